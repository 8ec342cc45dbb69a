//! The memory levers against plain data parallelism: ZeRO stages 1 and 2 and activation
//! checkpointing, on real worker processes with real gloo reduce-scatters and all-gathers.
//! Sharding the optimizer state and the gradients, or recomputing activations, must change
//! where memory goes and nothing else: the same parameters after every step, checkpoints in
//! the replicated layout that resume with any worker count and any stage.

use std::path::PathBuf;

use crate::common::{load, max_abs_diff as max_diff};
use trainbook::{Configure, ConfigureTraining, JobSpec, OptimizerKind, TrainResult};

fn runs_root() -> PathBuf {
    crate::common::scratch("trainbook-zero-tests")
}

/// The synthetic tiny BERT (1,024 generated sequences) without dropout, global batch 12
/// (divisible by 1, 2, 3 and 4 workers): 86 steps an epoch with 2 or 3 workers.
fn job(workers: usize, zero: u8, optimizer: OptimizerKind) -> JobSpec {
    JobSpec::new("synthetic")
        .workers(workers)
        .preset("tiny")
        .device(trainbook::DeviceRequest::Cpu)
        .runs_root(runs_root())
        .optimizer(optimizer)
        .lr(1e-3)
        .weight_decay(0.01)
        .dropout(0.0)
        .seed(11)
        .global_batch_size(12)
        .zero(zero)
}

fn checkpoint(r: &TrainResult) -> PathBuf {
    r.last_checkpoint.clone().expect("a checkpoint")
}

/// The largest difference between the last checkpoints of two runs, in `file`
/// (`model.safetensors` or `optimizer.safetensors`).
fn last_diff(a: &TrainResult, b: &TrainResult, file: &str) -> f64 {
    max_diff(&checkpoint(a).join(file), &checkpoint(b).join(file))
}

/// 20 AdamW steps of plain DDP and of ZeRO stage `stage` on `workers` workers, which end with
/// the same weights and optimizer state.
fn twenty_steps_equal_ddp(workers: usize, stage: u8) -> (TrainResult, TrainResult) {
    let ddp = trainbook::fit(job(workers, 0, OptimizerKind::Adamw).max_steps(20)).unwrap();
    let zero = trainbook::fit(job(workers, stage, OptimizerKind::Adamw).max_steps(20)).unwrap();
    for file in ["model.safetensors", "optimizer.safetensors"] {
        let d = last_diff(&ddp, &zero, file);
        assert!(
            d < 1e-5,
            "ZeRO-{stage}, {workers} workers: {file} differs by {d}"
        );
    }
    (ddp, zero)
}

#[test]
fn zero1_with_two_and_three_workers_equals_ddp_after_20_adamw_steps() {
    for workers in [2, 3] {
        let ddp = trainbook::fit(job(workers, 0, OptimizerKind::Adamw).max_steps(20)).unwrap();
        let zero = trainbook::fit(job(workers, 1, OptimizerKind::Adamw).max_steps(20)).unwrap();
        assert_eq!((ddp.steps, zero.steps), (20, 20));
        let weights = last_diff(&ddp, &zero, "model.safetensors");
        assert!(
            weights < 1e-5,
            "{workers} workers: weights differ by {weights}"
        );
        // The gathered state is the replicated optimizer's, tensor for tensor.
        let state = last_diff(&ddp, &zero, "optimizer.safetensors");
        assert!(
            state < 1e-5,
            "{workers} workers: optimizer state differs by {state}"
        );
        // Each rank holds about 1/W of AdamW's state (the last shard may hold padding only).
        let full = ddp.memory[0].optimizer_state as f64;
        assert_eq!(zero.memory.len(), workers);
        let held: u64 = zero.memory.iter().map(|m| m.optimizer_state).sum();
        assert!(
            (held as f64 - full).abs() / full < 0.01,
            "the shards add up to the whole state: {held} vs {full}"
        );
        for m in &zero.memory {
            let share = m.optimizer_state as f64 / full;
            assert!(
                (share - 1.0 / workers as f64).abs() < 0.05,
                "rank {} holds {share:.3} of the state with {workers} workers",
                m.rank
            );
            assert!(
                m.parameters > 0 && m.peak > 0 && m.peak_of == "rss",
                "{m:?}"
            );
        }
    }
}

