//! Inference with a trained checkpoint, in the calling process (the notebook kernel or a
//! program): `TextClassifier::load(dir)?.predict(&["the food was great"])`,
//! `ImageClassifier::load(dir)?.predict(&["ant.jpg"])`. The models themselves (libtorch) are
//! the recipes'; these handles hold them.

use std::path::Path;

use anyhow::{bail, Result};

use crate::runtime::port;

/// One prediction: the most likely label and every label's probability.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct Prediction {
    pub label: String,
    pub label_id: usize,
    /// Probability of `label`.
    pub score: f64,
    /// `(label, probability)` for every label, in id order.
    pub probabilities: Vec<(String, f64)>,
}

impl Prediction {
    /// The prediction for one row of class probabilities (`labels[i]` has `probs[i]`).
    pub fn from_probabilities(labels: &[String], probs: Vec<f64>) -> Result<Prediction> {
        if labels.len() != probs.len() || labels.is_empty() {
            bail!(
                "the model gave {} probabilities for {} labels: its checkpoint's label list does \
                 not match its head",
                probs.len(),
                labels.len()
            );
        }
        let (best, score) = probs
            .iter()
            .copied()
            .enumerate()
            .fold((0, f64::MIN), |a, (i, v)| if v > a.1 { (i, v) } else { a });
        Ok(Prediction {
            label: labels[best].clone(),
            label_id: best,
            score,
            probabilities: labels.iter().cloned().zip(probs).collect(),
        })
    }
}

impl std::fmt::Display for Prediction {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} ({:.3})", self.label, self.score)
    }
}

/// A loaded text classifier (the recipes implement it).
pub trait TextModel {
    /// Label names in id order.
    fn labels(&self) -> &[String];
    /// The checkpoint directory it was loaded from.
    fn checkpoint(&self) -> &Path;
    fn predict(&self, texts: &[&str]) -> Result<Vec<Prediction>>;
    /// Sentence pairs, for a model trained on pairs (`text_pair_column`).
    fn predict_pairs(&self, pairs: &[(&str, &str)]) -> Result<Vec<Prediction>>;
}

/// One tagged span of a text: an entity (a B-/I- run of words) or, for a tag set without
/// entities (part-of-speech), one word.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct TaggedSpan {
    /// The entity type (`PER` for `B-PER`/`I-PER`) or the word's tag.
    pub kind: String,
    pub text: String,
    /// Character offsets (Unicode scalar values, as Python counts them): `text` is the
    /// input's characters `start..end`.
    pub start: usize,
    pub end: usize,
    /// The model's probability of the first word's tag.
    pub score: f64,
}

impl std::fmt::Display for TaggedSpan {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} {:?} [{}..{}] ({:.3})",
            self.kind, self.text, self.start, self.end, self.score
        )
    }
}

/// A loaded token classifier (the recipes implement it).
pub trait TagModel {
    /// Tag names in id order.
    fn tags(&self) -> &[String];
    fn checkpoint(&self) -> &Path;
    fn predict(&self, text: &str) -> Result<Vec<TaggedSpan>>;
}

/// A token classifier (`trainbook train token-classification`) loaded from a checkpoint or an
/// exported directory, on the CPU: `TokenTagger::load(dir)?.predict("Ada lives in London")?`.
pub struct TokenTagger(Box<dyn TagModel>);

impl TokenTagger {
    pub fn load(dir: impl AsRef<Path>) -> Result<Self> {
        Ok(TokenTagger(
            port::<dyn Classifiers>()?.load_tagger(dir.as_ref())?,
        ))
    }

    /// Tag names in id order.
    pub fn tags(&self) -> &[String] {
        self.0.tags()
    }

    pub fn checkpoint(&self) -> &Path {
        self.0.checkpoint()
    }

    /// The entities of `text` with their character spans (for a tag set without entities,
    /// every word with its tag).
    pub fn predict(&self, text: &str) -> Result<Vec<TaggedSpan>> {
        self.0.predict(text)
    }
}

/// The engine's side of classifiers: loading a checkpoint's model. The `trainbook` crate
/// implements it (see `crate::runtime`).
pub trait Classifiers: Send + Sync {
    /// Loads a text classifier checkpoint on the CPU.
    fn load_text_model(&self, dir: &Path) -> Result<Box<dyn TextModel>>;
    /// Loads an image classifier checkpoint on the CPU.
    fn load_image_model(&self, dir: &Path) -> Result<Box<dyn ImageModel>>;
    /// Loads a token classifier checkpoint on the CPU.
    fn load_tagger(&self, dir: &Path) -> Result<Box<dyn TagModel>>;
    /// Loads a question-answering checkpoint on the CPU.
    fn load_answerer(&self, dir: &Path) -> Result<Box<dyn AnswerModel>>;
}

