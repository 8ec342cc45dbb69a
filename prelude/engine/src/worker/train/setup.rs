//! What a rank prepares before its first step: the batch layout, the optimizer's settings,
//! the recipe's variables in a fixed order (parameters and buffers), and its data shards.

use anyhow::{bail, Result};
use tch::Tensor;
use trainbook_api::{Hyper, OptimizerKind, Precision};

use super::WorkerContext;
use crate::worker::optim::OptimizerSettings;
use crate::worker::recipe::Recipe;
use crate::worker::sampler::{self, DistributedSampler};
use crate::worker::units::{SharedUnits, UnitStore};

/// Samples per forward pass on one worker, with a note when the global batch does not divide.
pub(super) fn local_batch(ctx: &WorkerContext, h: &Hyper) -> Result<usize> {
    let local_batch = h.local_batch(ctx.world_size)?;
    if ctx.rank == 0 {
        if let Some(note) = uneven_note(h, ctx.world_size, local_batch) {
            ctx.events.log(note);
        }
    }
    Ok(local_batch)
}

/// The note that says how a global batch that does not split over `world` workers and their
/// micro-batches is rounded down to `local_batch` samples a micro-batch.
fn uneven_note(h: &Hyper, world: usize, local_batch: usize) -> Option<String> {
    let accum = h.grad_accum.max(1);
    (!h.global_batch_size.is_multiple_of(world * accum)).then(|| format!(
        "note: global batch {} is not divisible by {world} workers x {accum} micro-batches; using {} per micro-batch ({} in all)",
        h.global_batch_size,
        local_batch,
        local_batch * world * accum
    ))
}

pub(super) fn optimizer_config(h: &Hyper) -> OptimizerSettings {
    OptimizerSettings {
        kind: h.optimizer,
        momentum: h.momentum,
        weight_decay: h.weight_decay,
        betas: (0.9, 0.999),
        // LAMB's and LANS's usual epsilon (NVIDIA's and Habana's BERT pre-training); the
        // torch default for the others.
        eps: match h.optimizer {
            OptimizerKind::Lamb | OptimizerKind::Lans => 1e-6,
            _ => 1e-8,
        },
    }
}

/// The recipe's variables in a fixed name order, so every rank lists them alike; those of a
/// layer built sharded are left out until its unit is captured (they have no values yet, and
/// every rank built or loaded its slice of them alike).
pub(super) fn ordered_vars(recipe: &dyn Recipe) -> Vec<Tensor> {
    let vars = recipe.vars().variables();
    let mut names: Vec<&String> = vars
        .keys()
        .filter(|n| !crate::worker::slices::is_built(n))
        .collect();
    names.sort();
    names.iter().map(|n| vars[*n].shallow_clone()).collect()
}

/// The trainable parameters, by name in name order, for the update strategy.
pub(super) fn trainable_named(recipe: &dyn Recipe) -> Vec<(String, Tensor)> {
    let vars = recipe.vars().variables();
    let mut named: Vec<(String, Tensor)> = vars
        .iter()
        .filter(|(_, t)| t.requires_grad())
        .map(|(n, t)| (n.clone(), t.shallow_clone()))
        .collect();
    named.sort_by(|a, b| a.0.cmp(&b.0));
    named
}

/// ZeRO-3's units over the recipe's variables (`zero 3` on several workers): every trained
/// variable, and the frozen ones too where they never change (a LoRA base; batch-norm
/// statistics stay whole on every rank).
pub(super) fn units(
    ctx: &WorkerContext,
    h: &Hyper,
    recipe: &dyn Recipe,
    trainable: &[(String, Tensor)],
) -> Result<Option<SharedUnits>> {
    if h.zero < 3 || ctx.world_size < 2 {
        return Ok(None);
    }
    let frozen_too = !recipe.buffers_change();
    let vars = recipe.vars().variables();
    let mut named: Vec<(String, Tensor)> = vars
        .into_iter()
        .filter(|(_, t)| frozen_too || t.requires_grad())
        .collect();
    named.sort_by(|a, b| a.0.cmp(&b.0));
    let names: Vec<String> = trainable.iter().map(|(n, _)| n.clone()).collect();
    // Under bf16 the gathered copies of fp32 parameters are bf16 (the fp32 masters stay in
    // the shards), as FSDP's mixed precision: gathers move half the bytes. Not for a partly
    // frozen model: its frozen base is held in bf16 already, and its trained part (LoRA's
    // adapters) is small and checkpointed from the gathered parameters.
    let partly_frozen = named.len() > names.len();
    let compute = (h.precision == Precision::Bf16 && !partly_frozen).then_some(tch::Kind::BFloat16);
    let store = UnitStore::new(named, &names, &ctx.pg, compute)?;
    Ok(Some(std::sync::Arc::new(std::sync::Mutex::new(store))))
}

