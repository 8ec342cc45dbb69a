//! The sweep view: a hyper-parameter sweep's trials (some running at once, some stopped early
//! by the scheduler) as one table, one plot of every trial's metric against steps, the best
//! trial highlighted, and the workers' log lines. HTML with an inline SVG for notebooks; an
//! aligned table for terminals.
//!
//! - [`table`]: the trials' table, as text and as HTML.
//! - [`plot`]: the plot of every trial's metric, as SVG.

#[cfg(test)]
mod fixtures;
mod plot;
mod table;

use crate::format::{format_duration, format_metric};
use crate::html::escape;
use crate::logs::{LogLevel, LogPanel};
use crate::theme::{GREEN, GREY};
use crate::Bundle;
use serde_json::Value;
use trainbook_api::plumbing::trials::{count_by_status, counts_line};
use trainbook_api::{Goal, TrialStatus};

use plot::svg_body;
pub use plot::{sweep_svg, MAX_LABELLED_LINES, MAX_POINTS_PER_TRIAL};
pub use table::status_color;

/// The plot's size in the HTML view.
pub const PLOT_WIDTH: u32 = 720;
pub const PLOT_HEIGHT: u32 = 320;
/// Log lines a new view keeps.
pub const LOG_LINES: usize = 10;

/// One row of the sweep table.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct TrialRow {
    /// 1-based trial number.
    pub id: usize,
    /// The trial's parameter values, formatted, in the order of `SweepView::params`.
    pub params: Vec<String>,
    pub state: TrialStatus,
    /// Optimizer steps done and planned (0 planned: unknown).
    pub step: u64,
    pub total_steps: u64,
    /// The metric's latest and best value so far.
    pub latest: Option<f64>,
    pub best: Option<f64>,
    /// Seconds the trial has run.
    pub elapsed: f64,
    /// The metric against the optimizer step, one point per report.
    pub curve: Vec<(u64, f64)>,
    /// A short note: why it was pruned ("pruned at report 1: 0.693 worse than 0.651"), or the
    /// first line of its error.
    pub note: Option<String>,
}

impl TrialRow {
    /// The best value the trial reached: `best`, or else the best point of its curve.
    fn best_value(&self, goal: Goal) -> Option<f64> {
        self.best.filter(|v| v.is_finite()).or_else(|| {
            self.curve
                .iter()
                .map(|p| p.1)
                .filter(|v| v.is_finite())
                .reduce(|a, b| if goal.better(b, a) { b } else { a })
        })
    }
}

/// The whole sweep.
#[derive(Clone, Debug)]
pub struct SweepView {
    /// e.g. "sweep · bert · 6 trials, 2 at a time · ASHA (grace 1, factor 2) on eval_loss (min)".
    pub title: String,
    /// The metric's name, e.g. "eval_loss".
    pub metric: String,
    /// Whether lower or higher values of the metric are better.
    pub goal: Goal,
    /// Parameter names, the table's parameter columns.
    pub params: Vec<String>,
    pub trials: Vec<TrialRow>,
    /// Index into `trials` of the best trial so far (highlighted).
    pub best: Option<usize>,
    /// Seconds since the sweep started.
    pub elapsed: f64,
    /// true once the sweep has ended.
    pub finished: bool,
    /// A line under the table once finished: where results are, or why the sweep failed.
    pub footer: Option<String>,
    /// Worker log lines of all trials (the caller prefixes each with its trial).
    pub logs: LogPanel,
    /// Draw the plot (default true).
    pub plot: bool,
}

impl SweepView {
    pub fn new(
        title: String,
        metric: String,
        goal: Goal,
        params: Vec<String>,
        log_level: LogLevel,
    ) -> SweepView {
        SweepView {
            title,
            metric,
            goal,
            params,
            trials: Vec::new(),
            best: None,
            elapsed: 0.0,
            finished: false,
            footer: None,
            logs: LogPanel::new(log_level, LOG_LINES),
            plot: true,
        }
    }

