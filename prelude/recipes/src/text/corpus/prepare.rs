//! Preparing a corpus: texts read as a stream, tokenised on every core, written as token shards.
//!
//! Memory stays bounded whatever the corpus size: a batch of texts (a few MB) and its encodings
//! are all that is held. Shards are cut by input bytes, so where a shard ends depends on the
//! input alone: a preparation that was stopped continues after its last finished shard (its
//! texts are read again but not tokenised), and gives the same files as one that never stopped.

use std::fs::File;
use std::hash::{Hash, Hasher};
use std::io::{BufWriter, Read, Write};
use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};

use super::layout::*;
use super::source::Corpus;
use crate::text::tokenizer::TextTokenizer;
pub use trainbook_api::corpus::PrepareProgress as Progress;

/// Default bytes of text tokenised at a time.
pub const BATCH_BYTES: usize = 4 << 20;
/// Default input bytes per shard.
pub const SHARD_BYTES: u64 = 64 << 20;

/// How a corpus is prepared.
#[derive(Clone, Debug)]
pub struct PrepareSettings {
    /// Every `eval_every`-th text is held out for evaluation; 0: none.
    pub eval_every: usize,
    pub shard_bytes: u64,
    /// Bytes of text tokenised at a time (memory, not output: not part of the manifest).
    pub batch_bytes: usize,
}

impl PrepareSettings {
    pub fn new(eval_every: usize) -> Self {
        PrepareSettings {
            eval_every,
            shard_bytes: SHARD_BYTES,
            batch_bytes: BATCH_BYTES,
        }
    }
}

/// The manifest of preparing `corpus` with `tok`.
pub fn manifest(
    corpus: &Corpus,
    tok: &TextTokenizer,
    tokenizer_dir: &Path,
    settings: &PrepareSettings,
) -> Result<Manifest> {
    Ok(Manifest {
        format: FORMAT,
        source: source_fingerprint(&corpus.files)?,
        files: corpus.files.clone(),
        column: corpus.column.clone(),
        tokenizer: format!("{:016x}", tok.fingerprint()),
        tokenizer_dir: tokenizer_dir.to_path_buf(),
        vocab_size: tok.vocab_size(),
        width: TokenWidth::for_vocab(tok.vocab_size()),
        eval_every: settings.eval_every,
        shard_bytes: settings.shard_bytes.max(1),
    })
}

/// Each file's canonical path, size and modification time (nanoseconds), hashed: a changed or
/// replaced file is another input.
fn source_fingerprint(files: &[PathBuf]) -> Result<String> {
    #[allow(deprecated)]
    let mut h = std::hash::SipHasher::new();
    for f in files {
        let meta = std::fs::metadata(f).with_context(|| format!("reading {}", f.display()))?;
        std::fs::canonicalize(f).unwrap_or(f.clone()).hash(&mut h);
        meta.len().hash(&mut h);
        meta.modified()
            .ok()
            .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
            .map(|d| d.as_nanos())
            .hash(&mut h);
    }
    Ok(format!("{:016x}", h.finish()))
}

/// An exclusive lock on a directory's preparation, held until dropped: two processes (the
/// workers of one machine, or two `trainbook prepare`s) never write the same set; the second
/// waits and then finds it done. The lock goes with the descriptor, when the value is dropped.
pub struct DirLock(#[allow(dead_code)] File);

impl DirLock {
    pub fn take(dir: &Path) -> Result<Self> {
        use std::os::fd::AsRawFd;
        std::fs::create_dir_all(dir).with_context(|| {
            format!(
                "cannot create {}: check that its parent is writable",
                dir.display()
            )
        })?;
        let path = dir.join(".lock");
        let f = File::create(&path).with_context(|| format!("creating {}", path.display()))?;
        // SAFETY: flock on a descriptor this function owns.
        if unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_EX) } != 0 {
            bail!(
                "cannot lock {}: {}",
                path.display(),
                std::io::Error::last_os_error()
            );
        }
        Ok(DirLock(f))
    }
}

