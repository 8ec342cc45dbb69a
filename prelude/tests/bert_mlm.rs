//! Our masked-LM BERT against Transformers' `BertForMaskedLM`: the fixture in
//! tests/fixtures/bert_mlm_tiny was written by tests/fixtures/make_bert_mlm_parity.py. Logits and
//! loss must match within 1e-4, and what we save must have exactly the tensor names
//! Transformers saves (so `BertForMaskedLM.from_pretrained` reads our checkpoints).

use std::collections::{BTreeSet, HashMap};
use std::path::PathBuf;

use tch::{nn, Kind, Tensor};
use trainbook::recipes::models::bert::{load_safetensors, BertConfig, BertForMaskedLm};

fn fixture() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures/bert_mlm_tiny")
}

fn max_diff(a: &Tensor, b: &Tensor) -> f64 {
    (a - b).abs().max().double_value(&[])
}

#[test]
fn logits_and_loss_match_transformers_and_the_names_round_trip() {
    let dir = fixture();
    let config = BertConfig::from_file(&dir.join("config.json")).unwrap();
    let vs = nn::VarStore::new(tch::Device::Cpu);
    let model = BertForMaskedLm::new(&vs.root(), &config);
    let report = load_safetensors(&vs, &dir.join("model.safetensors")).unwrap();
    assert!(
        report.missing.is_empty() && report.unexpected.is_empty(),
        "{report:?}"
    );
    let x: HashMap<String, Tensor> = Tensor::read_safetensors(dir.join("expected.safetensors"))
        .unwrap()
        .into_iter()
        .collect();
    let (ids, mask, types) = (
        &x["input_ids"],
        Some(&x["attention_mask"]),
        Some(&x["token_type_ids"]),
    );

    let logits = model.forward(ids, mask, types, false);
    let d = max_diff(&logits, &x["logits"]);
    assert!(d <= 1e-4, "logits differ by {d}");

    let (masked, labels) = model.forward_masked(ids, mask, types, &x["labels"], false);
    assert_eq!(masked.size(), [5, config.vocab_size]);
    let loss = masked.cross_entropy_for_logits(&labels).double_value(&[]);
    let want = x["loss"].double_value(&[0]);
    assert!((loss - want).abs() <= 1e-4, "loss {loss} vs {want}");
    // The masked rows are the full logits at the labelled positions.
    let at = x["labels"].reshape([-1]).ne(-100).nonzero().squeeze_dim(1);
    let full = logits.reshape([-1, config.vocab_size]).index_select(0, &at);
    assert!(max_diff(&masked, &full) <= 1e-5);

    // One tensor is both the embedding and the decoder: its gradient has both parts.
    masked.cross_entropy_for_logits(&labels).backward();
    let word = &vs.variables()["bert.embeddings.word_embeddings.weight"];
    let unused_row = word
        .grad()
        .get(100)
        .abs()
        .sum(Kind::Float)
        .double_value(&[]);
    assert!(
        unused_row > 0.0,
        "token 100 is never input but is decoded: the decoder's gradient reaches the tied weight"
    );

    let saved =
        std::env::temp_dir().join(format!("trainbook-mlm-{}.safetensors", std::process::id()));
    vs.save(&saved).unwrap();
    let names = |p: &std::path::Path| -> BTreeSet<String> {
        Tensor::read_safetensors(p)
            .unwrap()
            .into_iter()
            .map(|(n, _)| n)
            .collect()
    };
    assert_eq!(names(&saved), names(&dir.join("model.safetensors")));
    std::fs::remove_file(saved).ok();
}
