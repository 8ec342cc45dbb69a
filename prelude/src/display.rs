//! How trainbook's values look when a cell returns them: a DataFrame as an HTML table (head and
//! tail of long tables, as pandas and polars show them in Python notebooks), a `TrainResult` and
//! a `Job` as a summary table, each with its text twin.
//!
//! evcxr shows a cell's final value by compiling `value.evcxr_display()`, and when that does
//! not compile, compiling the cell again with the value's `Debug` form. [`ShowValue`] (in scope
//! through the prelude) gives every `Debug` value that method, so a cell that shows a value is
//! one compile instead of two; it prints the rich bundle ([`NotebookDisplay`]) of trainbook's
//! types and polars' `DataFrame`, and the `Debug` text of anything else, in evcxr's
//! content-block format on stdout, which the kernel turns into the cell's `execute_result`.

use crate::job::{Job, TrainResult};
use polars::prelude::DataFrame;
use trainbook_widgets::grid::{elide, Align, Grid, Row};
use trainbook_widgets::{format_duration, format_metric, Bundle};

/// The rich display of a value: its MIME bundle (`text/html` and `text/plain`).
pub trait NotebookDisplay {
    fn bundle(&self) -> Bundle;
}

/// How a cell's final value is shown (evcxr calls the method by this name).
pub trait ShowValue {
    fn evcxr_display(&self);
}

// The generic part is one call: it is compiled into every cell that shows a value (once per
// value type), the rest is compiled once, in the prelude.
impl<T: std::fmt::Debug + 'static> ShowValue for T {
    fn evcxr_display(&self) {
        show(self, self)
    }
}

fn show(any: &dyn std::any::Any, debug: &dyn std::fmt::Debug) {
    print!("{}", content_blocks(&value_bundle(any, debug)));
}

/// The rich bundle of trainbook's types and `DataFrame`; `Debug` text (what evcxr would show)
/// for anything else.
fn value_bundle(any: &dyn std::any::Any, debug: &dyn std::fmt::Debug) -> Bundle {
    if let Some(df) = any.downcast_ref::<DataFrame>() {
        return df.bundle();
    }
    if let Some(r) = any.downcast_ref::<TrainResult>() {
        return r.bundle();
    }
    if let Some(job) = any.downcast_ref::<Job>() {
        return job.bundle();
    }
    let mut b = Bundle::new();
    b.insert("text/plain".into(), format!("{debug:?}").into());
    b
}

/// A bundle in evcxr's stdout format: one `EVCXR_BEGIN_CONTENT <mime>` … `EVCXR_END_CONTENT`
/// block per type.
pub fn content_blocks(bundle: &Bundle) -> String {
    let mut out = String::new();
    for (mime, value) in bundle {
        if let Some(text) = value.as_str() {
            out.push_str(&format!(
                "EVCXR_BEGIN_CONTENT {mime}\n{text}\nEVCXR_END_CONTENT\n"
            ));
        }
    }
    out
}

impl NotebookDisplay for DataFrame {
    fn bundle(&self) -> Bundle {
        frame_grid(self).bundle()
    }
}

/// A DataFrame's head and tail, its column names and polars' data types.
fn frame_grid(df: &DataFrame) -> Grid {
    let columns = df.columns();
    let names: Vec<String> = columns.iter().map(|c| c.name().to_string()).collect();
    let dtypes: Vec<String> = columns.iter().map(|c| c.dtype().to_string()).collect();
    let align: Vec<Align> = columns
        .iter()
        .map(|c| match c.dtype().is_primitive_numeric() {
            true => Align::Right,
            false => Align::Left,
        })
        .collect();
    Grid {
        columns: elide(&names, "…".into()),
        dtypes: Some(elide(&dtypes, "…".into())),
        align: elide(&align, Align::Right),
        rows: Grid::rows_of(df.height(), columns.len(), |r, c| {
            columns[c]
                .get(r)
                .map(|v| v.to_string())
                .unwrap_or_else(|e| format!("<{e}>"))
        }),
        caption: Some(format!("shape: ({}, {})", df.height(), df.width())),
        class: "trainbook-frame",
    }
}

/// Two left-aligned columns, names as row headers.
fn summary(class: &'static str, pairs: Vec<(&str, String)>) -> Grid {
    Grid {
        align: vec![Align::Left, Align::Left],
        rows: pairs
            .into_iter()
            .map(|(k, v)| Row::Cells(vec![k.to_string(), v]))
            .collect(),
        class,
        ..Grid::default()
    }
}

