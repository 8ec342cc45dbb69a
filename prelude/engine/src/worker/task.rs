//! Recipes written by users: a [`Task`] defined in a notebook cell or in the user's own program,
//! trained by exec'd workers like the built-in recipes.
//!
//! Why code can travel this way: a worker must run the user's code, but workers are exec'd
//! processes (never forks of a process that holds libtorch), so the code cannot be handed over
//! in memory. What travels is an address. The launching process takes the address of
//! [`build::<T>`](build), the one function that turns the task's configuration (JSON) into a
//! [`Recipe`], and maps it with `dladdr` to the file it lives in and its offset there: a cell's
//! shared library (evcxr compiles each cell into `libcode_N.so`, re-emitting every earlier item,
//! so the latest definitions are in the latest library) or the user's executable. The worker
//! loads that same file (cells) or *is* that file (a program that re-executes itself, as torch's
//! `spawn` does), adds the offset to where the file was loaded, and calls it.
//!
//! That is only sound if the worker runs the very bytes the launcher looked at, with the very
//! types of this crate: the file's size and modification time travel with the address and are
//! checked first (a cell library deleted with its kernel, a rebuilt program: a clear error,
//! never a jump into other code), and cell libraries are loaded by `trainbook-cell-worker`,
//! which links the same trainbook_torch library as the cells, so each process holds one copy of
//! trainbook's statics.

use std::ffi::{c_char, c_int, c_void, CStr, CString};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};

use anyhow::{anyhow, bail, Context, Result};
use serde::{de::DeserializeOwned, Deserialize, Serialize};
use tch::nn;

use crate::shared::env;
use crate::worker::device::Device;
use crate::worker::recipe::{Recipe, Split, Step};

use trainbook_api::{Hyper, JobKind, JobSpec, OptimizerKind};

/// The key of the task in a job's recipe options.
const OPTION: &str = "task";

/// A training task written by the user: its model, its data and its loss.
///
/// The value itself is the task's configuration: it is serialised (JSON) when the job is
/// launched and deserialised in every worker, which then calls [`Task::setup`] once and
/// [`Task::step`] per batch. The engine does the rest as for the built-in recipes: sharding,
/// gradient all-reduce, the optimizer and schedule, evaluation, checkpoints and events.
pub trait Task: Serialize + DeserializeOwned + 'static {
    /// What a worker builds once: the model (its parameters created under `vars`) and the data
    /// it reads.
    type State;

    /// Builds the model under `vars` (seeded: every rank builds the same one, and rank 0's
    /// parameters are broadcast anyway) and loads the data. Runs in each worker.
    fn setup(&self, vars: &nn::Path, setup: &Setup) -> Result<Self::State>;

    /// Samples in a split; evaluation runs when the eval split is not empty. Every rank sees
    /// the whole split here: the engine gives each rank its own indices.
    fn len(&self, state: &Self::State, split: Split) -> usize;

    /// The loss (and, optionally, predictions for accuracy/F1 and named metrics) for the
    /// samples `batch.indices` of `batch.split`. Put tensors on `batch.device`.
    fn step(&self, state: &Self::State, batch: &Batch) -> Result<Step>;
}

/// Where a worker's task is built.
pub struct Setup<'a> {
    pub rank: usize,
    pub world_size: usize,
    /// The worker's device (`device.put(&t)` moves a tensor there; `device.tch()` is the tch
    /// device, where tch has one).
    pub device: Device,
    /// The job's resolved hyper-parameters (seed, dropout, data, model, ...).
    pub hyper: &'a Hyper,
    log: &'a dyn Fn(String),
}

impl Setup<'_> {
    /// Sends a line to the job's log (shown in the live view, de-duplicated across workers).
    pub fn log(&self, line: impl Into<String>) {
        (self.log)(line.into())
    }
}

/// The samples of one forward pass.
pub struct Batch<'a> {
    pub split: Split,
    /// Indices into the split (this rank's share of the global batch).
    pub indices: &'a [usize],
    /// True in training (dropout on), false in evaluation (which runs without gradients).
    pub train: bool,
    pub device: Device,
}

