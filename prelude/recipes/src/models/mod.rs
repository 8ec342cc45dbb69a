//! Model definitions, one file per model family, the pieces they share (attention and its
//! key/value cache, rotary positions, RMSNorm, LoRA projections) and the checkpoint loading
//! they share.

pub mod albert;
pub mod attention;
pub mod bert;
pub mod causal_lm;
pub mod decoder;
pub mod distilbert;
pub mod electra;
pub mod encoder;
pub mod family;
pub mod generate;
pub mod gpt2;
pub mod llama;
pub mod lora;
pub mod resnet;
pub mod rms_norm;
pub mod roberta;
pub mod rotary;

use std::collections::HashMap;

use anyhow::{bail, Result};
use tch::{nn, Tensor};
use trainbook_engine::checkpoint::TensorFiles;

/// What loading a checkpoint into a model found.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct LoadReport {
    /// Model parameters the checkpoint did not have (they keep their fresh initialisation),
    /// including a replaced head whose shape differs from the checkpoint's.
    pub missing: Vec<String>,
    /// Checkpoint tensors the model has no place for (e.g. a pre-training head).
    pub unexpected: Vec<String>,
    /// Head tensors skipped because the model has another shape: (name, checkpoint, model).
    pub mismatched: Vec<(String, Vec<i64>, Vec<i64>)>,
}

impl LoadReport {
    /// Transformers' wording, so users recognise it.
    pub fn describe(&self, model: &str, checkpoint: &str) -> Option<String> {
        if self.missing.is_empty() {
            return None;
        }
        let mut msg = format!(
            "Some weights of {model} were not initialized from the model checkpoint at {checkpoint} and are newly initialized: {:?}",
            self.missing
        );
        for (name, was, now) in &self.mismatched {
            msg.push_str(&format!("\n- {name}: found shape {was:?} in the checkpoint and {now:?} in the model instantiated"));
        }
        msg.push_str("\nYou should probably TRAIN this model on a down-stream task to be able to use it for predictions and inference.");
        Some(msg)
    }
}

/// How a family's checkpoints map onto its variables.
pub struct LoadRules<'a> {
    /// A prefix the model's names have and some checkpoints lack (`bert.`).
    pub optional_prefix: Option<&'a str>,
    /// Checkpoint tensors that are not parameters and are never reported.
    pub ignored: &'a [&'a str],
    /// Name prefixes of a task head that may differ in shape (`fc.`): skipped and reported
    /// instead of failing, so a 1000-class checkpoint can start a 10-class model.
    pub replaceable_head: &'a [&'a str],
    /// Appended to a shape-mismatch error.
    pub mismatch_hint: &'a str,
}

/// A trained variable under `path` drawn from N(0, std²) in place: the numbers
/// `Init::Randn { mean: 0, stdev }` draws, without its two temporaries of the variable's size
/// (which a large embedding or head would add to the peak of building a model).
pub fn normal(path: &nn::Path, name: &str, dims: &[i64], std: f64) -> Tensor {
    let t = path.zeros(name, dims);
    tch::no_grad(|| {
        let _ = t.shallow_clone().normal_(0.0, std);
    });
    t
}

/// Where [`load_into`] takes a checkpoint's tensors from: tensors in memory, or safetensors
/// files read a tensor at a time (so loading holds the model and one tensor, not the files'
/// contents as well).
pub enum Source {
    Loaded(HashMap<String, Tensor>),
    /// The files, and the file's name of each tensor by the name the model uses.
    Files(TensorFiles, HashMap<String, String>),
}

impl From<HashMap<String, Tensor>> for Source {
    fn from(m: HashMap<String, Tensor>) -> Self {
        Source::Loaded(m)
    }
}

impl Source {
    /// The shape of the tensor the model names `name`, if there is one.
    fn shape(&self, name: &str) -> Option<Vec<i64>> {
        match self {
            Source::Loaded(m) => m.get(name).map(Tensor::size),
            Source::Files(files, names) => names.get(name).and_then(|s| files.shape(s)),
        }
    }

