//! BERT: the encoder with a sequence-classification head or a masked-LM head, parameter names
//! identical to Hugging Face Transformers' `BertForSequenceClassification` and
//! `BertForMaskedLM` (`bert.embeddings.word_embeddings.weight`,
//! `bert.encoder.layer.0.attention.self.query.weight`, ..., `classifier.weight`,
//! `cls.predictions.transform.dense.weight`), so checkpoints go both ways.

use std::collections::HashMap;
use std::path::Path;
use std::sync::Arc;

use anyhow::{Context, Result};
use serde::{Deserialize, Serialize};
use tch::nn::{self, Module};
use tch::{Kind, Tensor};

use super::attention::lowest;

#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct BertConfig {
    pub vocab_size: i64,
    pub hidden_size: i64,
    pub num_hidden_layers: i64,
    pub num_attention_heads: i64,
    pub intermediate_size: i64,
    #[serde(default = "default_act")]
    pub hidden_act: String,
    #[serde(default = "default_dropout")]
    pub hidden_dropout_prob: f64,
    #[serde(default = "default_dropout")]
    pub attention_probs_dropout_prob: f64,
    pub max_position_embeddings: i64,
    #[serde(default = "default_type_vocab")]
    pub type_vocab_size: i64,
    #[serde(default = "default_eps")]
    pub layer_norm_eps: f64,
    #[serde(default = "default_init_range")]
    pub initializer_range: f64,
    /// Dropout before the classifier; `None` means `hidden_dropout_prob` (as in Transformers).
    #[serde(default)]
    pub classifier_dropout: Option<f64>,
    /// Label names by id, when the checkpoint has a classification head.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub id2label: Option<std::collections::BTreeMap<String, String>>,
}

fn default_act() -> String {
    "gelu".into()
}
fn default_dropout() -> f64 {
    0.1
}
fn default_type_vocab() -> i64 {
    2
}
fn default_eps() -> f64 {
    1e-12
}
fn default_init_range() -> f64 {
    0.02
}

impl BertConfig {
    /// A 2-layer, hidden-64 BERT: seconds to train on a CPU, for tests and CI.
    pub fn tiny(vocab_size: i64, max_positions: i64) -> Self {
        Self {
            vocab_size,
            hidden_size: 64,
            num_hidden_layers: 2,
            num_attention_heads: 4,
            intermediate_size: 128,
            hidden_act: default_act(),
            hidden_dropout_prob: 0.1,
            attention_probs_dropout_prob: 0.1,
            max_position_embeddings: max_positions,
            type_vocab_size: 2,
            layer_norm_eps: 1e-12,
            initializer_range: 0.02,
            classifier_dropout: None,
            id2label: None,
        }
    }

    /// Reads a Hugging Face `config.json`.
    pub fn from_file(path: &Path) -> Result<Self> {
        let text =
            std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
        // A checkpoint is read as what it says it is: a Llama's config would otherwise parse
        // (its field names overlap BERT's) and train a BERT initialised at random.
        let kind = serde_json::from_str::<serde_json::Value>(&text)
            .ok()
            .and_then(|v| {
                v.get("model_type")
                    .and_then(|t| t.as_str())
                    .map(String::from)
            });
        match kind.as_deref() {
            None | Some("bert") => {}
            Some(causal) if super::causal_lm::SUPPORTED.contains(&causal) => anyhow::bail!(
                "{} is a {causal} model, a causal language model: fine-tune it with `trainbook train causal-lm --model DIR` (LmTrainer in a notebook)",
                path.display()
            ),
            Some(other) => anyhow::bail!(
                "{} is a {other} model (model_type), not BERT: the bert recipes read model_type bert",
                path.display()
            ),
        }
        serde_json::from_str(&text).with_context(|| {
            format!("{} is not a BERT config.json (needs vocab_size, hidden_size, num_hidden_layers, ...)", path.display())
        })
    }

