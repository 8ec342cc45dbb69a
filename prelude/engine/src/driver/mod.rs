//! The driver side of a job: start workers, collect their events and output, watch their
//! health, and hand results to the caller. Data flows one way — workers → events → this
//! driver → subscribers (terminal, notebook widgets); only stop requests flow back.

use crate::dllog::DlLog;
use std::collections::VecDeque;
use std::fs::File;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc, Condvar, Mutex, Weak};
use std::thread;
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context, Result};
use serde::Serialize;

use crate::checkpoint::{self, RunConfig};
use crate::dedup::{Deduplicator, Stream};
use crate::device::{self, DeviceKind};
use crate::dist::Store;
use crate::events::{self, Collector, Emitter, Event, WorkerSummary};
use crate::launch::{self, Exit, RawOutput, WorkerCommand, Workers, STOP_GRACE};
use crate::metrics;
use crate::recipe::Registry;
use crate::spec::JobSpec;
use crate::worker;
use trainbook_api::topology::DEFAULT_MASTER_PORT;

/// Lines of each rank kept for error reports.
const TAIL_LINES: usize = 20;
/// How long node 0 waits for another node's report of the worker whose death failed its own.
const REMOTE_REPORT_WAIT: Duration = Duration::from_millis(1500);
/// How long node 0 waits, once its own workers are done, for other nodes' `done` events.
const REMOTE_DONE_WAIT: Duration = Duration::from_secs(10);
/// Log lines kept in memory per job (the run directory has them all).
const MEMORY_LOG_LINES: usize = 10_000;

pub use trainbook_api::job::{
    Job, JobControl, JobStatus, JobView, LogRecord, MetricRow, Progress, TrainError, TrainResult,
    Update,
};

struct State {
    status: JobStatus,
    metrics: Vec<MetricRow>,
    logs: VecDeque<LogRecord>,
    tails: Vec<VecDeque<String>>,
    errors: Vec<Option<String>>,
    progress: Option<Progress>,
    checkpoints: Vec<(u64, PathBuf)>,
    summaries: Vec<Option<WorkerSummary>>,
    failure: Option<TrainError>,
    pids: Vec<u32>,
    elapsed: f64,
    dropped_events: u64,
}

struct Shared {
    id: u64,
    spec: JobSpec,
    device: DeviceKind,
    run_dir: PathBuf,
    events_endpoint: String,
    started: Instant,
    state: Mutex<State>,
    finished: Condvar,
    stop_requested: AtomicBool,
    subscribers: Mutex<Vec<mpsc::Sender<Update>>>,
    views: Mutex<Vec<Arc<dyn JobView>>>,
}

/// How long [`Job::wait`] waits for views to settle.
const SETTLE_TIMEOUT: Duration = Duration::from_secs(3);

impl Shared {
    /// A job that has not started its workers yet.
    fn new(spec: JobSpec, device: DeviceKind, run_dir: PathBuf, events_endpoint: String) -> Self {
        let world = spec.world_size();
        Shared {
            id: NEXT_ID.fetch_add(1, Ordering::Relaxed),
            spec,
            device,
            run_dir,
            events_endpoint,
            started: Instant::now(),
            state: Mutex::new(State {
                status: JobStatus::Starting,
                metrics: Vec::new(),
                logs: VecDeque::new(),
                tails: vec![VecDeque::new(); world],
                errors: vec![None; world],
                progress: None,
                checkpoints: Vec::new(),
                summaries: vec![None; world],
                failure: None,
                pids: Vec::new(),
                elapsed: 0.0,
                dropped_events: 0,
            }),
            finished: Condvar::new(),
            stop_requested: AtomicBool::new(false),
            subscribers: Mutex::new(Vec::new()),
            views: Mutex::new(Vec::new()),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        // A panic while holding the lock must not make the job unreadable.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn publish(&self, u: Update) {
        let mut subs = self.subscribers.lock().unwrap_or_else(|e| e.into_inner());
        subs.retain(|s| s.send(u.clone()).is_ok());
    }
}

/// The engine's side of a [`Job`] handle.
#[derive(Clone)]
struct Driven {
    shared: Arc<Shared>,
}

impl Driven {
    fn handle(self) -> Job {
        Job::new(Arc::new(self))
    }
}

static REGISTRY: Mutex<Vec<Weak<Shared>>> = Mutex::new(Vec::new());
static NEXT_ID: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);

/// Jobs of this process that have not finished.
pub fn running_jobs() -> Vec<Job> {
    running().into_iter().map(Driven::handle).collect()
}

fn running() -> Vec<Driven> {
    let mut reg = REGISTRY.lock().unwrap_or_else(|e| e.into_inner());
    reg.retain(|w| w.strong_count() > 0);
    reg.iter()
        .filter_map(|w| w.upgrade())
        .map(|shared| Driven { shared })
        .filter(|j| !j.status().is_finished())
        .collect()
}

/// Stops every running job of this process (what a notebook interrupt does first).
pub fn stop_all() -> usize {
    let jobs = running();
    for j in &jobs {
        j.request_stop();
    }
    for j in &jobs {
        let _ = j.wait_finished(STOP_GRACE + Duration::from_secs(3));
    }
    jobs.len()
}

/// What every node's driver needs to start its workers. Node 0 makes it and publishes it in
/// the rendezvous store; the other nodes read it from there, so they run exactly node 0's
/// resolved job and send their events to node 0's collector.
#[derive(Serialize, serde::Deserialize)]
struct JobInfo {
    config: RunConfig,
    device: DeviceKind,
    events: String,
    token: String,
    run_name: String,
}

