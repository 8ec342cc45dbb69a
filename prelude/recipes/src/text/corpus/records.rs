//! NVIDIA's and Habana's BERT pre-training HDF5 shards prepared once into fixed-size records
//! that every worker memory-maps: a sequence is then a slice of a mapping, where reading it from
//! its shard decompresses the gzip chunks around it (~5 ms a sequence).
//!
//! ```text
//! <dir>/records-prepare.json  what is being prepared (the shards' names, sizes, modification
//!                             times and shapes; the record layout): written first
//! <dir>/records-00000.bin     shard 0's sequences (shards in name order), one record each
//! <dir>/records.json          written last: the same header and each file's sequences
//! ```
//!
//! A record holds its sequence's arrays as the shard does, one after the other, every value a
//! little-endian i32: `input_ids`, `input_mask`, `segment_ids` (`seq_len` each),
//! `masked_lm_positions`, `masked_lm_ids` (`max_pred` each) and `next_sentence_labels` (1; 0
//! for a shard without them, whose entry says so); then `crc32c`, the CRC-32C of the record's
//! bytes before it (a u32), checked at every read: a record is verified as it is read, where a
//! checksum of the whole file would make a job's first reads read every file whole. The header
//! gives each array's offset, shape and type. The masked positions and labels are the shards'
//! own (the data is masked once, when the shards are made): a job reads exactly the sequences
//! it reads from the shards.
//!
//! Every file is written under a temporary name and renamed when whole, `records.json` last: a
//! job never reads a half-written set, and a stopped preparation continues after its last whole
//! file.

use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use serde::{Deserialize, Serialize};

use super::layout::{is_set, read_complete, read_json};
use super::mapped::MappedPart;
use super::prepare::{remove_temporaries, source_fingerprint, DirLock, Progress};
use crate::text::hdf5_shards::{self, Hdf5Shards, Sequence, SequenceArrays, FIELDS};

/// Bumped when the layout changes; a job refuses other versions.
pub const FORMAT: u32 = 2;
pub const INDEX: &str = "records.json";
pub const MANIFEST: &str = "records-prepare.json";
const KIND: &str = "hdf5-records";
/// Sequences read from a shard at a time (at least: whole chunks are read).
pub const SLAB_ROWS: usize = 4096;
/// Bytes of a stored value.
const WIDTH: usize = 4;
/// The last field of a record: the CRC-32C of the bytes before it.
const CHECKSUM: &str = "crc32c";

/// A source shard.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct SourceShard {
    /// Its file name in the source directory.
    pub name: String,
    pub bytes: u64,
    /// Modification time, nanoseconds since 1970.
    pub modified_ns: Option<u64>,
    pub sequences: u64,
    pub next_sentence_labels: bool,
}

/// One array of a record.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct RecordArray {
    pub name: String,
    /// Per sequence.
    pub shape: Vec<usize>,
    /// NumPy's notation: `<i4`, little-endian 32-bit integers.
    pub dtype: String,
    /// Bytes from the record's start.
    pub offset: usize,
}

/// What a set of records is prepared from, and how a record is laid out.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Manifest {
    pub format: u32,
    pub kind: String,
    pub source_dir: PathBuf,
    /// The shards' canonical paths, sizes and modification times, hashed: the cache key.
    pub source: String,
    pub shards: Vec<SourceShard>,
    pub seq_len: usize,
    pub max_pred: usize,
    pub record_bytes: usize,
    pub arrays: Vec<RecordArray>,
}

/// A whole records file.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct RecordsFile {
    pub file: String,
    pub sequences: u64,
}

/// A complete set of records.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Index {
    pub manifest: Manifest,
    pub sequences: u64,
    pub files: Vec<RecordsFile>,
    pub seconds: f64,
}

/// The arrays of a record of `seq`-token sequences with `max_pred` predictions: the shards'
/// [`FIELDS`], then the checksum of the bytes before it.
fn record_layout(seq: usize, max_pred: usize) -> Vec<RecordArray> {
    let mut offset = 0;
    FIELDS
        .iter()
        .zip([seq, seq, seq, max_pred, max_pred, 1])
        .map(|(name, n)| (*name, n, "<i4"))
        .chain([(CHECKSUM, 1, "<u4")])
        .map(|(name, n, dtype)| {
            let a = RecordArray {
                name: name.to_string(),
                shape: vec![n],
                dtype: dtype.into(),
                offset,
            };
            offset += n * WIDTH;
            a
        })
        .collect()
}

fn records_path(dir: &Path, k: usize) -> PathBuf {
    dir.join(format!("records-{k:05}.bin"))
}

