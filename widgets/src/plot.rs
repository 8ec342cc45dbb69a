//! The loss plot: training loss per step (mean over ranks, with the ranks' min–max band),
//! validation loss per epoch, and validation accuracy on a second axis. SVG from plotters;
//! PNG (for front ends without SVG) rasterised from that same SVG, so the two never differ.

use crate::format::format_metric;
use crate::series::Curves;
use crate::theme;
use crate::Bundle;
use base64::Engine as _;
use plotters::chart::DualCoordChartContext;
use plotters::coord::types::RangedCoordf64;
use plotters::element::DashedPathElement;
use plotters::prelude::*;
use serde_json::Value;
use std::error::Error;
use std::sync::{Arc, OnceLock};

#[derive(Clone, Debug)]
pub struct PlotOptions {
    pub width: u32,
    pub height: u32,
    /// Logarithmic loss axis (losses that fall by orders of magnitude).
    pub log_y: bool,
    /// Shade the min–max of the ranks' losses around the mean.
    pub band: bool,
    pub title: String,
}

impl Default for PlotOptions {
    fn default() -> Self {
        PlotOptions {
            width: 720,
            height: 300,
            log_y: false,
            band: true,
            title: "loss".into(),
        }
    }
}

const TRAIN: RGBColor = theme::rgb(theme::BLUE);
const VAL: RGBColor = theme::rgb(theme::RED);
const ACC: RGBColor = theme::rgb(theme::GREEN);
/// Restart markers: the orange of a stopped run, drawn faint so they do not hide the curves.
const RESTART: RGBColor = theme::rgb(theme::ORANGE);

/// The plot as an SVG document. Never fails: a drawing error becomes an SVG saying so.
pub fn loss_svg(curves: &Curves, o: &PlotOptions) -> String {
    let mut svg = String::new();
    if let Err(e) = draw(&mut svg, curves, o) {
        svg = format!(
            "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{}\" height=\"{}\">\
             <text x=\"10\" y=\"20\" font-family=\"sans-serif\" font-size=\"13\">loss plot failed: {}</text></svg>",
            o.width,
            o.height,
            crate::html::escape(&e.to_string())
        );
    }
    svg
}

/// A MIME bundle with the SVG, a PNG fallback and a text summary.
pub fn loss_bundle(curves: &Curves, o: &PlotOptions) -> Bundle {
    let svg = loss_svg(curves, o);
    let mut b = Bundle::new();
    if let Ok(png) = svg_to_png(&svg) {
        b.insert(
            "image/png".into(),
            Value::String(base64::engine::general_purpose::STANDARD.encode(png)),
        );
    }
    b.insert("image/svg+xml".into(), Value::String(svg));
    b.insert("text/plain".into(), Value::String(summary(curves)));
    b
}

/// One line saying what the plot shows (its text twin).
pub fn summary(c: &Curves) -> String {
    let mut parts = Vec::new();
    match c.train.last() {
        Some((step, loss)) => {
            let min = c
                .train
                .points()
                .iter()
                .map(|p| p.1)
                .fold(f64::INFINITY, f64::min);
            parts.push(format!(
                "train loss {} at step {step:.0} (lowest {})",
                format_metric(loss),
                format_metric(min)
            ));
        }
        None => parts.push("no training steps yet".into()),
    }
    if let Some((_, l)) = c.val_loss.last() {
        parts.push(format!("val loss {}", format_metric(l)));
    }
    if let Some((_, a)) = c.val_accuracy.last() {
        parts.push(format!("val accuracy {}", format_metric(a)));
    }
    let (bad, first) = c.non_finite();
    if bad > 0 {
        parts.push(non_finite_note(bad, first));
    }
    parts.extend(restarts_note(c));
    parts.join(" · ")
}

/// `1 restart (resumed at step 20)`, `3 restarts (last resumed at step 40)`; `None` without
/// restarts.
fn restarts_note(c: &Curves) -> Option<String> {
    let last = c.restarts().last()?;
    let restarts = match c.restart_count() {
        0 => None,
        1 => Some(format!("1 restart (resumed at step {last})")),
        n => Some(format!("{n} restarts (last resumed at step {last})")),
    };
    let resizes = match c.resizes() {
        (0, _) => None,
        (1, w) => Some(format!("resized once (now {w} workers)")),
        (n, w) => Some(format!("resized {n} times (now {w} workers)")),
    };
    let parts: Vec<String> = restarts.into_iter().chain(resizes).collect();
    (!parts.is_empty()).then(|| parts.join(" · "))
}

