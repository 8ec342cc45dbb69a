//! ZeRO stage 3: each rank keeps 1/W of every parameter, and a unit's whole weights exist only
//! while the unit computes.
//!
//! A model is cut into units by its parameters' names: a unit is the name up to its first
//! numeric part (`model.layers.3`, `bert.encoder.layer.11`, `transformer.h.0`, `layer2.1`), the
//! layers FSDP wraps one by one; what has no numeric part (embeddings, final norm, head) is the
//! root. Each unit's parameters of one dtype are views of one flat buffer of `world × len`
//! elements; rank r keeps elements `[r·len, (r+1)·len)` as its shard, the fp32 master copy the
//! optimizer updates ([`crate::worker::zero`] steps the shards and reduce-scatters gradients
//! into them as autograd produces them). Between steps the flat buffers hold no storage.
//!
//! The model marks where a unit runs ([`unit_forward`] around a layer's forward): the unit's
//! buffer is all-gathered just before (the next unit's gather is started then, so it travels
//! while this one computes), and freed after. A gradient hook on the unit's output gathers it
//! again when the backward pass reaches it (and starts the previous unit's gather); one on its
//! input frees it once the backward pass has left it. The root is gathered for a whole step
//! (and for an evaluation), as FSDP's root is. A unit whose forward is never marked (a model
//! that does not call `unit_forward`) simply stays gathered: correct, only not smaller.
//!
//! Storage is resized in place (`csrc/units.cpp`) instead of tensors being swapped, so what
//! autograd saved from a parameter sees the gathered values again and no version counter moves.

use std::collections::HashMap;
use std::os::raw::{c_char, c_int, c_void};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use anyhow::{anyhow, bail, Result};
use tch::{Kind, Tensor};

use crate::shared::ffi::call_status;
use crate::worker::ddp::BucketPlan;
use crate::worker::device::OnDeviceOf;
use crate::worker::dist::{ProcessGroup, Work};

type UnitHookFn = unsafe extern "C" fn(ctx: *mut c_void, tag: usize);

extern "C" {
    fn tb_resize_storage(tensor: *mut c_void, nbytes: usize, err: *mut c_char, len: usize)
        -> c_int;
    fn tb_view_into(
        param: *mut c_void,
        flat: *mut c_void,
        offset: i64,
        err: *mut c_char,
        len: usize,
    ) -> c_int;
    fn tb_unit_hook(
        tensor: *mut c_void,
        f: UnitHookFn,
        ctx: *mut c_void,
        tag: usize,
        err: *mut c_char,
        len: usize,
    ) -> c_int;
}

pub(crate) type SharedUnits = Arc<Mutex<UnitStore>>;

/// The store of the running job, which [`unit_forward`] and the gradient hooks reach.
static ACTIVE: Mutex<Option<SharedUnits>> = Mutex::new(None);
/// Where each parameter starts in its unit's buffer (a multiple of this many bytes).
const ALIGN_BYTES: usize = 64;
/// Tells a hook of an earlier store (a graph kept past its job) from the running one's.
static GENERATION: AtomicU64 = AtomicU64::new(1);

/// The unit of a parameter name: up to and including its first numeric part; `None` for
/// the root's parameters.
pub(crate) fn unit_of(name: &str) -> Option<&str> {
    let mut end = 0;
    for part in name.split('.') {
        end += part.len();
        if !part.is_empty() && part.bytes().all(|b| b.is_ascii_digit()) {
            return Some(&name[..end]);
        }
        end += 1;
    }
    None
}

/// Each layer's unit among `tensors` (name, bytes) and its bytes, in name order; the root's
/// tensors are not counted.
pub fn unit_sizes<'a>(tensors: impl IntoIterator<Item = (&'a str, u64)>) -> Vec<(String, u64)> {
    let mut by_unit: std::collections::BTreeMap<&str, u64> = std::collections::BTreeMap::new();
    for (name, bytes) in tensors {
        if let Some(u) = unit_of(name) {
            *by_unit.entry(u).or_default() += bytes;
        }
    }
    by_unit
        .into_iter()
        .map(|(u, b)| (u.to_string(), b))
        .collect()
}

