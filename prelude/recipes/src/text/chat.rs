//! Fine-tuning examples for causal language models: jsonl records (prompt/completion pairs or
//! chat conversations) turned into token ids and loss labels. Only the answer is learnt: labels
//! are the ids on the completion or the assistant turns and [`IGNORE_INDEX`] elsewhere,
//! unshifted (the model shifts them). Conversations are written out by the tokenizer's own chat
//! template (Jinja, rendered as Hugging Face renders it) so that training sees the text the model
//! will see when served.

use std::path::Path;

use anyhow::{anyhow, bail, Context, Result};
use minijinja::value::{Serde, Value};
use minijinja::{Environment, Error as JinjaError, ErrorKind};

use crate::models::encoder::IGNORE_INDEX;

/// One encoded example: `labels[i] == ids[i]` where the loss applies, [`IGNORE_INDEX`]
/// elsewhere.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Example {
    pub ids: Vec<i64>,
    pub labels: Vec<i64>,
}

#[derive(serde::Deserialize, serde::Serialize, Clone, Debug, PartialEq)]
pub struct Message {
    pub role: String,
    pub content: String,
}

/// One jsonl record: `{"prompt": "...", "completion": "..."}` or
/// `{"messages": [{"role": "...", "content": "..."}, ...]}` (other keys are ignored).
#[derive(Clone, Debug, PartialEq)]
pub enum Record {
    PromptCompletion { prompt: String, completion: String },
    Chat { messages: Vec<Message> },
}

const FORMS: &str = r#"{"prompt": "...", "completion": "..."} or {"messages": [{"role": "...", "content": "..."}, ...]}"#;

/// The records of a jsonl file, blank lines skipped. Errors name `file:line`; a file mixing the
/// two forms is refused (one dataset, one way of computing the loss).
pub fn read_jsonl(path: &Path) -> Result<Vec<Record>> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    let mut records = Vec::new();
    let mut first: Option<(usize, bool)> = None; // (line, is_chat) of the first record
    for (n, line) in text.lines().enumerate().map(|(i, l)| (i + 1, l)) {
        if line.trim().is_empty() {
            continue;
        }
        let at = format!("{}:{n}", path.display());
        let record = parse_record(line).map_err(|e| anyhow!("{at}: {e}"))?;
        let is_chat = matches!(record, Record::Chat { .. });
        match first {
            None => first = Some((n, is_chat)),
            Some((line0, chat0)) if chat0 != is_chat => {
                let kind = |chat: bool| ["prompt/completion", "messages"][usize::from(chat)];
                bail!(
                    "{at} is a {} record but line {line0} is a {} one: a file holds one form; split it in two",
                    kind(is_chat),
                    kind(chat0)
                );
            }
            _ => {}
        }
        records.push(record);
    }
    Ok(records)
}

fn parse_record(line: &str) -> Result<Record, String> {
    let value: serde_json::Value = serde_json::from_str(line)
        .map_err(|e| format!("not JSON ({e}): each line holds {FORMS}"))?;
    let obj = value
        .as_object()
        .ok_or_else(|| format!("not a JSON object: each line holds {FORMS}"))?;
    let (prompt, completion, messages) = (
        obj.get("prompt"),
        obj.get("completion"),
        obj.get("messages"),
    );
    match (prompt, completion, messages) {
        (Some(p), Some(c), None) => match (p.as_str(), c.as_str()) {
            (Some(p), Some(c)) => Ok(Record::PromptCompletion {
                prompt: p.to_string(),
                completion: c.to_string(),
            }),
            _ => Err("\"prompt\" and \"completion\" must be strings".into()),
        },
        (None, None, Some(m)) => {
            let messages: Vec<Message> = serde_json::from_value(m.clone()).map_err(|e| {
                format!("\"messages\" must be a list of {{\"role\": string, \"content\": string}} ({e})")
            })?;
            Ok(Record::Chat { messages })
        }
        _ => {
            let keys: Vec<&str> = obj.keys().map(String::as_str).collect();
            Err(format!(
                "expected {FORMS}, one of the two, not the keys [{}]",
                keys.join(", ")
            ))
        }
    }
}

/// A tokenizer's chat template, ready to render conversations.
#[derive(Clone, Debug)]
pub struct ChatTemplate {
    env: Environment<'static>,
    /// Where the template came from, for errors.
    origin: String,
    bos_token: Option<String>,
    eos_token: Option<String>,
    /// Roles a conversation may use (see [`template_roles`]).
    roles: Vec<String>,
    /// `bos_token`/`eos_token` when the template uses them but they are unknown: the likely
    /// cause of a failing render.
    unset: Vec<&'static str>,
}

/// The detail of the error `raise_exception` raises, to tell it from the template's other errors.
const RAISED: &str = "raise_exception: ";