fn non_finite_note(n: usize, first: Option<(f64, f64)>) -> String {
    let at = first
        .map(|(x, y)| format!(" (first: {y} at step {x:.0})"))
        .unwrap_or_default();
    format!(
        "⚠ {n} non-finite loss value{}{at}",
        if n == 1 { "" } else { "s" }
    )
}

/// Tick labels: at most 4 significant digits, no trailing zeros (`5`, `0.25`, `1.2e-5`).
fn axis_label(v: f64) -> String {
    if v == 0.0 {
        return "0".into();
    }
    if v.abs() < 1e-3 || v.abs() >= 1e5 {
        return format!("{v:.1e}");
    }
    let digits = (3 - v.abs().log10().floor() as i32).clamp(0, 6) as usize;
    let s = format!("{v:.digits$}");
    if s.contains('.') {
        s.trim_end_matches('0').trim_end_matches('.').to_string()
    } else {
        s
    }
}

/// (min, max) of the values, widened so a flat or single-valued series still has a range.
pub(crate) fn span(values: impl Iterator<Item = f64>) -> Option<(f64, f64)> {
    let (lo, hi) = values.fold((f64::INFINITY, f64::NEG_INFINITY), |(lo, hi), v| {
        (lo.min(v), hi.max(v))
    });
    if !lo.is_finite() || !hi.is_finite() {
        return None;
    }
    let pad = ((hi - lo) * 0.05)
        .max(hi.abs().max(lo.abs()) * 0.01)
        .max(1e-9);
    Some((lo - pad, hi + pad))
}

type Points = Vec<(f64, f64)>;
/// The loss chart: steps by loss, with validation accuracy on a secondary 0..1 axis.
type Chart<'a, 'b> = DualCoordChartContext<
    'a,
    SVGBackend<'b>,
    Cartesian2d<RangedCoordf64, RangedCoordf64>,
    Cartesian2d<RangedCoordf64, RangedCoordf64>,
>;

/// The curves as drawn: losses on the chart's y scale (log10 of the loss on a log plot).
struct Lines {
    train: Points,
    /// The min–max band over ranks (empty without one).
    lo: Points,
    hi: Points,
    val: Points,
    acc: Points,
    restarts: Vec<f64>,
    with_band: bool,
}

impl Lines {
    fn of(c: &Curves, o: &PlotOptions) -> Lines {
        let log = o.log_y;
        // Log scale by drawing log10(loss) on a linear axis with 10^v labels; non-positive
        // losses cannot be placed on it and are clamped to the smallest positive value shown.
        let ty = |p: &(f64, f64)| -> (f64, f64) {
            if log {
                (p.0, p.1.max(1e-12).log10())
            } else {
                *p
            }
        };
        let with_band = o.band && c.world() > 1 && !c.band_lo.is_empty();
        let band = |s: &crate::series::Series| -> Points {
            if with_band {
                s.for_plot().iter().map(ty).collect()
            } else {
                Vec::new()
            }
        };
        Lines {
            train: c.train.for_plot().iter().map(ty).collect(),
            lo: band(&c.band_lo),
            hi: band(&c.band_hi),
            val: c.val_loss.for_plot().iter().map(ty).collect(),
            acc: c.val_accuracy.for_plot(),
            restarts: c.restarts().iter().map(|&s| s as f64).collect(),
            with_band,
        }
    }

    /// The points on the loss axis.
    fn losses(&self) -> impl Iterator<Item = &(f64, f64)> {
        self.train
            .iter()
            .chain(&self.lo)
            .chain(&self.hi)
            .chain(&self.val)
    }

