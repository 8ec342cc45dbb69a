//! NVIDIA's and Habana's BERT pre-training shards: HDF5 files of already masked sequences, as
//! `create_pretraining_data.py` writes them and Habana's BERT-1.5B job (002) reads them
//! (`hdf5_lower_case_1_seq_len_128_max_pred_20_masked_lm_prob_0.15_random_seed_12345_dupe_factor_5/books_wiki`).
//!
//! Each file holds, for N sequences of `seq` tokens with up to `max_pred` predictions:
//! `input_ids`, `input_mask`, `segment_ids` (N × seq), `masked_lm_positions`, `masked_lm_ids`
//! (N × max_pred; position 0 marks an unused slot, [CLS] is never predicted) and
//! `next_sentence_labels` (N). A job reads sequences one at a time when a batch needs them (the
//! files are never loaded whole; a sequence's gzip chunks are decompressed at each read);
//! `trainbook prepare` reads each shard once, a slab of whole chunks at a time, into records
//! (`text::corpus::records`) that read faster.

use std::path::{Path, PathBuf};

use anyhow::{anyhow, bail, Context, Result};

use crate::models::encoder::IGNORE_INDEX;

/// File extensions of HDF5 shards.
const EXTENSIONS: &[&str] = &["hdf5", "h5"];

/// The datasets of a shard, in the order a [`Slab`] holds them.
pub const FIELDS: [&str; 6] = [
    "input_ids",
    "input_mask",
    "segment_ids",
    "masked_lm_positions",
    "masked_lm_ids",
    "next_sentence_labels",
];

const LAYOUT: &str = "the BERT pre-training layout is input_ids, input_mask, segment_ids [N, seq]; masked_lm_positions, masked_lm_ids [N, max_pred]; next_sentence_labels [N]";

/// One sequence, ready for the model.
#[derive(Clone, Debug, PartialEq)]
pub struct Sequence {
    pub input_ids: Vec<i64>,
    pub input_mask: Vec<i64>,
    pub segment_ids: Vec<i64>,
    /// The original token at each masked position, [`IGNORE_INDEX`] elsewhere.
    pub labels: Vec<i64>,
    pub next_sentence_label: Option<i64>,
}

/// Consecutive sequences of a shard: each dataset's rows (in [`FIELDS`] order, row after row);
/// `next_sentence_labels` empty when the shard has none.
pub struct Slab {
    pub rows: std::ops::Range<usize>,
    pub arrays: [Vec<i64>; 6],
}

fn gcd(a: usize, b: usize) -> usize {
    if b == 0 {
        a
    } else {
        gcd(b, a % b)
    }
}

/// One sequence's arrays as the shards hold them.
pub struct SequenceArrays<'a> {
    pub input_ids: Vec<i64>,
    pub input_mask: Vec<i64>,
    pub segment_ids: Vec<i64>,
    pub masked_lm_positions: &'a [i64],
    pub masked_lm_ids: &'a [i64],
    pub next_sentence_label: Option<i64>,
}

impl Sequence {
    /// The sequence of `a`, read from `path`: the masked positions' ids as labels. Token ids
    /// must be below `vocab`.
    pub fn new(a: SequenceArrays, vocab: i64, path: &Path) -> Result<Self> {
        if let Some(&bad) = a.input_ids.iter().find(|&&t| t < 0 || t >= vocab) {
            bail!(
                "{} holds token id {bad}, outside the tokenizer's vocabulary of {vocab}: train with the vocabulary the shards were made with (--tokenizer DIR with its vocab.txt)",
                path.display()
            );
        }
        let mut labels = vec![IGNORE_INDEX; a.input_ids.len()];
        for (&p, &id) in a.masked_lm_positions.iter().zip(a.masked_lm_ids) {
            // Unused slots hold position 0 ([CLS], never predicted).
            if p > 0 && (p as usize) < labels.len() {
                labels[p as usize] = id;
            }
        }
        Ok(Sequence {
            input_ids: a.input_ids,
            input_mask: a.input_mask,
            segment_ids: a.segment_ids,
            labels,
            next_sentence_label: a.next_sentence_label,
        })
    }
}

