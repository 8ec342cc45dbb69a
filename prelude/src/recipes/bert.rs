//! `bert`: BERT sequence classification on a text table, data-parallel.
//!
//! Presets:
//! - `tiny`: a 2-layer, hidden-64 BERT initialised at random, on a few hundred Rotten Tomatoes
//!   snippets at 32 tokens — seconds, for tests and CI.
//! - `default`: the pretrained all-MiniLM-L6-v2 on the Rotten Tomatoes snippets (the offline
//!   data set-up fetches), with the reference notebook's training settings: SGD lr 1e-3
//!   momentum 0.9, global batch 8, 10 epochs, the first 1000 train / 1000 test rows, padding to
//!   max length (128 here).

use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use tch::{nn, Device, Kind, Tensor};

use super::{Hyper, Recipe, Split};
use crate::models::bert::{load_safetensors, BertClassifier, BertConfig};
use crate::spec::{OptimizerKind, TrainConfig};
use crate::text::dataset::{self, TextExamples};
use crate::text::tokenizer::{Encoded, Padding, TextTokenizer};

struct Preset {
    hyper: Hyper,
    pretrained: bool,
    max_length: usize,
    train_rows: usize,
    test_rows: usize,
}

fn preset(name: &str) -> Result<Preset> {
    let hyper = |epochs, batch, lr, optimizer| Hyper {
        preset: name.to_string(),
        epochs,
        max_steps: None,
        global_batch_size: batch,
        lr,
        optimizer,
        momentum: 0.9,
        weight_decay: 0.0,
        dropout: 0.1,
        seed: 42,
        grad_clip: None,
    };
    Ok(match name {
        "tiny" => Preset {
            hyper: hyper(1, 16, 1e-3, OptimizerKind::Adamw),
            pretrained: false,
            max_length: 32,
            train_rows: 512,
            test_rows: 256,
        },
        "default" => Preset {
            hyper: hyper(10, 8, 1e-3, OptimizerKind::Sgd),
            pretrained: true,
            max_length: 128,
            train_rows: 1000,
            test_rows: 1000,
        },
        other => bail!("unknown preset '{other}' for recipe bert: use tiny or default"),
    })
}

pub struct BertRecipe {
    vs: nn::VarStore,
    model: BertClassifier,
    config: BertConfig,
    tokenizer: TextTokenizer,
    model_dir: PathBuf,
    label_names: Vec<String>,
    train: (Vec<Encoded>, Tensor),
    eval: (Vec<Encoded>, Tensor),
    device: Device,
}

fn encode(tok: &TextTokenizer, ex: &TextExamples) -> Result<(Vec<Encoded>, Tensor)> {
    let texts: Vec<&str> = ex.texts.iter().map(String::as_str).collect();
    Ok((tok.encode_batch(&texts)?, Tensor::from_slice(&ex.labels)))
}

impl BertRecipe {
    pub fn build(
        config: &TrainConfig,
        device: Device,
        log: &dyn Fn(String),
    ) -> Result<(Self, Hyper)> {
        let p = preset(config.preset.as_deref().unwrap_or("default"))?;
        let hyper = p.hyper.with_overrides(config);
        let model_dir = crate::assets::minilm_dir();
        let table = crate::assets::rotten_tomatoes_csv();
        for needed in [&model_dir.join("config.json"), &table] {
            if !needed.exists() {
                bail!("{} is missing: run `make setup` (scripts/fetch-data.sh fetches the offline model and data)", needed.display());
            }
        }
        let all = dataset::examples(&dataset::read_table(&table)?, "text", "label", None)?;
        // The split is fixed (data seed 0), whatever the training seed: runs stay comparable.
        let (train, test) = all.split(0.2, 0)?;
        let (train, test) = (train.first(p.train_rows), test.first(p.test_rows));
        let label_names = train.label_names.clone();
        log(format!(
            "data: {} train / {} test rows of {} (labels: {})",
            train.len(),
            test.len(),
            table.display(),
            label_names.join(", ")
        ));

        let tokenizer = TextTokenizer::from_dir(&model_dir, p.max_length, true)?;
        let mut bert = BertConfig::from_file(&model_dir.join("config.json"))?;
        if !p.pretrained {
            let vocab = bert.vocab_size;
            bert = BertConfig::tiny(vocab, p.max_length as i64);
        }
        bert = bert.with_dropout(hyper.dropout);
        bert.id2label = Some(
            label_names
                .iter()
                .enumerate()
                .map(|(i, n)| (i.to_string(), n.clone()))
                .collect(),
        );
        tch::manual_seed(hyper.seed as i64);
        let vs = nn::VarStore::new(device);
        let model = BertClassifier::new(&vs.root(), &bert, label_names.len() as i64);
        if p.pretrained {
            let report = load_safetensors(&vs, &model_dir.join("model.safetensors"))?;
            if let Some(msg) = report.describe(
                "BertForSequenceClassification",
                &model_dir.display().to_string(),
            ) {
                for line in msg.lines() {
                    log(line.to_string());
                }
            }
        }
        let train = encode(&tokenizer, &train)?;
        let eval = encode(&tokenizer, &test)?;
        Ok((
            Self {
                vs,
                model,
                config: bert,
                tokenizer,
                model_dir,
                label_names,
                train,
                eval,
                device,
            },
            hyper,
        ))
    }
}

impl Recipe for BertRecipe {
    fn vars(&self) -> &nn::VarStore {
        &self.vs
    }
    fn train_len(&self) -> usize {
        self.train.0.len()
    }
    fn eval_len(&self) -> usize {
        self.eval.0.len()
    }
    fn forward(&self, split: Split, indices: &[usize], train: bool) -> Result<(Tensor, Tensor)> {
        let (enc, labels) = if split == Split::Train {
            &self.train
        } else {
            &self.eval
        };
        let items: Vec<&Encoded> = indices.iter().map(|&i| &enc[i]).collect();
        let b = self.tokenizer.pad(&items, Padding::MaxLength);
        let idx: Vec<i64> = indices.iter().map(|&i| i as i64).collect();
        let labels = labels
            .index_select(0, &Tensor::from_slice(&idx))
            .to(self.device);
        let logits = self.model.forward(
            &b.input_ids.to(self.device),
            Some(&b.attention_mask.to(self.device)),
            Some(&b.token_type_ids.to(self.device)),
            train,
        );
        Ok((logits.to_kind(Kind::Float), labels))
    }
    /// A loadable Hugging Face-style directory: weights, config.json with the labels, and the
    /// tokenizer files.
    fn save(&self, dir: &Path) -> Result<()> {
        self.vs.save(dir.join("model.safetensors"))?;
        let mut config = serde_json::to_value(&self.config)?;
        config["architectures"] = serde_json::json!(["BertForSequenceClassification"]);
        config["model_type"] = serde_json::json!("bert");
        config["num_labels"] = serde_json::json!(self.label_names.len());
        config["label2id"] = self
            .label_names
            .iter()
            .enumerate()
            .map(|(i, n)| (n.clone(), serde_json::json!(i)))
            .collect();
        std::fs::write(dir.join("config.json"), serde_json::to_vec_pretty(&config)?)?;
        for f in [
            "tokenizer.json",
            "vocab.txt",
            "tokenizer_config.json",
            "special_tokens_map.json",
        ] {
            let src = self.model_dir.join(f);
            if src.exists() {
                std::fs::copy(&src, dir.join(f))
                    .with_context(|| format!("copying {}", src.display()))?;
            }
        }
        Ok(())
    }
}
