//! The `question-answering` recipe end to end: the tiny preset on the generated facts-qa set,
//! a DistilBERT written by transformers trained alike on one and two workers, the export that
//! transformers loads with the same logits, a cell's `QuestionAnswerer`, and the errors bad
//! data gets before any worker starts.

use std::path::{Path, PathBuf};

use trainbook::prelude::*;

use crate::encoder_parity::{fixture, hf_outputs, outputs, read};

fn runs() -> PathBuf {
    crate::common::scratch("qa-runs")
}

/// 64 short questions in Hugging Face's jsonl layout, each answer a word of its context.
fn questions(dir: &Path) -> PathBuf {
    let names = ["anna", "ben", "cara", "dan"];
    let cities = ["rome", "oslo", "lima", "kiev"];
    let mut lines = Vec::new();
    for i in 0..64 {
        let (n, c) = (names[i % 4], cities[(i / 4) % 4]);
        let context = format!("the fox saw {n} in {c} by the river.");
        let start = context.find(c).unwrap();
        lines.push(
            serde_json::json!({
                "id": format!("q{i}"),
                "question": format!("where did the fox see {n}?"),
                "context": context,
                "answers": {"text": [c], "answer_start": [start]},
            })
            .to_string(),
        );
    }
    std::fs::create_dir_all(dir).unwrap();
    let f = dir.join("questions.jsonl");
    std::fs::write(&f, lines.join("\n")).unwrap();
    f
}

fn distilbert_qa(data: &Path) -> QaTrainer {
    QaTrainer::new()
        .model(fixture("distilbert", "qa").display().to_string())
        .data(data.display().to_string())
        .device(DeviceRequest::Cpu)
        .runs_root(runs())
        .dropout(0.0)
        .epochs(1)
        .global_batch_size(8)
        .lr(1e-3)
        .optimizer(OptimizerKind::Adamw)
        .max_length(32)
        .doc_stride(8)
        .max_steps(4)
}

#[test]
fn the_tiny_preset_answers_facts_qa_with_two_workers() {
    let r = QaTrainer::new()
        .workers(2)
        .preset("tiny")
        .device(DeviceRequest::Cpu)
        .runs_root(runs())
        .train_rows(64)
        .eval_rows(32)
        .fit()
        .unwrap();
    assert_eq!(r.status, JobStatus::Succeeded);
    for m in ["eval_exact_match", "eval_f1"] {
        let v = r.metrics[m];
        assert!((0.0..=100.0).contains(&v), "{m} {v}: {:?}", r.metrics);
    }
    assert!(r.metrics["eval_f1"] >= r.metrics["eval_exact_match"]);
}

#[test]
fn spans_train_alike_on_one_and_two_workers_and_export_to_transformers() {
    let data = questions(&crate::common::scratch("qa-data"));
    let one = distilbert_qa(&data).workers(1).fit().unwrap();
    let two = distilbert_qa(&data).workers(2).fit().unwrap();
    let rel = |a: f64, b: f64| (a - b).abs() / b.abs().max(1e-12);
    assert!(
        rel(two.param_l2, one.param_l2) < 1e-5,
        "l2 {} vs {}",
        two.param_l2,
        one.param_l2
    );
    for m in ["eval_exact_match", "eval_f1"] {
        assert!((one.metrics[m] - two.metrics[m]).abs() < 1e-9, "{m}");
    }

    let ckpt = two.last_checkpoint.clone().unwrap();
    let config: serde_json::Value =
        serde_json::from_slice(&std::fs::read(ckpt.join("config.json")).unwrap()).unwrap();
    assert_eq!(config["architectures"][0], "DistilBertForQuestionAnswering");
    assert_eq!(config["dim"], 32, "DistilBERT's own field names: {config}");
    let inputs = read(&fixture("distilbert", "qa").join("expected.safetensors"));
    let (ours, _) = outputs(&ckpt, "qa", &inputs);
    let theirs = hf_outputs(&ckpt, "qa", &inputs);
    for k in ["start_logits", "end_logits"] {
        let d = (&ours[k] - &theirs[k]).abs().max().double_value(&[]);
        assert!(d <= 1e-4, "exported {k} differ from transformers' by {d}");
    }

    // A cell's answerer gives a span of the context, by characters.
    let qa = QuestionAnswerer::load(&ckpt).unwrap();
    let context = "the fox saw cara in lima by the river.";
    let a = qa.answer("where did the fox see cara?", context).unwrap();
    let chars: String = context
        .chars()
        .skip(a.start)
        .take(a.end - a.start)
        .collect();
    assert_eq!(chars, a.text, "{a}");
}

#[test]
fn bad_questions_are_refused_before_any_worker_starts() {
    let dir = crate::common::scratch("qa-bad");
    std::fs::create_dir_all(&dir).unwrap();
    let wrong = dir.join("wrong-offset.jsonl");
    std::fs::write(
        &wrong,
        r#"{"id": "w1", "question": "where?", "context": "in rome", "answers": {"text": ["rome"], "answer_start": [0]}}"#,
    )
    .unwrap();
    let long = dir.join("long-question.jsonl");
    let question = "where did the fox see the dog ".repeat(10);
    std::fs::write(
        &long,
        serde_json::json!({"id": "l1", "question": question, "context": "in rome",
            "answers": {"text": ["rome"], "answer_start": [3]}})
        .to_string(),
    )
    .unwrap();
    for (file, want) in [(&wrong, "w1"), (&long, "max_length")] {
        let e = distilbert_qa(file)
            .workers(1)
            .plan()
            .map(|_| ())
            .unwrap_err();
        let e = format!("{e:#}");
        assert!(e.contains(want), "{e}");
    }
}
