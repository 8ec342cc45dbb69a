//! Where a worker puts its model and batches (the driver's side, which device a job gets, is
//! `driver::placement`).
//!
//! tch can name CPU and CUDA devices but not an Intel Gaudi HPU (its `Device` reports an HPU
//! tensor as `Mps`). A worker therefore places tensors through [`Device`], which reaches every
//! device PyTorch knows through the engine's C++ helpers, and recipes build their models on the
//! CPU and move them ([`Device::var_store`], [`Device::place_vars`]).

use std::os::raw::{c_char, c_int, c_void};

use anyhow::Result;
use tch::{nn, Kind, Tensor};

use crate::shared::ffi::{call_ptr, call_status};

pub(crate) use trainbook_api::DeviceKind;

extern "C" {
    fn tb_to_device(
        t: *const torch_sys::C_tensor,
        device_type: c_int,
        index: c_int,
        err: *mut c_char,
        errlen: usize,
    ) -> *mut torch_sys::C_tensor;
    fn tb_to_device_of(
        t: *const torch_sys::C_tensor,
        like: *const torch_sys::C_tensor,
        err: *mut c_char,
        errlen: usize,
    ) -> *mut torch_sys::C_tensor;
    fn tb_device_of(t: *const torch_sys::C_tensor, device_type: *mut c_int, index: *mut c_int);
    fn tb_contiguous_as(
        t: *const torch_sys::C_tensor,
        channels_last: c_int,
        err: *mut c_char,
        errlen: usize,
    ) -> *mut torch_sys::C_tensor;
    fn tb_channels_last_(t: *mut torch_sys::C_tensor, err: *mut c_char, errlen: usize) -> c_int;
    fn tb_is_channels_last(t: *const torch_sys::C_tensor) -> c_int;
    fn tb_cuda_event_record(index: c_int, err: *mut c_char, errlen: usize) -> *mut c_void;
    fn tb_cuda_event_wait(event: *mut c_void, err: *mut c_char, errlen: usize) -> c_int;
    fn tb_cuda_event_free(event: *mut c_void);
    fn tb_cuda_sync_debug(level: c_int, err: *mut c_char, errlen: usize) -> c_int;
}

/// `torch.cuda.set_sync_debug_mode` from here on: `warn` reports every operation that makes
/// the host wait for the GPU, `error` fails it, `off` stops; nothing on other devices.
pub(crate) fn cuda_sync_debug(device: Device, level: &str) -> Result<()> {
    let level = match level {
        "off" | "" => 0,
        "warn" => 1,
        "error" => 2,
        other => anyhow::bail!(
            "{} is {other:?}: it takes warn, error or off",
            crate::shared::env::CUDA_SYNC_DEBUG
        ),
    };
    if !matches!(device, Device::Cuda(_)) {
        return Ok(());
    }
    call_status("setting CUDA's sync debug mode", |e, n| {
        // SAFETY: a plain call; the shim catches C++ exceptions.
        unsafe { tb_cuda_sync_debug(level, e, n) }
    })
}

/// A point in a CUDA device's queued work (an event recorded on its stream): the host can
/// wait for the work before it while the work queued after it goes on ([`Device::mark`]).
pub(crate) struct Mark(*mut c_void);

impl Mark {
    /// Returns once the device has run everything queued before the mark.
    pub(crate) fn wait(self) -> Result<()> {
        call_status("waiting for the GPU", |e, n| {
            // SAFETY: self.0 is a live event from tb_cuda_event_record (freed on drop).
            unsafe { tb_cuda_event_wait(self.0, e, n) }
        })
    }
}

impl Drop for Mark {
    fn drop(&mut self) {
        // SAFETY: self.0 came from tb_cuda_event_record and is freed once, here.
        unsafe { tb_cuda_event_free(self.0) }
    }
}

/// `t` (N, C, H, W) with its memory in channels-last order (NHWC) when `channels_last`, else
/// in the usual NCHW order; the shape does not change. Convolutions on CUDA (and oneDNN on
/// CPUs) run faster on channels-last inputs and weights, and hand channels-last outputs on.
pub fn memory_format(t: &Tensor, channels_last: bool) -> Result<Tensor> {
    wrap("changing a tensor's memory format", |e, n| {
        // SAFETY: `t` is a live tensor; the buffer is valid for its length.
        unsafe { tb_contiguous_as(t.as_ptr(), c_int::from(channels_last), e, n) }
    })
}

