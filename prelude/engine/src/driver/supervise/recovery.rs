//! Recovery: watching a start of the job's workers and what follows its failure. The first
//! failure (a death, an error, a hang, a lost node) stops the other workers and becomes the
//! job's error, naming the rank, its last lines and its log; when the [`Policy`] allows, the
//! workers start again from the run's newest checkpoint, on every node (node 0 publishes the
//! start, the others follow it: `restart.rs`). Everything the workers say meanwhile goes
//! through the [`Fold`]; what it signals back is kept in the parts: [`Failures`] (what failed),
//! [`Hangs`] (every rank's pulse), [`NodeWatch`] (other nodes' drivers), [`Growth`] (an elastic
//! job's larger start).

use std::sync::atomic::Ordering;
use std::sync::mpsc;
use std::time::{Duration, Instant};

use trainbook_api::Stream;
use trainbook_api::TrainError;

use super::failures::Failures;
use super::growth::Growth;
use super::nodes::{NodeWatch, NODE_LOST_AFTER};
use super::rules::{self, Hangs, Hung, Policy, Signature};
use crate::driver::fold::{how_it_failed, Fold, Signal};
use crate::driver::handle::JobState;
use crate::driver::incoming::Incoming;
use crate::driver::processes::{Exit, Workers, STOP_GRACE};
use crate::driver::rendezvous::{self, Start};
use crate::driver::spawner::Spawner;
use crate::shared::events::Event;

/// How long node 0 waits for another node's report of the worker whose death failed its own.
const REMOTE_REPORT_WAIT: Duration = Duration::from_millis(2500);
/// How often the watch loop checks pulses and exits while events keep coming.
const CHECK_EVERY: Duration = Duration::from_millis(10);
/// How long node 0 waits, once its own workers are done, for other nodes' `done` events.
const REMOTE_DONE_WAIT: Duration = Duration::from_secs(10);

/// The state of a job's supervision across its starts.
pub(in crate::driver) struct Recovery {
    /// The event loop's mailbox: what the workers and other nodes say.
    pub(super) rx: mpsc::Receiver<Incoming>,
    /// How to start this node's workers again.
    pub(super) spawner: Spawner,
    /// Which start of the workers is running (0: the first).
    pub(super) attempt: u32,
    /// What failed this start.
    pub(super) failures: Failures,
    /// Every rank's pulse, for hang detection.
    pub(super) hangs: Hangs,
    /// The restart budget.
    pub(super) policy: Policy,
    /// When each other node's driver was last heard.
    pub(super) nodes: NodeWatch,
    /// Node 0 of an elastic job: a larger start to make.
    pub(super) growth: Growth,
    /// Other nodes: following node 0's starts.
    pub(super) following: Following,
}

/// Another node's place in node 0's starts.
#[derive(Default)]
pub(super) struct Following {
    /// A newer start node 0 published while this node's workers ran.
    pub(super) pending: Option<Start>,
    /// An elastic job's current start runs without this node, which waits for one that
    /// takes it.
    pub(super) waiting: bool,
}

impl Recovery {
    /// The supervision of `job`, whose workers run their `attempt`-th start, hearing them
    /// through `rx` and starting them again with `spawner`.
    pub(in crate::driver) fn new(
        job: &JobState,
        attempt: u32,
        rx: mpsc::Receiver<Incoming>,
        spawner: Spawner,
    ) -> Self {
        let world = job.spec.world_size();
        Recovery {
            rx,
            spawner,
            attempt,
            failures: Failures::new(world),
            hangs: Hangs::new(world, job.spec.hang_timeout_secs),
            policy: Policy::new(job.spec.max_failures),
            nodes: NodeWatch::new(job.spec.nodes),
            growth: Growth::new(),
            following: Following::default(),
        }
    }

    /// Node 0 of several nodes, once the job has ended: nodes waiting for a restart give up.
    pub(in crate::driver) fn publish_end(&self) {
        rendezvous::publish_end(&self.spawner.store);
    }

    /// Folds one arrival into the job and keeps what it signals.
    pub(super) fn take_in(&mut self, fold: &mut Fold, m: Incoming) {
        if let Some(s) = fold.incoming(m) {
            self.note(fold, s);
        }
    }

