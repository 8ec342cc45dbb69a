//! trainbook's engine behind `trainbook_api`'s ports: what the API's operations do in this
//! process. The engine's `launch` with trainbook's recipes injected and the notebook view
//! subscribed to the job, plans, sweeps, data tables, classifiers, tokenizers, corpora and the
//! rich display of values.
//!
//! Registered before `main` in every program that links this crate, and exported by name from
//! the trainbook_torch library, where notebook cells (which compile against `trainbook_api`
//! only) find it (see `trainbook_api`'s `runtime` module).

use std::any::Any;
use std::ffi::c_char;
use std::path::{Path, PathBuf};

use anyhow::{anyhow, Result};
use trainbook_api::plumbing::ports::{
    self, AnswerModel, Bundle, Classifiers, Corpora, Generators, ImageFolders, ImageModel, Jobs,
    LanguageModel, Notebook, Ports, Sweeps, TagModel, TextData, TextModel, Tokenizers,
};
use trainbook_api::plumbing::settings::view_options;
use trainbook_api::{
    CorpusPreparer, Hyper, ImageFolder, Job, JobSpec, Plan, PrepareProgress, PreparedCorpus,
    SweepJob, SweepSpec, Table, TokenizerTrainer, TrainedTokenizer, TrialPlan,
};
use trainbook_recipes::REGISTRY;

use crate::dashboard::dashboard_options;
use crate::{display, notebook};

/// trainbook in this process: the engine with trainbook's recipes injected and the notebook view
/// subscribed; it implements every port.
pub struct Trainbook;

/// The implementation of every port that this crate registers and exports.
pub static TRAINBOOK: Trainbook = Trainbook;

impl Jobs for Trainbook {
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

    fn running_jobs(&self) -> Vec<Job> {
        trainbook_engine::running_jobs()
    }

    fn stop_all(&self) -> usize {
        trainbook_engine::stop_all()
    }

    fn show_job(&self, job: &Job) -> Result<()> {
        notebook::show(job)
    }
}

impl Sweeps for Trainbook {
    fn sweep(&self, spec: SweepSpec) -> Result<SweepJob> {
        dashboard_options(&view_options(&spec.base))?;
        let sweep = trainbook_engine::sweep::launch(spec, &REGISTRY)?;
        notebook::show_launched::<crate::sweep_view::SweepDashboard>(&sweep);
        Ok(sweep)
    }

    fn plan_sweep(&self, spec: &SweepSpec) -> Result<Vec<TrialPlan>> {
        trainbook_engine::sweep::plan(spec, &REGISTRY)
    }

    fn show_sweep(&self, sweep: &SweepJob) -> Result<()> {
        crate::sweep_view::show(sweep)
    }
}

impl Notebook for Trainbook {
    fn attach_notebook(&self) -> Result<bool> {
        notebook::attach()
    }

    fn display(&self, value: &dyn Any) -> Option<Bundle> {
        display::bundle_of(value)
    }

    fn show_output(&self, id: Option<&str>, data: Bundle) -> Result<String> {
        Ok(notebook::show_output(id, data))
    }

    fn update_output(&self, id: &str, data: Bundle) -> Result<()> {
        notebook::update_output(id, data);
        Ok(())
    }

    fn clear_output(&self, wait: bool) -> Result<()> {
        notebook::clear_output(wait);
        Ok(())
    }
}

impl TextData for Trainbook {
    fn text_training_file(&self, hyper: &Hyper) -> Result<PathBuf> {
        trainbook_recipes::bert::training_file(hyper)
    }

    fn read_table(&self, path: &Path) -> Result<Table> {
        crate::frames::from_polars(&trainbook_recipes::text::dataset::read_table(path)?)
    }
}

impl ImageFolders for Trainbook {
    fn scan_images(&self, root: &Path) -> Result<ImageFolder> {
        trainbook_recipes::vision::folder::scan(root)
    }
}

impl Classifiers for Trainbook {
    fn load_text_model(&self, dir: &Path) -> Result<Box<dyn TextModel>> {
        Ok(Box::new(trainbook_recipes::classify::BertTextModel::load(
            dir,
        )?))
    }

    fn load_image_model(&self, dir: &Path) -> Result<Box<dyn ImageModel>> {
        Ok(Box::new(
            trainbook_recipes::classify::ResnetImageModel::load(dir)?,
        ))
    }

    fn load_answerer(&self, dir: &Path) -> Result<Box<dyn AnswerModel>> {
        Ok(Box::new(
            trainbook_recipes::question_answering::Answerer::load(dir)?,
        ))
    }

    fn load_tagger(&self, dir: &Path) -> Result<Box<dyn TagModel>> {
        Ok(Box::new(
            trainbook_recipes::token_classification::Tagger::load(dir)?,
        ))
    }
}

impl Generators for Trainbook {
    fn load_language_model(
        &self,
        model: &Path,
        adapter: Option<&Path>,
        device: &str,
    ) -> Result<Box<dyn LanguageModel>> {
        let device = crate::lm::device(device)?;
        let lm = trainbook_recipes::causal_lm::inference::load(model, adapter, device)?;
        Ok(Box::new(crate::lm::LoadedGenerator(lm)))
    }
}

impl Tokenizers for Trainbook {
    fn train_tokenizer(&self, spec: &TokenizerTrainer, out: &Path) -> Result<TrainedTokenizer> {
        trainbook_recipes::text::wordpiece::train_and_save(spec, out)
    }
}

impl Corpora for Trainbook {
    fn prepare_corpus(
        &self,
        spec: &CorpusPreparer,
        out: &Path,
        progress: &mut dyn FnMut(&PrepareProgress) -> Result<()>,
    ) -> Result<PreparedCorpus> {
        trainbook_recipes::text::corpus::prepare_spec(spec, out, progress)
    }
}

// Registration before `main`: a program only names `trainbook_api` items (re-exported here), so
// nothing else would run this crate's code first. `#[used]` keeps the entry in the link.
#[used]
#[link_section = ".init_array"]
static REGISTER: extern "C" fn() = {
    extern "C" fn register() {
        ports::register::<dyn Jobs>(&TRAINBOOK);
        ports::register::<dyn Sweeps>(&TRAINBOOK);
        ports::register::<dyn Notebook>(&TRAINBOOK);
        ports::register::<dyn TextData>(&TRAINBOOK);
        ports::register::<dyn ImageFolders>(&TRAINBOOK);
        ports::register::<dyn Classifiers>(&TRAINBOOK);
        ports::register::<dyn Tokenizers>(&TRAINBOOK);
        ports::register::<dyn Generators>(&TRAINBOOK);
        ports::register::<dyn Corpora>(&TRAINBOOK);
    }
    register
};

/// The fingerprint of the `trainbook_api` build inside this library (see
/// `trainbook_api`'s `runtime` module); notebook cells compare it with their own before they
/// use [`trainbook_ports`].
#[no_mangle]
pub extern "C" fn trainbook_api_fingerprint() -> *const c_char {
    ports::fingerprint().as_ptr()
}

/// This library's ports, for notebook cells (Rust ABI: cells are built by the same compiler
/// against the same `trainbook_api`, which the fingerprint checks).
#[no_mangle]
pub fn trainbook_ports() -> &'static Ports {
    ports::registered()
}
