//! Tokenisation with the `tokenizers` crate: `tokenizer.json` when the model has one, else a
//! BERT WordPiece tokenizer built from `vocab.txt`. Whatever truncation or padding the file
//! presets is replaced by the caller's: truncation to `max_length`, padding chosen per batch.

use std::path::Path;

use anyhow::{anyhow, bail, Context, Result};
use tch::Tensor;
use tokenizers::decoders::wordpiece::WordPiece as WordPieceDecoder;
use tokenizers::models::wordpiece::WordPiece;
use tokenizers::normalizers::bert::BertNormalizer;
use tokenizers::pre_tokenizers::bert::BertPreTokenizer;
use tokenizers::processors::bert::BertProcessing;
use tokenizers::{Model, Tokenizer, TruncationParams};

pub use trainbook_api::Padding;

/// One encoded text, truncated but not padded.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Encoded {
    pub ids: Vec<i64>,
    pub type_ids: Vec<i64>,
}

/// A padded batch: `(batch, seq)` int64 tensors.
pub struct Batch {
    pub input_ids: Tensor,
    pub attention_mask: Tensor,
    pub token_type_ids: Tensor,
}

pub struct TextTokenizer {
    inner: Tokenizer,
    pad_id: i64,
    max_length: usize,
    fingerprint: u64,
}

impl TextTokenizer {
    /// Loads the tokenizer of a model directory (`tokenizer.json`, else `vocab.txt`).
    pub fn from_dir(dir: &Path, max_length: usize, lowercase: bool) -> Result<Self> {
        if max_length < 2 {
            bail!("max_length {max_length} is too short: it must hold [CLS] and [SEP]");
        }
        let json = dir.join("tokenizer.json");
        let vocab = dir.join("vocab.txt");
        let mut inner = if json.exists() {
            Tokenizer::from_file(&json).map_err(|e| anyhow!("reading {}: {e}", json.display()))?
        } else if vocab.exists() {
            wordpiece(&vocab, lowercase)?
        } else {
            bail!(
                "{} has neither tokenizer.json nor vocab.txt: point the model option at a Hugging Face model directory",
                dir.display()
            );
        };
        inner.with_padding(None);
        inner
            .with_truncation(Some(TruncationParams {
                max_length,
                ..Default::default()
            }))
            .map_err(|e| anyhow!("setting truncation: {e}"))?;
        // BERT's [PAD], RoBERTa's <pad>.
        let pad_id = ["[PAD]", "<pad>"]
            .iter()
            .find_map(|t| inner.token_to_id(t))
            .unwrap_or(0) as i64;
        // The whole pipeline (vocabulary, normaliser, truncation) identifies the tokenizer.
        let fingerprint = {
            use std::hash::{Hash, Hasher};
            #[allow(deprecated)]
            let mut h = std::hash::SipHasher::new();
            inner
                .to_string(false)
                .map_err(|e| anyhow!("serialising the tokenizer: {e}"))?
                .hash(&mut h);
            h.finish()
        };
        Ok(Self {
            inner,
            pad_id,
            max_length,
            fingerprint,
        })
    }

    /// Identifies the tokenizer's behaviour (for caches).
    pub fn fingerprint(&self) -> u64 {
        self.fingerprint
    }

    /// Like [`TextTokenizer::from_dir`], lowercasing as the model's `tokenizer_config.json`
    /// says (`do_lower_case`, default true) when only `vocab.txt` is there.
    pub fn from_model_dir(dir: &Path, max_length: usize) -> Result<Self> {
        let lowercase = std::fs::read(dir.join("tokenizer_config.json"))
            .ok()
            .and_then(|b| serde_json::from_slice::<serde_json::Value>(&b).ok())
            .and_then(|v| v.get("do_lower_case").and_then(|x| x.as_bool()))
            .unwrap_or(true);
        Self::from_dir(dir, max_length, lowercase)
    }

    /// The id padding fills batches with.
    pub fn pad_id(&self) -> i64 {
        self.pad_id
    }

    pub fn max_length(&self) -> usize {
        self.max_length
    }

    /// The id of `token` (e.g. `[MASK]`), if the vocabulary has it.
    pub fn token_id(&self, token: &str) -> Option<i64> {
        self.inner.token_to_id(token).map(i64::from)
    }

    /// The `tokenizers` pipeline itself (chat templates encode through it).
    pub fn inner(&self) -> &Tokenizer {
        &self.inner
    }

