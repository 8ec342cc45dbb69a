//! `question-answering`: extractive question answering (SQuAD) with any encoder family. A
//! question and its context are read in windows of `max_length` tokens overlapping by
//! `doc_stride` (long contexts), the model learns the answer's start and end tokens, and each
//! epoch reports exact match and F1 as the official SQuAD evaluation computes them, over the
//! whole evaluation set, each question answered from all its windows. SQuAD v2 data (questions
//! without an answer) also learns to answer nothing (the first token).
//!
//! Presets:
//! - `tiny`: a 2-layer random encoder of the offline model's family on 256/64 questions of the
//!   generated facts-qa set (scripts/fetch-data.sh) — seconds, for tests;
//! - `default`: the pretrained all-MiniLM-L6-v2 on all of facts-qa (2,000/300 questions), one
//!   epoch: exact match 91.0, F1 91.5 on its 300 evaluation questions, ~6 minutes on 2 CPU cores.

use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use tch::{nn, Kind, Tensor};
use trainbook_api::plumbing::settings::{QaSettings, TextSettings};
use trainbook_api::{Hyper, JobSpec, OptimizerKind, Padding, QaOptions, TextOptions};
use trainbook_engine::{Device, Recipe, Split, Step};

use crate::encoder_job::{self, EncoderStart};
use crate::models::encoder::{EncoderConfig, QuestionAnsweringModel};
use crate::text::answers;
use crate::text::squad::{self, QaExample, Window};
use crate::text::tokenizer::TextTokenizer;

/// The best spans compared per window (run_qa.py's `n_best_size`).
const N_BEST: usize = 20;
/// Held out for evaluation when the data has no dev file and no fraction is set.
const EVAL_FRACTION: f64 = 0.1;
/// Where a checkpoint keeps the settings its windows were cut with (Transformers ignores it).
const SETTINGS_KEY: &str = "trainbook_question_answering";

pub const PRESETS: &[(&str, &str)] = &[
    ("tiny", "random 2-layer encoder, 256/64 generated facts-qa questions at 128 tokens (stride 32): seconds, for tests"),
    ("default", "pretrained all-MiniLM-L6-v2 on the generated facts-qa set (2,000/300 questions), 256 tokens, stride 64, AdamW 1e-4, batch 16, 1 epoch"),
];

fn preset(name: &str) -> Result<(Hyper, TextSettings, QaSettings)> {
    let model = crate::assets::minilm_dir().display().to_string();
    let data = crate::assets::facts_qa_dir().display().to_string();
    let (epochs, lr, rows, max_length, doc_stride, random_init) = match name {
        "tiny" => (1, 1e-3, (256, 64), 128, 32, true),
        "default" => (1, 1e-4, (usize::MAX, usize::MAX), 256, 64, false),
        other => return Err(crate::unknown_preset("question-answering", other, PRESETS)),
    };
    let hyper = Hyper {
        model: Some(model),
        data: Some(data),
        train_rows: (rows.0 != usize::MAX).then_some(rows.0),
        eval_rows: (rows.1 != usize::MAX).then_some(rows.1),
        ..Hyper::new(name, epochs, 16, lr, OptimizerKind::Adamw)
    };
    let text = TextSettings {
        max_length,
        padding: Padding::Dynamic,
        text_column: "context".into(),
        label_column: "answers".into(),
        text_pair_column: None,
        eval_fraction: None,
        eval_data: None,
        from_scratch: false,
        random_init,
    };
    let qa = QaSettings {
        doc_stride,
        max_answer_length: 30,
        null_threshold: 0.0,
    };
    Ok((hyper, text, qa))
}

