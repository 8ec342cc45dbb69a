//! Masked-LM data: texts grouped into fixed-length blocks, and BERT's masking of them.
//!
//! Grouping follows the reference's `group_texts` (003): every text is tokenized with its
//! special tokens, all ids are concatenated, and the stream is cut into blocks of `block`
//! tokens, the remainder dropped. No padding is ever needed, so no position is wasted.
//!
//! Masking follows BERT and Transformers' `DataCollatorForLanguageModeling`: each
//! non-special token is selected with probability `probability` (0.15); a selected token
//! becomes `[MASK]` 80% of the time, a uniformly random token 10%, and stays itself 10%; the
//! loss is taken at the selected positions only. Masks are drawn afresh each epoch ("dynamic
//! masking"), but from a generator seeded by (seed, epoch, block): the same block gets the
//! same mask whatever the worker count, and a resumed run masks as the straight one did.

use anyhow::{bail, Result};

use crate::models::encoder::IGNORE_INDEX;

/// Cuts the concatenation of `texts` into blocks of `block` ids, dropping the remainder.
pub fn group_texts<I, T>(texts: I, block: usize) -> Vec<Vec<i64>>
where
    I: IntoIterator<Item = T>,
    T: AsRef<[u32]>,
{
    let mut blocks = Vec::new();
    let mut current = Vec::with_capacity(block);
    for ids in texts {
        for &id in ids.as_ref() {
            current.push(id as i64);
            if current.len() == block {
                blocks.push(std::mem::replace(&mut current, Vec::with_capacity(block)));
            }
        }
    }
    blocks
}

/// The chance of selecting a token must be a probability strictly between 0 and 1.
pub fn check_probability(probability: f64) -> Result<()> {
    if !(probability > 0.0 && probability < 1.0) {
        bail!("mlm_probability {probability} must be between 0 and 1 (BERT uses 0.15)");
    }
    Ok(())
}

/// How blocks are masked.
#[derive(Clone, Debug)]
pub struct Masking {
    /// Chance that a non-special token is selected for prediction (BERT: 0.15).
    pub probability: f64,
    pub mask_id: i64,
    pub vocab_size: i64,
    /// Ids never selected ([CLS], [SEP], [PAD], ...).
    pub specials: Vec<i64>,
    /// At most this many predictions per block (BERT's `max_predictions_per_seq`): when more
    /// are selected, a seeded random subset of this size is kept.
    pub max_predictions: Option<usize>,
}

impl Masking {
    pub fn new(
        probability: f64,
        mask_id: i64,
        vocab_size: i64,
        specials: Vec<i64>,
    ) -> Result<Self> {
        check_probability(probability)?;
        if vocab_size <= 0 || !(0..vocab_size).contains(&mask_id) {
            bail!("the [MASK] id {mask_id} is outside the vocabulary of {vocab_size}: the tokenizer needs a [MASK] token");
        }
        Ok(Masking {
            probability,
            mask_id,
            vocab_size,
            specials,
            max_predictions: None,
        })
    }

    /// Limits the predictions per block (see [`Masking::max_predictions`]).
    pub fn with_max_predictions(mut self, max: Option<usize>) -> Self {
        self.max_predictions = max;
        self
    }

    /// The model's input and the labels ([`IGNORE_INDEX`] where nothing is predicted) for
    /// `block` in `epoch`.
    pub fn apply(
        &self,
        block: &[i64],
        seed: u64,
        epoch: u64,
        index: usize,
    ) -> (Vec<i64>, Vec<i64>) {
        let mut rng = SplitMix64::new(seed, epoch, index as u64);
        let mut input = block.to_vec();
        let mut labels = vec![IGNORE_INDEX; block.len()];
        let mut chosen = Vec::new();
        for (i, &id) in block.iter().enumerate() {
            // Draws for every position, special or not, so one position's fate does not
            // depend on its neighbours' tokens.
            let (select, kind, random) = (rng.unit(), rng.unit(), rng.next());
            if self.specials.contains(&id) || select >= self.probability {
                continue;
            }
            chosen.push(i);
            labels[i] = id;
            input[i] = if kind < 0.8 {
                self.mask_id
            } else if kind < 0.9 {
                (random % self.vocab_size as u64) as i64
            } else {
                id
            };
        }
        if let Some(max) = self.max_predictions.filter(|&m| chosen.len() > m) {
            // Keep a random `max` of the selected positions (a partial Fisher-Yates shuffle);
            // the others go back to their own token, unpredicted.
            for k in 0..max {
                let j = k + (rng.next() % (chosen.len() - k) as u64) as usize;
                chosen.swap(k, j);
            }
            for &i in &chosen[max..] {
                input[i] = block[i];
                labels[i] = IGNORE_INDEX;
            }
        }
        (input, labels)
    }
}

/// A small, fast, well-mixed generator (Steele et al.'s SplitMix64), seeded from three numbers.
struct SplitMix64(u64);

