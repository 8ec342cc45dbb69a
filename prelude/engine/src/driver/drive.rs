//! The driver’s event loop: everything the workers say (events, raw output, exits) is folded
//! into the job’s state in one thread, in arrival order, and published to subscribers. It also
//! watches the worker processes: the first failure (a death, an error, a hang) stops the rest
//! and becomes the job’s error, naming the rank, its last lines and its log — unless the job
//! may restart, in which case the same thread starts the workers again from the run’s newest
//! checkpoint ([`supervise`](super::supervise) decides) and goes on watching.

use std::fs::File;
use std::io::Write;
use std::path::PathBuf;
use std::sync::atomic::Ordering;
use std::sync::mpsc;
use std::time::{Duration, Instant};

use trainbook_api::job::{JobStatus, LogRecord, MetricRow, Progress, Restart, TrainError, Update};
use trainbook_api::logs::Stream;

use super::dedup::Deduplicator;
use super::handle::JobState;
use super::incoming::Incoming;
use super::metrics;
use super::processes::{Exit, RawOutput, WorkerCommand, Workers, STOP_GRACE};
use super::rendezvous::{self, StartInfo};
use super::supervise::{self, Decision, Hangs, Hung, Policy, Signature};
use super::track::Trackers;
use crate::shared::checkpoint::{self, RunStatus, TrainerState};
use crate::shared::env;
use crate::shared::events::{Collector, Emitter, Event};
use crate::worker::dist::Store;

/// Lines of each rank kept for error reports.
const TAIL_LINES: usize = 20;
/// How long node 0 waits for another node’s report of the worker whose death failed its own.
const REMOTE_REPORT_WAIT: Duration = Duration::from_millis(2500);
/// How often another node’s driver says it is alive, and the silence that means it is lost.
const NODE_ALIVE_EVERY: Duration = Duration::from_secs(1);
const NODE_LOST_AFTER: Duration = Duration::from_millis(2000);
/// How long node 0 waits, once its own workers are done, for other nodes’ `done` events.
const REMOTE_DONE_WAIT: Duration = Duration::from_secs(10);
/// Log lines kept in memory per job (the run directory has them all).
const MEMORY_LOG_LINES: usize = 10_000;

/// How to start this node’s workers again: their commands, where their output goes, and the
/// rendezvous store through which the nodes of a job agree on each start.
pub(super) struct Start {
    pub(super) cmds: Vec<WorkerCommand>,
    pub(super) tx: mpsc::Sender<Incoming>,
    pub(super) store: Store,
}

impl Start {
    /// Starts the workers, the `attempt`-th time (0: the first), resuming from `resume`.
    pub(super) fn spawn(
        &self,
        attempt: u32,
        resume: Option<&std::path::Path>,
    ) -> anyhow::Result<Workers> {
        let mut cmds = self.cmds.clone();
        for c in &mut cmds {
            c.env.push((env::ATTEMPT.into(), attempt.to_string()));
            if let Some(r) = resume {
                c.env.push((env::RESUME.into(), r.display().to_string()));
            }
        }
        let tx = self.tx.clone();
        Workers::spawn(cmds, move |r| tx.send(Incoming::Raw(r)).is_ok())
    }
}

/// The event loop’s state: the job it folds into, and what it writes on the way.
pub(super) struct Driver<'a> {
    job: &'a JobState,
    dedup: Deduplicator,
    log_files: Vec<Option<File>>,
    /// dllogger, TensorBoard, MLflow (node 0; none on the others).
    trackers: Trackers,
    /// On nodes other than 0: node 0’s event stream, which gets this node’s worker output and
    /// failures (their events go there directly).
    forward: Option<Emitter>,
    /// Failed workers of other nodes, as their drivers reported them (node 0).
    remote_exits: Vec<Exit>,
    /// This node joined node 0’s job (its workers’ events go to node 0).
    joined: bool,
    /// Every rank’s pulse, for hang detection.
    hangs: Hangs,
    /// When each rank reported `done`: a worker that has not exited `hang_timeout` later is
    /// stuck in its teardown (on Gaudi, the hccl process group’s untimed destructor barrier).
    done_at: Vec<Option<Instant>>,
    /// The steps each rank had taken when it reported an error.
    error_steps: Vec<Option<u64>>,
    /// The ranks that reported an error this start, in the order their reports arrived: the
    /// first is the likely cause when several fail (its peers fail because it did).
    error_order: Vec<usize>,
    /// The restart budget.
    policy: Policy,
    /// Which start of the workers is running (0: the first).
    attempt: u32,
    /// What failed this start, for the restart decision and its record.
    cause: Option<(Signature, String)>,
    /// When each other node’s driver was last heard (node 0), or last said it was alive
    /// (other nodes: their own entry).
    nodes_heard: Vec<Option<Instant>>,
    /// Other nodes: a newer start node 0 published while this node’s workers ran.
    pending: Option<StartInfo>,
}

