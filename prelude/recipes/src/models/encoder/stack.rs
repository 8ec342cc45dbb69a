//! The encoder every family shares: embeddings (word, position, token type, LayerNorm), an
//! optional projection to the hidden width, and post-LayerNorm Transformer layers, named as
//! the family names them.

use std::sync::Arc;

use tch::nn::{self, Module};
use tch::{Kind, Tensor};

use super::config::EncoderConfig;
use crate::models::attention::lowest;
use crate::models::decoder::unit_name;
use crate::models::family::{Family, LayerNames, Layers};

pub(super) fn linear(vs: nn::Path, i: i64, o: i64, cfg: &EncoderConfig) -> nn::Linear {
    let c = nn::LinearConfig {
        ws_init: nn::Init::Randn {
            mean: 0.0,
            stdev: cfg.initializer_range,
        },
        bs_init: Some(nn::Init::Const(0.0)),
        bias: true,
    };
    nn::linear(vs, i, o, c)
}

pub(super) fn layer_norm(vs: nn::Path, n: i64, cfg: &EncoderConfig) -> nn::LayerNorm {
    nn::layer_norm(
        vs,
        vec![n],
        nn::LayerNormConfig {
            eps: cfg.layer_norm_eps,
            ..Default::default()
        },
    )
}

fn embedding(vs: nn::Path, n: i64, d: i64, cfg: &EncoderConfig) -> nn::Embedding {
    nn::embedding(
        vs,
        n,
        d,
        nn::EmbeddingConfig {
            ws_init: nn::Init::Randn {
                mean: 0.0,
                stdev: cfg.initializer_range,
            },
            ..Default::default()
        },
    )
}

/// `hidden_act` and the heads' activations, by Transformers' names.
pub(super) fn activation(name: &str, x: &Tensor) -> Tensor {
    match name {
        "relu" => x.relu(),
        "tanh" => x.tanh(),
        "gelu_new" | "gelu_pytorch_tanh" | "gelu_fast" => x.gelu("tanh"),
        _ => x.gelu("none"),
    }
}

pub(super) struct Embeddings {
    pub(super) word: nn::Embedding,
    position: nn::Embedding,
    token_type: Option<nn::Embedding>,
    norm: nn::LayerNorm,
    /// RoBERTa's padding id, from which positions count.
    position_offset: Option<i64>,
    dropout: f64,
}

impl Embeddings {
    fn new(vs: nn::Path, c: &EncoderConfig, family: &Family) -> Self {
        let e = c.embedding_width();
        Self {
            word: embedding(&vs / "word_embeddings", c.vocab_size, e, c),
            position: embedding(&vs / "position_embeddings", c.max_position_embeddings, e, c),
            token_type: family
                .token_types
                .then(|| embedding(&vs / "token_type_embeddings", c.type_vocab_size, e, c)),
            norm: layer_norm(&vs / "LayerNorm", e, c),
            position_offset: family
                .position_offset
                .then_some(c.pad_token_id.unwrap_or(1)),
            dropout: c.hidden_dropout_prob,
        }
    }

    fn forward(&self, ids: &Tensor, token_types: Option<&Tensor>, train: bool) -> Tensor {
        let seq = ids.size()[1];
        let pos = match self.position_offset {
            // Real tokens count from pad + 1; padding sits at pad (Transformers'
            // create_position_ids_from_input_ids).
            Some(pad) => {
                let real = ids.ne(pad).to_kind(Kind::Int64);
                let pos = real.cumsum(1, Kind::Int64) * &real + pad;
                self.position.forward(&pos)
            }
            // Positions 0..seq are the first rows of the table: a slice added by broadcasting,
            // not a lookup. A lookup's backward pass sorts and sums one gradient row per token
            // (batch × seq of them) on CUDA; a slice's sums over the batch.
            None => self.position.ws.narrow(0, 0, seq),
        };
        let mut x = self.word.forward(ids) + pos;
        if let Some(table) = &self.token_type {
            // Without segment ids, or with a one-row table (RoBERTa), every token is of type 0.
            x += match token_types {
                Some(t) if table.ws.size()[0] > 1 => table.forward(t),
                _ => table.ws.get(0),
            };
        }
        self.norm.forward(&x).dropout(self.dropout, train)
    }
}

