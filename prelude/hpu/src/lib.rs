//! Intel Gaudi for trainbook's workers: the HPU device and the hccl collectives, from Gaudi's own
//! PyTorch bridge.
//!
//! The bridge is a libtorch plugin that registers PyTorch's built-in HPU device when its Python
//! package is imported, and its hccl backend exists only as a Python binding. So a worker built
//! with this crate embeds the CPython that its torch belongs to, imports the bridge (which
//! registers HPU in the worker's own libtorch: the torch pair check makes sure it is the same
//! one), creates the hccl backend through torch.distributed's backend registry on the job's
//! rendezvous store, and hands the C++ backend to the engine's process group. Tensors never
//! cross into Python: the model, batches and collectives stay in Rust and C++.
//!
//! Only `trainbook-worker` links this crate (the `hpu` feature); the engine reaches it through
//! [`trainbook_engine::HpuBridge`], so no other process embeds Python.

use std::ffi::{c_char, c_int, c_void, CStr};
use std::process::Command;

use anyhow::{anyhow, bail, Context, Result};
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyModule};
use trainbook_engine::{ffi, BackendHandle, Device, HpuBridge, InitOptions};

extern "C" {
    fn tb_backend_from_python(
        obj: *mut pyo3::ffi::PyObject,
        device_type: c_int,
        err: *mut c_char,
        errlen: usize,
    ) -> *mut c_void;
    fn tb_backend_from_registry(
        name: *const c_char,
        device_type: c_int,
        err: *mut c_char,
        errlen: usize,
    ) -> *mut c_void;
    fn tb_backend_free(holder: *mut c_void);
}

/// How the hccl group reaches the worker: by name through torch's group registry (the default),
/// or `TRAINBOOK_HPU_HANDOVER=cast` through pybind11 (needs equal pybind11 internals tags).
fn handover() -> Result<&'static str> {
    match std::env::var("TRAINBOOK_HPU_HANDOVER").as_deref() {
        Err(_) | Ok("") | Ok("registry") => Ok("registry"),
        Ok("cast") => Ok("cast"),
        Ok(other) => {
            bail!("TRAINBOOK_HPU_HANDOVER={other} is not known: use registry (the default) or cast")
        }
    }
}

/// Set once the bridge is loaded: only then is there a bridge teardown to run or skip.
static LOADED: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// The Python side, kept as one readable file.
const BRIDGE_PY: &CStr = c"bridge.py";
const BRIDGE_MODULE: &CStr = c"trainbook_hpu_bridge";
const BRIDGE_SOURCE: &str = include_str!("bridge.py");

/// The Python trainbook was set up with (baked in by the build), unless `TRAINBOOK_PYTHON`
/// names another: its site directories hold torch and, in the Gaudi container, the bridge.
fn python_executable() -> String {
    std::env::var("TRAINBOOK_PYTHON")
        .ok()
        .filter(|p| !p.is_empty())
        .unwrap_or_else(|| env!("TRAINBOOK_HPU_PYTHON").to_string())
}

