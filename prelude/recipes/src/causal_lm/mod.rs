//! `causal-lm`: fine-tuning a causal language model (GPT-2, Llama, Mistral, Qwen2) from a
//! Hugging Face directory, in full or with LoRA adapters, data-parallel.
//!
//! Data: plain text (a `.txt` file, a table with a text column, a directory of them, or a
//! corpus prepared by `trainbook prepare`), cut into blocks of `max_length` tokens, every
//! token predicted; or jsonl examples, `{"prompt", "completion"}` (the loss on the completion)
//! or `{"messages": [{"role", "content"}, ...]}` rendered with the tokenizer's chat template
//! (the loss on the assistant turns), or a table with prompt and completion columns; padded
//! per batch or packed into blocks (`packing`).
//!
//! Checkpoints are directories the Hugging Face ecosystem loads as they are: a full
//! fine-tune's `transformers.AutoModelForCausalLM.from_pretrained` loads; a LoRA run's holds
//! `adapter_config.json` and `adapter_model.safetensors` for `peft.PeftModel.from_pretrained`
//! over the base model ([`inference::export`] copies or merges either).
//!
//! Presets:
//! - `default`: AdamW 2e-5 (LoRA: 2e-4), linear decay after 3% warm-up, global batch 8, 1
//!   epoch, 512 tokens (at most the model's positions); without data, the offline Brown corpus.
//! - `tiny`: AdamW 1e-3, batch 8, 64 train / 16 eval samples of 32 tokens: seconds, for tests.

pub mod data;
pub mod inference;
pub mod plan;

use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use tch::{nn, Kind, Tensor};
use trainbook_api::plumbing::settings::{LmSettings, TextSettings};
use trainbook_api::{Hyper, JobSpec, LmOptions, OptimizerKind, Schedule, TextOptions};
use trainbook_engine::{Device, Recipe, Split, Step};

use crate::models::causal_lm::{self, CausalLm, ModelConfig};
use crate::models::lora::LoraSpec;
use crate::text::tokenizer::{Padding, TextTokenizer};
use data::Data;

/// Presets of `trainbook train causal-lm --preset NAME`.
pub const PRESETS: &[(&str, &str)] = &[
    ("default", "fine-tune --model DIR: AdamW 2e-5 (LoRA 2e-4), linear decay after 3% warm-up, batch 8, 1 epoch, 512 tokens"),
    ("tiny", "--model DIR on 64 train / 16 eval samples of 32 tokens, AdamW 1e-3: seconds, for tests"),
];

/// The settings a job resolves to.
#[derive(serde::Serialize, serde::Deserialize)]
pub(crate) struct Settings {
    text: TextSettings,
    lm: LmSettings,
    /// The resolved adapters (`None`: full fine-tuning).
    lora: Option<LoraSpec>,
}

fn preset(name: &str, lora: bool) -> Result<(Hyper, Settings)> {
    let text = |max_length| TextSettings {
        max_length,
        padding: Padding::Dynamic,
        text_column: "text".into(),
        label_column: "label".into(),
        eval_fraction: None,
        eval_data: None,
        text_pair_column: None,
        from_scratch: false,
        random_init: false,
    };
    let lm = LmSettings {
        lora_rank: None,
        lora_alpha: None,
        lora_dropout: 0.05,
        lora_targets: None,
        packing: false,
    };
    let mut h = match name {
        "default" => {
            let mut h = Hyper::new(
                name,
                1,
                8,
                if lora { 2e-4 } else { 2e-5 },
                OptimizerKind::Adamw,
            );
            h.schedule = Schedule::Linear;
            h.warmup_ratio = 0.03;
            h
        }
        "tiny" => Hyper {
            train_rows: Some(64),
            eval_rows: Some(16),
            ..Hyper::new(name, 1, 8, 1e-3, OptimizerKind::Adamw)
        },
        other => return Err(crate::unknown_preset("causal-lm", other, PRESETS)),
    };
    // The models here have no dropout of their own (Llama's is 0); LoRA has its own option.
    h.dropout = 0.0;
    // Without data: the offline Brown corpus (pre-training a model from scratch, the notebook).
    h.data = Some(crate::assets::brown_txt().display().to_string());
    let block = if name == "tiny" { 32 } else { 512 };
    Ok((
        h,
        Settings {
            text: text(block),
            lm,
            lora: None,
        },
    ))
}

