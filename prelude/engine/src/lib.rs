//! trainbook's engine: what a job is and how it runs, with no UI and no concrete recipe.
//!
//! `launch(spec, &registry)` starts one worker process per device; the workers keep their models
//! in lock-step through PyTorch's c10d collectives and stream events (logs, metrics, progress,
//! checkpoints) back to this process, which folds them into a [`Job`] handle. Recipes come in
//! through a [`Registry`] that the caller injects (the `trainbook` facade for notebooks and the
//! CLI, `trainbook-worker` in the workers); views subscribe to jobs ([`Job::subscribe`],
//! [`JobView`]) instead of being called by them.

pub mod check;
pub mod checkpoint;
pub mod ddp;
pub mod dedup;
pub mod device;
pub mod dist;
pub mod dllog;
pub mod events;
pub mod job;
pub mod launch;
pub mod metrics;
pub mod optim;
pub mod precision;
pub mod recipe;
pub mod sampler;
pub mod scores;
pub mod spec;
pub mod task;
pub mod train;
pub mod update;
pub mod worker;
pub mod zero;

pub use device::{DeviceKind, DeviceRequest};
pub use job::{
    launch, running_jobs, stop_all, Job, JobStatus, JobView, TrainError, TrainResult, Update,
};
pub use recipe::{Recipe, RecipeEntry, Registry, Split, Step};
pub use spec::{Configure, ConfigureTraining, Hyper, JobSpec, OptimizerKind, TrainConfig};
pub use task::{Batch, Setup, Task};
/// The notebook-facing types the engine's own are made of (specs, options, jobs, results).
pub use trainbook_api as api;
/// Declares a group of options (see `trainbook_api::options`).
pub use trainbook_api::options;
