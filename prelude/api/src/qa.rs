//! Extractive question answering (the `question-answering` recipe) as notebooks drive it:
//! [`QaTrainer`] with its options, and [`QuestionAnswerer`] to answer questions with a trained
//! checkpoint in a cell.

use std::path::Path;

use anyhow::Result;

use crate::runtime::port;
use crate::spec::Configure;
use crate::text::{ConfigureText, TextOptions};

crate::options! {
    /// Options of the question-answering recipe.
    struct QaOptions => QaSettings, trait ConfigureQa(qa_options) {
        /// Tokens by which the windows of a context longer than max_length overlap
        /// (Transformers' run_qa.py: 128 at max_length 384).
        #[arg(value_name = "N")]
        doc_stride: usize => usize,
        /// The longest answer considered, in tokens (30).
        #[arg(value_name = "N")]
        max_answer_length: usize => usize,
        /// SQuAD v2 data (unanswerable questions): a question is left unanswered when its
        /// no-answer score beats the best span's by more than this (0).
        #[arg(value_name = "X")]
        null_threshold: f64 => f64,
    }
}

trainer!(
    /// Every option of the question-answering recipe:
    /// `QaTrainer::new().model("./roberta-base").data("train-v2.0.json").doc_stride(128).fit()?`,
    /// then `QuestionAnswerer::load(result.last_checkpoint)?.answer(question, context)?`. Data:
    /// SQuAD v1.1/v2.0 JSON, or jsonl of `{"question", "context", "answers": {"text",
    /// "answer_start"}}`; a file or a directory with `train.*` and `dev.*`.
    QaTrainer,
    "question-answering"
);

/// `max_length`, `eval_fraction`, `eval_data`, `from_scratch`.
impl ConfigureText for QaTrainer {
    fn text_options(&mut self, edit: impl FnOnce(&mut TextOptions)) {
        self.spec.edit_recipe_options(edit)
    }
}

/// `doc_stride`, `max_answer_length`, `null_threshold`.
impl ConfigureQa for QaTrainer {
    fn qa_options(&mut self, edit: impl FnOnce(&mut QaOptions)) {
        self.spec.edit_recipe_options(edit)
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
            port::<dyn crate::classify::Classifiers>()?.load_answerer(dir.as_ref())?,
        ))
    }

    pub fn checkpoint(&self) -> &Path {
        self.0.checkpoint()
    }

    pub fn answer(&self, question: &str, context: &str) -> Result<Answer> {
        self.0.answer(question, context)
    }
}
