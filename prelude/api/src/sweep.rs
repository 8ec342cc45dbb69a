//! Hyper-parameter sweeps: many trials of one job with different options, several at a time
//! on the machine's devices, the unpromising ones stopped early, one live view for all.
//!
//! A sweep is a job builder (any trainer: `BertTrainer`, a cell's `Trainer<T>`, a `JobSpec`)
//! plus a search space over that job's own options, named as the options are declared (`lr`,
//! `warmup_ratio`, a recipe's `max_length`, a task's own field). Nothing here runs anything: the
//! engine generates the trials, checks every one of them before the first starts, places them
//! on devices or cores, asks the [`Scheduler`] after each report of the metric whether a trial
//! goes on, and folds it all into a [`SweepResult`].
//!
//! Trials are the grid's product (every combination of the [`Sweep::grid`] values) repeated
//! [`Sweep::samples`] times, each repetition drawing the random parameters afresh — Ray Tune's
//! `num_samples` semantics, so a Tune user's numbers mean the same here.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::{mpsc, Arc};

use anyhow::{bail, Result};
use serde::{Deserialize, Serialize};

use crate::job::{Job, JobView, TrainResult};
use crate::logs::Shown;
use crate::runtime::port;
use crate::spec::{Configure, JobSpec};
use crate::table::{Column, Table};

/// One value of a swept parameter.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum ParamValue {
    Bool(bool),
    Int(i64),
    Float(f64),
    Str(String),
}

impl ParamValue {
    /// The value as the option's JSON (what `config.json` holds).
    pub fn to_json(&self) -> serde_json::Value {
        serde_json::to_value(self).unwrap_or(serde_json::Value::Null)
    }

    /// A value written on the command line: a whole number, else a number, else `true`/`false`,
    /// else text.
    pub fn parse(s: &str) -> ParamValue {
        let s = s.trim();
        if let Ok(i) = s.parse::<i64>() {
            ParamValue::Int(i)
        } else if let Ok(f) = s.parse::<f64>() {
            ParamValue::Float(f)
        } else if let Ok(b) = s.parse::<bool>() {
            ParamValue::Bool(b)
        } else {
            ParamValue::Str(s.to_string())
        }
    }

    /// The value as a number, when it is one.
    pub fn as_f64(&self) -> Option<f64> {
        match self {
            ParamValue::Int(i) => Some(*i as f64),
            ParamValue::Float(f) => Some(*f),
            _ => None,
        }
    }
}

impl std::fmt::Display for ParamValue {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ParamValue::Bool(b) => write!(f, "{b}"),
            ParamValue::Int(i) => write!(f, "{i}"),
            // Short and exact enough to tell grid points apart: 0.0001 as 1e-4, 0.15 as 0.15.
            ParamValue::Float(x) => {
                let a = x.abs();
                if a != 0.0 && !(1e-3..1e5).contains(&a) {
                    write!(f, "{x:e}")
                } else {
                    let s = format!("{x:.6}");
                    let s = s.trim_end_matches('0').trim_end_matches('.');
                    f.write_str(if s.is_empty() || s == "-" { "0" } else { s })
                }
            }
            ParamValue::Str(s) => f.write_str(s),
        }
    }
}

macro_rules! param_from {
    ($($t:ty => $v:ident as $as:ty),* $(,)?) => {$(
        impl From<$t> for ParamValue {
            fn from(x: $t) -> Self {
                ParamValue::$v(x as $as)
            }
        }
    )*};
}
param_from!(f64 => Float as f64, f32 => Float as f64, i32 => Int as i64, i64 => Int as i64,
    u32 => Int as i64, u64 => Int as i64, usize => Int as i64, u8 => Int as i64);

impl From<bool> for ParamValue {
    fn from(b: bool) -> Self {
        ParamValue::Bool(b)
    }
}
impl From<&str> for ParamValue {
    fn from(s: &str) -> Self {
        ParamValue::Str(s.to_string())
    }
}
impl From<String> for ParamValue {
    fn from(s: String) -> Self {
        ParamValue::Str(s)
    }
}
// The enum options take their names (`OptimizerKind::Adamw` is "adamw").
macro_rules! param_from_display {
    ($($t:ty),*) => {$(
        impl From<$t> for ParamValue {
            fn from(x: $t) -> Self {
                ParamValue::Str(x.to_string())
            }
        }
    )*};
}
param_from_display!(
    crate::spec::OptimizerKind,
    crate::spec::Schedule,
    crate::spec::Precision
);

/// Where a parameter's values come from.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Space {
    /// Every value, each in its own trials (the grid's product over all grid parameters).
    Grid(Vec<ParamValue>),
    /// One of these, drawn at random per trial.
    Choice(Vec<ParamValue>),
    /// A number drawn uniformly from [low, high).
    Uniform { low: f64, high: f64 },
    /// A number whose logarithm is drawn uniformly (learning rates: 1e-5 to 1e-2).
    LogUniform { low: f64, high: f64 },
}

