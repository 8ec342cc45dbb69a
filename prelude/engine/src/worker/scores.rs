//! Classification scores from counts: accuracy and F1 (binary, macro) from a confusion matrix.
//!
//! Why counts: each rank evaluates its own shard, and the mean of per-rank ratios is not the
//! ratio over the whole split (shards differ in size and in class mix). Ranks add their
//! confusion matrices with one all-reduce, and the scores are taken from the sum, so they are
//! exactly what one process evaluating everything would report.

use anyhow::{bail, Result};
use tch::{Kind, Tensor};

/// More classes than this and only accuracy is kept (the matrix would be too large to
/// all-reduce every epoch).
pub(crate) const MAX_CLASSES: usize = 1024;

/// Counts of (true class, predicted class) pairs.
#[derive(Clone, Debug, Default, PartialEq)]
pub(crate) struct Confusion {
    classes: usize,
    /// Row-major `classes x classes`: row = true class, column = predicted class.
    counts: Vec<f64>,
    /// Samples counted (also when there are too many classes for the matrix).
    total: f64,
    /// Correct predictions.
    correct: f64,
}

impl Confusion {
    /// Adds a batch: `logits` `[batch, classes]`, `labels` `[batch]` (class indices).
    pub(crate) fn add(&mut self, logits: &Tensor, labels: &Tensor) -> Result<()> {
        let size = logits.size();
        let (Some(&classes), true) = (size.last(), size.len() == 2) else {
            bail!("predictions must be class scores of shape [batch, classes], got {size:?}");
        };
        let classes = classes as usize;
        if labels.size() != [size[0]] {
            bail!(
                "labels must have shape [{}] (one class index per sample), got {:?}",
                size[0],
                labels.size()
            );
        }
        if self.classes == 0 {
            self.classes = classes;
            if classes <= MAX_CLASSES {
                self.counts = vec![0.0; classes * classes];
            }
        } else if self.classes != classes {
            bail!(
                "predictions changed from {} to {classes} classes between batches",
                self.classes
            );
        }
        let labels = labels.to_kind(Kind::Int64);
        let predicted = logits.argmax(-1, false);
        let (lo, hi) = (labels.min().int64_value(&[]), labels.max().int64_value(&[]));
        if lo < 0 || hi >= classes as i64 {
            bail!(
                "a label is outside 0..{classes} (the number of class scores): found {lo}..={hi}"
            );
        }
        self.total += size[0] as f64;
        self.correct += predicted
            .eq_tensor(&labels)
            .sum(Kind::Int64)
            .double_value(&[]);
        if !self.counts.is_empty() {
            let cells = (labels * classes as i64 + predicted)
                .bincount::<Tensor>(None, (classes * classes) as i64)
                .to_kind(Kind::Double)
                .to_device(tch::Device::Cpu);
            for (c, v) in self.counts.iter_mut().zip(Vec::<f64>::try_from(&cells)?) {
                *c += v;
            }
        }
        Ok(())
    }

    /// Classes seen (0 before the first batch).
    pub(crate) fn classes(&self) -> usize {
        self.classes
    }

    /// The counts as one vector, to be summed over ranks (see [`Confusion::from_sums`]);
    /// every rank of a job must have seen the same number of classes.
    pub(crate) fn to_sums(&self) -> Vec<f64> {
        let mut v = vec![self.total, self.correct];
        v.extend(&self.counts);
        v
    }

    /// The inverse of [`Confusion::to_sums`], for `classes` classes.
    pub(crate) fn from_sums(classes: usize, sums: &[f64]) -> Self {
        Confusion {
            classes,
            total: sums.first().copied().unwrap_or(0.0),
            correct: sums.get(1).copied().unwrap_or(0.0),
            counts: sums.get(2..).unwrap_or(&[]).to_vec(),
        }
    }

    /// The length of [`Confusion::to_sums`] for `classes` classes.
    #[cfg(test)]
    fn sums_len(classes: usize) -> usize {
        2 + if classes <= MAX_CLASSES {
            classes * classes
        } else {
            0
        }
    }

    pub(crate) fn accuracy(&self) -> f64 {
        self.correct / self.total.max(1.0)
    }

    fn cell(&self, truth: usize, predicted: usize) -> f64 {
        self.counts[truth * self.classes + predicted]
    }

    /// F1 of one class against the rest; 0 when the class is neither present nor predicted.
    pub(crate) fn f1_of(&self, class: usize) -> Option<f64> {
        if self.counts.is_empty() || class >= self.classes {
            return None;
        }
        let tp = self.cell(class, class);
        let predicted: f64 = (0..self.classes).map(|t| self.cell(t, class)).sum();
        let actual: f64 = (0..self.classes).map(|p| self.cell(class, p)).sum();
        let denominator = predicted + actual;
        Some(if denominator > 0.0 {
            2.0 * tp / denominator
        } else {
            0.0
        })
    }