/// The preset with the job's options; the data read and checked (answers against their
/// contexts, questions against `max_length`) before any worker starts.
pub fn resolve(spec: &JobSpec) -> Result<Hyper> {
    let name = spec
        .train
        .preset
        .clone()
        .unwrap_or_else(|| "default".into());
    let (mut hyper, text, qa) = preset(&name)?;
    let (t, q): (TextOptions, QaOptions) = spec.recipe_options_pair()?;
    encoder_job::refuse_table_options(
        &t,
        "question-answering",
        "SQuAD questions, contexts and answers",
    )?;
    let mut text = text.with_overrides(&t);
    let qa = qa.with_overrides(&q);
    text.random_init &= spec.train.model.is_none();
    encoder_job::check(spec, &text)?;
    if qa.doc_stride == 0 || qa.doc_stride >= text.max_length {
        bail!(
            "doc_stride {} must be between 1 and max_length {} (run_qa.py uses 128 at 384)",
            qa.doc_stride,
            text.max_length
        );
    }
    let data = spec.train.data.clone().or(hyper.data.clone()).context(
        "question-answering needs data: a SQuAD JSON or jsonl file, or a directory with train and dev files",
    )?;
    let (train, eval) = read_sets(
        &encoder_job::data_files(Path::new(&data), &text, &DATA)?,
        text.eval_fraction,
    )?;
    // Every question must leave room for its context: checked with the model's tokenizer
    // when the model is on this machine.
    let model = spec.train.model.clone().or(hyper.model.clone());
    if let Some(dir) = model
        .map(PathBuf::from)
        .filter(|d| d.join("config.json").is_file())
    {
        let c = EncoderConfig::from_file(&dir.join("config.json"))?;
        let tok =
            TextTokenizer::from_model_dir(&dir, text.max_length.min(c.max_tokens() as usize))?;
        for e in train.iter().chain(&eval) {
            let question_only = QaExample {
                context: ".".into(),
                answers: Vec::new(),
                ..e.clone()
            };
            squad::windows(tok.inner(), &question_only, tok.max_length(), qa.doc_stride)?;
        }
    }
    let mut options = crate::settings_map(&text)?;
    options.extend(crate::settings_map(&qa)?);
    hyper.recipe_options = options;
    Ok(hyper)
}

/// Where questions are.
const DATA: encoder_job::DataLayout = encoder_job::DataLayout {
    extensions: &["json", "jsonl"],
    eval_stems: &["dev", "validation", "test"],
    train_name: "train.json (or train.jsonl)",
    hint: "pass a SQuAD JSON or jsonl file (run `make setup` for the offline facts-qa data)",
};

/// Training and evaluation examples: the evaluation file, else every k-th example held out.
fn read_sets(
    files: &(PathBuf, Option<PathBuf>),
    fraction: Option<f64>,
) -> Result<(Vec<QaExample>, Vec<QaExample>)> {
    let all = squad::read(&files.0)?;
    if all.is_empty() {
        bail!("{} has no question", files.0.display());
    }
    Ok(match &files.1 {
        Some(eval) => (all, squad::read(eval)?),
        None => encoder_job::hold_out(all, fraction, EVAL_FRACTION),
    })
}

/// The memory plan: the encoder with a span head, `max_length` tokens.
pub fn footprint(
    hyper: &Hyper,
    layout: &trainbook_engine::Layout,
) -> Result<trainbook_api::Footprint> {
    let text: TextSettings = crate::settings(hyper)?;
    let dir = encoder_job::model_dir(hyper, "question-answering", &|_| {})?;
    let mut c = EncoderConfig::from_file(&dir.join("config.json"))?;
    let max_length = text.max_length.min(c.max_tokens() as usize);
    if text.random_init {
        c = c.tiny_of(max_length as i64);
    }
    Ok(crate::models::encoder::plan_footprint(
        &c,
        crate::models::encoder::Head::Classifier(2),
        max_length as u64,
        hyper,
        layout,
    ))
}

pub struct QaRecipe {
    vs: nn::VarStore,
    model: QuestionAnsweringModel,
    start: EncoderStart,
    qa: QaSettings,
    /// SQuAD v2 data: unanswered questions are answers too.
    v2: bool,
    train: Vec<Window>,
    eval: Vec<(QaExample, Vec<Window>)>,
    pad_id: i64,
    device: Device,
}