impl Space {
    fn check(&self, name: &str) -> Result<()> {
        match self {
            Space::Grid(v) | Space::Choice(v) if v.is_empty() => {
                bail!("sweep parameter '{name}' has no values: give at least one")
            }
            Space::Uniform { low, high }
                if !(low.is_finite() && high.is_finite() && low < high) =>
            {
                bail!("sweep parameter '{name}': uniform({low}, {high}) needs finite bounds with low < high")
            }
            Space::LogUniform { low, high } if !(*low > 0.0 && high.is_finite() && low < high) => {
                bail!("sweep parameter '{name}': log_uniform({low}, {high}) needs 0 < low < high (e.g. 1e-5, 1e-2)")
            }
            _ => Ok(()),
        }
    }

    /// How the space reads in the sweep's title and `--help`-style listings.
    pub fn describe(&self) -> String {
        let list = |v: &[ParamValue]| {
            v.iter()
                .map(ToString::to_string)
                .collect::<Vec<_>>()
                .join(", ")
        };
        match self {
            Space::Grid(v) => format!("grid [{}]", list(v)),
            Space::Choice(v) => format!("choice [{}]", list(v)),
            Space::Uniform { low, high } => format!("uniform({low}, {high})"),
            Space::LogUniform { low, high } => format!("log_uniform({low}, {high})"),
        }
    }
}

/// Whether lower or higher values of the metric are better.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Goal {
    #[default]
    Min,
    Max,
}

impl Goal {
    /// Whether `a` is better than `b`.
    pub fn better(self, a: f64, b: f64) -> bool {
        match self {
            Goal::Min => a < b,
            Goal::Max => a > b,
        }
    }
    pub fn name(self) -> &'static str {
        match self {
            Goal::Min => "min",
            Goal::Max => "max",
        }
    }
}

impl std::str::FromStr for Goal {
    type Err = anyhow::Error;
    fn from_str(s: &str) -> Result<Self> {
        match s.to_ascii_lowercase().as_str() {
            "min" | "minimize" => Ok(Goal::Min),
            "max" | "maximize" => Ok(Goal::Max),
            o => {
                bail!("unknown goal '{o}': use min (e.g. eval_loss:min) or max (eval_accuracy:max)")
            }
        }
    }
}

/// Asynchronous successive halving (Li et al., 2018): at each rung (the metric's report
/// `grace_period`, then every `reduction_factor` times as many), a trial goes on only if its
/// value is among the best 1/`reduction_factor` of the values other trials had at that rung.
/// Nothing waits for a rung to fill, so trials start as soon as a slot frees: near-linear in
/// the number of slots. Defaults as Ray Tune's `ASHAScheduler`: grace 1, factor 4, `max_t` the
/// trial's length (its epochs, for per-epoch metrics).
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct Asha {
    /// The first rung, in reports of the metric (epochs for `eval_*` metrics).
    pub grace_period: u64,
    /// Keep the best 1/factor at each rung; rungs are this factor apart.
    pub reduction_factor: f64,
    /// The last report a trial can reach; `None`: its epochs (per-epoch metrics).
    pub max_t: Option<u64>,
}

impl Default for Asha {
    fn default() -> Self {
        Asha {
            grace_period: 1,
            reduction_factor: 4.0,
            max_t: None,
        }
    }
}

impl Asha {
    pub fn grace_period(mut self, reports: u64) -> Self {
        self.grace_period = reports;
        self
    }
    pub fn reduction_factor(mut self, factor: f64) -> Self {
        self.reduction_factor = factor;
        self
    }
    pub fn max_t(mut self, reports: u64) -> Self {
        self.max_t = Some(reports);
        self
    }
}

/// The median stopping rule (Golovin et al., 2017, Google Vizier): after `grace_period`
/// reports, a trial stops when its best value so far is worse than the median of the other
/// trials' running means at the same report, once `min_samples` trials have reached it.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct MedianStopping {
    pub grace_period: u64,
    pub min_samples: usize,
}

impl Default for MedianStopping {
    fn default() -> Self {
        MedianStopping {
            grace_period: 1,
            min_samples: 3,
        }
    }
}

/// What decides, after each report of the metric, whether a trial goes on.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Scheduler {
    /// Every trial runs to its end.
    #[default]
    None,
    Asha(Asha),
    Median(MedianStopping),
}

impl From<Asha> for Scheduler {
    fn from(a: Asha) -> Self {
        Scheduler::Asha(a)
    }
}
impl From<MedianStopping> for Scheduler {
    fn from(m: MedianStopping) -> Self {
        Scheduler::Median(m)
    }
}

impl std::fmt::Display for Scheduler {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Scheduler::None => f.write_str("no early stopping"),
            Scheduler::Asha(a) => write!(
                f,
                "ASHA (grace {}, factor {}{})",
                a.grace_period,
                a.reduction_factor,
                a.max_t.map(|t| format!(", max_t {t}")).unwrap_or_default()
            ),
            Scheduler::Median(m) => write!(
                f,
                "median stopping (grace {}, {} samples)",
                m.grace_period, m.min_samples
            ),
        }
    }
}

