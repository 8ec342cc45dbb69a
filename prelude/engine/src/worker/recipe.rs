//! What the engine needs from a recipe: the [`Recipe`] trait a worker trains, the resolved
//! hyper-parameters ([`Hyper`]), and the [`Registry`] type through which callers inject their
//! recipes. The engine knows no concrete recipe: `trainbook-worker` and the `trainbook` facade
//! pass the registry of `trainbook-recipes` (as burn-train is handed its renderer).

use std::path::Path;

use anyhow::{bail, Result};
use tch::{nn, Tensor};

pub use crate::device::Device;
pub use crate::spec::Hyper;
use crate::spec::JobSpec;

/// The job name of `trainbook check`: workers verify the collectives instead of training.
pub const CHECK: &str = "check";
/// The job name of the allreduce benchmark (see `benches/engine.rs`).
pub const BENCH_ALLREDUCE: &str = "bench-allreduce";

/// A recipe's hyper-parameters for a job: its chosen preset's values, with the recipe's own
/// options resolved into [`Hyper::recipe_options`]. The shared options go on top afterwards
/// (`Hyper::with_overrides`, at launch). Runs in the launching process before any worker
/// starts, so it reads no model and no data: a bad option fails in milliseconds.
pub type PresetFn = fn(&JobSpec) -> Result<Hyper>;

/// Builds a recipe on a device from the job's resolved hyper-parameters. Model initialisation
/// is seeded, so every rank builds the same model (rank 0's parameters are broadcast anyway).
/// `log` sends a line to the job's log.
pub type BuildFn = fn(&Hyper, Device, &dyn Fn(String)) -> Result<Box<dyn Recipe>>;

/// One recipe: everything the CLI, validation and the workers need to know of it, in one row.
pub struct RecipeEntry {
    pub name: &'static str,
    pub description: &'static str,
    /// Presets (name, description); the first is the default unless the recipe decides.
    pub presets: &'static [(&'static str, &'static str)],
    pub preset: PresetFn,
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
    /// [`BENCH_ALLREDUCE`], a user's [`TASK`](crate::task::TASK)).
    pub fn check_name(&self, name: &str) -> Result<()> {
        if name == CHECK
            || name == BENCH_ALLREDUCE
            || name == crate::task::TASK
            || self.get(name).is_some()
        {
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

    /// The job's hyper-parameters, fully resolved: the recipe's preset (see [`PresetFn`])
    /// with the job's shared options on top. `None` for the engine's own jobs, which train
    /// nothing.
    pub fn resolve(&self, spec: &JobSpec) -> Result<Option<Hyper>> {
        self.check_name(&spec.recipe)?;
        if spec.recipe == crate::task::TASK {
            return Ok(Some(crate::task::preset(spec)?.with_overrides(&spec.train)));
        }
        match self.get(&spec.recipe) {
            Some(e) => Ok(Some((e.preset)(spec)?.with_overrides(&spec.train))),
            None => Ok(None),
        }
    }

    /// Builds the named recipe (see [`BuildFn`]).
    pub fn build(
        &self,
        name: &str,
        hyper: &Hyper,
        device: Device,
        log: &dyn Fn(String),
    ) -> Result<Box<dyn Recipe>> {
        match self.get(name) {
            Some(e) => (e.build)(hyper, device, log),
            None => bail!("'{name}' is not a training recipe"),
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Split {
    Train,
    Eval,
}

/// What one forward pass over a batch gives the training loop.
pub struct Step {
    /// The batch's mean loss: what is differentiated, and the `loss` metric.
    pub loss: Tensor,
    /// Class scores `[batch, classes]` and true labels `[batch]`, for tasks that classify: the
    /// engine counts accuracy and F1 from them, summed over ranks before any ratio is taken.
    pub predictions: Option<(Tensor, Tensor)>,
    /// Named scalars for this batch (e.g. a perplexity): each becomes a metric of the step
    /// (averaged over micro-batches) and, averaged over the epoch and the ranks, of the epoch.
    pub metrics: Vec<(String, f64)>,
}

impl Step {
    /// A step that reports only its loss.
    pub fn loss(loss: Tensor) -> Self {
        Step {
            loss,
            predictions: None,
            metrics: Vec::new(),
        }
    }

    /// Classification: cross-entropy of `logits` against `labels`, with accuracy and F1 counted.
    pub fn classification(logits: Tensor, labels: Tensor) -> Self {
        Step::loss(logits.cross_entropy_for_logits(&labels)).with_predictions(logits, labels)
    }

    /// Adds class scores and labels, from which accuracy and F1 are counted.
    pub fn with_predictions(mut self, logits: Tensor, labels: Tensor) -> Self {
        self.predictions = Some((logits, labels));
        self
    }

    /// Adds a named scalar (shown in the live view and the metrics table).
    pub fn metric(mut self, name: impl Into<String>, value: f64) -> Self {
        self.metrics.push((name.into(), value));
        self
    }
}

/// What the training loop needs from a recipe.
pub trait Recipe {
    fn vars(&self) -> &nn::VarStore;
    fn vars_mut(&mut self) -> &mut nn::VarStore;
    fn train_len(&self) -> usize;
    fn eval_len(&self) -> usize;
    /// The loss (and predictions, metrics) for the given samples of a split; `train` is false
    /// in evaluation, which runs without gradients.
    fn step(&self, split: Split, indices: &[usize], train: bool) -> Result<Step>;
    /// Called before each pass over a split with the exact batches `forward` will be asked for,
    /// in order, so the recipe can prepare them in the background (the image pipeline).
    fn plan(&self, _split: Split, _epoch: u64, _batches: &[&[usize]]) {}
    /// True when the loss is a mean cross-entropy over tokens (a language model): the engine
    /// then also reports `perplexity`, exp(loss), per step and per epoch.
    fn perplexity(&self) -> bool {
        false
    }
    /// Writes a loadable checkpoint into `dir` (an empty directory).
    fn save(&self, dir: &Path) -> Result<()> {
        self.vars().save(dir.join(crate::checkpoint::MODEL))?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn none(_: &Hyper, _: Device, _: &dyn Fn(String)) -> Result<Box<dyn Recipe>> {
        bail!("not built in this test")
    }

    fn small(spec: &JobSpec) -> Result<Hyper> {
        let name = spec.train.preset.as_deref().unwrap_or("small");
        Ok(Hyper::new(name, 3, 8, 0.1, crate::spec::OptimizerKind::Sgd))
    }

    static ENTRIES: &[RecipeEntry] = &[RecipeEntry {
        name: "toy",
        description: "a recipe of this test",
        presets: &[("small", "a preset"), ("big", "another")],
        preset: small,
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

    #[test]
    fn resolving_puts_the_jobs_options_over_the_preset() {
        use crate::spec::ConfigureTraining;
        let r = Registry::new(ENTRIES);
        let h = r
            .resolve(&JobSpec::new("toy").lr(0.5).max_steps(7))
            .unwrap()
            .unwrap();
        assert_eq!((h.preset.as_str(), h.epochs, h.lr), ("small", 3, 0.5));
        assert_eq!(h.max_steps, Some(7));
        assert!(r.resolve(&JobSpec::new(CHECK)).unwrap().is_none());
        assert!(r.resolve(&JobSpec::new("tpy")).is_err());
    }
}
