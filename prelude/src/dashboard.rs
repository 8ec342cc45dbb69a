//! A job's updates turned into the widgets' [`Dashboard`]: the one place that knows both the
//! engine's metric names and the widgets. The notebook's live view and the terminal both feed
//! through it, so they show the same numbers.

use anyhow::Result;
use std::path::PathBuf;
use trainbook_api::metric;
use trainbook_api::plumbing::format::Shown;
use trainbook_api::MetricRow;
use trainbook_api::{Job, JobStatus, JobUpdate, Progress};
use trainbook_engine::looks_like_error;
use trainbook_widgets::{Bundle, Dashboard, LogLine, Outcome, ProgressView};

/// A [`Dashboard`] kept up to date from one job.
pub struct JobDashboard {
    dash: Dashboard,
    checkpoint: Option<PathBuf>,
    /// The job shown, for its title after an elastic job changes its size.
    job: Option<Job>,
}

/// `bert · 4 workers (2 nodes) on cpu · job 3 · my-run`: node 0 shows the whole job, another
/// node its own workers; an elastic job says its range of nodes.
fn title(job: &Job, world: usize) -> String {
    let spec = job.spec();
    let workers = spec.workers.max(1);
    let range = match spec.min_nodes.filter(|_| spec.is_elastic()) {
        Some(min) => format!(" of {min}:{}", spec.nodes),
        None => String::new(),
    };
    let (shown, nodes) = match (spec.nodes, spec.node_rank) {
        (1, _) => (world, String::new()),
        (_, 0) => (world, format!(" ({} nodes{range})", world / workers)),
        (n, k) => (spec.workers, format!(" (node {k} of {n})")),
    };
    // A named run (a sweep's trial-3, a resumable run) says its name.
    let name = spec
        .run_name
        .as_ref()
        .map(|n| format!(" · {n}"))
        .unwrap_or_default();
    format!(
        "{} · {shown} worker{}{nodes} on {} · job {}{name}",
        spec.recipe,
        if shown == 1 { "" } else { "s" },
        job.device().name(),
        job.id()
    )
}

impl JobDashboard {
    /// An empty dashboard for `job`, with the job's view options.
    pub fn new(job: &Job) -> Result<JobDashboard> {
        let spec = job.spec();
        let world = spec.world_size();
        let mut d = JobDashboard::from_parts(
            title(job, world),
            world,
            job.run_dir().display().to_string(),
            dashboard_options(&trainbook_api::plumbing::settings::view_options(spec))?,
        );
        d.job = Some(job.clone());
        d.dash.progress.status = job.status();
        Ok(d)
    }

    /// A dashboard not tied to a [`Job`] (replaying a run's updates, tests, benchmarks).
    pub fn from_parts(
        title: String,
        workers: usize,
        run_dir: String,
        options: trainbook_widgets::DashboardOptions,
    ) -> JobDashboard {
        JobDashboard {
            dash: Dashboard::new(title, workers, run_dir, options),
            checkpoint: None,
            job: None,
        }
    }

    /// A dashboard with everything the job reported so far (for `job.show()` on a running or
    /// finished job). Subscribe before calling this so nothing falls in between; a repeated
    /// metric is harmless, a line may show twice.
    pub fn with_history(job: &Job) -> Result<JobDashboard> {
        let mut d = JobDashboard::new(job)?;
        // Markers first: the rows of replayed steps are already the replayed ones.
        let result = job.result().ok();
        for r in result.iter().flat_map(|r| &r.restarts) {
            d.dash.curves.restart(r.resumed_step);
        }
        for r in result.iter().flat_map(|r| &r.resizes) {
            d.dash.curves.resize(r.to_workers, r.resumed_step);
        }
        if let Some(r) = result.as_ref().filter(|r| !r.resizes.is_empty()) {
            d.dash.title = title(job, r.workers);
        }
        for row in job.metric_rows() {
            d.metric(&row);
        }
        for r in job.logs() {
            d.dash.logs.push(LogLine {
                rank: Some(r.rank),
                is_error: looks_like_error(&r.text),
                text: r.text,
                repeats: None,
            });
        }
        if let Some(p) = job.progress() {
            d.progress(&p);
        }
        d.dash.progress.status = job.status();
        Ok(d)
    }

    pub fn dashboard(&self) -> &Dashboard {
        &self.dash
    }

    /// Applies one update. Returns the log line if the view's level shows it (the terminal
    /// prints exactly those).
    pub fn apply(&mut self, update: &JobUpdate) -> Option<LogLine> {
        match update {
            JobUpdate::Log(shown) => {
                let line = log_line(shown);
                return self.dash.logs.push(line.clone()).then_some(line);
            }
            JobUpdate::Metric(m) => self.metric(m),
            JobUpdate::Progress(p) => self.progress(p),
            JobUpdate::Checkpoint { path, .. } => self.checkpoint = Some(path.clone()),
            JobUpdate::Restart(r) => {
                self.dash.curves.restart(r.resumed_step);
                let line = LogLine {
                    rank: None,
                    is_error: true,
                    text: r.to_string(),
                    repeats: None,
                };
                return self.dash.logs.push(line.clone()).then_some(line);
            }
            JobUpdate::Resize(r) => {
                self.dash.curves.resize(r.to_workers, r.resumed_step);
                if let Some(job) = &self.job {
                    self.dash.title = title(job, r.to_workers);
                }
                let line = LogLine {
                    rank: None,
                    is_error: false,
                    text: r.to_string(),
                    repeats: None,
                };
                return self.dash.logs.push(line.clone()).then_some(line);
            }
            JobUpdate::Finished(s) => {
                self.dash.progress.status = *s;
                self.dash.curves.flush();
            }
        }
        None
    }