#[test]
fn zero1_lamb_and_lans_equal_ddp_and_clipping_is_global() {
    for opt in [OptimizerKind::Lamb, OptimizerKind::Lans] {
        let run = |zero| trainbook::fit(job(3, zero, opt).max_steps(8).grad_clip(0.5)).unwrap();
        let (ddp, zero) = (run(0), run(1));
        let d = last_diff(&ddp, &zero, "model.safetensors");
        // LANS divides each gradient by its norm, which magnifies the last bits that differ
        // between a reduce-scatter's and an all-reduce's summation order: plain DDP on 1 and
        // on 3 workers differ by 2e-3 here, ZeRO and DDP on 3 by 1.3e-5.
        let tol = if opt == OptimizerKind::Lans {
            1e-4
        } else {
            1e-5
        };
        assert!(d < tol, "{opt}: weights differ by {d}");
    }
}

#[test]
fn a_zero1_checkpoint_resumes_with_another_worker_count() {
    // Epoch 0 on 2 workers under ZeRO; 10 steps of epoch 1 resumed from its checkpoint on 3
    // workers, under ZeRO (each rank cuts its shard out of the whole state) and without (every
    // rank loads all of it): the step count carries over, and both resumes end equal. (Over
    // many AdamW steps the two drift apart by the last bits of their different summation
    // orders: 2.6e-5 after 40 steps, 5e-4 after 86.)
    let first = trainbook::fit(job(2, 1, OptimizerKind::Adamw).epochs(1)).unwrap();
    let ckpt = checkpoint(&first);
    assert_eq!(first.steps, 86);
    let resumed = trainbook::fit(
        job(3, 1, OptimizerKind::Adamw)
            .epochs(2)
            .max_steps(96)
            .resume_from(ckpt.clone()),
    )
    .unwrap();
    assert_eq!(resumed.steps, 96, "continues from step 86");
    let steps_then = load(&ckpt.join("optimizer.safetensors"))
        .into_iter()
        .find(|(n, _)| n == "steps")
        .unwrap()
        .1
        .int64_value(&[]);
    let steps_now = load(&checkpoint(&resumed).join("optimizer.safetensors"))
        .into_iter()
        .find(|(n, _)| n == "steps")
        .unwrap()
        .1
        .int64_value(&[]);
    assert_eq!(
        (steps_then, steps_now),
        (86, 96),
        "AdamW's step count carried over"
    );

    let plain = trainbook::fit(
        job(3, 0, OptimizerKind::Adamw)
            .epochs(2)
            .max_steps(96)
            .resume_from(ckpt.clone()),
    )
    .unwrap();
    assert_eq!(plain.steps, 96);
    let d = last_diff(&plain, &resumed, "model.safetensors");
    assert!(
        d < 1e-5,
        "resumed with and without ZeRO: weights differ by {d}"
    );

    // A mid-epoch ZeRO-1 checkpoint of 2 workers continues with 3 (the batch of 12 splits
    // evenly over both) and ends where 2 workers continuing from it end (a step checkpoint
    // that is not the latest keeps no optimizer state: both restart it); 5 workers cannot
    // split 12 evenly, so their steps would cover other samples: refused, naming the choices.
    let mid = trainbook::fit(
        job(2, 1, OptimizerKind::Adamw)
            .max_steps(10)
            .checkpoint_every(5),
    )
    .unwrap();
    let step5 = mid.run_dir.join("checkpoints/step-5");
    let three = trainbook::fit(
        job(3, 1, OptimizerKind::Adamw)
            .max_steps(10)
            .resume_from(step5.clone()),
    )
    .unwrap();
    let two = trainbook::fit(
        job(2, 1, OptimizerKind::Adamw)
            .max_steps(10)
            .resume_from(step5.clone()),
    )
    .unwrap();
    assert_eq!((three.steps, two.steps), (10, 10));
    let d = last_diff(&two, &three, "model.safetensors");
    assert!(
        d < 1e-5,
        "continued from step 5 by 3 and by 2 workers: weights differ by {d}"
    );
    let err = trainbook::fit(job(5, 1, OptimizerKind::Adamw).resume_from(step5))
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("does not split evenly over 5 workers") && err.contains("end of an epoch"),
        "{err}"
    );
}

