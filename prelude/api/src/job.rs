//! A job as its callers see it: the handle ([`Job`]) with status, progress, metrics, logs,
//! stop and wait; what subscribers receive while it runs ([`JobUpdate`]); its outcome
//! ([`TrainResult`]). The engine's driver is the one implementation behind the handle
//! ([`JobControl`]).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::{mpsc, Arc};
use std::time::Duration;

use anyhow::Result;
use serde::{Deserialize, Serialize};

use crate::device::DeviceKind;
use crate::logs::{Shown, Stream};
use crate::metric;
use crate::runtime::port;
use crate::spec::{JobSpec, Plan};
use crate::table::{Column, Table};

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum JobStatus {
    #[default]
    Starting,
    Running,
    Succeeded,
    Failed,
    Stopped,
}

impl JobStatus {
    pub fn is_finished(self) -> bool {
        matches!(
            self,
            JobStatus::Succeeded | JobStatus::Failed | JobStatus::Stopped
        )
    }
    pub fn name(self) -> &'static str {
        match self {
            JobStatus::Starting => "starting",
            JobStatus::Running => "running",
            JobStatus::Succeeded => "succeeded",
            JobStatus::Failed => "failed",
            JobStatus::Stopped => "stopped",
        }
    }
}

impl std::fmt::Display for JobStatus {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// Why a job did not succeed.
#[derive(Clone, Debug, thiserror::Error)]
pub enum TrainError {
    #[error("worker rank {rank} failed ({how}); all workers were stopped.{message}\nlast lines of rank {rank}:\n{tail}\nfull log: {log}")]
    WorkerFailed {
        rank: usize,
        how: String,
        message: String,
        tail: String,
        log: String,
    },
    #[error("node {node} was lost: {how}; all workers were stopped. Its workers' connections closed, which failed this node's ({local}). Start that node again, then resume the run (--name and --resume auto)")]
    NodeLost {
        node: usize,
        how: String,
        /// How this node's workers ended meanwhile.
        local: String,
    },
    #[error("the job was stopped before it finished (run directory: {run_dir})")]
    Interrupted { run_dir: String },
}

/// One line of worker output.
#[derive(Clone, Debug, Serialize)]
pub struct LogRecord {
    pub rank: usize,
    pub stream: Stream,
    pub text: String,
    /// Seconds since the job started.
    pub time: f64,
}

impl std::fmt::Display for LogRecord {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "(rank {}) {}", self.rank, self.text)
    }
}

/// Latest progress, as reported by rank 0.
#[derive(Clone, Debug, Default, Serialize)]
pub struct Progress {
    pub step: u64,
    pub total_steps: u64,
    pub epoch: u64,
    pub epochs: u64,
    pub samples: u64,
    pub samples_per_second: f64,
    pub elapsed: f64,
}

/// What subscribers (terminal, notebook) receive while the job runs.
#[derive(Clone, Debug)]
pub enum JobUpdate {
    Log(Shown),
    Metric(MetricRow),
    Progress(Progress),
    Checkpoint {
        epoch: u64,
        path: PathBuf,
    },
    /// The job restarted its workers after a failure; steps after `resumed_step` are replayed
    /// (their metric rows were dropped and come again).
    Restart(Restart),
    /// An elastic job changed its size (after a lost node, or a node that joined); the workers
    /// of the new size continue from `resumed_step`, as after a restart.
    Resize(Resize),
    Finished(JobStatus),
}

/// One restart of a job: why, and where it resumed.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Restart {
    /// Which restart: 1 for the first (an *attempt* is a start of the workers: 0 the first).
    pub number: u32,
    /// The restarts allowed (`max_failures`); `None`: no limit.
    pub allowed: Option<u32>,
    /// Seconds since the job started.
    pub time: f64,
    /// What failed, e.g. "rank 1 killed by SIGKILL".
    pub reason: String,
    /// The rank blamed, when one is.
    pub rank: Option<usize>,
    /// The step the blamed rank was at when it failed (steps done).
    pub failed_at_step: Option<u64>,
    /// The checkpoint the workers resumed from; `None`: from the start.
    pub checkpoint: Option<PathBuf>,
    /// The step they resumed at.
    pub resumed_step: u64,
    /// Steps of training redone (failed_at_step - resumed_step).
    pub steps_lost: u64,
}

impl std::fmt::Display for Restart {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let of = self
            .allowed
            .map(|a| format!("/{a}"))
            .unwrap_or_else(|| " (no limit)".into());
        write!(f, "restart {}{of}: {}", self.number, self.reason)?;
        if let Some(s) = self.failed_at_step {
            write!(f, " at step {s}")?;
        }
        match &self.checkpoint {
            Some(c) => write!(
                f,
                " — resumed from step {} (checkpoint {})",
                self.resumed_step,
                c.display()
            ),
            None => write!(f, " — started again from step 0 (no checkpoint yet)"),
        }
    }
}

