//! trainbook: data-parallel training from notebooks and the command line.
//!
//! This crate is what cells and the CLI use. It puts together three layers whose dependencies
//! run one way: `trainbook-engine` (jobs, workers, collectives, the training loop; no UI, no
//! concrete recipe), `trainbook-recipes` (BERT, ResNet, synthetic and their data), and here the
//! trainers (`train_bert`, `BertTrainer`...), the CLI and the notebook view, which subscribes to
//! jobs. [`launch`] hands the engine the recipe registry and shows the job.

/// The `trainbook` command line (the `trainbook` binary's entry point).
pub mod cli;
/// The dashboard model shared by the notebook view and the terminal.
pub mod dashboard;
mod display;
/// The notebook view: how a job's dashboard reaches the trainbook kernel's cells.
pub mod notebook;
mod run;
mod trainers;

/// The engine beneath: job spec and options, the `Recipe` trait and registry type, the driver,
/// workers, collectives, the training loop, the checkpoint format. For code that extends
/// trainbook; notebooks need only the prelude.
pub use trainbook_engine as engine;
/// The recipes beneath: BERT, ResNet and synthetic, their models and data, the classifiers and
/// `REGISTRY`. For code that extends trainbook; notebooks need only the prelude.
pub use trainbook_recipes as recipes;

// The facade's own modules reach the layers beneath by these names.
use trainbook_engine::{dedup, device, job, spec};
use trainbook_recipes::classify;

pub use classify::{ImageClassifier, Prediction, TextClassifier};
pub use device::{DeviceKind, DeviceRequest};
pub use display::{content_blocks, NotebookDisplay, ShowValue};
pub use job::{running_jobs, stop_all, Job, JobStatus, TrainError, TrainResult, Update};
pub use run::{fit, launch, Plan, Show, Train, View, ViewOptions};
pub use spec::{
    Configure, ConfigureTraining, Hyper, JobSpec, OptimizerKind, Precision, Schedule, TrainConfig,
};
pub use trainbook_recipes::bert::{ConfigureText, TextOptions};
pub use trainbook_recipes::models::resnet::Arch;
pub use trainbook_recipes::resnet::{ConfigureVision, VisionOptions};
pub use trainbook_recipes::text::tokenizer::Padding;
pub use trainbook_recipes::vision::folder::ImageFolder;
pub use trainers::{train_bert, train_resnet, BertTrainer, ResnetTrainer};

/// What notebooks and scripts import: `use trainbook::prelude::*;`
pub mod prelude {
    pub use crate::classify::{ImageClassifier, Prediction, TextClassifier};
    pub use crate::device::{DeviceKind, DeviceRequest};
    pub use crate::display::{NotebookDisplay, ShowValue};
    pub use crate::job::{stop_all, Job, JobStatus, TrainResult, Update};
    pub use crate::run::{fit, launch, Plan, Show, Train, View};
    pub use crate::spec::{
        Configure, ConfigureTraining, Hyper, JobSpec, OptimizerKind, Precision, Schedule,
    };
    pub use crate::trainers::{train_bert, train_resnet, BertTrainer, ResnetTrainer};
    pub use crate::{Arch, ConfigureText, ConfigureVision, ImageFolder, Padding};
    pub use anyhow::Result;
    // Tables (metrics, data previews) are polars DataFrames; notebook variables need the name.
    pub use polars::prelude::DataFrame;
    pub use trainbook_widgets::LogLevel;
    // The std types trainbook's values are made of, so that a variable's type, written down
    // by the kernel as the compiler names it (`PathBuf`, `BTreeMap<String, f64>`), resolves.
    pub use std::collections::{BTreeMap, HashMap};
    pub use std::path::{Path, PathBuf};
    pub use std::time::Duration;
}
