//! The causal-LM commands: `trainbook generate` (text from a model, an adapter over it, or a
//! LoRA checkpoint) and `trainbook export` (a checkpoint as the directories `transformers`
//! and `peft` load).

use std::io::Write;
use std::path::PathBuf;

use anyhow::{bail, Result};
use clap::Args;

use crate::recipes::causal_lm::inference::{self, Prompt};
use crate::recipes::models::generate::Sampling;
use crate::recipes::text::chat::Message;
use trainbook_api::plumbing::ports::LanguageModel;
use trainbook_api::{GenerateOptions, Generation};

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

/// A device named as on the command line: cpu, cuda, cuda:N.
pub(crate) fn device(name: &str) -> Result<tch::Device> {
    Ok(match name {
        "cpu" => tch::Device::Cpu,
        "cuda" => tch::Device::Cuda(0),
        other => match other.strip_prefix("cuda:").and_then(|i| i.parse().ok()) {
            Some(i) => tch::Device::Cuda(i),
            None => bail!("--device {other}: use cpu, cuda or cuda:N"),
        },
    })
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
pub fn generate(args: &GenerateArgs) -> Result<i32> {
    let sampling = args.sampling();
    sampling.check()?;
    let prompt = args.prompt()?;
    let lm = inference::load(&args.model, args.adapter.as_deref(), device(&args.device)?)?;
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

/// `trainbook export`.
pub fn export(args: &ExportArgs) -> Result<i32> {
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

/// A causal LM loaded in this process, behind `trainbook_api`'s [`LanguageModel`]: the
/// notebook's `TextGenerator`.
pub(crate) struct LoadedGenerator(pub(crate) inference::LoadedLm);

impl LanguageModel for LoadedGenerator {
    fn generate(
        &self,
        prompt: &str,
        chat: Option<&[(String, String)]>,
        o: &GenerateOptions,
    ) -> Result<Generation> {
        let p = match chat {
            Some(turns) => Prompt::Chat(
                turns
                    .iter()
                    .map(|(role, content)| Message {
                        role: role.clone(),
                        content: content.clone(),
                    })
                    .collect(),
            ),
            None => Prompt::Text(prompt.to_string()),
        };
        let sampling = Sampling {
            greedy: o.greedy,
            temperature: o.temperature,
            top_k: o.top_k,
            top_p: o.top_p,
            seed: o.seed,
        };
        sampling.check()?;
        let ids = self.0.encode(&p)?;
        let started = std::time::Instant::now();
        let mut shown = Shown::new(o.stream);
        let mut text = String::new();
        let tokens = self
            .0
            .generate(&ids, o.max_new_tokens, &sampling, &mut |piece| {
                text.push_str(piece);
                shown.show(piece, &text)
            })?;
        shown.finish(&text);
        Ok(Generation {
            text,
            prompt_tokens: ids.len(),
            tokens,
            seconds: started.elapsed().as_secs_f64(),
        })
    }
}

/// Where streamed text goes: in the trainbook kernel one display of the cell, replaced as the
/// text grows; elsewhere stdout, piece by piece.
enum Shown {
    Off,
    Cell(Option<trainbook_channel::Display>),
    Stdout,
}

impl Shown {
    fn new(on: bool) -> Self {
        match (on, trainbook_channel::link()) {
            (false, _) => Shown::Off,
            (true, Some(_)) => Shown::Cell(None),
            (true, None) => Shown::Stdout,
        }
    }

    fn show(&mut self, piece: &str, text: &str) -> Result<()> {
        match self {
            Shown::Off => {}
            Shown::Cell(display) => {
                let data = trainbook_channel::bundle(text, None);
                match display {
                    Some(d) => d.update(data),
                    None => *display = trainbook_channel::link().map(|l| l.display(data)),
                }
            }
            Shown::Stdout => {
                let mut out = std::io::stdout().lock();
                out.write_all(piece.as_bytes())?;
                out.flush()?;
            }
        }
        Ok(())
    }

    fn finish(&mut self, text: &str) {
        match self {
            Shown::Cell(Some(d)) => {
                d.update(trainbook_channel::bundle(text, None));
                d.flush(std::time::Duration::from_secs(2));
            }
            Shown::Stdout => println!(),
            _ => {}
        }
    }
}
