//! The memory plan of a job, made before any worker starts: what each device will hold, by
//! part, against what the device has, and the levers that would make a job fit that does not.
//!
//! The recipe reports the shapes of its model ([`FootprintFn`]: the trainable tensors, the
//! activations of one micro-batch); the engine knows what it keeps around them: fp32 master
//! weights and gradients, the state of the optimizer (sharded by ZeRO), the communication buckets
//! of `ddp` and `zero` (their sizes come from the same bucket plan the workers use), bf16
//! the weight copies of bf16 autocast, and its own fixed overhead. A job whose plan exceeds its device
//! fails in [`check`] before its run directory exists, naming the levers.
//!
//! On CPU, the peak is the resident memory of the worker process, and the glibc allocator keeps
//! freed blocks of its heap resident: short-lived tensors of the forward pass, and
//! parameter-sized ones (initialisation, the first broadcast, the fresh gradients of each step
//! before they are added up). The activations and parameters themselves are counted tensor by
//! tensor (and match the saved-tensor hooks of torch); what glibc keeps on top is the one
//! fitted part of the plan, [`CPU_RETAINED_PER_ACTIVATION`] and [`CPU_RETAINED_PER_PARAMETER`],
//! fitted to measured peaks and checked on others (docs/benchmarks.md). With a fixed mmap
//! threshold (`MALLOC_MMAP_THRESHOLD_`) the resident peak falls to the counted bytes, at about
//! 25% more time per step, so trainbook leaves the glibc default alone.

use anyhow::{bail, Result};
use trainbook_api::DeviceKind;
use trainbook_api::{
    plumbing::settings::parse_bytes, Capacity, Footprint, Lever, MemoryPlan, MemoryRow,
};
use trainbook_api::{Hyper, JobSpec, OptimizerKind, Precision};

use super::ddp;
use super::recipe::{FootprintFn, Layout, RecipeEntry};
use super::zero::IN_FLIGHT;

const F32: u64 = 4;
const MIB: u64 = 1 << 20;
const GIB: f64 = (1u64 << 30) as f64;

/// Resident memory of a CPU worker before it holds any model: the runtime, the code of libtorch and
/// data, the tokenizer and the data set of the offline presets (fitted: 170 MiB).
const CPU_BASE: u64 = 170 * MIB;
/// Memory CUDA keeps outside the tensors the caching allocator reports: the context, the cuBLAS
/// workspaces, allocator rounding (the usual NVIDIA figure for the context alone is 300-500 MiB).
const CUDA_BASE: u64 = 768 * MIB;
/// What the Gaudi runtime and the bridge reserve besides tensors; not measured (no Gaudi here).
const HPU_BASE: u64 = 1024 * MIB;
/// Resident memory glibc keeps per byte of activations (fitted; see the module docs).
const CPU_RETAINED_PER_ACTIVATION: f64 = 0.16;
/// Resident memory glibc keeps per byte of fp32 parameters (fitted; see the module docs):
/// under ZeRO-2, whose gradients never accumulate in the parameters, fewer parameter-sized
/// temporaries pass through the heap.
const CPU_RETAINED_PER_PARAMETER: f64 = 1.66;
const CPU_RETAINED_PER_PARAMETER_ZERO2: f64 = 1.3;

