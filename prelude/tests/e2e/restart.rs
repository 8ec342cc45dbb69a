//! A run that survives its failures: workers killed or stopped mid-run, a driver killed and
//! the same command run again. Real worker processes, real signals, real gloo collectives; the
//! tiny synthetic recipe keeps each test to seconds.

use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::common::{last_model, wait_until};

use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use trainbook::engine::testing::{children_of, process_alive};
use trainbook::{Configure, ConfigureTraining, Job, JobSpec, JobStatus, TrainResult};

fn runs_root() -> PathBuf {
    crate::common::scratch("trainbook-restart-tests")
}

/// 400 steps of 2 workers, a step checkpoint every 50: long enough to kill a worker in the
/// middle, short enough for a test.
fn long_run() -> JobSpec {
    JobSpec::new("synthetic")
        .workers(2)
        .preset("tiny")
        .device(trainbook::DeviceRequest::Cpu)
        .runs_root(runs_root())
        .epochs(10)
        .max_steps(400)
        .checkpoint_every(50)
}

fn wait_for_step(job: &Job, step: u64) {
    assert!(
        wait_until(Duration::from_secs(120), || job
            .progress()
            .is_some_and(|p| p.step >= step)),
        "the job never reached step {step}"
    );
}

fn signal(pid: u32, s: Signal) {
    kill(Pid::from_raw(pid as i32), s).unwrap();
}

/// The run ends where the same run without the failure ends.
fn assert_same_run(restarted: &TrainResult, straight: &TrainResult) {
    assert_eq!(restarted.steps, straight.steps);
    let diff = crate::common::max_abs_diff(&last_model(restarted), &last_model(straight));
    assert!(diff <= 1e-5, "max abs parameter difference {diff}");
    assert!(
        (restarted.param_l2 - straight.param_l2).abs() <= 1e-5,
        "param_l2 {} vs {}",
        restarted.param_l2,
        straight.param_l2
    );
}

/// Every (rank, step, metric) once: replayed steps replaced the lost ones.
fn assert_no_duplicate_rows(r: &TrainResult) {
    let mut seen = HashSet::new();
    for row in &r.metric_rows {
        assert!(
            seen.insert((row.rank, row.step, row.name.clone())),
            "metric {} of rank {} at step {} appears twice",
            row.name,
            row.rank,
            row.step
        );
    }
    let losses = r
        .metric_rows
        .iter()
        .filter(|m| m.name == "loss" && m.rank == 0)
        .count();
    assert_eq!(losses as u64, r.steps, "one loss row per step of rank 0");
}

#[test]
fn a_killed_worker_restarts_from_the_newest_checkpoint_and_ends_like_an_unbroken_run() {
    let job = trainbook::launch(long_run().max_failures(1)).unwrap();
    wait_for_step(&job, 120);
    let first = job.pids();
    signal(first[1], Signal::SIGKILL);
    let r = job.wait().expect("the job restarts and succeeds");
    assert_eq!(r.status, JobStatus::Succeeded);
    assert_eq!(r.restarts.len(), 1, "{:?}", r.restarts);
    let restart = &r.restarts[0];
    eprintln!("{restart}");
    assert_eq!(restart.rank, Some(1));
    assert!(restart.reason.contains("SIGKILL"), "{}", restart.reason);
    assert_eq!((restart.number, restart.allowed), (1, Some(1)));
    let checkpoint = restart
        .checkpoint
        .as_ref()
        .expect("resumed from a checkpoint");
    assert!(
        checkpoint.starts_with(&r.run_dir),
        "{}",
        checkpoint.display()
    );
    assert!(restart.resumed_step >= 100, "{restart:?}");
    assert!(restart.steps_lost <= 64, "{restart:?}");
    assert!(
        restart
            .to_string()
            .starts_with("restart 1/1: rank 1 killed by signal 9 (SIGKILL)"),
        "{restart}"
    );
    assert_eq!(r.to_json()["restarts"][0]["rank"], 1);
    assert_no_duplicate_rows(&r);
    for p in first {
        assert!(
            !process_alive(p),
            "worker {p} of the first start still alive"
        );
    }
    let straight = trainbook::fit(long_run()).unwrap();
    assert!(straight.restarts.is_empty());
    assert_same_run(&r, &straight);
}

