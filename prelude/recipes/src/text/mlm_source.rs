//! Where bert-mlm's samples come from: blocks of a prepared corpus (raw text is prepared first),
//! masked on the fly, or the already masked sequences of NVIDIA/Habana HDF5 shards, read from
//! the records they were prepared into when they were (`trainbook prepare`), else from the
//! shards. Either way a sample is read when a batch needs it; nothing of the corpus is held in
//! memory.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::{bail, Result};
use trainbook_api::plumbing::settings::TextSettings;

use super::corpus::records::{self, Hdf5Records};
use super::corpus::{self, PreparedCorpus};
use super::hdf5_shards::{self, Hdf5Shards, Sequence};
use super::tokenizer::TextTokenizer;

/// Held out for evaluation when neither `eval_data` nor `eval_fraction` is given.
pub const EVAL_FRACTION: f64 = 0.05;

/// A path's corpus: the path itself, else a dataset id's training table.
fn corpus_path(data: &str) -> Result<PathBuf> {
    let path = Path::new(data);
    if path.exists() {
        return Ok(path.to_path_buf());
    }
    Ok(crate::assets::resolve_dataset(data)?.train)
}

/// One sample: a block of token ids to mask, or a sequence masked when the shards were made.
pub enum Sample {
    Block(Vec<i64>),
    Masked(Sequence),
}

enum Source {
    Tokens {
        set: Arc<PreparedCorpus>,
        split: corpus::Split,
        len: usize,
    },
    /// Sample `k` is sequence `k` of the shards with every `every`-th one left out (training)
    /// or only those (evaluation); `every` 0: all of them are training.
    Hdf5 {
        shards: Arc<Masked>,
        every: usize,
        eval: bool,
    },
}

/// Masked sequences: HDF5 shards, or the records prepared from them (the same sequences).
pub enum Masked {
    Shards(Hdf5Shards),
    Records(Hdf5Records),
}

impl Masked {
    /// `dir`'s masked sequences, if it holds any: records, else HDF5 shards, read from their
    /// records in the prepared-corpus cache when `trainbook prepare` put them there.
    pub fn find(dir: &Path, log: &dyn Fn(String)) -> Result<Option<Self>> {
        if records::is_records(dir) {
            return Ok(Some(Masked::Records(Hdf5Records::open(dir)?)));
        }
        if !hdf5_shards::is_hdf5_dir(dir) || corpus::is_prepared(dir) {
            return Ok(None);
        }
        if let Some(cached) = records::cached(dir) {
            return Ok(Some(Masked::Records(Hdf5Records::open(&cached)?)));
        }
        log(format!(
            "{}: reading the HDF5 shards themselves, a sequence's gzip chunks decompressed at each read; `trainbook prepare --data {}` converts them once into records that read faster",
            dir.display(),
            dir.display()
        ));
        Ok(Some(Masked::Shards(Hdf5Shards::open(dir)?)))
    }

    pub fn rows(&self) -> usize {
        match self {
            Masked::Shards(s) => s.rows,
            Masked::Records(r) => r.rows,
        }
    }

    pub fn seq_len(&self) -> usize {
        match self {
            Masked::Shards(s) => s.seq_len,
            Masked::Records(r) => r.seq_len,
        }
    }

    pub fn has_next_sentence_labels(&self) -> bool {
        match self {
            Masked::Shards(s) => s.has_next_sentence_labels(),
            Masked::Records(r) => r.has_next_sentence_labels(),
        }
    }

    /// Sequence `i`; token ids must be below `vocab`.
    pub fn get(&self, i: usize, vocab: i64) -> Result<Sequence> {
        match self {
            Masked::Shards(s) => s.get(i, vocab),
            Masked::Records(r) => r.get(i, vocab),
        }
    }
}

/// One split's samples.
pub struct Samples {
    source: Source,
    pub count: usize,
}

impl Samples {
    fn blocks(
        set: &Arc<PreparedCorpus>,
        split: corpus::Split,
        len: usize,
        rows: Option<usize>,
    ) -> Self {
        let count = set
            .stream(split)
            .blocks(len)
            .min(rows.unwrap_or(usize::MAX));
        Samples {
            source: Source::Tokens {
                set: set.clone(),
                split,
                len,
            },
            count,
        }
    }

    fn sequences(shards: &Arc<Masked>, every: usize, eval: bool, rows: Option<usize>) -> Self {
        let n = shards.rows();
        let count = match (every, eval) {
            (0, false) => n,
            (0, true) => 0,
            (e, false) => n - n / e,
            (e, true) => n / e,
        };
        Samples {
            source: Source::Hdf5 {
                shards: shards.clone(),
                every,
                eval,
            },
            count: count.min(rows.unwrap_or(usize::MAX)),
        }
    }

    /// Sample `k`; token ids must be below `vocab`.
    pub fn get(&self, k: usize, vocab: i64) -> Result<Sample> {
        match &self.source {
            Source::Tokens { set, split, len } => {
                Ok(Sample::Block(set.stream(*split).block(k, *len)?))
            }
            Source::Hdf5 {
                shards,
                every,
                eval,
            } => Ok(Sample::Masked(
                shards.get(sequence_index(k, *every, *eval), vocab)?,
            )),
        }
    }

