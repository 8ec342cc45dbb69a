//! A resumed run: the checkpoint's weights and optimizer state loaded, and where in the data
//! order the run continues (with the checkpoint's worker count or another).

use std::path::Path;

use anyhow::{bail, Context, Result};
use tch::nn;
use trainbook_api::Hyper;

use super::plan::steps_per_epoch_of;
use super::WorkerContext;
use crate::shared::checkpoint::{self, TrainerState};
use crate::shared::tensor_files::{self, TensorFiles};
use crate::worker::strategy::UpdateStrategy;

/// The checkpoint a run resumed from, and its trainer state.
pub(super) struct Resumed<'h> {
    pub(super) dir: &'h Path,
    pub(super) state: TrainerState,
}

/// With `resume_from`: loads the checkpoint's weights into `vs` and its optimizer state into
/// `update`.
pub(super) fn load<'h>(
    ctx: &WorkerContext,
    h: &'h Hyper,
    vs: &mut nn::VarStore,
    update: &mut UpdateStrategy,
) -> Result<Option<Resumed<'h>>> {
    let Some(dir) = &h.resume_from else {
        return Ok(None);
    };
    let state = resume(dir, vs, update, h, &|m| ctx.events.log(m))?;
    Ok(Some(Resumed { dir, state }))
}

/// Loads weights and optimizer state from `dir`; returns its trainer state.
fn resume(
    dir: &Path,
    vs: &nn::VarStore,
    update: &mut UpdateStrategy,
    h: &Hyper,
    log: &dyn Fn(String),
) -> Result<TrainerState> {
    let state = TrainerState::read(dir)?;
    // A checkpoint holds what `Recipe::weights` gives: every variable, or (LoRA) the trained
    // ones only, the frozen rest being the recipe's own model files. One file, or under
    // ZeRO-3 one per rank with an index; either loads with any worker count.
    let Some(weights) = TensorFiles::open(dir, checkpoint::MODEL_STEM)? else {
        bail!(
            "{} has no weights ({} or {}): give a complete checkpoint directory",
            dir.display(),
            checkpoint::MODEL,
            tensor_files::index_name(checkpoint::MODEL_STEM)
        );
    };
    let vars = vs.variables();
    let missing = crate::worker::slices::load(&weights, &vars)
        .with_context(|| format!("loading the weights of {}", dir.display()))?;
    if let Some(name) = missing
        .iter()
        .find(|n| vars.get(*n).is_some_and(|t| t.requires_grad()))
    {
        bail!(
            "{} has no {name}: it was written by another model or recipe configuration",
            dir.display()
        );
    }
    match TensorFiles::open(dir, checkpoint::OPTIMIZER_STEM)? {
        Some(stored) => update.load(&stored)?,
        None => log(format!(
            "warning: {} has no optimizer state (only the latest checkpoint keeps it); the {} state restarts from zero",
            dir.display(),
            h.optimizer
        )),
    }
    Ok(state)
}

/// Where the run starts: (step, first epoch, steps of that epoch already taken); at the
/// beginning, or where `resumed` says (rank 0 says so).
pub(super) fn start(
    ctx: &WorkerContext,
    h: &Hyper,
    resumed: Option<&Resumed>,
    train_len: usize,
    steps_per_epoch: u64,
) -> Result<(u64, u64, u64)> {
    let Some(Resumed { dir, state }) = resumed else {
        return Ok((0, 0, 0));
    };
    let at = continue_at(dir, state, ctx.world_size, h, train_len, steps_per_epoch)?;
    if ctx.rank == 0 {
        ctx.events
            .log(format!("resumed from {} at step {}", dir.display(), at.0));
    }
    Ok(at)
}

