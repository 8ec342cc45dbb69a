//! The driver’s event loop: on the driver thread, the [`Fold`] turns everything the workers
//! say (events, raw output) into the job’s state, in arrival order, and the [`Recovery`]
//! watches the worker processes, turning the first failure into the job’s error or, when the
//! job may restart, starting the workers again from the run’s newest checkpoint.

use std::sync::mpsc;

use super::fold::Fold;
use super::handle::JobState;
use super::incoming::Incoming;
use super::processes::Workers;
use super::spawner::Spawner;
use super::supervise::Recovery;
use crate::shared::events::{Collector, Emitter};

/// Runs a job’s event loop on the driver thread until every worker is gone (restarting them
/// after a failure while the job may), then records how the job ended and publishes it.
pub(super) fn drive(
    job: &JobState,
    mut workers: Workers,
    rx: mpsc::Receiver<Incoming>,
    collector: Option<Collector>,
    forward: Option<Emitter>,
    spawner: Spawner,
    attempt: u32,
) {
    let mut fold = Fold::new(job, forward);
    let mut recovery = Recovery::new(job, attempt, rx, spawner);
    let stopped_by_user = loop {
        let stopped = recovery.watch(&mut fold, &mut workers);
        if stopped || !recovery.restart(&mut fold, &mut workers) {
            break stopped;
        }
    };
    recovery.settle(&mut fold, &mut workers);
    let dropped = collector.as_ref().map_or(0, |c| c.dropped());
    drop(collector);
    if job.spec.nodes > 1 && !fold.joined {
        // Nodes waiting for a restart give up.
        recovery.publish_end();
    }
    drop(recovery);
    fold.finish(dropped, stopped_by_user);
}
