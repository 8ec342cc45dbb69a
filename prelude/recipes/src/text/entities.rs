//! Entity-level scores for token classification (named entities and other chunks tagged
//! `B-X`/`I-X`), computed exactly as the Python package seqeval 1.2.2 computes them in its default
//! mode — `precision_score`, `recall_score`, `f1_score`, `classification_report` without
//! `mode="strict"` — so that a number trainbook reports is the number a Hugging Face token
//! classification script (which calls seqeval) reports for the same predictions.
//!
//! That mode chunks as CoNLL's `conlleval` does, which reads IOB1 and IOB2 (BIO) tags alike:
//! `B-X` always starts an entity; `I-X` continues an entity of type X and starts one after `O`
//! or after another type (so `B-PER I-LOC` is a PER entity then a LOC entity, and `O I-PER` is a
//! PER entity). IOBES tags are read too, as seqeval reads them (`E-X` ends an entity, `S-X` is a
//! one-token entity): they are accepted here, and [`check_bio`] lets them through.
//!
//! An entity is right only if its type, first and last token all match a gold entity: no
//! partial credit. Scores are micro-averaged over the whole evaluation set (all sentences'
//! entities counted together) and given per type; where a ratio is 0/0 it is 0.0, as seqeval's
//! default `zero_division="warn"` gives (with a warning). Token accuracy is the share of tokens
//! whose predicted tag equals the gold tag, seqeval's `accuracy_score`.
//!
//! tests/fixtures/make_score_reference.py writes the seqeval results that pin all of this
//! (tests/fixtures/scores/reference.json).

use std::collections::{BTreeMap, BTreeSet};

use anyhow::{bail, Result};
use serde::Serialize;

/// One entity (chunk) of a sentence: its type and the tokens `start..end` it spans (`end`
/// exclusive; seqeval's own tuples have the last token instead).
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
pub struct Entity {
    /// The type after the prefix: `PER` for `B-PER`.
    pub kind: String,
    pub start: usize,
    pub end: usize,
}

/// Scores of one entity type.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct KindScores {
    pub precision: f64,
    pub recall: f64,
    pub f1: f64,
    /// Gold entities of this type (0 for a type only ever predicted).
    pub support: usize,
}

/// Entity scores of an evaluation set, as fractions in 0..=1.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct EntityScores {
    /// Micro-averaged over all entities of all types (seqeval's default `average="micro"`).
    pub precision: f64,
    pub recall: f64,
    pub f1: f64,
    /// Per type, for every type in the gold or the predicted tags (seqeval's report rows).
    pub per_kind: BTreeMap<String, KindScores>,
    /// Tokens whose predicted tag is the gold tag, over all tokens.
    pub token_accuracy: f64,
}

/// The chunks of one sentence's tags, as seqeval's `get_entities` finds them.
///
/// Tags are read as seqeval reads them: the first character is the prefix (`B`, `I`, `E`, `S`,
/// `O`), the type is what follows the first `-` after it. A tag outside that scheme is chunked
/// the same lenient way seqeval does it (an empty tag is read as `O`); [`score`] rejects such
/// tags, and [`check_bio`] tells whether a sequence has any.
pub fn entities<S: AsRef<str>>(tags: &[S]) -> Vec<Entity> {
    let mut out = Vec::new();
    // seqeval starts from prev_tag 'O', prev_type '' (a type no tag can have: it reads '' as '_').
    let mut prev_prefix = 'O';
    let mut prev_kind = "";
    let mut begin = 0;
    // One `O` past the end closes an entity that runs to the last token.
    let padded = tags.iter().map(AsRef::as_ref).chain(std::iter::once("O"));
    for (i, tag) in padded.enumerate() {
        let (prefix, kind) = split_tag(tag);
        if end_of_chunk(prev_prefix, prefix, prev_kind, kind) {
            // end_of_chunk never holds at i = 0 (prev_prefix is 'O' there), and `begin` is 0 or
            // was set at a token before i, so begin < i: the span is never empty.
            out.push(Entity {
                kind: prev_kind.to_string(),
                start: begin,
                end: i,
            });
        }
        if start_of_chunk(prev_prefix, prefix, prev_kind, kind) {
            begin = i;
        }
        prev_prefix = prefix;
        prev_kind = kind;
    }
    out
}

