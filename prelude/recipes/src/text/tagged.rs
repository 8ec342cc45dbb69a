//! Token classification (named entities, parts of speech): tagged sentences from CoNLL or
//! JSON-lines files, their alignment to a tokenizer's word pieces for training, and the way
//! back from per-token predictions to entities with character spans in a raw text.
//!
//! Training follows Hugging Face's `run_ner.py`: sentences arrive already split into words
//! (CoNLL), are encoded as pre-tokenized input so that every piece knows its word, and only the
//! first piece of each word carries the word's label; the other pieces and the special tokens
//! get -100, which the cross-entropy loss ignores. At inference the caller tokenizes a raw text,
//! runs the model, and hands the per-token tags back: the first piece's tag decides the word,
//! and runs of `B-X I-X ...` words become one entity.
//!
//! The model call stays with the caller: [`encode_text`] gives the [`Encoding`] to feed the
//! model, [`spans`] (or [`words_of`] then [`group`]) turns its predicted tags into spans.

use std::collections::{BTreeSet, HashMap};
use std::path::Path;

use anyhow::{anyhow, bail, Context, Result};
use serde::Deserialize;
use tokenizers::{EncodeInput, Encoding, PostProcessor, Tokenizer, TruncationDirection};

/// The label of a token the loss must ignore (special tokens, non-first word pieces), as in
/// PyTorch's `CrossEntropyLoss(ignore_index=-100)`.
pub const IGNORE: i64 = -100;

/// One sentence: its words and one tag per word.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct TaggedSentence {
    pub words: Vec<String>,
    pub tags: Vec<String>,
    /// Where it came from (`"train.conll line 17"`), so that a later error (an unknown tag)
    /// can point at the data to fix. Empty for sentences made in code.
    pub origin: String,
}

impl TaggedSentence {
    pub fn new(words: Vec<String>, tags: Vec<String>) -> Self {
        TaggedSentence {
            words,
            tags,
            origin: String::new(),
        }
    }

    fn place(&self, index: usize) -> String {
        if self.origin.is_empty() {
            format!("sentence {index}")
        } else {
            format!("the sentence at {}", self.origin)
        }
    }
}

/// Reads tagged sentences, by extension: `.jsonl`/`.json` as JSON lines
/// (`{"tokens": [...], "tags": [...]}`), anything else as CoNLL (`token<TAB>tag`).
pub fn read(path: &Path) -> Result<Vec<TaggedSentence>> {
    let ext = path
        .extension()
        .and_then(|e| e.to_str())
        .unwrap_or("")
        .to_ascii_lowercase();
    let text = read_utf8(path)?;
    let sentences = match ext.as_str() {
        "jsonl" | "json" | "ndjson" => parse_jsonl(&text, path)?,
        _ => parse_conll(&text, path)?,
    };
    if sentences.is_empty() {
        bail!(
            "{} holds no tagged sentences: expected {}",
            path.display(),
            if matches!(ext.as_str(), "jsonl" | "json" | "ndjson") {
                "one {\"tokens\": [...], \"tags\": [...]} object per line"
            } else {
                "CoNLL lines `token<TAB>tag`, sentences separated by a blank line"
            }
        );
    }
    Ok(sentences)
}

/// A file's text, with the line of the first bad byte when it is not UTF-8 (a Latin-1 CoNLL
/// file is the usual case) instead of a bare decoding error.
pub(crate) fn read_utf8(path: &Path) -> Result<String> {
    let bytes = std::fs::read(path).with_context(|| format!("reading {}", path.display()))?;
    match String::from_utf8(bytes) {
        Ok(mut s) => {
            if s.starts_with('\u{feff}') {
                s.drain(..'\u{feff}'.len_utf8());
            }
            Ok(s)
        }
        Err(e) => {
            let at = e.utf8_error().valid_up_to();
            let line = 1 + e.as_bytes()[..at].iter().filter(|&&b| b == b'\n').count();
            bail!(
                "line {line} of {} is not UTF-8 text (byte {at}): convert the file to UTF-8 (e.g. `iconv -f latin1 -t utf-8`)",
                path.display()
            )
        }
    }
}

/// CoNLL: one `token tag` line per word (tab or spaces between; with more columns, as in
/// CoNLL-2003's `token POS chunk NER`, the first is the token and the last the tag), a blank
/// line between sentences, `-DOCSTART-` lines skipped.
fn parse_conll(text: &str, path: &Path) -> Result<Vec<TaggedSentence>> {
    let file = path.display();
    let mut out = Vec::new();
    let mut current = TaggedSentence::default();
    let mut flush = |current: &mut TaggedSentence| {
        if !current.words.is_empty() {
            out.push(std::mem::take(current));
        }
    };
    for (i, line) in text.lines().enumerate() {
        let n = i + 1;
        let line = line.trim_end_matches('\r');
        if line.trim().is_empty() {
            flush(&mut current);
            continue;
        }
        if line.starts_with("-DOCSTART-") {
            // A document boundary, not a sentence; it ends any sentence left open.
            flush(&mut current);
            continue;
        }
        let cols: Vec<&str> = line.split_whitespace().collect();
        if cols.len() < 2 {
            bail!(
                "line {n} of {file} has a token but no tag ({:?}): write `token<TAB>tag` on every non-blank line, and a blank line between sentences",
                cols[0]
            );
        }
        if current.words.is_empty() {
            current.origin = format!("{file} line {n}");
        }
        current.words.push(cols[0].to_string());
        current.tags.push(cols[cols.len() - 1].to_string());
    }
    flush(&mut current);
    Ok(out)
}

#[derive(Deserialize)]
struct JsonSentence {
    tokens: Option<Vec<String>>,
    tags: Option<serde_json::Value>,
    ner_tags: Option<serde_json::Value>,
}

