//! Extractive question answering scores (exact match and token F1) computed exactly as the
//! official SQuAD evaluation scripts compute them, so that a number trainbook reports is the one
//! papers and Hugging Face's `squad`/`squad_v2` metrics report for the same answers.
//!
//! Both scripts normalise an answer the same way (see [`normalize`]) and score a prediction
//! against each gold answer, keeping the best. They differ in two places, and this module
//! follows v2.0 in both, which on SQuAD v1.1 data changes nothing in practice:
//! - F1 when either side normalises to no token: v2.0 gives 1.0 if both do, else 0.0; v1.1 gives
//!   0.0 (no common token), so the two differ only when both are empty;
//! - gold answers that normalise to "" (an answer "The", say) are dropped by v2.0, and a question
//!   with no gold answer left is scored against "" — the rule that scores an unanswerable v2.0
//!   question: 1.0 exactly when the prediction normalises to "" (empty, or only articles and
//!   punctuation). v1.1 keeps such gold answers.
//!
//! torchmetrics' `squad` (the Python reference that tests/fixtures/make_score_reference.py runs)
//! has v2.0's F1 rule but v1.1's gold answers, and fails on a question with none; the fixture's
//! v2.0 expectations come from a copy of the official v2.0 formula.

use std::collections::HashMap;

use serde::Serialize;

/// SQuAD's answer normalisation: lowercase; delete ASCII punctuation (Python's
/// `string.punctuation`); replace each article `a`, `an`, `the` standing as a whole word by a
/// space (the script's `re.sub(r"\b(a|an|the)\b", " ", text)`); collapse whitespace runs to one
/// space and trim.
///
/// Done without regular expressions, keeping Python 3's semantics on `str` (the scripts run on
/// Python 3, where `re` is Unicode-aware):
/// - `\b(a|an|the)\b` matches exactly a maximal run of word characters that is `a`, `an` or
///   `the` (the letters are word characters, so the `\b`s say the characters either side are
///   not), so the text is cut into maximal runs of Python's `\w` and those runs replaced;
/// - Python's `\w` is a letter (Unicode category L*), a number (N*) or `_`: Rust's
///   `char::is_alphanumeric` less the characters of Unicode's Other_Alphabetic property that are
///   neither (combining vowel signs, circled letters), which a table here lists. So `the` is
///   removed from `thé` written with a combining accent (U+0301 is not a word character) and
///   kept in `thé` written precomposed;
/// - lowercase is Unicode's full lowercasing with the final-sigma rule, as Python's
///   `str.lower()` does (no case folding: `Straße` stays `straße`, not `strasse`);
/// - whitespace is what Python's `str.split()` splits on: Unicode White_Space plus the four
///   ASCII separators U+001C..U+001F, which Python counts as whitespace and Rust does not.
///
/// Checked against Python 3.11 (Unicode 14): characters assigned since follow Rust's tables.
pub fn normalize(text: &str) -> String {
    let lowered: String = text
        .to_lowercase()
        .chars()
        .filter(|c| !c.is_ascii_punctuation())
        .collect();
    let mut no_articles = String::with_capacity(lowered.len());
    let mut rest = lowered.as_str();
    while let Some(c) = rest.chars().next() {
        let run_len = if is_word(c) {
            rest.find(|c: char| !is_word(c)).unwrap_or(rest.len())
        } else {
            c.len_utf8()
        };
        let (piece, tail) = rest.split_at(run_len);
        if matches!(piece, "a" | "an" | "the") {
            no_articles.push(' ');
        } else {
            no_articles.push_str(piece);
        }
        rest = tail;
    }
    no_articles
        .split(is_python_space)
        .filter(|t| !t.is_empty())
        .collect::<Vec<_>>()
        .join(" ")
}

/// Python 3's `str.isspace()`, what `str.split()` splits on.
fn is_python_space(c: char) -> bool {
    c.is_whitespace() || ('\u{1c}'..='\u{1f}').contains(&c)
}

