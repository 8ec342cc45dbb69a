//! The kernel's end of the side channel (see the `trainbook-channel` crate): a Unix socket in
//! the kernel's private run directory. Notebook code connects from the cell process; its
//! displays and text go to the [`Publisher`], and the kernel sends interrupts back.

use crate::iopub::Publisher;
use anyhow::{Context, Result};
use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use trainbook_channel::{ToKernel, ToNotebook, decode, encode};

#[derive(Clone)]
pub struct ChannelServer {
    path: PathBuf,
    peers: Arc<Mutex<Vec<UnixStream>>>,
}

impl ChannelServer {
    /// Listens on `<dir>/channel.sock`; `dir` must be private to this user (the run directory
    /// is created 0700), since whoever connects can draw in the notebook.
    pub fn start(dir: &Path, publisher: Publisher) -> Result<ChannelServer> {
        let path = dir.join("channel.sock");
        let _ = std::fs::remove_file(&path);
        let listener = UnixListener::bind(&path)
            .with_context(|| format!("cannot listen on {}", path.display()))?;
        let peers: Arc<Mutex<Vec<UnixStream>>> = Arc::default();
        let server = ChannelServer {
            path,
            peers: peers.clone(),
        };
        std::thread::Builder::new()
            .name("channel-accept".into())
            .spawn(move || {
                for stream in listener.incoming().flatten() {
                    if let Ok(writer) = stream.try_clone() {
                        peers.lock().unwrap_or_else(|e| e.into_inner()).push(writer);
                    }
                    let publisher = publisher.clone();
                    let _ = std::thread::Builder::new()
                        .name("channel-read".into())
                        .spawn(move || read_peer(stream, publisher));
                }
            })
            .context("spawning the channel thread")?;
        Ok(server)
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Sends to every connected cell process (normally one; a restarted one reconnects).
    pub fn send(&self, msg: &ToNotebook) {
        let line = encode(msg);
        let mut peers = self.peers.lock().unwrap_or_else(|e| e.into_inner());
        peers.retain_mut(|p| p.write_all(line.as_bytes()).and_then(|_| p.flush()).is_ok());
    }
}

fn read_peer(stream: UnixStream, publisher: Publisher) {
    let mut bad = 0u32;
    let Ok(mut answer) = stream.try_clone() else {
        return;
    };
    for line in BufReader::new(stream).lines() {
        let Ok(line) = line else { break };
        match decode::<ToKernel>(&line) {
            // Everything this peer sent before is handled: its messages are read in order.
            Some(ToKernel::Sync { seq }) => {
                let _ = answer.write_all(encode(&ToNotebook::Synced { seq }).as_bytes());
            }
            Some(msg) => publisher.notebook_message(msg),
            None => {
                bad += 1;
                if bad <= 3 {
                    eprintln!(
                        "trainbook-kernel: ignored a malformed channel message ({} bytes)",
                        line.len()
                    );
                }
            }
        }
    }
}