struct Shard {
    path: PathBuf,
    file: hdf5::File,
    rows: usize,
    has_nsp: bool,
}

/// A directory of HDF5 shards, opened and checked.
pub struct Hdf5Shards {
    pub dir: PathBuf,
    shards: Vec<Shard>,
    /// The global index of each shard's first sequence.
    starts: Vec<usize>,
    pub rows: usize,
    pub seq_len: usize,
    pub max_pred: usize,
}

/// Whether `dir` holds HDF5 shards.
pub fn is_hdf5_dir(dir: &Path) -> bool {
    dir.is_dir() && !shard_files(dir).is_empty()
}

pub(crate) fn shard_files(dir: &Path) -> Vec<PathBuf> {
    super::files::files_with_extensions(dir, EXTENSIONS).unwrap_or_default()
}

fn shape(file: &hdf5::File, path: &Path, field: &str) -> Result<Option<Vec<usize>>> {
    match file.dataset(field) {
        Ok(ds) => Ok(Some(ds.shape())),
        Err(_) if field == "next_sentence_labels" => Ok(None),
        Err(_) => bail!("{} has no dataset '{field}': {LAYOUT}", path.display()),
    }
}

impl Hdf5Shards {
    /// Opens every shard of `dir` (in name order) and checks each one's datasets and shapes.
    pub fn open(dir: &Path) -> Result<Self> {
        let files = shard_files(dir);
        if files.is_empty() {
            bail!("{} holds no .hdf5 or .h5 file", dir.display());
        }
        let (mut shards, mut starts, mut rows) = (Vec::new(), Vec::new(), 0usize);
        let mut dims: Option<(usize, usize, PathBuf)> = None;
        for path in files {
            let file = hdf5::File::open(&path).map_err(|e| {
                anyhow!(
                    "{} is not a readable HDF5 file ({e}): the shard is damaged or incomplete",
                    path.display()
                )
            })?;
            let ids = shape(&file, &path, "input_ids")?.expect("required");
            let [n, seq] = ids[..] else {
                bail!(
                    "{}: dataset 'input_ids' has shape {ids:?}, not [N, seq]: {LAYOUT}",
                    path.display()
                );
            };
            // Predictions per sequence: the first shard's, else this one's positions.
            let positions = shape(&file, &path, "masked_lm_positions")?.expect("required");
            let max_pred = match &dims {
                Some((_, p, _)) => *p,
                None => positions.get(1).copied().unwrap_or(0),
            };
            for (field, want) in [
                ("input_mask", vec![n, seq]),
                ("segment_ids", vec![n, seq]),
                ("masked_lm_positions", vec![n, max_pred]),
                ("masked_lm_ids", vec![n, max_pred]),
                ("next_sentence_labels", vec![n]),
            ] {
                if let Some(got) = shape(&file, &path, field)? {
                    if got != want && !(field == "next_sentence_labels" && got == [n, 1]) {
                        bail!(
                            "{}: dataset '{field}' has shape {got:?} where {want:?} is expected (input_ids {:?}, {max_pred} predictions per sequence): {LAYOUT}",
                            path.display(),
                            ids
                        );
                    }
                }
            }
            match &dims {
                Some((s, p, first)) if (*s, *p) != (seq, max_pred) => bail!(
                    "{} holds {seq}-token sequences with {max_pred} predictions but {} holds {s} with {p}: a directory is one set of shards",
                    path.display(),
                    first.display()
                ),
                None => dims = Some((seq, max_pred, path.clone())),
                _ => {}
            }
            let has_nsp = file.dataset("next_sentence_labels").is_ok();
            starts.push(rows);
            rows += n;
            shards.push(Shard {
                path,
                file,
                rows: n,
                has_nsp,
            });
        }
        let (seq_len, max_pred, _) = dims.expect("at least one shard");
        Ok(Hdf5Shards {
            dir: dir.to_path_buf(),
            shards,
            starts,
            rows,
            seq_len,
            max_pred,
        })
    }

