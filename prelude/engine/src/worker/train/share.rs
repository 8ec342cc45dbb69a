//! How much each micro-batch's loss weighs in a step: the gradients of a step's micro-batches
//! add up, and the ranks' gradients are averaged with each rank's share of the step's samples.

/// The weights of one step on one rank.
#[derive(Debug, PartialEq)]
pub(super) struct Weights {
    /// This rank's share of the step's samples: 1/world, but for an epoch's last step, whose
    /// shards may differ by a sample.
    pub(super) share: f64,
    /// Per micro-batch, what its mean loss is divided by: the number of micro-batches when
    /// they are equal (like one big batch), else this rank's samples over the micro-batch's;
    /// `None` for a micro-batch without samples (a weightless sample stands in for it, so that
    /// the rank takes part in the step's collectives).
    pub(super) divisors: Vec<Option<f64>>,
}

/// The weights of a step whose micro-batches on this rank are `group` and whose samples over
/// all `world` ranks are `global`.
pub(super) fn weigh(group: &[&[usize]], world: usize, global: usize) -> Weights {
    let mine: usize = group.iter().map(|b| b.len()).sum();
    let even = mine * world == global && group.iter().all(|b| b.len() == mine / group.len());
    let share = if even {
        1.0 / world as f64
    } else {
        mine as f64 / global.max(1) as f64
    };
    let divisors = group
        .iter()
        .map(|batch| match batch.len() {
            0 => None,
            _ if even => Some(group.len() as f64),
            n => Some(mine as f64 / n as f64),
        })
        .collect();
    Weights { share, divisors }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_even_step_weighs_like_one_big_batch() {
        let (a, b) = ([0, 1, 2, 3], [4, 5, 6, 7]);
        let w = weigh(&[&a, &b], 2, 16);
        assert_eq!(w.share, 0.5);
        assert_eq!(w.divisors, [Some(2.0), Some(2.0)]);
        let w = weigh(&[&a], 4, 16);
        assert_eq!((w.share, w.divisors), (0.25, vec![Some(1.0)]));
    }

    #[test]
    fn an_epochs_last_step_weighs_by_samples() {
        // 7 samples over 2 ranks: this rank has 4 of them, in micro-batches of 3 and 1.
        let (a, b) = ([0, 1, 2], [3]);
        let w = weigh(&[&a, &b], 2, 7);
        assert_eq!(w.share, 4.0 / 7.0);
        assert_eq!(w.divisors, [Some(4.0 / 3.0), Some(4.0)]);
        // A micro-batch's mean loss is its samples' sum over n: divided by its divisor, each
        // sample weighs 1 / (n * divisor), the same 1/4 in both: the rank's mean loss.
        for (n, d) in [3.0, 1.0].iter().zip(&w.divisors) {
            assert_eq!(n * d.unwrap(), 4.0);
        }
    }

    #[test]
    fn equal_micro_batches_of_an_uneven_split_still_weigh_by_samples() {
        // 5 samples over 2 ranks: 3 here, as one micro-batch.
        let a = [0, 1, 2];
        let w = weigh(&[&a], 2, 5);
        assert_eq!((w.share, w.divisors), (0.6, vec![Some(1.0)]));
    }

    #[test]
    fn a_rank_without_samples_takes_part_weightless() {
        let (a, none) = ([0], []);
        let w = weigh(&[&a, &none], 3, 2);
        assert_eq!(w.share, 0.5);
        assert_eq!(w.divisors, [Some(1.0), None]);
        let w = weigh(&[&none], 3, 2);
        assert_eq!((w.share, w.divisors), (0.0, vec![None]));
    }
}
