//! Recovery: watching a start of the job's workers and what follows its failure. The first
//! failure (a death, an error, a hang, a lost node) stops the other workers and becomes the
//! job's error, naming the rank, its last lines and its log; when the [`Policy`] allows, the
//! workers start again from the run's newest checkpoint, on every node (node 0 publishes the
//! start, the others follow it). Everything the workers say meanwhile goes through the
//! [`Fold`]; what it signals back (errors, heartbeats, `done`s, other nodes) is kept here.

use std::sync::atomic::Ordering;
use std::sync::mpsc;
use std::time::{Duration, Instant};

use trainbook_api::Stream;
use trainbook_api::TrainError;

use super::elastic::Growth;
use super::rules::{self, Hangs, Hung, Policy, Signature};
use crate::driver::fold::{how_it_failed, Fold, Signal};
use crate::driver::handle::JobState;
use crate::driver::incoming::Incoming;
use crate::driver::membership::Membership;
use crate::driver::processes::{Exit, WorkerCommand, Workers, STOP_GRACE};
use crate::driver::rendezvous::{self, StartInfo};
use crate::shared::env;
use crate::shared::events::Event;
use crate::worker::dist::Store;

/// How long node 0 waits for another node’s report of the worker whose death failed its own.
const REMOTE_REPORT_WAIT: Duration = Duration::from_millis(2500);
/// How often another node’s driver says it is alive, and the silence that means it is lost.
pub(super) const NODE_ALIVE_EVERY: Duration = Duration::from_secs(1);
pub(super) const NODE_LOST_AFTER: Duration = Duration::from_millis(2000);
/// How often the watch loop checks pulses and exits while events keep coming.
const CHECK_EVERY: Duration = Duration::from_millis(10);
/// How long node 0 waits, once its own workers are done, for other nodes’ `done` events.
const REMOTE_DONE_WAIT: Duration = Duration::from_secs(10);

/// How to start this node’s workers again: their commands, where their output goes, and the
/// rendezvous store through which the nodes of a job agree on each start.
pub(in crate::driver) struct Start {
    pub(in crate::driver) cmds: Vec<WorkerCommand>,
    pub(in crate::driver) tx: mpsc::Sender<Incoming>,
    pub(in crate::driver) store: Store,
    /// This node (`--node-rank`), the job's most nodes and the workers each runs.
    node: usize,
    nodes: usize,
    workers: usize,
}

impl Start {
    pub(in crate::driver) fn new(
        cmds: Vec<WorkerCommand>,
        tx: mpsc::Sender<Incoming>,
        store: Store,
        spec: &trainbook_api::JobSpec,
    ) -> Start {
        Start {
            cmds,
            tx,
            store,
            node: spec.node_rank,
            nodes: spec.nodes,
            workers: spec.workers,
        }
    }

    /// Starts the workers for `start`: its attempt (0: the first), the checkpoint it resumes
    /// from, and the ranks this node's workers have among its nodes.
    pub(in crate::driver) fn spawn(&self, start: &StartInfo) -> anyhow::Result<Workers> {
        let members = Membership::new(&start.members, self.nodes, self.workers);
        let (Some(ranks), Some(place)) = (members.ranks(self.node), members.place(self.node))
        else {
            anyhow::bail!(
                "node {} is not one of the nodes of start {} ({})",
                self.node,
                start.attempt,
                crate::driver::membership::list(members.nodes())
            );
        };
        let mut cmds = self.cmds.clone();
        for (c, rank) in cmds.iter_mut().zip(ranks) {
            c.rank = rank;
            c.env.extend([
                ("RANK".into(), rank.to_string()),
                ("WORLD_SIZE".into(), members.world().to_string()),
                ("GROUP_RANK".into(), place.to_string()),
                ("NODE_RANK".into(), place.to_string()),
                (env::ATTEMPT.into(), start.attempt.to_string()),
            ]);
            if let Some(r) = &start.resume {
                c.env.push((env::RESUME.into(), r.display().to_string()));
            }
        }
        let tx = self.tx.clone();
        Workers::spawn(cmds, move |r| tx.send(Incoming::Raw(r)).is_ok())
    }
}

