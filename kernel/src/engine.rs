//! The evaluation engine: one thread that owns evcxr's `CommandContext`.
//!
//! evcxr compiles each cell and runs it in a child process (this same executable, which calls
//! `evcxr::runtime_hook()` first). The context is not thread-safe and a cell blocks it while it
//! runs, so it lives on its own thread and the Jupyter handlers talk to it through a queue;
//! interrupts and shutdown never wait for it (see `kernel.rs`).

use crate::analysis::{self, Analyzer};
use crate::cell_libs::{CellLibs, init_code};
use crate::completion::{Match, insert_text};
use crate::iopub::Publisher;
use crate::scan;
use crate::toolchain::Toolchain;
use crate::verdict;
use anyhow::{Context, Result};
use evcxr::{CommandContext, EvalContext, EvalContextOutputs};
use serde_json::{Map, Value};
use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::{Child, Command};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, mpsc};
use std::time::{Duration, Instant};
use tokio::sync::oneshot;

/// What a cell produced.
#[derive(Debug)]
pub enum Outcome {
    /// The cell ran; `data` is its result's MIME bundle (empty when it has no value).
    Ok { data: Map<String, Value> },
    /// Compile error, runtime error, interrupt or lost process.
    Error {
        ename: String,
        evalue: String,
        traceback: Vec<String>,
    },
}

pub struct Completion {
    pub matches: Vec<Match>,
    /// Byte offsets into the code.
    pub start: usize,
    pub end: usize,
}

enum Request {
    Execute {
        code: String,
        reply: oneshot::Sender<Outcome>,
    },
    Complete {
        code: String,
        cursor: usize,
        reply: oneshot::Sender<Option<Completion>>,
    },
    Inspect {
        code: String,
        cursor: usize,
        reply: oneshot::Sender<Option<(String, String)>>,
    },
}

/// State the interrupt and shutdown paths read while the engine thread is busy.
#[derive(Default)]
pub struct EngineState {
    /// Id of the execution now running (0: none).
    pub executing: AtomicU64,
    /// The execution an interrupt was sent for, and the one whose process was killed.
    pub interrupted: AtomicU64,
    pub killed: AtomicU64,
    /// evcxr's handle to the cell process; stays valid across its restarts.
    child: Mutex<Option<Arc<Mutex<Child>>>>,
}

impl EngineState {
    pub fn child_pid(&self) -> Option<u32> {
        let handle = self.child.lock().ok()?.clone()?;
        let child = handle.lock().ok()?;
        Some(child.id())
    }

    /// SIGKILL for the cell process (its jobs' workers follow through their death signal).
    pub fn kill_child(&self) {
        let handle = self.child.lock().ok().and_then(|h| h.clone());
        if let Some(handle) = handle
            && let Ok(mut child) = handle.lock()
        {
            let _ = child.kill();
        }
    }
}

#[derive(Clone)]
pub struct Engine {
    tx: mpsc::Sender<Request>,
    pub state: Arc<EngineState>,
}

/// Environment for the cell process.
pub struct ChildSetup {
    pub prelude: Option<CellLibs>,
    pub toolchain: Option<Toolchain>,
    pub channel_socket: PathBuf,
    /// Where the trainbook-aware analyzer keeps its crate (`analysis.rs`); None: no analyzer.
    pub analysis_dir: Option<PathBuf>,
}

impl Engine {
    /// Starts the engine thread; the context is created there (it takes a few seconds) while the
    /// kernel already answers on its sockets. Requests queue until it is ready.
    pub fn start(setup: ChildSetup, publisher: Publisher) -> Engine {
        let (tx, rx) = mpsc::channel();
        let state = Arc::new(EngineState::default());
        let st = state.clone();
        std::thread::Builder::new()
            .name("engine".into())
            .spawn(move || run(setup, publisher, st, rx))
            .expect("spawning the engine thread");
        Engine { tx, state }
    }

    pub async fn execute(&self, code: String) -> Outcome {
        let (reply, rx) = oneshot::channel();
        if self.tx.send(Request::Execute { code, reply }).is_err() {
            return engine_gone();
        }
        rx.await.unwrap_or_else(|_| engine_gone())
    }

    pub async fn complete(&self, code: String, cursor: usize) -> Option<Completion> {
        let (reply, rx) = oneshot::channel();
        self.tx
            .send(Request::Complete {
                code,
                cursor,
                reply,
            })
            .ok()?;
        rx.await.ok().flatten()
    }

    pub async fn inspect(&self, code: String, cursor: usize) -> Option<(String, String)> {
        let (reply, rx) = oneshot::channel();
        self.tx
            .send(Request::Inspect {
                code,
                cursor,
                reply,
            })
            .ok()?;
        rx.await.ok().flatten()
    }
}