/// Whether `dir` is (or is becoming) a set of records.
pub fn is_records(dir: &Path) -> bool {
    is_set(dir, INDEX, MANIFEST)
}

/// The index of the complete set of records in `dir`.
pub fn read_index(dir: &Path) -> Result<Index> {
    let index: Index = read_complete(
        dir,
        (INDEX, MANIFEST),
        "holds unfinished records of HDF5 shards (their preparation was stopped): run the same `trainbook prepare` again to finish them",
        &format!("holds no records ({INDEX})"),
    )?;
    let m = &index.manifest;
    if m.format != FORMAT || m.kind != KIND || m.arrays != record_layout(m.seq_len, m.max_pred) {
        bail!(
            "{} holds records in format {} but this trainbook reads format {FORMAT}: remove it and prepare the shards again (`trainbook prepare --data {}`)",
            dir.display(),
            m.format,
            m.source_dir.display()
        );
    }
    Ok(index)
}

/// Where `trainbook prepare` puts the records of the shards in `shards_dir` when given no
/// `--out`, and where a job given the shards looks for them: the prepared-corpus cache, keyed by
/// the shard files (path, size, modification time).
pub fn cache_path(shards_dir: &Path) -> Result<PathBuf> {
    let files = hdf5_shards::shard_files(shards_dir);
    if files.is_empty() {
        bail!("{} holds no .hdf5 or .h5 file", shards_dir.display());
    }
    let key = source_fingerprint(&files)?;
    Ok(super::cache_dir().join(format!("{KIND}-v{FORMAT}-{key}")))
}

/// The complete records of the shards in `shards_dir` in the cache, if they were prepared.
pub fn cached(shards_dir: &Path) -> Option<PathBuf> {
    cache_path(shards_dir)
        .ok()
        .filter(|d| d.join(INDEX).is_file())
}

/// The manifest of preparing `shards`.
pub fn manifest(shards: &Hdf5Shards) -> Result<Manifest> {
    let files: Vec<PathBuf> = shards.shards().map(|(p, ..)| p.to_path_buf()).collect();
    let mut list = Vec::new();
    for (path, rows, nsp) in shards.shards() {
        let meta =
            std::fs::metadata(path).with_context(|| format!("reading {}", path.display()))?;
        list.push(SourceShard {
            name: path
                .file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_default(),
            bytes: meta.len(),
            modified_ns: meta
                .modified()
                .ok()
                .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
                .map(|d| d.as_nanos() as u64),
            sequences: rows as u64,
            next_sentence_labels: nsp,
        });
    }
    let arrays = record_layout(shards.seq_len, shards.max_pred);
    let last = arrays.last().expect("arrays");
    Ok(Manifest {
        format: FORMAT,
        kind: KIND.into(),
        source_dir: std::fs::canonicalize(&shards.dir).unwrap_or(shards.dir.clone()),
        source: source_fingerprint(&files)?,
        shards: list,
        seq_len: shards.seq_len,
        max_pred: shards.max_pred,
        record_bytes: last.offset + last.shape[0] * WIDTH,
        arrays,
    })
}

/// Prepares the HDF5 shards in `shards_dir` into records in `out` (created): each shard read
/// once, from start to end, `min_rows` sequences or more at a time. Continues a stopped
/// preparation of the same shards; returns at once when `out` already holds them.
pub fn prepare(
    shards_dir: &Path,
    out: &Path,
    min_rows: usize,
    progress: &mut dyn FnMut(&Progress) -> Result<()>,
) -> Result<Index> {
    let shards = Hdf5Shards::open(shards_dir)?;
    let manifest = manifest(&shards)?;
    let _lock = DirLock::take(out)?;
    if out.join(INDEX).is_file() {
        let index = read_index(out)?;
        if index.manifest == manifest {
            return Ok(index);
        }
        bail!("{}", other_records(out, &index.manifest));
    }
    let manifest_path = out.join(MANIFEST);
    if manifest_path.is_file() {
        let there: Manifest = read_json(&manifest_path)?;
        if there != manifest && records_path(out, 0).is_file() {
            bail!("{}", other_records(out, &there));
        }
    }
    trainbook_engine::checkpoint::write_json_atomic(&manifest_path, &manifest)?;
    remove_temporaries(out, super::prepare::Slice::WHOLE);

    let t0 = std::time::Instant::now();
    let mut p = Progress {
        total_bytes: manifest.shards.iter().map(|s| s.bytes).sum(),
        ..Default::default()
    };
    let mut files = Vec::new();
    for (k, source) in manifest.shards.iter().enumerate() {
        let path = records_path(out, k);
        let len = source.sequences * manifest.record_bytes as u64;
        if std::fs::metadata(&path).is_ok_and(|m| m.len() == len) {
            // Whole: written, then renamed, by a preparation that stopped later.
            p.resumed_texts += source.sequences;
        } else {
            let (bytes_before, texts_before) = (before(&manifest, k), p.texts);
            write_records(&shards, k, &manifest, &path, min_rows, &mut |done| {
                p.bytes = bytes_before + source.bytes * done / source.sequences.max(1);
                p.texts = texts_before + done;
                p.tokens = p.texts * manifest.seq_len as u64;
                p.seconds = t0.elapsed().as_secs_f64();
                progress(&p)
            })?;
        }
        p.bytes = before(&manifest, k + 1);
        p.texts = manifest.shards[..=k].iter().map(|s| s.sequences).sum();
        p.tokens = p.texts * manifest.seq_len as u64;
        files.push(RecordsFile {
            file: path
                .file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_default(),
            sequences: source.sequences,
        });
    }
    p.seconds = t0.elapsed().as_secs_f64();
    progress(&p)?;
    let index = Index {
        sequences: files.iter().map(|f| f.sequences).sum(),
        manifest,
        files,
        seconds: p.seconds,
    };
    trainbook_engine::checkpoint::write_json_atomic(&out.join(INDEX), &index)?;
    Ok(index)
}

