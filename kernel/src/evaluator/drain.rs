//! The cell process's stdout and stderr, published to the running cell as they arrive.

use crate::iopub::Publisher;
use evcxr::EvalContextOutputs;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Forwards the cell process's stdout and stderr to the running cell as they arrive.
pub(super) struct Drains {
    lock: Arc<Mutex<()>>,
    stdout: crossbeam_channel::Receiver<String>,
    stderr: crossbeam_channel::Receiver<String>,
    publisher: Publisher,
}

impl Drains {
    pub(super) fn start(outputs: EvalContextOutputs, publisher: Publisher) -> Drains {
        let lock = Arc::new(Mutex::new(()));
        for (rx, name) in [
            (outputs.stdout.clone(), "stdout"),
            (outputs.stderr.clone(), "stderr"),
        ] {
            let lock = lock.clone();
            let publisher = publisher.clone();
            std::thread::Builder::new()
                .name(format!("drain-{name}"))
                .spawn(move || {
                    while let Ok(first) = rx.recv() {
                        // Held while publishing, so `flush` cannot overtake a taken line.
                        let _g = lock.lock().unwrap_or_else(|e| e.into_inner());
                        let text = gather(first, &rx);
                        publisher.stream(name, &text);
                    }
                })
                .expect("spawning a drain thread");
        }
        Drains {
            lock,
            stdout: outputs.stdout,
            stderr: outputs.stderr,
            publisher,
        }
    }

    /// Publishes everything the cell printed before its result goes out. stderr comes through
    /// a separate pipe with no end-of-cell marker, so wait until it has been quiet briefly.
    pub(super) fn flush(&self) {
        let deadline = Instant::now() + Duration::from_millis(150);
        let mut quiet_since = Instant::now();
        loop {
            let _g = self.lock.lock().unwrap_or_else(|e| e.into_inner());
            let mut got = false;
            for (rx, name) in [(&self.stdout, "stdout"), (&self.stderr, "stderr")] {
                if let Ok(first) = rx.try_recv() {
                    let text = gather(first, rx);
                    self.publisher.stream(name, &text);
                    got = true;
                }
            }
            drop(_g);
            if got {
                quiet_since = Instant::now();
            }
            if Instant::now() >= deadline || quiet_since.elapsed() >= Duration::from_millis(20) {
                break;
            }
            std::thread::sleep(Duration::from_millis(5));
        }
    }
}

/// One line plus whatever else is already waiting, as one stream message.
fn gather(first: String, rx: &crossbeam_channel::Receiver<String>) -> String {
    let mut text = first;
    text.push('\n');
    for _ in 0..1000 {
        match rx.try_recv() {
            Ok(line) => {
                text.push_str(&line);
                text.push('\n');
            }
            Err(_) => break,
        }
    }
    text
}
