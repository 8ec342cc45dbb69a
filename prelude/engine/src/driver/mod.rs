//! The driver side of a job: choose its device, join or host its rendezvous, start its
//! workers, fold what they report into the job's state, and hand results to the caller. Data
//! flows one way — workers → events → the event loop ([`drive`]) → subscribers (terminal,
//! notebook widgets); only stop requests flow back.
//!
//! - [`placement`]: which device a job gets (`auto`, the HPU probe).
//! - [`rendezvous`]: how a node joins its job (node 0 hosts, the others fetch its job).
//! - [`membership`]: the nodes of each start and the ranks they get (elastic jobs).
//! - [`processes`]: worker processes (exec, process groups, raw output, stop).
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
mod supervise;
mod track;

use std::path::PathBuf;
use std::sync::{mpsc, Arc};
use std::thread;

use anyhow::{anyhow, Context, Result};
use trainbook_api::DeviceKind;
use trainbook_api::JobSpec;
use trainbook_api::{Job, JobStatus};

use crate::shared::checkpoint::TrainerState;
use crate::shared::env;
use crate::worker::jobs::JobKind;
use crate::worker::recipe::Registry;
use handle::{JobHandle, JobState};
use incoming::Incoming;
use processes::WorkerCommand;
use rendezvous::Node;
use supervise::Start;

pub use handle::running_jobs;
pub(crate) use handle::stop_all;

/// Checks what can be checked before any process starts: the spec's own ranges
/// ([`JobSpec::check`]), recipe and preset names against `recipes`, and that a checkpoint to
/// resume from is readable.
pub fn validate(spec: &JobSpec, recipes: &Registry) -> Result<()> {
    spec.check()?;
    recipes.job_kind(&spec.recipe)?;
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
    let program = match recipes.job_kind(&spec.recipe)? {
        JobKind::Task => crate::worker::task::worker_program(&spec)?,
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
    let cmds = worker_commands(&node, program);
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
    job.lock().membership = first.membership(&job.spec);
    let job = Arc::new(job);
    let handle = JobHandle::register(job.clone());

    // Workers are spawned from the driver thread, which lives exactly as long as they do:
    // PR_SET_PDEATHSIG fires when the *thread* that forked them exits.
    let (spawned_tx, spawned_rx) = mpsc::channel::<Result<()>>();
    thread::Builder::new()
        .name(format!("trainbook-job-{}", job.id))
        .spawn(move || {
            let start = Start::new(cmds, tx, store, &job.spec);
            match start.spawn(&first) {
                Ok(w) => {
                    {
                        let mut st = job.lock();
                        st.pids = w.pids();
                        st.status = JobStatus::Running;
                    }
                    let _ = spawned_tx.send(Ok(()));
                    if job.spec.nodes > 1 {
                        rendezvous::mark_started(&start.store, first.attempt, job.spec.node_rank)
                            .ok();
                    }
                    drive::drive(&job, w, rx, collector, forward, start, first.attempt);
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

/// The variable that gives a job's workers their devices (see `JobSpec::visible_devices`):
/// local rank i then uses the i-th listed id, as CUDA and the Gaudi bridge number them.
fn visible_devices_env(device: DeviceKind, ids: Option<&[usize]>) -> Option<(String, String)> {
    let var = match device {
        DeviceKind::Cuda => "CUDA_VISIBLE_DEVICES",
        DeviceKind::Hpu => "HABANA_VISIBLE_MODULES",
        DeviceKind::Cpu => return None,
    };
    let list: Vec<String> = ids?.iter().map(ToString::to_string).collect();
    Some((var.into(), list.join(",")))
}

/// One command per local rank: the program (with its own environment) and the environment
/// through which a worker receives its place in the job (torch's env:// variables and
/// trainbook's, [`env`]). Its global rank and the world's size come with each start
/// ([`Start::spawn`]): an elastic job's differ from start to start.
fn worker_commands(
    node: &Node,
    (program, program_env): (PathBuf, Vec<(String, String)>),
) -> Vec<WorkerCommand> {
    let spec = &node.config.spec;
    let threads = match node.device {
        DeviceKind::Cpu => spec
            .threads_per_worker
            .unwrap_or_else(|| placement::cpu_threads_per_worker(spec.workers)),
        _ => spec.threads_per_worker.unwrap_or(4),
    };
    let node_addr = spec.node_addr.clone().or_else(|| {
        // Several nodes on one machine (tests, trials) share loopback: each binds the address
        // it was given, else the master's.
        rendezvous::is_loopback(&spec.master_addr).then(|| spec.master_addr.clone())
    });
    let cwd = std::env::current_dir().unwrap_or_else(|_| PathBuf::from("."));
    let config_file = node.run_dir.config();
    spec.local_ranks()
        .enumerate()
        .map(|(local, rank)| {
            let mut vars: Vec<(String, String)> = vec![
                ("LOCAL_RANK".into(), local.to_string()),
                ("LOCAL_WORLD_SIZE".into(), spec.workers.to_string()),
                ("MASTER_ADDR".into(), spec.master_addr.clone()),
                ("MASTER_PORT".into(), node.store.port().to_string()),
                (env::AGENT_STORE.into(), "1".into()),
                (env::EVENTS.into(), node.events.clone()),
                (env::TOKEN.into(), node.token.clone()),
                (env::RUN_DIR.into(), node.run_dir.display().to_string()),
                (env::CONFIG.into(), config_file.display().to_string()),
                (env::DEVICE.into(), node.device.name().into()),
                (env::THREADS.into(), threads.to_string()),
                ("OMP_NUM_THREADS".into(), threads.to_string()),
                ("MKL_NUM_THREADS".into(), threads.to_string()),
            ];
            if let Some(a) = &node_addr {
                vars.push((env::NODE_ADDR.into(), a.clone()));
            }
            // The step profiler's Kineto logs its own start, stop and (on a machine without a
            // GPU) a failed GPU count as errors to stderr: kept out of the job's log unless
            // the user asks for them.
            if std::env::var_os("KINETO_LOG_LEVEL").is_none() {
                vars.push(("KINETO_LOG_LEVEL".into(), "6".into()));
            }
            vars.extend(visible_devices_env(
                node.device,
                spec.visible_devices.as_deref(),
            ));
            vars.extend(program_env.iter().cloned());
            vars.extend(spec.env.iter().cloned());
            WorkerCommand {
                rank,
                program: program.clone(),
                env: vars,
                cwd: cwd.clone(),
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn visible_devices_go_to_the_variable_of_the_device() {
        let ids = [2, 3];
        assert_eq!(
            visible_devices_env(DeviceKind::Cuda, Some(&ids)),
            Some(("CUDA_VISIBLE_DEVICES".into(), "2,3".into()))
        );
        assert_eq!(
            visible_devices_env(DeviceKind::Hpu, Some(&ids)),
            Some(("HABANA_VISIBLE_MODULES".into(), "2,3".into()))
        );
        assert_eq!(visible_devices_env(DeviceKind::Cpu, Some(&ids)), None);
        assert_eq!(visible_devices_env(DeviceKind::Cuda, None), None);
    }
}
