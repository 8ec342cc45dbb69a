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
pub use trainbook_api::PrepareProgress as Progress;

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
pub(crate) fn source_fingerprint(files: &[PathBuf]) -> Result<String> {
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
        Self::take_named(dir, ".lock")
    }

    /// The lock file `name` in `dir`.
    pub fn take_named(dir: &Path, name: &str) -> Result<Self> {
        use std::os::fd::AsRawFd;
        std::fs::create_dir_all(dir).with_context(|| {
            format!(
                "cannot create {}: check that its parent is writable",
                dir.display()
            )
        })?;
        let path = dir.join(name);
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

/// Which shards a process prepares (a slice of the input): shard `k` when `k % count == index`.
/// Every slice reads the
/// whole input (reading is far faster than tokenising) to know where each shard starts, and
/// tokenises only its own shards, so parts on several machines sharing `out` prepare one set
/// in parallel; the slice that ends last writes `index.json`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Slice {
    pub index: usize,
    pub count: usize,
}

impl Slice {
    /// The whole corpus, in one process.
    pub const WHOLE: Slice = Slice { index: 0, count: 1 };

    fn owns(&self, shard: usize) -> bool {
        shard % self.count == self.index
    }
}

/// A slice that ended before the others: what is finished, and which slices are still to end.
#[derive(Clone, Debug, PartialEq)]
pub struct Pending {
    pub texts: u64,
    pub shards: usize,
    /// Records of the shards finished so far (every slice's), in order up to the first gap.
    pub finished: Vec<ShardRecord>,
    /// Slices with a shard still unwritten.
    pub slices: Vec<usize>,
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
    match prepare_slice(
        corpus,
        tok,
        manifest,
        batch_bytes,
        out,
        Slice::WHOLE,
        progress,
    )? {
        Ok(index) => Ok(index),
        Err(p) => bail!(
            "{}: shards of slices {:?} are missing after a whole preparation",
            out.display(),
            p.slices
        ),
    }
}

/// [`prepare`] of one slice: the index when every slice has ended, else what is pending.
pub fn prepare_slice(
    corpus: &Corpus,
    tok: &TextTokenizer,
    manifest: &Manifest,
    batch_bytes: usize,
    out: &Path,
    slice: Slice,
    progress: &mut dyn FnMut(&Progress) -> Result<()>,
) -> Result<std::result::Result<Index, Pending>> {
    if slice.count == 0 || slice.index >= slice.count {
        bail!(
            "slice {}/{} does not exist: slices are numbered 0 to count - 1",
            slice.index,
            slice.count
        );
    }
    // One process per slice at a time; the whole directory's lock guards the manifest and the
    // index (held throughout by a whole preparation).
    let _part_lock = if slice.count > 1 {
        Some(DirLock::take_named(
            out,
            &format!(".lock-slice-{}-of-{}", slice.index, slice.count),
        )?)
    } else {
        None
    };
    let mut dir_lock = Some(DirLock::take(out)?);
    if let Some(index) = existing_index(out, manifest)? {
        return Ok(Ok(index));
    }
    check_manifest(out, manifest)?;
    if slice.count > 1 {
        dir_lock = None;
    }
    remove_temporaries(out, slice);
    let t0 = std::time::Instant::now();
    let mut run = PartRun {
        out,
        manifest,
        slice,
        cutter: Cutter {
            shard: 0,
            first: 0,
            bytes: 0,
            limit: manifest.shard_bytes,
        },
        write: Vec::new(),
        writer: None,
        next: 0,
        p: Progress {
            total_bytes: corpus.bytes(),
            ..Default::default()
        },
    };
    corpus.for_each_batch(batch_bytes, |texts, done| {
        run.batch(tok, &texts, done)?;
        run.p.seconds = t0.elapsed().as_secs_f64();
        progress(&run.p)
    })?;
    let texts = run.next;
    if let Some(w) = run.writer.take() {
        w.finish(texts)?;
    }
    let shards = run.cutter.shard + usize::from(run.cutter.first < texts);
    if dir_lock.is_none() {
        dir_lock = Some(DirLock::take(out)?);
    }
    // A slice that ended while this one waited for the lock may have written the index: it
    // stands (writing it again would give the slices two different indexes).
    if let Some(index) = existing_index(out, manifest)? {
        return Ok(Ok(index));
    }
    let result = finish_index(out, manifest, slice, texts, shards, t0);
    drop(dir_lock);
    result
}

