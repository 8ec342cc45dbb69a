//! The configuration every encoder family is read into: BERT's field names (`hidden_size`,
//! `num_hidden_layers`, ...), whatever names the family's own `config.json` uses. A family that
//! names them otherwise (DistilBERT's `dim`, `n_layers`) renames on the way in and back out, so
//! an exported directory is what Transformers expects of that family.

use std::collections::BTreeMap;
use std::path::Path;

use anyhow::{bail, Context, Result};
use serde::{Deserialize, Serialize};

use crate::models::family::Family;

#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct EncoderConfig {
    /// The family (`bert`, `roberta`, `xlm-roberta`, `distilbert`, `albert`, `electra`).
    #[serde(default = "default_model_type")]
    pub model_type: String,
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
    /// Width of the token embeddings when it differs from `hidden_size` (ALBERT, ELECTRA): a
    /// projection maps them to the hidden width.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub embedding_size: Option<i64>,
    /// The padding token: RoBERTa's positions count from `pad_token_id + 1`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pad_token_id: Option<i64>,
    /// ALBERT: how many distinct layers the stack cycles through, and the layers in each.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub num_hidden_groups: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub inner_group_num: Option<i64>,
    /// Label names by id, when the checkpoint has a classification head.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub id2label: Option<BTreeMap<String, String>>,
    /// Every other field of the file, written back unchanged on export (token ids, the
    /// family's own options), so Transformers reads the model as it was.
    #[serde(flatten)]
    pub extra: serde_json::Map<String, serde_json::Value>,
}

