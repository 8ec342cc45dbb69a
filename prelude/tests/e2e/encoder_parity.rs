//! The encoder families against Hugging Face Transformers: tests/fixtures/encoders holds, per
//! family (roberta, xlm-roberta, distilbert, albert, electra) and per task (base, sequence,
//! token, qa, mlm), a tiny random model that Transformers wrote and the outputs it computed
//! for a padded batch (tests/fixtures/make_encoder_parity.py). Each must load with nothing
//! missing and give the same outputs within 1e-4.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use tch::{nn, Tensor};
use trainbook::recipes::models::encoder::{
    load_safetensors, BaseModel, EncoderConfig, MaskedLm, QuestionAnsweringModel,
    SequenceClassifier, TokenClassifier,
};

pub const FAMILIES: [&str; 5] = ["roberta", "xlm-roberta", "distilbert", "albert", "electra"];
pub const TASKS: [&str; 5] = ["base", "sequence", "token", "qa", "mlm"];

pub fn fixture(family: &str, task: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../tests/fixtures/encoders")
        .join(family)
        .join(task)
}

/// The outputs (by Transformers' names) of the task model trainbook builds for `dir`'s
/// config.json and weights, on `inputs`.
pub fn outputs(
    dir: &Path,
    task: &str,
    inputs: &HashMap<String, Tensor>,
) -> (
    HashMap<&'static str, Tensor>,
    trainbook::recipes::models::LoadReport,
) {
    let c = EncoderConfig::from_file(&dir.join("config.json")).unwrap();
    let vs = nn::VarStore::new(tch::Device::Cpu);
    let root = vs.root();
    let labels = c.num_labels().unwrap_or(2);
    let (ids, mask, types) = (
        &inputs["input_ids"],
        Some(&inputs["attention_mask"]),
        inputs.get("token_type_ids"),
    );
    enum Model {
        Base(BaseModel),
        Sequence(SequenceClassifier),
        Token(TokenClassifier),
        Qa(QuestionAnsweringModel),
        Mlm(MaskedLm),
    }
    let model = match task {
        "base" => Model::Base(BaseModel::new(&root, &c)),
        "sequence" => Model::Sequence(SequenceClassifier::new(&root, &c, labels)),
        "token" => Model::Token(TokenClassifier::new(&root, &c, labels)),
        "qa" => Model::Qa(QuestionAnsweringModel::new(&root, &c)),
        "mlm" => Model::Mlm(MaskedLm::new(&root, &c)),
        other => panic!("unknown task {other}"),
    };
    let report = load_safetensors(&vs, &dir.join("model.safetensors"), &c).unwrap();
    let out = tch::no_grad(|| match &model {
        Model::Base(m) => {
            HashMap::from([("last_hidden_state", m.forward(ids, mask, types, false))])
        }
        Model::Sequence(m) => HashMap::from([("logits", m.forward(ids, mask, types, false))]),
        Model::Token(m) => HashMap::from([("logits", m.forward(ids, mask, types, false))]),
        Model::Mlm(m) => HashMap::from([("logits", m.forward(ids, mask, types, false))]),
        Model::Qa(m) => {
            let (s, e) = m.forward(ids, mask, types, false);
            HashMap::from([("start_logits", s), ("end_logits", e)])
        }
    });
    (out, report)
}