/// Prepares `corpus` into `out` (created), continuing a stopped preparation of the same input
/// and settings; returns at once when `out` already holds it. `progress` is called after each
/// batch; an error from it stops the preparation (finished shards are kept).
pub fn prepare(
    corpus: &Corpus,
    tok: &TextTokenizer,
    manifest: &Manifest,
    batch_bytes: usize,
    out: &Path,
    progress: &mut dyn FnMut(&Progress) -> Result<()>,
) -> Result<Index> {
    let _lock = DirLock::take(out)?;
    if out.join(INDEX).is_file() {
        let index = read_index(out)?;
        if index.manifest == *manifest {
            return Ok(index);
        }
        bail!("{}", other_preparation(out, &index.manifest, manifest));
    }
    let manifest_path = out.join(MANIFEST);
    if manifest_path.is_file() {
        let there: Manifest = read_json(&manifest_path)?;
        // A preparation stopped before its first shard (a wrong text column, say) has nothing
        // to lose: the new settings replace it.
        let started = shard_record_path(out, 0).is_file();
        if there != *manifest && started {
            bail!("{}", other_preparation(out, &there, manifest));
        }
        if there != *manifest {
            trainbook_engine::checkpoint::write_json_atomic(&manifest_path, manifest)?;
        }
    } else {
        trainbook_engine::checkpoint::write_json_atomic(&manifest_path, manifest)?;
    }
    remove_temporaries(out);
    let t0 = std::time::Instant::now();
    let mut records = finished_shards(out, manifest);
    let resume = records.last().map_or(0, |r| r.end_text);
    let mut p = Progress {
        total_bytes: corpus.bytes(),
        resumed_texts: resume,
        ..Default::default()
    };
    let mut writer: Option<ShardWriter> = None;
    let mut next = 0u64;
    corpus.for_each_batch(batch_bytes, |texts, done| {
        let first = next;
        next += texts.len() as u64;
        p.bytes = done;
        p.texts = next;
        if next <= resume {
            return progress(&p);
        }
        let skip = resume.saturating_sub(first) as usize;
        let refs: Vec<&str> = texts[skip..].iter().map(String::as_str).collect();
        let ids = tok.encode_ids(&refs)?;
        for (k, (text, ids)) in refs.iter().zip(&ids).enumerate() {
            let g = first + (skip + k) as u64;
            if writer.is_none() {
                writer = Some(ShardWriter::create(out, records.len(), g, manifest.width)?);
            }
            let w = writer.as_mut().expect("open shard");
            let split = match manifest.eval_every {
                e if e > 0 && g % e as u64 == e as u64 - 1 => Split::Eval,
                _ => Split::Train,
            };
            w.push(split, ids)?;
            w.text_bytes += text.len() as u64;
            p.tokens += ids.len() as u64;
            if w.text_bytes >= manifest.shard_bytes {
                records.push(writer.take().expect("open shard").finish(g + 1)?);
            }
        }
        p.seconds = t0.elapsed().as_secs_f64();
        progress(&p)
    })?;
    if let Some(w) = writer.take() {
        records.push(w.finish(next)?);
    }
    let sum = |f: fn(&ShardRecord) -> u64| records.iter().map(f).sum::<u64>();
    let index = Index {
        manifest: manifest.clone(),
        texts: next,
        text_bytes: sum(|r| r.text_bytes),
        train_tokens: sum(|r| r.train.tokens),
        eval_tokens: sum(|r| r.eval.tokens),
        seconds: t0.elapsed().as_secs_f64(),
        shards: records,
    };
    if index.texts == 0 {
        bail!(
            "no text in {}: give files with text (.txt lines or a table's '{}' column)",
            show_files(&manifest.files),
            manifest.column
        );
    }
    trainbook_engine::checkpoint::write_json_atomic(&out.join(INDEX), &index)?;
    Ok(index)
}

fn show_files(files: &[PathBuf]) -> String {
    let names: Vec<String> = files.iter().map(|f| f.display().to_string()).collect();
    names.join(", ")
}

fn other_preparation(out: &Path, there: &Manifest, wanted: &Manifest) -> String {
    let what = if there.files != wanted.files || there.source != wanted.source {
        "other input files (or the same files since changed)"
    } else if there.tokenizer != wanted.tokenizer {
        "another tokenizer"
    } else {
        "other settings (text column, held-out share or shard size)"
    };
    format!(
        "{} holds a preparation of {what}: remove it, or prepare into another --out",
        out.display()
    )
}

/// Files a preparation that was killed left half-written.
fn remove_temporaries(out: &Path) {
    for entry in std::fs::read_dir(out).into_iter().flatten().flatten() {
        if entry.file_name().to_string_lossy().contains(".tmp-") {
            std::fs::remove_file(entry.path()).ok();
        }
    }
}

/// The finished shards, in order, up to the first one missing or not matching its files.
fn finished_shards(out: &Path, manifest: &Manifest) -> Vec<ShardRecord> {
    let mut records = Vec::new();
    loop {
        let shard = records.len();
        let Ok(r) = read_json::<ShardRecord>(&shard_record_path(out, shard)) else {
            break;
        };
        let expected_first = records.last().map_or(0, |p: &ShardRecord| p.end_text);
        let sizes_match = [Split::Train, Split::Eval].iter().all(|&s| {
            std::fs::metadata(tokens_path(out, s, shard))
                .is_ok_and(|m| m.len() == r.part(s).tokens * manifest.width.bytes())
        });
        if r.shard != shard || r.first_text != expected_first || !sizes_match {
            break;
        }
        records.push(r);
    }
    records
}