/// Unit names in the order their layers run: numeric parts compared as numbers
/// (`layers.2` before `layers.10`).
fn natural_cmp(a: &str, b: &str) -> std::cmp::Ordering {
    let key = |s: &str| {
        s.split('.')
            .map(|p| match p.parse::<u64>() {
                Ok(n) => (n, String::new()),
                Err(_) => (u64::MAX, p.to_string()),
            })
            .collect::<Vec<_>>()
    };
    key(a).cmp(&key(b))
}

/// One flat buffer: a unit's (or the root's) parameters of one dtype that are trained, or
/// that are not.
struct Group {
    /// (variable, offset in the flat buffer, elements) per parameter.
    members: BucketPlan,
    /// Each member's index among the trainable parameters (the optimizer's order).
    trainable: Option<Vec<usize>>,
    /// Elements per rank (the buffer holds `world × len`, zero-padded).
    len: i64,
    /// The shard's dtype (the master copy's), and the gathered buffer's: bf16 for fp32
    /// parameters under bf16 compute, so gathers move half the bytes.
    kind: Kind,
    gathered: Kind,
    /// The whole unit's values while gathered; no storage while freed.
    full: Option<Tensor>,
    /// This rank's elements, which the optimizer updates.
    shard: Tensor,
    /// The shard in the gathered dtype, when that differs: what the gathers send.
    low: Option<Tensor>,
}

impl Group {
    fn full_bytes(&self, world: usize) -> usize {
        self.len as usize * world * self.gathered.elt_size_in_bytes()
    }

    /// What this rank sends into a gather: the shard, or its copy in the gathered dtype
    /// (refreshed from the shard, which the last update changed).
    fn outgoing(&self) -> Tensor {
        match &self.low {
            Some(low) => tch::no_grad(|| {
                low.shallow_clone().copy_(&self.shard);
                low.shallow_clone()
            }),
            None => self.shard.shallow_clone(),
        }
    }
}

enum State {
    Gathered,
    Gathering(Vec<Work>),
    Freed,
}

struct Unit {
    name: String,
    groups: Vec<usize>,
    state: State,
    /// Its forward has been marked: it may be freed. The root always may.
    managed: bool,
}

/// Every sharded parameter of one rank, and where each unit stands.
pub(crate) struct UnitStore {
    /// The job's process group, alive as long as the training loop that owns this store.
    pg: *const ProcessGroup,
    rank: usize,
    world: usize,
    /// The sharded variables, and their names.
    vars: Vec<Tensor>,
    names: Vec<String>,
    groups: Vec<Group>,
    /// The layers' units in name order, then the root.
    units: Vec<Unit>,
    by_name: HashMap<String, usize>,
    /// Units in the order the first pass entered them, complete once a step has ended.
    order: Vec<usize>,
    order_known: bool,
    generation: u64,
    /// The first failure in a gradient hook, reported when the step ends.
    error: Option<anyhow::Error>,
}

// SAFETY: the process group is used from the training thread and from the backward pass it
// runs, one at a time (the mutex); tensors are reference-counted atomically by libtorch.
unsafe impl Send for UnitStore {}

