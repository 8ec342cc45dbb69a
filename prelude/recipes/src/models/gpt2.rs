//! GPT-2, with the parameter names of Hugging Face's `GPT2LMHeadModel`
//! (`transformer.wte.weight`, `transformer.h.0.attn.c_attn.weight`, ...): learned positions,
//! LayerNorm before attention and feed-forward, projections stored as Conv1D (in × out, the
//! layout of every GPT-2 checkpoint) and an output head tied to the token embeddings.

use anyhow::{bail, Result};
use serde::Deserialize;
use tch::nn::{self, Module};
use tch::Tensor;

use super::attention::{self, KvCache};
use super::decoder::{CausalLm, Layer, Layers, Stack, TensorShapes};
use super::lora::{LoraSpec, Projection, Shape};

#[derive(Clone, Debug, Deserialize, PartialEq)]
pub struct Gpt2Config {
    pub vocab_size: i64,
    pub n_positions: i64,
    pub n_embd: i64,
    pub n_layer: i64,
    pub n_head: i64,
    #[serde(default)]
    pub n_inner: Option<i64>,
    #[serde(default = "gelu_new")]
    pub activation_function: String,
    #[serde(default = "eps")]
    pub layer_norm_epsilon: f64,
    #[serde(default = "init_range")]
    pub initializer_range: f64,
    #[serde(default)]
    pub tie_word_embeddings: Option<bool>,
    #[serde(default)]
    pub scale_attn_by_inverse_layer_idx: bool,
    #[serde(default)]
    pub reorder_and_upcast_attn: bool,
    #[serde(default = "yes")]
    pub scale_attn_weights: bool,
}

fn gelu_new() -> String {
    "gelu_new".into()
}
fn eps() -> f64 {
    1e-5
}
fn init_range() -> f64 {
    0.02
}
fn yes() -> bool {
    true
}

impl Gpt2Config {
    fn inner(&self) -> i64 {
        self.n_inner.unwrap_or(4 * self.n_embd)
    }

    pub fn check(&self) -> Result<()> {
        if self.n_head <= 0 || self.n_embd % self.n_head != 0 {
            bail!(
                "n_embd {} is not divisible by n_head {}",
                self.n_embd,
                self.n_head
            );
        }
        if self.tie_word_embeddings == Some(false) {
            bail!("a GPT-2 with an untied output head (tie_word_embeddings false) is not supported: trainbook's GPT-2 ties it, as GPT2LMHeadModel does");
        }
        if self.scale_attn_by_inverse_layer_idx || !self.scale_attn_weights {
            bail!("scale_attn_by_inverse_layer_idx / scale_attn_weights false are not supported: trainbook's GPT-2 scales attention by 1/sqrt(head dim)");
        }
        let _ = activation(
            &self.activation_function,
            &Tensor::zeros([1], tch::kind::FLOAT_CPU),
        )?;
        Ok(())
    }

    pub fn check_length(&self, tokens: i64, fix: &str) -> Result<()> {
        if tokens > self.n_positions {
            bail!(
                "{tokens} tokens are more than GPT-2's {} positions (n_positions): {fix}",
                self.n_positions
            );
        }
        Ok(())
    }

    /// Every parameter's name and shape, as `GPT2LMHeadModel` checkpoints store them.
    pub fn tensors(&self) -> TensorShapes {
        let (h, i) = (self.n_embd, self.inner());
        let mut t = vec![
            (
                "transformer.wte.weight".to_string(),
                vec![self.vocab_size, h],
            ),
            ("transformer.wpe.weight".into(), vec![self.n_positions, h]),
            ("transformer.ln_f.weight".into(), vec![h]),
            ("transformer.ln_f.bias".into(), vec![h]),
        ];
        for l in 0..self.n_layer {
            for (name, shape) in [
                ("ln_1.weight", vec![h]),
                ("ln_1.bias", vec![h]),
                ("attn.c_attn.weight", vec![h, 3 * h]),
                ("attn.c_attn.bias", vec![3 * h]),
                ("attn.c_proj.weight", vec![h, h]),
                ("attn.c_proj.bias", vec![h]),
                ("ln_2.weight", vec![h]),
                ("ln_2.bias", vec![h]),
                ("mlp.c_fc.weight", vec![h, i]),
                ("mlp.c_fc.bias", vec![i]),
                ("mlp.c_proj.weight", vec![i, h]),
                ("mlp.c_proj.bias", vec![h]),
            ] {
                t.push((format!("transformer.h.{l}.{name}"), shape));
            }
        }
        t.sort();
        t
    }
}

fn activation(name: &str, x: &Tensor) -> Result<Tensor> {
    Ok(match name {
        "gelu_new" | "gelu_pytorch_tanh" | "gelu_fast" => x.gelu("tanh"),
        "gelu" => x.gelu("none"),
        "relu" => x.relu(),
        "silu" | "swish" => x.silu(),
        other => bail!(
            "activation_function '{other}' is not supported: use gelu_new, gelu, relu or silu"
        ),
    })
}