    /// The x and y ranges the chart shows.
    fn ranges(&self) -> ((f64, f64), (f64, f64)) {
        let xs = self
            .losses()
            .chain(&self.acc)
            .map(|p| p.0)
            .chain(self.restarts.iter().copied());
        let x = match span(xs) {
            Some((a, b)) => (a.max(0.0), b),
            None => (0.0, 1.0),
        };
        (x, span(self.losses().map(|p| p.1)).unwrap_or((0.0, 1.0)))
    }

    fn is_empty(&self) -> bool {
        self.train.is_empty() && self.val.is_empty() && self.acc.is_empty()
    }
}

fn draw(out: &mut String, c: &Curves, o: &PlotOptions) -> Result<(), Box<dyn Error>> {
    let log = o.log_y;
    let lines = Lines::of(c, o);
    let ((x0, x1), (y0, y1)) = lines.ranges();
    let root = SVGBackend::with_string(out, (o.width, o.height)).into_drawing_area();
    root.fill(&WHITE)?;
    let mut chart = ChartBuilder::on(&root)
        .margin(8)
        .caption(&o.title, ("sans-serif", 15))
        .x_label_area_size(34)
        .y_label_area_size(58)
        .right_y_label_area_size(if lines.acc.is_empty() { 8 } else { 52 })
        .build_cartesian_2d(x0..x1, y0..y1)?
        .set_secondary_coord(x0..x1, 0.0..1.0);
    let y_fmt = |v: &f64| axis_label(if log { 10f64.powf(*v) } else { *v });
    chart
        .configure_mesh()
        .light_line_style(BLACK.mix(0.06))
        .bold_line_style(BLACK.mix(0.12))
        .x_desc("step")
        .y_desc(if log { "loss (log scale)" } else { "loss" })
        .x_label_formatter(&|v| axis_label(v.round()))
        .y_label_formatter(&y_fmt)
        .label_style(("sans-serif", 12))
        .draw()?;
    if !lines.acc.is_empty() {
        chart
            .configure_secondary_axes()
            .y_desc("val accuracy")
            .y_label_formatter(&|v| axis_label(*v))
            .label_style(("sans-serif", 12))
            .draw()?;
    }
    draw_curves(&mut chart, &lines, c.world())?;
    draw_restarts(&mut chart, &lines.restarts, (y0, y1))?;
    if !lines.is_empty() {
        chart
            .configure_series_labels()
            .position({
                let scale = |p: &(f64, f64)| ((p.0 - x0) / (x1 - x0), (p.1 - y0) / (y1 - y0));
                let mut scaled: Vec<Points> = [&lines.train, &lines.lo, &lines.hi, &lines.val]
                    .map(|s| s.iter().map(scale).collect())
                    .into();
                // Accuracy is drawn on the right axis, already 0..1.
                scaled.push(
                    lines
                        .acc
                        .iter()
                        .map(|p| ((p.0 - x0) / (x1 - x0), p.1))
                        .collect(),
                );
                emptiest_corner(&scaled.iter().map(Vec::as_slice).collect::<Vec<_>>())
            })
            .label_font(("sans-serif", 12))
            .background_style(WHITE.mix(0.85))
            .border_style(BLACK.mix(0.3))
            .draw()?;
    } else {
        root.draw(&Text::new(
            "waiting for the first training step…",
            (o.width as i32 / 2 - 110, o.height as i32 / 2),
            ("sans-serif", 14).into_font().color(&BLACK.mix(0.6)),
        ))?;
    }
    let (bad, first) = c.non_finite();
    if bad > 0 {
        root.draw(&Text::new(
            non_finite_note(bad, first),
            (70, 28),
            ("sans-serif", 13).into_font().color(&VAL),
        ))?;
    }
    root.present()?;
    Ok(())
}

