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
    /// x of the latest non-finite values (at most [`NON_FINITE_KEPT`]), so that truncation
    /// can uncount the ones it drops and a replayed NaN is not counted twice.
    recent_non_finite: Vec<f64>,
}

/// Non-finite positions a [`Series`] remembers for truncation: more than a restart replays.
const NON_FINITE_KEPT: usize = 1024;

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
            recent_non_finite: Vec::new(),
        }
    }

    /// Adds a point; x should not decrease (steps).
    pub fn push(&mut self, x: f64, y: f64) {
        if !y.is_finite() || !x.is_finite() {
            self.non_finite += 1;
            self.first_non_finite.get_or_insert((x, y));
            self.recent_non_finite.push(x);
            if self.recent_non_finite.len() > 2 * NON_FINITE_KEPT {
                self.recent_non_finite.drain(..NON_FINITE_KEPT);
            }
            return;
        }
        self.points.push((x, y));
        if self.points.len() > self.capacity {
            self.points = downsample_minmax(&self.points, self.capacity / 2);
        }
    }

    /// Drops every point with x > `x` (a restart replays those steps), so that the points
    /// pushed next for them appear once. Points are in x order, so this is a cut of the tail:
    /// what stays is exactly what was stored for x ≤ `x`. After a compaction that is a
    /// down-sampling of those steps, which may keep other points than an uninterrupted run
    /// would, but never a point from after the cut. Non-finite values after the cut are
    /// uncounted too (exactly, unless more than [`NON_FINITE_KEPT`] of them are dropped while
    /// earlier ones stay).
    pub fn truncate_after(&mut self, x: f64) {
        let keep = self.points.partition_point(|p| p.0 <= x);
        self.points.truncate(keep);
        if self.first_non_finite.is_some_and(|(fx, _)| fx > x) {
            // In x order, so every non-finite value came after the cut.
            self.non_finite = 0;
            self.first_non_finite = None;
            self.recent_non_finite.clear();
            return;
        }
        while self.recent_non_finite.last().is_some_and(|&nx| nx > x) {
            self.recent_non_finite.pop();
            self.non_finite -= 1;
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
    /// Steps the job resumed at after a failure, increasing; the latest [`MAX_RESTART_MARKERS`].
    restarts: Vec<u64>,
    /// Every restart, including those whose marker was dropped.
    restart_count: usize,
    /// An elastic job's changes of size (their markers are among `restarts`).
    resize_count: usize,
}

/// Restart markers kept (the latest): a job restarting without limit stays bounded.
pub const MAX_RESTART_MARKERS: usize = 64;

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

    /// The job restarted after a failure and resumed from its checkpoint at `resumed_step`:
    /// the steps after it are reported again, so whatever was drawn or pending for them is
    /// dropped and the replay replaces it instead of being drawn twice. Records a marker at
    /// `resumed_step` (markers after it belonged to the replaced steps and go too).
    pub fn restart(&mut self, resumed_step: u64) {
        // Reports for steps after the checkpoint came from the lost workers' timeline.
        self.pending.retain(|&s, _| s <= resumed_step);
        // Steps up to the checkpoint are never reported again (the replay starts after it):
        // draw them now with the ranks that did report.
        self.flush();
        self.train_committed = self.train_committed.map(|s| s.min(resumed_step));
        let cut = resumed_step as f64;
        for s in [
            &mut self.train,
            &mut self.band_lo,
            &mut self.band_hi,
            &mut self.val_loss,
            &mut self.val_accuracy,
        ] {
            s.truncate_after(cut);
        }
        self.restarts.retain(|&s| s < resumed_step);
        self.restarts.push(resumed_step);
        if self.restarts.len() > MAX_RESTART_MARKERS {
            self.restarts.remove(0);
        }
        self.restart_count += 1;
    }

    /// An elastic job continues with `world` workers from `resumed_step`: the replayed
    /// steps are handled as after a restart (and marked), the change counted apart.
    pub fn resize(&mut self, world: usize, resumed_step: u64) {
        let restarts = self.restart_count;
        self.restart(resumed_step);
        self.restart_count = restarts;
        self.resize_count += 1;
        self.world = world.max(1);
    }

    /// How many times an elastic job changed its size, and its workers now.
    pub fn resizes(&self) -> (usize, usize) {
        (self.resize_count, self.world)
    }

    /// Where the job resumed after each restart, in step order (at most
    /// [`MAX_RESTART_MARKERS`]; the last is the latest restart).
    pub fn restarts(&self) -> &[u64] {
        &self.restarts
    }

    /// How many times the job restarted.
    pub fn restart_count(&self) -> usize {
        self.restart_count
    }

    /// Non-finite losses seen so far (training and validation), with the first one's step.
    pub fn non_finite(&self) -> (usize, Option<(f64, f64)>) {
        let (a, fa) = self.train.non_finite();
        let (b, fb) = self.val_loss.non_finite();
        (a + b, fa.or(fb))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every rank reports `steps` with the loss `f(step, rank)`.
    fn report(c: &mut Curves, steps: std::ops::RangeInclusive<u64>, f: impl Fn(u64, usize) -> f64) {
        for s in steps {
            for r in 0..c.world() {
                c.train_loss(r, s, f(s, r));
            }
        }
    }

    fn loss(s: u64, r: usize) -> f64 {
        1.0 / s as f64 + r as f64 * 0.01
    }

    fn xs(s: &Series) -> Vec<f64> {
        s.points().iter().map(|p| p.0).collect()
    }

    #[test]
    fn truncation_drops_exactly_the_later_points() {
        let mut s = Series::default();
        for x in 1..=25 {
            s.push(x as f64, x as f64 * 0.5);
        }
        let before = s.points().to_vec();
        s.truncate_after(20.0);
        assert_eq!(s.points(), &before[..20]);
        s.truncate_after(20.0);
        assert_eq!(s.points().len(), 20, "truncating again changes nothing");
        s.truncate_after(0.0);
        assert!(s.is_empty());
    }

    #[test]
    fn a_replayed_run_draws_the_same_curves_as_an_uninterrupted_one() {
        let mut whole = Curves::new(2);
        report(&mut whole, 1..=40, loss);
        whole.validation(10, Some(0.5), Some(0.7));
        whole.validation(30, Some(0.3), Some(0.8));
        whole.flush();

        // The lost timeline: steps 21 and 22 drawn with other values, 23..25 pending for a
        // rank that died, and an epoch that ended at step 24.
        let mut c = Curves::new(2);
        report(&mut c, 1..=10, loss);
        c.validation(10, Some(0.5), Some(0.7));
        report(&mut c, 11..=20, loss);
        report(&mut c, 21..=22, |_, _| 99.0);
        for s in 23..=25 {
            c.train_loss(0, s, 99.0);
        }
        c.validation(24, Some(9.0), Some(0.1));
        assert_eq!(c.train.last(), Some((22.0, 99.0)));
        c.restart(20);
        assert_eq!(c.train.last().map(|p| p.0), Some(20.0));
        assert_eq!(c.band_hi.last().map(|p| p.0), Some(20.0));
        assert_eq!(xs(&c.val_loss), [10.0]);
        assert_eq!(xs(&c.val_accuracy), [10.0]);
        // The replay.
        report(&mut c, 21..=40, loss);
        c.validation(30, Some(0.3), Some(0.8));
        c.flush();

        assert_eq!(c.train.points(), whole.train.points());
        assert_eq!(c.band_lo.points(), whole.band_lo.points());
        assert_eq!(c.band_hi.points(), whole.band_hi.points());
        assert_eq!(c.val_loss.points(), whole.val_loss.points());
        assert_eq!(c.val_accuracy.points(), whole.val_accuracy.points());
        assert_eq!(c.restarts(), [20]);
        assert_eq!(c.restart_count(), 1);
    }

    #[test]
    fn restart_draws_the_pending_steps_up_to_the_checkpoint() {
        let mut c = Curves::new(2);
        report(&mut c, 1..=3, loss);
        c.train_loss(0, 4, 0.4); // rank 1 died before reporting step 4
        c.train_loss(0, 5, 0.5);
        c.restart(4);
        assert_eq!(c.train.points().last(), Some(&(4.0, 0.4)));
        c.train_loss(1, 4, 7.0); // a late report of a step already drawn
        report(&mut c, 5..=6, loss);
        assert_eq!(xs(&c.train), [1.0, 2.0, 3.0, 4.0, 5.0, 6.0]);
        assert_eq!(c.train.points()[3], (4.0, 0.4));
        assert_eq!(c.train.points()[4], (5.0, (loss(5, 0) + loss(5, 1)) / 2.0));
    }

    #[test]
    fn replaying_a_compacted_series_keeps_order_and_bounds() {
        let cap = 8;
        let mut s = Series::with_capacity(cap);
        let y = |x: u64| if x == 13 { 100.0 } else { (x % 5) as f64 };
        for x in 1..=40 {
            s.push(x as f64, y(x));
        }
        let before = s.points().to_vec();
        s.truncate_after(30.0);
        let kept = before.iter().filter(|p| p.0 <= 30.0).count();
        assert_eq!(
            s.points(),
            &before[..kept],
            "the stored points up to the cut stay"
        );
        for x in 31..=60 {
            s.push(x as f64, y(x));
        }
        let p = s.points();
        assert!(p.len() <= cap, "{p:?}");
        assert!(
            p.windows(2).all(|w| w[0].0 < w[1].0),
            "each step once: {p:?}"
        );
        assert_eq!(p.last(), Some(&(60.0, y(60))));
        assert!(p.iter().any(|p| p.1 == 100.0), "the spike survives: {p:?}");
    }

    #[test]
    fn replayed_non_finite_values_are_counted_once() {
        let mut s = Series::default();
        for x in 1..=25 {
            s.push(x as f64, if x == 7 || x == 23 { f64::NAN } else { 1.0 });
        }
        assert_eq!(s.non_finite().0, 2);
        s.truncate_after(20.0);
        assert_eq!(s.non_finite().0, 1);
        s.push(23.0, f64::NAN);
        assert_eq!(s.non_finite().0, 2);
        s.truncate_after(5.0);
        assert_eq!(s.non_finite(), (0, None));
    }

    #[test]
    fn restart_markers_are_ordered_and_bounded() {
        let mut c = Curves::new(1);
        assert!(c.restarts().is_empty());
        report(&mut c, 1..=50, loss);
        c.restart(40);
        c.restart(40); // failed again before the next checkpoint
        assert_eq!(c.restarts(), [40]);
        c.restart(30); // resumed from an older checkpoint: the marker at 40 was replaced
        assert_eq!(c.restarts(), [30]);
        assert_eq!(c.restart_count(), 3);
        for i in 0..1000u64 {
            report(&mut c, 31 + i * 10..=40 + i * 10, loss);
            c.restart(35 + i * 10);
        }
        assert_eq!(c.restart_count(), 1003);
        assert_eq!(c.restarts().len(), MAX_RESTART_MARKERS);
        assert_eq!(c.restarts().last(), Some(&(35 + 999 * 10)));
        assert!(c.restarts().windows(2).all(|w| w[0] < w[1]));
        assert_eq!(c.train.last().map(|p| p.0), Some((35 + 999 * 10) as f64));
        assert!(c.train.points().windows(2).all(|w| w[0].0 < w[1].0));
    }

    #[test]
    fn a_resize_replays_like_a_restart_waits_for_the_new_world_and_is_counted_apart() {
        let mut c = Curves::new(4);
        for step in 1..=10 {
            for rank in 0..4 {
                c.train_loss(rank, step, 1.0);
            }
        }
        c.resize(3, 8);
        assert_eq!((c.restart_count(), c.resizes()), (0, (1, 3)));
        assert_eq!(c.restarts(), [8]);
        // Three ranks complete a step now.
        for rank in 0..3 {
            c.train_loss(rank, 9, 2.0);
        }
        assert_eq!(c.train.points().last().map(|p| p.1), Some(2.0));
    }
}
