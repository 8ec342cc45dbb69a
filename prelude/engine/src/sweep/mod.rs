//! Sweeps: many trials of one job, several at a time, the unpromising ones stopped early.
//!
//! A sweep is jobs composed, not a second engine: each trial is an ordinary job (its own
//! workers, rendezvous, run directory, restarts) launched by [`crate::driver::launch`] into the
//! sweep's directory. The sweep's driver thread starts trials as slots free ([`slots`]:
//! whole devices per trial, or a share of the cores), follows each trial's updates, feeds the
//! metric's reports to the sweep's scheduler ([`scheduler`]) and stops a trial it prunes
//! once that epoch's checkpoint is written, so a pruned trial keeps its checkpoint and metrics.
//! Views subscribe to [`SweepUpdate`]s, as they do to a job's updates.
//!
//! - [`params`]: the trials' jobs, checked before the first one starts.
//! - [`scheduler`]: the early-stopping rules (ASHA, the median rule, none).
//! - [`slots`]: which devices or cores a trial gets.

mod params;
mod scheduler;
mod slots;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc, Condvar, Mutex, MutexGuard, Weak};
use std::thread;
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context, Result};
use trainbook_api::metric;
use trainbook_api::{plumbing::handles::JobView, Job, JobStatus, JobUpdate};
use trainbook_api::{
    plumbing::handles::SweepControl,
    plumbing::trials::{best_finished, status_counts, trial_json},
    Scheduler, SweepJob, SweepResult, SweepSpec, SweepStatus, SweepUpdate, Trial, TrialPlan,
    TrialStatus,
};

use crate::shared::checkpoint::write_json_atomic;
use crate::worker::recipe::Registry;
use scheduler::{SchedulerState, TrialVerdict};
use slots::Slots;

/// The file in a sweep's directory that describes it: the spec, every trial's parameters,
/// status, reports and run directory, and the best trial; rewritten as trials end.
pub const SWEEP_JSON: &str = "sweep.json";

/// The trials `spec` would run, each checked (nothing starts).
pub fn plan(spec: &SweepSpec, recipes: &Registry) -> Result<Vec<TrialPlan>> {
    params::plan(spec, recipes)
}

/// Starts a sweep and returns at once.
pub fn launch(spec: SweepSpec, recipes: &'static Registry) -> Result<SweepJob> {
    let trials = params::plan(&spec, recipes)?;
    let device = crate::driver::placement::resolve(spec.base.device, spec.base.workers)?;
    let slots = Slots::new(&spec, device)?;
    let max_t = max_reports(&spec, &trials, recipes)?;
    let dir = sweep_dir(&spec)?;
    // Its trials declare the swept options as their TensorBoard HParams columns.
    let columns = crate::driver::SweepColumns::register(
        &dir,
        crate::driver::Swept {
            space: spec.space.clone(),
            metric: spec.metric.clone(),
        },
    );
    let state = Arc::new(SweepState {
        trials: Mutex::new(Inner {
            trials: trials
                .iter()
                .map(|t| Trial {
                    id: t.id,
                    params: t.params.clone(),
                    status: TrialStatus::Pending,
                    step: 0,
                    total_steps: 0,
                    reports: Vec::new(),
                    elapsed: 0.0,
                    run_dir: None,
                    note: None,
                    error: None,
                    result: None,
                })
                .collect(),
            jobs: BTreeMap::new(),
            status: SweepStatus::Running,
            subscribers: Vec::new(),
            views: Vec::new(),
            elapsed: 0.0,
        }),
        finished: Condvar::new(),
        stop: AtomicBool::new(false),
        started: Instant::now(),
        concurrency: slots.describe(),
        spec,
        dir,
        _columns: columns,
    });
    register(&state);
    let run = Run {
        state: state.clone(),
        plans: trials,
        slots,
        scheduler: SchedulerState::new(
            &state.spec.scheduler,
            state.spec.goal,
            &state.spec.metric,
            max_t,
        ),
        recipes,
        running: BTreeMap::new(),
    };
    state.write_json();
    thread::Builder::new()
        .name("trainbook-sweep".into())
        .spawn(move || run.drive())
        .context("starting the sweep's driver thread")?;
    Ok(SweepJob::new(Arc::new(SweepHandle(state))))
}

