//! Causal language models (the `causal-lm` recipe): GPT-2 and the Llama family (Llama, Mistral,
//! Qwen2) from Hugging Face directories, fine-tuned in full or with LoRA adapters on plain
//! text, prompt/completion pairs or chat conversations. [`LmTrainer`] holds every option; the
//! text options ([`crate::ConfigureText`]: `max_length`, `text_column`, `eval_fraction`,
//! `eval_data`, `from_scratch`) and [`ConfigureLm`]'s own.

use crate::spec::Configure;

crate::options! {
    /// Options of the causal-LM recipe (causal-lm).
    struct LmOptions => LmSettings, trait ConfigureLm(lm_options) {
        /// LoRA: train rank-R adapters beside the frozen model instead of every weight (8 or
        /// 16 are common); without it every weight is trained.
        #[arg(value_name = "R")]
        lora_rank: usize => Option<usize>,
        /// LoRA: the adapters' output is scaled by alpha / rank (default: 2 x rank).
        #[arg(value_name = "ALPHA")]
        lora_alpha: f64 => Option<f64>,
        /// LoRA: dropout on the adapters' input (default 0.05).
        #[arg(value_name = "P")]
        lora_dropout: f64 => f64,
        /// LoRA: the modules to adapt, comma-separated names or dotted suffixes as PEFT
        /// matches them (default: the attention projections, q_proj,k_proj,v_proj,o_proj;
        /// GPT-2: attn.c_attn,attn.c_proj).
        #[arg(value_name = "NAMES")]
        lora_targets: String [into] => Option<String>,
        /// Prompt/completion and chat data: pack examples one after another into blocks of
        /// max_length tokens (no padding; attention then crosses examples, as for plain text).
        #[arg(num_args = 0..=1, default_missing_value = "true", value_name = "BOOL")]
        packing: bool => bool,
    }
}

trainer!(
    /// Every option of the causal-LM recipe:
    /// `LmTrainer::new().model("./llama").data("chat.jsonl").lora_rank(8).fit()?`.
    /// Plain text is cut into blocks of `max_length` tokens; jsonl `{"prompt", "completion"}`
    /// trains on the completions, `{"messages": [...]}` on the assistant turns (rendered with
    /// the tokenizer's chat template).
    LmTrainer,
    "causal-lm"
);

/// `max_length`, `text_column`, `eval_fraction`, `eval_data`, `from_scratch`.
impl crate::text::ConfigureText for LmTrainer {
    fn text_options(&mut self, edit: impl FnOnce(&mut crate::text::TextOptions)) {
        self.spec.edit_recipe_options(edit)
    }
}

/// `lora_rank`, `lora_alpha`, `lora_dropout`, `lora_targets`, `packing`.
impl ConfigureLm for LmTrainer {
    fn lm_options(&mut self, edit: impl FnOnce(&mut LmOptions)) {
        self.spec.edit_recipe_options(edit)
    }
}

/// How [`TextGenerator`] picks each next token and when it stops.
#[derive(Clone, Debug, PartialEq)]
pub struct GenerateOptions {
    /// At most this many new tokens (generation also stops at the model's end-of-sequence
    /// token).
    pub max_new_tokens: usize,
    /// The most likely token every time; otherwise sampled with the settings below.
    pub greedy: bool,
    pub temperature: f64,
    /// Sample from the most likely tokens that together have this probability (1.0: all).
    pub top_p: f64,
    /// Sample from this many most likely tokens (0: all).
    pub top_k: i64,
    pub seed: u64,
    /// Stream the text into the cell (or stdout) as it comes.
    pub stream: bool,
}

impl Default for GenerateOptions {
    fn default() -> Self {
        Self {
            max_new_tokens: 64,
            greedy: true,
            temperature: 1.0,
            top_p: 1.0,
            top_k: 0,
            seed: 0,
            stream: true,
        }
    }
}

/// What a generation gave.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct Generation {
    /// The new text (the prompt not included).
    pub text: String,
    pub prompt_tokens: usize,
    /// The new token ids (an end-of-sequence token included when it ended the text).
    pub tokens: Vec<i64>,
    pub seconds: f64,
}

impl Generation {
    pub fn tokens_per_second(&self) -> f64 {
        self.tokens.len() as f64 / self.seconds.max(1e-9)
    }
}

impl std::fmt::Display for Generation {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.text)
    }
}

/// A loaded causal LM (the recipes implement it).
pub trait LanguageModel {
    /// Continues `prompt`, or with `chat` the conversation `(role, content)` rendered by the
    /// tokenizer's chat template.
    fn generate(
        &self,
        prompt: &str,
        chat: Option<&[(String, String)]>,
        options: &GenerateOptions,
    ) -> anyhow::Result<Generation>;
}

