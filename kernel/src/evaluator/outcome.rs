//! What a cell produced. [`Outcome::error`] is the one place an error outcome is built, and
//! [`red`] the one place its colour is written.

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