/// The store key of [`JobInfo`].
const JOB_KEY: &str = "trainbook/job";

/// How this node takes part in its job.
struct Node {
    config: RunConfig,
    device: DeviceKind,
    run_dir: PathBuf,
    store: Store,
    events: String,
    token: String,
    /// Node 0 collects every rank's events.
    collector: Option<Collector>,
    /// Other nodes forward their workers' output and failures to node 0.
    forward: Option<Emitter>,
}

/// Node 0 (and a job of one node): resolve the job, host the rendezvous and the event stream.
fn host(spec: JobSpec, recipes: &Registry, tx: &mpsc::Sender<Incoming>) -> Result<Node> {
    // The preset and every option resolved here, before any process starts: a bad option
    // fails at once, and config.json records what the run uses.
    let hyper = recipes.resolve(&spec)?;
    let device = device::resolve(spec.device, spec.workers)?;
    let run_dir = create_run_dir(&spec, None)?;
    let config = RunConfig { spec, hyper };
    write_json_atomic(&run_dir.join(checkpoint::RUN_CONFIG), &config)?;
    let spec = &config.spec;
    let timeout = Duration::from_secs(spec.collective_timeout_secs);
    let several = spec.nodes > 1;
    // Nodes agree on the port beforehand; one node may take any free port.
    let port = match (spec.master_port, several) {
        (Some(p), _) => p,
        (None, true) => DEFAULT_MASTER_PORT,
        (None, false) => 0,
    };
    let store = Store::bind(&spec.master_addr, port, timeout)?;
    let token = events::new_token();
    let ev_tx = tx.clone();
    // The event stream listens on a routable address only when other nodes must reach it.
    let listen = if several {
        spec.master_addr.as_str()
    } else {
        "127.0.0.1"
    };
    let collector = Collector::start(listen, token.clone(), move |e| {
        ev_tx.send(Incoming::Event(e)).is_ok()
    })?;
    let events = collector.endpoint().to_string();
    if several {
        let info = JobInfo {
            config: config.clone(),
            device,
            events: events.clone(),
            token: token.clone(),
            run_name: run_dir
                .file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_default(),
        };
        store.set(JOB_KEY, &serde_json::to_vec(&info)?)?;
    }
    Ok(Node {
        config,
        device,
        run_dir,
        store,
        events,
        token,
        collector: Some(collector),
        forward: None,
    })
}

/// Nodes 1..N: fetch node 0's job from its rendezvous store and run this node's share of it.
fn join(spec: JobSpec) -> Result<Node> {
    let timeout = Duration::from_secs(spec.collective_timeout_secs);
    let port = spec.master_port.unwrap_or(DEFAULT_MASTER_PORT);
    let node = spec.node_rank;
    let reach = |e: anyhow::Error| {
        e.context(format!(
            "node {node} could not reach node 0's rendezvous at {}:{port} within {} s: start node 0 \
             with the same --nnodes, --master-addr and --master-port, and check that this machine \
             can reach that address and port",
            spec.master_addr,
            timeout.as_secs()
        ))
    };
    let store = Store::connect(&spec.master_addr, port, timeout).map_err(reach)?;
    let info: JobInfo = serde_json::from_slice(&store.get(JOB_KEY).map_err(reach)?)
        .context("node 0 published a job this trainbook cannot read: run the same trainbook version on every node")?;
    let theirs = &info.config.spec;
    if theirs.recipe != spec.recipe || theirs.nodes != spec.nodes || theirs.workers != spec.workers
    {
        bail!(
            "node {node} was started for {} on {} node(s) x {} worker(s), but node 0 runs {} on {} node(s) x {} worker(s): start every node with the same recipe, --nnodes and --workers",
            spec.recipe,
            spec.nodes,
            spec.workers,
            theirs.recipe,
            theirs.nodes,
            theirs.workers
        );
    }
    // Node 0's resolved job, with this node's own place, paths and threads.
    let mut config = info.config;
    config.spec.node_rank = node;
    config.spec.node_addr = spec.node_addr.clone();
    config.spec.runs_root = spec.runs_root.clone();
    config.spec.threads_per_worker = spec.threads_per_worker.or(config.spec.threads_per_worker);
    config.spec.env.extend(spec.env.iter().cloned());
    config.spec.dedup = spec.dedup;
    config.spec.extensions = spec.extensions;
    let run_dir = create_run_dir(&config.spec, Some(format!("{}-node{node}", info.run_name)))?;
    write_json_atomic(&run_dir.join(checkpoint::RUN_CONFIG), &config)?;
    let forward = Emitter::connect(&info.events, &info.token, config.spec.local_ranks().start)
        .context("connecting to node 0's event stream")?;
    Ok(Node {
        config,
        device: info.device,
        run_dir,
        store,
        events: info.events,
        token: info.token,
        collector: None,
        forward: Some(forward),
    })
}

