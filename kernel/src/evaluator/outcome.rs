//! What a cell produced, and how evcxr's result for it becomes that. [`Outcome::error`] is the
//! one place an error outcome is built, and [`red`] the one place its colour is written.

use super::compile_error::compile_error;
use super::failure::failed_cell;
use crate::verdict;
use jupyter_protocol::ErrorOutput;
use serde_json::{Map, Value};

/// What a cell produced.
#[derive(Debug)]
pub(crate) enum Outcome {
    /// The cell ran; `data` is its result's MIME bundle (empty when it has no value).
    Ok { data: Map<String, Value> },
    /// Compile error, runtime error, interrupt or lost process: what the notebook's `error`
    /// output and the execute reply carry. Built only by [`Outcome::error`].
    Error(ErrorOutput),
}

impl Outcome {
    /// An error outcome; `traceback` is what the notebook shows, its headline coloured by the
    /// caller where it should be ([`red`]).
    pub(super) fn error(ename: &str, evalue: String, traceback: Vec<String>) -> Outcome {
        Outcome::Error(ErrorOutput {
            ename: ename.into(),
            evalue,
            traceback,
        })
    }

    /// An error whose whole traceback is one red headline: `ename: evalue`.
    pub(super) fn headline(ename: &str, evalue: String) -> Outcome {
        let traceback = vec![format!("{}: {evalue}", red(ename))];
        Outcome::error(ename, evalue, traceback)
    }

    /// The kernel's own failure (no cell ran): the message, plain, as the traceback.
    pub(super) fn kernel_error(msg: &str) -> Outcome {
        Outcome::error("KernelError", msg.to_string(), vec![msg.to_string()])
    }
}

/// `text` in the red that Jupyter front ends show an error's headline in.
pub(super) fn red(text: &str) -> String {
    format!("\x1b[0;31m{text}\x1b[0m")
}

/// `generated`: the source evcxr compiled for the cell, to place a panic on a cell line.
pub(super) fn to_outcome(
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
