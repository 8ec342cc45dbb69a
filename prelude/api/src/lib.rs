//! trainbook's notebook-facing API: what `use trainbook::prelude::*;` brings into a cell.
//!
//! Job specs and every option ([`JobSpec`], [`BertTrainer`], [`ResnetTrainer`], the option
//! traits), jobs and results ([`Job`], [`TrainResult`], [`Table`]), classifiers and image
//! folders. This crate depends on nothing heavy: in the trainbook kernel every cell compiles
//! against it, and a small dependency graph is what keeps a cell's compile short. The engine
//! (libtorch, polars, the recipes, the notebook view) is reached at run time through
//! ports found at run time (the private `runtime` module); the `trainbook` crate implements them
//! and re-exports everything here. What only the engine needs is in the hidden `plumbing`
//! module.
// Modules are private; what a user or the engine may name is re-exported below, once.
#![warn(unreachable_pub)]

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

mod classify;
mod corpus;
mod device;
mod display;
mod job;
mod lm;
mod logs;
mod memory;
pub mod metric;
mod mlm;
mod options;
mod params;
mod profile;
mod qa;
mod run;
mod runtime;
mod spec;
mod sweep;
mod table;
mod text;
mod tokenizer;
mod topology;
mod view;
mod vision;

pub use classify::{Answer, QuestionAnswerer};
pub use classify::{ImageClassifier, Prediction, TaggedSpan, TextClassifier, TokenTagger};
pub use corpus::{CorpusPreparer, PrepareProgress, PreparedCorpus};
pub use device::{Backend, DeviceKind, DeviceRequest};
pub use display::{
    clear_output, content_blocks, display, display_as, display_bundle, display_json, display_png,
    DisplayHandle, ShowValue,
};
pub use job::{
    running_jobs, stop_all, Job, JobStatus, JobUpdate, LogRecord, MemoryUse, MetricRow, Progress,
    Resize, Restart, TrainError, TrainResult,
};
pub use lm::{
    ConfigureLm, GenerateOptions, Generation, LlamaShape, LmOptions, LmTrainer, TextGenerator,
};
pub use logs::{LogLevel, Stream};
pub use memory::{Capacity, Footprint, Lever, MemoryPlan, MemoryRow};
pub use mlm::{BertMlmTrainer, ConfigureMlm, MlmOptions};
pub use params::{Param, ParamError};
pub use profile::{OpTime, ProfileSteps, StepProfile};
pub use qa::{ConfigureQa, QaOptions, QaTrainer};
pub use run::{fit, launch, Train, View};
pub use spec::{
    Configure, ConfigureTraining, DedupOptions, Hyper, JobKind, JobSpec, Nodes, OptimizerKind,
    Plan, Precision, Resume, Schedule, TrainOptions,
};
pub use sweep::{
    Asha, Goal, MedianStopping, ParamValue, Scheduler, Space, Sweep, SweepJob, SweepResult,
    SweepSpec, SweepStatus, SweepUpdate, Trial, TrialPlan, TrialStatus,
};
pub use table::{Column, Table, Value, Values};
pub use text::{train_bert, BertTrainer, ConfigureText, Padding, TaggerTrainer, TextOptions};
pub use tokenizer::{TokenizerTrainer, TrainedTokenizer};
pub use topology::Topology;
pub use view::ViewOptions;
pub use vision::{
    train_resnet, Arch, Augment, ConfigureVision, ImageFolder, ResnetTrainer, VisionOptions,
};

/// The kernel's side of a notebook.
pub mod notebook {
    pub use crate::display::attach;
}

/// What the engine and the `trainbook` crate build on, and notebooks never need, in groups: the
/// ports the engine implements ([`plumbing::ports`]), the handles' engine side
/// ([`plumbing::handles`]), the resolved settings the recipes read and the defaults of job
/// options ([`plumbing::settings`]), what the engine's views share ([`plumbing::format`],
/// [`plumbing::trials`]), and what the exported macros expand to ([`plumbing::macros`]).
#[doc(hidden)]
pub mod plumbing {
    /// The ports: the traits the engine implements (see the `runtime` module), what they hand
    /// back, and how this crate registers and finds them at run time.
    pub mod ports {
        pub use crate::classify::{AnswerModel, Classifiers, ImageModel, TagModel, TextModel};
        pub use crate::corpus::Corpora;
        pub use crate::display::{Bundle, Notebook};
        pub use crate::job::Jobs;
        pub use crate::lm::{Generators, LanguageModel};
        pub use crate::runtime::{
            fingerprint, last_dl_error, port, register, registered, Ports, DYLIB_ENV,
            FINGERPRINT_SYMBOL, PORTS_SYMBOL,
        };
        pub use crate::sweep::Sweeps;
        pub use crate::text::TextData;
        pub use crate::tokenizer::Tokenizers;
        pub use crate::vision::ImageFolders;
    }

