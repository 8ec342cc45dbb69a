//! What a training job is: recipe, workers, device and hyper-parameters. Serialised as the run
//! directory's `config.json`, which is also how workers receive it.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::{bail, Result};
use serde::{Deserialize, Serialize};

use crate::dedup::DedupConfig;
use crate::device::DeviceRequest;
pub use crate::optim::Schedule;
pub use crate::precision::Precision;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum OptimizerKind {
    #[default]
    Sgd,
    Adamw,
}

impl std::fmt::Display for OptimizerKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Self::Sgd => "sgd",
            Self::Adamw => "adamw",
        })
    }
}

impl std::str::FromStr for OptimizerKind {
    type Err = anyhow::Error;
    fn from_str(s: &str) -> Result<Self> {
        match s.to_ascii_lowercase().as_str() {
            "sgd" => Ok(Self::Sgd),
            "adamw" => Ok(Self::Adamw),
            o => bail!("unknown optimizer '{o}': use sgd or adamw"),
        }
    }
}

/// How a batch is padded.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum Padding {
    /// Every sequence to `max_length` (Transformers' `padding="max_length"`, the reference's).
    #[default]
    MaxLength,
    /// To the longest sequence of each batch (less work for short texts).
    Dynamic,
}

impl std::str::FromStr for Padding {
    type Err = anyhow::Error;
    fn from_str(s: &str) -> Result<Self> {
        match s.to_ascii_lowercase().replace('-', "_").as_str() {
            "max_length" | "max" => Ok(Self::MaxLength),
            "dynamic" | "longest" => Ok(Self::Dynamic),
            o => bail!("unknown padding '{o}': use max-length or dynamic"),
        }
    }
}

impl std::fmt::Display for Padding {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Self::MaxLength => "max-length",
            Self::Dynamic => "dynamic",
        })
    }
}

/// The network of an image-classification recipe.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Arch {
    Resnet18,
    Resnet34,
    Resnet50,
}

impl std::str::FromStr for Arch {
    type Err = anyhow::Error;
    fn from_str(s: &str) -> Result<Self> {
        match s.to_ascii_lowercase().replace(['-', '_'], "").as_str() {
            "resnet18" | "18" => Ok(Self::Resnet18),
            "resnet34" | "34" => Ok(Self::Resnet34),
            "resnet50" | "50" => Ok(Self::Resnet50),
            o => bail!("unknown architecture '{o}': use resnet18, resnet34 or resnet50"),
        }
    }
}

impl std::fmt::Display for Arch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Self::Resnet18 => "resnet18",
            Self::Resnet34 => "resnet34",
            Self::Resnet50 => "resnet50",
        })
    }
}

/// Hyper-parameters. `None` means "the recipe's preset decides".
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct TrainConfig {
    pub preset: Option<String>,
    pub epochs: Option<u64>,
    pub max_steps: Option<u64>,
    pub global_batch_size: Option<usize>,
    pub lr: Option<f64>,
    pub optimizer: Option<OptimizerKind>,
    pub momentum: Option<f64>,
    pub weight_decay: Option<f64>,
    pub dropout: Option<f64>,
    pub seed: Option<u64>,
    pub grad_clip: Option<f64>,
    /// Micro-batches whose gradients are summed before each optimizer step (the global batch
    /// is split over workers and then over these).
    pub grad_accum: Option<usize>,
    pub schedule: Option<Schedule>,
    /// Fraction of the optimizer steps spent warming the learning rate up from 0.
    pub warmup_ratio: Option<f64>,
    pub precision: Option<Precision>,
    /// A checkpoint directory (`.../checkpoints/epoch-E`) to continue from: weights, optimizer
    /// state, step count and data order.
    pub resume_from: Option<PathBuf>,
    /// Model to start from: a directory (or file) path; recipes document what they accept.
    pub model: Option<String>,
    /// Training data: a file or directory path; recipes document what they accept.
    pub data: Option<String>,
    /// Use only the first N training rows (text: after the split, like `select(range(N))`;
    /// images: N spread evenly over the classes).
    pub train_rows: Option<usize>,
    /// Use only the first N evaluation rows; 0 skips evaluation.
    pub eval_rows: Option<usize>,
    /// Options of text recipes (ignored by others).
    #[serde(default)]
    pub text: TextOptions,
    /// Options of image recipes (ignored by others).
    #[serde(default)]
    pub vision: VisionOptions,
}

/// How an image-classification recipe builds its model and input pipeline.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct VisionOptions {
    pub arch: Option<Arch>,
    /// Side of the square input in pixels (the reference's 224).
    pub image_size: Option<u32>,
    /// Threads per worker that decode and augment images ahead of the training loop.
    pub loader_threads: Option<usize>,
}

/// How a text-classification recipe reads and tokenises its table.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct TextOptions {
    /// Tokens per example after truncation.
    pub max_length: Option<usize>,
    pub padding: Option<Padding>,
    pub text_column: Option<String>,
    pub label_column: Option<String>,
    /// Fraction held out for evaluation when the data has no separate test split.
    pub eval_fraction: Option<f64>,
    /// A separate evaluation table (otherwise the data is split by `eval_fraction`).
    pub eval_data: Option<String>,
}