struct Layer {
    query: nn::Linear,
    key: nn::Linear,
    value: nn::Linear,
    attn_out: nn::Linear,
    attn_norm: nn::LayerNorm,
    intermediate: nn::Linear,
    output: nn::Linear,
    out_norm: nn::LayerNorm,
    heads: i64,
    act: String,
    dropout: f64,
    attn_dropout: f64,
}

impl Layer {
    fn new(vs: nn::Path, c: &EncoderConfig, n: &LayerNames) -> Self {
        let h = c.hidden_size;
        let path = |name: &str| path(&vs, name);
        Self {
            query: linear(path(n.query), h, h, c),
            key: linear(path(n.key), h, h, c),
            value: linear(path(n.value), h, h, c),
            attn_out: linear(path(n.attention_out), h, h, c),
            attn_norm: layer_norm(path(n.attention_norm), h, c),
            intermediate: linear(path(n.intermediate), h, c.intermediate_size, c),
            output: linear(path(n.output), c.intermediate_size, h, c),
            out_norm: layer_norm(path(n.output_norm), h, c),
            heads: c.num_attention_heads,
            act: c.hidden_act.clone(),
            dropout: c.hidden_dropout_prob,
            attn_dropout: c.attention_probs_dropout_prob,
        }
    }

    /// `mask`: additive attention mask broadcastable to (batch, heads, seq, seq).
    fn forward(&self, x: &Tensor, mask: Option<&Tensor>, train: bool) -> Tensor {
        let (b, s, h) = x.size3().expect("hidden states are (batch, seq, hidden)");
        let d = h / self.heads;
        // One projection for q, k and v (one matrix product of thrice the width, forward and
        // backward), from the three weights Transformers names: checkpoints keep their layout.
        let cat = |a: &Tensor, b: &Tensor, c: &Tensor| Tensor::cat(&[a, b, c], 0);
        let (wq, wk, wv) = (&self.query.ws, &self.key.ws, &self.value.ws);
        let bias = match (&self.query.bs, &self.key.bs, &self.value.bs) {
            (Some(bq), Some(bk), Some(bv)) => Some(cat(bq, bk, bv)),
            _ => None,
        };
        let qkv = x
            .linear(&cat(wq, wk, wv), bias.as_ref())
            .view([b, s, 3, self.heads, d])
            .permute([2, 0, 3, 1, 4]);
        let (q, k, v) = (qkv.get(0), qkv.get(1), qkv.get(2));
        let p = if train { self.attn_dropout } else { 0.0 };
        let ctx = crate::models::attention::attend(&q, &k, &v, mask, p, train);
        let ctx = ctx.transpose(1, 2).contiguous().view([b, s, h]);
        let attn = self
            .attn_norm
            .forward(&(self.attn_out.forward(&ctx).dropout(self.dropout, train) + x));
        let inter = activation(&self.act, &self.intermediate.forward(&attn));
        self.out_norm
            .forward(&(self.output.forward(&inter).dropout(self.dropout, train) + attn))
    }
}

/// The base model (`{prefix}.embeddings`, the layers), shared by the heads.
pub(super) struct Encoder {
    pub(super) embeddings: Embeddings,
    projection: Option<nn::Linear>,
    /// The layers in the order they run; ALBERT's repeat (one `Arc` per shared layer).
    /// Shared, so a checkpointed layer's recomputation can hold its own handle.
    layers: Vec<Arc<Layer>>,
    /// Each layer's variable prefix (`bert.encoder.layer.3`; ALBERT's group): its unit under
    /// ZeRO-3.
    units: Vec<String>,
    /// Activation checkpointing of every k-th layer in training (`None`: off).
    pub(super) checkpoint_every: Option<usize>,
}

