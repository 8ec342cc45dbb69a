//! The rules of supervision: what the driver decides when a start of the job's workers fails,
//! and how it notices a start that stopped moving.
//!
//! - [`Hangs`] watches every rank's heartbeat (see the worker's `heartbeat`): a rank whose
//!   work (steps, evaluation batches) has not moved for `hang_timeout` (or 5 times its slowest
//!   step, whichever is longer), outside a checkpoint write, is hung. Silent ranks (stopped, frozen) are
//!   blamed before ranks that are alive but blocked waiting for them.
//! - [`Policy`] decides whether a failure earns a restart: `max_failures` bounds them, and
//!   the same error of the same rank at the same step as the failure before is not retried
//!   (a NaN, a user's `bail!`, a bad batch would fail the same way every time).
//! - [`native_stack`] asks eu-stack (or gdb) for a hung process's threads, for its report.
//!
//! Time is a parameter everywhere here, so the rules are tested without waiting.

use crate::shared::run_dir::RunDir;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// A heartbeat older than this means a rank is silent (its pulse beats every second). Well
/// under the shortest hang limit: the ranks of a job start their pulses together, so a stopped
/// rank's last beat and its blocked peer's last news can be milliseconds apart, and the
/// stopped one must already count as silent when the peer passes its limit.
const SILENT_AFTER: Duration = Duration::from_millis(2000);
/// A rank may take this many times its slowest step so far before it counts as hung.
const SLOWEST_STEP_FACTOR: u32 = 5;
/// How long a native stack may take (gdb needs seconds to load libtorch's symbols).
const STACK_TIMEOUT: Duration = Duration::from_secs(30);

/// One rank's pulse as the driver last heard it.
#[derive(Clone, Debug, Default)]
struct Pulse {
    step: u64,
    work: u64,
    /// When the step last moved (or the rank said it was busy); `None` until its first step,
    /// since start-up (loading data, the rendezvous) is the collective timeout's business.
    moved: Option<Instant>,
    heard: Option<Instant>,
    slowest: Duration,
    /// The first heartbeat, and the time per step up to the first step counted from it
    /// (start-up included): it stands in for `slowest` until a step has been timed, so a model
    /// whose first steps are legitimately slow (a large one on CPU, Gaudi compiling its graphs)
    /// is not declared hung at the second step.
    first_heard: Option<Instant>,
    first_step: Duration,
    /// When the rank reported `done`: its teardown is not a hang of the training, but a
    /// process that has not exited `hang_timeout` later is stuck in it.
    done: Option<Instant>,
}

impl Pulse {
    /// The slowest timed step, or before any step was timed, the first one's time.
    fn step_time(&self) -> Duration {
        if self.slowest > Duration::ZERO {
            self.slowest
        } else {
            self.first_step
        }
    }
}

/// A rank declared hung.
#[derive(Clone, Debug, PartialEq)]
pub(super) struct Hung {
    pub rank: usize,
    /// Steps it had taken.
    pub step: u64,
    /// How long its step has not moved.
    pub still: Duration,
    /// The limit it went over.
    pub limit: Duration,
    /// It stopped beating as well (stopped or frozen, not blocked).
    pub silent: bool,
}

impl Hung {
    /// "hung: no progress for 12 s (limit 10 s), last heard at step 25; no heartbeat either: ...".
    /// Heartbeats come once a second, so the step may be a second's worth of steps behind.
    pub(super) fn describe(&self) -> String {
        format!(
            "hung: no progress for {:.0} s (limit {:.0} s), last heard at step {}{}",
            self.still.as_secs_f64(),
            self.limit.as_secs_f64(),
            self.step,
            if self.silent {
                "; no heartbeat either: the process is stopped or frozen"
            } else {
                "; it is alive but blocked (a collective waiting for a peer, a deadlock)"
            }
        )
    }
}

/// Every rank's pulse, and the rule that declares one hung.
pub(super) struct Hangs {
    /// `None`: hang detection is off.
    timeout: Option<Duration>,
    ranks: Vec<Pulse>,
}

impl Hangs {
    pub(super) fn new(world: usize, timeout_secs: u64) -> Hangs {
        Hangs {
            timeout: (timeout_secs > 0).then(|| Duration::from_secs(timeout_secs)),
            ranks: vec![Pulse::default(); world],
        }
    }