/// The index already in `out`, when it is this preparation's.
fn existing_index(out: &Path, manifest: &Manifest) -> Result<Option<Index>> {
    if !out.join(INDEX).is_file() {
        return Ok(None);
    }
    let index = read_index(out)?;
    if index.manifest == *manifest {
        return Ok(Some(index));
    }
    bail!("{}", other_preparation(out, &index.manifest, manifest));
}

/// Writes the manifest, or checks the one there is this preparation's.
fn check_manifest(out: &Path, manifest: &Manifest) -> Result<()> {
    let manifest_path = out.join(MANIFEST);
    if !manifest_path.is_file() {
        return trainbook_engine::checkpoint::write_json_atomic(&manifest_path, manifest);
    }
    let there: Manifest = read_json(&manifest_path)?;
    if there == *manifest {
        return Ok(());
    }
    // A preparation stopped before its first shard (a wrong text column, say) has nothing to
    // lose: the new settings replace it.
    let started = std::fs::read_dir(out)
        .into_iter()
        .flatten()
        .flatten()
        .any(|e| is_record_name(&e.file_name().to_string_lossy()));
    if started {
        bail!("{}", other_preparation(out, &there, manifest));
    }
    trainbook_engine::checkpoint::write_json_atomic(&manifest_path, manifest)
}

fn is_record_name(name: &str) -> bool {
    name.starts_with("shard-") && name.ends_with(".json")
}

/// Where shards start and end: a shard ends after the text that brings its text bytes to the
/// limit, so the cuts depend on the input alone.
struct Cutter {
    shard: usize,
    /// The current shard's first text.
    first: u64,
    bytes: u64,
    limit: u64,
}

impl Cutter {
    /// Text `g` of `len` bytes: its shard, that shard's first text, and whether the shard ends
    /// after it.
    fn place(&mut self, g: u64, len: u64) -> (usize, u64, bool) {
        let at = (self.shard, self.first);
        self.bytes += len;
        let ends = self.bytes >= self.limit;
        if ends {
            self.shard += 1;
            self.first = g + 1;
            self.bytes = 0;
        }
        (at.0, at.1, ends)
    }
}

/// One slice's pass over the input.
struct PartRun<'a> {
    out: &'a Path,
    manifest: &'a Manifest,
    slice: Slice,
    cutter: Cutter,
    /// Whether each shard started so far (not yet ended) is written by this pass.
    write: Vec<(usize, bool)>,
    writer: Option<ShardWriter>,
    /// Texts read so far.
    next: u64,
    p: Progress,
}

