//! The live dashboard under load: a flood of updates from 8 ranks is drawn at a bounded rate,
//! each drawing stays under a fixed size, and the final state is complete.

use std::sync::mpsc;
use std::time::{Duration, Instant};

use trainbook::dashboard::JobDashboard;
use trainbook::notebook::follow;
use trainbook::plumbing::format::Shown;
use trainbook::{JobStatus, JobUpdate, MetricRow, Progress, Stream};
use trainbook_widgets::DashboardOptions;

const RANKS: usize = 8;
/// Largest bundle the notebook may receive (it replaces the previous one in place).
const MAX_BUNDLE_BYTES: usize = 512 * 1024;

/// CPU time this thread has used so far (`CLOCK_THREAD_CPUTIME_ID`): what following costs,
/// whatever else runs on the machine.
fn thread_cpu_time() -> Duration {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    assert_eq!(rc, 0, "clock_gettime(CLOCK_THREAD_CPUTIME_ID)");
    Duration::new(ts.tv_sec as u64, ts.tv_nsec as u32)
}

fn metric(rank: usize, step: u64, epoch: u64, name: &str, value: f64) -> JobUpdate {
    JobUpdate::Metric(MetricRow {
        rank: rank as u32,
        step,
        epoch,
        name: name.into(),
        value,
        time: step as f64 / 1000.0,
    })
}

#[test]
fn a_flood_of_updates_from_8_ranks_is_drawn_at_a_bounded_rate_and_size() {
    let (tx, rx) = mpsc::channel();
    let rate = 100_000.0; // events per second
    let total = 200_000u64;
    let producer = std::thread::spawn(move || {
        let t0 = Instant::now();
        let mut sent = 0u64;
        let mut step = 0u64;
        while sent < total {
            step += 1;
            let epoch = step / 5_000;
            for rank in 0..RANKS {
                let loss = 2.0 / (1.0 + step as f64 / 1000.0) + rank as f64 * 0.01;
                tx.send(metric(rank, step, epoch, "loss", loss)).unwrap();
                tx.send(JobUpdate::Log(Shown {
                    rank,
                    stream: Stream::Stdout,
                    text: format!(
                        "step {step} loss {loss:.4} <with markup & a long tail {}>",
                        "x".repeat(step as usize % 300)
                    ),
                    repeats: None,
                    is_error: false,
                }))
                .unwrap();
                sent += 2;
            }
            if step.is_multiple_of(5_000) {
                for (name, v) in [
                    ("epoch_train_loss", 0.5),
                    ("eval_loss", 0.6),
                    ("eval_accuracy", 0.8),
                    ("samples_per_second", 1e4),
                ] {
                    tx.send(metric(0, step, epoch - 1, name, v)).unwrap();
                }
            }
            tx.send(JobUpdate::Progress(Progress {
                step,
                total_steps: total / (2 * RANKS as u64) + 1,
                epoch,
                epochs: 10,
                samples: step * 64,
                samples_per_second: 1e4,
                elapsed: t0.elapsed().as_secs_f64(),
            }))
            .unwrap();
            // Pace to `rate`.
            let due = Duration::from_secs_f64(sent as f64 / rate);
            if let Some(wait) = due.checked_sub(t0.elapsed()) {
                std::thread::sleep(wait);
            }
        }
        tx.send(JobUpdate::Finished(JobStatus::Succeeded)).unwrap();
        t0.elapsed()
    });

    let mut view = JobDashboard::from_parts(
        "flood · 8 workers on cpu".into(),
        RANKS,
        "/tmp/runs/flood".into(),
        DashboardOptions::default(),
    );
    let every = Duration::from_millis(500);
    let mut sizes = Vec::new();
    let t0 = Instant::now();
    let cpu0 = thread_cpu_time();
    let drawn = follow(&mut view, &rx, every, |b| {
        sizes.push(serde_json::to_vec(&b).unwrap().len());
    });
    let cpu = thread_cpu_time() - cpu0;
    let took = t0.elapsed();
    let produced_in = producer.join().unwrap();

    // It keeps up with the flood: folding and drawing it costs less CPU time than producing it
    // at its pace took (the wall clock would also count the time other processes had the core).
    assert!(
        cpu < produced_in,
        "following used {cpu:?} of CPU (in {took:?}), the flood was produced in {produced_in:?}"
    );
    let bound = (took.as_secs_f64() / every.as_secs_f64()).ceil() as usize + 1;
    assert!(
        drawn >= 2 && drawn <= bound,
        "{drawn} drawings in {took:?} (bound {bound})"
    );
    assert_eq!(drawn, sizes.len());
    let largest = *sizes.iter().max().unwrap();
    assert!(largest < MAX_BUNDLE_BYTES, "a drawing of {largest} bytes");

    // The final view: all steps in the curve (down-sampled for drawing), bounded logs, table.
    let final_bundle = view.bundle();
    let bytes = serde_json::to_vec(&final_bundle).unwrap().len();
    assert!(bytes < MAX_BUNDLE_BYTES, "final view is {bytes} bytes");
    let d = view.dashboard();
    assert_eq!(
        d.curves.train.last().map(|p| p.0 as u64),
        Some(total / (2 * RANKS as u64))
    );
    assert!(d.logs.lines().count() <= DashboardOptions::default().log_lines);
    assert_eq!(
        d.logs.hidden(),
        100_000 - 10,
        "every line but the last 10 counted as hidden"
    );
    eprintln!("{drawn} drawings in {took:?} ({cpu:?} of CPU); largest {largest} bytes, final {bytes} bytes");
    let text = final_bundle["text/plain"].as_str().unwrap();
    assert!(
        text.contains("more lines in /tmp/runs/flood/logs"),
        "{text}"
    );
    assert!(text.contains("val acc"), "{text}");
    let html = final_bundle["text/html"].as_str().unwrap();
    assert!(html.contains("&lt;with markup &amp; a long tail"));
    assert!(
        final_bundle.contains_key("image/png"),
        "a finished view carries the PNG"
    );
}

