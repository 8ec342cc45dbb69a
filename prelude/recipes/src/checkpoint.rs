//! The model files the recipes put in a checkpoint, beside the engine's files
//! ([`trainbook_engine::checkpoint`]: layout, trainer state, weights, optimizer state). The
//! recipes' `save` writes them and [`crate::classify`] reads them, through these types only.
//!
//! - text (encoders): a Hugging Face directory: `config.json` ([`EncoderConfig`] in its
//!   family's form, with `id2label`/`label2id`), `model.safetensors`, the tokenizer files;
//! - images (resnet): `config.json` ([`ImageModelConfig`]) and `model.safetensors` with
//!   torchvision's names.

use std::path::Path;

use anyhow::{bail, Context, Result};
use serde::{Deserialize, Serialize};

use crate::models::encoder::EncoderConfig;
use crate::models::resnet::Arch;
use crate::vision::transforms::Normalize;
pub use trainbook_engine::checkpoint::{write_atomic, MODEL, MODEL_STEM, OPTIMIZER, TRAINER_STATE};

/// A model's configuration file, text or image.
pub const MODEL_CONFIG: &str = "config.json";

/// The tokenizer files a text checkpoint carries over from its model.
pub const TOKENIZER_FILES: [&str; 4] = [
    "tokenizer.json",
    "vocab.txt",
    "tokenizer_config.json",
    "special_tokens_map.json",
];

fn imagenet() -> Normalize {
    Normalize::IMAGENET
}

/// An image classifier's `config.json`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ImageModelConfig {
    pub architecture: Arch,
    /// Side of the square input in pixels.
    pub image_size: u32,
    pub num_classes: usize,
    /// Class names in label order (the ImageFolder's sorted class folders).
    pub classes: Vec<String>,
    /// The input normalisation the model was trained with (ImageNet's when absent).
    #[serde(default = "imagenet")]
    pub normalize: Normalize,
}

impl ImageModelConfig {
    pub fn write(&self, dir: &Path) -> Result<()> {
        write_atomic(&dir.join(MODEL_CONFIG), &serde_json::to_vec_pretty(self)?)
    }

    pub fn read(dir: &Path) -> Result<Self> {
        let file = dir.join(MODEL_CONFIG);
        std::fs::read(&file)
            .ok()
            .and_then(|b| serde_json::from_slice(&b).ok())
            .with_context(|| {
                format!(
                    "{} is not an image-classifier checkpoint (it needs {MODEL_CONFIG} with architecture, image_size and classes): pass result.last_checkpoint of a resnet run",
                    dir.display()
                )
            })
    }
}

/// Writes an encoder's `config.json` as Transformers' `class` of its family reads it (the
/// family's field names, `architectures`, the labels in `id2label`/`label2id` when the config
/// has them), and copies the tokenizer files of `tokenizer_dir`.
pub fn write_encoder_model(
    dir: &Path,
    config: &EncoderConfig,
    class: &str,
    tokenizer_dir: &Path,
) -> Result<()> {
    let json = config.to_json(class)?;
    write_atomic(&dir.join(MODEL_CONFIG), &serde_json::to_vec_pretty(&json)?)?;
    copy_tokenizer(tokenizer_dir, dir)
}

/// Writes an encoder checkpoint (any family, any task) as the Hugging Face directory its
/// `AutoModelFor…` loads: config.json, model.safetensors and the tokenizer files, copied into
/// a directory beside `out` and renamed over it, so `out` is only ever replaced by a whole
/// export. Returns what was written.
pub fn export_encoder(checkpoint: &Path, out: &Path) -> Result<String> {
    let config = EncoderConfig::from_file(&checkpoint.join(MODEL_CONFIG))?;
    // One file, or under ZeRO-3 the shards and their index (transformers loads either).
    let weights = trainbook_engine::checkpoint::files_of(checkpoint, MODEL_STEM)?;
    let class = std::fs::read(checkpoint.join(MODEL_CONFIG))
        .ok()
        .and_then(|b| serde_json::from_slice::<serde_json::Value>(&b).ok())
        .and_then(|v| v["architectures"][0].as_str().map(String::from))
        .unwrap_or_else(|| config.family().classes.base.to_string());
    let tokenizer = TOKENIZER_FILES
        .iter()
        .filter(|f| checkpoint.join(f).exists());
    let files: Vec<&str> = std::iter::once(MODEL_CONFIG)
        .chain(weights.iter().map(String::as_str))
        .chain(tokenizer.copied())
        .collect();
    copy_into_place(checkpoint, &files, out)?;
    Ok(format!(
        "{class} in {}: transformers' AutoModel classes load it (from_pretrained(\"{}\"))",
        out.display(),
        out.display()
    ))
}

