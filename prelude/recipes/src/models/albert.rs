//! ALBERT: factorised embeddings (`embedding_size`, projected to the hidden width by
//! `encoder.embedding_hidden_mapping_in`) and layers shared across the stack
//! (`encoder.albert_layer_groups.{g}.albert_layers.{j}`), with its own layer names; a pooler
//! named `pooler` and the `predictions` masked-LM head.

use super::family::{
    Classes, EmbeddingProjection, Family, LayerNames, Layers, MaskedLmNames, SequenceHead,
};

pub const ALBERT: Family = Family {
    model_type: "albert",
    name: "ALBERT",
    prefix: "albert",
    layers: Layers::Groups,
    layer: LayerNames {
        query: "attention.query",
        key: "attention.key",
        value: "attention.value",
        attention_out: "attention.dense",
        attention_norm: "attention.LayerNorm",
        intermediate: "ffn",
        output: "ffn_output",
        output_norm: "full_layer_layer_norm",
    },
    token_types: true,
    position_offset: false,
    projection: Some(EmbeddingProjection {
        path: "encoder.embedding_hidden_mapping_in",
        always: true,
    }),
    pooler: Some("pooler"),
    sequence_head: SequenceHead::Pooled,
    masked_lm: MaskedLmNames {
        dense: "predictions.dense",
        norm: "predictions.LayerNorm",
        bias: "predictions.bias",
        activation: None,
        decoder: &["predictions.decoder.weight", "predictions.decoder.bias"],
    },
    classes: Classes {
        base: "AlbertModel",
        sequence: "AlbertForSequenceClassification",
        token: "AlbertForTokenClassification",
        question_answering: "AlbertForQuestionAnswering",
        masked_lm: "AlbertForMaskedLM",
    },
    config_names: &[("classifier_dropout", "classifier_dropout_prob")],
    default_act: "gelu_new",
};
