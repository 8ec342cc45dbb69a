//! DistilBERT: six BERT layers with their own names (`q_lin`, `sa_layer_norm`, `ffn.lin1`,
//! ...) under `distilbert.transformer.layer`, no token types, no pooler, a sequence head of
//! `pre_classifier` and ReLU, and config fields of its own (`dim`, `n_layers`, ...).

use super::family::{Classes, Family, LayerNames, Layers, MaskedLmNames, SequenceHead};

pub const DISTILBERT: Family = Family {
    model_type: "distilbert",
    name: "DistilBERT",
    prefix: "distilbert",
    layers: Layers::Each("transformer.layer"),
    layer: LayerNames {
        query: "attention.q_lin",
        key: "attention.k_lin",
        value: "attention.v_lin",
        attention_out: "attention.out_lin",
        attention_norm: "sa_layer_norm",
        intermediate: "ffn.lin1",
        output: "ffn.lin2",
        output_norm: "output_layer_norm",
    },
    token_types: false,
    position_offset: false,
    projection: None,
    pooler: None,
    sequence_head: SequenceHead::PreClassifier,
    masked_lm: MaskedLmNames {
        dense: "vocab_transform",
        norm: "vocab_layer_norm",
        bias: "vocab_projector.bias",
        activation: None,
        decoder: &["vocab_projector.weight"],
    },
    classes: Classes {
        base: "DistilBertModel",
        sequence: "DistilBertForSequenceClassification",
        token: "DistilBertForTokenClassification",
        question_answering: "DistilBertForQuestionAnswering",
        masked_lm: "DistilBertForMaskedLM",
    },
    config_names: &[
        ("hidden_size", "dim"),
        ("num_hidden_layers", "n_layers"),
        ("num_attention_heads", "n_heads"),
        ("intermediate_size", "hidden_dim"),
        ("hidden_act", "activation"),
        ("hidden_dropout_prob", "dropout"),
        ("attention_probs_dropout_prob", "attention_dropout"),
        ("classifier_dropout", "seq_classif_dropout"),
    ],
    default_act: "gelu",
};
