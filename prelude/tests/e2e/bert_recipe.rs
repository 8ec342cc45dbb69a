//! The `bert` recipe end to end on its tiny preset: real tokenizer, real Rotten Tomatoes
//! snippets, two worker processes, and a checkpoint that loads back as a Hugging Face model.

use tch::nn;
use trainbook::prelude::*;
use trainbook::recipes::models::encoder::{load_safetensors, EncoderConfig, SequenceClassifier};
use trainbook::TrainResult;

fn runs() -> std::path::PathBuf {
    crate::common::scratch("bert-runs")
}

/// The tiny preset on 128 rows (8 steps of 16 per epoch), without dropout so runs that should
/// compute the same thing can be compared number for number.
fn tiny() -> BertTrainer {
    BertTrainer::new()
        .workers(2)
        .preset("tiny")
        .device(DeviceRequest::Cpu)
        .runs_root(runs())
        .dropout(0.0)
        .train_rows(128)
        .eval_rows(64)
}

fn assert_same_params(a: &TrainResult, b: &TrainResult, tol: f64, what: &str) {
    let rel = |x: f64, y: f64| (x - y).abs() / y.abs().max(1e-12);
    assert!(
        rel(a.param_l2, b.param_l2) < tol && rel(a.param_sum, b.param_sum) < tol * 100.0,
        "{what}: l2 {} vs {}, sum {} vs {}",
        a.param_l2,
        b.param_l2,
        a.param_sum,
        b.param_sum
    );
}

#[test]
fn tiny_bert_trains_with_two_workers_and_saves_a_loadable_checkpoint() {
    let spec = JobSpec::new("bert")
        .workers(2)
        .preset("tiny")
        .device(DeviceRequest::Cpu)
        .runs_root(runs());
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
        "optimizer.safetensors",
    ] {
        assert!(ckpt.join(f).exists(), "{f} missing from {}", ckpt.display());
    }
    let config = EncoderConfig::from_file(&ckpt.join("config.json")).unwrap();
    let id2label = config.id2label.clone().unwrap();
    assert_eq!(id2label["0"], "fresh");
    assert_eq!(id2label["1"], "rotten");
    let raw: serde_json::Value =
        serde_json::from_slice(&std::fs::read(ckpt.join("config.json")).unwrap()).unwrap();
    assert_eq!(raw["label2id"]["rotten"], 1);
    assert_eq!(raw["num_labels"], 2);
    let vs = nn::VarStore::new(tch::Device::Cpu);
    let _model = SequenceClassifier::new(&vs.root(), &config, config.num_labels().unwrap());
    let report = load_safetensors(&vs, &ckpt.join("model.safetensors"), &config).unwrap();
    assert!(
        report.missing.is_empty() && report.unexpected.is_empty(),
        "{report:?}"
    );

    // The checkpoint answers questions in this process.
    let clf = TextClassifier::load(&ckpt).unwrap();
    assert_eq!(clf.labels(), ["fresh", "rotten"]);
    let preds = clf
        .predict(&["a triumph, moving and funny", "a dull, lifeless mess"])
        .unwrap();
    assert_eq!(preds.len(), 2);
    for p in &preds {
        let total: f64 = p.probabilities.iter().map(|(_, v)| v).sum();
        assert!((total - 1.0).abs() < 1e-9 && p.score >= 0.5, "{p:?}");
        assert_eq!(p.label, clf.labels()[p.label_id]);
    }
    let err = TextClassifier::load(&r.run_dir).err().unwrap().to_string();
    assert!(err.contains("not a model checkpoint"), "{err}");
}

#[test]
fn resuming_mid_epoch_continues_the_same_run() {
    let straight = tiny().epochs(2).fit().unwrap();
    assert_eq!(straight.steps, 16);
    // Stop after 5 of the 8 steps of epoch 0, then continue to the end of epoch 1.
    let first = tiny().epochs(2).max_steps(5).fit().unwrap();
    let ckpt = first.last_checkpoint.clone().unwrap();
    let state: serde_json::Value =
        serde_json::from_slice(&std::fs::read(ckpt.join("trainer_state.json")).unwrap()).unwrap();
    assert_eq!(state["step"], 5);
    let resumed = tiny().epochs(2).resume_from(&ckpt).fit().unwrap();
    assert_eq!(resumed.steps, 16, "the step count continues");
    // Same weights, same AdamW moments, same data order: the same model.
    assert_same_params(&resumed, &straight, 1e-5, "resumed vs straight");

    // One worker continues the two workers' mid-epoch position: every worker count trains on
    // the same global order, and the batch of 16 splits evenly over both counts.
    let alone = tiny()
        .workers(1)
        .epochs(2)
        .resume_from(&ckpt)
        .fit()
        .unwrap();
    assert_eq!(alone.steps, 16);
    assert_same_params(&alone, &straight, 1e-5, "resumed by 1 worker vs 2 straight");
}