#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct JobSpec {
    pub recipe: String,
    pub workers: usize,
    pub device: DeviceRequest,
    pub train: TrainConfig,
    pub master_addr: String,
    /// Fixed rendezvous port; `None` picks a free one.
    pub master_port: Option<u16>,
    /// Intra-op threads per worker; `None` shares the cores evenly (CPU).
    pub threads_per_worker: Option<usize>,
    /// Parent of the run directory (default `$TRAINBOOK_RUNS` or `./trainbook_runs`).
    pub runs_root: Option<PathBuf>,
    pub collective_timeout_secs: u64,
    /// Extra environment for workers.
    pub env: Vec<(String, String)>,
    #[serde(skip)]
    pub dedup: DedupConfig,
    /// Options of the caller's own layers, such as how the facade's views show the job; the
    /// engine only carries them.
    #[serde(skip)]
    pub extensions: Extensions,
}

/// Typed values a caller attaches to a job spec (one per type), for options the engine carries
/// but does not read.
#[derive(Default)]
pub struct Extensions(std::collections::HashMap<std::any::TypeId, Box<dyn Extension>>);

trait Extension: std::any::Any + Send + Sync {
    fn clone_box(&self) -> Box<dyn Extension>;
    fn as_any(&self) -> &dyn std::any::Any;
    fn as_any_mut(&mut self) -> &mut dyn std::any::Any;
}

impl<T: std::any::Any + Clone + Send + Sync> Extension for T {
    fn clone_box(&self) -> Box<dyn Extension> {
        Box::new(self.clone())
    }
    fn as_any(&self) -> &dyn std::any::Any {
        self
    }
    fn as_any_mut(&mut self) -> &mut dyn std::any::Any {
        self
    }
}

impl Extensions {
    pub fn get<T: 'static>(&self) -> Option<&T> {
        self.0
            .get(&std::any::TypeId::of::<T>())
            .and_then(|v| (**v).as_any().downcast_ref())
    }

    /// The value of type `T`, inserted as `T::default()` when there is none.
    pub fn get_mut<T: Default + Clone + Send + Sync + 'static>(&mut self) -> &mut T {
        self.0
            .entry(std::any::TypeId::of::<T>())
            .or_insert_with(|| Box::new(T::default()))
            .as_any_mut()
            .downcast_mut()
            .expect("extensions are keyed by their type")
    }
}

impl Clone for Extensions {
    fn clone(&self) -> Self {
        Extensions(
            self.0
                .iter()
                .map(|(k, v)| (*k, (**v).clone_box()))
                .collect(),
        )
    }
}

impl std::fmt::Debug for Extensions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Extensions({})", self.0.len())
    }
}

