//! trainbook: data-parallel training from notebooks and the command line.
//!
//! `launch(spec)` starts one worker process per device; the workers keep their models in
//! lock-step through PyTorch's c10d collectives and stream events (logs, metrics, progress,
//! checkpoints) back to this process, which de-duplicates logs and hands everything to the
//! caller through a [`Job`] handle.

pub mod assets;
pub mod check;
pub mod checkpoint;
pub mod classify;
pub mod cli;
pub mod dashboard;
pub mod ddp;
pub mod dedup;
pub mod device;
pub mod dist;
pub mod events;
pub mod job;
pub mod launch;
pub mod metrics;
pub mod models;
pub mod notebook;
pub mod optim;
pub mod precision;
pub mod recipes;
pub mod sampler;
pub mod spec;
pub mod text;
pub mod train;
pub mod trainers;
pub mod vision;
pub mod worker;

pub use classify::{ImageClassifier, Prediction, TextClassifier};
pub use device::{DeviceKind, DeviceRequest};
pub use job::{
    fit, launch, running_jobs, stop_all, Job, JobStatus, TrainError, TrainResult, Update,
};
pub use spec::{Configure, JobSpec, OptimizerKind, TrainConfig};
pub use trainers::{train_bert, train_resnet, BertTrainer, ResnetTrainer};

/// What notebooks and scripts import: `use trainbook::prelude::*;`
pub mod prelude {
    pub use crate::classify::{ImageClassifier, Prediction, TextClassifier};
    pub use crate::device::{DeviceKind, DeviceRequest};
    pub use crate::job::{fit, launch, stop_all, Job, JobStatus, TrainResult, Update};
    pub use crate::models::resnet::Arch;
    pub use crate::spec::{Configure, JobSpec, OptimizerKind, Padding, Precision, Schedule};
    pub use crate::trainers::{train_bert, train_resnet, BertTrainer, ResnetTrainer};
    pub use anyhow::Result;
    // Tables (metrics, data previews) are polars DataFrames; notebook variables need the name.
    pub use polars::prelude::DataFrame;
    pub use trainbook_widgets::LogLevel;
}
