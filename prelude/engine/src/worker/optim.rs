//! Optimizers and learning-rate schedules with state that can be saved and restored.
//!
//! tch's optimizers keep their state (momentum buffers, Adam moments) inside libtorch where it
//! cannot be read back, so a resumed run would restart its momentum from zero. These follow
//! `torch.optim.SGD` and `torch.optim.AdamW` step for step (same update formulas, same
//! defaults for betas and eps; in fact the same fused kernels) and expose their state as named
//! tensors for checkpoints.
//!
//! LAMB and LANS, the large-batch optimizers of BERT pre-training, have no kernel in libtorch;
//! they are written here from their papers' algorithms with tensor operations, and pinned by a
//! trajectory computed in plain PyTorch (`tests/fixtures/make_lamb_reference.py`).

use std::os::raw::{c_char, c_int, c_void};
use std::path::Path;

use anyhow::{bail, Context, Result};
use tch::{Kind, Tensor};

use crate::shared::ffi::call_status;
use crate::shared::tensor_files::TensorFiles;
use crate::worker::device::OnDeviceOf;
use trainbook_api::OptimizerKind;

pub(crate) use trainbook_api::Schedule;

/// The learning rate of every optimizer step of a run.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) struct LrSchedule {
    pub kind: Schedule,
    /// The peak learning rate.
    pub base: f64,
    /// Steps of linear warm-up from `base / warmup` to `base`.
    pub warmup: u64,
    /// Poly: steps held at `base` after the warm-up.
    pub constant: u64,
    /// Poly: the power of the decay.
    pub power: f64,
    /// Optimizer steps in the whole run.
    pub total: u64,
}

impl LrSchedule {
    /// Warm-up and constant phases are fractions of `total`, rounded up to whole steps.
    pub(crate) fn new(kind: Schedule, base: f64, total: u64, warmup_ratio: f64) -> Self {
        LrSchedule {
            kind,
            base,
            warmup: (warmup_ratio * total as f64).ceil() as u64,
            constant: 0,
            power: 1.0,
            total,
        }
    }

    pub(crate) fn with_poly(mut self, constant_ratio: f64, power: f64) -> Self {
        self.constant = (constant_ratio * self.total as f64).ceil() as u64;
        self.power = power;
        self
    }

    /// The learning rate of optimizer step `step` (0-based). Linear is poly with power 1 and
    /// no constant phase; both reach 0 at step `total`.
    pub(crate) fn at(&self, step: u64) -> f64 {
        if step < self.warmup {
            return self.base * (step + 1) as f64 / self.warmup as f64;
        }
        let decay = |constant: u64, power: f64| {
            if step < self.warmup + constant {
                return self.base;
            }
            let left = self.total.saturating_sub(step) as f64;
            let span = self.total.saturating_sub(self.warmup + constant).max(1) as f64;
            self.base * (left / span).clamp(0.0, 1.0).powf(power)
        };
        match self.kind {
            Schedule::Constant => self.base,
            Schedule::Linear => decay(0, 1.0),
            Schedule::Poly => decay(self.constant, self.power),
        }
    }
}

#[derive(Clone, Copy, Debug)]
pub(crate) struct OptimizerSettings {
    pub kind: OptimizerKind,
    pub momentum: f64,
    pub weight_decay: f64,
    pub betas: (f64, f64),
    pub eps: f64,
}

pub(crate) struct Optimizer {
    cfg: OptimizerSettings,
    /// (name, parameter) in a fixed order: whole parameters, or under ZeRO the flat pieces of
    /// parameters this rank updates (see [`Piece`]).
    params: Vec<(String, Tensor)>,
    /// Whether weight decay applies: matrices and embeddings yes; biases and norm scales
    /// (1-D tensors) no, as Transformers' Trainer and most recipes do.
    decays: Vec<bool>,
    /// Pieces only: where each lies in its named parameter.
    pieces: Vec<Option<Piece>>,
    /// Trainable parameters of the job (more than `params` holds under ZeRO).
    param_count: usize,
    /// Pieces only: a tensor on the optimizer's device, for ranks that hold no piece.
    home: Option<Tensor>,
    /// SGD: one momentum buffer; AdamW: first and second moments.
    state: Vec<Vec<Tensor>>,
    steps: u64,
    /// `steps` as a float scalar on the parameters' device, which the fused AdamW kernel reads.
    /// Made once and refilled each step (a kernel launch): a fresh host scalar copied over
    /// each step would come from pageable memory, a copy the host waits for, behind the whole
    /// backward pass queued before it.
    step_tensor: Option<Tensor>,
    /// In a CUDA graph: the learning rate as a device scalar, refilled before each replay, and
    /// the step counted on the device (a host number would be baked into the graph).
    graph_lr: Option<Tensor>,
    /// LAMB's and LANS's parameter index of each piece, on the device, for the pieces it was
    /// made for (the same every step, unless a gradient goes missing): uploaded once, not at
    /// every step (a copy from pageable memory the host waits for).
    piece_index: std::cell::RefCell<Option<(Vec<i64>, Tensor)>>,
}