/// JSON lines, one sentence per line: `{"tokens": [...], "tags": [...]}` (or `ner_tags`), tags
/// as strings. A `.json` file that holds one JSON array of such objects is read too.
fn parse_jsonl(text: &str, path: &Path) -> Result<Vec<TaggedSentence>> {
    let file = path.display();
    let records: Vec<(usize, &str)> = if text.trim_start().starts_with('[') {
        // A whole-file array: "records" are numbered from 1 in the array.
        let values: Vec<serde_json::Value> = serde_json::from_str(text).with_context(|| {
            format!("{file} starts with '[' but is not a JSON array of sentences: write one {{\"tokens\": [...], \"tags\": [...]}} object per line")
        })?;
        let mut out = Vec::with_capacity(values.len());
        for (i, v) in values.into_iter().enumerate() {
            out.push(one_json(v, &format!("record {} of {file}", i + 1))?);
        }
        return Ok(out);
    } else {
        text.lines()
            .enumerate()
            .map(|(i, l)| (i + 1, l))
            .filter(|(_, l)| !l.trim().is_empty())
            .collect()
    };
    let mut out = Vec::with_capacity(records.len());
    for (n, line) in records {
        let place = format!("line {n} of {file}");
        let v: serde_json::Value = serde_json::from_str(line).map_err(|e| {
            anyhow!("{place} is not valid JSON ({e}): write one {{\"tokens\": [...], \"tags\": [...]}} object per line")
        })?;
        let mut s = one_json(v, &place)?;
        s.origin = format!("{file} line {n}");
        out.push(s);
    }
    Ok(out)
}

fn one_json(v: serde_json::Value, place: &str) -> Result<TaggedSentence> {
    let rec: JsonSentence = serde_json::from_value(v).map_err(|e| {
        anyhow!(
            "{place}: {e}: each sentence is {{\"tokens\": [\"strings\"], \"tags\": [\"strings\"]}}"
        )
    })?;
    let words = rec.tokens.ok_or_else(|| {
        anyhow!("{place} has no \"tokens\" list: give the sentence's words as \"tokens\": [...]")
    })?;
    let (key, tags) = match (rec.tags, rec.ner_tags) {
        (Some(t), _) => ("tags", t),
        (None, Some(t)) => ("ner_tags", t),
        (None, None) => bail!(
            "{place} has no \"tags\" list: give one tag per token as \"tags\": [\"O\", \"B-PER\", ...]"
        ),
    };
    let tags: Vec<String> = match tags {
        serde_json::Value::Array(items) => items
            .into_iter()
            .enumerate()
            .map(|(i, t)| match t {
                serde_json::Value::String(s) if !s.trim().is_empty() => Ok(s),
                serde_json::Value::Number(_) => Err(anyhow!(
                    "{place}: \"{key}\" holds numbers (tag {} is {t}): write the tag names (\"B-PER\"), as the dataset's label list names them",
                    i + 1
                )),
                other => Err(anyhow!(
                    "{place}: tag {} in \"{key}\" is {other}, not a tag name: give each token a tag such as \"O\" or \"B-PER\"",
                    i + 1
                )),
            })
            .collect::<Result<_>>()?,
        other => bail!("{place}: \"{key}\" is {other}, not a list: give one tag per token"),
    };
    if words.len() != tags.len() {
        bail!(
            "{place} has {} tokens but {} tags: give exactly one tag per token",
            words.len(),
            tags.len()
        );
    }
    if words.is_empty() {
        bail!("{place} has no tokens: drop the empty sentence");
    }
    Ok(TaggedSentence {
        words,
        tags,
        origin: place.to_string(),
    })
}

/// The tags used in `sentences`, sorted, with "O" first when present, so that label ids stay
/// the same from run to run and "O" (the most common tag) is id 0.
pub fn tag_set(sentences: &[TaggedSentence]) -> Vec<String> {
    let set: BTreeSet<&str> = sentences
        .iter()
        .flat_map(|s| s.tags.iter().map(String::as_str))
        .collect();
    let mut tags: Vec<String> = Vec::with_capacity(set.len());
    if set.contains("O") {
        tags.push("O".to_string());
    }
    tags.extend(set.into_iter().filter(|&t| t != "O").map(String::from));
    tags
}

/// `tag -> id` for a tag list such as [`tag_set`]'s (the model's `label2id`).
pub fn label_ids(tags: &[String]) -> HashMap<String, i64> {
    tags.iter()
        .enumerate()
        .map(|(i, t)| (t.clone(), i as i64))
        .collect()
}

/// One sentence ready for the model (not padded).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct EncodedTags {
    pub ids: Vec<i64>,
    pub type_ids: Vec<i64>,
    /// One per token: the word's label id on its first piece, [`IGNORE`] elsewhere.
    pub labels: Vec<i64>,
    /// One per input word: the index of its first piece, or `None` when truncation dropped
    /// the word or the tokenizer made nothing of it (a control character, say). Predictions
    /// map back to words through it; a word without a piece has no prediction (score it "O").
    pub word_starts: Vec<Option<usize>>,
    /// Words cut off by truncation at `max_length`.
    pub dropped_words: usize,
}

impl EncodedTags {
    /// Whether truncation cut words off (their tags are lost for training and evaluation).
    pub fn truncated(&self) -> bool {
        self.dropped_words > 0
    }

    /// Per-word predictions from per-token ones (`None` for words without a piece).
    pub fn word_predictions<T: Clone>(&self, per_token: &[T]) -> Vec<Option<T>> {
        self.word_starts
            .iter()
            .map(|s| s.and_then(|t| per_token.get(t).cloned()))
            .collect()
    }
}

/// Many sentences encoded, and how much truncation cost, for the caller to log.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct EncodedSet {
    pub items: Vec<EncodedTags>,
    /// Sentences that lost words to truncation.
    pub truncated_sentences: usize,
    /// Words lost to truncation, over all sentences.
    pub dropped_words: usize,
}

