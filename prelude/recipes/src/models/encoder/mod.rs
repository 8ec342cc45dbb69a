//! Encoders (BERT, RoBERTa, XLM-RoBERTa, DistilBERT, ALBERT, ELECTRA): one implementation,
//! read from any of these families' `config.json` and checkpoints, with the task heads
//! Transformers gives them. What differs by family is a [`Family`] value in the family's own
//! file (`models/bert.rs`, `models/roberta.rs`, ...).

mod config;
mod heads;
mod plan;
mod stack;

use std::collections::HashMap;
use std::path::Path;

use anyhow::{Context, Result};
use tch::{nn, Tensor};
use trainbook_engine::checkpoint;

pub use crate::models::family::Family;
pub use crate::models::LoadReport;
pub use config::EncoderConfig;
pub use heads::{
    masked_positions, BaseModel, MaskedLm, QuestionAnsweringModel, SequenceClassifier,
    TokenClassifier, IGNORE_INDEX,
};
pub use plan::{plan_footprint, EncoderFootprint, Head, RunShape};

/// Every family trainbook reads.
const FAMILIES: [&Family; 6] = [
    &crate::models::bert::BERT,
    &crate::models::roberta::ROBERTA,
    &crate::models::roberta::XLM_ROBERTA,
    &crate::models::distilbert::DISTILBERT,
    &crate::models::albert::ALBERT,
    &crate::models::electra::ELECTRA,
];

impl Family {
    /// The family of a `model_type`.
    pub fn of(model_type: &str) -> Option<&'static Family> {
        FAMILIES.into_iter().find(|f| f.model_type == model_type)
    }

    /// The `model_type`s trainbook reads as encoders.
    pub fn supported() -> Vec<&'static str> {
        FAMILIES.iter().map(|f| f.model_type).collect()
    }
}

/// Tensors checkpoints carry that are not parameters here: buffers recomputed at run time.
const BUFFERS: &[&str] = &["embeddings.position_ids", "embeddings.token_type_ids"];

/// Copies the tensors of a `model.safetensors` into `vs`, matching Hugging Face names with or
/// without the family's prefix (base-model checkpoints such as all-MiniLM-L6-v2 have none).
pub fn load_safetensors(vs: &nn::VarStore, path: &Path, c: &EncoderConfig) -> Result<LoadReport> {
    let tensors =
        Tensor::read_safetensors(path).with_context(|| format!("reading {}", path.display()))?;
    load_tensors(vs, tensors, &path.display().to_string(), c)
}

/// Loads a model directory's weights: `model.safetensors`, else PyTorch's `pytorch_model.bin`
/// (read through libtorch's pickle loader), else a file given directly.
pub fn load_weights(vs: &nn::VarStore, path: &Path, c: &EncoderConfig) -> Result<LoadReport> {
    // A sharded set (an index beside the files: a ZeRO-3 checkpoint, a large model).
    let index = path.join(checkpoint::index_name(checkpoint::MODEL_STEM));
    if path.is_dir() && !path.join(checkpoint::MODEL).exists() && index.exists() {
        let files = checkpoint::TensorFiles::open(path, checkpoint::MODEL_STEM)?
            .context("the index was just seen")?;
        return load_tensors(vs, files.read_all()?, &path.display().to_string(), c);
    }
    let file = if path.is_dir() {
        ["model.safetensors", "pytorch_model.bin"]
            .iter()
            .map(|f| path.join(f))
            .find(|f| f.exists())
            .with_context(|| {
                format!(
                    "{} has neither model.safetensors nor pytorch_model.bin",
                    path.display()
                )
            })?
    } else {
        path.to_path_buf()
    };
    if file.extension().is_some_and(|e| e == "safetensors") {
        return load_safetensors(vs, &file, c);
    }
    let tensors = Tensor::loadz_multi(&file).with_context(|| {
        format!(
            "reading {} as a PyTorch state dict failed; convert it to model.safetensors (e.g. with Transformers' save_pretrained(safe_serialization=True))",
            file.display()
        )
    })?;
    load_tensors(vs, tensors, &file.display().to_string(), c)
}

pub fn load_tensors(
    vs: &nn::VarStore,
    tensors: Vec<(String, Tensor)>,
    origin: &str,
    c: &EncoderConfig,
) -> Result<LoadReport> {
    let family = c.family();
    // Old BERT checkpoints (TensorFlow-era conversions) call the LayerNorm parameters
    // gamma/beta; Transformers renames them on load, and so do we.
    let by_name: HashMap<String, Tensor> = tensors
        .into_iter()
        .map(|(k, t)| {
            let k = match (k.strip_suffix(".gamma"), k.strip_suffix(".beta")) {
                (Some(base), _) if base.ends_with("LayerNorm") => format!("{base}.weight"),
                (_, Some(base)) if base.ends_with("LayerNorm") => format!("{base}.bias"),
                _ => k,
            };
            (k, t)
        })
        .collect();
    // The masked-LM decoder is tied to the word embeddings (and its bias to the head's).
    let ignored: Vec<&str> = BUFFERS
        .iter()
        .chain(family.masked_lm.decoder)
        .copied()
        .collect();
    let prefix = format!("{}.", family.prefix);
    super::load_into(
        vs,
        by_name,
        origin,
        &super::LoadRules {
            optional_prefix: Some(&prefix),
            ignored: &ignored,
            // A task head for another number of labels is trained afresh (reported), as
            // fine-tuning a tagger or a classifier on a new label set needs.
            replaceable_head: &["classifier."],
            mismatch_hint: "the checkpoint was made for a different config.json",
        },
    )
}
