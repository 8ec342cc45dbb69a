//! The end of an epoch: this rank's evaluation, the epoch's metrics summed over ranks, rank 0's
//! epoch lines and the epoch checkpoint.

use std::collections::BTreeMap;

use anyhow::Result;

use super::metrics::{self, EpochSums, EvalSums};
use super::TrainingLoop;
use crate::worker::ddp;
use crate::worker::heartbeat::{self, Busy};
use crate::worker::precision::autocast;
use crate::worker::recipe::Split;
use crate::worker::sampler;

impl TrainingLoop<'_> {
    /// Evaluation, the epoch's metrics summed over ranks, rank 0's epoch lines (as the
    /// reference notebooks print them) and the epoch checkpoint.
    pub(super) fn end_epoch(&mut self, epoch: u64, train: EpochSums) -> Result<()> {
        let eval = self.evaluate(epoch)?;
        self.final_metrics = self.epoch_metrics(&train, &eval)?;
        if self.ctx.rank == 0 {
            for (k, v) in &self.final_metrics {
                self.ctx.events.metric(self.step, epoch, k, *v);
            }
            for line in metrics::epoch_lines(epoch, &self.final_metrics) {
                self.ctx.events.log(line);
            }
        }
        let dir = self.ctx.run_dir.checkpoint(&format!("epoch-{epoch}"));
        self.checkpoint(&dir, epoch, self.final_metrics.clone(), false)
    }

    /// Evaluates this rank's disjoint shard of the evaluation set (with rank 0's buffers).
    fn evaluate(&mut self, epoch: u64) -> Result<EvalSums> {
        if !self.params.buffers.is_empty() {
            ddp::broadcast_parameters(&self.ctx.pg, &self.params.buffers)?;
        }
        let batches: Vec<&[usize]> = sampler::batches(
            &self.shards.eval,
            self.recipe.eval_batch(self.plan.local_batch),
        )
        .collect();
        {
            let _busy = Busy::new();
            self.recipe.prefetch(Split::Eval, epoch, &batches);
        }
        let (precision, device) = (self.h.precision, self.ctx.device);
        // Under ZeRO-3 every forward gathers its units, a collective: every rank runs as many
        // batches, those past its own shard's end being passes whose results are dropped.
        let passes = match self.update.shards_parameters() {
            true => self.eval_passes(),
            false => batches.len(),
        };
        let spare = [self.shards.eval.first().copied().unwrap_or(0)];
        self.update.open()?;
        let sums = tch::no_grad(|| -> Result<EvalSums> {
            let mut e = EvalSums::default();
            for i in 0..passes {
                let Some(batch) = batches.get(i).copied() else {
                    autocast(precision, device, || {
                        self.recipe.step(Split::Eval, &spare, false)
                    })?;
                    continue;
                };
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
        });
        self.update.close()?;
        sums
    }

    /// The most evaluation batches any rank runs.
    fn eval_passes(&self) -> usize {
        let (len, world) = (self.recipe.eval_len(), self.ctx.world_size);
        let per_batch = self.recipe.eval_batch(self.plan.local_batch);
        (0..world)
            .map(|r| sampler::eval_shard(len, r, world).len().div_ceil(per_batch))
            .max()
            .unwrap_or(0)
    }

    /// The epoch's metrics, summed over ranks in one all-reduce (once they agree on what they
    /// sum): losses, accuracy, the recipe's own metrics and exact classification scores, then
    /// throughput.
    fn epoch_metrics(&self, train: &EpochSums, eval: &EvalSums) -> Result<BTreeMap<String, f64>> {
        let (pg, world) = (&self.ctx.pg, self.ctx.world_size);
        let layout = metrics::layout(train, eval);
        let agreed = metrics::agreed(&layout, &ddp::allreduce_sums(pg, &layout)?, world);
        if !agreed && self.ctx.rank == 0 {
            self.ctx.events.log("warning: the ranks reported different metric names or numbers of classes this epoch; only the loss is aggregated".to_string());
        }
        let sums = ddp::allreduce_sums(pg, &metrics::local_sums(train, eval, agreed))?;
        let mut m = metrics::epoch_metrics(train, eval, agreed, &sums, self.recipe.perplexity());
        self.clock.throughput(world, &mut m);
        Ok(m)
    }
}