/// The caller's tokenizer in two copies, neither truncating nor padding (padding is the
/// batcher's job): `raw` without the post-processor tokenizes, `join` adds the special tokens
/// (its `post_process`), after the caller of this has cut the tokens to fit.
///
/// Truncation is done by hand because tokenizers 0.23 stops tokenizing a sequence once it has
/// `max_length` tokens when truncation is set (an early exit in `do_tokenize`): the
/// encoding's overflow then lacks the rest of the text, so neither the words cut off nor
/// further windows can be read from it. Running the post-processor only once, on the cut
/// tokens, also matters: byte-level post-processors trim offsets each time they run.
pub(crate) struct Pipeline {
    pub raw: Tokenizer,
    pub join: Tokenizer,
}

impl Pipeline {
    pub(crate) fn new(tokenizer: &Tokenizer) -> Result<Self> {
        let mut join = tokenizer.clone();
        join.with_truncation(None)
            .map_err(|e| anyhow!("clearing the tokenizer's truncation: {e}"))?;
        join.with_padding(None);
        let mut raw = join.clone();
        raw.with_post_processor(None::<tokenizers::PostProcessorWrapper>);
        Ok(Pipeline { raw, join })
    }

    /// Special tokens the post-processor adds to one sequence (`pair`: to two).
    pub(crate) fn added(&self, pair: bool) -> usize {
        self.join
            .get_post_processor()
            .map(|p| p.added_tokens(pair))
            .unwrap_or(0)
    }

    /// Room for text in `max_length` tokens of one sequence.
    fn budget(&self, max_length: usize) -> Result<usize> {
        let added = self.added(false);
        if max_length <= added {
            bail!(
                "max_length {max_length} leaves no room for text: the tokenizer adds {added} special tokens; raise max_length (BERT uses 128–512)"
            );
        }
        Ok(max_length - added)
    }

    /// `enc` (from `raw`, no special tokens) cut to `budget` tokens, its rest in the overflow,
    /// then post-processed.
    fn finish(&self, mut enc: Encoding, budget: usize) -> Result<Encoding> {
        enc.truncate(budget, 0, TruncationDirection::Right);
        self.join
            .post_process(enc, None, true)
            .map_err(|e| anyhow!("adding the special tokens: {e}"))
    }
}

/// Encodes one sentence as pre-tokenized words and labels each word's first piece.
/// `label_ids` maps every tag to its id; a tag it lacks is an error (a tag seen only in the
/// test split, say) rather than a silent "O".
pub fn encode(
    tokenizer: &Tokenizer,
    sentence: &TaggedSentence,
    label_ids: &HashMap<String, i64>,
    max_length: usize,
) -> Result<EncodedTags> {
    let pipe = Pipeline::new(tokenizer)?;
    let budget = pipe.budget(max_length)?;
    encode_with(&pipe, budget, sentence, 0, label_ids)
}

/// [`encode`] for many sentences, counting what truncation dropped.
pub fn encode_all(
    tokenizer: &Tokenizer,
    sentences: &[TaggedSentence],
    label_ids: &HashMap<String, i64>,
    max_length: usize,
) -> Result<EncodedSet> {
    let pipe = Pipeline::new(tokenizer)?;
    let budget = pipe.budget(max_length)?;
    let mut set = EncodedSet::default();
    for (i, s) in sentences.iter().enumerate() {
        let e = encode_with(&pipe, budget, s, i, label_ids)?;
        if e.truncated() {
            set.truncated_sentences += 1;
            set.dropped_words += e.dropped_words;
        }
        set.items.push(e);
    }
    Ok(set)
}

fn encode_with(
    pipe: &Pipeline,
    budget: usize,
    sentence: &TaggedSentence,
    index: usize,
    label_ids: &HashMap<String, i64>,
) -> Result<EncodedTags> {
    if sentence.words.len() != sentence.tags.len() {
        bail!(
            "{} has {} words but {} tags: give exactly one tag per word",
            sentence.place(index),
            sentence.words.len(),
            sentence.tags.len()
        );
    }
    let word_labels: Vec<i64> = sentence
        .tags
        .iter()
        .map(|t| {
            label_ids.get(t).copied().ok_or_else(|| {
                let mut known: Vec<&String> = label_ids.keys().collect();
                known.sort();
                anyhow!(
                    "{} has the tag {t:?}, which is not among the labels ({}): build the label list from all splits, or fix the tag",
                    sentence.place(index),
                    known.iter().map(|s| s.as_str()).collect::<Vec<_>>().join(", ")
                )
            })
        })
        .collect::<Result<_>>()?;
    let words: &[String] = &sentence.words;
    let n_words = words.len();
    let full = pipe
        .raw
        .encode(EncodeInput::Single(words.into()), false)
        .map_err(|e| anyhow!("tokenizing {}: {e}", sentence.place(index)))?;
    let mut has_tokens = vec![false; n_words];
    for w in full.get_word_ids().iter().flatten() {
        if let Some(h) = has_tokens.get_mut(*w as usize) {
            *h = true;
        }
    }
    let enc = pipe
        .finish(full, budget)
        .with_context(|| sentence.place(index))?;
    let mut word_starts: Vec<Option<usize>> = vec![None; n_words];
    let mut labels = Vec::with_capacity(enc.len());
    for (t, w) in enc.get_word_ids().iter().enumerate() {
        match w.map(|w| w as usize).filter(|&w| w < n_words) {
            Some(w) if word_starts[w].is_none() => {
                word_starts[w] = Some(t);
                labels.push(word_labels[w]);
            }
            _ => labels.push(IGNORE),
        }
    }
    let dropped_words = (0..n_words)
        .filter(|&w| has_tokens[w] && word_starts[w].is_none())
        .count();
    Ok(EncodedTags {
        ids: enc.get_ids().iter().map(|&i| i64::from(i)).collect(),
        type_ids: enc.get_type_ids().iter().map(|&i| i64::from(i)).collect(),
        labels,
        word_starts,
        dropped_words,
    })
}

