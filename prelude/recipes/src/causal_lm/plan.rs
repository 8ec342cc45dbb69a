//! The memory plan's view of a causal-LM job: its trainable tensors (every weight, or only the
//! LoRA adapters), the frozen base, and what one micro-batch keeps for its backward pass,
//! counted from the shapes the way autograd keeps them in this crate's forward passes.
//!
//! Under LoRA a frozen projection keeps no copy of its input (its weight needs no gradient),
//! and under bf16 the frozen base is held in bf16 itself (no autocast copies).

use anyhow::Result;
use trainbook_api::{DeviceKind, Footprint, Hyper, Precision};
use trainbook_engine::Layout;

use super::{model_dir, Settings};
use crate::models::causal_lm::{Architecture, ModelConfig, TensorShapes};
use crate::models::lora::LoraSpec;

/// Tensor sizes of one layer, per token.
struct LayerShape {
    hidden: u64,
    /// Query (and attention output) width: heads x head dim.
    q: u64,
    inner: u64,
    heads: u64,
    /// GPT-2: LayerNorm (keeps its input and output); Llama: RMSNorm (its input, its
    /// normalised input before the weight, and its output).
    norm_copies: u64,
    /// Feed-forward tensors the backward pass needs whether or not the weights are trained
    /// (Llama: gate, silu(gate), up; GPT-2: the pre-activation).
    mlp_kept: u64,
}

fn shape(config: &ModelConfig) -> LayerShape {
    match &config.arch {
        Architecture::Gpt2(c) => {
            let (h, i) = (c.n_embd as u64, c.n_inner.unwrap_or(4 * c.n_embd) as u64);
            LayerShape {
                hidden: h,
                q: h,
                inner: i,
                heads: c.n_head as u64,
                norm_copies: 2,
                mlp_kept: i,
            }
        }
        Architecture::Llama(c) => {
            let (h, i) = (c.hidden_size as u64, c.intermediate_size as u64);
            LayerShape {
                hidden: h,
                q: (c.num_attention_heads * c.head_dim()) as u64,
                inner: i,
                heads: c.num_attention_heads as u64,
                norm_copies: 3,
                mlp_kept: 3 * i,
            }
        }
    }
}

/// The job's tensors and one micro-batch's activations on its device.
pub fn footprint(hyper: &Hyper, layout: &Layout) -> Result<Footprint> {
    let s: Settings = crate::settings(hyper)?;
    let dir = model_dir(hyper.model.as_deref().unwrap_or_default())?;
    let config = ModelConfig::read(&dir)?;
    Ok(plan(
        &config,
        s.lora.as_ref(),
        s.text.max_length as u64,
        hyper,
        layout,
    ))
}

/// [`footprint`] for a config (no file is read).
pub fn plan(
    config: &ModelConfig,
    lora: Option<&LoraSpec>,
    seq: u64,
    hyper: &Hyper,
    layout: &Layout,
) -> Footprint {
    let bf16 = hyper.precision == Precision::Bf16;
    let w = if bf16 { 2 } else { 4 };
    // The residual stream and the norms stay in f32 under CPU's and CUDA's autocast.
    let n = if layout.device == DeviceKind::Hpu {
        w
    } else {
        4
    };
    let tensors = config.tensors();
    let matrices: u64 = tensors
        .iter()
        .filter(|(_, s)| s.len() == 2)
        .map(|(_, s)| s.iter().product::<i64>() as u64)
        .sum();
    let all: u64 = tensors
        .iter()
        .map(|(_, s)| s.iter().product::<i64>() as u64)
        .sum();
    let l = shape(config);
    let layers = config.layers() as u64;
    let (b, tokens) = (
        layout.batch_per_device as u64,
        layout.batch_per_device as u64 * seq,
    );
    let adapted: Vec<(String, u64, u64)> = match lora {
        Some(spec) => tensors
            .iter()
            .filter(|(name, s)| s.len() == 2 && name.ends_with(".weight"))
            .filter_map(|(name, s)| {
                let module = name.strip_suffix(".weight")?;
                let (out, inp) = match &config.arch {
                    Architecture::Gpt2(_) => (s[1] as u64, s[0] as u64),
                    Architecture::Llama(_) => (s[0] as u64, s[1] as u64),
                };
                (config.projections().iter().any(|p| p == module) && spec.targets_module(module))
                    .then(|| (module.to_string(), inp, out))
            })
            .collect(),
        None => Vec::new(),
    };
    let trainable: Vec<u64> = match lora {
        Some(spec) => {
            let r = spec.rank as u64;
            adapted
                .iter()
                .flat_map(|(_, i, o)| [r * i, o * r])
                .collect()
        }
        None => tensors
            .iter()
            .map(|(_, s)| s.iter().product::<i64>() as u64)
            .collect(),
    };
    // One layer's activations, in bytes.
    let attention = 4 * tokens * l.q * w + b * l.heads * seq * 4;
    let layer = match lora {
        // Trained weights keep their inputs: the norms' outputs (counted with the norms), the
        // attention's output for its projection, the feed-forward's inner activation.
        None => {
            l.norm_copies * 2 * tokens * l.hidden * n
                + attention
                + tokens * (l.q + l.inner + l.mlp_kept) * w
        }
        Some(spec) => {
            let r = spec.rank as u64;
            let per_layer = adapted.len() as u64 / layers.max(1);
            let avg_in =
                adapted.iter().map(|(_, i, _)| i).sum::<u64>() / adapted.len().max(1) as u64;
            // An adapter keeps its (dropped-out) input for A's gradient, and A's output for B's.
            let dropout = if spec.dropout > 0.0 { 2 } else { 0 };
            2 * tokens * l.hidden * n
                + attention
                + tokens * l.mlp_kept * w
                + per_layer * tokens * (avg_in * dropout + r) * w
        }
    };
    let activations = stack_and_head(config, &l, layer, (b, seq, tokens), (w, n), hyper);
    // A frozen base is held in bf16 under bf16 (see `LmRecipe::build`).
    let frozen = if lora.is_some() { all * w } else { 0 };
    let units = layer_bytes(&tensors, if lora.is_some() { w } else { 4 });
    Footprint {
        model: config.describe(),
        trainable,
        cast_by_autocast: if lora.is_some() { 0 } else { matrices },
        frozen_bytes: frozen,
        activations,
        units,
    }
}

