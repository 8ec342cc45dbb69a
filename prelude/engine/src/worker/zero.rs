//! ZeRO stage 1: each rank keeps the optimizer state of only 1/W of the parameters.
//!
//! Plain data parallelism gives every rank the whole optimizer state (AdamW: two tensors the
//! size of the model), which caps the model a device can train. Here the gradient buckets of
//! [`crate::worker::ddp`] are cut into W equal shards: a reduce-scatter leaves rank r the summed
//! gradient of shard r only, rank r updates that shard of the parameters (and holds its
//! optimizer state), and an all-gather gives every rank the new parameters. The traffic is the
//! all-reduce's (an all-reduce is a reduce-scatter followed by an all-gather), and the
//! optimizer's work per rank drops to 1/W.
//!
//! Shards are flat element ranges, so one parameter can be split between ranks: each rank
//! steps the *pieces* it owns ([`crate::worker::optim::Piece`]). Element-wise optimizers (SGD, AdamW)
//! need nothing more; LAMB's and LANS's per-tensor norms add up the pieces' partial sums in one
//! small all-reduce. Checkpoints hold the whole state, gathered from the shards in the
//! replicated layout, so they resume with any worker count and with or without ZeRO.

use std::collections::VecDeque;

use anyhow::Result;
use tch::{Kind, Tensor};

use crate::worker::ddp::{self, BucketPlan};
use crate::worker::device::OnDeviceOf;
use crate::worker::dist::{ProcessGroup, ReduceOp, Work};
use crate::worker::optim::{Optimizer, OptimizerConfig, Piece};

/// Collectives in flight at once: the next bucket is packed while the previous one travels,
/// as [`ddp::GradSync`] does, without queueing every bucket's buffers at once.
const IN_FLIGHT: usize = 2;

struct Shard {
    slots: BucketPlan,
    /// Gradients going into the reduce-scatter, then parameters coming out of the all-gather.
    flat: Tensor,
    /// This rank's summed gradient shard.
    grad: Tensor,
    /// This rank's parameter shard, which the optimizer updates.
    param: Tensor,
    /// (parameter, offset in the parameter, offset in the shard, elements) of each piece.
    pieces: Vec<(usize, i64, i64, i64)>,
    /// The optimizer over this rank's pieces of the bucket (a parameter lies in one bucket, so
    /// LAMB's per-tensor norms never span two), and their gradients (views of `grad`).
    opt: Optimizer,
    grads: Vec<Tensor>,
}

pub(crate) struct ShardedOptimizer {
    names: Vec<String>,
    params: Vec<Tensor>,
    shards: Vec<Shard>,
}

impl ShardedOptimizer {
    /// `params`: the trainable parameters by name, in the same order on every rank.
    pub(crate) fn new(
        cfg: OptimizerConfig,
        params: Vec<(String, Tensor)>,
        rank: usize,
        world: usize,
        bucket_bytes: usize,
    ) -> Self {
        let (names, params): (Vec<String>, Vec<Tensor>) = params.into_iter().unzip();
        // Ranks without a piece in a bucket still join LAMB's norm all-reduces on the device.
        let home = params
            .first()
            .map(|p| p.zeros_on_device(&[1], Kind::Float))
            .unwrap_or_else(|| Tensor::zeros([1], (Kind::Float, tch::Device::Cpu)));
        let mut shards = Vec::new();
        for slots in ddp::plan_buckets(&params, bucket_bytes) {
            let first = &params[slots[0].0];
            let kind = first.kind();
            // Elements per rank: the flat bucket holds `world * len`, padded with zeros.
            let len = (ddp::plan_len(&slots) + world as i64 - 1) / world as i64;
            let (grad, param) = (
                first.zeros_on_device(&[len], kind),
                first.zeros_on_device(&[len], kind),
            );
            let pieces = pieces_of(&slots, rank as i64 * len, len);
            let (mut named, mut grads) = (Vec::new(), Vec::new());
            for &(i, in_param, in_shard, n) in &pieces {
                let piece = Piece {
                    param: i,
                    offset: in_param,
                    shape: params[i].size(),
                    decays: params[i].dim() >= 2,
                };
                named.push((names[i].clone(), param.narrow(0, in_shard, n), piece));
                grads.push(grad.narrow(0, in_shard, n));
            }
            shards.push(Shard {
                flat: first.zeros_on_device(&[len * world as i64], kind),
                grad,
                param,
                pieces,
                slots,
                opt: Optimizer::for_pieces(cfg, params.len(), home.shallow_clone(), named),
                grads,
            });
        }
        Self {
            names,
            params,
            shards,
        }
    }