    /// Number of labels named in `id2label`, if any.
    pub fn num_labels(&self) -> Option<i64> {
        self.id2label.as_ref().map(|m| m.len() as i64)
    }

    pub fn with_dropout(mut self, p: f64) -> Self {
        self.hidden_dropout_prob = p;
        self.attention_probs_dropout_prob = p;
        self
    }
}

fn linear(vs: nn::Path, i: i64, o: i64, cfg: &BertConfig) -> nn::Linear {
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

fn layer_norm(vs: nn::Path, n: i64, cfg: &BertConfig) -> nn::LayerNorm {
    nn::layer_norm(
        vs,
        vec![n],
        nn::LayerNormConfig {
            eps: cfg.layer_norm_eps,
            ..Default::default()
        },
    )
}

fn embedding(vs: nn::Path, n: i64, d: i64, cfg: &BertConfig) -> nn::Embedding {
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

fn activation(name: &str, x: &Tensor) -> Tensor {
    match name {
        "relu" => x.relu(),
        "gelu_new" | "gelu_pytorch_tanh" => x.gelu("tanh"),
        _ => x.gelu("none"),
    }
}

struct Embeddings {
    word: nn::Embedding,
    position: nn::Embedding,
    token_type: nn::Embedding,
    norm: nn::LayerNorm,
    dropout: f64,
}

impl Embeddings {
    fn new(vs: nn::Path, c: &BertConfig) -> Self {
        Self {
            word: embedding(&vs / "word_embeddings", c.vocab_size, c.hidden_size, c),
            position: embedding(
                &vs / "position_embeddings",
                c.max_position_embeddings,
                c.hidden_size,
                c,
            ),
            token_type: embedding(
                &vs / "token_type_embeddings",
                c.type_vocab_size,
                c.hidden_size,
                c,
            ),
            norm: layer_norm(&vs / "LayerNorm", c.hidden_size, c),
            dropout: c.hidden_dropout_prob,
        }
    }

    fn forward(&self, ids: &Tensor, token_types: Option<&Tensor>, train: bool) -> Tensor {
        let seq = ids.size()[1];
        // Positions 0..seq are the first rows of the table, and without segment ids every
        // token is of type 0: slices added by broadcasting, not lookups. A lookup's backward
        // pass sorts and sums one gradient row per token (batch × seq of them) on CUDA; a
        // slice's sums over the batch.
        let pos = self.position.ws.narrow(0, 0, seq);
        let tt = match token_types {
            Some(t) => self.token_type.forward(t),
            None => self.token_type.ws.get(0),
        };
        let x = self.word.forward(ids) + pos + tt;
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
    fn new(vs: nn::Path, c: &BertConfig) -> Self {
        let h = c.hidden_size;
        let att = &vs / "attention";
        Self {
            query: linear(&att / "self" / "query", h, h, c),
            key: linear(&att / "self" / "key", h, h, c),
            value: linear(&att / "self" / "value", h, h, c),
            attn_out: linear(&att / "output" / "dense", h, h, c),
            attn_norm: layer_norm(&att / "output" / "LayerNorm", h, c),
            intermediate: linear(&vs / "intermediate" / "dense", h, c.intermediate_size, c),
            output: linear(&vs / "output" / "dense", c.intermediate_size, h, c),
            out_norm: layer_norm(&vs / "output" / "LayerNorm", h, c),
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
        let ctx = super::attention::attend(&q, &k, &v, mask, p, train);
        let ctx = ctx.transpose(1, 2).contiguous().view([b, s, h]);
        let attn = self
            .attn_norm
            .forward(&(self.attn_out.forward(&ctx).dropout(self.dropout, train) + x));
        let inter = activation(&self.act, &self.intermediate.forward(&attn));
        self.out_norm
            .forward(&(self.output.forward(&inter).dropout(self.dropout, train) + attn))
    }
}

/// The encoder (`bert.embeddings`, `bert.encoder`), shared by the heads.
struct Encoder {
    embeddings: Embeddings,
    /// Shared, so a checkpointed layer's recomputation can hold its own handle.
    layers: Vec<Arc<Layer>>,
    /// Activation checkpointing of every k-th layer in training (`None`: off).
    checkpoint_every: Option<usize>,
}

impl Encoder {
    fn new(bert: &nn::Path, c: &BertConfig) -> Self {
        let enc = bert / "encoder" / "layer";
        Self {
            embeddings: Embeddings::new(bert / "embeddings", c),
            layers: (0..c.num_hidden_layers)
                .map(|i| Arc::new(Layer::new(&enc / i, c)))
                .collect(),
            checkpoint_every: None,
        }
    }

    /// Hidden states (batch, seq, hidden). `attention_mask`: 1 for real tokens, 0 for padding.
    fn forward(
        &self,
        input_ids: &Tensor,
        attention_mask: Option<&Tensor>,
        token_types: Option<&Tensor>,
        train: bool,
    ) -> Tensor {
        let mut x = self.embeddings.forward(input_ids, token_types, train);
        let mask = attention_mask.map(|m| {
            // (batch, 1, 1, seq): 0 where attended, -inf-ish where padded.
            let keep = m.to_kind(Kind::Bool).unsqueeze(1).unsqueeze(1);
            keep.zeros_like()
                .to_kind(x.kind())
                .masked_fill(&keep.logical_not(), lowest(x.kind()))
        });
        for (i, l) in self.layers.iter().enumerate() {
            x = match self.checkpoint_every {
                Some(k) if train && i % k == 0 => {
                    let (layer, mask) = (l.clone(), mask.as_ref().map(Tensor::shallow_clone));
                    trainbook_engine::checkpointed(&[&x], move |ins| {
                        layer.forward(&ins[0], mask.as_ref(), true)
                    })
                    .unwrap_or_else(|e| panic!("{e:#}"))
                }
                _ => l.forward(&x, mask.as_ref(), train),
            };
        }
        x
    }
}

/// `BertForSequenceClassification`.
pub struct BertClassifier {
    encoder: Encoder,
    pooler: nn::Linear,
    classifier: nn::Linear,
    dropout: f64,
    pub num_labels: i64,
}

impl BertClassifier {
    /// Builds under `root` (use the VarStore's root; names get the `bert.` prefix).
    pub fn new(root: &nn::Path, c: &BertConfig, num_labels: i64) -> Self {
        let bert = root / "bert";
        Self {
            encoder: Encoder::new(&bert, c),
            pooler: linear(&bert / "pooler" / "dense", c.hidden_size, c.hidden_size, c),
            classifier: linear(root / "classifier", c.hidden_size, num_labels, c),
            dropout: c.classifier_dropout.unwrap_or(c.hidden_dropout_prob),
            num_labels,
        }
    }

    /// Activation checkpointing of every k-th encoder layer in training (`None`: off).
    pub fn set_activation_checkpointing(&mut self, every: Option<usize>) {
        self.encoder.checkpoint_every = every.filter(|&k| k > 0);
    }

    /// Logits (batch, num_labels). `attention_mask`: 1 for real tokens, 0 for padding.
    pub fn forward(
        &self,
        input_ids: &Tensor,
        attention_mask: Option<&Tensor>,
        token_types: Option<&Tensor>,
        train: bool,
    ) -> Tensor {
        let x = self
            .encoder
            .forward(input_ids, attention_mask, token_types, train);
        let cls = x.select(1, 0);
        let pooled = self.pooler.forward(&cls).tanh();
        self.classifier
            .forward(&pooled.dropout(self.dropout, train))
    }
}

/// Label of a position the masked-LM loss ignores (Transformers' `-100`).
pub const IGNORE_INDEX: i64 = -100;

/// `BertForMaskedLM`: the encoder (no pooler), then `cls.predictions`: a dense + activation +
/// LayerNorm transform and a decoder whose weight is the word-embedding matrix (tied, as in
/// Transformers: one tensor, trained by both uses) plus its own bias.
pub struct BertForMaskedLm {
    encoder: Encoder,
    transform: nn::Linear,
    transform_norm: nn::LayerNorm,
    bias: Tensor,
    act: String,
}

impl BertForMaskedLm {
    /// Builds under `root` (names `bert.*` and `cls.predictions.*`).
    pub fn new(root: &nn::Path, c: &BertConfig) -> Self {
        let head = root / "cls" / "predictions";
        let h = c.hidden_size;
        Self {
            encoder: Encoder::new(&(root / "bert"), c),
            transform: linear(&head / "transform" / "dense", h, h, c),
            transform_norm: layer_norm(&head / "transform" / "LayerNorm", h, c),
            bias: head.zeros("bias", &[c.vocab_size]),
            act: c.hidden_act.clone(),
        }
    }

    /// Activation checkpointing of every k-th encoder layer in training (`None`: off).
    pub fn set_activation_checkpointing(&mut self, every: Option<usize>) {
        self.encoder.checkpoint_every = every.filter(|&k| k > 0);
    }

    /// Vocabulary logits of the given hidden states (…, hidden) → (…, vocab).
    fn predict(&self, hidden: &Tensor) -> Tensor {
        let x = activation(&self.act, &self.transform.forward(hidden));
        let x = self.transform_norm.forward(&x);
        x.matmul(&self.encoder.embeddings.word.ws.tr()) + &self.bias
    }

    /// Logits for every position (batch, seq, vocab), as Transformers returns them.
    pub fn forward(
        &self,
        input_ids: &Tensor,
        attention_mask: Option<&Tensor>,
        token_types: Option<&Tensor>,
        train: bool,
    ) -> Tensor {
        let x = self
            .encoder
            .forward(input_ids, attention_mask, token_types, train);
        self.predict(&x)
    }

    /// Logits (n, vocab) at `positions` only: indices into the flattened (batch × seq)
    /// tokens, from [`masked_positions`]. The loss needs nothing else, and the vocabulary
    /// projection of the ~85% unmasked positions is most of a forward pass's work at BERT
    /// sizes. The positions come from the host with the batch: finding them on the device
    /// (`nonzero`) would make the host wait for the encoder mid-step.
    pub fn forward_masked(
        &self,
        input_ids: &Tensor,
        attention_mask: Option<&Tensor>,
        token_types: Option<&Tensor>,
        positions: &Tensor,
        train: bool,
    ) -> Tensor {
        let x = self
            .encoder
            .forward(input_ids, attention_mask, token_types, train);
        let h = x.size()[2];
        let picked = x.reshape([-1, h]).index_select(0, positions);
        self.predict(&picked)
    }
}

/// The flat positions (row-major over batch × seq) whose label is not [`IGNORE_INDEX`], and
/// those labels: what [`BertForMaskedLm::forward_masked`] and its loss take.
pub fn masked_positions(labels: &[i64]) -> (Vec<i64>, Vec<i64>) {
    labels
        .iter()
        .enumerate()
        .filter(|(_, &l)| l != IGNORE_INDEX)
        .map(|(i, &l)| (i as i64, l))
        .unzip()
}

pub use super::LoadReport;

/// Tensors some checkpoints carry that are not parameters here: a buffer recomputed at run
/// time, and the masked-LM decoder, which is tied to the word embeddings and its bias.
const IGNORED: &[&str] = &[
    "embeddings.position_ids",
    "cls.predictions.decoder.weight",
    "cls.predictions.decoder.bias",
];

/// Copies the tensors of a `model.safetensors` into `vs`, matching Hugging Face names with or
/// without the `bert.` prefix (BertModel checkpoints such as all-MiniLM-L6-v2 have none).
pub fn load_safetensors(vs: &nn::VarStore, path: &Path) -> Result<LoadReport> {
    let tensors =
        Tensor::read_safetensors(path).with_context(|| format!("reading {}", path.display()))?;
    load_tensors(vs, tensors, &path.display().to_string())
}

/// Loads a model directory's weights: `model.safetensors`, else PyTorch's `pytorch_model.bin`
/// (read through libtorch's pickle loader), else a file given directly.
pub fn load_weights(vs: &nn::VarStore, path: &Path) -> Result<LoadReport> {
    let file = if path.is_dir() {
        ["model.safetensors", "pytorch_model.bin"]
            .iter()
            .map(|f| path.join(f))
            .find(|f| f.exists())
            .with_context(|| {
                format!(
                    "{} has neither model.safetensors nor pytorch_model.bin",
                    path.display()
                )
            })?
    } else {
        path.to_path_buf()
    };
    if file.extension().is_some_and(|e| e == "safetensors") {
        return load_safetensors(vs, &file);
    }
    let tensors = Tensor::loadz_multi(&file).with_context(|| {
        format!(
            "reading {} as a PyTorch state dict failed; convert it to model.safetensors (e.g. with Transformers' save_pretrained(safe_serialization=True))",
            file.display()
        )
    })?;
    load_tensors(vs, tensors, &file.display().to_string())
}

pub fn load_tensors(
    vs: &nn::VarStore,
    tensors: Vec<(String, Tensor)>,
    origin: &str,
) -> Result<LoadReport> {
    // Old BERT checkpoints (TensorFlow-era conversions) call the LayerNorm parameters
    // gamma/beta; Transformers renames them on load, and so do we.
    let by_name: HashMap<String, Tensor> = tensors
        .into_iter()
        .map(|(k, t)| {
            let k = match (k.strip_suffix(".gamma"), k.strip_suffix(".beta")) {
                (Some(base), _) if base.ends_with("LayerNorm") => format!("{base}.weight"),
                (_, Some(base)) if base.ends_with("LayerNorm") => format!("{base}.bias"),
                _ => k,
            };
            (k, t)
        })
        .collect();
    super::load_into(
        vs,
        by_name,
        origin,
        &super::LoadRules {
            optional_prefix: Some("bert."),
            ignored: IGNORED,
            replaceable_head: &[],
            mismatch_hint: "the checkpoint was made for a different config.json",
        },
    )
}

/// The head a BERT footprint is planned with.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Head {
    /// `BertForSequenceClassification` with this many labels (pooler and classifier).
    Classifier(i64),
    /// `BertForMaskedLM`, scoring this many positions per sequence (the masked ones).
    MaskedLm { predictions: f64 },
}

/// How one micro-batch runs, for [`BertConfig::footprint`].
#[derive(Clone, Copy, Debug)]
pub struct RunShape {
    pub batch: u64,
    pub seq: u64,
    /// Bytes of an activation element: 4 (fp32) or 2 (bf16 autocast).
    pub element: u64,
    /// Bytes of an element of the residual stream (the LayerNorms' inputs and outputs): 4 on
    /// CPU and CUDA, whose autocast runs LayerNorm in fp32; the activation's on Gaudi, whose
    /// autocast runs it in bf16.
    pub norm: u64,
    /// Bytes per element of a dropout mask: CPU keeps the scaled noise (an activation element),
    /// CUDA's and Gaudi's fused dropout a byte mask.
    pub mask: u64,
    /// Whether dropout is on (p > 0).
    pub dropout: bool,
    /// A fused attention kernel (saves q, k, v, the output and a row statistic) instead of the
    /// written-out one (saves the scores, the softmax and its dropout).
    pub fused_attention: bool,
    /// Activation checkpointing of every k-th layer.
    pub checkpoint_every: Option<usize>,
}

/// Activation bytes of one micro-batch, by part, and the parameter tensors, for the memory plan.
pub struct BertFootprint {
    /// (name, elements) of every trainable tensor, sorted by name.
    pub tensors: Vec<(String, u64)>,
    /// Elements of the weights bf16 autocast copies (every matrix a matmul reads).
    pub cast_by_autocast: u64,
    pub activations: Vec<(String, u64)>,
}

impl BertConfig {
    /// The parameters and the activations of a micro-batch, counted from the shapes the way
    /// autograd keeps them in this file's forward pass (checked against torch's saved-tensor
    /// hooks: the count of one layer matches to the tensor).
    pub fn footprint(&self, head: Head, run: &RunShape) -> BertFootprint {
        let (h, i, v, l) = (
            self.hidden_size as u64,
            self.intermediate_size as u64,
            self.vocab_size as u64,
            self.num_hidden_layers as u64,
        );
        let mut tensors: Vec<(String, u64)> = vec![
            ("bert.embeddings.word_embeddings.weight".into(), v * h),
            (
                "bert.embeddings.position_embeddings.weight".into(),
                self.max_position_embeddings as u64 * h,
            ),
            (
                "bert.embeddings.token_type_embeddings.weight".into(),
                self.type_vocab_size as u64 * h,
            ),
            ("bert.embeddings.LayerNorm.weight".into(), h),
            ("bert.embeddings.LayerNorm.bias".into(), h),
        ];
        for k in 0..l {
            let p = format!("bert.encoder.layer.{k}");
            for (name, n) in [
                ("attention.self.query.weight", h * h),
                ("attention.self.query.bias", h),
                ("attention.self.key.weight", h * h),
                ("attention.self.key.bias", h),
                ("attention.self.value.weight", h * h),
                ("attention.self.value.bias", h),
                ("attention.output.dense.weight", h * h),
                ("attention.output.dense.bias", h),
                ("attention.output.LayerNorm.weight", h),
                ("attention.output.LayerNorm.bias", h),
                ("intermediate.dense.weight", i * h),
                ("intermediate.dense.bias", i),
                ("output.dense.weight", h * i),
                ("output.dense.bias", h),
                ("output.LayerNorm.weight", h),
                ("output.LayerNorm.bias", h),
            ] {
                tensors.push((format!("{p}.{name}"), n));
            }
        }
        let mut cast = l * (4 * h * h + 2 * h * i);
        match head {
            Head::Classifier(labels) => {
                let labels = labels.max(1) as u64;
                tensors.extend([
                    ("bert.pooler.dense.weight".into(), h * h),
                    ("bert.pooler.dense.bias".into(), h),
                    ("classifier.weight".into(), labels * h),
                    ("classifier.bias".into(), labels),
                ]);
                cast += h * h + labels * h;
            }
            Head::MaskedLm { .. } => {
                tensors.extend([
                    ("cls.predictions.transform.dense.weight".into(), h * h),
                    ("cls.predictions.transform.dense.bias".into(), h),
                    ("cls.predictions.transform.LayerNorm.weight".into(), h),
                    ("cls.predictions.transform.LayerNorm.bias".into(), h),
                    ("cls.predictions.bias".into(), v),
                ]);
                // The decoder reads the word embeddings as a matrix.
                cast += h * h + v * h;
            }
        }
        tensors.sort();
        BertFootprint {
            tensors,
            cast_by_autocast: cast,
            activations: self.activations(head, run),
        }
    }

    /// Bytes one micro-batch keeps at the start of its backward pass, by part.
    fn activations(&self, head: Head, r: &RunShape) -> Vec<(String, u64)> {
        let (h, i, v, l, a) = (
            self.hidden_size as u64,
            self.intermediate_size as u64,
            self.vocab_size as u64,
            self.num_hidden_layers as u64,
            self.num_attention_heads as u64,
        );
        let tokens = r.batch * r.seq;
        let (e, inter, scores) = (tokens * h, tokens * i, r.batch * a * r.seq * r.seq);
        let (w, n, fp32) = (r.element, r.norm, 4);
        let masks = |n: u64| if r.dropout { n * r.mask } else { 0 };
        // One layer: its input; q, k, v (copies the attention's matmuls read); the scores, their
        // softmax and its dropout (written out) or the output and row statistics (fused); the
        // context; the two residual sums that enter the LayerNorms and the attention output
        // between them (in the residual stream's dtype); the feed-forward input and its
        // GELU; two dropout masks.
        let attention = if r.fused_attention {
            2 * e * w + r.batch * a * r.seq * fp32
        } else {
            e * w + scores * w + if r.dropout { scores * (r.mask + w) } else { 0 }
        };
        let layer = e * n + 3 * e * w + attention + 3 * e * n + 2 * inter * w + masks(2 * e);
        let every = r.checkpoint_every.map(|k| k.max(1) as u64);
        // A checkpointed layer keeps its input only, and is recomputed (all of its
        // activations) when the backward pass reaches it: by then the layers after it are
        // freed, and so is the head, whose backward pass ran first. So a recomputation adds
        // to the peak only when no plain layer follows the last checkpointed one, and then it
        // takes the head's place rather than adding to it.
        let (kept, recompute) = match every {
            Some(k) if l > 0 => {
                let checkpointed = l.div_ceil(k);
                let after_last = l - 1 - (l - 1) / k * k;
                let recompute = if after_last == 0 { layer } else { 0 };
                (checkpointed * e * n + (l - checkpointed) * layer, recompute)
            }
            Some(_) => (0, 0),
            None => (l * layer, 0),
        };
        let embeddings = e * n + masks(e);
        let mut parts = vec![
            ("embeddings".to_string(), embeddings),
            (
                match every {
                    Some(k) => format!("{l} layers (every {k}. recomputed)"),
                    None => format!("{l} layers"),
                },
                kept,
            ),
        ];
        // The backward pass's working set inside a layer: the gradients of the feed-forward
        // activations and of the residual stream.
        parts.push(("backward working set".into(), (2 * inter + 2 * e) * w));
        let (name, bytes) = match head {
            Head::MaskedLm { predictions } => {
                let m = (predictions * r.batch as f64).ceil() as u64;
                // The picked positions through the transform (4 tensors of m x h), the
                // log-softmax over the vocabulary, and in the backward pass two more m x v
                // gradients and the decoder's weight gradient (v x h, held until the tied
                // word embeddings take it).
                (
                    format!("masked-LM head ({m} positions x {v})"),
                    4 * m * h * w + m * v * fp32 + 2 * m * v * fp32 + v * h * fp32,
                )
            }
            Head::Classifier(labels) => (
                "classification head".into(),
                r.batch * (3 * h + 2 * labels.max(1) as u64) * fp32,
            ),
        };
        parts.push(if recompute > bytes {
            (
                format!("a recomputed layer (more than the {name})"),
                recompute,
            )
        } else if recompute > 0 {
            (format!("{name}, or a recomputed layer"), bytes)
        } else {
            (name, bytes)
        });
        parts
    }
}

/// The memory plan's view of a BERT job: its tensors and one micro-batch's activations on the
/// job's device, with its precision, dropout and checkpointing.
pub fn plan_footprint(
    config: &BertConfig,
    head: Head,
    seq: u64,
    h: &trainbook_api::Hyper,
    layout: &trainbook_engine::Layout,
) -> trainbook_api::Footprint {
    use trainbook_api::DeviceKind;
    use trainbook_api::Precision;
    let element = if h.precision == Precision::Bf16 { 2 } else { 4 };
    let dropout = h.dropout > 0.0;
    let run = RunShape {
        batch: layout.batch_per_device as u64,
        seq,
        element,
        norm: if layout.device == DeviceKind::Hpu {
            element
        } else {
            4
        },
        // CPU dropout keeps its scaled noise in the activation's dtype; CUDA's and Gaudi's
        // fused dropout a byte mask.
        mask: if layout.device == DeviceKind::Cpu {
            element
        } else {
            1
        },
        dropout,
        // Gaudi runs the written-out attention (see `math_attention`); CUDA's fused kernels
        // take dropout, CPU's only without it.
        fused_attention: match layout.device {
            DeviceKind::Hpu => false,
            DeviceKind::Cuda => true,
            DeviceKind::Cpu => !dropout,
        },
        checkpoint_every: h
            .activation_checkpointing
            .then_some(h.checkpoint_layers_every.max(1)),
    };
    let f = config.footprint(head, &run);
    trainbook_api::Footprint {
        model: format!(
            "BERT, {} layers, hidden {}, {} heads, vocabulary {}, {seq} tokens",
            config.num_hidden_layers,
            config.hidden_size,
            config.num_attention_heads,
            config.vocab_size
        ),
        trainable: f.tensors.iter().map(|t| t.1).collect(),
        cast_by_autocast: f.cast_by_autocast,
        frozen_bytes: 0,
        activations: f.activations,
    }
}

#[cfg(test)]
mod footprint_tests {
    use super::*;

    fn bert_1_5b() -> BertConfig {
        BertConfig {
            hidden_size: 1600,
            num_hidden_layers: 48,
            num_attention_heads: 25,
            intermediate_size: 6400,
            ..BertConfig::tiny(30522, 512)
        }
    }

    #[test]
    fn bert_1_5b_has_the_parameters_of_its_name() {
        let f = bert_1_5b().footprint(
            Head::MaskedLm { predictions: 20.0 },
            &RunShape {
                batch: 32,
                seq: 128,
                element: 2,
                norm: 2,
                mask: 1,
                dropout: true,
                fused_attention: false,
                checkpoint_every: None,
            },
        );
        let total: u64 = f.tensors.iter().map(|t| t.1).sum();
        // Embeddings 49,660,800; 48 layers of 30,740,800; the MLM head 2,595,322.
        assert_eq!(total, 49_660_800 + 48 * 30_740_800 + 2_595_322);
        assert_eq!(f.tensors.len(), 5 + 48 * 16 + 5);
    }

    #[test]
    fn checkpointing_keeps_less_and_every_kth_layer_keeps_more() {
        let run = |every| RunShape {
            batch: 8,
            seq: 128,
            element: 4,
            norm: 4,
            mask: 4,
            dropout: true,
            fused_attention: false,
            checkpoint_every: every,
        };
        let c = BertConfig {
            num_hidden_layers: 12,
            ..BertConfig::tiny(1000, 128)
        };
        let total = |every| -> u64 {
            c.footprint(Head::MaskedLm { predictions: 19.2 }, &run(every))
                .activations
                .iter()
                .map(|p| p.1)
                .sum()
        };
        let (plain, all, half) = (total(None), total(Some(1)), total(Some(2)));
        assert!(all < half && half <= plain, "{all} {half} {plain}");
    }

    /// The head's backward pass runs (and frees its tensors) before the first checkpointed
    /// layer is recomputed: the plan counts the larger of the two, not their sum.
    #[test]
    fn a_recomputed_layer_takes_the_heads_place_at_the_peak() {
        let run = |every| RunShape {
            batch: 256,
            seq: 128,
            element: 2,
            norm: 4,
            mask: 1,
            dropout: true,
            fused_attention: true,
            checkpoint_every: every,
        };
        let c = BertConfig {
            hidden_size: 768,
            num_hidden_layers: 12,
            num_attention_heads: 12,
            intermediate_size: 3072,
            ..BertConfig::tiny(30522, 512)
        };
        let parts = |every| {
            c.footprint(Head::MaskedLm { predictions: 20.0 }, &run(every))
                .activations
        };
        let (plain, all) = (parts(None), parts(Some(1)));
        let head = plain.last().unwrap().1;
        let last = all.last().unwrap();
        assert_eq!(
            last.1, head,
            "{last:?}: at BERT-base, batch 256, the head is the larger"
        );
        assert!(last.0.ends_with("or a recomputed layer"), "{}", last.0);
        // Only the layers' own row differs from the plain plan's.
        assert_eq!(plain[0], all[0]);
        assert_eq!(plain[2], all[2]);
    }
}