struct Block {
    ln_1: nn::LayerNorm,
    c_attn: Projection,
    attn_proj: Projection,
    ln_2: nn::LayerNorm,
    c_fc: Projection,
    mlp_proj: Projection,
    heads: i64,
    act: String,
}

impl Block {
    fn new(p: &nn::Path, c: &Gpt2Config, lora: Option<&LoraSpec>) -> Self {
        let h = c.n_embd;
        let norm = |path: nn::Path| {
            nn::layer_norm(
                path,
                vec![h],
                nn::LayerNormConfig {
                    eps: c.layer_norm_epsilon,
                    ..Default::default()
                },
            )
        };
        let conv = |path: nn::Path, inputs, outputs| {
            let shape = Shape {
                inputs,
                outputs,
                bias: true,
                transposed: true,
                init_std: c.initializer_range,
            };
            Projection::new(&path, shape, lora)
        };
        Self {
            ln_1: norm(p / "ln_1"),
            c_attn: conv(p / "attn" / "c_attn", h, 3 * h),
            attn_proj: conv(p / "attn" / "c_proj", h, h),
            ln_2: norm(p / "ln_2"),
            c_fc: conv(p / "mlp" / "c_fc", h, c.inner()),
            mlp_proj: conv(p / "mlp" / "c_proj", c.inner(), h),
            heads: c.n_head,
            act: c.activation_function.clone(),
        }
    }

    fn run(&self, x: &Tensor, cache: Option<(&mut KvCache, usize)>, train: bool) -> Tensor {
        let (b, n, h) = x.size3().expect("hidden states are (batch, seq, hidden)");
        let d = h / self.heads;
        let qkv = self
            .c_attn
            .forward(&self.ln_1.forward(x), train)
            .view([b, n, 3, self.heads, d])
            .permute([2, 0, 3, 1, 4]);
        let (q, k, v) = (qkv.get(0), qkv.get(1), qkv.get(2));
        let (k, v) = match cache {
            Some((c, i)) => c.extend(i, k, v),
            None => (k, v),
        };
        let ctx = attention::causal(&q, &k, &v, 0.0, train)
            .transpose(1, 2)
            .reshape([b, n, h]);
        let x = x + self.attn_proj.forward(&ctx, train);
        let inner = activation(&self.act, &self.c_fc.forward(&self.ln_2.forward(&x), train))
            .expect("the activation was checked with the config");
        &x + self.mlp_proj.forward(&inner, train)
    }
}

impl Layer for Block {
    fn forward(
        &self,
        x: &Tensor,
        _: &[Tensor],
        cache: Option<(&mut KvCache, usize)>,
        train: bool,
    ) -> Tensor {
        self.run(x, cache, train)
    }

    fn projections(&mut self) -> Vec<&mut Projection> {
        vec![
            &mut self.c_attn,
            &mut self.attn_proj,
            &mut self.c_fc,
            &mut self.mlp_proj,
        ]
    }
}

/// `GPT2LMHeadModel`.
pub struct Gpt2 {
    wte: Tensor,
    wpe: Tensor,
    layers: Stack<Block>,
    ln_f: nn::LayerNorm,
}

impl Gpt2 {
    pub fn new(vs: &nn::VarStore, c: &Gpt2Config, lora: Option<&LoraSpec>) -> Result<Self> {
        c.check()?;
        let root = &vs.root();
        let t = root / "transformer";
        let std = c.initializer_range;
        Ok(Self {
            wte: super::normal(&(&t / "wte"), "weight", &[c.vocab_size, c.n_embd], std),
            wpe: super::normal(&(&t / "wpe"), "weight", &[c.n_positions, c.n_embd], std),
            layers: Stack::build(vs, &(&t / "h"), c.n_layer, |p| Block::new(p, c, lora))?,
            ln_f: nn::layer_norm(
                &t / "ln_f",
                vec![c.n_embd],
                nn::LayerNormConfig {
                    eps: c.layer_norm_epsilon,
                    ..Default::default()
                },
            ),
        })
    }
}

impl CausalLm for Gpt2 {
    fn hidden(&self, ids: &Tensor, cache: Option<&mut KvCache>, train: bool) -> Tensor {
        let start = cache.as_ref().map_or(0, |c| c.len());
        let n = ids.size()[1];
        let x = Tensor::embedding(&self.wte, ids, -1, false, false) + self.wpe.narrow(0, start, n);
        self.ln_f
            .forward(&self.layers.forward(x, &[], cache, train))
    }

    fn logits(&self, hidden: &Tensor) -> Tensor {
        hidden.linear::<Tensor>(&self.wte, None)
    }

    fn layers(&self) -> &dyn Layers {
        &self.layers
    }

    fn layers_mut(&mut self) -> &mut dyn Layers {
        &mut self.layers
    }
}
