//! An epoch's numbers on one rank (training and evaluation sums), laid out for the all-reduce
//! that sums them over ranks, and the epoch's metrics and log lines from those sums.

use std::collections::BTreeMap;

use trainbook_api::metric;

use crate::worker::scores::Confusion;

/// Per-name sums of a recipe's own metrics, weighted by batch size.
#[derive(Default)]
pub(super) struct MetricSums(BTreeMap<String, (f64, f64)>);

impl MetricSums {
    pub(super) fn add(&mut self, metrics: &[(String, f64)], samples: usize) {
        for (name, v) in metrics {
            let e = self.0.entry(name.clone()).or_default();
            e.0 += v * samples as f64;
            e.1 += samples as f64;
        }
    }
    /// A ratio's numerator and denominator: its mean is then the ratio of the sums.
    pub(super) fn add_ratio(&mut self, name: &str, numerator: f64, denominator: f64) {
        let e = self.0.entry(name.to_string()).or_default();
        e.0 += numerator;
        e.1 += denominator;
    }
    pub(super) fn merge(&mut self, other: &MetricSums) {
        for (name, (s, n)) in &other.0 {
            let e = self.0.entry(name.clone()).or_default();
            e.0 += s;
            e.1 += n;
        }
    }
    pub(super) fn means(&self) -> Vec<(String, f64)> {
        self.means_of(&self.to_sums())
    }
    fn len(&self) -> usize {
        self.0.len()
    }
    fn sums_len(&self) -> usize {
        2 * self.0.len()
    }
    /// (sum, weight) per name, in name order.
    fn to_sums(&self) -> Vec<f64> {
        self.0.values().flat_map(|(s, n)| [*s, *n]).collect()
    }
    /// The means of `sums` (laid out as [`MetricSums::to_sums`], e.g. summed over ranks).
    fn means_of(&self, sums: &[f64]) -> Vec<(String, f64)> {
        self.0
            .keys()
            .zip(sums.chunks(2))
            .map(|(k, c)| (k.clone(), c[0] / c[1].max(1e-300)))
            .collect()
    }
}

/// One epoch's training sums on this rank.
#[derive(Default)]
pub(super) struct EpochSums {
    pub(super) loss: f64,
    pub(super) n: f64,
    pub(super) correct: f64,
    pub(super) counted: f64,
    pub(super) metrics: MetricSums,
}

/// One rank's evaluation of an epoch.
#[derive(Default)]
pub(super) struct EvalSums {
    pub(super) loss: f64,
    pub(super) n: f64,
    pub(super) confusion: Confusion,
    pub(super) metrics: MetricSums,
}

/// The shape of a rank's sums: the layout of [`local_sums`] depends on the metric names and the
/// number of classes, so ranks first check they agree on it ([`agreed`]).
pub(super) fn layout(train: &EpochSums, eval: &EvalSums) -> [f64; 3] {
    [
        train.metrics.len() as f64,
        eval.metrics.len() as f64,
        eval.confusion.classes() as f64,
    ]
}

/// Whether every one of `world` ranks has this rank's `layout`, given the layouts' sum.
pub(super) fn agreed(layout: &[f64], summed: &[f64], world: usize) -> bool {
    summed
        .iter()
        .zip(layout)
        .all(|(sum, mine)| *sum == mine * world as f64)
}

/// The numbers to sum over ranks: losses and accuracy counts, and (when the ranks `agreed` on
/// the layout) the recipe's own metrics and the confusion matrix.
pub(super) fn local_sums(train: &EpochSums, eval: &EvalSums, agreed: bool) -> Vec<f64> {
    let mut local = vec![
        train.loss,
        train.n,
        eval.loss,
        eval.n,
        train.correct,
        train.counted,
    ];
    if agreed {
        local.extend(train.metrics.to_sums());
        local.extend(eval.metrics.to_sums());
        local.extend(eval.confusion.to_sums());
    }
    local
}

