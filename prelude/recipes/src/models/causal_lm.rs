//! Causal language models from Hugging Face directories: the architecture `config.json`'s
//! `model_type` names ([`Architecture`]), built with or without LoRA adapters, loaded from
//! `model.safetensors` or the shards `model.safetensors.index.json` lists, and written back in
//! the layouts `transformers` and `peft` load.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use tch::{nn, Tensor};

pub use super::decoder::{CausalLm, TensorShapes};
use super::gpt2::{Gpt2, Gpt2Config};
use super::llama::{Llama, LlamaConfig};
use super::lora::{self, LoraSpec};
use trainbook_engine::checkpoint::{write_atomic, write_tensors, TensorFiles};

/// The model families trainbook reads, by `model_type`.
pub const SUPPORTED: &[&str] = &["gpt2", "llama", "mistral", "qwen2"];

/// A causal LM's `config.json`, read as what its `model_type` says it is.
#[derive(Clone, Debug)]
pub enum Architecture {
    Gpt2(Gpt2Config),
    Llama(LlamaConfig),
}

/// The model's `config.json` as written (exported unchanged beside the trained weights) and
/// what it says.
#[derive(Clone, Debug)]
pub struct ModelConfig {
    pub arch: Architecture,
    pub json: serde_json::Value,
}

impl ModelConfig {
    pub fn read(dir: &Path) -> Result<Self> {
        let file = dir.join("config.json");
        let text = std::fs::read_to_string(&file).with_context(|| {
            format!("reading {}: a causal LM directory needs config.json (as save_pretrained writes it)", file.display())
        })?;
        let json: serde_json::Value = serde_json::from_str(&text)
            .with_context(|| format!("{} is not JSON", file.display()))?;
        Self::from_json(json, &file.display().to_string())
    }

    pub fn from_json(json: serde_json::Value, origin: &str) -> Result<Self> {
        let kind = json
            .get("model_type")
            .and_then(|v| v.as_str())
            .unwrap_or("");
        let parse = |what: &str| -> anyhow::Error {
            anyhow::anyhow!("{origin} does not read as a {what} config.json")
        };
        let arch = match kind {
            "gpt2" => Architecture::Gpt2(
                serde_json::from_value(json.clone()).map_err(|e| parse("GPT-2").context(e))?,
            ),
            "llama" | "mistral" | "qwen2" => Architecture::Llama(
                serde_json::from_value(json.clone()).map_err(|e| parse(kind).context(e))?,
            ),
            "" => bail!(
                "{origin} has no model_type: causal LMs are read by it ({})",
                SUPPORTED.join(", ")
            ),
            other => bail!(
                "{origin}: model_type '{other}' is not a causal LM trainbook supports: {}",
                SUPPORTED.join(", ")
            ),
        };
        let c = Self { arch, json };
        c.check()?;
        Ok(c)
    }

    pub fn model_type(&self) -> &str {
        self.json["model_type"].as_str().unwrap_or("")
    }

    fn check(&self) -> Result<()> {
        match &self.arch {
            Architecture::Gpt2(c) => c.check(),
            Architecture::Llama(c) => c.check(),
        }
    }

    /// Refuses sequences of more tokens than the model attends over; `fix` ends the message.
    pub fn check_length(&self, tokens: i64, fix: &str) -> Result<()> {
        match &self.arch {
            Architecture::Gpt2(c) => c.check_length(tokens, fix),
            Architecture::Llama(c) => c.check_length(tokens, fix),
        }
    }

    /// The longest sequence the model attends over ([`ModelConfig::check_length`]'s limit).
    pub fn max_tokens(&self) -> i64 {
        match &self.arch {
            Architecture::Gpt2(c) => c.n_positions,
            Architecture::Llama(c) => c.max_tokens(),
        }
    }

    pub fn vocab_size(&self) -> i64 {
        match &self.arch {
            Architecture::Gpt2(c) => c.vocab_size,
            Architecture::Llama(c) => c.vocab_size,
        }
    }

    pub fn layers(&self) -> i64 {
        match &self.arch {
            Architecture::Gpt2(c) => c.n_layer,
            Architecture::Llama(c) => c.num_hidden_layers,
        }
    }

    pub fn hidden_size(&self) -> i64 {
        match &self.arch {
            Architecture::Gpt2(c) => c.n_embd,
            Architecture::Llama(c) => c.hidden_size,
        }
    }

