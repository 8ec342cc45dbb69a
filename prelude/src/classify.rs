//! Inference with a trained checkpoint, in the calling process (the notebook kernel or a
//! script): `TextClassifier::load(dir)?.predict(&["the food was great"])`.

use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use tch::{nn, Device, Kind};

use crate::models::bert::{load_weights, BertClassifier, BertConfig};
use crate::text::tokenizer::{Encoded, Padding, TextTokenizer};

/// One prediction: the most likely label and every label's probability.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct Prediction {
    pub label: String,
    pub label_id: usize,
    /// Probability of `label`.
    pub score: f64,
    /// `(label, probability)` for every label, in id order.
    pub probabilities: Vec<(String, f64)>,
}

impl std::fmt::Display for Prediction {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} ({:.3})", self.label, self.score)
    }
}

/// A BERT sequence classifier loaded from a Hugging Face-style directory (what trainbook's
/// BERT checkpoints are).
pub struct TextClassifier {
    _vs: nn::VarStore,
    model: BertClassifier,
    tokenizer: TextTokenizer,
    labels: Vec<String>,
    device: Device,
    dir: PathBuf,
}

impl TextClassifier {
    /// Loads `dir` (e.g. `result.last_checkpoint`) on the CPU.
    pub fn load(dir: impl AsRef<Path>) -> Result<Self> {
        Self::load_on(dir, Device::Cpu)
    }

    pub fn load_on(dir: impl AsRef<Path>, device: Device) -> Result<Self> {
        let dir = dir.as_ref();
        let has_weights = ["model.safetensors", "pytorch_model.bin"]
            .iter()
            .any(|f| dir.join(f).exists());
        if !dir.join("config.json").exists() || !has_weights {
            bail!(
                "{} is not a model checkpoint (it needs config.json and model.safetensors): pass a checkpoint directory such as result.last_checkpoint or trainbook_runs/<run>/checkpoints/epoch-0",
                dir.display()
            );
        }
        let config = BertConfig::from_file(&dir.join("config.json"))?;
        let Some(id2label) = config.id2label.clone() else {
            bail!("{}/config.json has no id2label: it is not a sequence-classification checkpoint (train one with train_bert first)", dir.display());
        };
        let mut labels = vec![String::new(); id2label.len()];
        for (id, name) in id2label {
            let i: usize = id
                .parse()
                .ok()
                .filter(|i| *i < labels.len())
                .with_context(|| format!("config.json: id2label key '{id}' is not a label id"))?;
            labels[i] = name;
        }
        let tokenizer =
            TextTokenizer::from_model_dir(dir, config.max_position_embeddings as usize)?;
        let vs = nn::VarStore::new(device);
        let model = BertClassifier::new(&vs.root(), &config, labels.len() as i64);
        let report = load_weights(&vs, dir)?;
        if !report.missing.is_empty() {
            bail!(
                "{} lacks trained weights for {}: it is not a fine-tuned classifier",
                dir.display(),
                report.missing.join(", ")
            );
        }
        Ok(Self {
            _vs: vs,
            model,
            tokenizer,
            labels,
            device,
            dir: dir.to_path_buf(),
        })
    }

    /// Label names in id order.
    pub fn labels(&self) -> &[String] {
        &self.labels
    }

    pub fn checkpoint(&self) -> &Path {
        &self.dir
    }

    pub fn predict(&self, texts: &[&str]) -> Result<Vec<Prediction>> {
        let mut out = Vec::with_capacity(texts.len());
        for chunk in texts.chunks(32) {
            let enc = self.tokenizer.encode_batch(chunk)?;
            let refs: Vec<&Encoded> = enc.iter().collect();
            let b = self.tokenizer.pad(&refs, Padding::Dynamic);
            let probs = tch::no_grad(|| {
                self.model
                    .forward(
                        &b.input_ids.to(self.device),
                        Some(&b.attention_mask.to(self.device)),
                        Some(&b.token_type_ids.to(self.device)),
                        false,
                    )
                    .to_kind(Kind::Double)
                    .softmax(-1, Kind::Double)
                    .to(Device::Cpu)
            });
            let rows: Vec<Vec<f64>> = Vec::<Vec<f64>>::try_from(&probs)?;
            for p in rows {
                let (best, score) = p
                    .iter()
                    .copied()
                    .enumerate()
                    .fold((0, f64::MIN), |a, (i, v)| if v > a.1 { (i, v) } else { a });
                out.push(Prediction {
                    label: self.labels[best].clone(),
                    label_id: best,
                    score,
                    probabilities: self.labels.iter().cloned().zip(p).collect(),
                });
            }
        }
        Ok(out)
    }

    /// Convenience for one text.
    pub fn predict_one(&self, text: &str) -> Result<Prediction> {
        Ok(self.predict(&[text])?.remove(0))
    }
}

