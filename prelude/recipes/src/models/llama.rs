//! The Llama shape, with the parameter names of Hugging Face's `LlamaForCausalLM`
//! (`model.embed_tokens.weight`, `model.layers.0.self_attn.q_proj.weight`, ...,
//! `lm_head.weight`): RMSNorm before attention and feed-forward, rotary positions (with
//! Llama 3.1's `rope_scaling`), grouped-query attention, a SwiGLU feed-forward layer, a tied
//! or separate output head. Three `model_type`s share it: `llama` (Llama 2, 3, 3.1, 3.2),
//! `mistral` (the same; its sliding window is longer than any sequence trainbook accepts, see
//! [`LlamaConfig::check_length`]) and `qwen2` (biases on q, k and v).

use anyhow::{bail, Result};
use serde::Deserialize;
use tch::nn;
use tch::Tensor;

use super::attention::{self, KvCache};
use super::decoder::{CausalLm, Layer, Layers, Stack, TensorShapes};
use super::lora::{LoraSpec, Projection, Shape};
use super::rms_norm::RmsNorm;
use super::rotary::{rotate, RopeScaling, Rotary};

#[derive(Clone, Debug, Deserialize, PartialEq)]
pub struct LlamaConfig {
    pub model_type: String,
    pub vocab_size: i64,
    pub hidden_size: i64,
    pub intermediate_size: i64,
    pub num_hidden_layers: i64,
    pub num_attention_heads: i64,
    #[serde(default)]
    pub num_key_value_heads: Option<i64>,
    #[serde(default)]
    pub head_dim: Option<i64>,
    #[serde(default = "silu")]
    pub hidden_act: String,
    pub max_position_embeddings: i64,
    #[serde(default = "eps")]
    pub rms_norm_eps: f64,
    #[serde(default)]
    pub rope_theta: Option<f64>,
    #[serde(default)]
    pub rope_scaling: Option<RopeScaling>,
    /// transformers 5's name for the rotary settings (with `rope_theta` inside).
    #[serde(default)]
    pub rope_parameters: Option<RopeScaling>,
    #[serde(default)]
    pub tie_word_embeddings: Option<bool>,
    /// Biases on q, k, v and o (Llama's option; Qwen2 has them on q, k, v always).
    #[serde(default)]
    pub attention_bias: bool,
    #[serde(default)]
    pub mlp_bias: bool,
    #[serde(default)]
    pub sliding_window: Option<i64>,
    /// Qwen2 applies its window only when this is set.
    #[serde(default)]
    pub use_sliding_window: Option<bool>,
    #[serde(default = "init_range")]
    pub initializer_range: f64,
}

fn silu() -> String {
    "silu".into()
}
fn eps() -> f64 {
    1e-6
}
fn init_range() -> f64 {
    0.02
}

impl LlamaConfig {
    pub fn kv_heads(&self) -> i64 {
        self.num_key_value_heads.unwrap_or(self.num_attention_heads)
    }

    pub fn head_dim(&self) -> i64 {
        self.head_dim
            .unwrap_or(self.hidden_size / self.num_attention_heads)
    }

    pub fn tied(&self) -> bool {
        self.tie_word_embeddings.unwrap_or(false)
    }

    fn qkv_bias(&self) -> bool {
        self.attention_bias || self.model_type == "qwen2"
    }

    fn scaling(&self) -> Option<&RopeScaling> {
        self.rope_scaling.as_ref().or(self.rope_parameters.as_ref())
    }

    fn theta(&self) -> f64 {
        self.rope_theta
            .or_else(|| self.rope_parameters.as_ref().and_then(|p| p.rope_theta))
            .unwrap_or(10_000.0)
    }

    /// What the file says that trainbook cannot honour, as one error.
    pub fn check(&self) -> Result<()> {
        let (h, heads, kv) = (self.hidden_size, self.num_attention_heads, self.kv_heads());
        if heads <= 0 || kv <= 0 || heads % kv != 0 {
            bail!("num_attention_heads {heads} must be a positive multiple of num_key_value_heads {kv}");
        }
        if self.head_dim.is_none() && h % heads != 0 {
            bail!("hidden_size {h} is not divisible by num_attention_heads {heads}");
        }
        if self.hidden_act != "silu" {
            bail!("hidden_act '{}' is not supported for {}: trainbook's Llama-shaped models use silu (SwiGLU)", self.hidden_act, self.model_type);
        }
        Rotary::new(self.head_dim(), self.theta(), self.scaling(), 1)?;
        Ok(())
    }

