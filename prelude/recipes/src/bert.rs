//! `bert`: BERT sequence classification on a text table, data-parallel.
//!
//! Presets:
//! - `tiny`: a 2-layer, hidden-64 BERT initialised at random, on a few hundred Rotten Tomatoes
//!   snippets at 32 tokens — seconds, for tests and CI.
//! - `default`: the pretrained all-MiniLM-L6-v2 on the Rotten Tomatoes snippets (the offline
//!   data set-up fetches), with the reference notebook's training settings: SGD lr 1e-3
//!   momentum 0.9, global batch 8, 10 epochs, the first 1000 train / 1000 test rows, padding to
//!   max length (128 here).
//! - `reference`: the reference notebook's exact job (bert-base-cased, yelp_review_full, 5
//!   labels, padding to 512), which needs those assets locally or a network.
//!
//! Without a preset, `reference` is chosen when its assets are already on this machine, else
//! `default`. Options (model, data, columns, rows, max length, padding) override the preset.

use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use tch::{nn, Kind, Tensor};
use trainbook_engine::Device;

use crate::encoder_job;
use crate::models::encoder::{EncoderConfig, SequenceClassifier};
use crate::text::cache;
use crate::text::dataset::{self, TextExamples};
use crate::text::tokenizer::{Encoded, Padding, TextTokenizer};
use trainbook_api::Hyper;
use trainbook_api::{JobSpec, OptimizerKind};
use trainbook_engine::{Recipe, Split, Step};

pub use trainbook_api::{plumbing::settings::TextSettings, ConfigureText, TextOptions};

/// Held out for evaluation when the data has no test table and no fraction is set.
const EVAL_FRACTION: f64 = 0.2;

/// What a preset decides; the job's options go on top.
struct Preset {
    hyper: Hyper,
    text: TextSettings,
}

/// The reference notebook's assets (loaded from a local copy, the Hugging Face cache, or the
/// Hub when online).
pub const REFERENCE_MODEL: &str = "bert-base-cased";
pub const REFERENCE_DATA: &str = "yelp_review_full";

/// Presets of `trainbook train bert --preset NAME`.
pub const PRESETS: &[(&str, &str)] = &[
    ("tiny", "random 2-layer hidden-64 BERT, 512/256 Rotten Tomatoes snippets at 32 tokens: seconds, for tests"),
    ("default", "pretrained all-MiniLM-L6-v2 on Rotten Tomatoes with the reference's settings (SGD 1e-3 m0.9, batch 8, 10 epochs, first 1000/1000 rows)"),
    ("reference", "the reference notebook's exact job: bert-base-cased on yelp_review_full (5 labels), max length 512"),
];

fn preset(name: &str) -> Result<Preset> {
    let minilm = crate::assets::minilm_dir().display().to_string();
    let rt = crate::assets::rotten_tomatoes_csv().display().to_string();
    let text = |max_length, random_init| TextSettings {
        max_length,
        padding: Padding::MaxLength,
        text_column: "text".into(),
        label_column: "label".into(),
        eval_fraction: None,
        eval_data: None,
        text_pair_column: None,
        from_scratch: false,
        random_init,
    };
    let hyper = |epochs, batch, optimizer, model: &str, data: &str, rows: (usize, usize)| Hyper {
        model: Some(model.to_string()),
        data: Some(data.to_string()),
        train_rows: Some(rows.0),
        eval_rows: Some(rows.1),
        ..Hyper::new(name, epochs, batch, 1e-3, optimizer)
    };
    Ok(match name {
        "tiny" => Preset {
            hyper: hyper(1, 16, OptimizerKind::Adamw, &minilm, &rt, (512, 256)),
            text: text(32, true),
        },
        "default" => Preset {
            hyper: hyper(10, 8, OptimizerKind::Sgd, &minilm, &rt, (1000, 1000)),
            text: text(128, false),
        },
        "reference" => Preset {
            hyper: hyper(
                10,
                8,
                OptimizerKind::Sgd,
                REFERENCE_MODEL,
                REFERENCE_DATA,
                (1000, 1000),
            ),
            text: text(512, false),
        },
        other => return Err(crate::unknown_preset("bert", other, PRESETS)),
    })
}

