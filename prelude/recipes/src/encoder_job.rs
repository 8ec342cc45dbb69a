//! What every encoder recipe (bert, token-classification, question-answering) does to start:
//! find the model directory, read its config.json as its family, make the tokenizer, and load
//! the weights (or not: `random_init`, `from_scratch`), logging what Transformers would.

use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use tch::nn;

use crate::models::encoder::{load_weights, EncoderConfig};
use crate::text::tokenizer::TextTokenizer;
use trainbook_api::plumbing::settings::TextSettings;
use trainbook_api::{Hyper, JobSpec};

/// A job's model, before its weights: the directory, its config (the tiny shape of the same
/// family with `random_init`, dropout as the job says) and tokenizer.
pub(crate) struct EncoderStart {
    pub dir: PathBuf,
    pub config: EncoderConfig,
    pub tokenizer: TextTokenizer,
    pub max_length: usize,
}

/// The model directory of a job (downloaded when the name is a Hub id and a network is there).
pub(crate) fn model_dir(hyper: &Hyper, recipe: &str, log: &dyn Fn(String)) -> Result<PathBuf> {
    let name = hyper
        .model
        .as_deref()
        .with_context(|| format!("the {recipe} recipe needs a model (a directory or a Hub id)"))?;
    let (dir, source) = crate::assets::resolve_model(name)?;
    if source == crate::assets::Source::Downloaded {
        log(format!("downloaded {name} into {}", dir.display()));
    }
    Ok(dir)
}

pub(crate) fn start(
    hyper: &Hyper,
    opts: &TextSettings,
    recipe: &str,
    log: &dyn Fn(String),
) -> Result<EncoderStart> {
    let dir = model_dir(hyper, recipe, log)?;
    let mut config = EncoderConfig::from_file(&dir.join("config.json"))?;
    let max_length = opts.max_length.min(config.max_tokens() as usize);
    let tokenizer = TextTokenizer::from_model_dir(&dir, max_length)?;
    if opts.random_init {
        config = config.tiny_of(max_length as i64);
    }
    Ok(EncoderStart {
        dir,
        config: config.with_dropout(hyper.dropout),
        tokenizer,
        max_length,
    })
}

/// Loads the directory's weights into `vs` unless the job starts from random weights; logs
/// the head the checkpoint lacked, in Transformers' words (`class`).
pub(crate) fn load(
    vs: &nn::VarStore,
    start: &EncoderStart,
    opts: &TextSettings,
    class: &str,
    log: &dyn Fn(String),
) -> Result<()> {
    if opts.random_init {
        return Ok(());
    }
    if opts.from_scratch {
        log(format!(
            "from scratch: the architecture of {} with random weights",
            start.dir.display()
        ));
        return Ok(());
    }
    let report = load_weights(vs, &start.dir, &start.config)?;
    if let Some(msg) = report.describe(class, &start.dir.display().to_string()) {
        msg.lines().for_each(|l| log(l.to_string()));
    }
    Ok(())
}

/// The checks every encoder recipe makes before a worker starts: `max_length` in range, the
/// held-out fraction, a local model read as what its config.json says.
pub(crate) fn check(spec: &JobSpec, text: &TextSettings) -> Result<()> {
    if text.max_length == 0 || text.max_length > 8192 {
        bail!(
            "max_length {} must be between 1 and 8192 tokens",
            text.max_length
        );
    }
    text.check_eval_fraction()?;
    if let Some(dir) = spec
        .train
        .model
        .as_deref()
        .map(Path::new)
        .filter(|d| d.is_dir())
    {
        EncoderConfig::from_file(&dir.join("config.json"))?;
    }
    Ok(())
}

