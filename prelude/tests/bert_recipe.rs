//! The `bert` recipe end to end on its tiny preset: real tokenizer, real Rotten Tomatoes
//! snippets, two worker processes, and a checkpoint that loads back as a Hugging Face model.

use tch::nn;
use trainbook::models::bert::{load_safetensors, BertClassifier, BertConfig};
use trainbook::{DeviceRequest, JobSpec, JobStatus};

#[test]
fn tiny_bert_trains_with_two_workers_and_saves_a_loadable_checkpoint() {
    let spec = JobSpec::new("bert")
        .workers(2)
        .preset("tiny")
        .device(DeviceRequest::Cpu)
        .runs_root(std::env::temp_dir().join("trainbook-bert-tests"));
    let job = trainbook::launch(spec).unwrap();
    let r = job.wait().unwrap();
    assert_eq!(r.status, JobStatus::Succeeded);
    assert_eq!(r.steps, 32, "512 rows / global batch 16");
    assert!(r.final_train_loss.is_finite());
    assert!(r.metrics["eval_accuracy"] > 0.0);
    let logs: Vec<String> = job.logs().into_iter().map(|l| l.text).collect();
    assert!(
        logs.iter().any(|l| l.contains("labels: fresh, rotten")),
        "{logs:?}"
    );

    let ckpt = r.last_checkpoint.expect("a checkpoint per epoch");
    for f in [
        "model.safetensors",
        "config.json",
        "tokenizer.json",
        "vocab.txt",
        "trainer_state.json",
    ] {
        assert!(ckpt.join(f).exists(), "{f} missing from {}", ckpt.display());
    }
    let config = BertConfig::from_file(&ckpt.join("config.json")).unwrap();
    let id2label = config.id2label.clone().unwrap();
    assert_eq!(id2label["0"], "fresh");
    assert_eq!(id2label["1"], "rotten");
    let raw: serde_json::Value =
        serde_json::from_slice(&std::fs::read(ckpt.join("config.json")).unwrap()).unwrap();
    assert_eq!(raw["label2id"]["rotten"], 1);
    assert_eq!(raw["num_labels"], 2);
    let vs = nn::VarStore::new(tch::Device::Cpu);
    let _model = BertClassifier::new(&vs.root(), &config, config.num_labels().unwrap());
    let report = load_safetensors(&vs, &ckpt.join("model.safetensors")).unwrap();
    assert!(
        report.missing.is_empty() && report.unexpected.is_empty(),
        "{report:?}"
    );
}

#[test]
fn unknown_bert_preset_is_a_clear_error() {
    let spec = JobSpec::new("bert")
        .workers(1)
        .preset("huge")
        .device(DeviceRequest::Cpu)
        .runs_root(std::env::temp_dir().join("trainbook-bert-tests"));
    let err = format!("{:#}", trainbook::fit(spec).unwrap_err());
    assert!(
        err.contains("unknown preset 'huge' for recipe bert: use tiny or default"),
        "{err}"
    );
}
