//! What follows a failed start: the restart decision, its record, and starting the workers
//! again from the run's newest checkpoint on every node (node 0 publishes the start and waits
//! for the other nodes; the others follow it).

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use trainbook_api::{JobUpdate, Resize, Restart, TrainError};

use super::nodes::{NODE_ALIVE_EVERY, NODE_LOST_AFTER};
use super::recovery::Recovery;
use super::rules::Decision;
use crate::driver::fold::Fold;
use crate::driver::handle::JobState;
use crate::driver::membership;
use crate::driver::processes::{Workers, STOP_GRACE};
use crate::driver::rendezvous::{self, Start};
use crate::shared::checkpoint::{self, TrainerState};
use crate::shared::events::Event;
use crate::worker::dist::Store;

impl Recovery {
    /// After a failure: starts the workers again from the run’s newest checkpoint when the
    /// job may restart (and returns true), or adds to the job’s error why it does not. After
    /// node 0 stopped the workers for an elastic job to grow, starts them on more nodes.
    pub(in crate::driver) fn restart(&mut self, fold: &mut Fold, workers: &mut Workers) -> bool {
        if fold.joined {
            return self.follow(fold, workers);
        }
        if let Some(nodes) = self.growth.take_ready() {
            return self.grow(fold, workers, nodes);
        }
        if fold.job.lock().failure.is_none() {
            return false;
        }
        let Some((signature, mut reason)) = self.failures.take_cause() else {
            return false;
        };
        let rank = signature.rank;
        let reported_step = self.failures.error_step(rank);
        match self.policy.decide(signature) {
            Decision::GiveUp(why) => {
                self.explain_give_up(fold, &why);
                false
            }
            Decision::Restart => {
                self.drain(fold);
                let job = fold.job;
                let (checkpoint, resumed_step) = resume_point(job);
                let reached = self
                    .hangs
                    .max_step()
                    .max(job.lock().progress.as_ref().map_or(0, |p| p.step));
                let nodes = self.nodes_after_failure(fold);
                // A node found gone is the cause, not the peers that failed because it did.
                let before = job.lock().membership.clone();
                let lost: Vec<usize> = before
                    .nodes()
                    .iter()
                    .copied()
                    .filter(|n| !nodes.is_empty() && !nodes.contains(n))
                    .collect();
                if !lost.is_empty() {
                    reason = format!("node {} lost", membership::list(&lost));
                }
                self.attempt += 1;
                let restart = Restart {
                    number: self.policy.used(),
                    allowed: self.policy.allowed(),
                    time: fold.elapsed(),
                    reason: reason.clone(),
                    rank: Some(rank),
                    failed_at_step: reported_step.or(Some(reached)),
                    checkpoint: checkpoint.clone(),
                    resumed_step,
                    steps_lost: reported_step
                        .unwrap_or(reached)
                        .saturating_sub(resumed_step),
                };
                self.forget_start(fold, resumed_step);
                fold.trackers.restart(resumed_step, &restart);
                job.lock().restarts.push(restart.clone());
                fold.job.publish(JobUpdate::Restart(restart));
                let next = Start {
                    attempt: self.attempt,
                    resume: checkpoint,
                    members: nodes,
                };
                self.begin(fold, workers, next, &reason, resumed_step)
            }
        }
    }

    /// Node 0 of an elastic job, after a failure: the nodes the next start runs on, from
    /// those still heard from; empty (every node) for a job of fixed size. Fewer than the job
    /// needs: the nodes of the start that failed, so that it waits for the lost ones to come
    /// back as a job of fixed size does.
    fn nodes_after_failure(&mut self, fold: &mut Fold) -> Vec<usize> {
        let job = fold.job;
        if !job.spec.is_elastic() {
            return Vec::new();
        }
        let alive = self.alive_nodes(fold);
        membership::choose(&alive, &job.node_counts)
            .unwrap_or_else(|| job.lock().membership.nodes().to_vec())
    }

    /// Node 0 and the nodes heard from since now: waits until every node heard before has
    /// either spoken again (they say so every [`NODE_ALIVE_EVERY`]) or been silent for
    /// [`NODE_LOST_AFTER`].
    fn alive_nodes(&mut self, fold: &mut Fold) -> Vec<usize> {
        let since = Instant::now();
        let deadline = since + NODE_LOST_AFTER + NODE_ALIVE_EVERY;
        while self.nodes.undecided(since, Instant::now()) && Instant::now() < deadline {
            self.receive(fold, Duration::from_millis(50));
        }
        self.nodes.alive_since(since)
    }

