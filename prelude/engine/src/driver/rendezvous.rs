//! How a node joins its job. Node 0 (and a job of one node) resolves the job, hosts c10d's
//! rendezvous store and the event stream; nodes 1..N fetch node 0's resolved job from that
//! store, so every node runs exactly the same hyper-parameters and reports to one place.
//!
//! The store also carries which *start* of the workers is current ([`Start`]): node 0
//! publishes each restart there, the other nodes' drivers start their workers for it and mark
//! that they did, and a node's driver that was lost and runs again joins the next start rather
//! than the one its predecessor was part of.

use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::shared::run_dir::RunDir;

use anyhow::{bail, Context, Result};
use serde::Serialize;
use trainbook_api::plumbing::settings::DEFAULT_MASTER_PORT;
use trainbook_api::DeviceKind;
use trainbook_api::{JobSpec, Resume};

use super::membership::{self, Membership};
use super::placement;
use crate::shared::checkpoint::{self, RunConfig, RunStatus};
use crate::shared::events::{self, Collector, Emitter};
use crate::worker::dist::Store;
use crate::worker::jobs::Work;
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
/// The store key of the current [`Start`].
const START_KEY: &str = "trainbook/start";
/// Set by node 0 when the job has ended: nodes waiting for a restart give up.
const END_KEY: &str = "trainbook/end";
/// Set by each node of an elastic job once it has read the job: node 0 starts it on the
/// nodes that have.
const READY_KEY: &str = "trainbook/ready";
/// How long node 0 of an elastic job waits for the rest of its nodes once the fewest have
/// joined (torchrun's rendezvous waits similarly before it closes a round).
const LAST_CALL: Duration = Duration::from_secs(10);
/// How often a node that waits for a start says it is alive.
const ALIVE_EVERY: Duration = Duration::from_secs(1);

/// A start of the job's workers: the first (attempt 0) or a restart, the checkpoint it
/// continues from, and the nodes it runs on.
#[derive(Clone, Debug, Default, PartialEq, Serialize, serde::Deserialize)]
pub(super) struct Start {
    pub(super) attempt: u32,
    pub(super) resume: Option<PathBuf>,
    /// The nodes of this start in rank order (an elastic job's choice); empty: every node.
    #[serde(default)]
    pub(super) members: Vec<usize>,
}

impl Start {
    pub(super) fn membership(&self, spec: &JobSpec) -> Membership {
        Membership::new(&self.members, spec.nodes, spec.workers)
    }
}

fn started_key(attempt: u32, node: usize) -> String {
    format!("{START_KEY}/{attempt}/node/{node}")
}

/// Node 0: makes `start` the job's current start.
pub(super) fn publish_start(store: &Store, start: &Start) -> Result<()> {
    store.set(START_KEY, &serde_json::to_vec(start)?)
}

