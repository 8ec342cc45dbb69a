//! The sweep view: a hyper-parameter sweep's trials (some running at once, some stopped early
//! by the scheduler) as one table, one plot of every trial's metric against steps, the best
//! trial highlighted, and the workers' log lines. HTML with an inline SVG for notebooks; an
//! aligned table for terminals.

use crate::format::{format_duration, format_metric};
use crate::grid::{Align, Grid, Row};
use crate::html::escape;
use crate::logs::{LogLevel, LogPanel};
use crate::series::downsample_minmax;
use crate::theme::{css, rgb, BLUE, GREEN, GREY, LINES, ORANGE, RED};
use crate::Bundle;
use plotters::coord::types::{RangedCoordf64, RangedCoordu64};
use plotters::prelude::*;
use serde_json::Value;
use std::cmp::Ordering;
use std::error::Error;
use trainbook_api::plumbing::trials::{count_by_status, counts_line};
use trainbook_api::{Goal, TrialStatus};

/// Lines the plot labels and colours (the best trial, the running ones, then the best of the
/// rest); the others are drawn faint and unlabelled.
pub const MAX_LABELLED_LINES: usize = 20;
/// Points drawn per trial (longer curves are down-sampled, spikes kept).
pub const MAX_POINTS_PER_TRIAL: usize = 500;
/// The plot's size in the HTML view.
pub const PLOT_WIDTH: u32 = 720;
pub const PLOT_HEIGHT: u32 = 320;
/// Log lines a new view keeps.
pub const LOG_LINES: usize = 10;

/// The HTML status cell's symbol (`×` is also the plot's pruned marker).
fn status_symbol(s: TrialStatus) -> &'static str {
    match s {
        TrialStatus::Pending => "○",
        TrialStatus::Running => "●",
        TrialStatus::Pruned => "×",
        TrialStatus::Succeeded => "✓",
        TrialStatus::Failed => "✗",
        TrialStatus::Stopped => "■",
    }
}

/// The status colour (readable on light and dark notebook themes).
pub fn status_color(s: TrialStatus) -> &'static str {
    match s {
        TrialStatus::Pending | TrialStatus::Pruned => GREY,
        TrialStatus::Running => BLUE,
        TrialStatus::Succeeded => GREEN,
        TrialStatus::Failed => RED,
        TrialStatus::Stopped => ORANGE,
    }
}

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
    /// `120/480`, `120` (total unknown), `–` (pending, nothing done).
    fn step_text(&self) -> String {
        if self.state == TrialStatus::Pending && self.step == 0 {
            "–".into()
        } else if self.total_steps > 0 {
            format!("{}/{}", self.step, self.total_steps)
        } else {
            self.step.to_string()
        }
    }

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

/// A line of the plot: which trial, and how it is drawn.
struct Line {
    /// Index into `trials`.
    index: usize,
    points: Vec<(u64, f64)>,
    /// Coloured and labelled (else faint grey, unlabelled).
    labelled: bool,
    color: RGBColor,
}

/// Pixels a line label takes vertically (plotters draws 11-point text about 9 pixels high).
const LABEL_HEIGHT: i32 = 11;
const FAINT: RGBColor = rgb(GREY);
const FAILED: RGBColor = rgb(RED);

