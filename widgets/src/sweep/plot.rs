//! The sweep plot: the metric of every trial against steps, one line per trial, the best
//! trial's line thicker, the most important ones coloured and labelled at their ends and the
//! rest faint; a trial's end marked by how it ended (pruned, running, failed). SVG from
//! plotters, drawn from the same [`SweepView`] as the table.

use super::SweepView;
use crate::format::format_metric;
use crate::html::escape;
use crate::series::downsample_minmax;
use crate::theme::{rgb, GREY, LINES, RED};
use plotters::coord::types::{RangedCoordf64, RangedCoordu64};
use plotters::prelude::*;
use std::cmp::Ordering;
use std::error::Error;
use trainbook_api::{Goal, TrialStatus};

/// Lines the plot labels and colours (the best trial, the running ones, then the best of the
/// rest); the others are drawn faint and unlabelled.
pub const MAX_LABELLED_LINES: usize = 20;
/// Points drawn per trial (longer curves are down-sampled, spikes kept).
pub const MAX_POINTS_PER_TRIAL: usize = 500;

/// A line of the plot: which trial, and how it is drawn.
pub(super) struct Line {
    /// Index into `trials`.
    pub(super) index: usize,
    points: Vec<(u64, f64)>,
    /// Coloured and labelled (else faint grey, unlabelled).
    pub(super) labelled: bool,
    pub(super) color: RGBColor,
}

/// Pixels a line label takes vertically (plotters draws 11-point text about 9 pixels high).
const LABEL_HEIGHT: i32 = 11;
pub(super) const FAINT: RGBColor = rgb(GREY);
const FAILED: RGBColor = rgb(RED);

/// A labelled line's colour, by trial number (stable while the view is redrawn).
fn palette(id: usize) -> RGBColor {
    LINES[id.saturating_sub(1) % LINES.len()]
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

/// The `<svg ...>...</svg>` element of a document (drops an XML declaration, if any).
pub(super) fn svg_body(svg: &str) -> &str {
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
pub(super) fn plot_lines(view: &SweepView) -> Vec<Line> {
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
    use super::super::fixtures::{polylines, sweep, texts};
    use super::*;
    use crate::theme::css;

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