/// Copies the files `names` of `from` into a directory beside `out` and renames it over
/// `out`, so `out` is only ever replaced by a whole copy; a copy at a time, so what it holds
/// in memory is a copy buffer whatever the files' sizes.
pub fn copy_into_place(from: &Path, names: &[&str], out: &Path) -> Result<()> {
    if out.exists() && std::fs::canonicalize(out).ok() == std::fs::canonicalize(from).ok() {
        bail!(
            "--out {} is the checkpoint itself: name another directory",
            out.display()
        );
    }
    let tmp = out.with_file_name(format!(
        ".{}.partial-{}",
        out.file_name().and_then(|n| n.to_str()).unwrap_or("export"),
        std::process::id()
    ));
    let _ = std::fs::remove_dir_all(&tmp);
    std::fs::create_dir_all(&tmp).with_context(|| format!("creating {}", tmp.display()))?;
    let copied = (|| -> Result<()> {
        for f in names {
            std::fs::copy(from.join(f), tmp.join(f))
                .with_context(|| format!("copying {}", from.join(f).display()))?;
        }
        // Replaced only once the new one is whole.
        if out.exists() {
            std::fs::remove_dir_all(out).with_context(|| format!("replacing {}", out.display()))?;
        }
        std::fs::rename(&tmp, out)
            .with_context(|| format!("moving the export to {}", out.display()))
    })();
    if copied.is_err() {
        let _ = std::fs::remove_dir_all(&tmp);
    }
    copied
}

fn copy_tokenizer(from: &Path, to: &Path) -> Result<()> {
    for f in TOKENIZER_FILES {
        let src = from.join(f);
        if src.exists() {
            std::fs::copy(&src, to.join(f))
                .with_context(|| format!("copying {}", src.display()))?;
        }
    }
    Ok(())
}

/// Reads a text classifier's `config.json`: the model configuration and the label names in
/// label order.
pub fn read_text_model(dir: &Path) -> Result<(EncoderConfig, Vec<String>)> {
    let has_weights = dir.join("pytorch_model.bin").exists()
        || trainbook_engine::checkpoint::has_tensors(dir, MODEL_STEM);
    if !dir.join(MODEL_CONFIG).exists() || !has_weights {
        bail!(
            "{} is not a model checkpoint (it needs {MODEL_CONFIG} and {MODEL}): pass a checkpoint directory such as result.last_checkpoint or trainbook_runs/<run>/checkpoints/epoch-0",
            dir.display()
        );
    }
    let config = EncoderConfig::from_file(&dir.join(MODEL_CONFIG))?;
    if config.id2label.is_none() {
        bail!("{}/{MODEL_CONFIG} has no id2label: it is not a sequence-classification checkpoint (train one with train_bert first)", dir.display());
    }
    let labels = config.label_names()?;
    Ok((config, labels))
}

#[cfg(test)]
mod tests {
    //! Model files written by trainbook before this module existed (tests/fixtures) still read.
    use super::*;

    fn fixture(name: &str) -> std::path::PathBuf {
        Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../../tests/fixtures/checkpoint-v0")
            .join(name)
    }

    #[test]
    fn an_old_image_config_reads_and_round_trips() {
        let dir = tempdir();
        std::fs::copy(fixture("resnet-config.json"), dir.join(MODEL_CONFIG)).unwrap();
        let c = ImageModelConfig::read(&dir).unwrap();
        assert_eq!(c.architecture, Arch::Resnet18);
        assert_eq!((c.image_size, c.num_classes, c.classes.len()), (32, 10, 10));
        assert_eq!(c.normalize, Normalize::IMAGENET);
        c.write(&dir).unwrap();
        assert_eq!(ImageModelConfig::read(&dir).unwrap(), c);
    }

    #[test]
    fn an_image_config_without_normalisation_means_imagenet() {
        let dir = tempdir();
        std::fs::write(
            dir.join(MODEL_CONFIG),
            r#"{"architecture":"resnet50","image_size":224,"num_classes":2,"classes":["ants","bees"]}"#,
        )
        .unwrap();
        assert_eq!(
            ImageModelConfig::read(&dir).unwrap().normalize,
            Normalize::IMAGENET
        );
        std::fs::write(dir.join(MODEL_CONFIG), "{}").unwrap();
        let e = ImageModelConfig::read(&dir).unwrap_err().to_string();
        assert!(e.contains("not an image-classifier checkpoint"), "{e}");
    }

    #[test]
    fn an_old_text_config_reads_its_labels_and_round_trips() {
        let dir = tempdir();
        std::fs::copy(fixture("bert-config.json"), dir.join(MODEL_CONFIG)).unwrap();
        std::fs::write(dir.join(MODEL), b"").unwrap();
        let (config, labels) = read_text_model(&dir).unwrap();
        assert_eq!(labels, ["fresh", "rotten"]);
        let class = config.family().classes.sequence;
        write_encoder_model(&dir, &config, class, &dir).unwrap();
        let (again, labels_again) = read_text_model(&dir).unwrap();
        assert_eq!(labels_again, labels);
        assert_eq!(again.hidden_size, config.hidden_size);
    }

    fn tempdir() -> std::path::PathBuf {
        use std::sync::atomic::{AtomicUsize, Ordering};
        static N: AtomicUsize = AtomicUsize::new(0);
        let d = std::env::temp_dir().join(format!(
            "trainbook-ckpt-test-{}-{}",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        ));
        std::fs::create_dir_all(&d).unwrap();
        d
    }
}
