//! `bert-mlm`: BERT pre-training by masked-language modelling, data-parallel.
//!
//! The reference's story (003): texts tokenized with their special tokens, concatenated and cut
//! into blocks of `max_length` tokens; 15% of the tokens masked (80/10/10), a
//! `BertForMaskedLM` trained to restore them. From scratch (a config from `layers`,
//! `hidden_size`, `heads` and the tokenizer's vocabulary) or continued from a checkpoint
//! (`model`). Samples are blocks: `train_rows`/`eval_rows` count blocks.
//!
//! Presets:
//! - `tiny`: a random 2-layer hidden-64 BERT, blocks of 32 tokens from the Rotten Tomatoes
//!   snippets, 256 train / 64 eval blocks: seconds, for tests and CI.
//! - `default`: a random 4-layer hidden-256 BERT, blocks of 128 tokens from the offline Brown
//!   corpus (1M words), AdamW 5e-4 with linear decay after 10% warm-up, 1 epoch: minutes on a
//!   CPU.
//! - `reference`: the reference's job (003): a bert-base-sized BERT (12 layers, hidden 768, 12
//!   heads) from scratch on every corpus file in `<data dir>/datasets/bert-pretraining/`
//!   (Wikipedia and BookCorpus tables, placed there by the user: no download), blocks of 512,
//!   global batch 256, AdamW 5e-5 with linear decay, 100,000 steps. Chosen without a preset
//!   when that directory has files.
//! - `bert-large`, `bert-1.5b`: the large models of BERT pre-training at 128 tokens with 20
//!   predictions per block; `bert-1.5b` is Habana's job of 002 (LANS, bf16, ZeRO-1). Both read
//!   the reference corpus when it is there, else the Brown corpus; `trainbook plan` says
//!   whether they fit a device before anything starts.
//!
//! Data: a `.txt` file (a text per line), a table with a text column, or a directory: every
//! such file in it, in name order (e.g. Wikipedia and BookCorpus side by side); without `eval_data`,
//! every 20th text (5%, `eval_fraction` to change) is held out. Or a corpus prepared by
//! `trainbook prepare` (token shards, memory-mapped). Raw text is prepared first, once per
//! machine and reused by later jobs (`text::corpus`): workers never hold the corpus in memory.
//! The tokenizer: `tokenizer`, else the model's, else the offline uncased BERT vocabulary of
//! all-MiniLM-L6-v2.

use std::cell::Cell;
use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use tch::{nn, Kind, Tensor};
use trainbook_api::Footprint;
use trainbook_api::Hyper;
use trainbook_api::{JobSpec, OptimizerKind, Schedule};
use trainbook_engine::Device;
use trainbook_engine::{Layout, Recipe, Split, StagedStep, Step};

use crate::models::encoder::{
    load_weights, masked_positions, EncoderConfig, Head, MaskedLm, IGNORE_INDEX,
};
use crate::text::mlm::Masking;
use crate::text::mlm_source::{self, Sample, Samples};
use crate::text::tokenizer::{Padding, TextTokenizer};
use crate::text::wordpiece::SPECIAL_TOKENS;
pub use trainbook_api::{plumbing::settings::MlmSettings, MlmOptions};
use trainbook_api::{plumbing::settings::TextSettings, TextOptions};

/// Presets of `trainbook train bert-mlm --preset NAME`.
pub const PRESETS: &[(&str, &str)] = &[
    ("tiny", "random 2-layer hidden-64 BERT, 32-token blocks of Rotten Tomatoes snippets, 256/64 blocks: seconds, for tests"),
    ("default", "random 4-layer hidden-256 BERT, 128-token blocks of the Brown corpus (1M words), AdamW 5e-4 linear, 1 epoch"),
    ("reference", "the reference's job: bert-base-sized BERT from scratch on <data dir>/datasets/bert-pretraining (Wikipedia, BookCorpus), 512-token blocks, batch 256, AdamW 5e-5, 100,000 steps"),
    ("bert-large", "BERT-large from scratch (24 layers, hidden 1024, 16 heads), 128-token blocks with 20 predictions each, batch 256, AdamW 1e-4; the reference corpus when present, else the Brown corpus"),
    ("bert-1.5b", "Habana's BERT-1.5B (48 layers, hidden 1600, 25 heads): 128-token blocks, 20 predictions each, LANS 1.5e-3 poly, bf16, ZeRO-1, batch 12,288 in 48 accumulations; for 8+ Gaudi cards (`trainbook plan` first)"),
];