/// A [`Task`] as the engine's [`Recipe`].
struct TaskRecipe<T: Task> {
    task: T,
    state: T::State,
    vs: nn::VarStore,
    device: Device,
}

impl<T: Task> Recipe for TaskRecipe<T> {
    fn vars(&self) -> &nn::VarStore {
        &self.vs
    }
    fn vars_mut(&mut self) -> &mut nn::VarStore {
        &mut self.vs
    }
    fn train_len(&self) -> usize {
        self.task.len(&self.state, Split::Train)
    }
    fn eval_len(&self) -> usize {
        self.task.len(&self.state, Split::Eval)
    }
    fn step(&self, split: Split, indices: &[usize], train: bool) -> Result<Step> {
        let batch = Batch {
            split,
            indices,
            train,
            device: self.device,
        };
        catch_panic(|| self.task.step(&self.state, &batch))
    }
}

/// What a worker calls to build a task (see the module docs): the task's configuration, the
/// job's hyper-parameters, the device and the log.
pub(crate) type BuildTask =
    fn(&serde_json::Value, &Hyper, Device, &dyn Fn(String), &WorkerRank) -> Result<Box<dyn Recipe>>;

/// A worker's place in its job.
#[derive(Clone, Copy, Debug)]
pub(crate) struct WorkerRank {
    pub rank: usize,
    pub world_size: usize,
}

/// Builds `T` from its configuration in a worker; the function whose address travels.
pub(crate) fn build<T: Task>(
    config: &serde_json::Value,
    hyper: &Hyper,
    device: Device,
    log: &dyn Fn(String),
    place: &WorkerRank,
) -> Result<Box<dyn Recipe>> {
    let task: T = serde_json::from_value(config.clone()).with_context(|| {
        format!(
            "the configuration of task {} does not read back: {config}",
            std::any::type_name::<T>()
        )
    })?;
    tch::manual_seed(hyper.seed as i64);
    let mut vs = device.var_store();
    let setup = Setup {
        rank: place.rank,
        world_size: place.world_size,
        device,
        hyper,
        log,
    };
    let state = catch_panic(|| task.setup(&vs.root(), &setup))?;
    if vs.variables().is_empty() {
        bail!(
            "{}::setup created no parameters under `vars`: build the model with the path it is \
             given (e.g. `nn::linear(vars / \"fc\", 784, 10, Default::default())`)",
            std::any::type_name::<T>()
        );
    }
    device.place_vars(&mut vs)?;
    Ok(Box::new(TaskRecipe {
        task,
        state,
        vs,
        device,
    }))
}

/// Runs [`Task::setup`] as a one-process job on the CPU would (to load a trained task).
pub fn setup_on_cpu<T: Task>(task: &T, vars: &nn::Path, hyper: &Hyper) -> Result<T::State> {
    let log = |line: String| eprintln!("{line}");
    let setup = Setup {
        rank: 0,
        world_size: 1,
        device: Device::Cpu,
        hyper,
        log: &log,
    };
    catch_panic(|| task.setup(vars, &setup))
}

/// Runs user code, turning a panic into an error that names where it happened.
fn catch_panic<R>(f: impl FnOnce() -> Result<R>) -> Result<R> {
    match std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)) {
        Ok(r) => r,
        Err(payload) => {
            let message = panic_text(payload.as_ref());
            let place = LAST_PANIC
                .with(|p| p.borrow_mut().take())
                .map(|p| format!(" at {p}"))
                .unwrap_or_default();
            Err(anyhow!("the task panicked{place}: {message}"))
        }
    }
}

/// A panic's message.
pub(crate) fn panic_text(payload: &(dyn std::any::Any + Send)) -> String {
    payload
        .downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| payload.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "a panic with a non-text payload".into())
}

thread_local! {
    /// Where the last panic of this thread happened (set by [`install_panic_hook`]).
    static LAST_PANIC: std::cell::RefCell<Option<String>> = const { std::cell::RefCell::new(None) };
}

