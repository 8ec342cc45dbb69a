//! The dashboard: progress, loss plot, metrics table and log panel in one view, which becomes
//! the result view (final metrics, checkpoint, run directory, final plot) when the run ends.

use crate::html::escape;
use crate::logs::{LogLevel, LogPanel};
use crate::plot::{loss_svg, svg_to_png, PlotOptions};
use crate::progress::ProgressView;
use crate::series::Curves;
use crate::table::MetricsTable;
use crate::theme::{GREY, ORANGE, RED};
use crate::{plot, Bundle};
use base64::Engine as _;
use serde_json::Value;
use trainbook_api::JobStatus;

/// What the dashboard shows.
#[derive(Clone, Debug)]
pub struct DashboardOptions {
    pub plot: bool,
    pub logs: bool,
    pub log_level: LogLevel,
    /// Log lines kept in view.
    pub log_lines: usize,
    pub log_y: bool,
}

impl Default for DashboardOptions {
    fn default() -> Self {
        DashboardOptions {
            plot: true,
            logs: true,
            log_level: LogLevel::Info,
            log_lines: 10,
            log_y: false,
        }
    }
}

/// How a run ended.
#[derive(Clone, Debug, Default)]
pub struct Outcome {
    /// Final metrics in display order, already formatted (`("val accuracy", "0.9860")`).
    pub metrics: Vec<(String, String)>,
    pub checkpoint: Option<String>,
    /// The failing rank's error (or why the run stopped).
    pub error: Option<String>,
    /// Each rank's memory at the end (none when the workers did not report it).
    pub memory: Vec<crate::memory::MemoryUse>,
}

#[derive(Clone, Debug)]
pub struct Dashboard {
    /// `bert · 2 workers on cpu`.
    pub title: String,
    pub run_dir: String,
    pub progress: ProgressView,
    pub curves: Curves,
    pub logs: LogPanel,
    pub table: MetricsTable,
    pub outcome: Option<Outcome>,
    pub options: DashboardOptions,
}

impl Dashboard {
    pub fn new(
        title: impl Into<String>,
        world: usize,
        run_dir: impl Into<String>,
        options: DashboardOptions,
    ) -> Dashboard {
        let run_dir = run_dir.into();
        let mut logs = LogPanel::new(options.log_level, options.log_lines);
        logs.path = Some(format!("{run_dir}/logs"));
        Dashboard {
            title: title.into(),
            run_dir,
            progress: ProgressView::default(),
            curves: Curves::new(world),
            logs,
            table: MetricsTable::default(),
            outcome: None,
            options,
        }
    }

    pub fn status(&self) -> JobStatus {
        self.progress.status
    }

    fn plot_options(&self) -> PlotOptions {
        PlotOptions {
            log_y: self.options.log_y,
            title: format!("loss · {}", self.title),
            ..PlotOptions::default()
        }
    }

    /// The whole view as plain text (`text/plain`).
    pub fn text(&self) -> String {
        self.text_with(self.options.logs)
    }

    /// The view without its log panel: what a terminal prints at the end of a run, having
    /// printed the lines as they came.
    pub fn summary_text(&self) -> String {
        self.text_with(false)
    }

    fn text_with(&self, logs: bool) -> String {
        let mut out = vec![format!("trainbook · {}", self.title), self.progress.text()];
        if let Some(o) = &self.outcome {
            if !o.metrics.is_empty() {
                out.push(metrics_line(o));
            }
            if let Some(c) = &o.checkpoint {
                out.push(format!("checkpoint: {c}"));
            }
        }
        if self.options.plot {
            out.push(format!("loss: {}", plot::summary(&self.curves)));
        }
        out.extend(self.restarts_line());
        if !self.table.is_empty() {
            out.push(self.table.text());
        }
        if let Some(o) = self.outcome.as_ref().filter(|o| !o.memory.is_empty()) {
            out.push(crate::memory::memory_text(&o.memory));
        }
        if logs && !self.logs.is_empty() {
            out.push(self.logs.text());
        }
        if let Some(e) = self.outcome.as_ref().and_then(|o| o.error.as_ref()) {
            out.push(format!("error: {e}"));
        }
        out.push(format!("run directory: {}", self.run_dir));
        out.join("\n")
    }

    /// `restarts: 2 (last resumed at step 40)` (and an elastic job's `resized ...`) when the
    /// job restarted or changed its size and no plot (whose markers and summary show them) is
    /// shown: a replayed stretch of steps should not go unexplained.
    fn restarts_line(&self) -> Option<String> {
        let last = self
            .curves
            .restarts()
            .last()
            .filter(|_| !self.options.plot)?;
        let restarts = (self.curves.restart_count() > 0).then(|| {
            format!(
                "restarts: {} (last resumed at step {last})",
                self.curves.restart_count()
            )
        });
        let resizes = match self.curves.resizes() {
            (0, _) => None,
            (n, w) => Some(format!("resized: {n}x (now {w} workers)")),
        };
        let parts: Vec<String> = restarts.into_iter().chain(resizes).collect();
        (!parts.is_empty()).then(|| parts.join(" · "))
    }

    /// The whole view as HTML with the plot inline.
    pub fn html(&self) -> String {
        self.html_with_svg(
            self.options
                .plot
                .then(|| loss_svg(&self.curves, &self.plot_options()))
                .as_deref(),
        )
    }

