//! `trainbook export`: a checkpoint as the directories `transformers` and `peft` load.

use std::path::PathBuf;

use anyhow::Result;
use clap::Args;

use crate::recipes::causal_lm::inference;

#[derive(Args, Debug)]
#[command(
    after_help = "Examples:\n  trainbook export --checkpoint trainbook_runs/<run>/checkpoints/epoch-0 --out my-model\n  trainbook export --checkpoint <a LoRA run's checkpoint> --out my-adapter\n  trainbook export --checkpoint <a LoRA run's checkpoint> --out my-merged-model --merge\n\nA full fine-tune is written as a transformers directory (AutoModelForCausalLM.from_pretrained);\na LoRA checkpoint as a PEFT adapter directory (PeftModel.from_pretrained(base, DIR)), or with\n--merge as the base with the adapter folded in. An encoder checkpoint (bert, bert-mlm,\ntoken-classification, question-answering) is written as its family's transformers directory\n(AutoModelForSequenceClassification, ...ForTokenClassification, ...ForQuestionAnswering,\n...ForMaskedLM). The directory is replaced only once complete."
)]
pub struct ExportArgs {
    /// A checkpoint of causal-lm or of an encoder recipe (or any model or adapter directory
    /// trainbook reads).
    #[arg(long, value_name = "DIR")]
    pub checkpoint: PathBuf,
    /// Where to write it (replaced if it exists).
    #[arg(long, value_name = "DIR")]
    pub out: PathBuf,
    /// Fold a LoRA adapter into the base weights and write a full model.
    #[arg(long)]
    pub merge: bool,
}

/// `trainbook export`.
pub fn run(args: &ExportArgs) -> Result<i32> {
    let config = args.checkpoint.join("config.json");
    let encoder = trainbook_recipes::models::encoder::EncoderConfig::from_file(&config).is_ok();
    let what = if encoder {
        trainbook_recipes::checkpoint::export_encoder(&args.checkpoint, &args.out)?
    } else {
        inference::export(&args.checkpoint, &args.out, args.merge)?
    };
    eprintln!("trainbook: wrote {what}");
    Ok(0)
}
