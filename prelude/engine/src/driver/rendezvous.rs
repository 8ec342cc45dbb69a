//! How a node joins its job. Node 0 (and a job of one node) resolves the job, hosts c10d's
//! rendezvous store and the event stream; nodes 1..N fetch node 0's resolved job from that
//! store, so every node runs exactly the same hyper-parameters and reports to one place.
//!
//! The store also carries which *start* of the workers is current ([`StartInfo`]): node 0
//! publishes each restart there, the other nodes' drivers start their workers for it and mark
//! that they did, and a node's driver that was lost and runs again joins the next start rather
//! than the one its predecessor was part of.

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{bail, Context, Result};
use serde::Serialize;
use trainbook_api::plumbing::DEFAULT_MASTER_PORT;
use trainbook_api::DeviceKind;
use trainbook_api::{JobSpec, Resume};

use super::placement;
use crate::shared::checkpoint::{self, RunConfig, RunStatus};
use crate::shared::events::{self, Collector, Emitter};
use crate::worker::dist::Store;
use crate::worker::jobs::JobKind;
use crate::worker::recipe::Registry;

/// What every node's driver needs to start its workers. Node 0 makes it and publishes it in
/// the rendezvous store; the other nodes read it from there, so they run exactly node 0's
/// resolved job and send their events to node 0's collector.
#[derive(Serialize, serde::Deserialize)]
struct JobInfo {
    pub(super) config: RunConfig,
    pub(super) device: DeviceKind,
    pub(super) events: String,
    pub(super) token: String,
    run_name: String,
}

/// The store key of [`JobInfo`].
const JOB_KEY: &str = "trainbook/job";
/// The store key of the current [`StartInfo`].
const START_KEY: &str = "trainbook/start";
/// Set by node 0 when the job has ended: nodes waiting for a restart give up.
const END_KEY: &str = "trainbook/end";

/// A start of the job's workers: the first (attempt 0) or a restart, and the checkpoint it
/// continues from.
#[derive(Clone, Debug, Default, PartialEq, Serialize, serde::Deserialize)]
pub(super) struct StartInfo {
    pub(super) attempt: u32,
    pub(super) resume: Option<PathBuf>,
}

fn started_key(attempt: u32, node: usize) -> String {
    format!("{START_KEY}/{attempt}/node/{node}")
}

/// Node 0: makes `start` the job's current start.
pub(super) fn publish_start(store: &Store, start: &StartInfo) -> Result<()> {
    store.set(START_KEY, &serde_json::to_vec(start)?)
}

/// The job's current start, if node 0 published one.
pub(super) fn current_start(store: &Store) -> Result<Option<StartInfo>> {
    store
        .try_get(START_KEY)?
        .map(|b| {
            serde_json::from_slice(&b)
                .context("node 0 published a start this trainbook cannot read")
        })
        .transpose()
}

/// Records that `node` started its workers for `attempt`.
pub(super) fn mark_started(store: &Store, attempt: u32, node: usize) -> Result<()> {
    store.set(&started_key(attempt, node), b"1")
}

/// Whether `node` started its workers for `attempt`.
pub(super) fn has_started(store: &Store, attempt: u32, node: usize) -> bool {
    store.check(&started_key(attempt, node)).unwrap_or(false)
}

/// Node 0: the job has ended.
pub(super) fn publish_end(store: &Store) {
    store.set(END_KEY, b"1").ok();
}

pub(super) fn ended(store: &Store) -> bool {
    store.check(END_KEY).unwrap_or(false)
}

/// Nodes 1..N: waits up to `timeout` for a start newer than `after` (or the job's end: `None`).
pub(super) fn next_start(store: &Store, after: u32, timeout: Duration) -> Option<StartInfo> {
    let deadline = std::time::Instant::now() + timeout;
    while std::time::Instant::now() < deadline {
        match current_start(store) {
            Ok(Some(s)) if s.attempt > after => return Some(s),
            Err(_) => return None,
            _ if ended(store) => return None,
            _ => std::thread::sleep(Duration::from_millis(100)),
        }
    }
    None
}

/// How this node takes part in its job.
pub(super) struct Node {
    pub(super) config: RunConfig,
    pub(super) device: DeviceKind,
    pub(super) run_dir: PathBuf,
    pub(super) store: Store,
    pub(super) events: String,
    pub(super) token: String,
    /// Node 0 collects every rank's events.
    pub(super) collector: Option<Collector>,
    /// Other nodes forward their workers' output and failures to node 0.
    pub(super) forward: Option<Emitter>,
    /// The start this node's workers begin with.
    pub(super) start: StartInfo,
}