/// The state of a job's supervision across its starts.
pub(in crate::driver) struct Recovery {
    /// The event loop's mailbox: what the workers and other nodes say.
    pub(super) rx: mpsc::Receiver<Incoming>,
    /// How to start this node's workers again.
    pub(super) start: Start,
    /// Failed workers of other nodes, as their drivers reported them (node 0).
    pub(super) remote_exits: Vec<Exit>,
    /// Every rank’s pulse, for hang detection.
    pub(super) hangs: Hangs,
    /// When each rank reported `done`: a worker that has not exited `hang_timeout` later is
    /// stuck in its teardown (on Gaudi, the hccl process group’s untimed destructor barrier).
    pub(super) done_at: Vec<Option<Instant>>,
    /// The steps each rank had taken when it reported an error.
    pub(super) error_steps: Vec<Option<u64>>,
    /// The ranks that reported an error this start, in the order their reports arrived: the
    /// first is the likely cause when several fail (its peers fail because it did).
    pub(super) error_order: Vec<usize>,
    /// The restart budget.
    pub(super) policy: Policy,
    /// Which start of the workers is running (0: the first).
    pub(super) attempt: u32,
    /// What failed this start, for the restart decision and its record.
    pub(super) cause: Option<(Signature, String)>,
    /// When each other node’s driver was last heard (node 0), or last said it was alive
    /// (other nodes: their own entry).
    pub(super) nodes_heard: Vec<Option<Instant>>,
    /// Other nodes: a newer start node 0 published while this node’s workers ran.
    pub(super) pending: Option<StartInfo>,
    /// Other nodes of an elastic job: the current start runs without this node, which waits
    /// for one that takes it.
    pub(super) waiting: bool,
    /// Node 0 of an elastic job: a larger start waiting for the next checkpoint, when it
    /// was last looked for, and the nodes of one to make now (the workers were stopped).
    pub(super) growth: Option<Growth>,
    pub(super) grow_checked: Instant,
    pub(super) growing: Option<Vec<usize>>,
}

impl Recovery {
    /// The supervision of `job`, whose workers run their `attempt`-th start, hearing them
    /// through `rx` and starting them again with `start`.
    pub(in crate::driver) fn new(
        job: &JobState,
        attempt: u32,
        rx: mpsc::Receiver<Incoming>,
        start: Start,
    ) -> Self {
        let world = job.spec.world_size();
        Recovery {
            rx,
            start,
            remote_exits: Vec::new(),
            hangs: Hangs::new(world, job.spec.hang_timeout_secs),
            done_at: vec![None; world],
            error_steps: vec![None; world],
            error_order: Vec::new(),
            policy: Policy::new(job.spec.max_failures),
            attempt,
            cause: None,
            nodes_heard: vec![None; job.spec.nodes],
            pending: None,
            waiting: false,
            growth: None,
            grow_checked: Instant::now(),
            growing: None,
        }
    }