/// Where a flat piece of a parameter lies: LAMB's and LANS's per-tensor norms add up the
/// squares of every piece of a parameter (over ranks too), and a checkpoint's whole-parameter
/// state is cut into the same pieces on load.
#[derive(Clone, Debug)]
pub(crate) struct Piece {
    /// The parameter's index among the job's trainable parameters (sorted by name).
    pub param: usize,
    /// The piece's first element in the flattened parameter.
    pub offset: i64,
    /// The whole parameter's shape.
    pub shape: Vec<i64>,
    pub decays: bool,
}

/// Sums a tensor over all ranks in place (an all-reduce), for norms of sharded parameters.
pub(crate) type SumOverRanks<'a> = &'a dyn Fn(&Tensor) -> Result<()>;

extern "C" {
    fn tb_grads_to_none(params: *const *mut c_void, n: usize);
    fn tb_fused_adamw(
        params: *const *mut c_void,
        grads: *const *mut c_void,
        exp_avgs: *const *mut c_void,
        exp_avg_sqs: *const *mut c_void,
        steps: *const *mut c_void,
        n: usize,
        step: i64,
        lr: f64,
        lr_t: *const c_void,
        beta1: f64,
        beta2: f64,
        weight_decay: f64,
        eps: f64,
        err: *mut c_char,
        errlen: usize,
    ) -> c_int;
    fn tb_fused_sgd(
        params: *const *mut c_void,
        grads: *const *mut c_void,
        momentum_buffers: *const *mut c_void,
        n: usize,
        lr: f64,
        lr_t: *const c_void,
        momentum: f64,
        weight_decay: f64,
        is_first_step: c_int,
        err: *mut c_char,
        errlen: usize,
    ) -> c_int;
}

impl Optimizer {
    /// `params`: the trainable variables by name.
    pub(crate) fn new(cfg: OptimizerSettings, mut params: Vec<(String, Tensor)>) -> Self {
        params.sort_by(|a, b| a.0.cmp(&b.0));
        let decays = params.iter().map(|(_, p)| p.dim() >= 2).collect();
        let slots = state_suffixes(&cfg).len();
        let state = params
            .iter()
            .map(|(_, p)| (0..slots).map(|_| p.zeros_like()).collect())
            .collect();
        Self {
            cfg,
            pieces: vec![None; params.len()],
            param_count: params.len(),
            home: None,
            params,
            decays,
            state,
            steps: 0,
            step_tensor: None,
            graph_lr: None,
            piece_index: Default::default(),
        }
    }

    /// An optimizer over flat pieces of parameters (ZeRO's shard of one rank), named after
    /// their parameters; [`Optimizer::step_with`] gives it their gradients.
    /// `param_count`: the job's trainable parameters; `home`: any tensor on the device.
    pub(crate) fn for_pieces(
        cfg: OptimizerSettings,
        param_count: usize,
        home: Tensor,
        pieces: Vec<(String, Tensor, Piece)>,
    ) -> Self {
        let mut opt = Self::new(cfg, Vec::new());
        opt.param_count = param_count;
        opt.home = Some(home);
        for (name, t, piece) in pieces {
            let slots = opt.slots();
            opt.state.push((0..slots).map(|_| t.zeros_like()).collect());
            opt.decays.push(piece.decays);
            opt.pieces.push(Some(piece));
            opt.params.push((name, t));
        }
        opt
    }

    fn slots(&self) -> usize {
        self.suffixes().len()
    }

