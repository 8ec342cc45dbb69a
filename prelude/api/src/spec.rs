//! What a training job is: recipe, workers, device and hyper-parameters. Serialised as the run
//! directory's `config.json`, which is also how workers receive it.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::{bail, Result};
use serde::{Deserialize, Serialize};

use crate::device::DeviceRequest;
use crate::topology::Topology;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum OptimizerKind {
    #[default]
    Sgd,
    Adamw,
    /// Layer-wise adaptive moments for large batches (You et al., 2019): Adam's update scaled
    /// per tensor by |weights| / |update| (NVIDIA's NVLAMB variant, bias-corrected).
    Lamb,
    /// LAMB with per-tensor normalised gradients and a Nesterov-style second trust-ratio term
    /// (Zheng et al., 2020); the optimizer of Habana's BERT-1.5B pre-training.
    Lans,
}

impl std::fmt::Display for OptimizerKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Self::Sgd => "sgd",
            Self::Adamw => "adamw",
            Self::Lamb => "lamb",
            Self::Lans => "lans",
        })
    }
}

impl std::str::FromStr for OptimizerKind {
    type Err = anyhow::Error;
    fn from_str(s: &str) -> Result<Self> {
        match s.to_ascii_lowercase().as_str() {
            "sgd" => Ok(Self::Sgd),
            "adamw" => Ok(Self::Adamw),
            "lamb" => Ok(Self::Lamb),
            "lans" => Ok(Self::Lans),
            o => bail!("unknown optimizer '{o}': use sgd, adamw, lamb or lans"),
        }
    }
}

/// How the learning rate changes over the run.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum Schedule {
    /// The same learning rate throughout (after any warm-up).
    #[default]
    Constant,
    /// Linear warm-up, then linear decay to 0 at the last step (Transformers' default).
    Linear,
    /// Linear warm-up, a constant phase (`constant_ratio`), then `lr * (left / span)^poly_power`
    /// down to 0 at the last step: the poly warm-up schedule of BERT pre-training.
    Poly,
}

impl std::fmt::Display for Schedule {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Self::Constant => "constant",
            Self::Linear => "linear",
            Self::Poly => "poly",
        })
    }
}

impl std::str::FromStr for Schedule {
    type Err = anyhow::Error;
    fn from_str(s: &str) -> Result<Self> {
        match s.to_ascii_lowercase().as_str() {
            "constant" => Ok(Self::Constant),
            "linear" => Ok(Self::Linear),
            "poly" => Ok(Self::Poly),
            o => bail!("unknown schedule '{o}': use constant, linear or poly"),
        }
    }
}

/// Numeric precision of the forward and backward passes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Precision {
    #[default]
    Fp32,
    Bf16,
}

impl std::fmt::Display for Precision {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Self::Fp32 => "fp32",
            Self::Bf16 => "bf16",
        })
    }
}

impl std::str::FromStr for Precision {
    type Err = anyhow::Error;
    fn from_str(s: &str) -> Result<Self> {
        match s.to_ascii_lowercase().as_str() {
            "fp32" | "float32" | "f32" => Ok(Self::Fp32),
            "bf16" | "bfloat16" => Ok(Self::Bf16),
            o => bail!("unknown precision '{o}': use fp32 or bf16"),
        }
    }
}

/// How worker logs are de-duplicated across workers (see the engine's `dedup`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DedupOptions {
    /// When false every line passes straight through.
    pub enabled: bool,
    /// How long repeats are collected after a key's first occurrence.
    pub window: Duration,
}

impl Default for DedupOptions {
    fn default() -> Self {
        DedupOptions {
            enabled: true,
            window: Duration::from_secs(5),
        }
    }
}