/// The plan of `spec` on `device`, when its recipe reports a footprint.
pub(crate) fn plan(
    entry: &RecipeEntry,
    spec: &JobSpec,
    hyper: &Hyper,
    device: DeviceKind,
) -> Result<Option<MemoryPlan>> {
    let Some(footprint) = entry.footprint else {
        return Ok(None);
    };
    let world = spec.world_size();
    let capacity = capacity(spec, device)?;
    let base = estimate(footprint, hyper, world, device)?;
    let fits = |total: u64| capacity.as_ref().map(|c| total <= c.bytes);
    let mut levers = Vec::new();
    let mut all = hyper.clone();
    for (change, edit) in lever_edits(hyper, world, base.batch) {
        let mut h = hyper.clone();
        edit(&mut h);
        edit(&mut all);
        let total = estimate(footprint, &h, world, device)?.peak();
        levers.push(Lever {
            change,
            total,
            fits: fits(total),
        });
    }
    if levers.len() > 1 {
        let total = estimate(footprint, &all, world, device)?.peak();
        let change = levers
            .iter()
            .map(|l| l.change.as_str())
            .collect::<Vec<_>>()
            .join(" ");
        levers.push(Lever {
            change,
            total,
            fits: fits(total),
        });
    }
    Ok(Some(MemoryPlan {
        recipe: spec.recipe.clone(),
        device,
        workers: world,
        model: base.footprint.model.clone(),
        parameters: base.footprint.parameters(),
        batch_per_device: base.batch,
        grad_accum: hyper.grad_accum.max(1),
        setup: setup(hyper),
        rows: base.rows,
        total: base.total,
        rank0_extra: base.rank0_extra,
        rank0_detail: base.rank0_detail,
        capacity,
        levers,
    }))
}

/// Fails when the plan of `spec` exceeds its device, naming the levers; passes when the
/// recipe is not planned, the memory of the device is unknown, or the check is turned off.
pub(crate) fn check(
    entry: &RecipeEntry,
    spec: &JobSpec,
    hyper: &Hyper,
    device: DeviceKind,
) -> Result<()> {
    if !spec.memory_check {
        return Ok(());
    }
    if let Some(p) = plan(entry, spec, hyper, device)? {
        if p.fits() == Some(false) {
            let unit = oversized_unit(entry, spec, hyper, device, &p)?;
            bail!("{}{}", unit.unwrap_or_default(), p.not_fitting_error());
        }
    }
    Ok(())
}

/// Under ZeRO-3, the layer that cannot be gathered whole on the device with the next one
/// prefetched, in words: no number of workers makes such a job fit.
fn oversized_unit(
    entry: &RecipeEntry,
    spec: &JobSpec,
    hyper: &Hyper,
    device: DeviceKind,
    plan: &MemoryPlan,
) -> Result<Option<String>> {
    let (Some(footprint), Some(capacity)) = (entry.footprint, &plan.capacity) else {
        return Ok(None);
    };
    if hyper.zero < 3 || spec.world_size() < 2 {
        return Ok(None);
    }
    let fp = estimate(footprint, hyper, spec.world_size(), device)?.footprint;
    let Some((name, bytes)) = fp.units.iter().rev().max_by_key(|u| u.1) else {
        return Ok(None);
    };
    Ok((GATHERED_UNITS as u64 * bytes > capacity.bytes).then(|| {
        format!(
            "ZeRO-3 gathers each layer whole while it computes, with the next one prefetched, and {name} alone holds {:.2} GiB whole: two of them are more than the {:.2} GiB a device has, whatever the number of workers. Use devices with more memory, or hold the weights in bf16 (--precision bf16 with --lora-rank, whose frozen base is bf16).\n",
            *bytes as f64 / GIB,
            capacity.bytes as f64 / GIB
        )
    }))
}

/// The options a plan reports itself under, e.g. "adamw, ZeRO-1, bf16, activation checkpointing".
fn setup(h: &Hyper) -> String {
    let mut parts = vec![h.optimizer.to_string()];
    if h.zero > 0 {
        parts.push(format!("ZeRO-{}", h.zero));
    }
    parts.push(h.precision.to_string());
    if h.activation_checkpointing {
        parts.push(match h.checkpoint_layers_every {
            1 => "activation checkpointing".into(),
            k => format!("activation checkpointing (every {k}. layer)"),
        });
    }
    parts.join(", ")
}

type Edit = Box<dyn Fn(&mut Hyper)>;