    /// What an event means for supervision.
    pub(super) fn note(&mut self, fold: &mut Fold, signal: Signal) {
        match signal {
            Signal::Error { rank, step } => self.failures.error(rank, step),
            Signal::Done { rank } => self.hangs.finished(rank, Instant::now()),
            Signal::NodeAlive { node } => self.nodes.heard(node, Instant::now()),
            Signal::Heartbeat {
                rank,
                step,
                work,
                busy,
            } => self.hangs.beat(rank, step, work, busy, Instant::now()),
            // A report about an earlier start is old news.
            Signal::Exited { attempt, .. } if attempt != self.attempt => {}
            Signal::Exited { node, exit, .. } => {
                fold.line(
                    exit.rank,
                    Stream::Stderr,
                    format!("worker on node {node}: {}", exit.describe()),
                );
                self.failures.remote(exit);
            }
        }
    }

    /// Another node's driver says it is alive, about once a second.
    pub(super) fn say_alive(&mut self, fold: &Fold) {
        let node = fold.job.spec.node_rank;
        if let Some(fwd) = &fold.forward {
            if self.nodes.alive_due(node, Instant::now()) {
                fwd.send(Event::NodeAlive { node });
            }
        }
    }

    /// Takes in what arrives within `wait`, then whatever else is already queued.
    pub(super) fn receive(&mut self, fold: &mut Fold, wait: Duration) {
        fold.trackers.tick();
        if let Ok(m) = self.rx.recv_timeout(wait) {
            self.take_in(fold, m);
            self.take_queued(fold);
        }
    }

    /// Takes in whatever is already queued.
    fn take_queued(&mut self, fold: &mut Fold) {
        while let Ok(m) = self.rx.try_recv() {
            self.take_in(fold, m);
        }
    }

    /// Folds events and watches the workers until all have exited. Returns whether the user
    /// stopped the job.
    pub(in crate::driver) fn watch(&mut self, fold: &mut Fold, workers: &mut Workers) -> bool {
        let mut stopped_by_user = false;
        let mut polled = Instant::now();
        let mut checked = Instant::now() - CHECK_EVERY;
        while !workers.all_exited() {
            self.receive(fold, Duration::from_millis(20));
            fold.flush_dedup(false);
            self.say_alive(fold);
            if self.node0_started_again(fold, &mut polled) {
                workers.stop(STOP_GRACE);
                continue;
            }
            if fold.job.stop_requested.load(Ordering::Relaxed) && !stopped_by_user {
                stopped_by_user = true;
                workers.stop(STOP_GRACE);
                continue;
            }
            // What follows walks every rank (pulses, `done`s, exits): every CHECK_EVERY, not
            // after each batch of events (1,024 ranks send thousands a second).
            if checked.elapsed() < CHECK_EVERY {
                continue;
            }
            checked = Instant::now();
            if !stopped_by_user && self.check_ranks(fold, workers) {
                continue;
            }
            self.take_exits(fold, workers, stopped_by_user);
        }
        stopped_by_user
    }

    /// Another node follows node 0's restarts, even while its own workers still run (hung, or
    /// blocked on a peer that is gone): whether node 0 published a newer start (kept to follow).
    fn node0_started_again(&mut self, fold: &Fold, polled: &mut Instant) -> bool {
        let spec = &fold.job.spec;
        if !fold.joined
            || (spec.max_failures == 0 && !spec.is_elastic())
            || polled.elapsed() < Duration::from_millis(500)
        {
            return false;
        }
        *polled = Instant::now();
        match rendezvous::current_start(&self.spawner.store) {
            Ok(Some(s)) if s.attempt > self.attempt => {
                self.following.pending = Some(s);
                true
            }
            _ => false,
        }
    }

    /// The checks that walk every rank while the workers run: whether to grow (elastic), a
    /// hung rank (whose failure stops the workers), a worker stuck after its `done`. Returns
    /// whether the workers were stopped.
    fn check_ranks(&mut self, fold: &mut Fold, workers: &mut Workers) -> bool {
        if self.growth.due(fold, &self.nodes) {
            workers.stop(STOP_GRACE);
            return true;
        }
        if !fold.joined && fold.job.lock().failure.is_none() {
            if let Some(hung) = self.hangs.hung(Instant::now()) {
                self.hang(fold, hung, workers);
                return true;
            }
        }
        self.kill_stuck_after_done(fold, workers);
        false
    }