    /// The longest sequence the model may see at once: its positions, and a sliding window
    /// that would apply (Mistral's, Qwen2's when `use_sliding_window`) is **refused**, not
    /// emulated: within the window attention is plainly causal, which is what trainbook runs.
    /// The sliding window that would apply (Mistral's; Qwen2's only with `use_sliding_window`).
    fn window(&self) -> Option<i64> {
        match self.model_type.as_str() {
            "qwen2" if self.use_sliding_window != Some(true) => None,
            _ => self.sliding_window,
        }
    }

    /// The most tokens [`LlamaConfig::check_length`] accepts.
    pub fn max_tokens(&self) -> i64 {
        self.window().map_or(self.max_position_embeddings, |w| {
            w.min(self.max_position_embeddings)
        })
    }

    pub fn check_length(&self, tokens: i64, fix: &str) -> Result<()> {
        if tokens > self.max_position_embeddings {
            bail!("{tokens} tokens are more than the model's {} positions (max_position_embeddings): {fix}", self.max_position_embeddings);
        }
        if let Some(w) = self.window().filter(|&w| tokens > w) {
            bail!("{tokens} tokens are more than the model's sliding_window of {w}: trainbook attends causally over the whole sequence and does not window it, so sequences are limited to {w} tokens: {fix}");
        }
        Ok(())
    }

    /// Every parameter's name and shape, as the checkpoints store them (without building
    /// the model: for the memory plan and checking a checkpoint before workers start).
    pub fn tensors(&self) -> TensorShapes {
        let (h, v, i) = (self.hidden_size, self.vocab_size, self.intermediate_size);
        let (q, kv) = (
            self.num_attention_heads * self.head_dim(),
            self.kv_heads() * self.head_dim(),
        );
        let mut t = vec![("model.embed_tokens.weight".to_string(), vec![v, h])];
        for l in 0..self.num_hidden_layers {
            let p = format!("model.layers.{l}");
            let mut add = |name: &str, shape: Vec<i64>| t.push((format!("{p}.{name}"), shape));
            add("input_layernorm.weight", vec![h]);
            add("post_attention_layernorm.weight", vec![h]);
            for (name, out, inp, bias) in [
                ("self_attn.q_proj", q, h, self.qkv_bias()),
                ("self_attn.k_proj", kv, h, self.qkv_bias()),
                ("self_attn.v_proj", kv, h, self.qkv_bias()),
                ("self_attn.o_proj", h, q, self.attention_bias),
                ("mlp.gate_proj", i, h, self.mlp_bias),
                ("mlp.up_proj", i, h, self.mlp_bias),
                ("mlp.down_proj", h, i, self.mlp_bias),
            ] {
                add(&format!("{name}.weight"), vec![out, inp]);
                if bias {
                    add(&format!("{name}.bias"), vec![out]);
                }
            }
        }
        t.push(("model.norm.weight".into(), vec![h]));
        if !self.tied() {
            t.push(("lm_head.weight".into(), vec![v, h]));
        }
        t.sort();
        t
    }
}

struct Block {
    input_norm: RmsNorm,
    q: Projection,
    k: Projection,
    v: Projection,
    o: Projection,
    post_norm: RmsNorm,
    gate: Projection,
    up: Projection,
    down: Projection,
    heads: i64,
    kv_heads: i64,
    head_dim: i64,
}

impl Block {
    fn new(p: &nn::Path, c: &LlamaConfig, lora: Option<&LoraSpec>) -> Self {
        let (h, d) = (c.hidden_size, c.head_dim());
        let proj = |path: nn::Path, inputs, outputs, bias| {
            let shape = Shape {
                inputs,
                outputs,
                bias,
                transposed: false,
                init_std: c.initializer_range,
            };
            Projection::new(&path, shape, lora)
        };
        let (att, mlp) = (p / "self_attn", p / "mlp");
        let (q, kv) = (c.num_attention_heads * d, c.kv_heads() * d);
        Self {
            input_norm: RmsNorm::new(&(p / "input_layernorm"), h, c.rms_norm_eps),
            q: proj(&att / "q_proj", h, q, c.qkv_bias()),
            k: proj(&att / "k_proj", h, kv, c.qkv_bias()),
            v: proj(&att / "v_proj", h, kv, c.qkv_bias()),
            o: proj(&att / "o_proj", q, h, c.attention_bias),
            post_norm: RmsNorm::new(&(p / "post_attention_layernorm"), h, c.rms_norm_eps),
            gate: proj(&mlp / "gate_proj", h, c.intermediate_size, c.mlp_bias),
            up: proj(&mlp / "up_proj", h, c.intermediate_size, c.mlp_bias),
            down: proj(&mlp / "down_proj", c.intermediate_size, h, c.mlp_bias),
            heads: c.num_attention_heads,
            kv_heads: c.kv_heads(),
            head_dim: d,
        }
    }

