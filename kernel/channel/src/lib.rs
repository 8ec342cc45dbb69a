//! The side channel between code running in a notebook and the trainbook kernel.
//!
//! Jupyter's own output path (the cell's stdout) is read by evcxr only while a cell runs, so a
//! training job that reports after its cell returned would be silent until the next cell. This
//! channel is a Unix socket the kernel listens on; it passes the path to the process that runs
//! the cells in [`SOCKET_ENV`]. Messages are JSON, one per line:
//!
//! - notebook → kernel ([`ToKernel`]): create a display, update it, clear the cell's output, or
//!   print text — from any thread, at any time, also when no cell is running;
//! - kernel → notebook ([`ToNotebook`]): interrupt (stop running jobs, keep state) and shutdown.
//!
//! The kernel turns displays into Jupyter `display_data` / `update_display_data` messages with a
//! `display_id`, so a front end redraws the same output in place.

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

mod client;
pub use client::{connect, connect_from_env, link, Display, Link};

/// Environment variable holding the socket path (set by the kernel for the cell process).
pub const SOCKET_ENV: &str = "TRAINBOOK_KERNEL_CHANNEL";

/// A MIME bundle: `{"text/plain": "...", "text/html": "...", "image/svg+xml": "..."}`.
pub type MimeBundle = Map<String, Value>;

/// Updates of one display are sent at most this often; the latest one always gets through.
pub const MIN_UPDATE_INTERVAL: std::time::Duration = std::time::Duration::from_millis(100);

/// Notebook → kernel.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "snake_case")]
pub enum ToKernel {
    /// First message on a connection.
    Hello { pid: u32 },
    /// A new output area that later updates replace in place.
    Display {
        display_id: String,
        data: MimeBundle,
        #[serde(default)]
        metadata: MimeBundle,
    },
    /// New content for an existing display.
    Update {
        display_id: String,
        data: MimeBundle,
        #[serde(default)]
        metadata: MimeBundle,
    },
    /// Clears the running cell's output; with `wait`, only once new output arrives (no flicker).
    Clear { wait: bool },
    /// Asks the kernel to answer [`ToNotebook::Synced`] once it has handled every message sent
    /// before this one (a cell's own output must reach the kernel before the cell ends).
    Sync { seq: u64 },
    /// Text for a cell's stdout/stderr. With `display_id`, it goes to the cell that created that
    /// display (a background job's own cell); without, to the running (or last) cell.
    Stream {
        name: StreamName,
        text: String,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        display_id: Option<String>,
    },
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum StreamName {
    Stdout,
    Stderr,
}

impl StreamName {
    pub fn as_str(self) -> &'static str {
        match self {
            StreamName::Stdout => "stdout",
            StreamName::Stderr => "stderr",
        }
    }
}

/// Kernel → notebook.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "snake_case")]
pub enum ToNotebook {
    /// The user pressed interrupt: stop running jobs cooperatively; variables must survive.
    Interrupt,
    /// The kernel is shutting down or restarting: stop everything now.
    Shutdown,
    /// Every message up to [`ToKernel::Sync`] `seq` has been handled.
    Synced { seq: u64 },
}

/// One message as a line of JSON (with the trailing newline).
pub fn encode<T: Serialize>(msg: &T) -> String {
    // Serialising these plain enums cannot fail (string keys, no non-finite floats in Value).
    let mut line = serde_json::to_string(msg).unwrap_or_else(|_| "{}".into());
    line.push('\n');
    line
}

/// Parses one line; `None` for anything that is not a message (logged by the caller).
pub fn decode<T: for<'de> Deserialize<'de>>(line: &str) -> Option<T> {
    serde_json::from_str(line.trim_end()).ok()
}

/// A bundle with a `text/plain` entry and optionally an HTML one.
pub fn bundle(text: impl Into<String>, html: Option<String>) -> MimeBundle {
    let mut b = MimeBundle::new();
    b.insert("text/plain".into(), Value::String(text.into()));
    if let Some(h) = html {
        b.insert("text/html".into(), Value::String(h));
    }
    b
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wire_format_is_tagged_json_lines() {
        let m = ToKernel::Update {
            display_id: "d1".into(),
            data: bundle("hi", None),
            metadata: MimeBundle::new(),
        };
        let line = encode(&m);
        assert!(line.ends_with('\n'));
        assert!(
            line.starts_with(r#"{"op":"update","display_id":"d1""#),
            "{line}"
        );
        assert_eq!(decode::<ToKernel>(&line), Some(m));
        assert_eq!(
            decode::<ToNotebook>("{\"op\":\"interrupt\"}\n"),
            Some(ToNotebook::Interrupt)
        );
        assert_eq!(decode::<ToNotebook>("{\"op\":\"explode\"}"), None);
        let s: ToKernel = decode(r#"{"op":"stream","name":"stderr","text":"x"}"#).unwrap();
        assert_eq!(
            s,
            ToKernel::Stream {
                name: StreamName::Stderr,
                text: "x".into(),
                display_id: None
            }
        );
    }
}
