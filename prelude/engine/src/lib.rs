#![warn(unreachable_pub)]
//! trainbook's engine: how a job runs, with no UI and no concrete recipe.
//!
//! Two sides, each a private room, and what they share:
//!
//! - the **driver** (`driver/`), in the process that starts a job (a notebook's kernel, the CLI):
//!   device choice, rendezvous, worker processes, the event loop that folds what workers report
//!   into a [`Job`](trainbook_api::Job) handle;
//! - the **worker** (`worker/`), one exec'd process per device: the training loop, collectives,
//!   update strategies, optimizers, precision, checkpoint writing;
//! - **shared** (`shared/`): the environment contract between the two, the events wire, the
//!   checkpoint format, the one C++ error path.
//!
//! The worker side never reaches into the driver side. Recipes come in through a [`Registry`]
//! that the caller injects (the `trainbook` facade for notebooks and the CLI, `trainbook-worker`
//! in the workers); views subscribe to jobs instead of being called by them. Everything below
//! is the engine's whole public surface; the notebook-facing types (specs, jobs, results) are
//! `trainbook-api`'s.

mod driver;
mod shared;
pub mod sweep;
mod worker;

// Running jobs: the driver side.
pub use driver::dedup::looks_like_error;
pub use driver::placement::resolve as resolve_device;
pub use driver::{launch, running_jobs, validate};

/// The memory plan of a job on a device (`None` for recipes that report no footprint).
pub fn plan_memory(
    spec: &trainbook_api::JobSpec,
    hyper: &trainbook_api::Hyper,
    device: trainbook_api::DeviceKind,
    recipes: &Registry,
) -> anyhow::Result<Option<trainbook_api::MemoryPlan>> {
    match recipes.work(spec)? {
        worker::jobs::Work::Recipe(entry) => worker::memory::plan(entry, spec, hyper, device),
        _ => Ok(None),
    }
}

/// Stops every sweep and every running job of this process (what a notebook interrupt does):
/// sweeps first, so that none starts a trial after its jobs were stopped. Returns how many
/// jobs were running.
pub fn stop_all() -> usize {
    sweep::stop_sweeps();
    driver::stop_all()
}

// What a recipe is, and what a worker gives it.
pub use worker::device::{
    is_channels_last, memory_format, on_hpu, vars_channels_last, Device, OnDeviceOf,
};
pub use worker::dist::{BackendHandle, InitOptions};
pub use worker::recipe::{
    BuildFn, FootprintFn, Layout, PresetFn, Recipe, RecipeEntry, Registry, Split, StagedStep, Step,
};
pub use worker::recompute::checkpointed;
pub use worker::task::{Batch, Setup, Task};
pub use worker::units::{unit_forward, unit_sizes};
/// ZeRO-3's sharded build: what a model and its loader call so that no rank holds it whole.
pub mod sharded_build {
    pub use crate::worker::slices::{cast, fill, unit_built};
}
pub use worker::{main as worker_main, Hpu, HpuBridge};

/// The run directory's files and crash-safe writing (see the module's layout).
pub mod checkpoint {
    pub use crate::driver::metrics::read_parquet as read_metrics;
    pub use crate::shared::checkpoint::{
        latest, save_vars, write_atomic, write_file_atomic, write_json_atomic, write_tensors,
        RunConfig, RunStatus, TrainerState, MODEL, MODEL_STEM, OPTIMIZER, OPTIMIZER_STEM,
        TRAINER_STATE,
    };
    pub use crate::shared::run_dir::RunDir;
    pub use crate::shared::tensor_files::{
        exists as has_tensors, files_of, index_name, shard_name, single_name, TensorFiles,
    };
}

/// C++ helpers' errors as `anyhow` errors: for crates that add helpers of their own (the HPU
/// bridge's).
pub mod ffi {
    pub use crate::shared::ffi::{call, call_ptr, call_status};
}

/// Users' tasks in their own programs and in notebook cells (the facade's `custom` module).
pub mod task {
    pub use crate::shared::env::WORKER_MAIN;
    pub use crate::worker::task::{job_spec, mark_hooked, setup_on_cpu};
}

/// For trainbook's own integration tests: process inspection and forged events.
#[doc(hidden)]
pub mod testing {
    pub use crate::driver::processes::{children_of, process_alive};
    pub use crate::shared::events::send_raw;
}
