//! Preparing a pre-training corpus once, for every job that reads it: [`CorpusPreparer`] in
//! notebooks and programs, `trainbook prepare` in a terminal; both end in the same runtime call.
//!
//! A prepared corpus is a directory of token shards (the texts tokenised with the job's
//! tokenizer, u16 ids when the vocabulary fits) and an `index.json`; `bert-mlm` jobs given it as
//! `data` memory-map the shards, so no worker holds the corpus in memory or tokenises it again.

use std::path::{Path, PathBuf};

use anyhow::Result;

use crate::runtime::port;

/// What to prepare, and how.
///
/// ```ignore
/// let set = CorpusPreparer::new("wikipedia/").tokenizer("my-tokenizer").prepare("wiki-prepared")?;
/// BertMlmTrainer::new().data(set.dir.display().to_string()).fit()?;
/// ```
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct CorpusPreparer {
    /// A `.txt` file (a text per non-empty line), a table (`.parquet`, `.csv`, `.tsv`,
    /// `.jsonl`, `.arrow`), a directory of them (read in name order), a directory Hugging Face
    /// datasets' `save_to_disk` wrote (a `DatasetDict`: its `train` split), or a directory of
    /// such directories.
    pub data: PathBuf,
    /// The text column of tables (default `text`).
    pub text_column: Option<String>,
    /// A directory with `tokenizer.json` or `vocab.txt` (default: the job's default, the
    /// offline uncased BERT vocabulary).
    pub tokenizer: Option<PathBuf>,
    /// The share of texts held out for evaluation (every n-th text; default 0.05, 0 for none).
    pub eval_fraction: f64,
    /// Input megabytes per shard (default 64).
    pub shard_mb: u64,
    /// `(index, count)`: prepare only slice `index` of `count` (the shards `k` with
    /// `k % count == index`), as one rank of a job spread over several machines that share the
    /// output directory; the slice that ends last writes the index. Default: the whole corpus.
    #[serde(default)]
    pub slice: Option<(usize, usize)>,
}

impl CorpusPreparer {
    pub fn new(data: impl Into<PathBuf>) -> Self {
        CorpusPreparer {
            data: data.into(),
            text_column: None,
            tokenizer: None,
            eval_fraction: 0.05,
            shard_mb: 64,
            slice: None,
        }
    }
    /// The text column of the tables (default `text`).
    pub fn text_column(mut self, name: impl Into<String>) -> Self {
        self.text_column = Some(name.into());
        self
    }
    /// The tokenizer's directory (`tokenizer.json` or `vocab.txt`); a job training on the
    /// prepared corpus must use the same one.
    pub fn tokenizer(mut self, dir: impl Into<PathBuf>) -> Self {
        self.tokenizer = Some(dir.into());
        self
    }
    /// The share of texts held out for evaluation (0 for none).
    pub fn eval_fraction(mut self, fraction: f64) -> Self {
        self.eval_fraction = fraction;
        self
    }
    /// Input megabytes per shard.
    pub fn shard_mb(mut self, mb: u64) -> Self {
        self.shard_mb = mb;
        self
    }
    /// Prepares only slice `index` of `count` (see [`CorpusPreparer::slice`]): e.g. each rank
    /// of a job `slice(rank, world_size)` into one shared directory.
    pub fn slice(mut self, index: usize, count: usize) -> Self {
        self.slice = Some((index, count));
        self
    }
    /// Prepares into `out` (created); continues a stopped preparation of the same input there,
    /// and returns at once when `out` already holds it. Prints progress every 10 seconds.
    pub fn prepare(&self, out: impl AsRef<Path>) -> Result<PreparedCorpus> {
        let mut last = std::time::Instant::now();
        port::<dyn Corpora>()?.prepare_corpus(self, out.as_ref(), &mut |p| {
            if last.elapsed().as_secs() >= 10 {
                last = std::time::Instant::now();
                eprintln!("{}", p.line());
            }
            Ok(())
        })
    }
}

/// The engine's side of corpora. The `trainbook` crate implements it (see `crate::runtime`).
pub trait Corpora: Send + Sync {
    /// Prepares a corpus (see [`CorpusPreparer::prepare`]); `progress` is called as it goes,
    /// and an error from it stops the preparation (finished shards are kept).
    fn prepare_corpus(
        &self,
        spec: &CorpusPreparer,
        out: &Path,
        progress: &mut dyn FnMut(&PrepareProgress) -> Result<()>,
    ) -> Result<PreparedCorpus>;
}

/// How far a preparation is.
#[derive(Clone, Debug, Default, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct PrepareProgress {
    /// Input bytes read, of `total_bytes`.
    pub bytes: u64,
    pub total_bytes: u64,
    pub texts: u64,
    pub tokens: u64,
    /// Texts an earlier, stopped preparation had finished (read again, not tokenised).
    pub resumed_texts: u64,
    pub seconds: f64,
}

impl PrepareProgress {
    /// Input megabytes per second of tokenising.
    pub fn mb_per_s(&self) -> f64 {
        if self.seconds > 0.0 {
            self.bytes as f64 / 1e6 / self.seconds
        } else {
            0.0
        }
    }

    /// `prepared 120.0 of 2000.0 MB (6%), 1234567 texts, 30000000 tokens, 3.2 MB/s, 9 min 47 s left`
    pub fn line(&self) -> String {
        let mb = |b: u64| b as f64 / 1e6;
        let rate = self.mb_per_s();
        let left = if rate > 0.0 {
            (mb(self.total_bytes.saturating_sub(self.bytes)) / rate) as u64
        } else {
            0
        };
        format!(
            "prepared {:.1} of {:.1} MB ({:.0}%), {} texts, {} tokens, {rate:.1} MB/s, {} min {} s left",
            mb(self.bytes),
            mb(self.total_bytes),
            100.0 * self.bytes as f64 / self.total_bytes.max(1) as f64,
            self.texts,
            self.tokens,
            left / 60,
            left % 60
        )
    }
}

/// A prepared corpus on disk.
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct PreparedCorpus {
    pub dir: PathBuf,
    pub texts: u64,
    pub train_tokens: u64,
    pub eval_tokens: u64,
    pub shards: usize,
    /// Bytes of the token files on disk.
    pub disk_bytes: u64,
    /// Input bytes (text) it was made from.
    pub text_bytes: u64,
    /// Seconds this call spent (0 when it was already prepared).
    pub seconds: f64,
    /// Slices (of a preparation spread over several processes) still to end; empty when the
    /// set is complete and jobs can read it. The counts above cover the shards finished so
    /// far until then.
    #[serde(default)]
    pub pending_slices: Vec<usize>,
}

impl PreparedCorpus {
    /// Whether every shard and the index are written (jobs can read it).
    pub fn is_complete(&self) -> bool {
        self.pending_slices.is_empty()
    }
}
