//! End-to-end tests of the engine: real worker processes, real gloo collectives, real zeromq
//! event streams. Tiny configurations keep each test to seconds.

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::common::wait_until;

use trainbook::engine::testing::process_alive;
use trainbook::{Configure, ConfigureTraining, JobKind, JobSpec, JobStatus, OptimizerKind};

fn runs_root() -> std::path::PathBuf {
    crate::common::scratch("trainbook-engine-tests")
}

fn tiny(workers: usize) -> JobSpec {
    JobSpec::new("synthetic")
        .workers(workers)
        .preset("tiny")
        .device(trainbook::DeviceRequest::Cpu)
        .runs_root(runs_root())
}

/// (a) 2 workers with batch b/2 each end where 1 worker with batch b ends.
#[test]
fn data_parallel_matches_single_worker() {
    let run = |workers| {
        let spec = tiny(workers)
            .optimizer(OptimizerKind::Sgd)
            .dropout(0.0)
            .seed(7)
            .global_batch_size(8)
            .max_steps(20);
        trainbook::fit(spec).expect("training succeeds")
    };
    let one = run(1);
    let two = run(2);
    assert_eq!(one.steps, 20);
    assert_eq!(two.steps, 20);
    let max_diff = crate::common::max_abs_diff(
        &crate::common::last_model(&one),
        &crate::common::last_model(&two),
    );
    assert!(max_diff <= 1e-5, "max abs parameter difference {max_diff}");
    assert!(
        (one.param_sum - two.param_sum).abs() < 1e-3,
        "{} vs {}",
        one.param_sum,
        two.param_sum
    );
    // The starting point was trained away from: the comparison is not vacuous.
    assert!(one.final_train_loss.is_finite());
}

/// An epoch's last step with fewer samples than workers: 1,024 samples in steps of 33 leave
/// one for the last, so rank 0 trains it and ranks 1 and 2 take part with weightless samples.
/// 3 workers, replicated and with ZeRO-2 (whose gradient hooks reduce during the backward
/// pass), end where 1 worker ends: every sample of the epoch is trained once, whatever the
/// number of workers.
#[test]
fn an_epoch_s_last_step_is_one_worker_s_whatever_the_worker_count() {
    let run = |workers, zero, (batch, accum)| {
        let spec = tiny(workers)
            .optimizer(OptimizerKind::Sgd)
            .dropout(0.0)
            .seed(7)
            .global_batch_size(batch)
            .grad_accum(accum)
            .epochs(1)
            .zero(zero);
        trainbook::fit(spec).expect("training succeeds")
    };
    // Steps of 66 in 2 micro-batches leave 34 for the last: 33 in the first (11 a rank), one
    // in the second (rank 0's), so ranks 1 and 2 weight their only sampled micro-batch.
    for (batch, accum, steps, zeros) in [(33, 1, 32, &[0, 2][..]), (66, 2, 16, &[0][..])] {
        let one = run(1, 0, (batch, 1));
        assert_eq!(one.steps, steps);
        for &zero in zeros {
            let three = run(3, zero, (batch, accum));
            assert_eq!(three.steps, steps);
            let max_diff = crate::common::max_abs_diff(
                &crate::common::last_model(&one),
                &crate::common::last_model(&three),
            );
            assert!(
                max_diff <= 1e-5,
                "batch {batch} in {accum}, zero {zero}: max abs parameter difference {max_diff}"
            );
        }
    }
}

/// (b) allreduce / broadcast / barrier with three processes.
#[test]
fn collectives_are_correct_with_three_workers() {
    let spec = JobSpec::of_kind(JobKind::Check)
        .workers(3)
        .device(trainbook::DeviceRequest::Cpu)
        .runs_root(runs_root());
    let r = trainbook::fit(spec).expect("collective checks pass");
    assert_eq!(r.status, JobStatus::Succeeded);
    let log = std::fs::read_to_string(r.run_dir.join("logs/rank2.log")).unwrap();
    assert!(log.contains("collectives ok"), "{log}");
}