/// The reference corpus when it is on this machine, else `fallback` (the large presets are
/// meant for it, and are planned anywhere).
fn large_corpus(fallback: &str) -> String {
    if auto_preset() == "reference" {
        reference_corpus().display().to_string()
    } else {
        fallback.to_string()
    }
}

/// Where the `reference` preset reads its corpus: the Wikipedia and BookCorpus tables (or any
/// text files) the user put there.
pub fn reference_corpus() -> PathBuf {
    crate::assets::data_dir().join("datasets/bert-pretraining")
}

/// With no preset named: the reference job when its corpus is on this machine, else the
/// offline default (nothing is downloaded for the choice).
pub fn auto_preset() -> &'static str {
    let has_files = std::fs::read_dir(reference_corpus())
        .map(|mut entries| entries.next().is_some())
        .unwrap_or(false);
    if has_files {
        "reference"
    } else {
        "default"
    }
}

/// The settings a job resolves to: the text options that apply (block size, columns, eval
/// split) and the masked-LM ones.
#[derive(serde::Serialize, serde::Deserialize)]
struct Settings {
    text: TextSettings,
    mlm: MlmSettings,
}

/// A preset's text options: blocks of `block` tokens, a model initialised at random.
fn preset_text(block: usize) -> TextSettings {
    TextSettings {
        max_length: block,
        padding: Padding::MaxLength,
        text_column: "text".into(),
        label_column: "label".into(),
        eval_fraction: None,
        eval_data: None,
        text_pair_column: None,
        from_scratch: false,
        random_init: true,
    }
}

/// A preset's masked-LM options: 15% masked, a model of that shape.
fn preset_mlm(layers: usize, hidden_size: usize, heads: usize) -> MlmSettings {
    MlmSettings {
        mlm_probability: 0.15,
        max_predictions_per_seq: None,
        tokenizer: None,
        layers,
        hidden_size,
        heads,
        next_sentence: None,
    }
}

/// Habana's BERT-1.5B pre-training (002; Model-References, DeepSpeedExamples/deepspeed-bert:
/// bert_1.5b_config.json, deepspeed_config_bert_1.5b.json, run_bert_1.5b_8x.sh): phase 1 at
/// 128 tokens with 20 predictions per sequence; LANS, lr 0.0015 with 5% warm-up and 25%
/// constant, poly decay of degree 1; bf16; ZeRO-1; gradient clipping 1.0; 32 sequences per
/// card and 12,288 per step (48 accumulations on 8 cards).
fn habana_bert_1_5b(h: &mut Hyper) {
    h.optimizer = OptimizerKind::Lans;
    h.schedule = Schedule::Poly;
    h.warmup_ratio = 0.05;
    h.constant_ratio = 0.25;
    h.poly_power = 1.0;
    h.weight_decay = 0.01;
    h.grad_clip = Some(1.0);
    h.grad_accum = 48;
    h.zero = 1;
    h.precision = trainbook_api::Precision::Bf16;
    h.max_steps = Some(155_000);
    h.seed = 12439;
}

