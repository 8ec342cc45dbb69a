//! Which device a job trains on: what `auto` becomes on this machine, checked before any worker
//! starts, with an error that says what to do. Gaudi's bridge is only ever loaded in a
//! short-lived probe worker, never in the driver's process (a notebook's kernel must not embed
//! Python or hold a device).

use std::path::Path;

use anyhow::{bail, Context, Result};

use crate::shared::env::{HpuProbe, PROBE_HPU};
use trainbook_api::{DeviceKind, DeviceRequest};

/// Where the Intel Gaudi software shows itself, if anywhere: accelerator device nodes, or the
/// bridge's Python package (whose plugins live in `habana_frameworks/torch/lib/`) on
/// `PYTHONPATH` or in the Gaudi container's site directories. Only a hint: whether HPUs are
/// usable is what [`probe_hpu`] finds out.
pub(crate) fn gaudi_stack_hint() -> Option<String> {
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

/// How long loading the bridge and acquiring a device may take in the probe.
const PROBE_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(180);

/// Loads Gaudi's bridge in a short-lived worker process (never in this one: the kernel's cell
/// process must not embed Python or hold a device) and reports what it found. The answer is
/// remembered for the life of this process.
pub(crate) fn probe_hpu() -> HpuProbe {
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
    let program = super::processes::worker_binary()?;
    let mut child = std::process::Command::new(&program)
        .arg(PROBE_HPU)
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .with_context(|| format!("starting {} {}", program.display(), PROBE_HPU))?;
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
                PROBE_HPU,
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
pub(crate) fn cuda_device_count() -> usize {
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
                // NCCL refuses two ranks on one GPU ("Duplicate GPU detected"), so this is
                // said here, before any process starts.
                let visible = if n == 1 {
                    "1 is".to_string()
                } else {
                    format!("{n} are")
                };
                bail!("{workers} workers need one CUDA device each (NCCL runs one rank per GPU), but only {visible} visible: use --workers {n} or fewer");
            }
            if !crate::worker::dist::have_nccl() {
                bail!("this trainbook build links CUDA but not NCCL: rebuild with `make setup` on the GPU machine");
            }
            Ok(DeviceKind::Cuda)
        }
        DeviceRequest::Auto => {
            let other = if cuda_device_count() >= workers && crate::worker::dist::have_nccl() {
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
pub(crate) fn cpu_threads_per_worker(workers: usize) -> usize {
    let cores = std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(1);
    (cores / workers.max(1)).max(1)
}