    /// `rope`: the cos and sin of the positions.
    fn run(
        &self,
        x: &Tensor,
        rope: &[Tensor],
        cache: Option<(&mut KvCache, usize)>,
        train: bool,
    ) -> Tensor {
        let (b, n, _) = x.size3().expect("hidden states are (batch, seq, hidden)");
        let a = self.input_norm.forward(x);
        let heads = |p: &Projection, count| {
            p.forward(&a, train)
                .view([b, n, count, self.head_dim])
                .transpose(1, 2)
        };
        let q = rotate(&heads(&self.q, self.heads), &rope[0], &rope[1]);
        let k = rotate(&heads(&self.k, self.kv_heads), &rope[0], &rope[1]);
        let v = heads(&self.v, self.kv_heads);
        let (k, v) = match cache {
            Some((c, i)) => c.extend(i, k, v),
            None => (k, v),
        };
        let ctx = attention::causal(&q, &k, &v, 0.0, train)
            .transpose(1, 2)
            .reshape([b, n, self.heads * self.head_dim]);
        let x = x + self.o.forward(&ctx, train);
        let m = self.post_norm.forward(&x);
        let inner = self.gate.forward(&m, train).silu() * self.up.forward(&m, train);
        &x + self.down.forward(&inner, train)
    }
}

impl Layer for Block {
    fn forward(
        &self,
        x: &Tensor,
        shared: &[Tensor],
        cache: Option<(&mut KvCache, usize)>,
        train: bool,
    ) -> Tensor {
        self.run(x, shared, cache, train)
    }

    fn projections(&mut self) -> Vec<&mut Projection> {
        vec![
            &mut self.q,
            &mut self.k,
            &mut self.v,
            &mut self.o,
            &mut self.gate,
            &mut self.up,
            &mut self.down,
        ]
    }
}

/// `LlamaForCausalLM` (and Mistral's, Qwen2's).
pub struct Llama {
    embed: Tensor,
    layers: Stack<Block>,
    norm: RmsNorm,
    /// `None`: tied to the embeddings.
    head: Option<Projection>,
    rotary: Rotary,
}

impl Llama {
    /// Builds under the VarStore's root (checked config: see [`LlamaConfig::check`]).
    pub fn new(vs: &nn::VarStore, c: &LlamaConfig, lora: Option<&LoraSpec>) -> Result<Self> {
        c.check()?;
        let root = &vs.root();
        let model = root / "model";
        let embed = super::normal(
            &(&model / "embed_tokens"),
            "weight",
            &[c.vocab_size, c.hidden_size],
            c.initializer_range,
        );
        let layers = Stack::build(vs, &(&model / "layers"), c.num_hidden_layers, |p| {
            Block::new(p, c, lora)
        })?;
        let norm = RmsNorm::new(&(&model / "norm"), c.hidden_size, c.rms_norm_eps);
        let head = (!c.tied()).then(|| {
            let shape = Shape {
                inputs: c.hidden_size,
                outputs: c.vocab_size,
                bias: false,
                transposed: false,
                init_std: c.initializer_range,
            };
            // Adapters go on the layers' projections only (what PEFT's LoRA targets).
            Projection::new(&(root / "lm_head"), shape, None)
        });
        Ok(Self {
            embed,
            layers,
            norm,
            head,
            rotary: Rotary::new(
                c.head_dim(),
                c.theta(),
                c.scaling(),
                c.max_position_embeddings,
            )?,
        })
    }
}

impl CausalLm for Llama {
    fn hidden(&self, ids: &Tensor, cache: Option<&mut KvCache>, train: bool) -> Tensor {
        let start = cache.as_ref().map_or(0, |c| c.len());
        let (cos, sin) = self.rotary.angles(start, ids.size()[1], ids);
        let x = Tensor::embedding(&self.embed, ids, -1, false, false);
        self.norm
            .forward(&self.layers.forward(x, &[cos, sin], cache, train))
    }

    fn logits(&self, hidden: &Tensor) -> Tensor {
        match &self.head {
            Some(h) => h.forward(hidden, false),
            None => hidden.linear::<Tensor>(&self.embed, None),
        }
    }

    fn layers(&self) -> &dyn Layers {
        &self.layers
    }

    fn layers_mut(&mut self) -> &mut dyn Layers {
        &mut self.layers
    }
}
