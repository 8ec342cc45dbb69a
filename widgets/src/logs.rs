//! The log panel: de-duplicated worker lines with rank prefixes and repeat counters, bounded to
//! the last N lines, errors highlighted, filtered by a `RUST_LOG`-style level.

use crate::html::escape;
use crate::theme::{GREY, ORANGE, RED};
use std::collections::VecDeque;
use std::fmt;
pub use trainbook_api::LogLevel;

/// Lines longer than this are cut (the run directory keeps them whole).
pub const MAX_LINE_CHARS: usize = 400;

/// One line to show, already de-duplicated across workers.
#[derive(Clone, Debug, PartialEq)]
pub struct LogLine {
    pub rank: Option<usize>,
    pub text: String,
    /// `[repeated 7x across 2 workers: ranks 0-1; loss 0.41–2.46]` for a collapsed group.
    pub repeats: Option<String>,
    pub is_error: bool,
}

impl LogLine {
    /// Whether a view filtered at `level` shows this line.
    pub fn shown_at(&self, level: LogLevel) -> bool {
        level != LogLevel::Off && self.level() <= level
    }

    pub fn level(&self) -> LogLevel {
        if self.is_error {
            return LogLevel::Error;
        }
        let lower = self.text.trim_start().to_ascii_lowercase();
        if lower.contains("warn") {
            LogLevel::Warn
        } else if lower.starts_with("debug")
            || lower.starts_with("[debug")
            || lower.starts_with("trace")
        {
            LogLevel::Debug
        } else {
            LogLevel::Info
        }
    }
}

impl fmt::Display for LogLine {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if let Some(r) = self.rank {
            write!(f, "(rank {r}) ")?;
        }
        f.write_str(&self.text)?;
        if let Some(r) = &self.repeats {
            write!(f, " {r}")?;
        }
        Ok(())
    }
}

/// The last `capacity` shown lines, plus how many were not shown.
#[derive(Clone, Debug)]
pub struct LogPanel {
    pub level: LogLevel,
    capacity: usize,
    lines: VecDeque<LogLine>,
    /// Lines scrolled out of the panel or filtered by the level.
    hidden: u64,
    /// Where all lines are (the run's log directory).
    pub path: Option<String>,
}

impl LogPanel {
    pub fn new(level: LogLevel, capacity: usize) -> LogPanel {
        LogPanel {
            level,
            capacity: capacity.max(1),
            lines: VecDeque::new(),
            hidden: 0,
            path: None,
        }
    }

    /// Adds a line; returns whether the level lets it show.
    pub fn push(&mut self, mut line: LogLine) -> bool {
        if !line.shown_at(self.level) {
            self.hidden += 1;
            return false;
        }
        if line.text.chars().count() > MAX_LINE_CHARS {
            line.text = line.text.chars().take(MAX_LINE_CHARS).collect::<String>() + "…";
        }
        if self.lines.len() == self.capacity {
            self.lines.pop_front();
            self.hidden += 1;
        }
        self.lines.push_back(line);
        true
    }

    pub fn lines(&self) -> impl Iterator<Item = &LogLine> {
        self.lines.iter()
    }
    pub fn hidden(&self) -> u64 {
        self.hidden
    }
    pub fn is_empty(&self) -> bool {
        self.lines.is_empty() && self.hidden == 0
    }

    fn more_note(&self) -> Option<String> {
        (self.hidden > 0).then(|| {
            let n = self.hidden;
            let s = if n == 1 { "" } else { "s" };
            match &self.path {
                Some(p) => format!("{n} more line{s} in {p}"),
                None => format!("{n} more line{s} not shown"),
            }
        })
    }

    pub fn text(&self) -> String {
        let mut out: Vec<String> = Vec::new();
        out.extend(self.more_note().map(|n| format!("… {n}")));
        out.extend(self.lines.iter().map(|l| l.to_string()));
        out.join("\n")
    }

