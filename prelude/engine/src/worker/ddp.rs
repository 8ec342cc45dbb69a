//! Data-parallel gradient synchronisation.
//!
//! Gradients are packed into a few flat buckets (about 25 MB each, like PyTorch DDP's default)
//! instead of one collective per tensor: per-call latency dominates small tensors. Bucket `k`'s
//! all-reduce runs while bucket `k+1` is packed, so packing and communication overlap.
//!
//! Each rank scales its gradient by `local_batch / global_batch` before the sum, so the result
//! is the gradient of the mean loss over the global batch even when the last batches differ in
//! size — exactly what one worker with the whole batch would compute.

use anyhow::Result;
use tch::Tensor;

use crate::worker::device::OnDeviceOf;
use crate::worker::dist::ProcessGroup;

/// Default bucket size in bytes.
pub(crate) const BUCKET_BYTES: usize = 25 * 1024 * 1024;

/// Consecutive parameters of one dtype and device, about `bucket_bytes` in all:
/// (index into params, offset in the flat bucket, numel) per parameter.
pub(crate) type BucketPlan = Vec<(usize, i64, i64)>;

/// Groups `params` into buckets, in order (ZeRO shards the same buckets).
pub(crate) fn plan_buckets(params: &[Tensor], bucket_bytes: usize) -> Vec<BucketPlan> {
    // tch reports every device it cannot name (an HPU) as MPS; buckets never mix devices
    // anyway, since all parameters of a worker live on its one device.
    group_buckets(
        params.iter().map(|p| {
            let n = p.numel() as i64;
            (
                (p.kind(), p.device()),
                n,
                n as usize * p.kind().elt_size_in_bytes(),
            )
        }),
        bucket_bytes,
    )
}

/// Groups consecutive (key, elements, bytes) items into buckets of about `bucket_bytes`, never
/// mixing keys (dtype and device): what [`plan_buckets`] does with tensors, and the memory plan
/// with the sizes a recipe reports.
pub(crate) fn group_buckets<K: PartialEq>(
    items: impl IntoIterator<Item = (K, i64, usize)>,
    bucket_bytes: usize,
) -> Vec<BucketPlan> {
    let mut buckets = Vec::new();
    let mut slots: BucketPlan = Vec::new();
    let (mut off, mut bytes) = (0i64, 0usize);
    let mut key: Option<K> = None;
    for (i, (k, n, size)) in items.into_iter().enumerate() {
        if key
            .as_ref()
            .is_some_and(|key| *key != k || bytes + size > bucket_bytes)
        {
            buckets.push(std::mem::take(&mut slots));
            (off, bytes) = (0, 0);
        }
        key = Some(k);
        slots.push((i, off, n));
        off += n;
        bytes += size;
    }
    if !slots.is_empty() {
        buckets.push(slots);
    }
    buckets
}

/// The elements of a bucket plan.
pub(crate) fn plan_len(plan: &BucketPlan) -> i64 {
    plan.last().map_or(0, |&(_, off, n)| off + n)
}

/// Like PyTorch DDP without find_unused_parameters: every rank must produce every gradient,
/// or the ranks' models would drift apart.
pub(crate) fn missing_gradient(i: usize, param: &Tensor) -> anyhow::Error {
    anyhow::anyhow!(
        "trainable parameter #{i} ({:?}) got no gradient this step: every trainable parameter \
         must take part in the loss for data-parallel training",
        param.size()
    )
}

struct Bucket {
    slots: BucketPlan,
    flat: Tensor,
}

pub(crate) struct GradSync {
    params: Vec<Tensor>,
    buckets: Vec<Bucket>,
}