impl UnitStore {
    /// The layout of `vars` (every variable that is sharded, by name) over `pg`'s ranks;
    /// `trainable`: the names the optimizer steps, in its order. Each shard starts as zeros:
    /// [`UnitStore::capture`] fills them from the parameters once those are final.
    pub(crate) fn new(
        vars: Vec<(String, Tensor)>,
        trainable: &[String],
        pg: &ProcessGroup,
        compute: Option<Kind>,
    ) -> Result<Self> {
        let (rank, world) = (pg.rank(), pg.world_size());
        let opt_index: HashMap<&str, usize> = trainable
            .iter()
            .enumerate()
            .map(|(i, n)| (n.as_str(), i))
            .collect();
        let mut names: Vec<String> = vars
            .iter()
            .filter_map(|(n, _)| unit_of(n).map(str::to_string))
            .collect();
        names.sort_by(|a, b| natural_cmp(a, b));
        names.dedup();
        let mut units: Vec<Unit> = names
            .iter()
            .chain(std::iter::once(&String::new()))
            .map(|n| Unit {
                name: n.clone(),
                groups: Vec::new(),
                state: State::Gathered,
                managed: n.is_empty(),
            })
            .collect();
        let by_name: HashMap<String, usize> = names
            .iter()
            .enumerate()
            .map(|(i, n)| (n.clone(), i))
            .collect();
        let root = units.len() - 1;
        // Groups by (unit, trained, dtype), in unit order (the optimizer's buckets follow the
        // backward pass: the last layer's first, the root's last).
        let mut keyed: HashMap<(usize, bool, Kind, Kind), usize> = HashMap::new();
        let mut groups: Vec<Group> = Vec::new();
        for (v, (name, t)) in vars.iter().enumerate() {
            let u = unit_of(name).map_or(root, |n| by_name[n]);
            let trained = opt_index.get(name.as_str()).copied();
            // Matrices only (weights of linear layers, convolutions, embeddings: nearly all the
            // bytes); vectors (biases, norms' scales) stay in their dtype, as batch norm needs
            // its weight in the dtype of its fp32 running statistics.
            let gathered = match compute {
                Some(c) if t.kind() == Kind::Float && t.dim() >= 2 => c,
                _ => t.kind(),
            };
            let key = (u, trained.is_some(), t.kind(), gathered);
            let g = *keyed.entry(key).or_insert_with(|| {
                groups.push(Group {
                    members: Vec::new(),
                    trainable: trained.map(|_| Vec::new()),
                    len: 0,
                    kind: t.kind(),
                    gathered,
                    full: None,
                    shard: Tensor::new(),
                    low: None,
                });
                units[u].groups.push(groups.len() - 1);
                groups.len() - 1
            });
            let group = &mut groups[g];
            // Each parameter starts on a 64-byte boundary, as a tensor of its own would: the
            // CPU kernels (oneDNN's convolutions) take other paths for unaligned weights,
            // which round differently.
            let align = (ALIGN_BYTES / gathered.elt_size_in_bytes()).max(1) as i64;
            let off = (crate::worker::ddp::plan_len(&group.members) + align - 1) / align * align;
            group.members.push((v, off, t.numel() as i64));
            if let (Some(list), Some(i)) = (group.trainable.as_mut(), trained) {
                list.push(i);
            }
        }
        let device_of = |g: &Group| vars[g.members[0].0].1.shallow_clone();
        for g in &mut groups {
            g.len = (crate::worker::ddp::plan_len(&g.members) + world as i64 - 1) / world as i64;
            g.shard = device_of(g).zeros_on_device(&[g.len], g.kind);
            g.low =
                (g.gathered != g.kind).then(|| device_of(g).zeros_on_device(&[g.len], g.gathered));
        }
        Ok(Self {
            pg: pg as *const ProcessGroup,
            rank,
            world,
            names: vars.iter().map(|(n, _)| n.clone()).collect(),
            vars: vars.into_iter().map(|(_, t)| t).collect(),
            groups,
            units,
            by_name,
            order: Vec::new(),
            order_known: false,
            generation: GENERATION.fetch_add(1, Ordering::Relaxed),
            error: None,
        })
    }

    /// The optimizer's buckets: each trained group's members (as indices among the trainable
    /// parameters, with their offsets) and its shard, the layers' from last to first, then
    /// the root's.
    pub(crate) fn trained_layout(&self) -> Vec<(BucketPlan, Tensor)> {
        let mut out: Vec<(BucketPlan, Tensor)> = Vec::new();
        let (root, layers) = self.units.split_last().expect("the root is a unit");
        for u in layers.iter().rev().chain(std::iter::once(root)) {
            for &g in &u.groups {
                let g = &self.groups[g];
                if let Some(idx) = &g.trainable {
                    let slots = g
                        .members
                        .iter()
                        .zip(idx)
                        .map(|(&(_, off, n), &i)| (i, off, n))
                        .collect();
                    out.push((slots, g.shard.shallow_clone()));
                }
            }
        }
        out
    }

