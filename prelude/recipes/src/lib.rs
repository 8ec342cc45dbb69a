//! trainbook's recipes: what a worker trains (model, data, defaults), and the building blocks
//! they share (BERT, causal LMs and ResNet models, text tables and tokenizers, image folders and
//! transforms, offline assets, classifiers that load the checkpoints).
//!
//! The engine knows recipes only through [`REGISTRY`], which `trainbook-worker` and the
//! `trainbook` facade hand to it: one row per recipe with its name, description, presets and
//! build function.

pub mod assets;
pub mod bert;
pub mod causal_lm;
pub mod checkpoint;
pub mod classify;
mod encoder_job;
pub mod mlm;
pub mod models;
pub mod question_answering;
pub mod resnet;
pub mod synthetic;
pub mod text;
pub mod token_classification;
pub mod vision;

use anyhow::{Context, Result};
use trainbook_api::Hyper;
use trainbook_engine::{RecipeEntry, Registry};

/// Every recipe trainbook ships.
pub static REGISTRY: Registry = Registry::new(&[
    RecipeEntry {
        name: "bert",
        description: "sequence classification with BERT, RoBERTa, XLM-RoBERTa, DistilBERT, ALBERT or ELECTRA (offline default: all-MiniLM-L6-v2 on Rotten Tomatoes snippets)",
        presets: bert::PRESETS,
        preset: bert::resolve,
        build: |h, d, log| Ok(Box::new(bert::BertRecipe::build(h, d, log)?)),
        footprint: Some(bert::footprint),
    },
    RecipeEntry {
        name: "bert-mlm",
        description: "BERT pre-training by masked-language modelling (offline default: a 4-layer BERT from scratch on the Brown corpus)",
        presets: mlm::PRESETS,
        preset: mlm::resolve,
        build: |h, d, log| Ok(Box::new(mlm::MlmRecipe::build(h, d, log)?)),
        footprint: Some(mlm::footprint),
    },
    RecipeEntry {
        name: "causal-lm",
        description: "causal language model fine-tuning, full or LoRA (GPT-2, Llama, Mistral, Qwen2 from a Hugging Face directory; text, prompt/completion or chat jsonl)",
        presets: causal_lm::PRESETS,
        preset: causal_lm::resolve,
        build: |h, d, log| Ok(Box::new(causal_lm::LmRecipe::build(h, d, log)?)),
        footprint: Some(causal_lm::plan::footprint),
    },
    RecipeEntry {
        name: "token-classification",
        description: "a tag per word, named entities or part-of-speech, with BERT, RoBERTa, DistilBERT, ALBERT or ELECTRA (CoNLL or jsonl; offline default: Brown part-of-speech tags)",
        presets: token_classification::PRESETS,
        preset: token_classification::resolve,
        build: |h, d, log| Ok(Box::new(token_classification::TaggingRecipe::build(h, d, log)?)),
        footprint: Some(token_classification::footprint),
    },
    RecipeEntry {
        name: "question-answering",
        description: "extractive question answering (SQuAD v1.1/v2.0, long contexts in doc_stride windows) with any encoder family (offline default: a generated facts-qa set)",
        presets: question_answering::PRESETS,
        preset: question_answering::resolve,
        build: |h, d, log| Ok(Box::new(question_answering::QaRecipe::build(h, d, log)?)),
        footprint: Some(question_answering::footprint),
    },
    RecipeEntry {
        name: "resnet",
        description: "ResNet image classification on an ImageFolder (offline default: ResNet-18 on MNIST digits)",
        presets: resnet::PRESETS,
        preset: resnet::resolve,
        build: |h, d, log| Ok(Box::new(resnet::ResnetRecipe::build(h, d, log)?)),
        footprint: None,
    },
    RecipeEntry {
        name: "synthetic",
        description: "tiny BERT classifying generated token sequences (engine self-test)",
        presets: synthetic::PRESETS,
        preset: synthetic::resolve,
        build: |h, d, _log| Ok(Box::new(synthetic::Synthetic::build(h, d)?)),
        footprint: Some(synthetic::footprint),
    },
]);

/// A worker process's entry point: the engine's worker loop with these recipes and, in `hpu`
/// builds, Gaudi's bridge. `trainbook-worker`, `trainbook-cell-worker` and programs that run
/// as their own workers (`trainbook::worker_hook`) all start here; returns the exit code.
pub fn worker_main() -> i32 {
    #[cfg(feature = "hpu")]
    let hpu: trainbook_engine::Hpu = Some(&trainbook_hpu::BRIDGE);
    #[cfg(not(feature = "hpu"))]
    let hpu: trainbook_engine::Hpu = None;
    trainbook_engine::worker_main(&REGISTRY, hpu)
}

/// The error for a preset name a recipe does not have, listing the ones it has.
fn unknown_preset(recipe: &str, name: &str, presets: &[(&str, &str)]) -> anyhow::Error {
    let names: Vec<&str> = presets.iter().map(|(n, _)| *n).collect();
    anyhow::anyhow!(
        "unknown preset '{name}' for recipe {recipe}: use {}",
        names.join(", ")
    )
}

/// A recipe's resolved settings as they travel in [`Hyper::recipe_options`].
fn settings_map<T: serde::Serialize>(
    settings: &T,
) -> Result<serde_json::Map<String, serde_json::Value>> {
    match serde_json::to_value(settings)? {
        serde_json::Value::Object(m) => Ok(m),
        other => anyhow::bail!("recipe settings must be a map, not {other}"),
    }
}

/// A recipe's resolved settings read back from [`Hyper::recipe_options`].
fn settings<T: serde::de::DeserializeOwned>(hyper: &Hyper) -> Result<T> {
    serde_json::from_value(serde_json::Value::Object(hyper.recipe_options.clone())).with_context(
        || {
            format!(
                "the resolved options of preset '{}' do not fit this recipe",
                hyper.preset
            )
        },
    )
}
