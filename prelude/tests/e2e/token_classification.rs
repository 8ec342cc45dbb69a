//! The `token-classification` recipe end to end: the tiny preset on the offline Brown
//! part-of-speech data, a BIO entity set on a RoBERTa written by transformers (2 workers = 1
//! worker), the export that transformers loads with the same logits, a cell's `TokenTagger`,
//! and the errors bad data gets before any worker starts.

use std::path::{Path, PathBuf};
use trainbook::prelude::*;

use crate::encoder_parity::{fixture, hf_outputs, outputs};

fn runs() -> PathBuf {
    crate::common::scratch("tagging-runs")
}

/// Sentences of six single words with BIO entities: every sentence has as many labelled
/// tokens, so the mean loss of two ranks' halves is the mean of the whole batch.
fn entity_data(dir: &Path) -> PathBuf {
    let people = ["anna", "ben", "cara", "dan"];
    let places = ["rome", "oslo", "lima", "kiev"];
    let mut text = String::from("-DOCSTART-\tO\n\n");
    for i in 0..64 {
        let (p, q) = (people[i % 4], places[(i / 4) % 4]);
        let words = [p, "went", "to", q, "by", "train"];
        let tags = ["B-PER", "O", "O", "B-LOC", "O", "O"];
        for (w, t) in words.iter().zip(tags) {
            text.push_str(&format!("{w}\t{t}\n"));
        }
        text.push('\n');
    }
    std::fs::create_dir_all(dir).unwrap();
    let f = dir.join("entities.conll");
    std::fs::write(&f, text).unwrap();
    f
}

fn roberta_tagger(data: &Path) -> TaggerTrainer {
    TaggerTrainer::new()
        .model(fixture("roberta", "token").display().to_string())
        .data(data.display().to_string())
        .device(DeviceRequest::Cpu)
        .runs_root(runs())
        .dropout(0.0)
        .epochs(1)
        .global_batch_size(8)
        .lr(1e-3)
        .optimizer(OptimizerKind::Adamw)
        .max_steps(4)
}

#[test]
fn the_tiny_preset_tags_brown_part_of_speech_with_two_workers() {
    let r = TaggerTrainer::new()
        .workers(2)
        .preset("tiny")
        .device(DeviceRequest::Cpu)
        .runs_root(runs())
        .train_rows(128)
        .eval_rows(64)
        .fit()
        .unwrap();
    assert_eq!(r.status, JobStatus::Succeeded);
    let acc = r.metrics["eval_token_accuracy"];
    assert!(acc > 0.0 && acc <= 1.0, "{:?}", r.metrics);
    assert!(
        !r.metrics.contains_key("eval_entity_f1"),
        "part-of-speech tags have no entities: {:?}",
        r.metrics
    );
}

#[test]
fn entities_train_alike_on_one_and_two_workers_and_export_to_transformers() {
    let data = entity_data(&crate::common::scratch("tagging-data"));
    let one = roberta_tagger(&data).workers(1).fit().unwrap();
    let two = roberta_tagger(&data).workers(2).fit().unwrap();
    let rel = |a: f64, b: f64| (a - b).abs() / b.abs().max(1e-12);
    assert!(
        rel(two.param_l2, one.param_l2) < 1e-5,
        "l2 {} vs {}",
        two.param_l2,
        one.param_l2
    );
    for m in [
        "eval_entity_f1",
        "eval_entity_precision",
        "eval_entity_recall",
    ] {
        assert!(one.metrics.contains_key(m), "{m}: {:?}", one.metrics);
        assert!((one.metrics[m] - two.metrics[m]).abs() < 1e-9, "{m}");
    }

    // The checkpoint is a directory transformers' AutoModelForTokenClassification loads,
    // giving the logits trainbook gives.
    let ckpt = two.last_checkpoint.clone().unwrap();
    let config: serde_json::Value =
        serde_json::from_slice(&std::fs::read(ckpt.join("config.json")).unwrap()).unwrap();
    assert_eq!(config["architectures"][0], "RobertaForTokenClassification");
    assert_eq!(config["id2label"]["1"], "B-LOC", "{config}");
    let inputs =
        crate::encoder_parity::read(&fixture("roberta", "token").join("expected.safetensors"));
    let (ours, _) = outputs(&ckpt, "token", &inputs);
    let theirs = hf_outputs(&ckpt, "token", &inputs);
    let d = (&ours["logits"] - &theirs["logits"])
        .abs()
        .max()
        .double_value(&[]);
    assert!(
        d <= 1e-4,
        "exported logits differ from transformers' by {d}"
    );

    // A cell's tagger finds the entities with their character spans.
    let tagger = TokenTagger::load(&ckpt).unwrap();
    assert_eq!(tagger.tags().len(), 3);
    let text = "cara went to oslo by train";
    for span in tagger.predict(text).unwrap() {
        let chars: String = text
            .chars()
            .skip(span.start)
            .take(span.end - span.start)
            .collect();
        assert_eq!(chars, span.text, "{span}");
    }
}

#[test]
fn bad_tagged_data_is_refused_before_any_worker_starts() {
    let dir = crate::common::scratch("tagging-bad");
    std::fs::create_dir_all(&dir).unwrap();
    let no_tag = dir.join("no-tag.conll");
    std::fs::write(&no_tag, "anna\tB-PER\nwent\n").unwrap();
    let mixed = dir.join("mixed.conll");
    std::fs::write(&mixed, "anna\tB-PER\nwent\tVERB\n").unwrap();
    for (file, want) in [(&no_tag, "has a token but no tag"), (&mixed, "BIO")] {
        let e = roberta_tagger(file)
            .workers(1)
            .plan()
            .map(|_| ())
            .unwrap_err();
        let e = format!("{e:#}");
        assert!(e.contains(want), "{e}");
    }
}