    /// Moves every parameter into its group's flat buffer (so it becomes a view of it) and
    /// copies this rank's elements into its shard: call once the parameters are final (loaded,
    /// broadcast). The units stay gathered until their forward is first marked.
    ///
    /// A layer built sharded has no values in its variables (`built`: this rank's slices of
    /// them, by name): its buffer is all-gathered from every rank's slices instead, and freed
    /// once its shard is taken, so that at no time does a rank hold more than one such unit
    /// whole.
    pub(crate) fn capture(&mut self, mut built: HashMap<String, Tensor>) -> Result<()> {
        tch::no_grad(|| -> Result<()> {
            for u in 0..self.units.len() {
                let mut hollow = false;
                for g in self.units[u].groups.clone() {
                    hollow |= self.capture_group(g, &mut built)?;
                }
                if hollow {
                    for &g in &self.units[u].groups {
                        if let Some(full) = &self.groups[g].full {
                            resize(full, 0)?;
                        }
                    }
                    self.units[u].state = State::Freed;
                }
            }
            if let Some(name) = built.keys().next() {
                bail!("ZeRO-3: {name} was built sharded but is not among the sharded variables (a variable of a unit that is not trained nor frozen for good, such as batch-norm statistics, cannot be)");
            }
            Ok(())
        })
    }

    /// Captures one group (see [`UnitStore::capture`]); true when a member was built sharded.
    fn capture_group(&mut self, gi: usize, built: &mut HashMap<String, Tensor>) -> Result<bool> {
        let world = self.world as i64;
        let g = &self.groups[gi];
        let like = &self.vars[g.members[0].0];
        // The master values first, in the shard's dtype; then the gathered copy.
        let master = like.zeros_on_device(&[g.len * world], g.kind);
        let mut hollow = false;
        for &(v, off, n) in &g.members {
            let whole = match built.remove(&self.names[v]) {
                Some(slice) => {
                    hollow = true;
                    let flat = slice.zeros_on_device(&[slice.numel() as i64 * world], slice.kind());
                    self.pg().allgather_start(&flat, &slice)?.wait()?;
                    flat.narrow(0, 0, n)
                }
                None => self.vars[v].reshape([-1]),
            };
            master.narrow(0, off, n).copy_(&whole);
        }
        let g = &mut self.groups[gi];
        g.shard
            .copy_(&master.narrow(0, self.rank as i64 * g.len, g.len));
        let full = if g.gathered == g.kind {
            master
        } else {
            master.to_kind(g.gathered)
        };
        for &(v, off, _) in &g.members {
            let p = &self.vars[v];
            // SAFETY: both are live tensors of the same dtype for the call.
            call_status("moving a parameter into its unit's buffer", |e, l| unsafe {
                tb_view_into(
                    p.as_ptr() as *mut c_void,
                    full.as_ptr() as *mut c_void,
                    off,
                    e,
                    l,
                )
            })?;
        }
        g.full = Some(full);
        Ok(hollow)
    }

    /// Bytes of parameters this rank holds between steps: its shards, and the whole of every
    /// unit that stays gathered.
    pub(crate) fn held_bytes(&self) -> u64 {
        let shards: usize = self
            .groups
            .iter()
            .map(|g| {
                let low = g.low.as_ref().map_or(0, |_| g.gathered.elt_size_in_bytes());
                g.len as usize * (g.kind.elt_size_in_bytes() + low)
            })
            .sum();
        let kept: usize = self
            .units
            .iter()
            .filter(|u| !u.managed)
            .flat_map(|u| &u.groups)
            .map(|&g| self.groups[g].full_bytes(self.world))
            .sum();
        (shards + kept) as u64
    }

