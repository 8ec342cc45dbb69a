//! ELECTRA: BERT's layers under `electra.`, embeddings of their own width projected by
//! `embeddings_project`, no pooler, a classification head on the first token with GELU, and
//! the generator's masked-LM head. A discriminator checkpoint is read as the encoder (its
//! replaced-token head is not a parameter here).

use super::family::{
    Classes, EmbeddingProjection, Family, Layers, MaskedLmNames, SequenceHead, BERT_LAYER,
};

pub const ELECTRA: Family = Family {
    model_type: "electra",
    name: "ELECTRA",
    prefix: "electra",
    layers: Layers::Each("encoder.layer"),
    layer: BERT_LAYER,
    token_types: true,
    position_offset: false,
    projection: Some(EmbeddingProjection {
        path: "embeddings_project",
        always: false,
    }),
    pooler: None,
    sequence_head: SequenceHead::Dense { activation: "gelu" },
    masked_lm: MaskedLmNames {
        dense: "generator_predictions.dense",
        norm: "generator_predictions.LayerNorm",
        bias: "generator_lm_head.bias",
        activation: Some("gelu"),
        decoder: &["generator_lm_head.weight"],
    },
    classes: Classes {
        base: "ElectraModel",
        sequence: "ElectraForSequenceClassification",
        token: "ElectraForTokenClassification",
        question_answering: "ElectraForQuestionAnswering",
        masked_lm: "ElectraForMaskedLM",
    },
    config_names: &[],
    default_act: "gelu",
};