impl ChatTemplate {
    /// The chat template of a Hugging Face model directory: `chat_template` of
    /// `tokenizer_config.json` (a string, or a list of `{"name", "template"}` of which the one
    /// named `default` is used), else a `chat_template.jinja` beside it (where newer
    /// transformers save it). `bos_token`/`eos_token` come from `tokenizer_config.json`
    /// (strings or AddedToken objects). `Ok(None)` when there is no template: the caller decides
    /// whether that is an error (base models have none).
    pub fn from_model_dir(dir: &Path) -> Result<Option<Self>> {
        let config_path = dir.join("tokenizer_config.json");
        let config: serde_json::Value = match std::fs::read(&config_path) {
            Ok(bytes) => serde_json::from_slice(&bytes)
                .with_context(|| format!("{} is not valid JSON", config_path.display()))?,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => serde_json::Value::Null,
            Err(e) => return Err(e).with_context(|| format!("reading {}", config_path.display())),
        };
        let token = |key: &str| match config.get(key) {
            Some(serde_json::Value::String(s)) => Some(s.clone()),
            Some(v) => v.get("content").and_then(|c| c.as_str()).map(String::from),
            None => None,
        };
        let (bos, eos) = (token("bos_token"), token("eos_token"));
        let (source, origin) = match config.get("chat_template") {
            Some(serde_json::Value::String(s)) => {
                (s.clone(), format!("the chat template of {}", config_path.display()))
            }
            Some(serde_json::Value::Array(list)) => {
                let named = |e: &serde_json::Value| e.get("name").and_then(|n| n.as_str()).map(String::from);
                let default = list.iter().find(|e| named(e).as_deref() == Some("default"));
                let Some(t) = default.and_then(|e| e.get("template")).and_then(|t| t.as_str()) else {
                    let names: Vec<String> = list.iter().filter_map(named).collect();
                    bail!(
                        "{}: chat_template lists the templates [{}] but none named \"default\" with a string template: add one",
                        config_path.display(),
                        names.join(", ")
                    );
                };
                (t.to_string(), format!("the \"default\" chat template of {}", config_path.display()))
            }
            Some(serde_json::Value::Null) | None => {
                let jinja = dir.join("chat_template.jinja");
                match std::fs::read_to_string(&jinja) {
                    Ok(s) => (s, format!("the chat template {}", jinja.display())),
                    Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
                    Err(e) => return Err(e).with_context(|| format!("reading {}", jinja.display())),
                }
            }
            Some(other) => bail!(
                "{}: chat_template is {other}, expected a string or a list of {{\"name\", \"template\"}}",
                config_path.display()
            ),
        };
        Self::build(&source, bos, eos, origin).map(Some)
    }

    /// A template from its Jinja source.
    pub fn from_source(
        template: &str,
        bos_token: Option<&str>,
        eos_token: Option<&str>,
    ) -> Result<Self> {
        Self::build(
            template,
            bos_token.map(String::from),
            eos_token.map(String::from),
            "the given chat template".into(),
        )
    }

    fn build(
        source: &str,
        bos: Option<String>,
        eos: Option<String>,
        origin: String,
    ) -> Result<Self> {
        let mut env = Environment::new();
        // As transformers' environment: blocks take their newline and indentation with them.
        env.set_syntax(
            minijinja::syntax::SyntaxConfig::builder()
                .trim_blocks(true)
                .lstrip_blocks(true)
                .build()
                .context("configuring Jinja's syntax")?,
        );
        env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
        env.add_function(
            "raise_exception",
            |msg: String| -> Result<Value, JinjaError> {
                Err(JinjaError::new(
                    ErrorKind::InvalidOperation,
                    format!("{RAISED}{msg}"),
                ))
            },
        );
        env.add_function("strftime_now", |fmt: String| strftime_now(&fmt));
        env.add_template_owned("chat_template", source.to_string())
            .map_err(|e| anyhow!("{origin} does not parse as Jinja: {e}"))?;
        let mut roles: Vec<String> = ["system", "user", "assistant"].map(String::from).to_vec();
        for r in template_roles(source) {
            if !roles.contains(&r) {
                roles.push(r);
            }
        }
        let unset = [("bos_token", &bos), ("eos_token", &eos)]
            .into_iter()
            .filter(|(key, token)| token.is_none() && source.contains(key))
            .map(|(key, _)| key)
            .collect();
        Ok(Self {
            env,
            origin,
            bos_token: bos,
            eos_token: eos,
            roles,
            unset,
        })
    }

    /// The roles a conversation may use: system, user, assistant, and any word the template
    /// compares `role` against (Llama 3's template writes out any role, so the template alone
    /// would not catch a typo).
    pub fn roles(&self) -> &[String] {
        &self.roles
    }

