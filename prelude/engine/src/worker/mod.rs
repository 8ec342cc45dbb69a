//! The worker side: one process per device, exec'd by the driver, that joins the job's
//! process group, trains one rank and reports back through events. Nothing here knows the
//! driver; what the two sides share is in `crate::shared` (the environment contract, the
//! events wire, the checkpoint format).
//!
//! - [`recipe`], [`task`]: what a worker trains (the engine's recipe contract, users' tasks).
//! - [`train`]: the training loop, a [`TrainingLoop`](train::TrainingLoop).
//! - [`strategy`], [`ddp`], [`zero`], [`units`]: how gradients become an update (replicated or
//!   sharded), and parameters sharded by unit (ZeRO-3).
//! - [`optim`], [`precision`], [`sampler`], [`scores`]: optimizers and schedules, autocast,
//!   data sharding, exact classification scores.
//! - [`dist`], [`device`], [`check`]: c10d collectives, tensor placement, collective checks.
//! - [`heartbeat`]: the pulse the driver's hang detection watches.
//! - [`recompute`]: activation checkpointing (a block run again in the backward pass).

mod check;
mod checkpoint_writer;
pub(crate) mod ddp;
pub(crate) mod device;
pub(crate) mod dist;
mod grad_hooks;
mod graph;
mod heartbeat;
pub(crate) mod jobs;
pub(crate) mod memory;
mod optim;
mod precision;
mod profiler;
pub(crate) mod recipe;
pub(crate) mod recompute;
mod sampler;
mod scores;
pub(crate) mod slices;
mod strategy;
pub(crate) mod task;
mod train;
pub(crate) mod units;
pub(crate) mod zero;

use std::path::Path;
use std::time::Duration;

use anyhow::{anyhow, Context, Result};
use trainbook_api::DeviceKind;

use crate::shared::checkpoint::RunConfig;
use crate::shared::env::{
    HpuProbe, CONFIG, DEVICE, EVENTS, PROBE_HPU, RESUME, RUN_DIR, THREADS, TOKEN,
};
use crate::shared::events::{Emitter, Event};
use crate::shared::run_dir::RunDir;
use device::Device;
use dist::{InitOptions, ProcessGroup};
use jobs::Work;
use recipe::Registry;
use train::{TrainingLoop, WorkerContext};

fn env(name: &str) -> Result<String> {
    std::env::var(name).map_err(|_| anyhow!("{name} is not set: trainbook-worker is started by `trainbook train` or `launch()`, not by hand"))
}

/// Exits if the parent goes away: a second line of defence behind PR_SET_PDEATHSIG (which
/// another launcher may not set).
fn watch_parent() {
    let parent = nix::unistd::getppid();
    let _ = std::thread::Builder::new()
        .name("trainbook-parent-watch".into())
        .spawn(move || loop {
            std::thread::sleep(Duration::from_millis(500));
            if nix::unistd::getppid() != parent {
                eprintln!("trainbook-worker: the launching process exited; stopping");
                std::process::exit(3);
            }
        });
}

/// What a worker built with Gaudi support plugs in (`trainbook-hpu`'s bridge, which embeds the
/// Python the vendor's bridge needs). The engine itself knows no Python.
pub trait HpuBridge: Sync {
    /// Registers the HPU device in this process's libtorch and acquires a device; returns
    /// facts for the worker's log (versions, paths, module id).
    fn load(&self) -> anyhow::Result<Vec<String>>;
    /// The collective backend for HPU tensors, created on the job's rendezvous store under
    /// `prefix`, for [`ProcessGroup::attach_backend`].
    fn hccl_backend(
        &self,
        init: &dist::InitOptions,
        prefix: &str,
    ) -> anyhow::Result<dist::BackendHandle>;
    /// The most HPU memory allocated so far, when the bridge can tell.
    fn peak_memory(&self) -> Option<u64> {
        None
    }
    /// Whether [`load`](Self::load) succeeded in this process.
    fn loaded(&self) -> bool {
        false
    }
    /// Runs the bridge's teardown (closes the hccl group, runs its exit handlers) while this
    /// process can still do it properly; called after a rank succeeded, before it exits.
    fn shutdown(&self) -> anyhow::Result<()> {
        Ok(())
    }
}

