//! trainbook inside the trainbook Jupyter kernel: the kernel link (live displays, interrupts).
//!
//! The kernel runs [`attach`] once when it starts. From then on every launched job gets a live
//! view in the cell that launched it ([`show_job`]), and an interrupt from the notebook stops
//! all running jobs, which makes a waiting `job.wait()` return an error while every variable
//! of the notebook survives. Outside the kernel none of this does anything.

use crate::dedup::Shown;
use crate::job::{self, Job, JobStatus, Progress, Update};
use anyhow::{Context, Result};
use serde_json::Value;
use std::collections::{BTreeMap, VecDeque};
use std::path::Path;
use std::time::Duration;
use trainbook_channel::{Link, MimeBundle};
use trainbook_widgets::{format_duration, progress_line};

/// Log lines a job's live view keeps (the run directory has them all).
const VIEW_LOG_LINES: usize = 8;

/// Connects to the kernel named in `TRAINBOOK_KERNEL_CHANNEL`, if any. Returns whether this
/// process now has a kernel link. Idempotent.
pub fn attach() -> Result<bool> {
    match trainbook_channel::connect_from_env()
        .context("cannot reach the kernel's display channel")?
    {
        Some(link) => {
            install_handlers(link);
            Ok(true)
        }
        None => Ok(false),
    }
}

/// [`attach`] to the kernel socket at `path` (tests, or a kernel started by hand).
pub fn attach_to(path: &Path) -> Result<()> {
    let link = trainbook_channel::connect(path)
        .with_context(|| format!("cannot connect to {}", path.display()))?;
    install_handlers(link);
    Ok(())
}

fn install_handlers(link: &'static Link) {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        link.on_interrupt(|| {
            job::stop_all();
        });
        link.on_shutdown(|| {
            job::stop_all();
        });
    });
}

/// Jobs whose live view has not yet delivered its final state (job id → done flag).
type Pending = std::sync::Mutex<std::collections::HashMap<u64, std::sync::Arc<ViewDone>>>;
static PENDING_VIEWS: std::sync::OnceLock<Pending> = std::sync::OnceLock::new();

#[derive(Default)]
struct ViewDone {
    done: std::sync::Mutex<bool>,
    cv: std::sync::Condvar,
}

fn pending(
) -> std::sync::MutexGuard<'static, std::collections::HashMap<u64, std::sync::Arc<ViewDone>>> {
    PENDING_VIEWS
        .get_or_init(Default::default)
        .lock()
        .unwrap_or_else(|e| e.into_inner())
}

/// Blocks (up to `timeout`) until a finished job's live view has sent its final state to the
/// kernel. `Job::wait` calls it, so the cell that waits is still running when the final view
/// arrives: headless runs (nbclient) only apply updates that arrive during some cell.
pub(crate) fn settle(job_id: u64, timeout: Duration) {
    let Some(flag) = pending().get(&job_id).cloned() else {
        return;
    };
    let guard = flag.done.lock().unwrap_or_else(|e| e.into_inner());
    let _ = flag.cv.wait_timeout_while(guard, timeout, |done| !*done);
}

/// Gives a freshly launched job a live view in the notebook (no-op without a kernel link).
pub(crate) fn show_job(job: &Job) {
    let Some(link) = trainbook_channel::link() else {
        return;
    };
    let flag = std::sync::Arc::new(ViewDone::default());
    pending().insert(job.id(), flag.clone());
    let mut view = JobView::new(job);
    let display = link.display(render(&view));
    let id = job.id();
    let job = job.clone();
    let updates = job.subscribe();
    let spawned = std::thread::Builder::new()
        .name(format!("trainbook-view-{id}"))
        .spawn(move || {
            for update in updates {
                let finished = matches!(update, Update::Finished(_));
                view.apply(update);
                if finished {
                    view.finish(&job);
                    display.update(render(&view));
                    break;
                }
                display.update(render(&view));
            }
            // The final view must reach the notebook even if the process exits next.
            display.flush(Duration::from_secs(2));
            *flag.done.lock().unwrap_or_else(|e| e.into_inner()) = true;
            flag.cv.notify_all();
            pending().remove(&id);
        });
    if let Err(e) = spawned {
        pending().remove(&id);
        link.stream(
            trainbook_channel::StreamName::Stderr,
            &format!("trainbook: no live view for job {id}: {e}\n"),
            None,
        );
    }
}

