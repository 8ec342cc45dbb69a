//! Node 0 of an elastic job (`--nnodes MIN:MAX`): which nodes a start runs on. After a
//! failure, the nodes still heard from (a node silent for [`NODE_LOST_AFTER`] is gone); while
//! the workers run, more nodes once others have joined, at the next checkpoint. Either way the
//! count is one the job's global batch splits evenly over (`JobSpec::node_counts`).

use std::time::{Duration, Instant};

use trainbook_api::Stream;

use super::recovery::{Recovery, NODE_ALIVE_EVERY, NODE_LOST_AFTER};
use crate::driver::fold::Fold;
use crate::driver::membership;

/// How often node 0 looks for nodes that joined while the workers run.
const GROW_CHECK_EVERY: Duration = Duration::from_millis(500);

/// A larger start node 0 is waiting to make: its nodes, and the checkpoints the run had when
/// it was decided (the next one is the boundary it grows at).
pub(super) struct Growth {
    nodes: Vec<usize>,
    checkpoints: usize,
}

impl Recovery {
    /// Node 0 of an elastic job, while its workers run: whether to stop them now to start on
    /// more nodes (`self.growing` says which). A node that joined is taken at the first
    /// checkpoint after it was heard, so the workers of the larger start lose no step that
    /// a checkpoint did not keep.
    pub(super) fn grow_now(&mut self, fold: &mut Fold) -> bool {
        let job = fold.job;
        if !job.spec.is_elastic() || fold.joined || self.grow_checked.elapsed() < GROW_CHECK_EVERY {
            return false;
        }
        self.grow_checked = Instant::now();
        let (current, checkpoints) = {
            let st = job.lock();
            // A checkpoint at the last step ends the training: nothing is left to grow for.
            let training = st.progress.as_ref().is_none_or(|p| p.step < p.total_steps);
            if st.failure.is_some() || !training {
                return false;
            }
            (st.membership.nodes().to_vec(), st.checkpoints.len())
        };
        let mut available = current.clone();
        available.extend(self.heard_within(NODE_LOST_AFTER));
        let larger = membership::choose(&available, &job.node_counts)
            .filter(|nodes| nodes.len() > current.len());
        let Some(nodes) = larger else {
            // The node that joined went again before the checkpoint.
            self.growth = None;
            return false;
        };
        match &self.growth {
            Some(g) if g.nodes == nodes && checkpoints > g.checkpoints => {
                self.growth = None;
                self.growing = Some(nodes);
                true
            }
            Some(g) if g.nodes == nodes => false,
            _ => {
                let joined: Vec<usize> = nodes
                    .iter()
                    .copied()
                    .filter(|n| !current.contains(n))
                    .collect();
                let note = format!(
                    "node {} joined: the job grows to {} nodes at its next checkpoint",
                    membership::list(&joined),
                    nodes.len()
                );
                fold.line(0, Stream::Stderr, note);
                self.growth = Some(Growth { nodes, checkpoints });
                false
            }
        }
    }

    /// Node 0 of an elastic job, after a failure: the nodes the next start runs on, from
    /// those still heard from; empty (every node) for a job of fixed size. Fewer than the job
    /// needs: the nodes of the start that failed, so that it waits for the lost ones to come
    /// back as a job of fixed size does.
    pub(super) fn nodes_after_failure(&mut self, fold: &mut Fold) -> Vec<usize> {
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
        loop {
            let undecided = self
                .nodes_heard
                .iter()
                .skip(1)
                .flatten()
                .any(|t| *t < since && t.elapsed() <= NODE_LOST_AFTER);
            if !undecided || Instant::now() >= deadline {
                let mut alive = vec![0];
                alive.extend(
                    self.nodes_heard
                        .iter()
                        .enumerate()
                        .skip(1)
                        .filter(|(_, t)| t.is_some_and(|t| t >= since))
                        .map(|(k, _)| k),
                );
                return alive;
            }
            self.receive(fold, Duration::from_millis(50));
        }
    }

    /// The nodes other than 0 heard from within `within`.
    fn heard_within(&self, within: Duration) -> Vec<usize> {
        self.nodes_heard
            .iter()
            .enumerate()
            .skip(1)
            .filter(|(_, t)| t.is_some_and(|t| t.elapsed() <= within))
            .map(|(k, _)| k)
            .collect()
    }
}
