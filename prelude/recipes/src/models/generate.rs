//! Text generation from a causal LM: the prompt once through the model (filling the key/value
//! cache), then one position per new token; greedy or sampled (temperature, top-k, top-p),
//! stopping at an end-of-sequence token.

use anyhow::{bail, Result};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use tch::{Device, Kind, Tensor};

use super::attention::KvCache;
use super::decoder::CausalLm;

/// How the next token is chosen.
#[derive(Clone, Debug, PartialEq)]
pub struct Sampling {
    /// Always the most likely token (the other fields are ignored).
    pub greedy: bool,
    pub temperature: f64,
    /// Only the k most likely tokens (0: all).
    pub top_k: i64,
    /// Only the most likely tokens whose probabilities add up to p (1.0: all).
    pub top_p: f64,
    /// Seeds the draws (generation's own generator: torch's global one is left alone).
    pub seed: u64,
}

impl Default for Sampling {
    fn default() -> Self {
        Self {
            greedy: true,
            temperature: 1.0,
            top_k: 0,
            top_p: 1.0,
            seed: 0,
        }
    }
}

impl Sampling {
    pub fn check(&self) -> Result<()> {
        if self.greedy {
            return Ok(());
        }
        if !(self.temperature > 0.0 && self.temperature.is_finite()) {
            bail!(
                "temperature {} must be above 0 (use --greedy for the most likely tokens)",
                self.temperature
            );
        }
        if !(self.top_p > 0.0 && self.top_p <= 1.0) {
            bail!("top_p {} must be in (0, 1]", self.top_p);
        }
        if self.top_k < 0 {
            bail!("top_k {} must be 0 (all tokens) or more", self.top_k);
        }
        Ok(())
    }

    /// The next token of the last position's logits (vocab,), drawn with `rng` when sampling:
    /// a generator of its own, so a seed repeats whatever else draws from torch's.
    fn pick(&self, logits: &Tensor, rng: &mut StdRng) -> i64 {
        let logits = logits.to_kind(Kind::Float);
        if self.greedy {
            return logits.argmax(-1, false).int64_value(&[]);
        }
        let mut scores = logits / self.temperature;
        let vocab = scores.size()[0];
        if self.top_k > 0 && self.top_k < vocab {
            let (top, _) = scores.topk(self.top_k, -1, true, true);
            let kth = top.get(self.top_k - 1);
            scores = scores.masked_fill(&scores.lt_tensor(&kth), f64::NEG_INFINITY);
        }
        if self.top_p < 1.0 {
            let (sorted, order) = scores.sort(-1, true);
            let probs = sorted.softmax(-1, Kind::Float);
            // Drop a token when the ones before it already reach p (the first always stays).
            let before = probs.cumsum(-1, Kind::Float) - &probs;
            let drop_sorted = before.ge(self.top_p);
            let drop = drop_sorted.zeros_like().scatter(-1, &order, &drop_sorted);
            scores = scores.masked_fill(&drop, f64::NEG_INFINITY);
        }
        let probs: Vec<f32> =
            Vec::try_from(scores.softmax(-1, Kind::Float).to_device(tch::Device::Cpu))
                .expect("probabilities are float32");
        let mut left = rng.gen::<f32>() * probs.iter().sum::<f32>();
        for (i, p) in probs.iter().enumerate() {
            left -= p;
            if left <= 0.0 && *p > 0.0 {
                return i as i64;
            }
        }
        probs.iter().rposition(|&p| p > 0.0).unwrap_or(0) as i64
    }
}