/// The engine's side of text generation. The `trainbook` crate implements it (see
/// `crate::runtime`).
pub trait Generators: Send + Sync {
    /// Loads a model directory (or a causal-lm checkpoint, or an adapter directory naming its
    /// base), with `adapter` over it, on `device` (`cpu`, `cuda`, `cuda:N`).
    fn load_language_model(
        &self,
        model: &std::path::Path,
        adapter: Option<&std::path::Path>,
        device: &str,
    ) -> anyhow::Result<Box<dyn LanguageModel>>;
}

/// Text from a causal LM in a cell, streamed into the cell's output as it comes:
/// `TextGenerator::load("./llama")?.max_new_tokens(40).generate("Once upon a time")?`.
/// A LoRA run's checkpoint loads as it is (its base is named in it), or over a base with
/// [`TextGenerator::with_adapter`].
pub struct TextGenerator {
    model: Box<dyn LanguageModel>,
    options: GenerateOptions,
}

impl std::fmt::Debug for TextGenerator {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TextGenerator")
            .field("options", &self.options)
            .finish()
    }
}

impl TextGenerator {
    /// On the CPU.
    pub fn load(model: impl AsRef<std::path::Path>) -> anyhow::Result<Self> {
        Self::load_on(model, None::<&std::path::Path>, "cpu")
    }

    /// `adapter` (a PEFT adapter directory or a causal-lm LoRA checkpoint) over `model`.
    pub fn with_adapter(
        model: impl AsRef<std::path::Path>,
        adapter: impl AsRef<std::path::Path>,
    ) -> anyhow::Result<Self> {
        Self::load_on(model, Some(adapter), "cpu")
    }

    /// On a device: `cpu`, `cuda` or `cuda:N`.
    pub fn load_on(
        model: impl AsRef<std::path::Path>,
        adapter: Option<impl AsRef<std::path::Path>>,
        device: &str,
    ) -> anyhow::Result<Self> {
        let model = crate::runtime::port::<dyn Generators>()?.load_language_model(
            model.as_ref(),
            adapter.as_ref().map(|a| a.as_ref()),
            device,
        )?;
        Ok(Self {
            model,
            options: GenerateOptions::default(),
        })
    }

    pub fn max_new_tokens(mut self, n: usize) -> Self {
        self.options.max_new_tokens = n;
        self
    }

    /// The most likely token every time (the default).
    pub fn greedy(mut self) -> Self {
        self.options.greedy = true;
        self
    }

    /// Sampling at temperature `t` (instead of greedy).
    pub fn temperature(mut self, t: f64) -> Self {
        self.options.greedy = false;
        self.options.temperature = t;
        self
    }

    /// Sampling from the smallest set of tokens with probability `p` (instead of greedy).
    pub fn top_p(mut self, p: f64) -> Self {
        self.options.greedy = false;
        self.options.top_p = p;
        self
    }

    /// Sampling from the `k` most likely tokens (instead of greedy).
    pub fn top_k(mut self, k: i64) -> Self {
        self.options.greedy = false;
        self.options.top_k = k;
        self
    }

    pub fn seed(mut self, seed: u64) -> Self {
        self.options.seed = seed;
        self
    }

    /// Whether text is shown as it comes (default true).
    pub fn stream(mut self, on: bool) -> Self {
        self.options.stream = on;
        self
    }

    pub fn options(&self) -> &GenerateOptions {
        &self.options
    }

    /// Continues `prompt`.
    pub fn generate(&self, prompt: &str) -> anyhow::Result<Generation> {
        self.model.generate(prompt, None, &self.options)
    }

    /// Answers a conversation of `(role, content)` turns (`system`, `user`, `assistant`),
    /// rendered with the tokenizer's chat template.
    pub fn chat(&self, messages: &[(&str, &str)]) -> anyhow::Result<Generation> {
        let owned: Vec<(String, String)> = messages
            .iter()
            .map(|(r, c)| (r.to_string(), c.to_string()))
            .collect();
        self.model.generate("", Some(&owned), &self.options)
    }
}

/// The shape of a Llama-family model to train from scratch: written as a model directory
/// (`config.json` and a tokenizer's files) that `LmTrainer::new().model(dir).from_scratch(true)`
/// trains from random weights. For pre-training a small model where no pretrained one can be
/// had (the offline notebook), or the control run of a fine-tuning comparison.
#[derive(Clone, Debug, PartialEq)]
pub struct LlamaShape {
    pub layers: usize,
    pub hidden_size: usize,
    pub heads: usize,
    /// Key/value heads (grouped-query attention when fewer than `heads`).
    pub kv_heads: usize,
    /// The feed-forward layer's width (Llama: about 8/3 of the hidden size).
    pub intermediate_size: usize,
    /// The longest sequence it takes.
    pub max_positions: usize,
}