/// Each layer's weights in bytes (ZeRO-3's units), `per_element` bytes an element: fp32 when
/// trained, the frozen base's dtype under LoRA.
fn layer_bytes(tensors: &TensorShapes, per_element: u64) -> Vec<(String, u64)> {
    trainbook_engine::unit_sizes(tensors.iter().map(|(name, s)| {
        (
            name.as_str(),
            s.iter().product::<i64>() as u64 * per_element,
        )
    }))
}

/// The parts of a micro-batch's activations: the layers (`layer` bytes each, fewer with
/// activation checkpointing), the embeddings, the backward pass's working set and the head.
fn stack_and_head(
    config: &ModelConfig,
    l: &LayerShape,
    layer: u64,
    (b, seq, tokens): (u64, u64, u64),
    (w, n): (u64, u64),
    hyper: &Hyper,
) -> Vec<(String, u64)> {
    let layers = config.layers() as u64;
    let every = hyper
        .activation_checkpointing
        .then_some(hyper.checkpoint_layers_every.max(1) as u64);
    let (kept, label) = match every {
        Some(k) => {
            let recomputed = layers.div_ceil(k);
            (
                recomputed * tokens * l.hidden * n + (layers - recomputed) * layer + layer,
                format!("{layers} layers (every {k}. recomputed; one recomputed at a time)"),
            )
        }
        None => (layers * layer, format!("{layers} layers")),
    };
    // The head: every position but a row's last predicts a token; its log-softmax and
    // gradient over the vocabulary in f32.
    let predicted = b * seq.saturating_sub(1);
    let vocab = config.vocab_size() as u64;
    let head = predicted * config.hidden_size() as u64 * w + 3 * predicted * vocab * 4;
    vec![
        ("embeddings".to_string(), tokens * l.hidden * n),
        (label, kept),
        (
            "backward working set".into(),
            2 * tokens * (l.inner + l.hidden) * w,
        ),
        (
            format!("next-token head ({predicted} positions x {vocab})"),
            head,
        ),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;
    use trainbook_api::OptimizerKind;

    fn llama3_8b() -> ModelConfig {
        ModelConfig::from_json(
            serde_json::json!({
                "model_type": "llama", "vocab_size": 128256, "hidden_size": 4096,
                "intermediate_size": 14336, "num_hidden_layers": 32, "num_attention_heads": 32,
                "num_key_value_heads": 8, "max_position_embeddings": 8192, "rope_theta": 500000.0,
                "tie_word_embeddings": false
            }),
            "Llama-3-8B",
        )
        .unwrap()
    }

    #[test]
    fn llama_3_8b_has_the_parameters_of_its_name_and_lora_trains_a_sliver() {
        let c = llama3_8b();
        let all: i64 = c
            .tensors()
            .iter()
            .map(|(_, s)| s.iter().product::<i64>())
            .sum();
        assert_eq!(all, 8_030_261_248);
        let h = Hyper::new("default", 1, 8, 2e-4, OptimizerKind::Adamw);
        let layout = Layout {
            batch_per_device: 1,
            device: DeviceKind::Cuda,
        };
        let spec = LoraSpec {
            rank: 16,
            alpha: 32.0,
            dropout: 0.05,
            targets: c.default_lora_targets(),
        };
        let f = plan(&c, Some(&spec), 2048, &h, &layout);
        // r x (in + out) for q (4096 -> 4096), k and v (4096 -> 1024), o (4096 -> 4096), 32 layers.
        assert_eq!(
            f.parameters(),
            32 * 16 * ((4096 + 4096) * 2 + (4096 + 1024) * 2)
        );
        assert_eq!(f.frozen_bytes, 4 * 8_030_261_248);
        let bf16 = Hyper {
            precision: Precision::Bf16,
            ..h.clone()
        };
        assert_eq!(
            plan(&c, Some(&spec), 2048, &bf16, &layout).frozen_bytes,
            2 * 8_030_261_248
        );
        let full = plan(&c, None, 2048, &h, &layout);
        assert_eq!(full.parameters(), 8_030_261_248);
        let acts = |f: &Footprint| f.activations.iter().map(|a| a.1).sum::<u64>();
        assert!(
            acts(&f) < acts(&full),
            "a frozen base keeps fewer activations"
        );
    }
}
