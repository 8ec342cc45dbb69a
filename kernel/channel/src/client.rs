//! The notebook side of the channel: a process-wide [`Link`] to the kernel.
//!
//! Callers never touch the socket: messages go to a queue that a writer thread drains, so a
//! training job's display update costs a lock and a map insert. Updates of one display are
//! coalesced to one write per [`MIN_UPDATE_INTERVAL`]; the newest always gets through.

use crate::{
    encode, MimeBundle, StreamName, ToKernel, ToNotebook, MIN_UPDATE_INTERVAL, SOCKET_ENV,
};
use std::collections::{HashMap, VecDeque};
use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, OnceLock};
use std::time::{Duration, Instant};

/// Ordered messages (displays, text) kept while the kernel is slow to read; beyond this, text is
/// dropped (and counted) rather than memory growing without bound.
const MAX_QUEUED: usize = 10_000;

type Handler = Arc<dyn Fn() + Send + Sync>;

/// A connection to the kernel.
pub struct Link {
    shared: Arc<Shared>,
    next_display: AtomicU64,
}

struct Shared {
    state: Mutex<State>,
    wake: Condvar,
    on_interrupt: Mutex<Vec<Handler>>,
    on_shutdown: Mutex<Vec<Handler>>,
}

#[derive(Default)]
struct State {
    /// Displays and text, in order.
    queue: VecDeque<ToKernel>,
    /// Latest unsent update per display.
    pending: HashMap<String, (MimeBundle, MimeBundle)>,
    /// When each display's last update was written.
    last_sent: HashMap<String, Instant>,
    /// Messages taken by the writer but not yet written (for `flush`).
    in_flight: usize,
    /// The last [`ToKernel::Sync`] sent and the last the kernel answered.
    sync_sent: u64,
    synced: u64,
    dropped: u64,
    closed: bool,
}

impl State {
    fn idle(&self) -> bool {
        self.queue.is_empty() && self.pending.is_empty() && self.in_flight == 0
    }
}

/// An output area in the notebook that can be redrawn in place.
#[derive(Clone)]
pub struct Display {
    id: String,
    shared: Arc<Shared>,
}

static LINK: OnceLock<Link> = OnceLock::new();

/// Connects to the kernel at `path` (once per process; later calls return the same link).
pub fn connect(path: &Path) -> std::io::Result<&'static Link> {
    if let Some(link) = LINK.get() {
        return Ok(link);
    }
    let link = Link::connect_new(path)?;
    // Two threads racing here both connected; the loser's link is dropped (its threads end
    // when the kernel sees the extra connection close).
    Ok(LINK.get_or_init(|| link))
}

/// Connects to the kernel named in `TRAINBOOK_KERNEL_CHANNEL`; `None` outside the kernel.
pub fn connect_from_env() -> std::io::Result<Option<&'static Link>> {
    match std::env::var_os(SOCKET_ENV) {
        Some(p) if !p.is_empty() => connect(Path::new(&p)).map(Some),
        _ => Ok(None),
    }
}

/// The process's link, if [`connect`] succeeded.
pub fn link() -> Option<&'static Link> {
    LINK.get()
}

impl Link {
    /// A new, independent connection (the process-wide one is made by [`connect`]).
    pub fn connect_new(path: &Path) -> std::io::Result<Link> {
        let stream = UnixStream::connect(path)?;
        let reader = stream.try_clone()?;
        let shared = Arc::new(Shared {
            state: Mutex::new(State::default()),
            wake: Condvar::new(),
            on_interrupt: Mutex::new(Vec::new()),
            on_shutdown: Mutex::new(Vec::new()),
        });
        shared.push(ToKernel::Hello {
            pid: std::process::id(),
        });
        let s = shared.clone();
        std::thread::Builder::new()
            .name("kernel-link-write".into())
            .spawn(move || write_loop(stream, s))?;
        let s = shared.clone();
        std::thread::Builder::new()
            .name("kernel-link-read".into())
            .spawn(move || read_loop(reader, s))?;
        Ok(Link {
            shared,
            next_display: AtomicU64::new(1),
        })
    }