    /// The names of a parameter's state tensors in a checkpoint (`<param>.<suffix>`).
    pub(crate) fn suffixes(&self) -> &'static [&'static str] {
        state_suffixes(&self.cfg)
    }

    /// State tensor `slot` (index into [`Optimizer::suffixes`]) of every parameter or piece.
    pub(crate) fn state_of(&self, slot: usize) -> impl Iterator<Item = &Tensor> {
        self.state.iter().map(move |s| &s[slot])
    }

    /// Bytes of optimizer state this process holds.
    pub(crate) fn state_bytes(&self) -> u64 {
        self.state
            .iter()
            .flatten()
            .map(|t| t.numel() as u64 * t.kind().elt_size_in_bytes() as u64)
            .sum()
    }

    /// Optimizer steps taken so far (restored by [`Optimizer::load`]).
    pub(crate) fn steps(&self) -> u64 {
        self.steps
    }

    /// Prepares the steps a CUDA graph captures: the learning rate becomes the returned device
    /// scalar (fill it before each replay) and the step number is counted on the device. The
    /// fused AdamW and SGD steps only; at least one eager step must have run (momentum buffers
    /// and the step scalar exist).
    pub(crate) fn enter_graph(&mut self) -> Result<Tensor> {
        if !matches!(self.cfg.kind, OptimizerKind::Adamw | OptimizerKind::Sgd) {
            bail!(
                "a CUDA graph captures the adamw and sgd steps, not {}",
                self.cfg.kind
            );
        }
        let Some(step) = self.step_tensor.as_ref() else {
            bail!("the optimizer has not stepped yet: a CUDA graph is captured after eager steps");
        };
        let lr = step.zeros_like();
        self.graph_lr = Some(lr.shallow_clone());
        Ok(lr)
    }

    /// Counts an update that ran inside a replayed CUDA graph (the host code did not run).
    pub(crate) fn count_replayed_step(&mut self) {
        self.steps += 1;
    }

    /// Drops every gradient before a step's backward passes (PyTorch's default,
    /// `set_to_none=True`): the first micro-batch's gradient is handed over, not added to zeros.
    pub(crate) fn zero_grad(&mut self) {
        let ptrs: Vec<*mut c_void> = self
            .params
            .iter()
            .map(|(_, p)| p.as_ptr() as *mut c_void)
            .collect();
        // SAFETY: live parameter tensors; the helper only resets their gradient slot.
        unsafe { tb_grads_to_none(ptrs.as_ptr(), ptrs.len()) }
    }

    /// Scales gradients so their global L2 norm is at most `max_norm`; returns the norm
    /// before clipping (as `torch.nn.utils.clip_grad_norm_`).
    pub(crate) fn clip_grad_norm(&mut self, max_norm: f64) -> f64 {
        tch::no_grad(|| {
            let grads: Vec<Tensor> = self
                .params
                .iter()
                .map(|(_, p)| p.grad())
                .filter(|g| g.defined())
                .collect();
            let sq: f64 = grads
                .iter()
                .map(|g| {
                    g.to_kind(Kind::Float)
                        .square()
                        .sum(Kind::Double)
                        .double_value(&[])
                })
                .sum();
            let norm = sq.sqrt();
            let scale = max_norm / (norm + 1e-6);
            if scale < 1.0 {
                for mut g in grads {
                    let _ = g.g_mul_scalar_(scale);
                }
            }
            norm
        })
    }

    /// One update with learning rate `lr`. Parameters without a gradient are skipped.
    ///
    /// Runs PyTorch's fused kernels (`torch.optim.AdamW(fused=True)` / `SGD(fused=True)`): one
    /// vectorised pass per parameter, where an elementwise chain would read and write every
    /// parameter-sized buffer about ten times. On an HPU the shim calls the Gaudi bridge's fused
    /// ops instead, which it has kernels for (csrc/optim.cpp).
    pub(crate) fn step(&mut self, lr: f64) -> Result<()> {
        let grads: Vec<Tensor> = self.params.iter().map(|(_, p)| p.grad()).collect();
        self.step_with(lr, &grads, None)
    }

    /// One update with the given gradient of each parameter or piece. `sum_over_ranks` adds
    /// up per-parameter partial sums when the pieces of a parameter are spread over ranks
    /// (LAMB's and LANS's norms under ZeRO).
    pub(crate) fn step_with(
        &mut self,
        lr: f64,
        grads: &[Tensor],
        sum_over_ranks: Option<SumOverRanks>,
    ) -> Result<()> {
        self.steps += 1;
        let c = self.cfg;
        if matches!(c.kind, OptimizerKind::Lamb | OptimizerKind::Lans) {
            return self.layerwise_step(lr, grads, sum_over_ranks);
        }
        // The fused AdamW kernel reads the (already incremented) step from a float tensor per
        // parameter; one shared scalar serves them all since it never writes it.
        let Some(like) = self.params.first().map(|(_, p)| p.shallow_clone()) else {
            return Ok(());
        };
        let mut step = self
            .step_tensor
            .get_or_insert_with(|| Tensor::from(0f32).to_device_of(&like))
            .shallow_clone();
        if self.graph_lr.is_some() {
            let _ = step.g_add_scalar_(1.0);
        } else {
            let _ = step.fill_(self.steps as f64);
        }
        let lr_t = self
            .graph_lr
            .as_ref()
            .map_or(std::ptr::null(), |t| t.as_ptr() as *const c_void);
        for decay in [true, false] {
            let idx: Vec<usize> = (0..self.params.len())
                .filter(|&i| self.decays[i] == decay && grads[i].defined())
                .collect();
            if idx.is_empty() {
                continue;
            }
            let wd = if decay { c.weight_decay } else { 0.0 };
            let ptrs =
                |f: &dyn Fn(usize) -> *mut c_void| idx.iter().map(|&i| f(i)).collect::<Vec<_>>();
            let params = ptrs(&|i| self.params[i].1.as_ptr() as *mut c_void);
            let g = ptrs(&|i| grads[i].as_ptr() as *mut c_void);
            // SAFETY: every pointer is a live tch tensor (held by self or `grads`/`step` for
            // the duration of the call); the shim catches C++ exceptions.
            call_status(&format!("{} step", c.kind), |err, errlen| unsafe {
                match c.kind {
                    OptimizerKind::Adamw => {
                        let m = ptrs(&|i| self.state[i][0].as_ptr() as *mut c_void);
                        let v = ptrs(&|i| self.state[i][1].as_ptr() as *mut c_void);
                        let s = ptrs(&|_| step.as_ptr() as *mut c_void);
                        tb_fused_adamw(
                            params.as_ptr(),
                            g.as_ptr(),
                            m.as_ptr(),
                            v.as_ptr(),
                            s.as_ptr(),
                            idx.len(),
                            self.steps as i64,
                            lr,
                            lr_t,
                            c.betas.0,
                            c.betas.1,
                            wd,
                            c.eps,
                            err,
                            errlen,
                        )
                    }
                    OptimizerKind::Lamb | OptimizerKind::Lans => unreachable!("handled above"),
                    OptimizerKind::Sgd => {
                        let b = if c.momentum != 0.0 {
                            ptrs(&|i| self.state[i][0].as_ptr() as *mut c_void)
                        } else {
                            Vec::new()
                        };
                        tb_fused_sgd(
                            params.as_ptr(),
                            g.as_ptr(),
                            b.as_ptr(),
                            idx.len(),
                            lr,
                            lr_t,
                            c.momentum,
                            wd,
                            i32::from(self.steps == 1),
                            err,
                            errlen,
                        )
                    }
                }
            })?;
        }
        Ok(())
    }

    /// One LAMB or LANS update: per tensor, Adam's bias-corrected moments, then an update
    /// scaled by the trust ratio |w| / |update| (1 when either norm is 0). Weight decay is
    /// added to the update (decoupled) on the tensors that decay. LANS first normalises each
    /// tensor's gradient to unit norm, and mixes two trust-scaled directions: the moment
    /// ratio (weight beta1) and the current gradient over the same denominator (1 - beta1).
    ///
    /// The norms are of whole parameters: [`Optimizer::norms`] adds up the squares of every
    /// piece of a parameter, over ranks when they are spread out.
    fn layerwise_step(
        &mut self,
        lr: f64,
        grads: &[Tensor],
        sum_over_ranks: Option<SumOverRanks>,
    ) -> Result<()> {
        let c = self.cfg;
        let (b1, b2) = c.betas;
        let t = self.steps as i32;
        let (bc1, bc2) = (1.0 - b1.powi(t), 1.0 - b2.powi(t));
        tch::no_grad(|| -> Result<()> {
            let live: Vec<usize> = (0..self.params.len())
                .filter(|&i| grads[i].defined())
                .collect();
            // Norms and trust ratios stay on the device as tensors: reading them back would
            // synchronise with a GPU or HPU two or three times per tensor per step.
            let mut g: Vec<Tensor> = live
                .iter()
                .map(|&i| grads[i].to_kind(Kind::Float))
                .collect();
            if c.kind == OptimizerKind::Lans {
                let norms = self.norms(&live, &[&g], sum_over_ranks)?;
                // A zero gradient stays zero.
                for (g, n) in g.iter_mut().zip(&norms[0]) {
                    *g = &*g / n.clamp_min(f64::from(f32::MIN_POSITIVE));
                }
            }
            let mut w = Vec::with_capacity(live.len());
            let mut dirs: Vec<Vec<Tensor>> = (0..1 + usize::from(c.kind == OptimizerKind::Lans))
                .map(|_| Vec::new())
                .collect();
            for (k, &i) in live.iter().enumerate() {
                let (mut m, mut v) = (
                    self.state[i][0].shallow_clone(),
                    self.state[i][1].shallow_clone(),
                );
                m *= b1;
                m += &g[k] * (1.0 - b1);
                v *= b2;
                v += g[k].square() * (1.0 - b2);
                let denom = (&v / bc2).sqrt() + c.eps;
                let wk = self.params[i].1.to_kind(Kind::Float);
                let wd = if self.decays[i] { c.weight_decay } else { 0.0 };
                // Each direction plus decoupled decay.
                let with_decay = |dir: Tensor| if wd != 0.0 { dir + &wk * wd } else { dir };
                dirs[0].push(with_decay(&m / bc1 / &denom));
                if c.kind == OptimizerKind::Lans {
                    dirs[1].push(with_decay(&g[k] / &denom));
                }
                w.push(wk);
            }
            let mut sets: Vec<&[Tensor]> = vec![&w];
            sets.extend(dirs.iter().map(|d| d.as_slice()));
            let norms = self.norms(&live, &sets, sum_over_ranks)?;
            for (k, &i) in live.iter().enumerate() {
                let w_norm = &norms[0][k];
                // |w| / |dir|, 1 where either norm is 0.
                let trusted = |dir: &Tensor, d_norm: &Tensor| {
                    let defined = w_norm.gt(0.0).logical_and(&d_norm.gt(0.0));
                    let ratio = (w_norm / d_norm).where_self(&defined, &w_norm.ones_like());
                    dir * ratio
                };
                let update = match c.kind {
                    OptimizerKind::Lans => {
                        trusted(&dirs[0][k], &norms[1][k]) * b1
                            + trusted(&dirs[1][k], &norms[2][k]) * (1.0 - b1)
                    }
                    _ => trusted(&dirs[0][k], &norms[1][k]),
                };
                let mut p = self.params[i].1.shallow_clone();
                p -= (update * lr).to_kind(p.kind());
            }
            Ok(())
        })
    }

    /// The L2 norm of each whole parameter, for each set of per-slot tensors (slots `live`),
    /// as 0-d device tensors. Whole parameters: one `norm()` each. Pieces: partial sums of
    /// squares added up per parameter, and over ranks, in one all-reduce for every set.
    fn norms(
        &self,
        live: &[usize],
        sets: &[&[Tensor]],
        sum_over_ranks: Option<SumOverRanks>,
    ) -> Result<Vec<Vec<Tensor>>> {
        let Some(sum) = sum_over_ranks else {
            return Ok(sets
                .iter()
                .map(|set| set.iter().map(|t| t.norm()).collect())
                .collect());
        };
        // Every rank joins the all-reduce with the same shape, even one without pieces.
        let Some(home) = live
            .first()
            .map(|&i| &self.params[i].1)
            .or(self.home.as_ref())
        else {
            bail!("a sharded optimizer needs a tensor on its device (none was given)");
        };
        let index: Vec<i64> = live
            .iter()
            .map(|&i| self.pieces[i].as_ref().map_or(i, |p| p.param) as i64)
            .collect();
        let index = {
            let mut cached = self.piece_index.borrow_mut();
            match cached.as_ref() {
                Some((k, t)) if *k == index => t.shallow_clone(),
                _ => {
                    let t = Tensor::from_slice(&index).to_device_of(home);
                    *cached = Some((index, t.shallow_clone()));
                    t
                }
            }
        };
        let mut totals =
            home.zeros_on_device(&[sets.len() as i64, self.param_count as i64], Kind::Float);
        if !live.is_empty() {
            let partial = Tensor::stack(
                &sets
                    .iter()
                    .map(|set| {
                        Tensor::stack(
                            &set.iter()
                                .map(|t| t.square().sum(Kind::Float))
                                .collect::<Vec<_>>(),
                            0,
                        )
                    })
                    .collect::<Vec<_>>(),
                0,
            );
            totals = totals.index_add(1, &index, &partial);
        }
        sum(&totals)?;
        let per_slot = totals.index_select(1, &index).sqrt();
        Ok((0..sets.len() as i64)
            .map(|s| {
                (0..live.len() as i64)
                    .map(|k| per_slot.get(s).get(k))
                    .collect()
            })
            .collect())
    }

    /// The state as named tensors (`steps`, `<param>.momentum`, `<param>.exp_avg`, ...), for
    /// `optimizer.safetensors` in a checkpoint. Whole parameters only: ZeRO gathers its pieces
    /// into the same layout (`zero::ShardedOptimizer::gather_state`).
    pub(crate) fn named_state(&self) -> Vec<(String, Tensor)> {
        let mut out = vec![("steps".to_string(), Tensor::from(self.steps as i64))];
        for ((name, _), slots) in self.params.iter().zip(&self.state) {
            for (s, t) in self.suffixes().iter().zip(slots) {
                out.push((format!("{name}.{s}"), t.shallow_clone()));
            }
        }
        out
    }

    #[cfg(test)]
    fn save(&self, path: &Path) -> Result<()> {
        save_state(&self.named_state(), path)
    }

    /// Restores state written by [`Optimizer::save`] (or gathered from ZeRO's shards) for the
    /// same parameters and optimizer; pieces take their part of each parameter's state, so a
    /// checkpoint loads with any worker count.
    pub(crate) fn load(&mut self, stored: &TensorFiles) -> Result<()> {
        let path = stored.origin();
        let Some(steps) = stored.get("steps")? else {
            bail!(
                "{} holds no optimizer step count: not an optimizer state file",
                path.display()
            );
        };
        let steps = steps.int64_value(&[]) as u64;
        let suffixes = self.suffixes();
        for (i, (pname, t)) in self.params.iter().enumerate() {
            for (s, dst) in suffixes.iter().zip(&self.state[i]) {
                let name = format!("{pname}.{s}");
                let Some(src) = stored.get(&name)? else {
                    bail!(
                        "{} has no '{name}': it was written by a different optimizer ({} now) or model; resume with the same optimizer and model",
                        path.display(),
                        self.cfg.kind
                    );
                };
                let want = match &self.pieces[i] {
                    Some(p) => p.shape.clone(),
                    None => t.size(),
                };
                if src.size() != want {
                    bail!(
                        "optimizer state '{name}' has shape {:?} in {}, the model needs {want:?}",
                        src.size(),
                        path.display(),
                    );
                }
                let src = match &self.pieces[i] {
                    Some(p) => src.reshape([-1]).narrow(0, p.offset, t.numel() as i64),
                    None => src,
                };
                tch::no_grad(|| dst.shallow_clone().copy_(&src));
            }
        }
        self.steps = steps;
        Ok(())
    }
}

