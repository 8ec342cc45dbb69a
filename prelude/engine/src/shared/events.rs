//! The event stream from workers to the driver.
//!
//! Workers PUSH, the driver PULLs, over zeromq on loopback. Every message is two frames,
//! `[token, json]`; the token is random per job and anything without it is dropped (counted,
//! never parsed), so another local process cannot inject events into a job.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc;
use std::sync::Arc;
use std::thread;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use anyhow::{anyhow, Context, Result};
use bytes::Bytes;
use serde::{Deserialize, Serialize};
use zeromq::{Socket, SocketRecv, SocketSend, ZmqMessage};

pub(crate) use trainbook_api::Stream;

/// Seconds since the Unix epoch.
pub(crate) fn unix_time() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs_f64())
        .unwrap_or(0.0)
}

/// What a worker reports when it finishes.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub(crate) struct WorkerSummary {
    pub steps: u64,
    pub epochs: u64,
    pub samples: u64,
    pub train_seconds: f64,
    /// Mean training loss of the last epoch, all-reduced over ranks.
    pub final_train_loss: f64,
    /// Sum and L2 norm of all final parameters (identical on every rank after data-parallel
    /// training; handy to compare runs).
    pub param_sum: f64,
    pub param_l2: f64,
    pub device: String,
    /// Final epoch metrics (all-reduced), e.g. eval_loss, eval_accuracy.
    pub metrics: std::collections::BTreeMap<String, f64>,
    #[serde(default)]
    pub memory: trainbook_api::MemoryUse,
    /// Rank 0's step profile, when the job profiled steps.
    #[serde(default)]
    pub profile: Option<trainbook_api::StepProfile>,
}

#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
#[serde(tag = "type", rename_all = "snake_case")]
pub(crate) enum Event {
    Log {
        rank: usize,
        stream: Stream,
        text: String,
    },
    Metric {
        rank: usize,
        step: u64,
        epoch: u64,
        name: String,
        value: f64,
        time: f64,
    },
    Progress {
        rank: usize,
        step: u64,
        total_steps: u64,
        epoch: u64,
        epochs: u64,
        samples: u64,
        samples_per_second: f64,
    },
    Checkpoint {
        rank: usize,
        step: u64,
        epoch: u64,
        path: String,
    },
    Error {
        rank: usize,
        message: String,
        /// The optimizer step this rank was on when it failed, from 1 (a failure at the same
        /// step with the same message twice in a row is not retried).
        #[serde(default)]
        step: Option<u64>,
    },
    /// A rank is alive (about once a second): its step, its work count (steps and evaluation
    /// batches) and whether it is inside one long operation. What hang detection watches.
    Heartbeat {
        rank: usize,
        step: u64,
        #[serde(default)]
        work: u64,
        /// Inside a checkpoint write or an epoch's data planning: working, although the work
        /// count does not move.
        #[serde(default)]
        busy: bool,
    },
    Done {
        rank: usize,
        summary: WorkerSummary,
    },
    /// Another node's driver is alive (about once a second): node 0 tells a lost node (its
    /// driver killed, its machine or network down) from a worker failing by itself.
    NodeAlive {
        node: usize,
    },
    /// A worker of another node ended badly, reported by its node's driver (node 0 has no
    /// process of its own to watch for it).
    Exited {
        rank: usize,
        node: usize,
        /// The start of the job's workers it belonged to (a late report of a start that was
        /// already replaced is not a failure of the new one).
        #[serde(default)]
        attempt: u32,
        code: Option<i32>,
        signal: Option<i32>,
    },
}

fn runtime() -> Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("starting the event-stream runtime")
}

/// Runs `body` on a new named thread with its own single-threaded tokio runtime; `body` reports
/// readiness (or failure) through `ready`, which also receives a runtime start failure.
fn on_runtime_thread<R, F, Fut>(
    name: &str,
    ready: mpsc::Sender<Result<R>>,
    body: F,
) -> Result<thread::JoinHandle<()>>
where
    R: Send + 'static,
    F: FnOnce(mpsc::Sender<Result<R>>) -> Fut + Send + 'static,
    Fut: std::future::Future<Output = ()>,
{
    thread::Builder::new()
        .name(name.into())
        .spawn(move || match runtime() {
            Ok(rt) => rt.block_on(body(ready)),
            Err(e) => {
                let _ = ready.send(Err(e));
            }
        })
        .with_context(|| format!("spawning the {name} thread"))
}