    /// Whether every shard has next-sentence labels.
    pub fn has_next_sentence_labels(&self) -> bool {
        self.shards.iter().all(|s| s.has_nsp)
    }

    /// The shards, in name order: each one's path, sequences and whether it has next-sentence
    /// labels.
    pub fn shards(&self) -> impl Iterator<Item = (&Path, usize, bool)> {
        self.shards
            .iter()
            .map(|s| (s.path.as_path(), s.rows, s.has_nsp))
    }

    /// Reads shard `k` from its first sequence to its last, in slabs of whole chunks (each
    /// compressed chunk is decompressed once), at least `min_rows` sequences each but the last.
    pub fn read_shard(
        &self,
        k: usize,
        min_rows: usize,
        each: &mut dyn FnMut(&Slab) -> Result<()>,
    ) -> Result<()> {
        let shard = &self.shards[k];
        let fields = if shard.has_nsp { 6 } else { 5 };
        let datasets = FIELDS[..fields]
            .iter()
            .map(|f| shard.file.dataset(f))
            .collect::<hdf5::Result<Vec<_>>>()?;
        // Rows of a slab: a multiple of every dataset's chunk rows, so that no chunk spans two
        // slabs (one beyond 64Ki rows is given up: a chunk may then be read twice).
        let step = datasets
            .iter()
            .filter_map(|d| d.chunk().and_then(|c| c.first().copied()))
            .fold(1usize, |l, r| match l / gcd(l, r.max(1)) * r.max(1) {
                m if m <= 1 << 16 => m,
                _ => l.max(r),
            });
        let slab_rows = step * min_rows.max(1).div_ceil(step);
        let mut start = 0;
        while start < shard.rows {
            let rows = start..(start + slab_rows).min(shard.rows);
            let mut slab = Slab {
                rows: rows.clone(),
                arrays: Default::default(),
            };
            for (k, ds) in datasets.iter().enumerate() {
                let v = if ds.ndim() == 1 {
                    ds.read_slice_1d::<i64, _>(rows.clone())?.to_vec()
                } else {
                    let a = ds.read_slice_2d::<i64, _>((rows.clone(), ..))?;
                    a.iter().copied().collect()
                };
                slab.arrays[k] = v;
            }
            each(&slab).with_context(|| {
                format!(
                    "sequences {}..{} of {}",
                    rows.start,
                    rows.end,
                    shard.path.display()
                )
            })?;
            start = rows.end;
        }
        Ok(())
    }

    /// Sequence `i` (global, shards in name order); token ids must be below `vocab`.
    pub fn get(&self, i: usize, vocab: i64) -> Result<Sequence> {
        let k = self.starts.partition_point(|&s| s <= i) - 1;
        let shard = &self.shards[k];
        let row = i - self.starts[k];
        if row >= shard.rows {
            bail!(
                "sequence {i} is past the end of the shards ({} sequences)",
                self.rows
            );
        }
        let read = |field: &str| -> Result<Vec<i64>> {
            let ds = shard.file.dataset(field)?;
            let v = if ds.ndim() == 1 {
                ds.read_slice_1d::<i64, _>(row..row + 1)?
            } else {
                ds.read_slice_1d::<i64, _>((row, ..))?
            };
            Ok(v.to_vec())
        };
        let context = |field: &str| {
            format!(
                "reading '{field}' of sequence {row} in {}",
                shard.path.display()
            )
        };
        let positions =
            read("masked_lm_positions").with_context(|| context("masked_lm_positions"))?;
        let ids = read("masked_lm_ids").with_context(|| context("masked_lm_ids"))?;
        Sequence::new(
            SequenceArrays {
                input_ids: read("input_ids").with_context(|| context("input_ids"))?,
                input_mask: read("input_mask").with_context(|| context("input_mask"))?,
                segment_ids: read("segment_ids").with_context(|| context("segment_ids"))?,
                masked_lm_positions: &positions,
                masked_lm_ids: &ids,
                next_sentence_label: match shard.has_nsp {
                    true => read("next_sentence_labels")?.first().copied(),
                    false => None,
                },
            },
            vocab,
            &shard.path,
        )
    }
}

