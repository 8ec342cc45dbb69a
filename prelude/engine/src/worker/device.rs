//! Choosing the device each worker trains on: what `auto` becomes on this machine, and where a
//! worker puts its model and batches.
//!
//! tch can name CPU and CUDA devices but not an Intel Gaudi HPU (its `Device` reports an HPU
//! tensor as `Mps`). A worker therefore places tensors through [`Device`], which reaches every
//! device PyTorch knows through the engine's C++ helpers, and recipes build their models on the
//! CPU and move them ([`Device::var_store`], [`Device::place_vars`]).

use std::os::raw::{c_char, c_int};
use std::path::Path;

use anyhow::{bail, Context, Result};
use tch::{nn, Kind, Tensor};

pub use trainbook_api::device::{DeviceKind, DeviceRequest};

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
}

/// c10::DeviceType numbers (c10/core/DeviceType.h).
const C10_CPU: c_int = 0;
const C10_CUDA: c_int = 1;
const C10_HPU: c_int = 15;

/// Wraps a tensor the C++ helpers returned, or their error.
fn wrap(ptr: *mut torch_sys::C_tensor, err: &[c_char], what: &str) -> Result<Tensor> {
    if ptr.is_null() {
        // SAFETY: the helpers write a NUL-terminated message into `err` when they return null.
        let msg = unsafe { std::ffi::CStr::from_ptr(err.as_ptr()) }.to_string_lossy();
        bail!("{what}: {msg}");
    }
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

    /// A variable store to build a model in. tch creates variables on the store's device,
    /// which cannot be an HPU: HPU models are built on the CPU and moved by [`Self::place_vars`]
    /// once their weights are loaded (one copy, as `model.to("hpu")` in PyTorch).
    pub fn var_store(self) -> nn::VarStore {
        nn::VarStore::new(self.tch().unwrap_or(tch::Device::Cpu))
    }

    /// Moves every variable of `vs` to this device in place (the variables keep their identity,
    /// so the model's layers and an optimizer built later see the moved tensors).
    pub fn place_vars(self, vs: &mut nn::VarStore) -> Result<()> {
        match self.tch() {
            Some(d) => vs.set_device(d),
            None => tch::no_grad(|| -> Result<()> {
                for (_, mut v) in vs.variables() {
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
            return Ok(t.to_device(d));
        }
        let (ty, index) = self.c10();
        let mut err = [0 as c_char; 512];
        // SAFETY: `t` is a live tensor; err is a valid buffer of the given length.
        let ptr = unsafe { tb_to_device(t.as_ptr(), ty, index, err.as_mut_ptr(), err.len()) };
        wrap(ptr, &err, &format!("moving a tensor to {self}"))
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
        let mut err = [0 as c_char; 512];
        // SAFETY: both tensors are live; err is a valid buffer of the given length.
        let ptr =
            unsafe { tb_to_device_of(self.as_ptr(), like.as_ptr(), err.as_mut_ptr(), err.len()) };
        // Moving to a device that already holds a tensor cannot fail short of running out of
        // memory, where tch's own operations panic too.
        wrap(ptr, &err, "moving a tensor to its model's device").unwrap()
    }

    fn zeros_on_device(&self, size: &[i64], kind: Kind) -> Tensor {
        Tensor::zeros(size, (kind, tch::Device::Cpu)).to_device_of(self)
    }
}

/// What a worker built with Gaudi support plugs in (`trainbook-hpu`'s bridge, which embeds the
/// Python the vendor's bridge needs). The engine itself knows no Python.
pub trait HpuBridge: Sync {
    /// Registers the HPU device in this process's libtorch and acquires a device; returns
    /// facts for the worker's log (versions, paths, module id).
    fn load(&self) -> anyhow::Result<Vec<String>>;
    /// The collective backend for HPU tensors, created on the job's rendezvous store under
    /// `prefix`, for [`crate::dist::ProcessGroup::attach_backend`].
    fn hccl_backend(
        &self,
        init: &crate::dist::InitOptions,
        prefix: &str,
    ) -> anyhow::Result<crate::dist::BackendHandle>;
    /// The most HPU memory allocated so far, when the bridge can tell.
    fn peak_memory(&self) -> Option<u64> {
        None
    }
}

/// The peak memory of a worker: bytes allocated on its CUDA or HPU device
/// (`torch.cuda.max_memory_allocated`, `torch.hpu.max_memory_allocated`) or, on CPU, its
/// process's peak resident set. 0 where it cannot be read.
pub fn peak_memory(device: Device, bridge: Option<&dyn HpuBridge>) -> (u64, &'static str) {
    match device {
        Device::Cuda(i) => {
            extern "C" {
                fn tb_cuda_peak_bytes(device: c_int) -> i64;
            }
            // SAFETY: a plain query; the shim catches C++ exceptions.
            let peak = unsafe { tb_cuda_peak_bytes(i as c_int) };
            (peak.max(0) as u64, "cuda")
        }
        Device::Hpu(_) => (bridge.and_then(|b| b.peak_memory()).unwrap_or(0), "hpu"),
        Device::Cpu => (peak_rss().unwrap_or(0), "rss"),
    }
}

/// The process's peak resident set size (`VmHWM` in /proc/self/status), on Linux.
fn peak_rss() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}

/// Where the Intel Gaudi software shows itself, if anywhere: accelerator device nodes, or the
/// bridge's Python package (whose plugins live in `habana_frameworks/torch/lib/`) on
/// `PYTHONPATH` or in the Gaudi container's site directories. Only a hint: whether HPUs are
/// usable is what [`probe_hpu`] finds out.
pub fn gaudi_stack_hint() -> Option<String> {
    for dev in ["/dev/accel/accel0", "/dev/hl0"] {
        if Path::new(dev).exists() {
            return Some(dev.to_string());
        }
    }
    let mut dirs: Vec<std::path::PathBuf> = std::env::var_os("PYTHONPATH")
        .map(|p| std::env::split_paths(&p).collect())
        .unwrap_or_default();
    for base in ["/usr/local/lib", "/usr/lib"] {
        if let Ok(entries) = std::fs::read_dir(base) {
            for e in entries.flatten() {
                if e.file_name().to_string_lossy().starts_with("python3") {
                    dirs.push(e.path().join("dist-packages"));
                    dirs.push(e.path().join("site-packages"));
                }
            }
        }
    }
    dirs.into_iter()
        .map(|d| d.join("habana_frameworks/torch"))
        .find(|d| d.is_dir())
        .map(|d| d.display().to_string())
}

/// What a worker process found when it loaded Gaudi's bridge (`trainbook-worker --probe-hpu`).
#[derive(Clone, Debug, serde::Serialize, serde::Deserialize)]
pub struct HpuProbe {
    /// Why HPUs are not usable, with the fix; `None` when they are.
    pub error: Option<String>,
    /// Facts the bridge reported (versions, paths), for logs.
    #[serde(default)]
    pub facts: Vec<String>,
    /// Devices visible to the bridge, when it says.
    #[serde(default)]
    pub device_count: Option<usize>,
}

/// How long loading the bridge and acquiring a device may take in the probe.
const PROBE_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(180);

/// Loads Gaudi's bridge in a short-lived worker process (never in this one: the kernel's cell
/// process must not embed Python or hold a device) and reports what it found. The answer is
/// remembered for the life of this process.
pub fn probe_hpu() -> HpuProbe {
    static PROBE: std::sync::Mutex<Option<HpuProbe>> = std::sync::Mutex::new(None);
    let mut cached = PROBE.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(p) = cached.as_ref() {
        return p.clone();
    }
    let probe = run_probe().unwrap_or_else(|e| HpuProbe {
        error: Some(format!("{e:#}")),
        facts: Vec::new(),
        device_count: None,
    });
    *cached = Some(probe.clone());
    probe
}

fn run_probe() -> Result<HpuProbe> {
    use std::io::Read;
    let program = crate::launch::worker_binary()?;
    let mut child = std::process::Command::new(&program)
        .arg(crate::worker::PROBE_HPU)
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .with_context(|| {
            format!(
                "starting {} {}",
                program.display(),
                crate::worker::PROBE_HPU
            )
        })?;
    let started = std::time::Instant::now();
    let status = loop {
        if let Some(status) = child.try_wait()? {
            break status;
        }
        if started.elapsed() > PROBE_TIMEOUT {
            let _ = child.kill();
            let _ = child.wait();
            bail!(
                "loading Gaudi's bridge took more than {} s (a hung device acquisition?): check                  `hl-smi` for a free module",
                PROBE_TIMEOUT.as_secs()
            );
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    };
    let mut out = String::new();
    let mut err = String::new();
    if let Some(mut o) = child.stdout.take() {
        o.read_to_string(&mut out)?;
    }
    if let Some(mut e) = child.stderr.take() {
        e.read_to_string(&mut err)?;
    }
    let line = out.lines().rev().find(|l| l.starts_with('{')).unwrap_or("");
    match serde_json::from_str::<HpuProbe>(line) {
        Ok(p) => Ok(p),
        Err(_) => {
            let tail: Vec<&str> = err.lines().rev().take(5).collect();
            let tail: Vec<&str> = tail.into_iter().rev().collect();
            bail!(
                "the HPU probe ({} {}) ended with {status} and no answer; its last lines: {}",
                program.display(),
                crate::worker::PROBE_HPU,
                tail.join(" | ")
            )
        }
    }
}

/// Why `auto` did not pick HPUs on a machine that has the Gaudi software, for one warning line.
fn hpu_fallback_warning(hint: &str, why: &str, fallback: DeviceKind) -> String {
    format!(
        "warning: the Intel Gaudi software is here ({hint}) but HPUs are not usable: {why}. \
         Training on {fallback} instead; pass device \"hpu\" to make this an error"
    )
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
            let probe = probe_hpu();
            if let Some(e) = probe.error {
                bail!("device 'hpu' requested, but {e}");
            }
            if let Some(n) = probe.device_count.filter(|&n| n < workers) {
                bail!("{workers} workers need one HPU each, but the Gaudi bridge sees {n}: use --workers {n} or fewer");
            }
            Ok(DeviceKind::Hpu)
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
            let other = if cuda_device_count() >= workers && crate::dist::have_nccl() {
                DeviceKind::Cuda
            } else {
                DeviceKind::Cpu
            };
            let Some(hint) = gaudi_stack_hint() else {
                return Ok(other);
            };
            match resolve(DeviceRequest::Hpu, workers) {
                Ok(kind) => Ok(kind),
                Err(e) => {
                    let why = format!("{e:#}");
                    let why = why
                        .strip_prefix("device 'hpu' requested, but ")
                        .unwrap_or(&why);
                    eprintln!("{}", hpu_fallback_warning(&hint, why, other));
                    Ok(other)
                }
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
