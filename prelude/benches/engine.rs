//! Engine benchmarks (not tests): `cargo bench -p trainbook --bench engine [-- a|b|c]`.
//! Prints one JSON line per measurement; `scripts/bench.sh` puts them side by side with the
//! PyTorch baseline measured in the same run.

use std::time::{Duration, Instant};

use trainbook::{Configure, ConfigureTraining, DeviceRequest, JobKind, JobSpec, JobUpdate};

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    let n = v.len();
    if n == 0 {
        return f64::NAN;
    }
    if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    }
}

fn root() -> std::path::PathBuf {
    std::env::temp_dir().join("trainbook-bench")
}

/// (a) allreduce of `numel` float32 values between 2 workers on loopback.
fn allreduce(numel: u64, iters: u64) {
    let spec = JobSpec::of_kind(JobKind::BenchAllreduce)
        .workers(2)
        .device(DeviceRequest::Cpu)
        .threads_per_worker(1)
        .runs_root(root())
        .env("TRAINBOOK_BENCH_NUMEL", numel.to_string())
        .env("TRAINBOOK_BENCH_ITERS", iters.to_string());
    let r = trainbook::fit(spec).expect("allreduce benchmark");
    // A collective is done when its slowest rank is: per iteration, the max over ranks (the
    // torch baseline measures the same way).
    let mut per_iter = std::collections::BTreeMap::<u64, f64>::new();
    for m in r
        .metric_rows
        .iter()
        .filter(|m| m.name == "allreduce_seconds")
    {
        let e = per_iter.entry(m.step).or_insert(0.0);
        *e = e.max(m.value);
    }
    let secs: Vec<f64> = per_iter.into_values().collect();
    let med = median(secs.clone());
    println!(
        "{}",
        serde_json::json!({"bench": "allreduce", "impl": "trainbook", "backend": "gloo", "world": 2, "numel": numel,
            "median_s": med, "min_s": secs.iter().cloned().fold(f64::INFINITY, f64::min),
            "gbytes_per_s": numel as f64 * 4.0 / med / 1e9})
    );
}

/// (b) samples/s of the same job as 2 workers x 1 thread and as 1 worker x 2 threads.
fn throughput(rounds: usize, steps: u64) {
    let run = |workers: usize, threads: usize| {
        let spec = JobSpec::new("synthetic")
            .workers(workers)
            .threads_per_worker(threads)
            .device(DeviceRequest::Cpu)
            .preset("bench")
            .max_steps(steps)
            .runs_root(root());
        trainbook::fit(spec)
            .expect("throughput run")
            .samples_per_second
    };
    let (mut dp, mut single) = (Vec::new(), Vec::new());
    // Interleaved, so drifting machine load hits both configurations alike.
    for _ in 0..rounds {
        dp.push(run(2, 1));
        single.push(run(1, 2));
    }
    let (a, b) = (median(dp.clone()), median(single.clone()));
    println!(
        "{}",
        serde_json::json!({"bench": "throughput", "preset": "bench", "steps": steps,
            "two_workers_one_thread": a, "one_worker_two_threads": b, "ratio": a / b,
            "runs_2x1": dp, "runs_1x2": single})
    );
}

/// (c) time from `launch` to the first loss event, tiny preset, 2 workers.
fn startup(rounds: usize) {
    let mut times = Vec::new();
    for _ in 0..rounds {
        let t0 = Instant::now();
        let spec = JobSpec::new("synthetic")
            .workers(2)
            .device(DeviceRequest::Cpu)
            .preset("tiny")
            .epochs(1)
            .runs_root(root());
        let job = trainbook::launch(spec).expect("launch");
        let rx = job.subscribe();
        let mut first = None;
        while let Ok(u) = rx.recv_timeout(Duration::from_secs(60)) {
            match u {
                JobUpdate::Metric(m) if m.name == "loss" => {
                    first = Some(t0.elapsed().as_secs_f64());
                    break;
                }
                JobUpdate::Finished(_) => break,
                _ => {}
            }
        }
        times.push(first.expect("a loss event arrived"));
        job.stop().ok();
    }
    println!(
        "{}",
        serde_json::json!({"bench": "startup", "workers": 2, "preset": "tiny", "median_s": median(times.clone()), "runs_s": times})
    );
}