/// Rank 0 killed while its background checkpoint write is in flight (its staged directory is
/// there): the restart resumes from the newest complete checkpoint, never the half-written one,
/// removes what the write left, and the run ends like an unbroken one. The bench preset's
/// checkpoint (tens of MB with the optimizer state) takes long enough to write to be caught mid-write.
#[test]
fn a_kill_during_a_background_checkpoint_write_resumes_from_the_last_complete_one() {
    let spec = || {
        long_run()
            .preset("bench")
            .max_steps(40)
            .checkpoint_every(10)
            .checkpoint_async(true)
    };
    let job = trainbook::launch(spec().max_failures(1)).unwrap();
    let checkpoints = job.run_dir().join("checkpoints");
    let staged = |dir: &Path| -> Vec<String> {
        std::fs::read_dir(dir)
            .into_iter()
            .flatten()
            .filter_map(|e| e.ok())
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .filter(|n| n.contains(".tmp-"))
            .collect()
    };
    // Past the first checkpoints (a restart then has one to resume from), then the moment a
    // write is staged.
    wait_for_step(&job, 12);
    let rank0 = job.pids()[0];
    let mut caught = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(60);
    while caught.is_empty() && Instant::now() < deadline {
        caught = staged(&checkpoints);
        caught.retain(|n| n.starts_with(".step-"));
        if caught.is_empty() {
            std::thread::sleep(Duration::from_micros(200));
        }
    }
    assert!(!caught.is_empty(), "no checkpoint write was seen in flight");
    signal(rank0, Signal::SIGKILL);
    let step_of = |name: &str| -> u64 {
        name.trim_start_matches(".step-")
            .split(".tmp-")
            .next()
            .and_then(|n| n.parse().ok())
            .unwrap_or_else(|| panic!("unexpected staged name {name}"))
    };
    let killed_at = step_of(&caught[0]);
    let r = job.wait().expect("the job restarts and succeeds");
    assert_eq!(r.status, JobStatus::Succeeded);
    assert_eq!(r.restarts.len(), 1, "{:?}", r.restarts);
    let restart = &r.restarts[0];
    let from = restart
        .checkpoint
        .as_ref()
        .expect("resumed from a checkpoint");
    let complete = checkpoints.join(format!("step-{}", killed_at - 10));
    // The write caught in flight had not finished: the restart took the one before it (or,
    // if the caught write completed before the kill landed, that one).
    assert!(
        *from == complete || *from == checkpoints.join(format!("step-{killed_at}")),
        "resumed from {} with step-{killed_at} being written",
        from.display()
    );
    eprintln!(
        "killed with step-{killed_at} in flight; resumed from {}",
        from.display()
    );
    assert!(
        staged(&checkpoints).is_empty(),
        "{:?}",
        staged(&checkpoints)
    );
    let straight = trainbook::fit(spec()).unwrap();
    assert_same_run(&r, &straight);
}

#[test]
fn a_second_failure_beyond_max_failures_fails_naming_both() {
    let job = trainbook::launch(long_run().max_failures(1)).unwrap();
    wait_for_step(&job, 60);
    let first = job.pids();
    signal(first[1], Signal::SIGKILL);
    assert!(
        wait_until(Duration::from_secs(60), || {
            job.pids() != first && job.progress().is_some()
        }),
        "the job did not restart"
    );
    let resumed = job.result().unwrap().restarts[0].resumed_step;
    wait_for_step(&job, resumed + 5);
    let second = job.pids();
    signal(second[1], Signal::SIGKILL);
    let err = format!(
        "{:#}",
        job.wait().expect_err("max_failures 1 allows one restart")
    );
    assert!(
        err.contains("worker rank 1 failed (killed by signal 9 (SIGKILL))"),
        "{err}"
    );
    assert!(
        err.contains("earlier failures:\nrestart 1/1: rank 1 killed by signal 9"),
        "{err}"
    );
    assert!(
        err.contains("not restarted: the job already restarted 1 time(s)"),
        "{err}"
    );
    assert_eq!(job.status(), JobStatus::Failed);
    for p in first.into_iter().chain(second) {
        assert!(!process_alive(p), "worker {p} still alive");
    }
}