/// A loaded image classifier (the recipes implement it).
pub trait ImageModel {
    /// Class names in id order.
    fn classes(&self) -> &[String];
    fn predict(&self, paths: &[&Path]) -> Result<Vec<Prediction>>;
}

/// A BERT sequence classifier loaded from a Hugging Face-style directory (what trainbook's
/// BERT checkpoints are), on the CPU.
pub struct TextClassifier(Box<dyn TextModel>);

impl TextClassifier {
    /// Loads `dir` (e.g. `result.last_checkpoint`) on the CPU.
    pub fn load(dir: impl AsRef<Path>) -> Result<Self> {
        Ok(TextClassifier(
            port::<dyn Classifiers>()?.load_text_model(dir.as_ref())?,
        ))
    }

    /// Label names in id order.
    pub fn labels(&self) -> &[String] {
        self.0.labels()
    }

    pub fn checkpoint(&self) -> &Path {
        self.0.checkpoint()
    }

    pub fn predict(&self, texts: &[&str]) -> Result<Vec<Prediction>> {
        self.0.predict(texts)
    }

    /// Convenience for one text.
    pub fn predict_one(&self, text: &str) -> Result<Prediction> {
        Ok(self.predict(&[text])?.remove(0))
    }

    /// For a model trained on sentence pairs (`text_pair_column`): each pair encoded as in
    /// training, `[CLS] a [SEP] b [SEP]` with two segments.
    /// `clf.predict_pairs(&[("The cat sat.", "A cat was sitting.")])?`
    pub fn predict_pairs(&self, pairs: &[(&str, &str)]) -> Result<Vec<Prediction>> {
        self.0.predict_pairs(pairs)
    }
}

/// An image classifier loaded from a trainbook ResNet checkpoint (`model.safetensors` +
/// `config.json` with the architecture, input size and class names), on the CPU.
pub struct ImageClassifier(Box<dyn ImageModel>);

impl ImageClassifier {
    pub fn load(dir: impl AsRef<Path>) -> Result<Self> {
        Ok(ImageClassifier(
            port::<dyn Classifiers>()?.load_image_model(dir.as_ref())?,
        ))
    }

    pub fn classes(&self) -> &[String] {
        self.0.classes()
    }

    /// Classifies image files (any format the `image` crate reads), with the evaluation
    /// transform the model was validated with.
    pub fn predict<P: AsRef<Path>>(&self, paths: &[P]) -> Result<Vec<Prediction>> {
        let paths: Vec<&Path> = paths.iter().map(|p| p.as_ref()).collect();
        self.0.predict(&paths)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_prediction_is_the_most_likely_label() {
        let labels = ["neg".to_string(), "pos".to_string()];
        let p = Prediction::from_probabilities(&labels, vec![0.25, 0.75]).unwrap();
        assert_eq!((p.label.as_str(), p.label_id, p.score), ("pos", 1, 0.75));
        assert_eq!(p.to_string(), "pos (0.750)");
        let e = Prediction::from_probabilities(&labels, vec![1.0]).unwrap_err();
        assert!(
            e.to_string().contains("1 probabilities for 2 labels"),
            "{e}"
        );
    }
}

/// An answer found in a context.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct Answer {
    /// The answer's text; empty when the question is left unanswered (SQuAD v2).
    pub text: String,
    /// Character offsets in the context (Unicode scalar values, as Python counts them).
    pub start: usize,
    pub end: usize,
    /// The span's start logit plus end logit.
    pub score: f64,
    /// The no-answer score (the first token's start plus end logit).
    pub null_score: f64,
}

impl std::fmt::Display for Answer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.text.is_empty() {
            write!(f, "(no answer; null score {:.2})", self.null_score)
        } else {
            write!(
                f,
                "{:?} [{}..{}] (score {:.2})",
                self.text, self.start, self.end, self.score
            )
        }
    }
}

/// A loaded question-answering model (the recipes implement it).
pub trait AnswerModel {
    fn checkpoint(&self) -> &Path;
    fn answer(&self, question: &str, context: &str) -> Result<Answer>;
}

/// A question-answering model loaded from a checkpoint or an exported directory, on the CPU:
/// `QuestionAnswerer::load(dir)?.answer("Where was Ada born?", context)?`. Long contexts are
/// read in overlapping windows, as in training.
pub struct QuestionAnswerer(Box<dyn AnswerModel>);

impl QuestionAnswerer {
    pub fn load(dir: impl AsRef<Path>) -> Result<Self> {
        Ok(QuestionAnswerer(
            port::<dyn Classifiers>()?.load_answerer(dir.as_ref())?,
        ))
    }

    pub fn checkpoint(&self) -> &Path {
        self.0.checkpoint()
    }

    pub fn answer(&self, question: &str, context: &str) -> Result<Answer> {
        self.0.answer(question, context)
    }
}
