//! The data-parallel training loop every recipe shares, as a [`TrainingLoop`]: sharded
//! batches, bucketed gradient all-reduce, per-step loss, per-epoch evaluation (all-reduced),
//! checkpoints, events. Each part of an epoch is a method of its own (`step`, `end_epoch`,
//! `checkpoint`), and each part of a step a module of its own, so a restart, a hook or a new
//! update strategy has one obvious place:
//!
//! - [`setup`]: the batch layout, the optimizer's settings, parameters and data shards.
//! - [`resume`]: a checkpoint loaded, and where in the data order the run continues.
//! - [`plan`]: steps, epochs, each epoch's micro-batches, the learning rates.
//! - [`share`]: how much each micro-batch's loss and each rank's gradient weigh.
//! - [`scalars`]: a micro-batch's pass, and the step's numbers read after the step is queued.
//! - [`graphed`]: steps captured in a CUDA graph and replayed (`cuda_graphs`).
//! - [`clock`]: throughput and when progress is due.
//! - [`checkpointing`]: when a checkpoint is due, the writer, what was written and kept.
//! - [`profiling`]: the profiler around the recorded steps (`profile`).
//! - [`metrics`], [`evaluation`], [`report`], [`summary`]: an epoch's numbers and the events.

mod checkpointing;
mod clock;
mod evaluation;
mod graphed;
mod metrics;
mod plan;
mod profiling;
mod report;
mod resume;
mod scalars;
mod setup;
mod share;
mod summary;

use std::collections::BTreeMap;
use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{bail, Result};
use tch::Tensor;
use trainbook_api::{metric, Hyper};

use crate::shared::checkpoint;
use crate::shared::events::{Emitter, WorkerSummary};
use crate::shared::run_dir::RunDir;
use crate::worker::checkpoint_writer::Contents;
use crate::worker::ddp;
use crate::worker::device::Device;
use crate::worker::dist::ProcessGroup;
use crate::worker::heartbeat::{self, Busy};
use crate::worker::recipe::{Recipe, Split};
use crate::worker::slices;
use crate::worker::strategy::UpdateStrategy;
use checkpointing::Checkpoints;
use clock::Clock;
use graphed::GraphSteps;
use metrics::EpochSums;
use plan::{steps_per_epoch, Plan};
use profiling::Profiling;
use scalars::{forward_backward, InFlight, StepScalars};
use setup::{Params, Shards};

/// Where a worker stands in its job.
pub(crate) struct WorkerContext {
    pub rank: usize,
    pub world_size: usize,
    pub device: Device,
    pub device_name: String,
    pub pg: ProcessGroup,
    pub events: Emitter,
    pub run_dir: RunDir,
}

/// One rank's training of one recipe: set up by [`TrainingLoop::new`] (the same starting point
/// on every rank, a resume, the plan), driven by [`TrainingLoop::run`].
pub(crate) struct TrainingLoop<'a> {
    ctx: &'a WorkerContext,
    recipe: &'a mut dyn Recipe,
    h: &'a Hyper,
    plan: Plan,
    /// Optimizer steps taken.
    step: u64,
    params: Params,
    update: UpdateStrategy,
    shards: Shards,
    clock: Clock,
    /// The last step, whose numbers are not read yet.
    in_flight: Option<InFlight>,
    graph: GraphSteps,
    checkpoints: Checkpoints,
    profiling: Profiling,
    /// The last epoch's metrics, summed over ranks.
    final_metrics: BTreeMap<String, f64>,
}