/// What a cell that uses polars gets: `*_df()`, `DataFrame`, `polars` (`trainbook::frames`).
const FRAMES_IMPORT: &str = "use trainbook_torch::frames::*;";

/// Whether a cell uses polars: a `*_df()` method, the `DataFrame` type or the crate.
fn uses_polars(code: &str) -> bool {
    code.contains("_df(") || code.contains("DataFrame") || code.contains("polars")
}

fn engine_gone() -> Outcome {
    Outcome::Error {
        ename: "KernelError".into(),
        evalue: "the evaluation engine stopped; restart the kernel".into(),
        traceback: vec!["the evaluation engine stopped; restart the kernel".into()],
    }
}

/// Replies to every request with the engine's start-up error (it could not start at all).
fn refuse_all(rx: mpsc::Receiver<Request>, msg: &str) {
    for req in rx {
        match req {
            Request::Execute { reply, .. } => {
                let _ = reply.send(Outcome::Error {
                    ename: "KernelError".into(),
                    evalue: msg.to_string(),
                    traceback: vec![msg.to_string()],
                });
            }
            Request::Complete { reply, .. } => drop(reply.send(None)),
            Request::Inspect { reply, .. } => drop(reply.send(None)),
        }
    }
}

fn run(
    setup: ChildSetup,
    publisher: Publisher,
    state: Arc<EngineState>,
    rx: mpsc::Receiver<Request>,
) {
    let t0 = Instant::now();
    let (ctx, outputs) = match create_context(&setup) {
        Ok(x) => x,
        Err(e) => {
            let msg = format!("the Rust engine failed to start: {e:#}");
            eprintln!("trainbook-kernel: {msg}");
            refuse_all(rx, &msg);
            return;
        }
    };
    *state.child.lock().unwrap_or_else(|e| e.into_inner()) = Some(ctx.process_handle());
    let drains = Drains::start(outputs, publisher.clone());
    let has_prelude = setup.prelude.is_some();
    drains.flush();
    timing("engine ready after", t0);
    let analysis = match (&setup.analysis_dir, has_prelude) {
        (Some(dir), true) => Analysis::start(dir.clone()),
        _ => Analysis::Off,
    };
    let mut session = Session {
        ctx,
        publisher,
        state,
        drains,
        analysis,
        has_prelude,
        prelude_pending: has_prelude,
        question_marks: false,
        frames_pending: true,
        next_id: 1,
        t0,
    };

    // A cell that is already waiting (a headless run sends its first cell at once) goes first,
    // compiled together with the prelude's init; otherwise the idle engine loads the prelude
    // and warms rust-analyzer up for the user's first `let`.
    let first = match rx.try_recv() {
        Ok(req) => Some(req),
        Err(mpsc::TryRecvError::Empty) => {
            session.load_prelude_now("");
            session.drains.flush();
            warm_up_analyzer(&mut session.ctx);
            None
        }
        Err(mpsc::TryRecvError::Disconnected) => return,
    };
    for req in first.into_iter().chain(rx) {
        if session.prelude_pending && !matches!(req, Request::Execute { .. }) {
            session.init("");
            session.prelude_pending = false;
        }
        match req {
            Request::Execute { code, reply } => {
                let _ = reply.send(session.execute(&code));
            }
            Request::Complete {
                code,
                cursor,
                reply,
            } => {
                let _ = reply.send(session.complete(&code, cursor));
            }
            Request::Inspect {
                code,
                cursor,
                reply,
            } => {
                let _ = reply.send(session.inspect(&code, cursor));
            }
        }
    }
}

/// The engine thread's evaluation context and what it remembers between cells.
struct Session {
    ctx: CommandContext,
    publisher: Publisher,
    state: Arc<EngineState>,
    drains: Drains,
    analysis: Analysis,
    has_prelude: bool,
    /// The prelude's init has not run yet (the first cell may carry it).
    prelude_pending: bool,
    /// evcxr's `?` support is on.
    question_marks: bool,
    /// The DataFrame import has not been compiled yet.
    frames_pending: bool,
    next_id: u64,
    t0: Instant,
}

impl Session {
    /// Runs the prelude's init; `extra` is code compiled with it (the init is a cell, and each
    /// cell a compile).
    fn init(&mut self, extra: &str) {
        if self.has_prelude
            && let Err(e) = self.ctx.execute(&format!("{}{extra}", init_code()))
        {
            self.publisher.kernel_note(&format!(
                "trainbook: the prelude did not load, so `use trainbook::prelude::*` is not in \
                 scope: {e}\n"
            ));
        }
    }

    /// The prelude's init on its own, now.
    fn load_prelude_now(&mut self, extra: &str) {
        self.init(extra);
        self.prelude_pending = false;
        timing("prelude ready after", self.t0);
    }

