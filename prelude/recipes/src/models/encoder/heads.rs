//! The task models: the family's encoder under its prefix and the head a task reads, with the
//! parameter names of Transformers' `…ForSequenceClassification`, `…ForTokenClassification`,
//! `…ForQuestionAnswering` and `…ForMaskedLM` of that family.

use tch::nn::{self, Module};
use tch::Tensor;

use super::config::EncoderConfig;
use super::stack::{activation, layer_norm, linear, path, Encoder};
use crate::models::family::SequenceHead;

/// The base model alone (`BertModel`, `RobertaModel`, ...): its last hidden states.
pub struct BaseModel {
    encoder: Encoder,
}

impl BaseModel {
    /// Builds under `root` with the family's prefix (base-model checkpoints, which have none,
    /// load all the same).
    pub fn new(root: &nn::Path, c: &EncoderConfig) -> Self {
        Self {
            encoder: Encoder::new(&(root / c.family().prefix), c),
        }
    }

    pub fn forward(
        &self,
        input_ids: &Tensor,
        attention_mask: Option<&Tensor>,
        token_types: Option<&Tensor>,
        train: bool,
    ) -> Tensor {
        self.encoder
            .forward(input_ids, attention_mask, token_types, train)
    }
}

enum SequenceLayers {
    Pooled {
        pooler: nn::Linear,
        classifier: nn::Linear,
    },
    Dense {
        dense: nn::Linear,
        out: nn::Linear,
        activation: &'static str,
    },
    PreClassifier {
        pre: nn::Linear,
        classifier: nn::Linear,
    },
}

/// `…ForSequenceClassification`: logits (batch, labels) from the first token.
pub struct SequenceClassifier {
    encoder: Encoder,
    head: SequenceLayers,
    dropout: f64,
    pub num_labels: i64,
}

impl SequenceClassifier {
    pub fn new(root: &nn::Path, c: &EncoderConfig, num_labels: i64) -> Self {
        let family = c.family();
        let base = root / family.prefix;
        let h = c.hidden_size;
        let head = match family.sequence_head {
            SequenceHead::Pooled => SequenceLayers::Pooled {
                pooler: linear(
                    path(&base, family.pooler.unwrap_or("pooler.dense")),
                    h,
                    h,
                    c,
                ),
                classifier: linear(root / "classifier", h, num_labels, c),
            },
            SequenceHead::Dense { activation } => SequenceLayers::Dense {
                dense: linear(root / "classifier" / "dense", h, h, c),
                out: linear(root / "classifier" / "out_proj", h, num_labels, c),
                activation,
            },
            SequenceHead::PreClassifier => SequenceLayers::PreClassifier {
                pre: linear(root / "pre_classifier", h, h, c),
                classifier: linear(root / "classifier", h, num_labels, c),
            },
        };
        Self {
            encoder: Encoder::new(&base, c),
            head,
            dropout: c.head_dropout(),
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
        let first = x.select(1, 0);
        let p = self.dropout;
        match &self.head {
            SequenceLayers::Pooled { pooler, classifier } => {
                classifier.forward(&pooler.forward(&first).tanh().dropout(p, train))
            }
            SequenceLayers::Dense {
                dense,
                out,
                activation: act,
            } => {
                let x = dense.forward(&first.dropout(p, train));
                out.forward(&activation(act, &x).dropout(p, train))
            }
            SequenceLayers::PreClassifier { pre, classifier } => {
                classifier.forward(&pre.forward(&first).relu().dropout(p, train))
            }
        }
    }
}

/// `…ForTokenClassification`: logits (batch, seq, labels), one row per token.
pub struct TokenClassifier {
    encoder: Encoder,
    classifier: nn::Linear,
    dropout: f64,
    pub num_labels: i64,
}

impl TokenClassifier {
    pub fn new(root: &nn::Path, c: &EncoderConfig, num_labels: i64) -> Self {
        Self {
            encoder: Encoder::new(&(root / c.family().prefix), c),
            classifier: linear(root / "classifier", c.hidden_size, num_labels, c),
            dropout: c.head_dropout(),
            num_labels,
        }
    }

    pub fn set_activation_checkpointing(&mut self, every: Option<usize>) {
        self.encoder.checkpoint_every = every.filter(|&k| k > 0);
    }

    pub fn forward(
        &self,
        input_ids: &Tensor,
        attention_mask: Option<&Tensor>,
        token_types: Option<&Tensor>,
        train: bool,
    ) -> Tensor {
        let h = self
            .encoder
            .forward(input_ids, attention_mask, token_types, train);
        self.classifier.forward(&h.dropout(self.dropout, train))
    }
}

/// `…ForQuestionAnswering`: start and end logits (batch, seq) of the answer span.
pub struct QuestionAnsweringModel {
    encoder: Encoder,
    qa_outputs: nn::Linear,
    dropout: f64,
}

impl QuestionAnsweringModel {
    pub fn new(root: &nn::Path, c: &EncoderConfig) -> Self {
        // DistilBERT alone applies dropout (qa_dropout) before the span head.
        let dropout = match c.extra.get("qa_dropout").and_then(|v| v.as_f64()) {
            Some(p) if c.family().model_type == "distilbert" => p,
            _ => 0.0,
        };
        Self {
            encoder: Encoder::new(&(root / c.family().prefix), c),
            qa_outputs: linear(root / "qa_outputs", c.hidden_size, 2, c),
            dropout,
        }
    }