    /// Node 0 of several nodes, once the job has ended: nodes waiting for a restart give up.
    pub(in crate::driver) fn publish_end(&self) {
        rendezvous::publish_end(&self.start.store);
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
            Signal::Error { rank, step } => {
                if let Some(slot) = self.error_steps.get_mut(rank) {
                    *slot = step;
                }
                if !self.error_order.contains(&rank) {
                    self.error_order.push(rank);
                }
            }
            Signal::Done { rank } => {
                if let Some(at) = self.done_at.get_mut(rank) {
                    at.get_or_insert_with(Instant::now);
                }
                self.hangs.finished(rank);
            }
            Signal::NodeAlive { node } => {
                if let Some(h) = self.nodes_heard.get_mut(node) {
                    *h = Some(Instant::now());
                }
            }
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
                self.remote_exits.push(exit);
            }
        }
    }

    /// Another node’s driver says it is alive, about once a second.
    pub(super) fn say_alive(&mut self, fold: &Fold) {
        let node = fold.job.spec.node_rank;
        let (Some(fwd), Some(last)) = (&fold.forward, self.nodes_heard.get_mut(node)) else {
            return;
        };
        if last.is_none_or(|t| t.elapsed() >= NODE_ALIVE_EVERY) {
            fwd.send(Event::NodeAlive { node });
            *last = Some(Instant::now());
        }
    }

    /// A node (other than 0) whose driver has been heard before but not for
    /// [`NODE_LOST_AFTER`], with how long.
    fn lost_node(&self) -> Option<(usize, Duration)> {
        self.nodes_heard
            .iter()
            .enumerate()
            .skip(1)
            .filter_map(|(n, h)| Some((n, h.as_ref()?.elapsed())))
            .find(|(_, silent)| *silent > NODE_LOST_AFTER)
    }

    /// Takes in what arrives within `wait`, then whatever else is already queued.
    pub(super) fn receive(&mut self, fold: &mut Fold, wait: Duration) {
        fold.trackers.tick();
        if let Ok(m) = self.rx.recv_timeout(wait) {
            self.take_in(fold, m);
            while let Ok(m) = self.rx.try_recv() {
                self.take_in(fold, m);
            }
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
            // Another node follows node 0’s restarts, even while its own workers still run
            // (hung, or blocked on a peer that is gone).
            if fold.joined
                && (fold.job.spec.max_failures != 0 || fold.job.spec.is_elastic())
                && polled.elapsed() >= Duration::from_millis(500)
            {
                polled = Instant::now();
                if let Ok(Some(s)) = rendezvous::current_start(&self.start.store) {
                    if s.attempt > self.attempt {
                        self.pending = Some(s);
                        workers.stop(STOP_GRACE);
                        continue;
                    }
                }
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
            if !stopped_by_user && self.grow_now(fold) {
                workers.stop(STOP_GRACE);
                continue;
            }
            if !stopped_by_user && !fold.joined && fold.job.lock().failure.is_none() {
                if let Some(hung) = self.hangs.hung(Instant::now()) {
                    self.hang(fold, hung, workers);
                    continue;
                }
            }
            if !stopped_by_user {
                self.kill_stuck_after_done(fold, workers);
            }
            let exits = workers.poll();
            let remote = std::mem::take(&mut self.remote_exits);
            if stopped_by_user || (exits.is_empty() && remote.is_empty()) {
                continue;
            }
            let bad = self.failed(fold, exits, remote);
            // The lock is taken and released here: `fail` folds events, which locks again.
            let first_failure = fold.job.lock().failure.is_none();
            if let (Some(first), true) =
                (root_cause(&bad, &self.error_order).cloned(), first_failure)
            {
                self.fail(fold, first, bad, workers);
            }
        }
        stopped_by_user
    }

    /// Kills the workers that reported `done` (their steps, metrics and checkpoints complete)
    /// but have not exited `hang_timeout` later, and says so in the job’s warnings: the run
    /// succeeded, only its teardown hung. Without this a peer gone from an untimed teardown
    /// barrier would keep the job from ending at all.
    fn kill_stuck_after_done(&mut self, fold: &mut Fold, workers: &mut Workers) {
        let limit = fold.job.spec.hang_timeout_secs;
        if limit == 0 {
            return;
        }
        let stuck: Vec<usize> = self
            .done_at
            .iter()
            .enumerate()
            .filter(|(_, at)| at.is_some_and(|t| t.elapsed() >= Duration::from_secs(limit)))
            .map(|(rank, _)| rank)
            .filter(|&rank| workers.pid_of(rank).is_some())
            .collect();
        for rank in stuck {
            if workers.kill_rank(rank).is_some() {
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
        while let Ok(m) = self.rx.try_recv() {
            self.take_in(fold, m);
        }
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
            while self.remote_exits.is_empty() && Instant::now() < deadline {
                if let Ok(m) = self.rx.recv_timeout(Duration::from_millis(20)) {
                    self.take_in(fold, m);
                }
                lost = self.lost_node();
                if lost.is_some() {
                    break;
                }
            }
            if let (Some((node, silent)), true) = (lost, self.remote_exits.is_empty()) {
                let failure = TrainError::NodeLost {
                    node,
                    how: format!(
                        "its driver stopped reporting {:.1} s ago (killed, or its machine or the network is down)",
                        silent.as_secs_f64()
                    ),
                    local: format!("rank {} {}", first.rank, first.describe()),
                };
                fold.job.lock().failure = Some(failure);
                self.cause = Some((
                    Signature {
                        rank: first.rank,
                        step: None,
                        message: None,
                    },
                    format!("node {node} lost"),
                ));
                return;
            }
            bad.append(&mut self.remote_exits);
            first = root_cause(&bad, &self.error_order)
                .cloned()
                .unwrap_or(first);
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
        fold.job.lock().failure = Some(failure);
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
            .error_steps
            .get(first.rank)
            .copied()
            .flatten()
            .or_else(|| self.hangs.step_of(first.rank));
        let how = how_it_failed(&first);
        self.cause = Some((
            Signature {
                rank: first.rank,
                step,
                message,
            },
            format!("rank {} {how}{said}", first.rank),
        ));
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
        while let Ok(m) = self.rx.try_recv() {
            self.take_in(fold, m);
        }
        let how = format!("{}; report: {}", hung.describe(), report.display());
        let failure = fold.failure_of(hung.rank, how);
        fold.job.lock().failure = Some(failure);
        self.cause = Some((
            Signature {
                rank: hung.rank,
                step: Some(hung.step),
                message: Some("hung".into()),
            },
            format!(
                "rank {} hung ({} s without progress)",
                hung.rank,
                hung.still.as_secs()
            ),
        ));
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
        if let (Some(first), true) = (
            self.remote_exits.first().cloned(),
            fold.job.lock().failure.is_none(),
        ) {
            let failure = fold.failure(&first);
            fold.job.lock().failure = Some(failure);
        }
        fold.flush_dedup(true);
        if let Some(fwd) = &fold.forward {
            fwd.flush(Duration::from_secs(2));
        }
    }
}

/// The failed worker to blame when several exit at once: one that died by a signal (its peers
/// then fail with "connection closed" errors moments later), else the one whose error report
/// came first (`error_order`: ranks in the order their errors arrived; a peer fails only after
/// the cause, however late the exits are polled), else the lowest rank.
fn root_cause<'e>(failed: &'e [Exit], error_order: &[usize]) -> Option<&'e Exit> {
    let reported = |rank: usize| {
        error_order
            .iter()
            .position(|&r| r == rank)
            .unwrap_or(usize::MAX)
    };
    failed
        .iter()
        .min_by_key(|e| (e.signal.is_none(), reported(e.rank), e.rank))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::driver::fold::tests::{fold, job};

    #[test]
    fn the_root_cause_is_a_signal_death_else_the_first_to_report_else_the_lowest_rank() {
        let exit = |rank, code, signal| Exit { rank, code, signal };
        let peers_then_killed = [
            exit(0, Some(1), None),
            exit(3, None, Some(9)),
            exit(1, Some(1), None),
        ];
        assert_eq!(root_cause(&peers_then_killed, &[]).map(|e| e.rank), Some(3));
        assert_eq!(
            root_cause(&peers_then_killed, &[1, 0]).map(|e| e.rank),
            Some(3)
        );
        let plain = [exit(2, Some(1), None), exit(1, Some(1), None)];
        assert_eq!(root_cause(&plain, &[]).map(|e| e.rank), Some(1));
        // Rank 1 failed first; rank 0 failed because of it, and both exits are seen at once.
        let both = [exit(0, Some(1), None), exit(1, Some(1), None)];
        assert_eq!(root_cause(&both, &[1, 0]).map(|e| e.rank), Some(1));
        // A rank that reported nothing comes after those that did.
        assert_eq!(root_cause(&both, &[1]).map(|e| e.rank), Some(1));
        assert_eq!(root_cause(&[], &[]), None);
    }

    #[test]
    fn error_reports_are_ordered_as_they_arrive_and_forgotten_with_the_attempt() {
        let shared = job(3);
        let mut f = fold(&shared);
        let (tx, rx) = mpsc::channel();
        let store = Store::bind("127.0.0.1", 0, Duration::from_secs(5)).unwrap();
        let start = Start::new(Vec::new(), tx, store, &shared.spec);
        let mut r = Recovery::new(&shared, 0, rx, start);
        for rank in [2, 0, 2] {
            let signal = f.event(Event::Error {
                rank,
                message: "boom".into(),
                step: None,
            });
            r.note(&mut f, signal.expect("an error is a signal"));
        }
        assert_eq!(r.error_order, vec![2, 0]);
        r.forget_attempt(&f, 0);
        assert!(r.error_order.is_empty());
    }
}