    /// Bytes of optimizer state this rank holds.
    pub(crate) fn state_bytes(&self) -> u64 {
        self.shards.iter().map(|s| s.opt.state_bytes()).sum()
    }

    /// Restores this rank's part of a checkpoint's whole optimizer state.
    pub(crate) fn load(&mut self, path: &std::path::Path) -> Result<()> {
        self.shards.iter_mut().try_for_each(|s| s.opt.load(path))
    }

    pub(crate) fn zero_grad(&mut self) {
        for p in &self.params {
            let mut g = p.grad();
            if g.defined() {
                let _ = g.detach_().zero_();
            }
        }
    }

    /// Bytes of the flat buckets and this rank's gradient and parameter shards.
    pub(crate) fn buffer_bytes(&self) -> u64 {
        self.shards
            .iter()
            .map(|s| {
                (s.flat.numel() + s.grad.numel() + s.param.numel()) as u64
                    * s.flat.kind().elt_size_in_bytes() as u64
            })
            .sum()
    }

    /// One optimizer step from this rank's gradients: reduce-scatter (each rank's gradient
    /// scaled by `weight`, its share of the global batch), clip the global norm to `clip`,
    /// update this rank's shard, all-gather the parameters. Returns the gradient norm
    /// before clipping when clipping.
    pub(crate) fn step(
        &mut self,
        pg: &ProcessGroup,
        weight: f64,
        clip: Option<f64>,
        lr: f64,
    ) -> Result<Option<f64>> {
        tch::no_grad(|| -> Result<Option<f64>> {
            self.reduce_scatter(pg, weight)?;
            let norm = match clip {
                Some(max) => Some(self.clip(pg, max)?),
                None => None,
            };
            self.update_and_allgather(pg, lr)?;
            Ok(norm)
        })
    }

    fn reduce_scatter(&mut self, pg: &ProcessGroup, weight: f64) -> Result<()> {
        let mut flight: VecDeque<Work> = VecDeque::new();
        for s in &mut self.shards {
            for &(i, off, n) in &s.slots {
                let g = self.params[i].grad();
                if !g.defined() {
                    return Err(ddp::missing_gradient(i, &self.params[i]));
                }
                s.flat.narrow(0, off, n).copy_(&g.reshape([-1]));
            }
            let used = ddp::plan_len(&s.slots);
            let _ = s.flat.narrow(0, used, s.flat.numel() as i64 - used).zero_();
            if weight != 1.0 {
                let _ = s.flat.g_mul_scalar_(weight);
            }
            flight.push_back(pg.reduce_scatter_start(&s.grad, &s.flat)?);
            if flight.len() >= IN_FLIGHT {
                flight.pop_front().map(Work::wait).transpose()?;
            }
        }
        flight.into_iter().try_for_each(Work::wait)
    }

    /// `torch.nn.utils.clip_grad_norm_` over the sharded gradient: each rank's squares, summed
    /// over ranks (the padding is zero).
    fn clip(&mut self, pg: &ProcessGroup, max: f64) -> Result<f64> {
        let mut sq = Tensor::from(0.0f64);
        for s in &self.shards {
            sq += s
                .grad
                .to_kind(Kind::Float)
                .square()
                .sum(Kind::Double)
                .to_device(tch::Device::Cpu);
        }
        pg.allreduce(&[&sq], ReduceOp::Sum)?;
        let norm = sq.double_value(&[]).sqrt();
        let scale = max / (norm + 1e-6);
        if scale < 1.0 {
            for s in &mut self.shards {
                let _ = s.grad.g_mul_scalar_(scale);
            }
        }
        Ok(norm)
    }

