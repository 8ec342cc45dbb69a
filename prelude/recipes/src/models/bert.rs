//! BERT: `BertModel` and its task models, parameter names identical to Transformers'
//! (`bert.embeddings.word_embeddings.weight`, `bert.encoder.layer.0.attention.self.query.weight`,
//! ..., `classifier.weight`, `cls.predictions.transform.dense.weight`), so checkpoints go both
//! ways. The model itself is [`super::encoder`]'s.

use super::family::{Classes, Family, Layers, MaskedLmNames, SequenceHead, BERT_LAYER};

pub const BERT: Family = Family {
    model_type: "bert",
    name: "BERT",
    prefix: "bert",
    layers: Layers::Each("encoder.layer"),
    layer: BERT_LAYER,
    token_types: true,
    position_offset: false,
    projection: None,
    pooler: Some("pooler.dense"),
    sequence_head: SequenceHead::Pooled,
    masked_lm: MaskedLmNames {
        dense: "cls.predictions.transform.dense",
        norm: "cls.predictions.transform.LayerNorm",
        bias: "cls.predictions.bias",
        activation: None,
        decoder: &[
            "cls.predictions.decoder.weight",
            "cls.predictions.decoder.bias",
        ],
    },
    classes: Classes {
        base: "BertModel",
        sequence: "BertForSequenceClassification",
        token: "BertForTokenClassification",
        question_answering: "BertForQuestionAnswering",
        masked_lm: "BertForMaskedLM",
    },
    config_names: &[],
    default_act: "gelu",
};