    /// Creates a display showing `data` in the running cell (or, between cells, the next one).
    pub fn display(&self, data: MimeBundle) -> Display {
        let n = self.next_display.fetch_add(1, Ordering::Relaxed);
        self.display_as(format!("trainbook-{}-{n}", std::process::id()), data)
    }

    /// [`Link::display`] under an id of the caller's (showing the same id again shows another
    /// view of one display: an update redraws them all).
    pub fn display_as(&self, id: String, data: MimeBundle) -> Display {
        self.shared.push(ToKernel::Display {
            display_id: id.clone(),
            data,
            metadata: MimeBundle::new(),
        });
        Display {
            id,
            shared: self.shared.clone(),
        }
    }

    /// The display `id` made earlier (by this process), to update it.
    pub fn display_of(&self, id: &str) -> Display {
        Display {
            id: id.to_string(),
            shared: self.shared.clone(),
        }
    }

    /// Clears the running cell's output; with `wait`, once its next output arrives.
    pub fn clear_output(&self, wait: bool) {
        self.shared.push(ToKernel::Clear { wait });
    }

    /// Text for the notebook; with `display_id`, for the cell that owns that display.
    pub fn stream(&self, name: StreamName, text: &str, display_id: Option<&str>) {
        self.shared.push(ToKernel::Stream {
            name,
            text: text.to_string(),
            display_id: display_id.map(str::to_string),
        });
    }

    /// Runs `f` (on a fresh thread) when the user interrupts the kernel.
    pub fn on_interrupt(&self, f: impl Fn() + Send + Sync + 'static) {
        lock(&self.shared.on_interrupt).push(Arc::new(f));
    }

    /// Runs `f` (on a fresh thread) when the kernel shuts down or restarts.
    pub fn on_shutdown(&self, f: impl Fn() + Send + Sync + 'static) {
        lock(&self.shared.on_shutdown).push(Arc::new(f));
    }

    /// Waits until everything queued so far (including coalesced updates) has been written, or
    /// `timeout` passes. Returns whether it all went out.
    pub fn flush(&self, timeout: Duration) -> bool {
        self.shared.flush(timeout)
    }

    /// Waits until the kernel has handled everything sent so far (it answers a sync message
    /// after the ones before it), or `timeout` passes. Returns whether it did.
    pub fn sync(&self, timeout: Duration) -> bool {
        let deadline = Instant::now() + timeout;
        let seq = {
            let mut st = lock(&self.shared.state);
            st.sync_sent += 1;
            st.sync_sent
        };
        self.shared.push(ToKernel::Sync { seq });
        let mut st = lock(&self.shared.state);
        while st.synced < seq && !st.closed {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return false;
            }
            st = self
                .shared
                .wake
                .wait_timeout(st, left)
                .map(|(g, _)| g)
                .unwrap_or_else(|e| e.into_inner().0);
        }
        st.synced >= seq
    }

    /// Text messages dropped because the kernel did not keep up.
    pub fn dropped(&self) -> u64 {
        lock(&self.shared.state).dropped
    }
}

impl Display {
    pub fn id(&self) -> &str {
        &self.id
    }

    /// Replaces the display's content. Cheap and non-blocking; coalesced per display.
    pub fn update(&self, data: MimeBundle) {
        let mut st = lock(&self.shared.state);
        if st.closed {
            return;
        }
        st.pending
            .insert(self.id.clone(), (data, MimeBundle::new()));
        drop(st);
        self.shared.wake.notify_all();
    }

    /// Waits until this display's latest content has been written (see [`Link::flush`]).
    pub fn flush(&self, timeout: Duration) -> bool {
        self.shared.flush(timeout)
    }
}

impl Shared {
    fn push(&self, msg: ToKernel) {
        let mut st = lock(&self.state);
        if st.closed {
            return;
        }
        if st.queue.len() >= MAX_QUEUED && matches!(msg, ToKernel::Stream { .. }) {
            st.dropped += 1;
            return;
        }
        st.queue.push_back(msg);
        drop(st);
        self.wake.notify_all();
    }

