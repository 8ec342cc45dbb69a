//! The data-parallel training loop every recipe shares: sharded batches, bucketed gradient
//! all-reduce, per-step loss, per-epoch evaluation (all-reduced), checkpoints, events.

use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use tch::nn;
use tch::{Kind, Tensor};

use crate::checkpoint::{self, TrainerState};
use crate::ddp;
use crate::dist::ProcessGroup;
use crate::events::{Emitter, Event, WorkerSummary};
use crate::optim::{LrSchedule, OptimizerConfig};
use crate::precision::autocast;
use crate::recipe::{Hyper, Recipe, Split};
use crate::sampler::{self, DistributedSampler};
use crate::scores::Confusion;
use crate::update::Update;

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

/// One rank's evaluation of an epoch.
#[derive(Default)]
struct EvalSums {
    loss: f64,
    n: f64,
    confusion: Confusion,
    metrics: MetricSums,
}

/// Where a worker stands in its job.
pub struct WorkerContext {
    pub rank: usize,
    pub world_size: usize,
    pub device: crate::device::Device,
    pub device_name: String,
    pub pg: ProcessGroup,
    pub events: Emitter,
    pub run_dir: std::path::PathBuf,
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
            crate::spec::OptimizerKind::Lamb | crate::spec::OptimizerKind::Lans => 1e-6,
            _ => 1e-8,
        },
    }
}

/// Optimizer steps per epoch: each of `world` ranks takes `train_len / world` samples in
/// micro-batches of `global_batch / (world * accum)`, `accum` micro-batches a step.
pub fn steps_per_epoch(train_len: usize, world: usize, global_batch: usize, accum: usize) -> u64 {
    let local_batch = (global_batch / (world * accum)).max(1);
    (train_len / world).div_ceil(local_batch).div_ceil(accum) as u64
}

/// Loads weights and optimizer state from `dir`; returns its trainer state.
fn resume(
    dir: &Path,
    vs: &mut nn::VarStore,
    update: &mut Update,
    h: &Hyper,
    log: &dyn Fn(String),
) -> Result<TrainerState> {
    let state = TrainerState::read(dir)?;
    vs.load(dir.join(checkpoint::MODEL))
        .with_context(|| format!("loading the weights of {}", dir.display()))?;
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
/// The data order depends on the worker count, the batch and the accumulation. With the same
/// values the run continues mid-epoch exactly where the checkpoint left it; with another
/// worker count (the optimizer state is whole in every checkpoint, ZeRO's too) only from the
/// end of an epoch, since a mid-epoch position means nothing in another sharding.
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
    let then_world = state.world_size.unwrap_or(world);
    if same_batch && then_world == world {
        return Ok((step, step / steps_per_epoch, step % steps_per_epoch));
    }
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
    let then_per_epoch = steps_per_epoch_of(
        train_len,
        then_world,
        h.global_batch_size,
        h.grad_accum.max(1),
    );
    if step % then_per_epoch != 0 {
        bail!(
            "cannot resume from {} with {world} workers: it was written in the middle of an epoch by {then_world} workers, whose data order only {then_world} workers can continue. Resume with {then_world} workers, or from a checkpoint written at the end of an epoch to change the worker count",
            dir.display()
        );
    }
    Ok((step, step / then_per_epoch, 0))
}

fn steps_per_epoch_of(train_len: usize, world: usize, global_batch: usize, accum: usize) -> u64 {
    steps_per_epoch(train_len, world, global_batch, accum).max(1)
}