    fn pg(&self) -> &ProcessGroup {
        // SAFETY: see the field.
        unsafe { &*self.pg }
    }

    fn start(&mut self, u: usize) -> Result<()> {
        if !matches!(self.units[u].state, State::Freed) {
            return Ok(());
        }
        let mut works = Vec::new();
        for &g in &self.units[u].groups {
            let group = &self.groups[g];
            let full = group
                .full
                .as_ref()
                .expect("a captured group has its buffer");
            resize(full, group.full_bytes(self.world))?;
            works.push(self.pg().allgather_start(full, &group.outgoing())?);
        }
        self.units[u].state = State::Gathering(works);
        Ok(())
    }

    fn ensure(&mut self, u: usize) -> Result<()> {
        self.start(u)?;
        if let State::Gathering(works) =
            std::mem::replace(&mut self.units[u].state, State::Gathered)
        {
            works.into_iter().try_for_each(Work::wait)?;
        }
        Ok(())
    }

    fn free(&mut self, u: usize) -> Result<()> {
        if !self.units[u].managed {
            return Ok(());
        }
        match std::mem::replace(&mut self.units[u].state, State::Freed) {
            // Freed already, but for what `gather_trained` kept: resizing to nothing is free.
            State::Freed => {}
            // A gather in flight writes into the buffer: it lands first.
            State::Gathering(works) => works.into_iter().try_for_each(Work::wait)?,
            State::Gathered => {}
        }
        for &g in &self.units[u].groups {
            if let Some(full) = &self.groups[g].full {
                resize(full, 0)?;
            }
        }
        self.units[u].state = State::Freed;
        Ok(())
    }

    fn root(&self) -> usize {
        self.units.len() - 1
    }

    /// A unit's forward begins: it is gathered, and the next unit's gather starts.
    fn enter(&mut self, u: usize) -> Result<()> {
        self.units[u].managed = true;
        self.ensure(u)?;
        if !self.order_known {
            if !self.order.contains(&u) {
                self.order.push(u);
            }
            return Ok(());
        }
        if let Some(next) = self.neighbour(u, 1) {
            self.start(next)?;
        }
        Ok(())
    }

    /// A unit's forward has ended: freed, unless the backward pass about to start needs it
    /// first (the last unit of a pass that records gradients).
    fn exit(&mut self, u: usize, grad: bool) -> Result<()> {
        if grad && self.order_known && self.order.last() == Some(&u) {
            return Ok(());
        }
        self.free(u)
    }

    /// The unit `step` places after `u` in the forward order (-1: before it).
    fn neighbour(&self, u: usize, step: isize) -> Option<usize> {
        let at = self.order.iter().position(|&x| x == u)? as isize + step;
        (at >= 0)
            .then(|| self.order.get(at as usize).copied())
            .flatten()
    }

    /// The backward pass reached the unit's output: gathered again, and the unit before it
    /// starts its gather.
    fn on_output(&mut self, u: usize) -> Result<()> {
        self.ensure(u)?;
        if let Some(prev) = self.neighbour(u, -1) {
            self.start(prev)?;
        }
        Ok(())
    }

    /// A pass over the model begins (a training step, an evaluation): the root is gathered.
    pub(crate) fn open(&mut self) -> Result<()> {
        let root = self.root();
        self.ensure(root)
    }

    /// A pass has ended (for a step, after the update): every gather in flight lands, every
    /// unit that may be is freed, and those that stay gathered take the updated shards.
    pub(crate) fn close(&mut self) -> Result<()> {
        if let Some(e) = self.error.take() {
            return Err(e);
        }
        self.order_known = self.order_known || !self.order.is_empty();
        for u in 0..self.units.len() {
            if self.units[u].managed {
                self.free(u)?;
            } else {
                self.refresh(u)?;
            }
        }
        Ok(())
    }