fn preset(name: &str) -> Result<(Hyper, Settings)> {
    let rt = crate::assets::rotten_tomatoes_csv().display().to_string();
    let brown = crate::assets::brown_txt().display().to_string();
    let (text, mlm) = (preset_text, preset_mlm);
    let hyper = |epochs, batch, lr, data: &str, rows: Option<(usize, usize)>| Hyper {
        data: Some(data.to_string()),
        train_rows: rows.map(|r| r.0),
        eval_rows: rows.map(|r| r.1),
        ..Hyper::new(name, epochs, batch, lr, OptimizerKind::Adamw)
    };
    Ok(match name {
        "tiny" => (
            hyper(1, 16, 1e-3, &rt, Some((256, 64))),
            Settings {
                text: text(32),
                mlm: mlm(2, 64, 4),
            },
        ),
        "default" => {
            let mut h = hyper(1, 32, 5e-4, &brown, None);
            h.schedule = Schedule::Linear;
            h.warmup_ratio = 0.1;
            h.weight_decay = 0.01;
            (
                h,
                Settings {
                    text: text(128),
                    mlm: mlm(4, 256, 4),
                },
            )
        }
        "reference" => {
            let corpus = reference_corpus().display().to_string();
            let mut h = hyper(1, 256, 5e-5, &corpus, None);
            h.schedule = Schedule::Linear;
            h.max_steps = Some(100_000);
            (
                h,
                Settings {
                    text: text(512),
                    mlm: mlm(12, 768, 12),
                },
            )
        }
        "bert-large" => {
            let mut h = hyper(1, 256, 1e-4, &large_corpus(&brown), None);
            h.schedule = Schedule::Linear;
            h.warmup_ratio = 0.01;
            h.weight_decay = 0.01;
            h.max_steps = Some(100_000);
            let mut m = mlm(24, 1024, 16);
            m.max_predictions_per_seq = Some(20);
            (
                h,
                Settings {
                    text: text(128),
                    mlm: m,
                },
            )
        }
        "bert-1.5b" => {
            // 48 layers, hidden 1600, 25 heads, feed-forward 6400: see habana_bert_1_5b.
            let mut h = hyper(1, 12_288, 1.5e-3, &large_corpus(&brown), None);
            habana_bert_1_5b(&mut h);
            let mut m = mlm(48, 1600, 25);
            m.max_predictions_per_seq = Some(20);
            (
                h,
                Settings {
                    text: text(128),
                    mlm: m,
                },
            )
        }
        other => return Err(crate::unknown_preset("bert-mlm", other, PRESETS)),
    })
}

/// The job's preset with its options resolved; checks what can be checked without loading
/// anything (see [`trainbook_engine::PresetFn`]).
pub fn resolve(spec: &JobSpec) -> Result<Hyper> {
    let name = spec
        .train
        .preset
        .clone()
        .unwrap_or_else(|| auto_preset().into());
    let (mut hyper, p) = preset(&name)?;
    let (text_opts, mlm_opts): (TextOptions, MlmOptions) = spec.recipe_options_pair()?;
    if text_opts.padding.is_some() || text_opts.label_column.is_some() {
        bail!("bert-mlm has no labels and needs no padding (its blocks are full): drop padding and label_column");
    }
    if text_opts.text_pair_column.is_some() {
        bail!(
            "bert-mlm reads one text column (its blocks run across texts): drop text_pair_column"
        );
    }
    let mut s = Settings {
        text: p.text.with_overrides(&text_opts),
        mlm: p.mlm.with_overrides(&mlm_opts),
    };
    s.text.random_init = spec.train.model.is_none();
    let block = s.text.max_length;
    if !(8..=8192).contains(&block) {
        bail!("max_length {block} (the block size) must be between 8 and 8192 tokens");
    }
    let m = &s.mlm;
    crate::text::mlm::check_probability(m.mlm_probability)?;
    if m.layers == 0 || m.hidden_size == 0 || m.heads == 0 || m.hidden_size % m.heads != 0 {
        bail!(
            "layers {}, hidden_size {}, heads {}: all must be positive and heads must divide hidden_size (e.g. 4 layers, 256 hidden, 4 heads)",
            m.layers,
            m.hidden_size,
            m.heads
        );
    }
    s.text.check_eval_fraction()?;
    if let Some(t) = &m.tokenizer {
        if !t.join("tokenizer.json").exists() && !t.join("vocab.txt").exists() {
            bail!("tokenizer {} has neither tokenizer.json nor vocab.txt: train one with `trainbook tokenizer train --out {}`", t.display(), t.display());
        }
    } else if spec.train.model.is_none() && !crate::assets::minilm_dir().join("vocab.txt").exists()
    {
        bail!("{} is missing: run `make setup` (scripts/fetch-data.sh fetches the offline vocabulary), or name a tokenizer", crate::assets::minilm_dir().display());
    }
    let data = hyper.data.as_deref().map(Path::new);
    if spec.train.data.is_none() && data.is_some_and(|d| !d.exists()) {
        let fix = if name == "reference" {
            "put the Wikipedia and BookCorpus tables (or any text files) there, or give data"
        } else {
            "run `make setup` (scripts/fetch-data.sh fetches the offline corpus), or give data"
        };
        bail!("{} is missing: {fix}", data.unwrap().display());
    }
    // A directory is checked before any worker starts.
    let given = spec.train.data.as_deref().map(Path::new).or(data);
    for d in [given, s.text.eval_data.as_deref()].into_iter().flatten() {
        mlm_source::check_dir(d, &s.text.text_column)?;
    }
    hyper.recipe_options = crate::settings_map(&s)?;
    Ok(hyper)
}