impl QaRecipe {
    pub fn build(hyper: &Hyper, device: Device, log: &dyn Fn(String)) -> Result<Self> {
        let text: TextSettings = crate::settings(hyper)?;
        let qa: QaSettings = crate::settings(hyper)?;
        let data = hyper
            .data
            .as_deref()
            .context("question-answering needs data")?;
        let files = encoder_job::data_files(Path::new(data), &text, &DATA)?;
        let (train, eval) = read_sets(&files, text.eval_fraction)?;
        let train: Vec<_> = train
            .into_iter()
            .take(hyper.train_rows.unwrap_or(usize::MAX))
            .collect();
        let eval: Vec<_> = eval
            .into_iter()
            .take(hyper.eval_rows.unwrap_or(usize::MAX))
            .collect();
        let v2 = train.iter().chain(&eval).any(|e| !e.is_answerable());
        let mut start = encoder_job::start(hyper, &text, "question-answering", log)?;
        let tok = start.tokenizer.inner();
        let windows = squad::windows_all(tok, &train, start.max_length, qa.doc_stride)?;
        let mut eval_windows = Vec::with_capacity(eval.len());
        for e in eval {
            let w = squad::windows(tok, &e, start.max_length, qa.doc_stride)?;
            eval_windows.push((e, w));
        }
        log(format!(
            "data: {} train questions ({} windows of at most {} tokens, stride {}) / {} eval questions from {}{}",
            train.len(),
            windows.len(),
            start.max_length,
            qa.doc_stride,
            eval_windows.len(),
            files.0.display(),
            if v2 { " (SQuAD v2: some unanswerable)" } else { "" }
        ));
        start.config.extra.insert(
            SETTINGS_KEY.into(),
            serde_json::json!({
                "max_length": start.max_length,
                "doc_stride": qa.doc_stride,
                "max_answer_length": qa.max_answer_length,
                "null_threshold": v2.then_some(qa.null_threshold),
            }),
        );
        tch::manual_seed(hyper.seed as i64);
        let mut vs = device.var_store();
        let mut model = QuestionAnsweringModel::new(&vs.root(), &start.config);
        model.set_activation_checkpointing(
            hyper
                .activation_checkpointing
                .then_some(hyper.checkpoint_layers_every),
        );
        let class = start.config.family().classes.question_answering;
        encoder_job::load(&vs, &start, &text, class, log)?;
        device.place_vars(&mut vs)?;
        Ok(Self {
            vs,
            model,
            pad_id: start.tokenizer.pad_id(),
            start,
            qa,
            v2,
            train: windows,
            eval: eval_windows,
            device,
        })
    }

    /// (start logits, end logits) of windows, as (windows, longest) float tensors.
    fn logits(&self, windows: &[&Window], train: bool) -> Result<(Tensor, Tensor)> {
        let d = self.device;
        let [ids, mask, types] = encoder_job::pad(
            windows.iter().map(|w| (&w.ids[..], &w.type_ids[..])),
            self.pad_id,
        );
        let (s, e) = self.model.forward(
            &d.put(&ids)?,
            Some(&d.put(&mask)?),
            Some(&d.put(&types)?),
            train,
        );
        Ok((s.to_kind(Kind::Float), e.to_kind(Kind::Float)))
    }

    /// The span loss (run_qa.py's: the mean of the start and end cross-entropies).
    fn loss(&self, windows: &[&Window], start: &Tensor, end: &Tensor) -> Result<Tensor> {
        let (s, e): (Vec<i64>, Vec<i64>) = windows
            .iter()
            .map(|w| (w.answer_tokens.0 as i64, w.answer_tokens.1 as i64))
            .unzip();
        let d = self.device;
        let (s, e) = (
            d.put(&Tensor::from_slice(&s))?,
            d.put(&Tensor::from_slice(&e))?,
        );
        Ok((start.cross_entropy_for_logits(&s) + end.cross_entropy_for_logits(&e)) / 2.0)
    }
}

impl Recipe for QaRecipe {
    fn vars(&self) -> &nn::VarStore {
        &self.vs
    }
    fn vars_mut(&mut self) -> &mut nn::VarStore {
        &mut self.vs
    }
    fn train_len(&self) -> usize {
        self.train.len()
    }
    fn eval_len(&self) -> usize {
        self.eval.len()
    }
    fn step(&self, split: Split, indices: &[usize], train: bool) -> Result<Step> {
        if split == Split::Train {
            let windows: Vec<&Window> = indices.iter().map(|&i| &self.train[i]).collect();
            let (s, e) = self.logits(&windows, train)?;
            return Ok(Step::loss(self.loss(&windows, &s, &e)?));
        }
        // Evaluation: each question answered from all of its windows.
        let examples: Vec<&(QaExample, Vec<Window>)> =
            indices.iter().map(|&i| &self.eval[i]).collect();
        let windows: Vec<&Window> = examples.iter().flat_map(|(_, w)| w).collect();
        let (s, e) = self.logits(&windows, false)?;
        let loss = self.loss(&windows, &s, &e)?;
        let starts = Vec::<Vec<f32>>::try_from(s.to_device(tch::Device::Cpu))?;
        let ends = Vec::<Vec<f32>>::try_from(e.to_device(tch::Device::Cpu))?;
        let (mut em, mut f1, mut row) = (0.0, 0.0, 0);
        for (example, ws) in examples {
            let logits: Vec<(&[f32], &[f32])> = (row..row + ws.len())
                .map(|r| (&starts[r][..], &ends[r][..]))
                .collect();
            row += ws.len();
            let p = squad::predict(
                example,
                ws,
                &logits,
                self.qa.max_answer_length,
                N_BEST,
                self.v2.then_some(self.qa.null_threshold as f32),
            )?;
            let golds: Vec<&str> = example.answers.iter().map(|a| a.text.as_str()).collect();
            let (m, f) = answers::best(&p.text, &golds);
            em += m;
            f1 += f;
        }
        let n = indices.len() as f64;
        Ok(Step::loss(loss)
            .ratio("exact_match", 100.0 * em, n)
            .ratio("f1", 100.0 * f1, n))
    }
    /// A directory the family's `…ForQuestionAnswering.from_pretrained` loads, with the
    /// tokenizer files and the window settings.
    fn save_files(&self, dir: &Path) -> Result<()> {
        let class = self.start.config.family().classes.question_answering;
        crate::checkpoint::write_encoder_model(dir, &self.start.config, class, &self.start.dir)
    }
}