/// Every 4-dimensional variable of `vs` (convolution weights) stored channels-last, in place
/// (the variables keep their identity), as `model.to(memory_format=torch.channels_last)`.
pub fn vars_channels_last(vs: &nn::VarStore) -> Result<()> {
    for (name, mut v) in vs.variables() {
        call_status(&format!("storing {name} channels-last"), |e, n| {
            // SAFETY: `v` is a live variable; the shim swaps its data under no_grad.
            unsafe { tb_channels_last_(v.as_mut_ptr(), e, n) }
        })?;
    }
    Ok(())
}

/// Whether `t` is a 4-dimensional tensor stored channels-last.
pub fn is_channels_last(t: &Tensor) -> bool {
    // SAFETY: a read-only query of a live tensor.
    unsafe { tb_is_channels_last(t.as_ptr()) == 1 }
}

/// c10::DeviceType numbers (c10/core/DeviceType.h).
const C10_CPU: c_int = 0;
const C10_CUDA: c_int = 1;
const C10_HPU: c_int = 15;

/// A tensor a C++ helper returned through [`call_ptr`].
fn wrap(
    what: &str,
    f: impl FnOnce(*mut c_char, usize) -> *mut torch_sys::C_tensor,
) -> Result<Tensor> {
    let ptr = call_ptr(what, f)?;
    // SAFETY: a non-null result is a fresh `at::Tensor*` whose ownership passes to us.
    Ok(unsafe { Tensor::from_ptr(ptr) })
}

/// Where one worker trains: tch's devices plus the HPU, which tch cannot name.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Device {
    Cpu,
    Cuda(usize),
    /// An Intel Gaudi device; index 0 is the module this process acquired (`HLS_MODULE_ID`).
    Hpu(usize),
}

impl Device {
    /// The device of a worker with this local rank. Each Gaudi worker process sees the one
    /// module it acquired as HPU 0; CUDA workers pick their GPU by local rank.
    pub fn for_worker(kind: DeviceKind, local_rank: usize) -> Self {
        match kind {
            DeviceKind::Cpu => Device::Cpu,
            DeviceKind::Cuda => Device::Cuda(local_rank),
            DeviceKind::Hpu => Device::Hpu(0),
        }
    }

    pub fn kind(self) -> DeviceKind {
        match self {
            Device::Cpu => DeviceKind::Cpu,
            Device::Cuda(_) => DeviceKind::Cuda,
            Device::Hpu(_) => DeviceKind::Hpu,
        }
    }

    /// The tch device, where tch has one (not for HPU).
    pub fn tch(self) -> Option<tch::Device> {
        match self {
            Device::Cpu => Some(tch::Device::Cpu),
            Device::Cuda(i) => Some(tch::Device::Cuda(i)),
            Device::Hpu(_) => None,
        }
    }

    /// c10::DeviceType and index.
    fn c10(self) -> (c_int, c_int) {
        match self {
            Device::Cpu => (C10_CPU, -1),
            Device::Cuda(i) => (C10_CUDA, i as c_int),
            Device::Hpu(i) => (C10_HPU, i as c_int),
        }
    }

    /// The c10::DeviceType number (autocast is switched per device type).
    pub fn c10_type(self) -> c_int {
        self.c10().0
    }

    /// A variable store to build a model in: always on the CPU, and moved by
    /// [`Self::place_vars`] once the weights are initialised or loaded (one copy, as
    /// `model.to(device)` in PyTorch). Initialising on the CPU draws from the CPU generator on
    /// every device, so a seed gives the same weights on CPU, CUDA and HPU (a CUDA store would
    /// draw from the GPU's generator: another model, and runs that do not compare); an HPU
    /// store cannot be made by tch at all.
    pub fn var_store(self) -> nn::VarStore {
        nn::VarStore::new(tch::Device::Cpu)
    }

    /// Moves every variable of `vs` to this device in place (the variables keep their identity,
    /// so the model's layers and an optimizer built later see the moved tensors).
    /// A variable built sharded under ZeRO-3 moves its slice (first: it is then on the device,
    /// hollow, and the store's own move leaves it alone).
    pub fn place_vars(self, vs: &mut nn::VarStore) -> Result<()> {
        let mut rest = Vec::new();
        tch::no_grad(|| -> Result<()> {
            for (name, v) in vs.variables() {
                if !crate::worker::slices::place(&name, &v, |s| self.put(s))? {
                    rest.push(v);
                }
            }
            Ok(())
        })?;
        match self.tch() {
            Some(d) => vs.set_device(d),
            None => tch::no_grad(|| -> Result<()> {
                for mut v in rest {
                    let moved = self.put(&v)?;
                    v.set_data(&moved);
                }
                Ok(())
            })?,
        }
        Ok(())
    }