crate::options! {
    /// The training options every recipe shares.
    struct TrainOptions => Hyper, trait ConfigureTraining(train_options) {
        /// A recipe preset (e.g. tiny): the defaults of every other option; each recipe
        /// documents its own (`trainbook recipes`).
        #[arg(value_name = "NAME")]
        preset: String [into] => String,
        /// Passes over the training set.
        epochs: u64 => u64,
        /// Stop after this many optimizer steps (when fewer than the epochs would take).
        #[arg(value_name = "N")]
        max_steps: u64 => Option<u64>,
        /// Samples per optimizer step over all workers and micro-batches (each worker gets an
        /// equal share).
        #[arg(value_name = "N")]
        global_batch_size: usize => usize,
        /// Learning rate (peak, when a schedule or warm-up is used).
        lr: f64 => f64,
        /// sgd (with momentum), adamw, or for large batches lamb or lans.
        #[arg(value_name = "sgd|adamw|lamb|lans")]
        optimizer: OptimizerKind => OptimizerKind,
        /// SGD momentum.
        momentum: f64 => f64,
        /// Decoupled weight decay (AdamW) or L2 penalty (SGD); not applied to biases and norms.
        weight_decay: f64 => f64,
        /// Dropout probability of the model, in [0, 1); 0 makes runs reproducible across
        /// worker counts.
        dropout: f64 => f64,
        /// Seed for initialisation and data order; the same seed gives the same run.
        seed: u64 => u64,
        /// Clip the global gradient norm to this value.
        grad_clip: f64 => Option<f64>,
        /// Micro-batches per optimizer step: the same global batch in smaller forward passes
        /// (less memory per step).
        #[arg(value_name = "N")]
        grad_accum: usize => usize,
        /// Learning-rate schedule: constant, linear (decays to 0 at the last step) or poly
        /// (warm-up, constant phase, then polynomial decay to 0).
        #[arg(value_name = "constant|linear|poly")]
        schedule: Schedule => Schedule,
        /// Fraction of the optimizer steps spent warming the learning rate up from 0 (e.g. 0.1).
        warmup_ratio: f64 => f64,
        /// poly schedule: fraction of the steps held at the peak after the warm-up (e.g. 0.25).
        constant_ratio: f64 => f64,
        /// poly schedule: the decay's power (1: linear, 0.5: square root).
        poly_power: f64 => f64,
        /// Also write a checkpoint every N optimizer steps (checkpoints/step-N), besides the
        /// one at each epoch's end.
        #[arg(value_name = "N")]
        checkpoint_every: u64 => Option<u64>,
        /// Also write a step checkpoint when this many minutes have passed since the last one
        /// (a restart or a resume loses at most this much training; e.g. 30).
        #[arg(value_name = "MINUTES")]
        checkpoint_every_minutes: f64 => Option<f64>,
        /// Keep only the last K step checkpoints (epoch checkpoints are all kept).
        #[arg(value_name = "K")]
        keep_checkpoints: usize => Option<usize>,
        /// Write step checkpoints in the background: the step pays only for a copy of the
        /// weights and optimizer state into host memory (still written atomically; at most one
        /// write in flight). Default: on CUDA and Gaudi, off on CPU, where training uses every
        /// core and a background write measured no faster. An epoch's checkpoint is always in
        /// place when its epoch ends.
        #[arg(value_name = "BOOL", num_args = 0..=1, default_missing_value = "true")]
        checkpoint_async: bool => Option<bool>,
        /// ZeRO stage: 0, every worker keeps the whole optimizer state; 1, each keeps 1/W of
        /// it; 2, each also keeps only 1/W of the gradients, reduced during the backward pass;
        /// 3, each also keeps only 1/W of the parameters, a layer gathered whole only while it
        /// computes (less memory per device, the same results; checkpoints load either way).
        #[arg(value_name = "0|1|2|3")]
        zero: u8 => u8,
        /// Activation checkpointing: keep only each checkpointed layer's input in the forward
        /// pass and recompute the layer in the backward pass (less memory for activations,
        /// about a third more compute; the same results).
        #[arg(value_name = "BOOL", num_args = 0..=1, default_missing_value = "true")]
        activation_checkpointing: bool => bool,
        /// With activation checkpointing: checkpoint every k-th transformer layer (1: every
        /// layer; larger: less recomputation, more memory).
        #[arg(value_name = "K")]
        checkpoint_layers_every: usize => usize,
        /// fp32, or bf16 autocast (CUDA and Gaudi; also runs on CPU, where it is rarely faster).
        #[arg(value_name = "fp32|bf16")]
        precision: Precision => Precision,
        /// Continue from a checkpoint directory (.../checkpoints/epoch-E): weights, optimizer
        /// state, step count and data order; needs the same batch, and mid-epoch a worker
        /// count that splits it evenly (any count at an epoch's end).
        #[arg(value_name = "CHECKPOINT")]
        resume_from: PathBuf [into] => Option<PathBuf>,
        /// Model to start from: a Hugging Face-style directory, a weights file or a Hub id (each
        /// recipe documents what it accepts).
        model: String [into] => Option<String>,
        /// Training data: a table (.parquet/.csv/.tsv/.jsonl), a directory with train*/test*
        /// tables or an ImageFolder, or a Hub dataset id (each recipe documents what it accepts).
        data: String [into] => Option<String>,
        /// Train on the first N rows only (the reference's `select(range(N))`; images: N spread
        /// over the classes).
        #[arg(value_name = "N")]
        train_rows: usize => Option<usize>,
        /// Evaluate on the first N held-out rows (0: no evaluation).
        #[arg(value_name = "N")]
        eval_rows: usize => Option<usize>,
        /// Record these optimizer steps with libtorch's profiler on every rank (e.g. 20..25):
        /// a Chrome trace per rank in the run directory's profile/ (Perfetto, TensorBoard) and
        /// a table of the operators with the most time.
        #[arg(value_name = "START..END")]
        profile: crate::profile::ProfileSteps [into] => Option<crate::profile::ProfileSteps>,
        /// Capture the training step (forward, backward and optimizer) in a CUDA graph after a
        /// few steps, then replay it: one launch a step instead of one per operator. For
        /// fixed-shape steps on one CUDA worker (bert-mlm with max_predictions_per_seq); a
        /// batch of another shape ends the run with an error.
        #[arg(value_name = "BOOL", num_args = 0..=1, default_missing_value = "true")]
        cuda_graphs: bool => bool,
    }
    extra {
        /// The recipe's own resolved options (text or image settings), by name.
        recipe_options: serde_json::Map<String, serde_json::Value>,
    }
}