    fn flush(&self, timeout: Duration) -> bool {
        let deadline = Instant::now() + timeout;
        let mut st = lock(&self.state);
        while !st.idle() && !st.closed {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return false;
            }
            st = self
                .wake
                .wait_timeout(st, left)
                .map(|(g, _)| g)
                .unwrap_or_else(|e| e.into_inner().0);
        }
        st.idle()
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// Takes what is due: all ordered messages, then updates whose display has not been written
/// for `MIN_UPDATE_INTERVAL`. Waits otherwise.
fn write_loop(mut stream: UnixStream, shared: Arc<Shared>) {
    loop {
        let batch: Vec<ToKernel> = {
            let mut st = lock(&shared.state);
            loop {
                if st.closed {
                    return;
                }
                let now = Instant::now();
                let mut batch: Vec<ToKernel> = st.queue.drain(..).collect();
                let mut next_due: Option<Instant> = None;
                let due: Vec<String> = st
                    .pending
                    .keys()
                    .filter(|id| {
                        let ready_at = st
                            .last_sent
                            .get(*id)
                            .map(|t| *t + MIN_UPDATE_INTERVAL)
                            .unwrap_or(now);
                        if ready_at <= now {
                            true
                        } else {
                            next_due = Some(next_due.map_or(ready_at, |d| d.min(ready_at)));
                            false
                        }
                    })
                    .cloned()
                    .collect();
                for id in due {
                    if let Some((data, metadata)) = st.pending.remove(&id) {
                        st.last_sent.insert(id.clone(), now);
                        batch.push(ToKernel::Update {
                            display_id: id,
                            data,
                            metadata,
                        });
                    }
                }
                if !batch.is_empty() {
                    st.in_flight = batch.len();
                    break batch;
                }
                // Nothing due: sleep until the next pending update is, or until woken.
                let wait = next_due
                    .map(|d| d.saturating_duration_since(now))
                    .unwrap_or(Duration::from_secs(3600));
                st = shared
                    .wake
                    .wait_timeout(st, wait)
                    .map(|(g, _)| g)
                    .unwrap_or_else(|e| e.into_inner().0);
            }
        };
        let mut text = String::new();
        for msg in &batch {
            text.push_str(&encode(msg));
        }
        let ok = stream
            .write_all(text.as_bytes())
            .and_then(|_| stream.flush())
            .is_ok();
        let mut st = lock(&shared.state);
        st.in_flight = 0;
        if !ok {
            // The kernel is gone: nothing will read what follows.
            st.closed = true;
            st.queue.clear();
            st.pending.clear();
        }
        drop(st);
        shared.wake.notify_all();
        if !ok {
            return;
        }
    }
}

fn read_loop(stream: UnixStream, shared: Arc<Shared>) {
    for line in BufReader::new(stream).lines() {
        let Ok(line) = line else { break };
        let handlers = match crate::decode::<ToNotebook>(&line) {
            Some(ToNotebook::Interrupt) => lock(&shared.on_interrupt).clone(),
            Some(ToNotebook::Shutdown) => lock(&shared.on_shutdown).clone(),
            Some(ToNotebook::Synced { seq }) => {
                let mut st = lock(&shared.state);
                st.synced = st.synced.max(seq);
                drop(st);
                shared.wake.notify_all();
                continue;
            }
            None => continue,
        };
        for h in handlers {
            let _ = std::thread::Builder::new()
                .name("kernel-link-handler".into())
                .spawn(move || h());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{bundle, decode};
    use std::os::unix::net::UnixListener;
    use std::sync::atomic::AtomicUsize;

    fn listener() -> (UnixListener, std::path::PathBuf) {
        static N: AtomicUsize = AtomicUsize::new(0);
        let dir = std::env::temp_dir().join(format!(
            "tb-channel-{}-{}",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        ));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("s.sock");
        (UnixListener::bind(&path).unwrap(), path)
    }

    /// Reads messages until `until` holds for one, or the socket's read timeout passes.
    fn read_until(
        lines: &mut impl Iterator<Item = std::io::Result<String>>,
        until: impl Fn(&ToKernel) -> bool,
    ) -> Vec<ToKernel> {
        let mut out = Vec::new();
        for line in lines {
            let Ok(line) = line else { break };
            let msg: ToKernel = decode(&line).unwrap();
            let stop = until(&msg);
            out.push(msg);
            if stop {
                break;
            }
        }
        out
    }

    fn text_of(m: &ToKernel) -> Option<String> {
        match m {
            ToKernel::Update { data, .. } | ToKernel::Display { data, .. } => data
                .get("text/plain")
                .and_then(|v| v.as_str())
                .map(str::to_string),
            _ => None,
        }
    }

    #[test]
    fn hello_then_display_then_updates_coalesced_to_the_latest() {
        let (l, path) = listener();
        let link = Link::connect_new(&path).unwrap();
        let (conn, _) = l.accept().unwrap();
        conn.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        let mut lines = BufReader::new(conn).lines();

        let d = link.display(bundle("0", None));
        let t0 = Instant::now();
        let mut n = 0;
        while t0.elapsed() < Duration::from_millis(1000) {
            n += 1;
            d.update(bundle(n.to_string(), None));
            if n % 100 == 0 {
                std::thread::sleep(Duration::from_millis(1));
            }
        }
        assert!(n >= 10_000 || t0.elapsed() >= Duration::from_millis(1000));
        let last = n.to_string();
        let got = read_until(&mut lines, |m| text_of(m).as_deref() == Some(last.as_str()));
        assert!(matches!(got[0], ToKernel::Hello { .. }));
        assert!(matches!(got[1], ToKernel::Display { .. }));
        let updates = got
            .iter()
            .filter(|m| matches!(m, ToKernel::Update { .. }))
            .count();
        // ~1 s of updates at ≤ 10/s per display.
        assert!(
            (2..=15).contains(&updates),
            "{updates} updates for {n} calls"
        );
        assert!(link.flush(Duration::from_secs(2)));
    }

    #[test]
    fn displays_coalesce_independently_and_text_keeps_its_order() {
        let (l, path) = listener();
        let link = Link::connect_new(&path).unwrap();
        let (conn, _) = l.accept().unwrap();
        conn.set_read_timeout(Some(Duration::from_millis(500)))
            .unwrap();
        let mut lines = BufReader::new(conn).lines();
        let a = link.display(bundle("a0", None));
        let b = link.display(bundle("b0", None));
        link.stream(StreamName::Stdout, "one\n", None);
        link.stream(StreamName::Stdout, "two\n", Some(a.id()));
        for i in 1..=500 {
            a.update(bundle(format!("a{i}"), None));
            b.update(bundle(format!("b{i}"), None));
        }
        assert!(link.flush(Duration::from_secs(2)));
        let got = read_until(&mut lines, |_| false);
        let texts: Vec<String> = got.iter().filter_map(text_of).collect();
        assert!(texts.contains(&"a500".to_string()) && texts.contains(&"b500".to_string()));
        let streams: Vec<&str> = got
            .iter()
            .filter_map(|m| match m {
                ToKernel::Stream { text, .. } => Some(text.as_str()),
                _ => None,
            })
            .collect();
        assert_eq!(streams, ["one\n", "two\n"]);
        // Each display's creation precedes its updates.
        let pos = |want: &str| got.iter().position(|m| text_of(m).as_deref() == Some(want));
        assert!(pos("a0") < pos("a500") && pos("b0") < pos("b500"));
    }

    #[test]
    fn interrupt_runs_the_handler_and_a_vanished_kernel_is_harmless() {
        let (l, path) = listener();
        let link = Link::connect_new(&path).unwrap();
        let (mut conn, _) = l.accept().unwrap();
        let hits = Arc::new(AtomicUsize::new(0));
        let h = hits.clone();
        link.on_interrupt(move || {
            h.fetch_add(1, Ordering::SeqCst);
        });
        conn.write_all(b"{\"op\":\"interrupt\"}\n").unwrap();
        let t0 = Instant::now();
        while hits.load(Ordering::SeqCst) == 0 && t0.elapsed() < Duration::from_secs(5) {
            std::thread::sleep(Duration::from_millis(10));
        }
        assert_eq!(hits.load(Ordering::SeqCst), 1);

        drop(conn);
        drop(l);
        let d = link.display(bundle("x", None));
        for i in 0..1000 {
            d.update(bundle(i.to_string(), None));
            link.stream(StreamName::Stderr, "late\n", None);
        }
        // Neither panics nor blocks: flush gives up or finds the link closed.
        let t0 = Instant::now();
        link.flush(Duration::from_secs(1));
        assert!(t0.elapsed() < Duration::from_secs(2));
    }
}
