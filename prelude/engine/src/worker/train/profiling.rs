//! The profiler hook of the loop (`profile`): the recorded steps wrapped around each step, the
//! trace saved after the last of them (or when training ends first), and rank 0's summary.

use std::path::Path;

use anyhow::Result;
use trainbook_api::{Hyper, ProfileSteps, StepProfile};

use super::WorkerContext;
use crate::worker::device::Device;
use crate::worker::profiler::{self, StepProfiler};

/// Whether a run from `step` to `total_steps` records none of the `profile` steps.
fn outside(profile: ProfileSteps, step: u64, total_steps: u64) -> bool {
    profile.start >= total_steps || profile.end <= step
}

/// A run's profiling: nothing without `profile`.
pub(super) struct Profiling {
    /// The steps to record, and their profiler.
    recorder: Option<(ProfileSteps, StepProfiler)>,
    /// Rank 0's summary of the saved trace.
    summary: Option<StepProfile>,
}

impl Profiling {
    pub(super) fn new(ctx: &WorkerContext, h: &Hyper) -> Profiling {
        Profiling {
            recorder: h.profile.map(|steps| {
                let cuda = matches!(ctx.device, Device::Cuda(_));
                let profiler = StepProfiler::new(steps, &ctx.run_dir, ctx.rank, cuda);
                (steps, profiler)
            }),
            summary: None,
        }
    }

    /// Rank 0's note when a run from `step` to `total_steps` records none of the steps asked
    /// for.
    pub(super) fn note_outside(&self, ctx: &WorkerContext, step: u64, total_steps: u64) {
        if let Some((p, _)) = self
            .recorder
            .as_ref()
            .filter(|(p, _)| outside(*p, step, total_steps))
        {
            ctx.events.log(format!(
                "profile steps {p} are outside this run's steps {step}..{total_steps}: nothing will be recorded"
            ));
        }
    }

    /// Before step `step` (0-based).
    pub(super) fn before_step(&mut self, step: u64) -> Result<()> {
        if let Some((_, p)) = self.recorder.as_mut() {
            p.before_step(step)?;
        }
        Ok(())
    }

    /// Whether the trace is saved after the step that makes `steps_done` steps (the step must
    /// then end whole on the device first).
    pub(super) fn saves_after(&self, steps_done: u64) -> bool {
        self.recorder
            .as_ref()
            .is_some_and(|(_, p)| p.saves_after(steps_done))
    }

    /// After the step that makes `steps_done` steps: the trace saved after the last recorded.
    pub(super) fn after_step(&mut self, ctx: &WorkerContext, steps_done: u64) -> Result<()> {
        let saved = match self.recorder.as_mut() {
            Some((_, p)) => p.after_step(steps_done)?,
            None => None,
        };
        if let Some(path) = saved {
            self.profiled(ctx, &path)?;
        }
        Ok(())
    }

    /// Training ended inside the profiled steps: what was recorded is saved.
    pub(super) fn finish(&mut self, ctx: &WorkerContext) -> Result<()> {
        let saved = match self.recorder.as_mut() {
            Some((_, p)) => p.finish()?,
            None => None,
        };
        if let Some(path) = saved {
            self.profiled(ctx, &path)?;
        }
        Ok(())
    }

    /// Rank 0's summary of the recorded steps, once saved.
    pub(super) fn into_summary(self) -> Option<StepProfile> {
        self.summary
    }

    /// A trace was saved: rank 0 sums it into the top-ops table (and says where it is).
    fn profiled(&mut self, ctx: &WorkerContext, path: &Path) -> Result<()> {
        let Some((steps, _)) = self.recorder.as_ref().filter(|_| ctx.rank == 0) else {
            return Ok(());
        };
        let summary = profiler::summarize(path, *steps)?;
        ctx.events.log(format!(
            "profiled steps {}: {:.1} ms a step, top operator {}; Chrome traces in {} (Perfetto, TensorBoard)",
            summary.steps,
            summary.step_ms,
            summary.ops.first().map_or("none", |o| o.name.as_str()),
            path.parent().unwrap_or(path).display()
        ));
        self.summary = Some(summary);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_run_records_the_profile_steps_it_takes() {
        let p = ProfileSteps { start: 20, end: 25 };
        assert!(!outside(p, 0, 100));
        assert!(!outside(p, 24, 100), "a resumed run still takes step 24");
        assert!(!outside(p, 0, 21), "a run ending at 21 records step 20");
        assert!(outside(p, 25, 100), "resumed after them");
        assert!(outside(p, 0, 20), "ends before them");
    }
}