/// What a job's live view shows; plain data, so rendering is a pure function.
#[derive(Clone, Debug, Default)]
pub struct JobView {
    pub id: u64,
    pub recipe: String,
    pub workers: usize,
    pub device: String,
    pub status: String,
    pub progress: Option<Progress>,
    pub train_loss: Option<f64>,
    pub eval: BTreeMap<String, f64>,
    pub logs: VecDeque<(String, bool)>,
    pub run_dir: String,
    pub final_metrics: BTreeMap<String, f64>,
    pub error: Option<String>,
}

impl JobView {
    fn new(job: &Job) -> JobView {
        JobView {
            id: job.id(),
            recipe: job.spec().recipe.clone(),
            workers: job.spec().workers,
            device: job.device().name().to_string(),
            status: job.status().name().to_string(),
            run_dir: job.run_dir().display().to_string(),
            ..JobView::default()
        }
    }

    fn apply(&mut self, update: Update) {
        match update {
            Update::Log(shown) => self.log(&shown),
            Update::Metric(m) => {
                if m.name == "train_loss" || m.name == "loss" {
                    self.train_loss = Some(m.value);
                } else if m.name.starts_with("eval_") {
                    self.eval.insert(m.name.clone(), m.value);
                }
            }
            Update::Progress(p) => {
                self.status = JobStatus::Running.name().to_string();
                self.progress = Some(p);
            }
            Update::Checkpoint { .. } => {}
            Update::Finished(s) => self.status = s.name().to_string(),
        }
    }

    fn log(&mut self, shown: &Shown) {
        if self.logs.len() == VIEW_LOG_LINES {
            self.logs.pop_front();
        }
        self.logs.push_back((shown.to_string(), shown.is_error));
    }

    fn finish(&mut self, job: &Job) {
        if let Ok(r) = job.result() {
            self.status = r.status.name().to_string();
            self.final_metrics = r.metrics.clone();
            self.error = r.error.clone();
        }
    }
}