/// Python 3's `\w` (and so `\b`) on `str`: letters, numbers and `_`.
///
/// Rust's `char::is_alphanumeric` is letters and numbers plus the rest of Unicode's
/// Other_Alphabetic property: combining vowel signs and the like (category Mn, Mc) and circled or
/// squared Latin letters (So), none of which Python calls a word character. [`NOT_PYTHON_WORD`]
/// lists those, so on every character assigned in Unicode 14 this is exactly Python 3.11's `\w`
/// (compared over all code points when the table was made).
fn is_word(c: char) -> bool {
    c == '_' || (c.is_alphanumeric() && !in_ranges(c, NOT_PYTHON_WORD))
}

fn in_ranges(c: char, ranges: &[(u32, u32)]) -> bool {
    let u = c as u32;
    ranges
        .binary_search_by(|&(lo, hi)| {
            if hi < u {
                std::cmp::Ordering::Less
            } else if lo > u {
                std::cmp::Ordering::Greater
            } else {
                std::cmp::Ordering::Equal
            }
        })
        .is_ok()
}

/// Code point ranges (inclusive, sorted) holding every character assigned in Unicode 14 that
/// Rust's `char::is_alphanumeric` accepts and Python 3.11's `re` `\w` does not. A range may also
/// hold characters that neither accepts (they were merged across such gaps to keep the table
/// short), so it is consulted only for characters `is_alphanumeric` accepts. Made by listing
/// `is_alphanumeric` for every `char` (Rust 1.95, Unicode 17) and comparing with
/// `re.match(r"\w", chr(u))` for every code point in Python 3.11.
#[rustfmt::skip]
const NOT_PYTHON_WORD: &[(u32, u32)] = &[
    (0x0345, 0x036F), (0x05B0, 0x05C7), (0x0610, 0x061A), (0x064B, 0x065F), (0x0670, 0x0670),
    (0x06D6, 0x06E4), (0x06E7, 0x06ED), (0x0711, 0x0711), (0x0730, 0x073F), (0x07A6, 0x07B0),
    (0x0816, 0x0817), (0x081B, 0x0823), (0x0825, 0x0827), (0x0829, 0x082C), (0x08D4, 0x0903),
    (0x093A, 0x093B), (0x093E, 0x094F), (0x0955, 0x0957), (0x0962, 0x0963), (0x0981, 0x0983),
    (0x09BE, 0x09CC), (0x09D7, 0x09D7), (0x09E2, 0x09E3), (0x0A01, 0x0A03), (0x0A3E, 0x0A51),
    (0x0A70, 0x0A71), (0x0A75, 0x0A83), (0x0ABE, 0x0ACC), (0x0AE2, 0x0AE3), (0x0AFA, 0x0B03),
    (0x0B3E, 0x0B57), (0x0B62, 0x0B63), (0x0B82, 0x0B82), (0x0BBE, 0x0BCC), (0x0BD7, 0x0BD7),
    (0x0C00, 0x0C04), (0x0C3E, 0x0C56), (0x0C62, 0x0C63), (0x0C81, 0x0C83), (0x0CBE, 0x0CD6),
    (0x0CE2, 0x0CE3), (0x0D00, 0x0D03), (0x0D3E, 0x0D4C), (0x0D57, 0x0D57), (0x0D62, 0x0D63),
    (0x0D81, 0x0D83), (0x0DCF, 0x0DDF), (0x0DF2, 0x0DF3), (0x0E31, 0x0E31), (0x0E34, 0x0E3A),
    (0x0E4D, 0x0E4D), (0x0EB1, 0x0EB1), (0x0EB4, 0x0EBC), (0x0ECD, 0x0ECD), (0x0F71, 0x0F83),
    (0x0F8D, 0x0FBC), (0x102B, 0x103E), (0x1056, 0x1059), (0x105E, 0x1060), (0x1062, 0x1064),
    (0x1067, 0x106D), (0x1071, 0x1074), (0x1082, 0x108D), (0x108F, 0x108F), (0x109A, 0x109D),
    (0x1712, 0x1713), (0x1732, 0x1733), (0x1752, 0x1753), (0x1772, 0x1773), (0x17B6, 0x17C8),
    (0x1885, 0x1886), (0x18A9, 0x18A9), (0x1920, 0x1938), (0x1A17, 0x1A1B), (0x1A55, 0x1A74),
    (0x1ABF, 0x1B04), (0x1B35, 0x1B43), (0x1B80, 0x1B82), (0x1BA1, 0x1BAD), (0x1BE7, 0x1BF1),
    (0x1C24, 0x1C36), (0x1DD3, 0x1DF4), (0x24B6, 0x24E9), (0x2DE0, 0x2DFF), (0xA674, 0xA67B),
    (0xA69E, 0xA69F), (0xA802, 0xA802), (0xA80B, 0xA80B), (0xA823, 0xA827), (0xA880, 0xA881),
    (0xA8B4, 0xA8C5), (0xA8FF, 0xA8FF), (0xA926, 0xA92A), (0xA947, 0xA952), (0xA980, 0xA983),
    (0xA9B4, 0xA9BF), (0xA9E5, 0xA9E5), (0xAA29, 0xAA36), (0xAA43, 0xAA43), (0xAA4C, 0xAA4D),
    (0xAA7B, 0xAA7D), (0xAAB0, 0xAAB0), (0xAAB2, 0xAAB4), (0xAAB7, 0xAAB8), (0xAABE, 0xAABE),
    (0xAAEB, 0xAAEF), (0xAAF5, 0xAAF5), (0xABE3, 0xABEA), (0xFB1E, 0xFB1E), (0x10376, 0x1037A),
    (0x10A01, 0x10A0F), (0x10D24, 0x10D27), (0x10EAB, 0x10EAC), (0x11000, 0x11002),
    (0x11038, 0x11045), (0x11073, 0x11074), (0x11080, 0x11082), (0x110B0, 0x110C2),
    (0x11100, 0x11102), (0x11127, 0x11132), (0x11145, 0x11146), (0x11180, 0x11182),
    (0x111B3, 0x111BF), (0x111CE, 0x111CF), (0x1122C, 0x1123E), (0x112DF, 0x112E8),
    (0x11300, 0x11303), (0x1133E, 0x1134C), (0x11357, 0x11357), (0x11362, 0x11363),
    (0x11435, 0x11445), (0x114B0, 0x114C1), (0x115AF, 0x115BE), (0x115DC, 0x115DD),
    (0x11630, 0x11640), (0x116AB, 0x116B5), (0x1171D, 0x1172A), (0x1182C, 0x11838),
    (0x11930, 0x1193C), (0x11940, 0x11940), (0x11942, 0x11942), (0x119D1, 0x119DF),
    (0x119E4, 0x119E4), (0x11A01, 0x11A0A), (0x11A35, 0x11A39), (0x11A3B, 0x11A3E),
    (0x11A51, 0x11A5B), (0x11A8A, 0x11A97), (0x11C2F, 0x11C3E), (0x11C92, 0x11CB6),
    (0x11D31, 0x11D43), (0x11D47, 0x11D47), (0x11D8A, 0x11D96), (0x11EF3, 0x11EF6),
    (0x16F4F, 0x16F4F), (0x16F51, 0x16F92), (0x16FF0, 0x16FF1), (0x1BC9E, 0x1BC9E),
    (0x1E000, 0x1E02A), (0x1E947, 0x1E947), (0x1F130, 0x1F189),
];