/// How a worker process ends. After success, Gaudi's bridge is torn down first: left to the
/// process's exit, its static destructors enter Python without the GIL (a crash after a good
/// run). After a failure, the bridge's teardown would wait in a barrier for peers that are not
/// coming, so the process leaves without running exit handlers or static destructors (the
/// driver already has the error, and every event and log line is flushed).
fn finish(code: i32, hpu: Hpu, events: &Emitter) -> i32 {
    let Some(bridge) = hpu.filter(|b| b.loaded()) else {
        return code;
    };
    if code == 0 {
        if let Err(e) = bridge.shutdown() {
            events.log(format!(
                "warning: the teardown of the Gaudi bridge failed: {e:#}"
            ));
            events.flush(Duration::from_secs(5));
        }
        return code;
    }
    use std::io::Write;
    let _ = std::io::stdout().flush();
    let _ = std::io::stderr().flush();
    // SAFETY: ends the process at once; nothing after this runs.
    unsafe { libc::_exit(code) }
}

/// The HPU bridge a worker binary built with the `hpu` feature injects.
pub type Hpu = Option<&'static dyn HpuBridge>;

/// Why a worker cannot train on HPU without a bridge.
fn no_hpu_build() -> anyhow::Error {
    anyhow!(
        "this trainbook build has no HPU support (trainbook-worker was built without the `hpu` \
         feature): inside the Gaudi container, run `make setup && make build` (set-up turns the \
         feature on when it finds the Gaudi bridge and its torch), or use --device cpu"
    )
}

/// `trainbook-worker --probe-hpu`: load the bridge, acquire a device, say what happened.
fn probe(hpu: Hpu) -> i32 {
    // Torn down before exiting, as after training (see `finish`).
    let result = hpu.ok_or_else(no_hpu_build).and_then(|b| {
        let facts = b.load()?;
        b.shutdown()?;
        Ok(facts)
    });
    let answer = match result {
        Ok(facts) => {
            let device_count = facts
                .iter()
                .find_map(|f| f.strip_prefix("device_count: ")?.trim().parse().ok());
            HpuProbe {
                error: None,
                facts,
                device_count,
            }
        }
        Err(e) => HpuProbe {
            error: Some(format!("{e:#}")),
            facts: Vec::new(),
            device_count: None,
        },
    };
    println!("{}", serde_json::to_string(&answer).unwrap_or_default());
    0
}

/// Entry point of `trainbook-worker`, which injects its recipes and, in `hpu` builds, Gaudi's
/// bridge; returns the process exit code.
pub fn main(recipes: &Registry, hpu: Hpu) -> i32 {
    if std::env::args().nth(1).as_deref() == Some(PROBE_HPU) {
        return probe(hpu);
    }
    watch_parent();
    let rank: usize = std::env::var("RANK")
        .ok()
        .and_then(|r| r.parse().ok())
        .unwrap_or(0);
    let events = match env(EVENTS).and_then(|ep| Emitter::connect(&ep, &env(TOKEN)?, rank)) {
        Ok(e) => e,
        Err(e) => {
            eprintln!("trainbook-worker: {e:#}");
            return 2;
        }
    };
    // A panic (a tch operation that failed) is an error like any other: reported, and the
    // process ends through `finish`, not through unwinding past the bridge.
    let ran = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        run_rank(rank, &events, recipes, hpu)
    }))
    .unwrap_or_else(|p| {
        Err(anyhow!(
            "the worker panicked: {}",
            task::panic_text(p.as_ref())
        ))
    });
    let code = match ran {
        Ok(()) => {
            events.flush(Duration::from_secs(5));
            0
        }
        Err(e) => {
            let message = format!("{e:#}");
            eprintln!("trainbook-worker rank {rank}: {message}");
            events.send(Event::Error {
                rank,
                message,
                // The step it was on: the one after those it had taken.
                step: Some(heartbeat::step() + 1),
            });
            events.flush(Duration::from_secs(5));
            1
        }
    };
    finish(code, hpu, &events)
}