    /// The engine's side of [`crate::Job`] and [`crate::SweepJob`]: what it updates, and what
    /// a view reads.
    pub mod handles {
        pub use crate::job::{JobControl, JobView};
        pub use crate::sweep::SweepControl;
    }

    /// The option structs as the recipes read them (resolved from a job's options), and the
    /// defaults, names and checks of job options.
    pub mod settings {
        pub use crate::lm::LmSettings;
        pub use crate::memory::parse_bytes;
        pub use crate::mlm::MlmSettings;
        pub use crate::options::names as option_names;
        pub use crate::qa::QaSettings;
        pub use crate::run::view_options;
        pub use crate::spec::{check_mlflow_uri, DEFAULT_HANG_TIMEOUT_SECS};
        pub use crate::text::TextSettings;
        pub use crate::topology::{first_hostlist_entry, DEFAULT_MASTER_PORT};
        pub use crate::view::LOG_LEVEL_ENV;
        pub use crate::vision::VisionSettings;
    }

    /// Values as the engine's views show them: numbers, rank lists, merged log lines, metric
    /// tables.
    pub mod format {
        pub use crate::job::{metrics_table, per_epoch};
        pub use crate::logs::{fmt_num, format_ranks, Repeats, Shown};
    }

    /// A sweep's trials: their parameters, the best one, and how they are counted, tabled and
    /// written.
    pub mod trials {
        pub use crate::sweep::{
            best_finished, count_by_status, counts_line, status_counts, trial_json, trial_params,
            trials_table,
        };
    }

    /// What [`param!`](crate::param) expands to.
    pub mod macros {
        pub use crate::params::{__json, rebind};
    }
}

/// What notebooks and scripts import: `use trainbook::prelude::*;`
pub mod prelude {
    pub use crate::classify::{Answer, QuestionAnswerer};
    pub use crate::classify::{
        ImageClassifier, Prediction, TaggedSpan, TextClassifier, TokenTagger,
    };
    pub use crate::corpus::{CorpusPreparer, PreparedCorpus};
    pub use crate::device::{DeviceKind, DeviceRequest};
    pub use crate::display::{
        clear_output, display, display_as, display_bundle, display_json, display_png,
        DisplayHandle, ShowValue,
    };
    pub use crate::job::{stop_all, Job, JobStatus, JobUpdate, Resize, Restart, TrainResult};
    pub use crate::lm::{ConfigureLm, Generation, LlamaShape, LmTrainer, TextGenerator};
    pub use crate::logs::LogLevel;
    pub use crate::mlm::{BertMlmTrainer, ConfigureMlm};
    pub use crate::param;
    pub use crate::qa::{ConfigureQa, QaTrainer};
    pub use crate::run::{fit, launch, Train, View};
    pub use crate::spec::{
        Configure, ConfigureTraining, Hyper, JobSpec, OptimizerKind, Plan, Precision, Resume,
        Schedule,
    };
    pub use crate::sweep::{
        Asha, Goal, MedianStopping, Scheduler, Sweep, SweepJob, SweepResult, TrialStatus,
    };
    pub use crate::table::{Column, Table};
    pub use crate::text::{train_bert, BertTrainer, ConfigureText, Padding, TaggerTrainer};
    pub use crate::tokenizer::{TokenizerTrainer, TrainedTokenizer};
    pub use crate::vision::{train_resnet, Arch, ConfigureVision, ImageFolder, ResnetTrainer};
    pub use anyhow::{anyhow, bail, Result};
    // The std types trainbook's values are made of, so that a variable's type, written down
    // by the kernel as the compiler names it (`PathBuf`, `BTreeMap<String, f64>`), resolves.
    pub use std::collections::{BTreeMap, HashMap};
    pub use std::path::{Path, PathBuf};
    pub use std::time::Duration;
}