    /// The best trial, when `best` points at one.
    pub fn best_trial(&self) -> Option<&TrialRow> {
        self.best.and_then(|i| self.trials.get(i))
    }

    /// How many trials are in each state, in the order summaries count them (running first,
    /// pending last), states without trials left out.
    pub fn counts(&self) -> Vec<(TrialStatus, usize)> {
        count_by_status(self.trials.iter().map(|t| t.state))
    }

    /// Counts per state, e.g. "2 running · 1 pruned · 3 pending"; "no trials yet".
    pub fn summary(&self) -> String {
        let counts = self.counts();
        if counts.is_empty() {
            return "no trials yet".into();
        }
        counts_line(&counts)
    }

    /// ` · elapsed 1m 05s` while running, ` · finished after 1m 05s` once ended.
    fn elapsed_note(&self) -> String {
        let d = format_duration(self.elapsed);
        if self.finished {
            format!(" · finished after {d}")
        } else {
            format!(" · elapsed {d}")
        }
    }

    /// `best: trial 3 (lr=0.001, batch=32) eval_loss 0.5120`.
    pub fn best_line(&self) -> Option<String> {
        let t = self.best_trial()?;
        // A finished trial is ranked by its last value (what `best()` uses); a running one by
        // its best so far.
        let value = match t.state {
            TrialStatus::Succeeded => t.latest.or(t.best_value(self.goal))?,
            _ => t.best_value(self.goal).or(t.latest)?,
        };
        let params: Vec<String> = self
            .params
            .iter()
            .zip(&t.params)
            .map(|(k, v)| format!("{k}={v}"))
            .collect();
        let params = if params.is_empty() {
            String::new()
        } else {
            format!(" ({})", params.join(", "))
        };
        Some(format!(
            "best: trial {}{params} {} {}",
            t.id,
            self.metric,
            format_metric(value)
        ))
    }

    fn is_best(&self, index: usize) -> bool {
        self.best == Some(index)
    }

    /// Plain text (`text/plain`): title, summary, best trial, table, footer, log lines.
    pub fn text(&self) -> String {
        let mut out = vec![
            self.title.clone(),
            format!("{}{}", self.summary(), self.elapsed_note()),
        ];
        out.extend(self.best_line());
        if !self.trials.is_empty() {
            out.push(self.table_text());
        }
        out.extend(self.footer.clone());
        if !self.logs.is_empty() {
            out.push(self.logs.text());
        }
        out.join("\n")
    }

    /// The summary with each count in its state's colour, and the elapsed time.
    fn summary_html(&self) -> String {
        let counts = self.counts();
        let parts = if counts.is_empty() {
            escape(&self.summary())
        } else {
            counts
                .iter()
                .map(|(s, n)| {
                    format!(
                        "<span style=\"color:{}\">{n} {}</span>",
                        status_color(*s),
                        s.name()
                    )
                })
                .collect::<Vec<_>>()
                .join(" · ")
        };
        format!(
            "<div class=\"trainbook-sweep-summary\" style=\"font-variant-numeric:tabular-nums\">{parts}{}</div>",
            escape(&self.elapsed_note())
        )
    }

    /// The whole view as HTML, plot inline (no JavaScript; self-contained styles).
    pub fn html(&self) -> String {
        let mut h = String::from(
            "<div class=\"trainbook-sweep\" style=\"font-family:var(--jp-ui-font-family,sans-serif);font-size:13px;max-width:980px\">",
        );
        h.push_str(&format!(
            "<div style=\"font-weight:bold;margin-bottom:2px\">{}</div>",
            escape(&self.title)
        ));
        h.push_str(&self.summary_html());
        if let Some(b) = self.best_line() {
            h.push_str(&format!(
                "<div style=\"margin:2px 0\"><span style=\"color:{GREEN}\">★</span> {}</div>",
                escape(&b)
            ));
        }
        if self.plot {
            let svg = sweep_svg(self, PLOT_WIDTH, PLOT_HEIGHT);
            h.push_str("<div class=\"trainbook-plot\">");
            h.push_str(svg_body(&svg));
            h.push_str("</div>");
        }
        if !self.trials.is_empty() {
            h.push_str(&self.table_html());
        }
        if let Some(f) = &self.footer {
            h.push_str(&format!(
                "<div style=\"margin:4px 0;white-space:pre-wrap\">{}</div>",
                escape(f)
            ));
        }
        if !self.logs.is_empty() {
            // A sweep that ended without a failed trial folds its logs away.
            let failed = self.trials.iter().any(|t| t.state == TrialStatus::Failed);
            if self.finished && !failed {
                h.push_str(&format!(
                    "<details><summary style=\"color:{GREY}\">worker logs</summary>{}</details>",
                    self.logs.html()
                ));
            } else {
                h.push_str(&self.logs.html());
            }
        }
        h.push_str("</div>");
        h
    }

