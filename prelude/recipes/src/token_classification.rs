//! `token-classification`: a tag per word (named entities, part-of-speech) with any encoder
//! family, from CoNLL files (`token TAB tag`, a blank line between sentences) or jsonl
//! (`{"tokens": [...], "tags": [...]}`). Each word's tag is learnt on its first word piece
//! (the others are ignored by the loss), as Transformers' run_ner.py does. Each epoch reports
//! word-level accuracy and, for BIO tag sets, entity precision, recall and F1 as seqeval counts
//! them, over the whole evaluation set.
//!
//! Presets:
//! - `tiny`: a 2-layer random encoder of the offline model's family, 512/256 sentences of the
//!   Brown corpus's part-of-speech tags — seconds, for tests;
//! - `default`: the pretrained all-MiniLM-L6-v2 on 4,000/500 Brown sentences, 3 epochs.

use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use tch::{nn, Kind, Reduction, Tensor};
use trainbook_api::plumbing::settings::TextSettings;
use trainbook_api::{Hyper, JobSpec, OptimizerKind, Padding, TextOptions};
use trainbook_engine::{Device, Recipe, Split, Step};

use crate::encoder_job::{self, EncoderStart};
use crate::models::encoder::{EncoderConfig, TokenClassifier, IGNORE_INDEX};
use crate::text::entities::{self, EntityCounts};
use crate::text::tagged::{self, EncodedTags, TaggedSentence, TaggedSpan};
use crate::text::tokenizer::{Encoded, TextTokenizer};

/// Held out for evaluation when the data has no test file and no fraction is set.
const EVAL_FRACTION: f64 = 0.1;

pub const PRESETS: &[(&str, &str)] = &[
    ("tiny", "random 2-layer encoder, 512/256 Brown part-of-speech sentences at 64 tokens: seconds, for tests"),
    ("default", "pretrained all-MiniLM-L6-v2 on 4,000/500 Brown part-of-speech sentences, AdamW 1e-4, batch 16, 3 epochs"),
];

fn preset(name: &str) -> Result<(Hyper, TextSettings)> {
    let model = crate::assets::minilm_dir().display().to_string();
    let data = crate::assets::brown_pos_dir().display().to_string();
    let (epochs, lr, rows, random_init) = match name {
        "tiny" => (1, 1e-3, (512, 256), true),
        "default" => (3, 1e-4, (4000, 500), false),
        other => {
            return Err(crate::unknown_preset(
                "token-classification",
                other,
                PRESETS,
            ))
        }
    };
    let hyper = Hyper {
        model: Some(model),
        data: Some(data),
        train_rows: Some(rows.0),
        eval_rows: Some(rows.1),
        ..Hyper::new(name, epochs, 16, lr, OptimizerKind::Adamw)
    };
    let text = TextSettings {
        max_length: 64,
        padding: Padding::Dynamic,
        text_column: "tokens".into(),
        label_column: "tags".into(),
        text_pair_column: None,
        eval_fraction: None,
        eval_data: None,
        from_scratch: false,
        random_init,
    };
    Ok((hyper, text))
}

/// The preset with the job's options, the data read and checked (a CoNLL line without a tag,
/// tags neither BIO nor plain), before any worker starts.
pub fn resolve(spec: &JobSpec) -> Result<Hyper> {
    let name = spec
        .train
        .preset
        .clone()
        .unwrap_or_else(|| "default".into());
    let (mut hyper, text) = preset(&name)?;
    let options: TextOptions = spec.recipe_options()?;
    encoder_job::refuse_table_options(
        &options,
        "token-classification",
        "CoNLL or jsonl tokens and tags",
    )?;
    let mut text = text.with_overrides(&options);
    text.random_init &= spec.train.model.is_none();
    encoder_job::check(spec, &text)?;
    let data = spec.train.data.clone().or(hyper.data.clone());
    let data = data.context("token-classification needs data: a CoNLL or jsonl file, or a directory with train and test files")?;
    let files = encoder_job::data_files(Path::new(&data), &text, &DATA)?;
    let (train, eval) = read_sets(&files, text.eval_fraction)?;
    tag_names(&train, &eval)?;
    hyper.recipe_options = crate::settings_map(&text)?;
    Ok(hyper)
}

/// Where tagged sentences are.
const DATA: encoder_job::DataLayout = encoder_job::DataLayout {
    extensions: &["conll", "txt", "tsv", "jsonl", "json"],
    eval_stems: &["test", "validation", "dev"],
    train_name: "train.conll (or train.jsonl)",
    hint: "pass a CoNLL or jsonl file of tagged sentences (run `make setup` for the offline Brown part-of-speech data)",
};