/// A model option as a directory: a path with `config.json`, else what `resolve_model` finds
/// (the Hugging Face cache).
pub fn model_dir(spec: &str) -> Result<PathBuf> {
    let p = Path::new(spec);
    if p.is_dir() {
        if !p.join("config.json").exists() {
            bail!("{spec} has no config.json: give a Hugging Face model directory (as save_pretrained writes it)");
        }
        return Ok(p.to_path_buf());
    }
    Ok(crate::assets::resolve_model(spec)?.0)
}

/// The job's options resolved and checked before any worker starts: the model's config and
/// weight headers, the tokenizer, the adapters' targets and the examples (each bad input is
/// one error; nothing is written).
pub fn resolve(spec: &JobSpec) -> Result<Hyper> {
    let name = spec
        .train
        .preset
        .clone()
        .unwrap_or_else(|| "default".into());
    let (text_opts, lm_opts): (TextOptions, LmOptions) = spec.recipe_options_pair()?;
    let (mut hyper, p) = preset(&name, lm_opts.lora_rank.is_some())?;
    if text_opts.padding.is_some()
        || text_opts.label_column.is_some()
        || text_opts.text_pair_column.is_some()
    {
        bail!("causal-lm predicts the next token of one text: drop padding, label_column and text_pair_column (padding is per batch; packing packs examples)");
    }
    if spec.train.dropout.is_some_and(|d| d > 0.0) {
        bail!(
            "causal-lm models apply no dropout of their own: drop dropout (LoRA has lora_dropout)"
        );
    }
    let mut s = Settings {
        text: p.text.with_overrides(&text_opts),
        lm: p.lm.with_overrides(&lm_opts),
        lora: None,
    };
    s.text.check_eval_fraction()?;
    let model = spec.train.model.as_deref().context(
        "causal-lm needs a model: --model DIR, a Hugging Face directory of a gpt2, llama, mistral or qwen2 model (config.json, safetensors weights, tokenizer.json)",
    )?;
    let dir = model_dir(model)?;
    let config = ModelConfig::read(&dir)?;
    if !s.text.from_scratch {
        causal_lm::check_weights(&dir, &config)?;
    }
    if !dir.join("tokenizer.json").exists() {
        bail!("{} has no tokenizer.json: causal-lm reads Hugging Face fast tokenizers (save the tokenizer with save_pretrained)", dir.display());
    }
    if text_opts.max_length.is_none() {
        // The preset's length, at most what the model takes.
        s.text.max_length = s.text.max_length.min(config.max_tokens() as usize);
    }
    let block = s.text.max_length;
    if block < 2 {
        bail!("max_length {block} is too short: a sample needs at least 2 tokens (one to predict from)");
    }
    config.check_length(
        block as i64,
        &format!("use max_length {} or less", config.max_tokens()),
    )?;
    s.lora = lora_spec(&s.lm, &config)?;
    let data = spec
        .train
        .data
        .clone()
        .or(hyper.data.clone())
        .unwrap_or_default();
    let path = Path::new(&data);
    if !path.exists() {
        let fix = if spec.train.data.is_none() {
            "run `make setup` (scripts/fetch-data.sh fetches the offline Brown corpus), or give --data: .txt, a table with a text column, a prepared corpus, jsonl of {\"prompt\", \"completion\"} or {\"messages\": [...]}, or a table with prompt and completion columns"
        } else {
            "check the path"
        };
        bail!("data {data} does not exist: {fix}");
    }
    if data::is_examples(path) {
        // Encoding checks every example (roles, lengths, the template) here, once.
        let tok = TextTokenizer::from_model_dir(&dir, 1 << 20)?;
        let template = crate::text::chat::ChatTemplate::from_model_dir(&dir)?;
        for f in [Some(path), s.text.eval_data.as_deref()]
            .into_iter()
            .flatten()
        {
            data::encode_file(
                f,
                tok.inner(),
                template.as_ref(),
                eos_id(&dir, &tok),
                block,
                &dir,
            )?;
        }
    } else {
        crate::text::mlm_source::check_dir(path, &s.text.text_column)?;
    }
    hyper.recipe_options = crate::settings_map(&s)?;
    Ok(hyper)
}

