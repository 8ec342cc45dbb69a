//! ZeRO-3's sharded build: a model built (and loaded) a unit at a time, each rank keeping only
//! its slice of every layer's weights, so no rank ever holds the whole model.
//!
//! The worker opens a build ([`begin`]) before the recipe makes its model when the job runs
//! ZeRO-3 on several workers. The model tells when a layer is complete ([`unit_built`]): each
//! of its variables, initialised as in a replicated build (every rank draws the same numbers
//! from the same seed), gives this rank its slice, then becomes *hollow*: its shape and dtype,
//! no storage. A rank's slice of a variable of `n` elements is elements `[r·c, r·c + c)` of it
//! flattened, `c = ⌈n / W⌉`, zero-padded. Loading a checkpoint then reads only those elements
//! ([`fill`]: the byte ranges of the mapped files), a cast or a move to the device changes the
//! slice ([`cast`], [`place`]), and the unit store, capturing the units, all-gathers each
//! layer's slices a unit at a time into its buffer ([`take`]), keeps its shard, and frees it.
//!
//! The root (embeddings, final norm, head) is built whole, as it is held whole in every step.

use std::collections::HashMap;
use std::os::raw::{c_char, c_int, c_void};
use std::sync::Mutex;

use anyhow::{bail, Context, Result};
use tch::{nn, Kind, Tensor};

use crate::shared::ffi::call_status;
use crate::shared::tensor_files::TensorFiles;

extern "C" {
    fn tb_hollow(param: *mut c_void, like: *mut c_void, err: *mut c_char, len: usize) -> c_int;
}

/// Gives the memory freed so far back to the system. glibc keeps freed blocks below its
/// (self-raising) mmap threshold in its heaps, and a layer's tensors are such blocks: without
/// this, a rank that built and dropped every layer in turn stays resident at about the whole
/// model (measured: 1.4-1.8 GB against 0.65 for a 1.2 GB Llama on 4 ranks).
pub(crate) fn give_back_freed_memory() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: a plain glibc call with no pointer arguments.
    unsafe {
        libc::malloc_trim(0);
    }
}

/// The open build of this process: its rank, its world, and the slices of the variables
/// built so far, by name.
struct Building {
    rank: usize,
    world: usize,
    slices: HashMap<String, Slice>,
}

/// This rank's elements of a built variable, and how many the whole variable has (the slice's
/// length alone does not say: padding).
struct Slice {
    values: Tensor,
    numel: i64,
}

static BUILDING: Mutex<Option<Building>> = Mutex::new(None);

fn building() -> std::sync::MutexGuard<'static, Option<Building>> {
    // A panic while the lock was held leaves plain data behind: still usable.
    BUILDING.lock().unwrap_or_else(|e| e.into_inner())
}

/// Rank `rank` of `world` builds its model sharded from now until [`take`].
pub(crate) fn begin(rank: usize, world: usize) {
    *building() = Some(Building {
        rank,
        world,
        slices: HashMap::new(),
    });
}

/// Ends the build: the slices by variable name (none when no build was open, or when the model
/// never marked a unit as built).
pub(crate) fn take() -> HashMap<String, Tensor> {
    building()
        .take()
        .map(|b| b.slices.into_iter().map(|(n, s)| (n, s.values)).collect())
        .unwrap_or_default()
}

/// Whether `name` is a variable built sharded, hollow until its unit is captured.
pub(crate) fn is_built(name: &str) -> bool {
    building()
        .as_ref()
        .is_some_and(|b| b.slices.contains_key(name))
}

/// The elements of a variable of `n` elements that rank `rank` of `world` keeps: (first,
/// count, slice length).
fn span(n: i64, rank: usize, world: usize) -> (i64, i64, i64) {
    let c = (n + world as i64 - 1) / world as i64;
    let first = (rank as i64 * c).min(n);
    (first, c.min(n - first), c)
}

fn hollow(var: &Tensor, like: &Tensor) -> Result<()> {
    // SAFETY: both are live tensors for the call.
    call_status("hollowing a variable built under ZeRO-3", |e, l| unsafe {
        tb_hollow(
            var.as_ptr() as *mut c_void,
            like.as_ptr() as *mut c_void,
            e,
            l,
        )
    })
}

/// The model says that the layer whose variables are named `unit.…` (`model.layers.3`) is
/// built: under a sharded build each of its variables keeps this rank's slice and becomes
/// hollow; otherwise nothing happens. Call it after each layer is made, before the next.
pub fn unit_built(vs: &nn::VarStore, unit: &str) -> Result<()> {
    let mut guard = building();
    let Some(b) = guard.as_mut() else {
        return Ok(());
    };
    let prefix = format!("{unit}.");
    let mut vars: Vec<(String, Tensor)> = vs
        .variables()
        .into_iter()
        .filter(|(n, _)| n.starts_with(&prefix) && !b.slices.contains_key(n))
        .collect();
    if vars.is_empty() {
        bail!("ZeRO-3: the model marked {unit} as built, but it has no variable named {unit}.…: mark a layer by its variables' prefix");
    }
    vars.sort_by(|a, b| a.0.cmp(&b.0));
    for (name, var) in vars {
        let numel = var.numel() as i64;
        let (first, count, c) = span(numel, b.rank, b.world);
        // Models are built on the host (and moved to their device after: [`place`]).
        let slice = Tensor::zeros([c], (var.kind(), var.device()));
        tch::no_grad(|| {
            slice
                .narrow(0, 0, count)
                .copy_(&var.reshape([-1]).narrow(0, first, count))
        });
        hollow(&var, &slice)?;
        drop(var);
        b.slices.insert(
            name,
            Slice {
                values: slice,
                numel,
            },
        );
    }
    give_back_freed_memory();
    Ok(())
}

