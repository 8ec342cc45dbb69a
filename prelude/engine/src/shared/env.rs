//! The contract between the driver and the processes it starts: the environment through which
//! a worker receives its job (besides torch's own RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR and
//! MASTER_PORT), the worker binary's arguments, and the HPU probe's answer. One place, so the
//! side that sets a variable and the side that reads it cannot drift apart.

/// Where the worker sends its events (a ZeroMQ endpoint).
pub(crate) const EVENTS: &str = "TRAINBOOK_EVENTS";
/// The job's secret, which every event carries.
pub(crate) const TOKEN: &str = "TRAINBOOK_TOKEN";
/// The run directory.
pub(crate) const RUN_DIR: &str = "TRAINBOOK_RUN_DIR";
/// The run's `config.json` ([`crate::shared::checkpoint::RunConfig`]).
pub(crate) const CONFIG: &str = "TRAINBOOK_CONFIG";
/// cpu, cuda or hpu.
pub(crate) const DEVICE: &str = "TRAINBOOK_DEVICE";
/// Intra-op threads.
pub(crate) const THREADS: &str = "TRAINBOOK_THREADS";
/// Set to 1 by a launcher that hosts the rendezvous store itself (see
/// `worker::dist::InitOptions`).
pub(crate) const AGENT_STORE: &str = "TRAINBOOK_AGENT_STORE";
/// The address a worker's gloo connections bind to (jobs of several nodes).
pub(crate) const NODE_ADDR: &str = "TRAINBOOK_NODE_ADDR";
/// The checkpoint directory a restarted (or resumed) worker continues from: the driver's
/// choice, over the job's own `resume_from`.
pub(crate) const RESUME: &str = "TRAINBOOK_RESUME";
/// Which start of the job's workers this is (0 first, 1 after the first restart...): each
/// start rendezvouses under its own store prefix, so nothing of a failed start is read again.
pub(crate) const ATTEMPT: &str = "TRAINBOOK_ATTEMPT";
/// `warn` or `error`: a CUDA worker reports (or fails at) every operation that makes the host
/// wait for the GPU while it trains (`torch.cuda.set_sync_debug_mode`), to find the ones
/// inside a step.
pub(crate) const CUDA_SYNC_DEBUG: &str = "TRAINBOOK_CUDA_SYNC_DEBUG";
/// Set for a user's program re-executed as a worker of its own task (see `worker::task`).
pub const WORKER_MAIN: &str = "TRAINBOOK_WORKER_MAIN";
/// The worker binary of tasks defined in notebook cells, beside `trainbook-worker`.
pub(crate) const CELL_WORKER: &str = "trainbook-cell-worker";
/// The argument that makes `trainbook-worker` load Gaudi's bridge, print an [`HpuProbe`] as
/// JSON and exit (see `driver::placement`).
pub(crate) const PROBE_HPU: &str = "--probe-hpu";

/// What a worker process found when it loaded Gaudi's bridge (`trainbook-worker --probe-hpu`).
#[derive(Clone, Debug, serde::Serialize, serde::Deserialize)]
pub(crate) struct HpuProbe {
    /// Why HPUs are not usable, with the fix; `None` when they are.
    pub error: Option<String>,
    /// Facts the bridge reported (versions, paths), for logs.
    #[serde(default)]
    pub facts: Vec<String>,
    /// Devices visible to the bridge, when it says.
    #[serde(default)]
    pub device_count: Option<usize>,
}