    /// One cell: what it needs switched on first (`?`, the DataFrame import, the prelude),
    /// its evaluation, and how it ended.
    fn execute(&mut self, code: &str) -> Outcome {
        let id = self.next_id;
        self.next_id += 1;
        let uses_question_marks = !question_mark_lines(code).is_empty();
        // The first cell and the prelude's init in one compile (they would be two).
        // Not with `?` in the cell: evcxr's retry that turns `?` on would drop its
        // value's rich display (see below); that cell gets init plus the switch.
        let merged = self.prelude_pending && !uses_question_marks;
        if self.prelude_pending && !merged {
            self.load_prelude_now("\nOk::<(), std::fmt::Error>(())?;");
            self.question_marks = true;
        }
        if !self.question_marks && uses_question_marks {
            // evcxr turns on `?` in cells the first time one fails to compile, and when
            // that `?` is in the cell's final expression it also drops the value's rich
            // display (`result.epochs()?` would show as text, not as a table). Turning
            // it on just before the first cell that uses `?` costs what evcxr's own
            // retry would, and nothing at start-up.
            let _ = self.ctx.execute("Ok::<(), std::fmt::Error>(())?;");
            self.question_marks = true;
        }
        if self.frames_pending && uses_polars(code) {
            // The DataFrame methods and types live in the trainbook_torch library itself
            // (`trainbook_torch`), which a cell that names it compiles against in full:
            // imported once, for the first cell that wants them, so the others keep
            // the light compile.
            self.frames_pending = self.ctx.execute(FRAMES_IMPORT).is_err();
        }
        self.state.executing.store(id, Ordering::SeqCst);
        let result = if merged {
            self.execute_with_prelude(code)
        } else {
            crate::infer::execute(&mut self.ctx, code, self.analysis.ready())
        };
        self.state.executing.store(0, Ordering::SeqCst);
        self.drains.flush();
        let interrupted = self.state.interrupted.load(Ordering::SeqCst) == id;
        let killed = self.state.killed.load(Ordering::SeqCst) == id;
        let restarted = matches!(result, Err(evcxr::Error::SubprocessTerminated(_)));
        let ctx = &mut self.ctx;
        let outcome = to_outcome(code, result, interrupted, killed, || ctx.last_source().ok());
        if restarted {
            // evcxr has started a fresh process; give it the prelude and kernel link.
            self.init("");
            self.frames_pending = true;
            self.drains.flush();
        }
        outcome
    }

    /// The first cell compiled together with the prelude's init.
    fn execute_with_prelude(&mut self, code: &str) -> Result<evcxr::EvalOutputs, evcxr::Error> {
        self.prelude_pending = false;
        let both = format!("{}\n{code}", init_code());
        let result = crate::infer::execute(&mut self.ctx, &both, self.analysis.ready());
        timing("prelude ready after", self.t0);
        // Nothing ran (it did not compile): the prelude alone, then the cell alone,
        // so its errors are reported against its own lines.
        if matches!(
            result,
            Err(evcxr::Error::CompilationErrors(_) | evcxr::Error::Message(_))
        ) {
            self.init("");
            crate::infer::execute(&mut self.ctx, code, self.analysis.ready())
        } else {
            result
        }
    }

    fn complete(&mut self, code: &str, cursor: usize) -> Option<Completion> {
        let ctx = &mut self.ctx;
        self.analysis
            .get()
            .and_then(|a| trainbook_completions(ctx, a, code, cursor))
            .or_else(|| {
                let c = ctx.completions(code, cursor).ok()?;
                Some(Completion {
                    matches: c
                        .completions
                        .into_iter()
                        .map(|c| Match {
                            text: insert_text(&c.code).to_string(),
                            kind: c.kind,
                            signature: c.label,
                        })
                        .collect(),
                    start: c.start_offset,
                    end: c.end_offset,
                })
            })
    }

    fn inspect(&mut self, code: &str, cursor: usize) -> Option<(String, String)> {
        let ctx = &mut self.ctx;
        self.analysis
            .get()
            .and_then(|a| trainbook_hover(ctx, a, code, cursor))
            .or_else(|| ctx.hover_at(code, cursor).ok())
    }
}

/// The trainbook-aware analyzer (`analysis.rs`): loading on its own thread, ready, or off.
enum Analysis {
    Loading(std::thread::JoinHandle<Option<Analyzer>>),
    Ready(Box<Analyzer>),
    Off,
}