/// Training through the job API: loss goes down, metrics and files land in the run directory.
#[test]
fn job_reports_metrics_logs_and_checkpoints() {
    let job = trainbook::launch(tiny(2).epochs(2)).unwrap();
    let r = job.wait().unwrap();
    let table = job.metrics().unwrap();
    assert_eq!(
        table.column_names(),
        ["rank", "step", "epoch", "name", "value", "time"]
    );
    let losses: Vec<f64> = job
        .logs()
        .iter()
        .filter(|l| l.rank == 0 && l.text.starts_with("train epoch:"))
        .map(|l| l.text.rsplit(':').next().unwrap().parse().unwrap())
        .collect();
    assert_eq!(
        losses.len() as u64,
        r.steps,
        "one loss line per step on rank 0"
    );
    let n = losses.len() / 4;
    let first: f64 = losses[..n].iter().sum::<f64>() / n as f64;
    let last: f64 = losses[losses.len() - n..].iter().sum::<f64>() / n as f64;
    assert!(
        last < first * 0.9,
        "loss should fall: first quarter {first:.4}, last quarter {last:.4}"
    );
    assert!(r.metrics["eval_accuracy"] > 0.6, "{:?}", r.metrics);
    for f in [
        "config.json",
        "metrics.parquet",
        "logs/rank0.log",
        "logs/rank1.log",
    ] {
        assert!(r.run_dir.join(f).exists(), "{f} missing");
    }
    let parquet =
        trainbook::engine::checkpoint::read_metrics(&r.run_dir.join("metrics.parquet")).unwrap();
    assert_eq!(parquet.height(), table.height());
    assert_eq!(
        r.last_checkpoint.as_ref().unwrap().file_name().unwrap(),
        "epoch-1"
    );
    assert!(r.best_checkpoint.is_some());
    // No temporary files left behind by atomic writes.
    let leftovers: Vec<_> = walk(&r.run_dir)
        .into_iter()
        .filter(|p| p.to_string_lossy().contains(".tmp-"))
        .collect();
    assert!(leftovers.is_empty(), "{leftovers:?}");
}

fn walk(dir: &Path) -> Vec<std::path::PathBuf> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir).unwrap().flatten() {
        let p = e.path();
        if p.is_dir() {
            out.extend(walk(&p));
        }
        out.push(p);
    }
    out
}

/// (c) a worker killed mid-run: the job fails within 5 s naming it; no worker survives.
#[test]
fn killed_worker_fails_the_job_fast_and_leaves_nothing() {
    let job = trainbook::launch(tiny(2).epochs(200)).unwrap();
    assert!(
        wait_until(Duration::from_secs(60), || job
            .progress()
            .map(|p| p.step > 5)
            .unwrap_or(false)),
        "training never started"
    );
    let pids = job.pids();
    let t0 = Instant::now();
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(pids[1] as i32),
        nix::sys::signal::Signal::SIGKILL,
    )
    .unwrap();
    let err = job.wait().expect_err("the job must fail");
    let took = t0.elapsed();
    assert!(took < Duration::from_secs(5), "took {took:?}");
    let msg = format!("{err:#}");
    assert!(msg.contains("rank 1") && msg.contains("SIGKILL"), "{msg}");
    assert_eq!(job.status(), JobStatus::Failed);
    for p in pids {
        assert!(!process_alive(p), "worker {p} still alive");
    }
}

/// (f) messages without the job's token never become events.
#[test]
fn event_socket_ignores_messages_without_the_token() {
    let job = trainbook::launch(tiny(1).epochs(3)).unwrap();
    let endpoint = job.events_endpoint().to_string();
    let forged =
        serde_json::json!({"type": "log", "rank": 0, "stream": "stdout", "text": "INJECTED"})
            .to_string();
    trainbook::engine::testing::send_raw(
        &endpoint,
        vec![b"not-the-token".to_vec(), forged.clone().into_bytes()],
    )
    .unwrap();
    trainbook::engine::testing::send_raw(&endpoint, vec![forged.into_bytes()]).unwrap();
    job.wait().unwrap();
    assert!(job.logs().iter().all(|l| !l.text.contains("INJECTED")));
    assert_eq!(job.dropped_events(), 2);
}

/// stop() ends a running job promptly with an Interrupted error and no survivors.
#[test]
fn stop_terminates_workers() {
    let job = trainbook::launch(tiny(2).epochs(200)).unwrap();
    assert!(wait_until(Duration::from_secs(60), || job
        .progress()
        .is_some()));
    let pids = job.pids();
    let t0 = Instant::now();
    job.stop().unwrap();
    assert!(t0.elapsed() < Duration::from_secs(5));
    assert_eq!(job.status(), JobStatus::Stopped);
    let err = job.wait().unwrap_err();
    assert!(err
        .downcast_ref::<trainbook::TrainError>()
        .is_some_and(|e| matches!(e, trainbook::TrainError::Interrupted { .. })));
    for p in pids {
        assert!(!process_alive(p));
    }
}

