//! A rank's events about its steps: each step's metrics and log line, and rank 0's progress.

use std::time::Instant;

use trainbook_api::metric;

use super::metrics::MetricSums;
use super::TrainingLoop;
use crate::shared::events::Event;

impl TrainingLoop<'_> {
    /// The step's metric events and its log line; the learning rate on rank 0 when it changes
    /// over the run.
    pub(super) fn report_step(
        &self,
        epoch: u64,
        step: u64,
        loss: f64,
        lr: f64,
        metrics: &MetricSums,
    ) {
        let ev = &self.ctx.events;
        ev.log(format!("train epoch:[{epoch}]\tloss:{loss:.6}"));
        ev.metric(step, epoch, metric::LOSS, loss);
        if self.recipe.perplexity() {
            ev.metric(step, epoch, metric::PERPLEXITY, loss.exp());
        }
        for (name, value) in metrics.means() {
            ev.metric(step, epoch, &name, value);
        }
        if self.ctx.rank == 0 && self.plan.lr_changes() {
            ev.metric(step, epoch, metric::LR, lr);
        }
    }

    /// Rank 0's progress event, at most every [`super::clock::PROGRESS_EVERY`] and at the last
    /// step.
    pub(super) fn progress(&mut self, epoch: u64) {
        let at_end = self.step == self.plan.total_steps;
        let now = Instant::now();
        if self.ctx.rank != 0 || !self.clock.progress_due(now, at_end) {
            return;
        }
        let (samples, samples_per_second) = self.clock.rate(self.ctx.world_size, now);
        self.ctx.events.send(Event::Progress {
            rank: 0,
            step: self.step,
            total_steps: self.plan.total_steps,
            epoch,
            epochs: self.plan.epochs,
            samples,
            samples_per_second,
        });
    }
}
