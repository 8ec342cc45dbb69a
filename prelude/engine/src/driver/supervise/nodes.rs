//! Node liveness in a job of several nodes: every other node's driver says it is alive about
//! once a second ([`NODE_ALIVE_EVERY`]); node 0 counts a node silent for [`NODE_LOST_AFTER`]
//! as lost. Time is a parameter, so the rules are tested without waiting.

use std::time::{Duration, Instant};

/// How often another node's driver says it is alive, and the silence that means it is lost.
pub(super) const NODE_ALIVE_EVERY: Duration = Duration::from_secs(1);
pub(super) const NODE_LOST_AFTER: Duration = Duration::from_millis(2000);

/// When each node's driver was last heard (node 0), or last said it was alive (other nodes:
/// their own entry).
pub(super) struct NodeWatch {
    heard: Vec<Option<Instant>>,
}

impl NodeWatch {
    pub(super) fn new(nodes: usize) -> NodeWatch {
        NodeWatch {
            heard: vec![None; nodes],
        }
    }

    /// `node`'s driver was heard at `now`.
    pub(super) fn heard(&mut self, node: usize, now: Instant) {
        if let Some(h) = self.heard.get_mut(node) {
            *h = Some(now);
        }
    }

    /// Other nodes: whether this node (`node`) is due to say it is alive at `now`; if so, it
    /// counts as said.
    pub(super) fn alive_due(&mut self, node: usize, now: Instant) -> bool {
        let Some(last) = self.heard.get_mut(node) else {
            return false;
        };
        let due = last.is_none_or(|t| now.saturating_duration_since(t) >= NODE_ALIVE_EVERY);
        if due {
            *last = Some(now);
        }
        due
    }

    /// A node (other than 0) heard before but not for [`NODE_LOST_AFTER`] at `now`, with how
    /// long it has been silent.
    pub(super) fn lost(&self, now: Instant) -> Option<(usize, Duration)> {
        self.others()
            .filter_map(|(n, h)| Some((n, now.saturating_duration_since(h?))))
            .find(|(_, silent)| *silent > NODE_LOST_AFTER)
    }

    /// The nodes other than 0 heard within `within` before `now`.
    pub(super) fn heard_within(&self, within: Duration, now: Instant) -> Vec<usize> {
        self.others()
            .filter(|(_, t)| t.is_some_and(|t| now.saturating_duration_since(t) <= within))
            .map(|(k, _)| k)
            .collect()
    }

    /// Whether some node heard before `since` may still speak again at `now` (it was heard
    /// within [`NODE_LOST_AFTER`]): the question "is it alive" has no answer yet.
    pub(super) fn undecided(&self, since: Instant, now: Instant) -> bool {
        self.others().any(|(_, t)| {
            t.is_some_and(|t| t < since && now.saturating_duration_since(t) <= NODE_LOST_AFTER)
        })
    }

    /// Node 0 and the nodes heard from at or after `since`.
    pub(super) fn alive_since(&self, since: Instant) -> Vec<usize> {
        let mut alive = vec![0];
        alive.extend(
            self.others()
                .filter(|(_, t)| t.is_some_and(|t| t >= since))
                .map(|(k, _)| k),
        );
        alive
    }

    fn others(&self) -> impl Iterator<Item = (usize, Option<Instant>)> + '_ {
        self.heard.iter().copied().enumerate().skip(1)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(m: u64) -> Duration {
        Duration::from_millis(m)
    }

    #[test]
    fn a_node_heard_before_and_silent_past_the_limit_is_lost() {
        let t0 = Instant::now();
        let mut w = NodeWatch::new(3);
        assert_eq!(w.lost(t0 + ms(10_000)), None, "never heard: not lost");
        w.heard(1, t0);
        w.heard(2, t0 + ms(1500));
        assert_eq!(w.lost(t0 + ms(1900)), None);
        assert_eq!(w.lost(t0 + ms(2500)), Some((1, ms(2500))));
        assert_eq!(w.heard_within(ms(1000), t0 + ms(2500)), vec![2]);
    }

    #[test]
    fn a_node_says_it_is_alive_once_a_second() {
        let t0 = Instant::now();
        let mut w = NodeWatch::new(2);
        assert!(w.alive_due(1, t0));
        assert!(!w.alive_due(1, t0 + ms(500)));
        assert!(w.alive_due(1, t0 + ms(1000)));
        assert!(!w.alive_due(5, t0), "not a node of the job");
    }

    #[test]
    fn alive_nodes_are_those_heard_since_and_undecided_ones_are_waited_for() {
        let t0 = Instant::now();
        let mut w = NodeWatch::new(4);
        w.heard(1, t0);
        w.heard(2, t0);
        let since = t0 + ms(100);
        assert!(w.undecided(since, since));
        w.heard(1, t0 + ms(600));
        assert!(w.undecided(since, t0 + ms(700)), "node 2 may still speak");
        assert!(
            !w.undecided(since, t0 + ms(2200)),
            "node 2 is silent too long"
        );
        assert_eq!(w.alive_since(since), vec![0, 1]);
    }
}