/// Driver side: receives events for one job.
pub(crate) struct Collector {
    endpoint: String,
    dropped: Arc<AtomicU64>,
    shutdown: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<thread::JoinHandle<()>>,
}

impl Collector {
    /// Binds a PULL socket on `host` (port chosen by the OS) and forwards every event carrying
    /// `token` to `sink` (which returns false once nobody listens).
    pub(crate) fn start(
        host: &str,
        token: String,
        mut sink: impl FnMut(Event) -> bool + Send + 'static,
    ) -> Result<Self> {
        let (ready_tx, ready_rx) = mpsc::channel::<Result<String>>();
        let (stop_tx, mut stop_rx) = tokio::sync::oneshot::channel::<()>();
        let dropped = Arc::new(AtomicU64::new(0));
        let dropped2 = dropped.clone();
        let addr = format!("tcp://{host}:0");
        let thread = on_runtime_thread("trainbook-events", ready_tx, move |ready_tx| async move {
            let mut socket = zeromq::PullSocket::new();
            let endpoint = match socket.bind(&addr).await {
                Ok(ep) => ep.to_string(),
                Err(e) => {
                    let _ = ready_tx.send(Err(anyhow!("binding the event socket on {addr}: {e}")));
                    return;
                }
            };
            let _ = ready_tx.send(Ok(endpoint));
            let token = Bytes::from(token.into_bytes());
            loop {
                tokio::select! {
                    _ = &mut stop_rx => break,
                    msg = socket.recv() => {
                        let Ok(msg) = msg else { continue };
                        match decode(&msg, &token) {
                            Some(ev) => { if !sink(ev) { break; } }
                            None => { dropped2.fetch_add(1, Ordering::Relaxed); }
                        }
                    }
                }
            }
            let _ = socket.close().await;
        })?;
        let endpoint = ready_rx
            .recv_timeout(Duration::from_secs(10))
            .map_err(|_| anyhow!("the event collector did not start within 10 s"))??;
        Ok(Self {
            endpoint,
            dropped,
            shutdown: Some(stop_tx),
            thread: Some(thread),
        })
    }

    /// Where workers connect, e.g. `tcp://127.0.0.1:40123`.
    pub(crate) fn endpoint(&self) -> &str {
        &self.endpoint
    }

    /// Messages dropped for a missing or wrong token, or unparsable content.
    pub(crate) fn dropped(&self) -> u64 {
        self.dropped.load(Ordering::Relaxed)
    }
}

