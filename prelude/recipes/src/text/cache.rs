//! On-disk cache of tokenised texts, keyed by (texts, tokenizer, max_length): large tables are
//! tokenised once, and every worker of every later run reads the result.
//!
//! The key hashes the texts themselves (not the file name), so a changed file, another split
//! or another row selection can never reuse stale tokens. Writes are atomic (temp + rename),
//! so workers racing on the same entry are harmless. A cache that cannot be written is skipped.

use std::hash::{Hash, Hasher};
use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use tch::Tensor;

use super::tokenizer::{Encoded, TextTokenizer};

/// Bumped when the file layout changes.
const FORMAT: u32 = 1;

fn key(tok: &TextTokenizer, texts: &[&str], pairs: Option<&[&str]>) -> String {
    // SipHash with fixed keys: stable across processes (a Rust upgrade may change it, which
    // only costs one re-tokenisation).
    #[allow(deprecated)]
    let mut h = std::hash::SipHasher::new();
    FORMAT.hash(&mut h);
    tok.fingerprint().hash(&mut h);
    tok.max_length().hash(&mut h);
    texts.hash(&mut h);
    // Absent for single texts, so their keys (and cached entries) stay what they were.
    if let Some(p) = pairs {
        p.hash(&mut h);
    }
    format!("{:016x}-{}", h.finish(), texts.len())
}

fn read(path: &Path) -> Result<Vec<Encoded>> {
    let t: std::collections::HashMap<String, Tensor> =
        Tensor::read_safetensors(path)?.into_iter().collect();
    let get = |n: &str| -> Result<Vec<i64>> {
        Ok(Vec::<i64>::try_from(
            t.get(n).context("incomplete cache entry")?,
        )?)
    };
    let (ids, types, offsets) = (get("ids")?, get("type_ids")?, get("offsets")?);
    Ok(offsets
        .windows(2)
        .map(|w| {
            let r = w[0] as usize..w[1] as usize;
            Encoded {
                ids: ids[r.clone()].to_vec(),
                type_ids: types[r].to_vec(),
            }
        })
        .collect())
}

fn write(path: &Path, enc: &[Encoded]) -> Result<()> {
    let mut offsets = vec![0i64];
    for e in enc {
        offsets.push(offsets.last().unwrap() + e.ids.len() as i64);
    }
    let ids: Vec<i64> = enc.iter().flat_map(|e| e.ids.iter().copied()).collect();
    let types: Vec<i64> = enc
        .iter()
        .flat_map(|e| e.type_ids.iter().copied())
        .collect();
    let (ids, types, offsets) = (
        Tensor::from_slice(&ids),
        Tensor::from_slice(&types),
        Tensor::from_slice(&offsets),
    );
    std::fs::create_dir_all(path.parent().unwrap_or(Path::new(".")))?;
    trainbook_engine::checkpoint::write_file_atomic(path, |tmp| {
        Tensor::write_safetensors(
            &[("ids", &ids), ("type_ids", &types), ("offsets", &offsets)],
            tmp,
        )?;
        Ok(())
    })
}

/// Where entries live: `$TRAINBOOK_CACHE`, else `<data dir>/cache/tokenized`.
pub fn cache_dir() -> PathBuf {
    std::env::var_os("TRAINBOOK_CACHE")
        .map(PathBuf::from)
        .unwrap_or_else(|| crate::assets::data_dir().join("cache").join("tokenized"))
}

/// Whether the tokens came from the cache.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Hit {
    Cached,
    Computed,
}

/// Tokenises `texts` (with `pairs`: sentence pairs), or reads them from `dir` when this exact
/// job was done before.
pub fn encode_cached(
    tok: &TextTokenizer,
    texts: &[&str],
    pairs: Option<&[&str]>,
    dir: &Path,
) -> Result<(Vec<Encoded>, Hit)> {
    let path = dir.join(format!("{}.safetensors", key(tok, texts, pairs)));
    if let Ok(enc) = read(&path) {
        if enc.len() == texts.len() {
            return Ok((enc, Hit::Cached));
        }
    }
    let enc = match pairs {
        Some(p) => tok.encode_pairs(texts, p)?,
        None => tok.encode_batch(texts)?,
    };
    // Best effort: a read-only data directory only costs speed.
    write(&path, &enc).ok();
    Ok((enc, Hit::Computed))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn second_encoding_is_a_cache_hit_with_identical_tokens() {
        let dir = std::env::temp_dir().join(format!("trainbook-tokcache-{}", std::process::id()));
        let tok = TextTokenizer::from_dir(&crate::assets::minilm_dir(), 16, true).unwrap();
        let texts = ["a fine film", "dull and far too long", ""];
        let (a, h1) = encode_cached(&tok, &texts, None, &dir).unwrap();
        let (b, h2) = encode_cached(&tok, &texts, None, &dir).unwrap();
        assert_eq!((h1, h2), (Hit::Computed, Hit::Cached));
        assert_eq!(a, b);
        // Another max_length or other texts are other entries.
        let tok8 = TextTokenizer::from_dir(&crate::assets::minilm_dir(), 8, true).unwrap();
        assert_eq!(
            encode_cached(&tok8, &texts, None, &dir).unwrap().1,
            Hit::Computed
        );
        assert_eq!(
            encode_cached(&tok, &texts[..2], None, &dir).unwrap().1,
            Hit::Computed
        );
        std::fs::remove_dir_all(dir).ok();
    }
}
