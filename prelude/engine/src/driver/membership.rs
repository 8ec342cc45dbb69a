//! Which nodes a start of the job runs on, and the global ranks each of them gets. A job of a
//! fixed size runs every start on all its nodes; an elastic one (`--nnodes MIN:MAX`) on the
//! nodes node 0 chose for that start: the nodes are numbered by their place in the list, so
//! ranks stay contiguous (c10d wants 0..W) whichever nodes are gone.

use std::ops::Range;

/// The nodes of one start, in rank order, and the workers each runs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Membership {
    nodes: Vec<usize>,
    workers: usize,
}

impl Membership {
    /// `nodes` (node ids, `--node-rank`) in rank order; empty means every one of `all`.
    pub(crate) fn new(nodes: &[usize], all: usize, workers: usize) -> Membership {
        let nodes = if nodes.is_empty() {
            (0..all.max(1)).collect()
        } else {
            nodes.to_vec()
        };
        Membership { nodes, workers }
    }

    pub(crate) fn nodes(&self) -> &[usize] {
        &self.nodes
    }

    /// Workers over the start's nodes.
    pub(crate) fn world(&self) -> usize {
        self.nodes.len() * self.workers
    }

    /// Whether `node` runs workers in this start.
    pub(crate) fn contains(&self, node: usize) -> bool {
        self.nodes.contains(&node)
    }

    /// The place of `node` among the start's nodes (its `GROUP_RANK`), if it is one of them.
    pub(crate) fn place(&self, node: usize) -> Option<usize> {
        self.nodes.iter().position(|&n| n == node)
    }

    /// The global ranks of `node`'s workers in this start.
    pub(crate) fn ranks(&self, node: usize) -> Option<Range<usize>> {
        let first = self.place(node)? * self.workers;
        Some(first..first + self.workers)
    }

    /// The node that runs `rank` in this start.
    pub(crate) fn node_of(&self, rank: usize) -> Option<usize> {
        self.nodes.get(rank / self.workers.max(1)).copied()
    }
}

/// The nodes the next start runs on: the most of `available` (node 0 first, then by id) that
/// is one of the job's allowed `counts` (the sizes that split the global batch evenly; see
/// `JobSpec::node_counts`). `None`: fewer nodes are available than the smallest count.
pub(crate) fn choose(available: &[usize], counts: &[usize]) -> Option<Vec<usize>> {
    let mut nodes = available.to_vec();
    nodes.sort_unstable();
    nodes.dedup();
    let n = counts.iter().copied().filter(|&c| c <= nodes.len()).max()?;
    nodes.truncate(n);
    Some(nodes)
}

/// `0, 1, 3` for a list of nodes.
pub(crate) fn list(nodes: &[usize]) -> String {
    nodes
        .iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join(", ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranks_follow_the_place_of_a_node_among_the_start_s_nodes() {
        // Node 1 lost: node 2 and 3 move down, so ranks stay 0..6.
        let m = Membership::new(&[0, 2, 3], 4, 2);
        assert_eq!(m.world(), 6);
        assert_eq!(m.ranks(0), Some(0..2));
        assert_eq!(m.ranks(2), Some(2..4));
        assert_eq!(m.ranks(3), Some(4..6));
        assert_eq!(m.ranks(1), None);
        assert_eq!(m.place(3), Some(2));
        assert_eq!(m.node_of(5), Some(3));
        assert_eq!(m.node_of(6), None);
        assert!(!m.contains(1));
        // A job of fixed size: every node, in order.
        let all = Membership::new(&[], 3, 2);
        assert_eq!(all.nodes(), [0, 1, 2]);
        assert_eq!(all.ranks(2), Some(4..6));
    }

    #[test]
    fn the_start_takes_the_most_available_nodes_of_an_allowed_size() {
        let counts = [2, 3, 4];
        assert_eq!(choose(&[0, 1, 2, 3], &counts), Some(vec![0, 1, 2, 3]));
        assert_eq!(choose(&[2, 0, 1], &counts), Some(vec![0, 1, 2]));
        assert_eq!(choose(&[0], &counts), None);
        // A global batch of 16 over 2 workers a node splits on 1, 2, 4 or 8 nodes: with 6
        // available the job runs on 4 and keeps 2 waiting.
        assert_eq!(
            choose(&[0, 1, 2, 3, 5, 6], &[1, 2, 4, 8]),
            Some(vec![0, 1, 2, 3])
        );
        assert_eq!(list(&[0, 1, 3]), "0, 1, 3");
    }
}