/// A trained question-answering model, for answering in a cell (`QuestionAnswerer`).
pub struct Answerer {
    _vs: nn::VarStore,
    model: QuestionAnsweringModel,
    tokenizer: TextTokenizer,
    doc_stride: usize,
    max_answer_length: usize,
    null_threshold: Option<f32>,
    dir: PathBuf,
}

impl Answerer {
    /// Loads a checkpoint (or exported directory) of a question-answering job, or any
    /// `…ForQuestionAnswering` directory (windows of 384 tokens, stride 128, as run_qa.py).
    pub fn load(dir: impl AsRef<Path>) -> Result<Self> {
        let dir = dir.as_ref();
        let config = EncoderConfig::from_file(&dir.join("config.json"))?;
        let saved = config.extra.get(SETTINGS_KEY).cloned().unwrap_or_default();
        let get = |k: &str, default: u64| {
            saved.get(k).and_then(|v| v.as_u64()).unwrap_or(default) as usize
        };
        let max_length = get("max_length", 384).min(config.max_tokens() as usize);
        let tokenizer = TextTokenizer::from_model_dir(dir, max_length)?;
        let vs = nn::VarStore::new(tch::Device::Cpu);
        let model = QuestionAnsweringModel::new(&vs.root(), &config);
        encoder_job::load_trained(
            &vs,
            dir,
            &config,
            "a question-answering model (train one with `trainbook train question-answering`)",
        )?;
        Ok(Self {
            _vs: vs,
            model,
            tokenizer,
            doc_stride: get("doc_stride", 128).min(max_length / 2),
            max_answer_length: get("max_answer_length", 30),
            null_threshold: saved
                .get("null_threshold")
                .and_then(|v| v.as_f64())
                .map(|t| t as f32),
            dir: dir.to_path_buf(),
        })
    }
}

impl trainbook_api::plumbing::ports::AnswerModel for Answerer {
    fn checkpoint(&self) -> &Path {
        &self.dir
    }

    fn answer(&self, question: &str, context: &str) -> Result<trainbook_api::Answer> {
        let example = QaExample {
            id: "question".into(),
            question: question.into(),
            context: context.into(),
            answers: Vec::new(),
        };
        let ws = squad::windows(
            self.tokenizer.inner(),
            &example,
            self.tokenizer.max_length(),
            self.doc_stride,
        )?;
        let [ids, mask, types] = encoder_job::pad(
            ws.iter().map(|w| (&w.ids[..], &w.type_ids[..])),
            self.tokenizer.pad_id(),
        );
        let (s, e) = tch::no_grad(|| self.model.forward(&ids, Some(&mask), Some(&types), false));
        let starts = Vec::<Vec<f32>>::try_from(s.to_kind(Kind::Float))?;
        let ends = Vec::<Vec<f32>>::try_from(e.to_kind(Kind::Float))?;
        let logits: Vec<(&[f32], &[f32])> = starts
            .iter()
            .zip(&ends)
            .map(|(s, e)| (&s[..], &e[..]))
            .collect();
        let p = squad::predict(
            &example,
            &ws,
            &logits,
            self.max_answer_length,
            N_BEST,
            self.null_threshold,
        )?;
        Ok(trainbook_api::Answer {
            text: p.text,
            start: p.start,
            end: p.end,
            score: f64::from(p.score),
            null_score: f64::from(p.null_score),
        })
    }
}