    /// Every parameter as checkpoints store it.
    pub fn tensors(&self) -> TensorShapes {
        match &self.arch {
            Architecture::Gpt2(c) => c.tensors(),
            Architecture::Llama(c) => c.tensors(),
        }
    }

    /// The projections LoRA may adapt (the layers' dense ones), from the config alone.
    pub fn projections(&self) -> Vec<String> {
        let mut p: Vec<String> = self
            .tensors()
            .into_iter()
            .filter(|(n, s)| s.len() == 2 && (n.contains(".layers.") || n.contains(".h.")))
            .filter_map(|(n, _)| n.strip_suffix(".weight").map(str::to_string))
            .collect();
        p.sort();
        p
    }

    /// The attention projections: what LoRA adapts unless told otherwise.
    pub fn default_lora_targets(&self) -> Vec<String> {
        match &self.arch {
            Architecture::Gpt2(_) => vec!["attn.c_attn".into(), "attn.c_proj".into()],
            Architecture::Llama(_) => ["q_proj", "k_proj", "v_proj", "o_proj"]
                .map(String::from)
                .to_vec(),
        }
    }

    /// A one-line description for logs and the memory plan.
    pub fn describe(&self) -> String {
        let params: i64 = self
            .tensors()
            .iter()
            .map(|(_, s)| s.iter().product::<i64>())
            .sum();
        format!(
            "{} ({} layers, hidden {}, vocabulary {}, {:.1}M parameters)",
            self.model_type(),
            self.layers(),
            self.hidden_size(),
            self.vocab_size(),
            params as f64 / 1e6
        )
    }
}

/// Builds the model under `vs`'s root; with `lora`, only the adapters stay trainable.
pub fn build(
    vs: &nn::VarStore,
    config: &ModelConfig,
    lora: Option<&LoraSpec>,
) -> Result<Box<dyn CausalLm>> {
    if let Some(l) = lora {
        l.check_targets(&config.projections())?;
    }
    let model: Box<dyn CausalLm> = match &config.arch {
        Architecture::Gpt2(c) => Box::new(Gpt2::new(vs, c, lora)?),
        Architecture::Llama(c) => Box::new(Llama::new(vs, c, lora)?),
    };
    if lora.is_some() {
        lora::freeze_base(vs);
    }
    Ok(model)
}

/// Tensors checkpoints may carry that are not parameters here.
const IGNORED: &[&str] = &["rotary_emb.inv_freq", "attn.bias", "attn.masked_bias"];

/// The weight files of a model directory: `model.safetensors`, or every shard its
/// `model.safetensors.index.json` names (each must exist).
pub fn weight_files(dir: &Path) -> Result<Vec<PathBuf>> {
    use trainbook_engine::checkpoint::{files_of, has_tensors, index_name, MODEL_STEM};
    if !has_tensors(dir, MODEL_STEM) {
        bail!(
            "{} has neither model.safetensors nor model.safetensors.index.json: save the model with save_pretrained (safetensors), or pass --from-scratch to start from its config.json",
            dir.display()
        );
    }
    let index = index_name(MODEL_STEM);
    Ok(files_of(dir, MODEL_STEM)?
        .into_iter()
        .filter(|f| *f != index)
        .map(|f| dir.join(f))
        .collect())
}

/// Names and shapes in the weight files' headers (nothing else is read): checks a checkpoint
/// against its config before any worker starts. Every parameter must be there with the
/// config's shape.
pub fn check_weights(dir: &Path, config: &ModelConfig) -> Result<()> {
    let mut stored: HashMap<String, (Vec<i64>, PathBuf)> = HashMap::new();
    for f in weight_files(dir)? {
        let file = std::fs::File::open(&f).with_context(|| format!("opening {}", f.display()))?;
        // SAFETY: read-only mapping of a file nothing here writes; only its header is parsed.
        let map = unsafe { memmap2::Mmap::map(&file) }
            .with_context(|| format!("mapping {}", f.display()))?;
        let (_, meta) = safetensors::SafeTensors::read_metadata(&map)
            .map_err(|e| anyhow::anyhow!("{} is not a safetensors file: {e:?}", f.display()))?;
        for (name, info) in meta.tensors() {
            let shape = info.shape.iter().map(|&d| d as i64).collect();
            stored.insert(strip_gpt2_prefix(&name, config), (shape, f.clone()));
        }
    }
    let mut missing = Vec::new();
    for (name, shape) in config.tensors() {
        match stored.get(&name) {
            None => missing.push(name),
            Some((found, file)) if *found != shape => bail!(
                "{}: tensor {name} has shape {found:?} but config.json makes it {shape:?}: the weights were made for another config",
                file.display()
            ),
            Some(_) => {}
        }
    }
    if !missing.is_empty() {
        bail!(
            "{} lacks {} of the model's {} tensors ({}{}): the checkpoint is incomplete or of another architecture",
            dir.display(),
            missing.len(),
            config.tensors().len(),
            missing.iter().take(3).cloned().collect::<Vec<_>>().join(", "),
            if missing.len() > 3 { ", ..." } else { "" }
        );
    }
    Ok(())
}