/// The BERT a job builds from scratch: its settings' shape, the tokenizer's vocabulary.
fn scratch_config(s: &Settings, vocab: i64) -> EncoderConfig {
    let h = s.mlm.hidden_size as i64;
    EncoderConfig {
        hidden_size: h,
        num_hidden_layers: s.mlm.layers as i64,
        num_attention_heads: s.mlm.heads as i64,
        intermediate_size: 4 * h,
        ..EncoderConfig::tiny(vocab, (s.text.max_length as i64).max(512))
    }
}

/// The job's model and activations for the memory plan: the model's config.json, or the
/// from-scratch shape with the tokenizer's vocabulary (nothing else is read).
pub fn footprint(hyper: &Hyper, layout: &Layout) -> Result<Footprint> {
    let s: Settings = crate::settings(hyper)?;
    let config = match &hyper.model {
        Some(m) => {
            let dir = crate::assets::resolve_model(m)?.0;
            EncoderConfig::from_file(&dir.join("config.json"))?
        }
        None => {
            let dir = s
                .mlm
                .tokenizer
                .clone()
                .unwrap_or_else(crate::assets::minilm_dir);
            let vocab = TextTokenizer::from_model_dir(&dir, 1 << 20)?.vocab_size() as i64;
            scratch_config(&s, vocab)
        }
    };
    // Positions a micro-batch predicts at its peak: each token is selected independently, so
    // a batch's count is binomial; three standard deviations over its mean, at most the cap.
    let (block, p) = (s.text.max_length as f64, s.mlm.mlm_probability);
    let batch = layout.batch_per_device.max(1) as f64;
    let high = p * block + 3.0 * (block * p * (1.0 - p) / batch).sqrt();
    let predictions = match s.mlm.max_predictions_per_seq {
        Some(max) => high.min(max as f64),
        None => high,
    };
    Ok(crate::models::encoder::plan_footprint(
        &config,
        Head::MaskedLm { predictions },
        s.text.max_length as u64,
        hyper,
        layout,
    ))
}

pub struct MlmRecipe {
    vs: nn::VarStore,
    model: MaskedLm,
    config: EncoderConfig,
    tokenizer_dir: PathBuf,
    masking: Masking,
    train: Samples,
    eval: Samples,
    seed: u64,
    /// The epoch of the current training pass (masks change per epoch).
    epoch: Cell<u64>,
    device: Device,
    /// Masked positions per block every batch is padded to (`cuda_graphs`: a captured step
    /// needs fixed shapes); `None`: as many as were masked.
    fixed_predictions: Option<usize>,
}

/// The model's config.json (its vocabulary and positions checked against the tokenizer and
/// the block), or the from-scratch shape.
fn model_config(
    model_dir: Option<&Path>,
    s: &Settings,
    vocab: i64,
    tokenizer_dir: &Path,
    block: usize,
) -> Result<EncoderConfig> {
    Ok(match model_dir {
        Some(dir) => {
            let c = EncoderConfig::from_file(&dir.join("config.json"))?;
            if c.vocab_size != vocab {
                bail!("{} has a vocabulary of {} but the tokenizer in {} has {vocab}: use the model's own tokenizer", dir.display(), c.vocab_size, tokenizer_dir.display());
            }
            if (c.max_tokens() as usize) < block {
                bail!(
                    "max_length {block} is longer than the model's {} positions",
                    c.max_tokens()
                );
            }
            c
        }
        None => scratch_config(s, vocab),
    })
}

