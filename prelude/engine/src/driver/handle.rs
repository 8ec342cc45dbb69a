//! The caller's side of a running job: its state as the driver's event loop folds it
//! ([`JobState`]), the [`Job`] handle's methods on it, and the list of this process's live jobs
//! (what a notebook interrupt stops).

use std::collections::VecDeque;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{mpsc, Arc, Condvar, Mutex, Weak};
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Result};
use trainbook_api::metric;
use trainbook_api::DeviceKind;
use trainbook_api::JobSpec;
use trainbook_api::{
    plumbing::handles::{JobControl, JobView},
    Job, JobStatus, JobUpdate, LogRecord, MetricRow, Progress, Resize, Restart, TrainError,
    TrainResult,
};

use super::membership::Membership;
use super::processes::STOP_GRACE;
use crate::shared::events::WorkerSummary;
use crate::shared::run_dir::RunDir;

pub(super) struct State {
    pub(super) status: JobStatus,
    pub(super) metrics: Vec<MetricRow>,
    pub(super) logs: VecDeque<LogRecord>,
    pub(super) tails: Vec<VecDeque<String>>,
    pub(super) errors: Vec<Option<String>>,
    pub(super) progress: Option<Progress>,
    pub(super) checkpoints: Vec<(u64, PathBuf)>,
    pub(super) summaries: Vec<Option<WorkerSummary>>,
    pub(super) failure: Option<TrainError>,
    pub(super) pids: Vec<u32>,
    /// Restarts after failures, in order.
    pub(super) restarts: Vec<Restart>,
    /// An elastic job's changes of size, in order.
    pub(super) resizes: Vec<Resize>,
    /// The nodes the current start runs on, and so its ranks (`world()` of them; the vectors
    /// by rank above are as long as the job's largest size).
    pub(super) membership: Membership,
    pub(super) elapsed: f64,
    pub(super) dropped_events: u64,
    /// What went wrong beside the training (an MLflow server that was down), for the result.
    pub(super) warnings: Vec<String>,
}

impl State {
    /// Records `failure` as the job's error unless one is recorded already: the first failure
    /// is the cause, the others its consequences. Returns whether it was recorded.
    pub(super) fn fail_once(&mut self, failure: TrainError) -> bool {
        if self.failure.is_some() {
            return false;
        }
        self.failure = Some(failure);
        true
    }

    /// Every rank of the current start reported `done`.
    pub(super) fn every_rank_done(&self) -> bool {
        let world = self.membership.world().min(self.summaries.len());
        self.summaries[..world].iter().all(|s| s.is_some())
    }
}

/// One job as its driver thread updates it and its handles read it.
pub(super) struct JobState {
    pub(super) id: u64,
    pub(super) spec: JobSpec,
    pub(super) device: DeviceKind,
    pub(super) run_dir: RunDir,
    pub(super) events_endpoint: String,
    pub(super) started: Instant,
    pub(super) state: Mutex<State>,
    pub(super) finished: Condvar,
    pub(super) stop_requested: AtomicBool,
    pub(super) subscribers: Mutex<Vec<mpsc::Sender<JobUpdate>>>,
    pub(super) views: Mutex<Vec<Arc<dyn JobView>>>,
    /// The numbers of nodes the job may run on (`JobSpec::node_counts`; one unless elastic).
    pub(super) node_counts: Vec<usize>,
    /// The resolved hyper-parameters (`None` for the engine's own jobs, which train nothing).
    pub(super) hyper: Option<trainbook_api::Hyper>,
}

/// How long [`Job::wait`] waits for views to settle.
const SETTLE_TIMEOUT: Duration = Duration::from_secs(3);

impl JobState {
    /// A job that has not started its workers yet.
    pub(super) fn new(
        spec: JobSpec,
        device: DeviceKind,
        run_dir: RunDir,
        events_endpoint: String,
    ) -> Self {
        let world = spec.world_size();
        let membership = Membership::new(&[], spec.nodes, spec.workers);
        let node_counts = spec.node_counts(None);
        JobState {
            id: NEXT_ID.fetch_add(1, Ordering::Relaxed),
            spec,
            device,
            run_dir,
            events_endpoint,
            started: Instant::now(),
            state: Mutex::new(State {
                status: JobStatus::Starting,
                metrics: Vec::new(),
                logs: VecDeque::new(),
                tails: vec![VecDeque::new(); world],
                errors: vec![None; world],
                progress: None,
                checkpoints: Vec::new(),
                summaries: vec![None; world],
                failure: None,
                pids: Vec::new(),
                restarts: Vec::new(),
                resizes: Vec::new(),
                membership,
                elapsed: 0.0,
                dropped_events: 0,
                warnings: Vec::new(),
            }),
            finished: Condvar::new(),
            stop_requested: AtomicBool::new(false),
            subscribers: Mutex::new(Vec::new()),
            views: Mutex::new(Vec::new()),
            node_counts,
            hyper: None,
        }
    }

