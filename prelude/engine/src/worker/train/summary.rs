//! What a rank reports when it is done: steps, throughput, final metrics, a fingerprint of
//! the parameters, memory.

use tch::{nn, Kind, Tensor};
use trainbook_api::metric;

use super::TrainingLoop;
use crate::shared::events::WorkerSummary;

impl TrainingLoop<'_> {
    /// This rank's summary: steps, throughput, final metrics, a parameter fingerprint, memory.
    /// `held`: the parameter bytes held between steps when ZeRO-3 shards them.
    pub(super) fn summary(self, held: Option<u64>) -> WorkerSummary {
        let vs = self.recipe.vars();
        let (param_sum, param_l2) = param_stats(vs);
        let (optimizer_state, buffers) = self.update.memory();
        let bytes = |t: &Tensor| t.numel() as u64 * t.kind().elt_size_in_bytes() as u64;
        let memory = trainbook_api::MemoryUse {
            rank: self.ctx.rank,
            parameters: held.unwrap_or_else(|| vs.variables().values().map(bytes).sum()),
            gradients: self
                .params
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
            epochs: self.plan.epochs,
            samples: self.clock.samples,
            train_seconds: self.clock.train_time.as_secs_f64(),
            final_train_loss: self
                .final_metrics
                .get(metric::EPOCH_TRAIN_LOSS)
                .copied()
                .unwrap_or(f64::NAN),
            param_sum,
            param_l2,
            device: self.ctx.device_name.clone(),
            metrics: self.final_metrics,
            memory,
            profile: self.profiling.into_summary(),
        }
    }
}

/// Sum and L2 norm of all trainable parameters, in f64.
fn param_stats(vs: &nn::VarStore) -> (f64, f64) {
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_fingerprint_sums_trainable_parameters_only() {
        let vs = nn::VarStore::new(tch::Device::Cpu);
        let root = vs.root();
        let w = root.zeros("w", &[2]);
        let _frozen = root.ones_no_train("frozen", &[5]);
        tch::no_grad(|| {
            let _ = w
                .shallow_clone()
                .copy_(&Tensor::from_slice(&[3.0f32, -4.0]));
        });
        assert_eq!(param_stats(&vs), (-1.0, 5.0));
    }
}