/// (r) Restart latency: tiny BERT (synthetic), 2 workers, a step checkpoint every 100 steps,
/// rank 1 killed with SIGKILL at step `kill_at`: seconds from the kill to the restart decision,
/// to the first loss after the restart and to the loss of step `kill_at` again (the work lost
/// made up), and the steps replayed. Ray Train's side of the same job is `bench/ray_restart.py`.
fn restart(rounds: usize, kill_at: u64) {
    let (mut to_restart, mut to_loss, mut replayed) = (Vec::new(), Vec::new(), Vec::new());
    let mut to_recovered = Vec::new();
    for _ in 0..rounds {
        let spec = JobSpec::new("synthetic")
            .workers(2)
            .device(DeviceRequest::Cpu)
            .preset("tiny")
            .epochs(100)
            .max_steps(400)
            .checkpoint_every(100)
            .max_failures(1)
            .runs_root(root());
        let job = trainbook::launch(spec).expect("launch");
        let rx = job.subscribe();
        let mut killed = None;
        let mut restarted = None;
        let mut resumed_step = 0;
        let mut first_loss_seen = false;
        while let Ok(u) = rx.recv_timeout(Duration::from_secs(120)) {
            match u {
                // Rank 0's loss at step 200: rank 1 is there too (they step together).
                JobUpdate::Metric(m)
                    if m.name == "loss" && killed.is_none() && m.step >= kill_at =>
                {
                    let pid = job.pids()[1];
                    nix::sys::signal::kill(
                        nix::unistd::Pid::from_raw(pid as i32),
                        nix::sys::signal::Signal::SIGKILL,
                    )
                    .expect("kill rank 1");
                    killed = Some((Instant::now(), m.step));
                }
                JobUpdate::Restart(r) => {
                    restarted = killed.map(|(k, _)| k.elapsed().as_secs_f64());
                    resumed_step = r.resumed_step;
                }
                JobUpdate::Metric(m) if m.name == "loss" && m.rank == 0 && restarted.is_some() => {
                    let (k, at) = killed.expect("killed before the restart");
                    if !first_loss_seen {
                        first_loss_seen = true;
                        to_restart.push(restarted.unwrap_or(f64::NAN));
                        to_loss.push(k.elapsed().as_secs_f64());
                        replayed.push((at - resumed_step) as f64);
                    }
                    if m.step >= at {
                        to_recovered.push(k.elapsed().as_secs_f64());
                        break;
                    }
                }
                JobUpdate::Finished(_) => break,
                _ => {}
            }
        }
        let r = job.wait().expect("the restarted job succeeds");
        assert_eq!(r.restarts.len(), 1);
    }
    println!(
        "{}",
        serde_json::json!({"bench": "restart", "impl": "trainbook", "workers": 2, "preset": "tiny",
            "checkpoint_every": 100, "kill_at_step": kill_at,
            "median_kill_to_restart_s": median(to_restart.clone()),
            "median_kill_to_first_loss_s": median(to_loss.clone()),
            "median_kill_to_recovered_s": median(to_recovered.clone()),
            "kill_to_first_loss_s": to_loss, "kill_to_recovered_s": to_recovered,
            "steps_replayed": replayed})
    );
}

/// (o) What heartbeats and hang detection cost: BERT default preset, 2 workers x 1 thread,
/// samples/s with hang detection on (default) and off (`hang_timeout` 0: no heartbeat thread),
/// alternating `rounds` times.
fn heartbeat_overhead(rounds: usize, steps: u64) {
    let mut on = Vec::new();
    let mut off = Vec::new();
    for _ in 0..rounds {
        for (hang, out) in [(60, &mut on), (0, &mut off)] {
            let spec = JobSpec::new("bert")
                .workers(2)
                .device(DeviceRequest::Cpu)
                .threads_per_worker(1)
                .preset("default")
                .max_steps(steps)
                .eval_rows(0)
                .hang_timeout(Duration::from_secs(hang))
                .runs_root(root());
            let r = trainbook::fit(spec).expect("bert training");
            out.push(r.metrics["train_samples_per_second"]);
        }
    }
    let (m_on, m_off) = (median(on.clone()), median(off.clone()));
    println!(
        "{}",
        serde_json::json!({"bench": "heartbeat_overhead", "workers": 2, "preset": "bert default",
            "steps": steps, "samples_per_s_on": on, "samples_per_s_off": off,
            "median_on": m_on, "median_off": m_off, "on_over_off": m_on / m_off})
    );
}

/// The image input pipeline alone (decode + augment + batch, background threads), on the
/// offline digits at the default preset's size: images/s to compare with training samples/s.
fn pipeline(threads: usize, batches: usize) {
    use std::sync::Arc;
    use trainbook::recipes::vision::{folder::ImageFolder, loader, transforms};
    let folder = Arc::new(
        ImageFolder::scan(&trainbook::recipes::assets::digits_dir().join("train"))
            .expect("run `make setup` first"),
    );
    let per_batch = 16; // one worker's share of the default global batch of 32
    let plan: Vec<Vec<usize>> = (0..batches)
        .map(|b| {
            (0..per_batch)
                .map(|k| (b * per_batch + k * 37) % folder.len())
                .collect()
        })
        .collect();
    let mode = loader::Mode::Train {
        seed: 42,
        epoch: 0,
        augment: transforms::Augment {
            min_scale: 0.6,
            flip: false,
        },
    };
    let t0 = Instant::now();
    let mut p = loader::Pipeline::start(
        folder,
        plan,
        64,
        mode,
        threads,
        4,
        trainbook::engine::Device::Cpu,
    );
    let mut n = 0;
    while let Some(b) = p.next_batch() {
        n += b.expect("batch").indices.len();
    }
    let secs = t0.elapsed().as_secs_f64();
    println!(
        "{}",
        serde_json::json!({"bench": "pipeline", "threads": threads, "image_size": 64, "images": n, "seconds": secs, "images_per_second": n as f64 / secs})
    );
}

fn main() {
    let args: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| !a.starts_with("--"))
        .collect();
    let want = |k: &str| args.is_empty() || args.iter().any(|a| a == k);
    let num = |k: &str, d: u64| {
        std::env::var(k)
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(d)
    };
    if want("a") {
        allreduce(num("BENCH_NUMEL", 110_000_000), num("BENCH_ITERS", 10));
    }
    if want("b") {
        throughput(num("BENCH_ROUNDS", 3) as usize, num("BENCH_STEPS", 60));
    }
    if want("c") {
        startup(num("BENCH_ROUNDS", 5) as usize);
    }
    if want("r") {
        restart(num("BENCH_ROUNDS", 3) as usize, num("BENCH_KILL_AT", 250));
    }
    if want("o") {
        heartbeat_overhead(num("BENCH_ROUNDS", 3) as usize, num("BENCH_STEPS", 40));
    }
    if want("p") {
        for threads in [1, 2] {
            pipeline(threads, num("BENCH_BATCHES", 100) as usize);
        }
    }
}