    /// `{"text/plain": text(), "text/html": html()}`.
    pub fn bundle(&self) -> Bundle {
        let mut b = Bundle::new();
        b.insert("text/html".into(), Value::String(self.html()));
        b.insert("text/plain".into(), Value::String(self.text()));
        b
    }
}

#[cfg(test)]
mod tests {
    use super::fixtures::{parse_html, polylines, sweep, texts, trial};
    use super::plot::FAINT;
    use super::*;
    use crate::theme::{css, BLUE, LINES, RED};

    #[test]
    fn summary_counts_each_state_once() {
        let mut v = sweep();
        assert_eq!(v.summary(), "2 running · 1 pruned · 3 pending");
        v.trials[1].state = TrialStatus::Succeeded;
        v.trials[3].state = TrialStatus::Failed;
        assert_eq!(
            v.summary(),
            "1 running · 1 succeeded · 1 pruned · 1 failed · 2 pending"
        );
        v.trials.clear();
        assert_eq!(v.summary(), "no trials yet");
        let t = sweep().text();
        let lines: Vec<&str> = t.lines().collect();
        assert_eq!(lines[0], "sweep · bert · 6 trials, 2 at a time");
        assert_eq!(
            lines[1],
            "2 running · 1 pruned · 3 pending · elapsed 1m 05s"
        );
        let h = sweep().html();
        assert!(
            h.contains(&format!("<span style=\"color:{BLUE}\">2 running</span> · ")),
            "{h}"
        );
    }

    #[test]
    fn html_escapes_every_text() {
        let mut v = sweep();
        v.title = "sweep <b>&</b>".into();
        v.params[0] = "<lr>".into();
        v.trials[0].params[0] = "<script>alert(1)</script>".into();
        v.trials[0].state = TrialStatus::Failed;
        v.trials[0].note = Some("ValueError: x < 0\n  at line 3".into());
        v.footer = Some("failed: \"a\" < b".into());
        v.metric = "f1 <macro>".into();
        let h = v.html();
        parse_html(&h);
        assert!(!h.contains("<script>") && !h.contains("<lr>") && !h.contains("<b>&"));
        assert!(h.contains("&lt;script&gt;alert(1)&lt;/script&gt;"));
        assert!(h.contains("sweep &lt;b&gt;&amp;&lt;/b&gt;"));
        assert!(h.contains(">&lt;lr&gt;</th>"));
        assert!(h.contains("best f1 &lt;macro&gt;"));
        assert!(h.contains(&format!(
            "<span style=\"color:{RED}\">ValueError: x &lt; 0</span>"
        )));
        assert!(!h.contains("at line 3"), "one line per note");
        assert!(h.contains("failed: &quot;a&quot; &lt; b"));
        // The plain text is not escaped.
        assert!(v.text().contains("<script>alert(1)</script>"));
    }