    pub(super) fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        // A panic while holding the lock must not make the job unreadable.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub(super) fn publish(&self, u: JobUpdate) {
        let mut subs = self.subscribers.lock().unwrap_or_else(|e| e.into_inner());
        subs.retain(|s| s.send(u.clone()).is_ok());
    }
}

/// The engine's side of a [`Job`] handle.
#[derive(Clone)]
pub(super) struct JobHandle {
    job: Arc<JobState>,
}

impl JobHandle {
    /// Puts a job on the list of this process's live jobs and returns its handle.
    pub(super) fn register(job: Arc<JobState>) -> Job {
        LIVE_JOBS
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(Arc::downgrade(&job));
        JobHandle { job }.handle()
    }

    fn handle(self) -> Job {
        Job::new(Arc::new(self))
    }
}

/// This process's jobs (weakly: a finished job whose handles are gone drops out).
static LIVE_JOBS: Mutex<Vec<Weak<JobState>>> = Mutex::new(Vec::new());
static NEXT_ID: AtomicU64 = AtomicU64::new(1);

/// Jobs of this process that have not finished.
pub fn running_jobs() -> Vec<Job> {
    running().into_iter().map(JobHandle::handle).collect()
}

fn running() -> Vec<JobHandle> {
    let mut reg = LIVE_JOBS.lock().unwrap_or_else(|e| e.into_inner());
    reg.retain(|w| w.strong_count() > 0);
    reg.iter()
        .filter_map(|w| w.upgrade())
        .map(|job| JobHandle { job })
        .filter(|j| !j.status().is_finished())
        .collect()
}

/// Stops every running job of this process (what a notebook interrupt does first).
pub(crate) fn stop_all() -> usize {
    let jobs = running();
    for j in &jobs {
        j.request_stop();
    }
    for j in &jobs {
        let _ = j.wait_finished(STOP_GRACE + Duration::from_secs(3));
    }
    jobs.len()
}

impl JobHandle {
    fn request_stop(&self) {
        self.job.stop_requested.store(true, Ordering::Relaxed);
    }

    fn wait_finished(&self, timeout: Duration) -> bool {
        let deadline = Instant::now().checked_add(timeout);
        let mut st = self.job.lock();
        while !st.status.is_finished() {
            let left = deadline
                .map(|d| d.saturating_duration_since(Instant::now()))
                .unwrap_or(Duration::from_secs(3600));
            if left.is_zero() {
                return false;
            }
            st = self
                .job
                .finished
                .wait_timeout(st, left)
                .map(|(g, _)| g)
                .unwrap_or_else(|e| e.into_inner().0);
        }
        true
    }
}

impl JobControl for JobHandle {
    fn id(&self) -> u64 {
        self.job.id
    }

    fn spec(&self) -> &JobSpec {
        &self.job.spec
    }

    fn device(&self) -> DeviceKind {
        self.job.device
    }

    fn run_dir(&self) -> &Path {
        &self.job.run_dir
    }

    /// The zeromq endpoint workers report to (loopback; messages need the job's token).
    fn events_endpoint(&self) -> &str {
        &self.job.events_endpoint
    }

    fn status(&self) -> JobStatus {
        self.job.lock().status
    }

    /// Worker process ids (for diagnostics and tests).
    fn pids(&self) -> Vec<u32> {
        self.job.lock().pids.clone()
    }

    fn progress(&self) -> Option<Progress> {
        self.job.lock().progress.clone()
    }

    /// Attaches a view that [`Job::wait`] lets settle before it returns (see [`JobView`]).
    fn attach_view(&self, view: Arc<dyn JobView>) {
        self.job
            .views
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(view);
    }

    /// Every metric row reported so far, in arrival order.
    fn metric_rows(&self) -> Vec<MetricRow> {
        self.job.lock().metrics.clone()
    }

    /// The most recent log lines of all workers (the run directory holds the full logs).
    fn logs(&self) -> Vec<LogRecord> {
        self.job.lock().logs.iter().cloned().collect()
    }

    /// Messages that reached the event socket without this job's token (dropped).
    fn dropped_events(&self) -> u64 {
        self.job.lock().dropped_events
    }

    /// Live updates from now on. Dropping the receiver unsubscribes.
    fn subscribe(&self) -> mpsc::Receiver<JobUpdate> {
        let (tx, rx) = mpsc::channel();
        // Holding the subscriber list while reading the status closes the race with the
        // driver, which sets the final status before it publishes `Finished` to this list:
        // either we see the final status here, or we are on the list when it is published.
        let mut subs = self
            .job
            .subscribers
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        let status = JobControl::status(self);
        if status.is_finished() {
            let _ = tx.send(JobUpdate::Finished(status));
        } else {
            subs.push(tx);
        }
        rx
    }

