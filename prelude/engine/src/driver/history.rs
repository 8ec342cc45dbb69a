//! The metric rows a job keeps in memory (what `history_df`, the result and `metrics.parquet`
//! hold), bounded for jobs of many ranks. Every rank reports its loss every step: 1,024 ranks
//! over 155,000 steps would be ~160 million rows, ~13 GB in the driver. Rank 0's rows and
//! every epoch-level row are always kept; the per-step rows of the other ranks are kept until
//! there are [`OTHER_RANK_ROWS`] of them, and then thinned to every 2nd step, every 4th, and so
//! on, so each rank keeps an evenly spaced history of the whole run.

use trainbook_api::metric;
use trainbook_api::MetricRow;

/// Per-step rows of ranks other than 0 kept before thinning (~8 MB).
pub(super) const OTHER_RANK_ROWS: usize = 100_000;

/// How the per-step rows of ranks other than 0 are thinned so far.
pub(super) struct Thinning {
    cap: usize,
    /// Rows of other ranks are kept at steps that are multiples of this (1: every step).
    stride: u64,
    /// Rows of other ranks kept, as counted at the last thinning and added since.
    others: usize,
}

/// Rows that are kept whatever their number: rank 0's (the plots, the trackers) and the
/// epoch-level metrics (one row per epoch and rank).
fn always_kept(row: &MetricRow) -> bool {
    row.rank == 0
        || row.name.starts_with(metric::EVAL_PREFIX)
        || row.name.starts_with(metric::EPOCH_TRAIN_PREFIX)
}

impl Thinning {
    pub(super) fn new(cap: usize) -> Self {
        Thinning {
            cap: cap.max(1),
            stride: 1,
            others: 0,
        }
    }

    /// Adds `row` to `rows` unless the current stride leaves it out; thins `rows` when the
    /// rows of other ranks pass the cap.
    pub(super) fn push(&mut self, rows: &mut Vec<MetricRow>, row: MetricRow) {
        if always_kept(&row) {
            rows.push(row);
            return;
        }
        if !row.step.is_multiple_of(self.stride) {
            return;
        }
        rows.push(row);
        self.others += 1;
        if self.others <= self.cap {
            return;
        }
        // Counted again first: a restart drops the rows of the steps it replays.
        self.others = rows.iter().filter(|r| !always_kept(r)).count();
        while self.others > self.cap {
            self.stride *= 2;
            let stride = self.stride;
            rows.retain(|r| always_kept(r) || r.step.is_multiple_of(stride));
            self.others = rows.iter().filter(|r| !always_kept(r)).count();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(rank: u32, step: u64, name: &str) -> MetricRow {
        MetricRow {
            rank,
            step,
            epoch: 0,
            name: name.into(),
            value: 1.0,
            time: 0.0,
        }
    }

    #[test]
    fn many_ranks_keep_rank_0_whole_and_an_evenly_thinned_history_of_the_others() {
        let mut thin = Thinning::new(1_000);
        let mut rows = Vec::new();
        for step in 1..=1_000u64 {
            for rank in 0..16 {
                thin.push(&mut rows, row(rank, step, metric::LOSS));
            }
            if step % 250 == 0 {
                for rank in 0..16 {
                    thin.push(&mut rows, row(rank, step + 1, metric::EVAL_LOSS));
                }
            }
        }
        let rank0 = rows
            .iter()
            .filter(|r| r.rank == 0 && r.name == metric::LOSS);
        assert_eq!(rank0.count(), 1_000, "rank 0 keeps every step");
        let evals = rows.iter().filter(|r| r.name == metric::EVAL_LOSS).count();
        assert_eq!(evals, 4 * 16, "every epoch-level row is kept");
        let others: Vec<&MetricRow> = rows.iter().filter(|r| !always_kept(r)).collect();
        assert!(
            others.len() <= 1_000,
            "{} rows of other ranks",
            others.len()
        );
        // 15 ranks x 1,000 steps thinned to every 16th step: 62 steps each, evenly spaced
        // over the whole run, the same steps on every rank.
        let rank7: Vec<u64> = others
            .iter()
            .filter(|r| r.rank == 7)
            .map(|r| r.step)
            .collect();
        assert_eq!(
            rank7,
            (1..=1_000).filter(|s| s % 16 == 0).collect::<Vec<_>>()
        );
        assert_eq!(others.len(), 15 * rank7.len());
    }

    #[test]
    fn a_few_ranks_keep_every_row() {
        let mut thin = Thinning::new(OTHER_RANK_ROWS);
        let mut rows = Vec::new();
        for step in 1..=500 {
            for rank in 0..8 {
                thin.push(&mut rows, row(rank, step, metric::LOSS));
            }
        }
        assert_eq!(rows.len(), 4_000);
    }
}
