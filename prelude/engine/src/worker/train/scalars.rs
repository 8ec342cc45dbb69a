//! A step's numbers (loss, hits, metrics), kept on the device while the step is queued and
//! read in one transfer afterwards; and the micro-batch pass that produces them.

use anyhow::{Context, Result};
use tch::{Kind, Tensor};
use trainbook_api::Precision;

use super::metrics::{EpochSums, MetricSums};
use crate::worker::device::{Device, Mark};
use crate::worker::precision::autocast;
use crate::worker::recipe::Step;

/// Per micro-batch: samples, whether it counted hits, host metrics, device metrics' names.
type Batch = (usize, bool, Vec<(String, f64)>, Vec<String>);

/// A step's numbers, kept on the device until the update is queued, then read in one
/// transfer: an `.item()` per micro-batch would make the host wait for each forward and
/// backward pass before queuing the next work, leaving an accelerator idle meanwhile.
#[derive(Default)]
pub(super) struct StepScalars {
    values: Vec<Tensor>,
    batches: Vec<Batch>,
}

impl StepScalars {
    /// The same numbers again (a replayed graph rewrote the tensors in place).
    pub(super) fn again(&self) -> StepScalars {
        StepScalars {
            values: self.values.iter().map(Tensor::shallow_clone).collect(),
            batches: self.batches.clone(),
        }
    }

    /// Whether a micro-batch reported metrics computed on the host.
    pub(super) fn has_host_metrics(&self) -> bool {
        self.batches.iter().any(|b| !b.2.is_empty())
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
    pub(super) fn send(self, device: Device) -> Result<SentScalars> {
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
pub(super) struct SentScalars {
    host: Tensor,
    /// Reached when the copy into `host` has landed; `None` when it already has.
    mark: Option<Mark>,
    batches: Vec<Batch>,
}

impl SentScalars {
    /// Whether the copy may still be under way (reading them then waits for the device).
    pub(super) fn deferred(&self) -> bool {
        self.mark.is_some()
    }

    /// The loss summed over samples, the samples, the metrics; hits go into `sums`.
    pub(super) fn read(self, sums: &mut EpochSums) -> Result<(f64, usize, MetricSums)> {
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

/// A step whose update is queued and whose numbers are on their way to the host. The host
/// reads them after queuing the next step, so on an accelerator it prepares and queues step
/// n + 1 while step n still runs, instead of waiting for the device to drain at every step.
pub(super) struct InFlight {
    pub(super) scalars: SentScalars,
    pub(super) epoch: u64,
    /// The step's index (0-based) and its learning rate.
    pub(super) index: u64,
    pub(super) lr: f64,
}

/// One micro-batch's forward pass (under `precision`) and backward pass, its numbers kept in
/// `scalars`. The micro-batches of a step add their gradients up, so each loss is divided by
/// `divisor` (their number when they are equal, like one big batch); `None`: a weightless
/// sample, run only so that the rank takes part in the step (its gradient is zero, its
/// numbers are not kept).
pub(super) fn forward_backward(
    (precision, device): (Precision, Device),
    n: usize,
    divisor: Option<f64>,
    scalars: &mut StepScalars,
    step: impl FnOnce() -> Result<Step>,
) -> Result<()> {
    let (loss, hits, out) = autocast(precision, device, || {
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

#[cfg(test)]
mod tests {
    use super::*;

    const CPU: (Precision, Device) = (Precision::Fp32, Device::Cpu);

    /// A micro-batch whose loss is `w * x` for a weight `w` and constant `x`.
    fn pass(
        w: &Tensor,
        x: f64,
        n: usize,
        divisor: Option<f64>,
        scalars: &mut StepScalars,
        step: impl FnOnce(Tensor) -> Step,
    ) {
        forward_backward(CPU, n, divisor, scalars, || Ok(step(w * x))).unwrap();
    }

    #[test]
    fn a_steps_numbers_are_read_in_one_transfer() {
        let w = Tensor::from(1.0f64).set_requires_grad(true);
        let mut scalars = StepScalars::default();
        pass(&w, 2.0, 3, Some(2.0), &mut scalars, |loss| {
            let logits = Tensor::from_slice(&[0.0f32, 1.0, 1.0, 0.0, 0.0, 1.0]).reshape([3, 2]);
            let labels = Tensor::from_slice(&[1i64, 1, 1]);
            let mut s = Step::loss(loss);
            s.predictions = Some((logits, labels));
            s.metrics = vec![("host".into(), 4.0)];
            s
        });
        pass(&w, 4.0, 1, Some(2.0), &mut scalars, |loss| {
            let mut s = Step::loss(loss);
            s.metrics = vec![("host".into(), 8.0)];
            s.device_metrics = vec![("device".into(), Tensor::from(0.5f64))];
            s
        });
        // A weightless sample: a zero gradient, and nothing to read.
        pass(&w, 100.0, 0, None, &mut scalars, Step::loss);
        // Each loss divided by its divisor: d/dw (2w / 2 + 4w / 2 + 0) = 3.
        assert_eq!(w.grad().double_value(&[]), 3.0);
        assert!(scalars.has_host_metrics());
        let sent = scalars.send(Device::Cpu).unwrap();
        assert!(!sent.deferred(), "on the CPU the copy is done");
        let mut sums = EpochSums::default();
        let (loss_sum, samples, metrics) = sent.read(&mut sums).unwrap();
        assert_eq!((loss_sum, samples), (2.0 * 3.0 + 4.0, 4));
        assert_eq!((sums.correct, sums.counted), (2.0, 3.0));
        let means = metrics.means();
        assert_eq!(means, [("device".into(), 0.5), ("host".into(), 5.0)]);
    }

    #[test]
    fn a_weightless_step_sends_nothing() {
        let w = Tensor::from(1.0f64).set_requires_grad(true);
        let mut scalars = StepScalars::default();
        pass(&w, 3.0, 0, None, &mut scalars, Step::loss);
        assert_eq!(w.grad().double_value(&[]), 0.0);
        let again = scalars.again();
        assert!(!again.has_host_metrics());
        let (loss_sum, samples, metrics) = again
            .send(Device::Cpu)
            .unwrap()
            .read(&mut EpochSums::default())
            .unwrap();
        assert_eq!((loss_sum, samples, metrics.means()), (0.0, 0, vec![]));
    }
}
