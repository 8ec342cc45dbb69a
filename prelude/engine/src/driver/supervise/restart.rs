//! What follows a failed start: the restart decision, its record, and starting the workers
//! again from the run's newest checkpoint on every node (node 0 publishes the start and waits
//! for the other nodes; the others follow it).

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use trainbook_api::{JobUpdate, Restart, TrainError};

use super::recovery::Recovery;
use super::rules::Decision;
use crate::driver::fold::Fold;
use crate::driver::processes::{Workers, STOP_GRACE};
use crate::driver::rendezvous::{self, StartInfo};
use crate::shared::checkpoint::{self, TrainerState};
use crate::shared::events::Event;
use crate::worker::dist::Store;

impl Recovery {
    /// After a failure: starts the workers again from the run’s newest checkpoint when the
    /// job may restart (and returns true), or adds to the job’s error why it does not.
    pub(in crate::driver) fn restart(&mut self, fold: &mut Fold, workers: &mut Workers) -> bool {
        if fold.joined {
            return self.follow(fold, workers);
        }
        if fold.job.lock().failure.is_none() {
            return false;
        }
        let Some((signature, reason)) = self.cause.take() else {
            return false;
        };
        let rank = signature.rank;
        let reported_step = self.error_steps.get(rank).copied().flatten();
        match self.policy.decide(signature) {
            Decision::GiveUp(why) => {
                self.explain_give_up(fold, &why);
                false
            }
            Decision::Restart => {
                // Whatever the stopped workers still had in flight belongs to this start.
                let deadline = Instant::now() + Duration::from_millis(200);
                while let Ok(m) = self
                    .rx
                    .recv_timeout(deadline.saturating_duration_since(Instant::now()))
                {
                    self.take_in(fold, m);
                }
                let job = fold.job;
                let (checkpoint, resumed_step) = match checkpoint::latest(&job.run_dir) {
                    Some((dir, state)) => (Some(dir), state.step),
                    // No checkpoint of this run yet: where the job itself started.
                    None => (
                        None,
                        job.spec
                            .train
                            .resume_from
                            .as_deref()
                            .and_then(|d| TrainerState::read(d).ok())
                            .map_or(0, |s| s.step),
                    ),
                };
                let reached = self
                    .hangs
                    .max_step()
                    .max(job.lock().progress.as_ref().map_or(0, |p| p.step));
                self.attempt += 1;
                let restart = Restart {
                    attempt: self.policy.used(),
                    allowed: self.policy.allowed(),
                    time: fold.elapsed(),
                    reason,
                    rank: Some(rank),
                    failed_at_step: reported_step.or(Some(reached)),
                    checkpoint: checkpoint.clone(),
                    resumed_step,
                    steps_lost: reported_step
                        .unwrap_or(reached)
                        .saturating_sub(resumed_step),
                };
                self.forget_attempt(fold, resumed_step);
                fold.trackers.restart(resumed_step, &restart);
                job.lock().restarts.push(restart.clone());
                fold.job.publish(JobUpdate::Restart(restart));
                let several = job.spec.nodes > 1;
                let next = StartInfo {
                    attempt: self.attempt,
                    resume: checkpoint,
                };
                let started = (if several {
                    rendezvous::publish_start(&self.start.store, &next)
                } else {
                    Ok(())
                })
                .and_then(|_| self.start.spawn(next.attempt, next.resume.as_deref()));
                match started {
                    Ok(w) => {
                        *workers = w;
                        job.lock().pids = workers.pids();
                        if several {
                            rendezvous::mark_started(&self.start.store, next.attempt, 0).ok();
                            return self.await_nodes(fold, workers);
                        }
                        true
                    }
                    Err(e) => {
                        let failure = fold.failure_of(
                            0,
                            format!("could not be started again after a failure: {e:#}"),
                        );
                        job.lock().failure = Some(failure);
                        false
                    }
                }
            }
        }
    }

    /// Node 0 of several nodes, after a restart: waits until every other node’s driver has
    /// started its workers for it (a lost node’s driver must be run again). A node that does
    /// not come back within the collective timeout fails the job, named.
    fn await_nodes(&mut self, fold: &mut Fold, workers: &mut Workers) -> bool {
        let timeout = Duration::from_secs(fold.job.spec.collective_timeout_secs);
        // Before the workers’ own rendezvous times out, so that the error names the node.
        let deadline = Instant::now() + timeout.saturating_sub(Duration::from_secs(2));
        let nodes = fold.job.spec.nodes;
        let missing = |store: &Store, attempt| {
            (1..nodes).find(|&k| !rendezvous::has_started(store, attempt, k))
        };
        while let Some(node) = missing(&self.start.store, self.attempt) {
            // A node that cannot start (it said why) fails this start like a dead worker.
            if fold.job.stop_requested.load(Ordering::Relaxed) || !self.remote_exits.is_empty() {
                return true;
            }
            if Instant::now() >= deadline {
                workers.stop(STOP_GRACE);
                fold.job.lock().failure = Some(TrainError::NodeLost {
                    node,
                    how: format!(
                        "it did not rejoin the restarted job within {} s: run its command again (the same --nnodes, --node-rank, --master-addr and --name) and resume the run",
                        timeout.as_secs()
                    ),
                    local: "stopped".into(),
                });
                return false;
            }
            self.receive(fold, Duration::from_millis(100));
            fold.flush_dedup(false);
        }
        true
    }