/// seqeval's reading of a tag: `chunk[0]` and `chunk[1:].split('-', maxsplit=1)[-1] or '_'`.
fn split_tag(tag: &str) -> (char, &str) {
    let mut chars = tag.chars();
    let Some(prefix) = chars.next() else {
        return ('O', "_");
    };
    let rest = chars.as_str();
    let kind = match rest.split_once('-') {
        Some((_, after)) => after,
        None => rest,
    };
    (prefix, if kind.is_empty() { "_" } else { kind })
}

/// seqeval's `end_of_chunk`: whether an entity ended between the previous token and this one.
fn end_of_chunk(prev: char, tag: char, prev_kind: &str, kind: &str) -> bool {
    matches!(prev, 'E' | 'S')
        || (matches!(prev, 'B' | 'I') && matches!(tag, 'B' | 'S' | 'O'))
        || (prev != 'O' && prev != '.' && prev_kind != kind)
}

/// seqeval's `start_of_chunk`: whether an entity starts at this token.
fn start_of_chunk(prev: char, tag: char, prev_kind: &str, kind: &str) -> bool {
    matches!(tag, 'B' | 'S')
        || (matches!(prev, 'E' | 'S' | 'O') && matches!(tag, 'E' | 'I'))
        || (tag != 'O' && tag != '.' && prev_kind != kind)
}

/// Whether a tag is one entity scoring understands: `O`, or `B-X`, `I-X`, `E-X`, `S-X` with a
/// non-empty type X.
fn is_entity_tag(tag: &str) -> bool {
    if tag == "O" {
        return true;
    }
    match tag.split_once('-') {
        Some((prefix, kind)) => matches!(prefix, "B" | "I" | "E" | "S") && !kind.is_empty(),
        None => false,
    }
}

/// Checks that every tag is `O`, `B-X` or `I-X` (X a non-empty type; IOBES's `E-X` and `S-X`
/// are accepted too), since entity scores are only defined for such tags: on anything else
/// seqeval guesses a prefix from the first letter and its numbers mean nothing. The error names
/// the first bad tag.
pub fn check_bio<'a>(tags: impl IntoIterator<Item = &'a str>) -> Result<()> {
    for (i, tag) in tags.into_iter().enumerate() {
        if !is_entity_tag(tag) {
            bail!(
                "tag {i} ({tag:?}) is not O, B-X or I-X (nor IOBES's E-X, S-X), X a type such as \
                 PER: entity precision/recall/F1 need tags in BIO form; for another tag set \
                 (part-of-speech tags, say) report token accuracy only"
            );
        }
    }
    Ok(())
}

/// Whether a tag set (the labels of a token classification data set) describes entities: every
/// tag passes [`check_bio`] and at least one is not `O`. A part-of-speech tag set does not, and
/// its callers report token accuracy alone.
pub fn has_entities<'a>(tag_set: impl IntoIterator<Item = &'a str>) -> bool {
    let mut any_entity = false;
    for tag in tag_set {
        if !is_entity_tag(tag) {
            return false;
        }
        any_entity |= tag != "O";
    }
    any_entity
}

/// The counts micro-averaged entity scores are ratios of: summed over batches (and ranks),
/// they give exactly the scores of the whole set ([`EntityCounts::precision`] and so on are
/// [`score`]'s micro precision, recall and F1 of the same sentences).
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize)]
pub struct EntityCounts {
    /// Predicted entities that are gold entities (type and both boundaries).
    pub correct: usize,
    pub predicted: usize,
    pub gold: usize,
    pub correct_tokens: usize,
    pub tokens: usize,
}

