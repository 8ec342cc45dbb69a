//! trainbook's runtime: what `trainbook_api`'s operations do in this process. The engine's
//! `launch` with trainbook's recipes injected and the notebook view subscribed to the job, plans,
//! data tables, classifiers and the rich display of values.
//!
//! Registered before `main` in every program that links this crate, and exported by name from
//! the prelude library, where notebook cells (which compile against `trainbook_api` only) find it
//! (see `trainbook_api::runtime`).

use std::any::Any;
use std::ffi::c_char;
use std::path::{Path, PathBuf};

use anyhow::{anyhow, Result};
use trainbook_api::classify::{ImageModel, TextModel};
use trainbook_api::run::view_options;
use trainbook_api::runtime::{Bundle, Runtime};
use trainbook_api::{Hyper, Job, JobSpec};
use trainbook_api::{Plan, Table};
use trainbook_recipes::REGISTRY;

use crate::dashboard::dashboard_options;
use crate::{display, notebook};

/// The runtime (one per process).
pub struct Trainbook;

/// The runtime this crate registers and exports.
pub static RUNTIME: Trainbook = Trainbook;

impl Runtime for Trainbook {
    fn launch(&self, spec: JobSpec) -> Result<Job> {
        dashboard_options(&view_options(&spec))?;
        let job = trainbook_engine::launch(spec, &REGISTRY)?;
        notebook::show_launched::<crate::dashboard::JobDashboard>(&job);
        Ok(job)
    }

    fn plan(&self, spec: &JobSpec) -> Result<Plan> {
        trainbook_engine::validate(spec, &REGISTRY)?;
        let hyper = REGISTRY.resolve(spec)?.ok_or_else(|| {
            anyhow!(
                "job '{}' trains no recipe: it has no hyper-parameters",
                spec.recipe
            )
        })?;
        let device = match trainbook_engine::resolve_device(spec.device, spec.workers) {
            Ok(d) => d,
            // Planning for a machine you are not on: the device named, its memory given.
            Err(e) => match (spec.device.kind(), &spec.device_memory) {
                (Some(kind), Some(_)) => kind,
                _ => return Err(e),
            },
        };
        let memory = trainbook_engine::plan_memory(spec, &hyper, device, &REGISTRY)?;
        Ok(Plan {
            device,
            hyper,
            memory,
        })
    }

    fn sweep(&self, spec: trainbook_api::SweepSpec) -> Result<trainbook_api::SweepJob> {
        dashboard_options(&view_options(&spec.base))?;
        let sweep = trainbook_engine::sweep::launch(spec, &REGISTRY)?;
        notebook::show_launched::<crate::sweep_view::SweepDashboard>(&sweep);
        Ok(sweep)
    }

    fn plan_sweep(&self, spec: &trainbook_api::SweepSpec) -> Result<Vec<trainbook_api::TrialPlan>> {
        trainbook_engine::sweep::plan(spec, &REGISTRY)
    }

    fn show_sweep(&self, sweep: &trainbook_api::SweepJob) -> Result<()> {
        crate::sweep_view::show(sweep)
    }

    fn running_jobs(&self) -> Vec<Job> {
        trainbook_engine::running_jobs()
    }

    fn stop_all(&self) -> usize {
        trainbook_engine::stop_all()
    }

    fn show_job(&self, job: &Job) -> Result<()> {
        notebook::show(job)
    }

    fn attach_notebook(&self) -> Result<bool> {
        notebook::attach()
    }

    fn display(&self, value: &dyn Any) -> Option<Bundle> {
        display::bundle_of(value)
    }

    fn text_training_file(&self, hyper: &Hyper) -> Result<PathBuf> {
        trainbook_recipes::bert::training_file(hyper)
    }

    fn read_table(&self, path: &Path) -> Result<Table> {
        crate::frames::from_polars(&trainbook_recipes::text::dataset::read_table(path)?)
    }

    fn scan_images(&self, root: &Path) -> Result<trainbook_api::ImageFolder> {
        trainbook_recipes::vision::folder::scan(root)
    }

    fn load_text_model(&self, dir: &Path) -> Result<Box<dyn TextModel>> {
        Ok(Box::new(trainbook_recipes::classify::BertTextModel::load(
            dir,
        )?))
    }

    fn train_tokenizer(
        &self,
        spec: &trainbook_api::TokenizerTrainer,
        out: &Path,
    ) -> Result<trainbook_api::TrainedTokenizer> {
        trainbook_recipes::text::wordpiece::train_and_save(spec, out)
    }

    fn prepare_corpus(
        &self,
        spec: &trainbook_api::CorpusPreparer,
        out: &Path,
        progress: &mut dyn FnMut(&trainbook_api::PrepareProgress) -> Result<()>,
    ) -> Result<trainbook_api::PreparedCorpus> {
        trainbook_recipes::text::corpus::prepare_spec(spec, out, progress)
    }

    fn load_image_model(&self, dir: &Path) -> Result<Box<dyn ImageModel>> {
        Ok(Box::new(
            trainbook_recipes::classify::ResnetImageModel::load(dir)?,
        ))
    }
}

// Registration before `main`: a program only names `trainbook_api` items (re-exported here), so
// nothing else would run this crate's code first. `#[used]` keeps the entry in the link.
#[used]
#[link_section = ".init_array"]
static REGISTER: extern "C" fn() = {
    extern "C" fn register() {
        trainbook_api::runtime::register(&RUNTIME);
    }
    register
};

/// The fingerprint of the `trainbook_api` build inside this library (see
/// `trainbook_api::runtime`); notebook cells compare it with their own before they use
/// [`trainbook_runtime`].
#[no_mangle]
pub extern "C" fn trainbook_api_fingerprint() -> *const c_char {
    trainbook_api::runtime::fingerprint().as_ptr()
}

/// This library's runtime, for notebook cells (Rust ABI: cells are built by the same compiler
/// against the same `trainbook_api`, which the fingerprint checks).
#[no_mangle]
pub fn trainbook_runtime() -> &'static dyn Runtime {
    &RUNTIME
}