/// Starts a job and returns at once; see [`Job::wait`]. The recipe is looked up in `recipes`.
///
/// In a job of several nodes, node 0 hosts the rendezvous and collects every rank's events
/// (its [`Job`] is the whole job's), and each other node starts its own workers with node 0's
/// resolved configuration (its [`Job`] shows its own workers' output and how they ended).
pub fn launch(spec: JobSpec, recipes: &Registry) -> Result<Job> {
    crate::spec::validate(&spec, recipes)?;
    let (program, program_env) = if spec.recipe == crate::task::TASK {
        crate::task::worker_program(&spec)?
    } else {
        (launch::worker_binary()?, Vec::new())
    };
    let (tx, rx) = mpsc::channel::<Incoming>();
    let node = if spec.node_rank == 0 {
        host(spec, recipes, &tx)?
    } else {
        join(spec)?
    };
    let Node {
        config,
        device,
        run_dir,
        store,
        events: events_endpoint,
        token,
        collector,
        forward,
    } = node;
    let config_file = run_dir.join(checkpoint::RUN_CONFIG);
    let spec = config.spec;

    let threads = match device {
        DeviceKind::Cpu => spec
            .threads_per_worker
            .unwrap_or_else(|| device::cpu_threads_per_worker(spec.workers)),
        _ => spec.threads_per_worker.unwrap_or(4),
    };
    let node_addr = spec.node_addr.clone().or_else(|| {
        // Several nodes on one machine (tests, trials) share loopback: each binds the address
        // it was given, else the master's.
        is_loopback(&spec.master_addr).then(|| spec.master_addr.clone())
    });
    let cwd = std::env::current_dir().unwrap_or_else(|_| PathBuf::from("."));
    let world = spec.world_size();
    let cmds: Vec<WorkerCommand> = spec
        .local_ranks()
        .enumerate()
        .map(|(local, rank)| {
            let mut env: Vec<(String, String)> = vec![
                ("RANK".into(), rank.to_string()),
                ("LOCAL_RANK".into(), local.to_string()),
                ("WORLD_SIZE".into(), world.to_string()),
                ("LOCAL_WORLD_SIZE".into(), spec.workers.to_string()),
                ("GROUP_RANK".into(), spec.node_rank.to_string()),
                ("NODE_RANK".into(), spec.node_rank.to_string()),
                ("MASTER_ADDR".into(), spec.master_addr.clone()),
                ("MASTER_PORT".into(), store.port().to_string()),
                (worker::AGENT_STORE.into(), "1".into()),
                (worker::EVENTS.into(), events_endpoint.clone()),
                (worker::TOKEN.into(), token.clone()),
                (worker::RUN_DIR.into(), run_dir.display().to_string()),
                (worker::CONFIG.into(), config_file.display().to_string()),
                (worker::DEVICE.into(), device.name().into()),
                (worker::THREADS.into(), threads.to_string()),
                ("OMP_NUM_THREADS".into(), threads.to_string()),
                ("MKL_NUM_THREADS".into(), threads.to_string()),
            ];
            if let Some(a) = &node_addr {
                env.push((crate::dist::NODE_ADDR.into(), a.clone()));
            }
            env.extend(program_env.iter().cloned());
            env.extend(spec.env.iter().cloned());
            WorkerCommand {
                rank,
                program: program.clone(),
                env,
                cwd: cwd.clone(),
            }
        })
        .collect();

    let shared = Arc::new(Shared::new(spec, device, run_dir, events_endpoint));
    REGISTRY
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .push(Arc::downgrade(&shared));

    // Workers are spawned from the driver thread, which lives exactly as long as they do:
    // PR_SET_PDEATHSIG fires when the *thread* that forked them exits.
    let (spawned_tx, spawned_rx) = mpsc::channel::<Result<()>>();
    let driver_shared = shared.clone();
    thread::Builder::new()
        .name(format!("trainbook-job-{}", shared.id))
        .spawn(move || {
            let raw_tx = tx.clone();
            let workers = Workers::spawn(cmds, move |r| raw_tx.send(Incoming::Raw(r)).is_ok());
            match workers {
                Ok(w) => {
                    {
                        let mut st = driver_shared.lock();
                        st.pids = w.pids();
                        st.status = JobStatus::Running;
                    }
                    let _ = spawned_tx.send(Ok(()));
                    drive(&driver_shared, w, rx, collector, forward, store);
                }
                Err(e) => {
                    {
                        let mut st = driver_shared.lock();
                        st.status = JobStatus::Failed;
                    }
                    driver_shared.finished.notify_all();
                    let _ = spawned_tx.send(Err(e));
                }
            }
        })
        .context("spawning the job driver thread")?;
    spawned_rx
        .recv()
        .map_err(|_| anyhow!("the job driver thread died while starting workers"))??;
    Ok(Driven { shared }.handle())
}

enum Incoming {
    Event(Event),
    Raw(RawOutput),
}

struct Driver<'a> {
    shared: &'a Shared,
    dedup: Deduplicator,
    log_files: Vec<Option<File>>,
    dllog: Option<DlLog>,
    /// On nodes other than 0: node 0's event stream, which gets this node's worker output and
    /// failures (their events go there directly).
    forward: Option<Emitter>,
    /// Failed workers of other nodes, as their drivers reported them (node 0).
    remote_exits: Vec<Exit>,
}