/// The job's preset with its text options resolved (see [`trainbook_engine::PresetFn`]):
/// no model or data is loaded, but a missing offline model or an out-of-range option fails
/// here, before any worker starts.
pub fn resolve(spec: &JobSpec) -> Result<Hyper> {
    let name = spec
        .train
        .preset
        .clone()
        .unwrap_or_else(|| auto_preset().to_string());
    let p = preset(&name)?;
    let options: TextOptions = spec.recipe_options()?;
    let mut text = p.text.with_overrides(&options);
    // A model the user names is loaded with its weights.
    text.random_init &= spec.train.model.is_none();
    // A local model is read as what its config.json says it is (a causal LM is refused here,
    // naming its recipe), before any worker starts.
    encoder_job::check(spec, &text)?;
    if spec.train.model.is_none()
        && name != "reference"
        && !crate::assets::minilm_dir().join("config.json").exists()
    {
        bail!("{} is missing: run `make setup` (scripts/fetch-data.sh fetches the offline model and data)", crate::assets::minilm_dir().display());
    }
    let mut hyper = p.hyper;
    hyper.recipe_options = crate::settings_map(&text)?;
    Ok(hyper)
}

/// With no preset named: the reference job when its model and data are already on this
/// machine, else the offline default (no download is attempted for the choice).
pub fn auto_preset() -> &'static str {
    if crate::assets::find_local_model(REFERENCE_MODEL).is_some()
        && crate::assets::find_local_dataset(REFERENCE_DATA).is_some()
    {
        "reference"
    } else {
        "default"
    }
}

/// The file of the training table a BERT job with these hyper-parameters reads, found as the
/// job would find it but without loading a model or the table.
pub fn training_file(hyper: &Hyper) -> Result<PathBuf> {
    Ok(crate::assets::resolve_dataset(data_of(hyper)?)?.train)
}

fn data_of(hyper: &Hyper) -> Result<&str> {
    hyper
        .data
        .as_deref()
        .context("the bert recipe needs data (a table, a directory or a dataset id)")
}

pub struct BertRecipe {
    vs: nn::VarStore,
    model: SequenceClassifier,
    config: EncoderConfig,
    tokenizer: TextTokenizer,
    model_dir: PathBuf,
    padding: Padding,
    train: (Vec<Encoded>, Tensor),
    eval: (Vec<Encoded>, Tensor),
    device: Device,
}

fn encode(
    tok: &TextTokenizer,
    ex: &TextExamples,
    log: &dyn Fn(String),
) -> Result<(Vec<Encoded>, Tensor)> {
    let texts: Vec<&str> = ex.texts.iter().map(String::as_str).collect();
    let pairs: Vec<&str> = ex.pairs.iter().map(String::as_str).collect();
    let pairs = (!ex.pairs.is_empty()).then_some(pairs.as_slice());
    let t0 = std::time::Instant::now();
    let (enc, hit) = cache::encode_cached(tok, &texts, pairs, &cache::cache_dir())?;
    if hit == cache::Hit::Computed && t0.elapsed().as_secs_f64() > 1.0 {
        log(format!(
            "tokenized {} texts in {:.1} s (cached for next time)",
            texts.len(),
            t0.elapsed().as_secs_f64()
        ));
    }
    Ok((enc, Tensor::from_slice(&ex.labels)))
}

/// Train and evaluation examples as the options ask: a separate test table when there is one,
/// else a fixed split (data seed 0, whatever the training seed, so runs stay comparable).
fn load_examples(
    hyper: &Hyper,
    opts: &TextSettings,
    log: &dyn Fn(String),
) -> Result<(TextExamples, TextExamples)> {
    let files = crate::assets::resolve_dataset(data_of(hyper)?)?;
    let (text_col, label_col) = (opts.text_column.as_str(), opts.label_column.as_str());
    let pair_col = opts.text_pair_column.as_deref();
    let train_all = dataset::examples(
        &dataset::read_table(&files.train)?,
        text_col,
        pair_col,
        label_col,
        None,
    )?;
    let eval_file = opts.eval_data.clone().or(files.test.clone());
    let (train, test) = match &eval_file {
        Some(f) if opts.eval_fraction.is_none() => {
            let names = train_all.label_names.clone();
            let test = dataset::examples(
                &dataset::read_table(f)?,
                text_col,
                pair_col,
                label_col,
                Some(&names),
            )?;
            (train_all, test)
        }
        _ => train_all.split(opts.eval_fraction.unwrap_or(EVAL_FRACTION), 0)?,
    };
    let train_rows = hyper.train_rows.unwrap_or(usize::MAX);
    let eval_rows = hyper.eval_rows.unwrap_or(usize::MAX);
    let (train, test) = (train.first(train_rows), test.first(eval_rows));
    if train.is_empty() {
        bail!(
            "{} has no usable training rows (text column '{text_col}', label column '{label_col}')",
            files.train.display()
        );
    }
    log(format!(
        "data: {} train / {} eval rows from {}{} (labels: {})",
        train.len(),
        test.len(),
        files.train.display(),
        match &eval_file {
            Some(f) if opts.eval_fraction.is_none() => format!(" and {}", f.display()),
            _ => format!(
                ", {:.0}% held out",
                100.0 * opts.eval_fraction.unwrap_or(EVAL_FRACTION)
            ),
        },
        train.label_names.join(", ")
    ));
    Ok((train, test))
}