impl Encoder {
    /// Builds under `base` (the prefix's path: `root / "bert"`).
    pub(super) fn new(base: &nn::Path, c: &EncoderConfig) -> Self {
        let family = c.family();
        let (e, h) = (c.embedding_width(), c.hidden_size);
        let projection = family
            .projection
            .as_ref()
            .filter(|p| p.always || e != h)
            .map(|p| linear(path(base, p.path), e, h, c));
        let (layers, units): (Vec<Arc<Layer>>, Vec<String>) = match family.layers {
            Layers::Each(under) => {
                let under = path(base, under);
                (0..c.num_hidden_layers)
                    .map(|i| {
                        let p = &under / i;
                        (
                            Arc::new(Layer::new(p.clone(), c, &family.layer)),
                            unit_name(&p),
                        )
                    })
                    .unzip()
            }
            Layers::Groups => {
                // ALBERT: layer i runs group i / (layers / groups), each group's inner layers
                // in turn (Transformers' AlbertTransformer).
                let groups = c.num_hidden_groups.unwrap_or(1).max(1);
                let inner = c.inner_group_num.unwrap_or(1).max(1);
                let under = path(base, "encoder.albert_layer_groups");
                let shared: Vec<Vec<Arc<Layer>>> = (0..groups)
                    .map(|g| {
                        (0..inner)
                            .map(|j| {
                                let p = &under / g / "albert_layers" / j;
                                Arc::new(Layer::new(p, c, &family.layer))
                            })
                            .collect()
                    })
                    .collect();
                let per_group = (c.num_hidden_layers / groups).max(1);
                (0..c.num_hidden_layers)
                    .flat_map(|i| {
                        let g = (i / per_group).min(groups - 1);
                        let unit = unit_name(&(&under / g));
                        shared[g as usize]
                            .iter()
                            .map(move |l| (l.clone(), unit.clone()))
                    })
                    .unzip()
            }
        };
        Self {
            embeddings: Embeddings::new(base / "embeddings", c, family),
            projection,
            layers,
            units,
            checkpoint_every: None,
        }
    }

    /// Hidden states (batch, seq, hidden). `attention_mask`: 1 for real tokens, 0 for padding.
    pub(super) fn forward(
        &self,
        input_ids: &Tensor,
        attention_mask: Option<&Tensor>,
        token_types: Option<&Tensor>,
        train: bool,
    ) -> Tensor {
        let mut x = self.embeddings.forward(input_ids, token_types, train);
        if let Some(p) = &self.projection {
            x = p.forward(&x);
        }
        let mask = attention_mask.map(|m| {
            // (batch, 1, 1, seq): 0 where attended, -inf-ish where padded.
            let keep = m.to_kind(Kind::Bool).unsqueeze(1).unsqueeze(1);
            keep.zeros_like()
                .to_kind(x.kind())
                .masked_fill(&keep.logical_not(), lowest(x.kind()))
        });
        for (i, l) in self.layers.iter().enumerate() {
            let recompute = self.checkpoint_every.is_some_and(|k| train && i % k == 0);
            x = trainbook_engine::unit_forward(&self.units[i], &x, |x| {
                if recompute {
                    let (layer, mask) = (l.clone(), mask.as_ref().map(Tensor::shallow_clone));
                    trainbook_engine::checkpointed(&[x], move |ins| {
                        layer.forward(&ins[0], mask.as_ref(), true)
                    })
                    .unwrap_or_else(|e| panic!("{e:#}"))
                } else {
                    l.forward(x, mask.as_ref(), train)
                }
            });
        }
        x
    }
}

/// The path of a dotted name (`encoder.layer`) under `p`.
pub(super) fn path<'a>(p: &nn::Path<'a>, dotted: &str) -> nn::Path<'a> {
    dotted.split('.').fold(p.clone(), |p, part| &p / part)
}