/// The tokens F1 counts: the normalised answer split at its spaces (the scripts' `get_tokens`).
fn tokens(normalized: &str) -> Vec<&str> {
    normalized.split(' ').filter(|t| !t.is_empty()).collect()
}

/// 1.0 if the two answers are equal once normalised, else 0.0 (the scripts' `compute_exact`).
pub fn exact_match(prediction: &str, gold: &str) -> f64 {
    f64::from(u8::from(normalize(prediction) == normalize(gold)))
}

/// Token F1 of a prediction against one gold answer (the v2.0 script's `compute_f1`): the
/// harmonic mean of the shares of predicted and of gold tokens that the other side has, counting
/// a repeated token as often as both sides have it. If either side has no token, 1.0 when
/// neither has, else 0.0 (v1.1 gives 0.0 there too, except when both are empty).
pub fn f1(prediction: &str, gold: &str) -> f64 {
    let (p, g) = (normalize(prediction), normalize(gold));
    f1_of_tokens(&tokens(&p), &tokens(&g))
}

fn f1_of_tokens(pred: &[&str], gold: &[&str]) -> f64 {
    if pred.is_empty() || gold.is_empty() {
        return f64::from(u8::from(pred.is_empty() && gold.is_empty()));
    }
    let mut gold_counts: HashMap<&str, usize> = HashMap::new();
    for t in gold {
        *gold_counts.entry(t).or_default() += 1;
    }
    let mut same = 0usize;
    for t in pred {
        if let Some(n) = gold_counts.get_mut(t).filter(|n| **n > 0) {
            *n -= 1;
            same += 1;
        }
    }
    if same == 0 {
        return 0.0;
    }
    let precision = same as f64 / pred.len() as f64;
    let recall = same as f64 / gold.len() as f64;
    (2.0 * precision * recall) / (precision + recall)
}

