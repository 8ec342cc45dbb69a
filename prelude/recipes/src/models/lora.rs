//! Projections with optional low-rank adapters (LoRA): `y = x Wᵀ + b + (dropout(x) Aᵀ Bᵀ) ·
//! alpha / r`, the base `W`, `b` frozen and only `A` (r × in) and `B` (out × r) trained. `B`
//! starts at zero, so an adapter starts as the base model. Names and shapes are PEFT's
//! (`<module>.lora_A.weight`, `<module>.lora_B.weight`), so its adapters load in PEFT and
//! PEFT's load here.

use anyhow::{bail, Result};
use serde::{Deserialize, Serialize};
use tch::nn::{self, Init};
use tch::Tensor;

/// What to adapt and how.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct LoraSpec {
    pub rank: i64,
    pub alpha: f64,
    pub dropout: f64,
    /// Module names (or dotted suffixes, as PEFT matches them: `q_proj`, `attn.c_proj`).
    pub targets: Vec<String>,
}

impl LoraSpec {
    pub fn scale(&self) -> f64 {
        self.alpha / self.rank as f64
    }

    /// Whether the module at `path` (`model.layers.0.self_attn.q_proj`) is adapted.
    pub fn targets_module(&self, path: &str) -> bool {
        self.targets
            .iter()
            .any(|t| path == t || path.ends_with(&format!(".{t}")))
    }

    /// Every target must name at least one of the model's adaptable modules: a misspelt one
    /// would silently train nothing.
    pub fn check_targets(&self, adaptable: &[String]) -> Result<()> {
        if self.rank <= 0 {
            bail!(
                "lora_rank must be positive (8 or 16 are common), not {}",
                self.rank
            );
        }
        for t in &self.targets {
            let probe = LoraSpec {
                targets: vec![t.clone()],
                ..self.clone()
            };
            if !adaptable.iter().any(|m| probe.targets_module(m)) {
                let mut kinds: Vec<&str> = adaptable
                    .iter()
                    .map(|m| m.rsplit('.').next().unwrap_or(m))
                    .collect();
                kinds.sort();
                kinds.dedup();
                bail!(
                    "LoRA target '{t}' names no module of this model: its projections are {}",
                    kinds.join(", ")
                );
            }
        }
        Ok(())
    }
}

/// A dense projection, as Linear (`weight` out × in) or as GPT-2's Conv1D (`weight` in × out,
/// the layout its checkpoints store), with an optional adapter.
pub struct Projection {
    pub weight: Tensor,
    pub bias: Option<Tensor>,
    /// Stored in × out (GPT-2's Conv1D).
    transposed: bool,
    lora: Option<Adapter>,
}

struct Adapter {
    a: Tensor,
    b: Tensor,
    scale: f64,
    dropout: f64,
}

/// How a projection is built: its shape, layout, bias and initialisation.
pub struct Shape {
    pub inputs: i64,
    pub outputs: i64,
    pub bias: bool,
    pub transposed: bool,
    pub init_std: f64,
}

impl Projection {
    /// Builds `weight` (and `bias`) under `path`, with an adapter when `lora` targets the
    /// module ([`freeze_base`] then freezes everything but the adapters).
    pub fn new(path: &nn::Path, shape: Shape, lora: Option<&LoraSpec>) -> Self {
        let dims = if shape.transposed {
            [shape.inputs, shape.outputs]
        } else {
            [shape.outputs, shape.inputs]
        };
        let weight = super::normal(path, "weight", &dims, shape.init_std);
        let bias = shape
            .bias
            .then(|| path.var("bias", &[shape.outputs], Init::Const(0.0)));
        let name = path.components().collect::<Vec<_>>().join(".");
        let lora = lora.filter(|l| l.targets_module(&name)).map(|l| {
            // PEFT's initialisation: A as nn.Linear's default (Kaiming uniform, a = √5,
            // i.e. uniform ±1/√in), B zero.
            let bound = 1.0 / (shape.inputs as f64).sqrt();
            Adapter {
                a: (path / "lora_A").var(
                    "weight",
                    &[l.rank, shape.inputs],
                    Init::Uniform {
                        lo: -bound,
                        up: bound,
                    },
                ),
                b: (path / "lora_B").var("weight", &[shape.outputs, l.rank], Init::Const(0.0)),
                scale: l.scale(),
                dropout: l.dropout,
            }
        });
        Self {
            weight,
            bias,
            transposed: shape.transposed,
            lora,
        }
    }