    fn metric(&mut self, m: &MetricRow) {
        let d = &mut self.dash;
        match m.name.as_str() {
            metric::LOSS => {
                d.curves.train_loss(m.rank as usize, m.step, m.value);
                if let Some((_, l)) = d.curves.train.last() {
                    d.progress.loss = Some(l);
                }
            }
            metric::EPOCH_TRAIN_LOSS => d.table.row_mut(m.epoch).train_loss = Some(m.value),
            metric::EPOCH_TRAIN_ACCURACY => d.table.row_mut(m.epoch).train_accuracy = Some(m.value),
            metric::EVAL_LOSS => {
                d.table.row_mut(m.epoch).val_loss = Some(m.value);
                d.curves.validation(m.step, Some(m.value), None);
            }
            metric::EVAL_ACCURACY => {
                d.table.row_mut(m.epoch).val_accuracy = Some(m.value);
                d.curves.validation(m.step, None, Some(m.value));
            }
            metric::SAMPLES_PER_SECOND => {
                let row = d.table.row_mut(m.epoch);
                row.samples_per_second = Some(m.value);
                row.elapsed = Some(m.time);
            }
            other => {
                if let Some(column) = score_column(other) {
                    d.table.row_mut(m.epoch).extra.insert(column, m.value);
                }
            }
        }
    }

    fn progress(&mut self, p: &Progress) {
        let loss = self.dash.progress.loss;
        self.dash.progress = ProgressView {
            status: JobStatus::Running,
            epoch: p.epoch,
            epochs: p.epochs,
            step: p.step,
            total_steps: p.total_steps,
            samples_per_second: p.samples_per_second,
            elapsed: p.elapsed,
            loss,
        };
    }

    /// Turns the view into the result view: final status, metrics, checkpoint and error.
    pub fn finish(&mut self, job: &Job) {
        self.dash.curves.flush();
        let Ok(r) = job.result() else { return };
        let d = &mut self.dash;
        d.progress.status = r.status;
        if r.elapsed > 0.0 {
            d.progress.elapsed = r.elapsed;
        }
        let mut metrics = Vec::new();
        if r.steps > 0 {
            metrics.push(("train loss".to_string(), fmt(r.final_train_loss)));
        }
        for (key, label) in [
            (metric::EVAL_LOSS, "val loss"),
            (metric::EVAL_ACCURACY, "val accuracy"),
        ] {
            if let Some(v) = r.metrics.get(key) {
                metrics.push((label.to_string(), fmt(*v)));
            }
        }
        // F1 and the task's own evaluation scores, in name order.
        for (key, v) in &r.metrics {
            if key.starts_with(metric::EVAL_PREFIX) {
                if let Some(label) = score_column(key) {
                    metrics.push((label, fmt(*v)));
                }
            }
        }
        if r.samples_per_second > 0.0 {
            metrics.push(("samples/s".into(), format!("{:.1}", r.samples_per_second)));
        }
        metrics.push(("steps".into(), r.steps.to_string()));
        metrics.push(("time".into(), trainbook_widgets::format_duration(r.elapsed)));
        let last = r.last_checkpoint.or_else(|| self.checkpoint.clone());
        let checkpoint = match (r.best_checkpoint, last) {
            (Some(b), Some(l)) if b != l => Some(format!(
                "{} (best validation loss; latest: {})",
                b.display(),
                l.display()
            )),
            (Some(p), _) | (None, Some(p)) => Some(p.display().to_string()),
            (None, None) => None,
        };
        d.outcome = Some(Outcome {
            metrics,
            checkpoint,
            error: r.error,
            memory: r.memory,
        });
    }

    /// The view as a MIME bundle (HTML with the plot, text; PNG once finished).
    pub fn bundle(&self) -> Bundle {
        self.dash.bundle()
    }
}

/// The epoch table's column for a per-epoch score beyond loss and accuracy: `eval_f1_macro` is
/// "val f1 macro", a task's `epoch_train_confidence` is "train confidence". Per-step metrics
/// (no prefix) have no column: the metrics DataFrame holds them.
fn score_column(name: &str) -> Option<String> {
    let (side, rest) = if let Some(rest) = name.strip_prefix(metric::EVAL_PREFIX) {
        ("val", rest)
    } else {
        ("train", name.strip_prefix(metric::EPOCH_TRAIN_PREFIX)?)
    };
    match rest {
        "loss" | "accuracy" | "" => None,
        _ => Some(format!("{side} {}", rest.replace('_', " "))),
    }
}

fn fmt(v: f64) -> String {
    trainbook_widgets::format_metric(v)
}

fn log_line(s: &Shown) -> LogLine {
    LogLine {
        rank: Some(s.rank),
        text: s.text.clone(),
        repeats: s.repeats.as_ref().map(|r| r.to_string()),
        is_error: s.is_error,
    }
}

/// The widgets' options for a job's view, with the log level resolved.
pub fn dashboard_options(
    view: &trainbook_api::ViewOptions,
) -> anyhow::Result<trainbook_widgets::DashboardOptions> {
    Ok(trainbook_widgets::DashboardOptions {
        plot: view.plot,
        logs: view.logs,
        log_level: view.log_level()?,
        log_y: view.log_scale,
        ..Default::default()
    })
}