impl Driver<'_> {
    fn elapsed(&self) -> f64 {
        self.job.started.elapsed().as_secs_f64()
    }

    fn line(&mut self, rank: usize, stream: Stream, text: String) {
        if let Some(fwd) = &self.forward {
            fwd.send(Event::Log {
                rank,
                stream: stream.into(),
                text: text.clone(),
            });
        }
        if let Some(Some(f)) = self.log_files.get_mut(rank) {
            let tag = if stream == Stream::Stderr {
                "[stderr] "
            } else {
                ""
            };
            let _ = writeln!(f, "{tag}{text}");
        }
        let now = Instant::now();
        let shown = self.dedup.push(rank, stream, &text, now);
        {
            let mut st = self.job.lock();
            if let Some(t) = st.tails.get_mut(rank) {
                if t.len() == TAIL_LINES {
                    t.pop_front();
                }
                t.push_back(text.clone());
            }
            if st.logs.len() == MEMORY_LOG_LINES {
                st.logs.pop_front();
            }
            let stream = if stream == Stream::Stderr {
                "stderr"
            } else {
                "stdout"
            };
            let time = self.elapsed();
            st.logs.push_back(LogRecord {
                rank,
                stream,
                text,
                time,
            });
        }
        for s in shown {
            self.job.publish(Update::Log(s));
        }
    }

    /// A metric: rank 0’s go to the run’s trackers (dllogger, TensorBoard, MLflow); every
    /// rank’s to the job and its subscribers.
    fn metric(&mut self, row: MetricRow) {
        if row.rank == 0 {
            self.trackers.metric(&row);
        }
        self.job.lock().metrics.push(row.clone());
        self.job.publish(Update::Metric(row));
    }

    fn event(&mut self, ev: Event) {
        let elapsed = self.elapsed();
        match ev {
            Event::Log { rank, stream, text } => self.line(rank, stream.into(), text),
            Event::Metric {
                rank,
                step,
                epoch,
                name,
                value,
                ..
            } => self.metric(MetricRow {
                rank: rank as u32,
                step,
                epoch,
                name,
                value,
                time: elapsed,
            }),
            Event::Progress {
                step,
                total_steps,
                epoch,
                epochs,
                samples,
                samples_per_second,
                ..
            } => {
                let p = Progress {
                    step,
                    total_steps,
                    epoch,
                    epochs,
                    samples,
                    samples_per_second,
                    elapsed,
                };
                self.job.lock().progress = Some(p.clone());
                self.job.publish(Update::Progress(p));
            }
            Event::Checkpoint { epoch, path, .. } => {
                let path = PathBuf::from(path);
                self.job.lock().checkpoints.push((epoch, path.clone()));
                self.job.publish(Update::Checkpoint { epoch, path });
            }
            Event::Error {
                rank,
                message,
                step,
            } => {
                if let Some(slot) = self.job.lock().errors.get_mut(rank) {
                    *slot = Some(message.clone());
                }
                if let Some(slot) = self.error_steps.get_mut(rank) {
                    *slot = step;
                }
                if !self.error_order.contains(&rank) {
                    self.error_order.push(rank);
                }
                self.line(rank, Stream::Stderr, format!("error: {message}"));
            }
            Event::Done { rank, summary } => {
                if let Some(at) = self.done_at.get_mut(rank) {
                    at.get_or_insert_with(Instant::now);
                }
                self.hangs.finished(rank);
                if rank == 0 {
                    self.trackers.done(&summary, elapsed);
                }
                if let Some(slot) = self.job.lock().summaries.get_mut(rank) {
                    *slot = Some(summary);
                }
            }
            Event::NodeAlive { node } => {
                if let Some(h) = self.nodes_heard.get_mut(node) {
                    *h = Some(Instant::now());
                }
            }
            Event::Heartbeat {
                rank,
                step,
                work,
                busy,
            } => self.hangs.beat(rank, step, work, busy, Instant::now()),
            Event::Started {
                rank,
                pid,
                device,
                threads,
            } => {
                let _ = (rank, pid, device, threads);
            }
            Event::Exited { attempt, .. } if attempt != self.attempt => {}
            Event::Exited {
                rank,
                node,
                code,
                signal,
                ..
            } => {
                let exit = Exit { rank, code, signal };
                self.line(
                    rank,
                    Stream::Stderr,
                    format!("worker on node {node}: {}", exit.describe()),
                );
                self.remote_exits.push(exit);
            }
        }
    }

    fn incoming(&mut self, m: Incoming) {
        match m {
            Incoming::Event(e) => self.event(e),
            Incoming::Raw(RawOutput::Line { rank, stderr, text }) => self.line(
                rank,
                if stderr {
                    Stream::Stderr
                } else {
                    Stream::Stdout
                },
                text,
            ),
        }
    }

    fn flush_dedup(&mut self, finish: bool) {
        let shown = if finish {
            self.dedup.finish()
        } else {
            self.dedup.flush_due(Instant::now())
        };
        for s in shown {
            self.job.publish(Update::Log(s));
        }
    }

    fn failure(&self, exit: &Exit) -> TrainError {
        self.failure_of(exit.rank, how_it_failed(exit))
    }

    /// The job’s error for a failure of `rank`, `how` it failed: its message, last lines and log.
    fn failure_of(&self, rank: usize, mut how: String) -> TrainError {
        let st = self.job.lock();
        let tail: Vec<String> = st
            .tails
            .get(rank)
            .map(|t| t.iter().map(|l| format!("  {l}")).collect())
            .unwrap_or_default();
        let message = st
            .errors
            .get(rank)
            .cloned()
            .flatten()
            .map(|m| format!("\nerror: {m}"))
            .unwrap_or_default();
        let spec = &self.job.spec;
        if spec.nodes > 1 {
            how = format!("{how}, on node {}", rank / spec.workers.max(1));
        }
        TrainError::WorkerFailed {
            rank,
            how,
            message,
            tail: if tail.is_empty() && self.forward.is_some() {
                "  (no output here: this node's workers report to node 0, whose run directory has their logs)".into()
            } else if tail.is_empty() {
                "  (no output)".into()
            } else {
                tail.join("\n")
            },
            log: self
                .job
                .run_dir
                .join("logs")
                .join(format!("rank{}.log", rank))
                .display()
                .to_string(),
        }
    }
}