impl Driver<'_> {
    fn elapsed(&self) -> f64 {
        self.shared.started.elapsed().as_secs_f64()
    }

    fn line(&mut self, rank: usize, stream: Stream, text: String) {
        if let Some(fwd) = &self.forward {
            fwd.send(Event::Log {
                rank,
                stream: stream.into(),
                text: text.clone(),
            });
        }
        if let Some(Some(f)) = self.log_files.get_mut(rank) {
            let tag = if stream == Stream::Stderr {
                "[stderr] "
            } else {
                ""
            };
            let _ = writeln!(f, "{tag}{text}");
        }
        let now = Instant::now();
        let shown = self.dedup.push(rank, stream, &text, now);
        {
            let mut st = self.shared.lock();
            if let Some(t) = st.tails.get_mut(rank) {
                if t.len() == TAIL_LINES {
                    t.pop_front();
                }
                t.push_back(text.clone());
            }
            if st.logs.len() == MEMORY_LOG_LINES {
                st.logs.pop_front();
            }
            let stream = if stream == Stream::Stderr {
                "stderr"
            } else {
                "stdout"
            };
            let time = self.elapsed();
            st.logs.push_back(LogRecord {
                rank,
                stream,
                text,
                time,
            });
        }
        for s in shown {
            self.shared.publish(Update::Log(s));
        }
    }

    fn event(&mut self, ev: Event) {
        let elapsed = self.elapsed();
        match ev {
            Event::Log { rank, stream, text } => self.line(rank, stream.into(), text),
            Event::Metric {
                rank,
                step,
                epoch,
                name,
                value,
                ..
            } => {
                if let (0, Some(log)) = (rank, &mut self.dllog) {
                    log.metric(epoch, step, &name, value, elapsed);
                }
                let row = MetricRow {
                    rank: rank as u32,
                    step,
                    epoch,
                    name,
                    value,
                    time: elapsed,
                };
                self.shared.lock().metrics.push(row.clone());
                self.shared.publish(Update::Metric(row));
            }
            Event::Progress {
                step,
                total_steps,
                epoch,
                epochs,
                samples,
                samples_per_second,
                ..
            } => {
                let p = Progress {
                    step,
                    total_steps,
                    epoch,
                    epochs,
                    samples,
                    samples_per_second,
                    elapsed,
                };
                self.shared.lock().progress = Some(p.clone());
                self.shared.publish(Update::Progress(p));
            }
            Event::Checkpoint { epoch, path, .. } => {
                let path = PathBuf::from(path);
                self.shared.lock().checkpoints.push((epoch, path.clone()));
                self.shared.publish(Update::Checkpoint { epoch, path });
            }
            Event::Error { rank, message } => {
                if let Some(slot) = self.shared.lock().errors.get_mut(rank) {
                    *slot = Some(message.clone());
                }
                self.line(rank, Stream::Stderr, format!("error: {message}"));
            }
            Event::Done { rank, summary } => {
                if let (0, Some(log)) = (rank, &mut self.dllog) {
                    log.finish(&summary, elapsed);
                }
                if let Some(slot) = self.shared.lock().summaries.get_mut(rank) {
                    *slot = Some(summary);
                }
            }
            Event::Started {
                rank,
                pid,
                device,
                threads,
            } => {
                let _ = (rank, pid, device, threads);
            }
            Event::Exited {
                rank,
                node,
                code,
                signal,
            } => {
                let exit = Exit { rank, code, signal };
                self.line(
                    rank,
                    Stream::Stderr,
                    format!("worker on node {node}: {}", exit.describe()),
                );
                self.remote_exits.push(exit);
            }
        }
    }

    fn incoming(&mut self, m: Incoming) {
        match m {
            Incoming::Event(e) => self.event(e),
            Incoming::Raw(RawOutput::Line { rank, stderr, text }) => self.line(
                rank,
                if stderr {
                    Stream::Stderr
                } else {
                    Stream::Stdout
                },
                text,
            ),
        }
    }

    fn flush_dedup(&mut self, finish: bool) {
        let shown = if finish {
            self.dedup.finish()
        } else {
            self.dedup.flush_due(Instant::now())
        };
        for s in shown {
            self.shared.publish(Update::Log(s));
        }
    }

    fn failure(&self, exit: &Exit) -> TrainError {
        let st = self.shared.lock();
        let tail: Vec<String> = st
            .tails
            .get(exit.rank)
            .map(|t| t.iter().map(|l| format!("  {l}")).collect())
            .unwrap_or_default();
        let message = st
            .errors
            .get(exit.rank)
            .cloned()
            .flatten()
            .map(|m| format!("\nerror: {m}"))
            .unwrap_or_default();
        let mut how = if exit.success() {
            "exited before reporting completion".to_string()
        } else {
            exit.describe()
        };
        let spec = &self.shared.spec;
        if spec.nodes > 1 {
            how = format!("{how}, on node {}", exit.rank / spec.workers.max(1));
        }
        TrainError::WorkerFailed {
            rank: exit.rank,
            how,
            message,
            tail: if tail.is_empty() && self.forward.is_some() {
                "  (no output here: this node's workers report to node 0, whose run directory has their logs)".into()
            } else if tail.is_empty() {
                "  (no output)".into()
            } else {
                tail.join("\n")
            },
            log: self
                .shared
                .run_dir
                .join("logs")
                .join(format!("rank{}.log", exit.rank))
                .display()
                .to_string(),
        }
    }
}

/// The failed worker to blame when several exit at once: one that died by a signal (its peers
/// then fail with "connection closed" errors moments later), else the lowest rank.
fn root_cause(failed: &[Exit]) -> Option<&Exit> {
    failed.iter().min_by_key(|e| (e.signal.is_none(), e.rank))
}

/// How a job ended once all its workers are gone: a recorded failure wins over a stop, and
/// success needs every rank's `done` event.
fn final_status(failed: bool, stopped_by_user: bool, every_rank_done: bool) -> JobStatus {
    if failed {
        JobStatus::Failed
    } else if stopped_by_user {
        JobStatus::Stopped
    } else if every_rank_done {
        JobStatus::Succeeded
    } else {
        JobStatus::Failed
    }
}