/// Pre-training's pieces together: LAMB, the poly schedule, dropout, step checkpoints with
/// keep-last-K, a resume from a step checkpoint mid-epoch, and the dllogger file.
#[test]
fn step_checkpoints_keep_the_last_k_and_resume_mid_run_exactly() {
    let job = || {
        tiny()
            .epochs(2)
            .dropout(0.1)
            .optimizer(OptimizerKind::Lamb)
            .weight_decay(0.01)
            .schedule(Schedule::Poly)
            .warmup_ratio(0.1)
            .constant_ratio(0.2)
            .poly_power(0.5)
            .checkpoint_every(3)
            .keep_checkpoints(2)
    };
    let straight = job().fit().unwrap();
    assert_eq!(straight.steps, 16);
    let dir = straight.run_dir.join("checkpoints");
    let mut names: Vec<String> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    assert_eq!(names, ["epoch-0", "epoch-1", "step-12", "step-15"]);
    assert!(
        dir.join("step-12/optimizer.safetensors").exists(),
        "a kept step checkpoint can resume"
    );
    assert!(!dir.join("epoch-0/optimizer.safetensors").exists());

    // lr: 2 warm-up steps, 4 at the peak, then 1e-3 * sqrt((16 - i) / 10).
    let lr: Vec<f64> = straight
        .metric_rows
        .iter()
        .filter(|m| m.name == "lr")
        .map(|m| m.value)
        .collect();
    assert_eq!(lr.len(), 16);
    assert_eq!(&lr[..6], &[5e-4, 1e-3, 1e-3, 1e-3, 1e-3, 1e-3]);
    for (i, l) in lr.iter().enumerate().skip(6) {
        assert!(
            (l - 1e-3 * ((16 - i) as f64 / 10.0).sqrt()).abs() < 1e-15,
            "{lr:?}"
        );
    }

    // Step 12 is in epoch 1 (8 steps per epoch): the resume skips 4 of its batches.
    let resumed = job().resume_from(dir.join("step-12")).fit().unwrap();
    assert_eq!(resumed.steps, 16);
    assert_same_params(
        &resumed,
        &straight,
        1e-5,
        "resumed from step 12 vs straight",
    );

    let dllog = std::fs::read_to_string(straight.run_dir.join("dllogger.json")).unwrap();
    let lines: Vec<serde_json::Value> = dllog
        .lines()
        .map(|l| serde_json::from_str(l.strip_prefix("DLLL ").unwrap()).unwrap())
        .collect();
    assert_eq!(lines[0]["data"]["optimizer"], "lamb");
    assert_eq!(lines[1]["step"], serde_json::json!([0, 1]));
    let last = lines.last().unwrap();
    assert_eq!(last["step"], serde_json::json!([]));
    assert!(
        last["data"]["training_sequences_per_second"]
            .as_f64()
            .unwrap()
            > 0.0
    );
    assert!(
        (last["data"]["final_loss"].as_f64().unwrap() - straight.final_train_loss).abs() < 1e-12
    );
}

#[test]
fn gradient_accumulation_and_dynamic_padding_compute_the_same_updates() {
    let base = tiny().max_steps(4).fit().unwrap();
    let accum = tiny().max_steps(4).grad_accum(2).fit().unwrap();
    assert_same_params(&accum, &base, 1e-5, "grad_accum 2 vs 1");
    let dynamic = tiny().max_steps(4).padding(Padding::Dynamic).fit().unwrap();
    assert_same_params(&dynamic, &base, 1e-5, "dynamic vs max-length padding");
    assert!(
        (dynamic.metrics["eval_accuracy"] - base.metrics["eval_accuracy"]).abs() < 1e-9,
        "padding changed predictions"
    );
}

#[test]
fn schedule_warmup_and_bf16_autocast_run() {
    let r = tiny()
        .max_steps(4)
        .optimizer(OptimizerKind::Adamw)
        .schedule(Schedule::Linear)
        .warmup_ratio(0.5)
        .precision(Precision::Bf16)
        .launch()
        .unwrap();
    let result = r.wait().unwrap();
    assert!(result.final_train_loss.is_finite());
    let lr = crate::common::metric_values(&r, "lr");
    // 2 warm-up steps up to 1e-3, then linear decay to 0 at step 4.
    let expect = [5e-4, 1e-3, 1e-3, 5e-4];
    assert_eq!(lr.len(), 4, "{lr:?}");
    for (a, b) in lr.iter().zip(expect) {
        assert!((a - b).abs() < 1e-12, "{lr:?}");
    }
    let logs: Vec<String> = r.logs().into_iter().map(|l| l.text).collect();
    assert!(logs.iter().any(|l| l.contains("bf16 autocast")), "{logs:?}");
}

