//! The input pipeline: decoding and augmentation on background threads, batches delivered in
//! the order the training loop will ask for them, with a bounded queue (memory stays flat and
//! the threads never run far ahead).
//!
//! Augmentation randomness comes from (seed, epoch, sample index) only, so a sample gets the
//! same crop whatever the thread count, the worker count or a resume.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{sync_channel, Receiver};
use std::sync::Arc;
use std::thread::JoinHandle;

use anyhow::{Context, Result};
use rand::SeedableRng;
use tch::Tensor;
use trainbook_engine::Device;

use super::folder::ImageFolder;
use super::transforms::{eval_selection, train_selection, Augment};

/// How samples are turned into tensors.
#[derive(Clone, Copy, Debug)]
pub enum Mode {
    Train {
        seed: u64,
        epoch: u64,
        augment: Augment,
    },
    Eval,
}

/// One prepared batch: images `(n, size, size, 3)` uint8 (the pixels, a quarter of the bytes of
/// floats to copy and to pin; normalised on the device) and labels `(n,)` int64.
pub struct Batch {
    pub indices: Vec<usize>,
    pub images: Tensor,
    pub labels: Tensor,
}

/// Prepares one sample: uint8 `(size, size, 3)`.
pub fn sample(folder: &ImageFolder, i: usize, size: u32, mode: Mode) -> Result<Tensor> {
    let img = crate::vision::folder::load(folder, i)?;
    Ok(match mode {
        Mode::Train {
            seed,
            epoch,
            augment,
        } => {
            let key = seed
                .wrapping_mul(0x9E37_79B9_7F4A_7C15)
                .wrapping_add(epoch.wrapping_mul(0xBF58_476D_1CE4_E5B9))
                .wrapping_add(i as u64);
            let mut rng = rand::rngs::StdRng::seed_from_u64(key);
            train_selection(&img, size, &mut rng, augment)?.hwc()?
        }
        Mode::Eval => eval_selection(&img, size)?.hwc()?,
    })
}

/// Builds a batch synchronously (also what the background threads run).
pub fn batch(folder: &ImageFolder, indices: &[usize], size: u32, mode: Mode) -> Result<Batch> {
    let images = indices
        .iter()
        .map(|&i| sample(folder, i, size, mode))
        .collect::<Result<Vec<_>>>()?;
    let labels: Vec<i64> = indices
        .iter()
        .map(|&i| folder.samples[i].1 as i64)
        .collect();
    Ok(Batch {
        indices: indices.to_vec(),
        images: Tensor::stack(&images, 0),
        labels: Tensor::from_slice(&labels),
    })
}

/// Background preparation of a fixed list of batches.
pub struct Pipeline {
    queues: Vec<Receiver<Result<Batch>>>,
    next: usize,
    stop: Arc<AtomicBool>,
    threads: Vec<JoinHandle<()>>,
}

impl Pipeline {
    /// Starts `threads` threads; thread t prepares batches t, t+threads, ... and may run
    /// `depth` batches ahead, in page-locked memory when `device` is a GPU.
    pub fn start(
        folder: Arc<ImageFolder>,
        batches: Vec<Vec<usize>>,
        size: u32,
        mode: Mode,
        threads: usize,
        depth: usize,
        device: Device,
    ) -> Self {
        let threads = threads.max(1);
        let stop = Arc::new(AtomicBool::new(false));
        let batches = Arc::new(batches);
        let mut queues = Vec::new();
        let mut handles = Vec::new();
        for t in 0..threads {
            let (tx, rx) = sync_channel(depth.max(1));
            queues.push(rx);
            let (folder, batches, stop) = (folder.clone(), batches.clone(), stop.clone());
            handles.push(std::thread::spawn(move || {
                for b in (t..batches.len()).step_by(threads) {
                    if stop.load(Ordering::Relaxed) {
                        return;
                    }
                    // Pinned here, off the training loop's path, when the batch goes to a GPU:
                    // labels too, or their copy would make the host wait for the forward pass.
                    let out = batch(&folder, &batches[b], size, mode).map(|mut b| {
                        b.images = device.pin(b.images);
                        b.labels = device.pin(b.labels);
                        b
                    });
                    if tx.send(out).is_err() {
                        return;
                    }
                }
            }));
        }
        Self {
            queues,
            next: 0,
            stop,
            threads: handles,
        }
    }

    /// The next batch in order; `None` after the last.
    pub fn next_batch(&mut self) -> Option<Result<Batch>> {
        let q = &self.queues[self.next % self.queues.len()];
        let out = q.recv().ok();
        self.next += 1;
        out
    }
}

impl Drop for Pipeline {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        // Unblock senders waiting on a full queue, then wait for the threads.
        self.queues.clear();
        for h in self.threads.drain(..) {
            h.join().ok();
        }
    }
}

/// Takes the next batch from `pipeline` when it holds the expected one, else builds it here.
pub fn take(
    pipeline: Option<&mut Pipeline>,
    folder: &ImageFolder,
    indices: &[usize],
    size: u32,
    mode: Mode,
) -> Result<Batch> {
    if let Some(p) = pipeline {
        if let Some(b) = p.next_batch() {
            let b = b?;
            if b.indices == indices {
                return Ok(b);
            }
        }
    }
    batch(folder, indices, size, mode).context("preparing a batch")
}