impl Hyper {
    /// Preset defaults shared by every recipe: no accumulation, constant learning rate, fp32,
    /// momentum 0.9, dropout 0.1, seed 42, model and data left to the recipe.
    pub fn new(
        preset: &str,
        epochs: u64,
        global_batch_size: usize,
        lr: f64,
        optimizer: OptimizerKind,
    ) -> Self {
        Self {
            preset: preset.to_string(),
            epochs,
            max_steps: None,
            global_batch_size,
            lr,
            optimizer,
            momentum: 0.9,
            weight_decay: 0.0,
            dropout: 0.1,
            seed: 42,
            grad_clip: None,
            grad_accum: 1,
            schedule: Schedule::Constant,
            warmup_ratio: 0.0,
            constant_ratio: 0.0,
            poly_power: 1.0,
            checkpoint_every: None,
            checkpoint_every_minutes: None,
            keep_checkpoints: None,
            checkpoint_async: None,
            zero: 0,
            activation_checkpointing: false,
            checkpoint_layers_every: 1,
            precision: Precision::Fp32,
            resume_from: None,
            model: None,
            data: None,
            train_rows: None,
            eval_rows: None,
            profile: None,
            cuda_graphs: false,
            recipe_options: Default::default(),
        }
    }
}

impl Hyper {
    /// Samples per micro-batch on each of `world` workers; an error naming the fix when the
    /// global batch cannot give every worker and micro-batch a sample. The driver checks it
    /// before any worker starts, each worker again with its own numbers.
    pub fn local_batch(&self, world: usize) -> Result<usize> {
        let accum = self.grad_accum.max(1);
        if self.global_batch_size < world * accum {
            bail!(
                "global batch size {} is smaller than {world} workers x {accum} micro-batches: raise global_batch_size to at least {}, or use fewer workers or micro-batches",
                self.global_batch_size,
                world * accum
            );
        }
        Ok(self.global_batch_size / (world * accum))
    }
}

fn one() -> usize {
    1
}

fn yes() -> bool {
    true
}

/// Seconds without progress before a worker counts as hung, by default: well under the
/// collective timeout (300 s), well over any step of the recipes' presets.
pub const DEFAULT_HANG_TIMEOUT_SECS: u64 = 60;

fn default_hang_timeout() -> u64 {
    DEFAULT_HANG_TIMEOUT_SECS
}

/// What a job does with a run directory of the same name ([`Configure::name`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Resume {
    /// Start a new run; a named run that already has checkpoints is an error.
    #[default]
    Never,
    /// Continue the named run from its newest complete checkpoint, or start it when it has
    /// none: the same command serves the first start and every re-run (a Slurm requeue, a
    /// killed driver, a closed notebook). A finished run is not trained again.
    Auto,
}

impl std::str::FromStr for Resume {
    type Err = anyhow::Error;
    fn from_str(s: &str) -> Result<Self> {
        match s.to_ascii_lowercase().as_str() {
            "auto" => Ok(Self::Auto),
            "never" | "no" => Ok(Self::Never),
            o => bail!("unknown resume mode '{o}': use auto (continue the named run's newest checkpoint) or never"),
        }
    }
}

/// What a job runs: a recipe of the engine's registry (the default), a user's task, or one of
/// trainbook's own jobs. A field of the spec, so that no recipe name means something else.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum JobKind {
    /// The recipe `JobSpec::recipe` names.
    #[default]
    Recipe,
    /// A user's task (`Trainer::new(task)`), run from the user's own program or cell.
    Task,
    /// `trainbook check`: the collectives verified, nothing trained.
    Check,
    /// The allreduce benchmark (`benches/engine.rs`).
    BenchAllreduce,
}

impl JobKind {
    /// The name a job of this kind shows (its run directory's, its recipe's).
    pub fn name(self) -> &'static str {
        match self {
            JobKind::Recipe => "recipe",
            JobKind::Task => "task",
            JobKind::Check => "check",
            JobKind::BenchAllreduce => "bench-allreduce",
        }
    }
}