/// Sentence pairs (MRPC-style) from a real source: two Rotten Tomatoes snippets, labelled by
/// whether they review the same movie. Both texts reach the model as two segments and the
/// binary task reports F1 next to accuracy.
#[test]
fn sentence_pairs_train_as_two_segments_and_report_f1() {
    use trainbook::recipes::text::wordpiece::read_texts;
    let csv = trainbook::recipes::assets::rotten_tomatoes_csv();
    let texts = read_texts(&csv, Some("text")).unwrap();
    let movies = read_texts(&csv, Some("movie")).unwrap();
    assert_eq!(texts.len(), movies.len());
    let mut rows = String::new();
    for i in 0..400 {
        for j in [i + 1, i + 6000] {
            let label = if movies[i] == movies[j] {
                "same"
            } else {
                "different"
            };
            let row = serde_json::json!({"a": texts[i], "b": texts[j], "label": label});
            rows.push_str(&format!("{row}\n"));
        }
    }
    let dir = runs().join("pairs");
    std::fs::create_dir_all(&dir).unwrap();
    let table = dir.join("pairs.jsonl");
    std::fs::write(&table, rows).unwrap();

    let job = tiny()
        .data(table.display().to_string())
        .text_column("a")
        .text_pair_column("b")
        .label_column("label")
        .max_length(64)
        .train_rows(512)
        .eval_rows(128)
        .max_steps(4)
        .launch()
        .unwrap();
    let r = job.wait().unwrap();
    assert!(
        (0.0..=1.0).contains(&r.metrics["eval_f1"]),
        "{:?}",
        r.metrics
    );
    assert!(r.metrics.contains_key("eval_accuracy"));
    let logs: Vec<String> = job.logs().into_iter().map(|l| l.text).collect();
    assert!(
        logs.iter().any(|l| l.contains("(labels: different, same)")),
        "{logs:?}"
    );
    assert!(logs.iter().any(|l| l.contains("F1: ")), "{logs:?}");

    // The checkpoint classifies pairs the way it was trained on them.
    let clf = TextClassifier::load(r.last_checkpoint.as_ref().unwrap()).unwrap();
    let p = clf
        .predict_pairs(&[
            (texts[0].as_str(), texts[1].as_str()),
            ("a fine film", "a dull film"),
        ])
        .unwrap();
    assert_eq!(p.len(), 2);
    assert!(p
        .iter()
        .all(|p| p.label == "same" || p.label == "different"));
    let as_pair = clf
        .predict_pairs(&[("a fine film", "a dull film")])
        .unwrap();
    let as_one = clf.predict(&["a fine film a dull film"]).unwrap();
    assert_ne!(
        as_pair[0].score, as_one[0].score,
        "segments reach the model"
    );
}

#[test]
fn bad_data_options_name_the_problem() {
    let err = format!(
        "{:#}",
        tiny().max_steps(1).text_column("review").fit().unwrap_err()
    );
    assert!(
        err.contains("no text column 'review'") && err.contains("text, label, movie"),
        "{err}"
    );
    let err = format!(
        "{:#}",
        tiny()
            .max_steps(1)
            .data("/nonexistent/reviews.csv")
            .fit()
            .unwrap_err()
    );
    assert!(
        err.contains("data file /nonexistent/reviews.csv does not exist"),
        "{err}"
    );
    let err = format!("{:#}", tiny().resume_from("/tmp").fit().unwrap_err());
    assert!(err.contains("not a trainbook checkpoint"), "{err}");
}

#[test]
fn unknown_bert_preset_is_a_clear_error() {
    let spec = JobSpec::new("bert")
        .workers(1)
        .preset("huge")
        .device(DeviceRequest::Cpu)
        .runs_root(runs());
    let err = format!("{:#}", trainbook::fit(spec).unwrap_err());
    assert!(
        err.contains("unknown preset 'huge' for recipe bert: use tiny, default, reference"),
        "{err}"
    );
}

/// What the BERT notebook previews is the table the job will read: the preset's, or the one
/// `.data(..)` names.
#[test]
fn training_table_is_the_table_the_job_reads() {
    let tiny = BertTrainer::new().preset("tiny");
    let file = tiny.training_file().unwrap();
    assert_eq!(
        file.canonicalize().unwrap(),
        trainbook::recipes::assets::rotten_tomatoes_csv()
            .canonicalize()
            .unwrap()
    );
    assert!(tiny.training_table().unwrap().height() > 10_000);

    let dir = crate::common::scratch("bert-table");
    let csv = dir.join("mine.csv");
    std::fs::write(&csv, "text,label\ngood,pos\nbad,neg\nfine,pos\n").unwrap();
    let mine = BertTrainer::new()
        .preset("tiny")
        .data(csv.display().to_string());
    assert_eq!(mine.training_file().unwrap(), csv);
    assert_eq!(mine.training_table().unwrap().height(), 3);
    let _ = std::fs::remove_dir_all(&dir);
}