/// Loads a built variable: `read(first, count)` gives elements `[first, first + count)` of the
/// stored tensor (of `n` elements, flattened), which become this rank's slice. False when
/// `name` was not built sharded (load it whole).
pub fn fill(name: &str, read: impl FnOnce(i64, i64) -> Result<Tensor>) -> Result<bool> {
    let mut guard = building();
    let Some(b) = guard.as_mut() else {
        return Ok(false);
    };
    let (rank, world) = (b.rank, b.world);
    let Some(slice) = b.slices.get_mut(name) else {
        return Ok(false);
    };
    let (first, count, _) = span(slice.numel, rank, world);
    let part = read(first, count)?;
    tch::no_grad(|| {
        slice
            .values
            .narrow(0, 0, count)
            .copy_(&part.reshape([-1]).to_kind(slice.values.kind()))
    });
    Ok(true)
}

/// Loads `vars` from `files` (by name): a built variable only this rank's elements, the
/// others whole. Returns the names the files do not hold.
pub(crate) fn load(files: &TensorFiles, vars: &HashMap<String, Tensor>) -> Result<Vec<String>> {
    let (built, whole): (HashMap<String, Tensor>, HashMap<String, Tensor>) = vars
        .iter()
        .map(|(n, t)| (n.clone(), t.shallow_clone()))
        .partition(|(n, _)| is_built(n));
    let mut missing = files.load_into(&whole)?;
    for (name, var) in &built {
        if !files.holds(name, var)? {
            missing.push(name.clone());
            continue;
        }
        fill(name, |first, count| {
            files
                .get_range(name, first, count)?
                .context("a tensor whose shape was just read")
        })?;
    }
    missing.sort();
    Ok(missing)
}

/// Gives a built variable the dtype `kind` (its slice converted). False when `name` was not
/// built sharded (convert it whole).
pub fn cast(name: &str, var: &Tensor, kind: Kind) -> Result<bool> {
    change(name, var, |s| Ok(s.to_kind(kind)))
}

/// Puts a built variable on its device: `put` moves its slice there. False when `name` was
/// not built sharded.
pub(crate) fn place(
    name: &str,
    var: &Tensor,
    put: impl FnOnce(&Tensor) -> Result<Tensor>,
) -> Result<bool> {
    change(name, var, put)
}

fn change(name: &str, var: &Tensor, f: impl FnOnce(&Tensor) -> Result<Tensor>) -> Result<bool> {
    let mut guard = building();
    let Some(slice) = guard.as_mut().and_then(|b| b.slices.get_mut(name)) else {
        return Ok(false);
    };
    let changed = f(&slice.values)?;
    hollow(var, &changed)?;
    slice.values = changed;
    Ok(true)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_rank_keeps_its_elements_of_each_variable_padded_to_an_equal_length() {
        assert_eq!(span(5, 0, 3), (0, 2, 2));
        assert_eq!(span(5, 2, 3), (4, 1, 2));
        // More ranks than elements: the last ones keep padding only.
        assert_eq!(span(2, 2, 3), (2, 0, 1));
    }

    /// One test for the process-wide build (tests of one binary run side by side).
    #[test]
    fn a_layer_built_sharded_keeps_its_slice_and_no_storage_until_taken() {
        let vs = nn::VarStore::new(tch::Device::Cpu);
        let layer = vs.root().sub("layers").sub(0);
        let w = layer.randn_standard("w", &[5]);
        let root = vs.root().zeros("norm", &[3]);
        assert!(!is_built("layers.0.w"));
        unit_built(&vs, "layers.0").unwrap(); // no build open: nothing happens
        assert!(!w.data_ptr().is_null());

        begin(1, 3);
        unit_built(&vs, "layers.0").unwrap();
        assert!(is_built("layers.0.w") && !is_built("norm"));
        assert_eq!((w.size(), w.data_ptr().is_null()), (vec![5], true));
        assert!(!root.data_ptr().is_null());
        let e = unit_built(&vs, "layers.7").unwrap_err().to_string();
        assert!(e.contains("layers.7") && e.contains("prefix"), "{e}");

        // Loading reads rank 1's elements 2 and 3 only.
        let mut asked = None;
        let read = |first, count| {
            asked = Some((first, count));
            Ok(Tensor::from_slice(&[7.0f64, 8.0]))
        };
        assert!(fill("layers.0.w", read).unwrap());
        assert_eq!(asked, Some((2, 2)));
        assert!(!fill("norm", |_, _| unreachable!()).unwrap());
        assert!(cast("layers.0.w", &w, Kind::BFloat16).unwrap());
        assert_eq!((w.kind(), w.size()), (Kind::BFloat16, vec![5]));

        let slices = take();
        assert!(!is_built("layers.0.w"));
        let s = &slices["layers.0.w"];
        assert_eq!(s.kind(), Kind::BFloat16);
        assert_eq!(
            Vec::<f32>::try_from(s.to_kind(Kind::Float)).unwrap(),
            [7.0, 8.0]
        );
    }
}
