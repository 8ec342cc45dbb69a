//! What tells one encoder family from another: parameter names, the head each task uses, how
//! positions and token types enter, and the config fields it names its own way. The maths is
//! the same post-LayerNorm Transformer for all of them (`models::encoder`); each family file
//! (`models/bert.rs`, `roberta.rs`, ...) is one [`Family`] value; `models::encoder` reads them.

/// One encoder family, as Transformers names and wires it.
#[derive(Debug)]
pub struct Family {
    /// `config.json`'s `model_type`.
    pub model_type: &'static str,
    /// What users call it, in messages.
    pub name: &'static str,
    /// The base model's attribute in a task model (`bert`, `roberta`, ...): its parameters'
    /// prefix, which base-model checkpoints lack.
    pub prefix: &'static str,
    /// Where the layers are, under the prefix.
    pub layers: Layers,
    /// One layer's parameter names.
    pub layer: LayerNames,
    /// Whether the model adds token-type (segment) embeddings.
    pub token_types: bool,
    /// RoBERTa's positions: counted from `pad_token_id + 1` over real tokens, padding at
    /// `pad_token_id`.
    pub position_offset: bool,
    /// The embedding-to-hidden projection, for families whose embeddings may be narrower
    /// than the hidden states (ALBERT, ELECTRA).
    pub projection: Option<EmbeddingProjection>,
    /// The pooler (a dense layer and tanh on the first token), under the prefix, when the
    /// sequence classifier reads it.
    pub pooler: Option<&'static str>,
    pub sequence_head: SequenceHead,
    pub masked_lm: MaskedLmNames,
    /// Transformers' class names per task.
    pub classes: Classes,
    /// Config fields the family names otherwise: (BERT's name, the family's name).
    pub config_names: &'static [(&'static str, &'static str)],
    /// `hidden_act` when the config does not say.
    pub default_act: &'static str,
}

/// The embedding-to-hidden projection.
#[derive(Debug)]
pub struct EmbeddingProjection {
    /// Under the prefix.
    pub path: &'static str,
    /// Whether it exists when the widths are equal (ALBERT's always does, ELECTRA's not).
    pub always: bool,
}

/// The layer stack's layout.
#[derive(Debug)]
pub enum Layers {
    /// `{path}.{i}`, one parameter set per layer.
    Each(&'static str),
    /// ALBERT: `encoder.albert_layer_groups.{g}.albert_layers.{j}`, groups shared across the
    /// stack (`num_hidden_groups` of them, `inner_group_num` layers each).
    Groups,
}

#[derive(Debug)]
pub struct LayerNames {
    pub query: &'static str,
    pub key: &'static str,
    pub value: &'static str,
    pub attention_out: &'static str,
    pub attention_norm: &'static str,
    pub intermediate: &'static str,
    pub output: &'static str,
    pub output_norm: &'static str,
}

/// BERT's, RoBERTa's and ELECTRA's layer.
pub const BERT_LAYER: LayerNames = LayerNames {
    query: "attention.self.query",
    key: "attention.self.key",
    value: "attention.self.value",
    attention_out: "attention.output.dense",
    attention_norm: "attention.output.LayerNorm",
    intermediate: "intermediate.dense",
    output: "output.dense",
    output_norm: "output.LayerNorm",
};

/// How a sequence classifier turns hidden states into logits.
#[derive(Debug)]
pub enum SequenceHead {
    /// BERT, ALBERT: the pooler's output, dropout, `classifier`.
    Pooled,
    /// RoBERTa (tanh), ELECTRA (gelu): the first token, dropout, `classifier.dense`, the
    /// activation, dropout, `classifier.out_proj`.
    Dense { activation: &'static str },
    /// DistilBERT: the first token, `pre_classifier`, ReLU, dropout, `classifier`.
    PreClassifier,
}

/// The masked-LM head: a dense transform to the embedding width, an activation, a LayerNorm,
/// and a decoder tied to the word embeddings with a bias of its own.
#[derive(Debug)]
pub struct MaskedLmNames {
    pub dense: &'static str,
    pub norm: &'static str,
    pub bias: &'static str,
    /// The transform's activation (`None`: the config's `hidden_act`).
    pub activation: Option<&'static str>,
    /// The decoder's own tensors in checkpoints: tied, so not parameters here.
    pub decoder: &'static [&'static str],
}

#[derive(Debug)]
pub struct Classes {
    pub base: &'static str,
    pub sequence: &'static str,
    pub token: &'static str,
    pub question_answering: &'static str,
    pub masked_lm: &'static str,
}