/// Source bytes of the shards before shard `k`.
fn before(m: &Manifest, k: usize) -> u64 {
    m.shards[..k].iter().map(|s| s.bytes).sum()
}

fn other_records(out: &Path, there: &Manifest) -> String {
    format!(
        "{} holds records of other shards ({}, or the same shards since changed): remove it, or prepare into another --out",
        out.display(),
        there.source_dir.display()
    )
}

/// Writes shard `k`'s records to `path` (a temporary name, renamed when whole); `done` is told
/// the sequences written so far after each slab.
fn write_records(
    shards: &Hdf5Shards,
    k: usize,
    m: &Manifest,
    path: &Path,
    min_rows: usize,
    done: &mut dyn FnMut(u64) -> Result<()>,
) -> Result<()> {
    let tmp = PathBuf::from(format!("{}.tmp-{}", path.display(), std::process::id()));
    let file = File::create(&tmp).with_context(|| format!("creating {}", tmp.display()))?;
    let mut w = BufWriter::with_capacity(1 << 20, file);
    let mut buf = Vec::new();
    let fields = &m.arrays[..FIELDS.len()];
    let source = shards.shards().nth(k).expect("shard k").0.to_path_buf();
    shards.read_shard(k, min_rows, &mut |slab| {
        let n = slab.rows.len();
        buf.clear();
        buf.reserve(n * m.record_bytes);
        for (a, array) in fields.iter().enumerate() {
            let (got, per) = (slab.arrays[a].len(), array.shape[0]);
            if got != n * per && !(a == 5 && got == 0) {
                bail!(
                    "'{}' gave {got} values for {n} sequences of {per}",
                    array.name
                );
            }
        }
        for r in 0..n {
            let start = buf.len();
            for (a, array) in fields.iter().enumerate() {
                let per = array.shape[0];
                let values = &slab.arrays[a];
                if values.is_empty() {
                    // A shard without next-sentence labels (its entry says so).
                    buf.extend_from_slice(&vec![0u8; per * WIDTH]);
                    continue;
                }
                for &v in &values[r * per..(r + 1) * per] {
                    let v = i32::try_from(v).map_err(|_| {
                        anyhow::anyhow!(
                            "{}: '{}' of sequence {} holds {v}, which does not fit 32 bits",
                            source.display(),
                            array.name,
                            slab.rows.start + r
                        )
                    })?;
                    buf.extend_from_slice(&v.to_le_bytes());
                }
            }
            let crc = crc32c::crc32c(&buf[start..]);
            buf.extend_from_slice(&crc.to_le_bytes());
        }
        w.write_all(&buf)
            .with_context(|| format!("writing {}", tmp.display()))?;
        done(slab.rows.end as u64)
    })?;
    let f = w
        .into_inner()
        .map_err(|e| anyhow::anyhow!("writing {}: {}", tmp.display(), e.error()))?;
    f.sync_all()
        .with_context(|| format!("writing {}", tmp.display()))?;
    std::fs::rename(&tmp, path)
        .with_context(|| format!("renaming {} to {}", tmp.display(), path.display()))
}