    /// `t` on this device (a copy unless it is already there).
    pub fn put(self, t: &Tensor) -> Result<Tensor> {
        if let Some(d) = self.tch() {
            // From page-locked memory the copy is queued and the host goes on to queue the
            // forward pass; from pageable memory the host waits for the whole copy.
            if let Some(pinned) = self.pin_target() {
                if t.device() == tch::Device::Cpu && t.is_pinned(pinned) {
                    return Ok(t.to_device_(d, t.kind(), true, false));
                }
            }
            return Ok(t.to_device(d));
        }
        let (ty, index) = self.c10();
        // SAFETY: `t` is a live tensor; the buffer is valid for its length.
        wrap(&format!("moving a tensor to {self}"), |err, len| unsafe {
            tb_to_device(t.as_ptr(), ty, index, err, len)
        })
    }

    /// A mark at the end of the work queued so far on this CUDA device; an error on other
    /// devices (the CPU has no queue; the Gaudi bridge has no events trainbook can reach).
    pub(crate) fn mark(self) -> Result<Mark> {
        let index = match self {
            Device::Cuda(i) => i as c_int,
            other => anyhow::bail!("marks are for CUDA devices, not {other}"),
        };
        let ptr = call_ptr("recording a CUDA event", |e, n| {
            // SAFETY: a plain call; the shim catches C++ exceptions.
            unsafe { tb_cuda_event_record(index, e, n) }
        })?;
        Ok(Mark(ptr))
    }

    /// The device whose copies page-locked host memory speeds up (CUDA), for input pipelines
    /// that prepare batches ahead ([`Self::pin`]).
    pub fn pin_target(self) -> Option<tch::Device> {
        match self {
            Device::Cuda(i) => Some(tch::Device::Cuda(i)),
            _ => None,
        }
    }

    /// `t` in page-locked host memory when this is a CUDA device (PyTorch's DataLoader
    /// `pin_memory=True`), so [`Self::put`] copies it without the host waiting; otherwise, or
    /// if pinning fails, `t` itself.
    pub fn pin(self, t: Tensor) -> Tensor {
        match self.pin_target() {
            Some(d) => t.f_pin_memory(d).unwrap_or(t),
            None => t,
        }
    }

    /// Whether `t` lives on this device (checked by c10 device type and index, which sees an
    /// HPU tensor as one, where tch would say MPS).
    pub fn holds(self, t: &Tensor) -> bool {
        let (ty, index) = self.c10();
        let (t_ty, t_index) = c10_device_of(t);
        t_ty == ty && (index < 0 || t_index < 0 || t_index == index)
    }

    /// Zeros of `kind` on this device.
    pub fn zeros(self, size: &[i64], kind: Kind) -> Result<Tensor> {
        match self.tch() {
            Some(d) => Ok(Tensor::zeros(size, (kind, d))),
            None => self.put(&Tensor::zeros(size, (kind, tch::Device::Cpu))),
        }
    }
}

impl std::fmt::Display for Device {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Device::Cpu => f.write_str("cpu"),
            Device::Cuda(i) => write!(f, "cuda:{i}"),
            Device::Hpu(i) => write!(f, "hpu:{i}"),
        }
    }
}

/// Whether `t` lives on an HPU (any index), for code that picks an HPU-friendly formulation.
pub fn on_hpu(t: &Tensor) -> bool {
    c10_device_of(t).0 == C10_HPU
}

/// The c10 device type and index of `t` (index -1 when it has none).
fn c10_device_of(t: &Tensor) -> (c_int, c_int) {
    let (mut ty, mut index) = (0, -1);
    // SAFETY: `t` is a live tensor and the out-pointers are valid.
    unsafe { tb_device_of(t.as_ptr(), &mut ty, &mut index) };
    (ty, index)
}

/// Tensors placed on the device of another tensor, for code that only has tensors in hand (a
/// model's forward pass creating position ids, gradient buckets next to their parameters):
/// tch's `t.device()` cannot name an HPU, so `Tensor::zeros(.., (kind, t.device()))` would
/// land on the wrong device.
pub trait OnDeviceOf {
    /// `self` on the device of `like`.
    fn to_device_of(&self, like: &Tensor) -> Tensor;
    /// Zeros of `kind` and `size` on the device of `self`.
    fn zeros_on_device(&self, size: &[i64], kind: Kind) -> Tensor;
}

