//! trainbook's notebook-facing API: what `use trainbook::prelude::*;` brings into a cell.
//!
//! Job specs and every option ([`$crate::spec::JobSpec`], [`BertTrainer`], [`ResnetTrainer`], the option
//! traits), jobs and results ([`Job`], [`TrainResult`], [`Table`]), classifiers and image
//! folders. This crate depends on nothing heavy: in the trainbook kernel every cell compiles
//! against it, and a small dependency graph is what keeps a cell's compile short. The engine
//! (libtorch, polars, the recipes, the notebook view) is reached at run time through
//! [`runtime::Runtime`]; the `trainbook` crate provides it and re-exports everything here.

// Builders for one recipe each; used by `text` and `vision`.
/// A recipe's builder: a `JobSpec` for that recipe (2 workers by default) whose job options come
/// from [`Configure`], its training options from [`crate::spec::ConfigureTraining`], `fit`,
/// `launch` and `plan` from [`Train`]; the recipe's own options from the recipe's trait below.
macro_rules! trainer {
    ($(#[$doc:meta])* $name:ident, $recipe:literal) => {
        $(#[$doc])*
        #[derive(Clone, Debug)]
        pub struct $name {
            spec: $crate::spec::JobSpec,
        }

        impl Default for $name {
            fn default() -> Self {
                Self::new()
            }
        }

        impl $crate::spec::Configure for $name {
            fn job_spec(&mut self) -> &mut $crate::spec::JobSpec {
                &mut self.spec
            }
            fn into_spec(self) -> $crate::spec::JobSpec {
                self.spec
            }
            fn spec(&self) -> &$crate::spec::JobSpec {
                &self.spec
            }
        }

        impl $name {
            pub fn new() -> Self {
                Self {
                    spec: $crate::spec::JobSpec::new($recipe).workers(2),
                }
            }
        }
    };
}

pub mod classify;
pub mod corpus;
pub mod device;
pub mod display;
pub mod job;
pub mod logs;
pub mod memory;
pub mod metric;
pub mod mlm;
pub mod options;
pub mod params;
pub mod profile;
pub mod run;
pub mod runtime;
pub mod spec;
pub mod sweep;
pub mod table;
pub mod text;
pub mod tokenizer;
pub mod topology;
pub mod view;
pub mod vision;

pub use classify::{ImageClassifier, Prediction, TextClassifier};
pub use corpus::{CorpusPreparer, PrepareProgress, PreparedCorpus};
pub use device::{Backend, DeviceKind, DeviceRequest};
pub use display::{content_blocks, ShowValue};
pub use job::{
    running_jobs, stop_all, Job, JobStatus, JobUpdate, Restart, TrainError, TrainResult,
};
pub use logs::LogLevel;
pub use memory::{Footprint, MemoryPlan};
pub use mlm::{BertMlmTrainer, ConfigureMlm, MlmOptions};
pub use params::{Param, ParamError};
pub use profile::{OpTime, ProfileSteps, StepProfile};
pub use run::{fit, launch, Plan, Train, View, ViewOptions};
pub use spec::{
    Configure, ConfigureTraining, Hyper, JobSpec, OptimizerKind, Precision, Resume, Schedule,
    TrainConfig,
};
pub use sweep::{
    Asha, Goal, MedianStopping, ParamValue, Scheduler, Space, Sweep, SweepJob, SweepResult,
    SweepSpec, SweepStatus, SweepUpdate, Trial, TrialPlan, TrialStatus,
};
pub use table::{Column, Table, Value};
pub use text::{train_bert, BertTrainer, ConfigureText, Padding, TextOptions};
pub use tokenizer::{TokenizerTrainer, TrainedTokenizer};
pub use topology::Topology;
pub use vision::{train_resnet, Arch, ConfigureVision, ImageFolder, ResnetTrainer, VisionOptions};

/// The kernel's side of a notebook.
pub mod notebook {
    /// Connects this process to the trainbook kernel's display channel (the kernel's first
    /// cell calls it); `Ok(false)` outside the kernel.
    pub fn attach() -> anyhow::Result<bool> {
        crate::runtime::runtime()?.attach_notebook()
    }
}

/// What notebooks and scripts import: `use trainbook::prelude::*;`
pub mod prelude {
    pub use crate::classify::{ImageClassifier, Prediction, TextClassifier};
    pub use crate::corpus::{CorpusPreparer, PreparedCorpus};
    pub use crate::device::{DeviceKind, DeviceRequest};
    pub use crate::display::ShowValue;
    pub use crate::job::{stop_all, Job, JobStatus, JobUpdate, Restart, TrainResult};
    pub use crate::logs::LogLevel;
    pub use crate::mlm::{BertMlmTrainer, ConfigureMlm};
    pub use crate::param;
    pub use crate::run::{fit, launch, Plan, Train, View};
    pub use crate::spec::{
        Configure, ConfigureTraining, Hyper, JobSpec, OptimizerKind, Precision, Resume, Schedule,
    };
    pub use crate::sweep::{
        Asha, Goal, MedianStopping, Scheduler, Sweep, SweepJob, SweepResult, TrialStatus,
    };
    pub use crate::table::{Column, Table};
    pub use crate::text::{train_bert, BertTrainer, ConfigureText, Padding};
    pub use crate::tokenizer::{TokenizerTrainer, TrainedTokenizer};
    pub use crate::vision::{train_resnet, Arch, ConfigureVision, ImageFolder, ResnetTrainer};
    pub use anyhow::{anyhow, bail, Result};
    // The std types trainbook's values are made of, so that a variable's type, written down
    // by the kernel as the compiler names it (`PathBuf`, `BTreeMap<String, f64>`), resolves.
    pub use std::collections::{BTreeMap, HashMap};
    pub use std::path::{Path, PathBuf};
    pub use std::time::Duration;
}