    pub fn html(&self) -> String {
        let mut h = String::from(
            "<pre class=\"trainbook-logs\" style=\"margin:4px 0;padding:4px 6px;max-height:14em;overflow:auto;\
             background:rgba(127,127,127,0.08);font-size:12px;line-height:1.35;white-space:pre-wrap\">",
        );
        if let Some(n) = self.more_note() {
            h.push_str(&format!(
                "<span style=\"color:{GREY}\">… {}</span>\n",
                escape(&n)
            ));
        }
        for l in &self.lines {
            if let Some(r) = l.rank {
                h.push_str(&format!("<span style=\"color:{GREY}\">(rank {r})</span> "));
            }
            let color = match l.level() {
                LogLevel::Error => Some(RED),
                LogLevel::Warn => Some(ORANGE),
                _ => None,
            };
            match color {
                Some(c) => h.push_str(&format!(
                    "<span style=\"color:{c}\">{}</span>",
                    escape(&l.text)
                )),
                None => h.push_str(&escape(&l.text)),
            }
            if let Some(r) = &l.repeats {
                h.push_str(&format!(
                    " <span style=\"color:{GREY};font-style:italic\">{}</span>",
                    escape(r)
                ));
            }
            h.push('\n');
        }
        h.push_str("</pre>");
        h
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn line(rank: usize, text: &str, is_error: bool) -> LogLine {
        LogLine {
            rank: Some(rank),
            text: text.into(),
            repeats: None,
            is_error,
        }
    }

    #[test]
    fn panel_keeps_the_last_lines_and_says_where_the_rest_are() {
        let mut p = LogPanel::new(LogLevel::Info, 3);
        p.path = Some("/runs/x/logs".into());
        for i in 0..5 {
            assert!(p.push(line(i % 2, &format!("line {i}"), false)));
        }
        let t = p.text();
        assert!(
            t.starts_with("… 2 more lines in /runs/x/logs\n(rank 0) line 2"),
            "{t}"
        );
        assert_eq!(p.lines().count(), 3);
    }

    #[test]
    fn errors_are_red_repeats_are_counted_and_html_is_escaped() {
        let mut p = LogPanel::new(LogLevel::Info, 10);
        p.push(line(1, "RuntimeError: <boom>", true));
        p.push(LogLine {
            repeats: Some("[repeated 7x across 2 workers: ranks 0-1]".into()),
            ..line(0, "loss 0.4", false)
        });
        let h = p.html();
        assert!(
            h.contains(&format!(
                "<span style=\"color:{RED}\">RuntimeError: &lt;boom&gt;</span>"
            )),
            "{h}"
        );
        assert!(
            h.contains("[repeated 7x across 2 workers: ranks 0-1]"),
            "{h}"
        );
        assert!(
            p.text().contains("(rank 0) loss 0.4 [repeated 7x"),
            "{}",
            p.text()
        );
    }

    #[test]
    fn levels_filter_like_rust_log() {
        assert_eq!("WARN".parse::<LogLevel>(), Ok(LogLevel::Warn));
        assert_eq!("trace".parse::<LogLevel>(), Ok(LogLevel::Debug));
        assert!("loud"
            .parse::<LogLevel>()
            .unwrap_err()
            .contains("use off, error, warn, info or debug"));
        let mut p = LogPanel::new(LogLevel::Warn, 10);
        assert!(!p.push(line(0, "step 1 loss 0.5", false)));
        assert!(p.push(line(0, "UserWarning: slow path", false)));
        assert!(p.push(line(0, "Traceback", true)));
        assert!(!p.push(line(0, "debug: buckets", false)));
        assert_eq!(p.hidden(), 2);
        let mut off = LogPanel::new(LogLevel::Off, 10);
        assert!(!off.push(line(0, "Error: x", true)));
        let mut long = LogPanel::new(LogLevel::Debug, 10);
        long.push(line(0, &"x".repeat(5000), false));
        assert_eq!(
            long.lines().next().unwrap().text.chars().count(),
            MAX_LINE_CHARS + 1
        );
    }
}