/// Tokenizes a raw text for tagging: cut to `max_length` tokens, not padded, offsets in bytes
/// (what [`spans`] expects). Feed its ids to the model; text past `max_length` is not tagged
/// (it is in `get_overflowing()` of the result).
pub fn encode_text(tokenizer: &Tokenizer, text: &str, max_length: usize) -> Result<Encoding> {
    let pipe = Pipeline::new(tokenizer)?;
    let budget = pipe.budget(max_length)?;
    let enc = pipe
        .raw
        .encode(text, false)
        .map_err(|e| anyhow!("tokenizing the text to tag: {e}"))?;
    pipe.finish(enc, budget)
}

/// A word of a raw text as the tokenizer split it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TextWord {
    /// Its first piece: the token whose prediction is the word's.
    pub first_token: usize,
    /// Byte span in the text (`&text[start..end]` is the word), surrounding whitespace
    /// trimmed.
    pub start: usize,
    pub end: usize,
}

/// The words of `text` in `encoding` (made by `Tokenizer::encode(text, ..)`, byte offsets), in
/// order, special tokens and whitespace-only words left out. Pieces of one word share the tokenizer's word id (its
/// pre-tokenizer's split: BERT splits at spaces and punctuation, byte-level BPE before each
/// space). Spans are trimmed of whitespace, so byte-level tokenizers without `trim_offsets`
/// (whose pieces start with the space, `Ġword`) still give the word alone.
pub fn words_of(text: &str, encoding: &Encoding) -> Result<Vec<TextWord>> {
    let offsets = encoding.get_offsets();
    let word_ids = encoding.get_word_ids();
    let special = encoding.get_special_tokens_mask();
    let mut words: Vec<(Option<u32>, TextWord)> = Vec::new();
    for t in 0..encoding.len() {
        if special.get(t).copied().unwrap_or(0) == 1 {
            continue;
        }
        let (s, e) = offsets[t];
        if e > text.len() || s > e || !text.is_char_boundary(s) || !text.is_char_boundary(e) {
            bail!(
                "token {t} ({:?}) has the span {s}..{e}, which is not a byte span of the {}-byte text: encode the text with Tokenizer::encode (byte offsets, not encode_char_offsets) and pass the same text",
                encoding.get_tokens().get(t).map(String::as_str).unwrap_or(""),
                text.len()
            );
        }
        let w = word_ids[t];
        match words.last_mut() {
            // Pieces of one word are adjacent; a word id of None (no pre-tokenizer word)
            // makes each piece a word of its own.
            Some((Some(prev), word)) if w == Some(*prev) => {
                word.start = word.start.min(s);
                word.end = word.end.max(e);
            }
            _ => words.push((
                w,
                TextWord {
                    first_token: t,
                    start: s,
                    end: e,
                },
            )),
        }
    }
    Ok(words
        .into_iter()
        .filter_map(|(_, mut w)| {
            let piece = &text[w.start..w.end];
            let trimmed = piece.trim();
            if trimmed.is_empty() {
                // A run of spaces that a byte-level pre-tokenizer keeps as a "word" of its own
                // ("New  York"): no text to tag, and it must not split an entity.
                return None;
            }
            w.start += piece.len() - piece.trim_start().len();
            w.end = w.start + trimmed.len();
            Some(w)
        })
        .collect())
}

/// An entity found in a text.
#[derive(Clone, Debug, PartialEq)]
pub struct TaggedSpan {
    /// The entity type: `PER` for `B-PER I-PER`.
    pub kind: String,
    /// The entity as written in the text: `text[start..end]`.
    pub text: String,
    /// Byte offsets into the text: Rust slices with these.
    pub start: usize,
    pub end: usize,
    /// Character (Unicode code point) offsets, as Python's `str` and most JSON annotation
    /// formats count.
    pub start_char: usize,
    pub end_char: usize,
    /// The indices of its first and last words in [`words_of`]'s list.
    pub first_word: usize,
    pub last_word: usize,
    /// The mean of its words' scores, when scores were given.
    pub score: Option<f32>,
}

/// Entities from per-token predictions: `token_tags[t]` (and `token_scores[t]`, e.g. the
/// softmax probability of that tag) for each token of `encoding`, the encoding of `text` made
/// by [`encode_text`] (or `Tokenizer::encode`). The first piece's tag decides each word.
pub fn spans<S: AsRef<str>>(
    text: &str,
    encoding: &Encoding,
    token_tags: &[S],
    token_scores: Option<&[f32]>,
) -> Result<Vec<TaggedSpan>> {
    if token_tags.len() != encoding.len() {
        bail!(
            "{} predicted tags for {} tokens: pass one tag per token of the encoding (special tokens included)",
            token_tags.len(),
            encoding.len()
        );
    }
    if let Some(s) = token_scores {
        if s.len() != encoding.len() {
            bail!(
                "{} scores for {} tokens: pass one score per token of the encoding, or none",
                s.len(),
                encoding.len()
            );
        }
    }
    let words = words_of(text, encoding)?;
    let tags: Vec<&str> = words
        .iter()
        .map(|w| token_tags[w.first_token].as_ref())
        .collect();
    let scores: Option<Vec<f32>> =
        token_scores.map(|s| words.iter().map(|w| s[w.first_token]).collect());
    group(text, &words, &tags, scores.as_deref())
}