    /// The conversation as the template writes it. The context holds `messages`,
    /// `add_generation_prompt`, and `bos_token`/`eos_token` when known; `raise_exception(msg)`,
    /// `strftime_now(fmt)` (UTC) and Python's string and dict methods are available.
    pub fn render(&self, messages: &[Message], add_generation_prompt: bool) -> Result<String> {
        let mut ctx = serde_json::json!({
            "messages": messages,
            "add_generation_prompt": add_generation_prompt,
        });
        // A token the config lacks stays undefined, as in transformers.
        for (key, token) in [
            ("bos_token", &self.bos_token),
            ("eos_token", &self.eos_token),
        ] {
            if let Some(t) = token {
                ctx[key] = t.as_str().into();
            }
        }
        let rendered = self
            .env
            .get_template("chat_template")
            .and_then(|t| t.render(Value::from(Serde(&ctx))));
        rendered.map_err(|e| match e.detail().and_then(|d| d.strip_prefix(RAISED)) {
            Some(msg) => anyhow!("{} refuses the conversation: {msg}", self.origin),
            None if self.unset.is_empty() => anyhow!("rendering {}: {e}", self.origin),
            None => anyhow!(
                "rendering {}: {e} (the template uses {}, which tokenizer_config.json does not set)",
                self.origin,
                self.unset.join(" and ")
            ),
        })
    }

    fn check_roles(&self, messages: &[Message]) -> Result<()> {
        for (i, m) in messages.iter().enumerate() {
            if !self.roles.contains(&m.role) {
                bail!(
                    "message {i} has the role {:?}, which {} does not know: allowed roles are {}",
                    m.role,
                    self.origin,
                    self.roles.join(", ")
                );
            }
        }
        Ok(())
    }
}

/// Role names a template compares `role` against: each quoted word in the source that follows
/// `role ==`, `role !=` or `role in [...]` (e.g. `message['role'] == 'tool'`,
/// `message.role in ['ipython', 'tool']`). A plain scan, not a parse: it finds the comparisons
/// chat templates make, not every way of writing one (`'tool' == message.role` is missed).
fn template_roles(source: &str) -> Vec<String> {
    let mut found: Vec<String> = Vec::new();
    let bytes = source.as_bytes();
    let mut i = 0;
    while i < bytes.len() {
        let q = bytes[i];
        if q != b'\'' && q != b'"' {
            i += 1;
            continue;
        }
        let Some(len) = source[i + 1..].find(q as char) else {
            break;
        };
        let (start, end) = (i + 1, i + 1 + len);
        let word = &source[start..end];
        let is_word = !word.is_empty()
            && word.len() <= 32
            && word.starts_with(|c: char| c.is_ascii_alphabetic())
            && word
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-');
        if is_word
            && word != "role"
            && !found.iter().any(|f| f == word)
            && compared_before(&source[..i])
        {
            found.push(word.to_string());
        }
        i = end + 1;
    }
    found
}

/// Whether the text before a literal ends in `role == `, `role != ` or `role in [..., `.
fn compared_before(before: &str) -> bool {
    let mut from = before.len().saturating_sub(64);
    while !before.is_char_boundary(from) {
        from += 1;
    }
    let window = &before[from..];
    let Some(at) = window.rfind("role") else {
        return false;
    };
    let rest = window[at + 4..].trim_start_matches(['\'', '"', ']', ')', ' ']);
    let Some(rest) = ["==", "!=", "not in", "in"]
        .iter()
        .find_map(|op| rest.strip_prefix(op))
    else {
        return false;
    };
    rest.chars()
        .all(|c| c.is_ascii_alphanumeric() || " [(,'\"_-".contains(c))
}

/// `strftime` of the current UTC time, as transformers' `strftime_now` (which uses local time).
fn strftime_now(fmt: &str) -> String {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs() as i64)
        .unwrap_or(0);
    strftime(fmt, now)
}

/// `strftime` of a Unix time (UTC) for the directives chat templates use (`%d %b %Y` and the
/// like: Y m d H M S b B a A %); others are kept as written.
fn strftime(fmt: &str, secs: i64) -> String {
    const MONTHS: &str =
        "January February March April May June July August September October November December";
    const DAYS: &str = "Sunday Monday Tuesday Wednesday Thursday Friday Saturday";
    let days = secs.div_euclid(86_400);
    let rem = secs.rem_euclid(86_400);
    let (y, m, d) = civil_from_days(days);
    let month = MONTHS.split(' ').nth((m - 1) as usize).unwrap_or("");
    // 1970-01-01 was a Thursday.
    let weekday = DAYS
        .split(' ')
        .nth((days + 4).rem_euclid(7) as usize)
        .unwrap_or("");
    let mut out = String::new();
    let mut chars = fmt.chars();
    while let Some(c) = chars.next() {
        if c != '%' {
            out.push(c);
            continue;
        }
        match chars.next() {
            Some('Y') => out += &y.to_string(),
            Some('m') => out += &format!("{m:02}"),
            Some('d') => out += &format!("{d:02}"),
            Some('H') => out += &format!("{:02}", rem / 3600),
            Some('M') => out += &format!("{:02}", rem % 3600 / 60),
            Some('S') => out += &format!("{:02}", rem % 60),
            Some('b') => out += &month[..3],
            Some('B') => out += month,
            Some('a') => out += &weekday[..3],
            Some('A') => out += weekday,
            Some('%') => out.push('%'),
            Some(other) => out.extend(['%', other]),
            None => out.push('%'),
        }
    }
    out
}

