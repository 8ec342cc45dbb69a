//! `synthetic`: a tiny BERT learning a sentiment-like rule on generated token sequences.
//!
//! Sequences are `[CLS]` plus 6–15 tokens (padded to 16, with an attention mask); tokens
//! `2..66` are "positive" words and `66..128` "negative" ones. Each sequence has a label, and
//! three words in four come from the label's half of the vocabulary, so the label is usually —
//! not always — the majority kind. A real learning problem (attention has to pool evidence
//! over the sequence), fast enough for tests, needing no files.

use anyhow::Result;
use rand::{Rng, SeedableRng};
use tch::{nn, Kind, Tensor};
use trainbook_engine::{Device, OnDeviceOf};

use crate::models::encoder::{EncoderConfig, SequenceClassifier};
use trainbook_api::Hyper;
use trainbook_api::{JobSpec, OptimizerKind};
use trainbook_engine::{Recipe, Split, Step};

const VOCAB: i64 = 128;
const SEQ: i64 = 16;
/// The data never changes with the training seed: runs with different seeds see the same task.
const DATA_SEED: u64 = 20_240_601;

struct Data {
    ids: Tensor,
    mask: Tensor,
    labels: Tensor,
}

fn generate(n: usize, seed: u64, device: Device) -> Result<Data> {
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let mut ids = vec![0i64; n * SEQ as usize];
    let mut mask = vec![0i64; n * SEQ as usize];
    let mut labels = Vec::with_capacity(n);
    for i in 0..n {
        let row = &mut ids[i * SEQ as usize..(i + 1) * SEQ as usize];
        let mrow = &mut mask[i * SEQ as usize..(i + 1) * SEQ as usize];
        let len = rng.gen_range(7..=SEQ as usize);
        let label = rng.gen_range(0..2i64);
        row[0] = 1;
        mrow[0] = 1;
        for j in 1..len {
            // Three words in four come from the label's half of the vocabulary, like the
            // sentiment-bearing words of a review.
            let own = rng.gen_bool(0.75);
            let positive = (label == 1) == own;
            row[j] = if positive {
                rng.gen_range(2..66)
            } else {
                rng.gen_range(66..VOCAB)
            };
            mrow[j] = 1;
        }
        labels.push(label);
    }
    let n = n as i64;
    Ok(Data {
        ids: device.put(&Tensor::from_slice(&ids).view([n, SEQ]))?,
        mask: device.put(&Tensor::from_slice(&mask).view([n, SEQ]))?,
        labels: device.put(&Tensor::from_slice(&labels))?,
    })
}

pub struct Synthetic {
    vs: nn::VarStore,
    model: SequenceClassifier,
    train: Data,
    eval: Data,
}

/// Presets (the registry's table and the error below read this one list).
pub const PRESETS: &[(&str, &str)] = &[
    (
        "tiny",
        "a 2-layer hidden-64 BERT on 1,024 generated sequences (256 held out): seconds, for tests and CI",
    ),
    (
        "bench",
        "a 4-layer hidden-256 BERT on 4,096 sequences, for throughput measurements",
    ),
];

struct Preset {
    hyper: Hyper,
    train_len: usize,
    eval_len: usize,
    hidden: i64,
    layers: i64,
}

fn preset(name: &str) -> Result<Preset> {
    // AdamW: a post-LayerNorm BERT trained from scratch diverges or stalls under plain SGD at
    // any learning rate that makes progress in a few hundred steps (measured: lr 0.02 stalls at
    // chance, 0.1 diverges). `--optimizer sgd` stays available, e.g. for equivalence checks.
    let hyper = |epochs, batch, lr| Hyper {
        weight_decay: 0.01,
        ..Hyper::new(name, epochs, batch, lr, OptimizerKind::Adamw)
    };
    Ok(match name {
        // Seconds on a laptop CPU: tests and CI.
        "tiny" => Preset {
            hyper: hyper(2, 8, 1e-3),
            train_len: 1024,
            eval_len: 256,
            hidden: 64,
            layers: 2,
        },
        // A heavier model for throughput measurements.
        "bench" => Preset {
            hyper: hyper(1, 32, 1e-3),
            train_len: 4096,
            eval_len: 512,
            hidden: 256,
            layers: 4,
        },
        other => return Err(crate::unknown_preset("synthetic", other, PRESETS)),
    })
}