/// Training and evaluation sentences: the evaluation file, else a fixed held-out share
/// (every k-th sentence, so the split is the same for every seed).
fn read_sets(
    files: &(PathBuf, Option<PathBuf>),
    fraction: Option<f64>,
) -> Result<(Vec<TaggedSentence>, Vec<TaggedSentence>)> {
    let all = tagged::read(&files.0)?;
    if all.is_empty() {
        bail!("{} has no tagged sentence", files.0.display());
    }
    Ok(match &files.1 {
        Some(eval) => (all, tagged::read(eval)?),
        None => encoder_job::hold_out(all, fraction, EVAL_FRACTION),
    })
}

/// The tag names (sorted, "O" first) of both sets; a tag set that mixes BIO tags with others
/// is refused, since its entities could not be scored.
fn tag_names(train: &[TaggedSentence], eval: &[TaggedSentence]) -> Result<Vec<String>> {
    let names = tagged::tag_set(&[train, eval].concat());
    let bio_like = names
        .iter()
        .any(|t| t.starts_with("B-") || t.starts_with("I-"));
    if bio_like {
        entities::check_bio(names.iter().map(String::as_str)).context(
            "the tags look like BIO entity tags (B-X, I-X) but not all are: fix them, or rename the B-/I- tags if they are not entities",
        )?;
    }
    Ok(names)
}

/// Whether the tags name entities (BIO), so entity scores are reported.
fn scores_entities(names: &[String]) -> bool {
    entities::has_entities(names.iter().map(String::as_str))
}

/// The memory plan: the encoder with a token head, `max_length` tokens.
pub fn footprint(
    hyper: &Hyper,
    layout: &trainbook_engine::Layout,
) -> Result<trainbook_api::Footprint> {
    let text: TextSettings = crate::settings(hyper)?;
    let dir = encoder_job::model_dir(hyper, "token-classification", &|_| {})?;
    let mut c = EncoderConfig::from_file(&dir.join("config.json"))?;
    let max_length = text.max_length.min(c.max_tokens() as usize);
    if text.random_init {
        c = c.tiny_of(max_length as i64);
    }
    Ok(crate::models::encoder::plan_footprint(
        &c,
        crate::models::encoder::Head::Classifier(2),
        max_length as u64,
        hyper,
        layout,
    ))
}

pub struct TaggingRecipe {
    vs: nn::VarStore,
    model: TokenClassifier,
    start: EncoderStart,
    tag_names: Vec<String>,
    entities: bool,
    train: Vec<EncodedTags>,
    eval: Vec<(EncodedTags, TaggedSentence)>,
    pad_id: i64,
    device: Device,
}

impl TaggingRecipe {
    pub fn build(hyper: &Hyper, device: Device, log: &dyn Fn(String)) -> Result<Self> {
        let text: TextSettings = crate::settings(hyper)?;
        let data = hyper
            .data
            .as_deref()
            .context("token-classification needs data")?;
        let files = encoder_job::data_files(Path::new(data), &text, &DATA)?;
        let (train, eval) = read_sets(&files, text.eval_fraction)?;
        let tag_names = tag_names(&train, &eval)?;
        let train: Vec<_> = train
            .into_iter()
            .take(hyper.train_rows.unwrap_or(usize::MAX))
            .collect();
        let eval: Vec<_> = eval
            .into_iter()
            .take(hyper.eval_rows.unwrap_or(usize::MAX))
            .collect();
        let entities = scores_entities(&tag_names);
        log(format!(
            "data: {} train / {} eval sentences from {}, {} tags{}",
            train.len(),
            eval.len(),
            files.0.display(),
            tag_names.len(),
            if entities {
                " (BIO: entity scores)"
            } else {
                " (word accuracy)"
            }
        ));
        let mut start = encoder_job::start(hyper, &text, "token-classification", log)?;
        start.config = start.config.clone().with_labels(&tag_names);
        tch::manual_seed(hyper.seed as i64);
        let mut vs = device.var_store();
        let mut model = TokenClassifier::new(&vs.root(), &start.config, tag_names.len() as i64);
        model.set_activation_checkpointing(
            hyper
                .activation_checkpointing
                .then_some(hyper.checkpoint_layers_every),
        );
        let class = start.config.family().classes.token;
        encoder_job::load(&vs, &start, &text, class, log)?;
        device.place_vars(&mut vs)?;
        let ids = tagged::label_ids(&tag_names);
        let tok = start.tokenizer.inner();
        let encoded = tagged::encode_all(tok, &train, &ids, start.max_length)?;
        if encoded.truncated_sentences > 0 {
            log(format!(
                "{} training sentences were longer than max_length {} tokens: {} words cut off (raise max_length to keep them)",
                encoded.truncated_sentences, start.max_length, encoded.dropped_words
            ));
        }
        let eval_encoded = tagged::encode_all(tok, &eval, &ids, start.max_length)?;
        Ok(Self {
            vs,
            model,
            pad_id: start.tokenizer.pad_id(),
            start,
            tag_names,
            entities,
            train: encoded.items,
            eval: eval_encoded.items.into_iter().zip(eval).collect(),
            device,
        })
    }

