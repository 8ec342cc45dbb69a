//! ZeRO stages 1 and 2: each rank keeps the optimizer state of only 1/W of the parameters
//! (stage 1), and also only 1/W of the gradients (stage 2).
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
//!
//! Stage 2 starts the reduce-scatters during the backward pass ([`Reducer`]): a hook on each
//! parameter copies its gradient into its bucket the moment autograd has it, then drops the
//! parameter-sized gradient; a full bucket is reduce-scattered at once and freed when done.
//! Buckets are laid out in reverse parameter order, the order in which the backward pass
//! produces gradients, and always launched in bucket order, so every rank issues the same
//! collectives in the same order. What a rank holds of the gradients is its shards plus the
//! buckets in flight, instead of the whole model's gradients plus their flat copy.

use std::collections::VecDeque;
use std::os::raw::c_void;
use std::sync::{Arc, Mutex};

use anyhow::{anyhow, Result};
use tch::{Kind, Tensor};

use crate::shared::tensor_files::TensorFiles;
use crate::worker::ddp::{self, BucketPlan};
use crate::worker::device::OnDeviceOf;
use crate::worker::dist::{ProcessGroup, ReduceOp, Work};
use crate::worker::grad_hooks::TakeGradHook;
use crate::worker::optim::{Optimizer, OptimizerSettings, Piece};
use crate::worker::units::{self, SharedUnits};

/// Collectives in flight at once: the next bucket is packed while the previous one travels,
/// as [`ddp::GradSync`] does, without queueing every bucket's buffers at once.
pub(crate) const IN_FLIGHT: usize = 2;

struct Shard {
    slots: BucketPlan,
    /// Elements of the flat bucket that carries the gradients into the reduce-scatter and
    /// the parameters out of the all-gather (`world` times the shard's, padding included):
    /// made when needed and freed after, so a rank never holds all of them at once.
    flat_len: i64,
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
    /// Stage 2: the reduction that runs in the backward pass, and the hooks that feed it
    /// (declared first: dropped before the reducer they point to).
    hooks: Vec<TakeGradHook>,
    reducer: Option<Arc<Mutex<Reducer>>>,
    /// Stage 3: the sharded parameters themselves, gathered unit by unit.
    units: Option<SharedUnits>,
}

impl ShardedOptimizer {
    /// `params`: the trainable parameters by name, in the same order on every rank. Stage 2
    /// registers its gradient hooks on them, which reduce through `pg` (the caller keeps `pg`
    /// alive as long as this optimizer) with each rank's gradient scaled by `weight`.
    pub(crate) fn new(
        cfg: OptimizerSettings,
        params: Vec<(String, Tensor)>,
        pg: &ProcessGroup,
        stage: u8,
        weight: f64,
        bucket_bytes: usize,
    ) -> Result<Self> {
        let tensors: Vec<Tensor> = params.iter().map(|(_, t)| t.shallow_clone()).collect();
        let layout = bucket_plan(&tensors, stage, bucket_bytes)
            .into_iter()
            .map(|slots| (slots, None))
            .collect();
        let mut z = Self::build(cfg, params, pg, layout);
        if stage >= 2 {
            z.reduce_in_backward(pg, weight)?;
        }
        Ok(z)
    }

    /// Stage 3: the buckets are `units`' trained groups and their shards are the units'
    /// shards, which the update steps in place; the gradients are reduce-scattered in the
    /// backward pass as in stage 2.
    pub(crate) fn over_units(
        cfg: OptimizerSettings,
        params: Vec<(String, Tensor)>,
        pg: &ProcessGroup,
        weight: f64,
        units: SharedUnits,
    ) -> Result<Self> {
        let layout = units::lock(&units)?
            .trained_layout()
            .into_iter()
            .map(|(slots, shard)| (slots, Some(shard)))
            .collect();
        let mut z = Self::build(cfg, params, pg, layout);
        z.reduce_in_backward(pg, weight)?;
        z.units = Some(units);
        Ok(z)
    }

