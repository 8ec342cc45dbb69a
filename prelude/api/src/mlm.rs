//! BERT pre-training by masked-language modelling (the `bert-mlm` recipe): texts grouped into
//! blocks of `max_length` tokens, 15% of the tokens masked, a `BertForMaskedLM` trained to
//! restore them, from scratch or continued from a checkpoint. [`BertMlmTrainer`] holds every
//! option; the text options ([`crate::ConfigureText`]: `max_length` as the block size,
//! `text_column`, `eval_fraction`, `eval_data`) and [`ConfigureMlm`]'s own.

use std::path::PathBuf;

use crate::spec::Configure;

crate::options! {
    /// Options of the masked-LM recipe (bert-mlm).
    struct MlmOptions => MlmSettings, trait ConfigureMlm(mlm_options) {
        /// Chance that a token is selected for prediction (BERT: 0.15); of those 80% become
        /// `[MASK]`, 10% a random token, 10% stay.
        mlm_probability: f64 => f64,
        /// A tokenizer directory (tokenizer.json or vocab.txt, e.g. from `trainbook tokenizer
        /// train`); default: the model's, else the offline uncased BERT vocabulary.
        #[arg(value_name = "DIR")]
        tokenizer: PathBuf [into] => Option<PathBuf>,
        /// At most this many positions predicted per block (BERT pre-training: 20 at 128
        /// tokens); the rest of the selected ones stay unmasked. Default: no limit.
        #[arg(value_name = "N")]
        max_predictions_per_seq: usize => Option<usize>,
        /// From scratch: transformer layers.
        #[arg(value_name = "N")]
        layers: usize => usize,
        /// From scratch: hidden size (the feed-forward layer is 4x).
        #[arg(value_name = "N")]
        hidden_size: usize => usize,
        /// From scratch: attention heads (must divide the hidden size).
        #[arg(value_name = "N")]
        heads: usize => usize,
        /// Also train BERT's next-sentence head on the data's next_sentence_labels (002's
        /// HDF5 shards), as BertForPreTraining does. Default: on when the data has them and
        /// the model is a BERT; false trains the masked-LM loss alone.
        #[arg(value_name = "BOOL")]
        next_sentence: bool => Option<bool>,
    }
}

trainer!(
    /// Every option of the masked-LM recipe:
    /// `BertMlmTrainer::new().workers(2).tokenizer("my-tokenizer").max_length(128).fit()?`.
    /// Without a `model` the BERT is built from scratch (`layers`, `hidden_size`, `heads`, the
    /// tokenizer's vocabulary); with one, training continues from its weights.
    BertMlmTrainer,
    "bert-mlm"
);

/// `max_length` (the block size), `text_column`, `eval_fraction`, `eval_data`.
impl crate::text::ConfigureText for BertMlmTrainer {
    fn text_options(&mut self, edit: impl FnOnce(&mut crate::text::TextOptions)) {
        self.spec.edit_recipe_options(edit)
    }
}

/// `mlm_probability`, `max_predictions_per_seq`, `tokenizer`, `layers`, `hidden_size`, `heads`.
impl ConfigureMlm for BertMlmTrainer {
    fn mlm_options(&mut self, edit: impl FnOnce(&mut MlmOptions)) {
        self.spec.edit_recipe_options(edit)
    }
}
