//! What the engine needs from a recipe: the [`Recipe`] trait a worker trains, the resolved
//! hyper-parameters ([`Hyper`]), and the [`Registry`] type through which callers inject their
//! recipes. The engine knows no concrete recipe: `trainbook-worker` and the `trainbook` facade
//! pass the registry of `trainbook-recipes` (as burn-train is handed its renderer).

use std::path::Path;

use anyhow::{bail, Result};
use tch::{nn, Tensor};

use crate::optim::Schedule;
use crate::precision::Precision;
use crate::spec::{OptimizerKind, TrainConfig};

/// The job name of `trainbook check`: workers verify the collectives instead of training.
pub const CHECK: &str = "check";
/// The job name of the allreduce benchmark (see `benches/engine.rs`).
pub const BENCH_ALLREDUCE: &str = "bench-allreduce";

/// Builds a recipe on a device from the job's config: the recipe and its resolved
/// hyper-parameters. Model initialisation is seeded, so every rank builds the same model
/// (rank 0's parameters are broadcast anyway). `log` sends a line to the job's log.
pub type BuildFn =
    fn(&TrainConfig, tch::Device, &dyn Fn(String)) -> Result<(Box<dyn Recipe>, Hyper)>;

/// One recipe: everything the CLI, validation and the workers need to know of it, in one row.
pub struct RecipeEntry {
    pub name: &'static str,
    pub description: &'static str,
    /// Presets (name, description); the first is the default unless the recipe decides.
    pub presets: &'static [(&'static str, &'static str)],
    pub build: BuildFn,
}

/// The recipes a process knows.
pub struct Registry {
    entries: &'static [RecipeEntry],
}

impl Registry {
    pub const fn new(entries: &'static [RecipeEntry]) -> Self {
        Registry { entries }
    }

    pub fn entries(&self) -> &'static [RecipeEntry] {
        self.entries
    }

    pub fn get(&self, name: &str) -> Option<&'static RecipeEntry> {
        self.entries.iter().find(|e| e.name == name)
    }

    /// Ok for a recipe of this registry or one of the engine's own jobs ([`CHECK`],
    /// [`BENCH_ALLREDUCE`]).
    pub fn check_name(&self, name: &str) -> Result<()> {
        if name == CHECK || name == BENCH_ALLREDUCE || self.get(name).is_some() {
            return Ok(());
        }
        let known: Vec<&str> = self.entries.iter().map(|e| e.name).collect();
        bail!(
            "unknown recipe '{name}': available recipes are {}",
            known.join(", ")
        )
    }

    /// Ok when the recipe has no presets or `preset` is one of them.
    pub fn check_preset(&self, recipe: &str, preset: &str) -> Result<()> {
        let presets = self.get(recipe).map(|e| e.presets).unwrap_or(&[]);
        if !presets.is_empty() && !presets.iter().any(|(n, _)| *n == preset) {
            let names: Vec<&str> = presets.iter().map(|(n, _)| *n).collect();
            bail!(
                "unknown preset '{preset}' for recipe {recipe}: use {}",
                names.join(", ")
            );
        }
        Ok(())
    }

    /// Builds the named recipe (see [`BuildFn`]).
    pub fn build(
        &self,
        name: &str,
        config: &TrainConfig,
        device: tch::Device,
        log: &dyn Fn(String),
    ) -> Result<(Box<dyn Recipe>, Hyper)> {
        self.check_name(name)?;
        match self.get(name) {
            Some(e) => (e.build)(config, device, log),
            None => bail!("'{name}' is not a training recipe"),
        }
    }
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

#[cfg(test)]
mod tests {
    use super::*;

    fn none(
        _: &TrainConfig,
        _: tch::Device,
        _: &dyn Fn(String),
    ) -> Result<(Box<dyn Recipe>, Hyper)> {
        bail!("not built in this test")
    }

    static ENTRIES: &[RecipeEntry] = &[RecipeEntry {
        name: "toy",
        description: "a recipe of this test",
        presets: &[("small", "a preset"), ("big", "another")],
        build: none,
    }];

    #[test]
    fn names_and_presets_are_checked_against_the_injected_table() {
        let r = Registry::new(ENTRIES);
        assert!(r.check_name("toy").is_ok());
        assert!(r.check_name(CHECK).is_ok());
        let e = r.check_name("tpy").unwrap_err().to_string();
        assert!(
            e.contains("unknown recipe 'tpy'") && e.contains("toy"),
            "{e}"
        );
        assert!(r.check_preset("toy", "big").is_ok());
        let e = r.check_preset("toy", "huge").unwrap_err().to_string();
        assert_eq!(e, "unknown preset 'huge' for recipe toy: use small, big");
        // The engine's own jobs have no presets.
        assert!(r.check_preset(CHECK, "anything").is_ok());
    }
}
