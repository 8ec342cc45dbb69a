//! How this crate reaches the engine that runs jobs, without naming it.
//!
//! Why: every notebook cell is compiled against the crate it calls, and rustc reads the
//! metadata of that crate's whole dependency graph for every cell. The engine's graph (libtorch
//! bindings, polars, tokenizers, ~300 crates) made each cell cost ~0.3 s more than this crate's
//! small one. So cells compile against this crate only, and the operations that need the
//! engine go through one [`Runtime`] object found at run time:
//!
//! - In a program that depends on `trainbook` (the CLI, tests, a user's own binary), the
//!   `trainbook` crate registers its runtime before `main` ([`register`]).
//! - In the trainbook kernel, cells link their own copy of this crate, while the engine lives in
//!   the prelude library (`TRAINBOOK_PRELUDE_DYLIB`, loaded into the cell process on first use).
//!   That library exports two symbols: the fingerprint of the copy of this crate it was built
//!   with, and its runtime. A cell checks the fingerprint before it takes the runtime, because
//!   values cross between the two copies and both must be the same build of this crate: the
//!   same layouts, and the same `TypeId`s, which the engine's displays downcast by. The
//!   fingerprint is a `TypeId` of this crate, so it tells builds apart, not only sources.

use std::any::Any;
use std::ffi::{c_char, c_int, c_void, CStr, CString};
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use anyhow::{anyhow, Result};

use crate::classify::{ImageModel, TextModel};
use crate::job::Job;
use crate::run::Plan;
use crate::spec::{Hyper, JobSpec};
use crate::table::Table;
use crate::tokenizer::{TokenizerTrainer, TrainedTokenizer};
use crate::vision::ImageFolder;

/// A value's rich display: MIME type → content (`text/html`, `text/plain`, ...).
pub type Bundle = serde_json::Map<String, serde_json::Value>;

/// What the engine does for this crate: everything that needs libtorch, polars, the recipes or
/// the notebook view. Implemented once, by the `trainbook` crate.
pub trait Runtime: Send + Sync {
    /// Starts `spec` with trainbook's recipes; in the trainbook kernel the cell shows its live
    /// dashboard.
    fn launch(&self, spec: JobSpec) -> Result<Job>;
    /// The device and hyper-parameters `spec` would run with (nothing started).
    fn plan(&self, spec: &JobSpec) -> Result<Plan>;
    /// Starts a sweep; in the trainbook kernel the cell shows its live view.
    fn sweep(&self, spec: crate::sweep::SweepSpec) -> Result<crate::sweep::SweepJob>;
    /// The trials `spec` would run, each checked as `plan` checks a job (nothing started).
    fn plan_sweep(&self, spec: &crate::sweep::SweepSpec) -> Result<Vec<crate::sweep::TrialPlan>>;
    /// Shows a sweep's live view in the current cell (text elsewhere).
    fn show_sweep(&self, sweep: &crate::sweep::SweepJob) -> Result<()>;
    /// Jobs of this process that have not finished.
    fn running_jobs(&self) -> Vec<Job>;
    /// Stops every running job of this process; returns how many there were.
    fn stop_all(&self) -> usize;
    /// Shows a job's dashboard in the current cell (live in the kernel, text elsewhere).
    fn show_job(&self, job: &Job) -> Result<()>;
    /// Connects this process to the trainbook kernel's display channel, when it runs in one.
    fn attach_notebook(&self) -> Result<bool>;
    /// The rich display of trainbook's values (tables, results, jobs); `None` for other values.
    fn display(&self, value: &dyn Any) -> Option<Bundle>;
    /// The file of the table a text job trains on, as its resolved options choose it.
    fn text_training_file(&self, hyper: &Hyper) -> Result<PathBuf>;
    /// Reads a data table (.parquet, .csv, .tsv, .jsonl).
    fn read_table(&self, path: &Path) -> Result<Table>;
    /// Scans an image folder (see [`ImageFolder::scan`]).
    fn scan_images(&self, root: &Path) -> Result<ImageFolder>;
    /// Loads a text classifier checkpoint on the CPU.
    fn load_text_model(&self, dir: &Path) -> Result<Box<dyn TextModel>>;
    /// Loads an image classifier checkpoint on the CPU.
    fn load_image_model(&self, dir: &Path) -> Result<Box<dyn ImageModel>>;
    /// Trains a WordPiece tokenizer and writes it into `out`.
    fn train_tokenizer(&self, spec: &TokenizerTrainer, out: &Path) -> Result<TrainedTokenizer>;
    /// Prepares a corpus (see [`crate::corpus::CorpusPreparer::prepare`]); `progress` is called
    /// as it goes, and an error from it stops the preparation (finished shards are kept).
    fn prepare_corpus(
        &self,
        spec: &crate::corpus::CorpusPreparer,
        out: &Path,
        progress: &mut dyn FnMut(&crate::corpus::PrepareProgress) -> Result<()>,
    ) -> Result<crate::corpus::PreparedCorpus>;
}

