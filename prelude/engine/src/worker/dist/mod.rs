//! Collective communication through PyTorch's own c10d engine.
//!
//! A [`ProcessGroup`] is the generic `c10d::ProcessGroup` with gloo serving CPU tensors, NCCL
//! serving CUDA tensors (builds with the `cuda` feature) and, for Intel Gaudi, the hccl backend
//! that Gaudi's bridge creates ([`ProcessGroup::attach_backend`]).
//! Rendezvous follows torch.distributed's `env://` contract (`MASTER_ADDR`, `MASTER_PORT`,
//! `RANK`, `WORLD_SIZE`), so trainbook workers can also be started by other launchers.
//! Every call carries a timeout, so a dead peer turns into an error instead of a hang.

mod ffi;

use std::ffi::CString;
use std::os::raw::{c_char, c_void};
use std::time::Duration;

use anyhow::{anyhow, bail, Context, Result};
use tch::Tensor;

use crate::shared::env::{AGENT_STORE, ATTEMPT, NODE_ADDR};
use crate::shared::ffi::call;

pub(crate) use trainbook_api::Backend;

/// Whether this build can create NCCL process groups (the `cuda` feature).
pub(crate) fn have_nccl() -> bool {
    unsafe { ffi::tb_have_nccl() != 0 }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum ReduceOp {
    Sum,
    /// Sum, then divide by the world size (gloo has no native average).
    Mean,
    Max,
}

impl ReduceOp {
    fn code(self) -> i32 {
        match self {
            ReduceOp::Sum | ReduceOp::Mean => 0,
            ReduceOp::Max => 1,
        }
    }
}

/// Adds what a timeout means to c10d's terse "Operation timed out!".
fn explain_timeout(e: anyhow::Error, timeout: Duration) -> anyhow::Error {
    if format!("{e}").to_lowercase().contains("timed out") {
        e.context(format!(
            "no answer from a peer within the collective timeout ({} s): another rank is stuck, \
             stopped or overloaded; see the other ranks' logs, or raise the timeout",
            timeout.as_secs()
        ))
    } else {
        e
    }
}

/// The job's rendezvous store (c10d's TCPStore). One node's driver hosts it; the workers and
/// the drivers of other nodes connect to it, and drivers exchange what a job's nodes must
/// agree on through it (see `job`). Hosting on port 0 lets the OS pick a free port atomically,
/// so two jobs started at once can never race for the same port.
pub(crate) struct Store {
    ptr: *mut ffi::TbStore,
    port: u16,
}

// SAFETY: TCPStore serialises its client calls and runs its server on its own threads; the
// handle is only freed once.
unsafe impl Send for Store {}
unsafe impl Sync for Store {}

impl Store {
    /// Hosts the store on `host:port` (port 0: any free port).
    pub(crate) fn bind(host: &str, port: u16, timeout: Duration) -> Result<Self> {
        let chost = CString::new(host).context("master address contains a NUL byte")?;
        let mut out_port = 0u16;
        let ptr = call(
            "starting the rendezvous store",
            |e, n| unsafe {
                ffi::tb_store_server(
                    chost.as_ptr(),
                    port,
                    timeout.as_millis() as i64,
                    &mut out_port,
                    e,
                    n,
                )
            },
            |p| p.is_null(),
        )
        .map_err(|e| {
            if port != 0 {
                anyhow!(
                    "{e}\nhint: master port {port} on {host} is probably in use by another \
                     process (or a job of this node is still running); choose another port, or \
                     leave the port unset to pick a free one (one node only)"
                )
            } else {
                e
            }
        })?;
        Ok(Self {
            ptr,
            port: out_port,
        })
    }

    /// Connects to the store hosted at `host:port`, waiting up to `timeout` for it to appear.
    pub(crate) fn connect(host: &str, port: u16, timeout: Duration) -> Result<Self> {
        let chost = CString::new(host).context("master address contains a NUL byte")?;
        let ptr = call(
            &format!("connecting to the rendezvous store at {host}:{port}"),
            |e, n| unsafe {
                ffi::tb_store_client(chost.as_ptr(), port, timeout.as_millis() as i64, e, n)
            },
            |p| p.is_null(),
        )?;
        Ok(Self { ptr, port })
    }

    pub(crate) fn port(&self) -> u16 {
        self.port
    }

    pub(crate) fn set(&self, key: &str, value: &[u8]) -> Result<()> {
        let ckey = CString::new(key).context("store key contains a NUL byte")?;
        call(
            &format!("writing '{key}' to the rendezvous store"),
            |e, n| unsafe {
                ffi::tb_store_set(self.ptr, ckey.as_ptr(), value.as_ptr(), value.len(), e, n)
            },
            |rc| *rc != 0,
        )?;
        Ok(())
    }

    /// Whether `key` is set, without waiting.
    pub(crate) fn check(&self, key: &str) -> Result<bool> {
        let ckey = CString::new(key).context("store key contains a NUL byte")?;
        let mut exists: std::ffi::c_int = 0;
        call(
            &format!("looking up '{key}' in the rendezvous store"),
            |e, n| unsafe { ffi::tb_store_check(self.ptr, ckey.as_ptr(), &mut exists, e, n) },
            |rc| *rc != 0,
        )?;
        Ok(exists != 0)
    }

    /// The value of `key` if it is set, without waiting.
    pub(crate) fn try_get(&self, key: &str) -> Result<Option<Vec<u8>>> {
        if self.check(key)? {
            self.get(key).map(Some)
        } else {
            Ok(None)
        }
    }

    /// The value of `key`, waiting for it up to the store's timeout.
    pub(crate) fn get(&self, key: &str) -> Result<Vec<u8>> {
        let ckey = CString::new(key).context("store key contains a NUL byte")?;
        let mut out: *mut u8 = std::ptr::null_mut();
        let mut len = 0usize;
        call(
            &format!("reading '{key}' from the rendezvous store"),
            |e, n| unsafe { ffi::tb_store_get(self.ptr, ckey.as_ptr(), &mut out, &mut len, e, n) },
            |rc| *rc != 0,
        )?;
        // SAFETY: on success the shim returned a malloc'd buffer of `len` bytes.
        let bytes = unsafe { std::slice::from_raw_parts(out, len) }.to_vec();
        unsafe { ffi::tb_bytes_free(out) };
        Ok(bytes)
    }
}

impl Drop for Store {
    fn drop(&mut self) {
        unsafe { ffi::tb_store_free(self.ptr) }
    }
}

/// The store prefix of the job's process group at its `attempt`-th start.
pub(crate) fn store_prefix(attempt: u32) -> String {
    match attempt {
        0 => "trainbook/default_pg".into(),
        n => format!("trainbook/attempt-{n}/default_pg"),
    }
}

/// How a worker joins its job's process group.

#[derive(Clone, Debug)]
pub struct InitOptions {
    pub backend: Backend,
    pub master_addr: String,
    pub master_port: u16,
    pub rank: usize,
    pub world_size: usize,
    /// Host the store in this process (torch's env:// behaviour for rank 0). trainbook's
    /// launcher hosts it itself and sets `TRAINBOOK_AGENT_STORE=1`.
    pub host_store: bool,
    pub timeout: Duration,
    /// Network interface for gloo (`GLOO_SOCKET_IFNAME`), if set.
    pub gloo_ifname: Option<String>,
    /// Address for gloo to bind ([`NODE_ADDR`]), if set.
    pub gloo_host: Option<String>,
    /// Where this start of the job keeps its keys in the store ([`ATTEMPT`]): a restart must
    /// not read the rendezvous of the start that failed.
    pub store_prefix: String,
}

impl InitOptions {
    /// Reads torch.distributed's env:// variables.
    pub fn from_env(backend: Backend, timeout: Duration) -> Result<Self> {
        fn var(name: &str) -> Result<String> {
            std::env::var(name).with_context(|| {
                format!("{name} is not set: workers need MASTER_ADDR, MASTER_PORT, RANK and WORLD_SIZE (start them with `trainbook train` or `launch`)")
            })
        }
        fn num<T: std::str::FromStr>(name: &str) -> Result<T> {
            let v = var(name)?;
            v.trim()
                .parse()
                .map_err(|_| anyhow!("{name}={v:?} is not a valid number"))
        }
        let rank: usize = num("RANK")?;
        let world_size: usize = num("WORLD_SIZE")?;
        if world_size == 0 || rank >= world_size {
            bail!("RANK={rank} must be below WORLD_SIZE={world_size}");
        }
        let agent_store = std::env::var(AGENT_STORE)
            .map(|v| v == "1")
            .unwrap_or(false);
        Ok(Self {
            backend,
            master_addr: var("MASTER_ADDR")?,
            master_port: num("MASTER_PORT")?,
            rank,
            world_size,
            host_store: rank == 0 && !agent_store,
            timeout,
            gloo_ifname: std::env::var("GLOO_SOCKET_IFNAME")
                .ok()
                .filter(|s| !s.is_empty()),
            gloo_host: std::env::var(NODE_ADDR).ok().filter(|s| !s.is_empty()),
            store_prefix: store_prefix(
                std::env::var(ATTEMPT)
                    .ok()
                    .and_then(|a| a.parse().ok())
                    .unwrap_or(0),
            ),
        })
    }
}

/// A c10d process group: this worker's handle on the job's collectives.
///
/// Collectives write into the tensors they are given although they take `&Tensor`: a tch
/// tensor is a shared handle on storage (like `at::Tensor`), so this is the same interior
/// mutability every in-place tch operation has.
pub(crate) struct ProcessGroup {
    ptr: *mut ffi::TbPg,
    timeout: Duration,
    rank: usize,
    world_size: usize,
}

// SAFETY: c10d process groups are thread-safe for enqueueing work; trainbook uses each one from
// a single training thread at a time.
unsafe impl Send for ProcessGroup {}

impl ProcessGroup {
    pub(crate) fn new(opts: &InitOptions) -> Result<Self> {
        let backend = CString::new(opts.backend.name()).unwrap();
        let addr =
            CString::new(opts.master_addr.as_str()).context("MASTER_ADDR contains a NUL byte")?;
        let ifname = CString::new(opts.gloo_ifname.clone().unwrap_or_default())
            .context("GLOO_SOCKET_IFNAME contains a NUL byte")?;
        let gloo_host = CString::new(opts.gloo_host.clone().unwrap_or_default())
            .context("the node address contains a NUL byte")?;
        let prefix = CString::new(opts.store_prefix.as_str())
            .context("the store prefix contains a NUL byte")?;
        let ptr = call(
            &format!(
                "joining the {} process group as rank {} of {} at {}:{}",
                opts.backend.name(),
                opts.rank,
                opts.world_size,
                opts.master_addr,
                opts.master_port
            ),
            |e, n| unsafe {
                ffi::tb_pg_new(
                    backend.as_ptr(),
                    addr.as_ptr(),
                    opts.master_port,
                    opts.rank as i32,
                    opts.world_size as i32,
                    opts.host_store as i32,
                    opts.timeout.as_millis() as i64,
                    ifname.as_ptr(),
                    gloo_host.as_ptr(),
                    prefix.as_ptr(),
                    e,
                    n,
                )
            },
            |p| p.is_null(),
        )?;
        let (rank, world_size) =
            unsafe { (ffi::tb_pg_rank(ptr) as usize, ffi::tb_pg_size(ptr) as usize) };
        Ok(Self {
            ptr,
            timeout: opts.timeout,
            rank,
            world_size,
        })
    }

    pub(crate) fn rank(&self) -> usize {
        self.rank
    }

    pub(crate) fn world_size(&self) -> usize {
        self.world_size
    }

    /// All-reduces `tensors` in place. Tensors must be contiguous and live on the group's device.
    pub(crate) fn allreduce(&self, tensors: &[&Tensor], op: ReduceOp) -> Result<()> {
        if tensors.is_empty() {
            return Ok(());
        }
        let ptrs: Vec<*mut c_void> = tensors.iter().map(|t| t.as_ptr() as *mut c_void).collect();
        call(
            "allreduce",
            |e, n| unsafe {
                ffi::tb_pg_allreduce(self.ptr, ptrs.as_ptr(), ptrs.len(), op.code(), e, n)
            },
            |rc| *rc != 0,
        )
        .map_err(|e| explain_timeout(e, self.timeout))?;
        if op == ReduceOp::Mean && self.world_size > 1 {
            for t in tensors {
                let _ = t.shallow_clone().g_div_scalar_(self.world_size as f64);
            }
        }
        Ok(())
    }

    /// Starts an in-place sum-allreduce of one tensor; [`Work::wait`] completes it.
    pub(crate) fn allreduce_start(&self, tensor: &Tensor) -> Result<Work> {
        self.start("allreduce", |e, n| unsafe {
            ffi::tb_pg_allreduce_start(self.ptr, tensor.as_ptr() as *mut c_void, 0, e, n)
        })
    }

    /// Starts a sum-reduce-scatter: `input` holds `world_size` equal chunks; `output` (one
    /// chunk's size) receives the sum over ranks of chunk `rank`.
    pub(crate) fn reduce_scatter_start(&self, output: &Tensor, input: &Tensor) -> Result<Work> {
        self.check_chunks("reduce_scatter", output, input)?;
        let (out, inp) = (
            output.as_ptr() as *mut c_void,
            input.as_ptr() as *mut c_void,
        );
        self.start("reduce_scatter", |e, n| unsafe {
            ffi::tb_pg_reduce_scatter_start(self.ptr, out, inp, e, n)
        })
    }

    /// Starts an all-gather: `output` (`world_size` chunks) receives every rank's `input` in
    /// rank order.
    pub(crate) fn allgather_start(&self, output: &Tensor, input: &Tensor) -> Result<Work> {
        self.check_chunks("allgather", input, output)?;
        let (out, inp) = (
            output.as_ptr() as *mut c_void,
            input.as_ptr() as *mut c_void,
        );
        self.start("allgather", |e, n| unsafe {
            ffi::tb_pg_allgather_start(self.ptr, out, inp, e, n)
        })
    }

    fn start(
        &self,
        what: &'static str,
        f: impl FnOnce(*mut c_char, usize) -> *mut ffi::TbWork,
    ) -> Result<Work> {
        let ptr = call(what, f, |p| p.is_null()).map_err(|e| explain_timeout(e, self.timeout))?;
        Ok(Work {
            ptr,
            timeout: self.timeout,
            what,
        })
    }

    /// `full` must be `world_size` copies of `chunk`'s size: c10d would fail with a less
    /// telling message (or, on some backends, read past the end).
    fn check_chunks(&self, what: &str, chunk: &Tensor, full: &Tensor) -> Result<()> {
        if full.numel() != chunk.numel() * self.world_size {
            bail!(
                "{what}: the flat tensor has {} elements, not {} ranks x {}",
                full.numel(),
                self.world_size,
                chunk.numel()
            );
        }
        Ok(())
    }

    /// Broadcasts `tensors` in place from `root` to every rank.
    pub(crate) fn broadcast(&self, tensors: &[&Tensor], root: usize) -> Result<()> {
        if root >= self.world_size {
            bail!(
                "broadcast root {root} is not a rank of this group (world size {})",
                self.world_size
            );
        }
        let ptrs: Vec<*mut c_void> = tensors.iter().map(|t| t.as_ptr() as *mut c_void).collect();
        call(
            "broadcast",
            |e, n| unsafe {
                ffi::tb_pg_broadcast(self.ptr, ptrs.as_ptr(), ptrs.len(), root as i32, e, n)
            },
            |rc| *rc != 0,
        )
        .map_err(|e| explain_timeout(e, self.timeout))?;
        Ok(())
    }

    pub(crate) fn barrier(&self) -> Result<()> {
        call(
            "barrier",
            |e, n| unsafe { ffi::tb_pg_barrier(self.ptr, e, n) },
            |rc| *rc != 0,
        )
        .map_err(|e| explain_timeout(e, self.timeout))?;
        Ok(())
    }
}

impl ProcessGroup {
    /// Serves tensors of `device` with `backend` (a device plugin's c10d backend, e.g. Gaudi's
    /// hccl for HPU tensors).
    pub(crate) fn attach_backend(
        &self,
        device: crate::worker::device::Device,
        backend: BackendHandle,
    ) -> Result<()> {
        call(
            &format!("attaching the {device} collective backend"),
            |e, n| unsafe {
                ffi::tb_pg_set_backend(self.ptr, device.c10_type(), backend.ptr, e, n)
            },
            |rc| *rc != 0,
        )?;
        Ok(())
    }
}

/// An owned `c10::intrusive_ptr<c10d::Backend>` made outside the engine (by a device plugin).
pub struct BackendHandle {
    ptr: *mut c_void,
    free: unsafe extern "C" fn(*mut c_void),
}

impl BackendHandle {
    /// # Safety
    /// `ptr` must be a heap-allocated `c10::intrusive_ptr<c10d::Backend>` that `free` deletes.
    pub unsafe fn from_raw(ptr: *mut c_void, free: unsafe extern "C" fn(*mut c_void)) -> Self {
        Self { ptr, free }
    }
}

impl Drop for BackendHandle {
    fn drop(&mut self) {
        // SAFETY: `from_raw`'s contract; the process group holds its own reference.
        unsafe { (self.free)(self.ptr) }
    }
}

impl Drop for ProcessGroup {
    fn drop(&mut self) {
        unsafe { ffi::tb_pg_free(self.ptr) }
    }
}

/// An in-flight collective.
pub(crate) struct Work {
    ptr: *mut ffi::TbWork,
    timeout: Duration,
    what: &'static str,
}

impl Work {
    pub(crate) fn wait(self) -> Result<()> {
        let rc = call(
            self.what,
            |e, n| unsafe { ffi::tb_work_wait(self.ptr, e, n) },
            |rc| *rc != 0,
        );
        rc.map(|_| ()).map_err(|e| explain_timeout(e, self.timeout))
    }
}

impl Drop for Work {
    fn drop(&mut self) {
        unsafe { ffi::tb_work_free(self.ptr) }
    }
}
