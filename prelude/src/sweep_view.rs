//! A sweep's updates turned into the widgets' [`SweepView`], and that view shown: live in the
//! trainbook kernel (one display, replaced in place until the sweep ends), as text elsewhere.
//! The terminal (`trainbook sweep`) and the notebook feed through the same [`SweepDashboard`],
//! so they show the same table.

use std::sync::mpsc::Receiver;
use std::sync::Arc;
use std::time::Instant;

use crate::notebook::{show_live, LiveView};
use anyhow::Result;
use trainbook_api::plumbing::format::Shown;
use trainbook_api::plumbing::handles::JobView;
use trainbook_api::{plumbing::trials::best_finished, Goal, SweepJob, SweepUpdate, Trial};
use trainbook_widgets::sweep::{SweepView, TrialRow};
use trainbook_widgets::{Bundle, LogLine};

/// A [`SweepView`] kept up to date from one sweep.
pub struct SweepDashboard {
    view: SweepView,
    goal: Goal,
    trials: Vec<Trial>,
    started: Instant,
}

fn row(t: &Trial, goal: Goal) -> TrialRow {
    TrialRow {
        id: t.id,
        params: t.params.iter().map(|(_, v)| v.to_string()).collect(),
        state: t.status,
        step: t.step,
        total_steps: t.total_steps,
        latest: t.last(),
        best: t.best(goal),
        elapsed: t.elapsed,
        curve: t.reports.clone(),
        note: t
            .error
            .as_deref()
            .map(|e| e.lines().next().unwrap_or(e).to_string())
            .or_else(|| t.note.clone()),
    }
}

impl SweepDashboard {
    /// The view of `sweep` as it stands now.
    pub fn new(sweep: &SweepJob) -> Result<SweepDashboard> {
        let spec = sweep.spec();
        let options = crate::dashboard::dashboard_options(&spec.base.view)?;
        let trials = sweep.trial_states();
        let title = format!(
            "sweep · {} · {} trials · {} · {} on {} ({})",
            spec.base.recipe,
            trials.len(),
            sweep.concurrency(),
            spec.scheduler,
            spec.metric,
            spec.goal.name()
        );
        let mut view = SweepView::new(
            title,
            spec.metric.clone(),
            spec.goal,
            spec.space.iter().map(|(k, _)| k.clone()).collect(),
            options.log_level,
        );
        view.plot = options.plot;
        view.logs.path = Some(format!("{}/trial-*/logs", sweep.dir().display()));
        let mut d = SweepDashboard {
            view,
            goal: spec.goal,
            trials,
            started: Instant::now(),
        };
        d.redo_rows();
        Ok(d)
    }

    fn redo_rows(&mut self) {
        self.view.trials = self.trials.iter().map(|t| row(t, self.goal)).collect();
        let best = best_finished(&self.trials, self.goal)
            .map(|t| t.id)
            .or_else(|| {
                // Before any trial has finished: the best value reported so far.
                self.trials
                    .iter()
                    .filter_map(|t| t.best(self.goal).map(|v| (t.id, v)))
                    .reduce(|a, b| if self.goal.better(b.1, a.1) { b } else { a })
                    .map(|(id, _)| id)
            });
        self.view.best = best.and_then(|id| self.trials.iter().position(|t| t.id == id));
    }

    /// Applies one update; returns the log line when the view's level shows it (the terminal
    /// prints exactly those).
    pub fn apply(&mut self, update: &SweepUpdate) -> Option<LogLine> {
        self.view.elapsed = self.started.elapsed().as_secs_f64();
        match update {
            SweepUpdate::Trial(t) => {
                match self.trials.iter_mut().find(|x| x.id == t.id) {
                    Some(x) => *x = (**t).clone(),
                    None => self.trials.push((**t).clone()),
                }
                self.redo_rows();
                None
            }
            SweepUpdate::Log { trial, line } => {
                let line = log_line(*trial, line);
                self.view.logs.push(line.clone()).then_some(line)
            }
            SweepUpdate::Finished(_) => {
                self.view.finished = true;
                None
            }
        }
    }

    /// The final view: every trial's final state and where the results are.
    pub fn finish(&mut self, sweep: &SweepJob) {
        let r = sweep.result();
        self.trials = r.trials.clone();
        self.redo_rows();
        self.view.finished = true;
        self.view.elapsed = r.elapsed;
        // The view's own line names the best trial; the footer says how it ended and where.
        self.view.footer = Some(match (&r.status, r.best_trial()) {
            (_, Ok(_)) => format!("{} · results in {}", r.status, r.dir.display()),
            (_, Err(e)) => format!("{} · {e} · results in {}", r.status, r.dir.display()),
        });
    }

    pub fn view(&self) -> &SweepView {
        &self.view
    }

    pub fn bundle(&self) -> Bundle {
        self.view.bundle()
    }

    pub fn text(&self) -> String {
        self.view.text()
    }

    /// The text view without its log lines (for a terminal that printed them already).
    pub fn text_without_logs(&self) -> String {
        let mut v = self.view.clone();
        v.logs = trainbook_widgets::LogPanel::new(v.logs.level, 1);
        v.text()
    }
}

/// A worker line of a trial, as the sweep's log panel shows it: `[trial 3] (rank 0) ...`.
fn log_line(trial: usize, s: &Shown) -> LogLine {
    LogLine {
        rank: None,
        text: format!("[trial {trial}] (rank {}) {}", s.rank, s.text),
        repeats: s.repeats.as_ref().map(|r| r.to_string()),
        is_error: s.is_error,
    }
}

/// Shows the sweep's view: live in the trainbook kernel, else its current state as text.
pub fn show(sweep: &SweepJob) -> Result<()> {
    if trainbook_channel::link().is_some() {
        return show_live::<SweepDashboard>(sweep);
    }
    let mut d = SweepDashboard::new(sweep)?;
    if sweep.status() != trainbook_api::SweepStatus::Running {
        d.finish(sweep);
    }
    println!("{}", d.text());
    Ok(())
}

impl LiveView for SweepDashboard {
    type Source = SweepJob;
    type Update = SweepUpdate;
    fn open(sweep: &SweepJob) -> Result<(Self, Receiver<SweepUpdate>)> {
        let updates = sweep.subscribe();
        Ok((SweepDashboard::new(sweep)?, updates))
    }
    fn take(&mut self, u: &SweepUpdate) -> bool {
        self.apply(u);
        matches!(u, SweepUpdate::Finished(_))
    }
    fn bundle(&self) -> Bundle {
        SweepDashboard::bundle(self)
    }
    fn finish(&mut self, sweep: &SweepJob) {
        SweepDashboard::finish(self, sweep)
    }
    fn attach(sweep: &SweepJob, done: Arc<dyn JobView>) {
        sweep.attach_view(done)
    }
    fn name(_: &SweepJob) -> String {
        "the sweep".into()
    }
}