#[test]
fn zero_stage_four_is_refused_with_the_choices() {
    let err = trainbook::fit(job(2, 4, OptimizerKind::Adamw))
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("ZeRO stage 4") && err.contains("use 3"),
        "{err}"
    );
}

#[test]
fn zero3_with_two_and_three_workers_equals_ddp_and_holds_a_shard_of_the_parameters() {
    for workers in [2, 3] {
        let (ddp, zero) = twenty_steps_equal_ddp(workers, 3);
        // Between steps a rank holds 1/W of every parameter (each unit padded to a multiple
        // of W elements), no gradient, and 1/W of the optimizer state.
        let whole = ddp.memory[0].parameters as f64;
        for m in &zero.memory {
            let share = m.parameters as f64 / whole;
            assert!(
                (share - 1.0 / workers as f64).abs() < 0.01,
                "rank {} holds {share:.4} of the parameters with {workers} workers: {m:?}",
                m.rank
            );
            assert_eq!(m.gradients, 0, "{m:?}");
            let state = m.optimizer_state as f64 / ddp.memory[0].optimizer_state as f64;
            assert!((state - 1.0 / workers as f64).abs() < 0.01, "{m:?}");
        }
    }
}

#[test]
fn zero3_under_bf16_gathers_bf16_copies_and_keeps_fp32_masters() {
    // Under bf16 the units are gathered as bf16 copies of the fp32 master shards (what bf16
    // autocast would round the weights to anyway), gradients are reduced in fp32: plain bf16
    // DDP's run within bf16's rounding, a rank holding its fp32 shard and its bf16 copy.
    let spec = |zero: u8| {
        job(2, zero, OptimizerKind::Adamw)
            .max_steps(20)
            .precision(trainbook::Precision::Bf16)
    };
    let (ddp, zero) = (
        trainbook::fit(spec(0)).unwrap(),
        trainbook::fit(spec(3)).unwrap(),
    );
    let d = last_diff(&ddp, &zero, "model.safetensors");
    assert!(d < 0.03, "weights differ by {d}, more than bf16's rounding");
    let rank0_losses = |r: &TrainResult| -> Vec<f64> {
        let rows = r
            .metric_rows
            .iter()
            .filter(|m| m.name == "loss" && m.rank == 0);
        rows.map(|m| m.value).collect()
    };
    let (a, b) = (rank0_losses(&ddp), rank0_losses(&zero));
    assert_eq!(a.len(), 20);
    for (x, y) in a.iter().zip(&b) {
        assert!((x - y).abs() < 0.01 * x.abs(), "losses {a:?} vs {b:?}");
    }
    // The checkpoint holds the fp32 masters.
    for (name, t) in load(&checkpoint(&zero).join("model.safetensors")) {
        assert_eq!(t.kind(), tch::Kind::Float, "{name}");
    }
    let whole = ddp.memory[0].parameters as f64;
    for m in &zero.memory {
        let share = m.parameters as f64 / whole;
        assert!(
            (share - 0.75).abs() < 0.01,
            "fp32 half and its bf16 copy: {share:.4} {m:?}"
        );
    }
}