/// The memory plan's view of a job: the model's config.json (or the tiny random BERT), two
/// labels (the head is small whatever their number), `max_length` tokens.
pub fn footprint(
    hyper: &Hyper,
    layout: &trainbook_engine::Layout,
) -> Result<trainbook_api::Footprint> {
    let opts: TextSettings = crate::settings(hyper)?;
    let model_name = hyper
        .model
        .as_deref()
        .context("the bert recipe needs a model (a directory or a Hub id)")?;
    let (model_dir, _) = crate::assets::resolve_model(model_name)?;
    let mut bert = EncoderConfig::from_file(&model_dir.join("config.json"))?;
    let max_length = opts.max_length.min(bert.max_tokens() as usize);
    if opts.random_init {
        bert = bert.tiny_of(max_length as i64);
    }
    Ok(crate::models::encoder::plan_footprint(
        &bert,
        crate::models::encoder::Head::Classifier(2),
        max_length as u64,
        hyper,
        layout,
    ))
}

impl BertRecipe {
    /// Loads the model and the data as `hyper` (resolved by [`resolve`]) says.
    pub fn build(hyper: &Hyper, device: Device, log: &dyn Fn(String)) -> Result<Self> {
        let opts: TextSettings = crate::settings(hyper)?;
        let (train, test) = load_examples(hyper, &opts, log)?;
        let label_names = train.label_names.clone();
        let start = encoder_job::start(hyper, &opts, "bert", log)?;
        let bert = start.config.clone().with_labels(&label_names);
        tch::manual_seed(hyper.seed as i64);
        let mut vs = device.var_store();
        let mut model = SequenceClassifier::new(&vs.root(), &bert, label_names.len() as i64);
        model.set_activation_checkpointing(
            hyper
                .activation_checkpointing
                .then_some(hyper.checkpoint_layers_every),
        );
        encoder_job::load(&vs, &start, &opts, bert.family().classes.sequence, log)?;
        device.place_vars(&mut vs)?;
        let (tokenizer, model_dir) = (start.tokenizer, start.dir);
        let train = encode(&tokenizer, &train, log)?;
        let eval = encode(&tokenizer, &test, log)?;
        Ok(Self {
            vs,
            model,
            config: bert,
            tokenizer,
            model_dir,
            padding: opts.padding,
            train,
            eval,
            device,
        })
    }
}

impl Recipe for BertRecipe {
    fn vars(&self) -> &nn::VarStore {
        &self.vs
    }
    fn vars_mut(&mut self) -> &mut nn::VarStore {
        &mut self.vs
    }
    fn train_len(&self) -> usize {
        self.train.0.len()
    }
    fn eval_len(&self) -> usize {
        self.eval.0.len()
    }
    fn step(&self, split: Split, indices: &[usize], train: bool) -> Result<Step> {
        let (enc, labels) = if split == Split::Train {
            &self.train
        } else {
            &self.eval
        };
        let items: Vec<&Encoded> = indices.iter().map(|&i| &enc[i]).collect();
        let b = self.tokenizer.pad(&items, self.padding);
        let idx: Vec<i64> = indices.iter().map(|&i| i as i64).collect();
        let d = self.device;
        let labels = d.put(&labels.index_select(0, &Tensor::from_slice(&idx)))?;
        let logits = self.model.forward(
            &d.put(&b.input_ids)?,
            Some(&d.put(&b.attention_mask)?),
            Some(&d.put(&b.token_type_ids)?),
            train,
        );
        Ok(Step::classification(logits.to_kind(Kind::Float), labels))
    }
    /// A loadable Hugging Face-style directory: weights, config.json with the labels, and the
    /// tokenizer files.
    fn save_files(&self, dir: &Path) -> Result<()> {
        let class = self.config.family().classes.sequence;
        crate::checkpoint::write_encoder_model(dir, &self.config, class, &self.model_dir)
    }
}
