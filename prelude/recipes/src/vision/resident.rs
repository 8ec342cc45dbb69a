//! A split's images held on the device (`--data-on-device`): decoded once, as the evaluation
//! transform makes them (resize, centre crop: no augmentation), and kept as uint8 so each
//! step's batch is picked there. The input pipeline leaves the step's path, which is how the
//! model's own speed is measured (PyTorch's benchmarks do the same with data made on the GPU).

use std::sync::Arc;

use anyhow::{Context, Result};
use tch::{Kind, Tensor};
use trainbook_engine::Device;

use super::folder::ImageFolder;
use super::loader::{Mode, Pipeline};

/// Images per decoding batch: big enough to keep the threads busy, small enough that the
/// host holds little more than one batch per thread.
const CHUNK: usize = 64;

pub struct Resident {
    /// `(n, size, size, 3)` uint8 on the device, row k = the split's k-th sample.
    images: Tensor,
    /// `(n,)` int64 on the device.
    labels: Tensor,
}

impl Resident {
    /// Decodes the samples `rows` of `folder` (in that order) with `threads` threads and puts
    /// them on `device`. The device tensor is allocated first, whole, so a dataset too large
    /// for the device fails before any decoding, with the fix.
    pub fn load(
        folder: Arc<ImageFolder>,
        rows: &[usize],
        size: u32,
        threads: usize,
        device: Device,
    ) -> Result<Self> {
        let n = rows.len() as i64;
        let side = size as i64;
        let bytes = bytes(rows.len(), size);
        let shape = [n, side, side, 3];
        let images = match device.tch() {
            Some(d) => Tensor::f_empty(shape, (Kind::Uint8, d)).map_err(anyhow::Error::from),
            None => device.put(&Tensor::f_empty(shape, (Kind::Uint8, tch::Device::Cpu))?),
        }
        .with_context(|| {
            format!(
                "{n} images at {size} px take {} as uint8, more than the device holds: \
                     drop --data-on-device (the loader streams them), or use fewer rows \
                     (--train-rows, --eval-rows) or a smaller --image-size",
                human_bytes(bytes)
            )
        })?;
        let chunks: Vec<Vec<usize>> = rows.chunks(CHUNK).map(<[usize]>::to_vec).collect();
        let mut pipeline =
            Pipeline::start(folder, chunks.clone(), size, Mode::Eval, threads, 2, device);
        let mut labels = Vec::with_capacity(rows.len());
        let mut at = 0i64;
        for chunk in &chunks {
            let b = pipeline
                .next_batch()
                .context("the image decoding threads stopped early")??;
            let len = chunk.len() as i64;
            images
                .f_narrow(0, at, len)?
                .f_copy_(&device.put(&b.images)?)?;
            labels.extend(Vec::<i64>::try_from(&b.labels).context("reading a batch's labels")?);
            at += len;
        }
        Ok(Self {
            images,
            labels: device.put(&Tensor::f_from_slice(&labels)?)?,
        })
    }

    /// The batch of the split's samples `indices`: uint8 images and int64 labels, picked on
    /// the device (the indices travel from page-locked memory, so the host does not wait).
    pub fn batch(&self, indices: &[usize], device: Device) -> Result<(Tensor, Tensor)> {
        let idx: Vec<i64> = indices.iter().map(|&i| i as i64).collect();
        let idx = device.put(&device.pin(Tensor::f_from_slice(&idx)?))?;
        Ok((
            self.images.f_index_select(0, &idx)?,
            self.labels.f_index_select(0, &idx)?,
        ))
    }
}

/// Bytes of `n` uint8 RGB images `size` pixels square.
pub fn bytes(n: usize, size: u32) -> u64 {
    n as u64 * size as u64 * size as u64 * 3
}

/// `1.2 GiB`, `574 MiB`, `0.3 MiB`: the memory plan's units.
pub fn human_bytes(b: u64) -> String {
    const MIB: f64 = (1u64 << 20) as f64;
    match b as f64 / MIB {
        m if m >= 1024.0 => format!("{:.1} GiB", m / 1024.0),
        m if m >= 10.0 => format!("{m:.0} MiB"),
        m => format!("{m:.1} MiB"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_read_as_people_write_them() {
        assert_eq!(bytes(4000, 224), 602_112_000);
        assert_eq!(human_bytes(bytes(4000, 224)), "574 MiB");
        assert_eq!(human_bytes(bytes(1_281_167, 224)), "179.6 GiB");
        assert_eq!(human_bytes(bytes(320, 32)), "0.9 MiB");
    }
}