/// A labelled line's colour, by trial number (stable while the view is redrawn).
fn palette(id: usize) -> RGBColor {
    LINES[id.saturating_sub(1) % LINES.len()]
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

    /// Whether the note column has anything to show.
    fn has_notes(&self) -> bool {
        self.trials
            .iter()
            .any(|t| t.note.as_deref().is_some_and(|n| !n.trim().is_empty()))
    }

    /// Column names and alignments. A parameter column is right-aligned when every value in it
    /// is a number.
    fn columns(&self) -> (Vec<String>, Vec<Align>) {
        let mut names = vec!["trial".to_string()];
        let mut align = vec![Align::Right];
        for (i, p) in self.params.iter().enumerate() {
            names.push(p.clone());
            let numeric = self
                .trials
                .iter()
                .filter_map(|t| t.params.get(i))
                .all(|v| v.trim().parse::<f64>().is_ok());
            align.push(if numeric { Align::Right } else { Align::Left });
        }
        names.push("status".into());
        align.push(Align::Left);
        names.push("step".into());
        align.push(Align::Right);
        names.push(format!("latest {}", self.metric));
        align.push(Align::Right);
        names.push(format!("best {}", self.metric));
        align.push(Align::Right);
        names.push("time".into());
        align.push(Align::Right);
        if self.has_notes() {
            names.push("note".into());
            align.push(Align::Left);
        }
        (names, align)
    }

    /// A trial's cells after the trial column: parameters, status, step, latest, best, time
    /// (and note, when the table has that column).
    fn cells(&self, t: &TrialRow, notes: bool) -> Vec<String> {
        let dash = || "–".to_string();
        let mut cells: Vec<String> = (0..self.params.len())
            .map(|i| t.params.get(i).cloned().unwrap_or_else(dash))
            .collect();
        cells.push(t.state.name().into());
        cells.push(t.step_text());
        cells.push(t.latest.map(format_metric).unwrap_or_else(dash));
        cells.push(t.best.map(format_metric).unwrap_or_else(dash));
        cells.push(if t.state == TrialStatus::Pending && t.elapsed <= 0.0 {
            dash()
        } else {
            format_duration(t.elapsed)
        });
        if notes {
            cells.push(note_line(t.note.as_deref()));
        }
        cells
    }

    /// The table as text: every trial, the best one's number marked `★`.
    fn table_text(&self) -> String {
        let (columns, align) = self.columns();
        let notes = self.has_notes();
        let rows = self
            .trials
            .iter()
            .enumerate()
            .map(|(i, t)| {
                let mark = if self.is_best(i) { "★ " } else { "" };
                let mut cells = vec![format!("{mark}{}", t.id)];
                cells.extend(self.cells(t, notes));
                Row::Cells(cells)
            })
            .collect();
        Grid {
            columns,
            align,
            rows,
            class: "trainbook-sweep-table",
            ..Grid::default()
        }
        .text()
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

    /// The table as HTML: every trial (in a scrolling box when long), the best row bold on a
    /// green tint, status cells coloured, labelled plot lines' colours beside the trial numbers.
    fn table_html(&self) -> String {
        let (columns, align) = self.columns();
        let notes = self.has_notes();
        let colors: Vec<Option<RGBColor>> = if self.plot {
            let mut c = vec![None; self.trials.len()];
            for l in plot_lines(self).iter().filter(|l| l.labelled) {
                c[l.index] = Some(l.color);
            }
            c
        } else {
            vec![None; self.trials.len()]
        };
        let status_col = 1 + self.params.len();
        let note_col = status_col + 5;
        let style = |i: usize| {
            let a = match align.get(i) {
                Some(Align::Left) => "left",
                _ => "right",
            };
            let wrap = if i == note_col {
                "white-space:normal;min-width:12em;max-width:36em"
            } else {
                "white-space:pre"
            };
            format!("padding:2px 8px;text-align:{a};font-variant-numeric:tabular-nums;{wrap}")
        };
        let mut h = String::from(
            "<div style=\"display:inline-block;max-width:100%;max-height:36em;overflow:auto;margin:4px 0;vertical-align:top\">\
             <table class=\"trainbook-sweep-table\" style=\"border-collapse:collapse;font-size:12px\"><thead><tr>",
        );
        for (i, c) in columns.iter().enumerate() {
            h.push_str(&format!(
                "<th style=\"{};position:sticky;top:0;background:var(--jp-layout-color1,var(--vscode-editor-background,#fff));\
                 border-bottom:1px solid rgba(127,127,127,0.45)\">{}</th>",
                style(i),
                escape(c)
            ));
        }
        h.push_str("</tr></thead><tbody>");
        for (i, t) in self.trials.iter().enumerate() {
            let best = self.is_best(i);
            let row_style = if best {
                "font-weight:bold;background:rgba(46,125,50,0.16)"
            } else if t.state == TrialStatus::Pending {
                "opacity:0.6"
            } else {
                ""
            };
            h.push_str(&format!("<tr style=\"{row_style}\">"));
            let swatch = colors[i]
                .map(|c| format!("<span style=\"color:{}\">━</span> ", css(c)))
                .unwrap_or_default();
            let mark = if best { "★ " } else { "" };
            h.push_str(&format!(
                "<td style=\"{}\" title=\"trial {}\">{swatch}{mark}{}</td>",
                style(0),
                t.id,
                t.id
            ));
            for (j, cell) in self.cells(t, notes).iter().enumerate() {
                let col = j + 1;
                let content = if col == status_col {
                    format!(
                        "<span style=\"color:{}\">{} {}</span>",
                        status_color(t.state),
                        status_symbol(t.state),
                        escape(cell)
                    )
                } else if col == note_col && t.state == TrialStatus::Failed {
                    format!("<span style=\"color:{RED}\">{}</span>", escape(cell))
                } else if col == note_col {
                    format!("<span style=\"color:{GREY}\">{}</span>", escape(cell))
                } else {
                    escape(cell)
                };
                h.push_str(&format!("<td style=\"{}\">{content}</td>", style(col)));
            }
            h.push_str("</tr>");
        }
        h.push_str("</tbody></table></div>");
        h
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

/// The first line of a note, or "" (one line per row).
fn note_line(note: Option<&str>) -> String {
    note.and_then(|n| n.lines().map(str::trim).find(|l| !l.is_empty()))
        .unwrap_or("")
        .to_string()
}

/// The `<svg ...>...</svg>` element of a document (drops an XML declaration, if any).
fn svg_body(svg: &str) -> &str {
    svg.find("<svg").map_or(svg, |i| &svg[i..])
}

/// `a` before `b` when `a` is the better value; values missing or not finite come last.
fn better(a: Option<f64>, b: Option<f64>, goal: Goal) -> Ordering {
    let key = |v: Option<f64>| v.filter(|v| v.is_finite());
    match (key(a), key(b)) {
        (Some(a), Some(b)) if goal == Goal::Min => a.total_cmp(&b),
        (Some(a), Some(b)) => b.total_cmp(&a),
        (Some(_), None) => Ordering::Less,
        (None, Some(_)) => Ordering::Greater,
        (None, None) => Ordering::Equal,
    }
}

/// The lines to draw, in drawing order: faint ones first, then the labelled ones from the least
/// to the most important (the best trial last, on top). Labelled: the best trial, the running
/// ones, then the best of the rest, [`MAX_LABELLED_LINES`] in all. Trials without a finite
/// point have no line.
fn plot_lines(view: &SweepView) -> Vec<Line> {
    let mut with_points: Vec<(usize, Vec<(u64, f64)>)> = view
        .trials
        .iter()
        .enumerate()
        .filter_map(|(i, t)| {
            let mut pts: Vec<(u64, f64)> = t
                .curve
                .iter()
                .copied()
                .filter(|p| p.1.is_finite())
                .collect();
            if pts.is_empty() {
                return None;
            }
            pts.sort_by_key(|p| p.0);
            if pts.len() > MAX_POINTS_PER_TRIAL {
                let f: Vec<(f64, f64)> = pts.iter().map(|&(x, y)| (x as f64, y)).collect();
                pts = downsample_minmax(&f, MAX_POINTS_PER_TRIAL)
                    .into_iter()
                    .map(|(x, y)| (x as u64, y))
                    .collect();
            }
            Some((i, pts))
        })
        .collect();
    // Importance: best trial, running trials, the rest; within each, better values first.
    let rank = |i: usize| -> u8 {
        if view.is_best(i) {
            0
        } else if view.trials[i].state == TrialStatus::Running {
            1
        } else {
            2
        }
    };
    with_points.sort_by(|(a, _), (b, _)| {
        rank(*a).cmp(&rank(*b)).then_with(|| {
            better(
                view.trials[*a].best_value(view.goal),
                view.trials[*b].best_value(view.goal),
                view.goal,
            )
        })
    });
    let mut lines: Vec<Line> = with_points
        .into_iter()
        .enumerate()
        .map(|(order, (index, points))| {
            let labelled = order < MAX_LABELLED_LINES;
            Line {
                index,
                points,
                labelled,
                color: if labelled {
                    palette(view.trials[index].id)
                } else {
                    FAINT
                },
            }
        })
        .collect();
    lines.reverse();
    lines
}

/// The y range of the plot: every value, unless some trials diverged far past the rest (above
/// for a minimised metric) — then the range ends 3 interquartile ranges past the quartile, so
/// one exploding trial does not flatten the others; its line runs into the plot's edge.
fn y_range(values: &[f64], goal: Goal) -> Option<(f64, f64)> {
    let mut v: Vec<f64> = values.iter().copied().filter(|x| x.is_finite()).collect();
    v.sort_by(f64::total_cmp);
    let q = |p: f64| v[((v.len() - 1) as f64 * p).round() as usize];
    if v.len() < 4 {
        return crate::plot::span(v.into_iter());
    }
    let (q1, q3) = (q(0.25), q(0.75));
    let reach = 3.0 * (q3 - q1).max(q3.abs().max(q1.abs()) * 0.05);
    let kept = v.iter().copied().filter(|x| match goal {
        Goal::Min => *x <= q3 + reach,
        Goal::Max => *x >= q1 - reach,
    });
    crate::plot::span(kept)
}

/// The plot: the metric of every trial against steps, one line per trial; the best trial's
/// line thicker, pruned trials' lines ending in `×`, running ones in a dot, failed ones in a
/// red ring; at most [`MAX_LABELLED_LINES`] lines coloured and labelled with their trial
/// number, the rest faint. Never fails: a drawing error becomes an SVG saying so.
pub fn sweep_svg(view: &SweepView, width: u32, height: u32) -> String {
    let (width, height) = (width.max(120), height.max(80));
    let mut svg = String::new();
    if let Err(e) = draw(&mut svg, view, width, height) {
        svg = format!(
            "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{width}\" height=\"{height}\">\
             <text x=\"10\" y=\"20\" font-family=\"sans-serif\" font-size=\"13\">sweep plot failed: {}</text></svg>",
            escape(&e.to_string())
        );
    }
    svg
}

/// What the plot's caption says: which line is the best, what the markers mean.
fn caption(view: &SweepView, lines: &[Line], (y0, y1): (f64, f64)) -> String {
    let mut parts = vec![format!(
        "{} per trial ({} is better)",
        view.metric,
        match view.goal {
            Goal::Min => "lower",
            Goal::Max => "higher",
        }
    )];
    let drawn = |s: TrialStatus| lines.iter().any(|l| view.trials[l.index].state == s);
    if let Some(b) = lines.iter().find(|l| view.is_best(l.index)) {
        parts.push(format!("thick: best, #{}", view.trials[b.index].id));
    }
    if drawn(TrialStatus::Pruned) {
        parts.push("× pruned".into());
    }
    if drawn(TrialStatus::Running) {
        parts.push("● running".into());
    }
    let off: Vec<String> = lines
        .iter()
        .filter(|l| l.points.iter().any(|p| !(y0..=y1).contains(&p.1)))
        .map(|l| format!("#{}", view.trials[l.index].id))
        .collect();
    if !off.is_empty() {
        parts.push(format!("off the scale: {}", off.join(", ")));
    }
    let faint = lines.iter().filter(|l| !l.labelled).count();
    if faint > 0 {
        parts.push(format!(
            "{faint} more trial{} in grey",
            if faint == 1 { "" } else { "s" }
        ));
    }
    parts.join(" · ")
}

fn draw(out: &mut String, view: &SweepView, width: u32, height: u32) -> Result<(), Box<dyn Error>> {
    let lines = plot_lines(view);
    let x1 = lines
        .iter()
        .flat_map(|l| l.points.iter().map(|p| p.0))
        .max()
        .unwrap_or(0)
        .max(1);
    let values: Vec<f64> = lines
        .iter()
        .flat_map(|l| l.points.iter().map(|p| p.1))
        .collect();
    let (y0, y1) = y_range(&values, view.goal).unwrap_or((0.0, 1.0));

    let root = SVGBackend::with_string(out, (width, height)).into_drawing_area();
    root.fill(&WHITE)?;
    let mut chart = ChartBuilder::on(&root)
        .margin(8)
        .margin_right(40)
        .caption(caption(view, &lines, (y0, y1)), ("sans-serif", 12))
        .x_label_area_size(34)
        .y_label_area_size(58)
        .build_cartesian_2d(0u64..x1, y0..y1)?;
    chart
        .configure_mesh()
        .light_line_style(BLACK.mix(0.06))
        .bold_line_style(BLACK.mix(0.12))
        .x_desc("step")
        .y_desc(view.metric.as_str())
        .label_style(("sans-serif", 12))
        .draw()?;

    if lines.is_empty() {
        root.draw(&Text::new(
            "waiting for the first report…",
            (width as i32 / 2 - 95, height as i32 / 2),
            ("sans-serif", 14).into_font().color(&BLACK.mix(0.6)),
        ))?;
        root.present()?;
        return Ok(());
    }

    for l in &lines {
        draw_line(&mut chart, l, view, (y0, y1))?;
    }
    draw_labels(&root, &chart, &lines, view, (y0, y1))?;
    root.present()?;
    Ok(())
}

type SweepChart<'a, 'b> =
    ChartContext<'a, SVGBackend<'b>, Cartesian2d<RangedCoordu64, RangedCoordf64>>;

/// One trial's line and the marker at its end (pruned: a cross; running: a dot; failed: a
/// red ring).
fn draw_line(
    chart: &mut SweepChart,
    l: &Line,
    view: &SweepView,
    (y0, y1): (f64, f64),
) -> Result<(), Box<dyn Error>> {
    let t = &view.trials[l.index];
    let best = view.is_best(l.index);
    let (style, marker_style) = if l.labelled {
        let w = if best { 4 } else { 2 };
        (l.color.stroke_width(w), l.color.stroke_width(2))
    } else {
        (
            FAINT.mix(0.35).stroke_width(1),
            FAINT.mix(0.5).stroke_width(1),
        )
    };
    // Values past the range (diverged trials) are drawn at its edge.
    let clamp = |(x, y): (u64, f64)| (x, y.clamp(y0, y1));
    chart.draw_series(LineSeries::new(l.points.iter().copied().map(clamp), style))?;
    let last = clamp(*l.points.last().expect("lines have points"));
    let size = if l.labelled { 4 } else { 3 };
    match t.state {
        TrialStatus::Pruned => {
            chart.draw_series(std::iter::once(Cross::new(last, size, marker_style)))?;
        }
        TrialStatus::Running => {
            let fill = if l.labelled {
                l.color.filled()
            } else {
                FAINT.mix(0.5).filled()
            };
            chart.draw_series(std::iter::once(Circle::new(last, size - 1, fill)))?;
        }
        TrialStatus::Failed => {
            chart.draw_series(std::iter::once(Circle::new(
                last,
                size,
                FAILED.stroke_width(2),
            )))?;
        }
        _ if l.points.len() == 1 => {
            // A single point draws no line: show it.
            let fill = if l.labelled {
                l.color.filled()
            } else {
                FAINT.mix(0.5).filled()
            };
            chart.draw_series(std::iter::once(Circle::new(last, 2, fill)))?;
        }
        _ => {}
    }
    Ok(())
}

/// Labels at the lines' ends, the most important placed first, each at the free spot
/// nearest its line's end inside the plot; one moved off its line's end gets a faint leader.
fn draw_labels(
    root: &DrawingArea<SVGBackend, plotters::coord::Shift>,
    chart: &SweepChart,
    lines: &[Line],
    view: &SweepView,
    (y0, y1): (f64, f64),
) -> Result<(), Box<dyn Error>> {
    let (_, rows) = chart.plotting_area().get_pixel_range();
    let (top, bottom) = (rows.start, rows.end);
    let mut placed: Vec<(i32, i32, i32, i32)> = Vec::new();
    for l in lines.iter().rev().filter(|l| l.labelled) {
        let t = &view.trials[l.index];
        let (lx, ly) = *l.points.last().expect("lines have points");
        let off = !(y0..=y1).contains(&ly);
        // A line that ends off the scale says where it went: "#4 ↑255".
        let label = match off {
            true => format!(
                "#{} {}{}",
                t.id,
                if ly > y1 { "↑" } else { "↓" },
                format_metric(ly)
            ),
            false => format!("#{}", t.id),
        };
        let (px, py) = chart.backend_coord(&(lx, ly.clamp(y0, y1)));
        let (w, h) = (6 * label.chars().count() as i32 + 4, LABEL_HEIGHT);
        let x = px + 6;
        let free = |y: i32| {
            !placed
                .iter()
                .any(|&(bx, by, bw, bh)| x < bx + bw && bx < x + w && y < by + bh && by < y + h)
        };
        let want = py - h / 2;
        let inside = |y: &i32| *y >= top - h / 2 && *y + h <= bottom + h / 2;
        let y = (0..=(bottom - top) / 2 + h)
            .flat_map(|k| [want - k, want + k])
            .filter(inside)
            .find(|&y| free(y))
            .unwrap_or(want);
        placed.push((x, y, w, h));
        if (y - want).abs() > h / 2 {
            root.draw(&PathElement::new(
                vec![(px + 2, py), (x - 1, y + h / 2)],
                l.color.mix(0.5).stroke_width(1),
            ))?;
        }
        let font = if view.is_best(l.index) {
            ("sans-serif", 12, FontStyle::Bold).into_font()
        } else {
            ("sans-serif", 11).into_font()
        };
        root.draw(&Text::new(label, (x, y), font.color(&l.color)))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::logs::LogLine;

    fn trial(id: usize, lr: &str, state: TrialStatus, curve: &[(u64, f64)]) -> TrialRow {
        let best = curve.iter().map(|p| p.1).reduce(f64::min);
        TrialRow {
            id,
            params: vec![lr.into(), "32".into()],
            state,
            step: curve.last().map_or(0, |p| p.0),
            total_steps: 480,
            latest: curve.last().map(|p| p.1),
            best,
            elapsed: curve.len() as f64 * 30.0,
            curve: curve.to_vec(),
            note: None,
        }
    }

    /// Six trials, two running, one pruned, three pending; trial 3 is the best.
    fn sweep() -> SweepView {
        let mut v = SweepView::new(
            "sweep · bert · 6 trials, 2 at a time".into(),
            "eval_loss".into(),
            Goal::Min,
            vec!["lr".into(), "batch".into()],
            LogLevel::Info,
        );
        v.trials = vec![
            TrialRow {
                note: Some("pruned at report 1: 0.693 worse than 0.651".into()),
                ..trial(1, "0.01", TrialStatus::Pruned, &[(120, 0.693)])
            },
            trial(
                2,
                "0.003",
                TrialStatus::Running,
                &[(120, 0.651), (240, 0.60)],
            ),
            trial(
                3,
                "0.001",
                TrialStatus::Running,
                &[(120, 0.62), (240, 0.512)],
            ),
            trial(4, "0.0003", TrialStatus::Pending, &[]),
            trial(5, "0.0001", TrialStatus::Pending, &[]),
            trial(6, "0.00003", TrialStatus::Pending, &[]),
        ];
        v.best = Some(2);
        v.elapsed = 65.0;
        v
    }

    /// The trials' lines in an SVG document, (stroke, stroke-width, point count): polylines
    /// drawn opaque (coloured lines) or at 0.35 (faint ones); label leaders are drawn at 0.5.
    fn polylines(svg: &str) -> Vec<(String, String, usize)> {
        let doc = roxmltree::Document::parse(svg).expect("the SVG is well-formed XML");
        doc.descendants()
            .filter(|n| n.has_tag_name("polyline"))
            .filter(|n| matches!(n.attribute("opacity"), Some("1") | Some("0.35")))
            .map(|n| {
                (
                    n.attribute("stroke").unwrap_or("").to_string(),
                    n.attribute("stroke-width").unwrap_or("").to_string(),
                    n.attribute("points")
                        .unwrap_or("")
                        .split_whitespace()
                        .count(),
                )
            })
            .collect()
    }

    fn texts(svg: &str) -> Vec<String> {
        let doc = roxmltree::Document::parse(svg).unwrap();
        doc.descendants()
            .filter(|n| n.has_tag_name("text"))
            .map(|n| n.text().unwrap_or("").trim().to_string())
            .collect()
    }

    /// The HTML parsed as XML (it is written well-formed, so a stray `<` shows up here).
    fn parse_html(html: &str) -> roxmltree::Document<'_> {
        roxmltree::Document::parse(html).unwrap_or_else(|e| panic!("{e}: {html}"))
    }

    #[test]
    fn states_have_names_and_know_when_they_are_finished() {
        let names: Vec<&str> = [
            TrialStatus::Pending,
            TrialStatus::Running,
            TrialStatus::Pruned,
            TrialStatus::Succeeded,
            TrialStatus::Failed,
            TrialStatus::Stopped,
        ]
        .iter()
        .map(|s| s.name())
        .collect();
        assert_eq!(
            names,
            [
                "pending",
                "running",
                "pruned",
                "succeeded",
                "failed",
                "stopped"
            ]
        );
        assert!(!TrialStatus::Pending.is_finished());
        assert!(!TrialStatus::Running.is_finished());
        assert!(TrialStatus::Pruned.is_finished());
        assert!(TrialStatus::Succeeded.is_finished());
        assert!(TrialStatus::Failed.is_finished());
        assert!(TrialStatus::Stopped.is_finished());
        assert_eq!(status_color(TrialStatus::Running), BLUE);
        assert_eq!(status_color(TrialStatus::Succeeded), GREEN);
        assert_eq!(status_color(TrialStatus::Failed), RED);
    }

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
    fn text_is_an_aligned_table_with_the_best_trial_starred() {
        let mut v = sweep();
        v.finished = true;
        v.footer = Some("results: runs/sweep-1/results.csv".into());
        v.logs.push(LogLine {
            rank: None,
            text: "[trial 3] epoch 2 done".into(),
            repeats: None,
            is_error: false,
        });
        let t = v.text();
        let lines: Vec<&str> = t.lines().collect();
        assert_eq!(
            lines[1],
            "2 running · 1 pruned · 3 pending · finished after 1m 05s"
        );
        assert_eq!(
            lines[2],
            "best: trial 3 (lr=0.001, batch=32) eval_loss 0.5120"
        );
        let table = [
            "trial       lr  batch  status      step  latest eval_loss  best eval_loss    time  note",
            "    1     0.01     32  pruned   120/480            0.6930          0.6930   30.0s  pruned at report 1: 0.693 worse than 0.651",
            "    2    0.003     32  running  240/480            0.6000          0.6000  1m 00s",
            "  ★ 3    0.001     32  running  240/480            0.5120          0.5120  1m 00s",
            "    4   0.0003     32  pending        –                 –               –       –",
            "    5   0.0001     32  pending        –                 –               –       –",
            "    6  0.00003     32  pending        –                 –               –       –",
        ];
        assert_eq!(lines[3..10], table, "{t}");
        assert_eq!(lines[10], "results: runs/sweep-1/results.csv");
        assert_eq!(lines[11], "[trial 3] epoch 2 done");
        assert_eq!(t.matches('★').count(), 1);
    }

    #[test]
    fn html_highlights_the_best_row_and_colours_status() {
        let v = sweep();
        let h = v.html();
        let doc = parse_html(&h);
        let rows: Vec<_> = doc
            .descendants()
            .filter(|n| n.has_tag_name("tbody"))
            .flat_map(|b| b.children().filter(|n| n.has_tag_name("tr")))
            .collect();
        assert_eq!(rows.len(), 6);
        let highlighted: Vec<usize> = rows
            .iter()
            .enumerate()
            .filter(|(_, r)| {
                r.attribute("style")
                    .unwrap_or("")
                    .contains("font-weight:bold")
            })
            .map(|(i, _)| i)
            .collect();
        assert_eq!(highlighted, [2], "only trial 3's row");
        let first_cell: String = rows[2]
            .children()
            .next()
            .unwrap()
            .descendants()
            .filter_map(|n| n.text())
            .collect();
        assert!(first_cell.ends_with("★ 3"), "{first_cell:?}");
        assert_eq!(h.matches("★ 3<").count(), 1);
        assert!(h.contains(&format!("<span style=\"color:{BLUE}\">● running</span>")));
        assert!(h.contains(&format!("<span style=\"color:{GREY}\">× pruned</span>")));
        assert!(h.contains("best: trial 3 (lr=0.001, batch=32) eval_loss 0.5120"));
        // Pending rows are dimmed, numbers tabular, the header sticks.
        assert!(rows[3].attribute("style").unwrap().contains("opacity:0.6"));
        assert!(h.contains("font-variant-numeric:tabular-nums"));
        assert!(h.contains("position:sticky"));
        let b = v.bundle();
        assert_eq!(b.len(), 2);
        assert_eq!(b["text/plain"], Value::String(v.text()));
        assert_eq!(b["text/html"], Value::String(h.clone()));
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
    fn svg_draws_one_line_per_trial_with_points_and_names_the_metric() {
        let v = sweep();
        let svg = sweep_svg(&v, 720, 320);
        let lines: Vec<_> = polylines(&svg)
            .into_iter()
            .filter(|(stroke, ..)| LINES.iter().any(|c| css(*c).eq_ignore_ascii_case(stroke)))
            .collect();
        // Trials 1–3 have points; the pending ones do not.
        assert_eq!(lines.len(), 3, "{svg}");
        let best = css(palette(3)).to_uppercase();
        assert!(
            lines
                .iter()
                .any(|(s, w, n)| *s == best && w == "4" && *n == 2),
            "the best line is thicker: {lines:?}"
        );
        assert!(lines.iter().all(|(s, w, _)| *s == best || w == "2"));
        let t = texts(&svg);
        assert!(t.iter().any(|s| s == "eval_loss"), "{t:?}");
        assert!(t.iter().any(|s| s == "step"));
        for label in ["#1", "#2", "#3"] {
            assert!(t.iter().any(|s| s == label), "{label} in {t:?}");
        }
        assert!(t
            .iter()
            .any(|s| s.contains("thick: best, #3") && s.contains("× pruned")));
        // The pruned trial's line ends with a cross: two strokes of its colour.
        let doc = roxmltree::Document::parse(&svg).unwrap();
        let crosses = doc
            .descendants()
            .filter(|n| {
                n.has_tag_name("line")
                    && n.attribute("stroke") == Some(&css(palette(1)).to_uppercase())
            })
            .count();
        assert_eq!(crosses, 2);
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

    #[test]
    fn a_diverged_trial_does_not_flatten_the_plot() {
        let values = [0.60, 0.62, 0.65, 0.66, 0.70, 0.69, 68.0, 299.0];
        let (lo, hi) = y_range(&values, Goal::Min).unwrap();
        assert!(lo < 0.6 && hi > 0.7 && hi < 1.0, "{lo}..{hi}");
        // For a maximised metric the outliers are the low ones.
        let acc = [0.80, 0.82, 0.85, 0.86, 0.84, 0.83, 0.0, 0.01];
        let (lo, hi) = y_range(&acc, Goal::Max).unwrap();
        assert!(lo > 0.5 && hi > 0.86, "{lo}..{hi}");
        // Without outliers every value is in range.
        let (lo, hi) = y_range(&[0.1, 0.5, 0.9, 1.3], Goal::Min).unwrap();
        assert!(lo < 0.1 && hi > 1.3);
    }
}