    /// Nodes 1..N once their workers have ended: when node 0 restarts the job (it published a
    /// newer start, or does within the collective timeout), start the workers for it.
    fn follow(&mut self, fold: &mut Fold, workers: &mut Workers) -> bool {
        if fold.job.spec.max_failures == 0 {
            return false;
        }
        let next = match self.pending.take() {
            Some(s) => s,
            None if fold.job.lock().failure.is_none() => return false,
            None => {
                let timeout = Duration::from_secs(fold.job.spec.collective_timeout_secs);
                let deadline = Instant::now() + timeout;
                loop {
                    match rendezvous::current_start(&self.start.store) {
                        Ok(Some(s)) if s.attempt > self.attempt => break s,
                        Err(_) => return false,
                        _ if rendezvous::ended(&self.start.store) => return false,
                        _ => {}
                    }
                    if Instant::now() >= deadline || fold.job.stop_requested.load(Ordering::Relaxed)
                    {
                        return false;
                    }
                    self.receive(fold, Duration::from_millis(100));
                    self.say_alive(fold);
                }
            }
        };
        self.attempt = next.attempt;
        self.forget_attempt(fold, 0);
        if let Some(dir) = next.resume.as_deref().filter(|d| !d.exists()) {
            let rank = fold.job.spec.local_ranks().start;
            let message = format!(
                "node {} cannot follow node 0's restart: its checkpoint {} is not on this node. Put the runs root on storage every node mounts at the same path (--runs-root or TRAINBOOK_RUNS)",
                fold.job.spec.node_rank,
                dir.display()
            );
            // Node 0 waits for this node’s start: tell it why there is none.
            if let Some(fwd) = &fold.forward {
                fwd.send(Event::Error {
                    rank,
                    message: message.clone(),
                    step: None,
                });
                fwd.send(Event::Exited {
                    attempt: next.attempt,
                    rank,
                    node: fold.job.spec.node_rank,
                    code: Some(1),
                    signal: None,
                });
                fwd.flush(Duration::from_secs(2));
            }
            let failure = fold.failure_of(rank, message);
            fold.job.lock().failure = Some(failure);
            return false;
        }
        match self.start.spawn(next.attempt, next.resume.as_deref()) {
            Ok(w) => {
                *workers = w;
                fold.job.lock().pids = workers.pids();
                let node = fold.job.spec.node_rank;
                rendezvous::mark_started(&self.start.store, next.attempt, node).ok();
                true
            }
            Err(e) => {
                let failure = fold.failure_of(
                    fold.job.spec.local_ranks().start,
                    format!("could not be started again for node 0's restart: {e:#}"),
                );
                fold.job.lock().failure = Some(failure);
                false
            }
        }
    }

    /// A new start of the workers: its failure, errors, pulses and progress start empty, and
    /// the metric rows of the steps it will redo are dropped (the replayed rows replace them).
    pub(super) fn forget_attempt(&mut self, fold: &Fold, resumed_step: u64) {
        self.hangs.reset();
        self.done_at.iter_mut().for_each(|d| *d = None);
        self.error_steps.iter_mut().for_each(|s| *s = None);
        self.error_order.clear();
        self.remote_exits.clear();
        let mut st = fold.job.lock();
        st.failure = None;
        st.errors.iter_mut().for_each(|e| *e = None);
        st.summaries.iter_mut().for_each(|s| *s = None);
        st.progress = None;
        st.metrics.retain(|m| m.step <= resumed_step);
        st.checkpoints.retain(|(_, p)| p.exists());
    }

    /// Adds to the job’s error the restarts it had and why there is no other.
    fn explain_give_up(&self, fold: &Fold, why: &str) {
        let mut st = fold.job.lock();
        let earlier: Vec<String> = st.restarts.iter().map(|r| format!("\n{r}")).collect();
        if let Some(TrainError::WorkerFailed { message, .. }) = st.failure.as_mut() {
            if !earlier.is_empty() {
                message.push_str(&format!("\nearlier failures:{}", earlier.concat()));
            }
            if !why.is_empty() {
                message.push_str(&format!("\n{why}"));
            }
        }
    }
}