/// (exact match, F1) of a prediction for one question: the best over its gold answers, as the
/// official v2.0 script takes it. Gold answers that normalise to "" are dropped; with none left
/// (an unanswerable SQuAD v2.0 question has no gold answer) the gold is "", so the score is
/// (1.0, 1.0) when the prediction normalises to "" and (0.0, 0.0) otherwise.
pub fn best<S: AsRef<str>>(prediction: &str, golds: &[S]) -> (f64, f64) {
    let pred = normalize(prediction);
    let pred_tokens = tokens(&pred);
    let golds: Vec<String> = golds
        .iter()
        .map(|g| normalize(g.as_ref()))
        .filter(|g| !g.is_empty())
        .collect();
    if golds.is_empty() {
        let none = f64::from(u8::from(pred.is_empty()));
        return (none, none);
    }
    let mut scores = (0.0f64, 0.0f64);
    for gold in &golds {
        scores.0 = scores.0.max(f64::from(u8::from(*gold == pred)));
        scores.1 = scores.1.max(f1_of_tokens(&pred_tokens, &tokens(gold)));
    }
    scores
}

/// Exact match and F1 of a group of questions, as percentages (0..=100) like the official
/// script prints them.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize)]
pub struct AnswerSplit {
    pub exact_match: f64,
    pub f1: f64,
    /// Questions in the group; 0 (and both scores 0.0) when it has none.
    pub count: usize,
}

/// SQuAD scores of an evaluation set: over all questions (the script's `exact`, `f1`, `total`)
/// and split into questions with gold answers (`HasAns_*`) and those without (`NoAns_*`, SQuAD
/// v2.0's unanswerable questions; empty on v1.1 data).
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize)]
pub struct AnswerScores {
    pub exact_match: f64,
    pub f1: f64,
    pub count: usize,
    pub has_answer: AnswerSplit,
    pub no_answer: AnswerSplit,
}

/// Scores `(prediction, gold answers)` pairs, one per question: [`best`] for each, averaged as
/// percentages. A question counts as answerable when its list of gold answers is not empty (as
/// in the script, even if every answer normalises to ""). No question at all gives zeros
/// (the script would divide by zero).
pub fn score<P: AsRef<str>, G: AsRef<str>>(pairs: &[(P, Vec<G>)]) -> AnswerScores {
    let (mut all, mut has, mut none) = (Sums::default(), Sums::default(), Sums::default());
    for (prediction, golds) in pairs {
        let (em, f1) = best(prediction.as_ref(), golds);
        all.add(em, f1);
        if golds.is_empty() {
            &mut none
        } else {
            &mut has
        }
        .add(em, f1);
    }
    let total = all.percentages();
    AnswerScores {
        exact_match: total.exact_match,
        f1: total.f1,
        count: total.count,
        has_answer: has.percentages(),
        no_answer: none.percentages(),
    }
}

/// Running sums of a group's scores, added in question order as the script's `sum` adds them
/// (so with the same rounding).
#[derive(Default)]
struct Sums {
    exact_match: f64,
    f1: f64,
    count: usize,
}

impl Sums {
    fn add(&mut self, exact_match: f64, f1: f64) {
        self.exact_match += exact_match;
        self.f1 += f1;
        self.count += 1;
    }

