//! How trainbook's values look when a cell returns them: a `Table` as an HTML table (head and
//! tail of long tables, as pandas and polars show them in Python notebooks), a `TrainResult`
//! and a `Job`, a `Plan` and a `MemoryPlan` as a summary table, each with its text twin.
//! `trainbook_api`'s `ShowValue` asks for them through the `Notebook` port ([`bundle_of`]).

use std::any::Any;

use trainbook_api::metric;
use trainbook_api::{Job, MemoryPlan, Plan, SweepJob, SweepResult, TrainResult};
use trainbook_api::{Table, Value};
use trainbook_widgets::grid::{elide, Align, Grid, Row};
use trainbook_widgets::{format_bytes, format_duration, format_metric, Bundle};

/// The rich display of a value: its MIME bundle (`text/html` and `text/plain`).
pub trait NotebookDisplay {
    fn bundle(&self) -> Bundle;
}

/// The rich bundle of trainbook's values; `None` for anything else (shown as `Debug` text).
pub fn bundle_of(value: &dyn Any) -> Option<Bundle> {
    if let Some(t) = value.downcast_ref::<Table>() {
        return Some(t.bundle());
    }
    if let Some(r) = value.downcast_ref::<TrainResult>() {
        return Some(r.bundle());
    }
    if let Some(job) = value.downcast_ref::<Job>() {
        return Some(job.bundle());
    }
    if let Some(r) = value.downcast_ref::<SweepResult>() {
        return Some(r.bundle());
    }
    if let Some(s) = value.downcast_ref::<SweepJob>() {
        return Some(s.bundle());
    }
    if let Some(p) = value.downcast_ref::<MemoryPlan>() {
        return Some(p.bundle());
    }
    if let Some(p) = value.downcast_ref::<Plan>() {
        return Some(p.bundle());
    }
    None
}

/// What a job would run with (`trainer.plan()?`): the device, the settings a reader checks
/// first, then its memory plan.
impl NotebookDisplay for Plan {
    fn bundle(&self) -> Bundle {
        let h = &self.hyper;
        let length = match (h.max_steps, h.epochs) {
            (Some(s), e) => format!("{s} steps at most ({e} epoch(s))"),
            (None, e) => format!("{e} epoch(s)"),
        };
        let batch = match h.grad_accum {
            0 | 1 => h.global_batch_size.to_string(),
            k => format!("{} ({k} micro-batches a step)", h.global_batch_size),
        };
        let mut pairs = vec![
            ("device", self.device.name().to_string()),
            ("preset", h.preset.clone()),
            ("length", length),
            ("global batch", batch),
            (
                "optimizer",
                format!("{}, lr {}, {} schedule", h.optimizer, h.lr, h.schedule),
            ),
            ("precision", h.precision.to_string()),
        ];
        if h.zero > 0 {
            pairs.push(("ZeRO", format!("stage {}", h.zero)));
        }
        if h.activation_checkpointing {
            pairs.push(("activation checkpointing", "on".into()));
        }
        if let Some(m) = &self.memory {
            pairs.extend(memory_pairs(m));
        }
        summary("trainbook-plan", pairs).bundle()
    }
}

/// A memory plan: its rows, the total against the device, the levers.
impl NotebookDisplay for MemoryPlan {
    fn bundle(&self) -> Bundle {
        summary("trainbook-plan", memory_pairs(self)).bundle()
    }
}

/// A memory plan's lines: the model and setup, each row, the total against the device, the
/// levers.
fn memory_pairs(plan: &MemoryPlan) -> Vec<(&str, String)> {
    let mut pairs = vec![
        (
            "model",
            format!(
                "{} on {} × {}, {} per device × {} micro-batch(es)",
                plan.model,
                plan.workers,
                plan.device.name(),
                plan.batch_per_device,
                plan.grad_accum
            ),
        ),
        ("setup", plan.setup.clone()),
    ];
    for r in &plan.rows {
        pairs.push((
            r.what.as_str(),
            format!("{}: {}", format_bytes(r.bytes), r.detail),
        ));
    }
    pairs.push((
        "total",
        format!("{}: {}", format_bytes(plan.total), plan.verdict()),
    ));
    for l in &plan.levers {
        let fits = match l.fits {
            Some(true) => ", fits",
            Some(false) => ", does not fit",
            None => "",
        };
        pairs.push((
            "lever",
            format!("{}: {}{fits}", l.change, format_bytes(l.total)),
        ));
    }
    pairs
}

impl NotebookDisplay for Table {
    fn bundle(&self) -> Bundle {
        table_grid(self).bundle()
    }
}

