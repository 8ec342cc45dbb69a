//! Loss curves as bounded data: per-step values aggregated over ranks, down-sampled for
//! drawing without losing spikes.

use std::collections::BTreeMap;

/// Most points drawn per series.
pub const MAX_PLOT_POINTS: usize = 2000;
/// Most points a [`Series`] stores; beyond that it compacts itself to half (min/max buckets),
/// so a run of any length costs bounded memory and amortised O(1) per point.
pub const DEFAULT_SERIES_CAPACITY: usize = 1 << 17;

/// Down-samples `points` (sorted by x) to at most `max_points`: the first and last points,
/// then for each of `(max_points - 2) / 2` buckets of equal count its minimum and maximum,
/// in x order. A spike survives because it is its bucket's max (or min).
pub fn downsample_minmax(points: &[(f64, f64)], max_points: usize) -> Vec<(f64, f64)> {
    let max_points = max_points.max(4);
    if points.len() <= max_points {
        return points.to_vec();
    }
    let inner = &points[1..points.len() - 1];
    let buckets = (max_points - 2) / 2;
    let mut out = Vec::with_capacity(max_points);
    out.push(points[0]);
    for b in 0..buckets {
        let lo = b * inner.len() / buckets;
        let hi = (b + 1) * inner.len() / buckets;
        let bucket = &inner[lo..hi];
        if bucket.is_empty() {
            continue;
        }
        let (mut imin, mut imax) = (0, 0);
        for (i, p) in bucket.iter().enumerate() {
            if p.1 < bucket[imin].1 {
                imin = i;
            }
            if p.1 > bucket[imax].1 {
                imax = i;
            }
        }
        let (a, b) = if imin <= imax {
            (imin, imax)
        } else {
            (imax, imin)
        };
        out.push(bucket[a]);
        if b != a {
            out.push(bucket[b]);
        }
    }
    out.push(points[points.len() - 1]);
    out
}

/// One curve: finite points in x order, plus a count of the non-finite values it was given
/// (they are flagged on the plot, never drawn).
#[derive(Clone, Debug)]
pub struct Series {
    points: Vec<(f64, f64)>,
    capacity: usize,
    non_finite: usize,
    first_non_finite: Option<(f64, f64)>,
}

impl Default for Series {
    fn default() -> Self {
        Series::with_capacity(DEFAULT_SERIES_CAPACITY)
    }
}

impl Series {
    pub fn with_capacity(capacity: usize) -> Series {
        Series {
            points: Vec::new(),
            capacity: capacity.max(8),
            non_finite: 0,
            first_non_finite: None,
        }
    }

    /// Adds a point; x should not decrease (steps).
    pub fn push(&mut self, x: f64, y: f64) {
        if !y.is_finite() || !x.is_finite() {
            self.non_finite += 1;
            self.first_non_finite.get_or_insert((x, y));
            return;
        }
        self.points.push((x, y));
        if self.points.len() > self.capacity {
            self.points = downsample_minmax(&self.points, self.capacity / 2);
        }
    }

    pub fn points(&self) -> &[(f64, f64)] {
        &self.points
    }
    pub fn is_empty(&self) -> bool {
        self.points.is_empty()
    }
    pub fn last(&self) -> Option<(f64, f64)> {
        self.points.last().copied()
    }
    /// How many non-finite values were pushed, and the first of them.
    pub fn non_finite(&self) -> (usize, Option<(f64, f64)>) {
        (self.non_finite, self.first_non_finite)
    }
    /// The points to draw: at most [`MAX_PLOT_POINTS`].
    pub fn for_plot(&self) -> Vec<(f64, f64)> {
        downsample_minmax(&self.points, MAX_PLOT_POINTS)
    }
}

/// Everything the loss plot draws: training loss per step (mean over ranks, and the min–max
/// band across ranks), and per-epoch validation loss and accuracy at the step the epoch ended.
#[derive(Clone, Debug, Default)]
pub struct Curves {
    world: usize,
    /// step → per-rank losses not yet complete.
    pending: BTreeMap<u64, Vec<Option<f64>>>,
    /// Last step drawn; later reports of it or earlier steps are ignored.
    train_committed: Option<u64>,
    pub train: Series,
    pub band_lo: Series,
    pub band_hi: Series,
    pub val_loss: Series,
    pub val_accuracy: Series,
}

/// Steps kept waiting for a slow rank before they are drawn with the ranks that reported.
const PENDING_STEPS: usize = 32;

impl Curves {
    pub fn new(world: usize) -> Curves {
        Curves {
            world: world.max(1),
            ..Curves::default()
        }
    }

    pub fn world(&self) -> usize {
        self.world.max(1)
    }

    /// Records rank `rank`'s training loss at `step`. A step is drawn once every rank has
    /// reported it (or once it is [`PENDING_STEPS`] behind the newest); a repeated report
    /// replaces the earlier one, so replaying history is harmless.
    pub fn train_loss(&mut self, rank: usize, step: u64, loss: f64) {
        let world = self.world();
        if self.train_committed.is_some_and(|last| step <= last) {
            return; // already drawn
        }
        let slots = self
            .pending
            .entry(step)
            .or_insert_with(|| vec![None; world]);
        if let Some(slot) = slots.get_mut(rank.min(world - 1)) {
            *slot = Some(loss);
        }
        if slots.iter().all(Option::is_some) {
            self.commit_through(step);
        } else if self.pending.len() > PENDING_STEPS {
            let oldest = *self.pending.keys().next().unwrap_or(&step);
            self.commit_through(oldest);
        }
    }

    /// Draws every pending step up to `step` with the ranks that reported it.
    fn commit_through(&mut self, step: u64) {
        let rest = self.pending.split_off(&(step + 1));
        let done = std::mem::replace(&mut self.pending, rest);
        for (s, slots) in done {
            let vals: Vec<f64> = slots.into_iter().flatten().collect();
            if vals.is_empty() {
                continue;
            }
            let x = s as f64;
            if vals.iter().any(|v| !v.is_finite()) {
                self.train.push(x, f64::NAN);
            } else {
                let mean = vals.iter().sum::<f64>() / vals.len() as f64;
                self.train.push(x, mean);
                if self.world > 1 {
                    let lo = vals.iter().copied().fold(f64::INFINITY, f64::min);
                    let hi = vals.iter().copied().fold(f64::NEG_INFINITY, f64::max);
                    self.band_lo.push(x, lo);
                    self.band_hi.push(x, hi);
                }
            }
            self.train_committed = Some(s);
        }
    }

    /// Draws whatever is still pending (the job ended).
    pub fn flush(&mut self) {
        if let Some(&last) = self.pending.keys().next_back() {
            self.commit_through(last);
        }
    }

    /// Records an epoch's validation metrics at the step the epoch ended.
    pub fn validation(&mut self, step: u64, loss: Option<f64>, accuracy: Option<f64>) {
        if let Some(l) = loss {
            if self.val_loss.last().is_none_or(|(x, _)| x < step as f64) {
                self.val_loss.push(step as f64, l);
            }
        }
        if let Some(a) = accuracy {
            if self
                .val_accuracy
                .last()
                .is_none_or(|(x, _)| x < step as f64)
            {
                self.val_accuracy.push(step as f64, a);
            }
        }
    }

    /// Non-finite losses seen so far (training and validation), with the first one's step.
    pub fn non_finite(&self) -> (usize, Option<(f64, f64)>) {
        let (a, fa) = self.train.non_finite();
        let (b, fb) = self.val_loss.non_finite();
        (a + b, fa.or(fb))
    }
}