/// The levers the job does not use yet, each as a flag and the change it makes.
fn lever_edits(h: &Hyper, world: usize, batch: usize) -> Vec<(String, Edit)> {
    let mut levers: Vec<(String, Edit)> = Vec::new();
    if world > 1 && h.zero < 2 {
        // Stage 2 shards what stage 1 does and the gradients too: the stronger lever.
        levers.push(("--zero 2".into(), Box::new(|h: &mut Hyper| h.zero = 2)));
    }
    if world > 1 && h.zero < 3 {
        levers.push(("--zero 3".into(), Box::new(|h: &mut Hyper| h.zero = 3)));
    }
    if !h.activation_checkpointing {
        levers.push((
            "--activation-checkpointing".into(),
            Box::new(|h: &mut Hyper| {
                h.activation_checkpointing = true;
                h.checkpoint_layers_every = 1;
            }),
        ));
    }
    if h.precision == Precision::Fp32 {
        levers.push((
            "--precision bf16".into(),
            Box::new(|h: &mut Hyper| h.precision = Precision::Bf16),
        ));
    }
    if batch >= 2 {
        let accum = h.grad_accum.max(1) * 2;
        levers.push((
            format!("--grad-accum {accum}"),
            Box::new(move |h: &mut Hyper| h.grad_accum = accum),
        ));
    }
    levers
}

/// Optimizer state tensors per parameter.
fn state_tensors(h: &Hyper) -> u64 {
    match h.optimizer {
        OptimizerKind::Sgd if h.momentum == 0.0 => 0,
        OptimizerKind::Sgd => 1,
        OptimizerKind::Adamw | OptimizerKind::Lamb | OptimizerKind::Lans => 2,
    }
}

/// The rows of a plan, what they come to, and what they came from.
struct Estimate {
    rows: Vec<MemoryRow>,
    /// The peak of every worker (the sum of the rows).
    total: u64,
    /// What rank 0 holds more while it writes a checkpoint, and why.
    rank0_extra: u64,
    rank0_detail: String,
    footprint: Footprint,
    batch: usize,
}

impl Estimate {
    fn peak(&self) -> u64 {
        self.total + self.rank0_extra
    }
}

/// The rows and total of a plan, the footprint they came from and the batch per device.
fn estimate(
    footprint: FootprintFn,
    h: &Hyper,
    world: usize,
    device: DeviceKind,
) -> Result<Estimate> {
    let accum = h.grad_accum.max(1);
    let batch = (h.global_batch_size / (world * accum)).max(1);
    let fp = footprint(
        h,
        &Layout {
            batch_per_device: batch,
            device,
        },
    )?;
    let p = fp.parameters();
    let zero = if world > 1 { h.zero } else { 0 };
    let mut rows = model_state_rows(&fp, h, world, zero);
    let acts: u64 = fp.activations.iter().map(|(_, b)| b).sum();
    let parts: Vec<String> = fp
        .activations
        .iter()
        .map(|(what, b)| format!("{what} {:.0} MiB", *b as f64 / MIB as f64))
        .collect();
    rows.push(MemoryRow {
        what: "activations".into(),
        bytes: acts,
        detail: format!("{batch} samples per micro-batch: {}", parts.join(", ")),
    });
    if h.precision == Precision::Bf16 {
        rows.push(bf16_copies_row(&fp, h, zero));
    }
    // What the heap holds free once the backward pass is over (CPU): the activations, and what
    // glibc kept of freed blocks.
    let mut heap_free_after_backward = 0;
    if device == DeviceKind::Cpu {
        // Under ZeRO-3 the parameter-sized temporaries are a unit's, not the model's: taken
        // as ZeRO-2's per shard (not fitted yet).
        let per_parameter = match zero {
            0 | 1 => CPU_RETAINED_PER_PARAMETER,
            2 => CPU_RETAINED_PER_PARAMETER_ZERO2,
            _ => CPU_RETAINED_PER_PARAMETER_ZERO2 / world as f64,
        };
        let kept = acts as f64 * CPU_RETAINED_PER_ACTIVATION + (p * F32) as f64 * per_parameter;
        heap_free_after_backward = acts + kept as u64;
        rows.push(MemoryRow {
            what: "allocator".into(),
            bytes: kept as u64,
            detail: "freed blocks glibc keeps resident (short-lived activations, parameter-sized temporaries; fitted)".into(),
        });
    }
    rows.push(framework_row(device));
    let total = rows.iter().map(|r| r.bytes).sum();
    // On CPU, rank 0 gathers the whole optimizer state from the shards into its own memory to
    // write a checkpoint, into the heap the backward pass left free.
    let (mut rank0_extra, mut rank0_detail) = (0, String::new());
    if device == DeviceKind::Cpu && zero >= 1 {
        // ZeRO-3 gathers the whole weights too (for now: consolidated checkpoints).
        let weights = if zero >= 3 {
            p * F32 + fp.frozen_bytes
        } else {
            0
        };
        let gathered = state_tensors(h) * p * F32 + weights;
        rank0_extra = gathered.saturating_sub(heap_free_after_backward);
        rank0_detail = format!(
            "the whole {} state{} gathered to write it ({:.2} GiB), in the heap the backward pass left free",
            h.optimizer,
            if zero >= 3 { " and weights" } else { "" },
            gathered as f64 / (1u64 << 30) as f64
        );
    }
    Ok(Estimate {
        rows,
        total,
        rank0_extra,
        rank0_detail,
        footprint: fp,
        batch,
    })
}