#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct JobSpec {
    pub recipe: String,
    /// What the job runs; a recipe unless one of the other kinds is asked for
    /// ([`JobSpec::of_kind`]).
    #[serde(default)]
    pub kind: JobKind,
    pub workers: usize,
    pub device: DeviceRequest,
    pub train: TrainOptions,
    /// The recipe's own options, by name (e.g. bert's `max_length`); the recipe reads them
    /// typed with [`JobSpec::recipe_options`].
    #[serde(default)]
    pub options: serde_json::Map<String, serde_json::Value>,
    /// Node 0's address: where the rendezvous store listens and, in a job of several nodes,
    /// where node 0's driver collects every rank's events.
    pub master_addr: String,
    /// Fixed rendezvous port; `None` picks a free one (one node) or 29500 (several nodes, which
    /// must agree on it beforehand).
    pub master_port: Option<u16>,
    /// Machines in the job; each runs one driver with `workers` workers (see [`Topology`]).
    /// In an elastic job, the most it runs on.
    #[serde(default = "one")]
    pub nodes: usize,
    /// An elastic job (`nodes(min..=max)`, `--nnodes MIN:MAX`): the fewest nodes it runs on.
    /// It starts once this many have joined, goes on without a lost node while this many are
    /// left, and grows at a checkpoint when a node joins. `None`: exactly `nodes`.
    #[serde(default)]
    pub min_nodes: Option<usize>,
    /// This machine's place among the nodes, 0 for the one that shows the dashboard.
    #[serde(default)]
    pub node_rank: usize,
    /// The address this node's workers bind their gloo connections to (default: the address
    /// of the host name, or loopback when the master is a loopback address).
    #[serde(default)]
    pub node_addr: Option<String>,
    /// Intra-op threads per worker; `None` shares the cores evenly (CPU).
    pub threads_per_worker: Option<usize>,
    /// The accelerators this node's workers use, by id, one per local worker (set for the
    /// workers as `CUDA_VISIBLE_DEVICES` or `HABANA_VISIBLE_MODULES`); `None`: the first
    /// `workers` devices. How a sweep gives concurrent trials disjoint devices.
    #[serde(default)]
    pub visible_devices: Option<Vec<usize>>,
    /// Parent of the run directory (default `$TRAINBOOK_RUNS` or `./trainbook_runs`).
    pub runs_root: Option<PathBuf>,
    pub collective_timeout_secs: u64,
    /// Extra environment for workers.
    pub env: Vec<(String, String)>,
    /// Restarts after a failure (a worker's death, a collective error, a hang): 0 (default)
    /// fails at once, -1 restarts without limit. Each restart resumes from the run's newest
    /// checkpoint.
    #[serde(default)]
    pub max_failures: i32,
    /// Seconds without progress after which a worker counts as hung (0: never); the job
    /// waits at least 5 times its slowest step so far (the first step, start-up included,
    /// until a step has been timed).
    #[serde(default = "default_hang_timeout")]
    pub hang_timeout_secs: u64,
    /// The run directory's name under the runs root (default `<recipe>-<time>-<random>`).
    #[serde(default)]
    pub run_name: Option<String>,
    /// Whether a job continues its named run's newest checkpoint.
    #[serde(default)]
    pub resume: Resume,
    /// Write TensorBoard event files into the run directory (default on).
    #[serde(default = "yes")]
    pub tensorboard: bool,
    /// An MLflow tracking server (`http(s)://host:port`) the run is logged to; `None`: the one
    /// `MLFLOW_TRACKING_URI` names, if any.
    #[serde(default)]
    pub mlflow: Option<String>,
    /// The memory of each worker's device, e.g. `32GiB` (first-generation Gaudi), `96GB`
    /// (Gaudi2): the memory plan checks the job against it instead of what this machine
    /// reports, to plan for a machine you are not on.
    #[serde(default)]
    pub device_memory: Option<String>,
    /// Check the memory plan before launch and refuse a job that would not fit (default on).
    #[serde(default = "yes")]
    pub memory_check: bool,
    #[serde(skip)]
    pub dedup: DedupOptions,
    /// How the job's live view shows it (see [`crate::run::View`]); the engine only carries it.
    #[serde(skip)]
    pub view: crate::view::ViewOptions,
}

/// An MLflow tracking URI trainbook can log to: an HTTP(S) tracking server (trainbook speaks
/// MLflow's REST API; a `file:` or database URI is read by MLflow's own Python client only).
pub fn check_mlflow_uri(uri: &str) -> Result<()> {
    let rest = uri
        .strip_prefix("http://")
        .or_else(|| uri.strip_prefix("https://"));
    match rest {
        Some(host) if !host.is_empty() && !host.starts_with('/') => Ok(()),
        _ => bail!(
            "MLflow tracking URI '{uri}' is not an HTTP tracking server: trainbook logs over \
             MLflow's REST API, so give the server's address, e.g. http://127.0.0.1:5000 (start \
             one with `mlflow server --host 127.0.0.1 --port 5000`)"
        ),
    }
}

/// How many nodes a job runs on: a number, or an elastic range (`2..=4`); see
/// [`Configure::nodes`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Nodes {
    pub min: usize,
    pub max: usize,
}

impl From<usize> for Nodes {
    fn from(n: usize) -> Nodes {
        Nodes { min: n, max: n }
    }
}

impl From<std::ops::RangeInclusive<usize>> for Nodes {
    fn from(r: std::ops::RangeInclusive<usize>) -> Nodes {
        Nodes {
            min: *r.start(),
            max: *r.end(),
        }
    }
}

/// The builder methods of how a job runs (workers, device, ports, logs): `JobSpec`,
/// `BertTrainer` and the other trainers share them through this trait (in the prelude). Their
/// training options come with [`ConfigureTraining`], which every `Configure` has.
pub trait Configure: Sized {
    fn job_spec(&mut self) -> &mut JobSpec;
    fn into_spec(self) -> JobSpec;
    /// The job this builder would run.
    fn spec(&self) -> &JobSpec;