/// 002's objective: the next-sentence head, when the data has its labels (HDF5 shards) and the
/// model is a BERT, unless switched off.
fn next_sentence_on(
    s: &Settings,
    train: &Samples,
    vocab: i64,
    config: &EncoderConfig,
) -> Result<bool> {
    let labelled = match train.get(0, vocab) {
        Ok(Sample::Masked(s)) => s.next_sentence_label.is_some(),
        _ => false,
    };
    Ok(match s.mlm.next_sentence {
        Some(true) if !labelled => bail!("next_sentence needs data with next_sentence_labels (002's HDF5 shards); this data has none: leave next_sentence unset"),
        Some(on) => on,
        None => labelled && config.family().model_type == "bert",
    })
}

/// How blocks are masked: `s`'s probability and limit, the tokenizer's mask token, and never
/// a special token (BERT's, and whatever the tokenizer marks special: RoBERTa's <s>, </s>,
/// <pad>).
fn masking(tokenizer: &TextTokenizer, tokenizer_dir: &Path, s: &Settings) -> Result<Masking> {
    let vocab = tokenizer.vocab_size() as i64;
    let id = |t: &str| tokenizer.token_id(t);
    // BERT's [MASK], RoBERTa's <mask>.
    let mask_id = id("[MASK]").or_else(|| id("<mask>")).with_context(|| {
        format!(
            "the tokenizer in {} has no [MASK] (or <mask>) token: masked-LM training needs one (`trainbook tokenizer train` adds it)",
            tokenizer_dir.display()
        )
    })?;
    // Never masked: BERT's special tokens, and whatever the tokenizer marks special
    // (RoBERTa's <s>, </s>, <pad>).
    let mut specials: Vec<i64> = SPECIAL_TOKENS.iter().filter_map(|t| id(t)).collect();
    specials.extend(
        tokenizer
            .inner()
            .get_added_tokens_decoder()
            .iter()
            .filter(|(_, t)| t.special)
            .map(|(i, _)| i64::from(*i)),
    );
    specials.sort_unstable();
    specials.dedup();
    Ok(
        Masking::new(s.mlm.mlm_probability, mask_id, vocab, specials)?
            .with_max_predictions(s.mlm.max_predictions_per_seq),
    )
}

impl MlmRecipe {
    pub fn build(hyper: &Hyper, device: Device, log: &dyn Fn(String)) -> Result<Self> {
        let s: Settings = crate::settings(hyper)?;
        let block = s.text.max_length;
        let model_dir = match &hyper.model {
            Some(m) => Some(crate::assets::resolve_model(m)?.0),
            None => None,
        };
        let tokenizer_dir = s
            .mlm
            .tokenizer
            .clone()
            .or_else(|| model_dir.clone())
            .unwrap_or_else(crate::assets::minilm_dir);
        // Whole texts: grouping, not truncation, makes the blocks.
        let tokenizer = TextTokenizer::from_model_dir(&tokenizer_dir, 1 << 20)?;
        let vocab = tokenizer.vocab_size() as i64;
        let masking = masking(&tokenizer, &tokenizer_dir, &s)?;
        let fixed_predictions = match (hyper.cuda_graphs, s.mlm.max_predictions_per_seq) {
            (true, None) => bail!("cuda_graphs needs the same number of masked positions in every batch: set max_predictions_per_seq (BERT: 20 at 128 tokens)"),
            (graphs, max) => max.filter(|_| graphs),
        };

        // Blocks, from the prepared corpus (raw text is prepared first).
        let data = hyper.data.as_deref().context(
            "bert-mlm needs data: a .txt file, a table with a text column or a prepared corpus",
        )?;
        let t0 = std::time::Instant::now();
        let rows = (hyper.train_rows, hyper.eval_rows);
        let (train, eval) =
            mlm_source::train_and_eval(data, rows, &s.text, &tokenizer, &tokenizer_dir, log)?;
        if train.count == 0 {
            bail!("{data} gives no training sample of {block} tokens ({}): use more text or a smaller max_length", train.describe());
        }
        log(format!(
            "data: {} train / {} eval samples of {block} tokens from {data}: {}, ready in {:.1} s; vocabulary {vocab} from {}",
            train.count,
            eval.count,
            train.describe(),
            t0.elapsed().as_secs_f64(),
            tokenizer_dir.display()
        ));

        let config = model_config(model_dir.as_deref(), &s, vocab, &tokenizer_dir, block)?
            .with_dropout(hyper.dropout);
        let next_sentence = next_sentence_on(&s, &train, vocab, &config)?;
        tch::manual_seed(hyper.seed as i64);
        let mut vs = device.var_store();
        let mut model = if next_sentence {
            log("training the next-sentence head on the data's next_sentence_labels too (BertForPreTraining; --next-sentence false: masked-LM alone)".into());
            MaskedLm::with_next_sentence(&vs.root(), &config)?
        } else {
            MaskedLm::new(&vs.root(), &config)
        };
        model.set_activation_checkpointing(
            hyper
                .activation_checkpointing
                .then_some(hyper.checkpoint_layers_every),
        );
        if let Some(dir) = model_dir.as_ref().filter(|_| !s.text.from_scratch) {
            let report = load_weights(&vs, dir, &config)?;
            let class = class_of(&model, &config);
            if let Some(msg) = report.describe(class, &dir.display().to_string()) {
                msg.lines().for_each(|l| log(l.to_string()));
            }
        }
        device.place_vars(&mut vs)?;
        Ok(Self {
            vs,
            model,
            config,
            tokenizer_dir,
            masking,
            train,
            eval,
            seed: hyper.seed,
            epoch: Cell::new(0),
            device,
            fixed_predictions,
        })
    }

