//! Running a job: `fit`, `launch` and `plan` for every job builder ([`Train`]), and what its
//! live view shows ([`View`], options that ride along in the spec: the engine carries them but
//! never reads them).

use anyhow::Result;

use crate::job::{Job, Jobs, TrainResult};
use crate::logs::LogLevel;
use crate::runtime::port;
use crate::spec::{Configure, JobSpec, Plan};

/// Starts a job with trainbook's recipes and returns at once; in the trainbook kernel the cell
/// shows its live dashboard. See [`Job::wait`].
pub fn launch(spec: JobSpec) -> Result<Job> {
    port::<dyn Jobs>()?.launch(spec)
}

/// Launches and waits: the blocking form of [`launch`].
pub fn fit(spec: JobSpec) -> Result<TrainResult> {
    launch(spec)?.wait()
}

/// `fit`, `launch` and `plan` for every job builder (`JobSpec`, `BertTrainer`, ...).
pub trait Train: Configure {
    /// The device and hyper-parameters this job would run with (see [`Plan`]); a bad option
    /// fails here as it would in `fit`.
    fn plan(&self) -> Result<Plan> {
        port::<dyn Jobs>()?.plan(self.spec())
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
        self.job_spec().view.plot = on;
        self
    }
    /// Show worker logs in the live view (default on).
    fn show_logs(mut self, on: bool) -> Self {
        self.job_spec().view.logs = on;
        self
    }
    /// Which worker lines the live view and the terminal show: `LogLevel::Warn` keeps
    /// warnings and errors only (default: `$TRAINBOOK_LOG`, else `info`).
    fn log_level(mut self, level: LogLevel) -> Self {
        self.job_spec().view.log_level = Some(level);
        self
    }
    /// Logarithmic loss axis in the plot.
    fn log_scale(mut self, on: bool) -> Self {
        self.job_spec().view.log_scale = on;
        self
    }
}

impl<T: Configure> View for T {}

/// The view options set on `spec` (the defaults when none were).
pub fn view_options(spec: &JobSpec) -> ViewOptions {
    spec.view.clone()
}

use crate::view::ViewOptions;

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