    /// Number of worker processes (one per device).
    fn workers(mut self, n: usize) -> Self {
        self.job_spec().workers = n;
        self
    }
    /// `DeviceRequest::Auto` (default) picks HPU, then CUDA, then CPU.
    fn device(mut self, d: DeviceRequest) -> Self {
        self.job_spec().device = d;
        self
    }
    fn master_port(mut self, p: u16) -> Self {
        self.job_spec().master_port = Some(p);
        self
    }
    /// Node 0's address, which every node can reach (default 127.0.0.1: one machine).
    fn master_addr(mut self, a: impl Into<String>) -> Self {
        self.job_spec().master_addr = a.into();
        self
    }
    /// Machines in the job (default 1); each runs `workers` workers. Start node 0 (this one,
    /// showing the dashboard) and the others (`trainbook train ... --node-rank K`) with the
    /// same `nodes`, `master_addr` and `master_port`. A range (`2..=4`) makes the job
    /// elastic: it starts on the nodes that joined (at least 2), goes on without a lost node
    /// from its newest checkpoint, and grows at a checkpoint when a node joins (again).
    fn nodes(mut self, n: impl Into<Nodes>) -> Self {
        let Nodes { min, max } = n.into();
        let spec = self.job_spec();
        spec.nodes = max;
        spec.min_nodes = (min != max).then_some(min);
        self
    }
    /// This machine's place among the nodes (default 0).
    fn node_rank(mut self, r: usize) -> Self {
        self.job_spec().node_rank = r;
        self
    }
    /// The address this node's workers bind to for gloo (default: from the host name).
    fn node_addr(mut self, a: impl Into<String>) -> Self {
        self.job_spec().node_addr = Some(a.into());
        self
    }
    /// Nodes, node rank and master address as a launcher (Slurm, MPI, torchrun) set them; see
    /// [`Topology::from_env`].
    fn topology(mut self, t: &Topology) -> Self {
        let spec = self.job_spec();
        spec.nodes = t.nodes;
        spec.node_rank = t.node_rank;
        if let Some(a) = &t.master_addr {
            spec.master_addr = a.clone();
        }
        if let Some(p) = t.master_port {
            spec.master_port = Some(p);
        }
        self
    }
    /// Intra-op threads per worker (default: cores / workers on CPU).
    fn threads_per_worker(mut self, t: usize) -> Self {
        self.job_spec().threads_per_worker = Some(t);
        self
    }
    /// The accelerator ids this node's workers use, one per worker (CUDA or HPU; default the
    /// first `workers` devices). Ignored on CPU.
    fn visible_devices(mut self, ids: impl IntoIterator<Item = usize>) -> Self {
        self.job_spec().visible_devices = Some(ids.into_iter().collect());
        self
    }
    /// Parent of the run directory (default `$TRAINBOOK_RUNS` or `./trainbook_runs`).
    fn runs_root(mut self, p: impl Into<PathBuf>) -> Self {
        self.job_spec().runs_root = Some(p.into());
        self
    }
    /// How long a collective (or the rendezvous) may wait for peers before it fails.
    fn collective_timeout(mut self, t: Duration) -> Self {
        self.job_spec().collective_timeout_secs = t.as_secs().max(1);
        self
    }
    /// Restarts after a failure, each from the run's newest checkpoint (default 0: fail at
    /// once; -1: without limit). The same error at the same step twice in a row is not
    /// retried.
    fn max_failures(mut self, n: i32) -> Self {
        self.job_spec().max_failures = n;
        self
    }
    /// How long a worker may make no progress before it counts as hung (default 60 s;
    /// `Duration::ZERO` turns hang detection off).
    fn hang_timeout(mut self, t: Duration) -> Self {
        self.job_spec().hang_timeout_secs = t.as_secs();
        self
    }
    /// A stable name for the run directory (`<runs root>/<name>`), so that a re-run with
    /// [`Resume::Auto`] finds it.
    fn name(mut self, name: impl Into<String>) -> Self {
        self.job_spec().run_name = Some(name.into());
        self
    }
    /// [`Resume::Auto`]: continue the named run's newest checkpoint (needs [`Configure::name`]).
    fn resume(mut self, r: Resume) -> Self {
        self.job_spec().resume = r;
        self
    }
    /// Plan for devices with this much memory, e.g. `"32GiB"` (first-generation Gaudi) or
    /// `"96GB"` (Gaudi2), instead of what this machine reports (see `Train::plan`).
    fn device_memory(mut self, size: impl Into<String>) -> Self {
        self.job_spec().device_memory = Some(size.into());
        self
    }
    /// Check the memory plan before launch and refuse a job that would not fit (default on;
    /// the plan errs high, so turn it off to try a job the plan refuses).
    fn memory_check(mut self, on: bool) -> Self {
        self.job_spec().memory_check = on;
        self
    }
    /// Write TensorBoard event files into the run directory (default on): `tensorboard
    /// --logdir trainbook_runs` shows the run's metrics, its options and its restarts.
    fn tensorboard(mut self, on: bool) -> Self {
        self.job_spec().tensorboard = on;
        self
    }
    /// Log the run to an MLflow tracking server (`http://host:5000`, as `mlflow server`
    /// prints): its options as params, every metric with its step, tags, the final status and
    /// the last checkpoint as an artifact. Without this, `MLFLOW_TRACKING_URI` is used when
    /// set. A server that is down never fails or slows the training: what could not be
    /// logged is named in one warning at the end.
    fn mlflow(mut self, uri: impl Into<String>) -> Self {
        self.job_spec().mlflow = Some(uri.into());
        self
    }
    /// Merge identical log lines across workers (default on).
    fn dedup(mut self, enabled: bool) -> Self {
        self.job_spec().dedup.enabled = enabled;
        self
    }
    fn dedup_window(mut self, w: Duration) -> Self {
        self.job_spec().dedup.window = w;
        self
    }
    /// Extra environment variable for the workers.
    fn env(mut self, k: impl Into<String>, v: impl Into<String>) -> Self {
        self.job_spec().env.push((k.into(), v.into()));
        self
    }
}