/// The view as a MIME bundle: HTML for notebooks, the same facts as plain text.
pub fn render(v: &JobView) -> MimeBundle {
    let headline = format!(
        "trainbook job {} · {} · {} worker{} on {} · {}",
        v.id,
        v.recipe,
        v.workers,
        if v.workers == 1 { "" } else { "s" },
        v.device,
        v.status
    );
    let progress = v.progress.as_ref().map(|p| {
        progress_line(
            p.epoch,
            p.epochs,
            p.step,
            p.total_steps,
            v.train_loss,
            p.samples_per_second,
            p.elapsed,
        ) + &format!(" · elapsed {}", format_duration(p.elapsed))
    });
    let fraction = v
        .progress
        .as_ref()
        .filter(|p| p.total_steps > 0)
        .map(|p| (p.step as f64 / p.total_steps as f64).clamp(0.0, 1.0));
    let metrics = if v.final_metrics.is_empty() {
        &v.eval
    } else {
        &v.final_metrics
    };
    let metric_text: Vec<String> = metrics
        .iter()
        .map(|(k, val)| format!("{k} {}", fmt_metric(*val)))
        .collect();

    let mut text = vec![headline.clone()];
    text.extend(progress.clone());
    if !metric_text.is_empty() {
        text.push(metric_text.join(" · "));
    }
    text.extend(v.logs.iter().map(|(l, _)| l.clone()));
    if let Some(e) = &v.error {
        text.push(format!("error: {e}"));
    }
    text.push(format!("run directory: {}", v.run_dir));

    let color = match v.status.as_str() {
        "succeeded" => "#2e7d32",
        "failed" => "#c62828",
        "stopped" => "#ef6c00",
        _ => "#1565c0",
    };
    let mut html = format!(
        "<div class=\"trainbook-job\" style=\"font-family:var(--jp-ui-font-family,sans-serif);font-size:13px\">\
         <div><b>{}</b> <span style=\"color:{color};font-weight:bold\">{}</span></div>",
        escape(&headline[..headline.rfind(" · ").unwrap_or(headline.len())]),
        escape(&v.status)
    );
    if let Some(f) = fraction {
        html.push_str(&format!(
            "<progress value=\"{:.4}\" max=\"1\" style=\"width:60%\"></progress> {:.0}%",
            f,
            f * 100.0
        ));
    }
    if let Some(p) = &progress {
        html.push_str(&format!("<div>{}</div>", escape(p)));
    }
    if !metric_text.is_empty() {
        html.push_str(&format!("<div>{}</div>", escape(&metric_text.join(" · "))));
    }
    if !v.logs.is_empty() {
        html.push_str("<pre style=\"margin:4px 0;max-height:12em;overflow:auto\">");
        for (line, is_error) in &v.logs {
            if *is_error {
                html.push_str(&format!(
                    "<span style=\"color:#c62828\">{}</span>\n",
                    escape(line)
                ));
            } else {
                html.push_str(&escape(line));
                html.push('\n');
            }
        }
        html.push_str("</pre>");
    }
    if let Some(e) = &v.error {
        html.push_str(&format!(
            "<pre style=\"color:#c62828;white-space:pre-wrap\">{}</pre>",
            escape(e)
        ));
    }
    html.push_str(&format!(
        "<div style=\"color:#666\">run directory: <code>{}</code></div></div>",
        escape(&v.run_dir)
    ));

    let mut b = MimeBundle::new();
    b.insert("text/plain".into(), Value::String(text.join("\n")));
    b.insert("text/html".into(), Value::String(html));
    b
}

fn fmt_metric(v: f64) -> String {
    if !v.is_finite() {
        format!("{v}")
    } else if v.abs() >= 1000.0 {
        format!("{v:.0}")
    } else {
        format!("{v:.4}")
    }
}

fn escape(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn render_escapes_logs_and_shows_progress_and_errors() {
        let mut v = JobView {
            id: 3,
            recipe: "bert".into(),
            workers: 2,
            device: "cpu".into(),
            status: "running".into(),
            progress: Some(Progress {
                step: 5,
                total_steps: 10,
                epoch: 0,
                epochs: 1,
                samples: 80,
                samples_per_second: 16.0,
                elapsed: 5.0,
            }),
            train_loss: Some(0.5),
            run_dir: "/runs/x".into(),
            ..JobView::default()
        };
        v.logs.push_back(("(rank 0) <b>loss</b>".into(), false));
        v.logs.push_back(("(rank 1) boom".into(), true));
        let b = render(&v);
        let html = b["text/html"].as_str().unwrap();
        assert!(html.contains("&lt;b&gt;loss&lt;/b&gt;"), "{html}");
        assert!(html.contains("<progress value=\"0.5000\""));
        assert!(html.contains("color:#c62828\">(rank 1) boom"));
        let text = b["text/plain"].as_str().unwrap();
        assert!(text.starts_with("trainbook job 3 · bert · 2 workers on cpu · running"));
        assert!(text.contains("step 5/10") && text.contains("loss 0.5000"));
        v.status = "failed".into();
        v.error = Some("worker rank 1 failed".into());
        let text = render(&v)["text/plain"].as_str().unwrap().to_string();
        assert!(text.contains("· failed") && text.contains("error: worker rank 1 failed"));
    }
}