    /// Stops the workers (SIGTERM, then SIGKILL after a grace period) and waits for them.
    fn stop(&self) -> Result<()> {
        self.request_stop();
        if !self.wait_finished(STOP_GRACE + Duration::from_secs(5)) {
            bail!(
                "job {} did not stop within {} s; its workers were sent SIGKILL",
                JobControl::id(self),
                STOP_GRACE.as_secs() + 5
            );
        }
        Ok(())
    }

    /// Blocks until the job ends. Ok for a successful job; the error names the failing rank
    /// or says the job was stopped. [`Job::result`] has the details either way.
    fn wait(&self) -> Result<TrainResult> {
        self.wait_finished(Duration::MAX);
        let views = std::mem::take(&mut *self.job.views.lock().unwrap_or_else(|e| e.into_inner()));
        let deadline = Instant::now() + SETTLE_TIMEOUT;
        for v in views {
            v.settle(deadline.saturating_duration_since(Instant::now()));
        }
        let result = self.result()?;
        match result.status {
            JobStatus::Succeeded => Ok(result),
            JobStatus::Stopped => Err(TrainError::Interrupted {
                run_dir: result.run_dir.display().to_string(),
            }
            .into()),
            _ => Err(self
                .job
                .lock()
                .failure
                .clone()
                .map(anyhow::Error::from)
                .unwrap_or_else(|| anyhow!("the job failed"))),
        }
    }

    /// The job's result so far (final once the job has finished).
    fn result(&self) -> Result<TrainResult> {
        let st = self.job.lock();
        let summaries: Vec<&WorkerSummary> = st.summaries.iter().flatten().collect();
        let s0 = st.summaries.first().cloned().flatten().unwrap_or_default();
        let samples: u64 = summaries.iter().map(|s| s.samples).sum();
        let secs = summaries
            .iter()
            .map(|s| s.train_seconds)
            .fold(0.0, f64::max);
        let mut final_metrics = s0.metrics.clone();
        let best_epoch = st
            .metrics
            .iter()
            .filter(|m| m.name == metric::EVAL_LOSS)
            .min_by(|a, b| a.value.total_cmp(&b.value))
            .map(|m| m.epoch);
        let last_checkpoint = st.checkpoints.last().map(|(_, p)| p.clone());
        let best_checkpoint = best_epoch
            .and_then(|e| {
                // The epoch's last checkpoint: the one at its end, after any step checkpoints.
                st.checkpoints
                    .iter()
                    .rev()
                    .find(|(ce, _)| *ce == e)
                    .map(|(_, p)| p.clone())
            })
            .or_else(|| last_checkpoint.clone());
        let sps = if secs > 0.0 {
            samples as f64 / secs
        } else {
            0.0
        };
        final_metrics.insert(metric::SAMPLES_PER_SECOND.into(), sps);
        final_metrics.insert(metric::TRAIN_LOSS.into(), s0.final_train_loss);
        Ok(TrainResult {
            status: st.status,
            recipe: self.job.spec.recipe.clone(),
            workers: st.membership.world(),
            device: self.job.device,
            metrics: final_metrics,
            metric_rows: st.metrics.clone(),
            last_checkpoint,
            best_checkpoint,
            run_dir: self.job.run_dir.to_path_buf(),
            error: st.failure.as_ref().map(|f| f.to_string()).or(
                if st.status == JobStatus::Stopped {
                    Some("stopped".into())
                } else {
                    None
                },
            ),
            steps: s0.steps,
            samples_per_second: sps,
            final_train_loss: s0.final_train_loss,
            param_sum: s0.param_sum,
            param_l2: s0.param_l2,
            memory: summaries.iter().map(|s| s.memory.clone()).collect(),
            restarts: st.restarts.clone(),
            resizes: st.resizes.clone(),
            warnings: st.warnings.clone(),
            profile: s0.profile.clone().map(|mut p| {
                p.traces = traces(&self.job.run_dir, p.traces);
                p
            }),
            elapsed: if st.status.is_finished() {
                st.elapsed
            } else {
                self.job.started.elapsed().as_secs_f64()
            },
        })
    }
}

/// Every rank's trace in the run directory's profile/ (rank 0's first), else the ones given.
fn traces(run_dir: &RunDir, given: Vec<std::path::PathBuf>) -> Vec<std::path::PathBuf> {
    let mut found: Vec<std::path::PathBuf> = std::fs::read_dir(run_dir.profile())
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.to_string_lossy().ends_with(".pt.trace.json"))
        .collect();
    // rank10 after rank9: by the number in the name.
    found.sort_by_key(|p| {
        let name = p.file_name().map(|n| n.to_string_lossy().into_owned());
        name.and_then(|n| {
            n.trim_start_matches("rank")
                .split('.')
                .next()?
                .parse::<usize>()
                .ok()
        })
    });
    if found.is_empty() {
        given
    } else {
        found
    }
}