/// The adapters the options ask for, checked against the model's projections.
fn lora_spec(lm: &LmSettings, config: &ModelConfig) -> Result<Option<LoraSpec>> {
    let Some(rank) = lm.lora_rank else {
        if lm.lora_alpha.is_some() || lm.lora_targets.is_some() {
            bail!("lora_alpha and lora_targets apply to LoRA: add lora_rank (e.g. 8)");
        }
        return Ok(None);
    };
    let targets = match &lm.lora_targets {
        Some(t) => t
            .split(',')
            .map(|s| s.trim().to_string())
            .filter(|s| !s.is_empty())
            .collect(),
        None => config.default_lora_targets(),
    };
    if !(0.0..1.0).contains(&lm.lora_dropout) {
        bail!("lora_dropout {} must be in [0, 1)", lm.lora_dropout);
    }
    let spec = LoraSpec {
        rank: rank as i64,
        alpha: lm.lora_alpha.unwrap_or(2.0 * rank as f64),
        dropout: lm.lora_dropout,
        targets,
    };
    spec.check_targets(&config.projections())?;
    Ok(Some(spec))
}

/// The end-of-sequence token a completion ends with: the tokenizer's own (its config's
/// `eos_token`), else `</s>`, `<|endoftext|>` or `<|im_end|>` when the vocabulary has them.
pub fn eos_id(dir: &Path, tok: &TextTokenizer) -> Option<i64> {
    let named = std::fs::read(dir.join("tokenizer_config.json"))
        .ok()
        .and_then(|b| serde_json::from_slice::<serde_json::Value>(&b).ok())
        .and_then(|v| match &v["eos_token"] {
            serde_json::Value::String(s) => Some(s.clone()),
            serde_json::Value::Object(o) => {
                o.get("content").and_then(|c| c.as_str()).map(String::from)
            }
            _ => None,
        });
    let candidates: Vec<String> = named
        .into_iter()
        .chain(["</s>", "<|endoftext|>", "<|im_end|>"].map(String::from))
        .collect();
    candidates.iter().find_map(|t| tok.token_id(t))
}

pub struct LmRecipe {
    vs: nn::VarStore,
    model: Box<dyn CausalLm>,
    config: ModelConfig,
    model_dir: PathBuf,
    lora: Option<LoraSpec>,
    data: Data,
    vocab: i64,
    pad: i64,
    device: Device,
}

impl LmRecipe {
    pub fn build(hyper: &Hyper, device: Device, log: &dyn Fn(String)) -> Result<Self> {
        let s: Settings = crate::settings(hyper)?;
        let dir = model_dir(hyper.model.as_deref().context("causal-lm needs a model")?)?;
        let config = ModelConfig::read(&dir)?;
        let tokenizer = TextTokenizer::from_model_dir(&dir, 1 << 20)?;
        let vocab = config.vocab_size();
        if (tokenizer.vocab_size() as i64) > vocab {
            bail!("the tokenizer in {} has {} tokens but the model's vocabulary is {vocab}: use the model's own tokenizer", dir.display(), tokenizer.vocab_size());
        }
        let eos = eos_id(&dir, &tokenizer);
        let data_path = hyper.data.as_deref().context("causal-lm needs data")?;
        let t0 = std::time::Instant::now();
        let source = data::Source {
            data: data_path,
            rows: (hyper.train_rows, hyper.eval_rows),
            text: &s.text,
            packing: s.lm.packing,
            tokenizer: &tokenizer,
            tokenizer_dir: &dir,
            eos,
        };
        let data = data::load(&source, log)?;
        if data.train.is_empty() {
            bail!(
                "{data_path} gives no training sample ({}): use more data or a smaller max_length",
                data.describe
            );
        }
        log(format!(
            "data: {}, ready in {:.1} s",
            data.describe,
            t0.elapsed().as_secs_f64()
        ));

        tch::manual_seed(hyper.seed as i64);
        let mut vs = device.var_store();
        let mut model = causal_lm::build(&vs, &config, s.lora.as_ref())?;
        model.layers_mut().set_activation_checkpointing(
            hyper
                .activation_checkpointing
                .then_some(hyper.checkpoint_layers_every),
        );
        if s.text.from_scratch {
            log(format!(
                "from scratch: the architecture of {} with random weights",
                dir.display()
            ));
        } else {
            causal_lm::load(&vs, &dir, &config)?;
        }
        if s.lora.is_some() && hyper.precision == trainbook_api::Precision::Bf16 {
            // A frozen base is only read, by bf16 matrix products: held in bf16 it takes half
            // the memory, and autocast makes no bf16 copy of it to keep for the backward pass.
            tch::no_grad(|| -> Result<()> {
                for (name, mut v) in vs.variables() {
                    if !crate::models::lora::is_adapter(&name)
                        && !trainbook_engine::sharded_build::cast(&name, &v, Kind::BFloat16)?
                    {
                        v.set_data(&v.to_kind(Kind::BFloat16));
                    }
                }
                Ok(())
            })?;
        }
        let (trainable, all) = vs.variables().values().fold((0i64, 0i64), |(t, a), v| {
            let n = v.numel() as i64;
            (t + if v.requires_grad() { n } else { 0 }, a + n)
        });
        log(format!(
            "model: {} from {}; {}: {trainable} of {all} parameters trained ({:.2}%)",
            config.describe(),
            dir.display(),
            match &s.lora {
                Some(l) => format!(
                    "LoRA rank {} alpha {} on {}",
                    l.rank,
                    l.alpha,
                    l.targets.join(", ")
                ),
                None => "full fine-tuning".into(),
            },
            100.0 * trainable as f64 / all.max(1) as f64
        ));
        device.place_vars(&mut vs)?;
        // Right padding is never attended to nor predicted: any id will do.
        let pad = eos.unwrap_or(0);
        Ok(Self {
            vs,
            model,
            config,
            model_dir: dir,
            lora: s.lora,
            data,
            vocab,
            pad,
            device,
        })
    }
}