    /// The shards of `layout`'s buckets (each with its parameter shard when the caller owns
    /// it, else a new one), and an optimizer over each.
    fn build(
        cfg: OptimizerSettings,
        params: Vec<(String, Tensor)>,
        pg: &ProcessGroup,
        layout: Vec<(BucketPlan, Option<Tensor>)>,
    ) -> Self {
        let (rank, world) = (pg.rank(), pg.world_size());
        let (names, params): (Vec<String>, Vec<Tensor>) = params.into_iter().unzip();
        // Ranks without a piece in a bucket still join LAMB's norm all-reduces on the device.
        let home = params
            .first()
            .map(|p| p.zeros_on_device(&[1], Kind::Float))
            .unwrap_or_else(|| Tensor::zeros([1], (Kind::Float, tch::Device::Cpu)));
        let mut shards = Vec::new();
        for (slots, given) in layout {
            let first = &params[slots[0].0];
            // Gradients are reduced, and the optimizer steps, in the master's dtype (fp32
            // under ZeRO-3's bf16 gathers, whose parameters are bf16).
            let kind = given.as_ref().map_or(first.kind(), Tensor::kind);
            // Elements per rank: the flat bucket holds `world * len`, padded with zeros.
            let len = (ddp::plan_len(&slots) + world as i64 - 1) / world as i64;
            let grad = first.zeros_on_device(&[len], kind);
            let param = given.unwrap_or_else(|| first.zeros_on_device(&[len], kind));
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
                flat_len: len * world as i64,
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
            hooks: Vec::new(),
            reducer: None,
            units: None,
        }
    }

    /// Stage 2: the reducer over this optimizer's buckets and gradient shards, and a hook on
    /// every parameter that feeds it.
    fn reduce_in_backward(&mut self, pg: &ProcessGroup, weight: f64) -> Result<()> {
        let mut slot_of = vec![(0, 0, 0); self.params.len()];
        let mut buckets = Vec::new();
        for (b, s) in self.shards.iter().enumerate() {
            for &(i, off, n) in &s.slots {
                slot_of[i] = (b, off, n);
            }
            buckets.push(ReduceBucket {
                like: s.grad.shallow_clone(),
                flat_len: s.flat_len,
                slots: s.slots.len(),
                pending: s.slots.len(),
                flat: None,
                grad: s.grad.shallow_clone(),
                fresh: true,
            });
        }
        let reducer = Arc::new(Mutex::new(Reducer {
            pg: pg as *const ProcessGroup,
            weight,
            params: self.params.iter().map(Tensor::shallow_clone).collect(),
            seen: vec![false; slot_of.len()],
            slot_of,
            buckets,
            next: 0,
            flight: VecDeque::new(),
            error: None,
        }));
        let ctx = Arc::as_ptr(&reducer) as *mut c_void;
        for (i, p) in self.params.iter().enumerate() {
            // SAFETY: the reducer outlives the hooks (`hooks` is dropped first, and unregisters).
            self.hooks
                .push(unsafe { TakeGradHook::register(p, on_grad, ctx, i)? });
        }
        self.reducer = Some(reducer);
        Ok(())
    }

    /// Bytes of optimizer state this rank holds.
    pub(crate) fn state_bytes(&self) -> u64 {
        self.shards.iter().map(|s| s.opt.state_bytes()).sum()
    }

    /// Restores this rank's part of a checkpoint's whole optimizer state.
    pub(crate) fn load(&mut self, stored: &TensorFiles) -> Result<()> {
        self.shards.iter_mut().try_for_each(|s| s.opt.load(stored))
    }

    /// Stage 2: this rank's share of the next step's samples, which its gradient is scaled by
    /// as the hooks reduce it (stage 1 is given it with the step).
    pub(crate) fn set_share(&mut self, share: f64) {
        if let Some(r) = &self.reducer {
            if let Ok(mut r) = r.lock() {
                r.weight = share;
            }
        }
    }

    pub(crate) fn zero_grad(&mut self) {
        if let Some(r) = &self.reducer {
            r.lock().map_err(|_| ()).map(|mut r| r.new_step()).ok();
        }
        for p in &self.params {
            let mut g = p.grad();
            if g.defined() {
                let _ = g.detach_().zero_();
            }
        }
    }

