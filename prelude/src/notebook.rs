//! trainbook inside the trainbook Jupyter kernel: the kernel link (live displays, interrupts).
//!
//! The kernel runs [`attach`] once when it starts. From then on every launched job gets a live
//! dashboard in the cell that launched it ([`show_launched`]), and an interrupt from the notebook stops
//! all running jobs, which makes a waiting `job.wait()` return an error while every variable
//! of the notebook survives. Outside the kernel none of this does anything.

use crate::dashboard::JobDashboard;
use anyhow::{Context, Result};
use std::path::Path;
use std::sync::mpsc::Receiver;
use std::sync::Arc;
use std::time::{Duration, Instant};
use trainbook_api::{plumbing::handles::JobView, Job, JobUpdate};
use trainbook_channel::Link;
use trainbook_widgets::Bundle;

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
            trainbook_engine::stop_all();
        });
        link.on_shutdown(|| {
            trainbook_engine::stop_all();
        });
    });
}

/// How long a cell's own display waits for the kernel to have taken it: it must arrive while
/// the cell still runs, the only time a headless run (nbclient) reads it.
const OUTPUT_FLUSH: Duration = Duration::from_secs(2);

/// A cell's `display(...)`: a display in the kernel, its `text/plain` on stdout elsewhere.
pub(crate) fn show_output(id: Option<&str>, data: Bundle) -> String {
    match trainbook_channel::link() {
        Some(link) => {
            let shown = match id {
                Some(id) => link.display_as(id.to_string(), data),
                None => link.display(data),
            };
            link.sync(OUTPUT_FLUSH);
            shown.id().to_string()
        }
        None => {
            print_plain(&data);
            id.unwrap_or_default().to_string()
        }
    }
}

pub(crate) fn update_output(id: &str, data: Bundle) {
    match trainbook_channel::link() {
        Some(link) => link.display_of(id).update(data),
        None => print_plain(&data),
    }
}

pub(crate) fn clear_output(wait: bool) {
    if let Some(link) = trainbook_channel::link() {
        link.clear_output(wait);
        link.sync(OUTPUT_FLUSH);
    }
}

fn print_plain(data: &Bundle) {
    if let Some(text) = data.get("text/plain").and_then(|t| t.as_str()) {
        println!("{text}");
    }
}

/// Set once a live view has sent the finished job's state to the kernel. Attached to the job as
/// its [`JobView`], so `Job::wait` keeps the waiting cell running until the final view has
/// arrived: headless runs (nbclient) only apply updates that arrive during some cell.
#[derive(Default)]
pub(crate) struct ViewDone {
    done: std::sync::Mutex<bool>,
    cv: std::sync::Condvar,
}

impl ViewDone {
    pub(crate) fn set(&self) {
        *self.done.lock().unwrap_or_else(|e| e.into_inner()) = true;
        self.cv.notify_all();
    }
}

impl JobView for ViewDone {
    fn settle(&self, timeout: Duration) {
        let guard = self.done.lock().unwrap_or_else(|e| e.into_inner());
        let _ = self.cv.wait_timeout_while(guard, timeout, |done| !*done);
    }
}

/// The live dashboard is redrawn at most this often (the plot costs a few ms to draw, and
/// the kernel link sends each display's updates at most 10 times a second anyway).
pub const REDRAW_EVERY: Duration = Duration::from_millis(500);

/// A view the notebook keeps up to date while what it shows runs: a job's dashboard, a
/// sweep's. Its own thread takes in the updates, redraws at most once per [`REDRAW_EVERY`] and
/// draws the final state once the source has finished ([`show_live`]).
pub trait LiveView: Sized + Send + 'static {
    /// What the view shows (a [`Job`], a sweep).
    type Source: Clone + Send + 'static;
    type Update: Send + 'static;
    /// Subscribes to `source`, then reads its state into a new view (in that order, so that
    /// nothing falls in between).
    fn open(source: &Self::Source) -> Result<(Self, Receiver<Self::Update>)>;
    /// Takes in one update; true when it was the last.
    fn take(&mut self, update: &Self::Update) -> bool;
    fn bundle(&self) -> Bundle;
    /// The final state, once the source has finished.
    fn finish(&mut self, source: &Self::Source);
    /// Makes the source's `wait` wait for `done` (the view's final draw).
    fn attach(source: &Self::Source, done: Arc<dyn JobView>);
    /// What the view shows, for its thread's name and messages ("job 3", "the sweep").
    fn name(source: &Self::Source) -> String;
}