/// Parameters, gradients, optimizer state and communication buffers: what the workers keep
/// of the model, by ZeRO stage, from the same bucket plan the workers make.
fn model_state_rows(fp: &Footprint, h: &Hyper, world: usize, zero: u8) -> Vec<MemoryRow> {
    if zero >= 3 {
        return sharded_parameter_rows(fp, h, world);
    }
    let p = fp.parameters();
    // ZeRO pads each bucket to a multiple of the workers; stage 2 holds its largest buckets
    // in flight.
    let buckets: Vec<u64> = ddp::group_buckets(
        fp.trainable.iter().map(|&n| ((), n as i64, n as usize * 4)),
        ddp::BUCKET_BYTES,
    )
    .iter()
    .map(|b| ddp::plan_len(b) as u64)
    .collect();
    let shard: u64 = buckets.iter().map(|&n| n.div_ceil(world as u64)).sum();
    let states = state_tensors(h);
    // Stage 2 makes its buckets while the backward pass runs: the largest ones in flight at
    // once come on top (the memory the layers free as the pass goes cannot always take them).
    let in_flight: u64 = largest_sum(&buckets, IN_FLIGHT + 1) * F32;
    let (comm, comm_detail) = match zero {
        0 if world == 1 => (0, "none: one worker exchanges no gradients".to_string()),
        0 => (
            p * F32,
            "flat gradient buckets (25 MiB each), kept between steps".to_string(),
        ),
        1 => (
            2 * shard * F32,
            format!("the gradient and parameter shards of this worker (1/{world})"),
        ),
        _ => (
            2 * shard * F32 + in_flight,
            format!(
                "gradient and parameter shards (1/{world}) and up to {} buckets in flight in the backward pass",
                IN_FLIGHT + 1
            ),
        ),
    };
    vec![
        MemoryRow {
            what: "parameters".into(),
            bytes: p * F32 + fp.frozen_bytes,
            detail: weights_detail(fp, ""),
        },
        MemoryRow {
            what: "gradients".into(),
            bytes: if zero >= 2 { 0 } else { p * F32 },
            detail: if zero >= 2 {
                "none kept: reduced into the shards during the backward pass".into()
            } else {
                "fp32, one per parameter".into()
            },
        },
        MemoryRow {
            what: "optimizer state".into(),
            bytes: states * if zero >= 1 { shard } else { p } * F32,
            detail: format!(
                "{}: {states} fp32 tensor(s) per parameter{}",
                h.optimizer,
                if zero >= 1 {
                    format!(", 1/{world} of them (ZeRO-{zero})")
                } else {
                    String::new()
                }
            ),
        },
        MemoryRow {
            what: "communication buffers".into(),
            bytes: comm,
            detail: comm_detail,
        },
    ]
}