/// Records each panic's location (and, for a notebook cell, its line of code) for
/// [`catch_panic`], then reports it as before.
pub(crate) fn install_panic_hook() {
    let previous = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        if let Some(l) = info.location() {
            let code = cell_source_line(l.file(), l.line())
                .map(|c| format!(" (`{}`)", c.trim()))
                .unwrap_or_default();
            let place = format!("{}:{}:{}{code}", l.file(), l.line(), l.column());
            LAST_PANIC.with(|p| *p.borrow_mut() = Some(place));
        }
        previous(info)
    }));
}

/// The line of a notebook cell's generated source (`src/lib.rs` of evcxr's build directory,
/// which the worker knows from the cell library it loaded).
fn cell_source_line(file: &str, line: u32) -> Option<String> {
    if Path::new(file).is_absolute() {
        return None;
    }
    let dir = CELL_BUILD_DIR.get()?;
    let text = std::fs::read_to_string(dir.join(file)).ok()?;
    text.lines()
        .nth(line.checked_sub(1)? as usize)
        .map(str::to_string)
}

static CELL_BUILD_DIR: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();

/// Where a function lives: a file and an offset in it, and the file's identity.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct EntryPoint {
    /// The shared library or executable holding the function.
    pub file: PathBuf,
    /// The function's address minus the file's load address.
    pub offset: u64,
    /// The file's size and modification time (ns since the epoch) when the job was launched.
    pub size: u64,
    pub modified_ns: u128,
    /// True when `file` is the launching program itself (workers re-execute it).
    pub executable: bool,
    /// The task's type, for messages.
    pub type_name: String,
}

#[repr(C)]
struct DlInfo {
    dli_fname: *const c_char,
    dli_fbase: *mut c_void,
    dli_sname: *const c_char,
    dli_saddr: *mut c_void,
}

/// The first field of glibc's `struct link_map`: the object's load address.
#[repr(C)]
struct LinkMap {
    l_addr: usize,
}

const RTLD_NOW: c_int = 2;
const RTLD_DI_LINKMAP: c_int = 2;

extern "C" {
    fn dladdr(addr: *const c_void, info: *mut DlInfo) -> c_int;
    fn dlopen(filename: *const c_char, flags: c_int) -> *mut c_void;
    fn dlinfo(handle: *mut c_void, request: c_int, info: *mut c_void) -> c_int;
}

/// The file holding `addr` and the address that file was loaded at.
fn file_of(addr: *const c_void) -> Result<(PathBuf, usize)> {
    let mut info = DlInfo {
        dli_fname: std::ptr::null(),
        dli_fbase: std::ptr::null_mut(),
        dli_sname: std::ptr::null(),
        dli_saddr: std::ptr::null_mut(),
    };
    // SAFETY: dladdr only reads the loader's tables; `info` is a valid out-parameter.
    if unsafe { dladdr(addr, &mut info) } == 0 || info.dli_fname.is_null() {
        bail!("cannot tell which file holds the code at {addr:p} (dladdr failed)");
    }
    // SAFETY: dli_fname is a NUL-terminated path owned by the loader.
    let name = unsafe { CStr::from_ptr(info.dli_fname) }
        .to_string_lossy()
        .into_owned();
    // The main program is reported by its argv[0], which may be relative or a bare name.
    let is_program = std::env::args_os()
        .next()
        .is_some_and(|a| a == name.as_str())
        || std::fs::canonicalize(&name).ok() == program();
    let file = match is_program {
        true => program().ok_or_else(|| anyhow!("cannot locate this program's executable"))?,
        false => std::fs::canonicalize(&name).with_context(|| format!("resolving {name}"))?,
    };
    Ok((file, info.dli_fbase as usize))
}

/// This program's executable, canonical.
fn program() -> Option<PathBuf> {
    std::env::current_exe()
        .ok()
        .and_then(|e| std::fs::canonicalize(e).ok())
}