/// (year, month, day) of a day count since 1970-01-01 (Howard Hinnant's algorithm).
fn civil_from_days(days: i64) -> (i64, i64, i64) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    (yoe + era * 400 + i64::from(m <= 2), m, d)
}

/// Padding preset on the tokenizer would add tokens behind this module's back; truncation is
/// harmless when it keeps the start and cuts no shorter than `max_length` (`TextTokenizer`
/// truncates to its `max_length`).
fn check_tokenizer(tok: &tokenizers::Tokenizer, max_length: usize) -> Result<()> {
    if tok.get_padding().is_some() {
        bail!("the tokenizer pads by itself: clear that (with_padding(None)); examples are padded per batch");
    }
    if let Some(t) = tok.get_truncation() {
        if t.max_length < max_length || t.direction != tokenizers::TruncationDirection::Right {
            bail!(
                "the tokenizer truncates ({} tokens, {:?}) where max_length is {max_length}: clear that (with_truncation(None)); examples are cut to max_length here",
                t.max_length,
                t.direction
            );
        }
    }
    Ok(())
}

/// How many tokens the first `n` of `enc` are, for errors: "at least n" when the tokenizer's own
/// truncation may have cut `enc` there (tokenizers stops tokenizing at the limit, so how much was
/// cut is unknown).
fn count(tok: &tokenizers::Tokenizer, enc: &tokenizers::Encoding, n: usize) -> String {
    let cut = tok
        .get_truncation()
        .is_some_and(|t| enc.len() >= t.max_length);
    if n == enc.len() && cut {
        format!("at least {n}")
    } else {
        n.to_string()
    }
}

fn ids_of(enc: &tokenizers::Encoding) -> Vec<i64> {
    enc.get_ids().iter().map(|&i| i64::from(i)).collect()
}

/// A prompt/completion pair: the prompt encoded with the tokenizer's special tokens (e.g.
/// Llama's BOS), the completion without, then `eos` when given; labels on the completion and
/// the EOS only. A prompt that alone reaches `max_length` is refused (nothing would be left to
/// learn); a completion that runs past `max_length` is truncated to `max_length` tokens in all
/// (its EOS then falls off).
pub fn encode_prompt_completion(
    tok: &tokenizers::Tokenizer,
    prompt: &str,
    completion: &str,
    eos: Option<i64>,
    max_length: usize,
) -> Result<Example> {
    check_tokenizer(tok, max_length)?;
    let p = tok
        .encode(prompt, true)
        .map_err(|e| anyhow!("tokenizing the prompt: {e}"))?;
    let c = tok
        .encode(completion, false)
        .map_err(|e| anyhow!("tokenizing the completion: {e}"))?;
    let mut ids = ids_of(&p);
    if ids.len() >= max_length {
        bail!(
            "the prompt has {} tokens, max_length is {max_length}: raise max_length or shorten the prompt",
            count(tok, &p, ids.len())
        );
    }
    let mut labels = vec![IGNORE_INDEX; ids.len()];
    let answer: Vec<i64> = ids_of(&c).into_iter().chain(eos).collect();
    ids.extend(&answer);
    labels.extend(&answer);
    ids.truncate(max_length);
    labels.truncate(max_length);
    Ok(Example { ids, labels })
}

