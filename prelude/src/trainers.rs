//! The notebook-facing API: one function per recipe with the reference's defaults
//! (`train_bert(2)`), and a builder per recipe for everything else.

use std::path::PathBuf;

use anyhow::Result;

use crate::job::TrainResult;
use crate::run::Train;
use crate::spec::{Configure, JobSpec, Padding};

/// Trains BERT sequence classification with `num_workers` data-parallel workers and the
/// defaults of the reference notebook (see `trainbook train bert --help` and
/// [`crate::recipes::bert`]): the reference's model and data when they are on this machine,
/// else the offline all-MiniLM-L6-v2 on Rotten Tomatoes.
pub fn train_bert(num_workers: usize) -> Result<TrainResult> {
    BertTrainer::new().workers(num_workers).fit()
}

/// A recipe's builder: a `JobSpec` for that recipe (2 workers by default) whose shared options,
/// `fit` and `launch` come from [`Configure`]; the recipe's own options are added below it.
macro_rules! trainer {
    ($(#[$doc:meta])* $name:ident, $recipe:literal) => {
        $(#[$doc])*
        #[derive(Clone, Debug)]
        pub struct $name {
            spec: JobSpec,
        }

        impl Default for $name {
            fn default() -> Self {
                Self::new()
            }
        }

        impl Configure for $name {
            fn job_spec(&mut self) -> &mut JobSpec {
                &mut self.spec
            }
            fn into_spec(self) -> JobSpec {
                self.spec
            }
        }

        impl $name {
            pub fn new() -> Self {
                Self {
                    spec: JobSpec::new($recipe).workers(2),
                }
            }

            /// The job this trainer would run.
            pub fn spec(&self) -> &JobSpec {
                &self.spec
            }
        }
    };
}

trainer!(
    /// Every option of the BERT recipe:
    /// `BertTrainer::new().workers(2).epochs(1).max_length(64).optimizer(OptimizerKind::Adamw).fit()?`
    /// The shared options (workers, epochs, lr, model, data, ...) come from [`Configure`].
    BertTrainer,
    "bert"
);

impl BertTrainer {
    /// The file of the table this job will train on, as its preset and `data` option choose it
    /// (nothing is started).
    pub fn training_file(&self) -> Result<PathBuf> {
        trainbook_recipes::bert::training_file(&self.spec.train)
    }
    /// The table this job will train on, all its rows (the BERT notebook previews it).
    pub fn training_table(&self) -> Result<polars::prelude::DataFrame> {
        trainbook_recipes::text::dataset::read_table(&self.training_file()?)
    }
    /// Tokens per text after truncation (the preset's otherwise: 128 default, 512 reference).
    pub fn max_length(mut self, n: usize) -> Self {
        self.spec.train.text.max_length = Some(n);
        self
    }
    /// `Padding::MaxLength` (the reference's) or `Padding::Dynamic` (pads each batch to its
    /// longest text: same results, less work for short texts).
    pub fn padding(mut self, p: Padding) -> Self {
        self.spec.train.text.padding = Some(p);
        self
    }
    /// Name of the text column (default "text").
    pub fn text_column(mut self, c: impl Into<String>) -> Self {
        self.spec.train.text.text_column = Some(c.into());
        self
    }
    /// Name of the label column (default "label"); strings or integers.
    pub fn label_column(mut self, c: impl Into<String>) -> Self {
        self.spec.train.text.label_column = Some(c.into());
        self
    }
    /// Hold out this fraction of the data for evaluation (when it has no test table).
    pub fn eval_fraction(mut self, f: f64) -> Self {
        self.spec.train.text.eval_fraction = Some(f);
        self
    }
    /// A separate evaluation table.
    pub fn eval_data(mut self, path: impl Into<PathBuf>) -> Self {
        self.spec.train.text.eval_data = Some(path.into().display().to_string());
        self
    }
}

/// Trains image classification with `num_workers` data-parallel workers: the reference
/// notebook's ResNet-50 job when a hymenoptera-style folder is on this machine, else the
/// offline default (ResNet-18 on MNIST digits; see `trainbook recipes`).
pub fn train_resnet(num_workers: usize) -> Result<TrainResult> {
    ResnetTrainer::new().workers(num_workers).fit()
}

trainer!(
    /// Every option of the ResNet recipe:
    /// `ResnetTrainer::new().workers(2).data("hymenoptera_data").arch(Arch::Resnet50).image_size(224).fit()?`
    ResnetTrainer,
    "resnet"
);

impl ResnetTrainer {
    pub fn arch(mut self, a: crate::spec::Arch) -> Self {
        self.spec.train.vision.arch = Some(a);
        self
    }
    /// Side of the square input in pixels.
    pub fn image_size(mut self, px: u32) -> Self {
        self.spec.train.vision.image_size = Some(px);
        self
    }
    /// Threads per worker that decode and augment images ahead of the training loop.
    pub fn loader_threads(mut self, n: usize) -> Self {
        self.spec.train.vision.loader_threads = Some(n);
        self
    }
}
