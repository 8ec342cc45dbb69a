//! RoBERTa and XLM-RoBERTa: BERT's layers under `roberta.`, one token type, positions counted
//! from `pad_token_id + 1` (padding sits at `pad_token_id`), a classification head on the first
//! token (`classifier.dense`, tanh, `classifier.out_proj`) and the `lm_head` masked-LM head.

use super::family::{Classes, Family, Layers, MaskedLmNames, SequenceHead, BERT_LAYER};

const LM_HEAD: MaskedLmNames = MaskedLmNames {
    dense: "lm_head.dense",
    norm: "lm_head.layer_norm",
    bias: "lm_head.bias",
    activation: Some("gelu"),
    decoder: &["lm_head.decoder.weight", "lm_head.decoder.bias"],
};

pub const ROBERTA: Family = Family {
    model_type: "roberta",
    name: "RoBERTa",
    prefix: "roberta",
    layers: Layers::Each("encoder.layer"),
    layer: BERT_LAYER,
    token_types: true,
    position_offset: true,
    projection: None,
    pooler: None,
    sequence_head: SequenceHead::Dense { activation: "tanh" },
    masked_lm: LM_HEAD,
    classes: Classes {
        base: "RobertaModel",
        sequence: "RobertaForSequenceClassification",
        token: "RobertaForTokenClassification",
        question_answering: "RobertaForQuestionAnswering",
        masked_lm: "RobertaForMaskedLM",
    },
    config_names: &[],
    default_act: "gelu",
};

/// XLM-RoBERTa is RoBERTa with a multilingual vocabulary; Transformers keeps the `roberta.`
/// prefix for it.
pub const XLM_ROBERTA: Family = Family {
    model_type: "xlm-roberta",
    name: "XLM-RoBERTa",
    classes: Classes {
        base: "XLMRobertaModel",
        sequence: "XLMRobertaForSequenceClassification",
        token: "XLMRobertaForTokenClassification",
        question_answering: "XLMRobertaForQuestionAnswering",
        masked_lm: "XLMRobertaForMaskedLM",
    },
    ..ROBERTA
};