    /// Masked inputs and labels of blocks `indices`: this epoch's masks in training, one fixed
    /// mask in evaluation (so epochs are compared on the same task).
    fn batch(&self, split: Split, indices: &[usize]) -> Result<Batch> {
        let (samples, epoch) = match split {
            Split::Train => (&self.train, self.epoch.get()),
            Split::Eval => (&self.eval, u64::MAX),
        };
        let (mut input, mut labels) = (Vec::new(), Vec::new());
        let (mut mask, mut types, mut next) = (Vec::new(), Vec::new(), Vec::new());
        for &i in indices {
            match samples.get(i, self.masking.vocab_size)? {
                Sample::Block(block) => {
                    let (x, y) = self.masking.apply(&block, self.seed, epoch, i);
                    input.extend(x);
                    labels.extend(y);
                }
                Sample::Masked(s) => {
                    input.extend(s.input_ids);
                    labels.extend(s.labels);
                    mask.extend(s.input_mask);
                    types.extend(s.segment_ids);
                    next.extend(s.next_sentence_label);
                }
            }
        }
        // A batch with nothing selected has no loss; predict one token as itself (it happens
        // about never at BERT's sizes, but a tiny block must not end a run).
        if labels.iter().all(|&l| l == IGNORE_INDEX) {
            if let Some(i) = input
                .iter()
                .position(|t| !self.masking.specials.contains(t))
            {
                labels[i] = input[i];
            }
        }
        let (mut positions, mut labels) = masked_positions(&labels);
        if let Some(per_block) = self.fixed_predictions {
            let room = per_block * indices.len();
            if positions.len() > room {
                bail!("a batch has {} masked positions, more than the {room} its CUDA graph holds (max_predictions_per_seq {per_block} x {} blocks): the data was masked with more predictions per block; raise max_predictions_per_seq", positions.len(), indices.len());
            }
            // Padding predicts position 0 with the ignored label: the loss and accuracy skip it.
            positions.resize(room, 0);
            labels.resize(room, IGNORE_INDEX);
        }
        // Page-locked on CUDA, so the copies to the device are queued, not waited for.
        let d = self.device;
        let shape = [indices.len() as i64, -1];
        let tensor = |v: &[i64]| (!v.is_empty()).then(|| d.pin(Tensor::from_slice(v).view(shape)));
        Ok(Batch {
            input: d.pin(Tensor::from_slice(&input).view(shape)),
            positions: d.pin(Tensor::from_slice(&positions)),
            labels: d.pin(Tensor::from_slice(&labels)),
            attention_mask: tensor(&mask),
            token_types: tensor(&types),
            next_sentence: (self.model.has_next_sentence() && next.len() == indices.len())
                .then(|| d.pin(Tensor::from_slice(&next))),
        })
    }
}