impl Analysis {
    /// `TRAINBOOK_KERNEL_ANALYZER=off` keeps it off (it holds a few hundred MB).
    fn start(dir: PathBuf) -> Analysis {
        if std::env::var("TRAINBOOK_KERNEL_ANALYZER").is_ok_and(|v| v == "off") {
            return Analysis::Off;
        }
        let Some(api) = analysis::api_sources() else {
            return Analysis::Off;
        };
        let spawned = std::thread::Builder::new()
            .name("analysis".into())
            .spawn(move || {
                // Behind the cells, which share these cores.
                unsafe { libc::setpriority(libc::PRIO_PROCESS, 0, 10) };
                let t = Instant::now();
                let lock = analysis::lock_file(&api);
                match Analyzer::load(&dir, &api, lock.as_deref()) {
                    Ok(a) => {
                        timing("trainbook analyzer loaded in", t);
                        Some(a)
                    }
                    Err(e) => {
                        eprintln!(
                            "trainbook-kernel: completion and types will not know trainbook: {e:#}"
                        );
                        None
                    }
                }
            });
        match spawned {
            Ok(handle) => Analysis::Loading(handle),
            Err(_) => Analysis::Off,
        }
    }

    /// The analyzer, waiting for it if it is still loading.
    fn get(&mut self) -> Option<&mut Analyzer> {
        if let Analysis::Loading(_) = self {
            let Analysis::Loading(handle) = std::mem::replace(self, Analysis::Off) else {
                unreachable!()
            };
            if let Ok(Some(a)) = handle.join() {
                *self = Analysis::Ready(Box::new(a));
            }
        }
        match self {
            Analysis::Ready(a) => Some(a),
            _ => None,
        }
    }

    /// The analyzer if it has loaded; a cell never waits for it.
    fn ready(&mut self) -> Option<&mut Analyzer> {
        match self {
            Analysis::Loading(h) if h.is_finished() => self.get(),
            Analysis::Ready(a) => Some(a),
            _ => None,
        }
    }
}

/// Marks the cursor in the cell so it can be found in the source evcxr writes for it.
const CURSOR: &str = "trainbook_cursor_mark";

/// The source evcxr analyses for `code` (earlier variables and items around the cell) and the
/// cursor's offset in it. evcxr writes that source to its crate's `src/lib.rs` when asked for
/// completions; the cursor is marked so it can be found there.
fn analysed_source(ctx: &mut CommandContext, code: &str, cursor: usize) -> Option<(String, usize)> {
    let marked = format!("{}{CURSOR}{}", code.get(..cursor)?, code.get(cursor..)?);
    ctx.completions(&marked, cursor + CURSOR.len()).ok()?;
    let source = ctx.last_source().ok()?;
    let at = source.find(CURSOR)?;
    Some((source.replacen(CURSOR, "", 1), at))
}

fn trainbook_completions(
    ctx: &mut CommandContext,
    analyzer: &mut Analyzer,
    code: &str,
    cursor: usize,
) -> Option<Completion> {
    let (source, at) = analysed_source(ctx, code, cursor)?;
    let c = analyzer.completions(&source, at).ok()?;
    // The replaced text surrounds the cursor, so it maps back by the same distances.
    let start = cursor.checked_sub(at.checked_sub(c.start)?)?;
    let end = cursor + c.end.checked_sub(at)?;
    (end <= code.len()).then_some(Completion {
        matches: c.matches,
        start,
        end,
    })
}

fn trainbook_hover(
    ctx: &mut CommandContext,
    analyzer: &mut Analyzer,
    code: &str,
    cursor: usize,
) -> Option<(String, String)> {
    let (source, at) = analysed_source(ctx, code, cursor)?;
    // Jupyter puts the cursor after the name it asks about.
    analyzer
        .hover(&source, at)
        .or_else(|| analyzer.hover(&source, at.checked_sub(1)?))
}

/// With `TRAINBOOK_KERNEL_TIMING` set, prints how long a start-up step took (on stderr).
fn timing(what: &str, since: Instant) {
    if std::env::var_os("TRAINBOOK_KERNEL_TIMING").is_some() {
        eprintln!(
            "trainbook-kernel: {what} {:.2} s",
            since.elapsed().as_secs_f64()
        );
    }
}

/// evcxr asks rust-analyzer for the types of every cell's new variables. The first question
/// makes it resolve the standard library's names and impls, ~3 s on a 2-core machine, which
/// the notebook's first `let` cell would wait for. A completion query asks the same of it
/// without compiling anything.
fn warm_up_analyzer(ctx: &mut CommandContext) {
    let t = Instant::now();
    let code = "let trainbook_warm_up: Vec<String> = Vec::new();\ntrainbook_warm_up.";
    let _ = ctx.completions(code, code.len());
    timing("analyzer warmed up in", t);
}