    /// The workers that exited (here, or on other nodes as their drivers report): the first
    /// failure among them fails the job.
    fn take_exits(&mut self, fold: &mut Fold, workers: &mut Workers, stopped_by_user: bool) {
        let exits = workers.poll();
        let remote = self.failures.take_remote();
        if stopped_by_user || (exits.is_empty() && remote.is_empty()) {
            return;
        }
        let bad = self.failed(fold, exits, remote);
        // The lock is taken and released here: `fail` folds events, which locks again.
        let first_failure = fold.job.lock().failure.is_none();
        if let (Some(first), true) = (self.failures.root_cause(&bad).cloned(), first_failure) {
            self.fail(fold, first, bad, workers);
        }
    }

    /// Kills the workers that reported `done` (their steps, metrics and checkpoints complete)
    /// but have not exited `hang_timeout` later, and says so in the job's warnings: the run
    /// succeeded, only its teardown hung. Without this a peer gone from an untimed teardown
    /// barrier would keep the job from ending at all.
    fn kill_stuck_after_done(&mut self, fold: &mut Fold, workers: &mut Workers) {
        let limit = self.hangs.timeout_secs();
        let stuck = self.hangs.stuck_after_done(Instant::now());
        for rank in stuck {
            if workers.pid_of(rank).is_some() && workers.kill_rank(rank).is_some() {
                let note = format!(
                    "rank {rank} finished its work but had not exited {limit} s later (stuck in \
                     its teardown; on Gaudi, typically the destructor barrier of the hccl \
                     process group): it was killed. Its metrics and checkpoints were complete."
                );
                fold.line(rank, Stream::Stderr, format!("warning: {note}"));
                fold.job.lock().warnings.push(note);
            }
        }
    }

    /// The exits that count as failures: a crash, or a clean exit without its `done` event
    /// (given the socket a moment). On other nodes the `done` events go to node 0, so a clean
    /// exit is enough there.
    fn failed(&mut self, fold: &mut Fold, exits: Vec<Exit>, mut bad: Vec<Exit>) -> Vec<Exit> {
        let done = |job: &JobState, r: usize| {
            job.lock()
                .summaries
                .get(r)
                .map(|s| s.is_some())
                .unwrap_or(false)
        };
        for e in exits {
            if e.success() && !fold.joined {
                let deadline = Instant::now() + Duration::from_millis(500);
                while !done(fold.job, e.rank) && Instant::now() < deadline {
                    if let Ok(m) = self.rx.recv_timeout(Duration::from_millis(10)) {
                        self.take_in(fold, m);
                    }
                }
                if !done(fold.job, e.rank) {
                    bad.push(e);
                }
            } else if !e.success() {
                bad.push(e);
            }
        }
        bad
    }

