//! Scaled dot-product attention as the models here call it: libtorch's fused kernel where it
//! runs natively, the written-out form on Gaudi; causal masking for decoders, with or without
//! a key/value cache of the positions already seen.

use tch::{Kind, Tensor};
use trainbook_engine::OnDeviceOf;

/// The most negative finite value of a floating kind (`torch.finfo(kind).min`): what a masked
/// position's additive mask holds. Hidden states are bf16 under Gaudi's autocast (its
/// layer_norm runs in bf16), where f32's minimum does not fit.
pub fn lowest(kind: Kind) -> f64 {
    match kind {
        Kind::BFloat16 => -3.389_531_389_251_535_5e38,
        Kind::Half => -65504.0,
        Kind::Double => f64::MIN,
        _ => f64::from(f32::MIN),
    }
}

/// softmax(q kᵀ / √d + mask) v, written out. On Gaudi this is what runs: torch's
/// scaled_dot_product_attention first asks `aten::_fused_sdp_choice`, which the bridge has no
/// kernel for (v1.19), so every call would copy q, k and v to the host for the CPU fallback
/// (and fail outright with PT_HPU_PLACE_ON_CPU=none); matmul, softmax and dropout are native.
pub fn math_attention(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    mask: Option<&Tensor>,
    p: f64,
    train: bool,
) -> Tensor {
    let d = *q
        .size()
        .last()
        .expect("attention inputs have a head dimension") as f64;
    let scores = q.matmul(&k.transpose(-2, -1)) / d.sqrt();
    let scores = match mask {
        Some(m) => scores + m,
        None => scores,
    };
    scores
        .softmax(-1, scores.kind())
        .dropout(p, train)
        .matmul(v)
}

/// Attention with an optional additive mask (broadcastable to (batch, heads, q, k)), fused
/// where the device has the kernel.
pub fn attend(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    mask: Option<&Tensor>,
    p: f64,
    train: bool,
) -> Tensor {
    if trainbook_engine::on_hpu(q) {
        math_attention(q, k, v, mask, p, train)
    } else {
        Tensor::scaled_dot_product_attention(q, k, v, mask, p, false, None, false)
    }
}

/// Causal attention of `q` (batch, heads, new, d) over `k`, `v` (batch, kv_heads, past + new,
/// d): query i sees keys 0..=past + i. Grouped-query attention (fewer key/value heads than
/// query heads) shares each key/value head among its group of query heads: inside the fused
/// kernel (`enable_gqa`, no copies), or repeated for the written-out form.
pub fn causal(q: &Tensor, k: &Tensor, v: &Tensor, p: f64, train: bool) -> Tensor {
    let (heads, kv_heads) = (q.size()[1], k.size()[1]);
    let (new, total) = (q.size()[2], k.size()[2]);
    let p = if train { p } else { 0.0 };
    let gqa = heads != kv_heads;
    if !trainbook_engine::on_hpu(q) && (new == 1 || new == total) {
        // One new token sees every cached position (no mask); a whole sequence is the
        // kernel's own causal case.
        return Tensor::scaled_dot_product_attention(
            q,
            k,
            v,
            None::<Tensor>,
            p,
            new > 1,
            None,
            gqa,
        );
    }
    let (k, v) = if gqa {
        let groups = heads / kv_heads;
        (
            k.repeat_interleave_self_int(groups, Some(1), None),
            v.repeat_interleave_self_int(groups, Some(1), None),
        )
    } else {
        (k.shallow_clone(), v.shallow_clone())
    };
    if new == 1 {
        return math_attention(q, &k, &v, None, p, train);
    }
    // Several new tokens after cached ones (or Gaudi): the mask written out, aligned so the
    // last query sees the last key (torch's `is_causal` aligns the first with the first).
    let mask = causal_mask(new, total, q);
    attend(q, &k, &v, Some(&mask), p, train)
}

/// (new, total) additive mask on the device of `like`: 0 where query i may see key j
/// (j <= total - new + i), the lowest value of `like`'s kind elsewhere. Made there from zeros
/// (tch cannot name every device, and a mask made on the host would be a copy per layer).
fn causal_mask(new: i64, total: i64, like: &Tensor) -> Tensor {
    let kind = like.kind();
    let ones = like.zeros_on_device(&[new, total], kind) + 1.0;
    ones.triu(total - new + 1) * lowest(kind)
}

/// The keys and values of the positions a generation has seen, per layer, so each new token
/// costs one position's work instead of the whole prefix again.
#[derive(Default)]
pub struct KvCache {
    layers: Vec<Option<(Tensor, Tensor)>>,
}

impl KvCache {
    pub fn new(layers: usize) -> Self {
        Self {
            layers: (0..layers).map(|_| None).collect(),
        }
    }

    /// Positions already cached.
    pub fn len(&self) -> i64 {
        self.layers
            .first()
            .and_then(|l| l.as_ref())
            .map_or(0, |(k, _)| k.size()[2])
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Appends layer `i`'s new keys and values (batch, kv_heads, new, d) and returns all of
    /// them, cached positions first.
    pub fn extend(&mut self, i: usize, k: Tensor, v: Tensor) -> (Tensor, Tensor) {
        let slot = &mut self.layers[i];
        let (k, v) = match slot.take() {
            Some((pk, pv)) => (Tensor::cat(&[pk, k], 2), Tensor::cat(&[pv, v], 2)),
            None => (k, v),
        };
        *slot = Some((k.shallow_clone(), v.shallow_clone()));
        (k, v)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Decoding token by token through the cache gives the attention of the whole sequence at
    /// once, for grouped-query heads too.
    #[test]
    fn cached_steps_equal_the_full_causal_pass() {
        tch::manual_seed(0);
        let (b, heads, kv, s, d) = (2, 4, 2, 7, 8);
        let q = Tensor::randn([b, heads, s, d], (Kind::Float, tch::Device::Cpu));
        let k = Tensor::randn([b, kv, s, d], (Kind::Float, tch::Device::Cpu));
        let v = Tensor::randn([b, kv, s, d], (Kind::Float, tch::Device::Cpu));
        let full = causal(&q, &k, &v, 0.0, false);
        let mut cache = KvCache::new(1);
        // A prefix of 3, then one token at a time, then the rest in one chunk.
        let mut parts = Vec::new();
        for (from, n) in [(0, 3), (3, 1), (4, 3)] {
            let (kk, vv) = cache.extend(0, k.narrow(2, from, n), v.narrow(2, from, n));
            parts.push(causal(&q.narrow(2, from, n), &kk, &vv, 0.0, false));
        }
        let stepped = Tensor::cat(&parts, 2);
        let diff = (full - stepped).abs().max().double_value(&[]);
        assert!(diff < 1e-5, "max difference {diff}");
        assert_eq!(cache.len(), s);
    }
}