/// A shard for tests and benchmarks, in the pre-training layout as `create_pretraining_data.py`
/// writes it (int32 datasets, gzip): `n` sequences of `seq` tokens ([CLS] ... [SEP], ids from a
/// 30,522-token vocabulary) with 2 to `max_pred` masked positions each (unused slots hold
/// position 0), drawn from `seed`. Chunks of 16 × 8, 24 × `max_pred` and 40 values, so that
/// datasets' chunks end at different rows. `leave_out` drops a dataset.
#[doc(hidden)]
pub fn write_example_shard(
    path: &Path,
    n: usize,
    seq: usize,
    max_pred: usize,
    seed: u64,
    leave_out: Option<&str>,
) -> Result<()> {
    let mut state = seed
        .wrapping_mul(6364136223846793005)
        .wrapping_add(1442695040888963407);
    let mut next = |below: usize| -> usize {
        // splitmix64
        state = state.wrapping_add(0x9e3779b97f4a7c15);
        let mut z = state;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58476d1ce4e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d049bb133111eb);
        ((z ^ (z >> 31)) % below as u64) as usize
    };
    let mut ids = vec![0i32; n * seq];
    let (mut positions, mut labels) = (vec![0i32; n * max_pred], vec![0i32; n * max_pred]);
    for r in 0..n {
        let row = &mut ids[r * seq..(r + 1) * seq];
        for t in row.iter_mut() {
            *t = 1000 + next(30522 - 1000) as i32;
        }
        (row[0], row[seq - 1]) = (101, 102);
        let k = 2 + next(max_pred - 1);
        let mut chosen: Vec<usize> = Vec::new();
        while chosen.len() < k.min(seq - 2) {
            let p = 1 + next(seq - 2);
            if !chosen.contains(&p) {
                chosen.push(p);
            }
        }
        chosen.sort();
        for (j, &p) in chosen.iter().enumerate() {
            positions[r * max_pred + j] = p as i32;
            labels[r * max_pred + j] = row[p];
            row[p] = 103; // [MASK]
        }
    }
    let segments: Vec<i32> = (0..n * seq)
        .map(|i| i32::from(i % seq >= seq / 2))
        .collect();
    let nsp: Vec<i32> = (0..n).map(|_| next(2) as i32).collect();
    let file = hdf5::File::create(path)?;
    let write = |name: &str, values: &[i32], cols: usize, chunk: (usize, usize)| {
        if leave_out == Some(name) {
            return Ok(());
        }
        let ds = if cols == 0 {
            file.new_dataset::<i32>()
                .shape([n])
                .chunk([chunk.0.min(n)])
                .deflate(4)
                .create(name)?
        } else {
            file.new_dataset::<i32>()
                .shape([n, cols])
                .chunk([chunk.0.min(n), chunk.1.min(cols)])
                .deflate(4)
                .create(name)?
        };
        ds.write_raw(values)
    };
    write("input_ids", &ids, seq, (16, 8))?;
    write("input_mask", &vec![1; n * seq], seq, (16, 8))?;
    write("segment_ids", &segments, seq, (16, 8))?;
    write("masked_lm_positions", &positions, max_pred, (24, max_pred))?;
    write("masked_lm_ids", &labels, max_pred, (24, max_pred))?;
    write("next_sentence_labels", &nsp, 0, (40, 0))?;
    Ok(())
}