fn drive(
    shared: &Shared,
    mut workers: Workers,
    rx: mpsc::Receiver<Incoming>,
    collector: Option<Collector>,
    forward: Option<Emitter>,
    store: Store,
) {
    let world = shared.spec.world_size();
    let logs_dir = shared.run_dir.join("logs");
    // Node 0 logs every rank (other nodes forward their output to it); other nodes their own.
    let local = shared.spec.local_ranks();
    let log_files = (0..world)
        .map(|r| {
            (forward.is_none() || local.contains(&r))
                .then(|| File::create(logs_dir.join(format!("rank{r}.log"))).ok())
                .flatten()
        })
        .collect();
    let joined = forward.is_some();
    // The resolved hyper-parameters, as config.json records them, head the dllogger file.
    let mut parameters = std::fs::read(shared.run_dir.join(checkpoint::RUN_CONFIG))
        .ok()
        .and_then(|b| serde_json::from_slice::<serde_json::Value>(&b).ok())
        .map(|c| c["hyper"].clone())
        .filter(|h| h.is_object())
        .unwrap_or_else(|| serde_json::json!({}));
    parameters["recipe"] = shared.spec.recipe.clone().into();
    parameters["workers"] = world.into();
    parameters["device"] = shared.device.name().into();
    let mut d = Driver {
        shared,
        dedup: Deduplicator::new(shared.spec.dedup),
        log_files,
        dllog: (!joined).then(|| DlLog::create(&shared.run_dir, parameters)),
        forward,
        remote_exits: Vec::new(),
    };
    let mut stopped_by_user = false;

    while !workers.all_exited() {
        match rx.recv_timeout(Duration::from_millis(20)) {
            Ok(m) => {
                d.incoming(m);
                // Drain what is queued before looking at process state again.
                while let Ok(m) = rx.try_recv() {
                    d.incoming(m);
                }
            }
            Err(mpsc::RecvTimeoutError::Timeout) => {}
            Err(mpsc::RecvTimeoutError::Disconnected) => {}
        }
        d.flush_dedup(false);
        if shared.stop_requested.load(Ordering::Relaxed) && !stopped_by_user {
            stopped_by_user = true;
            workers.stop(STOP_GRACE);
            continue;
        }
        let exits = workers.poll();
        let remote = std::mem::take(&mut d.remote_exits);
        if stopped_by_user || (exits.is_empty() && remote.is_empty()) {
            continue;
        }
        let done_ranks =
            |st: &State, r: usize| st.summaries.get(r).map(|s| s.is_some()).unwrap_or(false);
        // A clean exit counts only once its `done` event arrived; give the socket a moment.
        // On other nodes the `done` events go to node 0, so a clean exit is enough.
        let mut bad: Vec<Exit> = remote;
        for e in exits {
            if e.success() && !joined {
                let deadline = Instant::now() + Duration::from_millis(500);
                while !done_ranks(&shared.lock(), e.rank) && Instant::now() < deadline {
                    if let Ok(m) = rx.recv_timeout(Duration::from_millis(10)) {
                        d.incoming(m);
                    }
                }
                if !done_ranks(&shared.lock(), e.rank) {
                    bad.push(e);
                }
            } else if !e.success() {
                bad.push(e);
            }
        }
        // The lock is taken and released here: the block below folds events, which locks again.
        let first_failure = shared.lock().failure.is_none();
        if let (Some(first), true) = (root_cause(&bad).cloned(), first_failure) {
            workers.stop(STOP_GRACE);
            // Collect the failing rank's last words before building the report.
            workers.join_readers(Duration::from_millis(300));
            while let Ok(m) = rx.try_recv() {
                d.incoming(m);
            }
            // A worker killed on another node fails this node's workers at once ("connection
            // closed"); its driver's report follows within moments, and names the cause.
            let mut first = first;
            if shared.spec.nodes > 1 && !joined && first.signal.is_none() {
                let deadline = Instant::now() + REMOTE_REPORT_WAIT;
                while d.remote_exits.is_empty() && Instant::now() < deadline {
                    if let Ok(m) = rx.recv_timeout(Duration::from_millis(20)) {
                        d.incoming(m);
                    }
                }
                bad.append(&mut d.remote_exits);
                first = root_cause(&bad).cloned().unwrap_or(first);
            }
            if let Some(fwd) = &d.forward {
                fwd.send(Event::Exited {
                    rank: first.rank,
                    node: shared.spec.node_rank,
                    code: first.code,
                    signal: first.signal,
                });
                fwd.flush(Duration::from_secs(2));
            }
            let failure = d.failure(&first);
            shared.lock().failure = Some(failure);
        }
    }

    // Every worker is gone: take in what is still in flight.
    workers.join_readers(Duration::from_secs(1));
    // Other nodes' `done` events travel further than this node's.
    let settle = if shared.spec.nodes > 1 && !joined {
        REMOTE_DONE_WAIT
    } else {
        Duration::from_millis(300)
    };
    let deadline = Instant::now() + settle;
    while Instant::now() < deadline && !joined {
        match rx.recv_timeout(Duration::from_millis(20)) {
            Ok(m) => d.incoming(m),
            Err(_) => {
                let st = shared.lock();
                if st.summaries.iter().all(|s| s.is_some()) || st.failure.is_some() {
                    break;
                }
            }
        }
    }
    if let (Some(first), true) = (
        d.remote_exits.first().cloned(),
        shared.lock().failure.is_none(),
    ) {
        let failure = d.failure(&first);
        shared.lock().failure = Some(failure);
    }
    d.flush_dedup(true);
    if let Some(fwd) = &d.forward {
        fwd.flush(Duration::from_secs(2));
    }
    let dropped = collector.as_ref().map_or(0, |c| c.dropped());
    drop(collector);
    drop(store);

    let status = {
        let mut st = shared.lock();
        st.dropped_events = dropped;
        st.elapsed = shared.started.elapsed().as_secs_f64();
        // Other nodes see their own workers' clean exits; node 0 every rank's `done`.
        let every_rank_done = joined || st.summaries.iter().all(|s| s.is_some());
        st.status = final_status(st.failure.is_some(), stopped_by_user, every_rank_done);
        if st.status == JobStatus::Failed && st.failure.is_none() {
            st.failure = Some(TrainError::WorkerFailed {
                rank: 0,
                how: "workers exited without reporting completion".into(),
                message: String::new(),
                tail: String::new(),
                log: shared.run_dir.join("logs").display().to_string(),
            });
        }
        let rows = st.metrics.clone();
        drop(st);
        if let Err(e) = metrics::write_parquet(&rows, &shared.run_dir.join("metrics.parquet")) {
            eprintln!("trainbook: could not write metrics.parquet: {e:#}");
        }
        shared.lock().status
    };
    shared.publish(Update::Finished(status));
    shared.finished.notify_all();
}