/// What `CorpusPreparer::prepare` and `trainbook prepare` do with a directory of HDF5 shards.
/// The tokenizer, held-out share and shard size do not apply (the shards are tokenised and
/// masked; a job holds out every n-th sequence as it does reading the shards).
pub fn prepare_spec(
    spec: &trainbook_api::CorpusPreparer,
    out: &Path,
    progress: &mut dyn FnMut(&Progress) -> Result<()>,
) -> Result<trainbook_api::PreparedCorpus> {
    if spec.slice.is_some() {
        bail!(
            "{} holds HDF5 shards, which one process prepares (reading is all it does): drop --slice",
            spec.data.display()
        );
    }
    let t0 = std::time::Instant::now();
    let index = prepare(&spec.data, out, SLAB_ROWS, progress)?;
    let m = &index.manifest;
    Ok(trainbook_api::PreparedCorpus {
        dir: std::fs::canonicalize(out).unwrap_or(out.to_path_buf()),
        texts: index.sequences,
        train_tokens: index.sequences * m.seq_len as u64,
        eval_tokens: 0,
        shards: index.files.len(),
        disk_bytes: index.sequences * m.record_bytes as u64,
        text_bytes: m.shards.iter().map(|s| s.bytes).sum(),
        seconds: t0.elapsed().as_secs_f64(),
        pending_slices: Vec::new(),
    })
}

/// A set of records, opened: its files mapped, a sequence read when a batch needs it.
pub struct Hdf5Records {
    pub dir: PathBuf,
    pub index: Index,
    parts: Vec<MappedPart>,
    /// The global index of each file's first sequence.
    starts: Vec<u64>,
    pub rows: usize,
    pub seq_len: usize,
    pub max_pred: usize,
}

impl Hdf5Records {
    pub fn open(dir: &Path) -> Result<Self> {
        let index = read_index(dir)?;
        let m = &index.manifest;
        if index.files.len() != m.shards.len() {
            bail!(
                "{} lists {} records files for {} shards: prepare the shards again",
                dir.join(INDEX).display(),
                index.files.len(),
                m.shards.len()
            );
        }
        let (mut parts, mut starts, mut rows) = (Vec::new(), Vec::new(), 0u64);
        for f in &index.files {
            let len = f.sequences * m.record_bytes as u64;
            parts.push(MappedPart::open(dir.join(&f.file), len, None, INDEX)?);
            starts.push(rows);
            rows += f.sequences;
        }
        Ok(Hdf5Records {
            dir: dir.to_path_buf(),
            parts,
            starts,
            rows: rows as usize,
            seq_len: m.seq_len,
            max_pred: m.max_pred,
            index,
        })
    }

    /// Whether every source shard had next-sentence labels.
    pub fn has_next_sentence_labels(&self) -> bool {
        self.index
            .manifest
            .shards
            .iter()
            .all(|s| s.next_sentence_labels)
    }

    /// Sequence `i` (global, shards in name order), exactly as [`Hdf5Shards::get`] reads it
    /// from the shards; token ids must be below `vocab`.
    pub fn get(&self, i: usize, vocab: i64) -> Result<Sequence> {
        if i >= self.rows {
            bail!(
                "sequence {i} is past the end of the records ({} sequences)",
                self.rows
            );
        }
        // The last file starting at or before `i`: an empty file starts where the next one
        // does, so it is never the one chosen.
        let k = self.starts.partition_point(|&s| s <= i as u64) - 1;
        let m = &self.index.manifest;
        let row = (i as u64 - self.starts[k]) as usize;
        let at = row * m.record_bytes;
        let part = &self.parts[k];
        let record = &part.bytes()?[at..at + m.record_bytes];
        let (body, crc) = record.split_at(m.record_bytes - WIDTH);
        let want = u32::from_le_bytes([crc[0], crc[1], crc[2], crc[3]]);
        if crc32c::crc32c(body) != want {
            bail!(
                "{} is damaged: sequence {row}'s record does not match its checksum; prepare the shards again (`trainbook prepare --data {}`, into a new --out)",
                part.path.display(),
                m.source_dir.display()
            );
        }
        let ints = |a: usize| -> Vec<i64> {
            let (from, n) = (m.arrays[a].offset, m.arrays[a].shape[0]);
            record[from..from + n * WIDTH]
                .chunks_exact(WIDTH)
                .map(|c| i32::from_le_bytes([c[0], c[1], c[2], c[3]]) as i64)
                .collect()
        };
        let (positions, ids) = (ints(3), ints(4));
        Sequence::new(
            SequenceArrays {
                input_ids: ints(0),
                input_mask: ints(1),
                segment_ids: ints(2),
                masked_lm_positions: &positions,
                masked_lm_ids: &ids,
                next_sentence_label: match m.shards[k].next_sentence_labels {
                    true => ints(5).first().copied(),
                    false => None,
                },
            },
            vocab,
            &part.path,
        )
    }
}

#[cfg(test)]
#[path = "records_tests.rs"]
mod tests;