fn identity(file: &Path) -> Result<(u64, u128)> {
    let m = std::fs::metadata(file).with_context(|| format!("reading {}", file.display()))?;
    let modified = m
        .modified()
        .ok()
        .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
        .map_or(0, |d| d.as_nanos());
    Ok((m.len(), modified))
}

/// Whether the user's program called `trainbook::worker_hook()` (see [`mark_hooked`]).
static HOOKED: AtomicBool = AtomicBool::new(false);

/// Records that this program re-executes itself as workers when asked to.
pub fn mark_hooked() {
    HOOKED.store(true, Ordering::SeqCst);
}

impl EntryPoint {
    /// Where [`build::<T>`](build) lives in this process.
    pub(crate) fn of<T: Task>() -> Result<EntryPoint> {
        let f: BuildTask = build::<T>;
        let addr = f as *const c_void;
        let (file, base) = file_of(addr)?;
        let (size, modified_ns) = identity(&file)?;
        Ok(EntryPoint {
            executable: program().as_deref() == Some(file.as_path()),
            file,
            offset: (addr as usize - base) as u64,
            size,
            modified_ns,
            type_name: std::any::type_name::<T>().to_string(),
        })
    }

    /// The program workers run, and what they need in their environment.
    pub(crate) fn worker_program(&self) -> Result<(PathBuf, Vec<(String, String)>)> {
        if self.executable {
            if !HOOKED.load(Ordering::SeqCst) {
                bail!(
                    "task {} is defined in this program, which must run as its own workers: call \
                     `trainbook::worker_hook();` as the first line of `main`",
                    self.type_name
                );
            }
            return Ok((
                self.file.clone(),
                vec![(env::WORKER_MAIN.into(), "1".into())],
            ));
        }
        // A cell library: the worker program sits beside the library holding this engine.
        let (engine, _) = file_of(mark_hooked as *const c_void)?;
        let program = engine.with_file_name(env::CELL_WORKER);
        if !program.is_file() {
            bail!(
                "cannot find {} next to {}: build it with `make build` (scripts/build-torch-library.sh), \
                 then restart the kernel",
                program.display(),
                engine.display()
            );
        }
        Ok((program, Vec::new()))
    }

    /// The function in this process, after checking the file is the one the launcher saw.
    fn resolve(&self) -> Result<BuildTask> {
        let stale = |why: String| {
            anyhow!(
                "the code of task {} is gone: {why}. Run the cell that defines the task again \
                 (or rebuild the program), then launch again",
                self.type_name
            )
        };
        let (size, modified) = identity(&self.file).map_err(|e| stale(format!("{e:#}")))?;
        if (size, modified) != (self.size, self.modified_ns) {
            return Err(stale(format!(
                "{} changed since the job was launched",
                self.file.display()
            )));
        }
        let base = if self.executable {
            let (_, base) = file_of(mark_hooked as *const c_void)?;
            base
        } else {
            let c = CString::new(self.file.as_os_str().as_encoded_bytes())
                .context("the library path has a NUL byte")?;
            // SAFETY: loading a cell library runs no user code (cells have no initialisers);
            // its dependencies (libstd, the trainbook_torch library) are already loaded.
            let handle = unsafe { dlopen(c.as_ptr(), RTLD_NOW) };
            if handle.is_null() {
                return Err(stale(format!(
                    "cannot load {}: {}",
                    self.file.display(),
                    trainbook_api::plumbing::ports::last_dl_error()
                )));
            }
            let mut map: *const LinkMap = std::ptr::null();
            // SAFETY: RTLD_DI_LINKMAP writes a `struct link_map *` into `map`.
            let r = unsafe {
                dlinfo(
                    handle,
                    RTLD_DI_LINKMAP,
                    &mut map as *mut *const LinkMap as *mut c_void,
                )
            };
            if r != 0 || map.is_null() {
                bail!(
                    "cannot find where {} was loaded: {}",
                    self.file.display(),
                    trainbook_api::plumbing::ports::last_dl_error()
                );
            }
            if let Some(build_dir) = self
                .file
                .ancestors()
                .find(|d| d.join("src/lib.rs").is_file())
            {
                let _ = CELL_BUILD_DIR.set(build_dir.to_path_buf());
            }
            // SAFETY: `map` points to the loader's link_map for the handle.
            unsafe { (*map).l_addr }
        };
        let addr = base + self.offset as usize;
        // SAFETY: the file is the one the launcher mapped (same size and mtime), loaded in a
        // process with the same engine build, and the offset is that of `build::<T>` there, whose
        // signature is `BuildTask`.
        Ok(unsafe { std::mem::transmute::<usize, BuildTask>(addr) })
    }
}