/// The last report a trial can reach, for ASHA's rungs: `max_t` when given, else the trials'
/// epochs for a per-epoch metric.
fn max_reports(spec: &SweepSpec, trials: &[TrialPlan], recipes: &Registry) -> Result<u64> {
    let Scheduler::Asha(a) = spec.scheduler else {
        return Ok(u64::MAX);
    };
    if let Some(t) = a.max_t {
        return Ok(t);
    }
    let per_epoch = spec.metric.starts_with(metric::EVAL_PREFIX)
        || spec.metric.starts_with(metric::EPOCH_TRAIN_PREFIX);
    if !per_epoch {
        bail!(
            "ASHA needs max_t for '{}', which is not a per-epoch metric (eval_* or epoch_train_*): give the last report a trial reaches, e.g. .scheduler(Asha::default().max_t(100)) or --max-t 100",
            spec.metric
        );
    }
    let mut epochs = 1;
    for t in trials {
        if let Some(h) = recipes.resolve(&t.spec)? {
            epochs = epochs.max(h.epochs);
        }
    }
    Ok(epochs)
}

/// `<runs root>/<name>`, default `sweep-<recipe>-<time>-<random>`; a named sweep's directory
/// must not exist yet.
fn sweep_dir(spec: &SweepSpec) -> Result<PathBuf> {
    let root = crate::driver::runs_root(&spec.base);
    let name = spec.name.clone().unwrap_or_else(|| {
        let stamp = chrono::Local::now().format("%Y%m%d-%H%M%S");
        let suffix: u16 = rand::random();
        format!("sweep-{}-{stamp}-{suffix:04x}", spec.base.recipe)
    });
    let dir = root.join(&name);
    if dir.join(SWEEP_JSON).exists() {
        bail!(
            "sweep '{name}' already exists ({}): choose another name, or move that directory away",
            dir.display()
        );
    }
    std::fs::create_dir_all(&dir).with_context(|| {
        format!(
            "cannot create the sweep directory {}: check that its parent is writable, or set TRAINBOOK_RUNS",
            dir.display()
        )
    })?;
    Ok(std::fs::canonicalize(&dir).unwrap_or(dir))
}

/// A sweep's shared state: what the handle reads and the driver thread writes.
struct SweepState {
    spec: SweepSpec,
    dir: PathBuf,
    started: Instant,
    /// How many trials run at once and why, for the view's title.
    concurrency: String,
    trials: Mutex<Inner>,
    finished: Condvar,
    stop: AtomicBool,
    /// The swept options, registered for the trials' trackers while the sweep lives.
    _columns: crate::driver::SweepColumns,
}

struct Inner {
    trials: Vec<Trial>,
    jobs: BTreeMap<usize, Job>,
    status: SweepStatus,
    subscribers: Vec<mpsc::Sender<SweepUpdate>>,
    views: Vec<Arc<dyn JobView>>,
    elapsed: f64,
}

impl SweepState {
    fn lock(&self) -> MutexGuard<'_, Inner> {
        self.trials.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn send(inner: &mut Inner, update: SweepUpdate) {
        inner
            .subscribers
            .retain(|tx| tx.send(update.clone()).is_ok());
    }

    /// Changes trial `id` and tells the views.
    fn update_trial(&self, id: usize, edit: impl FnOnce(&mut Trial)) {
        let mut inner = self.lock();
        let Some(t) = inner.trials.iter_mut().find(|t| t.id == id) else {
            return;
        };
        edit(t);
        let copy = t.clone();
        Self::send(&mut inner, SweepUpdate::Trial(Box::new(copy)));
    }

    fn result(&self) -> SweepResult {
        let inner = self.lock();
        SweepResult {
            status: inner.status,
            dir: self.dir.clone(),
            metric: self.spec.metric.clone(),
            goal: self.spec.goal,
            trials: inner.trials.clone(),
            elapsed: if inner.status == SweepStatus::Running {
                self.started.elapsed().as_secs_f64()
            } else {
                inner.elapsed
            },
        }
    }

    /// `sweep.json`, written whole to a temporary file and renamed.
    fn write_json(&self) {
        let r = self.result();
        let doc = serde_json::json!({
            "status": r.status.name(),
            "recipe": self.spec.base.recipe,
            "metric": r.metric,
            "goal": r.goal.name(),
            "scheduler": self.spec.scheduler,
            "space": self.spec.space.iter().map(|(k, s)| (k.clone(), serde_json::json!(s.describe()))).collect::<serde_json::Map<_, _>>(),
            "samples": self.spec.samples,
            "seed": self.spec.seed,
            "concurrency": self.concurrency,
            "elapsed_seconds": r.elapsed,
            "best_trial": best_finished(&r.trials, r.goal).map(|t| t.id),
            "trials": r.trials.iter().map(|t| trial_json(t, r.goal)).collect::<Vec<_>>(),
            "base": self.spec.base,
        });
        if let Err(e) = write_json_atomic(&self.dir.join(SWEEP_JSON), &doc) {
            eprintln!(
                "trainbook: cannot write {}: {e:#}",
                self.dir.join(SWEEP_JSON).display()
            );
        }
    }
}

