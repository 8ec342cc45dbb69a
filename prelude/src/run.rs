//! How trainbook runs a job for notebooks and the CLI: the engine's `launch` with trainbook's
//! recipes injected and the notebook view subscribed to the job, and the view options that
//! ride along in the spec (the engine carries them but never reads them).

use anyhow::Result;
use trainbook_engine::{Configure, DeviceKind, Hyper, Job, JobSpec, TrainResult};

use crate::notebook;

/// Starts a job with trainbook's recipes and returns at once; in the trainbook kernel the cell
/// shows its live dashboard. See [`Job::wait`].
pub fn launch(spec: JobSpec) -> Result<Job> {
    view_options(&spec).dashboard()?;
    let job = trainbook_engine::launch(spec, &trainbook_recipes::REGISTRY)?;
    notebook::show_job(&job);
    Ok(job)
}

/// Launches and waits: the blocking form of [`launch`].
pub fn fit(spec: JobSpec) -> Result<TrainResult> {
    launch(spec)?.wait()
}

/// What a job would run with, resolved as `fit` resolves it, with nothing started.
#[derive(Clone, Debug)]
pub struct Plan {
    /// The device its workers would use (`DeviceRequest::Auto`: HPU, then CUDA, then CPU).
    pub device: DeviceKind,
    /// Every hyper-parameter: the preset's (named, or chosen as the recipe chooses: e.g.
    /// bert's "reference" when its model and data are on this machine), with the job's options
    /// on top; the recipe's own settings in `recipe_options`.
    pub hyper: Hyper,
}

/// `fit`, `launch` and `plan` for every job builder (`JobSpec`, `BertTrainer`, ...).
pub trait Train: Configure {
    /// The device and hyper-parameters this job would run with (see [`Plan`]); a bad option
    /// fails here as it would in `fit`.
    fn plan(&self) -> Result<Plan> {
        let spec = self.spec();
        spec.validate(&trainbook_recipes::REGISTRY)?;
        let hyper = trainbook_recipes::REGISTRY.resolve(spec)?.ok_or_else(|| {
            anyhow::anyhow!(
                "job '{}' trains no recipe: it has no hyper-parameters",
                spec.recipe
            )
        })?;
        let device = trainbook_engine::device::resolve(spec.device, spec.workers)?;
        Ok(Plan { device, hyper })
    }
    /// Runs the job to the end (see [`fit`]).
    fn fit(self) -> Result<TrainResult> {
        fit(self.into_spec())
    }
    /// Starts the job and returns at once; follow it with `job.wait()`, `job.progress()`, ...
    fn launch(self) -> Result<Job> {
        launch(self.into_spec())
    }
}

impl<T: Configure> Train for T {}

/// What the live dashboard shows, for every job builder.
pub trait View: Configure {
    /// Draw the loss plot in the live view (default on).
    fn show_plot(mut self, on: bool) -> Self {
        self.job_spec().extensions.get_mut::<ViewOptions>().plot = on;
        self
    }
    /// Show worker logs in the live view (default on).
    fn show_logs(mut self, on: bool) -> Self {
        self.job_spec().extensions.get_mut::<ViewOptions>().logs = on;
        self
    }
    /// Which worker lines the live view and the terminal show: `LogLevel::Warn` keeps
    /// warnings and errors only (default: `$TRAINBOOK_LOG`, else `info`).
    fn log_level(mut self, level: trainbook_widgets::LogLevel) -> Self {
        self.job_spec()
            .extensions
            .get_mut::<ViewOptions>()
            .log_level = Some(level);
        self
    }
    /// Logarithmic loss axis in the plot.
    fn log_scale(mut self, on: bool) -> Self {
        self.job_spec()
            .extensions
            .get_mut::<ViewOptions>()
            .log_scale = on;
        self
    }
}

impl<T: Configure> View for T {}

/// `job.show()`: the job's dashboard in any cell.
pub trait Show {
    /// Displays the job's dashboard (progress, loss plot, metrics table, logs): live in the
    /// trainbook kernel, updating in place until the job ends; as text elsewhere.
    fn show(&self) -> Result<()>;
}

impl Show for Job {
    fn show(&self) -> Result<()> {
        notebook::show(self)
    }
}

/// The view options set on `spec` (the defaults when none were).
pub fn view_options(spec: &JobSpec) -> ViewOptions {
    spec.extensions
        .get::<ViewOptions>()
        .cloned()
        .unwrap_or_default()
}

/// What a job's live view shows; see the `show_*`/`log_level` builder methods.
#[derive(Clone, Debug, PartialEq)]
pub struct ViewOptions {
    pub plot: bool,
    pub logs: bool,
    /// `None`: `$TRAINBOOK_LOG`, else `info`.
    pub log_level: Option<trainbook_widgets::LogLevel>,
    pub log_scale: bool,
}

impl Default for ViewOptions {
    fn default() -> Self {
        ViewOptions {
            plot: true,
            logs: true,
            log_level: None,
            log_scale: false,
        }
    }
}

/// Environment variable with the default log level of live views (`off`, `error`, `warn`,
/// `info`, `debug`), like `RUST_LOG`.
pub const LOG_LEVEL_ENV: &str = "TRAINBOOK_LOG";

impl ViewOptions {
    /// The widgets' options, with the log level from `$TRAINBOOK_LOG` when none was set.
    pub fn dashboard(&self) -> Result<trainbook_widgets::DashboardOptions> {
        let log_level = match self.log_level {
            Some(l) => l,
            None => match std::env::var(LOG_LEVEL_ENV) {
                Ok(v) => v
                    .parse()
                    .map_err(|e| anyhow::anyhow!("{LOG_LEVEL_ENV}={v:?}: {e}"))?,
                Err(_) => trainbook_widgets::LogLevel::Info,
            },
        };
        Ok(trainbook_widgets::DashboardOptions {
            plot: self.plot,
            logs: self.logs,
            log_level,
            log_y: self.log_scale,
            ..Default::default()
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn view_options_ride_along_in_the_spec() {
        let spec = JobSpec::new("synthetic").show_plot(false).log_scale(true);
        let copy = spec.clone();
        let v = view_options(&copy);
        assert!(!v.plot && v.logs && v.log_scale, "{v:?}");
        assert_eq!(view_options(&JobSpec::new("bert")), ViewOptions::default());
    }
}