/// The site directories of that Python (an embedded interpreter starts with its base install's
/// path only, which misses a venv's packages).
fn site_dirs(python: &str) -> Result<Vec<String>> {
    let out = Command::new(python)
        .args(["-c", "import site, sys; print('\\n'.join(site.getsitepackages() + [site.getusersitepackages()] + sys.path))"])
        .output()
        .with_context(|| format!("running {python} to find its packages (set TRAINBOOK_PYTHON to the python that has torch and the Gaudi bridge)"))?;
    if !out.status.success() {
        bail!(
            "{python} failed to list its packages: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(str::to_string)
        .collect())
}

fn bridge_module(py: Python<'_>) -> PyResult<Bound<'_, PyModule>> {
    match py.import("trainbook_hpu_bridge") {
        Ok(m) => Ok(m),
        Err(_) => {
            let source = std::ffi::CString::new(BRIDGE_SOURCE).expect("bridge.py has no NUL");
            let m = PyModule::from_code(py, &source, BRIDGE_PY, BRIDGE_MODULE)?;
            // Registered so later calls find the same module.
            py.import("sys")?
                .getattr("modules")?
                .set_item("trainbook_hpu_bridge", &m)?;
            Ok(m)
        }
    }
}

/// A Python exception as one readable line (its type and message).
fn py_error(py: Python<'_>, e: PyErr) -> anyhow::Error {
    let ty = e
        .get_type(py)
        .name()
        .map(|n| n.to_string())
        .unwrap_or_else(|_| "Exception".into());
    let msg = e.value(py).to_string();
    if ty == "RuntimeError" {
        anyhow!("{msg}")
    } else {
        anyhow!("{ty}: {msg}")
    }
}

/// Gaudi's PyTorch bridge, loaded into this worker process.
pub struct GaudiBridge;

/// The bridge `trainbook-worker` injects into the engine.
pub static BRIDGE: GaudiBridge = GaudiBridge;

impl HpuBridge for GaudiBridge {
    fn load(&self) -> Result<Vec<String>> {
        // Eager mode is the bridge's current default and the only one a Rust program can drive
        // (lazy mode needs mark_step from Python); the bridge aborts if the flag and the loaded
        // plugin disagree, so it is set before the first import.
        if std::env::var_os("PT_HPU_LAZY_MODE").is_none() {
            std::env::set_var("PT_HPU_LAZY_MODE", "0");
        }
        let python = python_executable();
        let dirs = site_dirs(&python)?;
        Python::initialize();
        let facts = Python::attach(|py| -> Result<Vec<String>> {
            let m = bridge_module(py).map_err(|e| py_error(py, e))?;
            m.getattr("add_site_dirs")
                .and_then(|f| f.call1((dirs,)))
                .map_err(|e| py_error(py, e))?;
            let info = m
                .getattr("load")
                .and_then(|f| f.call0())
                .map_err(|e| py_error(py, e))
                .context("loading Intel Gaudi's PyTorch bridge")?;
            let info = info
                .cast::<PyDict>()
                .map_err(|_| anyhow!("bridge.load() returned no dict"))?;
            let mut lines = Vec::new();
            for (k, v) in info.iter() {
                lines.push(format!("{k}: {v}"));
            }
            Ok(lines)
        })?;
        // Device acquisition happens at the first allocation: do it now, so "no free module"
        // and lazy-mode mismatches are reported here, not in the middle of building a model.
        let probe = Device::Hpu(0)
            .put(&tch::Tensor::from_slice(&[1.0f32, 2.0, 3.0]))
            .context("acquiring an HPU (the Gaudi bridge loaded, but the first tensor could not be placed on the device)")?;
        if !Device::Hpu(0).holds(&probe) {
            bail!("the Gaudi bridge loaded, but a tensor moved to HPU did not land there: the bridge registered no HPU device in this libtorch");
        }
        LOADED.store(true, std::sync::atomic::Ordering::SeqCst);
        Ok(facts)
    }

    fn loaded(&self) -> bool {
        LOADED.load(std::sync::atomic::Ordering::SeqCst)
    }

    fn shutdown(&self) -> Result<()> {
        if !self.loaded() {
            return Ok(());
        }
        Python::attach(|py| {
            let m = bridge_module(py).map_err(|e| py_error(py, e))?;
            m.getattr("shutdown")
                .and_then(|f| f.call0())
                .map_err(|e| py_error(py, e))
                .context(
                    "closing the hccl group and running the exit handlers of the Gaudi bridge",
                )?;
            Ok(())
        })
    }

    fn peak_memory(&self) -> Option<u64> {
        Python::attach(|py| {
            let m = bridge_module(py).ok()?;
            m.getattr("peak_memory")
                .and_then(|f| f.call0())
                .ok()?
                .extract::<Option<u64>>()
                .ok()
                .flatten()
        })
    }

    fn hccl_backend(&self, init: &InitOptions, prefix: &str) -> Result<BackendHandle> {
        let handover = handover()?;
        Python::attach(|py| -> Result<BackendHandle> {
            let m = bridge_module(py).map_err(|e| py_error(py, e))?;
            let created = m
                .getattr("create_hccl")
                .and_then(|f| {
                    f.call1((
                        init.master_addr.as_str(),
                        init.master_port,
                        init.rank,
                        init.world_size,
                        init.timeout.as_millis() as u64,
                        prefix,
                        handover,
                    ))
                })
                .map_err(|e| py_error(py, e))
                .context("creating the hccl backend")?;
            let (backend, name): (Bound<'_, PyAny>, Option<String>) =
                created.extract().map_err(|e| py_error(py, e))?;
            let device = Device::Hpu(0).c10_type();
            let holder = match name {
                Some(name) => {
                    let name = std::ffi::CString::new(name)?;
                    ffi::call_ptr(
                        "taking the hccl group from the torch group registry",
                        |err, len| unsafe {
                            // SAFETY: `name` is a live NUL-terminated string.
                            tb_backend_from_registry(name.as_ptr(), device, err, len)
                        },
                    )?
                }
                // SAFETY: the GIL is held (inside `attach`) and `backend` is a live object.
                None => ffi::call_ptr("taking the hccl backend from Python", |err, len| unsafe {
                    tb_backend_from_python(backend.as_ptr(), device, err, len)
                })?,
            };
            // SAFETY: `holder` is a fresh `c10::intrusive_ptr<c10d::Backend>*`, freed once.
            Ok(unsafe { BackendHandle::from_raw(holder, tb_backend_free) })
        })
    }
}
