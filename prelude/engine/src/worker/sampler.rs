//! Which samples each rank sees.
//!
//! Training shards come from one permutation per epoch, a function of `seed + epoch` alone, so
//! every worker count sees the same global order: rank `r` takes positions `r, r + W, r + 2W, ...`.
//! With a per-rank batch of `B / W`, global step `i` therefore covers exactly the positions
//! `i*B .. (i+1)*B` of the permutation — the batch a single worker with batch `B` would see.
//!
//! The permutation is never materialised: position `p` maps to its sample through a keyed
//! Feistel network over the next power of four (cycle-walking back into `0..len`), so a corpus
//! of 10^8 blocks costs no 800 MB index list per worker and each rank computes only its own
//! positions (its shard, `len / W` indices).
//!
//! Every position of an epoch is trained, whatever `W`: rank `r` takes the positions below
//! `len` that are `r` modulo `W`, so the shards of an epoch's last step may differ by one
//! sample (a rank may even have none). The trainer weights each rank's gradient by its share
//! of the step's samples and lets a rank without any take part with a weightless sample, so
//! the last step too is one worker's. Dropping the `len % W` tail, the usual choice, would make
//! an epoch's last step depend on the number of workers, and a job that changes its size (an
//! elastic job) would train other samples than one that does not. Padding, the other usual
//! choice, would make some samples count twice. Evaluation shards are not trimmed: every sample is evaluated exactly once, and shards may
//! differ in size by one (metrics are all-reduced as sums, so that is exact).

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

    /// This rank's samples per epoch (ranks below `len % W` have one more).
    pub(crate) fn shard_len(&self) -> usize {
        self.len.saturating_sub(self.rank).div_ceil(self.world_size)
    }

    /// Samples per epoch over all ranks.
    pub(crate) fn len(&self) -> usize {
        self.len
    }

    /// The sample at each position of an epoch's global order (before sharding).
    pub(crate) fn permutation(&self, epoch: usize) -> Permutation {
        if self.shuffle {
            Permutation::new(self.len, self.seed.wrapping_add(epoch as u64))
        } else {
            Permutation::identity(self.len)
        }
    }

    /// This rank's sample indices for `epoch`, in the order to train on them.
    pub(crate) fn indices(&self, epoch: usize) -> Vec<usize> {
        let perm = self.permutation(epoch);
        (0..self.shard_len())
            .map(|k| perm.at(self.rank + k * self.world_size))
            .collect()
    }
}

/// A pseudo-random permutation of `0..len`, evaluated one position at a time in O(1) memory: a
/// 6-round Feistel network on `2 * half` bits (the smallest even width holding `len`), keyed by
/// the seed; outputs past `len` are encrypted again until they fall inside (cycle-walking, under
/// 4 rounds on average since the domain is less than 4 x len).
#[derive(Clone, Debug)]
pub(crate) struct Permutation {
    len: usize,
    half: u32,
    keys: Option<[u64; 6]>,
}

impl Permutation {
    pub(crate) fn new(len: usize, seed: u64) -> Self {
        let bits = usize::BITS - len.saturating_sub(1).leading_zeros();
        let half = bits.div_ceil(2).max(1);
        let mut state = seed ^ 0x5851_f42d_4c95_7f2d;
        let keys = std::array::from_fn(|_| {
            state = mix(state);
            state
        });
        Permutation {
            len,
            half,
            keys: Some(keys),
        }
    }

    pub(crate) fn identity(len: usize) -> Self {
        Permutation {
            len,
            half: 1,
            keys: None,
        }
    }

    /// The sample at position `pos` (`pos < len`).
    pub(crate) fn at(&self, pos: usize) -> usize {
        debug_assert!(pos < self.len);
        let Some(keys) = &self.keys else { return pos };
        let mut x = pos as u64;
        loop {
            x = self.encrypt(x, keys);
            if x < self.len as u64 {
                return x as usize;
            }
        }
    }

