//! Training a BERT WordPiece tokenizer from raw text, as Hugging Face's `tokenizers` does it
//! (the same crate does the work; this module builds BERT's pipeline around its trainer and
//! reads trainbook's text sources).
//!
//! The pipeline is BERT's: `BertNormalizer` (clean text, split CJK characters, lowercase unless
//! cased, accents stripped when lowercasing), `BertPreTokenizer` (whitespace and punctuation),
//! the WordPiece model with `##` continuation pieces and `[UNK]`, `[CLS] a [SEP]` post-processing.
//! The trainer's settings default to those of Hugging Face's `BertWordPieceTokenizer.train`
//! (special tokens `[PAD] [UNK] [CLS] [SEP] [MASK]`, alphabet limit 1000), so a vocabulary
//! trained here equals the one Python's `tokenizers` learns from the same texts
//! (tests/fixtures/make_wordpiece_vocab.py makes the fixture that pins it).

use std::path::{Path, PathBuf};

use anyhow::{anyhow, bail, Context, Result};
use tokenizers::models::wordpiece::{WordPiece, WordPieceTrainer};
use tokenizers::models::TrainerWrapper;
use tokenizers::normalizers::bert::BertNormalizer;
use tokenizers::pre_tokenizers::bert::BertPreTokenizer;
use tokenizers::{AddedToken, Model, Tokenizer};

use super::dataset::read_table;
use super::tokenizer::bert_pipeline;

/// BERT's special tokens, in the order that gives them ids 0–4.
pub const SPECIAL_TOKENS: [&str; 5] = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"];

/// How to train a WordPiece vocabulary.
#[derive(Clone, Debug, PartialEq)]
pub struct WordPieceSettings {
    /// Tokens in the vocabulary, special tokens and the alphabet included (BERT: 30,522;
    /// reference 003: 32,000).
    pub vocab_size: usize,
    /// A pair of pieces is merged only if it occurs at least this often.
    pub min_frequency: u64,
    /// Lowercase (and strip accents), as uncased BERT models do.
    pub lowercase: bool,
    /// Characters kept in the initial alphabet, the most frequent first.
    pub limit_alphabet: usize,
}

impl Default for WordPieceSettings {
    fn default() -> Self {
        WordPieceSettings {
            vocab_size: 30_522,
            min_frequency: 2,
            lowercase: true,
            limit_alphabet: 1000,
        }
    }
}

impl WordPieceSettings {
    fn check(&self) -> Result<()> {
        if self.vocab_size < SPECIAL_TOKENS.len() + 1 {
            bail!(
                "vocab_size {} is too small: it must hold the {} special tokens and some text (BERT uses 30522)",
                self.vocab_size,
                SPECIAL_TOKENS.len()
            );
        }
        if self.limit_alphabet == 0 {
            bail!("limit_alphabet 0 keeps no characters: use 1000, as BERT's trainer does");
        }
        Ok(())
    }
}

/// Trains a WordPiece vocabulary on `texts`. As with Hugging Face's trainer, the vocabulary is
/// the same from run to run but the ids of the `##` alphabet and of merges with equal counts
/// are not (the trainer walks hash maps): keep the saved files with the model trained on them.
pub fn train<I, S>(texts: I, settings: &WordPieceSettings) -> Result<Tokenizer>
where
    I: Iterator<Item = S> + Send,
    S: AsRef<str> + Send,
{
    settings.check()?;
    // The untrained model has no vocabulary yet: the post-processor is added after training.
    let mut tok = Tokenizer::new(WordPiece::default());
    tok.with_normalizer(Some(BertNormalizer::new(
        true,
        true,
        None,
        settings.lowercase,
    )))
    .map_err(|e| anyhow!("setting BERT's normaliser: {e}"))?
    .with_pre_tokenizer(Some(BertPreTokenizer));
    let trainer = WordPieceTrainer::builder()
        .vocab_size(settings.vocab_size)
        .min_frequency(settings.min_frequency)
        .special_tokens(
            SPECIAL_TOKENS
                .iter()
                .map(|t| AddedToken::from(*t, true))
                .collect(),
        )
        .limit_alphabet(settings.limit_alphabet)
        .continuing_subword_prefix("##".to_string())
        .show_progress(false)
        .build();
    let mut trainer = TrainerWrapper::WordPieceTrainer(trainer);
    tok.train(&mut trainer, texts)
        .map_err(|e| anyhow!("training the WordPiece vocabulary: {e}"))?;
    // The post-processor needs the ids the special tokens got.
    let model = match tok.get_model() {
        tokenizers::models::ModelWrapper::WordPiece(wp) => wp.clone(),
        _ => unreachable!("a WordPiece tokenizer was trained"),
    };
    bert_pipeline(model, settings.lowercase)
}

/// The vocabulary in id order (`vocab.txt`'s lines).
pub fn vocab_in_order(tok: &Tokenizer) -> Vec<String> {
    let mut v: Vec<(String, u32)> = tok.get_model().get_vocab().into_iter().collect();
    v.sort_by_key(|(_, id)| *id);
    v.into_iter().map(|(t, _)| t).collect()
}