    /// A heartbeat of `rank` at `now`: its steps, its work count (steps and evaluation
    /// batches) and whether it is inside one long operation.
    pub(super) fn beat(&mut self, rank: usize, step: u64, work: u64, busy: bool, now: Instant) {
        let Some(p) = self.ranks.get_mut(rank) else {
            return;
        };
        p.heard = Some(now);
        let first = *p.first_heard.get_or_insert(now);
        if step > p.step {
            if let Some(m) = p.moved {
                // Steps since the last beat share the time.
                let per_step = now.saturating_duration_since(m) / (step - p.step) as u32;
                p.slowest = p.slowest.max(per_step);
            } else {
                p.first_step = now.saturating_duration_since(first) / step as u32;
            }
            p.step = step;
            p.moved = Some(now);
        } else if (work > p.work || busy) && p.moved.is_some() {
            p.moved = Some(now);
        }
        p.work = p.work.max(work);
    }

    /// `rank` reported `done` at `now`: no longer watched for hangs.
    pub(super) fn finished(&mut self, rank: usize, now: Instant) {
        if let Some(p) = self.ranks.get_mut(rank) {
            p.done.get_or_insert(now);
        }
    }

    /// The ranks that reported `done` at least `hang_timeout` before `now` (none when hang
    /// detection is off): a process still running then is stuck in its teardown (on Gaudi,
    /// the hccl process group's untimed destructor barrier).
    pub(super) fn stuck_after_done(&self, now: Instant) -> Vec<usize> {
        let Some(timeout) = self.timeout else {
            return Vec::new();
        };
        self.ranks
            .iter()
            .enumerate()
            .filter(|(_, p)| {
                p.done
                    .is_some_and(|t| now.saturating_duration_since(t) >= timeout)
            })
            .map(|(rank, _)| rank)
            .collect()
    }

    /// The hang limit in whole seconds (0: off), for messages.
    pub(super) fn timeout_secs(&self) -> u64 {
        self.timeout.map_or(0, |t| t.as_secs())
    }

    /// The steps `rank` had taken when last heard.
    pub(super) fn step_of(&self, rank: usize) -> Option<u64> {
        self.ranks
            .get(rank)
            .filter(|p| p.heard.is_some())
            .map(|p| p.step)
    }

    /// The furthest step any rank reached.
    pub(super) fn max_step(&self) -> u64 {
        self.ranks.iter().map(|p| p.step).max().unwrap_or(0)
    }

    /// Forgets every pulse (a new start of the workers).
    pub(super) fn reset(&mut self) {
        for p in &mut self.ranks {
            *p = Pulse::default();
        }
    }

    /// The rank to declare hung at `now`, if any. Once some rank past its first step is past
    /// its limit, the one blamed is a silent rank if there is one (even one not yet past its
    /// own limit, which its slowest step may have raised, or one stopped before its first
    /// heartbeat showed a step: its peers are blocked waiting for it), else the one furthest
    /// behind among those past their limit, then the lowest rank.
    pub(super) fn hung(&self, now: Instant) -> Option<Hung> {
        let timeout = self.timeout?;
        let mut armed_past_limit = false;
        let ranks: Vec<Hung> = self
            .ranks
            .iter()
            .enumerate()
            .filter(|(_, p)| p.done.is_none())
            .filter_map(|(rank, p)| {
                let heard = p.heard?;
                let h = Hung {
                    rank,
                    step: p.step,
                    still: now.saturating_duration_since(p.moved.unwrap_or(heard)),
                    limit: timeout.max(p.step_time() * SLOWEST_STEP_FACTOR),
                    silent: now.saturating_duration_since(heard) > SILENT_AFTER,
                };
                armed_past_limit |= p.moved.is_some() && h.still > h.limit;
                Some(h)
            })
            .collect();
        if !armed_past_limit {
            return None;
        }
        ranks
            .into_iter()
            .filter(|h| h.silent || (h.still > h.limit && self.ranks[h.rank].moved.is_some()))
            .min_by_key(|h| (!h.silent, h.step, h.rank))
    }
}

