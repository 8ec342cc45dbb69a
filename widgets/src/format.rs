//! Numbers and durations as people read them.

/// `75.0` → `"1m 15s"`, `3723.0` → `"1h 02m"`, `4.25` → `"4.2s"`.
pub fn format_duration(secs: f64) -> String {
    if !secs.is_finite() || secs < 0.0 {
        return "?".into();
    }
    if secs < 60.0 {
        return format!("{secs:.1}s");
    }
    let s = secs.round() as u64;
    if s < 3600 {
        format!("{}m {:02}s", s / 60, s % 60)
    } else {
        format!("{}h {:02}m", s / 3600, (s % 3600) / 60)
    }
}

/// Samples per second with a unit suffix: `1234.5` → `"1.23k samples/s"`.
pub fn format_rate(per_sec: f64, unit: &str) -> String {
    if !per_sec.is_finite() || per_sec <= 0.0 {
        return format!("- {unit}/s");
    }
    let (v, suffix) = if per_sec >= 1e6 {
        (per_sec / 1e6, "M")
    } else if per_sec >= 1e3 {
        (per_sec / 1e3, "k")
    } else {
        (per_sec, "")
    };
    let digits = if v >= 100.0 {
        0
    } else if v >= 10.0 {
        1
    } else {
        2
    };
    format!("{v:.digits$}{suffix} {unit}/s")
}

/// Seconds left at the current pace, if it can be told.
pub fn eta(done: u64, total: u64, elapsed: f64) -> Option<f64> {
    if done == 0 || total < done || !elapsed.is_finite() {
        return None;
    }
    Some(elapsed / done as f64 * (total - done) as f64)
}

/// One-line status used by the terminal progress bar and as the notebook's plain-text twin:
/// `epoch 2/10 · step 340/1250 · loss 0.4213 · 812 samples/s · ETA 1m 05s`.
pub fn progress_line(
    epoch: u64,
    epochs: u64,
    step: u64,
    total: u64,
    loss: Option<f64>,
    samples_per_sec: f64,
    elapsed: f64,
) -> String {
    let mut parts = vec![
        format!("epoch {}/{}", (epoch + 1).min(epochs.max(1)), epochs.max(1)),
        format!("step {step}/{total}"),
    ];
    if let Some(l) = loss {
        parts.push(if l.is_finite() {
            format!("loss {l:.4}")
        } else {
            format!("loss {l} (!)")
        });
    }
    parts.push(format_rate(samples_per_sec, "samples"));
    if let Some(e) = eta(step, total, elapsed) {
        parts.push(format!("ETA {}", format_duration(e)));
    }
    parts.join(" · ")
}

/// A metric value with sensible digits: `0.4213`, `1234`, `NaN`.
pub fn format_metric(v: f64) -> String {
    if !v.is_finite() {
        format!("{v}")
    } else if v.abs() >= 1000.0 {
        format!("{v:.0}")
    } else if v != 0.0 && v.abs() < 1e-3 {
        format!("{v:.2e}")
    } else {
        format!("{v:.4}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_read_naturally() {
        assert_eq!(format_duration(4.25), "4.2s");
        assert_eq!(format_duration(75.0), "1m 15s");
        assert_eq!(format_duration(3723.0), "1h 02m");
        assert_eq!(format_duration(f64::NAN), "?");
    }

    #[test]
    fn rates_have_units_and_sensible_digits() {
        assert_eq!(format_rate(1234.5, "samples"), "1.23k samples/s");
        assert_eq!(format_rate(12.0, "img"), "12.0 img/s");
        assert_eq!(format_rate(0.0, "samples"), "- samples/s");
        assert_eq!(format_rate(2.5e6, "tok"), "2.50M tok/s");
    }

    #[test]
    fn progress_line_flags_non_finite_loss_and_shows_eta() {
        let l = progress_line(0, 2, 50, 100, Some(f64::NAN), 100.0, 10.0);
        assert!(l.contains("loss NaN (!)"), "{l}");
        assert!(l.contains("ETA 10.0s"), "{l}");
        assert!(l.starts_with("epoch 1/2 · step 50/100"), "{l}");
        assert_eq!(eta(0, 10, 1.0), None);
    }

    #[test]
    fn metrics_keep_small_values_visible() {
        assert_eq!(format_metric(0.42131), "0.4213");
        assert_eq!(format_metric(12345.6), "12346");
        assert_eq!(format_metric(0.00002), "2.00e-5");
        assert_eq!(format_metric(f64::INFINITY), "inf");
    }
}