impl Default for LlamaShape {
    /// 4 layers of 256 (4 heads, 2 key/value heads), 512 positions: about 3M parameters
    /// besides the embeddings, minutes of pre-training on a laptop's cores.
    fn default() -> Self {
        Self {
            layers: 4,
            hidden_size: 256,
            heads: 4,
            kv_heads: 2,
            intermediate_size: 688,
            max_positions: 512,
        }
    }
}

impl LlamaShape {
    /// Writes `dir` (created) with `config.json` for this shape and the vocabulary of the
    /// tokenizer in `tokenizer_dir` (its `tokenizer.json`, copied; e.g. from
    /// `TokenizerTrainer`), whose `[CLS]`/`[SEP]` (or `<s>`/`</s>`) begin and end a text.
    /// Returns `dir`.
    pub fn write(
        &self,
        dir: impl AsRef<std::path::Path>,
        tokenizer_dir: impl AsRef<std::path::Path>,
    ) -> anyhow::Result<std::path::PathBuf> {
        use anyhow::Context;
        let (dir, tok) = (dir.as_ref(), tokenizer_dir.as_ref());
        if self.heads == 0
            || self.kv_heads == 0
            || self.hidden_size % self.heads != 0
            || self.heads % self.kv_heads != 0
        {
            anyhow::bail!(
                "hidden_size {}, heads {}, kv_heads {}: heads must divide hidden_size and kv_heads must divide heads",
                self.hidden_size, self.heads, self.kv_heads
            );
        }
        let json_file = tok.join("tokenizer.json");
        let text = std::fs::read_to_string(&json_file).with_context(|| {
            format!(
                "reading {}: give a tokenizer directory (TokenizerTrainer writes one)",
                json_file.display()
            )
        })?;
        let parsed: serde_json::Value = serde_json::from_str(&text)
            .with_context(|| format!("{} is not JSON", json_file.display()))?;
        let vocab = parsed["model"]["vocab"]
            .as_object()
            .map(|v| v.len())
            .unwrap_or(0)
            + parsed["added_tokens"]
                .as_array()
                .map(|a| {
                    a.iter()
                        .filter(|t| {
                            parsed["model"]["vocab"]
                                .get(t["content"].as_str().unwrap_or(""))
                                .is_none()
                        })
                        .count()
                })
                .unwrap_or(0);
        if vocab == 0 {
            anyhow::bail!("{} has no vocabulary", json_file.display());
        }
        let id = |t: &str| parsed["model"]["vocab"].get(t).and_then(|v| v.as_i64());
        let (bos, eos) = match (id("[CLS]"), id("[SEP]"), id("<s>"), id("</s>")) {
            (Some(b), Some(e), _, _) => (("[CLS]", b), ("[SEP]", e)),
            (_, _, Some(b), Some(e)) => (("<s>", b), ("</s>", e)),
            _ => anyhow::bail!(
                "{} has neither [CLS]/[SEP] nor <s>/</s> to begin and end a text",
                json_file.display()
            ),
        };
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
        let config = serde_json::json!({
            "architectures": ["LlamaForCausalLM"],
            "model_type": "llama",
            "vocab_size": vocab,
            "hidden_size": self.hidden_size,
            "intermediate_size": self.intermediate_size,
            "num_hidden_layers": self.layers,
            "num_attention_heads": self.heads,
            "num_key_value_heads": self.kv_heads,
            "max_position_embeddings": self.max_positions,
            "hidden_act": "silu",
            "rms_norm_eps": 1e-5,
            "rope_theta": 10000.0,
            "tie_word_embeddings": true,
            "initializer_range": 0.02,
            "bos_token_id": bos.1,
            "eos_token_id": eos.1,
            "torch_dtype": "float32",
        });
        let tok_config = serde_json::json!({"bos_token": bos.0, "eos_token": eos.0, "model_max_length": self.max_positions});
        let gen_config = serde_json::json!({"bos_token_id": bos.1, "eos_token_id": eos.1});
        for (name, value) in [
            ("config.json", config),
            ("tokenizer_config.json", tok_config),
            ("generation_config.json", gen_config),
        ] {
            std::fs::write(dir.join(name), serde_json::to_vec_pretty(&value)?)
                .with_context(|| format!("writing {}", dir.join(name).display()))?;
        }
        std::fs::write(dir.join("tokenizer.json"), text)
            .with_context(|| format!("writing {}", dir.join("tokenizer.json").display()))?;
        Ok(dir.to_path_buf())
    }
}
