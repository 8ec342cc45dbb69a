//! The notebook-facing API: one function per recipe with the reference's defaults
//! (`train_bert(2)`), and a builder per recipe for everything else.

use std::path::PathBuf;

use anyhow::Result;

use crate::job::TrainResult;
use crate::run::Train;
use crate::spec::{Configure, JobSpec};
use trainbook_recipes::bert::{ConfigureText, TextOptions};
use trainbook_recipes::resnet::{ConfigureVision, VisionOptions};

/// Trains BERT sequence classification with `num_workers` data-parallel workers and the
/// defaults of the reference notebook (see `trainbook train bert --help` and
/// [`crate::recipes::bert`]): the reference's model and data when they are on this machine,
/// else the offline all-MiniLM-L6-v2 on Rotten Tomatoes.
pub fn train_bert(num_workers: usize) -> Result<TrainResult> {
    BertTrainer::new().workers(num_workers).fit()
}

/// A recipe's builder: a `JobSpec` for that recipe (2 workers by default) whose job options come
/// from [`Configure`], its training options from [`crate::spec::ConfigureTraining`], `fit`,
/// `launch` and `plan` from [`Train`]; the recipe's own options from the recipe's trait below.
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
            fn spec(&self) -> &JobSpec {
                &self.spec
            }
        }

        impl $name {
            pub fn new() -> Self {
                Self {
                    spec: JobSpec::new($recipe).workers(2),
                }
            }
        }
    };
}

trainer!(
    /// Every option of the BERT recipe:
    /// `BertTrainer::new().workers(2).epochs(1).max_length(64).optimizer(OptimizerKind::Adamw).fit()?`
    /// The shared options (workers, epochs, lr, model, data, ...) come from [`Configure`] and
    /// [`crate::spec::ConfigureTraining`], the text options from [`ConfigureText`].
    BertTrainer,
    "bert"
);

impl BertTrainer {
    /// The file of the table this job will train on, as its preset and `data` option choose it
    /// (nothing is started).
    pub fn training_file(&self) -> Result<PathBuf> {
        trainbook_recipes::bert::training_file(&self.plan()?.hyper)
    }
    /// The table this job will train on, all its rows (the BERT notebook previews it).
    pub fn training_table(&self) -> Result<polars::prelude::DataFrame> {
        trainbook_recipes::text::dataset::read_table(&self.training_file()?)
    }
}

/// `max_length`, `padding`, `text_column`, `label_column`, `eval_fraction`, `eval_data`.
impl ConfigureText for BertTrainer {
    fn text_options(&mut self, edit: impl FnOnce(&mut TextOptions)) {
        self.spec.edit_recipe_options(edit)
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

/// `arch`, `image_size`, `loader_threads`.
impl ConfigureVision for ResnetTrainer {
    fn vision_options(&mut self, edit: impl FnOnce(&mut VisionOptions)) {
        self.spec.edit_recipe_options(edit)
    }
}
