//! Extractive question answering (SQuAD): examples from SQuAD v1.1/v2.0 JSON or Hugging Face
//! JSON lines, checked before training; their question + context windows for the model, as
//! Transformers' `run_qa.py` prepares features; and the way back from start/end logits to an
//! answer in the context.
//!
//! A context longer than the model's `max_length` is cut into windows that overlap by
//! `doc_stride` tokens, each `[CLS] question [SEP] context part [SEP]` (or the tokenizer's own
//! template), so that an answer near a window's edge is whole in its neighbour. For training,
//! a window holds the first answer's token span when the answer lies entirely inside it, else
//! (0, 0), the `[CLS]` position, which is also how SQuAD v2's unanswerable questions are
//! labelled. At inference each window's best span competes by start + end logit, and for v2
//! the "null" score (`[CLS]` start + end) decides whether to answer at all.
//!
//! All positions in a context are character (Unicode code point) offsets, as SQuAD's
//! `answer_start` counts them (Python `str` indices), not byte offsets.

use std::collections::HashMap;
use std::ops::Range;
use std::path::Path;

use anyhow::{anyhow, bail, Result};
use serde::Deserialize;
use serde_json::Value;
use tokenizers::{Encoding, Tokenizer, TruncationDirection};

use super::tagged::{read_utf8, Pipeline};

/// One answer: its text and where it starts in the context, in characters.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Answer {
    pub text: String,
    pub start: usize,
}

impl Answer {
    /// The character just past the answer.
    pub fn end(&self) -> usize {
        self.start + self.text.chars().count()
    }
}

/// A question about a context, with its answers (several annotators' in dev sets; none for
/// SQuAD v2's unanswerable questions).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct QaExample {
    pub id: String,
    pub question: String,
    pub context: String,
    pub answers: Vec<Answer>,
}

impl QaExample {
    pub fn is_answerable(&self) -> bool {
        !self.answers.is_empty()
    }
}

/// Reads QA examples and checks every answer against its context. `.jsonl` is Hugging Face's
/// squad layout, one `{"id", "question", "context", "answers": {"text": [...],
/// "answer_start": [...]}}` per line (answers may also be a list of `{"text", "answer_start"}`;
/// without "answers" a question is unanswerable). `.json` is the SQuAD file
/// (`{"version", "data": [{"title", "paragraphs": [{"context", "qas": [...]}]}]}`), or the same
/// records as JSON lines or as one JSON array (what `datasets`' `to_json` writes).
pub fn read(path: &Path) -> Result<Vec<QaExample>> {
    let file = path.display().to_string();
    let text = read_utf8(path)?;
    let ext = path
        .extension()
        .and_then(|e| e.to_str())
        .unwrap_or("")
        .to_ascii_lowercase();
    let examples = if ext == "json" {
        match serde_json::from_str::<Value>(&text) {
            Ok(v) if v.get("data").is_some() => read_squad(v, &file)?,
            Ok(Value::Array(records)) => records
                .into_iter()
                .enumerate()
                .map(|(i, r)| record(r, &format!("record {} of {file}", i + 1), i + 1))
                .collect::<Result<_>>()?,
            Ok(Value::Object(_)) if text.trim().lines().count() > 1 => bail!(
                "{file} is a JSON object without \"data\": a SQuAD file is {{\"version\": ..., \"data\": [{{\"title\": ..., \"paragraphs\": [...]}}]}}"
            ),
            Ok(_) => read_lines(&text, &file)?,
            Err(e) => {
                // JSON lines, or a broken JSON document (a cut-off download): say which.
                let first = text.lines().find(|l| !l.trim().is_empty()).unwrap_or("");
                if serde_json::from_str::<Value>(first).is_err() {
                    bail!(
                        "{file} is not valid JSON ({e}): a .json file is one SQuAD document ({{\"data\": [...]}}) or one question object per line"
                    );
                }
                read_lines(&text, &file)?
            }
        }
    } else {
        read_lines(&text, &file)?
    };
    if examples.is_empty() {
        bail!("{file} holds no questions: expected SQuAD JSON or one question per JSON line");
    }
    let mut seen: HashMap<&str, usize> = HashMap::new();
    for (i, e) in examples.iter().enumerate() {
        if let Some(j) = seen.insert(e.id.as_str(), i) {
            bail!(
                "{file}: question id {:?} appears twice (questions {} and {}): ids must be unique, as predictions are keyed by id",
                e.id,
                j + 1,
                i + 1
            );
        }
    }
    Ok(examples)
}

#[derive(Deserialize)]
struct SquadFile {
    data: Vec<SquadArticle>,
}

#[derive(Deserialize)]
struct SquadArticle {
    #[serde(default)]
    title: Option<String>,
    paragraphs: Vec<SquadParagraph>,
}

#[derive(Deserialize)]
struct SquadParagraph {
    context: Option<String>,
    #[serde(default)]
    qas: Vec<SquadQa>,
}

#[derive(Deserialize)]
struct SquadQa {
    id: Option<Value>,
    question: Option<String>,
    #[serde(default)]
    answers: Vec<SquadAnswer>,
    #[serde(default)]
    is_impossible: bool,
}

#[derive(Deserialize)]
struct SquadAnswer {
    text: String,
    answer_start: usize,
}