fn default_model_type() -> String {
    "bert".into()
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

/// Fields a config may carry that are derived from the ones above: never written back stale.
const DERIVED: &[&str] = &["num_labels", "label2id", "architectures", "_name_or_path"];

impl EncoderConfig {
    /// A 2-layer, hidden-64 BERT: seconds to train on a CPU, for tests and CI.
    pub fn tiny(vocab_size: i64, max_positions: i64) -> Self {
        Self {
            model_type: default_model_type(),
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
            embedding_size: None,
            pad_token_id: None,
            num_hidden_groups: None,
            inner_group_num: None,
            id2label: None,
            extra: Default::default(),
        }
    }

    /// The same family's shape at the tiny size (a `random_init` job on a real model's
    /// directory keeps the family, its vocabulary and its token ids).
    pub fn tiny_of(&self, max_positions: i64) -> Self {
        let family = self.family();
        let offset = if family.position_offset {
            self.pad_token_id.unwrap_or(1) + 1
        } else {
            0
        };
        Self {
            model_type: self.model_type.clone(),
            hidden_act: self.hidden_act.clone(),
            type_vocab_size: self.type_vocab_size,
            embedding_size: self.embedding_size.map(|_| 32),
            pad_token_id: self.pad_token_id,
            num_hidden_groups: self.num_hidden_groups.map(|_| 1),
            inner_group_num: self.inner_group_num.map(|_| 1),
            extra: self.extra.clone(),
            ..Self::tiny(self.vocab_size, max_positions + offset)
        }
    }

    /// Reads a Hugging Face `config.json` of any supported encoder family.
    pub fn from_file(path: &Path) -> Result<Self> {
        let text =
            std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
        let json: serde_json::Value = serde_json::from_str(&text)
            .with_context(|| format!("{} is not JSON", path.display()))?;
        Self::from_json(json).with_context(|| format!("reading {}", path.display()))
    }

    /// Reads a config's JSON (see [`EncoderConfig::from_file`]).
    pub fn from_json(json: serde_json::Value) -> Result<Self> {
        let serde_json::Value::Object(mut map) = json else {
            bail!("a config.json is a JSON object");
        };
        // A checkpoint is read as what it says it is: a Llama's config would otherwise parse
        // (its field names overlap BERT's) and train a BERT initialised at random.
        let kind = map
            .get("model_type")
            .and_then(|t| t.as_str())
            .unwrap_or("bert")
            .to_string();
        let family = match Family::of(&kind) {
            Some(f) => f,
            None if crate::models::causal_lm::SUPPORTED.contains(&kind.as_str()) => bail!(
                "this is a {kind} model, a causal language model: fine-tune it with `trainbook train causal-lm --model DIR` (LmTrainer in a notebook)"
            ),
            None => bail!(
                "model_type '{kind}' is not an encoder trainbook reads: the encoder recipes read {}",
                Family::supported().join(", ")
            ),
        };
        for (ours, theirs) in family.config_names {
            if let Some(v) = map.remove(*theirs) {
                map.insert(ours.to_string(), v);
            }
        }
        if !map.contains_key("hidden_act") {
            map.insert("hidden_act".into(), family.default_act.into());
        }
        if family.model_type == "distilbert"
            && map.get("sinusoidal_pos_embds") == Some(&true.into())
        {
            // The table is in the checkpoint either way; only its initialisation and its
            // being frozen differ, and trainbook trains it like the other weights.
            map.insert("sinusoidal_pos_embds".into(), false.into());
        }
        map.insert("model_type".into(), family.model_type.into());
        for d in DERIVED {
            map.remove(*d);
        }
        serde_json::from_value(serde_json::Value::Object(map)).context(
            "not an encoder config.json (needs vocab_size, hidden_size, num_hidden_layers, num_attention_heads, intermediate_size, max_position_embeddings)",
        )
    }

    /// The JSON Transformers reads back: the family's own field names, `architectures` naming
    /// `class`, and the labels (`id2label`, `label2id`) when there are any.
    pub fn to_json(&self, class: &str) -> Result<serde_json::Value> {
        let family = self.family();
        let mut json = serde_json::to_value(self)?;
        let map = json
            .as_object_mut()
            .context("a config serialises to a map")?;
        for (ours, theirs) in family.config_names {
            if let Some(v) = map.remove(*ours) {
                map.insert(theirs.to_string(), v);
            }
        }
        map.insert("architectures".into(), serde_json::json!([class]));
        if let Some(labels) = &self.id2label {
            map.insert("num_labels".into(), labels.len().into());
            map.insert(
                "label2id".into(),
                labels
                    .iter()
                    .map(|(i, n)| (n.clone(), serde_json::json!(i.parse::<i64>().unwrap_or(0))))
                    .collect(),
            );
        }
        Ok(json)
    }

    /// The family this configuration is of.
    pub fn family(&self) -> &'static Family {
        Family::of(&self.model_type).unwrap_or(&crate::models::bert::BERT)
    }

    /// Number of labels named in `id2label`, if any.
    pub fn num_labels(&self) -> Option<i64> {
        self.id2label.as_ref().map(|m| m.len() as i64)
    }

    /// Label names in id order, from `id2label`.
    pub fn label_names(&self) -> Result<Vec<String>> {
        let id2label = self.id2label.clone().unwrap_or_default();
        let mut labels = vec![String::new(); id2label.len()];
        for (id, name) in id2label {
            let i: usize = id
                .parse()
                .ok()
                .filter(|i| *i < labels.len())
                .with_context(|| format!("config.json: id2label key '{id}' is not a label id"))?;
            labels[i] = name;
        }
        Ok(labels)
    }

    /// Sets `id2label` from label names in id order.
    pub fn with_labels(mut self, names: &[String]) -> Self {
        self.id2label = Some(
            names
                .iter()
                .enumerate()
                .map(|(i, n)| (i.to_string(), n.clone()))
                .collect(),
        );
        self
    }

    /// Every dropout of the model at `p` (the job's `dropout`): the encoder's and the heads'.
    pub fn with_dropout(mut self, p: f64) -> Self {
        self.hidden_dropout_prob = p;
        self.attention_probs_dropout_prob = p;
        self.classifier_dropout = self.classifier_dropout.map(|_| p);
        if self.extra.contains_key("qa_dropout") {
            self.extra.insert("qa_dropout".into(), p.into());
        }
        self
    }

    /// Width of the token embeddings.
    pub fn embedding_width(&self) -> i64 {
        self.embedding_size.unwrap_or(self.hidden_size)
    }

    /// Dropout before a classification head.
    pub fn head_dropout(&self) -> f64 {
        self.classifier_dropout.unwrap_or(self.hidden_dropout_prob)
    }

    /// The longest input the position table allows (RoBERTa's first rows are taken by the
    /// padding offset).
    pub fn max_tokens(&self) -> i64 {
        if self.family().position_offset {
            self.max_position_embeddings - self.pad_token_id.unwrap_or(1) - 1
        } else {
            self.max_position_embeddings
        }
    }
}
