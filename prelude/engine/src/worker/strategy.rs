//! How a step's gradients become new parameters on every rank: replicated (each rank
//! all-reduces the gradients and steps the whole optimizer, as PyTorch DDP) or sharded (ZeRO
//! stages 1, 2 and 3, [`crate::worker::zero`], [`crate::worker::units`]). The training loop sees one interface; the choice is `--zero`.

use anyhow::Result;
use tch::Tensor;

use crate::shared::tensor_files::TensorFiles;
use crate::worker::ddp::{self, GradSync};
use crate::worker::dist::ProcessGroup;
use crate::worker::optim::{Optimizer, OptimizerSettings};
use crate::worker::units::{self, SharedUnits};
use crate::worker::zero::ShardedOptimizer;

pub(crate) enum UpdateStrategy {
    Replicated { sync: GradSync, opt: Optimizer },
    Sharded(ShardedOptimizer),
}

impl UpdateStrategy {
    /// `params`: the trainable parameters by name (sorted the same way on every rank);
    /// `weight`: each rank's share of the global batch, which ZeRO-2 applies in the backward
    /// pass (the caller keeps `pg` alive as long as the strategy).
    pub(crate) fn new(
        cfg: OptimizerSettings,
        params: Vec<(String, Tensor)>,
        zero: u8,
        pg: &ProcessGroup,
        weight: f64,
        units: Option<SharedUnits>,
    ) -> Result<Self> {
        if let Some(units) = units {
            return Ok(UpdateStrategy::Sharded(ShardedOptimizer::over_units(
                cfg, params, pg, weight, units,
            )?));
        }
        if zero >= 1 {
            return Ok(UpdateStrategy::Sharded(ShardedOptimizer::new(
                cfg,
                params,
                pg,
                zero,
                weight,
                ddp::BUCKET_BYTES,
            )?));
        }
        // One worker has no gradients to exchange: no buckets to fill and copy back each step
        // (a gradient-sized buffer and two passes over it), as PyTorch without DDP.
        let tensors: Vec<Tensor> = if pg.world_size() > 1 {
            params.iter().map(|(_, t)| t.shallow_clone()).collect()
        } else {
            Vec::new()
        };
        Ok(UpdateStrategy::Replicated {
            sync: GradSync::new(&tensors, ddp::BUCKET_BYTES),
            opt: Optimizer::new(cfg, params),
        })
    }

    /// This rank's share of the next step's samples (`1 / world` but for an epoch's last
    /// step), for a reduction that runs during the backward pass (ZeRO-2).
    pub(crate) fn set_share(&mut self, share: f64) {
        if let UpdateStrategy::Sharded(z) = self {
            z.set_share(share);
        }
    }

    pub(crate) fn zero_grad(&mut self) {
        match self {
            UpdateStrategy::Replicated { opt, .. } => opt.zero_grad(),
            UpdateStrategy::Sharded(z) => z.zero_grad(),
        }
    }

    /// Restores the optimizer state of a checkpoint (whole state; ZeRO takes its shard).
    pub(crate) fn load(&mut self, stored: &TensorFiles) -> Result<()> {
        match self {
            UpdateStrategy::Replicated { opt, .. } => opt.load(stored),
            UpdateStrategy::Sharded(z) => z.load(stored),
        }
    }

    /// One optimizer step from this rank's gradients, `weight` being its share of the global
    /// batch; gradients clipped to a global norm of `clip` first.
    pub(crate) fn step(
        &mut self,
        pg: &ProcessGroup,
        weight: f64,
        clip: Option<f64>,
        lr: f64,
    ) -> Result<()> {
        match self {
            UpdateStrategy::Replicated { sync, opt } => {
                sync.sync(pg, weight)?;
                if let Some(c) = clip {
                    opt.clip_grad_norm(c);
                }
                opt.step(lr)
            }
            UpdateStrategy::Sharded(z) => z.step(pg, weight, clip, lr).map(|_| ()),
        }
    }

    /// Prepares the update for capture in a CUDA graph: the learning rate as the returned device
    /// scalar. One worker, plain data parallelism only (the spec's check refuses the rest).
    pub(crate) fn enter_graph(&mut self) -> Result<Tensor> {
        match self {
            UpdateStrategy::Replicated { opt, .. } => opt.enter_graph(),
            UpdateStrategy::Sharded(_) => {
                anyhow::bail!("a CUDA graph does not capture ZeRO's sharded update: use zero 0")
            }
        }
    }