/// The job's preset (see [`trainbook_engine::PresetFn`]): `tiny` unless named. The
/// recipe has no options of its own.
pub fn resolve(spec: &JobSpec) -> Result<Hyper> {
    let _: NoOptions = spec.recipe_options()?;
    Ok(preset(spec.train.preset.as_deref().unwrap_or("tiny"))?.hyper)
}

/// The tiny BERT of a preset.
fn config(p: &Preset) -> EncoderConfig {
    EncoderConfig {
        hidden_size: p.hidden,
        num_hidden_layers: p.layers,
        num_attention_heads: (p.hidden / 16).max(1),
        intermediate_size: p.hidden * 2,
        ..EncoderConfig::tiny(VOCAB, SEQ)
    }
}

/// The memory plan's view of a synthetic job.
pub fn footprint(
    hyper: &Hyper,
    layout: &trainbook_engine::Layout,
) -> Result<trainbook_api::Footprint> {
    let p = preset(&hyper.preset)?;
    Ok(crate::models::encoder::plan_footprint(
        &config(&p),
        crate::models::encoder::Head::Classifier(2),
        SEQ as u64,
        hyper,
        layout,
    ))
}

/// The synthetic recipe's own options: none.
#[derive(Default, serde::Serialize, serde::Deserialize)]
struct NoOptions {}

impl Synthetic {
    pub fn build(hyper: &Hyper, device: Device) -> Result<Self> {
        // The model and data sizes are the preset's (not options).
        let p = preset(&hyper.preset)?;
        let bert = config(&p).with_dropout(hyper.dropout);
        tch::manual_seed(hyper.seed as i64);
        let mut vs = device.var_store();
        let mut model = SequenceClassifier::new(&vs.root(), &bert, 2);
        model.set_activation_checkpointing(
            hyper
                .activation_checkpointing
                .then_some(hyper.checkpoint_layers_every),
        );
        device.place_vars(&mut vs)?;
        // train_rows / eval_rows take the first rows of the preset's data (the generator is
        // sequential, so the first N rows are the same whatever N).
        let rows = |asked: Option<usize>, all: usize| asked.map_or(all, |n| n.min(all));
        let train = generate(rows(hyper.train_rows, p.train_len), DATA_SEED, device)?;
        let eval = generate(rows(hyper.eval_rows, p.eval_len), DATA_SEED + 1, device)?;
        Ok(Self {
            vs,
            model,
            train,
            eval,
        })
    }
}

impl Recipe for Synthetic {
    fn vars(&self) -> &nn::VarStore {
        &self.vs
    }
    fn vars_mut(&mut self) -> &mut nn::VarStore {
        &mut self.vs
    }
    fn train_len(&self) -> usize {
        self.train.labels.size()[0] as usize
    }
    fn eval_len(&self) -> usize {
        self.eval.labels.size()[0] as usize
    }
    fn step(&self, split: Split, indices: &[usize], train: bool) -> Result<Step> {
        let d = if split == Split::Train {
            &self.train
        } else {
            &self.eval
        };
        let idx: Vec<i64> = indices.iter().map(|&i| i as i64).collect();
        let idx = Tensor::from_slice(&idx).to_device_of(&d.ids);
        let ids = d.ids.index_select(0, &idx);
        let mask = d.mask.index_select(0, &idx);
        let logits = self.model.forward(&ids, Some(&mask), None, train);
        Ok(Step::classification(
            logits.to_kind(Kind::Float),
            d.labels.index_select(0, &idx),
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn train_and_eval_rows_take_the_first_generated_rows() {
        let mut h = preset("tiny").unwrap().hyper;
        (h.train_rows, h.eval_rows) = (Some(100), Some(0));
        let r = Synthetic::build(&h, Device::Cpu).unwrap();
        assert_eq!((r.train_len(), r.eval_len()), (100, 0));
        let all = generate(1024, DATA_SEED, Device::Cpu).unwrap();
        assert!(r.train.ids.equal(&all.ids.narrow(0, 0, 100)));
        h.train_rows = Some(5000);
        assert_eq!(Synthetic::build(&h, Device::Cpu).unwrap().train_len(), 1024);
    }
}