impl LiveView for JobDashboard {
    type Source = Job;
    type Update = JobUpdate;
    fn open(job: &Job) -> Result<(Self, Receiver<JobUpdate>)> {
        let updates = job.subscribe();
        Ok((JobDashboard::with_history(job)?, updates))
    }
    fn take(&mut self, u: &JobUpdate) -> bool {
        self.apply(u);
        matches!(u, JobUpdate::Finished(_))
    }
    fn bundle(&self) -> Bundle {
        JobDashboard::bundle(self)
    }
    fn finish(&mut self, job: &Job) {
        JobDashboard::finish(self, job)
    }
    fn attach(job: &Job, done: Arc<dyn JobView>) {
        job.attach_view(done)
    }
    fn name(job: &Job) -> String {
        format!("job {}", job.id())
    }
}

/// Gives a freshly launched job or sweep a live view in the notebook (no-op without a kernel
/// link); a view that cannot start says why on stderr.
pub(crate) fn show_launched<V: LiveView>(source: &V::Source) {
    if let Err(e) = show_live::<V>(source) {
        if let Some(link) = trainbook_channel::link() {
            link.stream(
                trainbook_channel::StreamName::Stderr,
                &format!("trainbook: no live view for {}: {e:#}\n", V::name(source)),
                None,
            );
        }
    }
}

/// Shows `job`'s dashboard: a live one in the trainbook kernel (kept up to date until the job
/// ends, also after the cell returns), else the current state as text on stdout.
pub fn show(job: &Job) -> Result<()> {
    if trainbook_channel::link().is_some() {
        return show_live::<JobDashboard>(job);
    }
    let mut view = JobDashboard::with_history(job)?;
    if job.status().is_finished() {
        view.finish(job);
    }
    println!("{}", view.dashboard().text());
    Ok(())
}

/// A live view of `source` in the notebook, kept up to date by its own thread until the
/// source finishes (no-op without a kernel link).
pub(crate) fn show_live<V: LiveView>(source: &V::Source) -> Result<()> {
    let Some(link) = trainbook_channel::link() else {
        return Ok(());
    };
    let (mut view, updates) = V::open(source)?;
    let flag = Arc::new(ViewDone::default());
    let display = link.display(view.bundle());
    let watched = source.clone();
    let done = flag.clone();
    let spawned = std::thread::Builder::new()
        .name(format!("trainbook-view {}", V::name(source)))
        .spawn(move || {
            follow(&mut view, &updates, REDRAW_EVERY, |b| display.update(b));
            view.finish(&watched);
            display.update(view.bundle());
            // The final view must reach the notebook even if the process exits next.
            display.flush(Duration::from_secs(2));
            done.set();
        });
    // Attached only once its thread runs, so a job never waits on a view that cannot finish.
    match spawned {
        Ok(_) => V::attach(source, flag),
        Err(e) => anyhow::bail!("cannot start the view thread: {e}"),
    }
    Ok(())
}

/// Applies updates until the source finishes, redrawing at most once per `every` (and only
/// when something changed). Returns how many times it drew. Under a flood of events this
/// bounds both the CPU spent drawing and what goes to the notebook.
pub fn follow<V: LiveView>(
    view: &mut V,
    updates: &Receiver<V::Update>,
    every: Duration,
    mut draw: impl FnMut(Bundle),
) -> usize {
    let view = std::cell::RefCell::new(view);
    follow_updates(
        updates,
        every,
        |u| view.borrow_mut().take(u),
        || draw(view.borrow().bundle()),
    )
}

/// The loop behind every live view: `apply` each update (it says whether it was the last),
/// and `draw` at most once per `every`, only after a change. Returns how many times it drew.
fn follow_updates<U>(
    updates: &Receiver<U>,
    every: Duration,
    mut apply: impl FnMut(&U) -> bool,
    mut draw: impl FnMut(),
) -> usize {
    use std::sync::mpsc::RecvTimeoutError;
    let mut drawn = 0;
    let mut dirty = false;
    let mut last = Instant::now();
    loop {
        let wait = if dirty {
            every.saturating_sub(last.elapsed())
        } else {
            Duration::from_secs(3600)
        };
        match updates.recv_timeout(wait) {
            Ok(u) => {
                if apply(&u) {
                    return drawn;
                }
                dirty = true;
            }
            Err(RecvTimeoutError::Timeout) => {}
            Err(RecvTimeoutError::Disconnected) => return drawn,
        }
        if dirty && last.elapsed() >= every {
            draw();
            drawn += 1;
            dirty = false;
            last = Instant::now();
        }
    }
}
