//! Training a BERT WordPiece tokenizer from raw text, the first step of pre-training (reference
//! 003 trains one before the model): [`TokenizerTrainer`] in notebooks and programs,
//! `trainbook tokenizer train` in a terminal; both end in the same runtime call.

use std::path::{Path, PathBuf};

use anyhow::Result;

use crate::runtime::port;

/// What to train a WordPiece vocabulary on, and how. Defaults are Hugging Face's
/// `BertWordPieceTokenizer.train` settings (vocabulary 30,522, min frequency 2, uncased,
/// alphabet limit 1000) on the offline Brown corpus (1M words of English, 15 genres).
///
/// ```ignore
/// let tok = TokenizerTrainer::new().data("corpus.txt").vocab_size(8000).train("my-tokenizer")?;
/// tok.vocab_txt; // my-tokenizer/vocab.txt, beside tokenizer.json
/// ```
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct TokenizerTrainer {
    /// Text sources, read in order: `.txt` files (a text per non-empty line) or data tables
    /// (`.parquet`, `.csv`, `.tsv`, `.jsonl`). Empty: the offline Brown corpus.
    pub data: Vec<PathBuf>,
    /// The text column of tables (default `text`).
    pub text_column: Option<String>,
    pub vocab_size: usize,
    pub min_frequency: u64,
    pub lowercase: bool,
    pub limit_alphabet: usize,
}

impl Default for TokenizerTrainer {
    fn default() -> Self {
        TokenizerTrainer {
            data: Vec::new(),
            text_column: None,
            vocab_size: 30_522,
            min_frequency: 2,
            lowercase: true,
            limit_alphabet: 1000,
        }
    }
}

impl TokenizerTrainer {
    pub fn new() -> Self {
        Self::default()
    }
    /// Adds a text source (call again for more).
    pub fn data(mut self, path: impl Into<PathBuf>) -> Self {
        self.data.push(path.into());
        self
    }
    /// The text column of the tables (default `text`).
    pub fn text_column(mut self, name: impl Into<String>) -> Self {
        self.text_column = Some(name.into());
        self
    }
    /// Tokens in the vocabulary, the 5 special tokens and the alphabet included.
    pub fn vocab_size(mut self, n: usize) -> Self {
        self.vocab_size = n;
        self
    }
    /// Pieces are merged only if the pair occurs at least this often.
    pub fn min_frequency(mut self, n: u64) -> Self {
        self.min_frequency = n;
        self
    }
    /// Keeps case and accents (a cased model); the default lowercases, as uncased BERT.
    pub fn cased(mut self) -> Self {
        self.lowercase = false;
        self
    }
    /// Characters kept in the initial alphabet, the most frequent first.
    pub fn limit_alphabet(mut self, n: usize) -> Self {
        self.limit_alphabet = n;
        self
    }
    /// Trains and writes `tokenizer.json` and `vocab.txt` into `out` (created); a BERT model
    /// directory uses them when they sit beside its `config.json` and weights.
    pub fn train(&self, out: impl AsRef<Path>) -> Result<TrainedTokenizer> {
        port::<dyn Tokenizers>()?.train_tokenizer(self, out.as_ref())
    }
}

/// The engine's side of tokenizers. The `trainbook` crate implements it (see `crate::runtime`).
pub trait Tokenizers: Send + Sync {
    /// Trains a WordPiece tokenizer and writes it into `out`.
    fn train_tokenizer(&self, spec: &TokenizerTrainer, out: &Path) -> Result<TrainedTokenizer>;
}

/// A trained tokenizer on disk.
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct TrainedTokenizer {
    pub dir: PathBuf,
    pub tokenizer_json: PathBuf,
    pub vocab_txt: PathBuf,
    /// Tokens in the vocabulary (at most the asked size: a small corpus gives fewer).
    pub vocab_size: usize,
    /// Texts it was trained on.
    pub texts: usize,
    pub seconds: f64,
    /// The first text as the tokenizer splits it (`[CLS] a ##b ... [SEP]`).
    pub example: Vec<String>,
}