    /// The script's `100.0 * sum / total`; zeros for an empty group.
    fn percentages(&self) -> AnswerSplit {
        if self.count == 0 {
            return AnswerSplit::default();
        }
        let n = self.count as f64;
        AnswerSplit {
            exact_match: 100.0 * self.exact_match / n,
            f1: 100.0 * self.f1 / n,
            count: self.count,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::Value;

    const REFERENCE: &str = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../tests/fixtures/scores/reference.json"
    );

    fn reference() -> Value {
        let text = std::fs::read_to_string(REFERENCE).unwrap_or_else(|e| {
            panic!("{REFERENCE}: {e} (tests/fixtures/make_score_reference.py)")
        });
        serde_json::from_str(&text).unwrap()
    }

    fn close(a: f64, b: &Value, what: &str) {
        let b = b
            .as_f64()
            .unwrap_or_else(|| panic!("{what}: {b} is not a number"));
        assert!((a - b).abs() <= 1e-9, "{what}: {a} here, reference {b}");
    }

    fn strings(v: &Value) -> Vec<String> {
        serde_json::from_value(v.clone()).unwrap()
    }

    fn pairs(cases: &Value) -> Vec<(String, Vec<String>)> {
        cases
            .as_array()
            .unwrap()
            .iter()
            .map(|c| {
                (
                    c["prediction"].as_str().unwrap().to_string(),
                    strings(&c["golds"]),
                )
            })
            .collect()
    }

    #[test]
    fn matches_torchmetrics_squad() {
        let reference = reference();
        let squad = &reference["squad"];
        for case in squad["cases"].as_array().unwrap() {
            let id = case["id"].as_str().unwrap();
            let pred = case["prediction"].as_str().unwrap();
            let golds = strings(&case["golds"]);
            assert_eq!(
                normalize(pred),
                case["normalized_prediction"].as_str().unwrap(),
                "{id}"
            );
            let normalized: Vec<String> = golds.iter().map(|g| normalize(g)).collect();
            assert_eq!(normalized, strings(&case["normalized_golds"]), "{id}");
            let (em, f) = best(pred, &golds);
            close(em, &case["exact_match"], &format!("{id}: exact match"));
            close(f, &case["f1"], &format!("{id}: f1"));
            if golds.len() == 1 {
                assert_eq!(
                    (exact_match(pred, &golds[0]), f1(pred, &golds[0])),
                    (em, f),
                    "{id}"
                );
            }
        }
        let got = score(&pairs(&squad["cases"]));
        let want = &squad["total"];
        close(got.exact_match, &want["exact_match"], "total exact match");
        close(got.f1, &want["f1"], "total f1");
        assert_eq!(got.count as u64, want["count"].as_u64().unwrap());
        assert_eq!(
            got.has_answer,
            AnswerSplit {
                exact_match: got.exact_match,
                f1: got.f1,
                count: got.count
            }
        );
        assert_eq!(got.no_answer, AnswerSplit::default());
    }

    #[test]
    fn matches_official_v2_rule() {
        let reference = reference();
        let v2 = &reference["squad_v2"];
        assert_eq!(v2["source"], "official v2.0 rule");
        for case in v2["cases"].as_array().unwrap() {
            let id = case["id"].as_str().unwrap();
            let (em, f) = best(
                case["prediction"].as_str().unwrap(),
                &strings(&case["golds"]),
            );
            close(em, &case["exact_match"], &format!("{id}: exact match"));
            close(f, &case["f1"], &format!("{id}: f1"));
        }
        let got = score(&pairs(&v2["cases"]));
        let want = &v2["total"];
        close(got.exact_match, &want["exact_match"], "exact match");
        close(got.f1, &want["f1"], "f1");
        assert_eq!(got.count as u64, want["count"].as_u64().unwrap());
        for (name, g, w) in [
            ("has", got.has_answer, &want["has_answer"]),
            ("no", got.no_answer, &want["no_answer"]),
        ] {
            close(
                g.exact_match,
                &w["exact_match"],
                &format!("{name} answer: exact match"),
            );
            close(g.f1, &w["f1"], &format!("{name} answer: f1"));
            assert_eq!(
                g.count as u64,
                w["count"].as_u64().unwrap(),
                "{name} answer: count"
            );
        }
    }

    #[test]
    fn normalization() {
        assert_eq!(normalize("The Eiffel  Tower!"), "eiffel tower");
        assert_eq!(normalize("An apple, a pear; THE end."), "apple pear end");
        assert_eq!(normalize("another theater an"), "another theater");
        assert_eq!(normalize("state-of-the-art"), "stateoftheart");
        assert_eq!(normalize("a_b"), "ab");
        assert_eq!(normalize(""), "");
        assert_eq!(normalize(" the . a "), "");
        assert_eq!(normalize("x\u{1f}y\u{a0}z\u{3000}w"), "x y z w");
        // Zero-width space is not whitespace to Python either.
        assert_eq!(normalize("x\u{200b}y"), "x\u{200b}y");
        assert_eq!(normalize("ΟΔΟΣ"), "οδος");
        // Python's \w: a combining accent and a circled letter are not word characters, so the
        // article before them is a word of its own; precomposed é and a superscript two are.
        assert_eq!(normalize("the\u{301}"), "\u{301}");
        assert_eq!(normalize("the\u{24d0} a\u{93f}"), "\u{24d0} \u{93f}");
        assert_eq!(normalize("thé the² the一"), "thé the² the一");
    }

    #[test]
    fn python_word_characters() {
        for c in [
            'a', 'Z', '0', '_', 'é', 'ß', 'Ω', '一', 'タ', '²', '½', 'Ⅻ', '\u{915}',
        ] {
            assert!(is_word(c), "{c:?} is \\w in Python");
        }
        for c in [
            ' ',
            '-',
            '\u{301}',
            '\u{345}',
            '\u{93f}',
            '\u{24b6}',
            '\u{24d0}',
            '\u{1f130}',
            '€',
            '\u{200b}',
        ] {
            assert!(!is_word(c), "{c:?} is not \\w in Python");
        }
        // The table is sorted and its ranges disjoint, as the binary search needs.
        assert!(NOT_PYTHON_WORD.iter().all(|(lo, hi)| lo <= hi));
        assert!(NOT_PYTHON_WORD.windows(2).all(|w| w[0].1 < w[1].0));
    }

    #[test]
    fn token_f1_counts_multisets() {
        assert_eq!(f1("dog dog dog", "dog"), 0.5);
        assert_eq!(f1("the cat", "a cat"), 1.0);
        assert_eq!(f1("London", "Paris"), 0.0);
        // v2.0's rule: both empty agree (1.0), one empty does not (0.0).
        assert_eq!(f1("", ""), 1.0);
        assert_eq!(f1("the", "."), 1.0);
        assert_eq!(f1("", "Paris"), 0.0);
        assert_eq!(f1("Paris", ""), 0.0);
        assert_eq!(exact_match("The Paris.", "paris"), 1.0);
        assert_eq!(exact_match("Straße", "STRASSE"), 0.0);
    }

    #[test]
    fn best_over_golds_and_unanswerable() {
        assert_eq!(best("Paris", &["London", "paris!"]), (1.0, 1.0));
        // 1 of 2 tokens against "paris france" (F1 0.5) beats 1 of 2 against 1 of 3 (0.4).
        assert_eq!(
            best("in Paris", &["Paris, France", "the city of Paris"]),
            (0.0, 0.5)
        );
        let no: [&str; 0] = [];
        assert_eq!(best("", &no), (1.0, 1.0));
        assert_eq!(best("an", &no), (1.0, 1.0));
        assert_eq!(best("Paris", &no), (0.0, 0.0));
        // Golds normalising to "" are dropped (v2.0); only such golds means the gold is "".
        assert_eq!(best("a", &["the", "Paris"]), (0.0, 0.0));
        assert_eq!(best("a", &["The"]), (1.0, 1.0));
    }

    #[test]
    fn score_empty_and_split() {
        let none: [(String, Vec<String>); 0] = [];
        assert_eq!(score(&none), AnswerScores::default());
        let s = score(&[
            ("Paris", vec!["Paris"]),
            ("", vec![]),
            ("x", vec![]),
            ("y", vec!["z"]),
        ]);
        assert_eq!((s.exact_match, s.f1, s.count), (50.0, 50.0, 4));
        assert_eq!(
            s.has_answer,
            AnswerSplit {
                exact_match: 50.0,
                f1: 50.0,
                count: 2
            }
        );
        assert_eq!(
            s.no_answer,
            AnswerSplit {
                exact_match: 50.0,
                f1: 50.0,
                count: 2
            }
        );
    }
}
