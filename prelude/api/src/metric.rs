//! The names of trainbook's built-in metrics, defined once: the workers report them, the
//! driver, dllogger and results read them, the dashboard and the result view show them. A
//! misspelt name is a compile error here, where a string would be a silently empty column.
//! A recipe's or task's own metrics stay plain strings; their per-epoch means are reported as
//! `epoch_train_<name>` and `eval_<name>` ([`epoch_train`], [`eval`]).

/// Training loss of one optimizer step (mean over its samples), per rank.
pub const LOSS: &str = "loss";
/// `exp(loss)` of one step, for language models.
pub const PERPLEXITY: &str = "perplexity";
/// Learning rate of one step (rank 0; reported when it changes over the run).
pub const LR: &str = "lr";
/// The final training loss of a run (in [`crate::TrainResult::metrics`] and checkpoints).
pub const TRAIN_LOSS: &str = "train_loss";
/// Mean training loss over an epoch, all ranks.
pub const EPOCH_TRAIN_LOSS: &str = "epoch_train_loss";
/// Training accuracy over an epoch, all ranks.
pub const EPOCH_TRAIN_ACCURACY: &str = "epoch_train_accuracy";
/// `exp(epoch_train_loss)`.
pub const EPOCH_TRAIN_PERPLEXITY: &str = "epoch_train_perplexity";
/// Evaluation loss of an epoch, all ranks.
pub const EVAL_LOSS: &str = "eval_loss";
/// Evaluation accuracy of an epoch (exact, from all-reduced confusion counts).
pub const EVAL_ACCURACY: &str = "eval_accuracy";
/// Evaluation F1 of a binary classifier.
pub const EVAL_F1: &str = "eval_f1";
/// Evaluation macro-F1 of a classifier of more than two classes.
pub const EVAL_F1_MACRO: &str = "eval_f1_macro";
/// `exp(eval_loss)`.
pub const EVAL_PERPLEXITY: &str = "eval_perplexity";
/// Training samples per second, all ranks, over the whole run so far.
pub const SAMPLES_PER_SECOND: &str = "samples_per_second";
/// Training samples per second without the first steps (warm-up), as BERT pre-training
/// scripts report it.
pub const TRAIN_SAMPLES_PER_SECOND: &str = "train_samples_per_second";
/// Seconds of one all-reduce in the collective benchmark.
pub const ALLREDUCE_SECONDS: &str = "allreduce_seconds";

/// The prefix of an epoch's training means.
pub const EPOCH_TRAIN_PREFIX: &str = "epoch_train_";
/// The prefix of an epoch's evaluation values.
pub const EVAL_PREFIX: &str = "eval_";

/// `epoch_train_<name>`: the epoch's training mean of a step metric.
pub fn epoch_train(name: &str) -> String {
    format!("{EPOCH_TRAIN_PREFIX}{name}")
}

/// `eval_<name>`: the epoch's evaluation value of a metric.
pub fn eval(name: &str) -> String {
    format!("{EVAL_PREFIX}{name}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn derived_names_are_the_built_in_ones() {
        assert_eq!(epoch_train("loss"), EPOCH_TRAIN_LOSS);
        assert_eq!(epoch_train("accuracy"), EPOCH_TRAIN_ACCURACY);
        assert_eq!(eval(LOSS), EVAL_LOSS);
        assert_eq!(eval("f1_macro"), EVAL_F1_MACRO);
        assert_eq!(eval(PERPLEXITY), EVAL_PERPLEXITY);
        assert_eq!(epoch_train(PERPLEXITY), EPOCH_TRAIN_PERPLEXITY);
    }
}