    /// An unmanaged unit's buffer re-gathered from the shards (after they were updated).
    fn refresh(&mut self, u: usize) -> Result<()> {
        self.ensure(u)?;
        self.units[u].state = State::Freed;
        self.ensure(u)
    }

    /// Every unit gathered.
    fn gather_all(&mut self) -> Result<()> {
        (0..self.units.len()).try_for_each(|u| self.ensure(u))
    }

    /// Gathers each unit in turn on every rank (a collective) and calls `f` with the names of
    /// its variables while they are whole; a unit that was not gathered before is freed again
    /// after, so no rank holds more than one unit at a time. A sharded checkpoint's ranks copy
    /// the tensors they write this way.
    /// A group whose gathered copy is of a lower precision gives its master values instead,
    /// gathered from the shards for the call.
    pub(crate) fn visit(
        &mut self,
        f: &mut dyn FnMut(&[(&str, Tensor)]) -> Result<()>,
    ) -> Result<()> {
        for u in 0..self.units.len() {
            let was_gathered = matches!(self.units[u].state, State::Gathered);
            self.ensure(u)?;
            let mut whole: Vec<(&str, Tensor)> = Vec::new();
            for &g in &self.units[u].groups {
                let group = &self.groups[g];
                let master = match &group.low {
                    None => None,
                    Some(_) => {
                        let flat = group
                            .shard
                            .zeros_on_device(&[group.len * self.world as i64], group.kind);
                        self.pg().allgather_start(&flat, &group.shard)?.wait()?;
                        Some(flat)
                    }
                };
                for &(v, off, n) in &group.members {
                    let t = match &master {
                        Some(flat) => flat.narrow(0, off, n).view(self.vars[v].size().as_slice()),
                        None => self.vars[v].shallow_clone(),
                    };
                    whole.push((self.names[v].as_str(), t));
                }
            }
            f(&whole)?;
            drop(whole);
            if !was_gathered {
                self.free(u)?;
            }
        }
        Ok(())
    }

    /// Every rank takes part in gathering the trained parameters (a LoRA run's adapters: a
    /// checkpoint that holds only those) for the rank that writes the checkpoint (`keep`),
    /// which holds them until [`UnitStore::close`]; the frozen rest stays sharded.
    pub(crate) fn gather_trained(&mut self, keep: bool) -> Result<()> {
        for u in 0..self.units.len() {
            if !matches!(self.units[u].state, State::Freed) {
                continue;
            }
            for &g in &self.units[u].groups.clone() {
                let group = &self.groups[g];
                let Some(full) = group.full.as_ref().filter(|_| group.trainable.is_some()) else {
                    continue;
                };
                resize(full, group.full_bytes(self.world))?;
                self.pg().allgather_start(full, &group.outgoing())?.wait()?;
                if !keep {
                    resize(full, 0)?;
                }
            }
        }
        Ok(())
    }

    fn hook(&mut self, tag: usize) {
        let (u, output) = (tag >> 1, tag & 1 == 1);
        if self.error.is_some() || u >= self.units.len() {
            return;
        }
        let outcome = if output {
            self.on_output(u)
        } else {
            self.free(u)
        };
        if let Err(e) = outcome {
            self.error = Some(e.context(format!("ZeRO-3, unit {}", self.units[u].name)));
        }
    }
}

fn resize(t: &Tensor, bytes: usize) -> Result<()> {
    // SAFETY: `t` is a live tensor for the call.
    call_status("resizing a unit's buffer", |e, l| unsafe {
        tb_resize_storage(t.as_ptr() as *mut c_void, bytes, e, l)
    })
}

/// Makes `store` the one [`unit_forward`] and the hooks reach, until [`deactivate`].
pub(crate) fn activate(store: &SharedUnits) {
    if let Ok(mut a) = ACTIVE.lock() {
        *a = Some(store.clone());
    }
}