#[test]
fn the_same_error_at_the_same_step_is_not_retried() {
    // A learning rate of 1e6 diverges at the same step every time.
    let spec = long_run().lr(1e6).max_failures(3);
    let job = trainbook::launch(spec).unwrap();
    let err = format!("{:#}", job.wait().expect_err("a diverging run fails"));
    assert!(err.contains("loss became"), "{err}");
    assert!(err.contains("failed with the same error at step"), "{err}");
    let r = job.result().unwrap();
    assert_eq!(
        r.restarts.len(),
        1,
        "one retry, not three: {:?}",
        r.restarts
    );
}

#[test]
fn a_stopped_worker_is_declared_hung_reported_and_restarted() {
    let spec = long_run()
        .max_failures(1)
        .hang_timeout(Duration::from_secs(3));
    let job = trainbook::launch(spec).unwrap();
    wait_for_step(&job, 120);
    let first = job.pids();
    let report = job.run_dir().join("hangs").join("attempt-0-rank-1.txt");
    let t0 = Instant::now();
    signal(first[1], Signal::SIGSTOP);
    // Detected (its report started) within its limit + 5 s: hang_timeout, unless 5 times the
    // slowest step so far is longer (a shared machine can stall a step). The restart follows
    // once eu-stack has the stack.
    assert!(
        wait_until(Duration::from_secs(60), || report.exists()),
        "no hang detected"
    );
    let detected = t0.elapsed();
    let first_line = std::fs::read_to_string(&report).unwrap_or_default();
    let limit: f64 = first_line
        .split("(limit ")
        .nth(1)
        .and_then(|l| l.split(' ').next())
        .and_then(|l| l.parse().ok())
        .unwrap_or_else(|| panic!("no limit in the report: {first_line}"));
    eprintln!("hang detected after {detected:?} (limit {limit} s)");
    assert!(limit >= 3.0, "{first_line}");
    assert!(
        detected.as_secs_f64() <= limit + 5.0,
        "detected after {detected:?}, limit {limit} s"
    );
    assert!(
        wait_until(Duration::from_secs(60), || !job
            .result()
            .unwrap()
            .restarts
            .is_empty()),
        "no restart after the hang"
    );
    eprintln!("restarted after {:?}", t0.elapsed());
    let r = job.wait().expect("the restarted job succeeds");
    let restart = &r.restarts[0];
    assert_eq!(restart.rank, Some(1), "{restart:?}");
    assert!(restart.reason.contains("hung"), "{restart}");
    let text =
        std::fs::read_to_string(&report).unwrap_or_else(|e| panic!("{}: {e}", report.display()));
    assert!(text.starts_with("rank 1 hung: no progress for"), "{text}");
    assert!(text.contains("stopped or frozen"), "{text}");
    assert!(text.contains("native stack:"), "{text}");
    if Path::new("/usr/bin/eu-stack").exists() || Path::new("/usr/bin/gdb").exists() {
        assert!(
            text.contains("#0 "),
            "the native stack is in the report:\n{text}"
        );
        // Symbolised frames: trainbook's own, or, when the stopped thread sits in a library
        // the unwinder cannot walk out of (MKL's sgemm has no frame info), any Rust thread's.
        assert!(
            text.contains("trainbook_engine") || text.contains("__rust_begin_short_backtrace"),
            "with symbols:\n{text}"
        );
    }
    for p in first {
        assert!(!process_alive(p), "worker {p} still alive");
    }
    assert_no_duplicate_rows(&r);
}

/// `trainbook train ... --name N --resume auto`, as a Slurm requeue runs it.
fn cli(name: &str) -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_trainbook"));
    c.args([
        "train",
        "synthetic",
        "--workers",
        "2",
        "--device",
        "cpu",
        "--preset",
        "tiny",
        "--epochs",
        "10",
        "--max-steps",
        "400",
        "--checkpoint-every",
        "50",
        "--name",
        name,
        "--resume",
        "auto",
        "--json",
    ])
    .env("TRAINBOOK_RUNS", runs_root())
    .stdin(Stdio::null());
    c
}

