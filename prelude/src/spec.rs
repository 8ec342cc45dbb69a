//! What a training job is: recipe, workers, device and hyper-parameters. Serialised as the run
//! directory's `config.json`, which is also how workers receive it.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::{bail, Result};
use serde::{Deserialize, Serialize};

use crate::dedup::DedupConfig;
use crate::device::DeviceRequest;

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
        }
    }

    pub fn workers(mut self, n: usize) -> Self {
        self.workers = n;
        self
    }
    pub fn device(mut self, d: DeviceRequest) -> Self {
        self.device = d;
        self
    }
    pub fn preset(mut self, p: impl Into<String>) -> Self {
        self.train.preset = Some(p.into());
        self
    }
    pub fn epochs(mut self, e: u64) -> Self {
        self.train.epochs = Some(e);
        self
    }
    pub fn max_steps(mut self, s: u64) -> Self {
        self.train.max_steps = Some(s);
        self
    }
    pub fn global_batch_size(mut self, b: usize) -> Self {
        self.train.global_batch_size = Some(b);
        self
    }
    pub fn lr(mut self, lr: f64) -> Self {
        self.train.lr = Some(lr);
        self
    }
    pub fn optimizer(mut self, o: OptimizerKind) -> Self {
        self.train.optimizer = Some(o);
        self
    }
    pub fn dropout(mut self, p: f64) -> Self {
        self.train.dropout = Some(p);
        self
    }
    pub fn seed(mut self, s: u64) -> Self {
        self.train.seed = Some(s);
        self
    }
    pub fn master_port(mut self, p: u16) -> Self {
        self.master_port = Some(p);
        self
    }
    pub fn threads_per_worker(mut self, t: usize) -> Self {
        self.threads_per_worker = Some(t);
        self
    }
    pub fn runs_root(mut self, p: impl Into<PathBuf>) -> Self {
        self.runs_root = Some(p.into());
        self
    }
    /// How long a collective (or the rendezvous) may wait for peers before it fails.
    pub fn collective_timeout(mut self, t: Duration) -> Self {
        self.collective_timeout_secs = t.as_secs().max(1);
        self
    }
    pub fn dedup(mut self, enabled: bool) -> Self {
        self.dedup.enabled = enabled;
        self
    }
    pub fn dedup_window(mut self, w: Duration) -> Self {
        self.dedup.window = w;
        self
    }
    pub fn env(mut self, k: impl Into<String>, v: impl Into<String>) -> Self {
        self.env.push((k.into(), v.into()));
        self
    }

    /// Checks what can be checked before any process starts.
    pub fn validate(&self) -> Result<()> {
        if self.workers == 0 {
            bail!("num_workers is 0: a job needs at least one worker (e.g. --workers 2)");
        }
        if self.workers > 1024 {
            bail!(
                "num_workers is {}: more than 1024 workers on one machine is surely a typo",
                self.workers
            );
        }
        crate::recipes::check_name(&self.recipe)?;
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
        if t.epochs == Some(0) {
            bail!("epochs is 0: train for at least one epoch (or use max_steps)");
        }
        if self.collective_timeout_secs == 0 {
            bail!("collective timeout must be at least 1 s");
        }
        Ok(())
    }
}
