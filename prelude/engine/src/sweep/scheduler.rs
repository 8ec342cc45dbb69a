//! The sweep's [`Scheduler`] at work: after each report of the sweep's metric by one trial, its
//! early-stopping rule (ASHA, the median rule, none) gives a [`TrialVerdict`]: go on, or prune
//! the trial. Pure bookkeeping over (trial, report number, value), so every rule is tested here
//! without a process; the sweep driver feeds it reports and acts on its verdicts.
//!
//! Scores are "higher is better" inside ([`Goal::Min`] values are negated on the way in), so
//! each rule is written once for both goals.

use std::collections::BTreeMap;

use trainbook_api::{Asha, Goal, MedianStopping, Scheduler};

/// What the scheduler answers to a trial's report.
#[derive(Clone, Debug, PartialEq)]
pub(crate) enum TrialVerdict {
    Continue,
    /// Prune the trial (stop it early, keeping what it has), with why (for the trial's note).
    Prune(String),
}

/// A sweep's [`Scheduler`] with the reports it has seen.
pub(crate) struct SchedulerState {
    goal: Goal,
    metric: String,
    kind: Kind,
}

enum Kind {
    None,
    Asha {
        factor: f64,
        /// (milestone, score of each trial that reached it), highest milestone first.
        rungs: Vec<(u64, BTreeMap<usize, f64>)>,
    },
    Median {
        rule: MedianStopping,
        /// Each trial's scores, one per report.
        history: BTreeMap<usize, Vec<f64>>,
    },
}

/// ASHA's milestones: `grace`, `grace·factor`, ... strictly below `max_t` (a trial at its last
/// report ends anyway; stopping it there would only relabel it).
pub(crate) fn milestones(asha: &Asha, max_t: u64) -> Vec<u64> {
    let mut out = Vec::new();
    let mut m = asha.grace_period as f64;
    while (m.round() as u64) < max_t {
        let r = m.round() as u64;
        if out.last() != Some(&r) {
            out.push(r);
        }
        m *= asha.reduction_factor;
    }
    out
}

/// The `q` quantile of `xs` with linear interpolation between order statistics (numpy's
/// default, which Ray's ASHA uses for its cutoff).
fn quantile(xs: &[f64], q: f64) -> Option<f64> {
    let mut v: Vec<f64> = xs.iter().copied().filter(|x| !x.is_nan()).collect();
    if v.is_empty() {
        return None;
    }
    v.sort_by(f64::total_cmp);
    let pos = q.clamp(0.0, 1.0) * (v.len() - 1) as f64;
    let (lo, hi) = (pos.floor() as usize, pos.ceil() as usize);
    Some(v[lo] + (v[hi] - v[lo]) * (pos - lo as f64))
}

impl SchedulerState {
    /// The state of `scheduler` before any report; `max_t` is the last report a trial can reach (ASHA's rungs stay
    /// below it).
    pub(crate) fn new(
        scheduler: &Scheduler,
        goal: Goal,
        metric: &str,
        max_t: u64,
    ) -> SchedulerState {
        let kind = match scheduler {
            Scheduler::None => Kind::None,
            Scheduler::Asha(a) => Kind::Asha {
                factor: a.reduction_factor,
                rungs: milestones(a, max_t)
                    .into_iter()
                    .rev()
                    .map(|m| (m, BTreeMap::new()))
                    .collect(),
            },
            Scheduler::Median(m) => Kind::Median {
                rule: *m,
                history: BTreeMap::new(),
            },
        };
        SchedulerState {
            goal,
            metric: metric.to_string(),
            kind,
        }
    }

    fn score(&self, value: f64) -> f64 {
        match self.goal {
            Goal::Min => -value,
            Goal::Max => value,
        }
    }

    #[cfg(test)]
    fn value(&self, score: f64) -> f64 {
        self.score(score)
    }

