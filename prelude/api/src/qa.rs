//! Extractive question answering (the `question-answering` recipe) as notebooks drive it:
//! [`QaTrainer`] with its options; `QuestionAnswerer` (in `classify`, beside the other
//! checkpoint handles) answers questions with a trained checkpoint in a cell.

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