    fn html_with_svg(&self, svg: Option<&str>) -> String {
        let finished = self.status().is_finished();
        let mut h = String::from(
            "<div class=\"trainbook-dashboard\" style=\"font-family:var(--jp-ui-font-family,sans-serif);font-size:13px;max-width:760px\">",
        );
        h.push_str(&format!(
            "<div style=\"font-weight:bold;margin-bottom:2px\">trainbook · {}</div>",
            escape(&self.title)
        ));
        h.push_str(&self.progress.html());
        if let Some(o) = &self.outcome {
            if !o.metrics.is_empty() {
                h.push_str("<div style=\"display:flex;gap:18px;flex-wrap:wrap;margin:6px 0\">");
                for (k, v) in &o.metrics {
                    h.push_str(&format!(
                        "<div><div style=\"color:{GREY};font-size:11px\">{}</div><div style=\"font-size:16px;font-variant-numeric:tabular-nums\">{}</div></div>",
                        escape(k),
                        escape(v)
                    ));
                }
                h.push_str("</div>");
            }
            if let Some(c) = &o.checkpoint {
                h.push_str(&format!(
                    "<div>checkpoint: <code>{}</code></div>",
                    escape(c)
                ));
            }
            if let Some(e) = &o.error {
                h.push_str(&format!(
                    "<pre style=\"color:{RED};white-space:pre-wrap;margin:4px 0\">{}</pre>",
                    escape(e)
                ));
            }
        }
        if let Some(svg) = svg {
            h.push_str("<div class=\"trainbook-plot\">");
            h.push_str(svg_body(svg));
            h.push_str("</div>");
        }
        if let Some(r) = self.restarts_line() {
            h.push_str(&format!(
                "<div style=\"color:{ORANGE}\">{}</div>",
                escape(&r)
            ));
        }
        if !self.table.is_empty() {
            h.push_str(&self.table.html());
        }
        if let Some(o) = &self.outcome {
            h.push_str(&crate::memory::memory_html(&o.memory));
        }
        if self.options.logs && !self.logs.is_empty() {
            // A finished, successful run folds its logs away; a failed one keeps them open.
            if finished && self.status() == JobStatus::Succeeded {
                h.push_str(&format!(
                    "<details><summary style=\"color:{GREY}\">worker logs</summary>{}</details>",
                    self.logs.html()
                ));
            } else {
                h.push_str(&self.logs.html());
            }
        }
        h.push_str(&format!(
            "<div style=\"color:{GREY}\">run directory: <code>{}</code></div></div>",
            escape(&self.run_dir)
        ));
        h
    }

    /// The MIME bundle to display: HTML and text while running; once finished, also a PNG of
    /// the final plot for front ends that show neither HTML nor SVG.
    pub fn bundle(&self) -> Bundle {
        let svg = self
            .options
            .plot
            .then(|| loss_svg(&self.curves, &self.plot_options()));
        let mut b = Bundle::new();
        if self.status().is_finished() {
            if let Some(png) = svg.as_deref().and_then(|s| svg_to_png(s).ok()) {
                b.insert(
                    "image/png".into(),
                    Value::String(base64::engine::general_purpose::STANDARD.encode(png)),
                );
            }
        }
        b.insert(
            "text/html".into(),
            Value::String(self.html_with_svg(svg.as_deref())),
        );
        b.insert("text/plain".into(), Value::String(self.text()));
        b
    }
}

fn metrics_line(o: &Outcome) -> String {
    o.metrics
        .iter()
        .map(|(k, v)| format!("{k} {v}"))
        .collect::<Vec<_>>()
        .join(" · ")
}

/// The `<svg ...>...</svg>` element of a document (drops an XML declaration, if any).
fn svg_body(svg: &str) -> &str {
    svg.find("<svg").map_or(svg, |i| &svg[i..])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn restarts_are_told_by_the_plot_or_on_a_line_of_their_own() {
        let mut d = Dashboard::new("mlp", 2, "runs/1", DashboardOptions::default());
        for s in 1..=25 {
            d.curves.train_loss(0, s, 1.0);
            d.curves.train_loss(1, s, 1.0);
        }
        assert!(!d.text().contains("restart"), "{}", d.text());
        d.curves.restart(20);
        let t = d.text();
        assert!(t.contains("· 1 restart (resumed at step 20)"), "{t}");
        assert!(!t.contains("restarts:"), "said once: {t}");

        d.options.plot = false;
        let t = d.summary_text();
        assert!(
            t.contains("\nrestarts: 1 (last resumed at step 20)\n"),
            "{t}"
        );
        assert!(d.html().contains("restarts: 1 (last resumed at step 20)"));
    }

    #[test]
    fn an_elastic_job_s_resizes_are_told_apart_from_restarts() {
        let mut d = Dashboard::new("mlp", 4, "runs/1", DashboardOptions::default());
        for s in 1..=25 {
            for rank in 0..4 {
                d.curves.train_loss(rank, s, 1.0);
            }
        }
        d.curves.resize(3, 20);
        let t = d.text();
        assert!(t.contains("· resized once (now 3 workers)"), "{t}");
        assert!(!t.contains("restart"), "{t}");
        d.options.plot = false;
        let t = d.summary_text();
        assert!(t.contains("\nresized: 1x (now 3 workers)\n"), "{t}");
    }
}
