//! A causal LM loaded in this process, for the notebook's `TextGenerator` (the commands that
//! use one are `commands/generate.rs` and `commands/export.rs`).

use std::io::Write;

use anyhow::{bail, Result};

use crate::recipes::causal_lm::inference::{self, Prompt};
use crate::recipes::models::generate::Sampling;
use crate::recipes::text::chat::Message;
use trainbook_api::plumbing::ports::LanguageModel;
use trainbook_api::{GenerateOptions, Generation};

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
