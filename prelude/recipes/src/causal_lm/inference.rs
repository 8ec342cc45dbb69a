//! A trained causal LM outside training: loaded from a model directory (with an adapter
//! directory over it, or an adapter directory alone that names its base), generating text,
//! and exported as the directories `transformers` and `peft` load.

use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use tch::nn;

use crate::models::causal_lm::{self, CausalLm, ModelConfig};
use crate::models::generate::{self, Detokenizer, Sampling};
use crate::models::lora::{self, LoraSpec};
use crate::text::chat::{ChatTemplate, Message};

/// A model ready to generate: base weights, an adapter over them when one was given.
pub struct LoadedLm {
    pub vs: nn::VarStore,
    pub model: Box<dyn CausalLm>,
    pub config: ModelConfig,
    /// Where the base model's files are (config, tokenizer).
    pub base: PathBuf,
    pub adapter: Option<(LoraSpec, PathBuf)>,
    pub tokenizer: tokenizers::Tokenizer,
    pub device: tch::Device,
}

/// Whether `dir` is a PEFT adapter directory.
pub fn is_adapter_dir(dir: &Path) -> bool {
    dir.join("adapter_config.json").exists()
}

/// The base model an adapter directory names (`base_model_name_or_path`).
fn adapter_base(adapter: &Path) -> Result<PathBuf> {
    let file = adapter.join("adapter_config.json");
    let json: serde_json::Value = serde_json::from_slice(
        &std::fs::read(&file).with_context(|| format!("reading {}", file.display()))?,
    )
    .with_context(|| format!("{} is not JSON", file.display()))?;
    let base = json["base_model_name_or_path"]
        .as_str()
        .with_context(|| format!("{} names no base model (base_model_name_or_path): give it with --model and this directory with --adapter", file.display()))?;
    super::model_dir(base)
}

/// Loads `model` (a model directory, or an adapter directory naming its base) and, over it,
/// `adapter`; on `device`.
pub fn load(model: &Path, adapter: Option<&Path>, device: tch::Device) -> Result<LoadedLm> {
    let (base, adapter) = match adapter {
        Some(a) => (model.to_path_buf(), Some(a.to_path_buf())),
        // An adapter directory (a LoRA checkpoint) names its base.
        None if is_adapter_dir(model) && !model.join("config.json").exists() => {
            (adapter_base(model)?, Some(model.to_path_buf()))
        }
        None => (model.to_path_buf(), None),
    };
    let base = super::model_dir(&base.display().to_string())?;
    let config = ModelConfig::read(&base)?;
    let adapter = match adapter {
        Some(dir) => {
            let (spec, tensors) = causal_lm::read_adapter_dir(&dir)?;
            Some((spec, tensors, dir))
        }
        None => None,
    };
    let vs = nn::VarStore::new(tch::Device::Cpu);
    let model = causal_lm::build(&vs, &config, adapter.as_ref().map(|a| &a.0))?;
    causal_lm::load(&vs, &base, &config)?;
    if let Some((_, tensors, dir)) = &adapter {
        let vars = vs.variables();
        let expected: Vec<&String> = vars.keys().filter(|n| lora::is_adapter(n)).collect();
        tch::no_grad(|| -> Result<()> {
            for (name, t) in tensors {
                let Some(dst) = vars.get(name) else {
                    bail!("{}: the adapter has {name}, which this model ({}) has no place for: it was trained on another base model", dir.display(), config.model_type());
                };
                if dst.size() != t.size() {
                    bail!("{}: {name} has shape {:?} but this base makes it {:?}: it was trained on another base model", dir.display(), t.size(), dst.size());
                }
                dst.shallow_clone().copy_(&t.to_kind(dst.kind()));
            }
            Ok(())
        })?;
        if expected.len() != tensors.len() {
            bail!(
                "{}: the adapter has {} tensors where its adapter_config.json makes {}",
                dir.display(),
                tensors.len(),
                expected.len()
            );
        }
    }
    let mut vs = vs;
    vs.set_device(device);
    let file = base.join("tokenizer.json");
    let tokenizer = tokenizers::Tokenizer::from_file(&file)
        .map_err(|e| anyhow::anyhow!("reading {}: {e}", file.display()))?;
    Ok(LoadedLm {
        vs,
        model,
        config,
        base,
        adapter: adapter.map(|(s, _, d)| (s, d)),
        tokenizer,
        device,
    })
}

/// The tokens generation stops at: `generation_config.json`'s `eos_token_id` (one or a
/// list), else `config.json`'s.
pub fn stop_tokens(base: &Path) -> Vec<i64> {
    let read = |f: &str| -> Option<serde_json::Value> {
        serde_json::from_slice(&std::fs::read(base.join(f)).ok()?).ok()
    };
    for f in ["generation_config.json", "config.json"] {
        if let Some(v) = read(f).map(|j| j["eos_token_id"].clone()) {
            match v {
                serde_json::Value::Number(n) => return n.as_i64().into_iter().collect(),
                serde_json::Value::Array(a) => {
                    return a.iter().filter_map(|x| x.as_i64()).collect()
                }
                _ => {}
            }
        }
    }
    Vec::new()
}

/// What to generate from.
pub enum Prompt {
    /// Text, encoded with the tokenizer's special tokens (Llama's BOS).
    Text(String),
    /// A conversation, rendered with the chat template and its generation prompt.
    Chat(Vec<Message>),
}

