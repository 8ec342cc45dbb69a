//! The progress widget: status, epoch and step, %, samples/s, elapsed and ETA.

use crate::format::{format_duration, progress_line};
use crate::html::escape;
use crate::theme::{BLUE, GREEN, GREY, ORANGE, RED};
use trainbook_api::JobStatus;

/// The colour of a job's status.
pub fn status_color(s: JobStatus) -> &'static str {
    match s {
        JobStatus::Starting => GREY,
        JobStatus::Running => BLUE,
        JobStatus::Succeeded => GREEN,
        JobStatus::Failed => RED,
        JobStatus::Stopped => ORANGE,
    }
}

/// The symbol before a job's status.
fn status_symbol(s: JobStatus) -> &'static str {
    match s {
        JobStatus::Starting | JobStatus::Running => "●",
        JobStatus::Succeeded => "✓",
        JobStatus::Failed => "✗",
        JobStatus::Stopped => "■",
    }
}

/// Progress of a run as plain data.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ProgressView {
    pub status: JobStatus,
    /// Zero-based epoch in progress.
    pub epoch: u64,
    pub epochs: u64,
    pub step: u64,
    pub total_steps: u64,
    pub samples_per_second: f64,
    pub elapsed: f64,
    /// Latest training loss (mean over ranks).
    pub loss: Option<f64>,
}

impl ProgressView {
    /// Fraction done, if the total is known.
    pub fn fraction(&self) -> Option<f64> {
        if self.status == JobStatus::Succeeded {
            return Some(1.0);
        }
        (self.total_steps > 0).then(|| (self.step as f64 / self.total_steps as f64).clamp(0.0, 1.0))
    }

    /// `epoch 1/2 · step 40/100 · loss 0.4100 · 30.0 samples/s · ETA 20.0s · elapsed 13.0s`
    /// (ETA only while running).
    pub fn line(&self) -> String {
        if self.total_steps == 0 && self.step == 0 {
            return format!(
                "waiting for workers · elapsed {}",
                format_duration(self.elapsed)
            );
        }
        let mut l = progress_line(
            self.epoch,
            self.epochs,
            self.step,
            self.total_steps,
            self.loss,
            self.samples_per_second,
            self.elapsed,
        );
        if self.status.is_finished() {
            if let Some(i) = l.find(" · ETA") {
                l.truncate(i);
            }
        }
        l + &format!(" · elapsed {}", format_duration(self.elapsed))
    }

    /// Plain text: `● running [██████░░░░░░░░░░░░░░]  30% epoch 1/2 · ...`.
    pub fn text(&self) -> String {
        let bar = match self.fraction() {
            Some(f) => format!("{} {:>3.0}% ", text_bar(f, 20), f * 100.0),
            None => String::new(),
        };
        format!(
            "{} {} {bar}{}",
            status_symbol(self.status),
            self.status.name(),
            self.line()
        )
    }

    pub fn html(&self) -> String {
        let mut h = format!(
            "<div class=\"trainbook-progress\" style=\"display:flex;gap:8px;align-items:center;flex-wrap:wrap\">\
             <span style=\"color:{};font-weight:bold\">{} {}</span>",
            status_color(self.status),
            status_symbol(self.status),
            self.status.name()
        );
        if let Some(f) = self.fraction() {
            h.push_str(&format!(
                "<span style=\"display:inline-block;width:240px;height:10px;background:#e0e0e0;border-radius:5px;overflow:hidden\">\
                 <span style=\"display:block;width:{:.1}%;height:100%;background:{}\"></span></span>\
                 <span style=\"font-variant-numeric:tabular-nums\">{:.0}%</span>",
                f * 100.0,
                status_color(self.status),
                f * 100.0
            ));
        }
        h.push_str(&format!(
            "<span style=\"font-variant-numeric:tabular-nums\">{}</span></div>",
            escape(&self.line())
        ));
        h
    }
}

/// `[██████░░░░]` for 0.6 at width 10.
pub fn text_bar(fraction: f64, width: usize) -> String {
    let f = if fraction.is_finite() {
        fraction.clamp(0.0, 1.0)
    } else {
        0.0
    };
    let full = (f * width as f64).round() as usize;
    format!("[{}{}]", "█".repeat(full), "░".repeat(width - full))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn text_and_html_agree_and_finished_runs_have_no_eta() {
        let mut p = ProgressView {
            status: JobStatus::Running,
            epoch: 0,
            epochs: 2,
            step: 30,
            total_steps: 100,
            samples_per_second: 30.0,
            elapsed: 10.0,
            loss: Some(0.41),
        };
        let t = p.text();
        assert!(
            t.starts_with("● running [██████░░░░░░░░░░░░░░]  30% epoch 1/2 · step 30/100"),
            "{t}"
        );
        assert!(t.contains("ETA") && t.contains("elapsed 10.0s"), "{t}");
        assert!(p.html().contains("width:30.0%") && p.html().contains("step 30/100"));
        p.status = JobStatus::Failed;
        assert!(!p.text().contains("ETA"), "{}", p.text());
        p.status = JobStatus::Succeeded;
        assert_eq!(p.fraction(), Some(1.0));
        assert_eq!(text_bar(f64::NAN, 4), "[░░░░]");
    }

    #[test]
    fn before_the_first_step_it_says_so() {
        let p = ProgressView::default();
        assert_eq!(p.fraction(), None);
        assert!(
            p.text().contains("starting waiting for workers"),
            "{}",
            p.text()
        );
    }
}