/// A sweep as asked for: the job, the space, how many trials, what to optimise and how.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct SweepSpec {
    /// The job every trial runs, before its parameters are applied.
    pub base: JobSpec,
    /// The swept options, in the order given.
    pub space: Vec<(String, Space)>,
    /// Repetitions of the grid (each draws the random parameters afresh).
    pub samples: usize,
    pub seed: u64,
    /// The metric the scheduler and `best()` read (rank 0's reports), e.g. `eval_loss`.
    pub metric: String,
    pub goal: Goal,
    /// Trials running at once (fewer when the devices or cores do not fit that many).
    pub concurrent: usize,
    pub scheduler: Scheduler,
    /// The sweep directory's name under the runs root (default `sweep-<recipe>-<time>-<random>`).
    pub name: Option<String>,
}

impl SweepSpec {
    /// Checks what can be checked without the recipes (the engine checks every trial's job
    /// as `fit` would, before the first starts).
    pub fn check(&self) -> Result<()> {
        if self.space.is_empty() {
            bail!("the sweep has no parameters: add one, e.g. .grid(\"lr\", [1e-4, 1e-3]) or --grid lr=1e-4,1e-3");
        }
        let mut seen = std::collections::BTreeSet::new();
        for (name, space) in &self.space {
            if !seen.insert(name) {
                bail!("sweep parameter '{name}' is given twice: give each option one space");
            }
            space.check(name)?;
        }
        if self.samples == 0 {
            bail!("samples is 0: a sweep runs at least one repetition of its grid");
        }
        if self.concurrent == 0 {
            bail!("concurrent is 0: run at least one trial at a time");
        }
        if self.metric.trim().is_empty() {
            bail!("the sweep's metric is empty: name a metric its trials report, e.g. eval_loss");
        }
        match self.scheduler {
            Scheduler::Asha(a) => {
                if a.grace_period == 0 {
                    bail!("ASHA grace period is 0: use at least 1 report of the metric");
                }
                if !(a.reduction_factor.is_finite() && a.reduction_factor > 1.0) {
                    bail!(
                        "ASHA reduction factor {} must be above 1 (2 keeps half at each rung, 4 a quarter)",
                        a.reduction_factor
                    );
                }
                if a.max_t == Some(0) {
                    bail!(
                        "ASHA max_t is 0: give the last report a trial reaches (e.g. its epochs)"
                    );
                }
            }
            Scheduler::Median(m) if m.min_samples == 0 => {
                bail!("median stopping needs min_samples of at least 1");
            }
            _ => {}
        }
        if let Some(name) = &self.name {
            if name.is_empty() || name.starts_with('.') || name.contains(['/', '\\']) {
                bail!("sweep name {name:?} cannot be a directory name: use letters, digits, '-', '_' or '.'");
            }
        }
        Ok(())
    }

    /// How many trials the sweep has: the grid's size times `samples`.
    pub fn trial_count(&self) -> usize {
        let grid: usize = self
            .space
            .iter()
            .map(|(_, s)| match s {
                Space::Grid(v) => v.len(),
                _ => 1,
            })
            .product();
        grid * self.samples
    }
}

/// Builds and runs a sweep over any trainer:
///
/// ```ignore
/// let result = Sweep::new(BertTrainer::new().preset("tiny").epochs(4).workers(1))
///     .grid("lr", [1e-4, 3e-4, 1e-3])
///     .uniform("warmup_ratio", 0.0, 0.2)
///     .samples(2)
///     .metric("eval_loss", Goal::Min)
///     .concurrent(2)
///     .scheduler(Asha::default())
///     .fit()?;
/// result.best()?;
/// ```
#[derive(Clone, Debug)]
pub struct Sweep {
    spec: SweepSpec,
}

impl Sweep {
    /// A sweep of `trainer`'s job: one sample, seed 0, `eval_loss` minimised, one trial at a
    /// time, no early stopping, until parameters and settings are added.
    pub fn new(trainer: impl Configure) -> Sweep {
        Sweep {
            spec: SweepSpec {
                base: trainer.into_spec(),
                space: Vec::new(),
                samples: 1,
                seed: 0,
                metric: crate::metric::EVAL_LOSS.into(),
                goal: Goal::Min,
                concurrent: 1,
                scheduler: Scheduler::None,
                name: None,
            },
        }
    }

    /// A sweep from its spec (the CLI builds one).
    pub fn from_spec(spec: SweepSpec) -> Sweep {
        Sweep { spec }
    }

    fn param(mut self, name: &str, space: Space) -> Self {
        self.spec.space.push((name.to_string(), space));
        self
    }