/// What a task job carries in its recipe options.
#[derive(Clone, Debug, Serialize, Deserialize)]
struct Carried {
    entry: EntryPoint,
    config: serde_json::Value,
}

/// A job spec that trains `task`. A task that cannot be located or serialised gives a spec that
/// fails, with the reason, when it is planned or launched (where errors are reported).
pub fn job_spec<T: Task>(task: &T) -> JobSpec {
    let carried = EntryPoint::of::<T>().and_then(|entry| {
        let config = serde_json::to_value(task).with_context(|| {
            format!("serialising the configuration of task {}", entry.type_name)
        })?;
        Ok(serde_json::to_value(Carried { entry, config })?)
    });
    let mut spec = JobSpec::of_kind(JobKind::Task);
    match carried {
        Ok(v) => spec.options.insert(OPTION.into(), v),
        Err(e) => spec.options.insert(ERROR.into(), format!("{e:#}").into()),
    };
    spec
}

/// The fields of a task job's task (its configuration as JSON), for a sweep that sets them by
/// name; `None` for other jobs, or a task that is not a JSON object.
pub(crate) fn task_fields(
    spec: &mut JobSpec,
) -> Option<&mut serde_json::Map<String, serde_json::Value>> {
    if spec.kind != JobKind::Task {
        return None;
    }
    spec.options
        .get_mut(OPTION)?
        .get_mut("config")?
        .as_object_mut()
}

/// The key under which [`job_spec`] leaves its error.
const ERROR: &str = "task_error";

fn carried(options: &serde_json::Map<String, serde_json::Value>) -> Result<Carried> {
    if let Some(e) = options.get(ERROR) {
        bail!("{}", e.as_str().unwrap_or_default());
    }
    let value = options
        .get(OPTION)
        .ok_or_else(|| anyhow!("a task job needs its task: start it with `Trainer::new(task)`"))?;
    serde_json::from_value(value.clone()).context("reading the job's task")
}

/// A task job's hyper-parameters: one epoch, global batch 32, AdamW at 1e-3, dropout 0 (the
/// task's own model decides), with the job's options on top.
pub(crate) fn preset(spec: &JobSpec) -> Result<Hyper> {
    let task = carried(&spec.options)?;
    if let Some(k) = spec.options.keys().find(|k| *k != OPTION) {
        bail!("a task job has no option '{k}': put the task's settings in the task value");
    }
    let mut h = Hyper::new("task", 1, 32, 1e-3, OptimizerKind::Adamw);
    h.dropout = 0.0;
    h.recipe_options
        .insert(OPTION.into(), serde_json::to_value(task)?);
    Ok(h)
}

/// The program workers of a task job run (see [`EntryPoint::worker_program`]).
pub(crate) fn worker_program(spec: &JobSpec) -> Result<(PathBuf, Vec<(String, String)>)> {
    carried(&spec.options)?.entry.worker_program()
}

/// Builds a task job's recipe in a worker.
pub(crate) fn build_in_worker(
    hyper: &Hyper,
    device: Device,
    log: &dyn Fn(String),
    place: &WorkerRank,
) -> Result<Box<dyn Recipe>> {
    let task = carried(&hyper.recipe_options)?;
    install_panic_hook();
    let build = task.entry.resolve()?;
    build(&task.config, hyper, device, log, place)
}