/// Old GPT-2 checkpoints (the original release) have no `transformer.` prefix.
fn strip_gpt2_prefix(name: &str, config: &ModelConfig) -> String {
    match config.arch {
        Architecture::Gpt2(_)
            if !name.starts_with("transformer.") && !name.starts_with("lm_head") =>
        {
            format!("transformer.{name}")
        }
        _ => name.to_string(),
    }
}

/// Loads a directory's weights into `vs`: every base parameter must be found (adapters
/// start fresh).
pub fn load(vs: &nn::VarStore, dir: &Path, config: &ModelConfig) -> Result<()> {
    weight_files(dir)?;
    let files = TensorFiles::open(dir, "model")?.context("the weight files were just found")?;
    // Read a tensor at a time from the mapped files: loading holds the model, not the
    // files' contents beside it.
    let mut by_name: HashMap<String, String> = files
        .names()
        .map(|n| (strip_gpt2_prefix(n, config), n.to_string()))
        .collect();
    let tied = !config.tensors().iter().any(|(n, _)| n == "lm_head.weight");
    if tied {
        // A tied head is the embeddings; files may carry the copy.
        by_name.remove("lm_head.weight");
    }
    let report = super::load_into(
        vs,
        super::Source::Files(files, by_name),
        &dir.display().to_string(),
        &super::LoadRules {
            optional_prefix: None,
            ignored: IGNORED,
            replaceable_head: &[],
            mismatch_hint: "the weights were made for another config.json",
        },
    )?;
    let missing: Vec<&String> = report
        .missing
        .iter()
        .filter(|n| !lora::is_adapter(n))
        .collect();
    if !missing.is_empty() {
        bail!(
            "{} lacks the model's {}: the checkpoint is incomplete",
            dir.display(),
            missing
                .iter()
                .map(|s| s.as_str())
                .collect::<Vec<_>>()
                .join(", ")
        );
    }
    Ok(())
}

/// The variables of `vs` by name, sorted (what a full export writes).
pub fn named(vs: &nn::VarStore, adapters: bool) -> Vec<(String, Tensor)> {
    let mut v: Vec<(String, Tensor)> = vs
        .variables()
        .into_iter()
        .filter(|(n, _)| lora::is_adapter(n) == adapters)
        .collect();
    v.sort_by(|a, b| a.0.cmp(&b.0));
    v
}

/// The `config.json`, tokenizer and generation files a model directory carries beside its
/// weights, copied from the base model's directory.
pub const MODEL_FILES: &[&str] = &[
    "config.json",
    "generation_config.json",
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "chat_template.jinja",
    "vocab.json",
    "merges.txt",
    "tokenizer.model",
];

/// Writes a full model directory `transformers`' `AutoModelForCausalLM.from_pretrained`
/// loads, all at once: `model.safetensors` with the base names (adapters merged beforehand by
/// the caller) and the files of [`write_model_files`].
pub fn write_model_dir(
    out: &Path,
    weights: &[(String, Tensor)],
    config: &ModelConfig,
    base: &Path,
) -> Result<()> {
    staged(out, |dir| {
        write_weights(weights, &dir.join("model.safetensors"), "")?;
        write_model_files(dir, config, base)
    })
}

