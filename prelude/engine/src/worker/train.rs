//! The data-parallel training loop every recipe shares, as a [`Trainer`]: sharded batches,
//! bucketed gradient all-reduce, per-step loss, per-epoch evaluation (all-reduced),
//! checkpoints, events. Each part of an epoch is a method of its own (`step`, `evaluate`,
//! `end_epoch`, `checkpoint`), so a restart, a hook or a new update strategy has one obvious
//! place.

use std::collections::{BTreeMap, VecDeque};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use tch::nn;
use tch::{Kind, Tensor};
use trainbook_api::metric;
use trainbook_api::{Hyper, OptimizerKind, Precision, Schedule};

use crate::shared::checkpoint::{self, TrainerState};
use crate::shared::events::{Emitter, Event, WorkerSummary};
use crate::shared::run_dir::RunDir;
use crate::worker::checkpoint_writer::{CheckpointWriter, Contents, Finished};
use crate::worker::ddp;
use crate::worker::device::{Device, Mark};
use crate::worker::dist::ProcessGroup;
use crate::worker::graph::{self, CapturedStep};
use crate::worker::heartbeat::{self, Busy};
use crate::worker::optim::{LrSchedule, OptimizerConfig};
use crate::worker::precision::autocast;
use crate::worker::profiler::{self, StepProfiler};
use crate::worker::recipe::{Recipe, Split, Step};
use crate::worker::sampler::{self, DistributedSampler};
use crate::worker::scores::Confusion;
use crate::worker::strategy::UpdateStrategy;

/// Per-name sums of a recipe's own metrics, weighted by batch size.
#[derive(Default)]
struct MetricSums(std::collections::BTreeMap<String, (f64, f64)>);

impl MetricSums {
    fn add(&mut self, metrics: &[(String, f64)], samples: usize) {
        for (name, v) in metrics {
            let e = self.0.entry(name.clone()).or_default();
            e.0 += v * samples as f64;
            e.1 += samples as f64;
        }
    }
    /// A ratio's numerator and denominator: its mean is then the ratio of the sums.
    fn add_ratio(&mut self, name: &str, numerator: f64, denominator: f64) {
        let e = self.0.entry(name.to_string()).or_default();
        e.0 += numerator;
        e.1 += denominator;
    }
    fn merge(&mut self, other: &MetricSums) {
        for (name, (s, n)) in &other.0 {
            let e = self.0.entry(name.clone()).or_default();
            e.0 += s;
            e.1 += n;
        }
    }
    fn means(&self) -> Vec<(String, f64)> {
        self.means_of(&self.to_sums())
    }
    fn len(&self) -> usize {
        self.0.len()
    }
    fn sums_len(&self) -> usize {
        2 * self.0.len()
    }
    /// (sum, weight) per name, in name order.
    fn to_sums(&self) -> Vec<f64> {
        self.0.values().flat_map(|(s, n)| [*s, *n]).collect()
    }
    /// The means of `sums` (laid out as [`MetricSums::to_sums`], e.g. summed over ranks).
    fn means_of(&self, sums: &[f64]) -> Vec<(String, f64)> {
        self.0
            .keys()
            .zip(sums.chunks(2))
            .map(|(k, c)| (k.clone(), c[0] / c[1].max(1e-300)))
            .collect()
    }
}

/// A step's numbers, kept on the device until the update is queued, then read in one
/// transfer: an `.item()` per micro-batch would make the host wait for each forward and
/// backward pass before queuing the next work, leaving an accelerator idle meanwhile.
#[derive(Default)]
struct StepScalars {
    values: Vec<Tensor>,
    /// Per micro-batch: samples, whether it counted hits, host metrics, device metrics' names.
    batches: Vec<(usize, bool, Vec<(String, f64)>, Vec<String>)>,
}

impl StepScalars {
    /// The same numbers again (a replayed graph rewrote the tensors in place).
    fn again(&self) -> StepScalars {
        StepScalars {
            values: self.values.iter().map(Tensor::shallow_clone).collect(),
            batches: self.batches.clone(),
        }
    }

    fn push(
        &mut self,
        n: usize,
        loss: &Tensor,
        hits: Option<Tensor>,
        host: Vec<(String, f64)>,
        device: Vec<(String, Tensor)>,
    ) {
        let scalar = |t: &Tensor| t.detach().to_kind(Kind::Double).reshape([1]);
        self.values.push(scalar(loss));
        if let Some(h) = &hits {
            self.values.push(scalar(h));
        }
        self.values.extend(device.iter().map(|(_, t)| scalar(t)));
        let names = device.into_iter().map(|(name, _)| name).collect();
        self.batches.push((n, hits.is_some(), host, names));
    }

    /// The numbers on their way to the host: on CUDA a queued copy into page-locked memory
    /// and an event behind it, so the host can go on queuing work and wait for this point
    /// alone later ([`SentScalars::read`]); elsewhere a plain copy, done when this returns.
    fn send(self, device: Device) -> Result<SentScalars> {
        if self.values.is_empty() {
            // A step this rank took part in with a weightless sample only: nothing to read.
            return Ok(SentScalars {
                host: Tensor::zeros([0], (Kind::Double, tch::Device::Cpu)),
                mark: None,
                batches: self.batches,
            });
        }
        let all = Tensor::cat(&self.values, 0);
        let cuda = matches!(device, Device::Cuda(_));
        let host = if cuda {
            all.to_device_(tch::Device::Cpu, Kind::Double, true, false)
        } else {
            all.to_device(tch::Device::Cpu)
        };
        let mark = if cuda { Some(device.mark()?) } else { None };
        Ok(SentScalars {
            host,
            mark,
            batches: self.batches,
        })
    }
}