/// The band, the train and validation losses and the accuracy, each with its legend entry.
fn draw_curves(chart: &mut Chart, l: &Lines, world: usize) -> Result<(), Box<dyn Error>> {
    if l.with_band {
        let ring: Vec<(f64, f64)> = l.hi.iter().chain(l.lo.iter().rev()).copied().collect();
        chart
            .draw_series(std::iter::once(Polygon::new(
                ring,
                TRAIN.mix(0.18).filled(),
            )))?
            .label(format!("train loss min–max over {world} ranks"))
            .legend(|(x, y)| {
                Rectangle::new([(x, y - 5), (x + 18, y + 5)], TRAIN.mix(0.18).filled())
            });
    }
    if !l.train.is_empty() {
        let label = if world > 1 {
            format!("train loss (mean of {world} ranks)")
        } else {
            "train loss".to_string()
        };
        chart
            .draw_series(LineSeries::new(
                l.train.iter().copied(),
                TRAIN.stroke_width(2),
            ))?
            .label(label)
            .legend(|(x, y)| PathElement::new(vec![(x, y), (x + 18, y)], TRAIN.stroke_width(2)));
    }
    if !l.val.is_empty() {
        chart
            .draw_series(LineSeries::new(l.val.iter().copied(), VAL.stroke_width(2)))?
            .label("val loss")
            .legend(|(x, y)| PathElement::new(vec![(x, y), (x + 18, y)], VAL.stroke_width(2)));
        chart.draw_series(l.val.iter().map(|p| Circle::new(*p, 3, VAL.filled())))?;
    }
    if !l.acc.is_empty() {
        chart
            .draw_secondary_series(LineSeries::new(l.acc.iter().copied(), ACC.stroke_width(2)))?
            .label("val accuracy (right axis)")
            .legend(|(x, y)| PathElement::new(vec![(x, y), (x + 18, y)], ACC.stroke_width(2)));
        chart.draw_secondary_series(l.acc.iter().map(|p| Circle::new(*p, 3, ACC.filled())))?;
    }
    Ok(())
}

/// Under the legend, over the curves: a marker says where the replayed steps begin.
fn draw_restarts(
    chart: &mut Chart,
    restarts: &[f64],
    (y0, y1): (f64, f64),
) -> Result<(), Box<dyn Error>> {
    let mut labelled_at = None;
    for &x in restarts {
        chart.draw_series(std::iter::once(DashedPathElement::new(
            [(x, y0), (x, y1)],
            5,
            4,
            RESTART.mix(0.7).stroke_width(1),
        )))?;
        // One label per 50 pixels: markers closer than that share the one on their left.
        let px = chart.backend_coord(&(x, y1)).0;
        if labelled_at.is_none_or(|at| px - at >= 50) {
            labelled_at = Some(px);
            chart.draw_series(std::iter::once(
                EmptyElement::at((x, y1))
                    + Text::new(
                        "restart",
                        (3, 2),
                        ("sans-serif", 10).into_font().color(&RESTART),
                    ),
            ))?;
        }
    }
    Ok(())
}

/// The corner where the legend hides the least of the lines (coordinates scaled to 0..1).
/// Every series weighs the same whatever its number of points: a 3-point validation line
/// crossing a corner matters as much as 2,000 training steps, so each line is resampled at
/// evenly spaced x positions before counting.
fn emptiest_corner(series: &[&[(f64, f64)]]) -> SeriesLabelPosition {
    // The legend covers about 45% of the width and 35% of the height.
    let (w, h) = (0.45, 0.35);
    const SAMPLES: usize = 128;
    let mut cover = [0f64; 4]; // upper right, upper left, lower left, lower right
    for line in series.iter().filter(|l| !l.is_empty()) {
        let (first, last) = (line[0].0, line[line.len() - 1].0);
        let n = if line.len() == 1 || last <= first {
            1
        } else {
            SAMPLES
        };
        let mut seg = 0;
        for i in 0..n {
            let x = if n == 1 {
                first
            } else {
                first + (last - first) * i as f64 / (n - 1) as f64
            };
            while seg + 2 < line.len() && line[seg + 1].0 < x {
                seg += 1;
            }
            let y = match (line.get(seg), line.get(seg + 1)) {
                (Some(a), Some(b)) if b.0 > a.0 => {
                    a.1 + (b.1 - a.1) * ((x - a.0) / (b.0 - a.0)).clamp(0.0, 1.0)
                }
                (Some(a), _) => a.1,
                _ => continue,
            };
            if !y.is_finite() {
                continue;
            }
            let (right, left, top, bottom) = (x >= 1.0 - w, x <= w, y >= 1.0 - h, y <= h);
            let wt = 1.0 / n as f64;
            cover[0] += wt * (right && top) as u8 as f64;
            cover[1] += wt * (left && top) as u8 as f64;
            cover[2] += wt * (left && bottom) as u8 as f64;
            cover[3] += wt * (right && bottom) as u8 as f64;
        }
    }
    // Ties keep the earlier corner: upper right is where readers look first.
    let best = (0..4).fold(0, |b, i| if cover[i] < cover[b] - 1e-9 { i } else { b });
    [
        SeriesLabelPosition::UpperRight,
        SeriesLabelPosition::UpperLeft,
        SeriesLabelPosition::LowerLeft,
        SeriesLabelPosition::LowerRight,
    ][best]
        .clone()
}

