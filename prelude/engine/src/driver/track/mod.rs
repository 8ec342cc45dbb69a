//! The run's trackers, one concept behind one trait: dllogger's JSON lines (`dllog`),
//! TensorBoard's event file (`tensorboard`, its HParams columns from `hparams`) and an MLflow
//! run (`mlflow`) are each a [`Tracker`]. The driver holds them as one [`Trackers`] and feeds
//! it rank 0's metrics, the restarts, rank 0's summary and the job's end, without naming any
//! of them. They live on node 0 only: other nodes forward their events there. A sweep
//! registers its swept options ([`SweepColumns`]) for its trials' HParams columns.

mod dllog;
mod hparams;
mod mlflow;
mod tensorboard;

use std::collections::BTreeMap;
use std::path::PathBuf;

use trainbook_api::{JobStatus, MetricRow, Restart};

use super::handle::JobState;
use crate::shared::events::WorkerSummary;

pub(crate) use hparams::{SweepColumns, Swept};

/// What a tracker is told. Every method has a default that ignores it: each tracker takes the
/// part it records.
pub(super) trait Tracker {
    /// One of rank 0's metrics.
    fn metric(&mut self, _row: &MetricRow) {}
    /// The workers restart from `resumed_step` (the checkpoint's step; 0 without one).
    fn restart(&mut self, _resumed_step: u64, _restart: &Restart) {}
    /// Rank 0 finished training with `summary`, `elapsed` seconds into the job.
    fn done(&mut self, _summary: &WorkerSummary, _elapsed: f64) {}
    /// Called by the event loop at least once a second, for flushing on time.
    fn tick(&mut self) {}
    /// The job ended with `status`, its newest checkpoint `checkpoint`. A warning for the
    /// job's result when the tracker could not do its part (a server that was down).
    fn finish(self: Box<Self>, _status: JobStatus, _checkpoint: Option<PathBuf>) -> Option<String> {
        None
    }
}

/// The job's trackers, fed together.
pub(super) struct Trackers(Vec<Box<dyn Tracker>>);

impl Trackers {
    /// None (the drivers of nodes other than 0, and tests).
    pub(super) fn none() -> Trackers {
        Trackers(Vec::new())
    }

    /// Node 0's trackers for `job`: dllogger always, TensorBoard unless the job turned it
    /// off, MLflow when a tracking server is named (a malformed `MLFLOW_TRACKING_URI` is a
    /// warning on the job).
    pub(super) fn for_job(job: &JobState) -> Trackers {
        let parameters = parameters(job);
        let mut trackers: Vec<Box<dyn Tracker>> = vec![Box::new(dllog::DlLog::create(
            &job.run_dir.dllogger(),
            parameters.clone(),
        ))];
        if job.spec.tensorboard {
            trackers.push(Box::new(tensorboard::for_job(job, &parameters)));
        }
        if let Some(m) = mlflow::for_job(job, &parameters) {
            trackers.push(Box::new(m));
        }
        Trackers(trackers)
    }

    pub(super) fn metric(&mut self, row: &MetricRow) {
        self.0.iter_mut().for_each(|t| t.metric(row));
    }

    pub(super) fn restart(&mut self, resumed_step: u64, restart: &Restart) {
        self.0
            .iter_mut()
            .for_each(|t| t.restart(resumed_step, restart));
    }

    pub(super) fn done(&mut self, summary: &WorkerSummary, elapsed: f64) {
        self.0.iter_mut().for_each(|t| t.done(summary, elapsed));
    }

    pub(super) fn tick(&mut self) {
        self.0.iter_mut().for_each(|t| t.tick());
    }

    /// Ends every tracker; the warnings of those that could not do their part.
    pub(super) fn finish(self, status: JobStatus, checkpoint: Option<PathBuf>) -> Vec<String> {
        self.0
            .into_iter()
            .filter_map(|t| t.finish(status, checkpoint.clone()))
            .collect()
    }
}

/// The resolved hyper-parameters (as config.json records them), plus the recipe, the workers
/// and the device: what heads the dllogger file, TensorBoard's HParams and MLflow's params.
fn parameters(job: &JobState) -> serde_json::Value {
    let mut parameters = job
        .hyper
        .as_ref()
        .and_then(|h| serde_json::to_value(h).ok())
        .filter(|h| h.is_object())
        .unwrap_or_else(|| serde_json::json!({}));
    parameters["recipe"] = job.spec.recipe.clone().into();
    parameters["workers"] = job.spec.world_size().into();
    parameters["device"] = job.device.name().into();
    parameters
}

/// Options as one level of `name = value` (TensorBoard's HParams, MLflow's params): nested
/// objects as `a.b`, unset (null) options left out, so every trial of a sweep has the same
/// names.
fn flat_options(options: &serde_json::Value) -> BTreeMap<String, serde_json::Value> {
    fn walk(prefix: &str, v: &serde_json::Value, out: &mut BTreeMap<String, serde_json::Value>) {
        match v {
            serde_json::Value::Null => {}
            serde_json::Value::Object(m) => {
                for (k, v) in m {
                    let key = if prefix.is_empty() {
                        k.clone()
                    } else {
                        format!("{prefix}.{k}")
                    };
                    walk(&key, v, out);
                }
            }
            leaf => {
                out.insert(prefix.to_string(), leaf.clone());
            }
        }
    }
    let mut out = BTreeMap::new();
    walk("", options, &mut out);
    out
}
