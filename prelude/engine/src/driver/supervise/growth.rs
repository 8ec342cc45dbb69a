//! Node 0 of an elastic job (`--nnodes MIN:MAX`), while its workers run: more nodes once others
//! have joined, at the next checkpoint. The count is one the job's global batch splits evenly
//! over (`JobSpec::node_counts`). (Which nodes a start after a failure runs on is the
//! restart's business: `restart.rs`.)

use std::time::{Duration, Instant};

use trainbook_api::Stream;

use super::nodes::{NodeWatch, NODE_LOST_AFTER};
use crate::driver::fold::Fold;
use crate::driver::membership;

/// How often node 0 looks for nodes that joined while the workers run.
const GROW_CHECK_EVERY: Duration = Duration::from_millis(500);

/// Node 0's plan to grow an elastic job.
pub(super) struct Growth {
    /// A larger start waiting for the next checkpoint.
    planned: Option<Planned>,
    /// When joined nodes were last looked for.
    checked: Instant,
    /// The nodes of the start to make now (the workers were stopped for it).
    ready: Option<Vec<usize>>,
}

/// A larger start: its nodes, and the checkpoints the run had when it was decided (the next
/// one is the boundary it grows at).
struct Planned {
    nodes: Vec<usize>,
    checkpoints: usize,
}

impl Growth {
    pub(super) fn new() -> Growth {
        Growth {
            planned: None,
            checked: Instant::now(),
            ready: None,
        }
    }

    /// The nodes of a larger start, once the workers have been stopped for it.
    pub(super) fn take_ready(&mut self) -> Option<Vec<usize>> {
        self.ready.take()
    }

    /// Node 0 of an elastic job, while its workers run: whether to stop them now to start on
    /// more nodes ([`Growth::take_ready`] then says which). A node that joined is taken at the
    /// first checkpoint after it was heard, so the workers of the larger start lose no step
    /// that a checkpoint did not keep.
    pub(super) fn due(&mut self, fold: &mut Fold, nodes: &NodeWatch) -> bool {
        let job = fold.job;
        if !job.spec.is_elastic() || fold.joined || self.checked.elapsed() < GROW_CHECK_EVERY {
            return false;
        }
        self.checked = Instant::now();
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
        available.extend(nodes.heard_within(NODE_LOST_AFTER, Instant::now()));
        let larger = membership::choose(&available, &job.node_counts)
            .filter(|nodes| nodes.len() > current.len());
        let Some(nodes) = larger else {
            // The node that joined went again before the checkpoint.
            self.planned = None;
            return false;
        };
        match &self.planned {
            Some(g) if g.nodes == nodes && checkpoints > g.checkpoints => {
                self.planned = None;
                self.ready = Some(nodes);
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
                self.planned = Some(Planned { nodes, checkpoints });
                false
            }
        }
    }
}