impl Driven {
    fn request_stop(&self) {
        self.shared.stop_requested.store(true, Ordering::Relaxed);
    }

    fn wait_finished(&self, timeout: Duration) -> bool {
        let deadline = Instant::now().checked_add(timeout);
        let mut st = self.shared.lock();
        while !st.status.is_finished() {
            let left = deadline
                .map(|d| d.saturating_duration_since(Instant::now()))
                .unwrap_or(Duration::from_secs(3600));
            if left.is_zero() {
                return false;
            }
            st = self
                .shared
                .finished
                .wait_timeout(st, left)
                .map(|(g, _)| g)
                .unwrap_or_else(|e| e.into_inner().0);
        }
        true
    }
}

impl JobControl for Driven {
    fn id(&self) -> u64 {
        self.shared.id
    }

    fn spec(&self) -> &JobSpec {
        &self.shared.spec
    }

    fn device(&self) -> DeviceKind {
        self.shared.device
    }

    fn run_dir(&self) -> &Path {
        &self.shared.run_dir
    }

    /// The zeromq endpoint workers report to (loopback; messages need the job's token).
    fn events_endpoint(&self) -> &str {
        &self.shared.events_endpoint
    }

    fn status(&self) -> JobStatus {
        self.shared.lock().status
    }

    /// Worker process ids (for diagnostics and tests).
    fn pids(&self) -> Vec<u32> {
        self.shared.lock().pids.clone()
    }

    fn progress(&self) -> Option<Progress> {
        self.shared.lock().progress.clone()
    }

    /// Attaches a view that [`Job::wait`] lets settle before it returns (see [`JobView`]).
    fn attach_view(&self, view: Arc<dyn JobView>) {
        self.shared
            .views
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(view);
    }

    /// Every metric row reported so far, in arrival order.
    fn metric_rows(&self) -> Vec<MetricRow> {
        self.shared.lock().metrics.clone()
    }

    /// The most recent log lines of all workers (the run directory holds the full logs).
    fn logs(&self) -> Vec<LogRecord> {
        self.shared.lock().logs.iter().cloned().collect()
    }

    /// Messages that reached the event socket without this job's token (dropped).
    fn dropped_events(&self) -> u64 {
        self.shared.lock().dropped_events
    }

    /// Live updates from now on. Dropping the receiver unsubscribes.
    fn subscribe(&self) -> mpsc::Receiver<Update> {
        let (tx, rx) = mpsc::channel();
        // Holding the subscriber list while reading the status closes the race with the
        // driver, which sets the final status before it publishes `Finished` to this list:
        // either we see the final status here, or we are on the list when it is published.
        let mut subs = self
            .shared
            .subscribers
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        let status = JobControl::status(self);
        if status.is_finished() {
            let _ = tx.send(Update::Finished(status));
        } else {
            subs.push(tx);
        }
        rx
    }

    /// Stops the workers (SIGTERM, then SIGKILL after a grace period) and waits for them.
    fn stop(&self) -> Result<()> {
        self.request_stop();
        if !self.wait_finished(STOP_GRACE + Duration::from_secs(5)) {
            bail!(
                "job {} did not stop within {} s; its workers were sent SIGKILL",
                JobControl::id(self),
                STOP_GRACE.as_secs() + 5
            );
        }
        Ok(())
    }

    /// Blocks until the job ends. Ok for a successful job; the error names the failing rank
    /// or says the job was stopped. [`Job::result`] has the details either way.
    fn wait(&self) -> Result<TrainResult> {
        self.wait_finished(Duration::MAX);
        let views =
            std::mem::take(&mut *self.shared.views.lock().unwrap_or_else(|e| e.into_inner()));
        let deadline = Instant::now() + SETTLE_TIMEOUT;
        for v in views {
            v.settle(deadline.saturating_duration_since(Instant::now()));
        }
        let result = self.result()?;
        match result.status {
            JobStatus::Succeeded => Ok(result),
            JobStatus::Stopped => Err(TrainError::Interrupted {
                run_dir: result.run_dir.display().to_string(),
            }
            .into()),
            _ => Err(self
                .shared
                .lock()
                .failure
                .clone()
                .map(anyhow::Error::from)
                .unwrap_or_else(|| anyhow!("the job failed"))),
        }
    }