impl OnDeviceOf for Tensor {
    fn to_device_of(&self, like: &Tensor) -> Tensor {
        // SAFETY: both tensors are live; the buffer is valid for its length.
        let moved = wrap("moving a tensor to its model's device", |err, len| unsafe {
            tb_to_device_of(self.as_ptr(), like.as_ptr(), err, len)
        });
        // Moving to a device that already holds a tensor cannot fail short of running out of
        // memory, where tch's own operations panic too.
        moved.unwrap()
    }

    fn zeros_on_device(&self, size: &[i64], kind: Kind) -> Tensor {
        // Nothing to view (an empty tensor, or a variable built sharded under ZeRO-3 that has
        // no storage yet): made on the host and moved (only while setting up).
        if self.numel() == 0 || self.data_ptr().is_null() {
            return Tensor::zeros(size, (kind, tch::Device::Cpu)).to_device_of(self);
        }
        // Made on the device from a view of one element of `self` (tch cannot name every
        // device, so `Tensor::zeros` cannot be asked for it): zeros made on the host and
        // copied over would be a copy the host waits for, on an accelerator inside a step.
        let mut first = self.shallow_clone();
        while first.dim() > 0 {
            first = first.select(0, 0);
        }
        let one = first.zeros_like().to_kind(kind);
        one.reshape(vec![1; size.len()])
            .expand(size, false)
            .contiguous()
    }
}

/// The peak memory of a worker: bytes allocated on its CUDA or HPU device
/// (`torch.cuda.max_memory_allocated`; on HPU `hpu_peak`, what the bridge reports as
/// `torch.hpu.max_memory_allocated`) or, on CPU, its process's peak resident set. 0 where it
/// cannot be read.
pub(crate) fn peak_memory(device: Device, hpu_peak: Option<u64>) -> (u64, &'static str) {
    match device {
        Device::Cuda(i) => {
            extern "C" {
                fn tb_cuda_peak_bytes(device: c_int) -> i64;
            }
            // SAFETY: a plain query; the shim catches C++ exceptions.
            let peak = unsafe { tb_cuda_peak_bytes(i as c_int) };
            (peak.max(0) as u64, "cuda")
        }
        Device::Hpu(_) => (hpu_peak.unwrap_or(0), "hpu"),
        Device::Cpu => (peak_rss().unwrap_or(0), "rss"),
    }
}

/// The process's peak resident set size (`VmHWM` in /proc/self/status), on Linux.
pub(crate) fn peak_rss() -> Option<u64> {
    status_bytes("VmHWM:")
}

/// The process's resident set size now (`VmRSS`), on Linux.
pub(crate) fn rss() -> Option<u64> {
    status_bytes("VmRSS:")
}

fn status_bytes(field: &str) -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with(field))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sync_debug_levels_name_the_choices_and_leave_other_devices_alone() {
        assert!(cuda_sync_debug(Device::Cpu, "warn").is_ok());
        assert!(cuda_sync_debug(Device::Cpu, "off").is_ok());
        let e = cuda_sync_debug(Device::Cpu, "loud")
            .unwrap_err()
            .to_string();
        assert!(e.contains("warn, error or off"), "{e}");
    }

    #[test]
    fn zeros_on_device_have_the_shape_and_kind_asked_whatever_the_model_tensor() {
        let w = memory_format(
            &Tensor::ones([4, 3, 2, 2], (Kind::Float, tch::Device::Cpu)),
            true,
        )
        .unwrap();
        for like in [
            w,
            Tensor::from(2.5f64),
            Tensor::zeros([0], (Kind::Float, tch::Device::Cpu)),
        ] {
            for size in [&[][..], &[5][..], &[2, 3][..]] {
                let z = like.zeros_on_device(size, Kind::Double);
                assert_eq!((z.size(), z.kind()), (size.to_vec(), Kind::Double));
                assert_eq!(z.abs().sum(Kind::Double).double_value(&[]), 0.0);
                assert!(z.is_contiguous());
            }
        }
    }

    /// Marks are CUDA events: asked of the CPU (no queue to mark) they are refused, and on a
    /// build or machine without CUDA the shim answers with an error, not an abort.
    #[test]
    fn marks_are_refused_where_there_is_no_cuda_queue() {
        let e = Device::Cpu
            .mark()
            .err()
            .expect("no mark on the CPU")
            .to_string();
        assert!(e.contains("CUDA"), "{e}");
        if !tch::Cuda::is_available() {
            let e = Device::Cuda(0).mark().err().expect("no CUDA here");
            assert!(e.to_string().contains("recording a CUDA event"), "{e}");
        }
    }
}