/// Where a resumed run continues: (step, first epoch, steps of that epoch already taken).
///
/// Every worker count trains on the same global order of an epoch, and global step i covers
/// its positions i·B..(i+1)·B whenever the workers' micro-batches add up to the global batch B
/// exactly (see `sampler`). So a run continues mid-epoch with the checkpoint's worker count or
/// any other that divides B (the optimizer state is whole in every checkpoint, ZeRO's too): the
/// new workers skip the positions the checkpoint's steps took. Only the positions trimmed at
/// an epoch's end (len % W) depend on the count.
fn continue_at(
    dir: &Path,
    state: &TrainerState,
    world: usize,
    h: &Hyper,
    train_len: usize,
    steps_per_epoch: u64,
) -> Result<(u64, u64, u64)> {
    let step = state.step;
    let same_batch = (state.global_batch_size, state.grad_accum)
        == (Some(h.global_batch_size), Some(h.grad_accum));
    let then = |v: Option<usize>| v.map_or("?".into(), |v| v.to_string());
    if !same_batch {
        bail!(
            "cannot resume from {}: it was trained with global batch {}, grad_accum {}; this job has global batch {}, grad_accum {}. Resume with the same values (or start a new run with the checkpoint as --model)",
            dir.display(),
            then(state.global_batch_size),
            then(state.grad_accum),
            h.global_batch_size,
            h.grad_accum
        );
    }
    let then_world = state.world_size.unwrap_or(world);
    if then_world == world {
        return Ok((step, step / steps_per_epoch, step % steps_per_epoch));
    }
    let accum = h.grad_accum.max(1);
    let then_per_epoch = steps_per_epoch_of(train_len, then_world, h.global_batch_size, accum);
    let (epoch, done) = (step / then_per_epoch, step % then_per_epoch);
    if done == 0 {
        return Ok((step, epoch, 0));
    }
    let b = h.global_batch_size;
    if let Some(w) = [then_world, world]
        .into_iter()
        .find(|&w| !b.is_multiple_of(w * accum))
    {
        bail!(
            "cannot resume from {} with {world} workers: it was written in the middle of an epoch by {then_world} workers, and global batch {b} does not split evenly over {w} workers x {accum} micro-batches, so the steps would not cover the same samples. Use a worker count that divides {b}, resume with {then_world} workers, or resume from a checkpoint written at the end of an epoch",
            dir.display()
        );
    }
    // The new sharding trims more of the epoch's end than the old one did: past its last step.
    if done >= steps_per_epoch {
        return Ok((step, epoch + 1, 0));
    }
    Ok((step, epoch, done))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::worker::train::plan::steps_per_epoch;
    use trainbook_api::OptimizerKind;

    fn hyper(global_batch: usize) -> Hyper {
        Hyper::new("test", 3, global_batch, 0.1, OptimizerKind::Sgd)
    }

    fn state(step: u64, world: Option<usize>, global_batch: usize, accum: usize) -> TrainerState {
        TrainerState {
            epoch: 0,
            step,
            world_size: world,
            global_batch_size: Some(global_batch),
            grad_accum: Some(accum),
            hyper: serde_json::Value::Null,
            metrics: Default::default(),
        }
    }

    /// Where a run of `world` workers resumes from `state`, on 100 samples.
    fn at(state: &TrainerState, world: usize, h: &Hyper) -> Result<(u64, u64, u64)> {
        let per_epoch = steps_per_epoch(100, world, h.global_batch_size, 1);
        continue_at(Path::new("ckpt"), state, world, h, 100, per_epoch)
    }

    #[test]
    fn the_same_worker_count_continues_at_the_same_step() {
        let h = hyper(16);
        // 2 workers x 8: 7 steps an epoch.
        assert_eq!(at(&state(10, Some(2), 16, 1), 2, &h).unwrap(), (10, 1, 3));
        assert_eq!(at(&state(14, Some(2), 16, 1), 2, &h).unwrap(), (14, 2, 0));
        // Checkpoints that do not say their worker count are taken as this run's.
        assert_eq!(at(&state(10, None, 16, 1), 4, &h).unwrap(), (10, 1, 3));
    }

    #[test]
    fn another_batch_cannot_resume() {
        let e = at(&state(10, Some(2), 32, 1), 2, &hyper(16)).unwrap_err();
        assert!(
            e.to_string()
                .contains("global batch 32, grad_accum 1; this job has global batch 16"),
            "{e}"
        );
        let e = at(&state(10, Some(2), 16, 2), 2, &hyper(16)).unwrap_err();
        assert!(e.to_string().contains("grad_accum 2"), "{e}");
    }

    #[test]
    fn another_worker_count_continues_mid_epoch_when_the_batch_splits_evenly() {
        let h = hyper(16);
        // Written by 4 workers (7 steps an epoch), 3 steps into epoch 1; 2 workers go on there.
        assert_eq!(at(&state(10, Some(4), 16, 1), 2, &h).unwrap(), (10, 1, 3));
        // 3 workers do not divide 16.
        let e = at(&state(10, Some(4), 16, 1), 3, &h).unwrap_err();
        assert!(
            e.to_string()
                .contains("does not split evenly over 3 workers"),
            "{e}"
        );
        // At an epoch's end any count goes on.
        assert_eq!(at(&state(14, Some(4), 16, 1), 3, &h).unwrap(), (14, 2, 0));
    }

    #[test]
    fn a_resume_past_the_new_epochs_last_step_starts_the_next_epoch() {
        // Written by 1 worker (7 steps an epoch) 6 steps into epoch 0; a sharding whose epochs
        // have 5 steps (it trims more of the epoch's end) has no step 6 in that epoch.
        let h = hyper(16);
        let state = state(6, Some(1), 16, 1);
        let s = continue_at(Path::new("ckpt"), &state, 2, &h, 100, 5).unwrap();
        assert_eq!(s, (6, 1, 0));
        let s = continue_at(Path::new("ckpt"), &state, 2, &h, 100, 7).unwrap();
        assert_eq!(s, (6, 0, 6));
    }
}