    /// Bytes of this rank's gradient and parameter shards (the flat buckets live only while
    /// they travel).
    pub(crate) fn buffer_bytes(&self) -> u64 {
        // Stage 3's parameter shards are the parameters themselves (counted as such).
        let param_shards = self.units.is_none() as usize;
        self.shards
            .iter()
            .map(|s| {
                (s.grad.numel() + param_shards * s.param.numel()) as u64
                    * s.grad.kind().elt_size_in_bytes() as u64
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
            match &self.reducer {
                Some(r) => r
                    .lock()
                    .map_err(|_| anyhow!("a gradient hook panicked"))?
                    .finish()?,
                None => self.reduce_scatter(pg, weight)?,
            }
            let norm = match clip {
                Some(max) => Some(self.clip(pg, max)?),
                None => None,
            };
            match self.units.clone() {
                Some(units) => {
                    self.update_shards(pg, lr)?;
                    units::lock(&units)?.close()?;
                }
                None => self.update_and_allgather(pg, lr)?,
            }
            Ok(norm)
        })
    }

    fn reduce_scatter(&mut self, pg: &ProcessGroup, weight: f64) -> Result<()> {
        let mut flight: VecDeque<(Work, Tensor)> = VecDeque::new();
        for s in &mut self.shards {
            let mut flat = s.flat_buffer();
            for &(i, off, n) in &s.slots {
                let g = self.params[i].grad();
                if !g.defined() {
                    return Err(ddp::missing_gradient(i, &self.params[i]));
                }
                flat.narrow(0, off, n).copy_(&g.reshape([-1]));
            }
            let used = ddp::plan_len(&s.slots);
            let _ = flat.narrow(0, used, s.flat_len - used).zero_();
            if weight != 1.0 {
                let _ = flat.g_mul_scalar_(weight);
            }
            flight.push_back((pg.reduce_scatter_start(&s.grad, &flat)?, flat));
            if flight.len() >= IN_FLIGHT {
                flight.pop_front().map(|(w, _)| w.wait()).transpose()?;
            }
        }
        flight.into_iter().try_for_each(|(w, _)| w.wait())
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
        let mut flight: VecDeque<(usize, Work, Tensor)> = VecDeque::new();
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
            let flat = s.flat_buffer();
            flight.push_back((b, pg.allgather_start(&flat, &s.param)?, flat));
            if flight.len() >= IN_FLIGHT {
                if let Some((done, w, flat)) = flight.pop_front() {
                    w.wait()?;
                    self.unpack(done, &flat);
                }
            }
        }
        for (done, w, flat) in flight {
            w.wait()?;
            self.unpack(done, &flat);
        }
        Ok(())
    }

    /// Stage 3: each shard is the parameters' truth; updated in place, gathered by the units
    /// when next needed.
    fn update_shards(&mut self, pg: &ProcessGroup, lr: f64) -> Result<()> {
        let sum = |t: &Tensor| pg.allreduce(&[t], ReduceOp::Sum);
        for s in &mut self.shards {
            s.opt.step_with(lr, &s.grads, Some(&sum))?;
        }
        Ok(())
    }

    /// Stage 3's units, when this optimizer steps them.
    pub(crate) fn units(&self) -> Option<&SharedUnits> {
        self.units.as_ref()
    }

    fn unpack(&self, b: usize, flat: &Tensor) {
        for &(i, off, n) in &self.shards[b].slots {
            let shape = self.params[i].size();
            self.params[i]
                .shallow_clone()
                .copy_(&flat.narrow(0, off, n).view(shape.as_slice()));
        }
    }

    /// The optimizer state in the replicated layout (`Optimizer::named_state`), gathered from
    /// every rank's shard: a collective, so every rank calls it. A rank copies out of the
    /// buckets only the state of the parameters `keep` names (and the step count with
    /// `steps`): the rank that writes a whole checkpoint keeps all, the others none, and each
    /// rank of a sharded checkpoint the state it writes; a bucket at a time, so a checkpoint
    /// costs no more device memory than a step's buffers.
    pub(crate) fn gather_state(
        &mut self,
        pg: &ProcessGroup,
        keep: &dyn Fn(&str) -> bool,
        steps: bool,
    ) -> Result<Vec<(String, Tensor)>> {
        tch::no_grad(|| {
            let count = self.shards.first().map_or(0, |s| s.opt.steps());
            let mut out = Vec::new();
            if steps {
                out.push(("steps".to_string(), Tensor::from(count as i64)));
            }
            let suffixes = self.shards.first().map_or(&[][..], |s| s.opt.suffixes());
            for (slot, suffix) in suffixes.iter().enumerate() {
                for s in &mut self.shards {
                    // The gradient shard is free between steps: it stages this rank's state.
                    let _ = s.grad.zero_();
                    for (&(_, _, in_shard, n), t) in s.pieces.iter().zip(s.opt.state_of(slot)) {
                        s.grad.narrow(0, in_shard, n).copy_(t);
                    }
                    let flat = s.flat_buffer();
                    pg.allgather_start(&flat, &s.grad)?.wait()?;
                    // Into host memory bucket by bucket: the device never holds more than
                    // one gathered bucket (a fresh one each time, so on CPU the pieces can
                    // stay views of it).
                    for &(i, off, n) in s.slots.iter().filter(|&&(i, _, _)| keep(&self.names[i])) {
                        out.push((
                            format!("{}.{suffix}", self.names[i]),
                            flat.narrow(0, off, n)
                                .view(self.params[i].size().as_slice())
                                .to_device(tch::Device::Cpu),
                        ));
                    }
                }
            }
            // The flat buckets now hold state, not parameters; nothing reads them before the
            // next step packs gradients into them.
            Ok(out)
        })
    }
}