#[test]
fn zero3_accumulates_clips_recomputes_and_steps_lans() {
    // Two micro-batches a step (each unit gathered for both), a global clip, every layer
    // recomputed (the recomputation runs on the gathered unit); LANS's per-tensor norms add
    // up the pieces of parameters cut between ranks.
    let spec = |zero: u8, opt| {
        job(2, zero, opt)
            .max_steps(12)
            .grad_accum(2)
            .grad_clip(0.5)
            .activation_checkpointing(zero == 3)
    };
    for (opt, tol) in [(OptimizerKind::Adamw, 1e-5), (OptimizerKind::Lans, 1e-4)] {
        let ddp = trainbook::fit(spec(0, opt)).unwrap();
        let zero = trainbook::fit(spec(3, opt)).unwrap();
        let d = last_diff(&ddp, &zero, "model.safetensors");
        assert!(d < tol, "{opt}: weights differ by {d}");
    }
}

#[test]
fn a_sharded_zero3_checkpoint_of_four_workers_resumes_on_three_and_on_two_without_zero() {
    // 10 steps under ZeRO-3 on 4 workers, whose checkpoint every rank writes a part of; 10
    // more from it on 3 workers under ZeRO-3 and on 2 under plain DDP (re-sharded on load):
    // both end where 20 straight DDP steps end.
    let straight = trainbook::fit(job(2, 0, OptimizerKind::Adamw).max_steps(20)).unwrap();
    let first = trainbook::fit(
        job(4, 3, OptimizerKind::Adamw)
            .max_steps(10)
            .checkpoint_every(10)
            .epochs(1),
    )
    .unwrap();
    let dir = checkpoint(&first);
    // Hugging Face's sharded layout: a file per rank and an index, no whole-model file.
    assert!(!dir.join("model.safetensors").exists());
    let files: Vec<String> = ["model", "optimizer"]
        .iter()
        .flat_map(|stem| trainbook::engine::checkpoint::files_of(&dir, stem).unwrap())
        .collect();
    for k in 1..=4 {
        for stem in ["model", "optimizer"] {
            let f = format!("{stem}-{k:05}-of-00004.safetensors");
            assert!(files.contains(&f), "{f} not in {files:?}");
        }
    }
    let sizes: Vec<u64> = (1..=4)
        .map(|k| {
            std::fs::metadata(dir.join(format!("model-{k:05}-of-00004.safetensors")))
                .unwrap()
                .len()
        })
        .collect();
    let total: u64 = sizes.iter().sum();
    assert!(
        sizes.iter().all(|&s| (s as f64) < 0.45 * total as f64),
        "every rank writes about a quarter: {sizes:?}"
    );
    for (workers, zero) in [(3, 3), (2, 0)] {
        let resumed = trainbook::fit(
            job(workers, zero, OptimizerKind::Adamw)
                .max_steps(20)
                .resume_from(dir.clone()),
        )
        .unwrap();
        assert_eq!(resumed.steps, 20);
        let d = last_diff(&straight, &resumed, "model.safetensors");
        assert!(
            d < 1e-5,
            "resumed on {workers} workers, ZeRO-{zero}: weights differ by {d}"
        );
    }
}

#[test]
fn zero2_with_two_and_three_workers_equals_ddp_and_holds_no_full_gradients() {
    for workers in [2, 3] {
        let (ddp, zero) = twenty_steps_equal_ddp(workers, 2);
        for m in &zero.memory {
            // The gradients went into the buckets during the backward pass and were dropped;
            // what stays are the 1/W shards (with the parameter shards, under buffers).
            assert_eq!(m.gradients, 0, "{m:?}");
            assert!(
                (m.buffers as f64) < 1.1 * 2.0 * m.parameters as f64 / workers as f64,
                "{m:?}"
            );
        }
        assert!(ddp.memory[0].gradients > 0);
    }
}

#[test]
fn zero2_accumulates_micro_batches_clips_and_combines_with_checkpointing() {
    // Two micro-batches per step (two reduce-scatters per bucket, the second added to the
    // shard), a global clip, every layer recomputed (the hooks fire inside the recomputation).
    let spec = |zero: u8| {
        job(2, zero, OptimizerKind::Adamw)
            .max_steps(20)
            .grad_accum(2)
            .grad_clip(0.5)
            .activation_checkpointing(zero == 2)
    };
    let ddp = trainbook::fit(spec(0)).unwrap();
    let zero = trainbook::fit(spec(2)).unwrap();
    let d = last_diff(&ddp, &zero, "model.safetensors");
    assert!(d < 1e-5, "weights differ by {d}");
}