/// What identifies a failure for the "same failure twice" rule: the step and the message.
/// Not the rank: a NaN fails every rank at once, and whichever the driver sees first is blamed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) struct Signature {
    pub rank: usize,
    pub step: Option<u64>,
    /// The rank's own error message; `None` for a death by signal (never deterministic: the
    /// same kill twice is two kills).
    pub message: Option<String>,
}

/// Whether the job restarts after a failure.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Decision {
    Restart,
    /// Fail, with why no restart (empty when restarts were not asked for).
    GiveUp(String),
}

/// The restart budget of one job.
pub(super) struct Policy {
    /// `None`: no limit.
    allowed: Option<u32>,
    used: u32,
    last: Option<Signature>,
}

impl Policy {
    /// From `max_failures` (-1: no limit).
    pub(super) fn new(max_failures: i32) -> Policy {
        Policy {
            allowed: u32::try_from(max_failures).ok(),
            used: 0,
            last: None,
        }
    }

    pub(super) fn allowed(&self) -> Option<u32> {
        self.allowed
    }

    pub(super) fn used(&self) -> u32 {
        self.used
    }

    pub(super) fn decide(&mut self, failure: Signature) -> Decision {
        if self.allowed == Some(0) {
            return Decision::GiveUp(String::new());
        }
        let repeated = failure.message.is_some()
            && self
                .last
                .as_ref()
                .is_some_and(|l| (l.step, &l.message) == (failure.step, &failure.message));
        if repeated {
            let at = failure
                .step
                .map(|s| format!(" at step {s}"))
                .unwrap_or_default();
            return Decision::GiveUp(format!(
                "not restarted again: rank {} failed with the same error{at} as before the last restart, which a restart does not fix (a deterministic error: fix it, then resume the run)",
                failure.rank
            ));
        }
        if self.allowed.is_some_and(|a| self.used >= a) {
            return Decision::GiveUp(format!(
                "not restarted: the job already restarted {} time(s), its max_failures",
                self.used
            ));
        }
        self.used += 1;
        self.last = Some(failure);
        Decision::Restart
    }
}

/// The native stack of every thread of `pid`, from eu-stack or gdb, or why there is none.
/// eu-stack first: it reads a libtorch process's symbols in a fraction of a second, where gdb
/// takes about 4 s (measured on the same stopped worker), and the restart waits for it.
pub(super) fn native_stack(pid: u32) -> String {
    let tools: [(&str, Vec<String>); 2] = [
        ("eu-stack", vec!["-p".into(), pid.to_string()]),
        (
            "gdb",
            vec![
                "-p".into(),
                pid.to_string(),
                "-batch".into(),
                "-nx".into(),
                "-ex".into(),
                "thread apply all bt".into(),
            ],
        ),
    ];
    let mut tried = Vec::new();
    for (tool, args) in tools {
        match run_with_timeout(tool, &args, STACK_TIMEOUT) {
            Ok(out) => return format!("$ {tool} {}\n{out}", args.join(" ")),
            Err(e) => tried.push(format!("{tool}: {e}")),
        }
    }
    format!(
        "no native stack ({}): install elfutils or gdb (apt-get install elfutils) to have one in the next hang's report",
        tried.join("; ")
    )
}

fn run_with_timeout(program: &str, args: &[String], timeout: Duration) -> Result<String, String> {
    let out_file = std::env::temp_dir().join(format!(
        "trainbook-stack-{}-{}",
        std::process::id(),
        rand::random::<u32>()
    ));
    let file = std::fs::File::create(&out_file).map_err(|e| e.to_string())?;
    let err = file.try_clone().map_err(|e| e.to_string())?;
    let mut child = Command::new(program)
        .args(args)
        .stdin(Stdio::null())
        .stdout(file)
        .stderr(err)
        .spawn()
        .map_err(|e| e.to_string())?;
    let deadline = Instant::now() + timeout;
    let status = loop {
        match child.try_wait() {
            Ok(Some(s)) => break Some(s),
            Ok(None) if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(50)),
            _ => {
                let _ = child.kill();
                let _ = child.wait();
                break None;
            }
        }
    };
    let text = std::fs::read_to_string(&out_file).unwrap_or_default();
    std::fs::remove_file(&out_file).ok();
    match status {
        Some(s) if s.success() => Ok(text),
        Some(s) => Err(format!("{s}: {}", text.lines().last().unwrap_or(""))),
        None => Err(format!("gave no answer within {} s", timeout.as_secs())),
    }
}