    /// Counts an update that ran inside a replayed CUDA graph.
    pub(crate) fn count_replayed_step(&mut self) {
        if let UpdateStrategy::Replicated { opt, .. } = self {
            opt.count_replayed_step();
        }
    }

    /// The whole optimizer state for rank 0's checkpoint (other ranks get nothing). Under
    /// ZeRO a collective: every rank calls it at the same step.
    pub(crate) fn checkpoint_state(&mut self, pg: &ProcessGroup) -> Result<Vec<(String, Tensor)>> {
        let writer = pg.rank() == 0;
        match self {
            UpdateStrategy::Replicated { opt, .. } if writer => Ok(opt.named_state()),
            UpdateStrategy::Replicated { .. } => Ok(Vec::new()),
            UpdateStrategy::Sharded(z) => z.gather_state(pg, &|_| writer, writer),
        }
    }

    /// Under ZeRO: the optimizer state of the parameters `keep` names, and with `steps` the
    /// step count, for this rank's part of a sharded checkpoint (a collective).
    pub(crate) fn owned_state(
        &mut self,
        pg: &ProcessGroup,
        keep: &dyn Fn(&str) -> bool,
        steps: bool,
    ) -> Result<Vec<(String, Tensor)>> {
        match self {
            UpdateStrategy::Sharded(z) => z.gather_state(pg, keep, steps),
            UpdateStrategy::Replicated { .. } => {
                anyhow::bail!("a sharded checkpoint needs sharded parameters (ZeRO-3)")
            }
        }
    }

    /// Bytes of optimizer state and of communication buffers this rank holds.
    pub(crate) fn memory(&self) -> (u64, u64) {
        let buffers = match self {
            UpdateStrategy::Replicated { sync, .. } => sync.buffer_bytes(),
            UpdateStrategy::Sharded(z) => z.buffer_bytes(),
        };
        let state = match self {
            UpdateStrategy::Replicated { opt, .. } => opt.state_bytes(),
            UpdateStrategy::Sharded(z) => z.state_bytes(),
        };
        (state, buffers)
    }

    /// ZeRO-3's units, when the parameters are sharded.
    fn units(&self) -> Option<&SharedUnits> {
        match self {
            UpdateStrategy::Sharded(z) => z.units(),
            UpdateStrategy::Replicated { .. } => None,
        }
    }

    /// A pass over the model begins (a step, an evaluation): under ZeRO-3 the root's
    /// parameters are gathered.
    pub(crate) fn open(&self) -> Result<()> {
        self.units().map_or(Ok(()), |u| units::lock(u)?.open())
    }

    /// The pass has ended: under ZeRO-3 what it gathered is freed (a step frees after its update).
    pub(crate) fn close(&self) -> Result<()> {
        self.units().map_or(Ok(()), |u| units::lock(u)?.close())
    }

    /// Under ZeRO-3 every rank takes part in gathering the trained parameters (a LoRA
    /// checkpoint's adapters) for the rank that writes a checkpoint of only those (`keep`),
    /// which holds them until [`UpdateStrategy::close`].
    pub(crate) fn gather_trained(&self, keep: bool) -> Result<()> {
        self.units()
            .map_or(Ok(()), |u| units::lock(u)?.gather_trained(keep))
    }

    /// Under ZeRO-3: each unit gathered in turn on every rank, `f` given its variables' names
    /// while they are whole (a collective).
    pub(crate) fn visit_units(
        &self,
        f: &mut dyn FnMut(&[(&str, Tensor)]) -> Result<()>,
    ) -> Result<()> {
        self.units().map_or(Ok(()), |u| units::lock(u)?.visit(f))
    }

    /// The model whole again for good (after the last step; a collective under ZeRO-3).
    pub(crate) fn unshard(&self) -> Result<()> {
        self.units().map_or(Ok(()), units::deactivate)
    }

    /// Whether the parameters are sharded (ZeRO-3 on several workers): then every forward
    /// pass is a collective.
    pub(crate) fn shards_parameters(&self) -> bool {
        self.units().is_some()
    }

    /// Bytes of parameters this rank holds between steps, when they are sharded.
    pub(crate) fn held_parameters(&self) -> Option<u64> {
        self.units()
            .and_then(|u| units::lock(u).ok().map(|s| s.held_bytes()))
    }
}