/// A step's numbers copied (or being copied) to the host.
struct SentScalars {
    host: Tensor,
    /// Reached when the copy into `host` has landed; `None` when it already has.
    mark: Option<Mark>,
    batches: Vec<(usize, bool, Vec<(String, f64)>, Vec<String>)>,
}

impl SentScalars {
    /// The loss summed over samples, the samples, the metrics; hits go into `sums`.
    fn read(self, sums: &mut EpochSums) -> Result<(f64, usize, MetricSums)> {
        if let Some(mark) = self.mark {
            mark.wait()?;
        }
        let mut values = Vec::<f64>::try_from(&self.host)?.into_iter();
        let (mut loss_sum, mut samples, mut metrics) = (0.0, 0, MetricSums::default());
        for (n, counted, mut host, names) in self.batches {
            let mut next = || values.next().context("a step scalar is missing");
            loss_sum += next()? * n as f64;
            samples += n;
            if counted {
                sums.correct += next()?;
                sums.counted += n as f64;
            }
            for name in names {
                host.push((name, next()?));
            }
            metrics.add(&host, n);
        }
        Ok((loss_sum, samples, metrics))
    }
}

const NO_STAGED_STEP: &str = "cuda_graphs: this recipe has no fixed-shape step";

/// One micro-batch's forward pass (under the job's precision) and backward pass, its numbers
/// kept in `scalars`. The micro-batches of a step add their gradients up, so each loss is
/// divided by `divisor` (their number when they are equal, like one big batch); `None`: a
/// weightless sample, run only so that the rank takes part in the step (its gradient is zero,
/// its numbers are not kept).
fn forward_backward(
    h: &Hyper,
    ctx: &WorkerContext,
    n: usize,
    divisor: Option<f64>,
    scalars: &mut StepScalars,
    step: impl FnOnce() -> Result<Step>,
) -> Result<()> {
    let (loss, hits, out) = autocast(h.precision, ctx.device, || {
        let out = step()?;
        let hits = out
            .predictions
            .as_ref()
            .map(|(logits, labels)| logits.argmax(-1, false).eq_tensor(labels).sum(Kind::Int64));
        Ok((out.loss.shallow_clone(), hits, out))
    })?;
    let Some(divisor) = divisor else {
        (&loss * 0.0).backward();
        return Ok(());
    };
    (&loss / divisor).backward();
    scalars.push(n, &loss, hits, out.metrics, out.device_metrics);
    Ok(())
}

/// One rank's evaluation of an epoch.
#[derive(Default)]
struct EvalSums {
    loss: f64,
    n: f64,
    confusion: Confusion,
    metrics: MetricSums,
}

/// Where a worker stands in its job.
pub(crate) struct WorkerContext {
    pub rank: usize,
    pub world_size: usize,
    pub device: crate::worker::device::Device,
    pub device_name: String,
    pub pg: ProcessGroup,
    pub events: Emitter,
    pub run_dir: RunDir,
}

/// Progress events are rate-limited: a notebook does not need 1000 updates a second.
const PROGRESS_EVERY: Duration = Duration::from_millis(100);