/// Writes a hung rank's report ([`RunDir::hang_report`]); returns its path. Written twice: at once
/// with what the driver knows, then again with the native stack, which takes gdb seconds.
pub(super) fn write_report(
    run_dir: &RunDir,
    attempt: u32,
    hung: &Hung,
    tail: &[String],
    stack: &str,
) -> std::path::PathBuf {
    let path = run_dir.hang_report(attempt, hung.rank);
    let dir = run_dir.hangs();
    let report = format!(
        "rank {} {}\n\nlast lines of rank {}:\n{}\n\nnative stack:\n{stack}\n",
        hung.rank,
        hung.describe(),
        hung.rank,
        tail.iter()
            .map(|l| format!("  {l}"))
            .collect::<Vec<_>>()
            .join("\n"),
    );
    let written = std::fs::create_dir_all(&dir)
        .map_err(anyhow::Error::from)
        .and_then(|_| crate::shared::checkpoint::write_atomic(&path, report.as_bytes()));
    if let Err(e) = written {
        eprintln!("trainbook: could not write {}: {e:#}", path.display());
    }
    path
}

#[cfg(test)]
mod tests {
    use super::*;

    fn secs(s: u64) -> Duration {
        Duration::from_secs(s)
    }

    #[test]
    fn a_rank_is_not_watched_before_its_first_step() {
        let t0 = Instant::now();
        let mut h = Hangs::new(2, 10);
        h.beat(0, 0, 0, false, t0);
        h.beat(0, 0, 0, true, t0 + secs(1));
        assert_eq!(h.hung(t0 + secs(1000)), None);
    }

    #[test]
    fn a_silent_rank_is_blamed_before_the_peers_blocked_on_it() {
        let t0 = Instant::now();
        let mut h = Hangs::new(2, 10);
        for s in 1..=5 {
            h.beat(0, s, s, false, t0 + secs(s));
            h.beat(1, s, s, false, t0 + secs(s));
        }
        // Rank 1 stops beating; rank 0 beats on, stuck at step 6 waiting for it.
        h.beat(0, 6, 6, false, t0 + secs(6));
        for t in 7..=20 {
            h.beat(0, 6, 6, false, t0 + secs(t));
        }
        assert_eq!(h.hung(t0 + secs(15)), None, "within the limit");
        let hung = h.hung(t0 + secs(17)).expect("rank 1 is past its limit");
        assert_eq!((hung.rank, hung.step, hung.silent), (1, 5, true));
        assert_eq!(hung.limit, secs(10));
        assert!(hung.describe().contains("at step 5"), "{}", hung.describe());
    }

    #[test]
    fn a_slow_first_step_stands_in_for_the_slowest_until_a_step_is_timed() {
        let t0 = Instant::now();
        let mut h = Hangs::new(1, 10);
        h.beat(0, 0, 0, false, t0);
        // The first step, start-up included, took 30 s: the second may take 5 times that.
        h.beat(0, 1, 1, false, t0 + secs(30));
        assert_eq!(h.hung(t0 + secs(30 + 60)), None, "within 5 x 30 s");
        let hung = h.hung(t0 + secs(30 + 151)).expect("past 150 s");
        assert_eq!(hung.limit, secs(150));
        // Once a step is timed (1 s), its time counts instead: the limit is the timeout again.
        let mut h = Hangs::new(1, 10);
        h.beat(0, 0, 0, false, t0);
        h.beat(0, 1, 1, false, t0 + secs(30));
        h.beat(0, 2, 2, false, t0 + secs(31));
        let hung = h.hung(t0 + secs(31 + 11)).expect("past 10 s");
        assert_eq!(hung.limit, secs(10));
    }

    #[test]
    fn a_silent_rank_with_a_higher_limit_is_blamed_when_a_peer_passes_its_own() {
        let t0 = Instant::now();
        let mut h = Hangs::new(2, 3);
        // Rank 1 once waited 1 s for a step (its limit is 5 s); rank 0's steps were quick.
        h.beat(0, 1, 1, false, t0);
        h.beat(1, 1, 1, false, t0);
        h.beat(0, 2, 2, false, t0 + Duration::from_millis(100));
        h.beat(1, 2, 2, false, t0 + secs(1));
        // Rank 1 stops; rank 0 beats on, blocked at step 2.
        for t in 2..=10 {
            h.beat(0, 2, 2, false, t0 + secs(t));
        }
        let hung = h
            .hung(t0 + Duration::from_millis(4500))
            .expect("rank 0 is past its 3 s");
        assert_eq!((hung.rank, hung.silent), (1, true), "{hung:?}");
        assert_eq!(hung.limit, secs(5));
    }