    /// Trial `trial` reported `value` as its `t`-th report (1 for the first).
    pub(crate) fn report(&mut self, trial: usize, t: u64, value: f64) -> TrialVerdict {
        if value.is_nan() {
            return TrialVerdict::Prune(format!("{} is NaN at report {t}", self.metric));
        }
        let score = self.score(value);
        let metric = self.metric.clone();
        let goal = self.goal;
        match &mut self.kind {
            Kind::None => TrialVerdict::Continue,
            Kind::Asha { factor, rungs } => {
                // The highest rung this trial has reached and not yet been judged at.
                let Some((milestone, recorded)) = rungs
                    .iter_mut()
                    .find(|(m, rec)| t >= *m && !rec.contains_key(&trial))
                else {
                    return TrialVerdict::Continue;
                };
                let others: Vec<f64> = recorded.values().copied().collect();
                let cutoff = quantile(&others, 1.0 - 1.0 / *factor);
                recorded.insert(trial, score);
                match cutoff {
                    Some(c) if score < c => {
                        let c_value = match goal {
                            Goal::Min => -c,
                            Goal::Max => c,
                        };
                        TrialVerdict::Prune(format!(
                            "{metric} {} at report {t} is outside the best 1/{} of {} trials at rung {milestone} (cutoff {})",
                            short(value),
                            factor,
                            others.len() + 1,
                            short(c_value)
                        ))
                    }
                    _ => TrialVerdict::Continue,
                }
            }
            Kind::Median { rule, history } => {
                let mine = history.entry(trial).or_default();
                mine.push(score);
                let best = mine.iter().copied().fold(f64::NEG_INFINITY, f64::max);
                if t < rule.grace_period {
                    return TrialVerdict::Continue;
                }
                let t = t as usize;
                let means: Vec<f64> = history
                    .iter()
                    .filter(|(id, h)| **id != trial && h.len() >= t)
                    .map(|(_, h)| h[..t].iter().sum::<f64>() / t as f64)
                    .collect();
                if means.len() < rule.min_samples {
                    return TrialVerdict::Continue;
                }
                let median = quantile(&means, 0.5).unwrap_or(f64::NEG_INFINITY);
                if best < median {
                    let median_value = match goal {
                        Goal::Min => -median,
                        Goal::Max => median,
                    };
                    TrialVerdict::Prune(format!(
                        "best {metric} {} by report {t} is worse than the median {} of {} other trials' running means",
                        short(match goal {
                            Goal::Min => -best,
                            Goal::Max => best,
                        }),
                        short(median_value),
                        means.len()
                    ))
                } else {
                    TrialVerdict::Continue
                }
            }
        }
    }

    #[cfg(test)]
    fn rung_values(&self) -> Vec<(u64, Vec<f64>)> {
        match &self.kind {
            Kind::Asha { rungs, .. } => rungs
                .iter()
                .map(|(m, r)| (*m, r.values().map(|s| self.value(*s)).collect()))
                .collect(),
            _ => Vec::new(),
        }
    }
}

