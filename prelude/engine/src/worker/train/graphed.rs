//! `cuda_graphs` in the loop: which steps go through the captured graph, the capture (the
//! first such step) and the replays after it (see [`crate::worker::graph`]).

use anyhow::{bail, Context, Result};
use tch::Tensor;
use trainbook_api::{Hyper, Precision};

use super::scalars::{forward_backward, StepScalars};
use super::WorkerContext;
use crate::worker::device::Device;
use crate::worker::graph::{self, CapturedStep};
use crate::worker::recipe::{Recipe, Split};
use crate::worker::strategy::UpdateStrategy;

const NO_STAGED_STEP: &str = "cuda_graphs: this recipe has no fixed-shape step";

/// A run's graphed steps.
pub(super) struct GraphSteps {
    /// The step from which steps go through the graph; `None` without `cuda_graphs`.
    from: Option<u64>,
    /// The samples of a micro-batch, the only size the graph holds.
    local_batch: usize,
    precision: Precision,
    captured: Option<CapturedStep<StepScalars>>,
}

impl GraphSteps {
    /// The graphed steps of a run at `step`: with `cuda_graphs`, those after a few eager ones.
    pub(super) fn new(h: &Hyper, local_batch: usize, step: u64) -> GraphSteps {
        GraphSteps {
            from: h.cuda_graphs.then_some(step + graph::EAGER_STEPS),
            local_batch,
            precision: h.precision,
            captured: None,
        }
    }

    /// Before the first step, with `cuda_graphs`: whether the device and the recipe can do it.
    pub(super) fn check(&self, device: Device, recipe: &dyn Recipe) -> Result<()> {
        if self.from.is_some() {
            graph::check(device, recipe.staged().is_some())?;
        }
        Ok(())
    }

    /// The batch of step `step` when it goes through the graph: once the eager steps are done,
    /// a step of one whole micro-batch (not the short last batch of an epoch, whose shapes the
    /// graph does not hold).
    fn batch<'b>(&self, step: u64, group: &[&'b [usize]]) -> Option<&'b [usize]> {
        let (Some(from), [batch]) = (self.from, group) else {
            return None;
        };
        (step >= from && batch.len() == self.local_batch).then_some(*batch)
    }

    /// The batch of step `step` as host tensors when it goes through the graph; `None` for an
    /// eager step.
    pub(super) fn inputs(
        &self,
        recipe: &dyn Recipe,
        step: u64,
        group: &[&[usize]],
    ) -> Result<Option<Vec<Tensor>>> {
        let Some(batch) = self.batch(step, group) else {
            return Ok(None);
        };
        // `check` made sure of a staged step before the first step.
        let staged = recipe.staged().context(NO_STAGED_STEP)?;
        Ok(Some(staged.inputs(Split::Train, batch)?))
    }

    /// An eager step's learning rate, which the optimizer reads from the graph's scalar once
    /// the graph is captured.
    pub(super) fn set_lr(&self, lr: f64) {
        if let Some(c) = &self.captured {
            c.set_lr(lr);
        }
    }

    /// Step `step` through the CUDA graph on the batch `host`, with learning rate `lr`:
    /// captured (and run) the first time, replayed after.
    pub(super) fn step(
        &mut self,
        ctx: &WorkerContext,
        recipe: &dyn Recipe,
        update: &mut UpdateStrategy,
        host: Vec<Tensor>,
        (step, lr): (u64, f64),
    ) -> Result<StepScalars> {
        if let Some(c) = self.captured.as_mut() {
            c.replay(&host, lr)?;
            update.count_replayed_step();
            return Ok(c.outputs.again());
        }
        let lr_t = update.enter_graph()?;
        let _ = lr_t.shallow_clone().fill_(lr);
        // The captured backward pass hands each gradient over into the graph's memory.
        update.zero_grad();
        let (n, precision) = (self.local_batch, self.precision);
        let staged = recipe.staged().context(NO_STAGED_STEP)?;
        let captured = CapturedStep::capture(ctx.device, &host, lr_t, |inputs| {
            let mut scalars = StepScalars::default();
            forward_backward((precision, ctx.device), n, Some(1.0), &mut scalars, || {
                staged.compute(inputs, true)
            })?;
            update.step(&ctx.pg, 1.0, None, lr)?;
            Ok(scalars)
        })?;
        if captured.outputs.has_host_metrics() {
            bail!("cuda_graphs: the recipe reports metrics computed on the host, which a replay would not update: leave cuda_graphs off");
        }
        let out = captured.outputs.again();
        ctx.events.log(format!(
            "cuda graphs: step {} captured; the steps after it replay it",
            step + 1
        ));
        self.captured = Some(captured);
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use trainbook_api::OptimizerKind;

    fn graphs(cuda_graphs: bool, step: u64) -> GraphSteps {
        let mut h = Hyper::new("test", 1, 8, 0.1, OptimizerKind::Sgd);
        h.cuda_graphs = cuda_graphs;
        GraphSteps::new(&h, 4, step)
    }

    #[test]
    fn whole_single_micro_batch_steps_go_through_the_graph_after_the_eager_ones() {
        let g = graphs(true, 10);
        let (whole, short) = ([0, 1, 2, 3], [4, 5]);
        assert_eq!(g.batch(10 + graph::EAGER_STEPS - 1, &[&whole]), None);
        assert_eq!(
            g.batch(10 + graph::EAGER_STEPS, &[&whole]),
            Some(&whole[..])
        );
        assert_eq!(g.batch(50, &[&whole]), Some(&whole[..]));
        // The short last batch of an epoch, and accumulated micro-batches, run eagerly.
        assert_eq!(g.batch(50, &[&short]), None);
        assert_eq!(g.batch(50, &[&whole, &whole]), None);
    }

    #[test]
    fn without_cuda_graphs_every_step_is_eager() {
        let g = graphs(false, 0);
        let whole = [0, 1, 2, 3];
        assert!((0..20).all(|s| g.batch(s, &[&whole]).is_none()));
        // Nothing to check either, on any device.
        assert!(g.check(Device::Cpu, &NoRecipe).is_ok());
        assert!(graphs(true, 0).check(Device::Cpu, &NoRecipe).is_err());
    }

    /// A recipe that is never stepped.
    struct NoRecipe;

    impl Recipe for NoRecipe {
        fn vars(&self) -> &tch::nn::VarStore {
            unreachable!()
        }
        fn vars_mut(&mut self) -> &mut tch::nn::VarStore {
            unreachable!()
        }
        fn train_len(&self) -> usize {
            0
        }
        fn eval_len(&self) -> usize {
            0
        }
        fn step(&self, _: Split, _: &[usize], _: bool) -> Result<crate::worker::recipe::Step> {
            unreachable!()
        }
    }
}
