//! What the engine needs from a recipe: the [`Recipe`] trait a worker trains, the resolved
//! hyper-parameters ([`Hyper`]), and the [`Registry`] type through which callers inject their
//! recipes. The engine knows no concrete recipe: `trainbook-worker` and the `trainbook` facade
//! pass the registry of `trainbook-recipes` (as burn-train is handed its renderer).

use std::path::Path;

use anyhow::{bail, Result};
use tch::{nn, Tensor};

pub(crate) use crate::worker::device::Device;
use trainbook_api::DeviceKind;
use trainbook_api::Footprint;
pub(crate) use trainbook_api::Hyper;
use trainbook_api::JobSpec;

/// A recipe's hyper-parameters for a job: its chosen preset's values, with the recipe's own
/// options resolved into [`Hyper::recipe_options`]. The shared options go on top afterwards
/// (`Hyper::with_overrides`, at launch). Runs in the launching process before any worker
/// starts, so it reads no model and no data: a bad option fails in milliseconds.
pub type PresetFn = fn(&JobSpec) -> Result<Hyper>;

/// Builds a recipe on a device from the job's resolved hyper-parameters. Model initialisation
/// is seeded, so every rank builds the same model (rank 0's parameters are broadcast anyway).
/// `log` sends a line to the job's log.
pub type BuildFn = fn(&Hyper, Device, &dyn Fn(String)) -> Result<Box<dyn Recipe>>;

/// What a job's model will need in memory, from the job's resolved hyper-parameters and how
/// it is laid out on the devices, without building anything (see the memory plan).
pub type FootprintFn = fn(&Hyper, &Layout) -> Result<Footprint>;

/// How a job runs on each device, as a [`FootprintFn`] needs to know it.
#[derive(Clone, Copy, Debug)]
pub struct Layout {
    /// Samples per forward pass on one device.
    pub batch_per_device: usize,
    pub device: DeviceKind,
}

/// One recipe: everything the CLI, validation and the workers need to know of it, in one row.
pub struct RecipeEntry {
    pub name: &'static str,
    pub description: &'static str,
    /// Presets (name, description); the first is the default unless the recipe decides.
    pub presets: &'static [(&'static str, &'static str)],
    pub preset: PresetFn,
    pub build: BuildFn,
    /// The model's memory, for the plan checked before launch (`None`: not planned).
    pub footprint: Option<FootprintFn>,
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
    /// The same, still on the device (0-dimensional tensors): read once per step, after the
    /// update is queued, so computing them makes the host wait for nothing.
    pub device_metrics: Vec<(String, Tensor)>,
    /// Evaluation metrics that are ratios over the whole split (entity F1, exact match):
    /// (name, numerator, denominator), both summed over the epoch's batches and the ranks
    /// before dividing, so the value is what one pass over the whole split gives.
    pub ratios: Vec<(String, f64, f64)>,
}

impl Step {
    /// A step that reports only its loss.
    pub fn loss(loss: Tensor) -> Self {
        Step {
            loss,
            predictions: None,
            metrics: Vec::new(),
            device_metrics: Vec::new(),
            ratios: Vec::new(),
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

    /// Adds a named scalar that is still a 0-dimensional tensor on the device: prefer it to
    /// [`Step::metric`] on accelerators (no `.item()` in the step).
    pub fn metric_tensor(mut self, name: impl Into<String>, value: &Tensor) -> Self {
        self.device_metrics.push((name.into(), value.detach()));
        self
    }

    /// Adds an evaluation metric that is a ratio over the whole split (see [`Step::ratios`]).
    pub fn ratio(mut self, name: impl Into<String>, numerator: f64, denominator: f64) -> Self {
        self.ratios.push((name.into(), numerator, denominator));
        self
    }

    /// Every metric as a number (reads the device's: the host waits for them).
    pub fn all_metrics(&self) -> Vec<(String, f64)> {
        let mut all = self.metrics.clone();
        all.extend(
            self.device_metrics
                .iter()
                .map(|(n, t)| (n.clone(), t.double_value(&[]))),
        );
        all
    }
}

/// A step whose host part (making the batch) and device part (the computation) are apart: a
/// CUDA graph captures the device part once on fixed input tensors, and each later step only
/// copies the next batch into them.
pub trait StagedStep {
    /// The batch of `indices` as host tensors, page-locked where that helps: for a given job
    /// always as many, with the same shapes and dtypes (or the run ends with an error).
    fn inputs(&self, split: Split, indices: &[usize]) -> Result<Vec<Tensor>>;
    /// The step's computation on `inputs`, already on the device, in the order `inputs` gave.
    fn compute(&self, inputs: &[Tensor], train: bool) -> Result<Step>;
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
    fn prefetch(&self, _split: Split, _epoch: u64, _batches: &[&[usize]]) {}
    /// Samples per evaluation batch for a training micro-batch of `local_batch`: at least 32
    /// by default (an evaluation pass keeps no activations for a backward pass, so it can take
    /// more at once). A recipe whose forward pass holds outputs as large as its training's (a
    /// language model's logits over the vocabulary) evaluates in its training batches.
    fn eval_batch(&self, local_batch: usize) -> usize {
        local_batch.max(32)
    }
    /// True when the loss is a mean cross-entropy over tokens (a language model): the engine
    /// then also reports `perplexity`, exp(loss), per step and per epoch.
    fn perplexity(&self) -> bool {
        false
    }
    /// The training step in two parts, for CUDA graphs (`cuda_graphs`): `None` (the default)
    /// where a recipe cannot keep its batches' shapes fixed.
    fn staged(&self) -> Option<&dyn StagedStep> {
        None
    }
    /// Whether the variables that are not trained change in training (batch-norm statistics):
    /// then rank 0's are broadcast before each evaluation. `false` for a frozen model (LoRA's
    /// base), which is the same on every rank from the start on and may be large.
    fn buffers_change(&self) -> bool {
        true
    }
    /// The weights a checkpoint holds, by the names its loader expects: the variable store's,
    /// sorted.
    fn weights(&self) -> Vec<(String, Tensor)> {
        let mut named: Vec<(String, Tensor)> = self.vars().variables().into_iter().collect();
        named.sort_by(|a, b| a.0.cmp(&b.0));
        named
    }
    /// The checkpoint's other files (the model's config, the tokenizer), written into `dir`
    /// beside the weights. Small: they are written on the step's path even when the weights
    /// are written in the background. Under ZeRO-3 the parameters are sharded while this runs,
    /// so it reads none of them; the exception is a checkpoint of only the trained parameters
    /// of a partly frozen model (LoRA's adapters), which are gathered for it.
    fn save_files(&self, _dir: &Path) -> Result<()> {
        Ok(())
    }
    /// Writes a loadable checkpoint into `dir` (an empty directory): the weights as
    /// `model.safetensors`, and the other files.
    fn save(&self, dir: &Path) -> Result<()> {
        crate::shared::checkpoint::write_tensors(
            &self.weights(),
            &dir.join(crate::shared::checkpoint::MODEL),
        )?;
        self.save_files(dir)
    }
}