fn read_squad(v: Value, file: &str) -> Result<Vec<QaExample>> {
    let squad: SquadFile = serde_json::from_value(v).map_err(|e| {
        anyhow!("{file} is not SQuAD JSON ({e}): expected {{\"data\": [{{\"title\": ..., \"paragraphs\": [{{\"context\": ..., \"qas\": [{{\"id\", \"question\", \"answers\": [{{\"text\", \"answer_start\"}}]}}]}}]}}]}}")
    })?;
    let mut out = Vec::new();
    for (a, article) in squad.data.into_iter().enumerate() {
        let title = article.title.unwrap_or_default();
        for (p, para) in article.paragraphs.into_iter().enumerate() {
            let where_ = format!(
                "paragraph {} of article {} ({title:?}) in {file}",
                p + 1,
                a + 1
            );
            let Some(context) = para.context else {
                bail!("{where_} has no \"context\": give each paragraph its text as \"context\"");
            };
            for (q, qa) in para.qas.into_iter().enumerate() {
                let id = match qa.id {
                    Some(Value::String(s)) => s,
                    Some(Value::Number(n)) => n.to_string(),
                    _ => bail!(
                        "question {} of {where_} has no \"id\": give every question a unique id",
                        q + 1
                    ),
                };
                let place = format!("question id {id:?} ({where_})");
                // SQuAD v2 keeps "plausible_answers" for impossible questions, and
                // Hugging Face's loader drops any "answers" they have: so do we.
                let answers = if qa.is_impossible {
                    Vec::new()
                } else {
                    qa.answers
                        .into_iter()
                        .map(|a| Answer {
                            text: a.text,
                            start: a.answer_start,
                        })
                        .collect()
                };
                let example = QaExample {
                    id,
                    question: qa.question.unwrap_or_default(),
                    context: context.clone(),
                    answers,
                };
                check(&example, &place)?;
                out.push(example);
            }
        }
    }
    Ok(out)
}

fn read_lines(text: &str, file: &str) -> Result<Vec<QaExample>> {
    let mut out = Vec::new();
    for (i, line) in text.lines().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        let place = format!("line {} of {file}", i + 1);
        let v: Value = serde_json::from_str(line).map_err(|e| {
            anyhow!("{place} is not valid JSON ({e}): write one {{\"id\", \"question\", \"context\", \"answers\"}} object per line, or a SQuAD .json file")
        })?;
        out.push(record(v, &place, i + 1)?);
    }
    Ok(out)
}

/// One Hugging Face-style record; `n` names it when it has no id.
fn record(v: Value, place: &str, n: usize) -> Result<QaExample> {
    let Value::Object(mut m) = v else {
        bail!("{place} is not a JSON object: write {{\"id\", \"question\", \"context\", \"answers\"}}");
    };
    let id = match m.remove("id") {
        Some(Value::String(s)) => s,
        Some(Value::Number(x)) => x.to_string(),
        None | Some(Value::Null) => format!("line-{n}"),
        Some(other) => bail!("{place}: \"id\" is {other}: give a string id"),
    };
    let place = format!("question id {id:?} ({place})");
    let text_field = |m: &mut serde_json::Map<String, Value>, key: &str| -> Result<String> {
        match m.remove(key) {
            Some(Value::String(s)) => Ok(s),
            None | Some(Value::Null) => Ok(String::new()),
            Some(other) => bail!("{place}: \"{key}\" is {other}, not a string"),
        }
    };
    let question = text_field(&mut m, "question")?;
    if !m.contains_key("context") {
        bail!("{place} has no \"context\": give the passage the answer is taken from");
    }
    let context = text_field(&mut m, "context")?;
    let answers = match m.remove("answers") {
        None | Some(Value::Null) => Vec::new(),
        Some(Value::Object(a)) => {
            let list = |key: &str| -> Result<Vec<Value>> {
                match a.get(key) {
                    Some(Value::Array(v)) => Ok(v.clone()),
                    _ => bail!("{place}: \"answers\" needs a \"{key}\" list (Hugging Face layout: {{\"text\": [...], \"answer_start\": [...]}})"),
                }
            };
            let (texts, starts) = (list("text")?, list("answer_start")?);
            if texts.len() != starts.len() {
                bail!(
                    "{place}: \"answers\" has {} texts but {} answer_start values: give one start per text",
                    texts.len(),
                    starts.len()
                );
            }
            texts
                .into_iter()
                .zip(starts)
                .map(|(t, s)| answer(t, s, &place))
                .collect::<Result<_>>()?
        }
        Some(Value::Array(items)) => items
            .into_iter()
            .map(|item| match item {
                Value::Object(mut o) => answer(
                    o.remove("text").unwrap_or(Value::Null),
                    o.remove("answer_start").unwrap_or(Value::Null),
                    &place,
                ),
                other => bail!("{place}: answer {other} is not a {{\"text\", \"answer_start\"}} object"),
            })
            .collect::<Result<_>>()?,
        Some(other) => bail!(
            "{place}: \"answers\" is {other}: give {{\"text\": [...], \"answer_start\": [...]}} or a list of {{\"text\", \"answer_start\"}}"
        ),
    };
    let example = QaExample {
        id,
        question,
        context,
        answers,
    };
    check(&example, &place)?;
    Ok(example)
}

fn answer(text: Value, start: Value, place: &str) -> Result<Answer> {
    let Value::String(text) = text else {
        bail!("{place}: an answer's \"text\" is {text}, not a string");
    };
    let Some(start) = start.as_u64() else {
        bail!("{place}: answer {text:?} has answer_start {start}, not a character offset (a whole number ≥ 0)");
    };
    Ok(Answer {
        text,
        start: start as usize,
    })
}