fn optimizer_config(h: &Hyper) -> OptimizerConfig {
    OptimizerConfig {
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

/// Loads weights and optimizer state from `dir`; returns its trainer state.
fn resume(
    dir: &Path,
    vs: &mut nn::VarStore,
    update: &mut UpdateStrategy,
    h: &Hyper,
    log: &dyn Fn(String),
) -> Result<TrainerState> {
    let state = TrainerState::read(dir)?;
    // A checkpoint holds what `Recipe::weights` gives: every variable, or (LoRA) the trained
    // ones only, the frozen rest being the recipe's own model files.
    let missing = vs
        .load_partial(dir.join(checkpoint::MODEL))
        .with_context(|| format!("loading the weights of {}", dir.display()))?;
    let vars = vs.variables();
    if let Some(name) = missing
        .iter()
        .find(|n| vars.get(*n).is_some_and(|t| t.requires_grad()))
    {
        bail!(
            "{} has no {name}: it was written by another model or recipe configuration",
            dir.display()
        );
    }
    let opt_file = dir.join(checkpoint::OPTIMIZER);
    if opt_file.exists() {
        update.load(&opt_file)?;
    } else {
        log(format!(
            "warning: {} has no optimizer state (only the latest checkpoint keeps it); the {} state restarts from zero",
            dir.display(),
            h.optimizer
        ));
    }
    Ok(state)
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

fn steps_per_epoch_of(train_len: usize, world: usize, global_batch: usize, accum: usize) -> u64 {
    steps_per_epoch(train_len, world, global_batch, accum).max(1)
}

/// Sum and L2 norm of all trainable parameters, in f64.
pub(crate) fn param_stats(vs: &nn::VarStore) -> (f64, f64) {
    tch::no_grad(|| {
        let (mut sum, mut sq) = (0.0, 0.0);
        for t in vs.trainable_variables() {
            let t = t.to_kind(Kind::Double);
            sum += t.sum(Kind::Double).double_value(&[]);
            sq += t.square().sum(Kind::Double).double_value(&[]);
        }
        (sum, sq.sqrt())
    })
}

/// Steps left out of `train_samples_per_second` at the start (fewer in runs under 50 steps).
const THROUGHPUT_WARMUP_STEPS: u64 = 5;

/// Throughput bookkeeping: all samples since the start, and the steady part after the first
/// steps (allocator, caches and thread pools warming up), as BERT pre-training scripts report it.
struct Clock {
    samples: u64,
    train_time: Duration,
    steady_from: u64,
    steady_samples: u64,
    steady_time: Duration,
    last_progress: Instant,
    /// When the current epoch's training started.
    epoch_start: Instant,
}

impl Clock {
    /// A clock for a run from `step` to `total_steps`: throughput counts from a tenth of the
    /// run in, at most [`THROUGHPUT_WARMUP_STEPS`] steps.
    fn new(step: u64, total_steps: u64, now: Instant) -> Self {
        Clock {
            samples: 0,
            train_time: Duration::ZERO,
            steady_from: step
                + (total_steps - step)
                    .div_ceil(10)
                    .min(THROUGHPUT_WARMUP_STEPS),
            steady_samples: 0,
            steady_time: Duration::ZERO,
            last_progress: now - PROGRESS_EVERY,
            epoch_start: now,
        }
    }
}

/// A step whose update is queued and whose numbers are on their way to the host. The host
/// reads them after queuing the next step, so on an accelerator it prepares and queues step
/// n + 1 while step n still runs, instead of waiting for the device to drain at every step.
struct InFlight {
    scalars: SentScalars,
    epoch: u64,
    /// The step's index (0-based) and its learning rate.
    index: u64,
    lr: f64,
}

/// One epoch's training sums on this rank.
#[derive(Default)]
struct EpochSums {
    loss: f64,
    n: f64,
    correct: f64,
    counted: f64,
    metrics: MetricSums,
}

/// How often ranks agree on whether a time-based checkpoint is due: one scalar all-reduce
/// every this many steps (ranks' clocks differ, and all of them must take part in a checkpoint).
const CLOCK_CHECK_EVERY: u64 = 10;

/// The checkpoints this run wrote: the latest (which keeps its optimizer state) and the step
/// checkpoints still kept, and when the last one was written.
struct Written {
    latest: Option<PathBuf>,
    steps: VecDeque<PathBuf>,
    at: Instant,
}

impl Written {
    /// What a start of the job finds of its own run: after a restart, the checkpoint it
    /// resumed from and the step checkpoints up to it (so `keep_checkpoints` still counts
    /// them).
    fn found(run_dir: &RunDir, resumed: Option<&Path>, step: u64) -> Written {
        let mut written = Written {
            latest: None,
            steps: VecDeque::new(),
            at: Instant::now(),
        };
        let checkpoints = run_dir.checkpoints();
        let Some(resumed) = resumed.filter(|r| r.parent() == Some(checkpoints.as_path())) else {
            return written;
        };
        written.latest = Some(resumed.to_path_buf());
        let mut steps: Vec<(u64, PathBuf)> = std::fs::read_dir(&checkpoints)
            .into_iter()
            .flatten()
            .filter_map(|e| e.ok())
            .filter_map(|e| {
                let n = e
                    .file_name()
                    .to_str()?
                    .strip_prefix("step-")?
                    .parse()
                    .ok()?;
                (n <= step).then(|| (n, e.path()))
            })
            .collect();
        steps.sort();
        written.steps = steps.into_iter().map(|(_, p)| p).collect();
        written
    }
}

/// One rank's training of one recipe: set up by [`Trainer::new`] (the same starting point on
/// every rank, a resume, the schedule), driven by [`Trainer::run`].
pub(crate) struct Trainer<'a> {
    ctx: &'a WorkerContext,
    recipe: &'a mut dyn Recipe,
    h: &'a Hyper,
    /// Micro-batches per optimizer step, and samples per micro-batch on this rank.
    accum: usize,
    local_batch: usize,
    trainable: Vec<Tensor>,
    /// Batch-norm running statistics and the like: rank 0's are broadcast before evaluation.
    buffers: Vec<Tensor>,
    update: UpdateStrategy,
    sampler: DistributedSampler,
    schedule: LrSchedule,
    eval_idx: Vec<usize>,
    /// Optimizer steps taken, and where this run ends.
    step: u64,
    total_steps: u64,
    epochs: u64,
    first_epoch: u64,
    /// Steps of the first epoch already taken before a resume.
    skip: u64,
    clock: Clock,
    in_flight: Option<InFlight>,
    /// `cuda_graphs`: the step from which steps go through the graph, and the graph.
    graph_from: Option<u64>,
    captured: Option<CapturedStep<StepScalars>>,
    final_train_loss: f64,
    final_metrics: BTreeMap<String, f64>,
    written: Written,
    writer: CheckpointWriter,
    /// The step profiler, when the job asks for one (`profile`).
    profiler: Option<StepProfiler>,
    profile: Option<trainbook_api::StepProfile>,
}

impl<'a> Trainer<'a> {
    /// Prepares a rank: checks the batch layout, builds the update strategy, resumes when asked,
    /// gives every rank rank 0's parameters, and plans the steps.
    pub(crate) fn new(
        ctx: &'a WorkerContext,
        recipe: &'a mut dyn Recipe,
        h: &'a Hyper,
    ) -> Result<Self> {
        let (rank, world) = (ctx.rank, ctx.world_size);
        let accum = h.grad_accum.max(1);
        let local_batch = local_batch(ctx, h)?;
        let named = trainable_named(recipe);
        let mut update = UpdateStrategy::new(
            optimizer_config(h),
            named,
            h.zero,
            &ctx.pg,
            1.0 / world as f64,
        )?;
        let resumed = match &h.resume_from {
            Some(dir) => Some((
                dir,
                resume(dir, recipe.vars_mut(), &mut update, h, &|m| {
                    ctx.events.log(m)
                })?,
            )),
            None => None,
        };
        // Same starting point everywhere (in a fixed name order).
        ddp::broadcast_parameters(&ctx.pg, &ordered_vars(recipe))?;
        let (trainable, mut buffers) = parameters(recipe);
        if !recipe.buffers_change() {
            // A frozen model (LoRA's base) is the same everywhere from the start broadcast on.
            buffers.clear();
        }
        let sampler = DistributedSampler::new(recipe.train_len(), rank, world, h.seed, true);
        if sampler.len() < world {
            bail!(
                "the training set has {} samples, fewer than the {world} workers",
                recipe.train_len()
            );
        }
        let per_epoch = steps_per_epoch(recipe.train_len(), world, h.global_batch_size, accum);
        let (step, first_epoch, skip) = match &resumed {
            Some((dir, state)) => {
                let at = continue_at(dir, state, world, h, recipe.train_len(), per_epoch)?;
                if rank == 0 {
                    ctx.events
                        .log(format!("resumed from {} at step {}", dir.display(), at.0));
                }
                at
            }
            None => (0, 0, 0),
        };
        let total_steps = match h.max_steps {
            Some(m) => m.min(per_epoch * h.epochs),
            None => per_epoch * h.epochs,
        };
        if step >= total_steps {
            bail!("the checkpoint is already at step {step}, and this job has {total_steps} steps in all: ask for more epochs (or max_steps) to continue training");
        }
        let schedule = LrSchedule::new(h.schedule, h.lr, total_steps, h.warmup_ratio)
            .with_poly(h.constant_ratio, h.poly_power);
        let now = Instant::now();
        let trainer = Trainer {
            eval_idx: sampler::eval_shard(recipe.eval_len(), rank, world),
            ctx,
            recipe,
            h,
            accum,
            local_batch,
            trainable,
            buffers,
            update,
            sampler,
            schedule,
            step,
            total_steps,
            epochs: total_steps.div_ceil(per_epoch),
            first_epoch,
            skip,
            clock: Clock::new(step, total_steps, now),
            in_flight: None,
            graph_from: h.cuda_graphs.then_some(step + graph::EAGER_STEPS),
            captured: None,
            final_train_loss: f64::NAN,
            final_metrics: BTreeMap::new(),
            written: Written::found(
                &ctx.run_dir,
                resumed.as_ref().map(|(d, _)| d.as_path()),
                step,
            ),
            // In the background where the host has cores to spare: on CPU, training uses
            // them all and a background write measured no faster (docs/benchmarks.md).
            writer: CheckpointWriter::new(
                h.checkpoint_async
                    .unwrap_or(!matches!(ctx.device, crate::worker::device::Device::Cpu)),
            ),
            profiler: h.profile.map(|steps| {
                let cuda = matches!(ctx.device, crate::worker::device::Device::Cuda(_));
                StepProfiler::new(steps, &ctx.run_dir, rank, cuda)
            }),
            profile: None,
        };
        heartbeat::set_step(step);
        if rank == 0 {
            checkpoint::remove_staged(&ctx.run_dir);
            trainer.announce();
            if let Some(p) = h
                .profile
                .filter(|p| p.start >= total_steps || p.end <= step)
            {
                ctx.events.log(format!(
                    "profile steps {p} are outside this run's steps {step}..{total_steps}: nothing will be recorded"
                ));
            }
        }
        Ok(trainer)
    }

    /// Rank 0's one line on what this run will do.
    fn announce(&self) {
        let (h, world, accum, local_batch) =
            (self.h, self.ctx.world_size, self.accum, self.local_batch);
        let shard = self.sampler.shard_len();
        let samples = self.sampler.len();
        let warmup = self.schedule.warmup;
        self.ctx.events.log(format!(
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
        ));
    }

    /// Trains every epoch left, evaluating and checkpointing at the end of each; returns this
    /// rank's summary for the driver.
    pub(crate) fn run(mut self) -> Result<WorkerSummary> {
        if let Ok(level) = std::env::var(crate::shared::env::CUDA_SYNC_DEBUG) {
            crate::worker::device::cuda_sync_debug(self.ctx.device, &level)?;
        }
        if self.graph_from.is_some() {
            graph::check(self.ctx.device, self.recipe.staged().is_some())?;
        }
        for epoch in self.first_epoch..self.epochs {
            let sums = self.train_epoch(epoch)?;
            self.end_epoch(epoch, sums)?;
            if self.step >= self.total_steps {
                break;
            }
        }
        // Training ended inside the profiled steps: what was recorded is saved.
        if let Some(path) = self
            .profiler
            .as_mut()
            .map(|p| p.finish())
            .transpose()?
            .flatten()
        {
            self.profiled(&path)?;
        }
        if let Some(f) = self.writer.wait()? {
            self.announce_checkpoint(f);
        }
        Ok(self.summary())
    }

    /// One epoch's optimizer steps over this rank's shard (after a resume, without the steps
    /// the checkpoint had already taken).
    fn train_epoch(&mut self, epoch: u64) -> Result<EpochSums> {
        let order = self.sampler.indices(epoch as usize);
        let mut micro: Vec<&[usize]> = sampler::batches(&order, self.local_batch).collect();
        // Every rank takes part in each of the epoch's micro-batches: one whose shard has
        // ended (an epoch's last step, when the samples left are fewer than the ranks) with
        // an empty one.
        let world = self.ctx.world_size;
        let len = self.sampler.len();
        micro.resize(len.div_ceil(self.local_batch * world), &[]);
        let per_step = self.local_batch * world * self.accum;
        let spare = order.first().copied().unwrap_or(0);
        let planned: Vec<&[usize]> = micro
            .iter()
            .skip(self.skip as usize * self.accum)
            .take((self.total_steps - self.step) as usize * self.accum)
            .copied()
            // A micro-batch without samples is not loaded (its weightless sample is).
            .filter(|b| !b.is_empty())
            .collect();
        {
            let _busy = Busy::new();
            self.recipe.prefetch(Split::Train, epoch, &planned);
        }
        let mut sums = EpochSums::default();
        self.clock.epoch_start = Instant::now();
        for (j, group) in micro.chunks(self.accum).enumerate() {
            if self.step >= self.total_steps {
                break;
            }
            if self.skip > 0 {
                self.skip -= 1;
                continue;
            }
            if let Some(p) = self.profiler.as_mut() {
                p.before_step(self.step)?;
            }
            // The step's samples over all ranks: `per_step` but for the epoch's last.
            let global = ((j + 1) * per_step).min(len) - j * per_step;
            self.step(epoch, group, (global, spare), &mut sums)?;
            let step = self.step;
            if self.profiler.as_ref().is_some_and(|p| p.saves_after(step)) {
                // The last recorded step ends whole on the device before the trace is saved.
                self.settle(&mut sums)?;
            }
            let saved = match self.profiler.as_mut() {
                Some(p) => p.after_step(step)?,
                None => None,
            };
            if let Some(path) = saved {
                self.profiled(&path)?;
            }
        }
        self.settle(&mut sums)?;
        self.clock.train_time += self.clock.epoch_start.elapsed();
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
        let (ctx, h) = (self.ctx, self.h);
        let (rank, world) = (ctx.rank, ctx.world_size);
        let started = Instant::now();
        // Seeded per step and rank, so a run resumed from any step draws the same dropout
        // masks as the run that was not interrupted.
        tch::manual_seed(
            (h.seed as i64)
                .wrapping_mul(1_000_003)
                .wrapping_add((self.step * world as u64 + rank as u64) as i64),
        );
        let lr = self.schedule.at(self.step);
        let scalars = match self.graphed(group)? {
            Some(host) => self.graphed_step(host, lr)?,
            None => {
                if let Some(c) = &self.captured {
                    c.set_lr(lr);
                }
                self.update.zero_grad();
                // This rank's share of the step's samples: 1/world, but for an epoch's last
                // step, whose shards may differ by a sample.
                let mine: usize = group.iter().map(|b| b.len()).sum();
                let even =
                    mine * world == global && group.iter().all(|b| b.len() == mine / group.len());
                let share = if even {
                    1.0 / world as f64
                } else {
                    mine as f64 / global.max(1) as f64
                };
                self.update.set_share(share);
                let mut scalars = StepScalars::default();
                for batch in group {
                    let recipe = &*self.recipe;
                    // Each micro-batch's mean loss, weighted by its part of this rank's samples
                    // (1 / micro-batches when they are equal); a rank with none takes part
                    // in the step's collectives with a weightless sample.
                    let (samples, divisor) = match batch.len() {
                        0 => (std::slice::from_ref(&spare), None),
                        _ if even => (*batch, Some(group.len() as f64)),
                        n => (*batch, Some(mine as f64 / n as f64)),
                    };
                    forward_backward(h, ctx, batch.len(), divisor, &mut scalars, || {
                        recipe.step(Split::Train, samples, true)
                    })?;
                }
                self.update.step(&ctx.pg, share, h.grad_clip, lr)?;
                scalars
            }
        };
        // The step's numbers, sent once the update is queued; the previous step's are read
        // now that this one is queued behind them.
        let n: usize = group.iter().map(|b| b.len()).sum();
        let scalars = scalars.send(ctx.device)?;
        self.settle(sums)?;
        let deferred = scalars.mark.is_some();
        self.in_flight = Some(InFlight {
            scalars,
            epoch,
            index: self.step,
            lr,
        });
        if self.step >= self.clock.steady_from {
            self.clock.steady_samples += n as u64;
            self.clock.steady_time += started.elapsed();
        }
        self.step += 1;
        heartbeat::set_step(self.step);
        self.clock.samples += n as u64;
        let due = self.step < self.total_steps && self.checkpoint_due()?;
        let loss = if due || !deferred {
            self.settle(sums)?
        } else {
            None
        };
        if let (true, Some(l)) = (due, loss) {
            let at = [(metric::TRAIN_LOSS.to_string(), l)].into_iter().collect();
            let dir = ctx.run_dir.checkpoint(&format!("step-{}", self.step));
            self.checkpoint(&dir, epoch, at, true)?;
        }
        if let Some(f) = self.writer.poll()? {
            self.announce_checkpoint(f);
        }
        self.progress(epoch);
        Ok(())
    }

    /// With `cuda_graphs`, once the eager steps are done: the step's batch as host tensors
    /// when it goes through the captured graph; `None` for an eager step (before the capture,
    /// or the short last batch of an epoch, whose shapes the graph does not hold).
    fn graphed(&mut self, group: &[&[usize]]) -> Result<Option<Vec<Tensor>>> {
        let (Some(from), [batch]) = (self.graph_from, group) else {
            return Ok(None);
        };
        if self.step < from || batch.len() != self.local_batch {
            return Ok(None);
        }
        // `graph::check` made sure of a staged step before the first step.
        let staged = self.recipe.staged().context(NO_STAGED_STEP)?;
        Ok(Some(staged.inputs(Split::Train, batch)?))
    }

    /// A step through the CUDA graph: captured (and run) the first time, replayed after.
    fn graphed_step(&mut self, host: Vec<Tensor>, lr: f64) -> Result<StepScalars> {
        if let Some(c) = self.captured.as_mut() {
            c.replay(&host, lr)?;
            self.update.count_replayed_step();
            return Ok(c.outputs.again());
        }
        let (ctx, h) = (self.ctx, self.h);
        let lr_t = self.update.enter_graph()?;
        let _ = lr_t.shallow_clone().fill_(lr);
        // The captured backward pass hands each gradient over into the graph's memory.
        self.update.zero_grad();
        let (recipe, update, n) = (&*self.recipe, &mut self.update, self.local_batch);
        let staged = recipe.staged().context(NO_STAGED_STEP)?;
        let captured = CapturedStep::capture(ctx.device, &host, lr_t, |inputs| {
            let mut scalars = StepScalars::default();
            forward_backward(h, ctx, n, Some(1.0), &mut scalars, || {
                staged.compute(inputs, true)
            })?;
            update.step(&ctx.pg, 1.0, None, lr)?;
            Ok(scalars)
        })?;
        if captured.outputs.batches.iter().any(|b| !b.2.is_empty()) {
            bail!("cuda_graphs: the recipe reports metrics computed on the host, which a replay would not update: leave cuda_graphs off");
        }
        let out = captured.outputs.again();
        ctx.events.log(format!(
            "cuda graphs: step {} captured; the steps after it replay it",
            self.step + 1
        ));
        self.captured = Some(captured);
        Ok(out)
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

    /// Whether this step ends with a step checkpoint: every `checkpoint_every` steps, or when
    /// `checkpoint_every_minutes` have passed on any rank since the last checkpoint (checked
    /// every [`CLOCK_CHECK_EVERY`] steps, by all ranks together).
    fn checkpoint_due(&self) -> Result<bool> {
        let h = self.h;
        if h.checkpoint_every
            .is_some_and(|k| self.step.is_multiple_of(k))
        {
            return Ok(true);
        }
        let Some(minutes) = h.checkpoint_every_minutes else {
            return Ok(false);
        };
        if !self.step.is_multiple_of(CLOCK_CHECK_EVERY) {
            return Ok(false);
        }
        let mine = (self.written.at.elapsed().as_secs_f64() >= minutes * 60.0) as u8 as f64;
        Ok(ddp::allreduce_sums(&self.ctx.pg, &[mine])?[0] > 0.0)
    }

    /// The step's metric events and its log line.
    fn report_step(&self, epoch: u64, step: u64, loss: f64, lr: f64, metrics: &MetricSums) {
        let ev = &self.ctx.events;
        ev.log(format!("train epoch:[{epoch}]\tloss:{loss:.6}"));
        ev.metric(step, epoch, metric::LOSS, loss);
        if self.recipe.perplexity() {
            ev.metric(step, epoch, metric::PERPLEXITY, loss.exp());
        }
        for (name, value) in metrics.means() {
            ev.metric(step, epoch, &name, value);
        }
        if self.ctx.rank == 0 && (self.h.schedule != Schedule::Constant || self.schedule.warmup > 0)
        {
            ev.metric(step, epoch, metric::LR, lr);
        }
    }

    /// Rank 0's progress event, at most every [`PROGRESS_EVERY`] and at the last step.
    fn progress(&mut self, epoch: u64) {
        let at_end = self.step == self.total_steps;
        if self.ctx.rank != 0 || (self.clock.last_progress.elapsed() < PROGRESS_EVERY && !at_end) {
            return;
        }
        self.clock.last_progress = Instant::now();
        let secs = (self.clock.train_time + self.clock.epoch_start.elapsed()).as_secs_f64();
        let samples = self.clock.samples * self.ctx.world_size as u64;
        self.ctx.events.send(Event::Progress {
            rank: 0,
            step: self.step,
            total_steps: self.total_steps,
            epoch,
            epochs: self.epochs,
            samples,
            samples_per_second: if secs > 0.0 {
                samples as f64 / secs
            } else {
                0.0
            },
        });
    }

    /// Evaluates this rank's disjoint shard of the evaluation set (with rank 0's buffers).
    fn evaluate(&mut self, epoch: u64) -> Result<EvalSums> {
        if !self.buffers.is_empty() {
            ddp::broadcast_parameters(&self.ctx.pg, &self.buffers)?;
        }
        let batches: Vec<&[usize]> =
            sampler::batches(&self.eval_idx, self.local_batch.max(32)).collect();
        {
            let _busy = Busy::new();
            self.recipe.prefetch(Split::Eval, epoch, &batches);
        }
        let (precision, device) = (self.h.precision, self.ctx.device);
        tch::no_grad(|| -> Result<EvalSums> {
            let mut e = EvalSums::default();
            for batch in batches.iter().copied() {
                let out = autocast(precision, device, || {
                    self.recipe.step(Split::Eval, batch, false)
                })?;
                e.loss += out.loss.double_value(&[]) * batch.len() as f64;
                e.n += batch.len() as f64;
                if let Some((logits, labels)) = &out.predictions {
                    e.confusion.add(logits, labels)?;
                }
                e.metrics.add(&out.all_metrics(), batch.len());
                for (name, num, den) in &out.ratios {
                    e.metrics.add_ratio(name, *num, *den);
                }
                heartbeat::tick();
            }
            Ok(e)
        })
    }

    /// The end of an epoch: evaluation, the epoch's metrics summed over ranks, rank 0's
    /// epoch lines (as the reference notebooks print them) and the epoch checkpoint.
    fn end_epoch(&mut self, epoch: u64, train: EpochSums) -> Result<()> {
        let eval = self.evaluate(epoch)?;
        let metrics = self.epoch_metrics(&train, &eval)?;
        self.final_train_loss = metrics[metric::EPOCH_TRAIN_LOSS];
        self.final_metrics = metrics;
        if self.ctx.rank == 0 {
            for (k, v) in &self.final_metrics {
                self.ctx.events.metric(self.step, epoch, k, *v);
            }
            self.log_epoch(epoch);
        }
        let dir = self.ctx.run_dir.checkpoint(&format!("epoch-{epoch}"));
        self.checkpoint(&dir, epoch, self.final_metrics.clone(), false)
    }

    /// The epoch's metrics, summed over ranks in one all-reduce: losses, accuracy, the
    /// recipe's own metrics and exact classification scores, then throughput.
    fn epoch_metrics(&self, train: &EpochSums, eval: &EvalSums) -> Result<BTreeMap<String, f64>> {
        let (pg, world) = (&self.ctx.pg, self.ctx.world_size);
        // The vector's layout depends on the metric names and the number of classes, so ranks
        // first check they agree on it.
        let layout = [
            train.metrics.len() as f64,
            eval.metrics.len() as f64,
            eval.confusion.classes() as f64,
        ];
        let agreed = ddp::allreduce_sums(pg, &layout)?
            .iter()
            .zip(layout)
            .all(|(sum, mine)| *sum == mine * world as f64);
        if !agreed && self.ctx.rank == 0 {
            self.ctx.events.log("warning: the ranks reported different metric names or numbers of classes this epoch; only the loss is aggregated".to_string());
        }
        let mut local = vec![
            train.loss,
            train.n,
            eval.loss,
            eval.n,
            train.correct,
            train.counted,
        ];
        if agreed {
            local.extend(train.metrics.to_sums());
            local.extend(eval.metrics.to_sums());
            local.extend(eval.confusion.to_sums());
        }
        let sums = ddp::allreduce_sums(pg, &local)?;
        let mut m = BTreeMap::new();
        m.insert(
            metric::EPOCH_TRAIN_LOSS.to_string(),
            sums[0] / sums[1].max(1.0),
        );
        if sums[5] > 0.0 {
            m.insert(metric::EPOCH_TRAIN_ACCURACY.to_string(), sums[4] / sums[5]);
        }
        if sums[3] > 0.0 {
            m.insert(metric::EVAL_LOSS.to_string(), sums[2] / sums[3]);
        }
        if agreed {
            let (train_user, rest) = sums[6..].split_at(train.metrics.sums_len());
            for (name, v) in train.metrics.means_of(train_user) {
                m.insert(metric::epoch_train(&name), v);
            }
            let (eval_user, rest) = rest.split_at(eval.metrics.sums_len());
            for (name, v) in eval.metrics.means_of(eval_user) {
                m.insert(metric::eval(&name), v);
            }
            let confusion = Confusion::from_sums(eval.confusion.classes(), rest);
            m.extend(confusion.scores(metric::EVAL_PREFIX));
        }
        if self.recipe.perplexity() {
            // exp of the mean loss, not the mean of per-batch perplexities.
            for (loss, ppl) in [
                (metric::EPOCH_TRAIN_LOSS, metric::EPOCH_TRAIN_PERPLEXITY),
                (metric::EVAL_LOSS, metric::EVAL_PERPLEXITY),
            ] {
                if let Some(l) = m.get(loss).copied() {
                    m.insert(ppl.to_string(), l.exp());
                }
            }
        }
        let c = &self.clock;
        let sps = c.samples as f64 * world as f64 / c.train_time.as_secs_f64().max(1e-9);
        m.insert(metric::SAMPLES_PER_SECOND.to_string(), sps);
        if c.steady_time > Duration::ZERO {
            m.insert(
                metric::TRAIN_SAMPLES_PER_SECOND.to_string(),
                c.steady_samples as f64 * world as f64 / c.steady_time.as_secs_f64(),
            );
        }
        Ok(m)
    }

    /// The reference notebooks' per-epoch lines.
    fn log_epoch(&self, epoch: u64) {
        let m = &self.final_metrics;
        let acc = |k: &str| {
            m.get(k)
                .map(|a| format!(" Acc: {a:.4}"))
                .unwrap_or_default()
        };
        self.ctx.events.log(format!(
            "Epoch {epoch}-train Loss: {:.4}{} ({:.1} samples/s)",
            m[metric::EPOCH_TRAIN_LOSS],
            acc(metric::EPOCH_TRAIN_ACCURACY),
            m[metric::SAMPLES_PER_SECOND],
        ));
        if let Some(l) = m.get(metric::EVAL_LOSS) {
            let f1 = m
                .get(metric::EVAL_F1)
                .or(m.get(metric::EVAL_F1_MACRO))
                .map(|f| format!(" F1: {f:.4}"))
                .unwrap_or_default();
            self.ctx.events.log(format!(
                "Epoch {epoch}-val Loss: {l:.4}{}{f1}",
                acc(metric::EVAL_ACCURACY)
            ));
        }
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
        self.written.at = Instant::now();
        let opt_state = self.update.checkpoint_state(&self.ctx.pg)?;
        if self.ctx.rank != 0 {
            return Ok(());
        }
        let h = self.h;
        let state = TrainerState {
            epoch,
            step: self.step,
            world_size: Some(self.ctx.world_size),
            global_batch_size: Some(h.global_batch_size),
            grad_accum: Some(self.accum),
            hyper: serde_json::to_value(h)?,
            metrics,
        };
        let contents = Contents {
            optimizer: &opt_state,
            state,
            step_checkpoint,
        };
        let (done, note) = self.writer.write(dir, &*self.recipe, contents)?;
        if let Some(note) = note {
            self.ctx.events.log(format!("warning: {note}"));
        }
        for f in done {
            self.announce_checkpoint(f);
        }
        Ok(())
    }

    /// A checkpoint is in place: it becomes the latest, step checkpoints beyond
    /// `keep_checkpoints` are removed, and the driver hears of it (a restart resumes from it).
    fn announce_checkpoint(&mut self, f: Finished) {
        self.retire_latest(f.dir.clone());
        if f.step_checkpoint {
            self.written.steps.push_back(f.dir.clone());
            while self.written.steps.len() > self.h.keep_checkpoints.unwrap_or(usize::MAX) {
                if let Some(old) = self.written.steps.pop_front() {
                    std::fs::remove_dir_all(&old).ok();
                }
            }
        }
        self.ctx.events.send(Event::Checkpoint {
            rank: 0,
            step: f.step,
            epoch: f.epoch,
            path: f.dir.display().to_string(),
        });
    }

    /// A checkpoint that is no longer the latest gives up its optimizer state, which is as
    /// large as the model (AdamW: twice): a resume normally starts from the latest. Step
    /// checkpoints under `keep_checkpoints` keep theirs, since that bound is the user's choice
    /// of what to resume from.
    fn retire_latest(&mut self, latest: PathBuf) {
        if let Some(prev) = self.written.latest.replace(latest) {
            if self.h.keep_checkpoints.is_none() || !self.written.steps.contains(&prev) {
                std::fs::remove_file(prev.join(checkpoint::OPTIMIZER)).ok();
            }
        }
    }

    /// A trace was saved: rank 0 sums it into the top-ops table (and says where it is).
    fn profiled(&mut self, path: &Path) -> Result<()> {
        if self.ctx.rank != 0 {
            return Ok(());
        }
        let steps = self.h.profile.expect("a profiler was asked for");
        let summary = profiler::summarize(path, steps)?;
        self.ctx.events.log(format!(
            "profiled steps {}: {:.1} ms a step, top operator {}; Chrome traces in {} (Perfetto, TensorBoard)",
            summary.steps,
            summary.step_ms,
            summary.ops.first().map_or("none", |o| o.name.as_str()),
            path.parent().unwrap_or(path).display()
        ));
        self.profile = Some(summary);
        Ok(())
    }

    /// This rank's summary: steps, throughput, final metrics, a parameter fingerprint, memory.
    fn summary(self) -> WorkerSummary {
        let vs = self.recipe.vars();
        let (param_sum, param_l2) = param_stats(vs);
        let (optimizer_state, buffers) = self.update.memory();
        let bytes = |t: &Tensor| t.numel() as u64 * t.kind().elt_size_in_bytes() as u64;
        let memory = trainbook_api::MemoryUse {
            rank: self.ctx.rank,
            parameters: vs.variables().values().map(bytes).sum(),
            gradients: self
                .trainable
                .iter()
                .map(|p| p.grad())
                .filter(|g| g.defined())
                .map(|g| bytes(&g))
                .sum(),
            optimizer_state,
            buffers,
            // The worker adds the device's peak (it knows the device's plugins).
            peak: 0,
            peak_of: String::new(),
        };
        WorkerSummary {
            steps: self.step,
            epochs: self.epochs,
            samples: self.clock.samples,
            train_seconds: self.clock.train_time.as_secs_f64(),
            final_train_loss: self.final_train_loss,
            param_sum,
            param_l2,
            device: self.ctx.device_name.clone(),
            metrics: self.final_metrics,
            memory,
            profile: self.profile,
        }
    }
}

/// Samples per forward pass on one worker, with a note when the global batch does not divide.
fn local_batch(ctx: &WorkerContext, h: &Hyper) -> Result<usize> {
    let (world, accum) = (ctx.world_size, h.grad_accum.max(1));
    let local_batch = h.local_batch(world)?;
    if ctx.rank == 0 && !h.global_batch_size.is_multiple_of(world * accum) {
        ctx.events.log(format!(
            "note: global batch {} is not divisible by {world} workers x {accum} micro-batches; using {} per micro-batch ({} in all)",
            h.global_batch_size,
            local_batch,
            local_batch * world * accum
        ));
    }
    Ok(local_batch)
}

/// The recipe's variables in a fixed name order, so every rank lists them alike.
fn ordered_vars(recipe: &dyn Recipe) -> Vec<Tensor> {
    let vars = recipe.vars().variables();
    let mut names: Vec<&String> = vars.keys().collect();
    names.sort();
    names.iter().map(|n| vars[*n].shallow_clone()).collect()
}

/// The trainable parameters, by name in name order, for the update strategy.
fn trainable_named(recipe: &dyn Recipe) -> Vec<(String, Tensor)> {
    let vars = recipe.vars().variables();
    let mut named: Vec<(String, Tensor)> = vars
        .iter()
        .filter(|(_, t)| t.requires_grad())
        .map(|(n, t)| (n.clone(), t.shallow_clone()))
        .collect();
    named.sort_by(|a, b| a.0.cmp(&b.0));
    named
}

/// (trainable parameters, buffers), each in name order.
fn parameters(recipe: &dyn Recipe) -> (Vec<Tensor>, Vec<Tensor>) {
    let (trainable, buffers): (Vec<Tensor>, Vec<Tensor>) = ordered_vars(recipe)
        .into_iter()
        .partition(|t| t.requires_grad());
    (trainable, buffers)
}