    /// Every value of option `name`, each in its own trials.
    pub fn grid<V: Into<ParamValue>>(
        self,
        name: &str,
        values: impl IntoIterator<Item = V>,
    ) -> Self {
        self.param(
            name,
            Space::Grid(values.into_iter().map(Into::into).collect()),
        )
    }
    /// One of `values` drawn per trial.
    pub fn choice<V: Into<ParamValue>>(
        self,
        name: &str,
        values: impl IntoIterator<Item = V>,
    ) -> Self {
        self.param(
            name,
            Space::Choice(values.into_iter().map(Into::into).collect()),
        )
    }
    /// A number drawn uniformly from [low, high) per trial.
    pub fn uniform(self, name: &str, low: f64, high: f64) -> Self {
        self.param(name, Space::Uniform { low, high })
    }
    /// A number drawn log-uniformly from [low, high) per trial (learning rates).
    pub fn log_uniform(self, name: &str, low: f64, high: f64) -> Self {
        self.param(name, Space::LogUniform { low, high })
    }
    /// Repetitions of the grid, each drawing the random parameters afresh (default 1).
    pub fn samples(mut self, n: usize) -> Self {
        self.spec.samples = n;
        self
    }
    /// Seed of the random parameters (default 0): the same seed draws the same trials.
    pub fn seed(mut self, seed: u64) -> Self {
        self.spec.seed = seed;
        self
    }
    /// The metric that ranks trials and feeds the scheduler (default `eval_loss`, `Goal::Min`).
    pub fn metric(mut self, name: impl Into<String>, goal: Goal) -> Self {
        self.spec.metric = name.into();
        self.spec.goal = goal;
        self
    }
    /// Trials at once (default 1). Each trial gets whole devices (HPU, CUDA) or its share of
    /// the cores (CPU); a trial that does not fit waits for one to end.
    pub fn concurrent(mut self, n: usize) -> Self {
        self.spec.concurrent = n;
        self
    }
    /// Early stopping: [`Asha`], [`MedianStopping`] or [`Scheduler::None`] (default).
    pub fn scheduler(mut self, s: impl Into<Scheduler>) -> Self {
        self.spec.scheduler = s.into();
        self
    }
    /// A name for the sweep's directory under the runs root.
    pub fn name(mut self, name: impl Into<String>) -> Self {
        self.spec.name = Some(name.into());
        self
    }

    pub fn spec(&self) -> &SweepSpec {
        &self.spec
    }

    /// The trials this sweep would run (parameters and each trial's job), every one checked as
    /// `fit` checks a job; nothing starts.
    pub fn plan(&self) -> Result<Vec<TrialPlan>> {
        port::<dyn Sweeps>()?.plan_sweep(&self.spec)
    }

    /// Starts the sweep and returns at once; in the trainbook kernel the cell shows its live view.
    pub fn launch(self) -> Result<SweepJob> {
        port::<dyn Sweeps>()?.sweep(self.spec)
    }

    /// Runs the sweep to its end (see [`SweepJob::wait`]).
    pub fn fit(self) -> Result<SweepResult> {
        self.launch()?.wait()
    }
}

/// One trial as planned: its number, parameters and the job it runs.
#[derive(Clone, Debug)]
pub struct TrialPlan {
    /// 1 for the first trial.
    pub id: usize,
    pub params: Vec<(String, ParamValue)>,
    pub spec: JobSpec,
}

/// Where a trial is.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum TrialStatus {
    /// Waiting for a free slot.
    #[default]
    Pending,
    Running,
    /// Stopped early by the scheduler; its metrics and checkpoints are kept.
    Pruned,
    /// Ran to its end (`"succeeded"`, the word of jobs and sweeps; sweep files written before
    /// it said `"done"`).
    #[serde(alias = "done")]
    Succeeded,
    Failed,
    /// Stopped by the user (or never started because the sweep was stopped).
    Stopped,
}

impl TrialStatus {
    pub fn name(self) -> &'static str {
        match self {
            TrialStatus::Pending => "pending",
            TrialStatus::Running => "running",
            TrialStatus::Pruned => "pruned",
            TrialStatus::Succeeded => "succeeded",
            TrialStatus::Failed => "failed",
            TrialStatus::Stopped => "stopped",
        }
    }
    pub fn is_finished(self) -> bool {
        !matches!(self, TrialStatus::Pending | TrialStatus::Running)
    }
}

impl std::fmt::Display for TrialStatus {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// One trial's state: parameters, status, the metric's reports, and once it ended its result.
#[derive(Clone, Debug, Serialize)]
pub struct Trial {
    /// 1 for the first trial.
    pub id: usize,
    pub params: Vec<(String, ParamValue)>,
    pub status: TrialStatus,
    /// Optimizer steps done and planned (0: not known yet).
    pub step: u64,
    pub total_steps: u64,
    /// Each report of the sweep's metric: (optimizer step, value), in order.
    pub reports: Vec<(u64, f64)>,
    /// Seconds the trial has run.
    pub elapsed: f64,
    pub run_dir: Option<PathBuf>,
    /// Why the scheduler stopped it, or what it is waiting for.
    pub note: Option<String>,
    pub error: Option<String>,
    /// The trial job's result, once it has ended.
    #[serde(skip)]
    pub result: Option<TrainResult>,
}

impl Trial {
    /// The metric's last report.
    pub fn last(&self) -> Option<f64> {
        self.reports.last().map(|r| r.1)
    }
    /// The metric's best report under `goal`.
    pub fn best(&self, goal: Goal) -> Option<f64> {
        self.reports
            .iter()
            .map(|r| r.1)
            .filter(|v| v.is_finite())
            .reduce(|a, b| if goal.better(b, a) { b } else { a })
    }
    /// `lr=0.001, warmup_ratio=0.05`.
    pub fn params_text(&self) -> String {
        self.params
            .iter()
            .map(|(k, v)| format!("{k}={v}"))
            .collect::<Vec<_>>()
            .join(", ")
    }
}

/// Where a sweep is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum SweepStatus {
    Running,
    /// Every trial ended and at least one ran to its end or was pruned.
    Succeeded,
    /// Every trial failed.
    Failed,
    /// Stopped by the user (`stop()`, a notebook interrupt).
    Stopped,
}