/// One change of an elastic job's size (`nodes(min..=max)`, `--nnodes MIN:MAX`): the nodes
/// it runs on since, and why.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Resize {
    /// Seconds since the job started.
    pub time: f64,
    /// Workers before and after.
    pub from_workers: usize,
    pub to_workers: usize,
    /// The nodes it runs on now (node ids as started, `--node-rank`).
    pub nodes: Vec<usize>,
    /// Why, e.g. "node 3 lost" or "node 3 joined".
    pub reason: String,
    /// The checkpoint the new size continued from; `None`: from the start.
    pub checkpoint: Option<PathBuf>,
    /// The step it continued at.
    pub resumed_step: u64,
}

impl std::fmt::Display for Resize {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let nodes: Vec<String> = self.nodes.iter().map(ToString::to_string).collect();
        write!(
            f,
            "resized: {} -> {} workers on nodes {} ({}) — continued from step {}",
            self.from_workers,
            self.to_workers,
            nodes.join(", "),
            self.reason,
            self.resumed_step
        )
    }
}

/// One worker's memory at the end of its run, in bytes: what its parameters, gradients,
/// optimizer state and communication buffers take (ZeRO-1 cuts the optimizer state to 1/W),
/// and the peak the process or device reached.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct MemoryUse {
    pub rank: usize,
    pub parameters: u64,
    pub gradients: u64,
    pub optimizer_state: u64,
    /// Flat gradient buckets (and ZeRO's shards).
    pub buffers: u64,
    /// The peak of [`MemoryUse::peak_of`]; 0 where it could not be read.
    pub peak: u64,
    /// What `peak` measures: `cuda` / `hpu` (device memory allocated) or `rss` (the worker
    /// process's resident memory, on CPU).
    pub peak_of: String,
}

/// The outcome of a job.
#[derive(Clone, Debug)]
pub struct TrainResult {
    pub status: JobStatus,
    pub recipe: String,
    pub workers: usize,
    pub device: DeviceKind,
    /// Final metrics: the last value of every global metric plus run statistics.
    pub metrics: BTreeMap<String, f64>,
    /// Every metric row the workers reported, in arrival order ([`TrainResult::history`] as a
    /// table).
    pub metric_rows: Vec<MetricRow>,
    /// The last epoch's checkpoint.
    pub last_checkpoint: Option<PathBuf>,
    /// The checkpoint of the epoch with the lowest `eval_loss` (`None` without evaluation).
    pub best_checkpoint: Option<PathBuf>,
    pub run_dir: PathBuf,
    pub error: Option<String>,
    pub steps: u64,
    pub samples_per_second: f64,
    pub final_train_loss: f64,
    pub param_sum: f64,
    pub param_l2: f64,
    pub elapsed: f64,
    /// Each rank's memory, by rank ([`TrainResult::memory_table`] as a table).
    pub memory: Vec<MemoryUse>,
    /// The job's restarts after failures, in order (see `max_failures`).
    pub restarts: Vec<Restart>,
    /// An elastic job's changes of size, in order (see `nodes(min..=max)`); `workers` is
    /// the size it ended with.
    pub resizes: Vec<Resize>,
    /// What went wrong beside the training, e.g. an MLflow server that was down (the metrics
    /// it did not get are named).
    pub warnings: Vec<String>,
    /// What the step profiler recorded (`profile`), rank 0's operators.
    pub profile: Option<crate::profile::StepProfile>,
}

impl TrainResult {
    /// One row per epoch: train loss/accuracy, eval loss/accuracy, samples/s, time (see
    /// [`per_epoch`]); [`TrainResult::history`] has every step.
    pub fn epochs(&self) -> Result<Table> {
        per_epoch(&self.metric_rows)
    }

    /// Every metric reported: columns rank, step, epoch, name, value, time.
    pub fn history(&self) -> Table {
        metrics_table(&self.metric_rows)
    }