impl LoadedLm {
    /// The prompt's token ids.
    pub fn encode(&self, prompt: &Prompt) -> Result<Vec<i64>> {
        let (text, special) = match prompt {
            Prompt::Text(t) => (t.clone(), true),
            Prompt::Chat(messages) => {
                let template = ChatTemplate::from_model_dir(&self.base)?.with_context(|| {
                    format!(
                        "the tokenizer in {} has no chat_template: give a plain prompt instead",
                        self.base.display()
                    )
                })?;
                (template.render(messages, true)?, false)
            }
        };
        let enc = self
            .tokenizer
            .encode(text.as_str(), special)
            .map_err(|e| anyhow::anyhow!("encoding the prompt: {e}"))?;
        Ok(enc.get_ids().iter().map(|&i| i as i64).collect())
    }

    /// Generates after `prompt`, handing each piece of text to `on_text` as it comes; returns
    /// the new token ids.
    pub fn generate(
        &self,
        prompt: &[i64],
        max_new: usize,
        sampling: &Sampling,
        on_text: &mut dyn FnMut(&str) -> Result<()>,
    ) -> Result<Vec<i64>> {
        let fix = format!(
            "the prompt has {} tokens and {max_new} new ones were asked for; shorten the prompt or ask for fewer",
            prompt.len()
        );
        self.config
            .check_length((prompt.len() + max_new) as i64, &fix)?;
        let stop = stop_tokens(&self.base);
        let mut text = Detokenizer::new(&self.tokenizer);
        generate::generate(
            self.model.as_ref(),
            prompt,
            max_new,
            sampling,
            &stop,
            self.device,
            // The end-of-sequence token ends the text; it is not part of it (tokenizers whose
            // special tokens are not marked so would decode it as `[SEP]`).
            &mut |id| match stop.contains(&id) {
                true => Ok(()),
                false => on_text(&text.push(id)?),
            },
        )
    }
}

/// Writes `checkpoint` (a causal-lm checkpoint or any model directory) to `out` as the
/// Hugging Face ecosystem loads it: a full model as a `transformers` directory; a LoRA
/// checkpoint as a PEFT adapter directory, or with `merge` the base with the adapter folded
/// in, as a full directory. Returns what was written, in words.
/// The files of a full fine-tune's checkpoint written sharded (under ZeRO-3): the weights'
/// shards and index, and the model files beside them; `None` for any other checkpoint.
fn sharded_full_model(checkpoint: &Path) -> Result<Option<Vec<String>>> {
    use trainbook_engine::checkpoint::{files_of, index_name, MODEL_STEM};
    let sharded = checkpoint.join(index_name(MODEL_STEM)).is_file()
        && !checkpoint.join("model.safetensors").exists()
        && !checkpoint.join("adapter_config.json").exists();
    if !sharded {
        return Ok(None);
    }
    let mut files = files_of(checkpoint, MODEL_STEM)?;
    files.extend(
        causal_lm::MODEL_FILES
            .iter()
            .filter(|f| checkpoint.join(f).exists())
            .map(|f| f.to_string()),
    );
    Ok(Some(files))
}

pub fn export(checkpoint: &Path, out: &Path, merge: bool) -> Result<String> {
    if !checkpoint.is_dir() {
        bail!("{} is not a directory: give a checkpoint (result.last_checkpoint, or trainbook_runs/<run>/checkpoints/<name>)", checkpoint.display());
    }
    if out.exists() && std::fs::canonicalize(out).ok() == std::fs::canonicalize(checkpoint).ok() {
        bail!(
            "--export {} is the checkpoint itself: name another directory",
            out.display()
        );
    }
    if let Some(files) = sharded_full_model(checkpoint)? {
        // Already the directory transformers loads: copied a file at a time, never loaded.
        let names: Vec<&str> = files.iter().map(String::as_str).collect();
        crate::checkpoint::copy_into_place(checkpoint, &names, out)?;
        return Ok(format!(
            "the model in {} ({} weight files and their index, copied): AutoModelForCausalLM.from_pretrained(\"{}\") loads it",
            out.display(),
            files.iter().filter(|f| f.ends_with(".safetensors")).count(),
            out.display()
        ));
    }
    let lm = load(checkpoint, None, tch::Device::Cpu)?;
    match (&lm.adapter, merge) {
        (Some((spec, _)), false) => {
            causal_lm::write_adapter_dir(
                out,
                &causal_lm::named(&lm.vs, true),
                spec,
                &lm.config,
                &lm.base,
            )?;
            Ok(format!("a LoRA adapter (rank {}) for {} in {}: peft.PeftModel.from_pretrained(base, \"{}\") loads it", spec.rank, lm.base.display(), out.display(), out.display()))
        }
        (Some(_), true) => {
            let mut lm = lm;
            lm.model.layers_mut().merge_adapters();
            let weights: Vec<_> = causal_lm::named(&lm.vs, false);
            causal_lm::write_model_dir(out, &weights, &lm.config, &lm.base)?;
            Ok(format!("{} with the adapter merged in {}: AutoModelForCausalLM.from_pretrained(\"{}\") loads it", lm.config.model_type(), out.display(), out.display()))
        }
        (None, _) => {
            causal_lm::write_model_dir(
                out,
                &causal_lm::named(&lm.vs, false),
                &lm.config,
                &lm.base,
            )?;
            Ok(format!(
                "{} in {}: AutoModelForCausalLM.from_pretrained(\"{}\") loads it",
                lm.config.model_type(),
                out.display(),
                out.display()
            ))
        }
    }
}