/// The fingerprint of this build of the crate (see the module docs), as a C string.
pub fn fingerprint() -> &'static CStr {
    struct Marker;
    static FINGERPRINT: OnceLock<CString> = OnceLock::new();
    FINGERPRINT.get_or_init(|| {
        CString::new(format!("{:?}", std::any::TypeId::of::<Marker>()))
            .expect("a TypeId's Debug form has no NUL")
    })
}

/// `extern "C" fn() -> *const c_char`: the fingerprint of the prelude library's copy.
pub const PRELUDE_FINGERPRINT_SYMBOL: &str = "trainbook_api_fingerprint";
/// `extern "Rust" fn() -> &'static dyn Runtime`: the prelude library's runtime.
pub const PRELUDE_RUNTIME_SYMBOL: &str = "trainbook_runtime";
/// Where the kernel tells cell processes the prelude library is.
pub const PRELUDE_DYLIB_ENV: &str = "TRAINBOOK_PRELUDE_DYLIB";

static REGISTERED: OnceLock<&'static dyn Runtime> = OnceLock::new();
static FROM_PRELUDE: OnceLock<std::result::Result<&'static dyn Runtime, String>> = OnceLock::new();

/// Makes `runtime` the one this process uses (the first registration wins). The `trainbook`
/// crate calls it before `main`.
pub fn register(runtime: &'static dyn Runtime) {
    let _ = REGISTERED.set(runtime);
}

/// The runtime of this process: the registered one, else the prelude library's.
pub fn runtime() -> Result<&'static dyn Runtime> {
    if let Some(r) = REGISTERED.get() {
        return Ok(*r);
    }
    match FROM_PRELUDE.get_or_init(from_prelude) {
        Ok(r) => Ok(*r),
        Err(e) => Err(anyhow!("{e}")),
    }
}

const RTLD_NOW: c_int = 2;
const RTLD_GLOBAL: c_int = 0x100;

extern "C" {
    fn dlopen(filename: *const c_char, flags: c_int) -> *mut c_void;
    fn dlsym(handle: *mut c_void, symbol: *const c_char) -> *mut c_void;
    fn dlerror() -> *mut c_char;
}

/// The dynamic loader's last error message.
pub fn last_dl_error() -> String {
    // SAFETY: dlerror returns NULL or a NUL-terminated string owned by libc.
    unsafe {
        let e = dlerror();
        if e.is_null() {
            "unknown error".into()
        } else {
            CStr::from_ptr(e).to_string_lossy().into_owned()
        }
    }
}

fn from_prelude() -> std::result::Result<&'static dyn Runtime, String> {
    let Some(path) = std::env::var_os(PRELUDE_DYLIB_ENV) else {
        return Err(format!(
            "trainbook's engine is not loaded in this process. In a program, depend on the \
             `trainbook` crate (not only `trainbook-api`) and use it; in a notebook, use the \
             trainbook kernel (it sets {PRELUDE_DYLIB_ENV})"
        ));
    };
    let shown = Path::new(&path).display().to_string();
    let c_path = CString::new(path.as_encoded_bytes())
        .map_err(|_| format!("{PRELUDE_DYLIB_ENV} has a NUL byte"))?;
    // SAFETY: loading the prelude library runs its initialisers, which only register its
    // runtime; the symbols are checked below before use.
    unsafe {
        let handle = dlopen(c_path.as_ptr(), RTLD_NOW | RTLD_GLOBAL);
        if handle.is_null() {
            return Err(format!(
                "cannot load trainbook's prelude library {shown}: {}. Rebuild it with `make \
                 build` and restart the kernel",
                last_dl_error()
            ));
        }
        let sym = |name: &str| {
            let c = CString::new(name).expect("symbol names have no NUL");
            let p = dlsym(handle, c.as_ptr());
            if p.is_null() {
                Err(format!(
                    "trainbook's prelude library {shown} has no symbol {name} ({}): it is \
                     from another version of trainbook; rebuild it with `make build` and \
                     restart the kernel",
                    last_dl_error()
                ))
            } else {
                Ok(p)
            }
        };
        let fingerprint: extern "C" fn() -> *const c_char =
            std::mem::transmute(sym(PRELUDE_FINGERPRINT_SYMBOL)?);
        let theirs = CStr::from_ptr(fingerprint());
        let ours = self::fingerprint();
        if theirs != ours {
            return Err(format!(
                "trainbook's prelude library {shown} was built with another build of \
                 trainbook-api than this kernel's cells compile against ({theirs:?} vs \
                 {ours:?}): rebuild with `make build` and restart the kernel"
            ));
        }
        let get: fn() -> &'static dyn Runtime = std::mem::transmute(sym(PRELUDE_RUNTIME_SYMBOL)?);
        Ok(get())
    }
}