impl Shard {
    /// A new flat bucket of zeros, next to the shard.
    fn flat_buffer(&self) -> Tensor {
        device_zeros(&self.grad, self.flat_len)
    }
}

/// `n` zeros of `like`'s dtype on `like`'s device, made there (no host buffer and copy per
/// step; tch cannot name every device, so the shape comes from `like` itself).
fn device_zeros(like: &Tensor, n: i64) -> Tensor {
    like.reshape([-1])
        .narrow(0, 0, 1)
        .zeros_like()
        .expand([n], false)
        .contiguous()
}

/// The buckets of `params`: in parameter order (stage 1, as DDP's), or in reverse parameter
/// order (stage 2), the order in which the backward pass completes them.
fn bucket_plan(params: &[Tensor], stage: u8, bucket_bytes: usize) -> Vec<BucketPlan> {
    if stage < 2 {
        return ddp::plan_buckets(params, bucket_bytes);
    }
    let last = params.len().saturating_sub(1);
    let reversed: Vec<Tensor> = params.iter().rev().map(Tensor::shallow_clone).collect();
    ddp::plan_buckets(&reversed, bucket_bytes)
        .into_iter()
        .map(|slots| {
            slots
                .into_iter()
                .map(|(i, off, n)| (last - i, off, n))
                .collect()
        })
        .collect()
}

/// One bucket of the stage-2 reduction.
struct ReduceBucket {
    /// The bucket's gradient shard: where its buffers are made, in its dtype.
    like: Tensor,
    flat_len: i64,
    /// Parameters in the bucket, and how many of them this backward pass has still to deliver.
    slots: usize,
    pending: usize,
    /// The bucket being filled, made at its first gradient.
    flat: Option<Tensor>,
    /// This rank's gradient shard (shared with the optimizer's [`Shard`]).
    grad: Tensor,
    /// No micro-batch of this step has been reduced into `grad` yet: the next reduce-scatter
    /// writes it; later ones (gradient accumulation) add to it.
    fresh: bool,
}

/// A reduce-scatter in flight: its bucket, the buffers it reads and writes, and whether its
/// output is added to the shard when done.
struct InFlight {
    bucket: usize,
    work: Work,
    _flat: Tensor,
    out: Tensor,
    add: bool,
}

/// Stage 2's reduction, fed by the gradient hooks during the backward pass.
struct Reducer {
    /// The job's process group, alive as long as the optimizer that owns this reducer.
    pg: *const ProcessGroup,
    weight: f64,
    params: Vec<Tensor>,
    /// Per parameter: (bucket, offset in the flat bucket, elements), and whether its gradient
    /// is in its bucket now.
    slot_of: Vec<(usize, i64, i64)>,
    seen: Vec<bool>,
    buckets: Vec<ReduceBucket>,
    /// The next bucket to launch: buckets go out in order, whatever order they fill in.
    next: usize,
    flight: VecDeque<InFlight>,
    /// The first failure in a hook, reported by [`Reducer::finish`].
    error: Option<anyhow::Error>,
}

// SAFETY: the process group is used only from the thread running the backward pass and the
// step, one at a time (the mutex); tensors are reference-counted atomically by libtorch.
unsafe impl Send for Reducer {}

impl Reducer {
    fn new_step(&mut self) {
        for b in &mut self.buckets {
            b.fresh = true;
        }
    }