impl GradSync {
    /// `params` are the trainable variables (shallow clones share storage and `.grad()`).
    pub(crate) fn new(params: &[Tensor], bucket_bytes: usize) -> Self {
        let params: Vec<Tensor> = params.iter().map(|p| p.shallow_clone()).collect();
        let buckets = plan_buckets(&params, bucket_bytes)
            .into_iter()
            .map(|slots| {
                // Allocated next to the bucket's first parameter, wherever that lives.
                let first = &params[slots[0].0];
                let flat = first.zeros_on_device(&[plan_len(&slots)], first.kind());
                Bucket { slots, flat }
            })
            .collect();
        Self { params, buckets }
    }

    /// Bytes of the flat communication buckets.
    pub(crate) fn buffer_bytes(&self) -> u64 {
        self.buckets
            .iter()
            .map(|b| b.flat.numel() as u64 * b.flat.kind().elt_size_in_bytes() as u64)
            .sum()
    }

    /// All-reduces the gradients: afterwards every rank holds
    /// `sum_r weight_r * grad_r`, with `weight_r = local_batch_r / global_batch`.
    pub(crate) fn sync(&mut self, pg: &ProcessGroup, weight: f64) -> Result<()> {
        tch::no_grad(|| -> Result<()> {
            let mut in_flight: Option<(usize, crate::worker::dist::Work)> = None;
            for b in 0..self.buckets.len() {
                self.pack(b, weight);
                let work = pg.allreduce_start(&self.buckets[b].flat)?;
                if let Some((prev, w)) = in_flight.replace((b, work)) {
                    w.wait()?;
                    self.unpack(prev)?;
                }
            }
            if let Some((prev, w)) = in_flight.take() {
                w.wait()?;
                self.unpack(prev)?;
            }
            Ok(())
        })
    }

    fn pack(&mut self, b: usize, weight: f64) {
        let bucket = &mut self.buckets[b];
        for &(i, off, n) in &bucket.slots {
            let mut dst = bucket.flat.narrow(0, off, n);
            let g = self.params[i].grad();
            if g.defined() {
                // reshape: a channels-last gradient is read in its logical order (a copy).
                dst.copy_(&g.reshape([-1]));
            } else {
                let _ = dst.zero_();
            }
        }
        if weight != 1.0 {
            let _ = bucket.flat.g_mul_scalar_(weight);
        }
    }

    fn unpack(&mut self, b: usize) -> Result<()> {
        let bucket = &self.buckets[b];
        for &(i, off, n) in &bucket.slots {
            let g = self.params[i].grad();
            if !g.defined() {
                return Err(missing_gradient(i, &self.params[i]));
            }
            // Written through the gradient's own shape, whatever its memory format.
            let mut g = g;
            g.copy_(&bucket.flat.narrow(0, off, n).view(g.size().as_slice()));
        }
        Ok(())
    }
}

/// Makes every rank start from rank 0's parameters (and buffers), in flat buckets.
pub(crate) fn broadcast_parameters(pg: &ProcessGroup, tensors: &[Tensor]) -> Result<()> {
    if pg.world_size() == 1 {
        return Ok(());
    }
    tch::no_grad(|| -> Result<()> {
        let sync = GradSync::new(tensors, BUCKET_BYTES);
        for bucket in &sync.buckets {
            let mut flat = bucket.flat.shallow_clone();
            for &(i, off, n) in &bucket.slots {
                flat.narrow(0, off, n).copy_(&tensors[i].reshape([-1]));
            }
            pg.broadcast(&[&flat], 0)?;
            for &(i, off, n) in &bucket.slots {
                let shape = tensors[i].size();
                tensors[i]
                    .shallow_clone()
                    .copy_(&flat.narrow(0, off, n).view(shape.as_slice()));
            }
            let _ = &mut flat;
        }
        Ok(())
    })
}

/// Sums a few f64 values over all ranks (epoch metrics: loss sums, correct counts, sizes).
pub(crate) fn allreduce_sums(pg: &ProcessGroup, values: &[f64]) -> Result<Vec<f64>> {
    let t = Tensor::from_slice(values);
    pg.allreduce(&[&t], crate::worker::dist::ReduceOp::Sum)?;
    Ok(Vec::<f64>::try_from(&t)?)
}