/// One split's files of the shard being written.
struct PartWriter {
    tokens: BufWriter<File>,
    docs: BufWriter<File>,
    paths: [(PathBuf, PathBuf); 2],
    part: Part,
}

impl PartWriter {
    fn create(out: &Path, split: Split, shard: usize) -> Result<Self> {
        let tmp = |p: PathBuf| {
            let t = PathBuf::from(format!("{}.tmp-{}", p.display(), std::process::id()));
            (t, p)
        };
        let paths = [
            tmp(tokens_path(out, split, shard)),
            tmp(docs_path(out, split, shard)),
        ];
        let open = |p: &Path| -> Result<BufWriter<File>> {
            Ok(BufWriter::with_capacity(
                1 << 20,
                File::create(p).with_context(|| format!("creating {}", p.display()))?,
            ))
        };
        Ok(PartWriter {
            tokens: open(&paths[0].0)?,
            docs: open(&paths[1].0)?,
            paths,
            part: Part {
                tokens: 0,
                docs: 0,
                crc32c: 0,
            },
        })
    }

    fn push(&mut self, width: TokenWidth, ids: &[u32]) -> Result<()> {
        self.docs.write_all(&self.part.tokens.to_le_bytes())?;
        self.part.docs += 1;
        let mut bytes = Vec::with_capacity(ids.len() * width.bytes() as usize);
        for &id in ids {
            match width {
                TokenWidth::U16 => bytes.extend_from_slice(&(id as u16).to_le_bytes()),
                TokenWidth::U32 => bytes.extend_from_slice(&id.to_le_bytes()),
            }
        }
        self.part.crc32c = crc32c::crc32c_append(self.part.crc32c, &bytes);
        self.tokens.write_all(&bytes)?;
        self.part.tokens += ids.len() as u64;
        Ok(())
    }

    fn finish(self) -> Result<Part> {
        for (w, (tmp, path)) in [self.tokens, self.docs].into_iter().zip(&self.paths) {
            let f = w
                .into_inner()
                .map_err(|e| anyhow::anyhow!("writing {}: {}", tmp.display(), e.error()))?;
            f.sync_all()
                .with_context(|| format!("writing {}", tmp.display()))?;
            std::fs::rename(tmp, path)
                .with_context(|| format!("renaming {} to {}", tmp.display(), path.display()))?;
        }
        Ok(self.part)
    }
}

struct ShardWriter {
    out: PathBuf,
    shard: usize,
    first_text: u64,
    text_bytes: u64,
    width: TokenWidth,
    train: PartWriter,
    eval: PartWriter,
}

impl ShardWriter {
    fn create(out: &Path, shard: usize, first_text: u64, width: TokenWidth) -> Result<Self> {
        Ok(ShardWriter {
            out: out.to_path_buf(),
            shard,
            first_text,
            text_bytes: 0,
            width,
            train: PartWriter::create(out, Split::Train, shard)?,
            eval: PartWriter::create(out, Split::Eval, shard)?,
        })
    }

    fn push(&mut self, split: Split, ids: &[u32]) -> Result<()> {
        if self.width == TokenWidth::U16 {
            if let Some(&big) = ids.iter().find(|&&i| i > u16::MAX as u32) {
                bail!("token id {big} does not fit 16 bits although the vocabulary does: the tokenizer is inconsistent");
            }
        }
        match split {
            Split::Train => self.train.push(self.width, ids),
            Split::Eval => self.eval.push(self.width, ids),
        }
    }

    /// Closes the shard after text `end_text - 1`: files renamed into place, then its record.
    fn finish(self, end_text: u64) -> Result<ShardRecord> {
        let record = ShardRecord {
            shard: self.shard,
            first_text: self.first_text,
            end_text,
            text_bytes: self.text_bytes,
            train: self.train.finish()?,
            eval: self.eval.finish()?,
        };
        trainbook_engine::checkpoint::write_json_atomic(
            &shard_record_path(&self.out, self.shard),
            &record,
        )?;
        Ok(record)
    }
}

/// CRC-32C of a file, read in 1 MiB pieces (not through a mapping, so a check does not count
/// toward the process's resident memory).
pub fn file_crc32c(path: &Path) -> Result<u32> {
    let mut f = File::open(path).with_context(|| format!("opening {}", path.display()))?;
    let mut buf = vec![0u8; 1 << 20];
    let mut crc = 0u32;
    loop {
        let n = f
            .read(&mut buf)
            .with_context(|| format!("reading {}", path.display()))?;
        if n == 0 {
            return Ok(crc);
        }
        crc = crc32c::crc32c_append(crc, &buf[..n]);
    }
}
