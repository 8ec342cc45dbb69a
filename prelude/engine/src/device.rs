//! Choosing the device each worker trains on: what `auto` becomes on this machine, and the
//! tch device of a worker.

use std::path::Path;

use anyhow::{bail, Result};

pub use trainbook_api::device::{DeviceKind, DeviceRequest};

/// The tch device of a worker with this local rank.
pub fn tch_device(kind: DeviceKind, local_rank: usize) -> Result<tch::Device> {
    match kind {
        DeviceKind::Cpu => Ok(tch::Device::Cpu),
        DeviceKind::Cuda => Ok(tch::Device::Cuda(local_rank)),
        DeviceKind::Hpu => bail!(hpu_unsupported()),
    }
}

/// Where the Gaudi software stack shows itself: accelerator device nodes and the PyTorch bridge.
pub fn gaudi_stack_present() -> bool {
    let has_device = ["/dev/accel/accel0", "/dev/hl0"]
        .iter()
        .any(|p| Path::new(p).exists());
    let has_bridge = [
        "/usr/lib/habanalabs/libhabana_pytorch_plugin.so",
        "/usr/lib/habanalabs",
    ]
    .iter()
    .any(|p| Path::new(p).exists())
        || std::env::var_os("HABANA_PLUGINS_LIB_PATH").is_some();
    has_device && has_bridge
}

fn hpu_unsupported() -> String {
    "the Intel Gaudi stack is present, but this trainbook build cannot place tensors on HPU: tch has \
     no HPU device type and the hccl backend lives in Gaudi's Python bridge. Use --device cpu for now"
        .into()
}

/// Number of CUDA devices this build can use (0 when libtorch_cuda is not linked).
pub fn cuda_device_count() -> usize {
    if tch::Cuda::is_available() {
        tch::Cuda::device_count().max(0) as usize
    } else {
        0
    }
}

/// Resolves the request for `workers` workers, with an error that says what to do.
pub fn resolve(req: DeviceRequest, workers: usize) -> Result<DeviceKind> {
    match req {
        DeviceRequest::Cpu => Ok(DeviceKind::Cpu),
        DeviceRequest::Hpu => {
            if !gaudi_stack_present() {
                bail!(
                    "device 'hpu' requested, but the Intel Gaudi software stack was not found (no \
                     /dev/accel/accel0 or /dev/hl0, no /usr/lib/habanalabs). Run inside the Gaudi \
                     container (see the Dockerfile), or use --device cpu"
                );
            }
            bail!(hpu_unsupported())
        }
        DeviceRequest::Cuda => {
            let n = cuda_device_count();
            if n == 0 && cfg!(feature = "cuda") {
                bail!(
                    "device 'cuda' requested, but no CUDA device is visible (this build supports \
                     CUDA): check `nvidia-smi` and CUDA_VISIBLE_DEVICES, or use --device cpu"
                );
            }
            if n == 0 {
                bail!(
                    "device 'cuda' requested, but no CUDA device is available to this trainbook \
                     build, which was set up without CUDA. On a GPU machine run `make setup` there \
                     (it links libtorch_cuda when nvidia-smi sees a GPU); otherwise use --device cpu"
                );
            }
            if n < workers {
                bail!("{workers} workers need one CUDA device each, but only {n} are visible: use --workers {n} or fewer");
            }
            if !crate::dist::have_nccl() {
                bail!("this trainbook build links CUDA but not NCCL: rebuild with `make setup` on the GPU machine");
            }
            Ok(DeviceKind::Cuda)
        }
        DeviceRequest::Auto => {
            if gaudi_stack_present() {
                resolve(DeviceRequest::Hpu, workers)
            } else if cuda_device_count() >= workers && crate::dist::have_nccl() {
                Ok(DeviceKind::Cuda)
            } else {
                Ok(DeviceKind::Cpu)
            }
        }
    }
}

/// Intra-op threads per CPU worker: the cores shared evenly, at least one.
pub fn cpu_threads_per_worker(workers: usize) -> usize {
    let cores = std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(1);
    (cores / workers.max(1)).max(1)
}