/// (d) the launching process killed with SIGKILL: every worker exits within 5 s.
#[test]
fn workers_die_with_their_parent() {
    let mut cli = Command::new(env!("CARGO_BIN_EXE_trainbook"))
        .args([
            "train",
            "synthetic",
            "--workers",
            "2",
            "--device",
            "cpu",
            "--epochs",
            "200",
        ])
        .env("TRAINBOOK_RUNS", runs_root())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let pid = cli.id();
    let mut workers = Vec::new();
    assert!(wait_until(Duration::from_secs(60), || {
        workers = trainbook::engine::testing::children_of(pid);
        workers.len() == 2
    }));
    std::thread::sleep(Duration::from_millis(500));
    cli.kill().unwrap();
    cli.wait().unwrap();
    let t0 = Instant::now();
    assert!(
        wait_until(Duration::from_secs(5), || workers
            .iter()
            .all(|&w| !process_alive(w))),
        "workers {workers:?} outlived their parent"
    );
    eprintln!("workers gone {:?} after the parent's death", t0.elapsed());
}

/// A worker that fails by itself (training diverges) ends the job with its own message.
#[test]
fn worker_error_reaches_the_caller() {
    let spec = tiny(2).optimizer(OptimizerKind::Sgd).lr(1e6).epochs(5);
    let err = trainbook::fit(spec).expect_err("a learning rate of 1e6 must diverge");
    let msg = format!("{err:#}");
    assert!(
        msg.contains("loss became") && msg.contains("lower the learning rate"),
        "{msg}"
    );
    assert!(msg.contains("worker rank"), "{msg}");
}

/// A peer that stops answering without dying (SIGSTOP) turns into a timeout error, not a hang.
#[test]
fn stalled_peer_times_out_instead_of_hanging() {
    let spec = tiny(2)
        .epochs(200)
        .collective_timeout(Duration::from_secs(3));
    let job = trainbook::launch(spec).unwrap();
    assert!(wait_until(Duration::from_secs(60), || job
        .progress()
        .map(|p| p.step > 5)
        .unwrap_or(false)));
    let pids = job.pids();
    let t0 = Instant::now();
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(pids[1] as i32),
        nix::sys::signal::Signal::SIGSTOP,
    )
    .unwrap();
    let err = job.wait().expect_err("a stalled peer must fail the job");
    let took = t0.elapsed();
    // The 3 s collective timeout, then at most the 2 s stop grace (a stopped process ignores
    // SIGTERM, so it is killed).
    assert!(took < Duration::from_secs(12), "took {took:?}");
    eprintln!("{err:#}");
    let msg = format!("{err:#}").to_lowercase();
    assert!(
        msg.contains("rank 0") && (msg.contains("timed out") || msg.contains("timeout")),
        "{msg}"
    );
    for p in pids {
        assert!(!process_alive(p), "worker {p} still alive");
    }
}

/// A checkpoint written before the checkpoint format had one owner (tests/fixtures) resumes:
/// its trainer state reads, its weights and optimizer state load, and training continues from
/// its step with what it recorded (1 worker, batch 8, no accumulation).
#[test]
fn a_checkpoint_of_an_earlier_version_resumes() {
    let fixture = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../tests/fixtures/checkpoint-v0/synthetic-epoch-0");
    let r = trainbook::fit(tiny(1).resume_from(&fixture).epochs(1).max_steps(5)).unwrap();
    assert_eq!(r.status, JobStatus::Succeeded);
    assert_eq!(r.steps, 5, "continues from the checkpoint's step 3");
    let state = trainbook::engine::checkpoint::TrainerState::read(
        r.last_checkpoint.as_ref().expect("a checkpoint"),
    )
    .unwrap();
    assert_eq!((state.step, state.world_size), (5, Some(1)));
    assert_eq!(state.hyper["resume_from"], fixture.display().to_string());
    // The run's config.json records the resolved hyper-parameters the workers received.
    let config =
        trainbook::engine::checkpoint::RunConfig::read(&r.run_dir.join("config.json")).unwrap();
    let hyper = config.hyper.expect("a recipe job has hyper-parameters");
    assert_eq!((hyper.preset.as_str(), hyper.max_steps), ("tiny", Some(5)));
    // Another worker count that splits the batch of 8 evenly continues its mid-epoch position.
    let two = trainbook::fit(tiny(2).resume_from(&fixture).epochs(1).max_steps(5)).unwrap();
    assert_eq!((two.status, two.steps), (JobStatus::Succeeded, 5));
}