fn tiny(epochs: u64) -> trainbook::JobSpec {
    use trainbook::{Configure, ConfigureTraining};
    let runs = crate::common::scratch("dashboard-runs");
    trainbook::JobSpec::new("synthetic")
        .workers(2)
        .preset("tiny")
        .epochs(epochs)
        .device(trainbook::DeviceRequest::Cpu)
        .runs_root(runs)
}

/// A real two-worker job: the dashboard rebuilt from its history has the curve, the epoch
/// rows and the result view.
#[test]
fn a_finished_jobs_dashboard_has_curve_table_and_result() {
    let job = trainbook::launch(tiny(2)).unwrap();
    let result = job.wait().unwrap();
    let mut view = JobDashboard::with_history(&job).unwrap();
    view.finish(&job);
    let d = view.dashboard();
    assert_eq!(
        d.curves.train.last().map(|p| p.0 as u64),
        Some(result.steps)
    );
    assert_eq!(
        d.curves.val_accuracy.points().len(),
        2,
        "one validation point per epoch"
    );
    assert_eq!(d.table.rows().count(), 2);
    // Binary F1 (from the all-reduced confusion counts) has a column and a final value.
    let f1 = result.metrics["eval_f1"];
    assert!(d.table.rows().all(|(_, r)| r.extra.contains_key("val f1")));
    let b = view.bundle();
    assert!(
        b["text/plain"]
            .as_str()
            .unwrap()
            .contains(&format!("val f1 {}", trainbook_widgets::format_metric(f1))),
        "{}",
        b["text/plain"]
    );
    let text = b["text/plain"].as_str().unwrap();
    assert!(
        text.contains("✓ succeeded") && text.contains("100%"),
        "{text}"
    );
    // The best checkpoint (lowest validation loss), and the latest when that is another one.
    let last = result.last_checkpoint.unwrap().display().to_string();
    assert!(
        text.contains("checkpoint: ") && text.contains(&last),
        "{text}"
    );
    let html = b["text/html"].as_str().unwrap();
    assert!(
        html.contains("<svg") && html.contains("<details>"),
        "logs folded away on success"
    );
    assert!(b.contains_key("image/png"));
}

/// A rank that dies: the result view says failed, names the rank and keeps the logs open.
#[test]
fn a_failed_jobs_dashboard_shows_the_failing_ranks_error() {
    let job = trainbook::launch(tiny(200)).unwrap();
    let t0 = Instant::now();
    while job.progress().is_none_or(|p| p.step < 3) {
        assert!(
            t0.elapsed() < Duration::from_secs(60),
            "training never started"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(job.pids()[1] as i32),
        nix::sys::signal::Signal::SIGKILL,
    )
    .unwrap();
    assert!(job.wait().is_err());
    let mut view = JobDashboard::with_history(&job).unwrap();
    view.finish(&job);
    let b = view.bundle();
    let text = b["text/plain"].as_str().unwrap();
    assert!(
        text.contains("✗ failed") && text.contains("error: worker rank 1 failed"),
        "{text}"
    );
    let html = b["text/html"].as_str().unwrap();
    assert!(
        html.contains("worker rank 1 failed") && !html.contains("<details>"),
        "{html}"
    );
}