impl SplitMix64 {
    fn new(seed: u64, epoch: u64, index: u64) -> Self {
        let mut g = SplitMix64(seed ^ 0x6a09_e667_f3bc_c909);
        let a = g.next() ^ epoch;
        g.0 = a;
        let b = g.next() ^ index;
        g.0 = b;
        g
    }

    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Uniform in [0, 1).
    fn unit(&mut self) -> f64 {
        (self.next() >> 11) as f64 / (1u64 << 53) as f64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn at_most_max_predictions_per_block_and_the_rest_untouched() {
        let block: Vec<i64> = (10..138).collect();
        let m = Masking::new(0.5, 1, 1000, vec![]).unwrap();
        let capped = m.clone().with_max_predictions(Some(20));
        for index in 0..20 {
            let (_, all) = m.apply(&block, 7, 0, index);
            let (input, labels) = capped.apply(&block, 7, 0, index);
            let predicted: Vec<usize> = (0..block.len())
                .filter(|&i| labels[i] != IGNORE_INDEX)
                .collect();
            assert_eq!(predicted.len(), 20, "about 64 selected, 20 kept");
            for i in 0..block.len() {
                if labels[i] == IGNORE_INDEX {
                    assert_eq!(
                        input[i], block[i],
                        "an unpredicted position keeps its token"
                    );
                } else {
                    assert_eq!(
                        labels[i], all[i],
                        "a kept prediction is one of the selected"
                    );
                }
            }
            assert_eq!(capped.apply(&block, 7, 0, index), (input, labels), "seeded");
        }
    }

    #[test]
    fn grouping_concatenates_and_drops_the_remainder() {
        let texts = [
            vec![2u32, 10, 11, 3],
            vec![2, 12, 3],
            vec![2, 13, 14, 15, 3],
        ];
        let blocks = group_texts(&texts, 5);
        assert_eq!(blocks, vec![vec![2, 10, 11, 3, 2], vec![12, 3, 2, 13, 14]]);
        assert!(group_texts(&texts, 100).is_empty());
    }

    /// BERT's masking statistics over 10^5 tokens: 15% ± 1% selected, of those 80/10/10
    /// within ± 2%, special tokens never selected.
    #[test]
    fn masking_statistics_follow_bert() {
        const CLS: i64 = 2;
        const SEP: i64 = 3;
        const MASK: i64 = 4;
        let vocab = 1000;
        let m = Masking::new(0.15, MASK, vocab, vec![0, 1, CLS, SEP, MASK]).unwrap();
        // 1000 blocks of 128: a [CLS] … [SEP] sentence structure with ids from 5..vocab.
        let (mut tokens, mut specials, mut selected) = (0usize, 0usize, 0usize);
        let (mut masked, mut random, mut kept) = (0usize, 0usize, 0usize);
        for b in 0..1000usize {
            let block: Vec<i64> = (0..128)
                .map(|i| match i % 32 {
                    0 => CLS,
                    31 => SEP,
                    _ => 5 + ((b * 131 + i * 17) % 995) as i64,
                })
                .collect();
            let (input, labels) = m.apply(&block, 42, 0, b);
            for i in 0..block.len() {
                let special = m.specials.contains(&block[i]);
                specials += special as usize;
                tokens += !special as usize;
                if labels[i] == IGNORE_INDEX {
                    assert_eq!(input[i], block[i], "an unselected token is never changed");
                    continue;
                }
                assert!(!special, "special token {} selected", block[i]);
                assert_eq!(labels[i], block[i]);
                selected += 1;
                if input[i] == MASK {
                    masked += 1;
                } else if input[i] == block[i] {
                    kept += 1;
                } else {
                    random += 1;
                }
            }
        }
        assert!(tokens >= 100_000 && specials > 0);
        let p = selected as f64 / tokens as f64;
        assert!((p - 0.15).abs() < 0.01, "selected {p}");
        let s = selected as f64;
        // A random replacement can draw the token itself (1 in 1000): counted as kept.
        let (fm, fr, fk) = (masked as f64 / s, random as f64 / s, kept as f64 / s);
        assert!((fm - 0.8).abs() < 0.02, "[MASK] {fm}");
        assert!((fr - 0.1).abs() < 0.02, "random {fr}");
        assert!((fk - 0.1).abs() < 0.02, "kept {fk}");
    }

    #[test]
    fn masks_depend_on_seed_epoch_and_block_only() {
        let m = Masking::new(0.15, 4, 1000, vec![2, 3]).unwrap();
        let block: Vec<i64> = (10..138).collect();
        assert_eq!(m.apply(&block, 1, 0, 7), m.apply(&block, 1, 0, 7));
        assert_ne!(
            m.apply(&block, 1, 0, 7).1,
            m.apply(&block, 1, 1, 7).1,
            "a new epoch, a new mask"
        );
        assert_ne!(m.apply(&block, 1, 0, 7).1, m.apply(&block, 1, 0, 8).1);
        assert_ne!(m.apply(&block, 1, 0, 7).1, m.apply(&block, 2, 0, 7).1);
    }

    #[test]
    fn bad_settings_name_the_fix() {
        let e = Masking::new(1.5, 4, 1000, vec![]).unwrap_err().to_string();
        assert!(e.contains("0.15"), "{e}");
        let e = Masking::new(0.15, 5000, 1000, vec![])
            .unwrap_err()
            .to_string();
        assert!(e.contains("[MASK]"), "{e}");
    }
}