/// evcxr's context with the cell flags set and, when there is a prelude, [`init_code`] run
/// (the same compile that applies the flags). A failed init is returned, not fatal.
fn create_context(setup: &ChildSetup) -> Result<(CommandContext, EvalContextOutputs)> {
    let exe = std::env::current_exe().context("cannot locate this executable")?;
    let mut cmd = Command::new(exe);
    cmd.env(trainbook_channel::SOCKET_ENV, &setup.channel_socket)
        .env(crate::verdict::CELL_PROCESS_ENV, "1")
        // anyhow errors would otherwise carry a backtrace (evcxr sets RUST_BACKTRACE=1).
        .env("RUST_LIB_BACKTRACE", "0")
        // The user's own setting, which the cell process puts back (verdict.rs).
        .env(
            verdict::USER_BACKTRACE_ENV,
            std::env::var_os("RUST_BACKTRACE").unwrap_or_default(),
        );
    if let Some(t) = &setup.toolchain {
        t.restore_user_env(&mut cmd);
    }
    if let Some(p) = &setup.prelude {
        let std_dir = setup.toolchain.as_ref().map(|t| t.target_libdir.as_path());
        cmd.env("LD_LIBRARY_PATH", p.library_path(std_dir)?)
            .env("TRAINBOOK_TORCH_DYLIB", &p.dylib);
        if let Some(w) = &p.worker {
            cmd.env("TRAINBOOK_WORKER", w);
        }
    }
    // The cell process (and, through their own death signal, its jobs' workers) must not outlive
    // the kernel, even a SIGKILLed one. The signal follows the spawning thread, which is this
    // long-lived engine thread for the first start and for every restart evcxr does.
    unsafe {
        cmd.pre_exec(|| {
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let t = Instant::now();
    let (mut eval, outputs) = EvalContext::with_subprocess_command(cmd)
        .map_err(|e| anyhow::anyhow!("{e}"))
        .context("evcxr could not start its Rust process")?;
    timing("evcxr context", t);
    let mut state = eval.state();
    // Cells build offline: no registry round trip per cell, and kernels on machines without a
    // network work; `:dep` takes crates from cargo's cache.
    state.set_offline_mode(true);
    // Commits the settings without a compile. The cell flags are in this process's environment
    // already (`toolchain.rs`), so evcxr's first compile used them too.
    eval.eval_with_state("", state)
        .map_err(|e| anyhow::anyhow!("{e}"))?;
    Ok((CommandContext::with_eval_context(eval), outputs))
}

/// `generated`: the source evcxr compiled for the cell, to place a panic on a cell line.
fn to_outcome(
    code: &str,
    result: Result<evcxr::EvalOutputs, evcxr::Error>,
    interrupted: bool,
    killed: bool,
    generated: impl FnOnce() -> Option<String>,
) -> Outcome {
    let error = |ename: &str, evalue: String| Outcome::Error {
        ename: ename.into(),
        traceback: vec![format!("\x1b[0;31m{ename}\x1b[0m: {evalue}")],
        evalue,
    };
    match result {
        _ if killed => error(
            "Interrupted",
            "the cell did not stop within the grace period after the interrupt, so its Rust \
             process was restarted: all variables are lost (trainbook jobs and their workers \
             were stopped). The prelude is loaded again."
                .into(),
        ),
        Ok(_) if interrupted => error(
            "Interrupted",
            "the cell was interrupted: running trainbook jobs were stopped and every variable \
             was kept"
                .into(),
        ),
        Ok(mut out) => match out.content_by_mime_type.remove(verdict::MIME) {
            Some(report) => failed_cell(code, verdict::parse(&report), generated),
            None => Outcome::Ok {
                data: out
                    .content_by_mime_type
                    .into_iter()
                    .map(|(k, v)| (k, Value::String(v)))
                    .collect(),
            },
        },
        Err(evcxr::Error::CompilationErrors(errors)) => compile_error(code, &errors),
        Err(evcxr::Error::SubprocessTerminated(msg)) => error(
            "ProcessDied",
            format!(
                "the Rust process running the cells died, so all variables are lost; the prelude \
                 is loaded again. {msg}"
            ),
        ),
        Err(e) => error("Error", e.to_string()),
    }
}

/// A cell whose `?` returned an error or that panicked: an error reply that names the message
/// and, where it can be told, the cell line that failed.
fn failed_cell(
    code: &str,
    failure: Option<verdict::Failure>,
    generated: impl FnOnce() -> Option<String>,
) -> Outcome {
    let Some(f) = failure else {
        let evalue = "the cell failed (its message is printed above)".to_string();
        return Outcome::Error {
            ename: "Error".into(),
            traceback: vec![format!("\x1b[0;31mError\x1b[0m: {evalue}")],
            evalue,
        };
    };
    let generated = match f.kind {
        verdict::FailureKind::Panic => generated(),
        verdict::FailureKind::Error => None,
    };
    let (ename, place) = match f.kind {
        verdict::FailureKind::Error => ("Error", question_mark_lines(code)),
        verdict::FailureKind::Panic => {
            let line = (f.file.as_deref() == Some("src/lib.rs"))
                .then(|| f.line.and_then(|l| cell_line_of(code, generated.as_deref()?, l)))
                .flatten();
            ("Panic", line.into_iter().collect())
        }
    };
    let message = if f.message.is_empty() {
        match f.kind {
            verdict::FailureKind::Error => "a `?` in the cell returned an error".to_string(),
            verdict::FailureKind::Panic => "the cell panicked".to_string(),
        }
    } else {
        f.message
    };
    let mut traceback: Vec<String> = message
        .lines()
        .enumerate()
        .map(|(i, l)| {
            if i == 0 {
                format!("\x1b[0;31m{ename}\x1b[0m: {l}")
            } else {
                l.to_string()
            }
        })
        .collect();
    let lines: Vec<&str> = code.lines().collect();
    match place.as_slice() {
        [n] => traceback.push(format!("  at cell line {n}: {}", lines[n - 1].trim())),
        [] => match (f.kind, f.file, f.line) {
            (verdict::FailureKind::Panic, Some(file), Some(line)) if file != "src/lib.rs" => {
                traceback.push(format!("  at {file}:{line}"))
            }
            _ => {}
        },
        many => traceback.push(format!(
            "  at one of the `?` on cell lines {}",
            many.iter()
                .map(|n| n.to_string())
                .collect::<Vec<_>>()
                .join(", ")
        )),
    }
    if let Some(trace) = &f.backtrace {
        traceback.extend(backtrace_lines(code, generated.as_deref(), trace));
    }
    Outcome::Error {
        ename: ename.into(),
        evalue: message,
        traceback,
    }
}

/// A panic's backtrace as the user reads it: their own functions and libraries, innermost
/// first, each placed on a cell line where it is in this cell. Cells are compiled without
/// debug info, so their frames have no lines unless the user turned it on; a cell frame
/// without one says nothing the error's `at cell line` does not, and is left out.
fn backtrace_lines(code: &str, generated: Option<&str>, trace: &str) -> Vec<String> {
    let lines: Vec<&str> = code.lines().collect();
    let mut out = Vec::new();
    for frame in verdict::user_frames(trace) {
        let cell_line = match (&frame.at, generated) {
            (Some((file, line)), Some(source)) if file.ends_with("src/lib.rs") => {
                cell_line_of(code, source, *line)
            }
            _ => None,
        };
        let name = if frame.is_cell() {
            "the cell"
        } else {
            frame.function.strip_prefix("ctx::").unwrap_or(&frame.function)
        };
        let entry = match (cell_line, &frame.at) {
            (Some(n), _) => format!("  {name}, cell line {n}: {}", lines[n - 1].trim()),
            (None, _) if frame.is_cell() => continue,
            (None, Some((file, line))) if !file.ends_with("src/lib.rs") => {
                format!("  {name}, {file}:{line}")
            }
            _ => format!("  {name}"),
        };
        if out.last() != Some(&entry) {
            out.push(entry);
        }
    }
    if !out.is_empty() {
        out.insert(0, "backtrace (RUST_BACKTRACE is set), innermost first:".into());
    }
    out
}

/// The 1-based cell lines that hold a `?` operator (outside strings, chars and comments).
fn question_mark_lines(code: &str) -> Vec<usize> {
    let mut lines: Vec<usize> = scan::code(code)
        .iter()
        .filter(|t| t.kind == scan::T![?])
        .map(|t| code[..t.at].matches('\n').count() + 1)
        .collect();
    lines.dedup();
    lines
}

/// The cell line that evcxr's generated source has at `line` (1-based), matched by its text.
fn cell_line_of(code: &str, generated: &str, line: u32) -> Option<usize> {
    let text = generated.lines().nth(line.checked_sub(1)? as usize)?.trim();
    if text.is_empty() {
        return None;
    }
    code.lines()
        .position(|l| same_statement(l.trim(), text))
        .map(|i| i + 1)
}

/// Whether `ran` is the cell's line `written`, possibly with the type the kernel added to its
/// `let` (`let v = f();` runs as `let v: u32 = f();`, see `infer`).
fn same_statement(written: &str, ran: &str) -> bool {
    if written == ran {
        return true;
    }
    let Some(eq) = written.find(" = ").filter(|_| written.starts_with("let ")) else {
        return false;
    };
    let (head, tail) = written.split_at(eq);
    ran.len() > written.len()
        && ran.starts_with(head)
        && ran.ends_with(tail)
        && ran[head.len()..].starts_with(':')
}

/// rustc's diagnostics drawn over the cell's own code (not evcxr's generated wrapper).
fn compile_error(code: &str, errors: &[evcxr::CompilationError]) -> Outcome {
    // An undeclared parameter also leaves rustc unable to type `param!`'s value, which it reports
    // as "`!: Param` is not satisfied": noise next to the hint that says what to fix.
    let undeclared = errors
        .iter()
        .any(|e| undeclared_parameter(code, &e.message()).is_some());
    let errors: Vec<&evcxr::CompilationError> = errors
        .iter()
        .filter(|e| !(undeclared && e.message().contains("Param` is not satisfied")))
        .collect();
    let mut traceback = Vec::new();
    for e in &errors {
        let mut drawn = None;
        if let Some(report) = e.build_report("cell".into(), code.to_string(), evcxr::Theme::Light) {
            let mut buf = Vec::new();
            if report
                .write(("cell".to_string(), ariadne::Source::from(code)), &mut buf)
                .is_ok()
            {
                drawn = Some(String::from_utf8_lossy(&buf).into_owned());
            }
        }
        // ariadne colours every character separately, which makes the text unsearchable in
        // saved notebooks; keep it plain and colour only the headline.
        let text = strip_ansi(&drawn.unwrap_or_else(|| e.rendered()));
        for (i, line) in text.lines().enumerate() {
            traceback.push(if i == 0 {
                format!("\x1b[0;31m{line}\x1b[0m")
            } else {
                line.to_string()
            });
        }
        for help in e.help() {
            traceback.push(format!("help: {help}"));
        }
        if let Some(hint) = undeclared_parameter(code, &e.message()) {
            traceback.push(format!("help: {hint}"));
        }
    }
    let evalue = errors
        .iter()
        .map(|e| {
            let message = e.message();
            match undeclared_parameter(code, &message) {
                Some(hint) => hint,
                None => message,
            }
        })
        .collect::<Vec<_>>()
        .join("; ");
    Outcome::Error {
        ename: "CompileError".into(),
        evalue,
        traceback,
    }
}

/// papermill (and `scripts/notebook.py`) inject parameters as `let NAME =
/// trainbook::param!(NAME = VALUE)?;`, which needs a `NAME` declared by the notebook's
/// parameters cell; when there is none, rustc only says it cannot find the value. This says
/// what the user did wrong and how to fix it.
fn undeclared_parameter(code: &str, message: &str) -> Option<String> {
    let name = message
        .strip_prefix("cannot find value `")?
        .split_once("` in this scope")?
        .0;
    let injected = code.lines().any(|line| {
        let line: String = line.split_whitespace().collect();
        line.contains(&format!("param!({name}="))
    });
    injected.then(|| {
        format!(
            "the notebook has no parameter `{name}`: its cell tagged `parameters` declares none \
             by that name. Check the spelling of `-p {name}`, or declare it there, e.g. \
             `let {name}: usize = 2;`"
        )
    })
}

fn strip_ansi(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    let mut chars = s.chars();
    while let Some(c) = chars.next() {
        if c == '\x1b' {
            // CSI sequences: ESC [ parameters final-byte
            if chars.next() == Some('[') {
                for c in chars.by_ref() {
                    if c.is_ascii_alphabetic() {
                        break;
                    }
                }
            }
        } else {
            out.push(c);
        }
    }
    out
}

/// Forwards the cell process's stdout and stderr to the running cell as they arrive.
struct Drains {
    lock: Arc<Mutex<()>>,
    stdout: crossbeam_channel::Receiver<String>,
    stderr: crossbeam_channel::Receiver<String>,
    publisher: Publisher,
}

impl Drains {
    fn start(outputs: EvalContextOutputs, publisher: Publisher) -> Drains {
        let lock = Arc::new(Mutex::new(()));
        for (rx, name) in [
            (outputs.stdout.clone(), "stdout"),
            (outputs.stderr.clone(), "stderr"),
        ] {
            let lock = lock.clone();
            let publisher = publisher.clone();
            std::thread::Builder::new()
                .name(format!("drain-{name}"))
                .spawn(move || {
                    while let Ok(first) = rx.recv() {
                        // Held while publishing, so `flush` cannot overtake a taken line.
                        let _g = lock.lock().unwrap_or_else(|e| e.into_inner());
                        let text = gather(first, &rx);
                        publisher.stream(name, &text);
                    }
                })
                .expect("spawning a drain thread");
        }
        Drains {
            lock,
            stdout: outputs.stdout,
            stderr: outputs.stderr,
            publisher,
        }
    }

    /// Publishes everything the cell printed before its result goes out. stderr comes through
    /// a separate pipe with no end-of-cell marker, so wait until it has been quiet briefly.
    fn flush(&self) {
        let deadline = Instant::now() + Duration::from_millis(150);
        let mut quiet_since = Instant::now();
        loop {
            let _g = self.lock.lock().unwrap_or_else(|e| e.into_inner());
            let mut got = false;
            for (rx, name) in [(&self.stdout, "stdout"), (&self.stderr, "stderr")] {
                if let Ok(first) = rx.try_recv() {
                    let text = gather(first, rx);
                    self.publisher.stream(name, &text);
                    got = true;
                }
            }
            drop(_g);
            if got {
                quiet_since = Instant::now();
            }
            if Instant::now() >= deadline || quiet_since.elapsed() >= Duration::from_millis(20) {
                break;
            }
            std::thread::sleep(Duration::from_millis(5));
        }
    }
}

/// One line plus whatever else is already waiting, as one stream message.
fn gather(first: String, rx: &crossbeam_channel::Receiver<String>) -> String {
    let mut text = first;
    text.push('\n');
    for _ in 0..1000 {
        match rx.try_recv() {
            Ok(line) => {
                text.push_str(&line);
                text.push('\n');
            }
            Err(_) => break,
        }
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_injected_parameter_the_notebook_does_not_declare_is_named() {
        let code = "// Parameters\nlet preset = trainbook::param!(preset = \"tiny\")?;\nlet nope = trainbook::param!( nope = 1 )?;";
        let hint = undeclared_parameter(code, "cannot find value `nope` in this scope").unwrap();
        assert!(hint.contains("no parameter `nope`"), "{hint}");
        assert!(hint.contains("-p nope"), "{hint}");
        // Other unknown names keep rustc's message.
        assert_eq!(
            undeclared_parameter(code, "cannot find value `x` in this scope"),
            None
        );
        assert_eq!(
            undeclared_parameter(
                "let y = nope + 1;",
                "cannot find value `nope` in this scope"
            ),
            None
        );
    }

    #[test]
    fn finds_the_lines_with_a_question_mark() {
        let code = "let a = f()?;\nlet s = \"why?\"; // ok?\nlet c = '?';\n/* x? */ g()?.h()?;";
        assert_eq!(question_mark_lines(code), [1, 4]);
        let code = "let s = r#\"a \"?\"#;\nlet c = '\\'';\nf::<'a>(b'?')?;";
        assert_eq!(question_mark_lines(code), [3]);
    }

    #[test]
    fn a_panic_is_placed_on_the_cell_line_with_the_same_text() {
        let generated = "fn x() {\n    let v = None::<u32>.unwrap();\n}";
        let code = "let w = 1;\nlet v = None::<u32>.unwrap();";
        assert_eq!(cell_line_of(code, generated, 2), Some(2));
        assert_eq!(cell_line_of(code, generated, 9), None);
        // The kernel may have given the binding its type before compiling.
        let typed = "fn x() {\n    let v: u32 = None::<u32>.unwrap();\n}";
        assert_eq!(cell_line_of(code, typed, 2), Some(2));
        assert!(!same_statement("let v = a;", "let w: u8 = a;"));
    }

    #[test]
    fn a_failed_cell_is_an_error_that_names_its_line() {
        let failure = verdict::Failure {
            kind: verdict::FailureKind::Error,
            message: "No such file or directory (os error 2)".into(),
            file: None,
            line: None,
            backtrace: None,
        };
        let code = "let n = 1;\nstd::fs::read(\"/nonexistent\")?;";
        let Outcome::Error {
            ename,
            evalue,
            traceback,
        } = failed_cell(code, Some(failure), || None)
        else {
            panic!("not an error")
        };
        assert_eq!(ename, "Error");
        assert_eq!(evalue, "No such file or directory (os error 2)");
        assert_eq!(
            traceback.last().unwrap(),
            "  at cell line 2: std::fs::read(\"/nonexistent\")?;"
        );
    }

    #[test]
    fn a_backtrace_names_the_cell_lines_and_the_libraries() {
        let code = "let x = 1;\ndeep(x);";
        let generated = "fn deep(x: u32) {\n    panic!(\"boom\");\n}\nfn run_user_code_3() {\n    deep(x);\n}";
        let trace = "\
   0: core::panicking::panic_fmt
   1: ctx::deep
             at ./src/lib.rs:2:5
   2: trainbook_api::job::Job::wait
             at /work/prelude/api/src/job.rs:44:9
   3: ctx::run_user_code_3::{{closure}}
             at ./src/lib.rs:5:5
   4: ctx::run_user_code_3
             at ./src/lib.rs:4:1
   5: evcxr::runtime::Runtime::run_loop
";
        assert_eq!(
            backtrace_lines(code, Some(generated), trace),
            [
                "backtrace (RUST_BACKTRACE is set), innermost first:",
                "  deep",
                "  trainbook_api::job::Job::wait, /work/prelude/api/src/job.rs:44",
                "  the cell, cell line 2: deep(x);",
            ]
        );
    }

    #[test]
    fn ansi_sequences_are_removed() {
        assert_eq!(strip_ansi("\x1b[38;5;249ml\x1b[0me\x1b[31mt"), "let");
    }
}