impl<T: Configure> ConfigureTraining for T {
    fn train_options(&mut self, edit: impl FnOnce(&mut TrainOptions)) {
        edit(&mut self.job_spec().train)
    }
}

impl Configure for JobSpec {
    fn job_spec(&mut self) -> &mut JobSpec {
        self
    }
    fn into_spec(self) -> JobSpec {
        self
    }
    fn spec(&self) -> &JobSpec {
        self
    }
}

impl JobSpec {
    pub fn new(recipe: impl Into<String>) -> Self {
        Self {
            recipe: recipe.into(),
            kind: JobKind::Recipe,
            workers: 1,
            device: DeviceRequest::Auto,
            train: TrainOptions::default(),
            options: Default::default(),
            master_addr: "127.0.0.1".into(),
            master_port: None,
            nodes: 1,
            min_nodes: None,
            node_rank: 0,
            node_addr: None,
            threads_per_worker: None,
            visible_devices: None,
            runs_root: None,
            collective_timeout_secs: 300,
            env: Vec::new(),
            max_failures: 0,
            hang_timeout_secs: DEFAULT_HANG_TIMEOUT_SECS,
            run_name: None,
            resume: Resume::Never,
            tensorboard: true,
            mlflow: None,
            device_memory: None,
            memory_check: true,
            dedup: DedupOptions::default(),
            view: Default::default(),
        }
    }

    /// A job of one of trainbook's own kinds (a task, the check, the benchmark), named after it.
    pub fn of_kind(kind: JobKind) -> Self {
        Self {
            kind,
            ..Self::new(kind.name())
        }
    }

    /// This job's recipe options as the recipe's options type `T`. An option `T` does not have
    /// is an error that lists the ones it has.
    pub fn recipe_options<T>(&self) -> Result<T>
    where
        T: serde::de::DeserializeOwned + Serialize + Default,
    {
        self.check_option_names(crate::options::names::<T>())?;
        self.options_as()
    }

    /// This job's recipe options as two option types at once, for a recipe that takes both
    /// (bert-mlm: the text options and its own). An option neither has is an error that lists
    /// the ones they have.
    pub fn recipe_options_pair<A, B>(&self) -> Result<(A, B)>
    where
        A: serde::de::DeserializeOwned + Serialize + Default,
        B: serde::de::DeserializeOwned + Serialize + Default,
    {
        let mut known = crate::options::names::<A>();
        known.extend(crate::options::names::<B>());
        self.check_option_names(known)?;
        Ok((self.options_as()?, self.options_as()?))
    }

    fn check_option_names(&self, known: Vec<String>) -> Result<()> {
        if let Some(k) = self.options.keys().find(|k| !known.contains(k)) {
            bail!(
                "recipe {} has no option '{k}': its options are {}",
                self.recipe,
                known.join(", ")
            );
        }
        Ok(())
    }

    /// The options as `T`, ignoring the ones `T` does not have.
    fn options_as<T: serde::de::DeserializeOwned>(&self) -> Result<T> {
        serde_json::from_value(serde_json::Value::Object(self.options.clone()))
            .map_err(|e| anyhow::anyhow!("recipe {}: {e}", self.recipe))
    }

    /// Lets `edit` change the options of type `T` among this job's recipe options (unset ones
    /// are left out, so a job's options name only what was set).
    pub fn edit_recipe_options<T>(&mut self, edit: impl FnOnce(&mut T))
    where
        T: serde::de::DeserializeOwned + Serialize + Default,
    {
        let known = crate::options::names::<T>();
        let mine: serde_json::Map<_, _> = self
            .options
            .iter()
            .filter(|(k, _)| known.contains(k))
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        let mut value: T =
            serde_json::from_value(serde_json::Value::Object(mine)).unwrap_or_default();
        edit(&mut value);
        if let Ok(serde_json::Value::Object(m)) = serde_json::to_value(value) {
            for (k, v) in m {
                if v.is_null() {
                    self.options.remove(&k);
                } else {
                    self.options.insert(k, v);
                }
            }
        }
    }

    /// Workers over all nodes.
    pub fn world_size(&self) -> usize {
        self.workers * self.nodes.max(1)
    }

    /// Whether the job's size may change (`nodes(min..=max)` with min < max).
    pub fn is_elastic(&self) -> bool {
        self.min_nodes.is_some_and(|m| m < self.nodes)
    }