    /// What the samples are read from, for the job's log.
    pub fn describe(&self) -> String {
        match &self.source {
            Source::Tokens { set, .. } => {
                let docs = |split| set.index.shards.iter().map(|r| r.part(split).docs).sum::<u64>();
                format!(
                    "prepared corpus {} ({} + {} texts)",
                    set.dir.display(),
                    docs(corpus::Split::Train),
                    docs(corpus::Split::Eval)
                )
            }
            Source::Hdf5 { shards, .. } => match &**shards {
                Masked::Shards(s) => format!(
                    "HDF5 shards in {} ({} sequences of {} tokens, up to {} predictions each, masked when the shards were made)",
                    s.dir.display(),
                    s.rows,
                    s.seq_len,
                    s.max_pred
                ),
                Masked::Records(r) => format!(
                    "records of the HDF5 shards in {}, prepared in {} ({} sequences of {} tokens, up to {} predictions each, masked when the shards were made)",
                    r.index.manifest.source_dir.display(),
                    r.dir.display(),
                    r.rows,
                    r.seq_len,
                    r.max_pred
                ),
            },
        }
    }
}

/// The shards' sequence of training (or held-out) sample `k` when every `every`-th sequence is
/// held out (`every` 0: none).
fn sequence_index(k: usize, every: usize, eval: bool) -> usize {
    match (every, eval) {
        (0, _) => k,
        (e, false) => (k / (e - 1)) * e + k % (e - 1),
        (e, true) => k * e + e - 1,
    }
}

/// Checks a `data` or `eval_data` directory before any worker starts: a prepared corpus must be
/// complete, HDF5 shards must have the layout, a raw corpus must hold text files.
pub fn check_dir(dir: &Path, column: &str) -> Result<()> {
    if !dir.is_dir() {
        return Ok(());
    }
    if records::is_records(dir) {
        Hdf5Records::open(dir)?;
    } else if corpus::is_prepared(dir) {
        corpus::layout::read_index(dir)?;
    } else if hdf5_shards::is_hdf5_dir(dir) {
        Hdf5Shards::open(dir)?;
    } else {
        corpus::Corpus::open(dir, column)?;
    }
    Ok(())
}

/// The training and held-out samples: `eval_data`'s, or every n-th text (sequence) of `data`
/// held out (when `data` is a prepared corpus, as it was prepared). Raw text is prepared first,
/// once per machine (see [`corpus::for_job`]).
pub fn train_and_eval(
    data: &str,
    rows: (Option<usize>, Option<usize>),
    text: &TextSettings,
    tok: &TextTokenizer,
    tokenizer_dir: &Path,
    log: &dyn Fn(String),
) -> Result<(Samples, Samples)> {
    let block = text.max_length;
    let every = match (&text.eval_data, text.eval_fraction) {
        (Some(_), None) => None,
        (_, fraction) => Some(corpus::eval_every(fraction.unwrap_or(EVAL_FRACTION))),
    };
    let path = corpus_path(data)?;
    let masked = |p: &Path| -> Result<Option<Arc<Masked>>> {
        let Some(set) = Masked::find(p, log)? else {
            return Ok(None);
        };
        if set.seq_len() != block {
            bail!(
                "{} holds {}-token sequences but max_length is {block}: use --max-length {}",
                p.display(),
                set.seq_len(),
                set.seq_len()
            );
        }
        Ok(Some(Arc::new(set)))
    };
    if let Some(shards) = masked(&path)? {
        let open = |p: &Path| -> Result<Arc<Masked>> {
            masked(p)?.ok_or_else(|| {
                anyhow::anyhow!(
                    "{} holds neither HDF5 shards nor their records: eval_data must be masked sequences too when data is",
                    p.display()
                )
            })
        };
        return Ok(match (every, &text.eval_data) {
            (None, Some(f)) => (
                Samples::sequences(&shards, 0, false, rows.0),
                Samples::sequences(&open(f)?, 0, false, rows.1),
            ),
            (e, _) => {
                let e = e.unwrap_or(0);
                (
                    Samples::sequences(&shards, e, false, rows.0),
                    Samples::sequences(&shards, e, true, rows.1),
                )
            }
        });
    }
    let open = |p: &Path, every: usize| -> Result<Arc<PreparedCorpus>> {
        let settings = corpus::PrepareSettings::new(every);
        let set = corpus::for_job(p, &text.text_column, tok, tokenizer_dir, &settings, log)?;
        Ok(Arc::new(set))
    };
    Ok(match (every, &text.eval_data) {
        (None, Some(f)) => (
            Samples::blocks(&open(&path, 0)?, corpus::Split::Train, block, rows.0),
            Samples::blocks(
                &open(&corpus_path(&f.display().to_string())?, 0)?,
                corpus::Split::Train,
                block,
                rows.1,
            ),
        ),
        (e, _) => {
            let every = e.unwrap_or(0);
            let set = open(&path, every)?;
            let prepared_every = set.index.manifest.eval_every;
            if text.eval_fraction.is_some() && prepared_every != every {
                bail!(
                    "{data} was prepared holding out every {prepared_every}th text, but eval_fraction asks for every {every}th: prepare it again with `--eval-fraction`, or drop eval_fraction",
                );
            }
            (
                Samples::blocks(&set, corpus::Split::Train, block, rows.0),
                Samples::blocks(&set, corpus::Split::Eval, block, rows.1),
            )
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Training and held-out sequence indices of HDF5 shards partition the shards, every 20th
    /// held out, as the prepared corpus holds texts out.
    #[test]
    fn held_out_sequences_are_every_nth_and_the_rest_train() {
        let (n, e) = (103usize, 20usize);
        let train: Vec<usize> = (0..n - n / e)
            .map(|k| sequence_index(k, e, false))
            .collect();
        let eval: Vec<usize> = (0..n / e).map(|k| sequence_index(k, e, true)).collect();
        let mut all: Vec<usize> = train.iter().chain(&eval).copied().collect();
        all.sort();
        assert_eq!(all, (0..n).collect::<Vec<_>>());
        assert!(eval.iter().all(|i| i % e == e - 1));
    }
}