/// A conversation written out by `template` and encoded without adding special tokens (the
/// template writes them). Labels are on the assistant turns only: for assistant message `i`,
/// the text between `render(messages[..i], add_generation_prompt = true)` and
/// `render(messages[..=i], false)`, i.e. the answer and whatever closes the turn (Llama 3's
/// `<|eot_id|>`, ChatML's `<|im_end|>\n`). A token is labelled when its byte offsets lie wholly
/// inside such a span. Each partial render must be a prefix of the next (else the template is
/// not incremental and the turns cannot be located: an error).
///
/// The conversation needs an assistant message, and known roles ([`ChatTemplate::roles`]). When
/// the part before the last assistant turn alone reaches `max_length` the conversation is
/// refused; when the last answer runs past `max_length` it is truncated to `max_length` tokens
/// in all.
pub fn encode_chat(
    template: &ChatTemplate,
    tok: &tokenizers::Tokenizer,
    messages: &[Message],
    max_length: usize,
) -> Result<Example> {
    check_tokenizer(tok, max_length)?;
    template.check_roles(messages)?;
    let turns: Vec<usize> = (0..messages.len())
        .filter(|&i| messages[i].role == "assistant")
        .collect();
    if turns.is_empty() {
        bail!("the conversation has no assistant message: there is nothing to learn from it");
    }
    let full = template.render(messages, false)?;
    let not_incremental = |what: &str| {
        anyhow!(
            "{} is not incremental: {what}, so the assistant turns cannot be located in the conversation; use a template that renders a conversation's start the same whatever follows",
            template.origin
        )
    };
    let mut spans = Vec::with_capacity(turns.len());
    let mut done = 0; // end of the previous span: every render must extend it
    for &i in &turns {
        let before = template
            .render(&messages[..i], true)
            .with_context(|| format!("rendering the conversation up to assistant message {i}"))?;
        let after = template.render(&messages[..=i], false)?;
        if !after.starts_with(&before) || !full.starts_with(&after) || before.len() < done {
            return Err(not_incremental(&format!(
                "the rendering of messages 0..{i} with the generation prompt is not where the rendering of messages 0..={i} and of the whole conversation starts"
            )));
        }
        spans.push((before.len(), after.len()));
        done = after.len();
    }
    let enc = tok
        .encode(full.as_str(), false)
        .map_err(|e| anyhow!("tokenizing the rendered conversation: {e}"))?;
    let mut ids = ids_of(&enc);
    let offsets = enc.get_offsets();
    // The tokens before the last assistant turn: what the last answer is conditioned on.
    let last_start = spans.last().map_or(0, |s| s.0);
    let context_len = offsets.iter().take_while(|o| o.1 <= last_start).count();
    if context_len >= max_length {
        bail!(
            "the prompt (the conversation before its last assistant turn) has {} tokens, max_length is {max_length}: raise max_length or shorten the conversation",
            count(tok, &enc, context_len)
        );
    }
    // Where the encoding stops (the tokenizer's own truncation may stop it early).
    let reached = offsets.last().map_or(0, |o| o.1);
    let mut labels = vec![IGNORE_INDEX; ids.len()];
    for (n, &(start, end)) in spans.iter().enumerate() {
        let mut any = false;
        for (j, &(a, b)) in offsets.iter().enumerate() {
            if a >= start && b <= end && b > a {
                labels[j] = ids[j];
                any = true;
            }
        }
        if !any && end > start && start < reached {
            bail!(
                "assistant message {} covers no whole token once tokenized (every token there straddles the turn's edges): the tokenizer does not fit the chat template",
                turns[n]
            );
        }
    }
    ids.truncate(max_length);
    labels.truncate(max_length);
    Ok(Example { ids, labels })
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokenizers::processors::template::TemplateProcessing;
    use tokenizers::Tokenizer;

    /// Meta-Llama-3-8B-Instruct's chat template, verbatim from its tokenizer_config.json as
    /// stored in the GitHub repository YJiangcm/WebR, path
    /// Meta-Llama-3-8B-Instruct/tokenizer_config.json.
    const LLAMA3: &str = "{% set loop_messages = messages %}{% for message in loop_messages %}{% set content = '<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n'+ message['content'] | trim + '<|eot_id|>' %}{% if loop.index0 == 0 %}{% set content = bos_token + content %}{% endif %}{{ content }}{% endfor %}{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}{% endif %}";

    /// Qwen2-7B-Instruct's chat template (`chat_template` of Qwen/Qwen2-7B-Instruct's
    /// tokenizer_config.json). No stored copy of that file itself was found: the text is as
    /// quoted from it, with that attribution, in public fine-tuning notes, and identical in the
    /// commented-out `cfg.chat_template == "qwen2"` branch of a public evaluation script.
    const QWEN2: &str = "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}{{ '<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n' }}{% endif %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}";

    const SPECIALS: &[&str] = &[
        "<|begin_of_text|>",
        "<|end_of_text|>",
        "<|start_header_id|>",
        "<|end_header_id|>",
        "<|eot_id|>",
        "<|im_start|>",
        "<|im_end|>",
    ];

    /// A byte-level BPE without merges (one token per byte, ids 0..256 in byte-character order)
    /// plus the special tokens above (ids 256..): ids and offsets are predictable, and decoding
    /// gives the exact text back. With `bos`, encoding with special tokens prepends
    /// `<|begin_of_text|>` as Llama 3's tokenizer does.
    fn tokenizer(bos: bool) -> Tokenizer {
        let mut alphabet: Vec<char> = tokenizers::pre_tokenizers::byte_level::ByteLevel::alphabet()
            .into_iter()
            .collect();
        alphabet.sort();
        let vocab: serde_json::Map<String, serde_json::Value> = alphabet
            .iter()
            .enumerate()
            .map(|(i, c)| (c.to_string(), i.into()))
            .collect();
        let added: Vec<serde_json::Value> = SPECIALS
            .iter()
            .enumerate()
            .map(|(i, t)| {
                serde_json::json!({"id": 256 + i, "content": t, "single_word": false, "lstrip": false,
                    "rstrip": false, "normalized": false, "special": true})
            })
            .collect();
        let byte_level = serde_json::json!({"type": "ByteLevel", "add_prefix_space": false,
            "trim_offsets": false, "use_regex": true});
        let json = serde_json::json!({
            "version": "1.0", "truncation": null, "padding": null, "added_tokens": added,
            "normalizer": null, "pre_tokenizer": byte_level, "post_processor": null,
            "decoder": byte_level,
            "model": {"type": "BPE", "vocab": vocab, "merges": []},
        });
        let mut tok: Tokenizer = json.to_string().parse().unwrap();
        if bos {
            let tp = TemplateProcessing::builder()
                .try_single("<|begin_of_text|> $A")
                .unwrap()
                .special_tokens(vec![("<|begin_of_text|>", 256)])
                .build()
                .unwrap();
            tok.with_post_processor(Some(tp));
        }
        tok
    }

    fn id(tok: &Tokenizer, t: &str) -> i64 {
        i64::from(tok.token_to_id(t).unwrap())
    }

    /// The labelled stretches of an example, decoded; and labels equal ids where set.
    fn labelled(tok: &Tokenizer, ex: &Example) -> Vec<String> {
        assert_eq!(ex.ids.len(), ex.labels.len());
        let mut runs: Vec<Vec<u32>> = Vec::new();
        let mut prev = false;
        for (&i, &l) in ex.ids.iter().zip(&ex.labels) {
            let on = l != IGNORE_INDEX;
            if on {
                assert_eq!(l, i);
                if !prev {
                    runs.push(Vec::new());
                }
                runs.last_mut().unwrap().push(i as u32);
            }
            prev = on;
        }
        runs.iter().map(|r| tok.decode(r, false).unwrap()).collect()
    }

    fn msg(role: &str, content: &str) -> Message {
        Message {
            role: role.into(),
            content: content.into(),
        }
    }

    fn conversation() -> Vec<Message> {
        vec![
            msg("system", "You are terse."),
            msg("user", "Hi"),
            msg("assistant", "Hello!"),
            msg("user", "Bye"),
            msg("assistant", "Later."),
        ]
    }

    #[test]
    fn prompt_completion_labels_completion_and_eos() {
        let tok = tokenizer(true);
        let eos = id(&tok, "<|end_of_text|>");
        let ex = encode_prompt_completion(&tok, "Q: 2+2?", " 4", Some(eos), 64).unwrap();
        // BOS, 7 prompt bytes, 2 completion bytes, EOS.
        assert_eq!(ex.ids.len(), 1 + 7 + 2 + 1);
        assert_eq!(ex.ids[0], id(&tok, "<|begin_of_text|>"));
        assert_eq!(*ex.ids.last().unwrap(), eos);
        assert!(ex.labels[..8].iter().all(|&l| l == IGNORE_INDEX));
        assert_eq!(labelled(&tok, &ex), [" 4<|end_of_text|>"]);
    }

    #[test]
    fn completion_past_max_length_is_truncated_and_long_prompt_refused() {
        let tok = tokenizer(true);
        let eos = Some(id(&tok, "<|end_of_text|>"));
        let ex = encode_prompt_completion(&tok, "Q: 2+2?", " four", eos, 10).unwrap();
        assert_eq!(ex.ids.len(), 10);
        assert_eq!(labelled(&tok, &ex), [" f"]);
        let e = err(encode_prompt_completion(&tok, "Q: 2+2?", " 4", eos, 8));
        assert!(
            e.contains("the prompt has 8 tokens, max_length is 8"),
            "{e}"
        );
        // A tokenizer that truncates to max_length itself (as TextTokenizer does) is fine.
        let mut cut = tok.clone();
        let trunc = |max_length| tokenizers::TruncationParams {
            max_length,
            ..Default::default()
        };
        cut.with_truncation(Some(trunc(10))).unwrap();
        let same = encode_prompt_completion(&cut, "Q: 2+2?", " four", eos, 10).unwrap();
        assert_eq!(same, ex);
        let e = err(encode_prompt_completion(&cut, "Q: 2+2 = ?", " 4", eos, 10));
        assert!(
            e.contains("the prompt has at least 10 tokens, max_length is 10"),
            "{e}"
        );
        cut.with_truncation(Some(trunc(6))).unwrap();
        let e = err(encode_prompt_completion(&cut, "Q", " 4", eos, 8));
        assert!(
            e.contains("the tokenizer truncates (6 tokens, Right) where max_length is 8"),
            "{e}"
        );
    }

    #[test]
    fn llama3_chat_labels_assistant_turns_and_eot() {
        let tok = tokenizer(true);
        let t = ChatTemplate::from_source(LLAMA3, Some("<|begin_of_text|>"), Some("<|eot_id|>"))
            .unwrap();
        let text = t.render(&conversation(), false).unwrap();
        assert_eq!(
            text,
            "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nYou are terse.<|eot_id|>\
             <|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|>\
             <|start_header_id|>assistant<|end_header_id|>\n\nHello!<|eot_id|>\
             <|start_header_id|>user<|end_header_id|>\n\nBye<|eot_id|>\
             <|start_header_id|>assistant<|end_header_id|>\n\nLater.<|eot_id|>"
        );
        let ex = encode_chat(&t, &tok, &conversation(), 512).unwrap();
        assert_eq!(
            ex.ids[0],
            id(&tok, "<|begin_of_text|>"),
            "one BOS, from the template"
        );
        assert_ne!(ex.ids[1], id(&tok, "<|begin_of_text|>"));
        assert_eq!(
            labelled(&tok, &ex),
            ["Hello!<|eot_id|>", "Later.<|eot_id|>"]
        );
    }

    #[test]
    fn qwen2_chat_labels_assistant_turns_im_end_and_newline() {
        let tok = tokenizer(false);
        let t = ChatTemplate::from_source(QWEN2, None, Some("<|im_end|>")).unwrap();
        let ex = encode_chat(&t, &tok, &conversation(), 512).unwrap();
        assert_eq!(
            labelled(&tok, &ex),
            ["Hello!<|im_end|>\n", "Later.<|im_end|>\n"]
        );
        // Without a system message the template adds its own; the turns are still found.
        let ex = encode_chat(&t, &tok, &conversation()[1..], 512).unwrap();
        let text = tok
            .decode(&ex.ids.iter().map(|&i| i as u32).collect::<Vec<_>>(), false)
            .unwrap();
        assert!(
            text.starts_with("<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n"),
            "{text}"
        );
        assert_eq!(
            labelled(&tok, &ex),
            ["Hello!<|im_end|>\n", "Later.<|im_end|>\n"]
        );
    }

    #[test]
    fn chat_limits_refuse_long_context_and_truncate_the_answer() {
        let tok = tokenizer(false);
        let t = ChatTemplate::from_source(QWEN2, None, None).unwrap();
        let full = encode_chat(&t, &tok, &conversation(), 512).unwrap();
        // 8 tokens "Later." + <|im_end|> + "\n" close the conversation.
        let before_last = full.ids.len() - 8;
        let cut = encode_chat(&t, &tok, &conversation(), before_last + 3).unwrap();
        assert_eq!(cut.ids.len(), before_last + 3);
        assert_eq!(labelled(&tok, &cut), ["Hello!<|im_end|>\n", "Lat"]);
        let e = err(encode_chat(&t, &tok, &conversation(), before_last));
        assert!(
            e.contains(&format!(
                "has {before_last} tokens, max_length is {before_last}"
            )),
            "{e}"
        );
        // The same through a tokenizer that truncates there itself.
        let mut cut = tok.clone();
        let trunc = tokenizers::TruncationParams {
            max_length: before_last,
            ..Default::default()
        };
        cut.with_truncation(Some(trunc)).unwrap();
        let e = err(encode_chat(&t, &cut, &conversation(), before_last));
        assert!(
            e.contains(&format!("has at least {before_last} tokens")),
            "{e}"
        );
    }

    #[test]
    fn conversation_errors_are_named() {
        let tok = tokenizer(false);
        let t = ChatTemplate::from_source(LLAMA3, Some("<|begin_of_text|>"), None).unwrap();
        let mut bad = conversation();
        bad[1].role = "human".into();
        let e = err(encode_chat(&t, &tok, &bad, 512));
        assert!(
            e.contains("\"human\"") && e.contains("system, user, assistant"),
            "{e}"
        );
        let e = err(encode_chat(&t, &tok, &conversation()[..2], 512));
        assert!(e.contains("no assistant message"), "{e}");
        let strict = "{% if messages[0]['role'] != 'user' %}{{ raise_exception('Conversations start with the user') }}{% endif %}{% for m in messages %}{{ m.content }}{% endfor %}";
        let t = ChatTemplate::from_source(strict, None, None).unwrap();
        let e = err(encode_chat(&t, &tok, &conversation(), 512));
        assert!(
            e.contains("refuses the conversation: Conversations start with the user"),
            "{e}"
        );
        let last_differs = "{% for m in messages %}{% if loop.last %}[{{ m.content }}]{% else %}{{ m.content }}{% endif %}{% endfor %}";
        let t = ChatTemplate::from_source(last_differs, None, None).unwrap();
        let e = err(encode_chat(&t, &tok, &conversation()[1..], 512));
        assert!(e.contains("not incremental"), "{e}");
    }

    #[test]
    fn roles_the_template_compares_are_allowed() {
        let src = "{% if message['role'] == 'tool' %}{% elif message.role in ['ipython', \"function_call\"] %}{% endif %}{{ '<|im_start|>' + message['role'] + '\n' }}{% if x == 'other' %}{% endif %}";
        assert_eq!(template_roles(src), ["tool", "ipython", "function_call"]);
        assert_eq!(template_roles(LLAMA3), Vec::<String>::new());
        assert_eq!(template_roles(QWEN2), ["system"]);
    }

    #[test]
    fn pycompat_and_strftime() {
        let t = ChatTemplate::from_source(
            "{{ messages[0].content.strip().upper() }} {{ strftime_now('%Y') | length }}",
            None,
            None,
        )
        .unwrap();
        assert_eq!(t.render(&[msg("user", "  hi ")], false).unwrap(), "HI 4");
        assert_eq!(strftime("%d %b %Y", 0), "01 Jan 1970");
        assert_eq!(
            strftime("%Y-%m-%d %H:%M:%S %a %A %B %% %q", 1_709_211_845),
            "2024-02-29 13:04:05 Thu Thursday February % %q"
        );
    }

    /// `text` written to `name` in a fresh directory of this test run.
    fn write(dir: &str, name: &str, text: &str) -> std::path::PathBuf {
        let d = std::env::temp_dir().join(format!("trainbook-chat-{}-{dir}", std::process::id()));
        std::fs::create_dir_all(&d).unwrap();
        std::fs::write(d.join(name), text).unwrap();
        d.join(name)
    }

    fn err<T: std::fmt::Debug>(r: Result<T>) -> String {
        r.unwrap_err().to_string()
    }

    #[test]
    fn templates_from_model_dirs() {
        let cfg = write("none", "tokenizer_config.json", r#"{"bos_token": "<s>"}"#);
        assert!(ChatTemplate::from_model_dir(cfg.parent().unwrap())
            .unwrap()
            .is_none());

        let config = serde_json::json!({
            "bos_token": {"__type": "AddedToken", "content": "<|begin_of_text|>", "lstrip": false},
            "eos_token": "<|eot_id|>",
            "chat_template": [{"name": "tool_use", "template": "x"}, {"name": "default", "template": LLAMA3}],
        });
        let cfg = write("list", "tokenizer_config.json", &config.to_string());
        let t = ChatTemplate::from_model_dir(cfg.parent().unwrap())
            .unwrap()
            .unwrap();
        let text = t.render(&[msg("user", "Hi")], true).unwrap();
        assert!(
            text.starts_with("<|begin_of_text|><|start_header_id|>user"),
            "{text}"
        );

        write(
            "jinja",
            "tokenizer_config.json",
            r#"{"eos_token": "<|im_end|>"}"#,
        );
        let jinja = write("jinja", "chat_template.jinja", &format!("{QWEN2}\n"));
        let t = ChatTemplate::from_model_dir(jinja.parent().unwrap())
            .unwrap()
            .unwrap();
        let text = t.render(&[msg("user", "Hi")], true).unwrap();
        assert!(text.ends_with("<|im_start|>assistant\n"), "{text}");

        let bad = r#"{"chat_template": [{"name": "rag", "template": "x"}]}"#;
        let cfg = write("bad-list", "tokenizer_config.json", bad);
        let e = err(ChatTemplate::from_model_dir(cfg.parent().unwrap()));
        assert!(e.contains("[rag]") && e.contains("default"), "{e}");
    }

    #[test]
    fn jsonl_records_and_their_errors() {
        let pc = |p: &str, c: &str| Record::PromptCompletion {
            prompt: p.into(),
            completion: c.into(),
        };
        let good = write(
            "jsonl",
            "good.jsonl",
            "{\"prompt\": \"a\", \"completion\": \"b\", \"id\": 1}\n\n{\"prompt\": \"c\", \"completion\": \"d\"}\n",
        );
        assert_eq!(read_jsonl(&good).unwrap(), [pc("a", "b"), pc("c", "d")]);
        let chat = write(
            "jsonl",
            "chat.jsonl",
            r#"{"messages": [{"role": "user", "content": "hi"}]}"#,
        );
        let messages = vec![msg("user", "hi")];
        assert_eq!(read_jsonl(&chat).unwrap(), [Record::Chat { messages }]);

        let pair = "{\"prompt\": \"a\", \"completion\": \"b\"}\n";
        let e = err(read_jsonl(&write(
            "jsonl",
            "neither.jsonl",
            &format!("{pair}{{\"text\": \"x\"}}\n"),
        )));
        assert!(
            e.contains("neither.jsonl:2: expected {\"prompt\"") && e.contains("{\"messages\""),
            "{e}"
        );
        let e = err(read_jsonl(&write(
            "jsonl",
            "mixed.jsonl",
            &format!("{pair}{{\"messages\": []}}\n"),
        )));
        assert!(e.contains("mixed.jsonl:2") && e.contains("one form"), "{e}");
        let null = r#"{"messages": [{"role": "user", "content": null}]}"#;
        let e = err(read_jsonl(&write("jsonl", "null.jsonl", null)));
        assert!(
            e.contains("null.jsonl:1") && e.contains("\"content\": string"),
            "{e}"
        );
    }
}
