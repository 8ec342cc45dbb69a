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

/// A file of a prepared set, mapped read-only; its CRC-32C, when its index has one, is verified
/// the first time it is read. A file's size is checked when it is opened.
pub(crate) struct MappedPart {
    pub(crate) path: PathBuf,
    map: Option<Mmap>,
    /// `None`: the file's records carry their own checksums, checked by its reader.
    crc32c: Option<u32>,
    checked: OnceLock<std::result::Result<(), String>>,
    /// The set's index file, named in errors.
    index: &'static str,
}

impl MappedPart {
    /// `path`, which `index` says holds `len` bytes with checksum `crc32c`.
    pub(crate) fn open(
        path: PathBuf,
        len: u64,
        crc32c: Option<u32>,
        index: &'static str,
    ) -> Result<Self> {
        let got = std::fs::metadata(&path)
            .map_err(|e| {
                anyhow!(
                    "{} is missing ({e}): the prepared set is damaged; prepare it again (`trainbook prepare`)",
                    path.display()
                )
            })?
            .len();
        if got != len {
            bail!(
                "{} is truncated or damaged: {got} bytes where {index} says {len}; prepare it again (`trainbook prepare`)",
                path.display()
            );
        }
        let map = if len == 0 {
            None
        } else {
            let f = std::fs::File::open(&path)
                .with_context(|| format!("opening {}", path.display()))?;
            // SAFETY: the file is only ever replaced by rename, never written in place, so
            // the mapped bytes do not change under the reader.
            let map =
                unsafe { Mmap::map(&f) }.with_context(|| format!("mapping {}", path.display()))?;
            // Read at random: no read-ahead, no mapping of the pages around a read, so a
            // worker's resident memory is what it reads.
            map.advise(memmap2::Advice::Random).ok();
            Some(map)
        };
        Ok(MappedPart {
            path,
            map,
            crc32c,
            checked: OnceLock::new(),
            index,
        })
    }

    /// The file's bytes, its checksum (if any) verified on the first call.
    pub(crate) fn bytes(&self) -> Result<&[u8]> {
        self.checked
            .get_or_init(|| match (self.crc32c, self.crc32c.map(|_| file_crc32c(&self.path))) {
                (Some(want), Some(Ok(crc))) if crc != want => Err(format!(
                    "{} is damaged: its checksum is {crc:08x} where {} says {want:08x}; prepare it again (`trainbook prepare`)",
                    self.path.display(),
                    self.index,
                )),
                (_, Some(Err(e))) => Err(format!("{e:#}")),
                _ => Ok(()),
            })
            .clone()
            .map_err(|e| anyhow!(e))?;
        Ok(self.map.as_deref().unwrap_or(&[]))
    }
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
            let len = part.tokens * width.bytes();
            starts.push(tokens);
            tokens += part.tokens;
            parts.push(MappedPart::open(path, len, Some(part.crc32c), INDEX)?);
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
            let bytes = part.bytes()?;
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
}