/// The model is whole again on every rank (a collective): every unit gathered, and no
/// forward frees one any more.
pub(crate) fn deactivate(store: &SharedUnits) -> Result<()> {
    if let Ok(mut a) = ACTIVE.lock() {
        *a = None;
    }
    let mut s = lock(store)?;
    s.gather_all()?;
    for u in &mut s.units {
        u.managed = false;
    }
    Ok(())
}

fn active() -> Option<SharedUnits> {
    ACTIVE.lock().ok().and_then(|a| a.clone())
}

pub(crate) fn lock(store: &SharedUnits) -> Result<MutexGuard<'_, UnitStore>> {
    store
        .lock()
        .map_err(|_| anyhow!("ZeRO-3: a unit hook panicked"))
}

unsafe extern "C" fn on_unit_grad(_ctx: *mut c_void, tag: usize) {
    let _ = std::panic::catch_unwind(|| {
        let Some(store) = active() else { return };
        if let Ok(mut s) = store.lock() {
            if (tag >> 32) as u64 == s.generation & 0xffff_ffff {
                s.hook(tag & 0xffff_ffff);
            }
        };
    });
}

fn register(t: &Tensor, generation: u64, u: usize, output: bool) -> Result<()> {
    let tag = ((generation & 0xffff_ffff) << 32) as usize | (u << 1) | output as usize;
    // SAFETY: `t` is live; the hook reaches its store through `ACTIVE`, never through `ctx`.
    call_status("registering a unit hook", |e, l| unsafe {
        tb_unit_hook(
            t.as_ptr() as *mut c_void,
            on_unit_grad,
            std::ptr::null_mut(),
            tag,
            e,
            l,
        )
    })
}

/// `f(x)` as the forward of the unit whose parameters are named `unit.…` (a layer:
/// `model.layers.3`): under ZeRO-3 its weights are gathered just before and freed after, and
/// gathered again when the backward pass reaches it; otherwise simply `f(x)`. Put it around
/// each layer of a model (and around its recomputation's caller, not inside it).
///
/// A model's forward returns tensors, not results: a collective that fails here ends the
/// step with a panic carrying the message, which the worker reports as the step's error.
pub fn unit_forward(unit: &str, x: &Tensor, f: impl FnOnce(&Tensor) -> Tensor) -> Tensor {
    let Some(store) = active() else {
        return f(x);
    };
    match around(&store, unit, x, f) {
        Ok(y) => y,
        Err(e) => panic!("{e:#}"),
    }
}

fn around(
    store: &SharedUnits,
    unit: &str,
    x: &Tensor,
    f: impl FnOnce(&Tensor) -> Tensor,
) -> Result<Tensor> {
    let (u, generation) = {
        let mut s = lock(store)?;
        let Some(&u) = s.by_name.get(unit) else {
            drop(s);
            return Ok(f(x));
        };
        s.enter(u)?;
        (u, s.generation)
    };
    if x.requires_grad() {
        register(x, generation, u, false)?;
    }
    let y = f(x);
    let grad = y.requires_grad();
    if grad {
        register(&y, generation, u, true)?;
    }
    lock(store)?.exit(u, grad)?;
    Ok(y)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_unit_is_the_name_up_to_its_first_number() {
        assert_eq!(
            unit_of("model.layers.3.self_attn.q_proj.weight"),
            Some("model.layers.3")
        );
        assert_eq!(
            unit_of("bert.encoder.layer.11.output.dense.bias"),
            Some("bert.encoder.layer.11")
        );
        assert_eq!(unit_of("layer2.1.conv1.weight"), Some("layer2.1"));
        assert_eq!(unit_of("0.weight"), Some("0"));
        assert_eq!(unit_of("model.embed_tokens.weight"), None);
        assert_eq!(unit_of("lm_head.weight"), None);
    }

    #[test]
    fn units_run_in_natural_order() {
        let mut v = vec!["h.10", "h.2", "h.1", "emb.0"];
        v.sort_by(|a, b| natural_cmp(a, b));
        assert_eq!(v, ["emb.0", "h.1", "h.2", "h.10"]);
    }
}