    pub fn vocab_size(&self) -> usize {
        self.inner.get_vocab_size(true)
    }

    pub fn encode_batch(&self, texts: &[&str]) -> Result<Vec<Encoded>> {
        self.encode_inputs(texts.iter().map(|&t| t.into()).collect())
    }

    /// Each text's token ids (with its special tokens) and nothing else: what preparing a
    /// corpus stores, without the per-token strings and offsets of a full encoding.
    pub fn encode_ids(&self, texts: &[&str]) -> Result<Vec<Vec<u32>>> {
        let encs = self
            .inner
            .encode_batch(texts.to_vec(), true)
            .map_err(|e| anyhow!("tokenizing: {e}"))?;
        Ok(encs.into_iter().map(|e| e.get_ids().to_vec()).collect())
    }

    /// Sentence pairs as Transformers' tokenizer encodes them: `[CLS] a [SEP] b [SEP]`,
    /// segment ids 0 for the first part and 1 for the second, the longer text truncated
    /// first when the pair exceeds `max_length`.
    pub fn encode_pairs(&self, first: &[&str], second: &[&str]) -> Result<Vec<Encoded>> {
        if first.len() != second.len() {
            bail!(
                "{} first texts but {} second texts: pairs need one of each",
                first.len(),
                second.len()
            );
        }
        self.encode_inputs(
            first
                .iter()
                .zip(second)
                .map(|(&a, &b)| (a, b).into())
                .collect(),
        )
    }

    fn encode_inputs(&self, inputs: Vec<tokenizers::EncodeInput>) -> Result<Vec<Encoded>> {
        let encs = self
            .inner
            .encode_batch(inputs, true)
            .map_err(|e| anyhow!("tokenizing: {e}"))?;
        Ok(encs
            .into_iter()
            .map(|e| Encoded {
                ids: e.get_ids().iter().map(|&i| i as i64).collect(),
                type_ids: e.get_type_ids().iter().map(|&i| i as i64).collect(),
            })
            .collect())
    }

    /// Pads `items` into tensors.
    pub fn pad(&self, items: &[&Encoded], padding: Padding) -> Batch {
        let len = match padding {
            Padding::MaxLength => self.max_length,
            Padding::Dynamic => items.iter().map(|e| e.ids.len()).max().unwrap_or(1).max(1),
        };
        let n = items.len();
        let mut ids = vec![self.pad_id; n * len];
        let mut mask = vec![0i64; n * len];
        let mut types = vec![0i64; n * len];
        for (row, e) in items.iter().enumerate() {
            let k = e.ids.len().min(len);
            ids[row * len..row * len + k].copy_from_slice(&e.ids[..k]);
            types[row * len..row * len + k].copy_from_slice(&e.type_ids[..k]);
            mask[row * len..row * len + k].fill(1);
        }
        let shape = [n as i64, len as i64];
        Batch {
            input_ids: Tensor::from_slice(&ids).view(shape),
            attention_mask: Tensor::from_slice(&mask).view(shape),
            token_type_ids: Tensor::from_slice(&types).view(shape),
        }
    }
}

/// BERT's WordPiece pipeline from a bare `vocab.txt`.
fn wordpiece(vocab: &Path, lowercase: bool) -> Result<Tokenizer> {
    let path = vocab.to_str().context("vocab.txt path is not UTF-8")?;
    let model = WordPiece::from_file(path)
        .unk_token("[UNK]".into())
        .build()
        .map_err(|e| anyhow!("reading {path}: {e}"))?;
    bert_pipeline(model, lowercase).with_context(|| format!("reading {path}"))
}

