//! `trainbook generate`: text from a causal LM, an adapter over it, or a LoRA checkpoint,
//! streamed to stdout.

use std::io::Write;
use std::path::PathBuf;

use anyhow::{bail, Result};
use clap::Args;

use crate::recipes::causal_lm::inference::{self, Prompt};
use crate::recipes::models::generate::Sampling;
use crate::recipes::text::chat::Message;

#[derive(Args, Debug)]
#[command(
    after_help = "Examples:\n  trainbook generate --model ./llama --prompt \"The capital of France is\" --max-new-tokens 20\n  trainbook generate --model ./llama --adapter trainbook_runs/<run>/checkpoints/epoch-0 --prompt \"Review: great fun. Sentiment:\" --greedy\n  trainbook generate --model ./llama-instruct --chat --prompt \"Name three primes.\" --temperature 0.7 --top-p 0.9 --seed 1\n\nThe completion streams to stdout as it is generated; generation stops at the model's\nend-of-sequence token(s) (generation_config.json) or after --max-new-tokens."
)]
pub struct GenerateArgs {
    /// A Hugging Face model directory (gpt2, llama, mistral, qwen2), a causal-lm checkpoint,
    /// or a LoRA adapter directory (its base is read from adapter_config.json).
    #[arg(long, value_name = "DIR")]
    pub model: PathBuf,
    /// A LoRA adapter directory (PEFT's format, or a causal-lm LoRA checkpoint) over --model.
    #[arg(long, value_name = "DIR")]
    pub adapter: Option<PathBuf>,
    /// The text to continue (with --chat: the user's message).
    #[arg(long)]
    pub prompt: String,
    /// A system message before the prompt (with --chat).
    #[arg(long, value_name = "TEXT")]
    pub system: Option<String>,
    /// Render the prompt as a user turn with the tokenizer's chat template.
    #[arg(long)]
    pub chat: bool,
    #[arg(long, default_value_t = 64, value_name = "N")]
    pub max_new_tokens: usize,
    /// The most likely token every time (the default unless --temperature, --top-p or
    /// --top-k is given).
    #[arg(long, conflicts_with_all = ["temperature", "top_p", "top_k"])]
    pub greedy: bool,
    /// Sampling temperature (higher: more varied).
    #[arg(long, value_name = "T")]
    pub temperature: Option<f64>,
    /// Sample from the most likely tokens that together have probability P.
    #[arg(long, value_name = "P")]
    pub top_p: Option<f64>,
    /// Sample from the K most likely tokens.
    #[arg(long, value_name = "K")]
    pub top_k: Option<i64>,
    /// Seed of the sampling.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// cpu, or cuda / cuda:N.
    #[arg(long, default_value = "cpu")]
    pub device: String,
    /// Print the generated token ids as JSON as the last line.
    #[arg(long)]
    pub json: bool,
}

impl GenerateArgs {
    fn sampling(&self) -> Sampling {
        let sampled = self.temperature.is_some() || self.top_p.is_some() || self.top_k.is_some();
        Sampling {
            greedy: self.greedy || !sampled,
            temperature: self.temperature.unwrap_or(1.0),
            top_k: self.top_k.unwrap_or(0),
            top_p: self.top_p.unwrap_or(1.0),
            seed: self.seed,
        }
    }

    fn prompt(&self) -> Result<Prompt> {
        if !self.chat {
            if self.system.is_some() {
                bail!("--system applies to --chat prompts");
            }
            return Ok(Prompt::Text(self.prompt.clone()));
        }
        let mut messages = Vec::new();
        if let Some(s) = &self.system {
            messages.push(Message {
                role: "system".into(),
                content: s.clone(),
            });
        }
        messages.push(Message {
            role: "user".into(),
            content: self.prompt.clone(),
        });
        Ok(Prompt::Chat(messages))
    }
}

/// `trainbook generate`: the completion on stdout as it comes.
pub fn run(args: &GenerateArgs) -> Result<i32> {
    let sampling = args.sampling();
    sampling.check()?;
    let prompt = args.prompt()?;
    let lm = inference::load(
        &args.model,
        args.adapter.as_deref(),
        crate::lm::device(&args.device)?,
    )?;
    let ids = lm.encode(&prompt)?;
    let mut out = std::io::stdout().lock();
    let new = lm.generate(&ids, args.max_new_tokens, &sampling, &mut |text| {
        out.write_all(text.as_bytes())?;
        out.flush()?;
        Ok(())
    })?;
    writeln!(out)?;
    if args.json {
        writeln!(
            out,
            "{}",
            serde_json::json!({"prompt_ids": ids, "new_ids": new})
        )?;
    }
    Ok(0)
}