/// A table's head and tail, its column names and data types.
fn table_grid(table: &Table) -> Grid {
    let columns = table.columns();
    let names: Vec<String> = columns.iter().map(|c| c.name().to_string()).collect();
    let dtypes: Vec<String> = columns.iter().map(|c| c.dtype().to_string()).collect();
    let align: Vec<Align> = columns
        .iter()
        .map(|c| match c.is_numeric() {
            true => Align::Right,
            false => Align::Left,
        })
        .collect();
    Grid {
        columns: elide(&names, "…".into()),
        dtypes: Some(elide(&dtypes, "…".into())),
        align: elide(&align, Align::Right),
        rows: Grid::rows_of(table.height(), columns.len(), |r, c| {
            match columns[c].get(r) {
                // Text quoted, as polars prints it, so that spaces and empty strings show.
                Value::Str(s) => format!("{s:?}"),
                // Numbers for reading: floats to 6 significant digits, counts with thousands
                // separators (`Column::cell_text`); `to_csv` has every digit.
                _ => columns[c].cell_text(r),
            }
        }),
        caption: Some(format!("shape: ({}, {})", table.height(), table.width())),
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
            if !matches!(
                name.as_str(),
                metric::SAMPLES_PER_SECOND | metric::TRAIN_LOSS
            ) {
                pairs.push((name.as_str(), format_metric(*value)));
            }
        }
        if let Some(m) = self.memory.first() {
            // Rank 0's; `memory_table()` has every rank's.
            let peak = if m.peak > 0 {
                format!(", peak {} {}", format_bytes(m.peak), m.peak_of)
            } else {
                String::new()
            };
            pairs.push((
                "memory (rank 0)",
                format!(
                    "parameters {}, gradients {}, optimizer state {}, buffers {}{peak}",
                    format_bytes(m.parameters),
                    format_bytes(m.gradients),
                    format_bytes(m.optimizer_state),
                    format_bytes(m.buffers)
                ),
            ));
        }
        pairs.push(("best checkpoint", path(&self.best_checkpoint)));
        pairs.push(("last checkpoint", path(&self.last_checkpoint)));
        pairs.push(("run dir", self.run_dir.display().to_string()));
        if let Some(e) = &self.error {
            pairs.push(("error", e.clone()));
        }
        for w in &self.warnings {
            pairs.push(("warning", w.clone()));
        }
        let mut bundle = summary("trainbook-result", pairs).bundle();
        if let Some(p) = &self.profile {
            append(&mut bundle, profile_grid(p).bundle());
        }
        bundle
    }
}

/// The step profiler's top operators (and device kernels), under the result.
fn profile_grid(p: &trainbook_api::StepProfile) -> Grid {
    let rows: Vec<(&str, &trainbook_api::OpTime)> = p
        .ops
        .iter()
        .take(15)
        .map(|o| ("operator", o))
        .chain(p.kernels.iter().take(10).map(|k| ("kernel", k)))
        .collect();
    Grid {
        columns: ["", "name", "self ms", "calls", "% step"]
            .map(String::from)
            .to_vec(),
        dtypes: None,
        align: vec![Align::Left, Align::Left],
        rows: rows
            .iter()
            .map(|(kind, o)| {
                Row::Cells(vec![
                    kind.to_string(),
                    o.name.clone(),
                    format!("{:.3}", o.self_ms),
                    Value::UInt(o.calls).display_short(),
                    format!("{:.1}", 100.0 * o.share),
                ])
            })
            .collect(),
        caption: Some(format!(
            "profiled steps {} on rank 0: {:.2} ms a step, {:.0}% inside operators{}; traces: {}",
            p.steps,
            p.step_ms,
            100.0 * p.covered,
            p.device_busy
                .map(|b| format!(", the device busy {:.0}%", 100.0 * b))
                .unwrap_or_default(),
            p.traces
                .first()
                .and_then(|t| t.parent())
                .map_or(String::new(), |d| d.display().to_string())
        )),
        class: "trainbook-profile",
    }
}

