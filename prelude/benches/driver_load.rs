//! The driver under the load of a thousand ranks: `bench/driver_load.sh` (which builds
//! `trainbook-simworker` and points `TRAINBOOK_WORKER` at it) runs this. One real driver, in
//! this process as in a notebook's, starts as many simulated workers as the first argument says
//! (default 1,024) that send what training ranks send over the real event protocol; this process
//! follows the job as the notebook view does (a subscription folded into the live dashboard)
//! and reports the driver's CPU time and memory, how long an event takes from a worker to the
//! subscriber, the dashboard's size, and what the de-duplicator made of lines every rank
//! printed alike.

use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::{bail, Context, Result};
use trainbook::dashboard::JobDashboard;
use trainbook::prelude::*;
use trainbook::{DeviceRequest, JobUpdate};

/// This process's CPU time (user + system) and peak resident memory.
fn usage() -> (Duration, u64) {
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut ru) };
    let t = |tv: libc::timeval| Duration::new(tv.tv_sec as u64, tv.tv_usec as u32 * 1000);
    (t(ru.ru_utime) + t(ru.ru_stime), ru.ru_maxrss as u64 * 1024)
}

/// Resident memory now (VmRSS), in bytes.
fn rss_now() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmRSS:"))
                .and_then(|l| l.split_whitespace().nth(1)?.parse::<u64>().ok())
        })
        .map_or(0, |kb| kb * 1024)
}

/// Milliseconds from a send stamped by the simulated worker (`step + ms / 1e6`, see
/// bench/simworker) to now.
fn latency_ms(value: f64) -> f64 {
    let sent = ((value.fract() * 1e6).round() as u64) % 1_000_000;
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
        % 1_000_000;
    ((now + 1_000_000 - sent) % 1_000_000) as f64
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    sorted[((sorted.len() - 1) as f64 * p).round() as usize]
}

fn main() -> Result<()> {
    if std::env::var_os("TRAINBOOK_WORKER").is_none() {
        bail!("run bench/driver_load.sh: it builds trainbook-simworker and sets TRAINBOOK_WORKER to it");
    }
    // Ranks, steps and milliseconds a step, from the command line; the simulated workers read
    // the last two from the environment they inherit.
    let args: Vec<u64> = std::env::args()
        .skip(1)
        .filter(|a| !a.starts_with("--"))
        .map(|a| {
            a.parse()
                .with_context(|| format!("{a} is not a whole number: pass RANKS STEPS STEP_MS"))
        })
        .collect::<Result<_>>()?;
    let arg = |i: usize, default: u64| args.get(i).copied().unwrap_or(default);
    let (ranks, steps, step_ms) = (arg(0, 1024) as usize, arg(1, 120), arg(2, 250));
    std::env::set_var("TRAINBOOK_SIM_STEPS", steps.to_string());
    std::env::set_var("TRAINBOOK_SIM_STEP_MS", step_ms.to_string());
    let spec = JobSpec::new("synthetic")
        .workers(ranks)
        .device(DeviceRequest::Cpu)
        .memory_check(false)
        .global_batch_size(8 * ranks)
        .max_steps(steps)
        .name("driver-load")
        .hang_timeout(Duration::from_secs(120));

    let (cpu0, _) = usage();
    let rss0 = rss_now();
    let t0 = Instant::now();
    let job = spec.launch()?;
    let launched = t0.elapsed();
    let updates = job.subscribe();
    let mut dashboard = JobDashboard::new(&job)?;
    let (mut latencies, mut counts) = (Vec::new(), [0u64; 3]);
    let warning = "the data loader fell behind";
    let mut warnings_shown = Vec::new();
    let (mut largest_bundle, mut rss_peak_seen) = (0usize, 0u64);
    let mut last_draw = Instant::now();
    for update in updates.iter() {
        match &update {
            JobUpdate::Metric(row) if row.name == "loss" => {
                latencies.push(latency_ms(row.value));
                counts[0] += 1;
            }
            JobUpdate::Log(line) => {
                counts[1] += 1;
                if line.text.contains(warning) {
                    let repeats = line.repeats.as_ref().map(|r| format!(" [{r}]"));
                    warnings_shown.push(format!(
                        "(rank {}) {}{}",
                        line.rank,
                        line.text,
                        repeats.unwrap_or_default()
                    ));
                }
            }
            _ => counts[2] += 1,
        }
        dashboard.apply(&update);
        // The notebook view redraws at most every 100 ms: measure what it would send.
        if last_draw.elapsed() >= Duration::from_millis(100) {
            last_draw = Instant::now();
            largest_bundle = largest_bundle.max(serde_json::to_vec(&dashboard.bundle())?.len());
            rss_peak_seen = rss_peak_seen.max(rss_now());
        }
        if matches!(update, JobUpdate::Finished(_)) {
            break;
        }
    }
    let result = job.wait();
    let wall = t0.elapsed();
    dashboard.finish(&job);
    let bundle = dashboard.bundle();
    let final_bundle = serde_json::to_vec(&bundle)?.len();
    if let Ok(out) = std::env::var("TRAINBOOK_SIM_BUNDLE") {
        std::fs::write(&out, serde_json::to_vec_pretty(&bundle)?)?;
    }
    let (cpu1, peak) = usage();
    latencies.sort_by(|a, b| a.total_cmp(b));
    let logs = job.logs();

    println!("driver load: {ranks} simulated ranks x {steps} steps of {step_ms} ms");
    println!(
        "  job: {:?} after {:.1} s (workers started in {:.1} s)",
        result.as_ref().map(|r| r.steps).map_err(|e| e.to_string()),
        wall.as_secs_f64(),
        launched.as_secs_f64()
    );
    println!(
        "  driver process CPU: {:.1} s ({:.0}% of one core over the run)",
        (cpu1 - cpu0).as_secs_f64(),
        100.0 * (cpu1 - cpu0).as_secs_f64() / wall.as_secs_f64()
    );
    println!(
        "  driver process memory: {:.0} MiB resident before, {:.0} MiB peak",
        rss0 as f64 / 1048576.0,
        peak as f64 / 1048576.0
    );
    println!(
        "  events to the subscriber: {} loss metrics, {} log lines, {} others",
        counts[0], counts[1], counts[2]
    );
    println!("  loss metric latency, worker send to subscriber: p50 {:.0} ms, p99 {:.0} ms, max {:.0} ms", percentile(&latencies, 0.5), percentile(&latencies, 0.99), percentile(&latencies, 1.0));
    println!(
        "  dashboard bundle: largest while running {:.0} KiB, final {:.0} KiB",
        largest_bundle as f64 / 1024.0,
        final_bundle as f64 / 1024.0
    );
    println!(
        "  job log (every rank's lines, for the run's logs): {} lines",
        logs.len()
    );
    println!("  the warning every rank printed, as the live view shows it: {warnings_shown:?}");
    let r = result?;
    if r.steps != steps {
        bail!("the job reported {} steps, not {steps}", r.steps);
    }
    Ok(())
}
