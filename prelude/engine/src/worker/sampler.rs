//! Which samples each rank sees.
//!
//! Training shards come from one permutation per epoch, shuffled with `seed + epoch`, so every
//! worker count sees the same global order: rank `r` takes positions `r, r + W, r + 2W, ...`.
//! With a per-rank batch of `B / W`, global step `i` therefore covers exactly the positions
//! `i*B .. (i+1)*B` of the permutation — the batch a single worker with batch `B` would see.
//!
//! Equal shard sizes are kept by **dropping** the last `len % W` positions of each epoch's
//! permutation (they differ per epoch, so no sample is excluded for good). Padding, the other
//! choice, would make some samples count twice and break the equivalence with one worker.
//! Evaluation shards are not trimmed: every sample is evaluated exactly once, and shards may
//! differ in size by one (metrics are all-reduced as sums, so that is exact).

use rand::seq::SliceRandom;
use rand::SeedableRng;

#[derive(Clone, Debug)]
pub(crate) struct DistributedSampler {
    len: usize,
    rank: usize,
    world_size: usize,
    seed: u64,
    shuffle: bool,
}

impl DistributedSampler {
    pub(crate) fn new(
        len: usize,
        rank: usize,
        world_size: usize,
        seed: u64,
        shuffle: bool,
    ) -> Self {
        assert!(
            world_size > 0 && rank < world_size,
            "rank {rank} outside world of {world_size}"
        );
        Self {
            len,
            rank,
            world_size,
            seed,
            shuffle,
        }
    }

    /// Samples per rank and epoch.
    pub(crate) fn shard_len(&self) -> usize {
        self.len / self.world_size
    }

    /// Global order of an epoch (before sharding).
    pub(crate) fn permutation(&self, epoch: usize) -> Vec<usize> {
        let mut order: Vec<usize> = (0..self.len).collect();
        if self.shuffle {
            let mut rng = rand::rngs::StdRng::seed_from_u64(self.seed.wrapping_add(epoch as u64));
            order.shuffle(&mut rng);
        }
        order
    }

    /// This rank's sample indices for `epoch`, in the order to train on them.
    pub(crate) fn indices(&self, epoch: usize) -> Vec<usize> {
        let keep = self.shard_len() * self.world_size;
        self.permutation(epoch)[..keep]
            .iter()
            .skip(self.rank)
            .step_by(self.world_size)
            .copied()
            .collect()
    }
}

/// Evaluation shard: every index exactly once across ranks, no shuffling, no padding.
pub(crate) fn eval_shard(len: usize, rank: usize, world_size: usize) -> Vec<usize> {
    (rank..len).step_by(world_size.max(1)).collect()
}

/// Batches of a shard; the last one may be short.
pub(crate) fn batches(indices: &[usize], batch_size: usize) -> impl Iterator<Item = &[usize]> {
    indices.chunks(batch_size.max(1))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashSet;

    #[test]
    fn shards_are_disjoint_equal_and_cover_the_trimmed_epoch() {
        let (len, world) = (103, 4);
        let shards: Vec<Vec<usize>> = (0..world)
            .map(|r| DistributedSampler::new(len, r, world, 7, true).indices(3))
            .collect();
        let all: HashSet<usize> = shards.iter().flatten().copied().collect();
        assert!(shards.iter().all(|s| s.len() == 25));
        assert_eq!(all.len(), 100, "disjoint");
        let perm = DistributedSampler::new(len, 0, world, 7, true).permutation(3);
        assert_eq!(all, perm[..100].iter().copied().collect::<HashSet<_>>());
    }

    #[test]
    fn order_depends_on_seed_plus_epoch() {
        let s = DistributedSampler::new(50, 0, 1, 10, true);
        assert_eq!(
            s.indices(2),
            DistributedSampler::new(50, 0, 1, 11, true).indices(1)
        );
        assert_ne!(s.indices(0), s.indices(1));
        assert_eq!(
            DistributedSampler::new(5, 0, 1, 1, false).indices(9),
            vec![0, 1, 2, 3, 4]
        );
    }

    #[test]
    fn global_step_matches_single_worker_batch() {
        // Step i of W workers with batch B/W covers the same samples as step i of one worker
        // with batch B: the basis of the data-parallel equivalence test.
        let (len, world, global_b) = (64, 2, 8);
        let one = DistributedSampler::new(len, 0, 1, 3, true).indices(0);
        let shards: Vec<Vec<usize>> = (0..world)
            .map(|r| DistributedSampler::new(len, r, world, 3, true).indices(0))
            .collect();
        for step in 0..len / global_b {
            let mut expect: Vec<usize> = one[step * global_b..(step + 1) * global_b].to_vec();
            let mut got: Vec<usize> = shards
                .iter()
                .flat_map(|s| {
                    s[step * global_b / world..(step + 1) * global_b / world]
                        .iter()
                        .copied()
                })
                .collect();
            expect.sort();
            got.sort();
            assert_eq!(expect, got, "step {step}");
        }
    }

    #[test]
    fn eval_shards_cover_everything_once() {
        let mut all: Vec<usize> = (0..3).flat_map(|r| eval_shard(10, r, 3)).collect();
        all.sort();
        assert_eq!(all, (0..10).collect::<Vec<_>>());
    }
}
