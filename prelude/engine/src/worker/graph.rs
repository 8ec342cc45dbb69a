//! The training step captured in a CUDA graph and replayed (`cuda_graphs`): the step's
//! kernels (about a thousand launches for BERT-base: forward, backward, the fused optimizer)
//! become one launch, so the host no longer has to queue them faster than the GPU runs them.
//!
//! How: after [`EAGER_STEPS`] ordinary steps (cuBLAS and cuDNN make their handles and
//! workspaces, the optimizer its state), the next step is captured on fixed input tensors
//! ([`CapturedStep::capture`]) with the learning rate read from a device scalar and the
//! optimizer's step count kept on the device; from then on each step copies its batch into
//! those inputs, sets the learning rate and replays. The gradients and the step's outputs
//! live in the graph's own memory and are rewritten by every replay. Dropout draws from the
//! generator's seed at each replay (the step's seed is set before it, as in eager steps).

use std::os::raw::{c_char, c_int, c_void};

use anyhow::{bail, Result};
use tch::Tensor;

use crate::shared::ffi::{call_ptr, call_status};
use crate::worker::device::Device;

extern "C" {
    fn tb_graph_capture_begin(index: c_int, err: *mut c_char, errlen: usize) -> *mut c_void;
    fn tb_graph_capture_end(graph: *mut c_void, err: *mut c_char, errlen: usize) -> c_int;
    fn tb_graph_replay(graph: *mut c_void, err: *mut c_char, errlen: usize) -> c_int;
    fn tb_graph_free(graph: *mut c_void);
}

/// Ordinary steps before the capture (PyTorch's advice is a few on a side stream; the
/// capture itself runs on one).
pub(crate) const EAGER_STEPS: u64 = 3;

/// What `cuda_graphs` needs of the worker, checked before its first step: a CUDA device (the
/// job's device may have been `auto`) and a recipe whose step keeps its shapes.
pub(crate) fn check(device: Device, staged: bool) -> Result<()> {
    if !matches!(device, Device::Cuda(_)) {
        bail!("cuda_graphs: this worker trains on {device}, and CUDA graphs need a CUDA device: use --device cuda on a GPU machine, or leave cuda_graphs off");
    }
    if !staged {
        bail!("cuda_graphs: this recipe's batches change shape, so its step cannot be captured (bert-mlm's can, with max_predictions_per_seq): leave cuda_graphs off");
    }
    Ok(())
}

/// A captured CUDA graph (libtorch's `at::cuda::CUDAGraph`).
struct Graph(*mut c_void);

impl Graph {
    /// Runs `work` while capturing what it queues on `device` (nothing of it runs yet).
    fn capture<T>(device: Device, work: impl FnOnce() -> Result<T>) -> Result<(Graph, T)> {
        // `check` refused other devices before the first step.
        let Device::Cuda(index) = device else {
            bail!("CUDA graphs need a CUDA device, not {device}");
        };
        let ptr = call_ptr("starting a CUDA graph capture", |e, n| {
            // SAFETY: a plain call; the shim catches C++ exceptions.
            unsafe { tb_graph_capture_begin(index as c_int, e, n) }
        })?;
        let graph = Graph(ptr);
        let out = work();
        // Ended whatever `work` did, so the stream it switched to is switched back.
        let ended = call_status("capturing the training step in a CUDA graph", |e, n| {
            // SAFETY: `graph.0` is the live graph begun above.
            unsafe { tb_graph_capture_end(graph.0, e, n) }
        });
        let out = out?;
        ended.map_err(|e| {
            e.context("an operation in the step cannot be captured (one that waits for the GPU, or allocates host memory): leave cuda_graphs off")
        })?;
        Ok((graph, out))
    }

    fn replay(&self) -> Result<()> {
        call_status("replaying the CUDA graph of the training step", |e, n| {
            // SAFETY: `self.0` is a live, captured graph.
            unsafe { tb_graph_replay(self.0, e, n) }
        })
    }
}

impl Drop for Graph {
    fn drop(&mut self) {
        // SAFETY: created by tb_graph_capture_begin, freed once, here.
        unsafe { tb_graph_free(self.0) }
    }
}

/// The captured step: its graph, the inputs it reads, the learning rate it reads, and what it
/// returns (`T`: the step's numbers, rewritten by each replay).
pub(crate) struct CapturedStep<T> {
    graph: Graph,
    inputs: Vec<Tensor>,
    lr: Tensor,
    device: Device,
    pub(crate) outputs: T,
}

impl<T> CapturedStep<T> {
    /// Captures `step` on device copies of `host` (the first batch it replays), with the
    /// learning rate read from `lr` (a device scalar), then runs it once.
    pub(crate) fn capture(
        device: Device,
        host: &[Tensor],
        lr: Tensor,
        step: impl FnOnce(&[Tensor]) -> Result<T>,
    ) -> Result<Self> {
        let inputs = host
            .iter()
            .map(|t| device.put(t))
            .collect::<Result<Vec<_>>>()?;
        let (graph, outputs) = Graph::capture(device, || step(&inputs))?;
        graph.replay()?;
        Ok(CapturedStep {
            graph,
            inputs,
            lr,
            device,
            outputs,
        })
    }

    /// Whether a batch has the captured shapes and dtypes.
    pub(crate) fn fits(&self, host: &[Tensor]) -> bool {
        host.len() == self.inputs.len()
            && host
                .iter()
                .zip(&self.inputs)
                .all(|(h, s)| h.size() == s.size() && h.kind() == s.kind())
    }

    /// Copies `host` into the captured inputs, sets the learning rate and replays the step.
    pub(crate) fn replay(&mut self, host: &[Tensor], lr: f64) -> Result<()> {
        if !self.fits(host) {
            bail!(
                "cuda_graphs: a batch of {} came after the captured step's {}: a graph replays fixed shapes. Keep every batch the same shape (fixed-length blocks, max_predictions_per_seq), or leave cuda_graphs off",
                shapes(host),
                shapes(&self.inputs)
            );
        }
        for (s, h) in self.inputs.iter_mut().zip(host) {
            // From page-locked memory the copy to the device is queued, not waited for.
            s.copy_(&self.device.put(h)?);
        }
        self.set_lr(lr);
        self.graph.replay()
    }

    /// The learning rate the optimizer reads from now on, in the graph and in eager steps
    /// alike (once captured, the optimizer reads it from the device).
    pub(crate) fn set_lr(&self, lr: f64) {
        let _ = self.lr.shallow_clone().fill_(lr);
    }
}

fn shapes(ts: &[Tensor]) -> String {
    let each: Vec<String> = ts
        .iter()
        .map(|t| format!("{:?} {:?}", t.size(), t.kind()))
        .collect();
    format!("[{}]", each.join(", "))
}