/// What a tag says about its word.
enum Mark<'a> {
    Outside,
    Begin(&'a str),
    Inside(&'a str),
    End(&'a str),
    Single(&'a str),
}

fn mark(tag: &str) -> Mark<'_> {
    let tag = tag.trim();
    if tag.is_empty() || tag == "O" {
        return Mark::Outside;
    }
    let b = tag.as_bytes();
    if b.len() > 2 && (b[1] == b'-' || b[1] == b'_') {
        let kind = &tag[2..];
        match b[0] {
            b'B' => return Mark::Begin(kind),
            b'I' => return Mark::Inside(kind),
            b'E' | b'L' => return Mark::End(kind),
            b'S' | b'U' => return Mark::Single(kind),
            _ => {}
        }
    }
    // A bare type ("PER", the IO scheme): consecutive words of one type are one entity.
    Mark::Inside(tag)
}

/// The words, tags and scores [`group`] is given belong together: one tag (and score) per
/// word, every word a byte span of `text` on character boundaries.
fn check_words(text: &str, words: &[TextWord], tags: usize, scores: Option<usize>) -> Result<()> {
    if tags != words.len() {
        bail!(
            "{} tags for {} words: pass one tag per word",
            tags,
            words.len()
        );
    }
    if let Some(s) = scores {
        if s != words.len() {
            bail!(
                "{} scores for {} words: pass one score per word, or none",
                s,
                words.len()
            );
        }
    }
    for w in words {
        if w.start > w.end
            || w.end > text.len()
            || !text.is_char_boundary(w.start)
            || !text.is_char_boundary(w.end)
        {
            bail!(
                "word span {}..{} is not a byte span of the {}-byte text: take the words from words_of with the same text",
                w.start,
                w.end,
                text.len()
            );
        }
    }
    Ok(())
}

/// The entities of a tag sequence: (kind, first word, last word), by [`group`]'s rules.
fn runs<S: AsRef<str>>(tags: &[S]) -> Vec<(&str, usize, usize)> {
    // (kind, first word, last word)
    let mut runs: Vec<(&str, usize, usize)> = Vec::new();
    let mut open: Option<(&str, usize, usize)> = None;
    for (i, tag) in tags.iter().enumerate() {
        match mark(tag.as_ref()) {
            Mark::Outside => runs.extend(open.take()),
            Mark::Begin(k) => {
                runs.extend(open.take());
                open = Some((k, i, i));
            }
            Mark::Inside(k) => match &mut open {
                Some((ok, _, last)) if *ok == k => *last = i,
                _ => {
                    runs.extend(open.take());
                    open = Some((k, i, i));
                }
            },
            Mark::End(k) => {
                match &mut open {
                    Some((ok, _, last)) if *ok == k => *last = i,
                    _ => {
                        runs.extend(open.take());
                        open = Some((k, i, i));
                    }
                }
                runs.extend(open.take());
            }
            Mark::Single(k) => {
                runs.extend(open.take());
                runs.push((k, i, i));
            }
        }
    }
    runs.extend(open);
    runs
}

/// Groups tagged words into entities: `B-X` starts one, `I-X` continues an `X` (and starts
/// one after anything else, as CoNLL-2003's original IOB1 tags and a model's slips need),
/// `O` ends it; BIOES/BILOU's `E-`/`L-` end and `S-`/`U-` are one-word entities; a tag with
/// no prefix is its own type. `words` from [`words_of`], one tag (and score) per word.
pub fn group<S: AsRef<str>>(
    text: &str,
    words: &[TextWord],
    tags: &[S],
    scores: Option<&[f32]>,
) -> Result<Vec<TaggedSpan>> {
    check_words(text, words, tags.len(), scores.map(<[f32]>::len))?;
    let runs = runs(tags);

    // Byte offsets to character offsets, walking the text once (spans come in order).
    let mut chars_before = 0usize;
    let mut at = 0usize;
    let mut char_of = |byte: usize| {
        if byte < at {
            chars_before = 0;
            at = 0;
        }
        chars_before += text[at..byte].chars().count();
        at = byte;
        chars_before
    };
    Ok(runs
        .into_iter()
        .map(|(kind, first, last)| {
            let (start, end) = (words[first].start, words[last].end.max(words[first].start));
            let score =
                scores.map(|s| s[first..=last].iter().sum::<f32>() / (last - first + 1) as f32);
            TaggedSpan {
                kind: kind.to_string(),
                text: text[start..end].to_string(),
                start,
                end,
                start_char: char_of(start),
                end_char: char_of(end),
                first_word: first,
                last_word: last,
                score,
            }
        })
        .collect())
}

/// Tiny tokenizers for the tests of this module and of `squad`.
#[cfg(test)]
pub(crate) mod test_tokenizers {
    use tokenizers::models::bpe::{Vocab, BPE};
    use tokenizers::models::wordpiece::WordPiece;
    use tokenizers::normalizers::bert::BertNormalizer;
    use tokenizers::pre_tokenizers::bert::BertPreTokenizer;
    use tokenizers::pre_tokenizers::byte_level::ByteLevel;
    use tokenizers::processors::bert::BertProcessing;
    use tokenizers::processors::roberta::RobertaProcessing;
    use tokenizers::{Tokenizer, TruncationParams};

    /// A lowercasing BERT WordPiece tokenizer over `words` (each also as a `##` piece, and
    /// each letter), with BERT's normalizer, pre-tokenizer and `[CLS] a [SEP] b [SEP]`. Like
    /// a caller's, it comes with a truncation setting (and padding) that the code must replace.
    pub fn wordpiece(words: &[&str]) -> Tokenizer {
        let mut vocab: Vec<String> = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
            .iter()
            .map(|s| s.to_string())
            .collect();
        let mut add = |t: String| {
            if !vocab.contains(&t) {
                vocab.push(t);
            }
        };
        for c in "abcdefghijklmnopqrstuvwxyz0123456789.,?!'-()".chars() {
            add(c.to_string());
            add(format!("##{c}"));
        }
        for w in words {
            add(w.to_string());
            add(format!("##{w}"));
        }
        // `tokenizers::models::bpe::Vocab` names the crate's hash map (ahash), which
        // WordPiece's builder takes too.
        let ids: Vocab = vocab
            .iter()
            .enumerate()
            .map(|(i, t)| (t.clone(), i as u32))
            .collect();
        let (cls, sep) = (ids["[CLS]"], ids["[SEP]"]);
        let model = WordPiece::builder()
            .vocab(ids)
            .unk_token("[UNK]".into())
            .build()
            .unwrap();
        let mut tok = Tokenizer::new(model);
        tok.with_normalizer(Some(BertNormalizer::new(true, true, None, true)))
            .unwrap()
            .with_pre_tokenizer(Some(BertPreTokenizer))
            .with_post_processor(Some(BertProcessing::new(
                ("[SEP]".into(), sep),
                ("[CLS]".into(), cls),
            )));
        tok.with_truncation(Some(TruncationParams {
            max_length: 512,
            ..Default::default()
        }))
        .unwrap();
        tok
    }

    /// A byte-level BPE with RoBERTa's post-processor: the 256 byte symbols plus merges that
    /// make each of `words` (with and without its leading space `Ġ`) one token. `trim` sets
    /// `trim_offsets` on the pre-tokenizer and post-processor: without it a piece's span
    /// includes the space before the word.
    pub fn byte_level(words: &[&str], trim: bool) -> Tokenizer {
        let mut vocab: Vec<String> =
            vec!["<s>".into(), "<pad>".into(), "</s>".into(), "<unk>".into()];
        let mut alphabet: Vec<char> = ByteLevel::alphabet().into_iter().collect();
        alphabet.sort();
        vocab.extend(alphabet.iter().map(|c| c.to_string()));
        let mut merges: Vec<(String, String)> = Vec::new();
        let to_bytes = |s: &str| -> Vec<String> {
            // The byte-level symbols of `s`, as the pre-tokenizer maps bytes to chars.
            let mut pre = tokenizers::PreTokenizedString::from(s);
            use tokenizers::PreTokenizer;
            ByteLevel::new(false, false, false)
                .pre_tokenize(&mut pre)
                .unwrap();
            let joined: String = pre
                .get_splits(
                    tokenizers::OffsetReferential::Original,
                    tokenizers::OffsetType::Byte,
                )
                .into_iter()
                .map(|(s, _, _)| s.to_string())
                .collect();
            joined.chars().map(|c| c.to_string()).collect()
        };
        let build = |vocab: &[String], merges: &[(String, String)]| {
            let ids: Vocab = vocab
                .iter()
                .enumerate()
                .map(|(i, t)| (t.clone(), i as u32))
                .collect();
            BPE::builder()
                .vocab_and_merges(ids, merges.to_vec())
                .unk_token("<unk>".into())
                .build()
                .unwrap()
        };
        for w in words {
            for form in [w.to_string(), format!(" {w}")] {
                // What the merges so far make of the word, then merges joining those pieces
                // left to right: ranked after every earlier merge, they apply last and leave
                // the earlier words whole.
                use tokenizers::Model;
                let joined: String = to_bytes(&form).concat();
                let pieces: Vec<String> = build(&vocab, &merges)
                    .tokenize(&joined)
                    .unwrap()
                    .into_iter()
                    .map(|t| t.value)
                    .collect();
                let mut acc = pieces[0].clone();
                for p in &pieces[1..] {
                    let merged = format!("{acc}{p}");
                    if !vocab.contains(&merged) {
                        merges.push((acc.clone(), p.clone()));
                        vocab.push(merged.clone());
                    }
                    acc = merged;
                }
            }
        }
        let mut tok = Tokenizer::new(build(&vocab, &merges));
        tok.with_pre_tokenizer(Some(ByteLevel::new(true, trim, true)))
            .with_decoder(Some(ByteLevel::default()))
            .with_post_processor(Some(
                RobertaProcessing::new(("</s>".into(), 2), ("<s>".into(), 0))
                    .trim_offsets(trim)
                    .add_prefix_space(true),
            ));
        tok.with_truncation(Some(TruncationParams {
            max_length: 512,
            ..Default::default()
        }))
        .unwrap();
        tok
    }
}

#[cfg(test)]
mod tests {
    use super::test_tokenizers::{byte_level, wordpiece};
    use super::*;

    fn write(name: &str, body: &str) -> std::path::PathBuf {
        let dir = std::env::temp_dir().join(format!("trainbook-tagged-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let p = dir.join(name);
        std::fs::write(&p, body).unwrap();
        p
    }

    fn s(v: &[&str]) -> Vec<String> {
        v.iter().map(|x| x.to_string()).collect()
    }

    #[test]
    fn reads_conll_with_docstart_and_four_columns() {
        let p = write(
            "a.conll",
            "-DOCSTART- -X- -X- O\n\nEU NNP B-NP B-ORG\nrejects VBZ B-VP O\nGerman JJ B-NP B-MISC\n\nPeter\tB-PER\nBlackburn\tI-PER\r\n\n\n",
        );
        let got = read(&p).unwrap();
        assert_eq!(got.len(), 2);
        assert_eq!(got[0].words, s(&["EU", "rejects", "German"]));
        assert_eq!(got[0].tags, s(&["B-ORG", "O", "B-MISC"]));
        assert!(
            got[0].origin.ends_with("a.conll line 3"),
            "{}",
            got[0].origin
        );
        assert_eq!(got[1].words, s(&["Peter", "Blackburn"]));
        assert_eq!(got[1].tags, s(&["B-PER", "I-PER"]));
        assert_eq!(
            tag_set(&got),
            s(&["O", "B-MISC", "B-ORG", "B-PER", "I-PER"])
        );
    }

    #[test]
    fn conll_errors_name_the_line() {
        let p = write("bad.conll", "EU B-ORG\nrejects\n");
        let err = read(&p).unwrap_err().to_string();
        assert!(
            err.contains("line 2 of") && err.contains("has a token but no tag"),
            "{err}"
        );
        let p = write("latin1.conll", "");
        std::fs::write(&p, b"EU B-ORG\n\nK\xf6ln B-LOC\n").unwrap();
        let err = read(&p).unwrap_err().to_string();
        assert!(err.contains("line 3 of") && err.contains("UTF-8"), "{err}");
        let p = write("empty.conll", "-DOCSTART- O\n\n");
        assert!(read(&p)
            .unwrap_err()
            .to_string()
            .contains("no tagged sentences"));
    }

    #[test]
    fn reads_jsonl_and_checks_it() {
        let p = write(
            "a.jsonl",
            "{\"tokens\": [\"Paris\", \"is\", \"nice\"], \"tags\": [\"B-LOC\", \"O\", \"O\"]}\n\n{\"tokens\": [\"Bob\"], \"ner_tags\": [\"B-PER\"]}\n",
        );
        let got = read(&p).unwrap();
        assert_eq!(got.len(), 2);
        assert_eq!(got[1].tags, s(&["B-PER"]));
        assert!(got[1].origin.ends_with("line 3"));
        let p = write(
            "n.jsonl",
            "{\"tokens\": [\"a\", \"b\"], \"tags\": [\"O\"]}\n",
        );
        let err = read(&p).unwrap_err().to_string();
        assert!(
            err.contains("line 1 of") && err.contains("2 tokens but 1 tags"),
            "{err}"
        );
        let p = write(
            "i.jsonl",
            "{\"tokens\": [\"a\"], \"tags\": [\"O\"]}\n{\"tokens\": [\"a\"], \"ner_tags\": [3]}\n",
        );
        let err = read(&p).unwrap_err().to_string();
        assert!(
            err.contains("line 2 of") && err.contains("numbers"),
            "{err}"
        );
        let p = write("j.jsonl", "{\"tokens\": [\"a\"], \"tags\": [\"O\"]\n");
        assert!(read(&p).unwrap_err().to_string().contains("not valid JSON"));
        let p = write("arr.json", "[{\"tokens\": [\"a\"], \"tags\": [\"O\"]}]");
        assert_eq!(read(&p).unwrap().len(), 1);
    }

    fn labels_of(tags: &[&str]) -> HashMap<String, i64> {
        label_ids(&s(tags))
    }

    #[test]
    fn first_piece_gets_the_label() {
        let tok = wordpiece(&["john", "lives", "in", "new", "york", "hamp", "shire"]);
        let sent = TaggedSentence::new(
            s(&["John", "lives", "in", "Hampshire", "."]),
            s(&["B-PER", "O", "O", "B-LOC", "O"]),
        );
        let ids = labels_of(&["O", "B-LOC", "B-PER"]);
        let e = encode(&tok, &sent, &ids, 32).unwrap();
        // [CLS] john lives in hamp ##shire . [SEP]
        assert_eq!(e.ids.len(), 8);
        assert_eq!(e.labels, vec![-100, 2, 0, 0, 1, -100, 0, -100]);
        assert_eq!(
            e.word_starts,
            vec![Some(1), Some(2), Some(3), Some(4), Some(6)]
        );
        assert_eq!(e.dropped_words, 0);
        assert_eq!(e.type_ids, vec![0; 8]);
        let preds = e.word_predictions(&["x", "a", "b", "c", "d", "e", "f", "y"]);
        assert_eq!(
            preds,
            vec![Some("a"), Some("b"), Some("c"), Some("d"), Some("f")]
        );
    }

    #[test]
    fn truncation_drops_words_and_counts_them() {
        let tok = wordpiece(&["john", "lives", "in", "new", "york"]);
        let words = s(&[
            "John", "lives", "in", "New", "York", "in", "New", "York", "in", "New", "York",
        ]);
        let mut tags = s(&["B-PER", "O", "O", "B-LOC", "I-LOC"]);
        tags.extend(s(&["O", "B-LOC", "I-LOC"]).into_iter().cycle().take(6));
        let long = TaggedSentence::new(words, tags);
        let short = TaggedSentence::new(s(&["John"]), s(&["B-PER"]));
        let ids = labels_of(&["O", "B-LOC", "I-LOC", "B-PER"]);
        let set = encode_all(&tok, &[long.clone(), short, long.clone()], &ids, 5).unwrap();
        let e = &set.items[0];
        assert_eq!(e.ids.len(), 5);
        assert_eq!(e.labels, vec![-100, 3, 0, 0, -100]);
        assert_eq!(&e.word_starts[..4], [Some(1), Some(2), Some(3), None]);
        // Every word past max_length counts, not only those the tokenizer's own (early-exit)
        // truncation would have tokenized.
        assert_eq!(e.dropped_words, 8);
        assert_eq!((set.truncated_sentences, set.dropped_words), (2, 16));
        assert!(!set.items[1].truncated());
        // A word cut in the middle keeps its first piece and its label.
        let tok = wordpiece(&["hamp", "shire"]);
        let sent = TaggedSentence::new(s(&["Hampshire"]), s(&["B-LOC"]));
        let e = encode(&tok, &sent, &ids, 3).unwrap();
        assert_eq!(
            (e.labels.clone(), e.dropped_words),
            (vec![-100, 1, -100], 0)
        );
        assert!(encode(&tok, &sent, &ids, 2)
            .unwrap_err()
            .to_string()
            .contains("raise max_length"));
    }

    #[test]
    fn unknown_tag_is_an_error_naming_the_sentence() {
        let tok = wordpiece(&["john"]);
        let mut sent = TaggedSentence::new(s(&["John"]), s(&["B-PER"]));
        sent.origin = "train.conll line 9".into();
        let err = encode(&tok, &sent, &labels_of(&["O"]), 16)
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("train.conll line 9") && err.contains("B-PER"),
            "{err}"
        );
    }

    #[test]
    fn byte_level_words_align_too() {
        let tok = byte_level(&["Paris", "is", "nice"], true);
        let sent = TaggedSentence::new(s(&["Paris", "is", "nice"]), s(&["B-LOC", "O", "O"]));
        let e = encode(&tok, &sent, &labels_of(&["O", "B-LOC"]), 16).unwrap();
        // <s> ĠParis Ġis Ġnice </s>
        assert_eq!(e.labels, vec![-100, 1, 0, 0, -100]);
        assert_eq!(e.word_starts, vec![Some(1), Some(2), Some(3)]);
    }

    fn tag_tokens(enc: &Encoding, text: &str, want: &[(&str, &str)]) -> Vec<String> {
        // Tags each token of a word listed in `want` by its text, "O" elsewhere (a stand-in
        // for the model).
        let words = words_of(text, enc).unwrap();
        let mut tags = vec!["O".to_string(); enc.len()];
        for w in &words {
            for (word, tag) in want {
                if &text[w.start..w.end] == *word {
                    tags[w.first_token] = tag.to_string();
                    // Later pieces get junk: only the first piece counts.
                    let word = enc.get_word_ids()[w.first_token];
                    for (t, id) in enc
                        .get_word_ids()
                        .iter()
                        .enumerate()
                        .skip(w.first_token + 1)
                    {
                        if *id == word {
                            tags[t] = "B-JUNK".into();
                        }
                    }
                }
            }
        }
        tags
    }

    #[test]
    fn spans_slice_the_text_wordpiece() {
        let tok = wordpiece(&[
            "john", "lives", "in", "new", "york", "zurich", "hamp", "shire",
        ]);
        let text = "  John lives in New York, née Zürich, Hampshire.";
        let enc = encode_text(&tok, text, 64).unwrap();
        let tags = tag_tokens(
            &enc,
            text,
            &[
                ("John", "B-PER"),
                ("New", "B-LOC"),
                ("York", "I-LOC"),
                ("Zürich", "B-LOC"),
                ("Hampshire", "I-LOC"),
            ],
        );
        let got = spans(text, &enc, &tags, None).unwrap();
        let texts: Vec<&str> = got.iter().map(|s| s.text.as_str()).collect();
        assert_eq!(texts, ["John", "New York", "Zürich", "Hampshire"]);
        for sp in &got {
            assert_eq!(&text[sp.start..sp.end], sp.text);
            let by_char: String = text
                .chars()
                .skip(sp.start_char)
                .take(sp.end_char - sp.start_char)
                .collect();
            assert_eq!(by_char, sp.text);
            assert_eq!(sp.kind, if sp.text == "John" { "PER" } else { "LOC" });
        }
        // "Hampshire" follows ", " after an entity: I-LOC after O starts a new entity.
        assert_eq!(got[3].first_word, got[3].last_word);
    }

    #[test]
    fn spans_slice_the_text_byte_level_with_and_without_trim_offsets() {
        for trim in [true, false] {
            let tok = byte_level(&["John", "lives", "in", "New", "York", "Zürich"], trim);
            let text = "John lives in New  York, near Zürich.";
            let enc = encode_text(&tok, text, 64).unwrap();
            let tags = tag_tokens(
                &enc,
                text,
                &[
                    ("John", "B-PER"),
                    ("New", "B-LOC"),
                    ("York", "I-LOC"),
                    ("Zürich", "S-LOC"),
                ],
            );
            let scores: Vec<f32> = (0..enc.len()).map(|i| i as f32).collect();
            let got = spans(text, &enc, &tags, Some(&scores)).unwrap();
            let texts: Vec<&str> = got.iter().map(|s| s.text.as_str()).collect();
            // The two spaces are a word of their own to the byte-level pre-tokenizer: not one
            // that splits the entity.
            assert_eq!(
                texts,
                ["John", "New  York", "Zürich"],
                "trim_offsets {trim}"
            );
            let z = &got[2];
            assert_eq!((z.start_char, z.end_char), (30, 36));
            assert_eq!((z.start, z.end), (30, 37), "ü is two bytes");
            assert!(got[1].score.is_some());
        }
    }

    #[test]
    fn grouping_rules() {
        let text = "a b c d e f";
        let words: Vec<TextWord> = (0..6)
            .map(|i| TextWord {
                first_token: i + 1,
                start: 2 * i,
                end: 2 * i + 1,
            })
            .collect();
        let g = |tags: &[&str]| -> Vec<(String, String)> {
            group(text, &words, tags, None)
                .unwrap()
                .into_iter()
                .map(|s| (s.kind, s.text))
                .collect()
        };
        let p = |v: &[(&str, &str)]| -> Vec<(String, String)> {
            v.iter()
                .map(|(a, b)| (a.to_string(), b.to_string()))
                .collect()
        };
        assert_eq!(
            g(&["B-PER", "I-PER", "B-PER", "I-LOC", "O", "I-LOC"]),
            p(&[("PER", "a b"), ("PER", "c"), ("LOC", "d"), ("LOC", "f")])
        );
        assert_eq!(
            g(&["S-PER", "B-LOC", "E-LOC", "I-LOC", "PER", "PER"]),
            p(&[("PER", "a"), ("LOC", "b c"), ("LOC", "d"), ("PER", "e f")])
        );
        assert!(group(text, &words, &["O"], None).is_err());
        let bad = [TextWord {
            first_token: 0,
            start: 0,
            end: 99,
        }];
        assert!(group(text, &bad, &["B-X"], None).is_err());
    }

    #[test]
    fn bad_prediction_shapes_are_errors() {
        let tok = wordpiece(&["john"]);
        let enc = encode_text(&tok, "john", 8).unwrap();
        assert!(spans("john", &enc, &["O"], None).is_err());
        assert!(spans("john", &enc, &["O", "B-PER", "O"], Some(&[0.5])).is_err());
        // Offsets from another text.
        assert!(spans("jo", &enc, &["O", "B-PER", "O"], None).is_err());
    }
}
