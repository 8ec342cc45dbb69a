//! The on-disk layout of a prepared corpus.
//!
//! ```text
//! <dir>/prepare.json          what is being prepared (input, tokenizer, settings): written first
//! <dir>/shard-00000.json      one finished shard: its text range, token counts and checksums
//! <dir>/train-00000.tokens    the training texts' token ids, concatenated (u16 or u32, little-endian)
//! <dir>/train-00000.docs      where each text starts in that stream (u64, little-endian)
//! <dir>/eval-00000.tokens     the held-out texts (every `eval_every`-th text), the same way
//! <dir>/eval-00000.docs
//! <dir>/index.json            written last: the prepared set is complete
//! ```
//!
//! Every file is written to a temporary name and renamed, a shard's record after its files: a
//! shard without a record is unfinished and prepared again, and only a directory with
//! `index.json` is read by a job.

use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use serde::{Deserialize, Serialize};

/// Bumped when the layout changes; a job refuses other versions.
pub const FORMAT: u32 = 1;
pub const INDEX: &str = "index.json";
pub const MANIFEST: &str = "prepare.json";

/// Which texts a stream holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Split {
    Train,
    Eval,
}

impl Split {
    pub fn name(self) -> &'static str {
        match self {
            Split::Train => "train",
            Split::Eval => "eval",
        }
    }
}

/// The width of a stored token id: u16 when the vocabulary fits, else u32.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum TokenWidth {
    U16,
    U32,
}

impl TokenWidth {
    pub fn for_vocab(vocab: usize) -> Self {
        if vocab <= 1 << 16 {
            TokenWidth::U16
        } else {
            TokenWidth::U32
        }
    }
    pub fn bytes(self) -> u64 {
        match self {
            TokenWidth::U16 => 2,
            TokenWidth::U32 => 4,
        }
    }
}

/// What a preparation is of: a directory holds one, and resuming or reusing it requires the
/// same.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Manifest {
    pub format: u32,
    /// Identifies the input: each file's path, size and modification time.
    pub source: String,
    pub files: Vec<PathBuf>,
    pub column: String,
    /// Identifies the tokenizer's behaviour (vocabulary, normaliser, special tokens).
    pub tokenizer: String,
    pub tokenizer_dir: PathBuf,
    pub vocab_size: usize,
    pub width: TokenWidth,
    /// Every `eval_every`-th text (the `eval_every - 1`-th, `2 * eval_every - 1`-th, ...) is
    /// held out; 0: none.
    pub eval_every: usize,
    /// A shard is closed after the text that brings its input to this many bytes.
    pub shard_bytes: u64,
}

/// One split's part of a shard.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Part {
    pub tokens: u64,
    pub docs: u64,
    /// CRC-32C of the tokens file.
    pub crc32c: u32,
}

/// A finished shard.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ShardRecord {
    pub shard: usize,
    /// Global indices of its texts: `first..end`.
    pub first_text: u64,
    pub end_text: u64,
    pub text_bytes: u64,
    pub train: Part,
    pub eval: Part,
}

impl ShardRecord {
    pub fn part(&self, split: Split) -> &Part {
        match split {
            Split::Train => &self.train,
            Split::Eval => &self.eval,
        }
    }
}

/// A complete prepared corpus.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Index {
    pub manifest: Manifest,
    pub texts: u64,
    pub text_bytes: u64,
    pub train_tokens: u64,
    pub eval_tokens: u64,
    pub seconds: f64,
    pub shards: Vec<ShardRecord>,
}

pub fn shard_record_path(dir: &Path, shard: usize) -> PathBuf {
    dir.join(format!("shard-{shard:05}.json"))
}

pub fn tokens_path(dir: &Path, split: Split, shard: usize) -> PathBuf {
    dir.join(format!("{}-{shard:05}.tokens", split.name()))
}

pub fn docs_path(dir: &Path, split: Split, shard: usize) -> PathBuf {
    dir.join(format!("{}-{shard:05}.docs", split.name()))
}

pub fn read_json<T: serde::de::DeserializeOwned>(path: &Path) -> Result<T> {
    let bytes = std::fs::read(path).with_context(|| format!("reading {}", path.display()))?;
    serde_json::from_slice(&bytes).with_context(|| {
        format!(
            "{} is not a trainbook prepared-corpus file (damaged, or written by another version): run `trainbook prepare` again",
            path.display()
        )
    })
}

/// Whether `dir` is (or is becoming) a prepared corpus rather than raw text.
pub fn is_prepared(dir: &Path) -> bool {
    is_set(dir, INDEX, MANIFEST)
}

/// Whether `dir` holds a prepared set's `index` or (while it is prepared) its `manifest`.
pub(crate) fn is_set(dir: &Path, index: &str, manifest: &str) -> bool {
    dir.join(index).is_file() || dir.join(manifest).is_file()
}

/// The `index` of the complete prepared set in `dir`: else the error `unfinished` when only its
/// `manifest` is there (its preparation was stopped), `missing` when neither is.
pub(crate) fn read_complete<T: serde::de::DeserializeOwned>(
    dir: &Path,
    (index, manifest): (&str, &str),
    unfinished: &str,
    missing: &str,
) -> Result<T> {
    let path = dir.join(index);
    if !path.is_file() {
        if dir.join(manifest).is_file() {
            bail!("{} {unfinished}", dir.display());
        }
        bail!("{} {missing}", dir.display());
    }
    read_json(&path)
}

/// The index of the complete prepared corpus in `dir`.
pub fn read_index(dir: &Path) -> Result<Index> {
    let index: Index = read_complete(
        dir,
        (INDEX, MANIFEST),
        "is an unfinished prepared corpus (its preparation was stopped): run the same `trainbook prepare` again to finish it",
        &format!(
            "is not a prepared corpus (no {INDEX}): make one with `trainbook prepare --data <corpus> --out {}`",
            dir.display()
        ),
    )?;
    if index.manifest.format != FORMAT {
        bail!(
            "{} was prepared in format {} but this trainbook reads format {FORMAT}: prepare it again",
            dir.display(),
            index.manifest.format
        );
    }
    Ok(index)
}
