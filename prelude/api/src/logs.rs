//! What the notebook and the terminal show of worker output: de-duplicated lines (the engine's
//! `dedup` decides which; these are its results) and the level filter of the views.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

/// Which output stream of a worker a line came from (`"stdout"` / `"stderr"` in JSON: the
/// workers' log events, the job's log records).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Stream {
    Stdout,
    Stderr,
}

/// What a summary line stands for.
#[derive(Clone, Debug, PartialEq)]
pub struct Repeats {
    /// Number of held lines (the first, already shown occurrence excluded).
    pub count: usize,
    /// Distinct ranks among the held lines, ascending.
    pub ranks: Vec<usize>,
    /// `(label, min, max)` of each labelled number that varied among the
    /// held lines, in order of first appearance.
    pub ranges: Vec<(String, f64, f64)>,
}

/// One entry to display.
#[derive(Clone, Debug, PartialEq)]
pub struct Shown {
    pub rank: usize,
    pub stream: Stream,
    pub text: String,
    /// `Some` for a summary of held repeats; `text` is then the latest one.
    pub repeats: Option<Repeats>,
    pub is_error: bool,
}

impl fmt::Display for Repeats {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let m = self.ranks.len();
        write!(
            f,
            "[repeated {}x across {} worker{}: rank{} {}",
            self.count,
            m,
            if m == 1 { "" } else { "s" },
            if m == 1 { "" } else { "s" },
            format_ranks(&self.ranks)
        )?;
        for (i, (label, lo, hi)) in self.ranges.iter().enumerate() {
            let sep = if i == 0 { "; " } else { ", " };
            write!(f, "{sep}{label} {}–{}", fmt_num(*lo), fmt_num(*hi))?;
        }
        f.write_str("]")
    }
}

impl fmt::Display for Shown {
    /// `(rank 0) text` or
    /// `(rank 1) text [repeated 7x across 4 workers: ranks 0-3; loss 0.41–2.46]`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "(rank {}) {}", self.rank, self.text)?;
        if let Some(r) = &self.repeats {
            write!(f, " {r}")?;
        }
        Ok(())
    }
}

/// A number as the summaries show it: plain in the usual range, scientific outside it.
pub fn fmt_num(v: f64) -> String {
    let a = v.abs();
    if a == 0.0 || (1e-4..1e15).contains(&a) {
        format!("{v}")
    } else {
        format!("{v:e}")
    }
}

/// Compress ranks: `[0,1,2,3]` -> `"0-3"`, `[0,2,5,6,7]` -> `"0,2,5-7"`.
/// Input need not be sorted or distinct.
pub fn format_ranks(ranks: &[usize]) -> String {
    let mut r = ranks.to_vec();
    r.sort_unstable();
    r.dedup();
    let mut out = String::new();
    let mut i = 0;
    while i < r.len() {
        let mut j = i;
        while j + 1 < r.len() && r[j + 1] == r[j] + 1 {
            j += 1;
        }
        if !out.is_empty() {
            out.push(',');
        }
        if j > i {
            out.push_str(&format!("{}-{}", r[i], r[j]));
        } else {
            out.push_str(&r[i].to_string());
        }
        i = j + 1;
    }
    out
}

/// Which worker lines are shown: `off`, `error`, `warn`, `info` (default) or `debug`
/// (`trace` means `debug`), like `RUST_LOG`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord)]
pub enum LogLevel {
    Off,
    Error,
    Warn,
    #[default]
    Info,
    Debug,
}

impl FromStr for LogLevel {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s.trim().to_ascii_lowercase().as_str() {
            "off" | "none" => Ok(LogLevel::Off),
            "error" => Ok(LogLevel::Error),
            "warn" | "warning" => Ok(LogLevel::Warn),
            "info" | "" => Ok(LogLevel::Info),
            "debug" | "trace" | "all" => Ok(LogLevel::Debug),
            other => Err(format!(
                "unknown log level {other:?}: use off, error, warn, info or debug"
            )),
        }
    }
}

impl LogLevel {
    pub fn name(self) -> &'static str {
        match self {
            LogLevel::Off => "off",
            LogLevel::Error => "error",
            LogLevel::Warn => "warn",
            LogLevel::Info => "info",
            LogLevel::Debug => "debug",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn format_ranks_cases() {
        assert_eq!(format_ranks(&[]), "");
        assert_eq!(format_ranks(&[3]), "3");
        assert_eq!(format_ranks(&[0, 1]), "0-1");
        assert_eq!(format_ranks(&[0, 1, 2, 3]), "0-3");
        assert_eq!(format_ranks(&[0, 2, 5, 6, 7]), "0,2,5-7");
        assert_eq!(format_ranks(&[1, 3]), "1,3");
        assert_eq!(format_ranks(&[7, 5, 6, 6, 0, 2]), "0,2,5-7");
    }

    #[test]
    fn streams_are_lowercase_words_in_json() {
        assert_eq!(
            serde_json::to_string(&Stream::Stdout).unwrap(),
            "\"stdout\""
        );
        assert_eq!(
            serde_json::to_string(&Stream::Stderr).unwrap(),
            "\"stderr\""
        );
        let s: Stream = serde_json::from_str("\"stderr\"").unwrap();
        assert_eq!(s, Stream::Stderr);
    }
}