/// How a failed worker ended, for its error: its exit, or a clean exit without its `done`.
fn how_it_failed(exit: &Exit) -> String {
    if exit.success() {
        "exited before reporting completion".to_string()
    } else {
        exit.describe()
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

/// How a job ended once all its workers are gone: a recorded failure wins over a stop, and
/// success needs every rank’s `done` event.
fn final_status(failed: bool, stopped_by_user: bool, every_rank_done: bool) -> JobStatus {
    if failed {
        JobStatus::Failed
    } else if stopped_by_user {
        JobStatus::Stopped
    } else if every_rank_done {
        JobStatus::Succeeded
    } else {
        JobStatus::Failed
    }
}

/// Runs a job’s event loop on the driver thread until every worker is gone (restarting them
/// after a failure while the job may), then records how the job ended and publishes it.
pub(super) fn drive(
    job: &JobState,
    mut workers: Workers,
    rx: mpsc::Receiver<Incoming>,
    collector: Option<Collector>,
    forward: Option<Emitter>,
    start: Start,
    attempt: u32,
) {
    let mut d = Driver::new(job, forward);
    d.attempt = attempt;
    let stopped_by_user = loop {
        let stopped = d.watch(&mut workers, &rx, &start);
        if stopped || !d.restart(&mut workers, &rx, &start) {
            break stopped;
        }
    };
    d.settle(&mut workers, &rx);
    let dropped = collector.as_ref().map_or(0, |c| c.dropped());
    drop(collector);
    if job.spec.nodes > 1 && !d.joined {
        // Nodes waiting for a restart give up.
        rendezvous::publish_end(&start.store);
    }
    drop(start);
    d.finish(dropped, stopped_by_user);
}

impl<'a> Driver<'a> {
    fn new(job: &'a JobState, forward: Option<Emitter>) -> Self {
        let world = job.spec.world_size();
        let logs_dir = job.run_dir.join("logs");
        // Node 0 logs every rank (other nodes forward their output to it); other nodes their own.
        let local = job.spec.local_ranks();
        let log_files = (0..world)
            .map(|r| {
                (forward.is_none() || local.contains(&r))
                    .then(|| File::create(logs_dir.join(format!("rank{r}.log"))).ok())
                    .flatten()
            })
            .collect();
        let joined = forward.is_some();
        Driver {
            job,
            dedup: Deduplicator::new(job.spec.dedup),
            log_files,
            trackers: if joined {
                Trackers::none()
            } else {
                Trackers::for_job(job)
            },
            forward,
            remote_exits: Vec::new(),
            joined,
            hangs: Hangs::new(world, job.spec.hang_timeout_secs),
            done_at: vec![None; world],
            error_steps: vec![None; world],
            error_order: Vec::new(),
            policy: Policy::new(job.spec.max_failures),
            attempt: 0,
            cause: None,
            nodes_heard: vec![None; job.spec.nodes],
            pending: None,
        }
    }

    /// Another node’s driver says it is alive, about once a second.
    fn say_alive(&mut self) {
        let node = self.job.spec.node_rank;
        let (Some(fwd), Some(last)) = (&self.forward, self.nodes_heard.get_mut(node)) else {
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
    fn receive(&mut self, rx: &mpsc::Receiver<Incoming>, wait: Duration) {
        self.trackers.tick();
        if let Ok(m) = rx.recv_timeout(wait) {
            self.incoming(m);
            while let Ok(m) = rx.try_recv() {
                self.incoming(m);
            }
        }
    }

    /// Folds events and watches the workers until all have exited. Returns whether the user
    /// stopped the job.
    fn watch(
        &mut self,
        workers: &mut Workers,
        rx: &mpsc::Receiver<Incoming>,
        start: &Start,
    ) -> bool {
        let mut stopped_by_user = false;
        let mut polled = Instant::now();
        while !workers.all_exited() {
            self.receive(rx, Duration::from_millis(20));
            self.flush_dedup(false);
            self.say_alive();
            // Another node follows node 0’s restarts, even while its own workers still run
            // (hung, or blocked on a peer that is gone).
            if self.joined
                && self.job.spec.max_failures != 0
                && polled.elapsed() >= Duration::from_millis(500)
            {
                polled = Instant::now();
                if let Ok(Some(s)) = rendezvous::current_start(&start.store) {
                    if s.attempt > self.attempt {
                        self.pending = Some(s);
                        workers.stop(STOP_GRACE);
                        continue;
                    }
                }
            }
            if self.job.stop_requested.load(Ordering::Relaxed) && !stopped_by_user {
                stopped_by_user = true;
                workers.stop(STOP_GRACE);
                continue;
            }
            if !stopped_by_user && !self.joined && self.job.lock().failure.is_none() {
                if let Some(hung) = self.hangs.hung(Instant::now()) {
                    self.hang(hung, workers, rx);
                    continue;
                }
            }
            if !stopped_by_user {
                self.kill_stuck_after_done(workers);
            }
            let exits = workers.poll();
            let remote = std::mem::take(&mut self.remote_exits);
            if stopped_by_user || (exits.is_empty() && remote.is_empty()) {
                continue;
            }
            let bad = self.failed(exits, remote, rx);
            // The lock is taken and released here: `fail` folds events, which locks again.
            let first_failure = self.job.lock().failure.is_none();
            if let (Some(first), true) =
                (root_cause(&bad, &self.error_order).cloned(), first_failure)
            {
                self.fail(first, bad, workers, rx);
            }
        }
        stopped_by_user
    }

    /// Kills the workers that reported `done` (their steps, metrics and checkpoints complete)
    /// but have not exited `hang_timeout` later, and says so in the job’s warnings: the run
    /// succeeded, only its teardown hung. Without this a peer gone from an untimed teardown
    /// barrier would keep the job from ending at all.
    fn kill_stuck_after_done(&mut self, workers: &mut Workers) {
        let limit = self.job.spec.hang_timeout_secs;
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
                self.line(rank, Stream::Stderr, format!("warning: {note}"));
                self.job.lock().warnings.push(note);
            }
        }
    }

    /// The exits that count as failures: a crash, or a clean exit without its `done` event
    /// (given the socket a moment). On other nodes the `done` events go to node 0, so a clean
    /// exit is enough there.
    fn failed(
        &mut self,
        exits: Vec<Exit>,
        mut bad: Vec<Exit>,
        rx: &mpsc::Receiver<Incoming>,
    ) -> Vec<Exit> {
        let done = |job: &JobState, r: usize| {
            job.lock()
                .summaries
                .get(r)
                .map(|s| s.is_some())
                .unwrap_or(false)
        };
        for e in exits {
            if e.success() && !self.joined {
                let deadline = Instant::now() + Duration::from_millis(500);
                while !done(self.job, e.rank) && Instant::now() < deadline {
                    if let Ok(m) = rx.recv_timeout(Duration::from_millis(10)) {
                        self.incoming(m);
                    }
                }
                if !done(self.job, e.rank) {
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
        mut first: Exit,
        mut bad: Vec<Exit>,
        workers: &mut Workers,
        rx: &mpsc::Receiver<Incoming>,
    ) {
        workers.stop(STOP_GRACE);
        workers.join_readers(Duration::from_millis(300));
        while let Ok(m) = rx.try_recv() {
            self.incoming(m);
        }
        // A worker killed on another node fails the workers of this node at once ("connection
        // closed"); the report of its driver follows within moments, and names the cause.
        // A node whose driver died reports nothing: its silence names it. (When another node
        // already reported, that report is the cause.)
        let local = self.job.spec.local_ranks();
        let only_local = bad.iter().all(|e| local.contains(&e.rank));
        if self.job.spec.nodes > 1 && !self.joined && first.signal.is_none() && only_local {
            // A node is lost only `NODE_LOST_AFTER` after its last `NodeAlive`, which may have
            // come just before it died: wait that long on top, so that a dead node is named.
            let deadline = Instant::now() + REMOTE_REPORT_WAIT + NODE_LOST_AFTER;
            let mut lost = None;
            while self.remote_exits.is_empty() && Instant::now() < deadline {
                if let Ok(m) = rx.recv_timeout(Duration::from_millis(20)) {
                    self.incoming(m);
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
                self.job.lock().failure = Some(failure);
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
        if let Some(fwd) = &self.forward {
            fwd.send(Event::Exited {
                attempt: self.attempt,
                rank: first.rank,
                node: self.job.spec.node_rank,
                code: first.code,
                signal: first.signal,
            });
            fwd.flush(Duration::from_secs(2));
        }
        let failure = self.failure(&first);
        self.job.lock().failure = Some(failure);
        let message = self.job.lock().errors.get(first.rank).cloned().flatten();
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
    fn hang(&mut self, hung: Hung, workers: &mut Workers, rx: &mpsc::Receiver<Incoming>) {
        let tail: Vec<String> = self
            .job
            .lock()
            .tails
            .get(hung.rank)
            .map(|t| t.iter().cloned().collect())
            .unwrap_or_default();
        let run_dir = &self.job.run_dir;
        let pid = workers.pid_of(hung.rank);
        let pending = "(being taken: eu-stack or gdb attaches to the process)";
        supervise::write_report(run_dir, self.attempt, &hung, &tail, pending);
        let stack = match pid {
            Some(pid) => supervise::native_stack(pid),
            None => format!(
                "rank {} runs on another node: run gdb -p <pid> there for its stack",
                hung.rank
            ),
        };
        let report = supervise::write_report(run_dir, self.attempt, &hung, &tail, &stack);
        workers.stop(STOP_GRACE);
        workers.join_readers(Duration::from_millis(300));
        while let Ok(m) = rx.try_recv() {
            self.incoming(m);
        }
        let how = format!("{}; report: {}", hung.describe(), report.display());
        let failure = self.failure_of(hung.rank, how);
        self.job.lock().failure = Some(failure);
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

    /// After a failure: starts the workers again from the run’s newest checkpoint when the
    /// job may restart (and returns true), or adds to the job’s error why it does not.
    fn restart(
        &mut self,
        workers: &mut Workers,
        rx: &mpsc::Receiver<Incoming>,
        start: &Start,
    ) -> bool {
        if self.joined {
            return self.follow(workers, rx, start);
        }
        if self.job.lock().failure.is_none() {
            return false;
        }
        let Some((signature, reason)) = self.cause.take() else {
            return false;
        };
        let rank = signature.rank;
        let reported_step = self.error_steps.get(rank).copied().flatten();
        match self.policy.decide(signature) {
            Decision::GiveUp(why) => {
                self.explain_give_up(&why);
                false
            }
            Decision::Restart => {
                // Whatever the stopped workers still had in flight belongs to this start.
                let deadline = Instant::now() + Duration::from_millis(200);
                while let Ok(m) =
                    rx.recv_timeout(deadline.saturating_duration_since(Instant::now()))
                {
                    self.incoming(m);
                }
                let job = self.job;
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
                    time: self.elapsed(),
                    reason,
                    rank: Some(rank),
                    failed_at_step: reported_step.or(Some(reached)),
                    checkpoint: checkpoint.clone(),
                    resumed_step,
                    steps_lost: reported_step
                        .unwrap_or(reached)
                        .saturating_sub(resumed_step),
                };
                self.forget_attempt(resumed_step);
                self.trackers.restart(resumed_step, &restart);
                job.lock().restarts.push(restart.clone());
                self.job.publish(Update::Restart(restart));
                let several = job.spec.nodes > 1;
                let next = StartInfo {
                    attempt: self.attempt,
                    resume: checkpoint,
                };
                let started = (if several {
                    rendezvous::publish_start(&start.store, &next)
                } else {
                    Ok(())
                })
                .and_then(|_| start.spawn(next.attempt, next.resume.as_deref()));
                match started {
                    Ok(w) => {
                        *workers = w;
                        job.lock().pids = workers.pids();
                        if several {
                            rendezvous::mark_started(&start.store, next.attempt, 0).ok();
                            return self.await_nodes(workers, rx, start);
                        }
                        true
                    }
                    Err(e) => {
                        let failure = self.failure_of(
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
    fn await_nodes(
        &mut self,
        workers: &mut Workers,
        rx: &mpsc::Receiver<Incoming>,
        start: &Start,
    ) -> bool {
        let timeout = Duration::from_secs(self.job.spec.collective_timeout_secs);
        // Before the workers’ own rendezvous times out, so that the error names the node.
        let deadline = Instant::now() + timeout.saturating_sub(Duration::from_secs(2));
        let missing = |attempt| {
            (1..self.job.spec.nodes).find(|&k| !rendezvous::has_started(&start.store, attempt, k))
        };
        while let Some(node) = missing(self.attempt) {
            // A node that cannot start (it said why) fails this start like a dead worker.
            if self.job.stop_requested.load(Ordering::Relaxed) || !self.remote_exits.is_empty() {
                return true;
            }
            if Instant::now() >= deadline {
                workers.stop(STOP_GRACE);
                self.job.lock().failure = Some(TrainError::NodeLost {
                    node,
                    how: format!(
                        "it did not rejoin the restarted job within {} s: run its command again (the same --nnodes, --node-rank, --master-addr and --name) and resume the run",
                        timeout.as_secs()
                    ),
                    local: "stopped".into(),
                });
                return false;
            }
            self.receive(rx, Duration::from_millis(100));
            self.flush_dedup(false);
        }
        true
    }

    /// Nodes 1..N once their workers have ended: when node 0 restarts the job (it published a
    /// newer start, or does within the collective timeout), start the workers for it.
    fn follow(
        &mut self,
        workers: &mut Workers,
        rx: &mpsc::Receiver<Incoming>,
        start: &Start,
    ) -> bool {
        if self.job.spec.max_failures == 0 {
            return false;
        }
        let next = match self.pending.take() {
            Some(s) => s,
            None if self.job.lock().failure.is_none() => return false,
            None => {
                let timeout = Duration::from_secs(self.job.spec.collective_timeout_secs);
                let deadline = Instant::now() + timeout;
                loop {
                    match rendezvous::current_start(&start.store) {
                        Ok(Some(s)) if s.attempt > self.attempt => break s,
                        Err(_) => return false,
                        _ if rendezvous::ended(&start.store) => return false,
                        _ => {}
                    }
                    if Instant::now() >= deadline || self.job.stop_requested.load(Ordering::Relaxed)
                    {
                        return false;
                    }
                    self.receive(rx, Duration::from_millis(100));
                    self.say_alive();
                }
            }
        };
        self.attempt = next.attempt;
        self.forget_attempt(0);
        if let Some(dir) = next.resume.as_deref().filter(|d| !d.exists()) {
            let rank = self.job.spec.local_ranks().start;
            let message = format!(
                "node {} cannot follow node 0's restart: its checkpoint {} is not on this node. Put the runs root on storage every node mounts at the same path (--runs-root or TRAINBOOK_RUNS)",
                self.job.spec.node_rank,
                dir.display()
            );
            // Node 0 waits for this node’s start: tell it why there is none.
            if let Some(fwd) = &self.forward {
                fwd.send(Event::Error {
                    rank,
                    message: message.clone(),
                    step: None,
                });
                fwd.send(Event::Exited {
                    attempt: next.attempt,
                    rank,
                    node: self.job.spec.node_rank,
                    code: Some(1),
                    signal: None,
                });
                fwd.flush(Duration::from_secs(2));
            }
            let failure = self.failure_of(rank, message);
            self.job.lock().failure = Some(failure);
            return false;
        }
        match start.spawn(next.attempt, next.resume.as_deref()) {
            Ok(w) => {
                *workers = w;
                self.job.lock().pids = workers.pids();
                let node = self.job.spec.node_rank;
                rendezvous::mark_started(&start.store, next.attempt, node).ok();
                true
            }
            Err(e) => {
                let failure = self.failure_of(
                    self.job.spec.local_ranks().start,
                    format!("could not be started again for node 0's restart: {e:#}"),
                );
                self.job.lock().failure = Some(failure);
                false
            }
        }
    }

    /// A new start of the workers: its failure, errors, pulses and progress start empty, and
    /// the metric rows of the steps it will redo are dropped (the replayed rows replace them).
    fn forget_attempt(&mut self, resumed_step: u64) {
        self.hangs.reset();
        self.done_at.iter_mut().for_each(|d| *d = None);
        self.error_steps.iter_mut().for_each(|s| *s = None);
        self.error_order.clear();
        self.remote_exits.clear();
        let mut st = self.job.lock();
        st.failure = None;
        st.errors.iter_mut().for_each(|e| *e = None);
        st.summaries.iter_mut().for_each(|s| *s = None);
        st.progress = None;
        st.metrics.retain(|m| m.step <= resumed_step);
        st.checkpoints.retain(|(_, p)| p.exists());
    }

    /// Adds to the job’s error the restarts it had and why there is no other.
    fn explain_give_up(&self, why: &str) {
        let mut st = self.job.lock();
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

    /// Every worker is gone: takes in what is still in flight (other nodes’ `done` events
    /// travel further than this node’s).
    fn settle(&mut self, workers: &mut Workers, rx: &mpsc::Receiver<Incoming>) {
        workers.join_readers(Duration::from_secs(1));
        let settle = if self.job.spec.nodes > 1 && !self.joined {
            REMOTE_DONE_WAIT
        } else {
            Duration::from_millis(300)
        };
        let deadline = Instant::now() + settle;
        while Instant::now() < deadline && !self.joined {
            match rx.recv_timeout(Duration::from_millis(20)) {
                Ok(m) => self.incoming(m),
                Err(_) => {
                    let st = self.job.lock();
                    if st.summaries.iter().all(|s| s.is_some()) || st.failure.is_some() {
                        break;
                    }
                }
            }
        }
        if let (Some(first), true) = (
            self.remote_exits.first().cloned(),
            self.job.lock().failure.is_none(),
        ) {
            let failure = self.failure(&first);
            self.job.lock().failure = Some(failure);
        }
        self.flush_dedup(true);
        if let Some(fwd) = &self.forward {
            fwd.flush(Duration::from_secs(2));
        }
    }

    /// Records how the job ended, writes `metrics.parquet` and tells subscribers.
    fn finish(mut self, dropped_events: u64, stopped_by_user: bool) {
        let job = self.job;
        let rows = {
            let mut st = job.lock();
            st.dropped_events = dropped_events;
            st.elapsed = job.started.elapsed().as_secs_f64();
            // Other nodes see their own workers’ clean exits; node 0 every rank’s `done`.
            let every_rank_done = self.joined || st.summaries.iter().all(|s| s.is_some());
            st.status = final_status(st.failure.is_some(), stopped_by_user, every_rank_done);
            if st.status == JobStatus::Failed && st.failure.is_none() {
                st.failure = Some(TrainError::WorkerFailed {
                    rank: 0,
                    how: "workers exited without reporting completion".into(),
                    message: String::new(),
                    tail: String::new(),
                    log: job.run_dir.join("logs").display().to_string(),
                });
            }
            st.metrics.clone()
        };
        if let Err(e) = metrics::write_parquet(&rows, &job.run_dir.join("metrics.parquet")) {
            eprintln!("trainbook: could not write metrics.parquet: {e:#}");
        }
        if !self.joined {
            let st = job.lock();
            let status = RunStatus {
                status: st.status.name().into(),
                steps: st
                    .summaries
                    .first()
                    .cloned()
                    .flatten()
                    .map_or(0, |s| s.steps),
                restarts: st.restarts.len(),
            };
            drop(st);
            let file = job.run_dir.join(checkpoint::RUN_STATUS);
            if let Err(e) = checkpoint::write_json_atomic(&file, &status) {
                eprintln!("trainbook: could not write {}: {e:#}", file.display());
            }
        }
        let status = job.lock().status;
        let checkpoint = job.lock().checkpoints.last().map(|(_, p)| p.clone());
        let trackers = std::mem::replace(&mut self.trackers, Trackers::none());
        let warnings = trackers.finish(status, checkpoint);
        job.lock().warnings.extend(warnings);
        job.publish(Update::Finished(status));
        job.finished.notify_all();
    }
}

#[cfg(test)]
mod tests {
    //! The driver’s folding of events into a job, fed synthetic event sequences: no worker
    //! processes, sockets or UI.
    use super::*;
    use crate::shared::events::LogStream;
    use std::path::PathBuf;
    use trainbook_api::device::DeviceKind;
    use trainbook_api::spec::Configure;
    use trainbook_api::spec::JobSpec;

    fn driver(job: &JobState) -> Driver<'_> {
        Driver {
            job,
            dedup: Deduplicator::new(job.spec.dedup),
            log_files: Vec::new(),
            trackers: Trackers::none(),
            forward: None,
            remote_exits: Vec::new(),
            joined: false,
            hangs: Hangs::new(job.spec.world_size(), 0),
            done_at: vec![None; job.spec.world_size()],
            error_steps: vec![None; job.spec.world_size()],
            error_order: Vec::new(),
            policy: Policy::new(0),
            attempt: 0,
            cause: None,
            nodes_heard: Vec::new(),
            pending: None,
        }
    }

    fn job(workers: usize) -> JobState {
        let spec = JobSpec::new("synthetic").workers(workers);
        JobState::new(
            spec,
            DeviceKind::Cpu,
            PathBuf::from("/runs/r1"),
            "tcp://x".into(),
        )
    }

    fn subscribe(shared: &JobState) -> mpsc::Receiver<Update> {
        let (tx, rx) = mpsc::channel();
        shared.subscribers.lock().unwrap().push(tx);
        rx
    }

    fn metric(rank: usize, step: u64, name: &str, value: f64) -> Event {
        Event::Metric {
            rank,
            step,
            epoch: 0,
            name: name.into(),
            value,
            time: 0.0,
        }
    }

    fn log(rank: usize, text: &str) -> Event {
        Event::Log {
            rank,
            stream: LogStream::Stdout,
            text: text.into(),
        }
    }

    #[test]
    fn events_fold_into_the_jobs_state_and_reach_subscribers_in_order() {
        let shared = job(2);
        let updates = subscribe(&shared);
        let mut d = driver(&shared);
        d.event(metric(0, 1, "loss", 0.9));
        d.event(Event::Progress {
            rank: 0,
            step: 1,
            total_steps: 10,
            epoch: 0,
            epochs: 1,
            samples: 8,
            samples_per_second: 4.0,
        });
        d.event(metric(1, 1, "loss", 0.8));
        d.event(Event::Checkpoint {
            rank: 0,
            step: 10,
            epoch: 0,
            path: "/runs/r1/checkpoints/epoch-0".into(),
        });
        let st = shared.lock();
        assert_eq!(st.metrics.len(), 2);
        assert_eq!((st.metrics[1].rank, st.metrics[1].value), (1, 0.8));
        assert_eq!(st.progress.as_ref().map(|p| p.step), Some(1));
        assert_eq!(st.checkpoints[0].0, 0);
        drop(st);
        let got: Vec<&str> = updates
            .try_iter()
            .map(|u| match u {
                Update::Metric(_) => "metric",
                Update::Progress(_) => "progress",
                Update::Checkpoint { .. } => "checkpoint",
                _ => "other",
            })
            .collect();
        assert_eq!(got, ["metric", "progress", "metric", "checkpoint"]);
    }

    #[test]
    fn a_failure_names_the_rank_its_error_its_last_lines_and_its_log() {
        let shared = job(2);
        let mut d = driver(&shared);
        for i in 0..30 {
            d.event(log(1, &format!("step {i}")));
        }
        d.event(log(0, "rank 0 is fine"));
        d.event(Event::Error {
            rank: 1,
            message: "loss became NaN at step 3".into(),
            step: Some(3),
        });
        let failure = d.failure(&Exit {
            rank: 1,
            code: Some(1),
            signal: None,
        });
        let TrainError::WorkerFailed {
            rank,
            how,
            message,
            tail,
            log,
        } = failure
        else {
            panic!("not a worker failure: {failure:?}")
        };
        assert_eq!((rank, how.as_str()), (1, "exit code 1"));
        assert_eq!(message, "\nerror: loss became NaN at step 3");
        // The last TAIL_LINES lines of that rank only, its error included.
        let lines: Vec<&str> = tail.lines().collect();
        assert_eq!(lines.len(), TAIL_LINES);
        assert_eq!(lines.last(), Some(&"  error: loss became NaN at step 3"));
        assert!(!tail.contains("rank 0 is fine") && !tail.contains("step 10\n"));
        assert_eq!(log, "/runs/r1/logs/rank1.log");
    }

    #[test]
    fn a_clean_exit_without_its_done_event_is_a_failure_too() {
        let shared = job(1);
        let d = driver(&shared);
        let TrainError::WorkerFailed { how, tail, .. } = d.failure(&Exit {
            rank: 0,
            code: Some(0),
            signal: None,
        }) else {
            panic!()
        };
        assert_eq!(how, "exited before reporting completion");
        assert_eq!(tail, "  (no output)");
    }

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
        let mut d = driver(&shared);
        for rank in [2, 0, 2] {
            d.event(Event::Error {
                rank,
                message: "boom".into(),
                step: None,
            });
        }
        assert_eq!(d.error_order, vec![2, 0]);
        d.forget_attempt(0);
        assert!(d.error_order.is_empty());
    }

    #[test]
    fn the_final_status_follows_failure_then_stop_then_completion() {
        use JobStatus::*;
        // (failed, stopped by the user, every rank reported done) → status
        let table = [
            ((true, false, false), Failed),
            ((true, true, true), Failed),
            ((false, true, false), Stopped),
            ((false, true, true), Stopped),
            ((false, false, true), Succeeded),
            ((false, false, false), Failed),
        ];
        for ((f, s, d), want) in table {
            assert_eq!(
                final_status(f, s, d),
                want,
                "failed={f} stopped={s} done={d}"
            );
        }
    }

    #[test]
    fn repeated_lines_of_several_ranks_reach_subscribers_once_plus_a_summary() {
        let shared = job(3);
        let updates = subscribe(&shared);
        let mut d = driver(&shared);
        for rank in 0..3 {
            d.event(log(rank, "loading the tokenizer"));
        }
        d.flush_dedup(true);
        let shown: Vec<crate::driver::dedup::Shown> = updates
            .try_iter()
            .filter_map(|u| match u {
                Update::Log(s) => Some(s),
                _ => None,
            })
            .collect();
        assert_eq!(shown.len(), 2, "{shown:?}");
        assert_eq!((shown[0].rank, shown[0].repeats.is_none()), (0, true));
        let repeats = shown[1].repeats.as_ref().expect("a summary of the repeats");
        assert_eq!(repeats.ranks.iter().copied().collect::<Vec<_>>(), [0, 1, 2]);
        assert_eq!(repeats.count, 3);
        // Every line is still kept for job.logs(), one record per rank.
        assert_eq!(shared.lock().logs.len(), 3);
    }
}