/// The epoch's metrics from `sums`, the ranks' [`local_sums`] summed: losses, accuracy, the
/// recipe's own metrics, exact classification scores, and perplexities when the recipe's loss
/// has one.
pub(super) fn epoch_metrics(
    train: &EpochSums,
    eval: &EvalSums,
    agreed: bool,
    sums: &[f64],
    perplexity: bool,
) -> BTreeMap<String, f64> {
    let mut m = BTreeMap::new();
    m.insert(
        metric::EPOCH_TRAIN_LOSS.to_string(),
        sums[0] / sums[1].max(1.0),
    );
    if sums[5] > 0.0 {
        m.insert(metric::EPOCH_TRAIN_ACCURACY.to_string(), sums[4] / sums[5]);
    }
    if sums[3] > 0.0 {
        m.insert(metric::EVAL_LOSS.to_string(), sums[2] / sums[3]);
    }
    if agreed {
        let (train_user, rest) = sums[6..].split_at(train.metrics.sums_len());
        for (name, v) in train.metrics.means_of(train_user) {
            m.insert(metric::epoch_train(&name), v);
        }
        let (eval_user, rest) = rest.split_at(eval.metrics.sums_len());
        for (name, v) in eval.metrics.means_of(eval_user) {
            m.insert(metric::eval(&name), v);
        }
        let confusion = Confusion::from_sums(eval.confusion.classes(), rest);
        m.extend(confusion.scores(metric::EVAL_PREFIX));
    }
    if perplexity {
        // exp of the mean loss, not the mean of per-batch perplexities.
        for (loss, ppl) in [
            (metric::EPOCH_TRAIN_LOSS, metric::EPOCH_TRAIN_PERPLEXITY),
            (metric::EVAL_LOSS, metric::EVAL_PERPLEXITY),
        ] {
            if let Some(l) = m.get(loss).copied() {
                m.insert(ppl.to_string(), l.exp());
            }
        }
    }
    m
}

/// The reference notebooks' per-epoch lines, from the epoch's metrics `m`.
pub(super) fn epoch_lines(epoch: u64, m: &BTreeMap<String, f64>) -> Vec<String> {
    let acc = |k: &str| {
        m.get(k)
            .map(|a| format!(" Acc: {a:.4}"))
            .unwrap_or_default()
    };
    let mut lines = vec![format!(
        "Epoch {epoch}-train Loss: {:.4}{} ({:.1} samples/s)",
        m[metric::EPOCH_TRAIN_LOSS],
        acc(metric::EPOCH_TRAIN_ACCURACY),
        m[metric::SAMPLES_PER_SECOND],
    )];
    if let Some(l) = m.get(metric::EVAL_LOSS) {
        let f1 = m
            .get(metric::EVAL_F1)
            .or(m.get(metric::EVAL_F1_MACRO))
            .map(|f| format!(" F1: {f:.4}"))
            .unwrap_or_default();
        lines.push(format!(
            "Epoch {epoch}-val Loss: {l:.4}{}{f1}",
            acc(metric::EVAL_ACCURACY)
        ));
    }
    lines
}

#[cfg(test)]
mod tests {
    use super::*;

    fn named(pairs: &[(&str, f64)]) -> Vec<(String, f64)> {
        pairs.iter().map(|(n, v)| (n.to_string(), *v)).collect()
    }

    #[test]
    fn metric_means_are_weighted_by_samples_and_ratios_by_their_sums() {
        let mut m = MetricSums::default();
        m.add(&named(&[("f1", 1.0)]), 3);
        m.add(&named(&[("f1", 0.0), ("bleu", 0.5)]), 1);
        m.add_ratio("em", 3.0, 4.0);
        let mut other = MetricSums::default();
        other.add_ratio("em", 1.0, 4.0);
        m.merge(&other);
        assert_eq!(
            m.means(),
            named(&[("bleu", 0.5), ("em", 0.5), ("f1", 0.75)])
        );
        assert_eq!(m.to_sums(), [0.5, 1.0, 4.0, 8.0, 3.0, 4.0]);
    }