/// The bf16 copies autocast makes of the matrices and keeps for the backward pass.
fn bf16_copies_row(fp: &Footprint, h: &Hyper, zero: u8) -> MemoryRow {
    // Recomputed ZeRO-3 layers keep no copies between their forward and backward: only the
    // layers gathered at a time hold theirs.
    let layers: u64 = fp.units.iter().map(|u| u.1).sum();
    let kept = match (zero >= 3 && h.activation_checkpointing, layers) {
        // The gathered matrices are bf16 already (full fine-tuning): autocast copies none.
        _ if zero >= 3 && fp.frozen_bytes == 0 => 0,
        (true, l) if l > 0 => {
            let share = largest_sum(&unit_bytes(fp), GATHERED_UNITS) as f64 / l as f64;
            (fp.cast_by_autocast as f64 * share) as u64
        }
        _ => fp.cast_by_autocast,
    };
    let detail = match kept {
        0 => "none: ZeRO-3 gathers the matrices as bf16 already",
        _ => "bf16 copies of the matrices made by autocast, kept for the backward pass",
    };
    MemoryRow {
        what: "bf16 weight copies".into(),
        bytes: kept * 2,
        detail: detail.into(),
    }
}

/// Layers a ZeRO-3 worker holds gathered at once: the one computing and the prefetched one.
const GATHERED_UNITS: usize = 2;

fn unit_bytes(fp: &Footprint) -> Vec<u64> {
    fp.units.iter().map(|u| u.1).collect()
}

/// The sum of the `n` largest of `sizes`.
fn largest_sum(sizes: &[u64], n: usize) -> u64 {
    let mut sorted = sizes.to_vec();
    sorted.sort_unstable_by(|a, b| b.cmp(a));
    sorted.iter().take(n).sum()
}

/// What the parameters row counts: trained fp32 weights, and a frozen base beside them.
fn weights_detail(fp: &Footprint, share: &str) -> String {
    let trained = format!(
        "fp32 master weights of the {} trained parameters",
        count(fp.parameters())
    );
    match fp.frozen_bytes {
        0 => format!("{trained}{share}"),
        b => format!(
            "{trained} and the frozen base ({:.2} GiB whole){share}",
            b as f64 / GIB
        ),
    }
}

fn count(n: u64) -> String {
    match n {
        n if n >= 1_000_000_000 => format!("{:.2}B", n as f64 / 1e9),
        n if n >= 1_000_000 => format!("{:.1}M", n as f64 / 1e6),
        n => n.to_string(),
    }
}