impl SweepStatus {
    pub fn name(self) -> &'static str {
        match self {
            SweepStatus::Running => "running",
            SweepStatus::Succeeded => "succeeded",
            SweepStatus::Failed => "failed",
            SweepStatus::Stopped => "stopped",
        }
    }
}

impl std::fmt::Display for SweepStatus {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// What a sweep's views receive while it runs.
#[derive(Clone, Debug)]
pub enum SweepUpdate {
    /// A trial's state changed (started, reported, was pruned, ended).
    Trial(Box<Trial>),
    /// A worker line of trial `trial`, de-duplicated within the trial's job.
    Log {
        trial: usize,
        line: Shown,
    },
    Finished(SweepStatus),
}

/// The outcome of a sweep.
#[derive(Clone, Debug)]
pub struct SweepResult {
    pub status: SweepStatus,
    /// The sweep directory: `sweep.json` and one run directory per trial.
    pub dir: PathBuf,
    pub metric: String,
    pub goal: Goal,
    pub trials: Vec<Trial>,
    pub elapsed: f64,
}

impl SweepResult {
    /// One row per trial: its number, each parameter, status, the metric's last and best value,
    /// reports, steps, time, run directory, and the note or error.
    pub fn trials(&self) -> Table {
        trials_table(&self.trials, &self.metric, self.goal)
    }

    /// The finished trial (ran to its end) whose last value of the metric is best; its result
    /// holds its checkpoints.
    pub fn best_trial(&self) -> Result<&Trial> {
        best_finished(&self.trials, self.goal).ok_or_else(|| {
            let counts = status_counts(&self.trials);
            anyhow::anyhow!(
                "no trial of this sweep ran to its end with a value of {} ({counts}): see the error column of `trials()`",
                self.metric
            )
        })
    }

    /// The best trial's [`TrainResult`] (see [`SweepResult::best_trial`]).
    pub fn best(&self) -> Result<TrainResult> {
        let t = self.best_trial()?;
        t.result
            .clone()
            .ok_or_else(|| anyhow::anyhow!("trial {} has no result (its job never started)", t.id))
    }