    /// Updates each bucket's shard and all-gathers it while the next bucket's shard is
    /// updated (two all-gathers in flight).
    fn update_and_allgather(&mut self, pg: &ProcessGroup, lr: f64) -> Result<()> {
        let sum = |t: &Tensor| pg.allreduce(&[t], ReduceOp::Sum);
        let mut flight: VecDeque<(usize, Work)> = VecDeque::new();
        for b in 0..self.shards.len() {
            let s = &mut self.shards[b];
            // The optimizer steps the parameters as they are now (a resume or a broadcast may
            // have changed them since the last all-gather).
            for &(i, in_param, in_shard, n) in &s.pieces {
                s.param
                    .narrow(0, in_shard, n)
                    .copy_(&self.params[i].reshape([-1]).narrow(0, in_param, n));
            }
            s.opt.step_with(lr, &s.grads, Some(&sum))?;
            flight.push_back((b, pg.allgather_start(&s.flat, &s.param)?));
            if flight.len() >= IN_FLIGHT {
                if let Some((done, w)) = flight.pop_front() {
                    w.wait()?;
                    self.unpack(done);
                }
            }
        }
        for (done, w) in flight {
            w.wait()?;
            self.unpack(done);
        }
        Ok(())
    }

    fn unpack(&self, b: usize) {
        let s = &self.shards[b];
        for &(i, off, n) in &s.slots {
            self.params[i]
                .shallow_clone()
                .view([-1])
                .copy_(&s.flat.narrow(0, off, n));
        }
    }

    /// The whole optimizer state in the replicated layout (`Optimizer::named_state`), gathered
    /// from every rank's shard: a collective, so every rank calls it. Only the rank that writes
    /// the checkpoint (`keep`) copies the state out of the buckets; the others return nothing,
    /// so a checkpoint costs them no more than a step's buffers.
    pub(crate) fn gather_state(
        &mut self,
        pg: &ProcessGroup,
        keep: bool,
    ) -> Result<Vec<(String, Tensor)>> {
        tch::no_grad(|| {
            let steps = self.shards.first().map_or(0, |s| s.opt.steps());
            let mut out = vec![("steps".to_string(), Tensor::from(steps as i64))];
            let suffixes = self.shards.first().map_or(&[][..], |s| s.opt.suffixes());
            for (slot, suffix) in suffixes.iter().enumerate() {
                for s in &mut self.shards {
                    // The gradient shard is free between steps: it stages this rank's state.
                    let _ = s.grad.zero_();
                    for (&(_, _, in_shard, n), t) in s.pieces.iter().zip(s.opt.state_of(slot)) {
                        s.grad.narrow(0, in_shard, n).copy_(t);
                    }
                    pg.allgather_start(&s.flat, &s.grad)?.wait()?;
                    if !keep {
                        continue;
                    }
                    for &(i, off, n) in &s.slots {
                        out.push((
                            format!("{}.{suffix}", self.names[i]),
                            s.flat
                                .narrow(0, off, n)
                                .view(self.params[i].size().as_slice())
                                .copy(),
                        ));
                    }
                }
            }
            // The flat buckets now hold state, not parameters; nothing reads them before the
            // next step packs gradients into them.
            if !keep {
                out.clear();
            }
            Ok(out)
        })
    }
}

/// The pieces of a bucket's parameters within elements `[start, start + len)`: (parameter,
/// offset in the parameter, offset in the shard, elements).
fn pieces_of(slots: &BucketPlan, start: i64, len: i64) -> Vec<(usize, i64, i64, i64)> {
    let end = start + len;
    slots
        .iter()
        .filter_map(|&(i, off, n)| {
            let (lo, hi) = (off.max(start), (off + n).min(end));
            (lo < hi).then_some((i, lo - off, lo - start, hi - lo))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shards_cut_parameters_into_pieces_that_cover_each_once() {
        // Parameters of 5, 3 and 4 elements in one bucket of 12, over 5 ranks of 3 (padded
        // to 15).
        let slots = vec![(0, 0, 5), (1, 5, 3), (2, 8, 4)];
        let per_rank: Vec<_> = (0..5).map(|r| pieces_of(&slots, r * 3, 3)).collect();
        assert_eq!(per_rank[0], vec![(0, 0, 0, 3)]);
        assert_eq!(per_rank[1], vec![(0, 3, 0, 2), (1, 0, 2, 1)]);
        assert_eq!(per_rank[2], vec![(1, 1, 0, 2), (2, 0, 2, 1)]);
        assert_eq!(per_rank[3], vec![(2, 1, 0, 3)]);
        assert_eq!(per_rank[4], vec![], "the last rank holds only padding");
        for (i, n) in [(0, 5), (1, 3), (2, 4)] {
            let covered: i64 = per_rank
                .iter()
                .flatten()
                .filter(|p| p.0 == i)
                .map(|p| p.3)
                .sum();
            assert_eq!(covered, n, "parameter {i}");
        }
    }
}