    fn encrypt(&self, x: u64, keys: &[u64; 6]) -> u64 {
        let mask = (1u64 << self.half) - 1;
        let (mut left, mut right) = (x >> self.half, x & mask);
        for k in keys {
            let f = mix(right ^ k) & mask;
            (left, right) = (right, left ^ f);
        }
        (left << self.half) | right
    }
}

/// SplitMix64's finaliser: a well-mixed 64-bit hash.
fn mix(x: u64) -> u64 {
    let mut z = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
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
    fn shards_are_disjoint_and_cover_the_whole_epoch() {
        let (len, world) = (103, 4);
        let shards: Vec<Vec<usize>> = (0..world)
            .map(|r| DistributedSampler::new(len, r, world, 7, true).indices(3))
            .collect();
        let sizes: Vec<usize> = shards.iter().map(Vec::len).collect();
        assert_eq!(sizes, [26, 26, 26, 25]);
        let all: HashSet<usize> = shards.iter().flatten().copied().collect();
        assert_eq!(all.len(), len, "disjoint, every sample");
        let perm = DistributedSampler::new(len, 0, world, 7, true).permutation(3);
        assert_eq!(shards[1][25], perm.at(101));
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
        // with batch B, for W = 2 and 4: the basis of the data-parallel equivalence test, and
        // why a job restarted on fewer or more workers reads the same global batches.
        // The epoch's last step (66 = 5 x 12 + 6) as well: 6 samples over 4 workers are
        // 2, 2, 1, 1; over 3 workers 2 each.
        let (len, global_b) = (66, 12);
        let one = DistributedSampler::new(len, 0, 1, 3, true).indices(0);
        for world in [2, 3, 4] {
            let shards: Vec<Vec<usize>> = (0..world)
                .map(|r| DistributedSampler::new(len, r, world, 3, true).indices(0))
                .collect();
            for step in 0..len.div_ceil(global_b) {
                let end = ((step + 1) * global_b).min(len);
                let mut expect: Vec<usize> = one[step * global_b..end].to_vec();
                let local = global_b / world;
                let mut got: Vec<usize> = shards
                    .iter()
                    .flat_map(|s| {
                        s[(step * local).min(s.len())..((step + 1) * local).min(s.len())]
                            .iter()
                            .copied()
                    })
                    .collect();
                expect.sort();
                got.sort();
                assert_eq!(expect, got, "{world} workers, step {step}");
            }
        }
    }

    /// Every position maps to a distinct sample, for lengths around powers of two and odd
    /// ones; the order depends on the seed and looks shuffled (few fixed points, both halves
    /// mixed early).
    #[test]
    fn the_permutation_is_a_bijection_and_shuffles() {
        for len in [1, 2, 3, 4, 5, 7, 8, 9, 63, 64, 65, 1000, 4097, 100_003] {
            let p = Permutation::new(len, 42);
            let mut seen = vec![false; len];
            for pos in 0..len {
                let s = p.at(pos);
                assert!(!seen[s], "len {len}: {s} twice");
                seen[s] = true;
            }
        }
        let (a, b) = (Permutation::new(10_000, 1), Permutation::new(10_000, 2));
        let fixed = (0..10_000).filter(|&i| a.at(i) == i).count();
        assert!(fixed < 20, "{fixed} fixed points");
        assert!(
            (0..100).any(|i| a.at(i) != b.at(i)),
            "another seed, another order"
        );
        let early_high = (0..100).filter(|&i| a.at(i) >= 5_000).count();
        assert!(
            (30..=70).contains(&early_high),
            "{early_high} of the first 100 from the upper half"
        );
        // A large corpus: positions are computed, nothing of its length is allocated.
        let big = Permutation::new(3_000_000_000, 7);
        assert!(big.at(2_999_999_999) < 3_000_000_000);
    }

    #[test]
    fn eval_shards_cover_everything_once() {
        let mut all: Vec<usize> = (0..3).flat_map(|r| eval_shard(10, r, 3)).collect();
        all.sort();
        assert_eq!(all, (0..10).collect::<Vec<_>>());
    }
}