impl Recipe for LmRecipe {
    fn vars(&self) -> &nn::VarStore {
        &self.vs
    }
    fn vars_mut(&mut self) -> &mut nn::VarStore {
        &mut self.vs
    }
    fn train_len(&self) -> usize {
        self.data.train.len()
    }
    fn eval_len(&self) -> usize {
        self.data.eval.len()
    }
    fn step(&self, split: Split, indices: &[usize], train: bool) -> Result<Step> {
        let source = match split {
            Split::Train => &self.data.train,
            Split::Eval => &self.data.eval,
        };
        let samples = indices
            .iter()
            .map(|&i| source.get(i, self.vocab))
            .collect::<Result<Vec<_>>>()?;
        let b = data::batch(&samples, self.pad);
        if b.positions.is_empty() {
            bail!("a batch of {} samples has no token to predict (every label is ignored): check that the examples have completions or assistant turns", b.rows);
        }
        let d = self.device;
        let ids =
            d.put(&d.pin(Tensor::from_slice(&b.ids).view([b.rows as i64, b.width as i64])))?;
        let positions = d.put(&d.pin(Tensor::from_slice(&b.positions)))?;
        let targets = d.put(&d.pin(Tensor::from_slice(&b.targets)))?;
        let hidden = self.model.hidden(&ids, None, train);
        let h = *hidden.size().last().expect("hidden states have a width");
        // Only the positions that predict a token go through the vocabulary projection.
        let picked = hidden.reshape([-1, h]).index_select(0, &positions);
        let logits = self.model.logits(&picked).to_kind(Kind::Float);
        let loss = logits.cross_entropy_for_logits(&targets);
        let accuracy = logits
            .argmax(-1, false)
            .eq_tensor(&targets)
            .to_kind(Kind::Float)
            .mean(Kind::Float);
        Ok(Step::loss(loss).metric_tensor("token_accuracy", &accuracy))
    }
    fn perplexity(&self) -> bool {
        true
    }
    /// Nothing here is a running statistic: what is not trained is LoRA's frozen base.
    fn buffers_change(&self) -> bool {
        false
    }
    /// The logits of a block are `tokens x vocabulary` floats, as in training (32 blocks of
    /// 256 tokens over 32,000 tokens are 1 GiB): evaluation runs in the training's batches.
    fn eval_batch(&self, local_batch: usize) -> usize {
        local_batch
    }
    /// LoRA checkpoints hold the adapters only (the base is the model directory's).
    fn weights(&self) -> Vec<(String, Tensor)> {
        causal_lm::named(&self.vs, self.lora.is_some())
    }
    /// A full fine-tune: config.json and the tokenizer and generation files beside the weights
    /// (a directory transformers loads). LoRA: PEFT's adapter files too.
    fn save_files(&self, dir: &Path) -> Result<()> {
        match &self.lora {
            Some(spec) => causal_lm::write_adapter_files(
                dir,
                &causal_lm::named(&self.vs, true),
                spec,
                &self.config,
                &self.model_dir,
            ),
            None => causal_lm::write_model_files(dir, &self.config, &self.model_dir),
        }
    }
}