/// System fonts, loaded once (a few ms to a few hundred ms), for the PNG's labels.
fn fonts() -> Arc<resvg::usvg::fontdb::Database> {
    static DB: OnceLock<Arc<resvg::usvg::fontdb::Database>> = OnceLock::new();
    DB.get_or_init(|| {
        let mut db = resvg::usvg::fontdb::Database::new();
        db.load_system_fonts();
        let families: Vec<String> = db
            .faces()
            .flat_map(|f| f.families.iter().map(|(n, _)| n.clone()))
            .collect();
        for want in [
            "DejaVu Sans",
            "Liberation Sans",
            "Noto Sans",
            "Arial",
            "Helvetica",
        ] {
            if families.iter().any(|f| f == want) {
                db.set_sans_serif_family(want);
                break;
            }
        }
        Arc::new(db)
    })
    .clone()
}

/// Rasterises an SVG (labels need a system font; without one the PNG has no text).
pub fn svg_to_png(svg: &str) -> Result<Vec<u8>, String> {
    let opt = resvg::usvg::Options {
        fontdb: fonts(),
        ..Default::default()
    };
    let tree = resvg::usvg::Tree::from_str(svg, &opt).map_err(|e| format!("bad SVG: {e}"))?;
    let size = tree.size().to_int_size();
    let mut pixmap = resvg::tiny_skia::Pixmap::new(size.width(), size.height())
        .ok_or_else(|| "empty image".to_string())?;
    resvg::render(
        &tree,
        resvg::tiny_skia::Transform::default(),
        &mut pixmap.as_mut(),
    );
    pixmap
        .encode_png()
        .map_err(|e| format!("PNG encoding failed: {e}"))
}

#[cfg(test)]
mod tests {
    use plotters::prelude::SeriesLabelPosition as P;

    fn name(p: P) -> &'static str {
        match p {
            P::UpperRight => "upper right",
            P::UpperLeft => "upper left",
            P::LowerLeft => "lower left",
            P::LowerRight => "lower right",
            _ => "other",
        }
    }

    #[test]
    fn legend_avoids_a_sparse_line_as_much_as_a_dense_one() {
        use super::emptiest_corner;
        // A dense training curve that falls from the top left to the bottom right, and a
        // 3-point validation accuracy line across the top right: the legend must not cover it,
        // although the dense curve alone would leave the top right emptiest.
        let train: Vec<(f64, f64)> = (0..2000)
            .map(|i| (i as f64 / 1999.0, 0.9 - 0.8 * i as f64 / 1999.0))
            .collect();
        let acc = [(0.33, 0.8), (0.66, 0.9), (1.0, 0.95)];
        assert_eq!(name(emptiest_corner(&[&train])), "upper right");
        assert_eq!(name(emptiest_corner(&[&train, &acc])), "lower left");
        // Nothing drawn yet, or one point: the usual corner.
        assert_eq!(name(emptiest_corner(&[&[]])), "upper right");
        assert_eq!(name(emptiest_corner(&[&[(0.9, 0.9)]])), "upper left");
    }

    #[test]
    fn axis_labels_are_short() {
        use super::axis_label;
        assert_eq!(axis_label(5.0), "5");
        assert_eq!(axis_label(0.25), "0.25");
        assert_eq!(axis_label(1.23456), "1.235");
        assert_eq!(axis_label(1200.0), "1200");
        assert_eq!(axis_label(0.00001), "1.0e-5");
    }
}
