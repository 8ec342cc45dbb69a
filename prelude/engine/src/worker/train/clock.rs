//! Step timing: throughput (all samples, and the steady part after the first steps) and when
//! rank 0's next progress event is due.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use trainbook_api::metric;

/// Progress events are rate-limited: a notebook does not need 1000 updates a second.
pub(super) const PROGRESS_EVERY: Duration = Duration::from_millis(100);

/// Steps left out of `train_samples_per_second` at the start (fewer in runs under 50 steps).
const THROUGHPUT_WARMUP_STEPS: u64 = 5;

/// Throughput bookkeeping: all samples since the start, and the steady part after the first
/// steps (allocator, caches and thread pools warming up), as BERT pre-training scripts report it.
pub(super) struct Clock {
    /// This rank's samples, and its time in training epochs (evaluation left out).
    pub(super) samples: u64,
    pub(super) train_time: Duration,
    /// The first step counted in the steady throughput, and what was counted from it on.
    steady_from: u64,
    steady_samples: u64,
    steady_time: Duration,
    last_progress: Instant,
    /// When the current epoch's training started.
    epoch_start: Instant,
}

impl Clock {
    /// A clock for a run from `step` to `total_steps`: throughput counts from a tenth of the
    /// run in, at most [`THROUGHPUT_WARMUP_STEPS`] steps.
    pub(super) fn new(step: u64, total_steps: u64, now: Instant) -> Self {
        Clock {
            samples: 0,
            train_time: Duration::ZERO,
            steady_from: step
                + (total_steps - step)
                    .div_ceil(10)
                    .min(THROUGHPUT_WARMUP_STEPS),
            steady_samples: 0,
            steady_time: Duration::ZERO,
            last_progress: now - PROGRESS_EVERY,
            epoch_start: now,
        }
    }

    /// An epoch's training starts.
    pub(super) fn start_epoch(&mut self, now: Instant) {
        self.epoch_start = now;
    }

    /// An epoch's training ends: its time counts.
    pub(super) fn end_epoch(&mut self) {
        self.train_time += self.epoch_start.elapsed();
    }

    /// Step `index` (0-based) took `took` for `samples` samples on this rank.
    pub(super) fn count(&mut self, index: u64, samples: usize, took: Duration) {
        if index >= self.steady_from {
            self.steady_samples += samples as u64;
            self.steady_time += took;
        }
        self.samples += samples as u64;
    }

    /// Whether a progress event is due at `now`: [`PROGRESS_EVERY`] after the last one, and at
    /// the run's end. A due event counts as sent.
    pub(super) fn progress_due(&mut self, now: Instant, at_end: bool) -> bool {
        if now.saturating_duration_since(self.last_progress) < PROGRESS_EVERY && !at_end {
            return false;
        }
        self.last_progress = now;
        true
    }

    /// All `world` ranks' samples so far, and their rate over the training time until `now`
    /// (the current epoch's included).
    pub(super) fn rate(&self, world: usize, now: Instant) -> (u64, f64) {
        let secs =
            (self.train_time + now.saturating_duration_since(self.epoch_start)).as_secs_f64();
        let samples = self.samples * world as u64;
        let per_second = if secs > 0.0 {
            samples as f64 / secs
        } else {
            0.0
        };
        (samples, per_second)
    }

    /// The throughput metrics of `world` ranks (each with this rank's numbers): all samples
    /// over the training time, and the steady part once it has begun.
    pub(super) fn throughput(&self, world: usize, m: &mut BTreeMap<String, f64>) {
        let sps = self.samples as f64 * world as f64 / self.train_time.as_secs_f64().max(1e-9);
        m.insert(metric::SAMPLES_PER_SECOND.to_string(), sps);
        if self.steady_time > Duration::ZERO {
            m.insert(
                metric::TRAIN_SAMPLES_PER_SECOND.to_string(),
                self.steady_samples as f64 * world as f64 / self.steady_time.as_secs_f64(),
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn steady_throughput_starts_a_tenth_in_at_most_five_steps() {
        let now = Instant::now();
        assert_eq!(Clock::new(0, 20, now).steady_from, 2);
        assert_eq!(Clock::new(0, 21, now).steady_from, 3);
        assert_eq!(Clock::new(0, 1000, now).steady_from, 5);
        // A resumed run counts from where it resumed.
        assert_eq!(Clock::new(100, 130, now).steady_from, 103);
        assert_eq!(Clock::new(99, 100, now).steady_from, 100);
    }

    #[test]
    fn warm_up_steps_count_in_samples_only() {
        let mut c = Clock::new(0, 20, Instant::now());
        let ms = Duration::from_millis;
        c.count(0, 8, ms(900));
        c.count(1, 8, ms(900));
        c.count(2, 8, ms(100));
        c.count(3, 6, ms(100));
        assert_eq!((c.samples, c.steady_samples), (30, 14));
        assert_eq!(c.steady_time, ms(200));
        c.train_time = Duration::from_secs(2);
        let mut m = BTreeMap::new();
        c.throughput(2, &mut m);
        assert_eq!(m[metric::SAMPLES_PER_SECOND], 30.0);
        assert_eq!(m[metric::TRAIN_SAMPLES_PER_SECOND], 140.0);
    }

    #[test]
    fn no_steady_throughput_before_its_first_step() {
        let mut c = Clock::new(0, 100, Instant::now());
        c.count(0, 8, Duration::from_millis(10));
        c.train_time = Duration::from_secs(4);
        let mut m = BTreeMap::new();
        c.throughput(1, &mut m);
        assert_eq!(m[metric::SAMPLES_PER_SECOND], 2.0);
        assert!(!m.contains_key(metric::TRAIN_SAMPLES_PER_SECOND));
    }

    #[test]
    fn progress_is_due_every_100ms_and_at_the_end() {
        let t0 = Instant::now();
        let mut c = Clock::new(0, 10, t0);
        assert!(c.progress_due(t0, false), "the first one at once");
        assert!(!c.progress_due(t0 + Duration::from_millis(50), false));
        assert!(c.progress_due(t0 + Duration::from_millis(60), true));
        // Counted from the last one sent (at 60 ms).
        assert!(!c.progress_due(t0 + Duration::from_millis(120), false));
        assert!(c.progress_due(t0 + Duration::from_millis(160), false));
    }

    #[test]
    fn rate_counts_every_rank_and_the_current_epoch() {
        let t0 = Instant::now();
        let mut c = Clock::new(0, 10, t0);
        c.count(0, 50, Duration::ZERO);
        c.train_time = Duration::from_secs(1);
        c.start_epoch(t0);
        assert_eq!(c.rate(4, t0 + Duration::from_secs(1)), (200, 100.0));
        assert_eq!(Clock::new(0, 10, t0).rate(2, t0), (0, 0.0));
    }
}