    /// Word-level tags of a batch's sentences, predicted and gold, for the words the model
    /// saw (truncation drops the rest from scoring, as it drops them from training).
    fn word_tags(
        &self,
        items: &[&(EncodedTags, TaggedSentence)],
        logits: &Tensor,
    ) -> Result<(Vec<Vec<String>>, Vec<Vec<String>>)> {
        let best = Vec::<Vec<i64>>::try_from(logits.argmax(-1, false).to_device(tch::Device::Cpu))?;
        let (mut gold, mut predicted) = (Vec::new(), Vec::new());
        for ((enc, sentence), row) in items.iter().zip(best) {
            let (mut g, mut p) = (Vec::new(), Vec::new());
            for (word, start) in enc.word_starts.iter().enumerate() {
                if let Some(t) = start {
                    g.push(sentence.tags[word].clone());
                    p.push(self.tag_names[row[*t] as usize].clone());
                }
            }
            gold.push(g);
            predicted.push(p);
        }
        Ok((gold, predicted))
    }
}

/// Pads a batch of sentences: ids, attention mask, type ids and labels (`IGNORE_INDEX` past
/// each sentence's end), (batch, longest) each.
fn collate(items: &[&EncodedTags], pad_id: i64) -> [Tensor; 4] {
    let [ids, mask, types] =
        encoder_job::pad(items.iter().map(|e| (&e.ids[..], &e.type_ids[..])), pad_id);
    let len = ids.size()[1] as usize;
    let mut labels = vec![IGNORE_INDEX; items.len() * len];
    for (r, e) in items.iter().enumerate() {
        labels[r * len..r * len + e.labels.len()].copy_from_slice(&e.labels);
    }
    let labels = Tensor::from_slice(&labels).view([items.len() as i64, len as i64]);
    [ids, mask, types, labels]
}

impl Recipe for TaggingRecipe {
    fn vars(&self) -> &nn::VarStore {
        &self.vs
    }
    fn vars_mut(&mut self) -> &mut nn::VarStore {
        &mut self.vs
    }
    fn train_len(&self) -> usize {
        self.train.len()
    }
    fn eval_len(&self) -> usize {
        self.eval.len()
    }
    fn step(&self, split: Split, indices: &[usize], train: bool) -> Result<Step> {
        let items: Vec<&EncodedTags> = match split {
            Split::Train => indices.iter().map(|&i| &self.train[i]).collect(),
            Split::Eval => indices.iter().map(|&i| &self.eval[i].0).collect(),
        };
        let d = self.device;
        let [ids, mask, types, labels] = collate(&items, self.pad_id);
        let logits = self
            .model
            .forward(
                &d.put(&ids)?,
                Some(&d.put(&mask)?),
                Some(&d.put(&types)?),
                train,
            )
            .to_kind(Kind::Float);
        let classes = self.tag_names.len() as i64;
        let loss = logits.view([-1, classes]).cross_entropy_loss::<Tensor>(
            &d.put(&labels.view([-1]))?,
            None,
            Reduction::Mean,
            IGNORE_INDEX,
            0.0,
        );
        let mut step = Step::loss(loss);
        if split == Split::Eval {
            let batch: Vec<_> = indices.iter().map(|&i| &self.eval[i]).collect();
            let (gold, predicted) = self.word_tags(&batch, &logits)?;
            if self.entities {
                let c = EntityCounts::of(&gold, &predicted)?;
                step = step
                    .ratio("token_accuracy", c.correct_tokens as f64, c.tokens as f64)
                    .ratio("entity_precision", c.correct as f64, c.predicted as f64)
                    .ratio("entity_recall", c.correct as f64, c.gold as f64)
                    .ratio(
                        "entity_f1",
                        2.0 * c.correct as f64,
                        (c.predicted + c.gold) as f64,
                    );
            } else {
                let pairs = gold.iter().flatten().zip(predicted.iter().flatten());
                let correct = pairs.clone().filter(|(g, p)| g == p).count();
                step = step.ratio("token_accuracy", correct as f64, pairs.count() as f64);
            }
        }
        Ok(step)
    }
    /// A directory the family's `…ForTokenClassification.from_pretrained` loads, with the
    /// tag names and the tokenizer files.
    fn save_files(&self, dir: &Path) -> Result<()> {
        let class = self.start.config.family().classes.token;
        crate::checkpoint::write_encoder_model(dir, &self.start.config, class, &self.start.dir)
    }
}

