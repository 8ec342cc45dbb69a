//! Recipes: what a worker trains (model, data, defaults). The engine knows them only through
//! the [`Recipe`] trait and this registry.

pub mod bert;
pub mod resnet;
pub mod synthetic;

use std::path::Path;

use anyhow::{bail, Result};
use tch::{nn, Tensor};

use crate::optim::Schedule;
use crate::precision::Precision;
use crate::spec::{OptimizerKind, TrainConfig};

/// Names accepted by `trainbook train <recipe>` and [`crate::spec::JobSpec::new`].
pub const RECIPES: &[(&str, &str)] = &[
    ("bert", "BERT sequence classification (offline default: all-MiniLM-L6-v2 on Rotten Tomatoes snippets)"),
    ("resnet", "ResNet image classification on an ImageFolder (offline default: ResNet-18 on MNIST digits)"),
    ("synthetic", "tiny BERT classifying generated token sequences (engine self-test)"),
];

/// The job name of `trainbook check`: workers verify the collectives instead of training.
pub const CHECK: &str = "check";
/// The job name of the allreduce benchmark (see `benches/engine.rs`).
pub const BENCH_ALLREDUCE: &str = "bench-allreduce";

/// The presets a recipe offers (name, description); empty for recipes without any.
pub fn presets(recipe: &str) -> &'static [(&'static str, &'static str)] {
    match recipe {
        "bert" => bert::PRESETS,
        "resnet" => resnet::PRESETS,
        _ => &[],
    }
}

pub fn check_name(name: &str) -> Result<()> {
    if name == CHECK || name == BENCH_ALLREDUCE || RECIPES.iter().any(|(n, _)| *n == name) {
        return Ok(());
    }
    let known: Vec<&str> = RECIPES.iter().map(|(n, _)| *n).collect();
    bail!(
        "unknown recipe '{name}': available recipes are {}",
        known.join(", ")
    )
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Split {
    Train,
    Eval,
}

/// Fully resolved hyper-parameters (preset defaults overridden by the job's config).
#[derive(Clone, Debug, serde::Serialize)]
pub struct Hyper {
    pub preset: String,
    pub epochs: u64,
    pub max_steps: Option<u64>,
    pub global_batch_size: usize,
    pub lr: f64,
    pub optimizer: OptimizerKind,
    pub momentum: f64,
    pub weight_decay: f64,
    pub dropout: f64,
    pub seed: u64,
    pub grad_clip: Option<f64>,
    pub grad_accum: usize,
    pub schedule: Schedule,
    pub warmup_ratio: f64,
    pub precision: Precision,
    pub resume_from: Option<std::path::PathBuf>,
}

impl Hyper {
    /// Preset defaults shared by every recipe: no accumulation, constant learning rate, fp32.
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
            precision: Precision::Fp32,
            resume_from: None,
        }
    }

    /// Applies the user's overrides on top of preset defaults.
    pub fn with_overrides(mut self, c: &TrainConfig) -> Self {
        if let Some(v) = c.epochs {
            self.epochs = v;
        }
        if c.max_steps.is_some() {
            self.max_steps = c.max_steps;
        }
        if let Some(v) = c.global_batch_size {
            self.global_batch_size = v;
        }
        if let Some(v) = c.lr {
            self.lr = v;
        }
        if let Some(v) = c.optimizer {
            self.optimizer = v;
        }
        if let Some(v) = c.momentum {
            self.momentum = v;
        }
        if let Some(v) = c.weight_decay {
            self.weight_decay = v;
        }
        if let Some(v) = c.dropout {
            self.dropout = v;
        }
        if let Some(v) = c.seed {
            self.seed = v;
        }
        if c.grad_clip.is_some() {
            self.grad_clip = c.grad_clip;
        }
        if let Some(v) = c.grad_accum {
            self.grad_accum = v;
        }
        if let Some(v) = c.schedule {
            self.schedule = v;
        }
        if let Some(v) = c.warmup_ratio {
            self.warmup_ratio = v;
        }
        if let Some(v) = c.precision {
            self.precision = v;
        }
        if c.resume_from.is_some() {
            self.resume_from = c.resume_from.clone();
        }
        self
    }
}

/// What the training loop needs from a recipe.
pub trait Recipe {
    fn vars(&self) -> &nn::VarStore;
    fn vars_mut(&mut self) -> &mut nn::VarStore;
    fn train_len(&self) -> usize;
    fn eval_len(&self) -> usize;
    /// Logits and labels for the given samples of a split.
    fn forward(&self, split: Split, indices: &[usize], train: bool) -> Result<(Tensor, Tensor)>;
    /// Called before each pass over a split with the exact batches `forward` will be asked for,
    /// in order, so the recipe can prepare them in the background (the image pipeline).
    fn plan(&self, _split: Split, _epoch: u64, _batches: &[&[usize]]) {}
    /// Writes a loadable checkpoint into `dir` (an empty directory).
    fn save(&self, dir: &Path) -> Result<()> {
        self.vars().save(dir.join("model.safetensors"))?;
        Ok(())
    }
}

/// Builds a recipe on `device`. Model initialisation is seeded, so every rank builds the same
/// model (rank 0's parameters are broadcast anyway).
pub fn build(
    name: &str,
    config: &TrainConfig,
    device: tch::Device,
    log: &dyn Fn(String),
) -> Result<(Box<dyn Recipe>, Hyper)> {
    match name {
        "bert" => {
            let (r, h) = bert::BertRecipe::build(config, device, log)?;
            Ok((Box::new(r), h))
        }
        "resnet" => {
            let (r, h) = resnet::ResnetRecipe::build(config, device, log)?;
            Ok((Box::new(r), h))
        }
        "synthetic" => {
            let (r, h) = synthetic::Synthetic::build(config, device)?;
            Ok((Box::new(r), h))
        }
        other => {
            check_name(other)?;
            bail!("'{other}' is not a training recipe")
        }
    }
}