    /// Parameter `i`'s gradient is complete: into its bucket, and out go the buckets that are
    /// full and next in line.
    fn on_grad(&mut self, i: usize) {
        if self.error.is_some() {
            return;
        }
        if let Err(e) = self.take(i).and_then(|_| self.start_ready_reduces()) {
            self.error = Some(e);
        }
    }

    fn take(&mut self, i: usize) -> Result<()> {
        let (b, off, n) = self.slot_of[i];
        let g = self.params[i].grad();
        if !g.defined() {
            return Err(ddp::missing_gradient(i, &self.params[i]));
        }
        let bucket = &mut self.buckets[b];
        let flat = bucket
            .flat
            .get_or_insert_with(|| device_zeros(&bucket.like, bucket.flat_len));
        flat.narrow(0, off, n).copy_(&g.reshape([-1]));
        if std::mem::replace(&mut self.seen[i], true) {
            return Err(anyhow!(
                "parameter #{i} delivered its gradient twice in one backward pass"
            ));
        }
        bucket.pending -= 1;
        Ok(())
    }

    fn start_ready_reduces(&mut self) -> Result<()> {
        while self.next < self.buckets.len() && self.buckets[self.next].pending == 0 {
            self.start_reduce(self.next)?;
            self.next = (self.next + 1) % self.buckets.len();
            if self.next == 0 {
                break;
            }
        }
        Ok(())
    }

    fn start_reduce(&mut self, b: usize) -> Result<()> {
        let weight = self.weight;
        let bucket = &mut self.buckets[b];
        let mut flat = bucket.flat.take().expect("a full bucket has its buffer");
        if weight != 1.0 {
            let _ = flat.g_mul_scalar_(weight);
        }
        let add = !bucket.fresh;
        let out = if add {
            bucket.grad.zeros_like()
        } else {
            bucket.grad.shallow_clone()
        };
        bucket.fresh = false;
        bucket.pending = bucket.slots;
        for (seen, &(owner, _, _)) in self.seen.iter_mut().zip(&self.slot_of) {
            if owner == b {
                *seen = false;
            }
        }
        // SAFETY: see the field; the pointer is valid while hooks can run.
        let pg = unsafe { &*self.pg };
        let work = pg.reduce_scatter_start(&out, &flat)?;
        self.flight.push_back(InFlight {
            bucket: b,
            work,
            _flat: flat,
            out,
            add,
        });
        while self.flight.len() > IN_FLIGHT {
            self.complete_oldest()?;
        }
        Ok(())
    }

    fn complete_oldest(&mut self) -> Result<()> {
        if let Some(f) = self.flight.pop_front() {
            f.work.wait()?;
            if f.add {
                let mut g = self.buckets[f.bucket].grad.shallow_clone();
                g += &f.out;
            }
        }
        Ok(())
    }

    /// The end of the backward passes of a step: every bucket must have gone out, and every
    /// reduce-scatter is waited for.
    fn finish(&mut self) -> Result<()> {
        if let Some(e) = self.error.take() {
            return Err(e);
        }
        if self.buckets.iter().any(|b| b.pending != b.slots) {
            // The bucket next in line is the one still waiting for a gradient.
            let stuck = self.next;
            let missing = (0..self.params.len())
                .find(|&i| self.slot_of[i].0 == stuck && !self.seen[i])
                .unwrap_or(0);
            return Err(ddp::missing_gradient(missing, &self.params[missing]));
        }
        if self.buckets.iter().any(|b| b.fresh) {
            return Err(anyhow!(
                "ZeRO-2: a step ended without a backward pass over every parameter"
            ));
        }
        while !self.flight.is_empty() {
            self.complete_oldest()?;
        }
        Ok(())
    }
}

unsafe extern "C" fn on_grad(ctx: *mut c_void, index: usize) {
    // SAFETY: `ctx` is the reducer's mutex, alive while the hooks are registered.
    let reducer = unsafe { &*(ctx as *const Mutex<Reducer>) };
    let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        if let Ok(mut r) = reducer.lock() {
            r.on_grad(index);
        }
    }));
    if let Err(p) = outcome {
        if let Ok(mut r) = reducer.lock() {
            r.error = Some(anyhow!(
                "a gradient hook panicked: {}",
                crate::worker::task::panic_text(p.as_ref())
            ));
        }
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
