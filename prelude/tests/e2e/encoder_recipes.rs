//! Every encoder family through the recipes BERT had, from the command line: sequence
//! classification (`train bert --model DIR`) and continued masked-LM pre-training
//! (`train bert-mlm --model DIR`) on the tiny models transformers wrote
//! (tests/fixtures/encoders), each exported with `--export` and loaded back by transformers
//! with the logits trainbook computes.

use std::path::{Path, PathBuf};
use std::process::Command;

use crate::encoder_parity::{fixture, outputs, read, FAMILIES};
use crate::token_classification::hf_outputs;

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

#[test]
fn every_family_classifies_and_pretrains_and_exports_what_transformers_loads() {
    let scratch = crate::common::scratch("encoder-recipes");
    let (table, corpus) = data(&scratch);
    for family in FAMILIES {
        for (recipe, task, data) in [("bert", "sequence", &table), ("bert-mlm", "mlm", &corpus)] {
            let out = scratch.join(format!("{family}-{task}"));
            train(recipe, &fixture(family, task), data, &out);
            let inputs = read(&fixture(family, task).join("expected.safetensors"));
            let (ours, report) = outputs(&out, task, &inputs);
            assert!(report.missing.is_empty(), "{family}/{task}: {report:?}");
            let theirs = hf_outputs(&out, task, &inputs);
            let d = (&ours["logits"] - &theirs["logits"])
                .abs()
                .max()
                .double_value(&[]);
            assert!(d <= 1e-4, "{family}/{task}: exported logits differ by {d}");
            // Trained: the weights moved from the fixture's.
            let before = outputs(&fixture(family, task), task, &inputs).0;
            let moved = (&ours["logits"] - &before["logits"])
                .abs()
                .max()
                .double_value(&[]);
            assert!(moved > 0.0, "{family}/{task}: training changed nothing");
        }
    }
}