/// Pads token sequences `(ids, type ids)` into a batch: ids, attention mask and type ids,
/// (batch, longest) each.
pub(crate) fn pad<'a>(
    rows: impl ExactSizeIterator<Item = (&'a [i64], &'a [i64])> + Clone,
    pad_id: i64,
) -> [tch::Tensor; 3] {
    let len = rows.clone().map(|r| r.0.len()).max().unwrap_or(1).max(1);
    let n = rows.len();
    let (mut ids, mut mask, mut types) = (
        vec![pad_id; n * len],
        vec![0i64; n * len],
        vec![0i64; n * len],
    );
    for (r, (i, t)) in rows.enumerate() {
        let k = i.len();
        ids[r * len..r * len + k].copy_from_slice(i);
        types[r * len..r * len + k].copy_from_slice(t);
        mask[r * len..r * len + k].fill(1);
    }
    let shape = [n as i64, len as i64];
    [ids, mask, types].map(|v| tch::Tensor::from_slice(&v).view(shape))
}

/// Where a task's data is: the files a directory may hold, and what to say when it is missing.
pub(crate) struct DataLayout {
    pub extensions: &'static [&'static str],
    pub eval_stems: &'static [&'static str],
    /// The training file to name in errors (`train.conll (or train.jsonl)`).
    pub train_name: &'static str,
    /// How to get data, for the error when `data` does not exist.
    pub hint: &'static str,
}

/// The training file and the evaluation file (if any) of `data`: a file, or a directory with
/// `train.*` and one of the layout's evaluation files. `eval_data` overrides the latter; a
/// held-out fraction replaces both.
pub(crate) fn data_files(
    data: &Path,
    text: &TextSettings,
    layout: &DataLayout,
) -> Result<(PathBuf, Option<PathBuf>)> {
    let find = |stems: &[&str]| -> Option<PathBuf> {
        stems.iter().find_map(|s| {
            layout
                .extensions
                .iter()
                .map(|e| data.join(format!("{s}.{e}")))
                .find(|p| p.is_file())
        })
    };
    let (train, test) = if data.is_dir() {
        let train = find(&["train"]).with_context(|| {
            format!(
                "{} has no {}: put the training data there, or pass a file",
                data.display(),
                layout.train_name
            )
        })?;
        (train, find(layout.eval_stems))
    } else if data.is_file() {
        (data.to_path_buf(), None)
    } else {
        bail!("{} does not exist: {}", data.display(), layout.hint);
    };
    let eval = text.eval_data.clone().or(test);
    Ok((train, eval.filter(|_| text.eval_fraction.is_none())))
}

/// Every k-th item held out for evaluation (k from the fraction, `default` when unset): the
/// same split whatever the seed, so runs stay comparable.
pub(crate) fn hold_out<T>(all: Vec<T>, fraction: Option<f64>, default: f64) -> (Vec<T>, Vec<T>) {
    let every = (1.0 / fraction.unwrap_or(default)).round().max(2.0) as usize;
    let (mut train, mut eval) = (Vec::new(), Vec::new());
    for (i, x) in all.into_iter().enumerate() {
        if i % every == every - 1 {
            eval.push(x);
        } else {
            train.push(x);
        }
    }
    (train, eval)
}

/// The trained model of a checkpoint: every weight must come from it (a task head missing
/// means the directory is not a fine-tuned model of this task; `what` says which).
pub(crate) fn load_trained(
    vs: &nn::VarStore,
    dir: &Path,
    config: &EncoderConfig,
    what: &str,
) -> Result<()> {
    let report = load_weights(vs, dir, config)?;
    if !report.missing.is_empty() {
        bail!(
            "{} lacks trained weights for {}: it is not {what}",
            dir.display(),
            report.missing.join(", ")
        );
    }
    Ok(())
}

/// Refuses the text options a task recipe does not read (columns, padding are `bert`'s), so
/// a user who sets one learns it does nothing here.
pub(crate) fn refuse_table_options(
    options: &trainbook_api::TextOptions,
    recipe: &str,
    reads: &str,
) -> Result<()> {
    let set: Vec<&str> = [
        ("text_column", options.text_column.is_some()),
        ("text_pair_column", options.text_pair_column.is_some()),
        ("label_column", options.label_column.is_some()),
        ("padding", options.padding.is_some()),
    ]
    .into_iter()
    .filter_map(|(name, given)| given.then_some(name))
    .collect();
    if !set.is_empty() {
        bail!(
            "{recipe} does not take {}: it reads {reads} (and pads each batch to its longest input); drop the option",
            set.join(", ")
        );
    }
    Ok(())
}