/// Node 0 (and a job of one node): resolve the job, host the rendezvous and the event stream.
/// Every event that reaches the collector goes to `sink` (false: nobody listens any more).
pub(super) fn host(
    spec: JobSpec,
    recipes: &Registry,
    sink: impl Fn(events::Event) -> bool + Send + 'static,
) -> Result<Node> {
    // The preset and every option resolved here, before any process starts: a bad option
    // fails at once, and config.json records what the run uses.
    let hyper = recipes.resolve(&spec)?;
    // What every worker would reject for the job's shape, refused before any of them starts.
    if let Some(h) = &hyper {
        h.local_batch(spec.world_size())?;
    }
    let device = placement::resolve(spec.device, spec.workers)?;
    // A job that cannot fit its devices fails here, before its run directory exists.
    if let (Some(h), JobKind::Recipe(entry)) = (&hyper, recipes.job_kind(&spec.recipe)?) {
        crate::worker::memory::check(entry, &spec, h, device)?;
    }
    let run_dir = create_run_dir(&spec, None)?;
    let start = StartInfo {
        attempt: 0,
        resume: named_run_resume(&spec, &run_dir)?,
    };
    let config = RunConfig { spec, hyper };
    checkpoint::write_json_atomic(&run_dir.join(checkpoint::RUN_CONFIG), &config)?;
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
    // The event stream listens on a routable address only when other nodes must reach it.
    let listen = if several {
        spec.master_addr.as_str()
    } else {
        "127.0.0.1"
    };
    let collector = Collector::start(listen, token.clone(), sink)?;
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
        publish_start(&store, &start)?;
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
        start,
    })
}

/// Nodes 1..N: fetch node 0's job from its rendezvous store and run this node's share of it.
pub(super) fn join(spec: JobSpec) -> Result<Node> {
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
    config.spec.view = spec.view;
    let run_dir = create_run_dir(&config.spec, Some(format!("{}-node{node}", info.run_name)))?;
    checkpoint::write_json_atomic(&run_dir.join(checkpoint::RUN_CONFIG), &config)?;
    let forward = Emitter::connect(&info.events, &info.token, config.spec.local_ranks().start)
        .context("connecting to node 0's event stream")?;
    // A driver that replaces one lost from this node joins the next start, which node 0
    // publishes once it has noticed the loss.
    let mut start = current_start(&store)?.unwrap_or_default();
    if has_started(&store, start.attempt, node) {
        eprintln!(
            "trainbook: node {node} rejoins its job: waiting for node 0 to restart it (up to {} s)",
            timeout.as_secs()
        );
        start = next_start(&store, start.attempt, timeout).ok_or_else(|| {
            anyhow::anyhow!(
                "node {node} rejoined its job, but node 0 did not restart it within {} s (its job may have ended, or restarts are off: max_failures 0)",
                timeout.as_secs()
            )
        })?;
    }
    Ok(Node {
        config,
        device: info.device,
        run_dir,
        store,
        events: info.events,
        token: info.token,
        collector: None,
        forward: Some(forward),
        start,
    })
}

/// 127.0.0.0/8, ::1 or localhost.
pub(super) fn is_loopback(addr: &str) -> bool {
    addr == "localhost"
        || addr
            .parse::<std::net::IpAddr>()
            .map(|ip| ip.is_loopback())
            .unwrap_or(false)
}

/// What a named run's directory says about this start: the checkpoint to continue from
/// (`resume auto`), nothing (a new run, or one without checkpoints), or an error when the run
/// already finished or has checkpoints that a start without `resume auto` would mix with.
fn named_run_resume(spec: &JobSpec, run_dir: &Path) -> Result<Option<PathBuf>> {
    let Some(name) = &spec.run_name else {
        return Ok(None);
    };
    if let Some(s) = RunStatus::read(run_dir).filter(|s| s.status == "succeeded") {
        bail!(
            "run '{name}' already finished ({} after {} steps, in {}): nothing to resume. Choose another name to train again, or remove that directory",
            s.status,
            s.steps,
            run_dir.display()
        );
    }
    let Some((dir, state)) = checkpoint::latest(run_dir) else {
        return Ok(None);
    };
    match spec.resume {
        Resume::Auto => Ok(Some(dir)),
        Resume::Never => bail!(
            "run '{name}' already has checkpoints (the newest at step {}: {}): continue it with --resume auto (.resume(Resume::Auto)), or choose another name",
            state.step,
            dir.display()
        ),
    }
}

/// `name`: the run's directory name (another node's run keeps node 0's name); default the
/// job's `run_name`, else `<recipe>-<time>-<random>`.
fn create_run_dir(spec: &JobSpec, name: Option<String>) -> Result<PathBuf> {
    let name = name.or_else(|| spec.run_name.clone());
    let root = super::runs_root(spec);
    let stamp = chrono::Local::now().format("%Y%m%d-%H%M%S");
    let suffix: u16 = rand::random();
    let dir = root.join(name.unwrap_or_else(|| format!("{}-{stamp}-{suffix:04x}", spec.recipe)));
    std::fs::create_dir_all(dir.join("logs"))
        .with_context(|| format!("cannot create the run directory {}: check that its parent is writable, or set TRAINBOOK_RUNS", dir.display()))?;
    Ok(std::fs::canonicalize(&dir).unwrap_or(dir))
}
