//! The data-parallel training loop every recipe shares: sharded batches, bucketed gradient
//! all-reduce, per-step loss, per-epoch evaluation (all-reduced), checkpoints, events.

use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use tch::nn::{self, OptimizerConfig};
use tch::{Kind, Tensor};

use crate::ddp::{self, GradSync};
use crate::dist::ProcessGroup;
use crate::events::{Emitter, Event, WorkerSummary};
use crate::recipes::{Hyper, Recipe, Split};
use crate::sampler::{self, DistributedSampler};
use crate::spec::OptimizerKind;

/// Where a worker stands in its job.
pub struct WorkerContext {
    pub rank: usize,
    pub world_size: usize,
    pub device: tch::Device,
    pub device_name: String,
    pub pg: ProcessGroup,
    pub events: Emitter,
    pub run_dir: std::path::PathBuf,
}

/// Progress events are rate-limited: a notebook does not need 1000 updates a second.
const PROGRESS_EVERY: Duration = Duration::from_millis(100);

fn optimizer(vs: &nn::VarStore, h: &Hyper) -> Result<nn::Optimizer> {
    Ok(match h.optimizer {
        OptimizerKind::Sgd => nn::Sgd {
            momentum: h.momentum,
            dampening: 0.0,
            wd: h.weight_decay,
            nesterov: false,
        }
        .build(vs, h.lr)?,
        OptimizerKind::Adamw => nn::AdamW {
            wd: h.weight_decay,
            ..Default::default()
        }
        .build(vs, h.lr)?,
    })
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

pub fn run(ctx: &WorkerContext, recipe: &dyn Recipe, h: &Hyper) -> Result<WorkerSummary> {
    let (rank, world) = (ctx.rank, ctx.world_size);
    let ev = &ctx.events;
    let vs = recipe.vars();
    if h.global_batch_size < world {
        bail!(
            "global batch size {} is smaller than the world size {world}",
            h.global_batch_size
        );
    }
    let local_batch = h.global_batch_size / world;
    if rank == 0 && !h.global_batch_size.is_multiple_of(world) {
        ev.log(format!(
            "note: global batch {} is not divisible by {world} workers; using {} per worker ({} in all)",
            h.global_batch_size,
            local_batch,
            local_batch * world
        ));
    }

    // Same starting point everywhere (in a fixed name order), then different dropout streams
    // per rank.
    let names: Vec<String> = {
        let mut v: Vec<String> = vs.variables().into_keys().collect();
        v.sort();
        v
    };
    let vars = vs.variables();
    let ordered: Vec<Tensor> = names.iter().map(|n| vars[n].shallow_clone()).collect();
    ddp::broadcast_parameters(&ctx.pg, &ordered)?;
    tch::manual_seed(h.seed as i64 + 1 + rank as i64);

    let trainable: Vec<Tensor> = names
        .iter()
        .filter(|n| vars[*n].requires_grad())
        .map(|n| vars[n].shallow_clone())
        .collect();
    let mut sync = GradSync::new(&trainable, ddp::BUCKET_BYTES);
    let mut opt = optimizer(vs, h)?;

    let sampler = DistributedSampler::new(recipe.train_len(), rank, world, h.seed, true);
    let shard = sampler.shard_len();
    if shard == 0 {
        bail!(
            "the training set has {} samples, fewer than the {world} workers",
            recipe.train_len()
        );
    }
    let steps_per_epoch = shard.div_ceil(local_batch) as u64;
    let total_steps = match h.max_steps {
        Some(m) => m.min(steps_per_epoch * h.epochs),
        None => steps_per_epoch * h.epochs,
    };
    let epochs = total_steps.div_ceil(steps_per_epoch);
    if rank == 0 {
        ev.log(format!(
            "training {} samples ({} per worker) for {epochs} epoch(s), {total_steps} steps, global batch {}, {} lr {}",
            shard * world,
            shard,
            local_batch * world,
            h.optimizer,
            h.lr
        ));
    }

    let eval_idx = sampler::eval_shard(recipe.eval_len(), rank, world);
    let mut step: u64 = 0;
    let mut samples: u64 = 0;
    let mut train_time = Duration::ZERO;
    let mut last_progress = Instant::now() - PROGRESS_EVERY;
    let mut final_train_loss = f64::NAN;
    let mut final_metrics = std::collections::BTreeMap::new();

    'epochs: for epoch in 0..epochs {
        let order = sampler.indices(epoch as usize);
        let (mut loss_sum, mut loss_n) = (0.0f64, 0.0f64);
        let t0 = Instant::now();
        for batch in sampler::batches(&order, local_batch) {
            if step >= total_steps {
                break;
            }
            let (logits, labels) = recipe.forward(Split::Train, batch, true)?;
            let loss = logits.cross_entropy_for_logits(&labels);
            opt.zero_grad();
            loss.backward();
            // Each rank's share of the global batch (equal shards: 1/world).
            sync.sync(&ctx.pg, 1.0 / world as f64)?;
            if let Some(c) = h.grad_clip {
                opt.clip_grad_norm(c);
            }
            opt.step();
            let l = loss.double_value(&[]);
            if !l.is_finite() {
                bail!("loss became {l} at step {step} (epoch {epoch}): lower the learning rate or enable gradient clipping");
            }
            step += 1;
            samples += batch.len() as u64;
            loss_sum += l * batch.len() as f64;
            loss_n += batch.len() as f64;
            ev.log(format!("train epoch:[{epoch}]\tloss:{l:.6}"));
            ev.metric(step, epoch, "loss", l);
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
        let (eval_loss_sum, eval_correct, eval_n) = tch::no_grad(|| -> Result<(f64, f64, f64)> {
            let (mut ls, mut c, mut n) = (0.0, 0.0, 0.0);
            for batch in sampler::batches(&eval_idx, local_batch.max(32)) {
                let (logits, labels) = recipe.forward(Split::Eval, batch, false)?;
                ls +=
                    logits.cross_entropy_for_logits(&labels).double_value(&[]) * batch.len() as f64;
                c += logits
                    .argmax(-1, false)
                    .eq_tensor(&labels)
                    .sum(Kind::Int64)
                    .double_value(&[]);
                n += batch.len() as f64;
            }
            Ok((ls, c, n))
        })?;
        let sums = ddp::allreduce_sums(
            &ctx.pg,
            &[loss_sum, loss_n, eval_loss_sum, eval_correct, eval_n],
        )?;
        let train_loss = sums[0] / sums[1].max(1.0);
        final_train_loss = train_loss;
        final_metrics.insert("epoch_train_loss".to_string(), train_loss);
        if sums[4] > 0.0 {
            final_metrics.insert("eval_loss".to_string(), sums[2] / sums[4]);
            final_metrics.insert("eval_accuracy".to_string(), sums[3] / sums[4]);
        }
        let sps = samples as f64 * world as f64 / train_time.as_secs_f64().max(1e-9);
        final_metrics.insert("samples_per_second".to_string(), sps);
        if rank == 0 {
            for (k, v) in &final_metrics {
                ev.metric(step, epoch, k, *v);
            }
            ev.log(format!(
                "epoch {epoch}: train_loss {train_loss:.4}  eval_loss {:.4}  eval_accuracy {:.4}  ({sps:.0} samples/s)",
                final_metrics.get("eval_loss").copied().unwrap_or(f64::NAN),
                final_metrics.get("eval_accuracy").copied().unwrap_or(f64::NAN),
            ));
            let dir = ctx
                .run_dir
                .join("checkpoints")
                .join(format!("epoch-{epoch}"));
            std::fs::create_dir_all(ctx.run_dir.join("checkpoints"))
                .context("creating checkpoints/")?;
            let state = serde_json::json!({ "epoch": epoch, "step": step, "hyper": h, "metrics": final_metrics });
            crate::checkpoint::write_dir_atomic(&dir, |tmp| {
                recipe.save(tmp)?;
                std::fs::write(
                    tmp.join("trainer_state.json"),
                    serde_json::to_vec_pretty(&state)?,
                )?;
                Ok(())
            })?;
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
    })
}