    fn one_epoch() -> (EpochSums, EvalSums) {
        let mut train = EpochSums {
            loss: 12.0,
            n: 6.0,
            correct: 3.0,
            counted: 4.0,
            ..Default::default()
        };
        train.metrics.add(&named(&[("bleu", 0.25)]), 6);
        let mut eval = EvalSums {
            loss: 2.0,
            n: 4.0,
            ..Default::default()
        };
        eval.metrics.add_ratio("em", 1.0, 4.0);
        (train, eval)
    }

    #[test]
    fn the_epochs_metrics_come_from_the_summed_vector() {
        let (train, eval) = one_epoch();
        assert_eq!(layout(&train, &eval), [1.0, 1.0, 0.0]);
        let local = local_sums(&train, &eval, true);
        // Two ranks with the same numbers: the means are this rank's.
        let sums: Vec<f64> = local.iter().map(|v| 2.0 * v).collect();
        let m = epoch_metrics(&train, &eval, true, &sums, false);
        let expected: BTreeMap<String, f64> = [
            (metric::EPOCH_TRAIN_LOSS, 2.0),
            (metric::EPOCH_TRAIN_ACCURACY, 0.75),
            (metric::EVAL_LOSS, 0.5),
            ("epoch_train_bleu", 0.25),
            ("eval_em", 0.25),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v))
        .collect();
        assert_eq!(m, expected);
    }

    #[test]
    fn ranks_that_disagree_on_the_layout_sum_only_the_losses() {
        let (train, eval) = one_epoch();
        let mine = layout(&train, &eval);
        assert!(agreed(&mine, &[2.0, 2.0, 0.0], 2));
        assert!(!agreed(&mine, &[1.0, 2.0, 0.0], 2));
        let local = local_sums(&train, &eval, false);
        assert_eq!(local, [12.0, 6.0, 2.0, 4.0, 3.0, 4.0]);
        let m = epoch_metrics(&train, &eval, false, &local, true);
        assert_eq!(m.len(), 5, "{m:?}");
        assert_eq!(m[metric::EPOCH_TRAIN_PERPLEXITY], 2f64.exp());
        assert_eq!(m[metric::EVAL_PERPLEXITY], 0.5f64.exp());
    }

    #[test]
    fn no_evaluation_no_eval_metrics() {
        let train = EpochSums {
            loss: 3.0,
            n: 3.0,
            ..Default::default()
        };
        let eval = EvalSums::default();
        let local = local_sums(&train, &eval, true);
        let m = epoch_metrics(&train, &eval, true, &local, true);
        assert_eq!(
            m.keys().collect::<Vec<_>>(),
            [metric::EPOCH_TRAIN_LOSS, metric::EPOCH_TRAIN_PERPLEXITY]
        );
    }

    #[test]
    fn epoch_lines_are_the_reference_notebooks() {
        let mut m: BTreeMap<String, f64> = [
            (metric::EPOCH_TRAIN_LOSS, 0.51234),
            (metric::SAMPLES_PER_SECOND, 812.34),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v))
        .collect();
        assert_eq!(
            epoch_lines(0, &m),
            ["Epoch 0-train Loss: 0.5123 (812.3 samples/s)"]
        );
        for (k, v) in [
            (metric::EPOCH_TRAIN_ACCURACY, 0.9),
            (metric::EVAL_LOSS, 0.4),
            (metric::EVAL_ACCURACY, 0.875),
            (metric::EVAL_F1_MACRO, 0.5),
        ] {
            m.insert(k.to_string(), v);
        }
        assert_eq!(
            epoch_lines(2, &m),
            [
                "Epoch 2-train Loss: 0.5123 Acc: 0.9000 (812.3 samples/s)",
                "Epoch 2-val Loss: 0.4000 Acc: 0.8750 F1: 0.5000"
            ]
        );
    }
}
