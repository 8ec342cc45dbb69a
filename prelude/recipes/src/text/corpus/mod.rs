//! Pre-training corpora larger than memory: prepared once (`trainbook prepare`), memory-mapped
//! by every worker.
//!
//! - [`source`]: a corpus (text files, tables, a directory of them, a Hugging Face `datasets`
//!   directory) read as a stream of texts;
//! - [`prepare`]: tokenised on every core into token shards, resumable;
//! - [`layout`]: the files of a prepared corpus;
//! - [`mapped`]: a prepared corpus opened, blocks of tokens read from the mapped shards;
//! - [`records`]: HDF5 pre-training shards (tokenised and masked already) prepared into
//!   fixed-size records, memory-mapped the same way.
//!
//! A job given raw text prepares it first, into the machine's cache, once: the workers of a
//! machine wait for the one that prepares, then all map the same files.

mod arrow;
pub mod layout;
pub mod mapped;
pub mod prepare;
pub(crate) mod read;
pub mod records;
pub mod source;

use std::hash::{Hash, Hasher};
use std::path::{Path, PathBuf};

use anyhow::Result;

pub use layout::{is_prepared, Index, Split};
pub use mapped::{PreparedCorpus, Stream};
pub use prepare::{PrepareSettings, Progress, BATCH_BYTES, SHARD_BYTES};
pub use source::Corpus;

use crate::text::tokenizer::TextTokenizer;

/// Where jobs keep the corpora they prepared: `$TRAINBOOK_CACHE/prepared`, else
/// `<data dir>/cache/prepared`.
pub fn cache_dir() -> PathBuf {
    std::env::var_os("TRAINBOOK_CACHE")
        .map(|c| PathBuf::from(c).join("prepared"))
        .unwrap_or_else(|| crate::assets::data_dir().join("cache").join("prepared"))
}

/// Every `every`-th text held out for a share of `fraction` (0.05: every 20th).
pub fn eval_every(fraction: f64) -> usize {
    if fraction <= 0.0 {
        0
    } else {
        (1.0 / fraction).round().max(2.0) as usize
    }
}

/// The prepared corpus a job reads: `data` itself when it is one (made with this tokenizer),
/// else `data` prepared into [`cache_dir`] (keyed by the input files, the tokenizer and the
/// settings; prepared once, then reused by every worker and every later job).
pub fn for_job(
    data: &Path,
    column: &str,
    tok: &TextTokenizer,
    tokenizer_dir: &Path,
    settings: &PrepareSettings,
    log: &dyn Fn(String),
) -> Result<PreparedCorpus> {
    if is_prepared(data) {
        let set = PreparedCorpus::open(data)?;
        set.check_tokenizer(tok.fingerprint(), tokenizer_dir)?;
        return Ok(set);
    }
    let corpus = Corpus::open(data, column)?;
    let manifest = prepare::manifest(&corpus, tok, tokenizer_dir, settings)?;
    #[allow(deprecated)]
    let mut h = std::hash::SipHasher::new();
    serde_json::to_string(&manifest)?.hash(&mut h);
    let dir = cache_dir().join(format!("{:016x}", h.finish()));
    if !dir.join(layout::INDEX).is_file() {
        log(format!(
            "preparing {} ({:.1} MB) into {} (once; later jobs reuse it)",
            data.display(),
            corpus.bytes() as f64 / 1e6,
            dir.display()
        ));
    }
    let mut last = std::time::Instant::now();
    let index = prepare::prepare(
        &corpus,
        tok,
        &manifest,
        settings.batch_bytes,
        &dir,
        &mut |p| {
            if last.elapsed().as_secs() >= 10 {
                last = std::time::Instant::now();
                log(p.line());
            }
            Ok(())
        },
    )?;
    let set = PreparedCorpus::open(&dir)?;
    debug_assert_eq!(set.index, index);
    Ok(set)
}

/// What `CorpusPreparer::prepare` and `trainbook prepare` do: a corpus of text is tokenised
/// into token shards, a directory of HDF5 pre-training shards becomes records.
pub fn prepare_spec(
    spec: &trainbook_api::CorpusPreparer,
    out: &Path,
    progress: &mut dyn FnMut(&Progress) -> Result<()>,
) -> Result<trainbook_api::PreparedCorpus> {
    if crate::text::hdf5_shards::is_hdf5_dir(&spec.data) {
        return records::prepare_spec(spec, out, progress);
    }
    if !(0.0..1.0).contains(&spec.eval_fraction) {
        anyhow::bail!(
            "eval_fraction {} must be at least 0 and below 1 (0.05 holds out every 20th text; 0 none)",
            spec.eval_fraction
        );
    }
    if spec.shard_mb == 0 {
        anyhow::bail!("shard_mb must be at least 1 (64 is the default)");
    }
    let tokenizer_dir = spec
        .tokenizer
        .clone()
        .unwrap_or_else(crate::assets::minilm_dir);
    // Whole texts, as bert-mlm tokenises them: grouping, not truncation, makes its blocks.
    let tok = TextTokenizer::from_model_dir(&tokenizer_dir, 1 << 20)?;
    let corpus = Corpus::open(&spec.data, spec.text_column.as_deref().unwrap_or("text"))?;
    let settings = PrepareSettings {
        shard_bytes: spec.shard_mb << 20,
        ..PrepareSettings::new(eval_every(spec.eval_fraction))
    };
    let manifest = prepare::manifest(&corpus, &tok, &tokenizer_dir, &settings)?;
    let slice = spec
        .slice
        .map_or(prepare::Slice::WHOLE, |(index, count)| prepare::Slice {
            index,
            count,
        });
    let t0 = std::time::Instant::now();
    let outcome = prepare::prepare_slice(
        &corpus,
        &tok,
        &manifest,
        settings.batch_bytes,
        out,
        slice,
        progress,
    )?;
    let (texts, shards, records, pending_slices) = match outcome {
        Ok(index) => (index.texts, index.shards.len(), index.shards, Vec::new()),
        Err(p) => (p.texts, p.shards, p.finished, p.slices),
    };
    let sum = |f: fn(&layout::ShardRecord) -> u64| records.iter().map(f).sum::<u64>();
    let (train_tokens, eval_tokens) = (sum(|r| r.train.tokens), sum(|r| r.eval.tokens));
    Ok(trainbook_api::PreparedCorpus {
        dir: std::fs::canonicalize(out).unwrap_or(out.to_path_buf()),
        texts,
        train_tokens,
        eval_tokens,
        shards,
        disk_bytes: (train_tokens + eval_tokens) * manifest.width.bytes(),
        text_bytes: sum(|r| r.text_bytes),
        pending_slices,
        seconds: t0.elapsed().as_secs_f64(),
    })
}

#[cfg(test)]
mod tests;
