//! The `trainbook` command line: JSON summaries, worker-count invariance, and one clear error
//! (never a hang) for each kind of bad input.

use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use crate::common::last_json;

fn runs_root() -> std::path::PathBuf {
    crate::common::scratch("trainbook-cli-tests")
}

/// Runs the CLI with a hard deadline so a hang fails the test instead of stalling CI.
fn trainbook(args: &[&str], env: &[(&str, &str)], deadline: Duration) -> Output {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_trainbook"));
    cmd.args(args)
        .env("TRAINBOOK_RUNS", runs_root())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    for (k, v) in env {
        cmd.env(k, v);
    }
    let mut child = cmd.spawn().unwrap();
    let t0 = Instant::now();
    loop {
        if child.try_wait().unwrap().is_some() {
            return child.wait_with_output().unwrap();
        }
        if t0.elapsed() > deadline {
            let _ = child.kill();
            panic!("trainbook {args:?} did not finish within {deadline:?}");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn json_summary_is_the_same_whatever_the_worker_count() {
    let args = |w: &'static str| {
        [
            "train",
            "synthetic",
            "--workers",
            w,
            "--device",
            "cpu",
            "--preset",
            "tiny",
            "--optimizer",
            "sgd",
            "--dropout",
            "0",
            "--seed",
            "3",
            "--global-batch-size",
            "8",
            "--max-steps",
            "30",
            "--json",
        ]
    };
    let one = trainbook(&args("1"), &[], Duration::from_secs(120));
    let two = trainbook(&args("2"), &[], Duration::from_secs(120));
    assert!(
        one.status.success() && two.status.success(),
        "{}",
        String::from_utf8_lossy(&two.stderr)
    );
    let (a, b) = (last_json(&one), last_json(&two));
    for key in [
        "status",
        "workers",
        "device",
        "steps",
        "final_train_loss",
        "samples_per_second",
        "run_dir",
        "param_sum",
        "param_l2",
    ] {
        assert!(a.get(key).is_some(), "missing {key} in {a}");
    }
    assert_eq!(a["status"], "succeeded");
    assert_eq!(b["workers"], 2);
    assert_eq!(b["device"], "cpu");
    assert_eq!(a["steps"], 30);
    let f = |v: &serde_json::Value, k: &str| v[k].as_f64().unwrap();
    assert!(
        (f(&a, "param_sum") - f(&b, "param_sum")).abs() < 1e-3,
        "{a}\n{b}"
    );
    assert!(
        (f(&a, "param_l2") - f(&b, "param_l2")).abs() < 1e-4,
        "{a}\n{b}"
    );
}

fn expect_clear_error(args: &[&str], env: &[(&str, &str)], needles: &[&str]) {
    let out = trainbook(args, env, Duration::from_secs(60));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{args:?} should fail");
    let errors = stderr.lines().filter(|l| l.starts_with("error")).count();
    assert_eq!(
        errors, 1,
        "exactly one error line expected for {args:?}:\n{stderr}"
    );
    for n in needles {
        assert!(stderr.contains(n), "{args:?}: expected {n:?} in:\n{stderr}");
    }
}

#[test]
fn zero_workers() {
    expect_clear_error(
        &["train", "synthetic", "--workers", "0"],
        &[],
        &["at least one worker"],
    );
}

/// A preset's global batch that cannot give each of 32 workers (or each micro-batch) a sample
/// is refused by the driver before any worker starts, naming the fix.
#[test]
fn a_global_batch_smaller_than_the_workers_is_refused_before_launch() {
    let started = std::time::Instant::now();
    expect_clear_error(
        &[
            "train",
            "bert-mlm",
            "--preset",
            "tiny",
            "--workers",
            "32",
            "--device",
            "cpu",
        ],
        &[],
        &[
            "global batch size 16 is smaller than 32 workers x 1 micro-batches",
            "raise global_batch_size to at least 32",
        ],
    );
    expect_clear_error(
        &[
            "train",
            "bert-mlm",
            "--preset",
            "tiny",
            "--workers",
            "4",
            "--grad-accum",
            "8",
        ],
        &[],
        &["smaller than 4 workers x 8 micro-batches"],
    );
    // Two refusals, no worker process started: well under a second each here.
    assert!(
        started.elapsed() < Duration::from_secs(20),
        "{:?}",
        started.elapsed()
    );
}

#[test]
fn unknown_recipe() {
    expect_clear_error(
        &["train", "nosuch", "--workers", "2"],
        &[],
        &["unknown recipe 'nosuch'", "synthetic"],
    );
}

#[test]
fn cuda_without_a_gpu() {
    expect_clear_error(
        &["train", "synthetic", "--workers", "2", "--device", "cuda"],
        &[],
        &["no CUDA device", "--device cpu"],
    );
}

#[test]
fn hpu_without_the_gaudi_stack() {
    expect_clear_error(
        &["train", "synthetic", "--workers", "2", "--device", "hpu"],
        &[],
        &["Gaudi", "--device cpu"],
    );
}

#[test]
fn occupied_master_port() {
    let busy = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = busy.local_addr().unwrap().port().to_string();
    expect_clear_error(
        &[
            "train",
            "synthetic",
            "--workers",
            "2",
            "--device",
            "cpu",
            "--master-port",
            &port,
        ],
        &[],
        &["in use", &port],
    );
}

#[test]
fn worker_that_cannot_start() {
    expect_clear_error(
        &["train", "synthetic", "--workers", "2", "--device", "cpu"],
        &[("TRAINBOOK_WORKER", "/nonexistent/trainbook-worker")],
        &["could not start", "/nonexistent/trainbook-worker"],
    );
}

/// torchrun's elastic `--nnodes MIN:MAX` is taken; a range upside down, a count that is not
/// one, and an elastic job whose global batch no size splits evenly are refused before any
/// process starts, saying what to give.
#[test]
fn an_elastic_node_range_is_checked_before_launch() {
    expect_clear_error(
        &["train", "synthetic", "--nnodes", "4:2"],
        &[],
        &["4:2 has more nodes at least than at most", "--nnodes 2:4"],
    );
    expect_clear_error(
        &["train", "synthetic", "--nnodes", "2:x"],
        &[],
        &["not a number of nodes nor a range", "--nnodes 2:4"],
    );
    expect_clear_error(
        &["train", "synthetic", "--nnodes", "0"],
        &[],
        &["at least 1 node"],
    );
    expect_clear_error(
        &[
            "train",
            "synthetic",
            "--device",
            "cpu",
            "--nnodes",
            "2:3",
            "--global-batch-size",
            "7",
        ],
        &[],
        &[
            "no number of nodes from 2 to 3 splits the global batch of 7 samples",
            "e.g. 12",
        ],
    );
}

#[test]
fn bad_device_name_and_help() {
    expect_clear_error(
        &["train", "synthetic", "--device", "tpu"],
        &[],
        &["unknown device 'tpu'"],
    );
    let help = trainbook(&["train", "--help"], &[], Duration::from_secs(10));
    let text = String::from_utf8_lossy(&help.stdout);
    for flag in [
        "--workers",
        "--device",
        "--preset",
        "--epochs",
        "--max-steps",
        "--global-batch-size",
        "--lr",
        "--optimizer",
        "--dropout",
        "--seed",
        "--json",
        "--optimizer <sgd|adamw|lamb|lans>",
        "--schedule <constant|linear|poly>",
        "--checkpoint-every <N>",
        "Text recipes (bert, token-classification, question-answering;",
        "Question answering (question-answering):",
        "--doc-stride <N>",
        "Masked-LM recipe (bert-mlm):",
        "--mlm-probability",
        "--max-length <N>",
        "Image recipes (resnet):",
        "--arch <resnet18|resnet34|resnet50>",
    ] {
        assert!(text.contains(flag), "--help lacks {flag}");
    }
}

/// A recipe option given to a recipe without it fails before any worker starts, naming the
/// options the recipe has; so does an out-of-range recipe option.
#[test]
fn options_of_another_recipe_and_bad_recipe_options() {
    expect_clear_error(
        &["train", "bert", "--preset", "tiny", "--arch", "resnet50"],
        &[],
        &["recipe bert has no option 'arch'", "max_length", "padding"],
    );
    expect_clear_error(
        &["train", "synthetic", "--max-length", "64"],
        &[],
        &["recipe synthetic has no option 'max_length'"],
    );
    expect_clear_error(
        &["train", "bert", "--preset", "tiny", "--max-length", "0"],
        &[],
        &["max_length 0 must be between 1 and 8192"],
    );
    expect_clear_error(
        &["train", "resnet", "--preset", "tiny", "--image-size", "8"],
        &[],
        &["image_size 8 is too small"],
    );
}

#[test]
fn check_subcommand_passes() {
    let out = trainbook(
        &["check", "--workers", "2", "--device", "cpu"],
        &[],
        Duration::from_secs(60),
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(String::from_utf8_lossy(&out.stdout).contains("collectives ok"));
}

#[test]
fn terminal_output_merges_repeats_across_workers() {
    let out = trainbook(
        &[
            "train",
            "synthetic",
            "--workers",
            "2",
            "--device",
            "cpu",
            "--epochs",
            "1",
        ],
        &[],
        Duration::from_secs(120),
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    let loss_lines = stdout
        .lines()
        .filter(|l| l.contains("train epoch:[0]"))
        .count();
    // 1024 samples / batch 8 = 128 steps on each of 2 ranks: 256 raw lines.
    assert!(
        loss_lines < 256,
        "{loss_lines} loss lines: nothing was merged"
    );
    assert!(
        stdout.contains("[repeated ") && stdout.contains("across 2 workers: ranks 0-1"),
        "{stdout}"
    );
    // With de-duplication off, every line is shown.
    let raw = trainbook(
        &[
            "train",
            "synthetic",
            "--workers",
            "2",
            "--device",
            "cpu",
            "--epochs",
            "1",
            "--no-dedup",
        ],
        &[],
        Duration::from_secs(120),
    );
    let all = String::from_utf8_lossy(&raw.stdout)
        .lines()
        .filter(|l| l.contains("train epoch:[0]"))
        .count();
    assert_eq!(all, 256);
}

#[test]
fn terminal_shows_the_dashboard_summary_and_honours_log_levels() {
    let args = [
        "train",
        "synthetic",
        "--workers",
        "2",
        "--device",
        "cpu",
        "--epochs",
        "2",
    ];
    // `TRAINBOOK_LOG=warn`: no ordinary worker lines, but the summary and table remain.
    let out = trainbook(
        &args,
        &[("TRAINBOOK_LOG", "warn")],
        Duration::from_secs(120),
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(!stdout.contains("train epoch:["), "{stdout}");
    assert!(
        stderr.contains("✓ succeeded") && stderr.contains("100%"),
        "{stderr}"
    );
    assert!(
        stderr.contains("epoch  train loss  train acc  val loss  val acc"),
        "{stderr}"
    );
    assert!(
        stderr.contains("checkpoint: ") && stderr.contains("run directory: "),
        "{stderr}"
    );
    // The flag wins over the environment; a bad level is one clear error before any worker.
    let out = trainbook(
        &[&args[..], &["--log-level", "info"]].concat(),
        &[("TRAINBOOK_LOG", "warn")],
        Duration::from_secs(120),
    );
    assert!(String::from_utf8_lossy(&out.stdout).contains("Epoch 1-val Loss"));
    let out = trainbook(
        &[&args[..], &["--log-level", "loud"]].concat(),
        &[],
        Duration::from_secs(30),
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && stderr.contains("use off, error, warn, info or debug"),
        "{stderr}"
    );
    let out = trainbook(&args, &[("TRAINBOOK_LOG", "loud")], Duration::from_secs(30));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && stderr.contains("TRAINBOOK_LOG=\"loud\""),
        "{stderr}"
    );
}

#[test]
fn tokenizer_train_writes_a_vocabulary_and_names_bad_input() {
    let out = crate::common::scratch("cli-tokenizer");
    let o = trainbook(
        &[
            "tokenizer",
            "train",
            "--vocab-size",
            "800",
            "--out",
            out.to_str().unwrap(),
            "--json",
        ],
        &[],
        Duration::from_secs(120),
    );
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let summary = last_json(&o);
    assert_eq!(summary["vocab_size"], 800);
    assert_eq!(
        summary["texts"], 15_667,
        "the offline Brown corpus by default"
    );
    assert_eq!(summary["example"][0], "[CLS]");
    let vocab = std::fs::read_to_string(out.join("vocab.txt")).unwrap();
    assert_eq!(vocab.lines().count(), 800);
    assert!(out.join("tokenizer.json").exists());
    std::fs::remove_dir_all(&out).unwrap();

    expect_clear_error(
        &[
            "tokenizer",
            "train",
            "--data",
            "/nonexistent/corpus.txt",
            "--out",
            "/tmp/x",
        ],
        &[],
        &["/nonexistent/corpus.txt does not exist"],
    );
    expect_clear_error(
        &["tokenizer", "train", "--vocab-size", "2", "--out", "/tmp/x"],
        &[],
        &["vocab_size 2 is too small"],
    );
}

#[test]
fn plan_prints_the_memory_plan_and_exits_3_when_the_job_does_not_fit() {
    let plan = |extra: &[&str]| {
        let mut args = vec![
            "plan",
            "bert-mlm",
            "--preset",
            "bert-1.5b",
            "--workers",
            "8",
            "--device",
            "hpu",
        ];
        args.extend_from_slice(extra);
        trainbook(&args, &[], Duration::from_secs(60))
    };
    // 002's job on first-generation Gaudi: fits with its ZeRO-1 and bf16, not without ZeRO.
    let fits = plan(&["--device-memory", "32GiB"]);
    let text = String::from_utf8_lossy(&fits.stdout);
    assert_eq!(fits.status.code(), Some(0), "{text}");
    for part in [
        "1.53B parameters",
        "on 8 x hpu",
        "optimizer state",
        "activations",
        "fits:",
    ] {
        assert!(text.contains(part), "{part}: {text}");
    }
    let no_zero = plan(&["--device-memory", "32GiB", "--zero", "0"]);
    let text = String::from_utf8_lossy(&no_zero.stdout);
    assert_eq!(no_zero.status.code(), Some(3), "{text}");
    assert!(
        text.contains("does not fit") && text.contains("--zero 2"),
        "{text}"
    );
    let json = plan(&["--device-memory", "96GB", "--zero", "0", "--json"]);
    let v = last_json(&json);
    assert_eq!(json.status.code(), Some(0));
    assert_eq!(v["capacity"]["source"], "--device-memory");
    assert!(v["total"].as_u64().unwrap() < 96_000_000_000);
    // Without a device here and without --device-memory, the device cannot be planned for.
    let bad = plan(&[]);
    assert_eq!(bad.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&bad.stderr).contains("hpu"));
}