    pub fn set_activation_checkpointing(&mut self, every: Option<usize>) {
        self.encoder.checkpoint_every = every.filter(|&k| k > 0);
    }

    /// (start logits, end logits), each (batch, seq).
    pub fn forward(
        &self,
        input_ids: &Tensor,
        attention_mask: Option<&Tensor>,
        token_types: Option<&Tensor>,
        train: bool,
    ) -> (Tensor, Tensor) {
        let h = self
            .encoder
            .forward(input_ids, attention_mask, token_types, train);
        let logits = self.qa_outputs.forward(&h.dropout(self.dropout, train));
        (logits.select(2, 0), logits.select(2, 1))
    }
}

/// Label of a position the masked-LM loss ignores (Transformers' `-100`).
pub const IGNORE_INDEX: i64 = -100;

/// `…ForMaskedLM`: the encoder, then a dense transform to the embedding width, an activation,
/// a LayerNorm, and a decoder whose weight is the word-embedding matrix (tied, as in
/// Transformers: one tensor, trained by both uses) plus its own bias.
pub struct MaskedLm {
    encoder: Encoder,
    transform: nn::Linear,
    transform_norm: nn::LayerNorm,
    bias: Tensor,
    act: String,
    /// BERT's second pre-training objective (`BertForPreTraining`): the pooler and
    /// `cls.seq_relationship`, whether the second segment followed the first.
    next_sentence: Option<(nn::Linear, nn::Linear)>,
}

impl MaskedLm {
    pub fn new(root: &nn::Path, c: &EncoderConfig) -> Self {
        let family = c.family();
        let names = &family.masked_lm;
        let (h, e) = (c.hidden_size, c.embedding_width());
        let (bias_path, bias_name) = names.bias.rsplit_once('.').unwrap_or(("", names.bias));
        let bias_root = if bias_path.is_empty() {
            root.clone()
        } else {
            path(root, bias_path)
        };
        Self {
            encoder: Encoder::new(&(root / family.prefix), c),
            transform: linear(path(root, names.dense), h, e, c),
            transform_norm: layer_norm(path(root, names.norm), e, c),
            bias: bias_root.zeros(bias_name, &[c.vocab_size]),
            act: names.activation.unwrap_or(&c.hidden_act).to_string(),
            next_sentence: None,
        }
    }

    /// `BertForPreTraining`: the masked-LM head and the next-sentence head (names
    /// `bert.pooler.dense`, `cls.seq_relationship`). BERT's objective only: other families
    /// pre-train without it (ALBERT's sentence-order head is another task).
    pub fn with_next_sentence(root: &nn::Path, c: &EncoderConfig) -> anyhow::Result<Self> {
        let family = c.family();
        if family.model_type != "bert" {
            anyhow::bail!(
                "next-sentence prediction is BERT's pre-training objective (BertForPreTraining); {} has no such head: leave next_sentence off",
                family.name
            );
        }
        let h = c.hidden_size;
        let mut m = Self::new(root, c);
        let pooler = linear(root / family.prefix / "pooler" / "dense", h, h, c);
        let classifier = linear(root / "cls" / "seq_relationship", h, 2, c);
        m.next_sentence = Some((pooler, classifier));
        Ok(m)
    }

    /// Whether the model has the next-sentence head.
    pub fn has_next_sentence(&self) -> bool {
        self.next_sentence.is_some()
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
        self.forward_pretraining(input_ids, attention_mask, token_types, positions, train)
            .0
    }

    /// [`MaskedLm::forward_masked`]'s logits and the next-sentence logits (batch, 2) of the
    /// same pass (`None` without the head).
    pub fn forward_pretraining(
        &self,
        input_ids: &Tensor,
        attention_mask: Option<&Tensor>,
        token_types: Option<&Tensor>,
        positions: &Tensor,
        train: bool,
    ) -> (Tensor, Option<Tensor>) {
        let x = self
            .encoder
            .forward(input_ids, attention_mask, token_types, train);
        let h = x.size()[2];
        let picked = x.reshape([-1, h]).index_select(0, positions);
        let next = self.next_sentence.as_ref().map(|(pooler, classifier)| {
            classifier.forward(&pooler.forward(&x.select(1, 0)).tanh())
        });
        (self.predict(&picked), next)
    }
}

/// The flat positions (row-major over batch × seq) whose label is not [`IGNORE_INDEX`], and
/// those labels: what [`MaskedLm::forward_masked`] and its loss take.
pub fn masked_positions(labels: &[i64]) -> (Vec<i64>, Vec<i64>) {
    labels
        .iter()
        .enumerate()
        .filter(|(_, &l)| l != IGNORE_INDEX)
        .map(|(i, &l)| (i as i64, l))
        .unzip()
}