    /// F1 of class 1 (scikit-learn's `f1_score` default for two classes, as GLUE's MRPC reports).
    pub(crate) fn f1_binary(&self) -> Option<f64> {
        (self.classes == 2).then(|| self.f1_of(1)).flatten()
    }

    /// The unweighted mean of every class's F1 (scikit-learn's `average="macro"`, over the
    /// classes of the model's output).
    pub(crate) fn f1_macro(&self) -> Option<f64> {
        if self.counts.is_empty() {
            return None;
        }
        let sum: f64 = (0..self.classes).filter_map(|c| self.f1_of(c)).sum();
        Some(sum / self.classes as f64)
    }

    /// `{prefix}accuracy`, and `{prefix}f1` for two classes or `{prefix}f1_macro` for more.
    pub(crate) fn scores(&self, prefix: &str) -> Vec<(String, f64)> {
        if self.total == 0.0 {
            return Vec::new();
        }
        let mut v = vec![(format!("{prefix}accuracy"), self.accuracy())];
        if let Some(f1) = self.f1_binary() {
            v.push((format!("{prefix}f1"), f1));
        } else if let Some(f1) = self.f1_macro().filter(|_| self.classes > 2) {
            v.push((format!("{prefix}f1_macro"), f1));
        }
        v
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn logits_for(predicted: &[i64], classes: i64) -> Tensor {
        Tensor::from_slice(predicted)
            .one_hot(classes)
            .to_kind(Kind::Float)
    }

    #[test]
    fn binary_f1_is_that_of_class_one() {
        // truth:     1 1 1 0 0 1
        // predicted: 1 0 1 1 0 1  -> tp 3, fp 1, fn 1: precision 0.75, recall 0.75, F1 0.75
        let mut c = Confusion::default();
        c.add(
            &logits_for(&[1, 0, 1, 1, 0, 1], 2),
            &Tensor::from_slice(&[1i64, 1, 1, 0, 0, 1]),
        )
        .unwrap();
        assert!((c.f1_binary().unwrap() - 0.75).abs() < 1e-12);
        assert!((c.accuracy() - 4.0 / 6.0).abs() < 1e-12);
        let names: Vec<String> = c.scores("eval_").into_iter().map(|(n, _)| n).collect();
        assert_eq!(names, ["eval_accuracy", "eval_f1"]);
    }

    #[test]
    fn sums_over_ranks_give_the_scores_of_the_whole_split() {
        // Rank 0 sees 2 samples, rank 1 sees 4: the mean of per-rank accuracies (0.5 and 1.0)
        // would be 0.75; the whole split's is 5/6.
        let mut a = Confusion::default();
        a.add(&logits_for(&[0, 1], 3), &Tensor::from_slice(&[0i64, 2]))
            .unwrap();
        let mut b = Confusion::default();
        b.add(
            &logits_for(&[2, 2, 1, 0], 3),
            &Tensor::from_slice(&[2i64, 2, 1, 0]),
        )
        .unwrap();
        let sums: Vec<f64> = a
            .to_sums()
            .iter()
            .zip(b.to_sums())
            .map(|(x, y)| x + y)
            .collect();
        assert_eq!(sums.len(), Confusion::sums_len(3));
        let all = Confusion::from_sums(3, &sums);
        assert!((all.accuracy() - 5.0 / 6.0).abs() < 1e-12);
        // Per class: 0: tp 2, F1 1; 1: tp 1, fp 1 -> F1 2/3; 2: tp 2, fn 1 -> F1 0.8.
        let expected = (1.0 + 2.0 / 3.0 + 0.8) / 3.0;
        assert!((all.f1_macro().unwrap() - expected).abs() < 1e-12);
        assert_eq!(all.f1_binary(), None);
    }

    #[test]
    fn bad_shapes_and_labels_name_the_problem() {
        let mut c = Confusion::default();
        let e = c
            .add(
                &Tensor::zeros([4], (Kind::Float, tch::Device::Cpu)),
                &Tensor::from_slice(&[0i64; 4]),
            )
            .unwrap_err()
            .to_string();
        assert!(e.contains("[batch, classes]"), "{e}");
        let e = c
            .add(&logits_for(&[0, 1], 2), &Tensor::from_slice(&[0i64, 5]))
            .unwrap_err()
            .to_string();
        assert!(e.contains("outside 0..2"), "{e}");
    }
}