impl PartRun<'_> {
    fn batch(&mut self, tok: &TextTokenizer, texts: &[String], done: u64) -> Result<()> {
        let first = self.next;
        self.next += texts.len() as u64;
        self.p.bytes = done;
        self.p.texts = self.next;
        let places: Vec<(usize, u64, bool)> = texts
            .iter()
            .enumerate()
            .map(|(k, t)| self.cutter.place(first + k as u64, t.len() as u64))
            .collect();
        let mut mine = Vec::with_capacity(texts.len());
        for &(shard, shard_first, _) in &places {
            mine.push(self.decide(shard, shard_first));
        }
        let refs: Vec<&str> = texts
            .iter()
            .zip(&mine)
            .filter(|(_, &m)| m)
            .map(|(t, _)| t.as_str())
            .collect();
        if refs.is_empty() {
            return Ok(());
        }
        let ids = tok.encode_ids(&refs)?;
        let mut ids = ids.iter();
        for (k, (text, &(shard, shard_first, ends))) in texts.iter().zip(&places).enumerate() {
            if !mine[k] {
                continue;
            }
            let g = first + k as u64;
            let ids = ids.next().expect("an encoding per text");
            if self.writer.is_none() {
                self.writer = Some(ShardWriter::create(
                    self.out,
                    shard,
                    shard_first,
                    self.manifest.width,
                )?);
            }
            let w = self.writer.as_mut().expect("open shard");
            let split = match self.manifest.eval_every {
                e if e > 0 && g % e as u64 == e as u64 - 1 => Split::Eval,
                _ => Split::Train,
            };
            w.push(split, ids)?;
            w.text_bytes += text.len() as u64;
            self.p.tokens += ids.len() as u64;
            if ends {
                self.writer.take().expect("open shard").finish(g + 1)?;
            }
        }
        Ok(())
    }

    /// Whether this pass writes `shard` (first text `first`): a shard of this slice not
    /// finished by an earlier run. Decided once, when the shard starts.
    fn decide(&mut self, shard: usize, first: u64) -> bool {
        if let Some(&(_, w)) = self.write.iter().find(|(s, _)| *s == shard) {
            return w;
        }
        self.write.retain(|(s, _)| *s + 1 >= shard);
        let w = self.slice.owns(shard)
            && match finished_shard(self.out, self.manifest, shard, Some(first)) {
                Some(r) => {
                    self.p.resumed_texts += r.end_text - r.first_text;
                    false
                }
                None => true,
            };
        self.write.push((shard, w));
        w
    }
}

/// Shard `shard`'s record when it starts at text `first` (when known) and its files match it.
fn finished_shard(
    out: &Path,
    manifest: &Manifest,
    shard: usize,
    first: Option<u64>,
) -> Option<ShardRecord> {
    let r = read_json::<ShardRecord>(&shard_record_path(out, shard)).ok()?;
    let sizes_match = [Split::Train, Split::Eval].iter().all(|&s| {
        std::fs::metadata(tokens_path(out, s, shard))
            .is_ok_and(|m| m.len() == r.part(s).tokens * manifest.width.bytes())
    });
    (r.shard == shard && first.is_none_or(|f| r.first_text == f) && sizes_match).then_some(r)
}

/// After a slice's pass: every shard's record read back (each starting where the one before
/// ended); the index written when all `shards` are there.
fn finish_index(
    out: &Path,
    manifest: &Manifest,
    slice: Slice,
    texts: u64,
    shards: usize,
    t0: std::time::Instant,
) -> Result<std::result::Result<Index, Pending>> {
    let mut records: Vec<ShardRecord> = Vec::with_capacity(shards);
    let mut parts = std::collections::BTreeSet::new();
    for shard in 0..shards {
        // Each shard starts where the one before ended; after a gap, where its record says.
        let first = match records.last() {
            _ if !parts.is_empty() => None,
            Some(r) => Some(r.end_text),
            None => Some(0),
        };
        match finished_shard(out, manifest, shard, first) {
            Some(r) if parts.is_empty() => records.push(r),
            Some(_) => {}
            None => {
                parts.insert(shard % slice.count);
            }
        }
    }
    if !parts.is_empty() {
        return Ok(Err(Pending {
            texts,
            shards,
            finished: records,
            slices: parts.into_iter().collect(),
        }));
    }
    let sum = |f: fn(&ShardRecord) -> u64| records.iter().map(f).sum::<u64>();
    let index = Index {
        manifest: manifest.clone(),
        texts,
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
    Ok(Ok(index))
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

/// Files a killed preparation of this slice left half-written (another slice's are its own).
pub(crate) fn remove_temporaries(out: &Path, slice: Slice) {
    for entry in std::fs::read_dir(out).into_iter().flatten().flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        let Some((stem, _)) = name.split_once(".tmp-") else {
            continue;
        };
        let shard = stem.split(['-', '.']).find_map(|s| s.parse::<usize>().ok());
        if shard.is_none_or(|k| slice.owns(k)) {
            std::fs::remove_file(entry.path()).ok();
        }
    }
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