    /// The job's result so far (final once the job has finished).
    fn result(&self) -> Result<TrainResult> {
        let st = self.shared.lock();
        let summaries: Vec<&WorkerSummary> = st.summaries.iter().flatten().collect();
        let s0 = st.summaries.first().cloned().flatten().unwrap_or_default();
        let samples: u64 = summaries.iter().map(|s| s.samples).sum();
        let secs = summaries
            .iter()
            .map(|s| s.train_seconds)
            .fold(0.0, f64::max);
        let mut final_metrics = s0.metrics.clone();
        let best_epoch = st
            .metrics
            .iter()
            .filter(|m| m.name == "eval_loss")
            .min_by(|a, b| a.value.total_cmp(&b.value))
            .map(|m| m.epoch);
        let last_checkpoint = st.checkpoints.last().map(|(_, p)| p.clone());
        let best_checkpoint = best_epoch
            .and_then(|e| {
                // The epoch's last checkpoint: the one at its end, after any step checkpoints.
                st.checkpoints
                    .iter()
                    .rev()
                    .find(|(ce, _)| *ce == e)
                    .map(|(_, p)| p.clone())
            })
            .or_else(|| last_checkpoint.clone());
        let sps = if secs > 0.0 {
            samples as f64 / secs
        } else {
            0.0
        };
        final_metrics.insert("samples_per_second".into(), sps);
        final_metrics.insert("train_loss".into(), s0.final_train_loss);
        Ok(TrainResult {
            status: st.status,
            recipe: self.shared.spec.recipe.clone(),
            workers: self.shared.spec.world_size(),
            device: self.shared.device,
            metrics: final_metrics,
            metric_rows: st.metrics.clone(),
            last_checkpoint,
            best_checkpoint,
            run_dir: self.shared.run_dir.clone(),
            error: st.failure.as_ref().map(|f| f.to_string()).or(
                if st.status == JobStatus::Stopped {
                    Some("stopped".into())
                } else {
                    None
                },
            ),
            steps: s0.steps,
            samples_per_second: sps,
            final_train_loss: s0.final_train_loss,
            param_sum: s0.param_sum,
            param_l2: s0.param_l2,
            memory: summaries.iter().map(|s| s.memory.clone()).collect(),
            elapsed: if st.status.is_finished() {
                st.elapsed
            } else {
                self.shared.started.elapsed().as_secs_f64()
            },
        })
    }
}

/// 127.0.0.0/8, ::1 or localhost.
fn is_loopback(addr: &str) -> bool {
    addr == "localhost"
        || addr
            .parse::<std::net::IpAddr>()
            .map(|ip| ip.is_loopback())
            .unwrap_or(false)
}

/// `name`: the run's directory name (another node's run keeps node 0's name); default
/// `<recipe>-<time>-<random>`.
fn create_run_dir(spec: &JobSpec, name: Option<String>) -> Result<PathBuf> {
    let root = spec
        .runs_root
        .clone()
        .or_else(|| std::env::var_os("TRAINBOOK_RUNS").map(PathBuf::from))
        .unwrap_or_else(|| PathBuf::from("trainbook_runs"));
    let stamp = chrono::Local::now().format("%Y%m%d-%H%M%S");
    let suffix: u16 = rand::random();
    let dir = root.join(name.unwrap_or_else(|| format!("{}-{stamp}-{suffix:04x}", spec.recipe)));
    std::fs::create_dir_all(dir.join("logs"))
        .with_context(|| format!("cannot create the run directory {}: check that its parent is writable, or set TRAINBOOK_RUNS", dir.display()))?;
    Ok(std::fs::canonicalize(&dir).unwrap_or(dir))
}

/// Writes JSON to a temporary file beside `path`, then renames it into place.
pub fn write_json_atomic<T: Serialize>(path: &Path, value: &T) -> Result<()> {
    crate::checkpoint::write_atomic(path, &serde_json::to_vec_pretty(value)?)
}

#[cfg(test)]
mod tests {
    //! The driver's folding of events into a job, fed synthetic event sequences: no worker
    //! processes, sockets or UI.
    use super::*;
    use crate::events::LogStream;
    use crate::spec::Configure;

