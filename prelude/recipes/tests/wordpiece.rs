//! WordPiece tokenizer training: the vocabulary equals the one Hugging Face's Python trainer
//! learns from the same texts (as a set of tokens; see `assert_same_vocab`) (fixture: tests/fixtures/make_wordpiece_vocab.py), and a trained
//! tokenizer saves and loads as a model directory's tokenizer.

use std::path::PathBuf;

use trainbook_recipes::assets;
use trainbook_recipes::text::tokenizer::TextTokenizer;
use trainbook_recipes::text::wordpiece::{self, WordPieceSettings};

fn fixture(name: &str) -> Vec<String> {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../tests/fixtures/wordpiece")
        .join(name);
    std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
        .lines()
        .map(str::to_string)
        .collect()
}

fn snippets() -> Vec<String> {
    let csv = assets::rotten_tomatoes_csv();
    assert!(csv.exists(), "{} missing: run `make setup`", csv.display());
    wordpiece::read_texts(&csv, None).unwrap()
}

/// The same tokens, and the special tokens at BERT's ids. Ids beyond those are not compared:
/// Hugging Face's trainer orders the `##` alphabet and merges of equal count by hash-map
/// iteration, so two runs of the Python trainer on the same texts give the same vocabulary
/// under different ids (checked when the fixture was made: 98 of 2,000 ids differed).
fn assert_same_vocab(ours: &[String], theirs: &[String]) {
    assert_eq!(ours.len(), theirs.len());
    assert_eq!(ours[..5], theirs[..5]);
    let a: std::collections::BTreeSet<&String> = ours.iter().collect();
    let b: std::collections::BTreeSet<&String> = theirs.iter().collect();
    let only_ours: Vec<_> = a.difference(&b).take(10).collect();
    let only_theirs: Vec<_> = b.difference(&a).take(10).collect();
    assert!(
        only_ours.is_empty() && only_theirs.is_empty(),
        "only in ours: {only_ours:?}; only in Python's: {only_theirs:?}"
    );
}

#[test]
fn the_vocabulary_equals_the_python_trainers_uncased_and_cased() {
    let texts = snippets();
    assert_eq!(texts.len(), 12_808);
    for (name, settings) in [
        (
            "vocab-2000.txt",
            WordPieceSettings {
                vocab_size: 2000,
                min_frequency: 2,
                lowercase: true,
                ..WordPieceSettings::default()
            },
        ),
        (
            "vocab-2000-cased-min5.txt",
            WordPieceSettings {
                vocab_size: 2000,
                min_frequency: 5,
                lowercase: false,
                ..WordPieceSettings::default()
            },
        ),
    ] {
        let tok = wordpiece::train(texts.iter(), &settings).unwrap();
        assert_same_vocab(&wordpiece::vocab_in_order(&tok), &fixture(name));
    }
}

#[test]
fn a_trained_tokenizer_saves_and_loads_as_a_models_tokenizer() {
    let texts = snippets();
    let settings = WordPieceSettings {
        vocab_size: 500,
        ..WordPieceSettings::default()
    };
    let tok = wordpiece::train(texts.iter().take(2000), &settings).unwrap();
    let dir = std::env::temp_dir().join(format!("tb-wordpiece-{}", std::process::id()));
    let (json, vocab) = wordpiece::save(&tok, &dir).unwrap();
    assert!(json.exists() && vocab.exists());
    let lines = std::fs::read_to_string(&vocab).unwrap();
    assert_eq!(
        lines.lines().take(5).collect::<Vec<_>>(),
        ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    );
    assert_eq!(lines.lines().count(), 500);
    // No temporary file is left behind.
    let names: Vec<String> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert_eq!(names.len(), 2, "{names:?}");

    // Loaded from tokenizer.json and from vocab.txt alone, it encodes alike: [CLS] ... [SEP].
    let from_json = TextTokenizer::from_dir(&dir, 32, true).unwrap();
    std::fs::remove_file(&json).unwrap();
    let from_vocab = TextTokenizer::from_dir(&dir, 32, true).unwrap();
    let text = ["A three-hour cinema master class."];
    let a = from_json.encode_batch(&text).unwrap();
    assert_eq!(a, from_vocab.encode_batch(&text).unwrap());
    assert_eq!(a[0].ids.first(), Some(&2));
    assert_eq!(a[0].ids.last(), Some(&3));
    assert!(a[0].ids.len() > 6, "{:?}", a[0].ids);
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn bad_settings_and_sources_are_clear_errors() {
    let tiny = WordPieceSettings {
        vocab_size: 3,
        ..WordPieceSettings::default()
    };
    let err = wordpiece::train(["a b c"].iter(), &tiny)
        .unwrap_err()
        .to_string();
    assert!(err.contains("vocab_size 3 is too small"), "{err}");
    let err = wordpiece::read_texts(&assets::rotten_tomatoes_csv(), Some("review"))
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("no column 'review'") && err.contains("text, label, movie"),
        "{err}"
    );
    let err = wordpiece::read_texts(std::path::Path::new("/nonexistent/corpus.txt"), None)
        .unwrap_err()
        .to_string();
    assert!(err.contains("does not exist"), "{err}");
}