#[test]
fn zero2_checkpoints_resume_under_other_stages() {
    // 10 steps under ZeRO-2, then 10 more from its checkpoint under stage 0 and stage 1: both
    // end where 20 straight DDP steps end.
    let straight = trainbook::fit(job(2, 0, OptimizerKind::Adamw).max_steps(20)).unwrap();
    let first = trainbook::fit(
        job(2, 2, OptimizerKind::Adamw)
            .max_steps(10)
            .checkpoint_every(10)
            .epochs(1),
    )
    .unwrap();
    let ckpt = checkpoint(&first);
    for stage in [0, 1] {
        let resumed = trainbook::fit(
            job(2, stage, OptimizerKind::Adamw)
                .max_steps(20)
                .resume_from(ckpt.clone()),
        )
        .unwrap();
        assert_eq!(resumed.steps, 20);
        let d = last_diff(&straight, &resumed, "model.safetensors");
        assert!(
            d < 1e-5,
            "resumed under stage {stage}: weights differ by {d}"
        );
    }
}

#[test]
fn activation_checkpointing_trains_the_same_model_with_and_without_dropout() {
    // Every layer and every second one, against the plain run: 20 AdamW steps on 2 workers.
    // With dropout the recomputation draws the masks of the first forward pass again.
    for dropout in [0.0, 0.1] {
        let run = |every: Option<usize>| {
            let mut spec = job(2, 0, OptimizerKind::Adamw)
                .max_steps(20)
                .dropout(dropout);
            if let Some(k) = every {
                spec = spec
                    .activation_checkpointing(true)
                    .checkpoint_layers_every(k);
            }
            trainbook::fit(spec).unwrap()
        };
        let plain = run(None);
        for k in [1, 2] {
            let ckpt = run(Some(k));
            let d = last_diff(&plain, &ckpt, "model.safetensors");
            assert!(
                d < 1e-5,
                "dropout {dropout}, every {k}: weights differ by {d}"
            );
            assert!((plain.final_train_loss - ckpt.final_train_loss).abs() < 1e-6);
        }
    }
}

