//! A simulated trainbook worker, for `bench/driver_load.sh`: started by a real driver in place
//! of `trainbook-worker` (`TRAINBOOK_WORKER`), it sends what a training rank sends over the
//! workers' real event protocol (ZeroMQ PUSH to the driver's collector, `[token, json]`) and
//! nothing else: no libtorch, no collectives, so a thousand ranks fit on one small machine and
//! the load on the driver is the events alone.
//!
//! Per step, like `trainbook-worker`: a log line `train epoch:[0]\tloss:…` and a `loss` metric
//! (every rank), rank 0's progress; a heartbeat every second; at step 10 a warning that every
//! rank prints alike (what the de-duplicator folds); a summary at the end. The `loss` metric's
//! value carries the moment it was sent in its fraction, so the benchmark can measure how long
//! an event takes to reach the driver's subscribers: `loss = step + sent_ms / 1e6`, where
//! `sent_ms` is the millisecond of the send within its 1000-second window.
//!
//! The ranks wait for each other before the first step (a barrier of files in the run
//! directory, standing in for c10d's rendezvous). Steps and their length: `TRAINBOOK_SIM_STEPS` (default 120) and `TRAINBOOK_SIM_STEP_MS`
//! (default 250); the job's own settings are not read.

use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::{anyhow, Context, Result};
use bytes::Bytes;
use serde_json::{json, Value};
use zeromq::{Socket, SocketSend, ZmqMessage};

fn var(name: &str) -> Result<String> {
    std::env::var(name).with_context(|| format!("{name} is not set: start this program as a trainbook driver's worker (TRAINBOOK_WORKER)"))
}

fn number(name: &str, default: u64) -> Result<u64> {
    match std::env::var(name) {
        Ok(v) => v
            .parse()
            .with_context(|| format!("{name}={v} is not a whole number")),
        Err(_) => Ok(default),
    }
}

fn unix_time() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs_f64())
        .unwrap_or(0.0)
}

/// The send time folded into a metric value (see the module docs).
fn stamp(step: u64) -> f64 {
    let ms = (unix_time() * 1000.0) as u64 % 1_000_000;
    step as f64 + ms as f64 / 1e6
}

struct Events {
    socket: zeromq::PushSocket,
    token: Bytes,
}

impl Events {
    async fn send(&mut self, event: Value) -> Result<()> {
        let frames = vec![self.token.clone(), Bytes::from(serde_json::to_vec(&event)?)];
        let msg = ZmqMessage::try_from(frames).map_err(|e| anyhow!("{e}"))?;
        self.socket
            .send(msg)
            .await
            .map_err(|e| anyhow!("sending to the driver: {e}"))
    }
}

/// Waits until every rank has started, as real workers do in c10d's rendezvous (else the
/// first ranks would train while the driver is still starting the last ones). Through files in
/// the run directory: each rank leaves one; rank 0 counts them and leaves `go`.
async fn barrier(rank: u64, world: u64) -> Result<()> {
    let dir = std::path::PathBuf::from(var("TRAINBOOK_RUN_DIR")?).join("sim-barrier");
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    std::fs::write(dir.join(rank.to_string()), b"")?;
    let go = dir.join("go");
    loop {
        if rank == 0 {
            let here = std::fs::read_dir(&dir)?.count() as u64;
            if here >= world {
                std::fs::write(&go, b"")?;
                return Ok(());
            }
        } else if go.exists() {
            return Ok(());
        }
        // Rarely: a thousand waiting ranks must not take the cores the driver starts them with.
        tokio::time::sleep(Duration::from_millis(if rank == 0 { 100 } else { 500 })).await;
    }
}

/// This process's peak resident memory (VmHWM), in bytes.
fn peak_rss() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            let line = s.lines().find(|l| l.starts_with("VmHWM:"))?;
            line.split_whitespace().nth(1)?.parse::<u64>().ok()
        })
        .map_or(0, |kb| kb * 1024)
}

async fn run() -> Result<()> {
    let endpoint = var("TRAINBOOK_EVENTS")?;
    let token = Bytes::from(var("TRAINBOOK_TOKEN")?.into_bytes());
    let rank: u64 = var("RANK")?.parse().context("RANK is not a number")?;
    let world: u64 = var("WORLD_SIZE")?
        .parse()
        .context("WORLD_SIZE is not a number")?;
    let steps = number("TRAINBOOK_SIM_STEPS", 120)?;
    let step_time = Duration::from_millis(number("TRAINBOOK_SIM_STEP_MS", 250)?);

    let mut socket = zeromq::PushSocket::new();
    tokio::time::timeout(Duration::from_secs(30), socket.connect(&endpoint))
        .await
        .map_err(|_| anyhow!("connecting to the driver at {endpoint}: timed out"))?
        .map_err(|e| anyhow!("connecting to the driver at {endpoint}: {e}"))?;
    let mut ev = Events { socket, token };

    barrier(rank, world).await?;
    let start = Instant::now();
    let mut last_pulse = Instant::now() - Duration::from_secs(1);
    for step in 1..=steps {
        // Steps end on the same clock on every rank, as they do after an all-reduce.
        let due = start + step_time * step as u32;
        tokio::time::sleep_until(due.into()).await;
        let loss = 2.0 / (1.0 + step as f64 / 10.0) + rank as f64 * 1e-4;
        ev.send(json!({"type": "log", "rank": rank, "stream": "stdout",
                       "text": format!("train epoch:[0]\tloss:{loss:.6}")}))
            .await?;
        ev.send(
            json!({"type": "metric", "rank": rank, "step": step, "epoch": 0,
                       "name": "loss", "value": stamp(step), "time": unix_time()}),
        )
        .await?;
        if rank == 0 {
            ev.send(
                json!({"type": "progress", "rank": 0, "step": step, "total_steps": steps,
                           "epoch": 0, "epochs": 1, "samples": step * 8,
                           "samples_per_second": 8.0 / step_time.as_secs_f64()}),
            )
            .await?;
        }
        if step == 10 {
            ev.send(json!({"type": "log", "rank": rank, "stream": "stderr",
                           "text": "UserWarning: the data loader fell behind; raise prefetch"}))
                .await?;
        }
        if last_pulse.elapsed() >= Duration::from_secs(1) {
            last_pulse = Instant::now();
            ev.send(
                json!({"type": "heartbeat", "rank": rank, "step": step, "work": step,
                           "busy": false}),
            )
            .await?;
        }
    }
    let secs = start.elapsed().as_secs_f64();
    ev.send(json!({"type": "done", "rank": rank, "summary": {
        "steps": steps, "epochs": 1, "samples": steps * 8, "train_seconds": secs,
        "final_train_loss": 0.5, "param_sum": 1.0, "param_l2": 1.0, "device": "cpu",
        "metrics": {}, "memory": {"rank": rank, "parameters": 4 << 20, "gradients": 4 << 20,
        "optimizer_state": 8 << 20, "buffers": 1 << 20, "peak": peak_rss(), "peak_of": "rss"}}}))
        .await?;
    // Let zeromq's writer hand the last messages to the socket before the process ends.
    tokio::time::sleep(Duration::from_millis(200)).await;
    Ok(())
}

fn main() {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a tokio runtime");
    if let Err(e) = rt.block_on(run()) {
        eprintln!("trainbook-simworker: {e:#}");
        std::process::exit(1);
    }
}