    /// One row per rank: parameters, gradients, optimizer state, buffers and peak, in MiB.
    pub fn memory_table(&self) -> Table {
        let mib = |f: fn(&MemoryUse) -> u64| {
            self.memory
                .iter()
                .map(move |m| Some(f(m) as f64 / (1 << 20) as f64))
        };
        Table::from_columns(vec![
            Column::uint("rank", self.memory.iter().map(|m| Some(m.rank as u64))),
            Column::float("parameters_mib", mib(|m| m.parameters)),
            Column::float("gradients_mib", mib(|m| m.gradients)),
            Column::float("optimizer_state_mib", mib(|m| m.optimizer_state)),
            Column::float("buffers_mib", mib(|m| m.buffers)),
            Column::float("peak_mib", mib(|m| m.peak)),
            Column::str(
                "peak_of",
                self.memory.iter().map(|m| Some(m.peak_of.clone())),
            ),
        ])
        .expect("memory columns have one value per rank")
    }

    /// The summary the CLI prints with `--json`.
    pub fn to_json(&self) -> serde_json::Value {
        serde_json::json!({
            "status": self.status.name(),
            "recipe": self.recipe,
            "workers": self.workers,
            "device": self.device.name(),
            "steps": self.steps,
            "final_train_loss": finite_or_null(self.final_train_loss),
            "samples_per_second": finite_or_null(self.samples_per_second),
            "elapsed_seconds": self.elapsed,
            "run_dir": self.run_dir.display().to_string(),
            "param_sum": finite_or_null(self.param_sum),
            "param_l2": finite_or_null(self.param_l2),
            "metrics": self.metrics.iter().map(|(k, v)| (k.clone(), finite_or_null(*v))).collect::<serde_json::Map<_, _>>(),
            "last_checkpoint": self.last_checkpoint.as_ref().map(|p| p.display().to_string()),
            "best_checkpoint": self.best_checkpoint.as_ref().map(|p| p.display().to_string()),
            "error": self.error,
            "memory": self.memory,
            "restarts": self.restarts,
            "resizes": self.resizes,
            "warnings": self.warnings,
            "profile": self.profile,
        })
    }
}

fn finite_or_null(v: f64) -> serde_json::Value {
    if v.is_finite() {
        serde_json::json!(v)
    } else {
        serde_json::Value::Null
    }
}

/// One metric value a worker reported.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct MetricRow {
    pub rank: u32,
    pub step: u64,
    pub epoch: u64,
    pub name: String,
    pub value: f64,
    /// Seconds since the job started.
    pub time: f64,
}

/// Metric rows as a table: columns rank, step, epoch, name, value, time.
pub fn metrics_table(rows: &[MetricRow]) -> Table {
    Table::from_columns(vec![
        Column::uint("rank", rows.iter().map(|r| Some(r.rank as u64))),
        Column::uint("step", rows.iter().map(|r| Some(r.step))),
        Column::uint("epoch", rows.iter().map(|r| Some(r.epoch))),
        Column::str("name", rows.iter().map(|r| Some(r.name.clone()))),
        Column::float("value", rows.iter().map(|r| Some(r.value))),
        Column::float("time", rows.iter().map(|r| Some(r.time))),
    ])
    .expect("metric columns have one value per row")
}

/// One row per epoch from the metrics a run reported: `epoch`, then whichever of `train_loss`,
/// `train_accuracy`, `eval_loss`, `eval_accuracy` the run reported, then its further per-epoch
/// scores in name order (`eval_f1`, a task's own `eval_confidence` and `train_confidence`),
/// `samples_per_second` and `time` (seconds since the start when the epoch's last metric
/// came). Per-step metrics (`loss`, `lr`, a task's own per-step values) stay in the full
/// history.
pub fn per_epoch(rows: &[MetricRow]) -> Result<Table> {
    // The column of a per-epoch metric, with the order it sorts in: the fixed scores first,
    // the others by name, throughput last.
    fn column(name: &str) -> Option<((u8, String), String)> {
        let label = match name {
            metric::SAMPLES_PER_SECOND => return Some(((2, String::new()), name.to_string())),
            _ => match name.strip_prefix(metric::EPOCH_TRAIN_PREFIX) {
                Some(rest) => format!("train_{rest}"),
                None if name.starts_with(metric::EVAL_PREFIX) => name.to_string(),
                None => return None,
            },
        };
        let fixed = [
            metric::TRAIN_LOSS,
            "train_accuracy",
            metric::EVAL_LOSS,
            metric::EVAL_ACCURACY,
        ];
        Some(match fixed.iter().position(|f| *f == label) {
            Some(i) => ((0, i.to_string()), label),
            None => ((1, label.clone()), label),
        })
    }
    // epoch → (value per column, time of the latest); global metrics come once per epoch, the
    // last report wins if a resumed run repeated one.
    let mut labels: BTreeMap<(u8, String), String> = BTreeMap::new();
    let mut epochs: BTreeMap<u64, (BTreeMap<String, f64>, f64)> = BTreeMap::new();
    for r in rows {
        let Some((order, label)) = column(&r.name) else {
            continue;
        };
        labels.insert(order, label.clone());
        let row = epochs.entry(r.epoch).or_default();
        row.0.insert(label, r.value);
        row.1 = row.1.max(r.time);
    }
    let mut columns = vec![Column::uint("epoch", epochs.keys().map(|e| Some(*e)))];
    for label in labels.values() {
        columns.push(Column::float(
            label,
            epochs.values().map(|r| r.0.get(label).copied()),
        ));
    }
    columns.push(Column::float("time", epochs.values().map(|r| Some(r.1))));
    Table::from_columns(columns)
}