impl<'a> TrainingLoop<'a> {
    /// Prepares a rank: checks the batch layout, builds the update strategy, resumes when asked,
    /// gives every rank rank 0's parameters, and plans the steps.
    pub(crate) fn new(
        ctx: &'a WorkerContext,
        recipe: &'a mut dyn Recipe,
        h: &'a Hyper,
    ) -> Result<Self> {
        let world = ctx.world_size;
        let local_batch = setup::local_batch(ctx, h)?;
        let trainable = setup::trainable_named(recipe);
        let units = setup::units(ctx, h, recipe, &trainable)?;
        let mut update = UpdateStrategy::new(
            setup::optimizer_config(h),
            trainable,
            h.zero,
            &ctx.pg,
            1.0 / world as f64,
            units.clone(),
        )?;
        let resumed = resume::load(ctx, h, recipe.vars_mut(), &mut update)?;
        // Same starting point everywhere (in a fixed name order).
        ddp::broadcast_parameters(&ctx.pg, &setup::ordered_vars(recipe))?;
        if let Some(units) = &units {
            crate::worker::units::lock(units)?.capture(slices::take())?;
            slices::give_back_freed_memory();
            crate::worker::units::activate(units);
        }
        let params = Params::of(recipe);
        let shards = Shards::new(recipe, ctx.rank, world, h.seed)?;
        let accum = h.grad_accum.max(1);
        let per_epoch = steps_per_epoch(recipe.train_len(), world, h.global_batch_size, accum);
        let at = resume::start(ctx, h, resumed.as_ref(), recipe.train_len(), per_epoch)?;
        let plan = Plan::new(h, local_batch, per_epoch, at)?;
        let step = at.0;
        let training = TrainingLoop {
            clock: Clock::new(step, plan.total_steps, Instant::now()),
            graph: GraphSteps::new(h, local_batch, step),
            checkpoints: Checkpoints::new(ctx, h, resumed.as_ref().map(|r| r.dir), step),
            profiling: Profiling::new(ctx, h),
            in_flight: None,
            final_metrics: BTreeMap::new(),
            ctx,
            recipe,
            h,
            plan,
            step,
            params,
            update,
            shards,
        };
        heartbeat::set_step(step);
        if ctx.rank == 0 {
            checkpoint::remove_staged(&ctx.run_dir);
            training.announce();
            let total_steps = training.plan.total_steps;
            training.profiling.note_outside(ctx, step, total_steps);
        }
        Ok(training)
    }

    /// Rank 0's one line on what this run will do.
    fn announce(&self) {
        let sampler = &self.shards.sampler;
        let counts = (sampler.len(), sampler.shard_len());
        let line = self.plan.describe(self.h, self.ctx.world_size, counts);
        self.ctx.events.log(line);
    }

    /// Trains every epoch left, evaluating and checkpointing at the end of each; returns this
    /// rank's summary for the driver.
    pub(crate) fn run(mut self) -> Result<WorkerSummary> {
        if let Ok(level) = std::env::var(crate::shared::env::CUDA_SYNC_DEBUG) {
            crate::worker::device::cuda_sync_debug(self.ctx.device, &level)?;
        }
        self.graph.check(self.ctx.device, &*self.recipe)?;
        for epoch in self.plan.first_epoch..self.plan.epochs {
            let sums = self.train_epoch(epoch)?;
            self.end_epoch(epoch, sums)?;
            if self.step >= self.plan.total_steps {
                break;
            }
        }
        self.profiling.finish(self.ctx)?;
        self.checkpoints.wait(self.ctx)?;
        // What the rank held between steps, before the model is made whole again for what
        // follows the run (its summary, a last save).
        let held = self.update.held_parameters();
        self.update.unshard()?;
        Ok(self.summary(held))
    }

    /// One epoch's optimizer steps over this rank's shard (after a resume, without the steps
    /// the checkpoint had already taken).
    fn train_epoch(&mut self, epoch: u64) -> Result<EpochSums> {
        let (world, len) = (self.ctx.world_size, self.shards.sampler.len());
        let order = self.shards.sampler.indices(epoch as usize);
        let micro = self.plan.micro_batches(&order, world, len);
        let planned = self.plan.to_load(&micro, self.step);
        {
            let _busy = Busy::new();
            self.recipe.prefetch(Split::Train, epoch, &planned);
        }
        // A sample of this rank's shard, for a micro-batch it has none for.
        let spare = order.first().copied().unwrap_or(0);
        let mut sums = EpochSums::default();
        self.clock.start_epoch(Instant::now());
        for (j, group) in micro.chunks(self.plan.accum).enumerate() {
            if self.step >= self.plan.total_steps {
                break;
            }
            if self.plan.skip > 0 {
                self.plan.skip -= 1;
                continue;
            }
            self.profiling.before_step(self.step)?;
            let global = self.plan.step_samples(j, world, len);
            self.step(epoch, group, (global, spare), &mut sums)?;
            if self.profiling.saves_after(self.step) {
                // The last recorded step ends whole on the device before the trace is saved.
                self.settle(&mut sums)?;
            }
            self.profiling.after_step(self.ctx, self.step)?;
        }
        self.settle(&mut sums)?;
        self.clock.end_epoch();
        Ok(sums)
    }

