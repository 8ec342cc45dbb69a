//! trainbook's recipes: what a worker trains (model, data, defaults), and the building blocks
//! they share (BERT and ResNet models, text tables and tokenizers, image folders and
//! transforms, offline assets, classifiers that load the checkpoints).
//!
//! The engine knows recipes only through [`REGISTRY`], which `trainbook-worker` and the
//! `trainbook` facade hand to it: one row per recipe with its name, description, presets and
//! build function.

pub mod assets;
pub mod bert;
pub mod classify;
pub mod models;
pub mod resnet;
pub mod synthetic;
pub mod text;
pub mod vision;

use anyhow::Result;
use trainbook_engine::recipe::{Hyper, Recipe, RecipeEntry, Registry};
use trainbook_engine::spec::TrainConfig;

/// Every recipe trainbook ships.
pub static REGISTRY: Registry = Registry::new(&[
    RecipeEntry {
        name: "bert",
        description: "BERT sequence classification (offline default: all-MiniLM-L6-v2 on Rotten Tomatoes snippets)",
        presets: bert::PRESETS,
        build: build_bert,
    },
    RecipeEntry {
        name: "resnet",
        description: "ResNet image classification on an ImageFolder (offline default: ResNet-18 on MNIST digits)",
        presets: resnet::PRESETS,
        build: build_resnet,
    },
    RecipeEntry {
        name: "synthetic",
        description: "tiny BERT classifying generated token sequences (engine self-test)",
        presets: synthetic::PRESETS,
        build: build_synthetic,
    },
]);

type Built = Result<(Box<dyn Recipe>, Hyper)>;

fn build_bert(c: &TrainConfig, d: tch::Device, log: &dyn Fn(String)) -> Built {
    let (r, h) = bert::BertRecipe::build(c, d, log)?;
    Ok((Box::new(r), h))
}

fn build_resnet(c: &TrainConfig, d: tch::Device, log: &dyn Fn(String)) -> Built {
    let (r, h) = resnet::ResnetRecipe::build(c, d, log)?;
    Ok((Box::new(r), h))
}

fn build_synthetic(c: &TrainConfig, d: tch::Device, _log: &dyn Fn(String)) -> Built {
    let (r, h) = synthetic::Synthetic::build(c, d)?;
    Ok((Box::new(r), h))
}
