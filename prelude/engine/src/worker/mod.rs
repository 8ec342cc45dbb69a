//! The worker process: join the job's process group, train one rank, report back.

use std::path::Path;
use std::time::Duration;

use anyhow::{anyhow, Context, Result};

use crate::checkpoint::RunConfig;
use crate::device::{Device, DeviceKind, HpuBridge, HpuProbe};
use crate::dist::{InitOptions, ProcessGroup};
use crate::events::{Emitter, Event};
use crate::recipe::Registry;
use crate::train::{self, WorkerContext};

// The environment through which the driver (`job::launch`) hands a worker its job, besides
// torch's own RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT.
/// Where the worker sends its events (a ZeroMQ endpoint).
pub const EVENTS: &str = "TRAINBOOK_EVENTS";
/// The job's secret, which every event carries.
pub const TOKEN: &str = "TRAINBOOK_TOKEN";
/// The run directory.
pub const RUN_DIR: &str = "TRAINBOOK_RUN_DIR";
/// The run's `config.json` ([`crate::checkpoint::RunConfig`]).
pub const CONFIG: &str = "TRAINBOOK_CONFIG";
/// cpu, cuda or hpu.
pub const DEVICE: &str = "TRAINBOOK_DEVICE";
/// Intra-op threads.
pub const THREADS: &str = "TRAINBOOK_THREADS";
/// The argument that makes `trainbook-worker` load Gaudi's bridge, print an
/// [`HpuProbe`](crate::device::HpuProbe) as JSON and exit (see `device::probe_hpu`).
pub const PROBE_HPU: &str = "--probe-hpu";
/// Set when the launcher hosts the rendezvous store (see `dist::InitOptions`).
pub const AGENT_STORE: &str = crate::dist::AGENT_STORE;

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
    let result = hpu.ok_or_else(no_hpu_build).and_then(|b| b.load());
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
    match run(rank, &events, recipes, hpu) {
        Ok(()) => {
            events.flush(Duration::from_secs(5));
            0
        }
        Err(e) => {
            let message = format!("{e:#}");
            eprintln!("trainbook-worker rank {rank}: {message}");
            events.send(Event::Error { rank, message });
            events.flush(Duration::from_secs(5));
            1
        }
    }
}

fn run(rank: usize, events: &Emitter, recipes: &Registry, hpu: Hpu) -> Result<()> {
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
    events.send(Event::Started {
        rank,
        pid: std::process::id(),
        device: tdev.to_string(),
        threads,
    });

    let init = InitOptions::from_env(
        device.backend(),
        Duration::from_secs(spec.collective_timeout_secs),
    )?;
    let pg = ProcessGroup::new(&init)?;
    if let Some(bridge) = bridge {
        let backend = bridge.hccl_backend(&init, "trainbook/default_pg/hccl")?;
        pg.attach_backend(tdev, backend)?;
    }
    if spec.recipe == crate::recipe::CHECK {
        crate::check::run(&pg, tdev, events)?;
        events.send(Event::Done {
            rank,
            summary: Default::default(),
        });
        return Ok(());
    }
    if spec.recipe == crate::recipe::BENCH_ALLREDUCE {
        let num = |k: &str, d: u64| {
            std::env::var(k)
                .ok()
                .and_then(|v| v.parse().ok())
                .unwrap_or(d)
        };
        crate::check::bench_allreduce(
            &pg,
            tdev,
            events,
            num("TRAINBOOK_BENCH_NUMEL", 110_000_000) as i64,
            num("TRAINBOOK_BENCH_ITERS", 10),
        )?;
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
        run_dir: env(RUN_DIR)?.into(),
    };
    let trained = train_recipe(&ctx, hyper, &spec.recipe, recipes, bridge);
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
    hyper: Option<crate::spec::Hyper>,
    name: &str,
    recipes: &Registry,
    bridge: Option<&dyn HpuBridge>,
) -> Result<()> {
    let (rank, events) = (ctx.rank, &ctx.events);
    let log = |line: String| events.log(line);
    let hyper = hyper.ok_or_else(|| {
        anyhow!(
            "{} has no resolved hyper-parameters for recipe {name}",
            env(CONFIG).unwrap_or_default(),
        )
    })?;
    let mut recipe = if name == crate::task::TASK {
        let place = crate::task::WorkerRank {
            rank,
            world_size: ctx.world_size,
        };
        crate::task::build_in_worker(&hyper, ctx.device, &log, &place)?
    } else {
        recipes.build(name, &hyper, ctx.device, &log)?
    };
    let mut summary = train::run(ctx, recipe.as_mut(), &hyper)?;
    let (peak, peak_of) = crate::device::peak_memory(ctx.device, bridge);
    (summary.memory.peak, summary.memory.peak_of) = (peak, peak_of.to_string());
    // Nobody leaves before everyone is done, so no peer sees a closed connection.
    ctx.pg.barrier()?;
    events.send(Event::Done { rank, summary });
    Ok(())
}