#[test]
fn a_killed_driver_resumes_on_re_run_and_a_finished_run_is_not_trained_again() {
    let name = format!("resume-auto-{}", std::process::id());
    let run_dir = runs_root().join(&name);
    std::fs::remove_dir_all(&run_dir).ok();
    let mut driver = cli(&name)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let step_100 = run_dir
        .join("checkpoints")
        .join("step-100")
        .join("trainer_state.json");
    let mut workers = Vec::new();
    assert!(
        wait_until(Duration::from_secs(120), || {
            workers = children_of(driver.id());
            step_100.exists()
        }),
        "no checkpoint at step 100"
    );
    driver.kill().unwrap();
    driver.wait().unwrap();
    assert!(wait_until(Duration::from_secs(5), || workers
        .iter()
        .all(|&w| !process_alive(w))));

    let out = cli(&name).output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert!(stderr.contains("resumed from"), "{stderr}");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let summary: serde_json::Value = serde_json::from_str(stdout.lines().last().unwrap()).unwrap();
    assert_eq!(summary["steps"], 400);
    assert_eq!(
        summary["run_dir"],
        run_dir.canonicalize().unwrap().display().to_string()
    );
    let straight = trainbook::fit(long_run()).unwrap();
    let l2 = summary["param_l2"].as_f64().unwrap();
    assert!(
        (l2 - straight.param_l2).abs() <= 1e-5,
        "{l2} vs {}",
        straight.param_l2
    );
    let last = straight
        .last_checkpoint
        .as_ref()
        .unwrap()
        .file_name()
        .unwrap();
    let resumed_model = run_dir
        .join("checkpoints")
        .join(last)
        .join("model.safetensors");
    let diff = crate::common::max_abs_diff(&resumed_model, &last_model(&straight));
    assert!(diff <= 1e-5, "max abs parameter difference {diff}");

    // The same command once more: the run is done, and says so.
    let again = cli(&name).output().unwrap();
    let stderr = String::from_utf8_lossy(&again.stderr);
    assert!(!again.status.success());
    assert!(
        stderr.contains(&format!("run '{name}' already finished")),
        "{stderr}"
    );
    std::fs::remove_dir_all(&run_dir).ok();
}

#[test]
fn a_named_run_with_checkpoints_is_not_started_over_by_mistake() {
    let name = format!("named-{}", std::process::id());
    let run_dir = runs_root().join(&name);
    std::fs::remove_dir_all(&run_dir).ok();
    // Stopped well before its end (400 steps), past its step-50 checkpoint.
    let spec = || long_run().name(&name);
    let job = trainbook::launch(spec()).unwrap();
    wait_for_step(&job, 55);
    job.stop().unwrap();
    assert_eq!(job.status(), JobStatus::Stopped);
    let err = format!("{:#}", trainbook::fit(spec()).unwrap_err());
    assert!(
        err.contains("already has checkpoints") && err.contains("--resume auto"),
        "{err}"
    );
    let r = trainbook::fit(spec().resume(trainbook::Resume::Auto)).unwrap();
    assert_eq!(r.steps, 400);
    let err = format!(
        "{:#}",
        trainbook::fit(long_run().resume(trainbook::Resume::Auto)).unwrap_err()
    );
    assert!(err.contains("needs a run name"), "{err}");
    std::fs::remove_dir_all(&run_dir).ok();
}

#[test]
fn time_based_checkpoints_are_written_when_the_minutes_have_passed() {
    let spec = JobSpec::new("synthetic")
        .workers(2)
        .preset("tiny")
        .device(trainbook::DeviceRequest::Cpu)
        .runs_root(runs_root())
        .max_steps(60)
        // 30 ms: due at every check (every 10 steps, which take longer than that).
        .checkpoint_every_minutes(0.0005);
    let r = trainbook::fit(spec).unwrap();
    let mut steps: Vec<u64> = std::fs::read_dir(r.run_dir.join("checkpoints"))
        .unwrap()
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.strip_prefix("step-")?.parse().ok())
        .collect();
    steps.sort();
    assert_eq!(steps, [10, 20, 30, 40, 50]);
    let err = format!(
        "{:#}",
        trainbook::fit(long_run().checkpoint_every_minutes(0.0)).unwrap_err()
    );
    assert!(err.contains("checkpoint_every_minutes is 0"), "{err}");
}