    /// The numbers of nodes the job may run on, fewest first: every count from the fewest
    /// (`min_nodes`) to `nodes` whose workers split `hyper`'s global batch evenly, so that a
    /// step trains the same samples at every size (one count for a job that is not elastic).
    pub fn node_counts(&self, hyper: Option<&Hyper>) -> Vec<usize> {
        let min = self.min_nodes.unwrap_or(self.nodes).min(self.nodes);
        (min..=self.nodes)
            .filter(|&n| {
                min == self.nodes
                    || hyper.is_none_or(|h| {
                        let split = n * self.workers * h.grad_accum.max(1);
                        h.global_batch_size >= split && h.global_batch_size % split == 0
                    })
            })
            .collect()
    }

    /// The global ranks of this node's workers.
    pub fn local_ranks(&self) -> std::ops::Range<usize> {
        let first = self.node_rank * self.workers;
        first..first + self.workers
    }

    /// Checks what can be checked without the recipes: worker count, batch split, ranges.
    /// The engine checks the recipe, its preset and a resume checkpoint as well before any
    /// process starts.
    pub fn check(&self) -> Result<()> {
        if self.workers == 0 {
            bail!("num_workers is 0: a job needs at least one worker (e.g. --workers 2)");
        }
        if self.nodes == 0 {
            bail!("nodes is 0: a job runs on at least one node (--nnodes 1 for this machine only)");
        }
        if let Some(min) = self.min_nodes {
            if min == 0 || min > self.nodes {
                bail!(
                    "nodes {min}:{} is not a range of nodes: give the fewest (at least 1) and then the most, e.g. --nnodes 2:4 (.nodes(2..=4))",
                    self.nodes
                );
            }
        }
        if self.node_rank >= self.nodes {
            bail!(
                "node rank {} is not below the number of nodes {}: number the nodes 0 to {} (node 0 hosts the rendezvous and shows the dashboard)",
                self.node_rank,
                self.nodes,
                self.nodes - 1
            );
        }
        if self.workers > 1024 {
            bail!(
                "num_workers is {}: more than 1024 workers on one machine is surely a typo",
                self.workers
            );
        }
        self.check_training()?;
        self.check_cuda_graphs()?;
        if self.collective_timeout_secs == 0 {
            bail!("collective timeout must be at least 1 s");
        }
        if let Some(uri) = &self.mlflow {
            check_mlflow_uri(uri)?;
        }
        if let Some(size) = &self.device_memory {
            crate::memory::parse_bytes(size)?;
        }
        if let Some(m) = self.train.checkpoint_every_minutes {
            if !(m.is_finite() && m > 0.0) {
                bail!("checkpoint_every_minutes is {m}: give the minutes between checkpoints (e.g. 30), more than 0");
            }
        }
        if self.max_failures < -1 {
            bail!(
                "max_failures is {}: use 0 (no restart), a number of restarts, or -1 (no limit)",
                self.max_failures
            );
        }
        if let Some(name) = &self.run_name {
            let bad = name.is_empty()
                || name.starts_with('.')
                || name.contains(['/', '\\'])
                || name.chars().any(char::is_control);
            if bad {
                bail!("run name {name:?} cannot be a directory name: use letters, digits, '-', '_' or '.', not starting with '.' and without '/'");
            }
        }
        if let Some(ids) = &self.visible_devices {
            if ids.len() != self.workers {
                bail!(
                    "visible devices {ids:?} name {} devices for {} workers: give one device id per worker",
                    ids.len(),
                    self.workers
                );
            }
            let distinct: std::collections::BTreeSet<_> = ids.iter().collect();
            if distinct.len() != ids.len() {
                bail!("visible devices {ids:?} repeat an id: each worker needs its own device");
            }
        }
        if self.resume == Resume::Auto && self.run_name.is_none() {
            bail!("resume auto needs a run name to find the run: add --name NAME (or .name(\"...\")), the same on every re-run");
        }
        Ok(())
    }

    /// The training options' ranges and the batch split (part of [`JobSpec::check`]).
    /// What a captured step cannot hold: another device, other workers' all-reduce, several
    /// micro-batches, a host-side norm, recomputation, sharded or layer-wise optimizers.
    fn check_cuda_graphs(&self) -> Result<()> {
        let t = &self.train;
        if t.cuda_graphs != Some(true) {
            return Ok(());
        }
        let refuse =
            |why: String| -> Result<()> { bail!("cuda_graphs: {why}; or leave cuda_graphs off") };
        if matches!(self.device, DeviceRequest::Cpu | DeviceRequest::Hpu) {
            return refuse(format!(
                "CUDA graphs run on CUDA, not on {:?}: use --device cuda",
                self.device
            ));
        }
        if self.world_size() > 1 {
            return refuse(format!("a graph holds one worker's step, and the gradient all-reduce of {} workers is not captured: use 1 worker", self.world_size()));
        }
        if t.grad_accum.is_some_and(|a| a > 1) {
            return refuse("a graph holds one forward and backward pass: use grad_accum 1 (a larger batch, if it fits)".into());
        }
        if t.grad_clip.is_some() {
            return refuse("gradient clipping reads the norm on the host, which a graph cannot: drop grad_clip".into());
        }
        if t.activation_checkpointing == Some(true) {
            return refuse("activation checkpointing's recomputation is not captured: drop activation_checkpointing".into());
        }
        if t.zero.is_some_and(|z| z > 0) {
            return refuse("ZeRO shards need several workers: use zero 0".into());
        }
        if let Some(o) = t
            .optimizer
            .filter(|o| !matches!(o, OptimizerKind::Adamw | OptimizerKind::Sgd))
        {
            return refuse(format!("{o} computes per-layer norms step by step; adamw and sgd are captured: use one of them"));
        }
        Ok(())
    }