/// Sweeps of this process, for `stop_all`.
static SWEEPS: Mutex<Vec<Weak<SweepState>>> = Mutex::new(Vec::new());
/// Held while a sweep starts a trial and while `stop_all` marks sweeps stopped, so a trial is
/// either started before the mark (and then stopped with the other jobs) or not at all.
static LAUNCHING: Mutex<()> = Mutex::new(());

fn register(state: &Arc<SweepState>) {
    let mut all = SWEEPS.lock().unwrap_or_else(|e| e.into_inner());
    all.retain(|w| w.strong_count() > 0);
    all.push(Arc::downgrade(state));
}

/// Marks every sweep of this process stopped (they start no more trials); their running trials
/// are jobs, which the caller stops. Returns how many sweeps were running.
pub(crate) fn stop_sweeps() -> usize {
    let _launching = LAUNCHING.lock().unwrap_or_else(|e| e.into_inner());
    let all = SWEEPS.lock().unwrap_or_else(|e| e.into_inner());
    let mut n = 0;
    for s in all.iter().filter_map(Weak::upgrade) {
        if s.lock().status == SweepStatus::Running {
            s.stop.store(true, Ordering::SeqCst);
            n += 1;
        }
    }
    n
}

/// A running trial, as the driver thread follows it.
struct Running {
    job: Job,
    started: Instant,
    /// Set once the scheduler pruned it: the report's epoch and when; the trial is stopped once
    /// that epoch's checkpoint is written (or after [`PRUNE_GRACE`]).
    pruning: Option<(u64, Instant)>,
    stop_sent: bool,
}

/// How long a pruned trial may take to write its epoch's checkpoint before it is stopped anyway.
const PRUNE_GRACE: Duration = Duration::from_secs(20);

/// The sweep's driver thread.
struct Run {
    state: Arc<SweepState>,
    plans: Vec<TrialPlan>,
    slots: Slots,
    scheduler: SchedulerState,
    recipes: &'static Registry,
    running: BTreeMap<usize, Running>,
}

impl Run {
    fn drive(mut self) {
        let (tx, rx) = mpsc::channel::<(usize, JobUpdate)>();
        let mut pending: std::collections::VecDeque<usize> =
            self.plans.iter().map(|p| p.id).collect();
        loop {
            let stopping = self.state.stop.load(Ordering::SeqCst);
            if stopping {
                for id in pending.drain(..) {
                    self.state.update_trial(id, |t| {
                        t.status = TrialStatus::Stopped;
                        t.note = Some("not started: the sweep was stopped".into());
                    });
                }
                for r in self.running.values_mut().filter(|r| !r.stop_sent) {
                    r.stop_sent = true;
                    stop_in_background(r.job.clone());
                }
            }
            while !stopping && !pending.is_empty() && self.slots.free() {
                let id = pending.pop_front().expect("not empty");
                self.start(id, &tx);
            }
            if self.running.is_empty() && (pending.is_empty() || stopping) {
                break;
            }
            match rx.recv_timeout(Duration::from_millis(200)) {
                Ok((id, u)) => self.on_update(id, u),
                Err(mpsc::RecvTimeoutError::Timeout) => {}
                Err(mpsc::RecvTimeoutError::Disconnected) => {}
            }
            self.stop_pruned();
        }
        self.finish();
    }