    #[test]
    fn a_rank_stopped_before_its_first_step_was_heard_is_blamed_too() {
        let t0 = Instant::now();
        let mut h = Hangs::new(2, 3);
        // Rank 1 was heard once, before its first step; then stopped.
        h.beat(1, 0, 0, false, t0);
        h.beat(0, 0, 0, false, t0);
        for t in 1..=10 {
            h.beat(0, 40, 40, false, t0 + secs(t));
        }
        assert_eq!(
            h.hung(t0 + Duration::from_millis(3500)),
            None,
            "rank 0 is within its limit"
        );
        let hung = h
            .hung(t0 + Duration::from_millis(4500))
            .expect("rank 0 is past its limit");
        assert_eq!((hung.rank, hung.silent), (1, true), "{hung:?}");
    }

    #[test]
    fn busy_phases_count_as_progress_and_slow_steps_raise_the_limit() {
        let t0 = Instant::now();
        let mut h = Hangs::new(1, 10);
        h.beat(0, 1, 1, false, t0);
        // Steps of 20 s each: the limit becomes 5 x 20 s.
        h.beat(0, 2, 2, false, t0 + secs(20));
        assert_eq!(h.hung(t0 + secs(20) + secs(99)), None);
        assert!(h.hung(t0 + secs(20) + secs(101)).is_some());
        // A checkpoint write that keeps saying "busy" is not a hang.
        let mut h = Hangs::new(1, 10);
        h.beat(0, 1, 1, false, t0);
        for t in 1..=60 {
            h.beat(0, 1, 1, true, t0 + secs(t));
        }
        assert_eq!(h.hung(t0 + secs(65)), None);
        assert!(h.hung(t0 + secs(71)).is_some());
        // Nor is an evaluation whose batches go on; one that stops is.
        let mut h = Hangs::new(1, 10);
        h.beat(0, 1, 1, false, t0);
        for t in 1..=30 {
            h.beat(0, 1, 1 + t, false, t0 + secs(t));
        }
        for t in 31..=60 {
            h.beat(0, 1, 31, false, t0 + secs(t));
        }
        assert_eq!(h.hung(t0 + secs(40)), None);
        let hung = h
            .hung(t0 + secs(41))
            .expect("a stalled evaluation is a hang");
        assert!(!hung.silent);
    }

    #[test]
    fn blocked_ranks_alive_blame_the_one_furthest_behind() {
        let t0 = Instant::now();
        let mut h = Hangs::new(3, 5);
        h.beat(0, 8, 8, false, t0);
        h.beat(1, 7, 7, false, t0);
        h.beat(2, 8, 8, false, t0);
        for r in 0..3 {
            h.beat(r, 0, 0, false, t0 + secs(9));
        }
        let hung = h.hung(t0 + secs(10)).unwrap();
        assert_eq!((hung.rank, hung.silent), (1, false));
        h.reset();
        assert_eq!(h.hung(t0 + secs(100)), None);
        assert_eq!(h.step_of(1), None);
    }

    #[test]
    fn a_rank_done_and_not_gone_a_hang_limit_later_is_stuck_in_its_teardown() {
        let t0 = Instant::now();
        let mut h = Hangs::new(3, 10);
        h.beat(0, 5, 5, false, t0);
        h.finished(0, t0);
        h.finished(2, t0 + secs(4));
        h.finished(0, t0 + secs(8));
        assert!(h.stuck_after_done(t0 + secs(9)).is_empty());
        assert_eq!(
            h.stuck_after_done(t0 + secs(10)),
            vec![0],
            "the first `done` counts"
        );
        assert_eq!(h.stuck_after_done(t0 + secs(14)), vec![0, 2]);
        assert_eq!(
            h.hung(t0 + secs(60)),
            None,
            "a rank that is done is not hung"
        );
        h.reset();
        assert!(h.stuck_after_done(t0 + secs(60)).is_empty());
        assert!(
            Hangs::new(1, 0).stuck_after_done(t0).is_empty(),
            "off with hang detection"
        );
    }