    /// The summary the CLI prints with `--json`.
    pub fn to_json(&self) -> serde_json::Value {
        serde_json::json!({
            "status": self.status.name(),
            "dir": self.dir.display().to_string(),
            "metric": self.metric,
            "goal": self.goal.name(),
            "elapsed_seconds": self.elapsed,
            "best_trial": self.best_trial().ok().map(|t| t.id),
            "trials": self.trials.iter().map(|t| trial_json(t, self.goal)).collect::<Vec<_>>(),
        })
    }
}

/// A trial as `sweep.json` and `--json` hold it.
pub fn trial_json(t: &Trial, goal: Goal) -> serde_json::Value {
    let num = |v: Option<f64>| match v {
        Some(x) if x.is_finite() => serde_json::json!(x),
        _ => serde_json::Value::Null,
    };
    serde_json::json!({
        "id": t.id,
        "params": t.params.iter().map(|(k, v)| (k.clone(), v.to_json())).collect::<serde_json::Map<_, _>>(),
        "status": t.status.name(),
        "step": t.step,
        "reports": t.reports.iter().map(|(s, v)| serde_json::json!([s, num(Some(*v))])).collect::<Vec<_>>(),
        "last": num(t.last()),
        "best": num(t.best(goal)),
        "elapsed_seconds": t.elapsed,
        "run_dir": t.run_dir.as_ref().map(|p| p.display().to_string()),
        "best_checkpoint": t.result.as_ref().and_then(|r| r.best_checkpoint.as_ref().or(r.last_checkpoint.as_ref())).map(|p| p.display().to_string()),
        "note": t.note,
        "error": t.error,
    })
}

/// The trial that ran to its end with the best last value (ties: the lower number).
pub fn best_finished(trials: &[Trial], goal: Goal) -> Option<&Trial> {
    trials
        .iter()
        .filter(|t| t.status == TrialStatus::Succeeded)
        .filter_map(|t| t.last().filter(|v| v.is_finite()).map(|v| (t, v)))
        .reduce(|a, b| if goal.better(b.1, a.1) { b } else { a })
        .map(|(t, _)| t)
}

/// Every trial status, in the order summaries count them.
const SUMMARY_ORDER: [TrialStatus; 6] = [
    TrialStatus::Running,
    TrialStatus::Succeeded,
    TrialStatus::Pruned,
    TrialStatus::Stopped,
    TrialStatus::Failed,
    TrialStatus::Pending,
];

/// How many of `statuses` are in each status, in the order summaries count them (running
/// first, pending last); statuses none is in are left out.
pub fn count_by_status(
    statuses: impl IntoIterator<Item = TrialStatus>,
) -> Vec<(TrialStatus, usize)> {
    let mut n = [0usize; SUMMARY_ORDER.len()];
    for s in statuses {
        if let Some(i) = SUMMARY_ORDER.iter().position(|&o| o == s) {
            n[i] += 1;
        }
    }
    SUMMARY_ORDER
        .into_iter()
        .zip(n)
        .filter(|&(_, n)| n > 0)
        .collect()
}

/// Counts as a line: "2 running · 3 succeeded · 1 pruned" ("" for none).
pub fn counts_line(counts: &[(TrialStatus, usize)]) -> String {
    counts
        .iter()
        .map(|(s, n)| format!("{n} {s}"))
        .collect::<Vec<_>>()
        .join(" · ")
}

/// The trials counted per status: "3 succeeded · 2 pruned · 1 failed".
pub fn status_counts(trials: &[Trial]) -> String {
    counts_line(&count_by_status(trials.iter().map(|t| t.status)))
}

/// Trials as a table (see [`SweepResult::trials`]).
pub fn trials_table(trials: &[Trial], metric: &str, goal: Goal) -> Table {
    let mut columns = vec![Column::uint(
        "trial",
        trials.iter().map(|t| Some(t.id as u64)),
    )];
    let names: Vec<&String> = trials
        .first()
        .map(|t| t.params.iter().map(|(k, _)| k).collect())
        .unwrap_or_default();
    for (i, name) in names.iter().enumerate() {
        let values: Vec<Option<&ParamValue>> = trials
            .iter()
            .map(|t| t.params.get(i).map(|p| &p.1))
            .collect();
        let all = |f: fn(&ParamValue) -> bool| values.iter().flatten().all(|v| f(v));
        let column = if all(|v| matches!(v, ParamValue::Int(_))) {
            Column::int(
                name,
                values.iter().map(|v| match v {
                    Some(ParamValue::Int(i)) => Some(*i),
                    _ => None,
                }),
            )
        } else if all(|v| v.as_f64().is_some()) {
            Column::float(name, values.iter().map(|v| v.and_then(ParamValue::as_f64)))
        } else {
            Column::str(name, values.iter().map(|v| v.map(ToString::to_string)))
        };
        columns.push(column);
    }
    columns.extend([
        Column::str(
            "status",
            trials.iter().map(|t| Some(t.status.name().to_string())),
        ),
        Column::float(metric, trials.iter().map(Trial::last)),
        Column::float(
            &format!("best_{metric}"),
            trials.iter().map(|t| t.best(goal)),
        ),
        Column::uint(
            "reports",
            trials.iter().map(|t| Some(t.reports.len() as u64)),
        ),
        Column::uint("steps", trials.iter().map(|t| Some(t.step))),
        // Seconds, to the tenth: the table is read, the trials' results hold the exact times.
        Column::float(
            "time",
            trials
                .iter()
                .map(|t| Some((t.elapsed * 10.0).round() / 10.0)),
        ),
        Column::str(
            "note",
            trials
                .iter()
                .map(|t| t.error.clone().or_else(|| t.note.clone())),
        ),
        Column::str(
            "run_dir",
            trials
                .iter()
                .map(|t| t.run_dir.as_ref().map(|p| p.display().to_string())),
        ),
    ]);
    Table::from_columns(columns).expect("trial columns have one value per trial")
}

/// What is behind a [`SweepJob`] handle: the engine's sweep driver.
/// The engine's side of sweeps: what [`Sweep::launch`], [`Sweep::plan`] and
/// [`SweepJob::show`] need of it. The `trainbook` crate implements it (see `crate::runtime`).
pub trait Sweeps: Send + Sync {
    /// Starts a sweep; in the trainbook kernel the cell shows its live view.
    fn sweep(&self, spec: SweepSpec) -> Result<SweepJob>;
    /// The trials `spec` would run, each checked as `plan` checks a job (nothing started).
    fn plan_sweep(&self, spec: &SweepSpec) -> Result<Vec<TrialPlan>>;
    /// Shows a sweep's live view in the current cell (text elsewhere).
    fn show_sweep(&self, sweep: &SweepJob) -> Result<()>;
}

pub trait SweepControl: Send + Sync {
    fn spec(&self) -> &SweepSpec;
    fn dir(&self) -> &Path;
    /// How many trials run at once, e.g. "2 at a time (4 asked; 2 cores, 2 worker(s) each)".
    fn concurrency(&self) -> String;
    fn status(&self) -> SweepStatus;
    /// Every trial's state now.
    fn trials(&self) -> Vec<Trial>;
    /// The job of trial `id`, once it has started.
    fn job(&self, id: usize) -> Option<Job>;
    fn subscribe(&self) -> mpsc::Receiver<SweepUpdate>;
    fn attach_view(&self, view: Arc<dyn JobView>);
    fn stop(&self) -> Result<()>;
    fn wait(&self) -> Result<SweepResult>;
    fn result(&self) -> SweepResult;
}

/// A handle on a running or finished sweep. Cheap to clone.
#[derive(Clone)]
pub struct SweepJob(Arc<dyn SweepControl>);

impl SweepJob {
    /// The handle of the sweep `control` drives (the engine makes these).
    pub fn new(control: Arc<dyn SweepControl>) -> SweepJob {
        SweepJob(control)
    }
    pub fn control(&self) -> &Arc<dyn SweepControl> {
        &self.0
    }
    pub fn spec(&self) -> &SweepSpec {
        self.0.spec()
    }
    /// The sweep directory: `sweep.json` and one run directory per trial.
    pub fn dir(&self) -> &Path {
        self.0.dir()
    }
    pub fn status(&self) -> SweepStatus {
        self.0.status()
    }
    /// How many trials run at once on this machine, and why fewer than asked when so.
    pub fn concurrency(&self) -> String {
        self.0.concurrency()
    }
    /// One row per trial, as it stands now (see [`SweepResult::trials`]).
    pub fn trials(&self) -> Table {
        trials_table(&self.0.trials(), &self.spec().metric, self.spec().goal)
    }
    /// Every trial's state now.
    pub fn trial_states(&self) -> Vec<Trial> {
        self.0.trials()
    }
    /// Trial `id`'s job (1 for the first trial): `sweep.trial(3)?.show()?` shows its dashboard.
    pub fn trial(&self, id: usize) -> Result<Job> {
        let n = self.0.trials().len();
        if id == 0 || id > n {
            bail!("this sweep has trials 1 to {n}: no trial {id}");
        }
        self.0.job(id).ok_or_else(|| {
            anyhow::anyhow!("trial {id} has not started yet: it waits for a free slot")
        })
    }
    /// Live updates from now on.
    pub fn subscribe(&self) -> mpsc::Receiver<SweepUpdate> {
        self.0.subscribe()
    }
    pub fn attach_view(&self, view: Arc<dyn JobView>) {
        self.0.attach_view(view)
    }
    /// Stops every running trial and starts no more; waits for their workers.
    pub fn stop(&self) -> Result<()> {
        self.0.stop()
    }
    /// Blocks until every trial has ended. Ok unless every trial failed or the sweep was
    /// stopped; [`SweepJob::result`] has the trials either way.
    pub fn wait(&self) -> Result<SweepResult> {
        self.0.wait()
    }
    /// The trials so far (final once the sweep has ended).
    pub fn result(&self) -> SweepResult {
        self.0.result()
    }
    /// Displays the sweep's live view (table, plot, logs): live in the trainbook kernel, as
    /// text elsewhere.
    pub fn show(&self) -> Result<()> {
        port::<dyn Sweeps>()?.show_sweep(self)
    }
}

impl std::fmt::Debug for SweepJob {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let trials = self.0.trials();
        write!(
            f,
            "SweepJob({} trials of {}, {}, {}, {})",
            trials.len(),
            self.spec().base.recipe,
            self.status(),
            status_counts(&trials),
            self.dir().display()
        )
    }
}