fn run_rank(rank: usize, events: &Emitter, recipes: &Registry, hpu: Hpu) -> Result<()> {
    let RunConfig { spec, hyper } = RunConfig::read(Path::new(&env(CONFIG)?))?;
    let device: DeviceKind = serde_json::from_value(serde_json::Value::String(env(DEVICE)?))
        .with_context(|| format!("{DEVICE} must be cpu, cuda or hpu"))?;
    let threads: usize = env(THREADS)?
        .parse()
        .with_context(|| format!("{THREADS} must be a number"))?;
    tch::set_num_threads(threads as i32);
    tch::set_num_interop_threads(1);
    let local_rank: usize = std::env::var("LOCAL_RANK")
        .ok()
        .and_then(|r| r.parse().ok())
        .unwrap_or(rank);
    let tdev = Device::for_worker(device, local_rank);
    // The bridge registers the HPU device in this process's libtorch: before any tensor.
    let bridge = match device {
        DeviceKind::Hpu => {
            let bridge = hpu.ok_or_else(no_hpu_build)?;
            let facts = bridge
                .load()
                .context("loading Intel Gaudi's PyTorch bridge")?;
            events.log(format!("hpu: {}", facts.join(", ")));
            Some(bridge)
        }
        _ => None,
    };
    let init = InitOptions::from_env(
        device.backend(),
        Duration::from_secs(spec.collective_timeout_secs),
    )?;
    let pg = ProcessGroup::new(&init)?;
    if let Some(bridge) = bridge {
        let backend = bridge.hccl_backend(&init, &format!("{}/hccl", init.store_prefix))?;
        pg.attach_backend(tdev, backend)?;
    }
    let kind = recipes.work(&spec)?;
    // No pulse when nobody listens (hang detection off): what the overhead benchmark compares.
    if spec.hang_timeout_secs > 0 {
        heartbeat::start(events, rank);
    }
    if let Work::Check | Work::BenchAllreduce = kind {
        check::run_job(kind, &pg, tdev, events)?;
        events.send(Event::Done {
            rank,
            summary: Default::default(),
        });
        return Ok(());
    }
    let ctx = WorkerContext {
        rank,
        world_size: pg.world_size(),
        device: tdev,
        device_name: device.name().to_string(),
        pg,
        events: events.clone(),
        run_dir: RunDir::new(env(RUN_DIR)?),
    };
    let trained = train_recipe(&ctx, hyper, kind, bridge);
    if trained.is_err() {
        // The process group stays open until this process exits, after `main` has reported
        // the error: closing it now would fail the peers at once ("connection reset"), and
        // their errors could reach the driver before the cause.
        std::mem::forget(ctx);
    }
    trained
}

fn train_recipe(
    ctx: &WorkerContext,
    hyper: Option<trainbook_api::Hyper>,
    kind: Work,
    bridge: Option<&dyn HpuBridge>,
) -> Result<()> {
    let (rank, events) = (ctx.rank, &ctx.events);
    let log = |line: String| events.log(line);
    let mut hyper = hyper.ok_or_else(|| {
        anyhow!(
            "{} has no resolved hyper-parameters for this job",
            env(CONFIG).unwrap_or_default(),
        )
    })?;
    // A restarted (or resumed) start continues where the driver says.
    if let Some(dir) = std::env::var_os(RESUME).filter(|d| !d.is_empty()) {
        hyper.resume_from = Some(dir.into());
    }
    // Under ZeRO-3 a model that marks its layers is built a layer at a time, each rank
    // keeping its slice of them (`slices`).
    let sharded = hyper.zero >= 3 && ctx.world_size >= 2;
    if sharded {
        slices::begin(rank, ctx.world_size);
    }
    let resident = device::rss();
    let mut recipe = match kind {
        Work::Task => {
            let place = task::WorkerRank {
                rank,
                world_size: ctx.world_size,
            };
            task::build_in_worker(&hyper, ctx.device, &log, &place)?
        }
        Work::Recipe(entry) => (entry.build)(&hyper, ctx.device, &log)?,
        Work::Check | Work::BenchAllreduce => {
            unreachable!("run() answers the engine's own jobs before training")
        }
    };
    if let (true, Device::Cpu, Some(before), Some(peak), Some(now)) = (
        sharded,
        ctx.device,
        resident,
        device::peak_rss(),
        device::rss(),
    ) {
        // What loading a model too large for one rank is about, said by every rank (before
        // the training loop adds the shards, gradients and optimizer state it plans).
        let gib = |b: u64| b.saturating_sub(before) as f64 / (1u64 << 30) as f64;
        log(format!(
            "ZeRO-3: rank {rank} built and loaded its slice of the model: resident set {:.2} GiB above its start at the peak, {:.2} GiB now",
            gib(peak),
            gib(now)
        ));
    }
    let mut summary = TrainingLoop::new(ctx, recipe.as_mut(), &hyper)?.run()?;
    let (peak, peak_of) = device::peak_memory(ctx.device, bridge.and_then(|b| b.peak_memory()));
    (summary.memory.peak, summary.memory.peak_of) = (peak, peak_of.to_string());
    // Nobody leaves before everyone is done, so no peer sees a closed connection.
    ctx.pg.barrier()?;
    events.send(Event::Done { rank, summary });
    Ok(())
}