impl EntityCounts {
    /// Counts the entities and tokens of `predicted` against `gold` (one tag sequence per
    /// sentence; the same checks as [`score`], except that no token at all is allowed).
    pub fn of<S: AsRef<str>>(gold: &[Vec<S>], predicted: &[Vec<S>]) -> Result<Self> {
        if gold.iter().all(Vec::is_empty) && gold.len() == predicted.len() {
            return Ok(Self::default());
        }
        // The same checks (lengths, BIO tags) as `score`.
        score(gold, predicted)?;
        let mut c = Self::default();
        for (g, p) in gold.iter().zip(predicted) {
            let (g_set, p_set): (BTreeSet<Entity>, BTreeSet<Entity>) = (
                entities(g).into_iter().collect(),
                entities(p).into_iter().collect(),
            );
            c.correct += g_set.intersection(&p_set).count();
            c.predicted += p_set.len();
            c.gold += g_set.len();
            c.tokens += g.len();
            c.correct_tokens += g
                .iter()
                .zip(p)
                .filter(|(a, b)| a.as_ref() == b.as_ref())
                .count();
        }
        Ok(c)
    }
}

/// Entity precision, recall, F1 (micro and per type) and token accuracy of `predicted` against
/// `gold`, one tag sequence per sentence, as seqeval 1.2.2's default mode computes them.
///
/// Sentences are chunked separately (seqeval joins them with an `O` between, which is the same:
/// no entity crosses a sentence end) and all entities then counted together. Fails, naming the
/// problem, when the two have different numbers of sentences, a sentence's two tag sequences
/// differ in length (seqeval would silently misalign them), a tag is not `O`/`B-X`/`I-X`/`E-X`/
/// `S-X`, or there is no token at all (seqeval's accuracy divides by zero there).
pub fn score<S: AsRef<str>>(gold: &[Vec<S>], predicted: &[Vec<S>]) -> Result<EntityScores> {
    if gold.len() != predicted.len() {
        bail!(
            "{} gold sentences but {} predicted: score one prediction per gold sentence, in the \
             same order",
            gold.len(),
            predicted.len()
        );
    }
    let mut tokens = 0usize;
    let mut correct = 0usize;
    // Per type: the (sentence, start, end) of gold and of predicted entities. Sets, as seqeval's.
    type Spans = BTreeSet<(usize, usize, usize)>;
    let mut gold_spans: BTreeMap<String, Spans> = BTreeMap::new();
    let mut pred_spans: BTreeMap<String, Spans> = BTreeMap::new();
    for (n, (g, p)) in gold.iter().zip(predicted).enumerate() {
        if g.len() != p.len() {
            bail!(
                "sentence {n}: {} gold tags but {} predicted: predict one tag per gold token \
                 (map sub-word predictions back to words, e.g. the first piece's tag, first)",
                g.len(),
                p.len()
            );
        }
        for (side, tags) in [("gold", g), ("predicted", p)] {
            if let Some((i, bad)) = tags
                .iter()
                .map(AsRef::as_ref)
                .enumerate()
                .find(|(_, t)| !is_entity_tag(t))
            {
                bail!(
                    "sentence {n}, token {i}: {side} tag {bad:?} is not O, B-X or I-X (nor \
                     IOBES's E-X, S-X): entity scores need tags in BIO form; for another tag set \
                     (part-of-speech tags, say) report token accuracy only"
                );
            }
        }
        tokens += g.len();
        correct += g
            .iter()
            .zip(p)
            .filter(|(a, b)| a.as_ref() == b.as_ref())
            .count();
        for (tags, spans) in [(g, &mut gold_spans), (p, &mut pred_spans)] {
            for e in entities(tags) {
                spans.entry(e.kind).or_default().insert((n, e.start, e.end));
            }
        }
    }
    if tokens == 0 {
        bail!(
            "nothing to score: the {} sentences have no token; evaluate on a set with at least \
             one tagged token",
            gold.len()
        );
    }

    let empty = Spans::new();
    let kinds: BTreeSet<&String> = gold_spans.keys().chain(pred_spans.keys()).collect();
    let (mut tp_all, mut pred_all, mut gold_all) = (0, 0, 0);
    let mut per_kind = BTreeMap::new();
    for kind in kinds {
        let g = gold_spans.get(kind).unwrap_or(&empty);
        let p = pred_spans.get(kind).unwrap_or(&empty);
        let tp = g.intersection(p).count();
        let (precision, recall, f1) = prf(tp, p.len(), g.len());
        per_kind.insert(
            kind.clone(),
            KindScores {
                precision,
                recall,
                f1,
                support: g.len(),
            },
        );
        tp_all += tp;
        pred_all += p.len();
        gold_all += g.len();
    }
    let (precision, recall, f1) = prf(tp_all, pred_all, gold_all);
    Ok(EntityScores {
        precision,
        recall,
        f1,
        per_kind,
        token_accuracy: correct as f64 / tokens as f64,
    })
}