/// What transformers computes for directories trainbook wrote (tests/encoders/hf_check.py,
/// one process for all): per (directory, task, inputs), the task's outputs.
pub fn hf_outputs_many(
    checks: &[(&Path, &str, &HashMap<String, Tensor>)],
) -> Vec<HashMap<String, Tensor>> {
    let repo = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..");
    // A directory per call: tests running at once must not read each other's files.
    static CALLS: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let call = CALLS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let scratch = crate::common::scratch(&format!("encoder-hf-{call}"));
    std::fs::create_dir_all(&scratch).unwrap();
    let mut jobs = Vec::new();
    for (k, (dir, task, inputs)) in checks.iter().enumerate() {
        let (inp, out) = (
            scratch.join(format!("in-{k}.safetensors")),
            scratch.join(format!("out-{k}.safetensors")),
        );
        let named: Vec<(&str, &Tensor)> = inputs
            .iter()
            .filter(|(k, _)| {
                ["input_ids", "attention_mask", "token_type_ids"].contains(&k.as_str())
            })
            .map(|(k, v)| (k.as_str(), v))
            .collect();
        Tensor::write_safetensors(&named, &inp).unwrap();
        jobs.push(serde_json::json!({"model": dir, "task": task, "inputs": inp, "out": out}));
    }
    let batch = scratch.join("jobs.json");
    std::fs::write(&batch, serde_json::to_vec(&jobs).unwrap()).unwrap();
    let done = std::process::Command::new(repo.join("scripts/torch-python.sh"))
        .arg(repo.join("tests/encoders/hf_check.py"))
        .arg("--batch")
        .arg(&batch)
        .output()
        .unwrap();
    assert!(
        done.status.success(),
        "hf_check.py: {}",
        String::from_utf8_lossy(&done.stderr)
    );
    jobs.iter()
        .map(|j| read(Path::new(j["out"].as_str().unwrap())))
        .collect()
}

/// [`hf_outputs_many`] for one directory.
pub fn hf_outputs(
    dir: &Path,
    task: &str,
    inputs: &HashMap<String, Tensor>,
) -> HashMap<String, Tensor> {
    hf_outputs_many(&[(dir, task, inputs)]).remove(0)
}

pub fn read(path: &Path) -> HashMap<String, Tensor> {
    Tensor::read_safetensors(path)
        .unwrap()
        .into_iter()
        .collect()
}

#[test]
fn every_family_and_head_gives_transformers_outputs() {
    let mut worst = 0.0f64;
    for family in FAMILIES {
        for task in TASKS {
            let dir = fixture(family, task);
            let expected = read(&dir.join("expected.safetensors"));
            let (got, report) = outputs(&dir, task, &expected);
            assert!(report.missing.is_empty(), "{family}/{task}: {report:?}");
            // A base model's pooler (RoBERTa, ALBERT) is not used by the base outputs.
            assert!(
                report.unexpected.iter().all(|n| n.contains("pooler")),
                "{family}/{task}: {report:?}"
            );
            for (name, t) in &got {
                let d = (t - &expected[*name]).abs().max().double_value(&[]);
                assert!(d <= 1e-4, "{family}/{task} {name} differs by {d}");
                worst = worst.max(d);
            }
        }
    }
    eprintln!("largest difference from Transformers: {worst:.1e}");
}

#[test]
fn an_unknown_model_type_names_the_supported_ones() {
    let e = EncoderConfig::from_json(serde_json::json!({"model_type": "deberta-v2"}))
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("deberta-v2") && e.contains("roberta") && e.contains("electra"),
        "{e}"
    );
    let e = EncoderConfig::from_json(serde_json::json!({"model_type": "llama"}))
        .unwrap_err()
        .to_string();
    assert!(e.contains("causal-lm"), "{e}");
}

/// A config read and written back is the family's own form: DistilBERT's `dim`, ALBERT's
/// `classifier_dropout_prob`, the fields trainbook does not use kept.
#[test]
fn configs_round_trip_in_their_familys_words() {
    for family in FAMILIES {
        let dir = fixture(family, "sequence");
        let text = std::fs::read_to_string(dir.join("config.json")).unwrap();
        let original: serde_json::Value = serde_json::from_str(&text).unwrap();
        let c = EncoderConfig::from_file(&dir.join("config.json")).unwrap();
        let class = original["architectures"][0].as_str().unwrap();
        let back = c.to_json(class).unwrap();
        for (k, v) in original.as_object().unwrap() {
            assert_eq!(&back[k], v, "{family}: {k}");
        }
    }
}