    /// The base weight as Linear's (out × in).
    pub fn linear_weight(&self) -> Tensor {
        if self.transposed {
            self.weight.tr()
        } else {
            self.weight.shallow_clone()
        }
    }

    pub fn forward(&self, x: &Tensor, train: bool) -> Tensor {
        let y = if self.transposed {
            let y = x.matmul(&self.weight);
            match &self.bias {
                Some(b) => y + b,
                None => y,
            }
        } else {
            x.linear(&self.weight, self.bias.as_ref())
        };
        match &self.lora {
            Some(l) => {
                let low = x.dropout(l.dropout, train).linear::<Tensor>(&l.a, None);
                y + low.linear::<Tensor>(&l.b, None) * l.scale
            }
            None => y,
        }
    }

    /// Folds the adapter into the base weight (`W += B A · scale`), as PEFT's
    /// `merge_and_unload`; the adapter is gone afterwards.
    pub fn merge(&mut self) {
        if let Some(l) = self.lora.take() {
            tch::no_grad(|| {
                let delta = l.b.matmul(&l.a) * l.scale;
                let delta = if self.transposed { delta.tr() } else { delta };
                let merged = &self.weight + delta.to_kind(self.weight.kind());
                self.weight.set_data(&merged);
            });
        }
    }
}

/// Whether a variable is a LoRA adapter's.
pub fn is_adapter(name: &str) -> bool {
    name.contains(".lora_A.") || name.contains(".lora_B.")
}

/// Freezes every variable but the adapters': no gradients, no optimizer state, nothing
/// exchanged between workers for them.
pub fn freeze_base(vs: &nn::VarStore) {
    for (name, t) in vs.variables() {
        if !is_adapter(&name) {
            let _ = t.set_requires_grad(false);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tch::{Device, Kind};

    fn spec(targets: &[&str]) -> LoraSpec {
        LoraSpec {
            rank: 2,
            alpha: 4.0,
            dropout: 0.0,
            targets: targets.iter().map(|s| s.to_string()).collect(),
        }
    }

    #[test]
    fn targets_match_whole_names_or_dotted_suffixes() {
        let s = spec(&["q_proj", "attn.c_proj"]);
        assert!(s.targets_module("model.layers.0.self_attn.q_proj"));
        assert!(s.targets_module("transformer.h.1.attn.c_proj"));
        assert!(!s.targets_module("transformer.h.1.mlp.c_proj"));
        assert!(!s.targets_module("model.layers.0.self_attn.qq_proj"));
        let err = spec(&["query"])
            .check_targets(&["model.layers.0.self_attn.q_proj".into()])
            .unwrap_err()
            .to_string();
        assert!(err.contains("'query'") && err.contains("q_proj"), "{err}");
    }

    /// An adapted projection trains only A and B; merged, it computes what it did unmerged.
    #[test]
    fn the_adapter_alone_trains_and_merging_keeps_the_function() {
        tch::manual_seed(1);
        for transposed in [false, true] {
            let vs = nn::VarStore::new(Device::Cpu);
            let shape = Shape {
                inputs: 6,
                outputs: 5,
                bias: true,
                transposed,
                init_std: 0.5,
            };
            let mut p = Projection::new(&(vs.root() / "q_proj"), shape, Some(&spec(&["q_proj"])));
            freeze_base(&vs);
            let trainable: Vec<String> = vs
                .variables()
                .into_iter()
                .filter(|(_, t)| t.requires_grad())
                .map(|(n, _)| n)
                .collect();
            let mut trainable = trainable;
            trainable.sort();
            assert_eq!(trainable, ["q_proj.lora_A.weight", "q_proj.lora_B.weight"]);
            tch::no_grad(|| {
                let _ = p.lora.as_mut().unwrap().b.normal_(0.0, 1.0);
            });
            let x = Tensor::randn([3, 6], (Kind::Float, Device::Cpu));
            let before = p.forward(&x, false);
            p.merge();
            let after = p.forward(&x, false);
            let diff = (before - after).abs().max().double_value(&[]);
            assert!(diff < 1e-5, "transposed {transposed}: {diff}");
        }
    }
}