/// ZeRO-3: every parameter, gradient and optimizer state sharded 1/W; what is whole is the
/// root's weights for a step and the units in flight (the one computing and the one being
/// prefetched), and the gradient buckets of the units the backward pass reduces.
fn sharded_parameter_rows(fp: &Footprint, h: &Hyper, world: usize) -> Vec<MemoryRow> {
    let w = world as u64;
    let p = fp.parameters();
    let whole = p * F32 + fp.frozen_bytes;
    let layers: u64 = fp.units.iter().map(|u| u.1).sum();
    let root = whole.saturating_sub(layers);

    // Current and prefetched; the root stays gathered through the step.
    let gathered = largest_sum(&unit_bytes(fp), GATHERED_UNITS);
    // A unit's gradient bucket is the size of its trained part (all of it in full
    // fine-tuning); under LoRA the adapters' are small.
    let trained_share = if whole == 0 {
        0.0
    } else {
        (p * F32) as f64 / whole as f64
    };
    let buckets =
        ((largest_sum(&unit_bytes(fp), IN_FLIGHT + 1) + root) as f64 * trained_share) as u64;
    let shard = |bytes: u64| bytes.div_ceil(w);
    let states = state_tensors(h);
    // Under bf16 a full fine-tune gathers bf16 copies of its fp32 masters (the matrices,
    // nearly all the bytes), made from a bf16 copy of each shard.
    let low = h.precision == Precision::Bf16 && fp.frozen_bytes == 0;
    let (gathered_bytes, copy, how) = match low {
        true => ((root + gathered) / 2, shard(whole) / 2, "bf16 copies"),
        false => (root + gathered, 0, "whole"),
    };
    vec![
        MemoryRow {
            what: "parameters".into(),
            bytes: shard(whole) + copy,
            detail: weights_detail(
                fp,
                &format!(
                    ", 1/{world} of each tensor (ZeRO-3){}",
                    if low { ", and the shard's bf16 copy" } else { "" }
                ),
            ),
        },
        MemoryRow {
            what: "gathered units".into(),
            bytes: gathered_bytes,
            detail: format!(
                "{how} while they compute: the root (embeddings, head: {:.2} GiB) for the step, and 2 of {} layers at a time (the current and the prefetched, {:.2} GiB)",
                root as f64 / GIB / if low { 2.0 } else { 1.0 },
                fp.units.len().max(1),
                gathered as f64 / GIB / if low { 2.0 } else { 1.0 }
            ),
        },
        MemoryRow {
            what: "gradients".into(),
            bytes: shard(p * F32),
            detail: format!("fp32, 1/{world} of them: reduced into the shards during the backward pass"),
        },
        MemoryRow {
            what: "optimizer state".into(),
            bytes: states * shard(p * F32),
            detail: format!(
                "{}: {states} fp32 tensor(s) per parameter, 1/{world} of them (ZeRO-3)",
                h.optimizer
            ),
        },
        MemoryRow {
            what: "communication buffers".into(),
            bytes: buckets,
            detail: format!(
                "the gradient buckets of up to {} units and the root's in flight in the backward pass",
                IN_FLIGHT + 1
            ),
        },
    ]
}

/// The memory the framework itself takes on a device.
fn framework_row(device: DeviceKind) -> MemoryRow {
    let (bytes, detail) = match device {
        DeviceKind::Cpu => (
            CPU_BASE,
            "worker process: runtime, libtorch, tokenizer and data",
        ),
        DeviceKind::Cuda => (CUDA_BASE, "CUDA context, cuBLAS workspaces (assumed)"),
        DeviceKind::Hpu => (
            HPU_BASE,
            "Gaudi runtime reservations (assumed, not measured)",
        ),
    };
    MemoryRow {
        what: "framework".into(),
        bytes,
        detail: detail.into(),
    }
}

/// How much memory the device of each worker has: `device_memory` of the job, else what this
/// machine reports (CPU: the available memory shared by the workers of this node).
fn capacity(spec: &JobSpec, device: DeviceKind) -> Result<Option<Capacity>> {
    if let Some(text) = &spec.device_memory {
        return Ok(Some(Capacity {
            bytes: parse_bytes(text)?,
            source: "--device-memory".into(),
        }));
    }
    Ok(match device {
        DeviceKind::Cpu => mem_available().map(|b| Capacity {
            bytes: b / spec.workers.max(1) as u64,
            source: format!("available memory / {} workers", spec.workers),
        }),
        DeviceKind::Cuda => smi_total(
            "nvidia-smi",
            &["--query-gpu=memory.total", "--format=csv,noheader,nounits"],
        )
        .map(|b| Capacity {
            bytes: b,
            source: "nvidia-smi".into(),
        }),
        DeviceKind::Hpu => smi_total(
            "hl-smi",
            &["-Q", "memory.total", "-f", "csv,noheader,nounits"],
        )
        .map(|b| Capacity {
            bytes: b,
            source: "hl-smi".into(),
        }),
    })
}

/// MemAvailable of /proc/meminfo, in bytes.
fn mem_available() -> Option<u64> {
    let text = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = text.lines().find(|l| l.starts_with("MemAvailable:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}

/// The smallest device memory (MiB) a vendor tool lists, in bytes.
fn smi_total(tool: &str, args: &[&str]) -> Option<u64> {
    let out = std::process::Command::new(tool).args(args).output().ok()?;
    if !out.status.success() {
        return None;
    }
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| l.trim().split_whitespace().next()?.parse::<u64>().ok())
        .min()
        .map(|mib| mib * MIB)
}