    fn check_training(&self) -> Result<()> {
        let t = &self.train;
        let world = self.world_size();
        if let Some(b) = t.global_batch_size {
            if b < world {
                bail!("global batch size {b} is smaller than the {world} workers: each worker needs at least one sample per step");
            }
        }
        if let Some(lr) = t.lr {
            if !(lr.is_finite() && lr > 0.0) {
                bail!("learning rate {lr} must be a positive number");
            }
        }
        if let Some(p) = t.dropout {
            if !(0.0..1.0).contains(&p) {
                bail!("dropout {p} must be in [0, 1)");
            }
        }
        if t.grad_accum == Some(0) {
            bail!("grad_accum is 0: use 1 (no accumulation) or more micro-batches per step");
        }
        if let (Some(b), Some(a)) = (t.global_batch_size, t.grad_accum) {
            if b < world * a {
                bail!("global batch size {b} cannot be split into {a} micro-batches on each of {world} workers: use a global batch of at least {}", world * a);
            }
        }
        if let Some(w) = t.warmup_ratio {
            if !(0.0..1.0).contains(&w) {
                bail!("warmup_ratio {w} must be in [0, 1): it is the fraction of steps spent warming up");
            }
        }
        if let Some(c) = t.constant_ratio {
            if !(0.0..1.0).contains(&c) {
                bail!("constant_ratio {c} must be in [0, 1): it is the fraction of steps held at the peak learning rate");
            }
            if c + t.warmup_ratio.unwrap_or(0.0) >= 1.0 {
                bail!("warmup_ratio + constant_ratio is {}: together they must leave some steps for the decay (below 1)", c + t.warmup_ratio.unwrap_or(0.0));
            }
        }
        if let Some(p) = t.poly_power {
            if !(p.is_finite() && p > 0.0) {
                bail!("poly_power {p} must be positive (1 decays linearly, 0.5 as a square root)");
            }
        }
        if t.checkpoint_every == Some(0) {
            bail!("checkpoint_every is 0: give the number of optimizer steps between checkpoints (e.g. 200)");
        }
        if let Some(z) = t.zero.filter(|&z| z > 3) {
            bail!("ZeRO stage {z} is not available: use 3 (parameters, gradients and optimizer state sharded over the workers), 2 (gradients and optimizer state sharded), 1 (optimizer state sharded) or 0 (nothing sharded)");
        }
        if t.checkpoint_layers_every == Some(0) {
            bail!("checkpoint_layers_every is 0: give k to checkpoint every k-th layer (1: every layer)");
        }
        if t.keep_checkpoints == Some(0) {
            bail!("keep_checkpoints is 0: keep at least the last one (a resume needs it), or leave it unset to keep all");
        }
        if t.train_rows == Some(0) {
            bail!("train_rows is 0: nothing to train on");
        }
        if t.epochs == Some(0) {
            bail!("epochs is 0: train for at least one epoch (or use max_steps)");
        }
        Ok(())
    }
}
/// What a job would run with, resolved as `fit` resolves it, with nothing started.
#[derive(Clone, Debug)]
pub struct Plan {
    /// The device its workers would use (`DeviceRequest::Auto`: HPU, then CUDA, then CPU).
    pub device: crate::device::DeviceKind,
    /// Every hyper-parameter: the preset's (named, or chosen as the recipe chooses: e.g.
    /// bert's "reference" when its model and data are on this machine), with the job's options
    /// on top; the recipe's own settings in `recipe_options`.
    pub hyper: Hyper,
    /// What each device will hold at the job's peak, against its memory, with the levers that
    /// lower it (`None` for recipes that do not report their model's shapes).
    pub memory: Option<crate::memory::MemoryPlan>,
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Each setting a captured step cannot hold is refused up front, naming the way out.
    #[test]
    fn cuda_graphs_refuse_what_a_graph_cannot_hold() {
        let job = || {
            JobSpec::new("bert-mlm")
                .workers(1)
                .device(DeviceRequest::Cuda)
                .cuda_graphs(true)
        };
        assert!(job().check().is_ok());
        let refused = |s: JobSpec, want: &str| {
            let e = s.check().unwrap_err().to_string();
            assert!(
                e.contains(want) && e.contains("leave cuda_graphs off"),
                "{e}"
            );
        };
        refused(job().device(DeviceRequest::Cpu), "--device cuda");
        refused(job().workers(2), "use 1 worker");
        refused(job().grad_accum(2), "grad_accum 1");
        refused(job().grad_clip(1.0), "drop grad_clip");
        refused(
            job().activation_checkpointing(true),
            "activation_checkpointing",
        );
        refused(job().optimizer(OptimizerKind::Lamb), "adamw and sgd");
    }
}
