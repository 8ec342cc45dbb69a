//! A worker's pulse: a thread that tells the driver, about once a second, how many optimizer
//! steps this rank has taken, how much work it has done (steps and evaluation batches), and
//! whether it is inside one long operation (a checkpoint write, planning an epoch's data). The
//! driver's hang detection reads it: a rank whose work stops moving outside such an operation
//! is stuck (deadlocked in a collective, waiting on a dead peer's socket, a hung evaluation),
//! and one that goes silent is stopped or frozen (SIGSTOP, a machine that no longer schedules
//! it).
//!
//! A thread rather than a call from the training loop, because a rank blocked inside a
//! collective cannot call anything: its silence would look the same as a stopped process, and
//! the driver could not tell "blocked at step 240" from "gone".

use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use crate::shared::events::{Emitter, Event};

/// Optimizer steps this process has taken (what its error report and heartbeats say).
static STEP: AtomicU64 = AtomicU64::new(0);
/// Units of work done: optimizer steps and evaluation batches.
static WORK: AtomicU64 = AtomicU64::new(0);
/// Long phases in progress (nested guards).
static BUSY: AtomicU32 = AtomicU32::new(0);

/// How often the pulse beats.
pub(crate) const EVERY: Duration = Duration::from_secs(1);

/// Starts this process's pulse (once; it beats until the process exits): at once, at the
/// first step (so the driver watches a rank from then on, however fast its steps), then
/// every [`EVERY`].
pub(crate) fn start(events: &Emitter, rank: usize) {
    let events = events.clone();
    let _ = std::thread::Builder::new()
        .name("trainbook-heartbeat".into())
        .spawn(move || {
            let beat = || {
                let step = STEP.load(Ordering::Relaxed);
                events.send(Event::Heartbeat {
                    rank,
                    step,
                    work: WORK.load(Ordering::Relaxed),
                    busy: BUSY.load(Ordering::Relaxed) > 0,
                });
                step
            };
            let mut last = Instant::now();
            let mut stepped = beat() > 0;
            loop {
                std::thread::sleep(EVERY / 10);
                let first_step = !stepped && STEP.load(Ordering::Relaxed) > 0;
                if first_step || last.elapsed() >= EVERY {
                    stepped |= beat() > 0;
                    last = Instant::now();
                }
            }
        });
}

/// Records the steps taken so far.
pub(crate) fn set_step(step: u64) {
    STEP.store(step, Ordering::Relaxed);
    tick();
}

/// Records a unit of work that is not a step (an evaluation batch).
pub(crate) fn tick() {
    WORK.fetch_add(1, Ordering::Relaxed);
}

/// The steps taken so far.
pub(crate) fn step() -> u64 {
    STEP.load(Ordering::Relaxed)
}

/// Marks one long operation (a checkpoint write, planning an epoch's data) for as long as it
/// lives: the rank is working although its work count does not move.
pub(crate) struct Busy;

impl Busy {
    pub(crate) fn new() -> Busy {
        BUSY.fetch_add(1, Ordering::Relaxed);
        Busy
    }
}

impl Drop for Busy {
    fn drop(&mut self) {
        BUSY.fetch_sub(1, Ordering::Relaxed);
    }
}
