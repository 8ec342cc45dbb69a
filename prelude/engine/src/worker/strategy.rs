//! How a step's gradients become new parameters on every rank: replicated (each rank
//! all-reduces the gradients and steps the whole optimizer, as PyTorch DDP) or sharded (ZeRO
//! stage 1, [`crate::zero`]). The training loop sees one interface; the choice is `--zero`.

use std::path::Path;

use anyhow::Result;
use tch::Tensor;

use crate::ddp::{self, GradSync};
use crate::dist::ProcessGroup;
use crate::optim::{Optimizer, OptimizerConfig};
use crate::zero::ShardedOptimizer;

pub enum Update {
    Replicated { sync: GradSync, opt: Optimizer },
    Sharded(ShardedOptimizer),
}

impl Update {
    /// `params`: the trainable parameters by name (sorted the same way on every rank).
    pub fn new(
        cfg: OptimizerConfig,
        params: Vec<(String, Tensor)>,
        zero: u8,
        rank: usize,
        world: usize,
    ) -> Self {
        if zero >= 1 {
            return Update::Sharded(ShardedOptimizer::new(
                cfg,
                params,
                rank,
                world,
                ddp::BUCKET_BYTES,
            ));
        }
        let tensors: Vec<Tensor> = params.iter().map(|(_, t)| t.shallow_clone()).collect();
        Update::Replicated {
            sync: GradSync::new(&tensors, ddp::BUCKET_BYTES),
            opt: Optimizer::new(cfg, params),
        }
    }

    pub fn zero_grad(&mut self) {
        match self {
            Update::Replicated { opt, .. } => opt.zero_grad(),
            Update::Sharded(z) => z.zero_grad(),
        }
    }

    /// Restores the optimizer state of a checkpoint (whole state; ZeRO takes its shard).
    pub fn load(&mut self, path: &Path) -> Result<()> {
        match self {
            Update::Replicated { opt, .. } => opt.load(path),
            Update::Sharded(z) => z.load(path),
        }
    }

    /// One optimizer step from this rank's gradients, `weight` being its share of the global
    /// batch; gradients clipped to a global norm of `clip` first.
    pub fn step(
        &mut self,
        pg: &ProcessGroup,
        weight: f64,
        clip: Option<f64>,
        lr: f64,
    ) -> Result<()> {
        match self {
            Update::Replicated { sync, opt } => {
                sync.sync(pg, weight)?;
                if let Some(c) = clip {
                    opt.clip_grad_norm(c);
                }
                opt.step(lr)
            }
            Update::Sharded(z) => z.step(pg, weight, clip, lr).map(|_| ()),
        }
    }

    /// The whole optimizer state for rank 0's checkpoint (other ranks get nothing). Under
    /// ZeRO a collective: every rank calls it at the same step.
    pub fn checkpoint_state(&mut self, pg: &ProcessGroup) -> Result<Vec<(String, Tensor)>> {
        let writer = pg.rank() == 0;
        match self {
            Update::Replicated { opt, .. } if writer => Ok(opt.named_state()),
            Update::Replicated { .. } => Ok(Vec::new()),
            Update::Sharded(z) => z.gather_state(pg, writer),
        }
    }

    /// Bytes of optimizer state and of communication buffers this rank holds.
    pub fn memory(&self) -> (u64, u64) {
        let buffers = match self {
            Update::Replicated { sync, .. } => sync.buffer_bytes(),
            Update::Sharded(z) => z.buffer_bytes(),
        };
        let state = match self {
            Update::Replicated { opt, .. } => opt.state_bytes(),
            Update::Sharded(z) => z.state_bytes(),
        };
        (state, buffers)
    }
}