/// Checks an example before any training: a question, a context, and every answer exactly
/// where its `start` says (in characters). `place` names the example in the errors (file,
/// line or article).
pub fn check(example: &QaExample, place: &str) -> Result<()> {
    if example.question.trim().is_empty() {
        bail!("{place} has an empty question: give the question text, or drop the example");
    }
    if example.context.trim().is_empty() {
        bail!("{place} has no context: give the passage the answer is taken from");
    }
    let n_chars = example.context.chars().count();
    for a in &example.answers {
        if a.text.is_empty() {
            bail!(
                "{place} has an empty answer text at character {}: give the answer's text, or no answers for an unanswerable question",
                a.start
            );
        }
        let len = a.text.chars().count();
        let found: String = example.context.chars().skip(a.start).take(len).collect();
        if found == a.text {
            continue;
        }
        let mut hint = String::new();
        if let Some(b) = example.context.find(&a.text) {
            let c = example.context[..b].chars().count();
            hint = if b == a.start && c != a.start {
                format!(" (answer_start {} is the answer's byte offset: SQuAD counts characters, so it should be {c})", a.start)
            } else {
                format!(" (the text occurs at character {c})")
            };
        }
        if a.start >= n_chars {
            bail!(
                "{place}: answer {:?} starts at character {}, past the end of the {n_chars}-character context{hint}: fix answer_start (it counts Unicode characters from 0)",
                a.text,
                a.start
            );
        }
        bail!(
            "{place}: answer {:?} should be at character {} of the context, but the context there reads {found:?}{hint}: fix answer_start (it counts Unicode characters from 0, as Python does) or the answer text",
            a.text,
            a.start
        );
    }
    Ok(())
}

/// One model input cut from an example (not padded).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Window {
    pub example_id: String,
    /// Its place among the example's windows, from 0.
    pub index: usize,
    pub ids: Vec<i64>,
    pub type_ids: Vec<i64>,
    /// Real tokens (= `ids.len()`: windows are not padded; the batcher pads and masks past it).
    pub attention_len: usize,
    /// The context's tokens in `ids`.
    pub context_range: Range<usize>,
    /// Per token: its character span in the context (whitespace trimmed) for context tokens,
    /// `None` for the question and special tokens.
    pub offsets: Vec<Option<(usize, usize)>>,
    /// The first answer's (start, end) tokens (end inclusive) when it lies entirely in this
    /// window; (0, 0), the `[CLS]` position, when it does not or there is no answer.
    pub answer_tokens: (usize, usize),
}

/// Cuts an example into windows of at most `max_length` tokens, `[CLS] question [SEP]
/// context part [SEP]` (the tokenizer's template), successive context parts overlapping by
/// `doc_stride` tokens, as `run_qa.py` does with `truncation="only_second"`,
/// `stride=doc_stride`, `return_overflowing_tokens=True`. The question's leading whitespace is
/// dropped first (as `run_qa.py` does: some SQuAD questions start with many spaces).
///
/// The windows are cut here rather than by the tokenizer's own overflow, which in tokenizers
/// 0.23 is wrong for this: with truncation set the crate stops tokenizing the context after
/// `max_length` tokens, so the overflow holds one or two windows and the rest of a long context
/// is lost; its overflow windows also keep the sequence's type ids instead of the template's
/// (`TemplateProcessing` with `$B:0`), and it panics when the stride does not fit. Here question
/// and context are tokenized once each, the whole context cut with `Encoding::truncate` (the
/// cutting the crate itself does), and each part joined to the question by the tokenizer's
/// post-processor, so every window has the full template.
pub fn windows(
    tokenizer: &Tokenizer,
    example: &QaExample,
    max_length: usize,
    doc_stride: usize,
) -> Result<Vec<Window>> {
    windows_with(&Pipeline::new(tokenizer)?, example, max_length, doc_stride)
}

/// [`windows`] for many examples, in order (each window names its example): the tokenizer is
/// prepared once rather than per example.
pub fn windows_all(
    tokenizer: &Tokenizer,
    examples: &[QaExample],
    max_length: usize,
    doc_stride: usize,
) -> Result<Vec<Window>> {
    let pipe = Pipeline::new(tokenizer)?;
    let mut out = Vec::with_capacity(examples.len());
    for e in examples {
        out.extend(windows_with(&pipe, e, max_length, doc_stride)?);
    }
    Ok(out)
}

