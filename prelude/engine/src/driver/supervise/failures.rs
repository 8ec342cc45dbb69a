//! What failed in the current start of the workers: the ranks that reported errors (in the
//! order their reports arrived, and at which step), the failed workers other nodes reported,
//! and the cause the restart decision is made on. The job's error itself is recorded once, by
//! [`crate::driver::handle::State::fail_once`].

use super::rules::Signature;
use crate::driver::processes::Exit;

/// The failure reports of one start; [`Failures::forget`] starts them afresh.
pub(super) struct Failures {
    /// Failed workers of other nodes, as their drivers reported them (node 0).
    remote_exits: Vec<Exit>,
    /// The steps each rank had taken when it reported an error.
    error_steps: Vec<Option<u64>>,
    /// The ranks that reported an error, in the order their reports arrived: the first is the
    /// likely cause when several fail (its peers fail because it did).
    error_order: Vec<usize>,
    /// What failed, for the restart decision and its record.
    cause: Option<(Signature, String)>,
}

impl Failures {
    pub(super) fn new(world: usize) -> Failures {
        Failures {
            remote_exits: Vec::new(),
            error_steps: vec![None; world],
            error_order: Vec::new(),
            cause: None,
        }
    }

    /// `rank` reported an error at `step`.
    pub(super) fn error(&mut self, rank: usize, step: Option<u64>) {
        if let Some(slot) = self.error_steps.get_mut(rank) {
            *slot = step;
        }
        if !self.error_order.contains(&rank) {
            self.error_order.push(rank);
        }
    }

    /// The step `rank` had taken when it reported its error.
    pub(super) fn error_step(&self, rank: usize) -> Option<u64> {
        self.error_steps.get(rank).copied().flatten()
    }

    /// Another node's driver reported a failed worker.
    pub(super) fn remote(&mut self, exit: Exit) {
        self.remote_exits.push(exit);
    }

    pub(super) fn has_remote(&self) -> bool {
        !self.remote_exits.is_empty()
    }

    pub(super) fn first_remote(&self) -> Option<&Exit> {
        self.remote_exits.first()
    }

    /// The other nodes' reports not yet taken.
    pub(super) fn take_remote(&mut self) -> Vec<Exit> {
        std::mem::take(&mut self.remote_exits)
    }

    /// The failed worker to blame when several exit at once: one that died by a signal (its
    /// peers then fail with "connection closed" errors moments later), else the one whose
    /// error report came first (a peer fails only after the cause, however late the exits are
    /// polled), else the lowest rank.
    pub(super) fn root_cause<'e>(&self, failed: &'e [Exit]) -> Option<&'e Exit> {
        let reported = |rank: usize| {
            self.error_order
                .iter()
                .position(|&r| r == rank)
                .unwrap_or(usize::MAX)
        };
        failed
            .iter()
            .min_by_key(|e| (e.signal.is_none(), reported(e.rank), e.rank))
    }

    /// What failed this start, described (`reason`) for the restart's record.
    pub(super) fn set_cause(&mut self, signature: Signature, reason: String) {
        self.cause = Some((signature, reason));
    }

    pub(super) fn take_cause(&mut self) -> Option<(Signature, String)> {
        self.cause.take()
    }

    /// A new start: nothing has failed yet.
    pub(super) fn forget(&mut self) {
        self.error_steps.iter_mut().for_each(|s| *s = None);
        self.error_order.clear();
        self.remote_exits.clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn exit(rank: usize, code: Option<i32>, signal: Option<i32>) -> Exit {
        Exit { rank, code, signal }
    }

    fn reported(order: &[usize]) -> Failures {
        let mut f = Failures::new(4);
        for &rank in order {
            f.error(rank, None);
        }
        f
    }

    #[test]
    fn the_root_cause_is_a_signal_death_else_the_first_to_report_else_the_lowest_rank() {
        let peers_then_killed = [
            exit(0, Some(1), None),
            exit(3, None, Some(9)),
            exit(1, Some(1), None),
        ];
        let cause = |f: &Failures, failed| f.root_cause(failed).map(|e: &Exit| e.rank);
        assert_eq!(cause(&reported(&[]), &peers_then_killed), Some(3));
        assert_eq!(cause(&reported(&[1, 0]), &peers_then_killed), Some(3));
        let plain = [exit(2, Some(1), None), exit(1, Some(1), None)];
        assert_eq!(cause(&reported(&[]), &plain), Some(1));
        // Rank 1 failed first; rank 0 failed because of it, and both exits are seen at once.
        let both = [exit(0, Some(1), None), exit(1, Some(1), None)];
        assert_eq!(cause(&reported(&[1, 0]), &both), Some(1));
        // A rank that reported nothing comes after those that did.
        assert_eq!(cause(&reported(&[1]), &both), Some(1));
        assert_eq!(cause(&reported(&[]), &[]), None);
    }

    #[test]
    fn error_reports_keep_their_first_order_and_are_forgotten_with_the_start() {
        let mut f = Failures::new(3);
        f.error(2, Some(7));
        f.error(0, None);
        f.error(2, Some(8));
        assert_eq!(f.error_order, vec![2, 0]);
        assert_eq!(f.error_step(2), Some(8));
        f.remote(exit(1, Some(1), None));
        assert!(f.has_remote());
        f.forget();
        assert!(f.error_order.is_empty());
        assert_eq!(f.error_step(2), None);
        assert!(!f.has_remote());
    }
}