fn state_suffixes(cfg: &OptimizerSettings) -> &'static [&'static str] {
    match cfg.kind {
        OptimizerKind::Sgd if cfg.momentum != 0.0 => &["momentum"],
        OptimizerKind::Sgd => &[],
        OptimizerKind::Adamw | OptimizerKind::Lamb | OptimizerKind::Lans => {
            &["exp_avg", "exp_avg_sq"]
        }
    }
}

/// Writes named optimizer state as safetensors.
pub(crate) fn save_state(named: &[(String, Tensor)], path: &Path) -> Result<()> {
    crate::shared::checkpoint::write_tensors(named, path).context("writing optimizer state")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn linear_schedule_warms_up_then_decays_to_zero() {
        let s = LrSchedule::new(Schedule::Linear, 1.0, 12, 0.3);
        assert_eq!(s.warmup, 4);
        let lr = |step| s.at(step);
        assert_eq!(lr(0), 0.25);
        assert_eq!(lr(3), 1.0);
        assert_eq!(lr(4), 1.0);
        assert_eq!(lr(8), 0.5);
        assert_eq!(lr(12), 0.0);
        assert_eq!(
            LrSchedule::new(Schedule::Constant, 0.1, 10, 0.0).at(100),
            0.1
        );
    }

    #[test]
    fn poly_schedule_warms_up_holds_then_decays_as_a_power() {
        // 002's shape: 5% warm-up, 25% constant, then decay; here over 20 steps, power 2.
        let s = LrSchedule::new(Schedule::Poly, 2.0, 20, 0.05).with_poly(0.25, 2.0);
        assert_eq!((s.warmup, s.constant), (1, 5));
        let lr: Vec<f64> = (0..=20).map(|i| s.at(i)).collect();
        assert_eq!(lr[0], 2.0, "one warm-up step reaches the peak");
        assert!(lr[1..6].iter().all(|&l| l == 2.0), "{lr:?}");
        // From step 6 the decay spans 14 steps: 2 * ((20 - i) / 14)^2.
        assert_eq!(lr[6], 2.0);
        assert_eq!(lr[13], 2.0 * 0.25);
        assert_eq!(lr[20], 0.0);
        for i in 6..=20u64 {
            let want = 2.0 * ((20 - i) as f64 / 14.0).powf(2.0);
            assert_eq!(lr[i as usize], want, "step {i}");
        }
        // Power 1 without a constant phase is the linear schedule.
        let poly = LrSchedule::new(Schedule::Poly, 1.0, 12, 0.3).with_poly(0.0, 1.0);
        let linear = LrSchedule::new(Schedule::Linear, 1.0, 12, 0.3);
        assert!((0..=12).all(|i| poly.at(i) == linear.at(i)));
    }

    /// Where the optimizer tests run: the CPU, or with `TRAINBOOK_TEST_DEVICE=cuda` the first
    /// GPU, so that the fused CUDA kernels are checked against libtorch's on a GPU machine
    /// (bench/cuda/device.sh runs them there).
    fn test_device() -> tch::Device {
        match std::env::var("TRAINBOOK_TEST_DEVICE").as_deref() {
            Ok("cuda") => tch::Device::Cuda(0),
            _ => tch::Device::Cpu,
        }
    }

    /// A linear layer with fixed weights (tests run in parallel threads and share torch's
    /// global RNG, so seeding is not enough).
    fn fixed_linear() -> (tch::nn::VarStore, tch::nn::Linear) {
        let vs = tch::nn::VarStore::new(test_device());
        let mut lin = tch::nn::linear(vs.root(), 3, 2, Default::default());
        tch::no_grad(|| {
            lin.ws.copy_(
                &Tensor::from_slice(&[0.1f32, -0.2, 0.3, 0.4, 0.5, -0.6])
                    .view([2, 3])
                    .to_device(test_device()),
            );
            lin.bs
                .as_mut()
                .unwrap()
                .copy_(&Tensor::from_slice(&[0.05f32, -0.05]).to_device(test_device()));
        });
        (vs, lin)
    }

    fn quadratic_run(
        kind: OptimizerKind,
        wd: f64,
        tch_opt: impl FnOnce(&tch::nn::VarStore) -> tch::nn::Optimizer,
    ) {
        // Same problem through tch's (libtorch's) optimizer and ours: identical trajectories.
        use tch::nn::Module;
        let run_ours = || {
            let (vs, lin) = fixed_linear();
            let params = vs.variables().into_iter().collect();
            let mut opt = Optimizer::new(
                OptimizerSettings {
                    kind,
                    momentum: 0.9,
                    weight_decay: wd,
                    betas: (0.9, 0.999),
                    eps: 1e-8,
                },
                params,
            );
            let x = Tensor::from_slice(&[1.0f32, -2.0, 0.5, 0.3, 0.1, -1.0])
                .view([2, 3])
                .to_device(test_device());
            for _ in 0..5 {
                opt.zero_grad();
                lin.forward(&x).square().sum(Kind::Float).backward();
                opt.step(0.05).unwrap();
            }
            (lin.ws.shallow_clone(), lin.bs.unwrap())
        };
        let run_tch = || {
            let (vs, lin) = fixed_linear();
            let mut opt = tch_opt(&vs);
            let x = Tensor::from_slice(&[1.0f32, -2.0, 0.5, 0.3, 0.1, -1.0])
                .view([2, 3])
                .to_device(test_device());
            for _ in 0..5 {
                opt.zero_grad();
                lin.forward(&x).square().sum(Kind::Float).backward();
                opt.step();
            }
            (lin.ws.shallow_clone(), lin.bs.unwrap())
        };
        let (w1, b1) = run_ours();
        let (w2, b2) = run_tch();
        let diff = (&w1 - &w2)
            .abs()
            .max()
            .double_value(&[])
            .max((&b1 - &b2).abs().max().double_value(&[]));
        assert!(diff < 1e-6, "{kind}: max difference {diff}");
    }

    #[test]
    fn sgd_momentum_matches_libtorch() {
        use tch::nn::OptimizerConfig as _;
        // wd 0 because ours skips decay on 1-D tensors (biases), libtorch's does not.
        quadratic_run(OptimizerKind::Sgd, 0.0, |vs| {
            tch::nn::Sgd {
                momentum: 0.9,
                ..Default::default()
            }
            .build(vs, 0.05)
            .unwrap()
        });
    }

    #[test]
    fn adamw_matches_libtorch() {
        use tch::nn::OptimizerConfig as _;
        quadratic_run(OptimizerKind::Adamw, 0.0, |vs| {
            tch::nn::AdamW {
                wd: 0.0,
                ..Default::default()
            }
            .build(vs, 0.05)
            .unwrap()
        });
    }

    /// LAMB and LANS against the plain-PyTorch trajectory of
    /// `tests/fixtures/make_lamb_reference.py` (same layer, data, loss and settings).
    #[test]
    fn lamb_and_lans_match_the_pytorch_reference() {
        use tch::nn::Module;
        // Compiled in, so the test binary also runs on a machine without the sources (a GPU
        // machine, bench/cuda/device.sh).
        let fixture: serde_json::Value = serde_json::from_str(include_str!(
            "../../../../tests/fixtures/lamb_reference.json"
        ))
        .unwrap();
        for kind in [OptimizerKind::Lamb, OptimizerKind::Lans] {
            let (vs, lin) = fixed_linear();
            let mut opt = Optimizer::new(
                OptimizerSettings {
                    kind,
                    momentum: 0.0,
                    weight_decay: 0.01,
                    betas: (0.9, 0.999),
                    eps: 1e-6,
                },
                vs.variables().into_iter().collect(),
            );
            let x = Tensor::from_slice(&[1.0f32, -2.0, 0.5, 0.3, 0.1, -1.0])
                .view([2, 3])
                .to_device(test_device());
            for _ in 0..5 {
                opt.zero_grad();
                lin.forward(&x).square().sum(Kind::Float).backward();
                opt.step(0.05).unwrap();
            }
            let want = &fixture[kind.to_string()];
            let got = [
                Vec::<f32>::try_from(lin.ws.flatten(0, -1).to_device(tch::Device::Cpu)).unwrap(),
                Vec::<f32>::try_from(lin.bs.as_ref().unwrap().to_device(tch::Device::Cpu)).unwrap(),
            ];
            for (got, key) in got.iter().zip(["weight", "bias"]) {
                let want: Vec<f64> = serde_json::from_value(want[key].clone()).unwrap();
                assert_eq!(got.len(), want.len());
                for (g, w) in got.iter().zip(&want) {
                    assert!(
                        (*g as f64 - w).abs() < 1e-6,
                        "{kind} {key}: {got:?} vs {want:?}"
                    );
                }
            }
        }
    }

    #[test]
    fn state_round_trips_through_a_file() {
        let vs = tch::nn::VarStore::new(tch::Device::Cpu);
        let lin = tch::nn::linear(vs.root(), 3, 2, Default::default());
        let cfg = OptimizerSettings {
            kind: OptimizerKind::Adamw,
            momentum: 0.0,
            weight_decay: 0.01,
            betas: (0.9, 0.999),
            eps: 1e-8,
        };
        let mut opt = Optimizer::new(cfg, vs.variables().into_iter().collect());
        use tch::nn::Module;
        lin.forward(&Tensor::ones([1, 3], (Kind::Float, tch::Device::Cpu)))
            .sum(Kind::Float)
            .backward();
        opt.step(0.1).unwrap();
        let dir = std::env::temp_dir().join(format!("trainbook-optim-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        opt.save(&dir.join("optimizer.safetensors")).unwrap();
        let f = TensorFiles::open(&dir, "optimizer").unwrap().unwrap();
        let mut fresh = Optimizer::new(cfg, vs.variables().into_iter().collect());
        fresh.load(&f).unwrap();
        assert_eq!(fresh.steps(), 1);
        for (a, b) in opt.state.iter().flatten().zip(fresh.state.iter().flatten()) {
            assert!(a.equal(b));
        }
        let sgd = OptimizerSettings {
            kind: OptimizerKind::Sgd,
            momentum: 0.9,
            ..cfg
        };
        let err = Optimizer::new(sgd, vs.variables().into_iter().collect())
            .load(&f)
            .unwrap_err();
        assert!(err.to_string().contains("different optimizer"), "{err}");
        std::fs::remove_dir_all(dir).ok();
    }
}