fn windows_with(
    pipe: &Pipeline,
    example: &QaExample,
    max_length: usize,
    doc_stride: usize,
) -> Result<Vec<Window>> {
    let added = pipe.added(true);
    if max_length <= added + doc_stride {
        bail!(
            "max_length {max_length} leaves no context per window: the tokenizer adds {added} special tokens and windows overlap by doc_stride {doc_stride}; raise max_length (384 in run_qa.py) or lower doc_stride (128)"
        );
    }
    for a in &example.answers {
        if a.end() > example.context.chars().count() {
            check(example, &format!("question id {:?}", example.id))?;
        }
    }
    let (raw, join) = (&pipe.raw, &pipe.join);
    let question = example.question.trim_start();
    let q = raw
        .encode_char_offsets(question, false)
        .map_err(|e| anyhow!("tokenizing the question of id {:?}: {e}", example.id))?;
    let room = max_length - added;
    if q.len() + doc_stride >= room {
        bail!(
            "question id {:?} is {} tokens long: with max_length {max_length}, {added} special tokens and doc_stride {doc_stride}, no context fits beside it (a window needs more than doc_stride context tokens); raise max_length, lower doc_stride, or shorten or drop the question",
            example.id,
            q.len()
        );
    }
    let per_window = room - q.len();
    let mut c = raw
        .encode_char_offsets(example.context.as_str(), false)
        .map_err(|e| anyhow!("tokenizing the context of id {:?}: {e}", example.id))?;
    c.truncate(per_window, doc_stride, TruncationDirection::Right);
    let rest = c.take_overflowing();
    let parts = std::iter::once(c).chain(rest);

    let chars: Vec<char> = example.context.chars().collect();
    let answer = example.answers.first().map(|a| (a.start, a.end()));
    let mut out = Vec::new();
    for (index, part) in parts.enumerate() {
        let n_ctx = part.len();
        let enc = join
            .post_process(q.clone(), Some(part), true)
            .map_err(|e| anyhow!("joining question and context of id {:?}: {e}", example.id))?;
        let context_range = context_range(&enc, n_ctx).ok_or_else(|| {
            anyhow!(
                "the tokenizer's post-processor does not mark the context tokens of id {:?} (sequence ids): use a tokenizer with a pair template (BERT's, RoBERTa's)",
                example.id
            )
        })?;
        let offsets: Vec<Option<(usize, usize)>> = (0..enc.len())
            .map(|t| {
                context_range
                    .contains(&t)
                    .then(|| trim_span(&chars, enc.get_offsets()[t]))
            })
            .collect();
        let answer_tokens = answer
            .and_then(|(s, e)| answer_span(&offsets, &context_range, s, e))
            .unwrap_or((0, 0));
        out.push(Window {
            example_id: example.id.clone(),
            index,
            ids: enc.get_ids().iter().map(|&i| i64::from(i)).collect(),
            type_ids: enc.get_type_ids().iter().map(|&i| i64::from(i)).collect(),
            attention_len: enc.len(),
            context_range,
            offsets,
            answer_tokens,
        });
    }
    Ok(out)
}

/// The tokens of sequence 1 (the context): one contiguous run of `n` tokens, or `None`.
fn context_range(enc: &Encoding, n: usize) -> Option<Range<usize>> {
    let seq = enc.get_sequence_ids();
    if n == 0 {
        // An empty context part: place the empty range after the question's tokens.
        let after = seq.iter().rposition(|s| *s == Some(0)).map_or(0, |p| p + 1);
        return Some(after..after);
    }
    let first = seq.iter().position(|s| *s == Some(1))?;
    let range = first..first + n;
    (range.end <= seq.len() && seq[range.clone()].iter().all(|s| *s == Some(1))).then_some(range)
}

/// A token's character span shrunk past surrounding whitespace: byte-level tokenizers without
/// `trim_offsets` (and the first token of every window but the first, which the crate never
/// trims) count the space before a word as part of it.
fn trim_span(chars: &[char], (mut s, mut e): (usize, usize)) -> (usize, usize) {
    let e0 = e.min(chars.len());
    e = e0;
    s = s.min(e);
    while s < e && chars[s].is_whitespace() {
        s += 1;
    }
    while e > s && chars[e - 1].is_whitespace() {
        e -= 1;
    }
    (s, e)
}

/// The (start, end) tokens of the answer `[start_char, end_char)`, if the window's context
/// holds all of it: the token containing its first character and the one containing its last.
fn answer_span(
    offsets: &[Option<(usize, usize)>],
    context: &Range<usize>,
    start_char: usize,
    end_char: usize,
) -> Option<(usize, usize)> {
    let spans = || {
        context
            .clone()
            .filter_map(|t| offsets[t].filter(|(s, e)| s < e).map(|o| (t, o)))
    };
    let (_, (first_start, _)) = spans().next()?;
    let (_, (_, last_end)) = spans().next_back()?;
    if first_start > start_char || last_end < end_char {
        return None;
    }
    let start = spans().find(|(_, (_, e))| *e > start_char)?.0;
    let end = spans().rfind(|(_, (s, _))| *s < end_char)?.0;
    (start <= end).then_some((start, end))
}

/// A span of the context chosen from a window's logits: character offsets into the context.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct SpanScore {
    pub start: usize,
    pub end: usize,
    /// Start logit + end logit.
    pub score: f32,
    /// The tokens it came from, in the window.
    pub start_token: usize,
    pub end_token: usize,
}

/// The best answer in one window, as `run_qa.py`'s post-processing finds it: among the
/// `n_best` highest start logits and the `n_best` highest end logits, the pair with the
/// highest sum whose tokens are both in the context, start ≤ end, at most
/// `max_answer_tokens` tokens long. `None` when no such pair is among them. Logits past the
/// window's tokens (padding) are ignored.
pub fn best_span(
    start_logits: &[f32],
    end_logits: &[f32],
    window: &Window,
    max_answer_tokens: usize,
    n_best: usize,
) -> Option<SpanScore> {
    let n = window
        .attention_len
        .min(window.offsets.len())
        .min(start_logits.len())
        .min(end_logits.len());
    let top = |logits: &[f32]| {
        let mut idx: Vec<usize> = (0..n).filter(|&i| !logits[i].is_nan()).collect();
        idx.sort_by(|&a, &b| logits[b].total_cmp(&logits[a]).then(a.cmp(&b)));
        idx.truncate(n_best.max(1));
        idx
    };
    let (starts, ends) = (top(start_logits), top(end_logits));
    let mut best: Option<SpanScore> = None;
    for &s in &starts {
        let Some((cs, _)) = window.offsets[s] else {
            continue;
        };
        for &e in &ends {
            let Some((_, ce)) = window.offsets[e] else {
                continue;
            };
            if e < s || e - s + 1 > max_answer_tokens || ce <= cs {
                continue;
            }
            let score = start_logits[s] + end_logits[e];
            if best.is_none_or(|b| score > b.score) {
                best = Some(SpanScore {
                    start: cs,
                    end: ce,
                    score,
                    start_token: s,
                    end_token: e,
                });
            }
        }
    }
    best
}