    #[test]
    fn hang_detection_can_be_turned_off() {
        let t0 = Instant::now();
        let mut h = Hangs::new(1, 0);
        h.beat(0, 1, 1, false, t0);
        assert_eq!(h.hung(t0 + secs(10_000)), None);
    }

    fn sig(rank: usize, step: u64, message: Option<&str>) -> Signature {
        Signature {
            rank,
            step: Some(step),
            message: message.map(String::from),
        }
    }

    #[test]
    fn no_restart_unless_asked() {
        let mut p = Policy::new(0);
        assert_eq!(p.decide(sig(1, 3, None)), Decision::GiveUp(String::new()));
    }

    #[test]
    fn restarts_are_bounded_by_max_failures() {
        let mut p = Policy::new(1);
        assert_eq!(p.decide(sig(1, 25, None)), Decision::Restart);
        let Decision::GiveUp(why) = p.decide(sig(1, 31, None)) else {
            panic!("a second failure with max_failures 1 restarts")
        };
        assert!(why.contains("already restarted 1 time"), "{why}");
        let mut unlimited = Policy::new(-1);
        for s in 0..100 {
            assert_eq!(unlimited.decide(sig(0, s, None)), Decision::Restart);
        }
        assert_eq!(unlimited.allowed(), None);
        assert_eq!(unlimited.used(), 100);
    }

    #[test]
    fn the_same_error_at_the_same_step_twice_is_not_retried() {
        let mut p = Policy::new(3);
        assert_eq!(p.decide(sig(0, 7, Some("bad batch"))), Decision::Restart);
        let Decision::GiveUp(why) = p.decide(sig(0, 7, Some("bad batch"))) else {
            panic!("a deterministic error was retried")
        };
        assert!(why.contains("same error at step 7"), "{why}");
        // Another step or another message is another failure.
        let mut p = Policy::new(-1);
        assert_eq!(p.decide(sig(0, 7, Some("e"))), Decision::Restart);
        assert_eq!(p.decide(sig(0, 9, Some("e"))), Decision::Restart);
        assert_eq!(p.decide(sig(0, 9, Some("f"))), Decision::Restart);
        assert_eq!(p.decide(sig(0, 9, Some("e"))), Decision::Restart);
        assert!(
            matches!(p.decide(sig(1, 9, Some("e"))), Decision::GiveUp(_)),
            "the same error at the same step on another rank is the same failure"
        );
        // Two kills at the same step are two kills.
        let mut p = Policy::new(3);
        assert_eq!(p.decide(sig(1, 5, None)), Decision::Restart);
        assert_eq!(p.decide(sig(1, 5, None)), Decision::Restart);
    }

    #[test]
    fn a_stopped_process_has_a_native_stack_in_its_report() {
        let mut child = Command::new("sleep").arg("30").spawn().unwrap();
        let pid = child.id();
        nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(pid as i32),
            nix::sys::signal::Signal::SIGSTOP,
        )
        .unwrap();
        let stack = native_stack(pid);
        let _ = child.kill();
        let _ = child.wait();
        let have_tool = ["gdb", "eu-stack"].iter().any(|t| {
            Command::new(t)
                .arg("--version")
                .stdout(Stdio::null())
                .status()
                .is_ok()
        });
        if have_tool {
            assert!(stack.contains("#0") || stack.contains("TID"), "{stack}");
        } else {
            assert!(stack.contains("install elfutils"), "{stack}");
        }
        let dir = std::env::temp_dir().join(format!("trainbook-hang-{}", std::process::id()));
        let hung = Hung {
            rank: 1,
            step: 25,
            still: secs(12),
            limit: secs(10),
            silent: true,
        };
        let path = write_report(&RunDir::new(&dir), 0, &hung, &["step 25".into()], &stack);
        let report = std::fs::read_to_string(&path).unwrap();
        assert!(
            report.starts_with(
                "rank 1 hung: no progress for 12 s (limit 10 s), last heard at step 25"
            ),
            "{report}"
        );
        assert!(report.contains("  step 25") && report.contains("native stack:"));
        std::fs::remove_dir_all(&dir).ok();
    }
}