/// Something that shows a job as it runs (the notebook's live dashboard). [`Job::wait`] gives
/// every attached view a few seconds to draw the job's final state before it returns, so the
/// waiting cell receives that state; the engine calls nothing else of it.
pub trait JobView: Send + Sync {
    /// Returns once the view has drawn the finished job, or after `timeout`.
    fn settle(&self, timeout: Duration);
}

/// What is behind a [`Job`] handle: the engine's driver of a running or finished job.
pub trait JobControl: Send + Sync {
    fn id(&self) -> u64;
    fn spec(&self) -> &JobSpec;
    fn device(&self) -> DeviceKind;
    fn run_dir(&self) -> &Path;
    fn events_endpoint(&self) -> &str;
    fn status(&self) -> JobStatus;
    fn pids(&self) -> Vec<u32>;
    fn progress(&self) -> Option<Progress>;
    fn metric_rows(&self) -> Vec<MetricRow>;
    fn logs(&self) -> Vec<LogRecord>;
    fn dropped_events(&self) -> u64;
    fn subscribe(&self) -> mpsc::Receiver<JobUpdate>;
    fn attach_view(&self, view: Arc<dyn JobView>);
    fn stop(&self) -> Result<()>;
    fn wait(&self) -> Result<TrainResult>;
    fn result(&self) -> Result<TrainResult>;
}

/// A handle on a running or finished job. Cheap to clone.
#[derive(Clone)]
pub struct Job(Arc<dyn JobControl>);

impl Job {
    /// The handle of the job `control` drives (the engine makes these).
    pub fn new(control: Arc<dyn JobControl>) -> Job {
        Job(control)
    }

    /// What this handle refers to (for engines and views that need their own type back).
    pub fn control(&self) -> &Arc<dyn JobControl> {
        &self.0
    }

    /// Process-wide number of this job (1, 2, ...).
    pub fn id(&self) -> u64 {
        self.0.id()
    }

    /// The job as it was asked for.
    pub fn spec(&self) -> &JobSpec {
        self.0.spec()
    }

    /// The device its workers use.
    pub fn device(&self) -> DeviceKind {
        self.0.device()
    }

    /// The run directory: config, logs, metrics, checkpoints.
    pub fn run_dir(&self) -> &Path {
        self.0.run_dir()
    }

    /// The zeromq endpoint workers report to (loopback; messages need the job's token).
    pub fn events_endpoint(&self) -> &str {
        self.0.events_endpoint()
    }

    pub fn status(&self) -> JobStatus {
        self.0.status()
    }

    /// Worker process ids (for diagnostics and tests).
    pub fn pids(&self) -> Vec<u32> {
        self.0.pids()
    }

    /// The latest progress rank 0 reported.
    pub fn progress(&self) -> Option<Progress> {
        self.0.progress()
    }

    /// Every metric reported so far: columns rank, step, epoch, name, value, time.
    pub fn metrics(&self) -> Result<Table> {
        Ok(metrics_table(&self.0.metric_rows()))
    }

    /// Every metric row reported so far, in arrival order.
    pub fn metric_rows(&self) -> Vec<MetricRow> {
        self.0.metric_rows()
    }

    /// The most recent log lines of all workers (the run directory holds the full logs).
    pub fn logs(&self) -> Vec<LogRecord> {
        self.0.logs()
    }

    /// Messages that reached the event socket without this job's token (dropped).
    pub fn dropped_events(&self) -> u64 {
        self.0.dropped_events()
    }

    /// Live updates from now on. Dropping the receiver unsubscribes.
    pub fn subscribe(&self) -> mpsc::Receiver<JobUpdate> {
        self.0.subscribe()
    }

    /// Attaches a view that [`Job::wait`] lets settle before it returns (see [`JobView`]).
    pub fn attach_view(&self, view: Arc<dyn JobView>) {
        self.0.attach_view(view)
    }

    /// Stops the workers (SIGTERM, then SIGKILL after a grace period) and waits for them.
    pub fn stop(&self) -> Result<()> {
        self.0.stop()
    }