/// The "no answer" score of a window: the `[CLS]` token's (position 0) start + end logit.
pub fn null_score(start_logits: &[f32], end_logits: &[f32]) -> f32 {
    match (start_logits.first(), end_logits.first()) {
        (Some(s), Some(e)) => s + e,
        _ => f32::NEG_INFINITY,
    }
}

/// The answer to one example, from all its windows.
#[derive(Clone, Debug, PartialEq)]
pub struct QaPrediction {
    pub id: String,
    /// The answer text, `""` when not answered.
    pub text: String,
    /// Character offsets of the answer in the context (0, 0 when not answered).
    pub start: usize,
    pub end: usize,
    /// The best span's start + end logit (`-inf` if no window had a valid span).
    pub score: f32,
    /// The lowest null score over the windows, as `run_qa.py` takes it.
    pub null_score: f32,
    pub answered: bool,
}

/// Combines the windows of one example: the best-scoring span over all windows. With
/// `null_threshold` (SQuAD v2) the question is left unanswered when `null_score > score +
/// null_threshold` (`run_qa.py`'s `null_score_diff_threshold`, 0 by default); without it
/// (v1) the best span is always the answer. `logits[i]` are window `i`'s (start, end) logits.
pub fn predict(
    example: &QaExample,
    windows: &[Window],
    logits: &[(&[f32], &[f32])],
    max_answer_tokens: usize,
    n_best: usize,
    null_threshold: Option<f32>,
) -> Result<QaPrediction> {
    if windows.len() != logits.len() {
        bail!(
            "question id {:?}: {} windows but {} pairs of logits: pass the model's output for each window, in order",
            example.id,
            windows.len(),
            logits.len()
        );
    }
    let mut best: Option<SpanScore> = None;
    let mut null = f32::INFINITY;
    for (w, (sl, el)) in windows.iter().zip(logits) {
        if w.example_id != example.id {
            bail!(
                "window {} belongs to id {:?}, not {:?}: pass only the example's own windows",
                w.index,
                w.example_id,
                example.id
            );
        }
        if sl.len() < w.attention_len || el.len() < w.attention_len {
            bail!(
                "question id {:?}, window {}: {} start and {} end logits for {} tokens: pass one logit per token",
                example.id,
                w.index,
                sl.len(),
                el.len(),
                w.attention_len
            );
        }
        null = null.min(null_score(sl, el));
        if let Some(s) = best_span(sl, el, w, max_answer_tokens, n_best) {
            if best.is_none_or(|b| s.score > b.score) {
                best = Some(s);
            }
        }
    }
    let answered = match (best, null_threshold) {
        (None, _) => false,
        (Some(_), None) => true,
        (Some(b), Some(t)) => null <= b.score + t,
    };
    let (start, end) = match best {
        Some(b) if answered => (b.start, b.end),
        _ => (0, 0),
    };
    Ok(QaPrediction {
        id: example.id.clone(),
        text: char_slice(&example.context, start, end).to_string(),
        start,
        end,
        score: best.map_or(f32::NEG_INFINITY, |b| b.score),
        null_score: null,
        answered,
    })
}

/// `text[start..end]` in characters (clamped to the text).
pub fn char_slice(text: &str, start: usize, end: usize) -> &str {
    let byte = |c: usize| text.char_indices().nth(c).map_or(text.len(), |(b, _)| b);
    let (s, e) = (byte(start), byte(end.max(start)));
    &text[s..e]
}

#[cfg(test)]
mod tests {
    use super::super::tagged::test_tokenizers::{byte_level, wordpiece};
    use super::*;
    use tokenizers::{TruncationParams, TruncationStrategy};