/// A trained token classifier, for tagging text in a cell:
/// `Tagger::load(result.last_checkpoint)?.predict("Ada Lovelace was born in London")?`.
pub struct Tagger {
    _vs: nn::VarStore,
    model: TokenClassifier,
    tokenizer: TextTokenizer,
    tags: Vec<String>,
    dir: PathBuf,
}

impl Tagger {
    /// Loads a checkpoint (or exported directory) of a token-classification job.
    pub fn load(dir: impl AsRef<Path>) -> Result<Self> {
        let dir = dir.as_ref();
        let config = EncoderConfig::from_file(&dir.join("config.json"))?;
        let tags = config.label_names()?;
        if tags.is_empty() {
            bail!("{}/config.json has no id2label: it is not a token-classification checkpoint (train one with `trainbook train token-classification`)", dir.display());
        }
        let tokenizer = TextTokenizer::from_model_dir(dir, config.max_tokens() as usize)?;
        let vs = nn::VarStore::new(tch::Device::Cpu);
        let model = TokenClassifier::new(&vs.root(), &config, tags.len() as i64);
        encoder_job::load_trained(&vs, dir, &config, "a fine-tuned token classifier")?;
        Ok(Self {
            _vs: vs,
            model,
            tokenizer,
            tags,
            dir: dir.to_path_buf(),
        })
    }
}

impl trainbook_api::plumbing::ports::TagModel for Tagger {
    /// The tag names, by label id.
    fn tags(&self) -> &[String] {
        &self.tags
    }

    fn checkpoint(&self) -> &Path {
        &self.dir
    }

    /// The tagged spans of `text`: entities (B-/I- runs) with their character offsets, or for
    /// a tag set without entities a span per word. Text past the model's length is not tagged.
    fn predict(&self, text: &str) -> Result<Vec<trainbook_api::TaggedSpan>> {
        let enc = tagged::encode_text(self.tokenizer.inner(), text, self.tokenizer.max_length())?;
        let ids: Vec<i64> = enc.get_ids().iter().map(|&i| i64::from(i)).collect();
        let types: Vec<i64> = enc.get_type_ids().iter().map(|&i| i64::from(i)).collect();
        let e = Encoded {
            ids,
            type_ids: types,
        };
        let b = self.tokenizer.pad(&[&e], Padding::Dynamic);
        let logits = tch::no_grad(|| {
            self.model.forward(
                &b.input_ids,
                Some(&b.attention_mask),
                Some(&b.token_type_ids),
                false,
            )
        })
        .to_kind(Kind::Float)
        .get(0);
        let (score, best) = logits.softmax(-1, Kind::Float).max_dim(-1, false);
        let best = Vec::<i64>::try_from(best)?;
        let score = Vec::<f32>::try_from(score)?;
        let tags: Vec<&str> = best
            .iter()
            .map(|&i| self.tags[i as usize].as_str())
            .collect();
        Ok(tagged::spans(text, &enc, &tags, Some(&score))?
            .into_iter()
            .map(|s: TaggedSpan| trainbook_api::TaggedSpan {
                kind: s.kind,
                text: s.text,
                start: s.start_char,
                end: s.end_char,
                score: s.score.map_or(f64::NAN, f64::from),
            })
            .collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sentence(words: &[&str], tags: &[&str]) -> TaggedSentence {
        TaggedSentence::new(
            words.iter().map(|w| w.to_string()).collect(),
            tags.iter().map(|t| t.to_string()).collect(),
        )
    }

    #[test]
    fn a_tag_set_that_mixes_bio_with_other_tags_is_refused() {
        let train = [sentence(&["Ada", "sings"], &["B-PER", "VERB"])];
        let e = format!("{:#}", tag_names(&train, &[]).unwrap_err());
        assert!(e.contains("VERB") && e.contains("BIO"), "{e}");
        let ok = [sentence(&["Ada", "Lovelace"], &["B-PER", "I-PER"])];
        assert_eq!(tag_names(&ok, &[]).unwrap(), ["B-PER", "I-PER"]);
        assert!(scores_entities(&tag_names(&ok, &[]).unwrap()));
        let pos = [sentence(&["the", "cat"], &["at", "nn"])];
        assert!(!scores_entities(&tag_names(&pos, &[]).unwrap()));
    }
}
