//! The worker process: join the job's process group, train one rank, report back.

use std::path::Path;
use std::time::Duration;

use anyhow::{anyhow, Context, Result};

use crate::checkpoint::RunConfig;
use crate::device::DeviceKind;
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

/// Entry point of `trainbook-worker`, which injects its recipes; returns the process exit code.
pub fn main(recipes: &Registry) -> i32 {
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
    match run(rank, &events, recipes) {
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

fn run(rank: usize, events: &Emitter, recipes: &Registry) -> Result<()> {
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
    let tdev = crate::device::tch_device(device, local_rank)?;
    events.send(Event::Started {
        rank,
        pid: std::process::id(),
        device: format!("{tdev:?}"),
        threads,
    });

    let init = InitOptions::from_env(
        device.backend(),
        Duration::from_secs(spec.collective_timeout_secs),
    )?;
    let pg = ProcessGroup::new(&init)?;
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
    let log = |line: String| events.log(line);
    let hyper = hyper.ok_or_else(|| {
        anyhow!(
            "{} has no resolved hyper-parameters for recipe {}",
            env(CONFIG).unwrap_or_default(),
            spec.recipe
        )
    })?;
    let mut recipe = recipes.build(&spec.recipe, &hyper, tdev, &log)?;
    let ctx = WorkerContext {
        rank,
        world_size: pg.world_size(),
        device: tdev,
        device_name: device.name().to_string(),
        pg,
        events: events.clone(),
        run_dir: env(RUN_DIR)?.into(),
    };
    let summary = train::run(&ctx, recipe.as_mut(), &hyper)?;
    // Nobody leaves before everyone is done, so no peer sees a closed connection.
    ctx.pg.barrier()?;
    events.send(Event::Done { rank, summary });
    Ok(())
}