    fn write(name: &str, body: &str) -> std::path::PathBuf {
        let dir = std::env::temp_dir().join(format!("trainbook-squad-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let p = dir.join(name);
        std::fs::write(&p, body).unwrap();
        p
    }

    const V2: &str = r#"{"version": "v2.0", "data": [{"title": "Zürich", "paragraphs": [
        {"context": "Zürich is the largest city in Switzerland.",
         "qas": [
           {"id": "q1", "question": "What is the largest city?", "answers": [{"text": "Zürich", "answer_start": 0}], "is_impossible": false},
           {"id": "q2", "question": "  Where is Zürich?", "answers": [{"text": "Switzerland", "answer_start": 30}, {"text": "in Switzerland", "answer_start": 27}]},
           {"id": "q3", "question": "What is the smallest city?", "answers": [], "plausible_answers": [{"text": "Zürich", "answer_start": 0}], "is_impossible": true}
         ]}]}]}"#;

    #[test]
    fn reads_squad_json() {
        let got = read(&write("v2.json", V2)).unwrap();
        assert_eq!(got.len(), 3);
        assert_eq!(
            got[1].answers[0],
            Answer {
                text: "Switzerland".into(),
                start: 30
            }
        );
        assert_eq!(got[1].answers[0].end(), 41);
        assert!(got[0].is_answerable() && !got[2].is_answerable());
        assert_eq!(got[0].context, got[2].context);
    }

    #[test]
    fn reads_hugging_face_jsonl() {
        let p = write(
            "hf.jsonl",
            concat!(
                r#"{"id": "a", "title": "t", "question": "Where?", "context": "In Zürich.", "answers": {"text": ["Zürich"], "answer_start": [3]}}"#,
                "\n\n",
                r#"{"question": "Who?", "context": "Nobody here.", "answers": {"text": [], "answer_start": []}}"#,
                "\n",
                r#"{"id": 7, "question": "What?", "context": "A cat.", "answers": [{"text": "cat", "answer_start": 2}]}"#,
                "\n"
            ),
        );
        let got = read(&p).unwrap();
        assert_eq!(got.len(), 3);
        assert_eq!(
            got[0].answers,
            vec![Answer {
                text: "Zürich".into(),
                start: 3
            }]
        );
        assert_eq!(got[1].id, "line-3");
        assert!(got[1].answers.is_empty());
        assert_eq!((got[2].id.as_str(), got[2].answers[0].start), ("7", 2));
        // The same records as a JSON array in a .json file.
        let arr = write(
            "hf.json",
            r#"[{"id": "a", "question": "Where?", "context": "In Zürich.", "answers": {"text": ["Zürich"], "answer_start": [3]}}]"#,
        );
        assert_eq!(read(&arr).unwrap()[0].answers[0].start, 3);
    }

    #[test]
    fn bad_answer_offsets_are_errors_naming_the_question() {
        // The byte offset of "Switzerland" (ü is two bytes): a common conversion slip.
        let p = write(
            "bad.jsonl",
            r#"{"id": "q9", "question": "Where?", "context": "Zürich is in Switzerland.", "answers": {"text": ["Switzerland"], "answer_start": [14]}}"#,
        );
        let err = read(&p).unwrap_err().to_string();
        assert!(err.contains("\"q9\"") && err.contains("line 1 of"), "{err}");
        assert!(
            err.contains("\"Switzerland\"") && err.contains("witzerland."),
            "{err}"
        );
        assert!(
            err.contains("byte offset") && err.contains("should be 13"),
            "{err}"
        );
        let off = V2.replace("\"answer_start\": 30", "\"answer_start\": 32");
        let err = read(&write("off.json", &off)).unwrap_err().to_string();
        assert!(
            err.contains("\"q2\"") && err.contains("article 1") && err.contains("character 32"),
            "{err}"
        );
        assert!(err.contains("occurs at character 30"), "{err}");
        let past = V2.replace("\"answer_start\": 30", "\"answer_start\": 300");
        assert!(read(&write("past.json", &past))
            .unwrap_err()
            .to_string()
            .contains("past the end"));
    }

    #[test]
    fn missing_parts_are_errors() {
        let e = |body: &str| read(&write("m.jsonl", body)).unwrap_err().to_string();
        let err = e(r#"{"id": "x", "question": " ", "context": "c", "answers": []}"#);
        assert!(
            err.contains("\"x\"") && err.contains("empty question"),
            "{err}"
        );
        let err = e(r#"{"id": "y", "question": "q?", "answers": []}"#);
        assert!(
            err.contains("\"y\"") && err.contains("no \"context\""),
            "{err}"
        );
        let err =
            e(r#"{"id": "z", "question": "q?", "context": "a b", "answers": {"text": ["a"]}}"#);
        assert!(err.contains("answer_start"), "{err}");
        let err = e("{\"id\": \"d\", \"question\": \"q\", \"context\": \"c\"}\n{\"id\": \"d\", \"question\": \"q\", \"context\": \"c\"}");
        assert!(err.contains("appears twice"), "{err}");
        let no_ctx = V2.replace(
            "\"context\": \"Zürich is the largest city in Switzerland.\",",
            "",
        );
        assert!(read(&write("noctx.json", &no_ctx))
            .unwrap_err()
            .to_string()
            .contains("no \"context\""));
        assert!(read(&write("notsquad.json", "{\"version\": 1,\n \"x\": []}")).is_err());
        let cut = &V2[..V2.len() / 2];
        let err = read(&write("cut.json", cut)).unwrap_err().to_string();
        assert!(err.contains("cut.json is not valid JSON"), "{err}");
    }

    const FILLER: &str = "the river runs by the old mill and the hills are green";

    /// A long context with the answer near its end.
    fn long_example() -> QaExample {
        let mut context = String::new();
        for _ in 0..6 {
            context.push_str(FILLER);
            context.push_str(". ");
        }
        let start = context.chars().count() + "the treasure lies in ".len();
        context.push_str("the treasure lies in Zürich Hampshire today.");
        QaExample {
            id: "long".into(),
            question: "where does the treasure lie?".into(),
            context,
            answers: vec![Answer {
                text: "Zürich Hampshire".into(),
                start,
            }],
        }
    }

    fn vocab() -> Vec<&'static str> {
        let mut v: Vec<&str> = FILLER.split(' ').collect();
        v.extend([
            "treasure", "lies", "lie", "in", "zurich", "hamp", "shire", "today", "where", "does",
        ]);
        v
    }

    fn check_windows(
        tok: &Tokenizer,
        ex: &QaExample,
        max_length: usize,
        stride: usize,
    ) -> Vec<Window> {
        let ws = windows(tok, ex, max_length, stride).unwrap();
        assert!(ws.len() >= 3, "{} windows", ws.len());
        let q_ids = &ws[0].ids[..ws[0].context_range.start];
        for (i, w) in ws.iter().enumerate() {
            assert_eq!(w.index, i);
            assert!(w.ids.len() <= max_length);
            assert_eq!(w.attention_len, w.ids.len());
            assert_eq!(
                &w.ids[..w.context_range.start],
                q_ids,
                "every window starts with the question"
            );
            for t in 0..w.ids.len() {
                assert_eq!(w.offsets[t].is_some(), w.context_range.contains(&t));
            }
            if i > 0 {
                // The last doc_stride context tokens of the previous window start this one.
                let prev = &ws[i - 1];
                let tail = &prev.ids[prev.context_range.end - stride..prev.context_range.end];
                assert_eq!(
                    &w.ids[w.context_range.start..w.context_range.start + stride],
                    tail
                );
            }
        }
        let (last, rest) = ws.split_last().unwrap();
        for w in rest {
            assert_eq!(
                w.answer_tokens,
                (0, 0),
                "window {} lacks the answer",
                w.index
            );
        }
        let (s, e) = last.answer_tokens;
        assert!(s > 0 && s <= e);
        let (cs, ce) = (last.offsets[s].unwrap().0, last.offsets[e].unwrap().1);
        assert_eq!(char_slice(&ex.context, cs, ce), "Zürich Hampshire");
        ws
    }

    #[test]
    fn answer_only_in_a_later_window_wordpiece() {
        let tok = wordpiece(&vocab());
        let ex = long_example();
        let ws = check_windows(&tok, &ex, 24, 4);
        let w = &ws[0];
        assert_eq!(w.ids[0], tok.token_to_id("[CLS]").unwrap() as i64);
        assert!(w.type_ids[w.context_range.clone()].iter().all(|&t| t == 1));
        assert!(w.type_ids[..w.context_range.start].iter().all(|&t| t == 0));
        assert_eq!(
            *w.ids.last().unwrap(),
            tok.token_to_id("[SEP]").unwrap() as i64
        );

        // The windows cover the whole context.
        let mut covered = vec![false; ex.context.chars().count()];
        for w in &ws {
            for (s, e) in w.offsets.iter().flatten() {
                covered[*s..*e].iter_mut().for_each(|c| *c = true);
            }
        }
        for (c, ch) in ex.context.chars().enumerate() {
            assert!(
                covered[c] || ch.is_whitespace(),
                "character {c} ({ch:?}) in no window"
            );
        }

        // The tokenizer's own overflow (what run_qa.py gets from Python's tokenizers) gives
        // the same windows where it is complete: a context of at most max_length tokens...
        let crate_windows = |ex: &QaExample| -> Vec<Vec<i64>> {
            let mut own = tok.clone();
            own.with_truncation(Some(TruncationParams {
                max_length: 24,
                stride: 4,
                strategy: TruncationStrategy::OnlySecond,
                ..Default::default()
            }))
            .unwrap();
            let mut enc = own
                .encode((ex.question.as_str(), ex.context.as_str()), true)
                .unwrap();
            let over = enc.take_overflowing();
            std::iter::once(enc)
                .chain(over)
                .map(|e| e.get_ids().iter().map(|&i| i as i64).collect())
                .collect()
        };
        let ids = |ws: Vec<Window>| -> Vec<Vec<i64>> { ws.into_iter().map(|w| w.ids).collect() };
        let mid = QaExample {
            context: format!("{FILLER}. the river runs by the old mill and the hills"),
            answers: vec![],
            ..ex.clone()
        };
        let ours = ids(windows(&tok, &mid, 24, 4).unwrap());
        assert_eq!(ours.len(), 2);
        assert_eq!(ours, crate_windows(&mid));
        // ...but for a longer context tokenizers 0.23 stops tokenizing at max_length tokens
        // and its overflow loses the rest (the answer here). If this starts failing, the
        // crate has fixed that; windows() does not depend on it either way.
        let theirs = crate_windows(&ex);
        assert_eq!(theirs[0], ws[0].ids);
        assert!(theirs.len() < ws.len());
    }

    #[test]
    fn answer_only_in_a_later_window_byte_level() {
        let mut words = vocab();
        words.extend(["Zürich", "Hampshire", "mill."]);
        for trim in [true, false] {
            let tok = byte_level(&words, trim);
            let ex = long_example();
            let ws = check_windows(&tok, &ex, 24, 3);
            assert!(
                ws.iter().all(|w| w.type_ids.iter().all(|&t| t == 0)),
                "RoBERTa: type ids 0"
            );
            // Every context token's span is free of the space before it.
            for w in &ws {
                for (s, e) in w.offsets.iter().flatten() {
                    let piece = char_slice(&ex.context, *s, *e);
                    assert_eq!(piece.trim(), piece, "trim_offsets {trim}");
                }
            }
        }
    }

    /// A `TemplateProcessing` post-processor (what most tokenizer.json files have) sets type
    /// ids by its template in every window, not only the first.
    #[test]
    fn template_type_ids_in_every_window() {
        use tokenizers::processors::template::TemplateProcessing;
        for (pair, want) in [
            ("[CLS] $A [SEP] $B:1 [SEP]:1", 1),
            ("[CLS] $A [SEP] [SEP] $B:0 [SEP]", 0),
        ] {
            let mut tok = wordpiece(&vocab());
            let (cls, sep) = (
                tok.token_to_id("[CLS]").unwrap(),
                tok.token_to_id("[SEP]").unwrap(),
            );
            let template = TemplateProcessing::builder()
                .try_single("[CLS] $A [SEP]")
                .unwrap()
                .try_pair(pair)
                .unwrap()
                .special_tokens(vec![("[CLS]", cls), ("[SEP]", sep)])
                .build()
                .unwrap();
            tok.with_post_processor(Some(template));
            let ws = check_windows(&tok, &long_example(), 24, 4);
            for w in &ws {
                assert!(
                    w.type_ids[w.context_range.clone()]
                        .iter()
                        .all(|&t| t == want),
                    "{pair}"
                );
                assert_eq!(w.type_ids[0], 0);
            }
        }
    }

    #[test]
    fn too_long_question_is_an_error() {
        let tok = wordpiece(&vocab());
        let mut ex = long_example();
        ex.question = "where does the treasure lie ".repeat(5);
        let err = windows(&tok, &ex, 24, 4).unwrap_err().to_string();
        assert!(
            err.contains("\"long\"") && err.contains("raise max_length"),
            "{err}"
        );
        let err = windows(&tok, &long_example(), 8, 6)
            .unwrap_err()
            .to_string();
        assert!(err.contains("lower doc_stride"), "{err}");
        // A bad answer in an example made in code is an error, not a panic.
        let mut bad = long_example();
        bad.answers[0].start = 10_000;
        assert!(windows(&tok, &bad, 24, 4).is_err());
    }

    #[test]
    fn windows_of_many_examples() {
        let tok = wordpiece(&vocab());
        let mut other = long_example();
        other.id = "other".into();
        let all = windows_all(&tok, &[long_example(), other.clone()], 24, 4).unwrap();
        let one = windows(&tok, &other, 24, 4).unwrap();
        assert_eq!(all.len(), 2 * one.len());
        assert_eq!(all[one.len()..], one[..]);
    }

    #[test]
    fn unanswerable_points_at_cls() {
        let tok = wordpiece(&vocab());
        let mut ex = long_example();
        ex.answers.clear();
        let ws = windows(&tok, &ex, 24, 4).unwrap();
        assert!(ws.iter().all(|w| w.answer_tokens == (0, 0)));
        // A short context: one window.
        let short = QaExample {
            id: "s".into(),
            question: "where?".into(),
            context: "in zurich".into(),
            answers: vec![],
        };
        let ws = windows(&tok, &short, 24, 4).unwrap();
        assert_eq!(ws.len(), 1);
        assert_eq!(ws[0].answer_tokens, (0, 0));
    }

    /// Logits that point at the answer tokens of the window holding them, and at [CLS] (with
    /// `null`) elsewhere.
    fn fake_logits(ws: &[Window], null: f32) -> Vec<(Vec<f32>, Vec<f32>)> {
        ws.iter()
            .map(|w| {
                let mut s = vec![0.0f32; w.ids.len() + 3]; // padded past the window
                let mut e = s.clone();
                s[0] = null / 2.0;
                e[0] = null / 2.0;
                let (a, b) = w.answer_tokens;
                if (a, b) != (0, 0) {
                    s[a] = 5.0;
                    e[b] = 4.0;
                    // A tempting but invalid pair: end before start, and question tokens.
                    e[a - 1] = 9.0;
                    s[1] = 9.0;
                    e[1] = 9.0;
                }
                (s, e)
            })
            .collect()
    }

    #[test]
    fn best_span_across_windows() {
        let mut words = vocab();
        words.extend(["Zürich", "Hampshire"]);
        for tok in [wordpiece(&vocab()), byte_level(&words, false)] {
            let ex = long_example();
            let ws = windows(&tok, &ex, 24, 4).unwrap();
            let logits = fake_logits(&ws, 1.0);
            let refs: Vec<(&[f32], &[f32])> =
                logits.iter().map(|(s, e)| (&s[..], &e[..])).collect();
            let p = predict(&ex, &ws, &refs, 30, 20, None).unwrap();
            assert_eq!(p.text, "Zürich Hampshire");
            assert!(p.answered && (p.score - 9.0).abs() < 1e-6);
            assert_eq!(char_slice(&ex.context, p.start, p.end), p.text);
            // v2: a null score above the best span's leaves it unanswered...
            let logits = fake_logits(&ws, 20.0);
            let refs: Vec<(&[f32], &[f32])> =
                logits.iter().map(|(s, e)| (&s[..], &e[..])).collect();
            let p = predict(&ex, &ws, &refs, 30, 20, Some(0.0)).unwrap();
            assert!(!p.answered && p.text.is_empty());
            // ...unless the threshold allows it.
            let p = predict(&ex, &ws, &refs, 30, 20, Some(12.0)).unwrap();
            assert!(p.answered && p.text == "Zürich Hampshire");
            // Too short a max_answer_tokens: no valid span at all.
            let p = predict(&ex, &ws, &refs, 1, 20, None).unwrap();
            if ws.last().unwrap().answer_tokens.0 != ws.last().unwrap().answer_tokens.1 {
                assert!(!p.answered || p.text != "Zürich Hampshire");
            }
            assert!(predict(&ex, &ws, &refs[..1], 30, 20, None).is_err());
        }
    }
}