/// Sum and L2 norm of all trainable parameters, in f64.
pub fn param_stats(vs: &nn::VarStore) -> (f64, f64) {
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

/// A checkpoint that is no longer the latest gives up its optimizer state, which is as large
/// as the model (AdamW: twice): a resume normally starts from the latest. Step checkpoints
/// under `keep_checkpoints` keep theirs, since that bound is the user's choice of what to
/// resume from.
fn retire(
    previous: Option<std::path::PathBuf>,
    step_checkpoints: &std::collections::VecDeque<std::path::PathBuf>,
    h: &Hyper,
) {
    if let Some(prev) = previous {
        if h.keep_checkpoints.is_none() || !step_checkpoints.contains(&prev) {
            std::fs::remove_file(prev.join(checkpoint::OPTIMIZER)).ok();
        }
    }
}

/// Writes a checkpoint directory (weights, optimizer state, trainer state) atomically.
/// `at`: epoch, step, workers, micro-batches per step.
fn write_checkpoint(
    dir: &Path,
    recipe: &dyn Recipe,
    opt_state: &[(String, Tensor)],
    h: &Hyper,
    at: (u64, u64, usize, usize),
    metrics: std::collections::BTreeMap<String, f64>,
) -> Result<()> {
    let (epoch, step, world, accum) = at;
    if let Some(parent) = dir.parent() {
        std::fs::create_dir_all(parent)
            .with_context(|| format!("creating {}", parent.display()))?;
    }
    let state = TrainerState {
        epoch,
        step,
        world_size: Some(world),
        global_batch_size: Some(h.global_batch_size),
        grad_accum: Some(accum),
        hyper: serde_json::to_value(h)?,
        metrics,
    };
    checkpoint::write_dir_atomic(dir, |tmp| {
        recipe.save(tmp)?;
        crate::optim::save_state(opt_state, &tmp.join(checkpoint::OPTIMIZER))?;
        std::fs::write(
            tmp.join(checkpoint::TRAINER_STATE),
            serde_json::to_vec_pretty(&state)?,
        )?;
        Ok(())
    })
}

pub fn run(ctx: &WorkerContext, recipe: &mut dyn Recipe, h: &Hyper) -> Result<WorkerSummary> {
    let (rank, world) = (ctx.rank, ctx.world_size);
    let ev = &ctx.events;
    let accum = h.grad_accum.max(1);
    if h.global_batch_size < world * accum {
        bail!(
            "global batch size {} is smaller than {world} workers x {accum} micro-batches",
            h.global_batch_size
        );
    }
    // Samples per forward pass on one worker.
    let local_batch = h.global_batch_size / (world * accum);
    if rank == 0 && !h.global_batch_size.is_multiple_of(world * accum) {
        ev.log(format!(
            "note: global batch {} is not divisible by {world} workers x {accum} micro-batches; using {} per micro-batch ({} in all)",
            h.global_batch_size,
            local_batch,
            local_batch * world * accum
        ));
    }

    // Same starting point everywhere (in a fixed name order), then different dropout streams
    // per rank.
    let names: Vec<String> = {
        let mut v: Vec<String> = recipe.vars().variables().into_keys().collect();
        v.sort();
        v
    };
    let trainable: Vec<(String, Tensor)> = {
        let vars = recipe.vars().variables();
        names
            .iter()
            .filter(|n| vars[*n].requires_grad())
            .map(|n| (n.clone(), vars[n].shallow_clone()))
            .collect()
    };
    let shallow = trainable
        .iter()
        .map(|(n, t)| (n.clone(), t.shallow_clone()))
        .collect();
    let mut update = Update::new(optimizer_config(h), shallow, h.zero, rank, world);
    let resumed = match &h.resume_from {
        Some(dir) => Some((
            dir,
            resume(dir, recipe.vars_mut(), &mut update, h, &|m| ev.log(m))?,
        )),
        None => None,
    };
    let vs = recipe.vars();
    let vars = vs.variables();
    let ordered: Vec<Tensor> = names.iter().map(|n| vars[n].shallow_clone()).collect();
    ddp::broadcast_parameters(&ctx.pg, &ordered)?;
    // Buffers (batch-norm running statistics) drift apart per rank; rank 0's are broadcast
    // before each evaluation, as DDP does before each forward.
    let buffers: Vec<Tensor> = names
        .iter()
        .filter(|n| !vars[*n].requires_grad())
        .map(|n| vars[n].shallow_clone())
        .collect();

    let sampler = DistributedSampler::new(recipe.train_len(), rank, world, h.seed, true);
    let shard = sampler.shard_len();
    if shard == 0 {
        bail!(
            "the training set has {} samples, fewer than the {world} workers",
            recipe.train_len()
        );
    }
    let steps_per_epoch = steps_per_epoch(recipe.train_len(), world, h.global_batch_size, accum);
    let (mut step, first_epoch, mut skip) = match &resumed {
        Some((dir, state)) => {
            let at = continue_at(dir, state, world, h, recipe.train_len(), steps_per_epoch)?;
            if rank == 0 {
                ev.log(format!("resumed from {} at step {}", dir.display(), at.0));
            }
            at
        }
        None => (0, 0, 0),
    };
    let total_steps = match h.max_steps {
        Some(m) => m.min(steps_per_epoch * h.epochs),
        None => steps_per_epoch * h.epochs,
    };
    let epochs = total_steps.div_ceil(steps_per_epoch);
    let schedule = LrSchedule::new(h.schedule, h.lr, total_steps, h.warmup_ratio)
        .with_poly(h.constant_ratio, h.poly_power);
    let warmup = schedule.warmup;
    if step >= total_steps {
        bail!("the checkpoint is already at step {step}, and this job has {total_steps} steps in all: ask for more epochs (or max_steps) to continue training");
    }
    if rank == 0 {
        ev.log(format!(
            "training {} samples ({} per worker) for {epochs} epoch(s), {total_steps} steps, global batch {}{}, {} lr {} ({} schedule{}){}",
            shard * world,
            shard,
            local_batch * world * accum,
            if accum > 1 { format!(" ({accum} micro-batches of {local_batch} per worker)") } else { String::new() },
            h.optimizer,
            h.lr,
            h.schedule,
            match (warmup, h.schedule == crate::optim::Schedule::Poly) {
                (0, false) => String::new(),
                (w, false) => format!(", {w} warm-up steps"),
                (w, true) => format!(", {w} warm-up + {} constant steps, power {}", schedule.constant, h.poly_power),
            },
            if h.precision == crate::precision::Precision::Bf16 { ", bf16 autocast" } else { "" },
        ));
    }

    let eval_idx = sampler::eval_shard(recipe.eval_len(), rank, world);
    let perplexity = recipe.perplexity();
    let mut samples: u64 = 0;
    let mut train_time = Duration::ZERO;
    let mut last_progress = Instant::now() - PROGRESS_EVERY;
    let mut final_train_loss = f64::NAN;
    let mut final_metrics = std::collections::BTreeMap::new();
    let mut last_checkpoint: Option<std::path::PathBuf> = None;
    let mut step_checkpoints: std::collections::VecDeque<std::path::PathBuf> = Default::default();
    // Throughput without the first steps (allocator, caches and thread pools warming up), as
    // BERT pre-training scripts report it.
    let steady_from = step
        + (total_steps - step)
            .div_ceil(10)
            .min(THROUGHPUT_WARMUP_STEPS);
    let (mut steady_samples, mut steady_time) = (0u64, Duration::ZERO);

    'epochs: for epoch in first_epoch..epochs {
        let order = sampler.indices(epoch as usize);
        let micro: Vec<&[usize]> = sampler::batches(&order, local_batch).collect();
        let planned: Vec<&[usize]> = micro
            .iter()
            .skip(skip as usize * accum)
            .take((total_steps - step) as usize * accum)
            .copied()
            .collect();
        recipe.plan(Split::Train, epoch, &planned);
        let (mut loss_sum, mut loss_n, mut correct, mut counted) = (0.0f64, 0.0f64, 0.0f64, 0.0);
        let mut epoch_metrics = MetricSums::default();
        let t0 = Instant::now();
        for group in micro.chunks(accum) {
            if step >= total_steps {
                break;
            }
            if skip > 0 {
                skip -= 1;
                continue;
            }
            let step_start = Instant::now();
            // Seeded per step and rank, so a run resumed from any step draws the same dropout
            // masks as the run that was not interrupted.
            tch::manual_seed(
                (h.seed as i64)
                    .wrapping_mul(1_000_003)
                    .wrapping_add((step * world as u64 + rank as u64) as i64),
            );
            update.zero_grad();
            let (mut group_loss, mut group_n) = (0.0f64, 0usize);
            let mut group_metrics = MetricSums::default();
            for batch in group {
                let (loss, hits, metrics) = autocast(h.precision, ctx.device, || {
                    let out = recipe.step(Split::Train, batch, true)?;
                    let hits = match &out.predictions {
                        Some((logits, labels)) => {
                            Some(logits.argmax(-1, false).eq_tensor(labels).sum(Kind::Int64))
                        }
                        None => None,
                    };
                    Ok((out.loss, hits, out.metrics))
                })?;
                if let Some(hits) = hits {
                    correct += hits.double_value(&[]);
                    counted += batch.len() as f64;
                }
                // Gradients add up over micro-batches; average them like one big batch.
                (&loss / group.len() as f64).backward();
                group_loss += loss.double_value(&[]) * batch.len() as f64;
                group_n += batch.len();
                group_metrics.add(&metrics, batch.len());
            }
            // Each rank's share of the global batch (equal shards: 1/world).
            let lr = schedule.at(step);
            update.step(&ctx.pg, 1.0 / world as f64, h.grad_clip, lr)?;
            let l = group_loss / group_n.max(1) as f64;
            if !l.is_finite() {
                bail!("loss became {l} at step {step} (epoch {epoch}): lower the learning rate or enable gradient clipping");
            }
            if step >= steady_from {
                steady_samples += group_n as u64;
                steady_time += step_start.elapsed();
            }
            step += 1;
            samples += group_n as u64;
            loss_sum += group_loss;
            loss_n += group_n as f64;
            ev.log(format!("train epoch:[{epoch}]\tloss:{l:.6}"));
            ev.metric(step, epoch, "loss", l);
            if perplexity {
                ev.metric(step, epoch, "perplexity", l.exp());
            }
            for (name, value) in group_metrics.means() {
                ev.metric(step, epoch, &name, value);
            }
            epoch_metrics.merge(&group_metrics);
            if rank == 0 && (h.schedule != crate::optim::Schedule::Constant || warmup > 0) {
                ev.metric(step, epoch, "lr", lr);
            }
            if h.checkpoint_every.is_some_and(|n| step % n == 0) && step < total_steps {
                // Every rank: ZeRO gathers the state from all of them.
                let opt_state = update.checkpoint_state(&ctx.pg)?;
                if rank != 0 {
                    continue;
                }
                let dir = ctx.run_dir.join("checkpoints").join(format!("step-{step}"));
                let metrics = [("train_loss".to_string(), l)].into_iter().collect();
                write_checkpoint(
                    &dir,
                    recipe,
                    &opt_state,
                    h,
                    (epoch, step, world, accum),
                    metrics,
                )?;
                retire(last_checkpoint.replace(dir.clone()), &step_checkpoints, h);
                step_checkpoints.push_back(dir.clone());
                while step_checkpoints.len() > h.keep_checkpoints.unwrap_or(usize::MAX) {
                    if let Some(old) = step_checkpoints.pop_front() {
                        std::fs::remove_dir_all(&old).ok();
                    }
                }
                ev.send(Event::Checkpoint {
                    rank,
                    step,
                    epoch,
                    path: dir.display().to_string(),
                });
            }
            if rank == 0 && (last_progress.elapsed() >= PROGRESS_EVERY || step == total_steps) {
                last_progress = Instant::now();
                let secs = (train_time + t0.elapsed()).as_secs_f64();
                ev.send(Event::Progress {
                    rank,
                    step,
                    total_steps,
                    epoch,
                    epochs,
                    samples: samples * world as u64,
                    samples_per_second: if secs > 0.0 {
                        (samples * world as u64) as f64 / secs
                    } else {
                        0.0
                    },
                });
            }
        }
        train_time += t0.elapsed();

        // Evaluation: each rank its own disjoint shard, then one all-reduce of the sums.
        if !buffers.is_empty() {
            ddp::broadcast_parameters(&ctx.pg, &buffers)?;
        }
        let eval_batches: Vec<&[usize]> =
            sampler::batches(&eval_idx, local_batch.max(32)).collect();
        recipe.plan(Split::Eval, epoch, &eval_batches);
        let eval = tch::no_grad(|| -> Result<EvalSums> {
            let mut e = EvalSums::default();
            for batch in eval_batches.iter().copied() {
                let out = autocast(h.precision, ctx.device, || {
                    recipe.step(Split::Eval, batch, false)
                })?;
                e.loss += out.loss.double_value(&[]) * batch.len() as f64;
                e.n += batch.len() as f64;
                if let Some((logits, labels)) = &out.predictions {
                    e.confusion.add(logits, labels)?;
                }
                e.metrics.add(&out.metrics, batch.len());
            }
            Ok(e)
        })?;
        // Each rank's counts in one vector, summed over ranks. Its layout depends on the metric
        // names and the number of classes, so ranks first check they agree on it.
        let layout = [
            epoch_metrics.len() as f64,
            eval.metrics.len() as f64,
            eval.confusion.classes() as f64,
        ];
        let agreed = ddp::allreduce_sums(&ctx.pg, &layout)?
            .iter()
            .zip(layout)
            .all(|(sum, mine)| *sum == mine * world as f64);
        if !agreed && rank == 0 {
            ev.log("warning: the ranks reported different metric names or numbers of classes this epoch; only the loss is aggregated".to_string());
        }
        let mut local = vec![loss_sum, loss_n, eval.loss, eval.n, correct, counted];
        if agreed {
            local.extend(epoch_metrics.to_sums());
            local.extend(eval.metrics.to_sums());
            local.extend(eval.confusion.to_sums());
        }
        let sums = ddp::allreduce_sums(&ctx.pg, &local)?;
        let train_loss = sums[0] / sums[1].max(1.0);
        final_train_loss = train_loss;
        final_metrics.insert("epoch_train_loss".to_string(), train_loss);
        if sums[5] > 0.0 {
            final_metrics.insert("epoch_train_accuracy".to_string(), sums[4] / sums[5]);
        }
        if sums[3] > 0.0 {
            final_metrics.insert("eval_loss".to_string(), sums[2] / sums[3]);
        }
        if agreed {
            let mut rest = &sums[6..];
            let (train_user, tail) = rest.split_at(epoch_metrics.sums_len());
            rest = tail;
            for (name, v) in epoch_metrics.means_of(train_user) {
                final_metrics.insert(format!("epoch_train_{name}"), v);
            }
            let (eval_user, tail) = rest.split_at(eval.metrics.sums_len());
            rest = tail;
            for (name, v) in eval.metrics.means_of(eval_user) {
                final_metrics.insert(format!("eval_{name}"), v);
            }
            let confusion = Confusion::from_sums(eval.confusion.classes(), rest);
            final_metrics.extend(confusion.scores("eval_"));
        }
        if perplexity {
            // exp of the mean loss, not the mean of per-batch perplexities.
            for split in ["epoch_train", "eval"] {
                if let Some(l) = final_metrics.get(&format!("{split}_loss")).copied() {
                    final_metrics.insert(format!("{split}_perplexity"), l.exp());
                }
            }
        }
        let sps = samples as f64 * world as f64 / train_time.as_secs_f64().max(1e-9);
        final_metrics.insert("samples_per_second".to_string(), sps);
        if steady_time > Duration::ZERO {
            final_metrics.insert(
                "train_samples_per_second".to_string(),
                steady_samples as f64 * world as f64 / steady_time.as_secs_f64(),
            );
        }
        // Every rank: ZeRO gathers the state from all of them.
        let opt_state = update.checkpoint_state(&ctx.pg)?;
        if rank == 0 {
            for (k, v) in &final_metrics {
                ev.metric(step, epoch, k, *v);
            }
            // The reference notebooks' per-epoch lines.
            let acc = |k: &str| {
                final_metrics
                    .get(k)
                    .map(|a| format!(" Acc: {a:.4}"))
                    .unwrap_or_default()
            };
            ev.log(format!(
                "Epoch {epoch}-train Loss: {train_loss:.4}{} ({sps:.1} samples/s)",
                acc("epoch_train_accuracy")
            ));
            if let Some(l) = final_metrics.get("eval_loss") {
                let f1 = final_metrics
                    .get("eval_f1")
                    .or(final_metrics.get("eval_f1_macro"))
                    .map(|f| format!(" F1: {f:.4}"))
                    .unwrap_or_default();
                ev.log(format!(
                    "Epoch {epoch}-val Loss: {l:.4}{}{f1}",
                    acc("eval_accuracy")
                ));
            }
            let dir = ctx
                .run_dir
                .join("checkpoints")
                .join(format!("epoch-{epoch}"));
            write_checkpoint(
                &dir,
                recipe,
                &opt_state,
                h,
                (epoch, step, world, accum),
                final_metrics.clone(),
            )?;
            retire(last_checkpoint.replace(dir.clone()), &step_checkpoints, h);
            ev.send(Event::Checkpoint {
                rank,
                step,
                epoch,
                path: dir.display().to_string(),
            });
        }
        if step >= total_steps {
            break 'epochs;
        }
    }

    let (param_sum, param_l2) = param_stats(vs);
    let (optimizer_state, buffers) = update.memory();
    let bytes = |t: &Tensor| t.numel() as u64 * t.kind().elt_size_in_bytes() as u64;
    let memory = trainbook_api::job::MemoryUse {
        rank,
        parameters: vs.variables().values().map(bytes).sum(),
        gradients: trainable
            .iter()
            .map(|(_, p)| p.grad())
            .filter(|g| g.defined())
            .map(|g| bytes(&g))
            .sum(),
        optimizer_state,
        buffers,
        // The worker adds the device's peak (it knows the device's plugins).
        peak: 0,
        peak_of: String::new(),
    };
    Ok(WorkerSummary {
        steps: step,
        epochs,
        samples,
        train_seconds: train_time.as_secs_f64(),
        final_train_loss,
        param_sum,
        param_l2,
        device: ctx.device_name.clone(),
        metrics: final_metrics,
        memory,
    })
}