/// The files beside a full model's weights: its `config.json` (float32, as trained) and the
/// base directory's tokenizer and generation files.
pub fn write_model_files(dir: &Path, config: &ModelConfig, base: &Path) -> Result<()> {
    copy_model_files(base, dir)?;
    let mut json = config.json.clone();
    // Trained in float32 whatever the base was stored in (transformers 5 says `dtype`).
    let key = if json.get("dtype").is_some() {
        "dtype"
    } else {
        "torch_dtype"
    };
    json[key] = serde_json::json!("float32");
    write_atomic(&dir.join("config.json"), &serde_json::to_vec_pretty(&json)?)
}

/// Builds a directory beside `out` and puts it in `out`'s place only when complete: an
/// export that fails half-way leaves the previous one (or nothing) there.
pub fn staged(out: &Path, fill: impl FnOnce(&Path) -> Result<()>) -> Result<()> {
    let name = out
        .file_name()
        .with_context(|| format!("{} names no directory", out.display()))?;
    let parent = match out.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
        _ => PathBuf::from("."),
    };
    std::fs::create_dir_all(&parent).with_context(|| format!("creating {}", parent.display()))?;
    let tmp = parent.join(format!(
        ".{}.partial-{}",
        name.to_string_lossy(),
        std::process::id()
    ));
    let _ = std::fs::remove_dir_all(&tmp);
    std::fs::create_dir_all(&tmp).with_context(|| format!("creating {}", tmp.display()))?;
    if let Err(e) = fill(&tmp) {
        let _ = std::fs::remove_dir_all(&tmp);
        return Err(e);
    }
    let old = parent.join(format!(
        ".{}.old-{}",
        name.to_string_lossy(),
        std::process::id()
    ));
    if out.exists() {
        std::fs::rename(out, &old)
            .with_context(|| format!("moving the previous {} aside", out.display()))?;
    }
    std::fs::rename(&tmp, out).with_context(|| format!("putting {} in place", out.display()))?;
    let _ = std::fs::remove_dir_all(&old);
    Ok(())
}

/// Writes host copies of `named` (names prefixed) as one safetensors file.
fn write_weights(named: &[(String, Tensor)], path: &Path, prefix: &str) -> Result<()> {
    let host: Vec<(String, Tensor)> = named
        .iter()
        .map(|(n, t)| {
            (
                format!("{prefix}{n}"),
                t.detach().to_device(tch::Device::Cpu),
            )
        })
        .collect();
    write_tensors(&host, path)
}

/// Copies the tokenizer and generation files of `from` that exist into `to`.
pub fn copy_model_files(from: &Path, to: &Path) -> Result<()> {
    for f in MODEL_FILES {
        let src = from.join(f);
        if src.exists() && from != to {
            std::fs::copy(&src, to.join(f))
                .with_context(|| format!("copying {}", src.display()))?;
        }
    }
    Ok(())
}

/// Writes a PEFT adapter directory that `peft.PeftModel.from_pretrained(base, dir)` loads
/// over the base model at `base`, all at once ([`write_adapter_files`]).
pub fn write_adapter_dir(
    out: &Path,
    adapters: &[(String, Tensor)],
    spec: &LoraSpec,
    config: &ModelConfig,
    base: &Path,
) -> Result<()> {
    staged(out, |dir| {
        write_adapter_files(dir, adapters, spec, config, base)
    })
}

/// `adapter_config.json`, `adapter_model.safetensors` (PEFT's names: `base_model.model.` and
/// the variable's name) and the base's tokenizer files, into `dir`.
pub fn write_adapter_files(
    dir: &Path,
    adapters: &[(String, Tensor)],
    spec: &LoraSpec,
    config: &ModelConfig,
    base: &Path,
) -> Result<()> {
    let json = serde_json::json!({
        "peft_type": "LORA",
        "task_type": "CAUSAL_LM",
        "base_model_name_or_path": std::fs::canonicalize(base).unwrap_or_else(|_| base.to_path_buf()).display().to_string(),
        "r": spec.rank,
        "lora_alpha": spec.alpha,
        "lora_dropout": spec.dropout,
        "target_modules": spec.targets,
        // GPT-2's projections are stored in x out (Conv1D).
        "fan_in_fan_out": matches!(config.arch, Architecture::Gpt2(_)),
        "bias": "none",
        "inference_mode": true,
        "use_rslora": false,
        "use_dora": false,
        "modules_to_save": null,
    });
    write_weights(
        adapters,
        &dir.join("adapter_model.safetensors"),
        "base_model.model.",
    )?;
    copy_model_files(base, dir)?;
    // The base's config.json is not an adapter's: PEFT reads adapter_config.json.
    let _ = std::fs::remove_file(dir.join("config.json"));
    write_atomic(
        &dir.join("adapter_config.json"),
        &serde_json::to_vec_pretty(&json)?,
    )
}

