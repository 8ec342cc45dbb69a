//! Every encoder family through the recipes BERT had, from the command line: sequence
//! classification (`train bert --model DIR`) and continued masked-LM pre-training
//! (`train bert-mlm --model DIR`) on the tiny models transformers wrote
//! (tests/fixtures/encoders), each exported with `--export`; and every family's token and
//! question-answering models written as the recipes write them. transformers loads each with
//! the outputs trainbook computes (one hf_check.py process for all).

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::Command;

use tch::{nn, Tensor};
use trainbook::recipes::models::encoder::{
    load_safetensors, EncoderConfig, QuestionAnsweringModel, TokenClassifier,
};

use crate::encoder_parity::{fixture, hf_outputs_many, outputs, read, FAMILIES};

fn data(dir: &Path) -> (PathBuf, PathBuf) {
    std::fs::create_dir_all(dir).unwrap();
    let words = [
        "the fox runs",
        "a dog sleeps",
        "the river is green",
        "trees are tall",
    ];
    let mut csv = String::from("text,label\n");
    let mut text = String::new();
    for i in 0..32 {
        let line = format!("{} and {}", words[i % 4], words[(i / 4) % 4]);
        csv.push_str(&format!("{line},{}\n", ["good", "bad", "fine"][i % 3]));
        text.push_str(&line);
        text.push('\n');
    }
    let (table, corpus) = (dir.join("table.csv"), dir.join("corpus.txt"));
    std::fs::write(&table, csv).unwrap();
    std::fs::write(&corpus, text).unwrap();
    (table, corpus)
}

fn train(recipe: &str, model: &Path, data: &Path, out: &Path) {
    let runs = crate::common::scratch("encoder-recipes-runs");
    let done = Command::new(env!("CARGO_BIN_EXE_trainbook"))
        .args([
            "train",
            recipe,
            "--device",
            "cpu",
            "--workers",
            "1",
            "--epochs",
            "1",
        ])
        .args([
            "--max-steps",
            "2",
            "--max-length",
            "16",
            "--global-batch-size",
            "4",
        ])
        .arg("--model")
        .arg(model)
        .arg("--data")
        .arg(data)
        .arg("--runs-root")
        .arg(&runs)
        .arg("--export")
        .arg(out)
        .output()
        .unwrap();
    assert!(
        done.status.success(),
        "train {recipe} --model {}: {}",
        model.display(),
        String::from_utf8_lossy(&done.stderr)
    );
}

/// A fixture's token or QA model loaded by trainbook and written as the recipes write their
/// checkpoints (weights by variable name, config.json in the family's words).
fn write_as_recipe(family: &str, task: &str, out: &Path) {
    let dir = fixture(family, task);
    let c = EncoderConfig::from_file(&dir.join("config.json")).unwrap();
    let vs = nn::VarStore::new(tch::Device::Cpu);
    let class = match task {
        "token" => {
            TokenClassifier::new(&vs.root(), &c, c.num_labels().unwrap());
            c.family().classes.token
        }
        _ => {
            QuestionAnsweringModel::new(&vs.root(), &c);
            c.family().classes.question_answering
        }
    };
    load_safetensors(&vs, &dir.join("model.safetensors"), &c).unwrap();
    std::fs::create_dir_all(out).unwrap();
    let mut named: Vec<(String, Tensor)> = vs.variables().into_iter().collect();
    named.sort_by(|a, b| a.0.cmp(&b.0));
    trainbook::engine::checkpoint::write_tensors(&named, &out.join("model.safetensors")).unwrap();
    trainbook::recipes::checkpoint::write_encoder_model(out, &c, class, &dir).unwrap();
}

#[test]
fn every_family_and_task_exports_what_transformers_loads() {
    let scratch = crate::common::scratch("encoder-recipes");
    let (table, corpus) = data(&scratch);
    let mut checks: Vec<(String, PathBuf, &str, HashMap<String, Tensor>)> = Vec::new();
    for family in FAMILIES {
        for (recipe, task, data) in [("bert", "sequence", &table), ("bert-mlm", "mlm", &corpus)] {
            let out = scratch.join(format!("{family}-{task}"));
            train(recipe, &fixture(family, task), data, &out);
            let inputs = read(&fixture(family, task).join("expected.safetensors"));
            checks.push((family.to_string(), out, task, inputs));
        }
        for task in ["token", "qa"] {
            let out = scratch.join(format!("{family}-{task}"));
            write_as_recipe(family, task, &out);
            let inputs = read(&fixture(family, task).join("expected.safetensors"));
            checks.push((family.to_string(), out, task, inputs));
        }
    }
    let asked: Vec<(&Path, &str, &HashMap<String, Tensor>)> = checks
        .iter()
        .map(|(_, d, t, i)| (d.as_path(), *t, i))
        .collect();
    let theirs = hf_outputs_many(&asked);
    for ((family, dir, task, inputs), theirs) in checks.iter().zip(theirs) {
        let (ours, report) = outputs(dir, task, inputs);
        assert!(report.missing.is_empty(), "{family}/{task}: {report:?}");
        for (name, t) in &ours {
            let d = (t - &theirs[*name]).abs().max().double_value(&[]);
            assert!(
                d <= 1e-4,
                "{family}/{task} {name}: exported outputs differ by {d}"
            );
        }
        if ["sequence", "mlm"].contains(task) {
            // Trained: the weights moved from the fixture's.
            let before = outputs(&fixture(family, task), task, inputs).0;
            let moved = (&ours["logits"] - &before["logits"])
                .abs()
                .max()
                .double_value(&[]);
            assert!(moved > 0.0, "{family}/{task}: training changed nothing");
        }
    }
}