    /// Removes the tensor the model names `name` and returns it (of what `shape` said), or
    /// only its elements `[first, first + count)` flattened.
    fn take(&mut self, name: &str, range: Option<(i64, i64)>) -> Result<Tensor> {
        let whole = || anyhow::anyhow!("{name} was listed but is not there");
        match self {
            Source::Loaded(m) => {
                let t = m.remove(name).ok_or_else(whole)?;
                Ok(match range {
                    Some((first, count)) => t.reshape([-1]).narrow(0, first, count),
                    None => t,
                })
            }
            Source::Files(files, names) => {
                let stored = names.remove(name).ok_or_else(whole)?;
                match range {
                    Some((first, count)) => files.get_range(&stored, first, count),
                    None => files.get(&stored),
                }?
                .ok_or_else(whole)
            }
        }
    }

    /// Reads the tensor the model names `name` straight into `dst` where the files can (see
    /// [`TensorFiles::read_into`]), removing it; false otherwise.
    fn read_into(&mut self, name: &str, dst: &Tensor) -> Result<bool> {
        let Source::Files(files, names) = self else {
            return Ok(false);
        };
        let read = names
            .get(name)
            .map_or(Ok(false), |stored| files.read_into(stored, dst))?;
        if read {
            names.remove(name);
        }
        Ok(read)
    }

    /// Forgets the tensor the model names `name` (it was reported instead).
    fn forget(&mut self, name: &str) {
        match self {
            Source::Loaded(m) => {
                m.remove(name);
            }
            Source::Files(_, names) => {
                names.remove(name);
            }
        }
    }

    /// The names nothing took.
    fn rest(self) -> Vec<String> {
        match self {
            Source::Loaded(m) => m.into_keys().collect(),
            Source::Files(_, names) => names.into_keys().collect(),
        }
    }
}

/// Copies `tensors` into `vs` by name.
pub fn load_into(
    vs: &nn::VarStore,
    by_name: impl Into<Source>,
    origin: &str,
    rules: &LoadRules,
) -> Result<LoadReport> {
    let mut by_name = by_name.into();
    let mut report = LoadReport::default();
    let vars = vs.variables();
    let mut names: Vec<&String> = vars.keys().collect();
    names.sort();
    let unprefixed = |n: &str| {
        rules
            .optional_prefix
            .and_then(|p| n.strip_prefix(p))
            .map(str::to_string)
    };
    tch::no_grad(|| -> Result<()> {
        for name in names {
            let found = [Some(name.clone()), unprefixed(name)]
                .into_iter()
                .flatten()
                .find_map(|k| by_name.shape(&k).map(|s| (k, s)));
            let Some((key, shape)) = found else {
                report.missing.push(name.clone());
                continue;
            };
            let mut dst = vars[name].shallow_clone();
            if shape != dst.size() {
                if rules.replaceable_head.iter().any(|h| name.starts_with(h)) {
                    by_name.forget(&key);
                    report.missing.push(name.clone());
                    report.mismatched.push((name.clone(), shape, dst.size()));
                    continue;
                }
                bail!(
                    "{origin}: tensor {name} has shape {shape:?} but the model expects {:?}: {}",
                    dst.size(),
                    rules.mismatch_hint
                );
            }
            // A layer built sharded under ZeRO-3 reads only this rank's elements of it.
            let range = |first, count| by_name.take(&key, Some((first, count)));
            if trainbook_engine::sharded_build::fill(name, range)? {
                continue;
            }
            if by_name.read_into(&key, &dst)? {
                continue;
            }
            let src = by_name.take(&key, None)?;
            // copy_ crosses devices itself (tch cannot name an HPU destination).
            dst.copy_(&src.to_kind(dst.kind()));
        }
        Ok(())
    })?;
    let mut unexpected: Vec<String> = by_name
        .rest()
        .into_iter()
        .filter(|k| {
            !rules.ignored.iter().any(|i| {
                k == i || k.ends_with(&format!(".{i}")) || unprefixed(k).as_deref() == Some(*i)
            })
        })
        .collect();
    unexpected.sort();
    report.unexpected = unexpected;
    Ok(report)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_normal_variable_draws_what_init_randn_draws() {
        let vs = nn::VarStore::new(tch::Device::Cpu);
        tch::manual_seed(3);
        let ours = normal(&vs.root(), "a", &[64, 9], 0.02);
        tch::manual_seed(3);
        let init = nn::Init::Randn {
            mean: 0.0,
            stdev: 0.02,
        };
        let theirs = vs.root().var("b", &[64, 9], init);
        assert!(ours.requires_grad());
        assert!(ours.equal(&theirs));
    }
}