impl StagedStep for MlmRecipe {
    /// ids, masked positions, their labels, then the attention mask and segment ids when the
    /// data brings them (HDF5 shards), then the next-sentence labels when that head trains.
    fn inputs(&self, split: Split, indices: &[usize]) -> Result<Vec<Tensor>> {
        let b = self.batch(split, indices)?;
        let mut v = vec![b.input, b.positions, b.labels];
        v.extend(b.attention_mask.into_iter().chain(b.token_types));
        v.extend(b.next_sentence);
        Ok(v)
    }

    fn compute(&self, inputs: &[Tensor], train: bool) -> Result<Step> {
        let (input, positions, labels, mask, types, next) = match inputs {
            [i, p, l] => (i, p, l, None, None, None),
            [i, p, l, m, t] => (i, p, l, Some(m), Some(t), None),
            [i, p, l, m, t, n] => (i, p, l, Some(m), Some(t), Some(n)),
            _ => bail!(
                "a masked-LM step takes 3, 5 or 6 inputs, not {}",
                inputs.len()
            ),
        };
        let (logits, next_logits) = self
            .model
            .forward_pretraining(input, mask, types, positions, train);
        let logits = logits.to_kind(Kind::Float);
        let mut loss = logits.cross_entropy_for_logits(labels);
        let mut metrics = Vec::new();
        if let (Some(n), Some(nl)) = (next, next_logits) {
            // BertForPreTraining's loss: the two cross-entropies summed.
            let nl = nl.to_kind(Kind::Float);
            loss = loss + nl.cross_entropy_for_logits(n);
            let right = nl.argmax(-1, false).eq_tensor(n).to_kind(Kind::Float);
            metrics.push(("next_sentence_accuracy", right.mean(Kind::Float)));
        }
        // Padded positions (the ignored label) count in neither the hits nor the total.
        let valid = labels.ne(IGNORE_INDEX);
        let hits = logits
            .argmax(-1, false)
            .eq_tensor(labels)
            .logical_and(&valid)
            .to_kind(Kind::Float)
            .sum(Kind::Float);
        let accuracy = hits / valid.to_kind(Kind::Float).sum(Kind::Float);
        let step = Step::loss(loss).metric_tensor("masked_accuracy", &accuracy);
        Ok(metrics
            .iter()
            .fold(step, |step, (name, v)| step.metric_tensor(*name, v)))
    }
}

/// Transformers' class of the model: `BertForPreTraining` with the next-sentence head.
fn class_of(model: &MaskedLm, config: &EncoderConfig) -> &'static str {
    if model.has_next_sentence() {
        "BertForPreTraining"
    } else {
        config.family().classes.masked_lm
    }
}

/// A batch's tensors; HDF5 shards bring their own attention mask and segment ids.
struct Batch {
    input: Tensor,
    /// The masked tokens' flat positions and their labels ([`masked_positions`]).
    positions: Tensor,
    labels: Tensor,
    attention_mask: Option<Tensor>,
    token_types: Option<Tensor>,
    /// 002's next-sentence labels, when the head is trained.
    next_sentence: Option<Tensor>,
}

impl Recipe for MlmRecipe {
    fn vars(&self) -> &nn::VarStore {
        &self.vs
    }
    fn vars_mut(&mut self) -> &mut nn::VarStore {
        &mut self.vs
    }
    fn train_len(&self) -> usize {
        self.train.count
    }
    fn eval_len(&self) -> usize {
        self.eval.count
    }
    fn prefetch(&self, split: Split, epoch: u64, _batches: &[&[usize]]) {
        if split == Split::Train {
            self.epoch.set(epoch);
        }
    }
    fn step(&self, split: Split, indices: &[usize], train: bool) -> Result<Step> {
        let inputs = self.inputs(split, indices)?;
        let d = self.device;
        let on_device = inputs
            .iter()
            .map(|t| d.put(t))
            .collect::<Result<Vec<_>>>()?;
        self.compute(&on_device, train)
    }
    fn perplexity(&self) -> bool {
        true
    }
    fn staged(&self) -> Option<&dyn StagedStep> {
        Some(self)
    }
    /// A directory the family's `…ForMaskedLM.from_pretrained` loads (the decoder is tied, as
    /// in its own checkpoints), with the tokenizer files.
    fn save_files(&self, dir: &Path) -> Result<()> {
        let class = class_of(&self.model, &self.config);
        crate::checkpoint::write_encoder_model(dir, &self.config, class, &self.tokenizer_dir)
    }
}