    /// Starts trial `id` on a free slot; a trial whose job cannot start fails alone.
    fn start(&mut self, id: usize, tx: &mpsc::Sender<(usize, JobUpdate)>) {
        let plan = &self.plans[id - 1];
        let mut spec = plan.spec.clone();
        let width = self.plans.len().to_string().len();
        spec.runs_root = Some(self.state.dir.clone());
        spec.run_name = Some(format!("trial-{id:0width$}"));
        let lease = self.slots.take(&mut spec);
        let launched = {
            let _launching = LAUNCHING.lock().unwrap_or_else(|e| e.into_inner());
            if self.state.stop.load(Ordering::SeqCst) {
                Err(anyhow!("the sweep was stopped"))
            } else {
                crate::driver::launch(spec, self.recipes)
            }
        };
        let job = match launched {
            Ok(job) => job,
            Err(e) => {
                self.slots.give_back(lease);
                let stopped = self.state.stop.load(Ordering::SeqCst);
                self.state.update_trial(id, |t| {
                    if stopped {
                        t.status = TrialStatus::Stopped;
                        t.note = Some("not started: the sweep was stopped".into());
                    } else {
                        t.status = TrialStatus::Failed;
                        t.error = Some(format!("{e:#}"));
                    }
                });
                return;
            }
        };
        self.slots.bind(lease, id);
        let updates = job.subscribe();
        let forward = tx.clone();
        let _ = thread::Builder::new()
            .name(format!("trainbook-trial-{id}"))
            .spawn(move || {
                for u in updates {
                    let last = matches!(u, JobUpdate::Finished(_));
                    if forward.send((id, u)).is_err() || last {
                        break;
                    }
                }
            });
        let run_dir = job.run_dir().to_path_buf();
        self.state.lock().jobs.insert(id, job.clone());
        self.state.update_trial(id, |t| {
            t.status = TrialStatus::Running;
            t.run_dir = Some(run_dir);
        });
        self.running.insert(
            id,
            Running {
                job,
                started: Instant::now(),
                pruning: None,
                stop_sent: false,
            },
        );
    }

    fn on_update(&mut self, id: usize, update: JobUpdate) {
        let Some(run) = self.running.get_mut(&id) else {
            return;
        };
        let elapsed = run.started.elapsed().as_secs_f64();
        match update {
            JobUpdate::Metric(row) if row.rank == 0 && row.name == self.state.spec.metric => {
                let mut t_now = 0;
                self.state.update_trial(id, |t| {
                    // A restarted trial replays steps: its report of a step replaces the old.
                    t.reports.retain(|(s, _)| *s < row.step);
                    t.reports.push((row.step, row.value));
                    t.step = t.step.max(row.step);
                    t.elapsed = elapsed;
                    t_now = t.reports.len() as u64;
                });
                if run.pruning.is_none() {
                    if let TrialVerdict::Prune(why) = self.scheduler.report(id, t_now, row.value) {
                        run.pruning = Some((row.epoch, Instant::now()));
                        self.state.update_trial(id, |t| t.note = Some(why));
                    }
                }
            }
            JobUpdate::Progress(p) => {
                if let Some((e, _)) = run.pruning {
                    // The next epoch began: the pruned epoch's checkpoint is behind it.
                    if p.epoch > e && !run.stop_sent {
                        run.stop_sent = true;
                        stop_in_background(run.job.clone());
                    }
                }
                self.state.update_trial(id, |t| {
                    t.step = p.step;
                    t.total_steps = p.total_steps;
                    t.elapsed = elapsed;
                });
            }
            JobUpdate::Checkpoint { epoch, .. } => {
                if let Some((e, _)) = run.pruning {
                    if epoch >= e && !run.stop_sent {
                        run.stop_sent = true;
                        stop_in_background(run.job.clone());
                    }
                }
            }
            JobUpdate::Log(line) => {
                let mut inner = self.state.lock();
                SweepState::send(&mut inner, SweepUpdate::Log { trial: id, line });
            }
            JobUpdate::Finished(status) => self.trial_ended(id, status),
            _ => {}
        }
    }

    /// Stops pruned trials whose checkpoint did not come within the grace period.
    fn stop_pruned(&mut self) {
        for r in self.running.values_mut() {
            if let Some((_, since)) = r.pruning {
                if !r.stop_sent && since.elapsed() > PRUNE_GRACE {
                    r.stop_sent = true;
                    stop_in_background(r.job.clone());
                }
            }
        }
    }

    fn trial_ended(&mut self, id: usize, status: JobStatus) {
        let Some(run) = self.running.remove(&id) else {
            return;
        };
        self.slots.release(id);
        let result = run.job.result().ok();
        let pruned = run.pruning.is_some();
        self.state.update_trial(id, |t| {
            t.status = match status {
                _ if pruned && status != JobStatus::Failed => TrialStatus::Pruned,
                JobStatus::Succeeded => TrialStatus::Succeeded,
                JobStatus::Failed => TrialStatus::Failed,
                _ => TrialStatus::Stopped,
            };
            if let Some(r) = &result {
                t.elapsed = r.elapsed;
                t.step = t.step.max(r.steps);
                if t.status == TrialStatus::Failed {
                    t.error = Some(
                        r.error
                            .clone()
                            .unwrap_or_else(|| "the trial's job failed".into()),
                    );
                }
            }
            t.result = result;
        });
        self.state.write_json();
    }