/// The parameter values of every trial, before they are applied to jobs: the grid's product
/// repeated `samples` times, random parameters drawn with `draw(space, trial_index)`.
pub fn trial_params(
    spec: &SweepSpec,
    mut draw: impl FnMut(&Space) -> ParamValue,
) -> Vec<Vec<(String, ParamValue)>> {
    // The grid's product, the first grid parameter varying slowest (as Ray orders it).
    let mut grid: Vec<BTreeMap<usize, ParamValue>> = vec![BTreeMap::new()];
    for (i, (_, space)) in spec.space.iter().enumerate() {
        if let Space::Grid(values) = space {
            grid = grid
                .into_iter()
                .flat_map(|point| {
                    values.iter().map(move |v| {
                        let mut p = point.clone();
                        p.insert(i, v.clone());
                        p
                    })
                })
                .collect();
        }
    }
    let mut trials = Vec::new();
    for _ in 0..spec.samples {
        for point in &grid {
            let params = spec
                .space
                .iter()
                .enumerate()
                .map(|(i, (name, space))| {
                    let v = match point.get(&i) {
                        Some(v) => v.clone(),
                        None => draw(space),
                    };
                    (name.clone(), v)
                })
                .collect();
            trials.push(params);
        }
    }
    trials
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::spec::ConfigureTraining;

    fn sweep() -> Sweep {
        Sweep::new(JobSpec::new("bert").lr(1e-3))
    }

    #[test]
    fn trials_are_the_grid_product_times_samples_with_random_draws_in_each() {
        let s = sweep()
            .grid("lr", [1e-4, 1e-3])
            .uniform("warmup_ratio", 0.0, 0.2)
            .grid("max_length", [32, 64, 128])
            .samples(2);
        s.spec().check().unwrap();
        assert_eq!(s.spec().trial_count(), 12);
        let mut n = 0;
        let trials = trial_params(s.spec(), |_| {
            n += 1;
            ParamValue::Float(n as f64 / 100.0)
        });
        assert_eq!(trials.len(), 12);
        // The first grid parameter varies slowest; the random one is drawn per trial.
        let row = |t: &Vec<(String, ParamValue)>| {
            t.iter()
                .map(|(_, v)| v.to_string())
                .collect::<Vec<_>>()
                .join(" ")
        };
        assert_eq!(row(&trials[0]), "1e-4 0.01 32");
        assert_eq!(row(&trials[1]), "1e-4 0.02 64");
        assert_eq!(row(&trials[3]), "0.001 0.04 32");
        assert_eq!(
            row(&trials[6]),
            "1e-4 0.07 32",
            "the second sample repeats the grid"
        );
        assert_eq!(trials[0][0].0, "lr");
    }

    #[test]
    fn bad_spaces_and_settings_fail_naming_the_fix() {
        let err = |s: Sweep| s.spec().check().unwrap_err().to_string();
        assert!(err(sweep()).contains("no parameters"));
        assert!(err(sweep().grid("lr", Vec::<f64>::new())).contains("'lr' has no values"));
        assert!(err(sweep().log_uniform("lr", 0.0, 1e-3)).contains("0 < low < high"));
        assert!(err(sweep().uniform("dropout", 0.3, 0.1)).contains("low < high"));
        assert!(err(sweep().grid("lr", [1e-3]).grid("lr", [1e-4])).contains("given twice"));
        assert!(err(sweep().grid("lr", [1e-3]).concurrent(0)).contains("concurrent is 0"));
        assert!(err(sweep()
            .grid("lr", [1e-3])
            .scheduler(Asha::default().reduction_factor(1.0)))
        .contains("above 1"));
    }

    #[test]
    fn values_print_short_and_parse_back_from_the_command_line() {
        assert_eq!(ParamValue::from(1e-4).to_string(), "1e-4");
        assert_eq!(ParamValue::from(0.15).to_string(), "0.15");
        assert_eq!(ParamValue::from(2e-2).to_string(), "0.02");
        assert_eq!(ParamValue::from(3.0).to_string(), "3");
        assert_eq!(ParamValue::parse("64"), ParamValue::Int(64));
        assert_eq!(ParamValue::parse("3e-4"), ParamValue::Float(3e-4));
        assert_eq!(ParamValue::parse("adamw"), ParamValue::Str("adamw".into()));
        assert_eq!(
            ParamValue::from(crate::spec::OptimizerKind::Adamw).to_json(),
            serde_json::json!("adamw")
        );
        assert_eq!("max".parse::<Goal>().unwrap(), Goal::Max);
        assert!("up"
            .parse::<Goal>()
            .unwrap_err()
            .to_string()
            .contains("eval_loss:min"));
    }

    #[test]
    fn a_trial_that_ran_to_its_end_succeeded_as_jobs_do() {
        let s = TrialStatus::Succeeded;
        assert_eq!(s.name(), crate::JobStatus::Succeeded.name());
        assert_eq!(serde_json::to_value(s).unwrap(), "succeeded");
        // Sweep files written when it was called "done" still read.
        let old: TrialStatus = serde_json::from_str("\"done\"").unwrap();
        assert_eq!(old, s);
    }

    fn trial(id: usize, status: TrialStatus, reports: &[f64]) -> Trial {
        Trial {
            id,
            params: vec![("lr".into(), ParamValue::Float(id as f64 * 1e-3))],
            status,
            step: 10 * reports.len() as u64,
            total_steps: 40,
            reports: reports
                .iter()
                .enumerate()
                .map(|(i, v)| (10 * (i as u64 + 1), *v))
                .collect(),
            elapsed: 1.0,
            run_dir: None,
            note: None,
            error: None,
            result: None,
        }
    }

    #[test]
    fn the_best_trial_is_a_finished_one_by_its_last_value() {
        let trials = vec![
            trial(1, TrialStatus::Succeeded, &[0.9, 0.6]),
            // Pruned with a better early value: not a candidate.
            trial(2, TrialStatus::Pruned, &[0.5]),
            trial(3, TrialStatus::Succeeded, &[0.8, 0.55]),
            trial(4, TrialStatus::Failed, &[]),
        ];
        assert_eq!(best_finished(&trials, Goal::Min).unwrap().id, 3);
        assert_eq!(best_finished(&trials, Goal::Max).unwrap().id, 1);
        assert_eq!(status_counts(&trials), "2 succeeded · 1 pruned · 1 failed");
        let t = trials_table(&trials, "eval_loss", Goal::Min);
        assert_eq!(
            t.column_names(),
            [
                "trial",
                "lr",
                "status",
                "eval_loss",
                "best_eval_loss",
                "reports",
                "steps",
                "time",
                "note",
                "run_dir"
            ]
        );
        assert_eq!(t.column("eval_loss").unwrap().f64s()[2], Some(0.55));
        assert_eq!(t.column("status").unwrap().get(1).to_string(), "pruned");
        let r = SweepResult {
            status: SweepStatus::Failed,
            dir: "d".into(),
            metric: "eval_loss".into(),
            goal: Goal::Min,
            trials: vec![trial(1, TrialStatus::Failed, &[])],
            elapsed: 1.0,
        };
        assert!(r.best().unwrap_err().to_string().contains("1 failed"));
    }
}