    /// Takes in whatever the stopped workers still had in flight: it belongs to this start.
    fn drain(&mut self, fold: &mut Fold) {
        let deadline = Instant::now() + Duration::from_millis(200);
        while let Ok(m) = self
            .rx
            .recv_timeout(deadline.saturating_duration_since(Instant::now()))
        {
            self.take_in(fold, m);
        }
    }

    /// Node 0 of an elastic job, its workers stopped at a checkpoint: starts them again on
    /// `nodes`, which include nodes that joined since the last start.
    fn grow(&mut self, fold: &mut Fold, workers: &mut Workers, nodes: Vec<usize>) -> bool {
        self.drain(fold);
        let job = fold.job;
        let (checkpoint, resumed_step) = resume_point(job);
        let before = job.lock().membership.clone();
        let joined: Vec<usize> = nodes
            .iter()
            .copied()
            .filter(|n| !before.contains(*n))
            .collect();
        self.attempt += 1;
        self.forget_start(fold, resumed_step);
        let next = Start {
            attempt: self.attempt,
            resume: checkpoint,
            members: nodes,
        };
        let reason = format!("node {} joined", membership::list(&joined));
        self.begin(fold, workers, next, &reason, resumed_step)
    }

    /// Node 0: publishes `next` (several nodes), records a change of the job’s size, starts
    /// this node’s workers for it and waits for the other nodes of the start to start theirs.
    fn begin(
        &mut self,
        fold: &mut Fold,
        workers: &mut Workers,
        next: Start,
        why: &str,
        resumed_step: u64,
    ) -> bool {
        let job = fold.job;
        let after = next.membership(&job.spec);
        let before = std::mem::replace(&mut job.lock().membership, after.clone());
        if before != after {
            let resize = Resize {
                time: fold.elapsed(),
                from_workers: before.world(),
                to_workers: after.world(),
                nodes: after.nodes().to_vec(),
                reason: why.to_string(),
                checkpoint: next.resume.clone(),
                resumed_step,
            };
            job.lock().resizes.push(resize.clone());
            job.publish(JobUpdate::Resize(resize));
        }
        let several = job.spec.nodes > 1;
        let started = (if several {
            rendezvous::publish_start(&self.spawner.store, &next)
        } else {
            Ok(())
        })
        .and_then(|_| self.spawner.spawn(&next));
        match started {
            Ok(w) => {
                *workers = w;
                job.lock().pids = workers.pids();
                if several {
                    rendezvous::mark_started(&self.spawner.store, next.attempt, 0).ok();
                    return self.await_nodes(fold, workers);
                }
                true
            }
            Err(e) => {
                let failure = fold.failure_of(0, format!("could not be started again: {e:#}"));
                job.lock().fail_once(failure);
                false
            }
        }
    }