/// Precision, recall and F1 from counts, with seqeval's arithmetic (its `_prf_divide` and
/// `(1 + beta²)·p·r / (beta²·p + r)` at beta = 1), 0/0 read as 0.
fn prf(true_positives: usize, predicted: usize, gold: usize) -> (f64, f64, f64) {
    let ratio = |n: usize, d: usize| if d == 0 { 0.0 } else { n as f64 / d as f64 };
    let p = ratio(true_positives, predicted);
    let r = ratio(true_positives, gold);
    let denom = p + r;
    let f1 = if denom == 0.0 {
        0.0
    } else {
        2.0 * p * r / denom
    };
    (p, r, f1)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::Value;

    const REFERENCE: &str = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../tests/fixtures/scores/reference.json"
    );

    fn sentences(v: &Value) -> Vec<Vec<String>> {
        serde_json::from_value(v.clone()).unwrap()
    }

    fn close(a: f64, b: &Value, what: &str) {
        let b = b
            .as_f64()
            .unwrap_or_else(|| panic!("{what}: {b} is not a number"));
        assert!((a - b).abs() <= 1e-9, "{what}: {a} here, seqeval {b}");
    }

    fn ent(kind: &str, start: usize, end: usize) -> Entity {
        Entity {
            kind: kind.into(),
            start,
            end,
        }
    }

    /// Counts summed over parts of a set (batches, ranks) give seqeval's micro scores of the
    /// whole set.
    #[test]
    fn counts_summed_over_parts_give_the_whole_sets_scores() {
        let text = std::fs::read_to_string(REFERENCE).unwrap();
        let reference: Value = serde_json::from_str(&text).unwrap();
        for case in reference["entities"]["cases"].as_array().unwrap() {
            let (gold, pred) = (sentences(&case["gold"]), sentences(&case["predicted"]));
            let half = gold.len() / 2;
            let a = EntityCounts::of(&gold[..half], &pred[..half]).unwrap();
            let b = EntityCounts::of(&gold[half..], &pred[half..]).unwrap();
            let ratio = |n: usize, d: usize| if d == 0 { 0.0 } else { n as f64 / d as f64 };
            let whole = score(&gold, &pred).unwrap();
            let (correct, predicted, gold_n) = (
                a.correct + b.correct,
                a.predicted + b.predicted,
                a.gold + b.gold,
            );
            let name = case["name"].as_str().unwrap();
            assert!(
                (ratio(correct, predicted) - whole.precision).abs() < 1e-12,
                "{name}"
            );
            assert!(
                (ratio(correct, gold_n) - whole.recall).abs() < 1e-12,
                "{name}"
            );
            let f1 = ratio(2 * correct, predicted + gold_n);
            assert!((f1 - whole.f1).abs() < 1e-12, "{name}: {f1} {}", whole.f1);
            let acc = ratio(a.correct_tokens + b.correct_tokens, a.tokens + b.tokens);
            assert!((acc - whole.token_accuracy).abs() < 1e-12, "{name}");
        }
    }

    #[test]
    fn matches_seqeval_reference() {
        let text = std::fs::read_to_string(REFERENCE).unwrap_or_else(|e| {
            panic!("{REFERENCE}: {e} (tests/fixtures/make_score_reference.py)")
        });
        let reference: Value = serde_json::from_str(&text).unwrap();
        let cases = reference["entities"]["cases"].as_array().unwrap();
        assert!(cases.len() >= 10);
        for case in cases {
            let name = case["name"].as_str().unwrap();
            let gold = sentences(&case["gold"]);
            let pred = sentences(&case["predicted"]);
            for (side, tags, want) in [
                ("gold", &gold, &case["gold_entities"]),
                ("predicted", &pred, &case["predicted_entities"]),
            ] {
                let want: Vec<Vec<(String, usize, usize)>> =
                    serde_json::from_value(want.clone()).unwrap();
                let got: Vec<Vec<(String, usize, usize)>> = tags
                    .iter()
                    .map(|t| {
                        entities(t)
                            .into_iter()
                            .map(|e| (e.kind, e.start, e.end))
                            .collect()
                    })
                    .collect();
                assert_eq!(got, want, "{name}: {side} entities");
            }
            let got = score(&gold, &pred).unwrap_or_else(|e| panic!("{name}: {e:#}"));
            let want = &case["expected"];
            close(
                got.precision,
                &want["precision"],
                &format!("{name}: precision"),
            );
            close(got.recall, &want["recall"], &format!("{name}: recall"));
            close(got.f1, &want["f1"], &format!("{name}: f1"));
            close(
                got.token_accuracy,
                &want["accuracy"],
                &format!("{name}: accuracy"),
            );
            let want_kinds = want["per_kind"].as_object().unwrap();
            let got_kinds: Vec<&String> = got.per_kind.keys().collect();
            let want_names: Vec<&String> = want_kinds.keys().collect();
            assert_eq!(got_kinds, want_names, "{name}: types");
            for (kind, w) in want_kinds {
                let g = &got.per_kind[kind];
                close(
                    g.precision,
                    &w["precision"],
                    &format!("{name} {kind}: precision"),
                );
                close(g.recall, &w["recall"], &format!("{name} {kind}: recall"));
                close(g.f1, &w["f1"], &format!("{name} {kind}: f1"));
                assert_eq!(
                    g.support as u64,
                    w["support"].as_u64().unwrap(),
                    "{name} {kind}"
                );
            }
        }
    }

    #[test]
    fn chunking_rules() {
        // Adjacent entities of one type, I- after O, a type switch inside, IOBES.
        assert_eq!(
            entities(&["B-PER", "I-PER", "B-PER", "O", "I-LOC", "B-ORG", "I-MISC"]),
            vec![
                ent("PER", 0, 2),
                ent("PER", 2, 3),
                ent("LOC", 4, 5),
                ent("ORG", 5, 6),
                ent("MISC", 6, 7)
            ]
        );
        assert_eq!(
            entities(&["S-PER", "B-LOC", "E-LOC", "S-LOC"]),
            vec![ent("PER", 0, 1), ent("LOC", 1, 3), ent("LOC", 3, 4)]
        );
        // A type may itself contain '-'; only the first one after the prefix separates.
        assert_eq!(entities(&["B-ORG-X", "I-ORG-X"]), vec![ent("ORG-X", 0, 2)]);
        assert!(entities::<&str>(&[]).is_empty());
        assert!(entities(&["O", "O"]).is_empty());
        // Lenient on tags outside the scheme, as seqeval is, and never panics on them.
        let _ = entities(&["", "B-", "Ü", "-", "I"]);
    }

    #[test]
    fn score_counts_sets_per_type() {
        let gold = vec![vec!["B-PER", "I-PER", "O", "B-LOC"], vec!["O", "B-ORG"]];
        let pred = vec![vec!["B-PER", "I-PER", "O", "B-ORG"], vec!["O", "O"]];
        let s = score(&gold, &pred).unwrap();
        assert_eq!((s.precision, s.recall), (0.5, 1.0 / 3.0));
        assert!((s.f1 - 0.4).abs() < 1e-15);
        assert_eq!(s.token_accuracy, 4.0 / 6.0);
        assert_eq!(
            s.per_kind["PER"],
            KindScores {
                precision: 1.0,
                recall: 1.0,
                f1: 1.0,
                support: 1
            }
        );
        assert_eq!(
            s.per_kind["ORG"],
            KindScores {
                precision: 0.0,
                recall: 0.0,
                f1: 0.0,
                support: 1
            }
        );
        assert_eq!(s.per_kind["LOC"].support, 1);
        // Strings work as well as &str.
        let owned: Vec<Vec<String>> = gold
            .iter()
            .map(|s| s.iter().map(|t| t.to_string()).collect())
            .collect();
        assert_eq!(score(&owned, &owned).unwrap().f1, 1.0);
    }

    #[test]
    fn no_entity_anywhere_scores_zero_not_nan() {
        let s = score(&[vec!["O", "O"]], &[vec!["O", "O"]]).unwrap();
        assert_eq!(
            (s.precision, s.recall, s.f1, s.token_accuracy),
            (0.0, 0.0, 0.0, 1.0)
        );
        assert!(s.per_kind.is_empty());
        // Empty sentences among others are fine.
        let s = score(&[vec![], vec!["B-PER"]], &[vec![], vec!["B-PER"]]).unwrap();
        assert_eq!(s.f1, 1.0);
    }

    #[test]
    fn unequal_lengths_are_errors() {
        let e = score(&[vec!["O"], vec!["O"]], &[vec!["O"]])
            .unwrap_err()
            .to_string();
        assert!(e.contains("2 gold sentences but 1 predicted"), "{e}");
        let e = score(&[vec!["O", "B-PER"]], &[vec!["O"]])
            .unwrap_err()
            .to_string();
        assert!(e.contains("sentence 0: 2 gold tags but 1 predicted"), "{e}");
    }

    #[test]
    fn empty_inputs_are_errors() {
        let none: [Vec<&str>; 0] = [];
        let e = score(&none, &none).unwrap_err().to_string();
        assert!(e.contains("nothing to score"), "{e}");
        let e = score(&[Vec::<&str>::new()], &[vec![]])
            .unwrap_err()
            .to_string();
        assert!(e.contains("nothing to score"), "{e}");
    }

    #[test]
    fn non_bio_tags_are_errors() {
        let e = score(&[vec!["O", "NN"]], &[vec!["O", "O"]])
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("token 1: gold tag \"NN\"") && e.contains("token accuracy"),
            "{e}"
        );
        let e = score(&[vec!["O"]], &[vec!["B-"]]).unwrap_err().to_string();
        assert!(e.contains("predicted tag \"B-\""), "{e}");
    }

    #[test]
    fn check_bio_names_the_first_bad_tag() {
        assert!(check_bio(["O", "B-PER", "I-PER", "E-LOC", "S-LOC", "B-ORG-X"]).is_ok());
        assert!(check_bio([]).is_ok());
        for bad in ["", "o", "B", "B-", "b-PER", "X-PER", "PER", "O-PER", "NN"] {
            let e = check_bio(["O", "B-PER", bad, "VB"])
                .unwrap_err()
                .to_string();
            assert!(e.starts_with(&format!("tag 2 ({bad:?})")), "{e}");
            assert!(e.contains("BIO") && e.contains("token accuracy"), "{e}");
        }
    }

    #[test]
    fn has_entities_tells_ner_from_pos() {
        assert!(has_entities(["O", "B-PER", "I-PER"]));
        assert!(has_entities(["S-LOC"]));
        assert!(!has_entities(["O"]));
        assert!(!has_entities([]));
        assert!(!has_entities(["NN", "VB", "DT", "B-NP"]));
        assert!(!has_entities(["O", "B-PER", "X"]));
    }
}