/// Writes `tokenizer.json` and `vocab.txt` into `dir` (created), each to a temporary file first,
/// then renamed, so a failed save leaves no half-written file. Returns the two paths.
pub fn save(tok: &Tokenizer, dir: &Path) -> Result<(PathBuf, PathBuf)> {
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    let json = tok
        .to_string(true)
        .map_err(|e| anyhow!("serialising the tokenizer: {e}"))?;
    let mut vocab = vocab_in_order(tok).join("\n");
    vocab.push('\n');
    let write = |name: &str, text: &str| -> Result<PathBuf> {
        let path = dir.join(name);
        let tmp = dir.join(format!(".{name}.tmp"));
        std::fs::write(&tmp, text).with_context(|| format!("writing {}", tmp.display()))?;
        std::fs::rename(&tmp, &path).with_context(|| format!("writing {}", path.display()))?;
        Ok(path)
    };
    Ok((write("tokenizer.json", &json)?, write("vocab.txt", &vocab)?))
}

/// The texts of one source: a plain-text file (`.txt`: one text per non-empty line) or a data
/// table (`.parquet`, `.csv`, `.tsv`, `.jsonl`: the `column` column, default `text`).
pub fn read_texts(path: &Path, column: Option<&str>) -> Result<Vec<String>> {
    let ext = path
        .extension()
        .and_then(|e| e.to_str())
        .unwrap_or("")
        .to_ascii_lowercase();
    if !path.exists() {
        bail!(
            "{} does not exist: give a .txt file or a data table",
            path.display()
        );
    }
    if ext == "txt" {
        let text = std::fs::read_to_string(path)
            .with_context(|| format!("reading {} (UTF-8 text)", path.display()))?;
        return Ok(text
            .lines()
            .filter(|l| !l.trim().is_empty())
            .map(str::to_string)
            .collect());
    }
    let df = read_table(path)?;
    let texts = super::corpus::source::text_column(path, &df, column.unwrap_or("text"))?;
    Ok(texts.iter().flatten().map(str::to_string).collect())
}

/// What `TokenizerTrainer::train` does: reads its sources (default: the offline Brown corpus),
/// trains, saves into `out`.
pub fn train_and_save(
    spec: &trainbook_api::TokenizerTrainer,
    out: &Path,
) -> Result<trainbook_api::TrainedTokenizer> {
    let t0 = std::time::Instant::now();
    let sources = if spec.data.is_empty() {
        let brown = crate::assets::brown_txt();
        if !brown.exists() {
            bail!("{} is missing: run `make setup` (scripts/fetch-data.sh fetches the offline corpus), or give data", brown.display());
        }
        vec![brown]
    } else {
        spec.data.clone()
    };
    let settings = WordPieceSettings {
        vocab_size: spec.vocab_size,
        min_frequency: spec.min_frequency,
        lowercase: spec.lowercase,
        limit_alphabet: spec.limit_alphabet,
    };
    let column = spec.text_column.as_deref().unwrap_or("text");
    let corpora = sources
        .iter()
        .map(|path| super::corpus::Corpus::open(path, column))
        .collect::<Result<Vec<_>>>()?;
    let (tok, texts, first) = train_streaming(corpora, &settings)?;
    let Some(first) = first else {
        bail!(
            "no text in {}: give files with text (.txt lines or a table's text column)",
            sources
                .iter()
                .map(|p| p.display().to_string())
                .collect::<Vec<_>>()
                .join(", ")
        );
    };
    let (tokenizer_json, vocab_txt) = save(&tok, out)?;
    let example = tok
        .encode(first.as_str(), true)
        .map_err(|e| anyhow!("encoding an example: {e}"))?
        .get_tokens()
        .to_vec();
    Ok(trainbook_api::TrainedTokenizer {
        dir: out.to_path_buf(),
        tokenizer_json,
        vocab_txt,
        vocab_size: tok.get_vocab_size(true),
        texts,
        seconds: t0.elapsed().as_secs_f64(),
        example,
    })
}

/// Trains on `corpora` read as a stream (a reader thread hands batches of texts through a
/// short queue), so memory holds the trainer's word counts, not the corpus. Returns the
/// tokenizer, the number of texts and the first one.
fn train_streaming(
    corpora: Vec<super::corpus::Corpus>,
    settings: &WordPieceSettings,
) -> Result<(Tokenizer, usize, Option<String>)> {
    let (tx, rx) = std::sync::mpsc::sync_channel::<Vec<String>>(4);
    let reader = std::thread::spawn(move || -> Result<(usize, Option<String>)> {
        let (mut count, mut first) = (0, None);
        for corpus in &corpora {
            corpus.for_each_batch(4 << 20, |texts, _| {
                count += texts.len();
                if first.is_none() {
                    first = texts.first().cloned();
                }
                // The trainer stopped early (an error): stop reading.
                tx.send(texts)
                    .map_err(|_| anyhow!("the tokenizer trainer stopped"))
            })?;
        }
        Ok((count, first))
    });
    let trained = train(rx.into_iter().flatten(), settings);
    let read = reader
        .join()
        .map_err(|_| anyhow!("the corpus reader thread panicked"))?;
    let tok = trained?;
    let (count, first) = read?;
    Ok((tok, count, first))
}
