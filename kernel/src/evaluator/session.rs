//! The evaluator thread: its start (evcxr's context, the output drains, the analyzer, the
//! prelude), its request loop, and one cell's run from the switches it needs to its outcome.

use super::analyzer::{Analysis, warm_up_analyzer};
use super::compile_error::compile_error;
use super::context::create_context;
use super::drain::Drains;
use super::failure::{failed_cell, question_mark_lines};
use super::outcome::Outcome;
use super::{CellProcess, ChildSetup, Request, lookup, timing};
use crate::cell_libs::init_code;
use crate::infer;
use crate::iopub::Publisher;
use crate::verdict;
use anyhow::Result;
use evcxr::CommandContext;
use serde_json::Value;
use std::sync::atomic::Ordering;
use std::sync::{Arc, mpsc};
use std::time::Instant;

/// What a cell that uses polars gets: `*_df()`, `DataFrame`, `polars` (`trainbook::frames`).
const FRAMES_IMPORT: &str = "use trainbook_torch::frames::*;";

/// Whether a cell uses polars: a `*_df()` method, the `DataFrame` type or the crate.
fn uses_polars(code: &str) -> bool {
    code.contains("_df(") || code.contains("DataFrame") || code.contains("polars")
}

/// Replies to every request with the evaluator's start-up error (it could not start at all).
fn refuse_all(rx: mpsc::Receiver<Request>, msg: &str) {
    for req in rx {
        match req {
            Request::Execute { reply, .. } => {
                let _ = reply.send(Outcome::kernel_error(msg));
            }
            Request::Complete { reply, .. } => drop(reply.send(None)),
            Request::Inspect { reply, .. } => drop(reply.send(None)),
        }
    }
}

/// The evaluator thread: creates evcxr's context, then answers requests until the queue closes.
pub(super) fn run(
    setup: ChildSetup,
    publisher: Publisher,
    cell_process: Arc<CellProcess>,
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
    *cell_process.child.lock().unwrap_or_else(|e| e.into_inner()) = Some(ctx.process_handle());
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
        cell_process,
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
    // compiled together with the prelude's init; otherwise the idle evaluator loads the prelude
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
                let _ = reply.send(lookup::complete(
                    &mut session.ctx,
                    &mut session.analysis,
                    &code,
                    cursor,
                ));
            }
            Request::Inspect {
                code,
                cursor,
                reply,
            } => {
                let _ = reply.send(lookup::inspect(
                    &mut session.ctx,
                    &mut session.analysis,
                    &code,
                    cursor,
                ));
            }
        }
    }
}

/// The evaluator thread's evaluation context and what it remembers between cells.
struct Session {
    ctx: CommandContext,
    publisher: Publisher,
    cell_process: Arc<CellProcess>,
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
        self.cell_process.executing.store(id, Ordering::SeqCst);
        let result = if merged {
            self.execute_with_prelude(code)
        } else {
            infer::execute(&mut self.ctx, code, self.analysis.ready())
        };
        self.cell_process.executing.store(0, Ordering::SeqCst);
        self.drains.flush();
        let interrupted = self.cell_process.interrupted.load(Ordering::SeqCst) == id;
        let killed = self.cell_process.killed.load(Ordering::SeqCst) == id;
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
        let result = infer::execute(&mut self.ctx, &both, self.analysis.ready());
        timing("prelude ready after", self.t0);
        // Nothing ran (it did not compile): the prelude alone, then the cell alone,
        // so its errors are reported against its own lines.
        if matches!(
            result,
            Err(evcxr::Error::CompilationErrors(_) | evcxr::Error::Message(_))
        ) {
            self.init("");
            infer::execute(&mut self.ctx, code, self.analysis.ready())
        } else {
            result
        }
    }
}

/// `generated`: the source evcxr compiled for the cell, to place a panic on a cell line.
fn to_outcome(
    code: &str,
    result: Result<evcxr::EvalOutputs, evcxr::Error>,
    interrupted: bool,
    killed: bool,
    generated: impl FnOnce() -> Option<String>,
) -> Outcome {
    match result {
        _ if killed => Outcome::headline(
            "Interrupted",
            "the cell did not stop within the grace period after the interrupt, so its Rust \
             process was restarted: all variables are lost (trainbook jobs and their workers \
             were stopped). The prelude is loaded again."
                .into(),
        ),
        Ok(_) if interrupted => Outcome::headline(
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
        Err(evcxr::Error::SubprocessTerminated(msg)) => Outcome::headline(
            "ProcessDied",
            format!(
                "the Rust process running the cells died, so all variables are lost; the prelude \
                 is loaded again. {msg}"
            ),
        ),
        Err(e) => Outcome::headline("Error", e.to_string()),
    }
}