/// A metric value as the notes show it: 4 significant digits.
fn short(v: f64) -> String {
    if v == 0.0 || !v.is_finite() {
        return v.to_string();
    }
    let digits = (3 - v.abs().log10().floor() as i32).max(0) as usize;
    format!("{v:.digits$}")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn asha(grace: u64, factor: f64) -> Scheduler {
        Scheduler::Asha(Asha::default().grace_period(grace).reduction_factor(factor))
    }

    #[test]
    fn milestones_start_at_the_grace_period_and_stay_below_max_t() {
        let a = Asha::default().grace_period(1).reduction_factor(2.0);
        assert_eq!(milestones(&a, 4), [1, 2]);
        assert_eq!(milestones(&a, 9), [1, 2, 4, 8]);
        assert_eq!(milestones(&Asha::default(), 100), [1, 4, 16, 64]);
        assert_eq!(
            milestones(&Asha::default().grace_period(3), 3),
            Vec::<u64>::new()
        );
        let f = Asha::default().grace_period(1).reduction_factor(1.5);
        assert_eq!(milestones(&f, 5), [1, 2, 3]);
    }

    #[test]
    fn quantile_interpolates_like_numpy() {
        assert_eq!(quantile(&[1.0, 2.0, 3.0, 4.0], 0.5), Some(2.5));
        assert_eq!(quantile(&[3.0], 0.75), Some(3.0));
        assert_eq!(quantile(&[1.0, 2.0, 3.0, 4.0, 5.0], 0.75), Some(4.0));
        assert_eq!(quantile(&[], 0.5), None);
    }

    #[test]
    fn asha_keeps_the_first_trial_and_stops_a_worse_one_at_the_same_rung() {
        let mut r = SchedulerState::new(&asha(1, 2.0), Goal::Min, "eval_loss", 4);
        assert_eq!(
            r.report(1, 1, 0.60),
            TrialVerdict::Continue,
            "nothing to compare with"
        );
        let TrialVerdict::Prune(why) = r.report(2, 1, 0.70) else {
            panic!("a worse value than the only other one at rung 1 stops")
        };
        assert!(
            why.contains("eval_loss 0.7000 at report 1") && why.contains("cutoff 0.6000"),
            "{why}"
        );
        assert_eq!(
            r.report(3, 1, 0.50),
            TrialVerdict::Continue,
            "a better one goes on"
        );
        // Trial 1 reaches rung 2 first: continues; its second report is not judged at rung 1.
        assert_eq!(r.report(1, 2, 0.55), TrialVerdict::Continue);
        assert_eq!(
            r.report(1, 3, 0.54),
            TrialVerdict::Continue,
            "3 is no rung below max_t 4"
        );
        assert!(matches!(r.report(3, 2, 0.58), TrialVerdict::Prune(_)));
        assert_eq!(
            r.rung_values(),
            [(2, vec![0.55, 0.58]), (1, vec![0.60, 0.70, 0.50])]
        );
    }

    #[test]
    fn asha_maximises_too_and_a_late_report_is_judged_at_its_highest_rung_only() {
        let mut r = SchedulerState::new(&asha(1, 2.0), Goal::Max, "eval_accuracy", 8);
        assert_eq!(r.report(1, 1, 0.8), TrialVerdict::Continue);
        assert!(matches!(r.report(2, 1, 0.7), TrialVerdict::Prune(_)));
        // A trial whose first report comes at t=4 (reports skipped) is judged at rung 4.
        assert_eq!(
            r.report(3, 4, 0.1),
            TrialVerdict::Continue,
            "rung 4 was empty"
        );
        assert_eq!(
            r.rung_values()
                .iter()
                .map(|(m, v)| (*m, v.len()))
                .collect::<Vec<_>>(),
            [(4, 1), (2, 0), (1, 2)]
        );
    }

    #[test]
    fn asha_with_factor_four_keeps_the_top_quarter() {
        let mut r = SchedulerState::new(&asha(1, 4.0), Goal::Min, "eval_loss", 4);
        for (i, v) in [0.4, 0.5, 0.6, 0.7].iter().enumerate() {
            r.report(i + 1, 1, *v);
        }
        // The 75th percentile of scores (-0.4,-0.5,-0.6,-0.7) is -0.475: 0.45 passes, 0.48 not.
        assert_eq!(r.report(5, 1, 0.45), TrialVerdict::Continue);
        assert!(matches!(r.report(6, 1, 0.48), TrialVerdict::Prune(_)));
    }

    #[test]
    fn no_scheduler_never_stops_but_nan_always_does() {
        let mut r = SchedulerState::new(&Scheduler::None, Goal::Min, "eval_loss", 4);
        for t in 1..=4 {
            assert_eq!(r.report(1, t, 10.0 * t as f64), TrialVerdict::Continue);
        }
        assert_eq!(
            r.report(2, 1, f64::NAN),
            TrialVerdict::Prune("eval_loss is NaN at report 1".into())
        );
    }

    #[test]
    fn median_stopping_waits_for_enough_trials_and_compares_running_means() {
        let rule = MedianStopping {
            grace_period: 2,
            min_samples: 2,
        };
        let mut r = SchedulerState::new(&Scheduler::Median(rule), Goal::Min, "eval_loss", 10);
        // Trials 1 and 2: means at report 2 are 0.55 and 0.65 (median 0.6).
        for (t, v) in [(1, 0.6), (2, 0.5)] {
            assert_eq!(r.report(1, t, v), TrialVerdict::Continue);
        }
        assert_eq!(r.report(2, 1, 0.7), TrialVerdict::Continue);
        assert_eq!(
            r.report(2, 2, 0.6),
            TrialVerdict::Continue,
            "only one other trial"
        );
        assert_eq!(
            r.report(3, 1, 0.9),
            TrialVerdict::Continue,
            "within the grace period"
        );
        let TrialVerdict::Prune(why) = r.report(3, 2, 0.61) else {
            panic!("best 0.61 is worse than the median running mean 0.6")
        };
        assert!(why.contains("median 0.6000 of 2 other trials"), "{why}");
        assert_eq!(r.report(4, 1, 0.9), TrialVerdict::Continue);
        assert_eq!(
            r.report(4, 2, 0.59),
            TrialVerdict::Continue,
            "best 0.59 beats 0.6"
        );
    }
}