    /// Node 0 of several nodes, after a restart: waits until every other node of the start
    /// has started its workers for it (a lost node’s driver must be run again). A node that
    /// does not come back within the collective timeout fails the job, named.
    fn await_nodes(&mut self, fold: &mut Fold, workers: &mut Workers) -> bool {
        let timeout = Duration::from_secs(fold.job.spec.collective_timeout_secs);
        // Before the workers’ own rendezvous times out, so that the error names the node.
        let deadline = Instant::now() + timeout.saturating_sub(Duration::from_secs(2));
        let nodes = fold.job.lock().membership.nodes().to_vec();
        let missing = |store: &Store, attempt| {
            nodes
                .iter()
                .copied()
                .filter(|&k| k != 0)
                .find(|&k| !rendezvous::has_started(store, attempt, k))
        };
        while let Some(node) = missing(&self.spawner.store, self.attempt) {
            // A node that cannot start (it said why) fails this start like a dead worker.
            if fold.job.stop_requested.load(Ordering::Relaxed) || self.failures.has_remote() {
                return true;
            }
            if Instant::now() >= deadline {
                workers.stop(STOP_GRACE);
                fold.job.lock().fail_once(TrainError::NodeLost {
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

    /// Nodes 1..N once their workers have ended: when node 0 starts the job again (it
    /// published a newer start, or does within the collective timeout), start the workers
    /// for it. A start of an elastic job that runs without this node leaves it waiting for
    /// one that takes it, as long as the job runs.
    fn follow(&mut self, fold: &mut Fold, workers: &mut Workers) -> bool {
        let spec = &fold.job.spec;
        if spec.max_failures == 0 && !spec.is_elastic() {
            return false;
        }
        let node = spec.node_rank;
        let next = loop {
            let next = match self.following.pending.take() {
                Some(s) => s,
                None if fold.job.lock().failure.is_none() && !self.following.waiting => {
                    return false
                }
                None => match self.next_start(fold) {
                    Some(s) => s,
                    None => return false,
                },
            };
            self.attempt = next.attempt;
            let members = next.membership(&fold.job.spec);
            if members.contains(node) {
                fold.job.lock().membership = members;
                self.following.waiting = false;
                break next;
            }
            // Not needed at this size: a failure of the start before is not this node's.
            fold.job.lock().failure = None;
            self.following.waiting = true;
            eprintln!(
                "trainbook: node {node} waits: the job goes on with nodes {}, and takes this node again at a checkpoint",
                membership::list(members.nodes())
            );
        };
        self.forget_start(fold, 0);
        if let Some(dir) = next.resume.as_deref().filter(|d| !d.exists()) {
            self.cannot_follow(fold, &next, dir);
            return false;
        }
        match self.spawner.spawn(&next) {
            Ok(w) => {
                *workers = w;
                fold.job.lock().pids = workers.pids();
                rendezvous::mark_started(&self.spawner.store, next.attempt, node).ok();
                true
            }
            Err(e) => {
                let rank = first_own_rank(fold);
                let failure = fold.failure_of(
                    rank,
                    format!("could not be started again for node 0's restart: {e:#}"),
                );
                fold.job.lock().fail_once(failure);
                false
            }
        }
    }

    /// Nodes 1..N: waits for a start newer than this node’s, while node 0 answers: up to the
    /// collective timeout, or for as long as the job runs while this node waits to be taken.
    fn next_start(&mut self, fold: &mut Fold) -> Option<Start> {
        let timeout = Duration::from_secs(fold.job.spec.collective_timeout_secs);
        let deadline = Instant::now() + timeout;
        loop {
            match rendezvous::current_start(&self.spawner.store) {
                Ok(Some(s)) if s.attempt > self.attempt => return Some(s),
                Err(_) => return None,
                _ if rendezvous::ended(&self.spawner.store) => return None,
                _ => {}
            }
            if (!self.following.waiting && Instant::now() >= deadline)
                || fold.job.stop_requested.load(Ordering::Relaxed)
            {
                return None;
            }
            self.receive(fold, Duration::from_millis(100));
            self.say_alive(fold);
        }
    }

    /// Nodes 1..N: the checkpoint of node 0’s start is not on this node. Says why, here and to
    /// node 0 (which waits for this node’s start).
    fn cannot_follow(&mut self, fold: &mut Fold, next: &Start, dir: &std::path::Path) {
        let node = fold.job.spec.node_rank;
        let rank = first_own_rank(fold);
        let message = format!(
            "node {node} cannot follow node 0's restart: its checkpoint {} is not on this node. Put the runs root on storage every node mounts at the same path (--runs-root or TRAINBOOK_RUNS)",
            dir.display()
        );
        if let Some(fwd) = &fold.forward {
            fwd.send(Event::Error {
                rank,
                message: message.clone(),
                step: None,
            });
            fwd.send(Event::Exited {
                attempt: next.attempt,
                rank,
                node,
                code: Some(1),
                signal: None,
            });
            fwd.flush(Duration::from_secs(2));
        }
        let failure = fold.failure_of(rank, message);
        fold.job.lock().fail_once(failure);
    }

    /// A new start of the workers: its failure, errors, pulses and progress start empty, and
    /// the metric rows of the steps it will redo are dropped (the replayed rows replace them).
    pub(super) fn forget_start(&mut self, fold: &Fold, resumed_step: u64) {
        self.hangs.reset();
        self.failures.forget();
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

/// Nodes 1..N: the first global rank of this node's workers in the current start.
fn first_own_rank(fold: &Fold) -> usize {
    let node = fold.job.spec.node_rank;
    fold.job
        .lock()
        .membership
        .ranks(node)
        .map_or(0, |r| r.start)
}

/// Where a new start continues: the run’s newest checkpoint and its step, else where the job
/// itself started (its `resume_from`, or step 0).
fn resume_point(job: &JobState) -> (Option<std::path::PathBuf>, u64) {
    match checkpoint::latest(&job.run_dir) {
        Some((dir, state)) => (Some(dir), state.step),
        None => (
            None,
            job.spec
                .train
                .resume_from
                .as_deref()
                .and_then(|d| TrainerState::read(d).ok())
                .map_or(0, |s| s.step),
        ),
    }
}