/// Reads a PEFT adapter directory: its spec and tensors by trainbook's variable names.
pub fn read_adapter_dir(dir: &Path) -> Result<(LoraSpec, Vec<(String, Tensor)>)> {
    let cfg = dir.join("adapter_config.json");
    let json: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&cfg).with_context(|| {
            format!(
                "reading {}: an adapter directory needs it (as PEFT's save_pretrained writes it)",
                cfg.display()
            )
        })?)
        .with_context(|| format!("{} is not JSON", cfg.display()))?;
    if json["peft_type"].as_str() != Some("LORA") {
        bail!(
            "{} is not a LoRA adapter (peft_type {}): trainbook reads LoRA adapters",
            cfg.display(),
            json["peft_type"]
        );
    }
    if json["use_dora"].as_bool() == Some(true) || json["use_rslora"].as_bool() == Some(true) {
        bail!(
            "{}: DoRA and rsLoRA adapters are not supported",
            cfg.display()
        );
    }
    let targets = match &json["target_modules"] {
        serde_json::Value::String(s) => vec![s.clone()],
        serde_json::Value::Array(a) => a
            .iter()
            .filter_map(|v| v.as_str().map(String::from))
            .collect(),
        other => bail!(
            "{}: target_modules {other} is not a list of module names",
            cfg.display()
        ),
    };
    let spec = LoraSpec {
        rank: json["r"].as_i64().context("adapter_config.json has no r")?,
        alpha: json["lora_alpha"]
            .as_f64()
            .context("adapter_config.json has no lora_alpha")?,
        dropout: json["lora_dropout"].as_f64().unwrap_or(0.0),
        targets,
    };
    let file = dir.join("adapter_model.safetensors");
    let tensors = Tensor::read_safetensors(&file)
        .with_context(|| format!("reading {}", file.display()))?
        .into_iter()
        .map(|(n, t)| {
            let n = n
                .strip_prefix("base_model.model.")
                .unwrap_or(&n)
                .replace(".lora_A.default.", ".lora_A.")
                .replace(".lora_B.default.", ".lora_B.");
            (n, t)
        })
        .collect();
    Ok((spec, tensors))
}

/// Against `transformers` itself: tests/fixtures/causal_lm holds tiny random models of each
/// architecture written by its `save_pretrained`, with their logits and greedy generations
/// (tests/fixtures/make_causal_lm_parity.py).
#[cfg(test)]
mod parity {
    use super::*;
    use crate::models::generate::{generate, Sampling};

    fn fixture(arch: &str) -> PathBuf {
        PathBuf::from(env!("CARGO_MANIFEST_DIR"))
            .join("../../tests/fixtures/causal_lm")
            .join(arch)
    }

    fn expected(dir: &Path) -> HashMap<String, Tensor> {
        Tensor::read_safetensors(dir.join("expected.safetensors"))
            .unwrap()
            .into_iter()
            .collect()
    }

    fn model(
        dir: &Path,
        lora: Option<&LoraSpec>,
    ) -> (nn::VarStore, Box<dyn CausalLm>, ModelConfig) {
        let config = ModelConfig::read(dir).unwrap();
        check_weights(dir, &config).unwrap();
        let vs = nn::VarStore::new(tch::Device::Cpu);
        let m = build(&vs, &config, lora).unwrap();
        load(&vs, dir, &config).unwrap();
        (vs, m, config)
    }