/// `more`'s HTML and text after `bundle`'s.
fn append(bundle: &mut trainbook_widgets::Bundle, more: trainbook_widgets::Bundle) {
    for (mime, value) in more {
        let joined = match (bundle.get(&mime).and_then(|v| v.as_str()), value.as_str()) {
            (Some(a), Some(b)) => format!("{a}\n{b}"),
            (None, Some(b)) => b.to_string(),
            _ => continue,
        };
        bundle.insert(mime, serde_json::Value::String(joined));
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

impl NotebookDisplay for SweepResult {
    /// What the sweep found (status, best trial, directory) over its trials table.
    fn bundle(&self) -> Bundle {
        let mut pairs = vec![
            ("status", self.status.to_string()),
            (
                "trials",
                trainbook_api::plumbing::trials::status_counts(&self.trials),
            ),
            ("time", format_duration(self.elapsed)),
        ];
        match self.best_trial() {
            Ok(t) => pairs.push((
                "best",
                format!(
                    "trial {} ({}): {} {}",
                    t.id,
                    t.params_text(),
                    self.metric,
                    t.last().map(format_metric).unwrap_or_default()
                ),
            )),
            Err(e) => pairs.push(("best", format!("{e}"))),
        }
        pairs.push(("sweep dir", self.dir.display().to_string()));
        let head = summary("trainbook-sweep-result", pairs).bundle();
        let table = self.trials().bundle();
        let mut b = Bundle::new();
        for key in ["text/plain", "text/html"] {
            let part = |x: &Bundle| {
                x.get(key)
                    .and_then(|v| v.as_str())
                    .unwrap_or("")
                    .to_string()
            };
            let sep = if key == "text/plain" { "\n" } else { "" };
            b.insert(
                key.into(),
                serde_json::Value::String(format!("{}{sep}{}", part(&head), part(&table))),
            );
        }
        b
    }
}

impl NotebookDisplay for SweepJob {
    /// The sweep's view as it stands (the live one is `sweep.show()`).
    fn bundle(&self) -> Bundle {
        match crate::sweep_view::SweepDashboard::new(self) {
            Ok(mut d) => {
                if self.status() != trainbook_api::SweepStatus::Running {
                    d.finish(self);
                }
                d.bundle()
            }
            Err(e) => {
                let mut b = Bundle::new();
                b.insert(
                    "text/plain".into(),
                    serde_json::Value::String(format!("{self:?} ({e:#})")),
                );
                b
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use trainbook_api::Column;

    #[test]
    fn a_long_table_is_its_head_and_tail_with_types() {
        let n = 1000u64;
        let table = Table::from_columns(vec![
            Column::uint("step", (0..n).map(Some)).with_dtype("u32"),
            Column::str("name", (0..n).map(|i| Some(format!("m{i}")))),
        ])
        .unwrap();
        let b = bundle_of(&table).unwrap();
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
    fn a_table_shows_short_floats_and_separated_counts_but_csv_every_digit() {
        let table = Table::from_columns(vec![
            Column::uint("step", [Some(1), Some(2)]),
            Column::float("loss", [Some(0.14622268317274092), Some(1e-7)]),
            Column::int("tokens", [Some(12345678), Some(999)]),
            Column::int("trial_id", [Some(20240101), Some(3)]),
        ])
        .unwrap();
        let b = bundle_of(&table).unwrap();
        let text = b["text/plain"].as_str().unwrap();
        assert_eq!(
            text.lines().collect::<Vec<_>>(),
            [
                "shape: (2, 4)",
                "step      loss      tokens  trial_id",
                " u64       f64         i64       i64",
                "   1  0.146223  12,345,678  20240101",
                "   2     1e-07         999         3",
            ],
            "{text}"
        );
        let html = b["text/html"].as_str().unwrap();
        for cell in [
            ">0.146223</td>",
            ">1e-07</td>",
            ">12,345,678</td>",
            ">20240101</td>",
        ] {
            assert!(html.contains(cell), "{cell} in {html}");
        }
        assert!(!html.contains("0.14622268317274092"), "{html}");
        assert_eq!(
            table.to_csv(),
            "step,loss,tokens,trial_id\n1,0.14622268317274092,12345678,20240101\n\
             2,0.0000001,999,3\n"
        );
    }

    #[test]
    fn a_plan_shows_its_device_settings_and_memory() {
        use trainbook_api::Configure;
        let spec = trainbook_api::JobSpec::new("synthetic").workers(1);
        let plan =
            trainbook_api::plumbing::ports::Jobs::plan(&crate::run::TRAINBOOK, &spec).unwrap();
        let bundle = bundle_of(&plan).expect("a plan has a rich display");
        let text = bundle["text/plain"].as_str().unwrap();
        for want in [
            "device",
            "cpu",
            "preset",
            "global batch",
            "optimizer",
            "total",
        ] {
            assert!(text.contains(want), "{want} in {text}");
        }
        assert!(bundle["text/html"]
            .as_str()
            .unwrap()
            .contains("trainbook-plan"));
    }

    #[test]
    fn other_values_have_no_rich_display() {
        assert!(bundle_of(&Some("x")).is_none());
    }
}