    /// The first failure of the job: stop the other workers, collect the last words of the
    /// failing rank and record the report (node 0 of a job of several nodes waits a moment for
    /// the reports of the other nodes, which may name the real cause).
    fn fail(
        &mut self,
        fold: &mut Fold,
        mut first: Exit,
        mut bad: Vec<Exit>,
        workers: &mut Workers,
    ) {
        workers.stop(STOP_GRACE);
        workers.join_readers(Duration::from_millis(300));
        self.take_queued(fold);
        // A worker killed on another node fails the workers of this node at once ("connection
        // closed"); the report of its driver follows within moments, and names the cause.
        // A node whose driver died reports nothing: its silence names it. (When another node
        // already reported, that report is the cause.)
        let local = fold.job.spec.local_ranks();
        let only_local = bad.iter().all(|e| local.contains(&e.rank));
        if fold.job.spec.nodes > 1 && !fold.joined && first.signal.is_none() && only_local {
            // A node is lost only `NODE_LOST_AFTER` after its last `NodeAlive`, which may have
            // come just before it died: wait that long on top, so that a dead node is named.
            let deadline = Instant::now() + REMOTE_REPORT_WAIT + NODE_LOST_AFTER;
            let mut lost = None;
            while !self.failures.has_remote() && Instant::now() < deadline {
                if let Ok(m) = self.rx.recv_timeout(Duration::from_millis(20)) {
                    self.take_in(fold, m);
                }
                lost = self.nodes.lost(Instant::now());
                if lost.is_some() {
                    break;
                }
            }
            if let (Some((node, silent)), false) = (lost, self.failures.has_remote()) {
                let failure = TrainError::NodeLost {
                    node,
                    how: format!(
                        "its driver stopped reporting {:.1} s ago (killed, or its machine or the network is down)",
                        silent.as_secs_f64()
                    ),
                    local: format!("rank {} {}", first.rank, first.describe()),
                };
                fold.job.lock().fail_once(failure);
                let signature = Signature {
                    rank: first.rank,
                    step: None,
                    message: None,
                };
                self.failures
                    .set_cause(signature, format!("node {node} lost"));
                return;
            }
            bad.append(&mut self.failures.take_remote());
            first = self.failures.root_cause(&bad).cloned().unwrap_or(first);
        }
        if let Some(fwd) = &fold.forward {
            fwd.send(Event::Exited {
                attempt: self.attempt,
                rank: first.rank,
                node: fold.job.spec.node_rank,
                code: first.code,
                signal: first.signal,
            });
            fwd.flush(Duration::from_secs(2));
        }
        let failure = fold.failure(&first);
        fold.job.lock().fail_once(failure);
        let message = fold.job.lock().errors.get(first.rank).cloned().flatten();
        let said = message
            .as_deref()
            .and_then(|m| m.lines().next())
            .map(|m| {
                let m: String = m.chars().take(160).collect();
                format!(": {m}")
            })
            .unwrap_or_default();
        let step = self
            .failures
            .error_step(first.rank)
            .or_else(|| self.hangs.step_of(first.rank));
        let how = how_it_failed(&first);
        let signature = Signature {
            rank: first.rank,
            step,
            message,
        };
        self.failures
            .set_cause(signature, format!("rank {} {how}{said}", first.rank));
    }

    /// A rank stopped making progress: save its report (last lines, native stack), stop every
    /// worker and record the hang as the job’s failure.
    fn hang(&mut self, fold: &mut Fold, hung: Hung, workers: &mut Workers) {
        let tail: Vec<String> = fold
            .job
            .lock()
            .tails
            .get(hung.rank)
            .map(|t| t.iter().cloned().collect())
            .unwrap_or_default();
        let run_dir = &fold.job.run_dir;
        let pid = workers.pid_of(hung.rank);
        let pending = "(being taken: eu-stack or gdb attaches to the process)";
        rules::write_report(run_dir, self.attempt, &hung, &tail, pending);
        let stack = match pid {
            Some(pid) => rules::native_stack(pid),
            None => format!(
                "rank {} runs on another node: run gdb -p <pid> there for its stack",
                hung.rank
            ),
        };
        let report = rules::write_report(run_dir, self.attempt, &hung, &tail, &stack);
        workers.stop(STOP_GRACE);
        workers.join_readers(Duration::from_millis(300));
        self.take_queued(fold);
        let how = format!("{}; report: {}", hung.describe(), report.display());
        let failure = fold.failure_of(hung.rank, how);
        fold.job.lock().fail_once(failure);
        let signature = Signature {
            rank: hung.rank,
            step: Some(hung.step),
            message: Some("hung".into()),
        };
        let reason = format!(
            "rank {} hung ({} s without progress)",
            hung.rank,
            hung.still.as_secs()
        );
        self.failures.set_cause(signature, reason);
    }

    /// Every worker is gone: takes in what is still in flight (other nodes’ `done` events
    /// travel further than this node’s).
    pub(in crate::driver) fn settle(&mut self, fold: &mut Fold, workers: &mut Workers) {
        workers.join_readers(Duration::from_secs(1));
        let settle = if fold.job.spec.nodes > 1 && !fold.joined {
            REMOTE_DONE_WAIT
        } else {
            Duration::from_millis(300)
        };
        let deadline = Instant::now() + settle;
        while Instant::now() < deadline && !fold.joined {
            match self.rx.recv_timeout(Duration::from_millis(20)) {
                Ok(m) => self.take_in(fold, m),
                Err(_) => {
                    let st = fold.job.lock();
                    if st.every_rank_done() || st.failure.is_some() {
                        break;
                    }
                }
            }
        }
        if let Some(first) = self.failures.first_remote().cloned() {
            let failure = fold.failure(&first);
            fold.job.lock().fail_once(failure);
        }
        fold.flush_dedup(true);
        if let Some(fwd) = &fold.forward {
            fwd.flush(Duration::from_secs(2));
        }
    }
}