    #[test]
    fn an_empty_sweep_renders() {
        let v = SweepView::new(
            "sweep · mlp".into(),
            "val_accuracy".into(),
            Goal::Max,
            vec![],
            LogLevel::Info,
        );
        assert_eq!(v.text(), "sweep · mlp\nno trials yet · elapsed 0.0s");
        let h = v.html();
        parse_html(&h);
        assert!(h.contains("no trials yet") && !h.contains("<table"));
        let svg = sweep_svg(&v, 720, 320);
        let t = texts(&svg);
        assert!(
            t.iter().any(|s| s == "waiting for the first report…"),
            "{t:?}"
        );
        assert!(t.iter().any(|s| s == "val_accuracy"));
        // Trials, none reporting yet; a best index out of range; a NaN-only curve.
        let mut v = v;
        v.trials = vec![
            TrialRow {
                id: 1,
                state: TrialStatus::Running,
                curve: vec![(10, f64::NAN)],
                step: 10,
                latest: Some(f64::NAN),
                ..TrialRow::default()
            },
            TrialRow {
                id: 2,
                ..TrialRow::default()
            },
        ];
        v.best = Some(7);
        assert!(
            v.text().ends_with(
                "\n    1  running    10                  NaN                  –  0.0s\n    2  pending     –                    –                  –     –"
            ),
            "{}",
            v.text()
        );
        parse_html(&v.html());
        assert!(texts(&sweep_svg(&v, 720, 320))
            .iter()
            .any(|s| s.starts_with("waiting")));
    }

    #[test]
    fn a_hundred_trials_show_in_the_table_and_twenty_lines_are_labelled() {
        let mut v = SweepView::new(
            "sweep · big".into(),
            "eval_loss".into(),
            Goal::Min,
            vec!["lr".into(), "batch".into()],
            LogLevel::Info,
        );
        for id in 1..=100usize {
            let state = match id {
                1..=70 => TrialStatus::Pruned,
                71..=90 => TrialStatus::Succeeded,
                91..=94 => TrialStatus::Running,
                _ => TrialStatus::Pending,
            };
            let reports = match state {
                TrialStatus::Pruned => 1 + id % 3,
                TrialStatus::Pending => 0,
                _ => 8,
            };
            let curve: Vec<(u64, f64)> = (1..=reports as u64)
                .map(|r| (r * 60, 1.0 / (r as f64 + 1.0) + (id % 17) as f64 * 0.01))
                .collect();
            v.trials.push(trial(
                id,
                &format!("{:.0e}", 1e-5 * id as f64),
                state,
                &curve,
            ));
        }
        v.best = Some(84); // trial 85
        let t = v.text();
        assert_eq!(
            t.lines().count(),
            3 + 1 + 100,
            "title, summary, best, header, rows"
        );
        assert!(
            t.contains("\n ★ 85  9e-4     32  succeeded  480/480"),
            "{t}"
        );
        assert!(t.lines().last().unwrap().starts_with("  100 "));
        assert!(t.contains("4 running · 20 succeeded · 70 pruned · 6 pending"));

        let h = v.html();
        let doc = parse_html(&h);
        let rows = doc.descendants().filter(|n| n.has_tag_name("tr")).count();
        assert_eq!(rows, 101, "header and every trial");

        let svg = sweep_svg(&v, 720, 320);
        let all = polylines(&svg);
        let coloured = all
            .iter()
            .filter(|(s, ..)| LINES.iter().any(|c| css(*c).eq_ignore_ascii_case(s)))
            .count();
        let faint = all
            .iter()
            .filter(|(s, ..)| s.eq_ignore_ascii_case(&css(FAINT)))
            .count();
        assert_eq!(coloured, MAX_LABELLED_LINES);
        assert_eq!(coloured + faint, 94, "one line per trial with points");
        let labels: Vec<String> = texts(&svg)
            .into_iter()
            .filter(|s| s.starts_with('#') && s[1..].parse::<usize>().is_ok())
            .collect();
        assert_eq!(labels.len(), MAX_LABELLED_LINES);
        for must in ["#85", "#91", "#92", "#93", "#94"] {
            assert!(labels.iter().any(|l| l == must), "{must} in {labels:?}");
        }
        assert!(texts(&svg)
            .iter()
            .any(|s| s.contains("74 more trials in grey")));
    }
}