    #[test]
    fn logits_and_greedy_generation_equal_transformers() {
        for arch in ["gpt2", "llama", "mistral", "qwen2"] {
            let dir = fixture(arch);
            let (_vs, m, config) = model(&dir, None);
            let want = expected(&dir);
            // The built model has exactly the tensors the config lists (the memory plan and
            // the pre-flight check read that list).
            let built: TensorShapes = named(&_vs, false)
                .into_iter()
                .map(|(n, t)| (n, t.size()))
                .collect();
            assert_eq!(built, config.tensors(), "{arch}");
            let logits = tch::no_grad(|| m.logits(&m.hidden(&want["input_ids"], None, false)));
            let diff = (&logits - &want["logits"]).abs().max().double_value(&[]);
            assert!(diff <= 1e-4, "{arch}: logits differ by {diff}");

            let prompt: Vec<i64> = Vec::try_from(want["prompt_ids"].view([-1])).unwrap();
            let greedy: Vec<i64> = Vec::try_from(want["greedy_ids"].view([-1])).unwrap();
            let stop = crate::causal_lm::inference::stop_tokens(&dir);
            let new = generate(
                m.as_ref(),
                &prompt,
                greedy.len() - prompt.len(),
                &Sampling::default(),
                &stop,
                tch::Device::Cpu,
                &mut |_| Ok(()),
            )
            .unwrap();
            assert_eq!([prompt, new].concat(), greedy, "{arch}: greedy tokens");
        }
    }

    #[test]
    fn a_shape_the_config_does_not_make_is_refused_before_loading() {
        let dir = fixture("llama");
        let mut json: serde_json::Value =
            serde_json::from_slice(&std::fs::read(dir.join("config.json")).unwrap()).unwrap();
        json["intermediate_size"] = serde_json::json!(64);
        let config = ModelConfig::from_json(json, "edited").unwrap();
        let err = check_weights(&dir, &config).unwrap_err().to_string();
        assert!(
            err.contains("mlp.") && err.contains("shape") && err.contains("another config"),
            "{err}"
        );
    }

    #[test]
    fn an_unknown_model_type_names_the_supported_ones() {
        let err =
            ModelConfig::from_json(serde_json::json!({"model_type": "falcon"}), "x/config.json")
                .unwrap_err()
                .to_string();
        assert!(
            err.contains("'falcon'") && err.contains("gpt2, llama, mistral, qwen2"),
            "{err}"
        );
    }

    #[test]
    fn a_missing_shard_is_named() {
        let tmp = std::env::temp_dir().join(format!("trainbook-shard-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&tmp);
        std::fs::create_dir_all(&tmp).unwrap();
        let src = fixture("llama");
        std::fs::copy(
            src.join("model.safetensors.index.json"),
            tmp.join("model.safetensors.index.json"),
        )
        .unwrap();
        let err = weight_files(&tmp).unwrap_err().to_string();
        assert!(
            err.contains("which is not there") && err.contains("model-0000"),
            "{err}"
        );
        let _ = std::fs::remove_dir_all(&tmp);
    }

    /// Written and read back, an adapter gives the same logits; merged into the base, too.
    #[test]
    fn adapters_round_trip_and_merge_to_the_same_function() {
        for arch in ["gpt2", "llama"] {
            let dir = fixture(arch);
            let config = ModelConfig::read(&dir).unwrap();
            let spec = LoraSpec {
                rank: 2,
                alpha: 4.0,
                dropout: 0.0,
                targets: config.default_lora_targets(),
            };
            let (vs, mut m, _) = model(&dir, Some(&spec));
            tch::no_grad(|| {
                for (n, mut t) in vs.variables() {
                    if n.contains("lora_B") {
                        let _ = t.normal_(0.0, 0.5);
                    }
                }
            });
            let ids = expected(&dir)["input_ids"].shallow_clone();
            let before = tch::no_grad(|| m.logits(&m.hidden(&ids, None, false)));
            let out = std::env::temp_dir()
                .join(format!("trainbook-adapter-{arch}-{}", std::process::id()));
            write_adapter_dir(&out, &named(&vs, true), &spec, &config, &dir).unwrap();
            let lm = crate::causal_lm::inference::load(&dir, Some(&out), tch::Device::Cpu).unwrap();
            let again = tch::no_grad(|| lm.model.logits(&lm.model.hidden(&ids, None, false)));
            let d = (&before - &again).abs().max().double_value(&[]);
            assert!(d < 1e-5, "{arch}: reloaded adapter differs by {d}");
            m.layers_mut().merge_adapters();
            let merged = tch::no_grad(|| m.logits(&m.hidden(&ids, None, false)));
            let d = (&before - &merged).abs().max().double_value(&[]);
            assert!(d < 1e-4, "{arch}: merged model differs by {d}");
            let _ = std::fs::remove_dir_all(&out);
        }
    }
}
