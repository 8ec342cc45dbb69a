//! Reading a prepared corpus: its token shards memory-mapped, blocks cut on demand.
//!
//! Nothing of the corpus is copied into the process: a block is read from the mapping when a
//! batch needs it, so a worker's memory does not grow with the corpus. Each split is one
//! token stream (its shards in order), and block `k` is tokens `k * len .. (k + 1) * len` of
//! it: exactly the blocks of [`crate::text::mlm::group_texts`] over the same texts. A shard's
//! size is checked when the set is opened and its checksum the first time a block touches it.

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use anyhow::{anyhow, bail, Context, Result};
use memmap2::Mmap;

use super::layout::*;
use super::prepare::file_crc32c;

/// A prepared corpus, opened.
pub struct PreparedCorpus {
    pub dir: PathBuf,
    pub index: Index,
    train: Stream,
    eval: Stream,
}

impl PreparedCorpus {
    pub fn open(dir: &Path) -> Result<Self> {
        let index = read_index(dir)?;
        let stream = |split| Stream::open(dir, &index, split);
        Ok(PreparedCorpus {
            dir: dir.to_path_buf(),
            train: stream(Split::Train)?,
            eval: stream(Split::Eval)?,
            index,
        })
    }

    pub fn stream(&self, split: Split) -> &Stream {
        match split {
            Split::Train => &self.train,
            Split::Eval => &self.eval,
        }
    }

    /// Fails unless the set was tokenised by the tokenizer with `fingerprint`.
    pub fn check_tokenizer(&self, fingerprint: u64, tokenizer_dir: &Path) -> Result<()> {
        let m = &self.index.manifest;
        if m.tokenizer != format!("{fingerprint:016x}") {
            bail!(
                "{} was prepared with another tokenizer (the one in {}) than this job's ({}): prepare it again with `trainbook prepare --tokenizer {}`, or train with the tokenizer it was made with",
                self.dir.display(),
                m.tokenizer_dir.display(),
                tokenizer_dir.display(),
                tokenizer_dir.display()
            );
        }
        Ok(())
    }
}

struct MappedPart {
    path: PathBuf,
    map: Option<Mmap>,
    crc32c: u32,
    checked: OnceLock<std::result::Result<(), String>>,
}

/// One split's tokens, the shards in order.
pub struct Stream {
    parts: Vec<MappedPart>,
    /// The stream position where each part starts.
    starts: Vec<u64>,
    tokens: u64,
    width: TokenWidth,
}

impl Stream {
    fn open(dir: &Path, index: &Index, split: Split) -> Result<Self> {
        let width = index.manifest.width;
        let (mut parts, mut starts, mut tokens) = (Vec::new(), Vec::new(), 0u64);
        for r in &index.shards {
            let part = r.part(split);
            let path = tokens_path(dir, split, r.shard);
            let len = std::fs::metadata(&path)
                .map_err(|e| {
                    anyhow!(
                        "{} is missing ({e}): the prepared corpus is damaged; prepare it again",
                        path.display()
                    )
                })?
                .len();
            if len != part.tokens * width.bytes() {
                bail!(
                    "{} is truncated or damaged: {len} bytes where {INDEX} says {}; prepare the corpus again (`trainbook prepare`)",
                    path.display(),
                    part.tokens * width.bytes()
                );
            }
            let map = if len == 0 {
                None
            } else {
                let f = std::fs::File::open(&path)
                    .with_context(|| format!("opening {}", path.display()))?;
                // SAFETY: the file is only ever replaced by rename, never written in place, so
                // the mapped bytes do not change under the reader.
                let map = unsafe { Mmap::map(&f) }
                    .with_context(|| format!("mapping {}", path.display()))?;
                // Blocks are read at random: no read-ahead, no mapping of the pages around a
                // block, so a worker's resident memory is the blocks it reads.
                map.advise(memmap2::Advice::Random).ok();
                Some(map)
            };
            starts.push(tokens);
            tokens += part.tokens;
            parts.push(MappedPart {
                path,
                map,
                crc32c: part.crc32c,
                checked: OnceLock::new(),
            });
        }
        Ok(Stream {
            parts,
            starts,
            tokens,
            width,
        })
    }

    pub fn tokens(&self) -> u64 {
        self.tokens
    }

    /// Whole blocks of `len` tokens (the remainder is dropped).
    pub fn blocks(&self, len: usize) -> usize {
        (self.tokens / len.max(1) as u64) as usize
    }

    /// Block `k` of `len` tokens.
    pub fn block(&self, k: usize, len: usize) -> Result<Vec<i64>> {
        let (mut pos, end) = (k as u64 * len as u64, (k as u64 + 1) * len as u64);
        if end > self.tokens {
            bail!(
                "block {k} of {len} tokens is past the end of the stream ({} tokens)",
                self.tokens
            );
        }
        let mut out = Vec::with_capacity(len);
        while pos < end {
            // The last part starting at or before `pos`: an empty part starts where the next
            // one does, so it is never the one chosen.
            let i = self.starts.partition_point(|&s| s <= pos) - 1;
            let part = &self.parts[i];
            let from = pos - self.starts[i];
            let n = (end - pos).min(self.part_tokens(i) - from);
            self.check(part)?;
            let bytes = part.map.as_ref().expect("a part with tokens is mapped");
            let w = self.width.bytes() as usize;
            let slice = &bytes[from as usize * w..(from + n) as usize * w];
            match self.width {
                TokenWidth::U16 => out.extend(
                    slice
                        .chunks_exact(2)
                        .map(|c| u16::from_le_bytes([c[0], c[1]]) as i64),
                ),
                TokenWidth::U32 => out.extend(
                    slice
                        .chunks_exact(4)
                        .map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]]) as i64),
                ),
            }
            pos += n;
        }
        Ok(out)
    }

    fn part_tokens(&self, i: usize) -> u64 {
        self.starts.get(i + 1).copied().unwrap_or(self.tokens) - self.starts[i]
    }

    /// The part's checksum, verified once.
    fn check(&self, part: &MappedPart) -> Result<()> {
        part.checked
            .get_or_init(|| match file_crc32c(&part.path) {
                Ok(crc) if crc == part.crc32c => Ok(()),
                Ok(crc) => Err(format!(
                    "{} is damaged: its checksum is {crc:08x} where {INDEX} says {:08x}; prepare the corpus again (`trainbook prepare`)",
                    part.path.display(),
                    part.crc32c
                )),
                Err(e) => Err(format!("{e:#}")),
            })
            .clone()
            .map_err(|e| anyhow!(e))
    }
}