    /// One optimizer step: forward and backward over `group`'s micro-batches, the update
    /// (gradients reduced across ranks), the step's metrics, a step checkpoint when due, and a
    /// progress event (rate-limited).
    /// `global`: the step's samples over all ranks; `spare`: a sample of this rank's shard, for
    /// a micro-batch it has none for.
    fn step(
        &mut self,
        epoch: u64,
        group: &[&[usize]],
        (global, spare): (usize, usize),
        sums: &mut EpochSums,
    ) -> Result<()> {
        let started = Instant::now();
        let (world, rank) = (self.ctx.world_size, self.ctx.rank);
        tch::manual_seed(step_seed(self.h.seed, self.step, world, rank));
        let lr = self.plan.schedule.at(self.step);
        let scalars = match self.graph.inputs(&*self.recipe, self.step, group)? {
            Some(host) => self.graphed_step(host, lr)?,
            None => self.eager_step(group, (global, spare), lr)?,
        };
        let deferred = self.send(scalars, epoch, lr, sums)?;
        let samples = group.iter().map(|b| b.len()).sum();
        self.count_step(samples, started.elapsed());
        let due = self.step_checkpoint_due()?;
        if due || !deferred {
            // Numbers already on the host are read at once; a checkpoint records the loss.
            let loss = self.settle(sums)?;
            if let (true, Some(loss)) = (due, loss) {
                self.step_checkpoint(epoch, loss)?;
            }
        }
        self.checkpoints.poll(self.ctx)?;
        self.progress(epoch);
        Ok(())
    }

    /// A step through the CUDA graph (`cuda_graphs`).
    fn graphed_step(&mut self, host: Vec<Tensor>, lr: f64) -> Result<StepScalars> {
        let at = (self.step, lr);
        self.graph
            .step(self.ctx, &*self.recipe, &mut self.update, host, at)
    }

    /// A step run op by op: each micro-batch's forward and backward pass, weighted by its
    /// share of the step's samples, then the update.
    fn eager_step(
        &mut self,
        group: &[&[usize]],
        (global, spare): (usize, usize),
        lr: f64,
    ) -> Result<StepScalars> {
        let (ctx, h) = (self.ctx, self.h);
        self.graph.set_lr(lr);
        self.update.zero_grad();
        let weights = share::weigh(group, ctx.world_size, global);
        self.update.set_share(weights.share);
        let mut scalars = StepScalars::default();
        let recipe = &*self.recipe;
        self.update.open()?;
        for (batch, divisor) in group.iter().zip(weights.divisors) {
            // A rank with no samples takes part in the step's collectives with a weightless
            // sample.
            let samples = match batch.len() {
                0 => std::slice::from_ref(&spare),
                _ => *batch,
            };
            forward_backward(
                (h.precision, ctx.device),
                batch.len(),
                divisor,
                &mut scalars,
                || recipe.step(Split::Train, samples, true),
            )?;
        }
        self.update.step(&ctx.pg, weights.share, h.grad_clip, lr)?;
        Ok(scalars)
    }

    /// The step's numbers, sent once the update is queued; the previous step's are read now
    /// that this one is queued behind them. Returns whether this step's may still be on their
    /// way (then reading them can wait for the next step).
    fn send(
        &mut self,
        scalars: StepScalars,
        epoch: u64,
        lr: f64,
        sums: &mut EpochSums,
    ) -> Result<bool> {
        let scalars = scalars.send(self.ctx.device)?;
        self.settle(sums)?;
        let deferred = scalars.deferred();
        self.in_flight = Some(InFlight {
            scalars,
            epoch,
            index: self.step,
            lr,
        });
        Ok(deferred)
    }

    /// The step is taken: its samples and time count, and the pulse says so.
    fn count_step(&mut self, samples: usize, took: Duration) {
        self.clock.count(self.step, samples, took);
        self.step += 1;
        heartbeat::set_step(self.step);
    }

    /// Whether the step just taken ends with a step checkpoint (never the run's last, which
    /// ends with its epoch's).
    fn step_checkpoint_due(&self) -> Result<bool> {
        Ok(self.step < self.plan.total_steps && self.checkpoints.due(self.step, &self.ctx.pg)?)
    }

    /// Reads the step in flight, if any: its loss (also returned) and metrics go into `sums`
    /// and out as events. A loss that is not finite ends the run.
    fn settle(&mut self, sums: &mut EpochSums) -> Result<Option<f64>> {
        let Some(f) = self.in_flight.take() else {
            return Ok(None);
        };
        let (loss_sum, n, metrics) = f.scalars.read(sums)?;
        if n == 0 {
            // A step this rank took part in without samples (an epoch's last): no loss.
            return Ok(None);
        }
        let l = loss_sum / n as f64;
        if !l.is_finite() {
            bail!("loss became {l} at step {} (epoch {}): lower the learning rate or enable gradient clipping", f.index, f.epoch);
        }
        sums.loss += loss_sum;
        sums.n += n as f64;
        self.report_step(f.epoch, f.index + 1, l, f.lr, &metrics);
        sums.metrics.merge(&metrics);
        Ok(Some(l))
    }