impl Drop for Collector {
    fn drop(&mut self) {
        if let Some(s) = self.shutdown.take() {
            let _ = s.send(());
        }
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

fn decode(msg: &ZmqMessage, token: &Bytes) -> Option<Event> {
    if msg.len() != 2 {
        return None;
    }
    let got = msg.get(0)?;
    // Compare in constant time so the token cannot be guessed byte by byte.
    if got.len() != token.len()
        || got
            .iter()
            .zip(token.iter())
            .fold(0u8, |acc, (a, b)| acc | (a ^ b))
            != 0
    {
        return None;
    }
    serde_json::from_slice(msg.get(1)?).ok()
}

/// A fresh random token for one job.
pub(crate) fn new_token() -> String {
    use rand::Rng;
    let bytes: [u8; 16] = rand::thread_rng().gen();
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

enum Outgoing {
    Event(Event),
    Flush(mpsc::Sender<()>),
}

/// Worker side: sends events to the driver from any thread, never blocking the training loop.
#[derive(Clone)]
pub(crate) struct Emitter {
    tx: tokio::sync::mpsc::UnboundedSender<Outgoing>,
    rank: usize,
}

impl Emitter {
    /// Connects to the driver's collector. Fails if the driver cannot be reached.
    pub(crate) fn connect(endpoint: &str, token: &str, rank: usize) -> Result<Self> {
        // A tokio channel, awaited: while this thread waits for events the runtime keeps running
        // zeromq's writer tasks, so events leave as they are sent, not at the end.
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<Outgoing>();
        let (ready_tx, ready_rx) = mpsc::channel::<Result<()>>();
        let endpoint = endpoint.to_string();
        let token = Bytes::from(token.to_string().into_bytes());
        on_runtime_thread("trainbook-emitter", ready_tx, move |ready_tx| async move {
            let mut socket = zeromq::PushSocket::new();
            let connected =
                tokio::time::timeout(Duration::from_secs(10), socket.connect(&endpoint)).await;
            match connected {
                Ok(Ok(())) => {
                    let _ = ready_tx.send(Ok(()));
                }
                Ok(Err(e)) => {
                    let _ =
                        ready_tx.send(Err(anyhow!("connecting to the driver at {endpoint}: {e}")));
                    return;
                }
                Err(_) => {
                    let _ = ready_tx.send(Err(anyhow!(
                        "connecting to the driver at {endpoint}: timed out after 10 s"
                    )));
                    return;
                }
            }
            while let Some(out) = rx.recv().await {
                match out {
                    Outgoing::Event(ev) => {
                        let Ok(json) = serde_json::to_vec(&ev) else {
                            continue;
                        };
                        let frames = vec![token.clone(), Bytes::from(json)];
                        let msg = ZmqMessage::try_from(frames).expect("two frames");
                        if socket.send(msg).await.is_err() {
                            // Driver gone: nothing left to report to.
                            break;
                        }
                    }
                    Outgoing::Flush(done) => {
                        // zeromq queues messages per peer and a separate task writes them
                        // to the TCP stream; give that task the runtime until it has.
                        for _ in 0..16 {
                            tokio::task::yield_now().await;
                        }
                        tokio::time::sleep(Duration::from_millis(20)).await;
                        let _ = done.send(());
                    }
                }
            }
        })?;
        ready_rx
            .recv_timeout(Duration::from_secs(15))
            .map_err(|_| anyhow!("event emitter did not start"))??;
        Ok(Self { tx, rank })
    }

    pub(crate) fn send(&self, ev: Event) {
        let _ = self.tx.send(Outgoing::Event(ev));
    }

    pub(crate) fn log(&self, text: impl Into<String>) {
        self.send(Event::Log {
            rank: self.rank,
            stream: Stream::Stdout,
            text: text.into(),
        });
    }

    pub(crate) fn metric(&self, step: u64, epoch: u64, name: &str, value: f64) {
        self.send(Event::Metric {
            rank: self.rank,
            step,
            epoch,
            name: name.to_string(),
            value,
            time: unix_time(),
        });
    }

    /// Waits until every event sent so far has been handed to the kernel's socket buffer (call
    /// before exiting, so the last events are not lost).
    pub(crate) fn flush(&self, timeout: Duration) -> bool {
        let (tx, rx) = mpsc::channel();
        if self.tx.send(Outgoing::Flush(tx)).is_err() {
            return false;
        }
        rx.recv_timeout(timeout).is_ok()
    }
}

/// Sends one raw multipart message to an event endpoint; used to check that untrusted
/// messages are ignored.
pub fn send_raw(endpoint: &str, frames: Vec<Vec<u8>>) -> Result<()> {
    let rt = runtime()?;
    rt.block_on(async {
        let mut socket = zeromq::PushSocket::new();
        socket
            .connect(endpoint)
            .await
            .map_err(|e| anyhow!("connect {endpoint}: {e}"))?;
        let msg = ZmqMessage::try_from(frames.into_iter().map(Bytes::from).collect::<Vec<_>>())
            .map_err(|e| anyhow!("building message: {e}"))?;
        socket.send(msg).await.map_err(|e| anyhow!("send: {e}"))?;
        // Let the bytes leave before the socket is dropped.
        tokio::time::sleep(Duration::from_millis(50)).await;
        Ok(())
    })
}
