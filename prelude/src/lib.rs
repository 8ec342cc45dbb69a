//! trainbook: data-parallel training from notebooks and the command line.
//!
//! `launch(spec)` starts one worker process per device; the workers keep their models in
//! lock-step through PyTorch's c10d collectives and stream events (logs, metrics, progress,
//! checkpoints) back to this process, which de-duplicates logs and hands everything to the
//! caller through a [`Job`] handle.

pub mod assets;
pub mod check;
pub mod checkpoint;
pub mod cli;
pub mod ddp;
pub mod dedup;
pub mod device;
pub mod dist;
pub mod events;
pub mod job;
pub mod launch;
pub mod metrics;
pub mod models;
pub mod recipes;
pub mod sampler;
pub mod spec;
pub mod text;
pub mod train;
pub mod worker;

pub use device::{DeviceKind, DeviceRequest};
pub use job::{
    fit, launch, running_jobs, stop_all, Job, JobStatus, TrainError, TrainResult, Update,
};
pub use spec::{JobSpec, OptimizerKind, TrainConfig};

/// What notebooks and scripts import: `use trainbook::prelude::*;`
pub mod prelude {
    pub use crate::device::DeviceRequest;
    pub use crate::job::{fit, launch, stop_all, Job, JobStatus, TrainResult, Update};
    pub use crate::spec::{JobSpec, OptimizerKind};
    pub use anyhow::Result;
}