/// The recipe's variables, each kind in name order.
pub(super) struct Params {
    pub(super) trainable: Vec<Tensor>,
    /// Batch-norm running statistics and the like: rank 0's are broadcast before evaluation.
    /// None when they do not change in training (a frozen model such as LoRA's base is the
    /// same everywhere from the start broadcast on).
    pub(super) buffers: Vec<Tensor>,
}

impl Params {
    pub(super) fn of(recipe: &dyn Recipe) -> Params {
        let (trainable, mut buffers): (Vec<Tensor>, Vec<Tensor>) = ordered_vars(recipe)
            .into_iter()
            .partition(|t| t.requires_grad());
        if !recipe.buffers_change() {
            buffers.clear();
        }
        Params { trainable, buffers }
    }
}

/// What one rank reads: its shard of each epoch's training order, and its disjoint part of
/// the evaluation set.
pub(super) struct Shards {
    pub(super) sampler: DistributedSampler,
    pub(super) eval: Vec<usize>,
}

impl Shards {
    /// Rank `rank`'s shards of `recipe`'s data over `world` ranks, shuffled with `seed`.
    pub(super) fn new(recipe: &dyn Recipe, rank: usize, world: usize, seed: u64) -> Result<Shards> {
        let sampler = DistributedSampler::new(recipe.train_len(), rank, world, seed, true);
        if sampler.len() < world {
            bail!(
                "the training set has {} samples, fewer than the {world} workers",
                recipe.train_len()
            );
        }
        Ok(Shards {
            sampler,
            eval: sampler::eval_shard(recipe.eval_len(), rank, world),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::worker::recipe::{Split, Step};
    use tch::nn;

    /// A recipe of variables only: `w` and `a` trained, `stats` not.
    struct Vars {
        vs: nn::VarStore,
        train_len: usize,
        buffers_change: bool,
    }

    impl Vars {
        fn new(train_len: usize, buffers_change: bool) -> Vars {
            let vs = nn::VarStore::new(tch::Device::Cpu);
            let root = vs.root();
            let _ = root.zeros("w", &[2]);
            let _ = root.zeros_no_train("stats", &[3]);
            let _ = root.zeros("a", &[1]);
            Vars {
                vs,
                train_len,
                buffers_change,
            }
        }
    }

    impl Recipe for Vars {
        fn vars(&self) -> &nn::VarStore {
            &self.vs
        }
        fn vars_mut(&mut self) -> &mut nn::VarStore {
            &mut self.vs
        }
        fn train_len(&self) -> usize {
            self.train_len
        }
        fn eval_len(&self) -> usize {
            10
        }
        fn step(&self, _: Split, _: &[usize], _: bool) -> Result<Step> {
            unreachable!()
        }
        fn buffers_change(&self) -> bool {
            self.buffers_change
        }
    }

    #[test]
    fn variables_are_listed_in_name_order() {
        let r = Vars::new(8, true);
        let sizes = |ts: &[Tensor]| ts.iter().map(|t| t.size()).collect::<Vec<_>>();
        assert_eq!(sizes(&ordered_vars(&r)), [vec![1], vec![3], vec![2]]);
        let names: Vec<String> = trainable_named(&r).into_iter().map(|(n, _)| n).collect();
        assert_eq!(names, ["a", "w"]);
        let p = Params::of(&r);
        assert_eq!(sizes(&p.trainable), [vec![1], vec![2]]);
        assert_eq!(sizes(&p.buffers), [vec![3]]);
        assert!(Params::of(&Vars::new(8, false)).buffers.is_empty());
    }

    #[test]
    fn every_rank_needs_a_training_sample() {
        let r = Vars::new(3, true);
        let s = Shards::new(&r, 1, 2, 0).unwrap();
        assert_eq!(s.eval, sampler::eval_shard(10, 1, 2));
        let e = Shards::new(&r, 0, 4, 0).err().unwrap();
        assert_eq!(
            e.to_string(),
            "the training set has 3 samples, fewer than the 4 workers"
        );
    }

    #[test]
    fn an_uneven_global_batch_is_rounded_down_with_a_note() {
        let mut h = Hyper::new("test", 1, 32, 0.1, OptimizerKind::Lamb);
        assert_eq!(uneven_note(&h, 4, 8), None);
        h.grad_accum = 3;
        assert_eq!(
            uneven_note(&h, 2, 5).as_deref(),
            Some("note: global batch 32 is not divisible by 2 workers x 3 micro-batches; using 5 per micro-batch (30 in all)")
        );
        assert_eq!(optimizer_config(&h).eps, 1e-6);
        h.optimizer = OptimizerKind::Adamw;
        assert_eq!(optimizer_config(&h).eps, 1e-8);
    }
}
