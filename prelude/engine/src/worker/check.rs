//! `trainbook check --workers N`: verifies the collectives themselves across N real worker
//! processes — sums, means, maxima, broadcasts and barriers with known answers — without
//! training anything. The first thing to run when a new machine or container misbehaves.

use anyhow::{bail, Result};
use tch::{Kind, Tensor};

use crate::worker::device::Device;

use crate::shared::events::Emitter;
use crate::worker::dist::{ProcessGroup, ReduceOp};
use crate::worker::jobs::Work;

/// A tensor of `value`s on `device`, checked to be there: a device plugin that silently left
/// tensors on the CPU would otherwise pass every check.
fn full(device: Device, size: &[i64], value: f64, kind: Kind) -> Result<Tensor> {
    let t = device.put(&Tensor::full(size, value, (kind, tch::Device::Cpu)))?;
    if !device.holds(&t) {
        bail!(
            "a tensor placed on {device} is not there: the device plugin did not register {device}"
        );
    }
    Ok(t)
}

fn expect_close(what: &str, got: &Tensor, want: f64) -> Result<()> {
    let diff = (got.to_kind(Kind::Double) - want)
        .abs()
        .max()
        .double_value(&[]);
    if diff > 1e-6 * want.abs().max(1.0) {
        bail!("{what}: expected every element to be {want}, max deviation {diff}");
    }
    Ok(())
}

/// Runs every check on this rank; all ranks must run it together.
fn check_collectives(pg: &ProcessGroup, device: Device, events: &Emitter) -> Result<()> {
    let (rank, world) = (pg.rank() as f64, pg.world_size() as f64);
    let tri = world * (world + 1.0) / 2.0; // sum over ranks of (rank + 1)
    for &n in &[1i64, 7, 1 << 20] {
        let t = full(device, &[n], rank + 1.0, Kind::Float)?;
        pg.allreduce(&[&t], ReduceOp::Sum)?;
        expect_close(&format!("allreduce sum of {n} floats"), &t, tri)?;
    }
    let t = full(device, &[1000], rank + 1.0, Kind::Double)?;
    pg.allreduce(&[&t], ReduceOp::Mean)?;
    expect_close("allreduce mean", &t, tri / world)?;
    let t = full(device, &[3], rank, Kind::Float)?;
    pg.allreduce(&[&t], ReduceOp::Max)?;
    expect_close("allreduce max", &t, world - 1.0)?;
    // Several tensors in one call.
    let a = full(device, &[5], 1.0, Kind::Float)?;
    let b = full(device, &[2, 2], 2.0, Kind::Float)?;
    pg.allreduce(&[&a, &b], ReduceOp::Sum)?;
    expect_close("allreduce of two tensors (first)", &a, world)?;
    expect_close("allreduce of two tensors (second)", &b, 2.0 * world)?;
    // Broadcast from the last rank, so it is not trivially rank 0's own data.
    let root = pg.world_size() - 1;
    let t = full(device, &[4096], rank * 10.0 + 3.0, Kind::Float)?;
    pg.broadcast(&[&t], root)?;
    expect_close("broadcast from the last rank", &t, root as f64 * 10.0 + 3.0)?;
    pg.barrier()?;
    events.log(format!("collectives ok on {device} tensors: sum, mean, max, multi-tensor allreduce, broadcast, barrier across {world} ranks"));
    Ok(())
}

/// Times `iters` all-reduces of `numel` float32 values (after two warm-up rounds) and reports
/// each as an `allreduce_seconds` metric; used by the benchmarks to compare with
/// torch.distributed on the same machine.
fn bench_allreduce(
    pg: &ProcessGroup,
    device: Device,
    events: &Emitter,
    numel: i64,
    iters: u64,
) -> Result<()> {
    let t = full(device, &[numel], 1.0, Kind::Float)?;
    for _ in 0..2 {
        pg.allreduce(&[&t], ReduceOp::Sum)?;
    }
    for i in 0..iters {
        let _ = t.shallow_clone().fill_(1.0);
        pg.barrier()?;
        let t0 = std::time::Instant::now();
        pg.allreduce(&[&t], ReduceOp::Sum)?;
        let secs = t0.elapsed().as_secs_f64();
        expect_close(
            "benchmark allreduce",
            &t.narrow(0, 0, 16),
            pg.world_size() as f64,
        )?;
        events.metric(i + 1, 0, trainbook_api::metric::ALLREDUCE_SECONDS, secs);
    }
    Ok(())
}

/// Runs one of the engine's own jobs: [`Work::Check`] or [`Work::BenchAllreduce`]
/// (sized by `TRAINBOOK_BENCH_NUMEL` and `TRAINBOOK_BENCH_ITERS`).
pub(crate) fn run_job(
    kind: Work,
    pg: &ProcessGroup,
    device: Device,
    events: &Emitter,
) -> Result<()> {
    let num = |k: &str, d: u64| {
        std::env::var(k)
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(d)
    };
    match kind {
        Work::Check => check_collectives(pg, device, events),
        Work::BenchAllreduce => bench_allreduce(
            pg,
            device,
            events,
            num("TRAINBOOK_BENCH_NUMEL", 110_000_000) as i64,
            num("TRAINBOOK_BENCH_ITERS", 10),
        ),
        Work::Recipe(_) | Work::Task => bail!("not one of the engine's own jobs"),
    }
}
