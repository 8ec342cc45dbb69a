//! The models behind `trainbook_api`'s `TextClassifier` and `ImageClassifier`: a trained
//! checkpoint loaded for inference in the calling process (the notebook kernel or a program).

use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use tch::{nn, Device, Kind};

use crate::models::encoder::SequenceClassifier;
use crate::text::tokenizer::{Encoded, Padding, TextTokenizer};
use trainbook_api::{
    plumbing::ports::{ImageModel, TextModel},
    Prediction,
};

/// A BERT sequence classifier loaded from a Hugging Face-style directory (what trainbook's
/// BERT checkpoints are).
pub struct BertTextModel {
    _vs: nn::VarStore,
    model: SequenceClassifier,
    tokenizer: TextTokenizer,
    labels: Vec<String>,
    device: Device,
    dir: PathBuf,
}

impl BertTextModel {
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
        let model = SequenceClassifier::new(&vs.root(), &config, labels.len() as i64);
        crate::encoder_job::load_trained(&vs, dir, &config, "a fine-tuned classifier")?;
        Ok(Self {
            _vs: vs,
            model,
            tokenizer,
            labels,
            device,
            dir: dir.to_path_buf(),
        })
    }
}

impl TextModel for BertTextModel {
    fn labels(&self) -> &[String] {
        &self.labels
    }

    fn checkpoint(&self) -> &Path {
        &self.dir
    }

    fn predict(&self, texts: &[&str]) -> Result<Vec<Prediction>> {
        let mut out = Vec::with_capacity(texts.len());
        for chunk in texts.chunks(32) {
            out.extend(self.classify(self.tokenizer.encode_batch(chunk)?)?);
        }
        Ok(out)
    }

    fn predict_pairs(&self, pairs: &[(&str, &str)]) -> Result<Vec<Prediction>> {
        let mut out = Vec::with_capacity(pairs.len());
        for chunk in pairs.chunks(32) {
            let (a, b): (Vec<&str>, Vec<&str>) = chunk.iter().copied().unzip();
            out.extend(self.classify(self.tokenizer.encode_pairs(&a, &b)?)?);
        }
        Ok(out)
    }
}

impl BertTextModel {
    /// Label probabilities of encoded texts (one batch).
    fn classify(&self, enc: Vec<Encoded>) -> Result<Vec<Prediction>> {
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
        Vec::<Vec<f64>>::try_from(&probs)?
            .into_iter()
            .map(|p| Prediction::from_probabilities(&self.labels, p))
            .collect()
    }
}

/// An image classifier loaded from a trainbook ResNet checkpoint (`model.safetensors` +
/// `config.json` with the architecture, input size and class names).
pub struct ResnetImageModel {
    _vs: nn::VarStore,
    model: crate::models::resnet::Model,
    classes: Vec<String>,
    size: u32,
    normalize: crate::vision::transforms::Normalize,
    device: Device,
}

impl ResnetImageModel {
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
}

impl ImageModel for ResnetImageModel {
    fn classes(&self) -> &[String] {
        &self.classes
    }

    /// Classifies image files (any format the `image` crate reads), with the evaluation
    /// transform the model was validated with.
    fn predict(&self, paths: &[&Path]) -> Result<Vec<Prediction>> {
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
        rows.into_iter()
            .map(|p| Prediction::from_probabilities(&self.classes, p))
            .collect()
    }
}
