//! What a causal-LM job trains on: blocks of plain text (every token predicted), or examples
//! from jsonl (prompt/completion pairs, chat conversations) whose loss covers only the
//! completion or the assistant's turns; and the batches made of either.

use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use trainbook_api::plumbing::settings::TextSettings;

use crate::models::encoder::IGNORE_INDEX;
use crate::text::chat::{self, ChatTemplate, Example, Record};
use crate::text::dataset;
use crate::text::mlm_source::{self, Sample, Samples};
use crate::text::tokenizer::TextTokenizer;

/// Held out for evaluation from jsonl examples when neither `eval_data` nor `eval_fraction` is
/// given.
pub const EVAL_FRACTION: f64 = 0.05;

/// Whether `data` holds examples rather than plain text: a `.jsonl` file whose first record
/// has `prompt` or `messages`, or a table (`.csv`, `.tsv`, `.parquet`) with `prompt` and
/// `completion` columns.
pub fn is_examples(data: &Path) -> bool {
    match data.extension().and_then(|e| e.to_str()) {
        Some("jsonl") => std::fs::read_to_string(data)
            .ok()
            .and_then(|text| {
                let first = text.lines().find(|l| !l.trim().is_empty())?.to_string();
                serde_json::from_str::<serde_json::Value>(&first).ok()
            })
            .is_some_and(|v| v.get("prompt").is_some() || v.get("messages").is_some()),
        Some("csv" | "tsv" | "parquet") => dataset::read_table(data).is_ok_and(|df| {
            let names = df.get_column_names();
            ["prompt", "completion"]
                .iter()
                .all(|c| names.iter().any(|n| n.as_str() == *c))
        }),
        _ => false,
    }
}

/// The records of an examples file: jsonl (either form), or a table's prompt and completion
/// columns (rows missing either are an error naming the row).
fn read_records(path: &Path) -> Result<Vec<Record>> {
    if path.extension().and_then(|e| e.to_str()) == Some("jsonl") {
        return chat::read_jsonl(path);
    }
    let df = dataset::read_table(path)?;
    let column = |name: &str| -> Result<Vec<Option<String>>> {
        let c = df
            .column(name)
            .with_context(|| format!("{}: no {name} column", path.display()))?;
        let s = c
            .str()
            .with_context(|| format!("{}: the {name} column must hold text", path.display()))?;
        Ok(s.iter().map(|v| v.map(str::to_string)).collect())
    };
    let (prompts, completions) = (column("prompt")?, column("completion")?);
    prompts
        .into_iter()
        .zip(completions)
        .enumerate()
        .map(|(i, pair)| match pair {
            (Some(prompt), Some(completion)) => Ok(Record::PromptCompletion { prompt, completion }),
            _ => bail!(
                "{}: row {} has no prompt or no completion",
                path.display(),
                i + 1
            ),
        })
        .collect()
}

/// One split's samples.
pub enum Split {
    /// Blocks of `max_length` tokens of a prepared corpus.
    Blocks(Samples),
    /// Encoded examples, or blocks packed from them.
    Examples(Vec<Example>),
}