/// Generates up to `max_new` tokens after `prompt`, calling `on_token` with each as it comes;
/// stops after a token of `stop`. Returns the new tokens (a stop token included, as
/// `transformers`' `generate` does).
pub fn generate(
    model: &dyn CausalLm,
    prompt: &[i64],
    max_new: usize,
    sampling: &Sampling,
    stop: &[i64],
    device: Device,
    on_token: &mut dyn FnMut(i64) -> Result<()>,
) -> Result<Vec<i64>> {
    if prompt.is_empty() {
        bail!("the prompt has no tokens: give some text (or a tokenizer that adds a beginning-of-sequence token)");
    }
    sampling.check()?;
    let mut rng = StdRng::seed_from_u64(sampling.seed);
    tch::no_grad(|| {
        let mut cache = KvCache::new(model.layers().len());
        let mut input = Tensor::from_slice(prompt).view([1, -1]).to_device(device);
        let mut out = Vec::with_capacity(max_new);
        for _ in 0..max_new {
            let hidden = model.hidden(&input, Some(&mut cache), false);
            let last = hidden.select(1, -1).squeeze_dim(0);
            let next = sampling.pick(&model.logits(&last), &mut rng);
            out.push(next);
            on_token(next)?;
            if stop.contains(&next) {
                break;
            }
            input = Tensor::from_slice(&[next]).view([1, 1]).to_device(device);
        }
        Ok(out)
    })
}

/// Text that grows as tokens come: each new token's text is what decoding all of them adds
/// (byte-level tokenizers split characters across tokens, so a token alone may decode to
/// nothing or to half a character).
pub struct Detokenizer<'a> {
    tokenizer: &'a tokenizers::Tokenizer,
    ids: Vec<u32>,
    shown: usize,
}

impl<'a> Detokenizer<'a> {
    pub fn new(tokenizer: &'a tokenizers::Tokenizer) -> Self {
        Self {
            tokenizer,
            ids: Vec::new(),
            shown: 0,
        }
    }

    /// The text `id` adds (empty while a character is incomplete).
    pub fn push(&mut self, id: i64) -> Result<String> {
        self.ids.push(id as u32);
        let text = self
            .tokenizer
            .decode(&self.ids, true)
            .map_err(|e| anyhow::anyhow!("decoding the generated tokens: {e}"))?;
        if text.ends_with('\u{FFFD}')
            || text.len() < self.shown
            || !text.is_char_boundary(self.shown)
        {
            return Ok(String::new());
        }
        let new = text[self.shown..].to_string();
        self.shown = text.len();
        Ok(new)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sampled(top_k: i64, top_p: f64) -> Sampling {
        Sampling {
            greedy: false,
            temperature: 0.7,
            top_k,
            top_p,
            seed: 3,
        }
    }

    #[test]
    fn top_k_of_one_and_a_tiny_top_p_are_greedy_and_seeds_repeat() {
        let logits = Tensor::from_slice(&[0.1f32, 2.0, 1.9, -1.0, 0.5]);
        let mut rng = StdRng::seed_from_u64(9);
        for s in [sampled(1, 1.0), sampled(0, 0.01)] {
            for _ in 0..20 {
                assert_eq!(s.pick(&logits, &mut rng), 1, "{s:?}");
            }
        }
        // Top-2 keeps tokens 1 and 2 only; the same seed draws the same tokens.
        let draw = || {
            let mut rng = StdRng::seed_from_u64(5);
            (0..50)
                .map(|_| sampled(2, 1.0).pick(&logits, &mut rng))
                .collect::<Vec<_>>()
        };
        let (a, b) = (draw(), draw());
        assert_eq!(a, b);
        assert!(
            a.iter().all(|&t| t == 1 || t == 2) && a.contains(&2),
            "{a:?}"
        );
        assert!(sampled(0, 1.5).check().is_err() && sampled(-1, 1.0).check().is_err());
    }

    /// Text grows by what each token adds, a character split over two byte-level tokens
    /// appearing once both are in.
    #[test]
    fn the_detokenizer_shows_whole_characters_as_they_complete() {
        let dir = std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR"))
            .join("../../tests/fixtures/causal_lm/gpt2/tokenizer.json");
        let tok = tokenizers::Tokenizer::from_file(dir).unwrap();
        let ids: Vec<i64> = tok
            .encode("the café", false)
            .unwrap()
            .get_ids()
            .iter()
            .map(|&i| i as i64)
            .collect();
        let mut d = Detokenizer::new(&tok);
        let pieces: Vec<String> = ids.iter().map(|&i| d.push(i).unwrap()).collect();
        assert_eq!(pieces.concat(), "the café");
        assert!(pieces.iter().all(|p| !p.contains('\u{FFFD}')), "{pieces:?}");
    }
}
