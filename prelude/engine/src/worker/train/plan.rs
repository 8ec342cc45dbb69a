//! What a run does: its steps and epochs (after a resume, from where it stands), each epoch's
//! micro-batches on a rank, and the learning rate of every step.

use anyhow::{bail, Result};
use trainbook_api::{Hyper, Precision, Schedule};

use crate::worker::optim::LrSchedule;
use crate::worker::sampler;

/// Optimizer steps per epoch: every sample once, in micro-batches of `global_batch / (world *
/// accum)` on each of `world` ranks, `accum` micro-batches a step (the last may be short).
pub(crate) fn steps_per_epoch(
    train_len: usize,
    world: usize,
    global_batch: usize,
    accum: usize,
) -> u64 {
    let local_batch = (global_batch / (world * accum)).max(1);
    train_len.div_ceil(local_batch * world).div_ceil(accum) as u64
}

/// [`steps_per_epoch`], at least one.
pub(super) fn steps_per_epoch_of(
    train_len: usize,
    world: usize,
    global_batch: usize,
    accum: usize,
) -> u64 {
    steps_per_epoch(train_len, world, global_batch, accum).max(1)
}

/// A run's plan on one rank.
#[derive(Debug)]
pub(super) struct Plan {
    /// Micro-batches per optimizer step, and samples per micro-batch on this rank.
    pub(super) accum: usize,
    pub(super) local_batch: usize,
    /// Where this run ends, and its epochs.
    pub(super) total_steps: u64,
    pub(super) epochs: u64,
    /// The epoch this start of the run begins in.
    pub(super) first_epoch: u64,
    /// Steps of the first epoch already taken before a resume (skipped, counting down).
    pub(super) skip: u64,
    pub(super) schedule: LrSchedule,
}

impl Plan {
    /// The plan of a run of `per_epoch` steps an epoch, with `local_batch` samples per
    /// micro-batch, that stands at `step` (`skip` steps into epoch `first_epoch`): `epochs`
    /// epochs, or `max_steps` steps when fewer.
    pub(super) fn new(
        h: &Hyper,
        local_batch: usize,
        per_epoch: u64,
        (step, first_epoch, skip): (u64, u64, u64),
    ) -> Result<Plan> {
        let total_steps = match h.max_steps {
            Some(m) => m.min(per_epoch * h.epochs),
            None => per_epoch * h.epochs,
        };
        if step >= total_steps {
            bail!("the checkpoint is already at step {step}, and this job has {total_steps} steps in all: ask for more epochs (or max_steps) to continue training");
        }
        let schedule = LrSchedule::new(h.schedule, h.lr, total_steps, h.warmup_ratio)
            .with_poly(h.constant_ratio, h.poly_power);
        Ok(Plan {
            accum: h.grad_accum.max(1),
            local_batch,
            total_steps,
            epochs: total_steps.div_ceil(per_epoch),
            first_epoch,
            skip,
            schedule,
        })
    }