    /// The step checkpoint of the step just taken, which records its loss.
    fn step_checkpoint(&mut self, epoch: u64, loss: f64) -> Result<()> {
        let at = [(metric::TRAIN_LOSS.to_string(), loss)]
            .into_iter()
            .collect();
        let dir = self.ctx.run_dir.checkpoint(&format!("step-{}", self.step));
        self.checkpoint(&dir, epoch, at, true)
    }

    /// Writes a checkpoint directory (weights, optimizer state, trainer state) atomically on
    /// rank 0, on the step's path or in the background (`checkpoint_async`), and announces it
    /// once it is in place; every rank takes part, since ZeRO gathers the optimizer state from
    /// all of them.
    fn checkpoint(
        &mut self,
        dir: &Path,
        epoch: u64,
        metrics: BTreeMap<String, f64>,
        step_checkpoint: bool,
    ) -> Result<()> {
        let _busy = Busy::new();
        self.checkpoints.started();
        if self.update.shards_parameters() && !self.checkpoints_trained_only() {
            let state = (self.ctx.rank == 0)
                .then(|| {
                    let (world, accum) = (self.ctx.world_size, self.plan.accum);
                    checkpointing::trainer_state(self.h, (epoch, self.step), world, accum, metrics)
                })
                .transpose()?;
            let written = self.checkpoints.write_sharded(
                self.ctx,
                dir,
                &*self.recipe,
                &mut self.update,
                state,
                step_checkpoint,
            );
            self.update.close()?;
            return written;
        }
        let optimizer = self.update.checkpoint_state(&self.ctx.pg)?;
        // Under ZeRO-3 every rank takes part in gathering the adapters rank 0 writes.
        self.update.gather_trained(self.ctx.rank == 0)?;
        let written = self.write_checkpoint(dir, epoch, metrics, step_checkpoint, optimizer);
        self.update.close()?;
        written
    }

    /// Whether the recipe's checkpoints hold only the trained parameters of a model that
    /// has frozen ones too (LoRA: the adapters, beside a base that is the recipe's own files).
    /// Such a checkpoint is small, and rank 0 writes it whole even under ZeRO-3.
    fn checkpoints_trained_only(&self) -> bool {
        // By the tensors' own flags: a frozen base is frozen with `set_requires_grad`.
        let frozen = self
            .recipe
            .vars()
            .variables()
            .values()
            .any(|t| !t.requires_grad());
        frozen && self.recipe.weights().iter().all(|(_, t)| t.requires_grad())
    }

    fn write_checkpoint(
        &mut self,
        dir: &Path,
        epoch: u64,
        metrics: BTreeMap<String, f64>,
        step_checkpoint: bool,
        optimizer: Vec<(String, Tensor)>,
    ) -> Result<()> {
        if self.ctx.rank != 0 {
            return Ok(());
        }
        let (world, accum) = (self.ctx.world_size, self.plan.accum);
        let state =
            checkpointing::trainer_state(self.h, (epoch, self.step), world, accum, metrics)?;
        let contents = Contents {
            optimizer: &optimizer,
            state,
            step_checkpoint,
        };
        self.checkpoints
            .write(self.ctx, dir, &*self.recipe, contents)
    }
}

/// The random seed of step `step` on rank `rank` of `world` in a job seeded with `seed`: seeded
/// per step and rank, so a run resumed from any step draws the same dropout masks as the run
/// that was not interrupted.
fn step_seed(seed: u64, step: u64, world: usize, rank: usize) -> i64 {
    (seed as i64)
        .wrapping_mul(1_000_003)
        .wrapping_add((step * world as u64 + rank as u64) as i64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_step_and_rank_has_its_own_seed() {
        assert_eq!(step_seed(42, 0, 1, 0), 42_000_126);
        assert_eq!(step_seed(42, 3, 2, 1), 42_000_126 + 7);
        let seeds: std::collections::HashSet<i64> = (0..10)
            .flat_map(|step| (0..4).map(move |rank| step_seed(7, step, 4, rank)))
            .collect();
        assert_eq!(seeds.len(), 40);
        // A seed too large for i64 wraps instead of overflowing.
        assert_eq!(step_seed(u64::MAX, 0, 1, 0), -1_000_003);
    }
}