/// BERT's tokenizer pipeline around a WordPiece model (trained, or read from `vocab.txt`).
pub fn bert_pipeline(model: WordPiece, lowercase: bool) -> Result<Tokenizer> {
    let id = |t: &str| {
        model.token_to_id(t).ok_or_else(|| {
            anyhow!("the vocabulary has no {t} token: is it a BERT (WordPiece) vocabulary?")
        })
    };
    let (cls, sep) = (id("[CLS]")?, id("[SEP]")?);
    let mut tok = Tokenizer::new(model);
    tok.with_normalizer(Some(BertNormalizer::new(true, true, None, lowercase)))
        .map_err(|e| anyhow!("setting BERT's normaliser: {e}"))?
        .with_pre_tokenizer(Some(BertPreTokenizer))
        .with_decoder(Some(WordPieceDecoder::default()))
        .with_post_processor(Some(BertProcessing::new(
            ("[SEP]".into(), sep),
            ("[CLS]".into(), cls),
        )));
    Ok(tok)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn minilm() -> std::path::PathBuf {
        let dir = crate::assets::minilm_dir();
        assert!(
            dir.join("vocab.txt").exists(),
            "{} missing: run `make setup`",
            dir.display()
        );
        dir
    }

    #[test]
    fn tokenizer_json_and_vocab_txt_agree_and_truncate() {
        let dir = minilm();
        let from_json = TextTokenizer::from_dir(&dir, 8, true).unwrap();
        let vocab_only = tempdir_with_vocab(&dir);
        let from_vocab = TextTokenizer::from_dir(&vocab_only, 8, true).unwrap();
        let texts = [
            "The food was great",
            "An exhaustive investigation into the roots and after-effects of revolutions",
        ];
        let a = from_json.encode_batch(&texts).unwrap();
        let b = from_vocab.encode_batch(&texts).unwrap();
        assert_eq!(a, b);
        // [CLS] the food was great [SEP] in BERT's uncased vocabulary.
        assert_eq!(a[0].ids, vec![101, 1996, 2833, 2001, 2307, 102]);
        assert_eq!(a[1].ids.len(), 8, "truncated to max_length");
        assert_eq!(*a[1].ids.last().unwrap(), 102, "[SEP] kept at the end");
    }

    /// Pairs as Transformers' BERT tokenizer encodes them (its tokenizer.json template, and
    /// the same from a bare vocab.txt): `[CLS] a [SEP] b [SEP]`, segments 0 then 1, the longer
    /// text truncated first.
    #[test]
    fn sentence_pairs_get_two_segments() {
        let dir = minilm();
        let from_json = TextTokenizer::from_dir(&dir, 12, true).unwrap();
        let from_vocab = TextTokenizer::from_dir(&tempdir_with_vocab(&dir), 12, true).unwrap();
        let (a, b) = (["The food was great"], ["I liked it"]);
        let enc = from_json.encode_pairs(&a, &b).unwrap();
        assert_eq!(enc, from_vocab.encode_pairs(&a, &b).unwrap());
        // [CLS] the food was great [SEP] i liked it [SEP]
        assert_eq!(
            enc[0].ids,
            [101, 1996, 2833, 2001, 2307, 102, 1045, 4669, 2009, 102]
        );
        assert_eq!(enc[0].type_ids, [0, 0, 0, 0, 0, 0, 1, 1, 1, 1]);
        let long = from_json
            .encode_pairs(
                &["an exhaustive investigation into the roots and after-effects of revolutions"],
                &["short"],
            )
            .unwrap();
        assert_eq!(long[0].ids.len(), 12);
        assert_eq!(
            &long[0].ids[9..],
            [102, 2460, 102],
            "the second text kept whole"
        );
        assert!(from_json.encode_pairs(&["a"], &[]).is_err());
    }

    #[test]
    fn padding_to_max_length_or_per_batch() {
        let tok = TextTokenizer::from_dir(&minilm(), 16, true).unwrap();
        let enc = tok.encode_batch(&["good", "not good at all"]).unwrap();
        let refs: Vec<&Encoded> = enc.iter().collect();
        let full = tok.pad(&refs, Padding::MaxLength);
        assert_eq!(full.input_ids.size(), [2, 16]);
        let dynamic = tok.pad(&refs, Padding::Dynamic);
        assert_eq!(dynamic.input_ids.size(), [2, 6]);
        assert_eq!(
            dynamic
                .attention_mask
                .sum(tch::Kind::Int64)
                .int64_value(&[]),
            3 + 6
        );
    }

    #[test]
    fn missing_files_are_a_clear_error() {
        let err = TextTokenizer::from_dir(Path::new("/nonexistent"), 16, true)
            .err()
            .unwrap()
            .to_string();
        assert!(
            err.contains("neither tokenizer.json nor vocab.txt"),
            "{err}"
        );
    }

    fn tempdir_with_vocab(dir: &Path) -> std::path::PathBuf {
        let d = std::env::temp_dir().join(format!("trainbook-vocab-{}", std::process::id()));
        std::fs::create_dir_all(&d).unwrap();
        std::fs::copy(dir.join("vocab.txt"), d.join("vocab.txt")).unwrap();
        d
    }
}