    /// This rank's micro-batches of an epoch from its shard's `order`. Every rank takes part
    /// in each of the epoch's micro-batches: one whose shard has ended (an epoch's last step,
    /// when the samples left are fewer than the ranks) with an empty one. `len`: the epoch's
    /// samples over all `world` ranks.
    pub(super) fn micro_batches<'o>(
        &self,
        order: &'o [usize],
        world: usize,
        len: usize,
    ) -> Vec<&'o [usize]> {
        let mut micro: Vec<&[usize]> = sampler::batches(order, self.local_batch).collect();
        micro.resize(len.div_ceil(self.local_batch * world), &[]);
        micro
    }

    /// The micro-batches of `micro` this run trains on from `step` on: after a resume, not
    /// those the checkpoint's steps took, nor any past the run's end; and a micro-batch
    /// without samples is not loaded (its weightless sample is).
    pub(super) fn to_load<'o>(&self, micro: &[&'o [usize]], step: u64) -> Vec<&'o [usize]> {
        micro
            .iter()
            .skip(self.skip as usize * self.accum)
            .take((self.total_steps - step) as usize * self.accum)
            .copied()
            .filter(|b| !b.is_empty())
            .collect()
    }

    /// The samples over all `world` ranks of an epoch's step `j`: a whole global batch but for
    /// the epoch's last step. `len`: the epoch's samples.
    pub(super) fn step_samples(&self, j: usize, world: usize, len: usize) -> usize {
        let per_step = self.local_batch * world * self.accum;
        ((j + 1) * per_step).min(len) - j * per_step
    }

    /// Whether the learning rate changes over the run (a schedule or a warm-up): rank 0 then
    /// reports it at every step.
    pub(super) fn lr_changes(&self) -> bool {
        self.schedule.kind != Schedule::Constant || self.schedule.warmup > 0
    }

    /// Rank 0's one line on what this run will do: `samples` in the epoch, `shard` per worker.
    pub(super) fn describe(
        &self,
        h: &Hyper,
        world: usize,
        (samples, shard): (usize, usize),
    ) -> String {
        let (accum, local_batch, warmup) = (self.accum, self.local_batch, self.schedule.warmup);
        format!(
            "training {} samples ({} per worker) for {} epoch(s), {} steps, global batch {}{}, {} lr {} ({} schedule{}){}",
            samples,
            shard,
            self.epochs,
            self.total_steps,
            local_batch * world * accum,
            if accum > 1 { format!(" ({accum} micro-batches of {local_batch} per worker)") } else { String::new() },
            h.optimizer,
            h.lr,
            h.schedule,
            match (warmup, h.schedule == Schedule::Poly) {
                (0, false) => String::new(),
                (w, false) => format!(", {w} warm-up steps"),
                (w, true) => format!(", {w} warm-up + {} constant steps, power {}", self.schedule.constant, h.poly_power),
            },
            if h.precision == Precision::Bf16 { ", bf16 autocast" } else { "" },
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use trainbook_api::OptimizerKind;

    fn hyper(epochs: u64, global_batch: usize, accum: usize) -> Hyper {
        let mut h = Hyper::new("test", epochs, global_batch, 0.1, OptimizerKind::Sgd);
        h.grad_accum = accum;
        h
    }

    #[test]
    fn an_epoch_covers_every_sample_once() {
        // 100 samples, 2 workers x 2 micro-batches of 8: 7 micro-batch rounds, 4 steps.
        assert_eq!(steps_per_epoch(100, 2, 32, 2), 4);
        assert_eq!(steps_per_epoch(96, 2, 32, 1), 3);
        // A global batch smaller than the workers still takes a sample each.
        assert_eq!(steps_per_epoch(10, 4, 2, 1), 3);
        assert_eq!(steps_per_epoch_of(0, 1, 8, 1), 1);
    }

    #[test]
    fn a_run_ends_after_its_epochs_or_max_steps() {
        let mut h = hyper(3, 32, 1);
        let p = Plan::new(&h, 16, 10, (0, 0, 0)).unwrap();
        assert_eq!((p.total_steps, p.epochs, p.accum), (30, 3, 1));
        h.max_steps = Some(15);
        let p = Plan::new(&h, 16, 10, (12, 1, 2)).unwrap();
        assert_eq!((p.total_steps, p.epochs), (15, 2));
        assert_eq!((p.first_epoch, p.skip), (1, 2));
        assert_eq!(p.schedule.total, 15);
        let done = Plan::new(&h, 16, 10, (15, 1, 5)).unwrap_err();
        assert!(done.to_string().contains("already at step 15"), "{done}");
    }

    #[test]
    fn an_epochs_micro_batches_are_padded_to_every_ranks_count() {
        let p = Plan::new(&hyper(1, 8, 2), 2, 2, (0, 0, 0)).unwrap();
        // 9 samples over 2 ranks: this rank has 4 (rank 1), the other 5: 3 rounds of 2 each.
        let order = [1, 3, 5, 7];
        let micro = p.micro_batches(&order, 2, 9);
        assert_eq!(micro, [&[1, 3][..], &[5, 7], &[]]);
        assert_eq!(p.to_load(&micro, 0), [&[1, 3][..], &[5, 7]]);
        // Steps of 2 ranks x 2 micro-batches x 2 samples: 8, then the 1 left.
        assert_eq!(p.step_samples(0, 2, 9), 8);
        assert_eq!(p.step_samples(1, 2, 9), 1);
    }

    #[test]
    fn a_resumed_epoch_loads_only_the_steps_left() {
        let mut h = hyper(1, 4, 2);
        h.max_steps = Some(4);
        // One rank, micro-batches of 2, 2 a step; resumed 1 step in; 3 steps left in the run.
        let p = Plan::new(&h, 2, 5, (1, 0, 1)).unwrap();
        let order: Vec<usize> = (0..20).collect();
        let micro = p.micro_batches(&order, 1, 20);
        assert_eq!(micro.len(), 10);
        let loaded = p.to_load(&micro, 1);
        assert_eq!(loaded.len(), 6);
        assert_eq!(loaded[0], [4, 5]);
        assert_eq!(loaded[5], [14, 15]);
    }

    #[test]
    fn the_learning_rate_changes_with_a_schedule_or_a_warm_up() {
        let mut h = hyper(1, 8, 1);
        assert!(!Plan::new(&h, 8, 10, (0, 0, 0)).unwrap().lr_changes());
        h.warmup_ratio = 0.05;
        assert!(Plan::new(&h, 8, 10, (0, 0, 0)).unwrap().lr_changes());
        h.warmup_ratio = 0.0;
        h.schedule = Schedule::Linear;
        assert!(Plan::new(&h, 8, 10, (0, 0, 0)).unwrap().lr_changes());
    }

    #[test]
    fn the_announcement_says_what_the_run_does() {
        let mut h = hyper(2, 64, 2);
        let p = Plan::new(&h, 16, 5, (0, 0, 0)).unwrap();
        assert_eq!(
            p.describe(&h, 2, (150, 75)),
            "training 150 samples (75 per worker) for 2 epoch(s), 10 steps, global batch 64 (2 micro-batches of 16 per worker), sgd lr 0.1 (constant schedule)"
        );
        h.schedule = Schedule::Poly;
        h.warmup_ratio = 0.1;
        h.constant_ratio = 0.2;
        h.poly_power = 0.5;
        h.precision = Precision::Bf16;
        h.grad_accum = 1;
        let p = Plan::new(&h, 32, 5, (0, 0, 0)).unwrap();
        let line = p.describe(&h, 2, (150, 75));
        assert!(
            line.ends_with("global batch 64, sgd lr 0.1 (poly schedule, 1 warm-up + 2 constant steps, power 0.5), bf16 autocast"),
            "{line}"
        );
    }
}