    fn driver(shared: &Shared) -> Driver<'_> {
        Driver {
            shared,
            dedup: Deduplicator::new(shared.spec.dedup),
            log_files: Vec::new(),
            dllog: None,
            forward: None,
            remote_exits: Vec::new(),
        }
    }

    fn job(workers: usize) -> Shared {
        let spec = JobSpec::new("synthetic").workers(workers);
        Shared::new(
            spec,
            DeviceKind::Cpu,
            PathBuf::from("/runs/r1"),
            "tcp://x".into(),
        )
    }

    fn subscribe(shared: &Shared) -> mpsc::Receiver<Update> {
        let (tx, rx) = mpsc::channel();
        shared.subscribers.lock().unwrap().push(tx);
        rx
    }

    fn metric(rank: usize, step: u64, name: &str, value: f64) -> Event {
        Event::Metric {
            rank,
            step,
            epoch: 0,
            name: name.into(),
            value,
            time: 0.0,
        }
    }

    fn log(rank: usize, text: &str) -> Event {
        Event::Log {
            rank,
            stream: LogStream::Stdout,
            text: text.into(),
        }
    }

    #[test]
    fn events_fold_into_the_jobs_state_and_reach_subscribers_in_order() {
        let shared = job(2);
        let updates = subscribe(&shared);
        let mut d = driver(&shared);
        d.event(metric(0, 1, "loss", 0.9));
        d.event(Event::Progress {
            rank: 0,
            step: 1,
            total_steps: 10,
            epoch: 0,
            epochs: 1,
            samples: 8,
            samples_per_second: 4.0,
        });
        d.event(metric(1, 1, "loss", 0.8));
        d.event(Event::Checkpoint {
            rank: 0,
            step: 10,
            epoch: 0,
            path: "/runs/r1/checkpoints/epoch-0".into(),
        });
        let st = shared.lock();
        assert_eq!(st.metrics.len(), 2);
        assert_eq!((st.metrics[1].rank, st.metrics[1].value), (1, 0.8));
        assert_eq!(st.progress.as_ref().map(|p| p.step), Some(1));
        assert_eq!(st.checkpoints[0].0, 0);
        drop(st);
        let got: Vec<&str> = updates
            .try_iter()
            .map(|u| match u {
                Update::Metric(_) => "metric",
                Update::Progress(_) => "progress",
                Update::Checkpoint { .. } => "checkpoint",
                _ => "other",
            })
            .collect();
        assert_eq!(got, ["metric", "progress", "metric", "checkpoint"]);
    }

    #[test]
    fn a_failure_names_the_rank_its_error_its_last_lines_and_its_log() {
        let shared = job(2);
        let mut d = driver(&shared);
        for i in 0..30 {
            d.event(log(1, &format!("step {i}")));
        }
        d.event(log(0, "rank 0 is fine"));
        d.event(Event::Error {
            rank: 1,
            message: "loss became NaN at step 3".into(),
        });
        let failure = d.failure(&Exit {
            rank: 1,
            code: Some(1),
            signal: None,
        });
        let TrainError::WorkerFailed {
            rank,
            how,
            message,
            tail,
            log,
        } = failure
        else {
            panic!("not a worker failure: {failure:?}")
        };
        assert_eq!((rank, how.as_str()), (1, "exit code 1"));
        assert_eq!(message, "\nerror: loss became NaN at step 3");
        // The last TAIL_LINES lines of that rank only, its error included.
        let lines: Vec<&str> = tail.lines().collect();
        assert_eq!(lines.len(), TAIL_LINES);
        assert_eq!(lines.last(), Some(&"  error: loss became NaN at step 3"));
        assert!(!tail.contains("rank 0 is fine") && !tail.contains("step 10\n"));
        assert_eq!(log, "/runs/r1/logs/rank1.log");
    }

    #[test]
    fn a_clean_exit_without_its_done_event_is_a_failure_too() {
        let shared = job(1);
        let d = driver(&shared);
        let TrainError::WorkerFailed { how, tail, .. } = d.failure(&Exit {
            rank: 0,
            code: Some(0),
            signal: None,
        }) else {
            panic!()
        };
        assert_eq!(how, "exited before reporting completion");
        assert_eq!(tail, "  (no output)");
    }

    #[test]
    fn the_root_cause_is_the_worker_killed_by_a_signal_else_the_lowest_rank() {
        let exit = |rank, code, signal| Exit { rank, code, signal };
        let peers_then_killed = [
            exit(0, Some(1), None),
            exit(3, None, Some(9)),
            exit(1, Some(1), None),
        ];
        assert_eq!(root_cause(&peers_then_killed).map(|e| e.rank), Some(3));
        let plain = [exit(2, Some(1), None), exit(1, Some(1), None)];
        assert_eq!(root_cause(&plain).map(|e| e.rank), Some(1));
        assert_eq!(root_cause(&[]), None);
    }

    #[test]
    fn the_final_status_follows_failure_then_stop_then_completion() {
        use JobStatus::*;
        // (failed, stopped by the user, every rank reported done) → status
        let table = [
            ((true, false, false), Failed),
            ((true, true, true), Failed),
            ((false, true, false), Stopped),
            ((false, true, true), Stopped),
            ((false, false, true), Succeeded),
            ((false, false, false), Failed),
        ];
        for ((f, s, d), want) in table {
            assert_eq!(
                final_status(f, s, d),
                want,
                "failed={f} stopped={s} done={d}"
            );
        }
    }

    #[test]
    fn repeated_lines_of_several_ranks_reach_subscribers_once_plus_a_summary() {
        let shared = job(3);
        let updates = subscribe(&shared);
        let mut d = driver(&shared);
        for rank in 0..3 {
            d.event(log(rank, "loading the tokenizer"));
        }
        d.flush_dedup(true);
        let shown: Vec<crate::dedup::Shown> = updates
            .try_iter()
            .filter_map(|u| match u {
                Update::Log(s) => Some(s),
                _ => None,
            })
            .collect();
        assert_eq!(shown.len(), 2, "{shown:?}");
        assert_eq!((shown[0].rank, shown[0].repeats.is_none()), (0, true));
        let repeats = shown[1].repeats.as_ref().expect("a summary of the repeats");
        assert_eq!(repeats.ranks.iter().copied().collect::<Vec<_>>(), [1, 2]);
        // Every line is still kept for job.logs(), one record per rank.
        assert_eq!(shared.lock().logs.len(), 3);
    }
}
