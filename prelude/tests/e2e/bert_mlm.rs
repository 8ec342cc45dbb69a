//! Our masked-LM BERT against Transformers' `BertForMaskedLM`: the fixture in
//! tests/fixtures/bert_mlm_tiny was written by tests/fixtures/make_bert_mlm_parity.py. Logits and
//! loss must match within 1e-4, and what we save must have exactly the tensor names
//! Transformers saves (so `BertForMaskedLM.from_pretrained` reads our checkpoints).

use std::collections::{BTreeSet, HashMap};
use std::path::PathBuf;

use tch::{nn, Kind, Tensor};
use trainbook::recipes::models::encoder::{
    load_safetensors, masked_positions, EncoderConfig, MaskedLm,
};

fn fixture() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures/bert_mlm_tiny")
}

fn max_diff(a: &Tensor, b: &Tensor) -> f64 {
    (a - b).abs().max().double_value(&[])
}

#[test]
fn logits_and_loss_match_transformers_and_the_names_round_trip() {
    let dir = fixture();
    let config = EncoderConfig::from_file(&dir.join("config.json")).unwrap();
    let vs = nn::VarStore::new(tch::Device::Cpu);
    let model = MaskedLm::new(&vs.root(), &config);
    let report = load_safetensors(&vs, &dir.join("model.safetensors"), &config).unwrap();
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

    let all_labels = Vec::<i64>::try_from(x["labels"].reshape([-1])).unwrap();
    let (at, labels) = masked_positions(&all_labels);
    let (at, labels) = (Tensor::from_slice(&at), Tensor::from_slice(&labels));
    let masked = model.forward_masked(ids, mask, types, &at, false);
    assert_eq!(masked.size(), [5, config.vocab_size]);
    let loss = masked.cross_entropy_for_logits(&labels).double_value(&[]);
    let want = x["loss"].double_value(&[0]);
    assert!((loss - want).abs() <= 1e-4, "loss {loss} vs {want}");
    // The masked rows are the full logits at the labelled positions.
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

    let saved = crate::common::scratch("mlm-weights").join("model.safetensors");
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

fn runs() -> PathBuf {
    crate::common::scratch("mlm-runs")
}

fn tiny() -> trainbook::BertMlmTrainer {
    use trainbook::prelude::*;
    BertMlmTrainer::new()
        .workers(2)
        .preset("tiny")
        .device(DeviceRequest::Cpu)
        .runs_root(runs())
}

/// The recipe end to end: two workers pre-train the tiny BERT, the loss falls, perplexity is
/// exp(loss), and the checkpoint is a Transformers `BertForMaskedLM` directory that a second
/// run continues from.
#[test]
fn tiny_pretraining_runs_and_its_checkpoint_continues() {
    use trainbook::prelude::*;
    let r = tiny().fit().unwrap();
    assert_eq!(r.steps, 16);
    let losses: Vec<f64> = r
        .metric_rows
        .iter()
        .filter(|m| m.name == "loss" && m.rank == 0)
        .map(|m| m.value)
        .collect();
    assert!(
        losses.last().unwrap() < &(losses[0] - 0.3),
        "the loss falls: {losses:?}"
    );
    let m = &r.metrics;
    assert!((m["eval_perplexity"] - m["eval_loss"].exp()).abs() < 1e-6 * m["eval_perplexity"]);
    assert!((0.0..=1.0).contains(&m["eval_masked_accuracy"]));

    let ckpt = r.last_checkpoint.clone().unwrap();
    let config: serde_json::Value =
        serde_json::from_slice(&std::fs::read(ckpt.join("config.json")).unwrap()).unwrap();
    assert_eq!(config["architectures"][0], "BertForMaskedLM");
    assert!(
        ckpt.join("vocab.txt").exists(),
        "the tokenizer travels with the model"
    );
    let cfg = EncoderConfig::from_file(&ckpt.join("config.json")).unwrap();
    let vs = nn::VarStore::new(tch::Device::Cpu);
    let _model = MaskedLm::new(&vs.root(), &cfg);
    let report = load_safetensors(&vs, &ckpt.join("model.safetensors"), &cfg).unwrap();
    assert!(
        report.missing.is_empty() && report.unexpected.is_empty(),
        "{report:?}"
    );

    // Continued pre-training starts where the first run ended, not from scratch.
    let more = tiny()
        .model(ckpt.display().to_string())
        .max_steps(2)
        .fit()
        .unwrap();
    let first = more
        .metric_rows
        .iter()
        .find(|m| m.name == "loss")
        .unwrap()
        .value;
    assert!(
        first < losses[0] - 0.3,
        "continued from {first}, scratch began at {}",
        losses[0]
    );
}

/// A tokenizer trained by `TokenizerTrainer` is what a from-scratch model's vocabulary is
/// made of; bad options fail before any worker starts, naming the fix.
#[test]
fn a_trained_tokenizer_feeds_pretraining_and_bad_options_name_the_fix() {
    use trainbook::prelude::*;
    let dir = runs().join("tok-600");
    TokenizerTrainer::new().vocab_size(600).train(&dir).unwrap();
    let r = tiny().tokenizer(&dir).max_steps(2).fit().unwrap();
    let ckpt = r.last_checkpoint.unwrap();
    let cfg = EncoderConfig::from_file(&ckpt.join("config.json")).unwrap();
    assert_eq!(cfg.vocab_size, 600);

    let err = |t: BertMlmTrainer| format!("{:#}", t.plan().unwrap_err());
    let e = err(tiny().heads(5));
    assert!(e.contains("heads must divide hidden_size"), "{e}");
    let e = err(tiny().padding(Padding::Dynamic));
    assert!(e.contains("no labels and needs no padding"), "{e}");
    let e = err(tiny().tokenizer("/nonexistent"));
    assert!(e.contains("trainbook tokenizer train"), "{e}");
    let e = err(tiny().mlm_probability(1.5));
    assert!(e.contains("0.15"), "{e}");
    let mut spec = JobSpec::new("bert").preset("tiny");
    spec.edit_recipe_options(|o: &mut trainbook::MlmOptions| o.layers = Some(2));
    let e = format!("{:#}", spec.plan().unwrap_err());
    assert!(e.contains("recipe bert has no option 'layers'"), "{e}");
}

/// The reference's job as a preset: it names where its corpus goes when the corpus is absent,
/// reads every text file of a directory, and has the reference's sizes.
#[test]
fn the_reference_preset_reads_a_corpus_directory() {
    use trainbook::prelude::*;
    let reference = || BertMlmTrainer::new().workers(2).preset("reference");
    if !trainbook::recipes::mlm::reference_corpus().exists() {
        let e = format!("{:#}", reference().plan().unwrap_err());
        assert!(
            e.contains("datasets/bert-pretraining is missing") && e.contains("BookCorpus"),
            "{e}"
        );
    }
    // A corpus directory: two "sources", a text file and a table, read in name order.
    let dir = runs().join("corpus");
    std::fs::create_dir_all(&dir).unwrap();
    let csv = trainbook::recipes::assets::rotten_tomatoes_csv();
    std::fs::copy(&csv, dir.join("b-reviews.csv")).unwrap();
    let brown = std::fs::read_to_string(trainbook::recipes::assets::brown_txt()).unwrap();
    let head: Vec<&str> = brown.lines().take(300).collect();
    std::fs::write(dir.join("a-brown.txt"), head.join("\n")).unwrap();
    std::fs::write(dir.join("notes.md"), "not read").unwrap();

    let plan = reference().data(dir.display().to_string()).plan().unwrap();
    let h = &plan.hyper;
    assert_eq!(
        (h.global_batch_size, h.max_steps, h.lr),
        (256, Some(100_000), 5e-5)
    );
    let mlm = &h.recipe_options["mlm"];
    assert_eq!(
        (&mlm["layers"], &mlm["hidden_size"], &mlm["heads"]),
        (&12.into(), &768.into(), &12.into())
    );
    assert_eq!(h.recipe_options["text"]["max_length"], 512);

    let job = tiny()
        .data(dir.display().to_string())
        .max_steps(1)
        .launch()
        .unwrap();
    job.wait().unwrap();
    let logs: Vec<String> = job.logs().into_iter().map(|l| l.text).collect();
    // 300 Brown lines + 12,808 snippets = 13,108 texts, every 20th held out.
    let read = logs.iter().find(|l| l.starts_with("data: ")).unwrap();
    assert!(read.contains("(12453 + 655 texts"), "{read}");
}

/// What a CUDA graph needs of the masked-LM step: every batch padded to
/// max_predictions_per_seq × blocks positions, the padding ignored. The loss and the accuracy
/// come out as without it.
#[test]
fn padded_masked_positions_change_neither_loss_nor_accuracy() {
    use trainbook::engine::{Device, Recipe, Split};
    use trainbook::prelude::*;
    use trainbook::recipes::mlm::{resolve, MlmRecipe};
    let recipe = |graphs: bool| {
        let t = tiny()
            .workers(1)
            .max_predictions_per_seq(20)
            .cuda_graphs(graphs);
        let h = resolve(t.spec()).unwrap().with_overrides(&t.spec().train);
        MlmRecipe::build(&h, Device::Cpu, &|_| {}).unwrap()
    };
    let (plain, padded) = (recipe(false), recipe(true));
    let blocks: Vec<usize> = (0..8).collect();
    let staged = padded.staged().expect("bert-mlm has a fixed-shape step");
    let inputs = staged.inputs(Split::Train, &blocks).unwrap();
    assert_eq!(
        inputs[1].size(),
        [8 * 20],
        "positions padded to 20 per block"
    );
    let (a, b) = (
        plain.step(Split::Train, &blocks, false).unwrap(),
        padded.step(Split::Train, &blocks, false).unwrap(),
    );
    let d = (a.loss.double_value(&[]) - b.loss.double_value(&[])).abs();
    assert!(d < 1e-6, "loss differs by {d}");
    let acc = |s: &trainbook::engine::Step| s.device_metrics[0].1.double_value(&[]);
    assert!((acc(&a) - acc(&b)).abs() < 1e-6);
}

/// `cuda_graphs` where it cannot work fails before training, saying why and what to do.
#[test]
fn cuda_graphs_are_refused_off_cuda_and_without_fixed_predictions() {
    use trainbook::prelude::*;
    let err = |t: trainbook::BertMlmTrainer| format!("{:#}", t.max_steps(2).fit().unwrap_err());
    let e = err(tiny()
        .workers(1)
        .max_predictions_per_seq(20)
        .cuda_graphs(true));
    assert!(
        e.contains("CUDA graphs run on CUDA") && e.contains("--device cuda"),
        "{e}"
    );
    let e = err(tiny()
        .device(DeviceRequest::Auto)
        .max_predictions_per_seq(20)
        .cuda_graphs(true));
    assert!(e.contains("use 1 worker"), "{e}");
    // On a machine without a GPU `auto` trains on the CPU: refused by the worker.
    let e = err(tiny()
        .workers(1)
        .device(DeviceRequest::Auto)
        .max_predictions_per_seq(20)
        .cuda_graphs(true));
    assert!(
        e.contains("CUDA graphs need a CUDA device") || e.contains("CUDA graphs run on CUDA"),
        "{e}"
    );
    let e = err(tiny()
        .workers(1)
        .device(DeviceRequest::Auto)
        .cuda_graphs(true));
    assert!(e.contains("max_predictions_per_seq"), "{e}");
}

/// With the next-sentence head, `BertForPreTraining`: both heads' logits and the summed loss
/// equal Transformers' (tests/fixtures/make_bert_pretraining_parity.py), nothing missing.
#[test]
fn the_next_sentence_head_matches_bert_for_pretraining() {
    let dir =
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures/bert_pretraining_tiny");
    let config = EncoderConfig::from_file(&dir.join("config.json")).unwrap();
    let vs = nn::VarStore::new(tch::Device::Cpu);
    let model = MaskedLm::with_next_sentence(&vs.root(), &config).unwrap();
    let report = load_safetensors(&vs, &dir.join("model.safetensors"), &config).unwrap();
    assert!(
        report.missing.is_empty() && report.unexpected.is_empty(),
        "{report:?}"
    );
    let x: HashMap<String, Tensor> = Tensor::read_safetensors(dir.join("expected.safetensors"))
        .unwrap()
        .into_iter()
        .collect();
    let all_labels = Vec::<i64>::try_from(x["labels"].reshape([-1])).unwrap();
    let (at, labels) = masked_positions(&all_labels);
    let (at, labels) = (Tensor::from_slice(&at), Tensor::from_slice(&labels));
    let (masked, next) = model.forward_pretraining(
        &x["input_ids"],
        Some(&x["attention_mask"]),
        Some(&x["token_type_ids"]),
        &at,
        false,
    );
    let next = next.expect("the head is there");
    let d = max_diff(&next, &x["seq_relationship_logits"]);
    assert!(d <= 1e-4, "next-sentence logits differ by {d}");
    let v = config.vocab_size;
    let full = x["prediction_logits"].reshape([-1, v]).index_select(0, &at);
    assert!(max_diff(&masked, &full) <= 1e-4);
    let loss = masked.cross_entropy_for_logits(&labels).double_value(&[])
        + next
            .cross_entropy_for_logits(&x["next_sentence_label"])
            .double_value(&[]);
    let want = x["loss"].double_value(&[0]);
    assert!((loss - want).abs() <= 1e-4, "loss {loss} vs {want}");

    let roberta = crate::encoder_parity::fixture("roberta", "mlm");
    let c = EncoderConfig::from_file(&roberta.join("config.json")).unwrap();
    let e = MaskedLm::with_next_sentence(&nn::VarStore::new(tch::Device::Cpu).root(), &c)
        .err()
        .unwrap()
        .to_string();
    assert!(e.contains("RoBERTa") && e.contains("next_sentence"), "{e}");
}
