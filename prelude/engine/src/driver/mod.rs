//! The driver side of a job: choose its device, join or host its rendezvous, start its
//! workers, fold what they report into the job's state, and hand results to the caller. Data
//! flows one way — workers → events → the event loop ([`drive`]) → subscribers (terminal,
//! notebook widgets); only stop requests flow back.
//!
//! - [`placement`]: which device a job gets (`auto`, the HPU probe).
//! - [`rendezvous`]: how a node joins its job (node 0 hosts, the others fetch its job).
//! - [`membership`]: the nodes of each start and the ranks they get (elastic jobs).
//! - [`processes`]: worker processes (exec, process groups, raw output, stop).
//! - [`spawner`]: this node's workers for each start: their environment, built in one place.
//! - [`drive`]: the event loop on the driver thread, of two parts:
//!   - [`fold`]: events and output into the job's state, logs, subscribers and trackers;
//!   - [`supervise`]: watching the workers, failures, hangs and restarts (its rules apart).
//! - [`handle`]: the job's state and the [`Job`] handle's methods on it.
//! - [`memory`]: the memory plan, checked before any worker starts.
//! - [`dedup`], [`metrics`]: what the event loop writes on the way.
//! - [`track`]: the run's trackers (dllogger, TensorBoard, MLflow) behind one trait.

pub(crate) mod dedup;
mod drive;
mod fold;
mod handle;
mod history;
mod incoming;
pub(crate) mod membership;
pub(crate) mod metrics;
pub(crate) mod placement;
pub(crate) mod processes;
mod rendezvous;
mod spawner;
mod supervise;
mod track;

use std::path::PathBuf;
use std::sync::{mpsc, Arc};
use std::thread;

use anyhow::{anyhow, Context, Result};
use trainbook_api::JobSpec;
use trainbook_api::{Job, JobStatus};

use crate::shared::checkpoint::TrainerState;
use crate::worker::jobs::Work;
use crate::worker::recipe::Registry;
use handle::{JobHandle, JobState};
use incoming::Incoming;
use rendezvous::Node;
use spawner::{Spawner, WorkerEnv};

pub use handle::running_jobs;
pub(crate) use handle::stop_all;
pub(crate) use track::{SweepColumns, Swept};

/// Checks what can be checked before any process starts: the spec's own ranges
/// ([`JobSpec::check`]), recipe and preset names against `recipes`, and that a checkpoint to
/// resume from is readable.
pub fn validate(spec: &JobSpec, recipes: &Registry) -> Result<()> {
    spec.check()?;
    recipes.work(spec)?;
    if let Some(p) = &spec.train.preset {
        recipes.check_preset(&spec.recipe, p)?;
    }
    if let Some(r) = &spec.train.resume_from {
        TrainerState::read(r).with_context(|| format!("cannot resume from {}", r.display()))?;
    }
    Ok(())
}

/// Starts a job and returns at once; see [`Job::wait`]. The recipe is looked up in `recipes`.
///
/// In a job of several nodes, node 0 hosts the rendezvous and collects every rank's events
/// (its [`Job`] is the whole job's), and each other node starts its own workers with node 0's
/// resolved configuration (its [`Job`] shows its own workers' output and how they ended).
pub fn launch(spec: JobSpec, recipes: &Registry) -> Result<Job> {
    validate(&spec, recipes)?;
    processes::raise_open_file_limit();
    let program = match recipes.work(&spec)? {
        Work::Task => crate::worker::task::worker_program(&spec)?,
        _ => (processes::worker_binary()?, Vec::new()),
    };
    let (tx, rx) = mpsc::channel::<Incoming>();
    let node = if spec.node_rank == 0 {
        let events = tx.clone();
        rendezvous::host(spec, recipes, move |e| {
            events.send(Incoming::Event(e)).is_ok()
        })?
    } else {
        rendezvous::join(spec)?
    };
    let (program, program_env) = program;
    let env = WorkerEnv::new(&node, program_env);
    let Node {
        config,
        device,
        run_dir,
        store,
        events,
        collector,
        forward,
        start: first,
        ..
    } = node;
    let mut job = JobState::new(config.spec, device, run_dir, events);
    job.node_counts = job.spec.node_counts(config.hyper.as_ref());
    job.hyper = config.hyper;
    job.lock().membership = first.membership(&job.spec);
    let job = Arc::new(job);
    let handle = JobHandle::register(job.clone());

    // Workers are spawned from the driver thread, which lives exactly as long as they do:
    // PR_SET_PDEATHSIG fires when the *thread* that forked them exits.
    let (spawned_tx, spawned_rx) = mpsc::channel::<Result<()>>();
    thread::Builder::new()
        .name(format!("trainbook-job-{}", job.id))
        .spawn(move || {
            let spawner = Spawner::new(&job.spec, program, env, tx, store);
            match spawner.spawn(&first) {
                Ok(w) => {
                    {
                        let mut st = job.lock();
                        st.pids = w.pids();
                        st.status = JobStatus::Running;
                    }
                    let _ = spawned_tx.send(Ok(()));
                    if job.spec.nodes > 1 {
                        rendezvous::mark_started(&spawner.store, first.attempt, job.spec.node_rank)
                            .ok();
                    }
                    drive::drive(&job, w, rx, collector, forward, spawner, first.attempt);
                }
                Err(e) => {
                    job.lock().status = JobStatus::Failed;
                    job.finished.notify_all();
                    let _ = spawned_tx.send(Err(e));
                }
            }
        })
        .context("spawning the job driver thread")?;
    spawned_rx
        .recv()
        .map_err(|_| anyhow!("the job driver thread died while starting workers"))??;
    Ok(handle)
}

/// Where a job's run directory goes: its `runs_root`, else `$TRAINBOOK_RUNS`, else
/// `./trainbook_runs`.
pub(crate) fn runs_root(spec: &JobSpec) -> PathBuf {
    spec.runs_root
        .clone()
        .or_else(|| std::env::var_os("TRAINBOOK_RUNS").map(PathBuf::from))
        .unwrap_or_else(|| PathBuf::from("trainbook_runs"))
}
