//! Text classification (the `bert` recipe) as notebooks drive it: [`train_bert`] with the
//! reference's defaults, [`BertTrainer`] for everything else, and the recipe's own options.

use std::path::PathBuf;

use anyhow::{bail, Result};

use crate::job::TrainResult;
use crate::run::Train;
use crate::runtime::port;
use crate::spec::{Configure, Hyper};
use crate::table::Table;

/// How a batch is padded.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum Padding {
    /// Every sequence to `max_length` (Transformers' `padding="max_length"`, the reference's).
    #[default]
    MaxLength,
    /// To the longest sequence of each batch (less work for short texts).
    Dynamic,
}

impl TextSettings {
    /// A held-out fraction, when set, is strictly between 0 and 1.
    pub fn check_eval_fraction(&self) -> Result<()> {
        if let Some(f) = self.eval_fraction {
            if !(f > 0.0 && f < 1.0) {
                bail!("eval_fraction {f} must be between 0 and 1 (e.g. 0.2 holds out 20%)");
            }
        }
        Ok(())
    }
}

impl std::str::FromStr for Padding {
    type Err = anyhow::Error;
    fn from_str(s: &str) -> Result<Self> {
        match s.to_ascii_lowercase().replace('-', "_").as_str() {
            "max_length" | "max" => Ok(Self::MaxLength),
            "dynamic" | "longest" => Ok(Self::Dynamic),
            o => bail!("unknown padding '{o}': use max-length or dynamic"),
        }
    }
}

impl std::fmt::Display for Padding {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Self::MaxLength => "max-length",
            Self::Dynamic => "dynamic",
        })
    }
}

crate::options! {
    /// Options of the text-classification recipe (bert).
    struct TextOptions => TextSettings, trait ConfigureText(text_options) {
        /// Tokens per text after truncation (at most the model's position embeddings).
        #[arg(value_name = "N")]
        max_length: usize => usize,
        /// max-length (pad every text, the reference's) or dynamic (pad each batch to its
        /// longest text: same results, less work for short texts).
        #[arg(value_name = "max-length|dynamic")]
        padding: Padding => Padding,
        /// Name of the text column.
        #[arg(value_name = "COLUMN")]
        text_column: String [into] => String,
        /// A second text column: each example is then a sentence pair, `[CLS] a [SEP] b [SEP]`
        /// with segment ids 0 and 1, as Transformers encodes pairs (MRPC-style tasks).
        #[arg(value_name = "COLUMN")]
        text_pair_column: String [into] => Option<String>,
        /// Name of the label column (strings or integers).
        #[arg(value_name = "COLUMN")]
        label_column: String [into] => String,
        /// Fraction held out for evaluation (used when the data has no test table, or when
        /// set; 0.2 otherwise).
        eval_fraction: f64 => Option<f64>,
        /// A separate evaluation table (otherwise the data's test table or a held-out split).
        #[arg(value_name = "TABLE")]
        eval_data: PathBuf [into] => Option<PathBuf>,
        /// Train the model's architecture (its config.json) from random weights instead of
        /// its trained ones: the control run of a fine-tuning comparison.
        #[arg(num_args = 0..=1, default_missing_value = "true", value_name = "BOOL")]
        from_scratch: bool => bool,
    }
    extra {
        /// The model's architecture with random weights (the tiny preset, when no model is
        /// given).
        random_init: bool,
    }
}

/// Trains BERT sequence classification with `num_workers` data-parallel workers and the
/// defaults of the reference notebook (see `trainbook train bert --help` and
/// the `bert` recipe's presets): the reference's model and data when they are on this machine,
/// else the offline all-MiniLM-L6-v2 on Rotten Tomatoes.
pub fn train_bert(num_workers: usize) -> Result<TrainResult> {
    BertTrainer::new().workers(num_workers).fit()
}

trainer!(
    /// Every option of the BERT recipe:
    /// `BertTrainer::new().workers(2).epochs(1).max_length(64).optimizer(OptimizerKind::Adamw).fit()?`
    /// The shared options (workers, epochs, lr, model, data, ...) come from [`Configure`] and
    /// [`crate::spec::ConfigureTraining`], the text options from [`ConfigureText`].
    BertTrainer,
    "bert"
);

trainer!(
    /// Every option of the token-classification recipe (a tag per word: named entities,
    /// part-of-speech): `TaggerTrainer::new().model("./roberta-base").data("ner.conll").fit()?`,
    /// then `TokenTagger::load(result.last_checkpoint)?.predict("...")?`. Data: CoNLL
    /// (`token TAB tag`, blank lines between sentences) or jsonl `{"tokens", "tags"}`, a file
    /// or a directory with `train.*` and `test.*`.
    TaggerTrainer,
    "token-classification"
);

/// `max_length`, `eval_fraction`, `eval_data`, `from_scratch` (the columns and padding are
/// not used: sentences are padded per batch).
impl ConfigureText for TaggerTrainer {
    fn text_options(&mut self, edit: impl FnOnce(&mut TextOptions)) {
        self.spec.edit_recipe_options(edit)
    }
}

/// The engine's side of text jobs' data. The `trainbook` crate implements it (see
/// `crate::runtime`).
pub trait TextData: Send + Sync {
    /// The file of the table a text job trains on, as its resolved options choose it.
    fn text_training_file(&self, hyper: &Hyper) -> Result<PathBuf>;
    /// Reads a data table (.parquet, .csv, .tsv, .jsonl).
    fn read_table(&self, path: &std::path::Path) -> Result<Table>;
}

impl BertTrainer {
    /// The file of the table this job will train on, as its preset and `data` option choose it
    /// (nothing is started).
    pub fn training_file(&self) -> Result<PathBuf> {
        port::<dyn TextData>()?.text_training_file(&self.plan()?.hyper)
    }
    /// The table this job will train on, all its rows (the BERT notebook previews it).
    pub fn training_table(&self) -> Result<Table> {
        port::<dyn TextData>()?.read_table(&self.training_file()?)
    }
}

/// `max_length`, `padding`, `text_column`, `label_column`, `eval_fraction`, `eval_data`.
impl ConfigureText for BertTrainer {
    fn text_options(&mut self, edit: impl FnOnce(&mut TextOptions)) {
        self.spec.edit_recipe_options(edit)
    }
}