/// Habana's BERT-1.5B job (002) planned for 8 Gaudi cards: every row of the plan against the
/// arithmetic written out here, within 1%.
#[test]
fn the_bert_1_5b_plan_matches_a_hand_computation() {
    use trainbook::Train;
    let plan = |zero: u8, memory: &str| {
        trainbook::BertMlmTrainer::new()
            .preset("bert-1.5b")
            .workers(8)
            .device(trainbook::DeviceRequest::Hpu)
            .device_memory(memory)
            .zero(zero)
            .plan()
            .unwrap()
            .memory
            .expect("bert-mlm has a memory plan")
    };
    // 48 layers, hidden 1600, 25 heads, feed-forward 6400, vocabulary 30522, 512 positions.
    let (l, h, i, v, a) = (48f64, 1600f64, 6400f64, 30522f64, 25f64);
    let p = v * h
        + 512.0 * h
        + 2.0 * h
        + 2.0 * h
        + l * (4.0 * h * h + 2.0 * h * i + 9.0 * h + i)
        + h * h
        + h
        + 2.0 * h
        + v;
    assert_eq!(p, 1_527_814_522.0);
    // 32 sequences of 128 tokens per card (12,288 per step in 48 accumulations on 8 cards),
    // 20 predictions each; bf16 (2 bytes; Gaudi's LayerNorm too), byte dropout masks, the
    // written-out attention.
    let (b, s, m) = (32f64, 128f64, 32.0 * 20.0);
    let (e, inter, scores) = (b * s * h, b * s * i, b * a * s * s);
    let attention = 2.0 * e + 2.0 * scores + 3.0 * scores;
    let layer = 2.0 * e + 6.0 * e + attention + 6.0 * e + 4.0 * inter + 2.0 * e;
    let activations = l * layer
        + 3.0 * e
        + 2.0 * (2.0 * inter + 2.0 * e)
        + (4.0 * m * h * 2.0 + 3.0 * m * v * 4.0 + v * h * 4.0);
    let copies = 2.0 * (l * (4.0 * h * h + 2.0 * h * i) + h * h + v * h);
    let framework = (1u64 << 30) as f64;
    let zero1 = [
        ("parameters", 4.0 * p),
        ("gradients", 4.0 * p),
        ("optimizer state", 2.0 * 4.0 * p / 8.0),
        ("communication buffers", 2.0 * 4.0 * p / 8.0),
        ("activations", activations),
        ("bf16 weight copies", copies),
        ("framework", framework),
    ];
    let close = |what: &str, got: u64, want: f64| {
        let err = (got as f64 / want - 1.0).abs();
        assert!(
            err < 0.01,
            "{what}: planned {got}, by hand {want:.0} ({err:.4})"
        );
    };
    let gaudi1 = plan(1, "32GiB");
    assert_eq!(gaudi1.parameters, p as u64);
    assert_eq!((gaudi1.batch_per_device, gaudi1.grad_accum), (32, 48));
    for (what, want) in zero1 {
        close(what, gaudi1.bytes_of(what).unwrap(), want);
    }
    let total: f64 = zero1.iter().map(|r| r.1).sum();
    close("total", gaudi1.total, total);
    // 002: with ZeRO-1 and bf16 the model fits a first-generation Gaudi's 32 GB...
    assert_eq!(gaudi1.fits(), Some(true), "{gaudi1}");
    // ...and without ZeRO it does not: the whole LANS state and the flat gradient buckets.
    let plain = plan(0, "32GiB");
    close(
        "total without ZeRO",
        plain.total,
        total - 2.0 * 4.0 * p / 8.0 * 2.0 + 2.0 * 4.0 * p + 4.0 * p,
    );
    assert_eq!(plain.fits(), Some(false), "{plain}");
    let levers: Vec<&str> = plain
        .levers
        .iter()
        .filter(|l| l.fits == Some(true))
        .map(|l| l.change.as_str())
        .collect();
    assert!(levers.contains(&"--zero 2"), "{plain}");
    // Gaudi2's 96 GB holds it either way.
    assert_eq!(plan(0, "96GB").fits(), Some(true));
    assert_eq!(plan(1, "96GB").fits(), Some(true));
}

#[test]
fn a_job_that_cannot_fit_fails_before_launch_naming_the_levers() {
    let root = runs_root().join("too-big");
    let _ = std::fs::remove_dir_all(&root);
    let spec = job(2, 0, OptimizerKind::Adamw)
        .runs_root(root.clone())
        .device_memory("20MiB");
    let err = format!("{:#}", trainbook::fit(spec.clone()).unwrap_err());
    assert!(
        err.contains("does not fit")
            && err.contains("the device has 0.02 GiB (--device-memory)")
            && err.contains("--zero 2")
            && err.contains("--no-memory-check"),
        "{err}"
    );
    assert!(!root.exists(), "nothing was started: {}", root.display());
    // The check can be turned off, and a job that fits runs.
    let ok = trainbook::fit(spec.memory_check(false).max_steps(2)).unwrap();
    assert_eq!(ok.steps, 2);
    let e = format!(
        "{:#}",
        trainbook::fit(job(2, 0, OptimizerKind::Adamw).device_memory("lots")).unwrap_err()
    );
    assert!(e.contains("32GiB"), "{e}");
    // Under ZeRO-3 a layer that cannot be gathered whole is named: more workers do not help.
    let e = format!(
        "{:#}",
        trainbook::fit(job(2, 3, OptimizerKind::Adamw).device_memory("4KiB")).unwrap_err()
    );
    assert!(
        e.contains("ZeRO-3 gathers each layer whole") && e.contains("bert.encoder.layer.0 alone"),
        "{e}"
    );
}