    fn finish(self) {
        let stopped = self.state.stop.load(Ordering::SeqCst);
        {
            let mut inner = self.state.lock();
            let any_ok = inner
                .trials
                .iter()
                .any(|t| matches!(t.status, TrialStatus::Succeeded | TrialStatus::Pruned));
            inner.status = if stopped {
                SweepStatus::Stopped
            } else if any_ok {
                SweepStatus::Succeeded
            } else {
                SweepStatus::Failed
            };
            inner.elapsed = self.state.started.elapsed().as_secs_f64();
            let status = inner.status;
            SweepState::send(&mut inner, SweepUpdate::Finished(status));
        }
        self.state.write_json();
        self.state.finished.notify_all();
    }
}

/// `job.stop()` on its own thread: it waits for the workers to exit, and the driver thread
/// must keep following the other trials meanwhile.
fn stop_in_background(job: Job) {
    let _ = thread::Builder::new()
        .name(format!("trainbook-stop-{}", job.id()))
        .spawn(move || {
            let _ = job.stop();
        });
}

/// The [`SweepJob`] handle's side.
struct SweepHandle(Arc<SweepState>);

/// How long `wait` gives attached views to draw the final state.
const SETTLE_TIMEOUT: Duration = Duration::from_secs(5);

impl SweepControl for SweepHandle {
    fn spec(&self) -> &SweepSpec {
        &self.0.spec
    }
    fn dir(&self) -> &Path {
        &self.0.dir
    }
    fn concurrency(&self) -> String {
        self.0.concurrency.clone()
    }
    fn status(&self) -> SweepStatus {
        self.0.lock().status
    }
    fn trials(&self) -> Vec<Trial> {
        self.0.lock().trials.clone()
    }
    fn job(&self, id: usize) -> Option<Job> {
        self.0.lock().jobs.get(&id).cloned()
    }
    fn subscribe(&self) -> mpsc::Receiver<SweepUpdate> {
        let (tx, rx) = mpsc::channel();
        let mut inner = self.0.lock();
        if inner.status == SweepStatus::Running {
            inner.subscribers.push(tx);
        } else {
            let _ = tx.send(SweepUpdate::Finished(inner.status));
        }
        rx
    }
    fn attach_view(&self, view: Arc<dyn JobView>) {
        self.0.lock().views.push(view);
    }
    fn stop(&self) -> Result<()> {
        {
            let _launching = LAUNCHING.lock().unwrap_or_else(|e| e.into_inner());
            self.0.stop.store(true, Ordering::SeqCst);
        }
        let jobs: Vec<Job> = self.0.lock().jobs.values().cloned().collect();
        for j in jobs.iter().filter(|j| !j.status().is_finished()) {
            j.stop()?;
        }
        self.wait_finished();
        Ok(())
    }
    fn wait(&self) -> Result<SweepResult> {
        self.wait_finished();
        let views = std::mem::take(&mut self.0.lock().views);
        let deadline = Instant::now() + SETTLE_TIMEOUT;
        for v in views {
            v.settle(deadline.saturating_duration_since(Instant::now()));
        }
        let r = self.0.result();
        match r.status {
            SweepStatus::Succeeded => Ok(r),
            SweepStatus::Stopped => bail!(
                "the sweep was stopped ({}); its trials so far are in {} (sweep.result().trials())",
                status_counts(&r.trials),
                r.dir.display()
            ),
            _ => {
                let errors: Vec<String> = r
                    .trials
                    .iter()
                    .map(|t| {
                        let e = t.error.as_deref().unwrap_or("no error recorded");
                        format!("trial {} ({}): {}", t.id, t.params_text(), first_line(e))
                    })
                    .collect();
                bail!(
                    "every trial of the sweep failed:\n{}\nfull logs in {}",
                    errors.join("\n"),
                    r.dir.display()
                )
            }
        }
    }
    fn result(&self) -> SweepResult {
        self.0.result()
    }
}

impl SweepHandle {
    fn wait_finished(&self) {
        let mut inner = self.0.lock();
        while inner.status == SweepStatus::Running {
            inner = self
                .0
                .finished
                .wait(inner)
                .unwrap_or_else(|e| e.into_inner());
        }
    }
}

fn first_line(s: &str) -> &str {
    s.lines().next().unwrap_or(s)
}