/// The job's current start, if node 0 published one.
pub(super) fn current_start(store: &Store) -> Result<Option<Start>> {
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
pub(super) fn next_start(store: &Store, after: u32, timeout: Duration) -> Option<Start> {
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
    pub(super) run_dir: RunDir,
    pub(super) store: Store,
    pub(super) events: String,
    pub(super) token: String,
    /// Node 0 collects every rank's events.
    pub(super) collector: Option<Collector>,
    /// Other nodes forward their workers' output and failures to node 0.
    pub(super) forward: Option<Emitter>,
    /// The start this node's workers begin with.
    pub(super) start: Start,
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
    let counts = spec.node_counts(hyper.as_ref());
    if counts.is_empty() {
        bail!(
            "no number of nodes from {} to {} splits the global batch of {} samples evenly over their workers ({} per node{}), and an elastic job keeps the samples of a step at every size: choose a global batch that divides by the workers of several of those sizes, e.g. {}",
            spec.min_nodes.unwrap_or(spec.nodes),
            spec.nodes,
            hyper.as_ref().map_or(0, |h| h.global_batch_size),
            spec.workers,
            hyper.as_ref().filter(|h| h.grad_accum > 1).map_or(String::new(), |h| format!(" x {} micro-batches", h.grad_accum)),
            (spec.min_nodes.unwrap_or(1)..=spec.nodes).fold(1, lcm) * spec.workers * hyper.as_ref().map_or(1, |h| h.grad_accum.max(1))
        );
    }
    // A job that cannot fit its devices fails here, before its run directory exists.
    if let (Some(h), Work::Recipe(entry)) = (&hyper, recipes.work(&spec)?) {
        // An elastic job's workers hold the most (the largest share of the batch) at its
        // smallest size.
        let mut smallest = spec.clone();
        smallest.nodes = counts[0];
        smallest.min_nodes = None;
        crate::worker::memory::check(entry, &smallest, h, device)?;
    }
    let run_dir = create_run_dir(&spec, None)?;
    let mut start = Start {
        attempt: 0,
        resume: named_run_resume(&spec, &run_dir)?,
        members: Vec::new(),
    };
    let config = RunConfig { spec, hyper };
    checkpoint::write_json_atomic(&run_dir.config(), &config)?;
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
        if spec.is_elastic() {
            store.set(JOB_KEY, &serde_json::to_vec(&info)?)?;
            start.members = gather(&store, spec, &counts, timeout)?;
            publish_start(&store, &start)?;
        } else {
            publish_start(&store, &start)?;
            store.set(JOB_KEY, &serde_json::to_vec(&info)?)?;
        }
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
    if theirs.recipe != spec.recipe
        || theirs.nodes != spec.nodes
        || theirs.min_nodes != spec.min_nodes
        || theirs.workers != spec.workers
    {
        bail!(
            "node {node} was started for {} on {} node(s) x {} worker(s), but node 0 runs {} on {} node(s) x {} worker(s): start every node with the same recipe, --nnodes and --workers",
            spec.recipe,
            nodes_text(&spec),
            spec.workers,
            theirs.recipe,
            nodes_text(theirs),
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
    checkpoint::write_json_atomic(&run_dir.config(), &config)?;
    let forward = Emitter::connect(&info.events, &info.token, config.spec.local_ranks().start)
        .context("connecting to node 0's event stream")?;
    let start = if config.spec.is_elastic() {
        store.set(&format!("{READY_KEY}/{node}"), b"1")?;
        await_turn(&store, &config.spec, &forward)?
    } else {
        rejoin_start(&store, node, timeout)?
    };
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

/// Nodes 1..N of a job of fixed size: the current start, or, for a driver that replaces one
/// lost from this node, the next, which node 0 publishes once it has noticed the loss.
fn rejoin_start(store: &Store, node: usize, timeout: Duration) -> Result<Start> {
    let start = current_start(store)?.unwrap_or_default();
    if !has_started(store, start.attempt, node) {
        return Ok(start);
    }
    eprintln!(
        "trainbook: node {node} rejoins its job: waiting for node 0 to restart it (up to {} s)",
        timeout.as_secs()
    );
    next_start(store, start.attempt, timeout).ok_or_else(|| {
        anyhow::anyhow!(
            "node {node} rejoined its job, but node 0 did not restart it within {} s (its job may have ended, or restarts are off: max_failures 0)",
            timeout.as_secs()
        )
    })
}

/// The least common multiple of `a` and `b`.
fn lcm(a: usize, b: usize) -> usize {
    fn gcd(a: usize, b: usize) -> usize {
        if b == 0 {
            a
        } else {
            gcd(b, a % b)
        }
    }
    a / gcd(a, b).max(1) * b
}

/// `4` or, for an elastic job, `2:4`.
fn nodes_text(spec: &JobSpec) -> String {
    match spec.min_nodes.filter(|_| spec.is_elastic()) {
        Some(min) => format!("{min}:{}", spec.nodes),
        None => spec.nodes.to_string(),
    }
}

/// Node 0 of an elastic job: waits until the fewest nodes it runs on have joined, then up to
/// [`LAST_CALL`] more for the rest, and returns the nodes the first start runs on.
fn gather(
    store: &Store,
    spec: &JobSpec,
    counts: &[usize],
    timeout: Duration,
) -> Result<Vec<usize>> {
    let t0 = std::time::Instant::now();
    let mut enough_at = None;
    let mut said = 0;
    loop {
        let joined: Vec<usize> = std::iter::once(0)
            .chain(
                (1..spec.nodes)
                    .filter(|k| store.check(&format!("{READY_KEY}/{k}")).unwrap_or(false)),
            )
            .collect();
        let chosen = membership::choose(&joined, counts);
        if joined.len() != said {
            said = joined.len();
            eprintln!(
                "trainbook: {} of {} nodes joined (nodes {}){}",
                joined.len(),
                nodes_text(spec),
                membership::list(&joined),
                if joined.len() < spec.nodes && chosen.is_some() {
                    format!(
                        "; starting in {} s unless the rest join",
                        LAST_CALL.as_secs()
                    )
                } else {
                    String::new()
                }
            );
        }
        if let Some(nodes) = chosen {
            let since = *enough_at.get_or_insert_with(std::time::Instant::now);
            if joined.len() == spec.nodes || since.elapsed() >= LAST_CALL {
                return Ok(nodes);
            }
        }
        if t0.elapsed() >= timeout {
            bail!(
                "only {} of the at least {} nodes this elastic job needs joined within {} s (nodes {}): start the others with the same --nnodes, --master-addr and --master-port and their own --node-rank",
                joined.len(),
                counts[0],
                timeout.as_secs(),
                membership::list(&joined)
            );
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Nodes 1..N of an elastic job: waits for a start that runs on this node and that its
/// workers have not started yet (a node the job does not need now waits for a later one, as
/// long as the job runs), saying it is alive so that node 0 knows it can grow.
fn await_turn(store: &Store, spec: &JobSpec, forward: &Emitter) -> Result<Start> {
    let node = spec.node_rank;
    let mut said = None;
    let mut alive_at: Option<std::time::Instant> = None;
    loop {
        if let Some(s) = current_start(store)? {
            if s.membership(spec).contains(node) && !has_started(store, s.attempt, node) {
                return Ok(s);
            }
            if said != Some(s.attempt) {
                said = Some(s.attempt);
                eprintln!(
                    "trainbook: node {node} waits to join: the job runs on nodes {} now, and takes this node at its next checkpoint",
                    membership::list(s.membership(spec).nodes())
                );
            }
        }
        if ended(store) {
            bail!("node {node} joined a job that ended before it took this node");
        }
        if alive_at.is_none_or(|t| t.elapsed() >= ALIVE_EVERY) {
            forward.send(events::Event::NodeAlive { node });
            alive_at = Some(std::time::Instant::now());
        }
        std::thread::sleep(Duration::from_millis(100));
    }
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
fn create_run_dir(spec: &JobSpec, name: Option<String>) -> Result<RunDir> {
    let name = name.or_else(|| spec.run_name.clone());
    let root = super::runs_root(spec);
    let stamp = chrono::Local::now().format("%Y%m%d-%H%M%S");
    let suffix: u16 = rand::random();
    let dir = root.join(name.unwrap_or_else(|| format!("{}-{stamp}-{suffix:04x}", spec.recipe)));
    std::fs::create_dir_all(RunDir::new(&dir).logs())
        .with_context(|| format!("cannot create the run directory {}: check that its parent is writable, or set TRAINBOOK_RUNS", dir.display()))?;
    Ok(RunDir::new(std::fs::canonicalize(&dir).unwrap_or(dir)))
}