impl Split {
    pub fn len(&self) -> usize {
        match self {
            Split::Blocks(s) => s.count,
            Split::Examples(e) => e.len(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Sample `k` as (input ids, labels): a block's labels are its ids.
    pub fn get(&self, k: usize, vocab: i64) -> Result<(Vec<i64>, Vec<i64>)> {
        match self {
            Split::Blocks(s) => match s.get(k, vocab)? {
                Sample::Block(b) => Ok((b.clone(), b)),
                Sample::Masked(_) => bail!("causal-lm reads plain text, not masked-LM HDF5 shards: give text, a table with a text column or a corpus prepared by `trainbook prepare`"),
            },
            Split::Examples(e) => {
                let x = &e[k];
                Ok((x.ids.clone(), x.labels.clone()))
            }
        }
    }
}

/// Encodes jsonl examples (all of one form); errors name the file and line.
pub fn encode_file(
    path: &Path,
    tokenizer: &tokenizers::Tokenizer,
    template: Option<&ChatTemplate>,
    eos: Option<i64>,
    max_length: usize,
    model_dir: &Path,
) -> Result<Vec<Example>> {
    let records = read_records(path)?;
    records
        .iter()
        .enumerate()
        .map(|(i, r)| {
            match r {
                Record::PromptCompletion { prompt, completion } => {
                    chat::encode_prompt_completion(tokenizer, prompt, completion, eos, max_length)
                }
                Record::Chat { messages } => {
                    let t = template.with_context(|| format!(
                        "{} has chat messages but the tokenizer in {} has no chat_template (tokenizer_config.json): use a model whose tokenizer has one (an -Instruct or -Chat model), or write the data as {{\"prompt\", \"completion\"}} pairs",
                        path.display(),
                        model_dir.display()
                    ))?;
                    chat::encode_chat(t, tokenizer, messages, max_length)
                }
            }
            // One line that carries the cause: a notebook shows an error's first line.
            .map_err(|e| anyhow::anyhow!("{}: record {}: {e:#}", path.display(), i + 1))
        })
        .collect()
}

/// Examples one after another, cut into blocks of `max_length` (the last, short one dropped
/// as with plain text).
pub fn pack(examples: &[Example], max_length: usize) -> Vec<Example> {
    let ids: Vec<i64> = examples
        .iter()
        .flat_map(|e| e.ids.iter().copied())
        .collect();
    let labels: Vec<i64> = examples
        .iter()
        .flat_map(|e| e.labels.iter().copied())
        .collect();
    ids.chunks_exact(max_length)
        .zip(labels.chunks_exact(max_length))
        .map(|(i, l)| Example {
            ids: i.to_vec(),
            labels: l.to_vec(),
        })
        .collect()
}

/// Every `every`-th example (from the first) held out: (train, eval).
fn hold_out(examples: Vec<Example>, fraction: f64) -> (Vec<Example>, Vec<Example>) {
    let every = (1.0 / fraction).round().max(2.0) as usize;
    let (mut train, mut eval) = (Vec::new(), Vec::new());
    for (i, e) in examples.into_iter().enumerate() {
        if i % every == every - 1 {
            eval.push(e);
        } else {
            train.push(e);
        }
    }
    (train, eval)
}

/// The samples of a job: what [`crate::causal_lm::LmRecipe`] trains and evaluates on.
pub struct Data {
    pub train: Split,
    pub eval: Split,
    pub describe: String,
}

/// Everything the data needs from the job.
pub struct Source<'a> {
    pub data: &'a str,
    pub rows: (Option<usize>, Option<usize>),
    pub text: &'a TextSettings,
    pub packing: bool,
    pub tokenizer: &'a TextTokenizer,
    pub tokenizer_dir: &'a Path,
    pub eos: Option<i64>,
}

pub fn load(s: &Source, log: &dyn Fn(String)) -> Result<Data> {
    let path = PathBuf::from(s.data);
    let block = s.text.max_length;
    if !is_examples(&path) {
        let (train, eval) = mlm_source::train_and_eval(
            s.data,
            s.rows,
            s.text,
            s.tokenizer,
            &s.tokenizer_dir.to_path_buf(),
            log,
        )?;
        let describe = format!(
            "{} train / {} eval blocks of {block} tokens from {}: {}",
            train.count,
            eval.count,
            s.data,
            train.describe()
        );
        return Ok(Data {
            train: Split::Blocks(train),
            eval: Split::Blocks(eval),
            describe,
        });
    }
    let template = ChatTemplate::from_model_dir(s.tokenizer_dir)?;
    let encode = |p: &Path| {
        encode_file(
            p,
            s.tokenizer.inner(),
            template.as_ref(),
            s.eos,
            block,
            s.tokenizer_dir,
        )
    };
    let all = encode(&path)?;
    let (train, eval) = match (&s.text.eval_data, s.text.eval_fraction) {
        (Some(e), None) => (all, encode(e)?),
        (_, f) => hold_out(all, f.unwrap_or(EVAL_FRACTION)),
    };
    let (mut train, mut eval) = if s.packing {
        (pack(&train, block), pack(&eval, block))
    } else {
        (train, eval)
    };
    train.truncate(s.rows.0.unwrap_or(usize::MAX));
    eval.truncate(s.rows.1.unwrap_or(usize::MAX));
    let trained: usize = train
        .iter()
        .map(|e| e.labels.iter().filter(|&&l| l != IGNORE_INDEX).count())
        .sum();
    let tokens: usize = train.iter().map(|e| e.ids.len()).sum();
    let describe = format!(
        "{} train / {} eval {} from {}: {tokens} tokens, {trained} of them trained on ({:.0}%)",
        train.len(),
        eval.len(),
        if s.packing {
            format!("packed blocks of {block} tokens")
        } else {
            "examples".into()
        },
        s.data,
        100.0 * trained as f64 / tokens.max(1) as f64
    );
    Ok(Data {
        train: Split::Examples(train),
        eval: Split::Examples(eval),
        describe,
    })
}

/// A batch: ids padded with `pad` to the longest sample, and the targets of each position
/// (the next token's label; [`IGNORE_INDEX`] where nothing is predicted), flat.
pub struct Batch {
    pub ids: Vec<i64>,
    pub rows: usize,
    pub width: usize,
    /// Flat positions (row-major over rows × width) that predict a token, and their targets.
    pub positions: Vec<i64>,
    pub targets: Vec<i64>,
}

/// Pads samples on the right (a causal model never attends to later positions, so padding
/// changes nothing before it) and shifts labels by one: position t predicts label t + 1.
pub fn batch(samples: &[(Vec<i64>, Vec<i64>)], pad: i64) -> Batch {
    let width = samples.iter().map(|s| s.0.len()).max().unwrap_or(0);
    let mut b = Batch {
        ids: Vec::with_capacity(samples.len() * width),
        rows: samples.len(),
        width,
        positions: Vec::new(),
        targets: Vec::new(),
    };
    for (r, (ids, labels)) in samples.iter().enumerate() {
        b.ids.extend(ids);
        b.ids.extend(std::iter::repeat_n(pad, width - ids.len()));
        for t in 0..ids.len().saturating_sub(1) {
            let target = labels[t + 1];
            if target != IGNORE_INDEX {
                b.positions.push((r * width + t) as i64);
                b.targets.push(target);
            }
        }
    }
    b
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn batches_pad_right_and_predict_the_next_labelled_token() {
        let ig = IGNORE_INDEX;
        let b = batch(
            &[
                (vec![5, 6, 7, 8], vec![ig, ig, 7, 8]),
                (vec![1, 2], vec![1, 2]),
            ],
            0,
        );
        assert_eq!(b.ids, [5, 6, 7, 8, 1, 2, 0, 0]);
        // Row 0: position 1 predicts 7, position 2 predicts 8; row 1: position 0 predicts 2.
        assert_eq!(b.positions, [1, 2, 4]);
        assert_eq!(b.targets, [7, 8, 2]);
    }

    #[test]
    fn packing_concatenates_and_drops_the_short_tail() {
        let e = |ids: &[i64]| Example {
            ids: ids.to_vec(),
            labels: ids.iter().map(|i| -i).collect(),
        };
        let packed = pack(&[e(&[1, 2, 3]), e(&[4, 5]), e(&[6])], 4);
        assert_eq!(packed.len(), 1);
        assert_eq!(packed[0].ids, [1, 2, 3, 4]);
        assert_eq!(packed[0].labels, [-1, -2, -3, -4]);
    }

    #[test]
    fn every_twentieth_example_is_held_out_by_default() {
        let ex: Vec<Example> = (0..40)
            .map(|i| Example {
                ids: vec![i],
                labels: vec![i],
            })
            .collect();
        let (train, eval) = hold_out(ex, EVAL_FRACTION);
        assert_eq!((train.len(), eval.len()), (38, 2));
        assert_eq!(eval[0].ids, [19]);
    }
}
