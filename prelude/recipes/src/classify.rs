//! Inference with a trained checkpoint, in the calling process (the notebook kernel or a
//! script): `TextClassifier::load(dir)?.predict(&["the food was great"])`,
//! `ImageClassifier::load(dir)?.predict(&["ant.jpg"])`.
//!
//! Generic public methods only convert their arguments and call a private non-generic one: a
//! generic body is compiled into its caller, and a notebook cell, linked against the prelude
//! library, can reach only the library's exported symbols, not private helpers.

use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use tch::{nn, Device, Kind};

use crate::models::bert::{load_weights, BertClassifier};
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
        Self::load_dir(dir.as_ref(), device)
    }

    fn load_dir(dir: &Path, device: Device) -> Result<Self> {
        let (config, labels) = crate::checkpoint::read_text_model(dir)?;
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
            out.extend(rows.into_iter().map(|p| to_prediction(&self.labels, p)));
        }
        Ok(out)
    }

    /// Convenience for one text.
    pub fn predict_one(&self, text: &str) -> Result<Prediction> {
        Ok(self.predict(&[text])?.remove(0))
    }
}

/// An image classifier loaded from a trainbook ResNet checkpoint (`model.safetensors` +
/// `config.json` with the architecture, input size and class names).
pub struct ImageClassifier {
    _vs: nn::VarStore,
    model: crate::models::resnet::Model,
    classes: Vec<String>,
    size: u32,
    normalize: crate::vision::transforms::Normalize,
    device: Device,
}

impl ImageClassifier {
    pub fn load(dir: impl AsRef<Path>) -> Result<Self> {
        Self::load_dir(dir.as_ref())
    }

    fn load_dir(dir: &Path) -> Result<Self> {
        let config = crate::checkpoint::ImageModelConfig::read(dir)?;
        let vs = nn::VarStore::new(Device::Cpu);
        let model = crate::models::resnet::build(
            &vs.root(),
            config.architecture,
            config.classes.len() as i64,
        );
        let report = crate::models::resnet::load_weights(&vs, dir)?;
        if !report.missing.is_empty() {
            bail!(
                "{} lacks weights for {}",
                dir.display(),
                report.missing.join(", ")
            );
        }
        Ok(Self {
            _vs: vs,
            model,
            classes: config.classes,
            size: config.image_size,
            normalize: config.normalize,
            device: Device::Cpu,
        })
    }

    pub fn classes(&self) -> &[String] {
        &self.classes
    }

    /// Classifies image files (any format the `image` crate reads), with the evaluation
    /// transform the model was validated with.
    pub fn predict<P: AsRef<Path>>(&self, paths: &[P]) -> Result<Vec<Prediction>> {
        let paths: Vec<&Path> = paths.iter().map(|p| p.as_ref()).collect();
        self.predict_paths(&paths)
    }

    fn predict_paths(&self, paths: &[&Path]) -> Result<Vec<Prediction>> {
        use crate::vision::transforms::eval_transform;
        let mut images = Vec::with_capacity(paths.len());
        for &p in paths {
            let img = image::open(p)
                .with_context(|| format!("cannot read image {}", p.display()))?
                .to_rgb8();
            images.push(eval_transform(&img, self.size, &self.normalize)?);
        }
        if images.is_empty() {
            return Ok(Vec::new());
        }
        let probs = tch::no_grad(|| {
            self.model
                .forward_t(&tch::Tensor::stack(&images, 0).to(self.device), false)
                .to_kind(Kind::Double)
                .softmax(-1, Kind::Double)
                .to(Device::Cpu)
        });
        let rows: Vec<Vec<f64>> = Vec::<Vec<f64>>::try_from(&probs)?;
        Ok(rows
            .into_iter()
            .map(|p| to_prediction(&self.classes, p))
            .collect())
    }
}

fn to_prediction(labels: &[String], p: Vec<f64>) -> Prediction {
    let (best, score) = p
        .iter()
        .copied()
        .enumerate()
        .fold((0, f64::MIN), |a, (i, v)| if v > a.1 { (i, v) } else { a });
    Prediction {
        label: labels[best].clone(),
        label_id: best,
        score,
        probabilities: labels.iter().cloned().zip(p).collect(),
    }
}