    /// Blocks until the job ends. Ok for a successful job; the error names the failing rank
    /// or says the job was stopped. [`Job::result`] has the details either way.
    pub fn wait(&self) -> Result<TrainResult> {
        self.0.wait()
    }

    /// The job's result so far (final once the job has finished).
    pub fn result(&self) -> Result<TrainResult> {
        self.0.result()
    }

    /// Displays the job's dashboard (progress, loss plot, metrics table, logs): live in the
    /// trainbook kernel, updating in place until the job ends; as text elsewhere.
    pub fn show(&self) -> Result<()> {
        port::<dyn Jobs>()?.show_job(self)
    }
}

impl std::fmt::Debug for Job {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "Job({} {} x{} on {}, {}, {})",
            self.id(),
            self.spec().recipe,
            self.spec().workers,
            self.device(),
            self.status(),
            self.run_dir().display()
        )
    }
}

/// Jobs of this process that have not finished (none when trainbook's engine is not loaded).
pub fn running_jobs() -> Vec<Job> {
    port::<dyn Jobs>()
        .map(|r| r.running_jobs())
        .unwrap_or_default()
}

/// Stops every running job of this process (what a notebook interrupt does first); returns how
/// many there were.
pub fn stop_all() -> usize {
    port::<dyn Jobs>().map(|r| r.stop_all()).unwrap_or(0)
}

/// The engine's side of jobs: what [`crate::launch`], [`Job::show`] and the other job
/// operations need of it. The `trainbook` crate implements it (see `crate::runtime`).
pub trait Jobs: Send + Sync {
    /// Starts `spec` with trainbook's recipes; in the trainbook kernel the cell shows its live
    /// dashboard.
    fn launch(&self, spec: JobSpec) -> Result<Job>;
    /// The device and hyper-parameters `spec` would run with (nothing started).
    fn plan(&self, spec: &JobSpec) -> Result<Plan>;
    /// Jobs of this process that have not finished.
    fn running_jobs(&self) -> Vec<Job>;
    /// Stops every running job of this process; returns how many there were.
    fn stop_all(&self) -> usize;
    /// Shows a job's dashboard in the current cell (live in the kernel, text elsewhere).
    fn show_job(&self, job: &Job) -> Result<()>;
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(epoch: u64, name: &str, value: f64, time: f64) -> MetricRow {
        MetricRow {
            rank: 0,
            step: epoch * 10,
            epoch,
            name: name.into(),
            value,
            time,
        }
    }

    #[test]
    fn per_epoch_puts_further_scores_between_accuracy_and_throughput() {
        let rows = vec![
            row(0, "samples_per_second", 100.0, 1.0),
            row(0, "eval_f1_macro", 0.5, 1.0),
            row(0, "eval_accuracy", 0.6, 1.0),
            row(0, "epoch_train_confidence", 0.3, 1.0),
            row(0, "confidence", 0.2, 0.5),
            row(0, "epoch_train_loss", 0.8, 1.0),
        ];
        let t = per_epoch(&rows).unwrap();
        assert_eq!(
            t.column_names(),
            [
                "epoch",
                "train_loss",
                "eval_accuracy",
                "eval_f1_macro",
                "train_confidence",
                "samples_per_second",
                "time"
            ]
        );
    }

    #[test]
    fn per_epoch_has_one_row_per_epoch_and_only_reported_columns() {
        let rows = vec![
            row(0, "loss", 0.9, 1.0),
            row(0, "epoch_train_loss", 0.8, 2.0),
            row(0, "eval_loss", 0.7, 3.0),
            row(1, "loss", 0.5, 4.0),
            row(1, "epoch_train_loss", 0.4, 5.0),
            row(1, "eval_loss", 0.45, 6.0),
        ];
        let t = per_epoch(&rows).unwrap();
        assert_eq!(
            t.column_names(),
            ["epoch", "train_loss", "eval_loss", "time"]
        );
        assert_eq!(t.height(), 2);
        assert_eq!(
            t.column("eval_loss").unwrap().f64s(),
            [Some(0.7), Some(0.45)]
        );
        assert_eq!(t.column("time").unwrap().f64s(), [Some(3.0), Some(6.0)]);
    }

    #[test]
    fn the_metrics_table_has_a_row_per_report() {
        let t = metrics_table(&[row(0, "loss", 0.9, 1.0), row(1, "loss", 0.5, 4.0)]);
        assert_eq!(t.shape(), (2, 6));
        assert_eq!(t.column("name").unwrap().get(1).to_string(), "loss");
        assert_eq!(t.column("epoch").unwrap().f64s(), [Some(0.0), Some(1.0)]);
    }
}