fn path(p: &Option<std::path::PathBuf>) -> String {
    p.as_ref()
        .map(|p| p.display().to_string())
        .unwrap_or_else(|| "–".into())
}

impl NotebookDisplay for TrainResult {
    fn bundle(&self) -> Bundle {
        let mut pairs = vec![
            ("status", self.status.to_string()),
            ("recipe", self.recipe.clone()),
            ("workers", format!("{} × {}", self.workers, self.device)),
            ("steps", self.steps.to_string()),
            ("time", format_duration(self.elapsed)),
            ("samples/s", format!("{:.1}", self.samples_per_second)),
            ("final train loss", format_metric(self.final_train_loss)),
        ];
        // The last value of each global metric, the run statistics above left out.
        for (name, value) in &self.metrics {
            if !matches!(name.as_str(), "samples_per_second" | "train_loss") {
                pairs.push((name.as_str(), format_metric(*value)));
            }
        }
        pairs.push(("best checkpoint", path(&self.best_checkpoint)));
        pairs.push(("last checkpoint", path(&self.last_checkpoint)));
        pairs.push(("run dir", self.run_dir.display().to_string()));
        if let Some(e) = &self.error {
            pairs.push(("error", e.clone()));
        }
        summary("trainbook-result", pairs).bundle()
    }
}

impl NotebookDisplay for Job {
    fn bundle(&self) -> Bundle {
        let spec = self.spec();
        let mut pairs = vec![
            ("job", self.id().to_string()),
            ("status", self.status().to_string()),
            ("recipe", spec.recipe.clone()),
            ("workers", format!("{} × {}", spec.workers, self.device())),
        ];
        if let Some(p) = self.progress() {
            pairs.push((
                "epoch",
                format!("{}/{}", (p.epoch + 1).min(p.epochs), p.epochs),
            ));
            pairs.push(("step", format!("{}/{}", p.step, p.total_steps)));
            pairs.push(("samples/s", format!("{:.1}", p.samples_per_second)));
            pairs.push(("time", format_duration(p.elapsed)));
        }
        pairs.push(("run dir", self.run_dir().display().to_string()));
        summary("trainbook-job", pairs).bundle()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use polars::prelude::*;

    #[test]
    fn a_long_frame_is_its_head_and_tail_with_types() {
        let n = 1000u32;
        let df = df!(
            "step" => (0..n).collect::<Vec<u32>>(),
            "name" => (0..n).map(|i| format!("m{i}")).collect::<Vec<String>>(),
        )
        .unwrap();
        let b = value_bundle(&df, &df);
        let html = b["text/html"].as_str().unwrap();
        assert!(html.contains("trainbook-frame"));
        assert!(html.contains("… 980 more rows"));
        assert!(html.contains(">999</td>") && !html.contains(">500</td>"));
        assert!(html.contains(">u32</td>") && html.contains(">str</td>"));
        let text = b["text/plain"].as_str().unwrap();
        let lines: Vec<&str> = text.lines().collect();
        // Shape, names, types; numbers right-aligned, text left-aligned.
        assert_eq!(
            lines[..4],
            [
                "shape: (1000, 2)",
                "step  name",
                " u32  str",
                "   0  \"m0\""
            ]
        );
        assert!(html.contains(
            "text-align:left;font-variant-numeric:tabular-nums;white-space:pre\">&quot;m0&quot;"
        ));
    }

    #[test]
    fn other_values_show_their_debug_text() {
        let b = value_bundle(&Some("x"), &Some("x"));
        assert_eq!(b.len(), 1);
        assert_eq!(b["text/plain"], "Some(\"x\")");
    }

    #[test]
    fn content_blocks_are_what_evcxr_reads() {
        let mut b = Bundle::new();
        b.insert("text/html".into(), "<b>x</b>".into());
        b.insert("text/plain".into(), "x".into());
        assert_eq!(
            content_blocks(&b),
            "EVCXR_BEGIN_CONTENT text/html\n<b>x</b>\nEVCXR_END_CONTENT\n\
             EVCXR_BEGIN_CONTENT text/plain\nx\nEVCXR_END_CONTENT\n"
        );
    }
}