/// The builder methods every job has: `JobSpec`, `BertTrainer` and other trainers share them
/// through this trait (in the prelude), so each option is spelled and documented once.
pub trait Configure: Sized {
    fn job_spec(&mut self) -> &mut JobSpec;
    fn into_spec(self) -> JobSpec;

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
    /// A recipe preset (e.g. "tiny"); each recipe documents its own.
    fn preset(mut self, p: impl Into<String>) -> Self {
        self.job_spec().train.preset = Some(p.into());
        self
    }
    fn epochs(mut self, e: u64) -> Self {
        self.job_spec().train.epochs = Some(e);
        self
    }
    /// Stop after this many optimizer steps (when fewer than the epochs would take).
    fn max_steps(mut self, s: u64) -> Self {
        self.job_spec().train.max_steps = Some(s);
        self
    }
    /// Samples per optimizer step over all workers and micro-batches.
    fn global_batch_size(mut self, b: usize) -> Self {
        self.job_spec().train.global_batch_size = Some(b);
        self
    }
    fn lr(mut self, lr: f64) -> Self {
        self.job_spec().train.lr = Some(lr);
        self
    }
    fn optimizer(mut self, o: OptimizerKind) -> Self {
        self.job_spec().train.optimizer = Some(o);
        self
    }
    fn momentum(mut self, m: f64) -> Self {
        self.job_spec().train.momentum = Some(m);
        self
    }
    fn weight_decay(mut self, w: f64) -> Self {
        self.job_spec().train.weight_decay = Some(w);
        self
    }
    fn dropout(mut self, p: f64) -> Self {
        self.job_spec().train.dropout = Some(p);
        self
    }
    fn seed(mut self, s: u64) -> Self {
        self.job_spec().train.seed = Some(s);
        self
    }
    /// Clip the global gradient norm to this value.
    fn grad_clip(mut self, c: f64) -> Self {
        self.job_spec().train.grad_clip = Some(c);
        self
    }
    /// Micro-batches per optimizer step (same global batch, less memory per step).
    fn grad_accum(mut self, n: usize) -> Self {
        self.job_spec().train.grad_accum = Some(n);
        self
    }
    fn schedule(mut self, s: Schedule) -> Self {
        self.job_spec().train.schedule = Some(s);
        self
    }
    /// Fraction of steps spent warming the learning rate up (e.g. 0.1).
    fn warmup_ratio(mut self, r: f64) -> Self {
        self.job_spec().train.warmup_ratio = Some(r);
        self
    }
    fn precision(mut self, p: Precision) -> Self {
        self.job_spec().train.precision = Some(p);
        self
    }
    /// Continue a run from one of its checkpoints (`.../checkpoints/epoch-E`).
    fn resume_from(mut self, dir: impl Into<PathBuf>) -> Self {
        self.job_spec().train.resume_from = Some(dir.into());
        self
    }
    /// The model to start from (a directory path or a Hugging Face id).
    fn model(mut self, m: impl Into<String>) -> Self {
        self.job_spec().train.model = Some(m.into());
        self
    }
    /// The training data (a file, a directory with train/test tables, or a dataset id).
    fn data(mut self, d: impl Into<String>) -> Self {
        self.job_spec().train.data = Some(d.into());
        self
    }
    /// Train on the first `n` rows only (the reference's `select(range(1000))`).
    fn train_rows(mut self, n: usize) -> Self {
        self.job_spec().train.train_rows = Some(n);
        self
    }
    /// Evaluate on the first `n` held-out rows; 0 skips evaluation.
    fn eval_rows(mut self, n: usize) -> Self {
        self.job_spec().train.eval_rows = Some(n);
        self
    }
    fn master_port(mut self, p: u16) -> Self {
        self.job_spec().master_port = Some(p);
        self
    }
    /// Intra-op threads per worker (default: cores / workers on CPU).
    fn threads_per_worker(mut self, t: usize) -> Self {
        self.job_spec().threads_per_worker = Some(t);
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

impl Configure for JobSpec {
    fn job_spec(&mut self) -> &mut JobSpec {
        self
    }
    fn into_spec(self) -> JobSpec {
        self
    }
}

impl JobSpec {
    pub fn new(recipe: impl Into<String>) -> Self {
        Self {
            recipe: recipe.into(),
            workers: 1,
            device: DeviceRequest::Auto,
            train: TrainConfig::default(),
            master_addr: "127.0.0.1".into(),
            master_port: None,
            threads_per_worker: None,
            runs_root: None,
            collective_timeout_secs: 300,
            env: Vec::new(),
            dedup: DedupConfig::default(),
            extensions: Extensions::default(),
        }
    }

    /// Checks what can be checked before any process starts, recipe and preset names against
    /// `recipes`.
    pub fn validate(&self, recipes: &crate::recipe::Registry) -> Result<()> {
        if self.workers == 0 {
            bail!("num_workers is 0: a job needs at least one worker (e.g. --workers 2)");
        }
        if self.workers > 1024 {
            bail!(
                "num_workers is {}: more than 1024 workers on one machine is surely a typo",
                self.workers
            );
        }
        recipes.check_name(&self.recipe)?;
        // Checked here too (workers check again) so a typo fails before any process starts.
        if let Some(p) = &self.train.preset {
            recipes.check_preset(&self.recipe, p)?;
        }
        let t = &self.train;
        if let Some(b) = t.global_batch_size {
            if b < self.workers {
                bail!("global batch size {b} is smaller than the {} workers: each worker needs at least one sample per step", self.workers);
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
            if b < self.workers * a {
                bail!("global batch size {b} cannot be split into {a} micro-batches on each of {} workers: use a global batch of at least {}", self.workers, self.workers * a);
            }
        }
        if let Some(w) = t.warmup_ratio {
            if !(0.0..1.0).contains(&w) {
                bail!("warmup_ratio {w} must be in [0, 1): it is the fraction of steps spent warming up");
            }
        }
        if let Some(f) = t.text.eval_fraction {
            if !(f > 0.0 && f < 1.0) {
                bail!("eval_fraction {f} must be between 0 and 1 (e.g. 0.2 holds out 20%)");
            }
        }
        if t.text.max_length == Some(0) || t.text.max_length.is_some_and(|m| m > 8192) {
            bail!(
                "max_length {} must be between 1 and 8192 tokens",
                t.text.max_length.unwrap_or(0)
            );
        }
        if t.train_rows == Some(0) {
            bail!("train_rows is 0: nothing to train on");
        }
        if let Some(r) = &t.resume_from {
            if !r.join("trainer_state.json").exists() {
                bail!("cannot resume from {}: it is not a trainbook checkpoint (no trainer_state.json); pass a directory like trainbook_runs/<run>/checkpoints/epoch-0", r.display());
            }
        }
        if t.epochs == Some(0) {
            bail!("epochs is 0: train for at least one epoch (or use max_steps)");
        }
        if self.collective_timeout_secs == 0 {
            bail!("collective timeout must be at least 1 s");
        }
        Ok(())
    }
}
