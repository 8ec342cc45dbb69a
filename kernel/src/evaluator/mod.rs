//! The evaluator: one thread that owns evcxr's `CommandContext` and evaluates the cells.
//!
//! evcxr compiles each cell and runs it in a child process (this same executable, which calls
//! `evcxr::runtime_hook()` first). The context is not thread-safe and a cell blocks it while it
//! runs, so it lives on its own thread and the Jupyter handlers talk to it through a queue;
//! interrupts and shutdown never wait for it (see `kernel.rs`).
//!
//! - `session.rs`: the thread itself, what it remembers between cells, and one cell's run to
//!   its outcome;
//! - `context.rs`: evcxr's context and the cell process's environment;
//! - `outcome.rs`: what a cell produced (the one constructor of an error, and its colour);
//! - `failure.rs` and `compile_error.rs`: a failed cell's and a compile error's report;
//! - `analyzer.rs` and `lookup.rs`: the trainbook-aware analyzer, and completion and hover;
//! - `drain.rs`: the cell process's stdout and stderr, forwarded to the running cell.

mod analyzer;
mod compile_error;
mod context;
mod drain;
mod failure;
mod lookup;
mod outcome;
mod session;

pub(crate) use outcome::Outcome;

use crate::cell_libs::CellLibs;
use crate::completion::Match;
use crate::iopub::Publisher;
use crate::toolchain::Toolchain;
use std::path::PathBuf;
use std::process::Child;
use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Mutex, mpsc};
use std::time::Instant;
use tokio::sync::oneshot;

/// Completion candidates for the text between `start` and `end`.
pub(crate) struct Completion {
    pub(crate) matches: Vec<Match>,
    /// Byte offsets into the code.
    pub(crate) start: usize,
    pub(crate) end: usize,
}

/// What the Jupyter handlers ask of the evaluator thread; each carries where its answer goes.
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

/// The cell process as the interrupt and shutdown paths see it while the evaluator thread is
/// busy with a cell: which execution it runs, and its handle to kill it by.
#[derive(Default)]
pub(crate) struct CellProcess {
    /// Id of the execution now running (0: none).
    pub(crate) executing: AtomicU64,
    /// The execution an interrupt was sent for, and the one whose process was killed.
    pub(crate) interrupted: AtomicU64,
    pub(crate) killed: AtomicU64,
    /// evcxr's handle to the cell process; stays valid across its restarts.
    child: Mutex<Option<Arc<Mutex<Child>>>>,
}

impl CellProcess {
    pub(crate) fn child_pid(&self) -> Option<u32> {
        let handle = self.child.lock().ok()?.clone()?;
        let child = handle.lock().ok()?;
        Some(child.id())
    }

    /// SIGKILL for the cell process (its jobs' workers follow through their death signal).
    pub(crate) fn kill_child(&self) {
        let handle = self.child.lock().ok().and_then(|h| h.clone());
        if let Some(handle) = handle
            && let Ok(mut child) = handle.lock()
        {
            let _ = child.kill();
        }
    }
}

/// The Jupyter handlers' side of the evaluator thread: requests go through its queue.
#[derive(Clone)]
pub(crate) struct Evaluator {
    tx: mpsc::Sender<Request>,
    pub(crate) cell_process: Arc<CellProcess>,
}

/// Environment for the cell process.
pub(crate) struct ChildSetup {
    pub(crate) prelude: Option<CellLibs>,
    pub(crate) toolchain: Option<Toolchain>,
    pub(crate) channel_socket: PathBuf,
    /// Where the trainbook-aware analyzer keeps its crate (`analysis.rs`); None: no analyzer.
    pub(crate) analysis_dir: Option<PathBuf>,
}

impl Evaluator {
    /// Starts the evaluator thread; the context is created there (it takes a few seconds) while
    /// the kernel already answers on its sockets. Requests queue until it is ready.
    pub(crate) fn start(setup: ChildSetup, publisher: Publisher) -> Evaluator {
        let (tx, rx) = mpsc::channel();
        let cell_process = Arc::new(CellProcess::default());
        let c = cell_process.clone();
        std::thread::Builder::new()
            .name("evaluator".into())
            .spawn(move || session::run(setup, publisher, c, rx))
            .expect("spawning the evaluator thread");
        Evaluator { tx, cell_process }
    }

    pub(crate) async fn execute(&self, code: String) -> Outcome {
        let (reply, rx) = oneshot::channel();
        if self.tx.send(Request::Execute { code, reply }).is_err() {
            return evaluator_gone();
        }
        rx.await.unwrap_or_else(|_| evaluator_gone())
    }

    pub(crate) async fn complete(&self, code: String, cursor: usize) -> Option<Completion> {
        self.ask(|reply| Request::Complete {
            code,
            cursor,
            reply,
        })
        .await
    }

    pub(crate) async fn inspect(&self, code: String, cursor: usize) -> Option<(String, String)> {
        self.ask(|reply| Request::Inspect {
            code,
            cursor,
            reply,
        })
        .await
    }

    /// Queues a question whose answer may be missing; None too when the thread has ended.
    async fn ask<T>(
        &self,
        request: impl FnOnce(oneshot::Sender<Option<T>>) -> Request,
    ) -> Option<T> {
        let (reply, rx) = oneshot::channel();
        self.tx.send(request(reply)).ok()?;
        rx.await.ok().flatten()
    }
}

/// The reply when the evaluator thread has ended (it panicked) and a cell cannot run.
fn evaluator_gone() -> Outcome {
    Outcome::kernel_error("the evaluation engine stopped; restart the kernel")
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
