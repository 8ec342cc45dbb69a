//! A decoder's stack of layers, whatever the family: each layer in turn, recomputed in the
//! backward pass when activation checkpointing asks for it, its keys and values added to the
//! cache when generating; and the adapters of every layer merged at once.

use std::sync::Arc;

use anyhow::Result;
use tch::{nn, Tensor};

use super::attention::KvCache;
use super::lora::Projection;

/// (name, shape) of every parameter, sorted by name.
pub type TensorShapes = Vec<(String, Vec<i64>)>;

/// What the training loop and generation need of a causal language model.
pub trait CausalLm {
    /// Final hidden states (batch, n, hidden) of `ids` (batch, n), which continue the
    /// positions `cache` holds (and are added to it).
    fn hidden(&self, ids: &Tensor, cache: Option<&mut KvCache>, train: bool) -> Tensor;
    /// Next-token logits of hidden states (…, hidden) → (…, vocab).
    fn logits(&self, hidden: &Tensor) -> Tensor;
    /// The decoder layers: how many, activation checkpointing, merging adapters.
    fn layers(&self) -> &dyn Layers;
    fn layers_mut(&mut self) -> &mut dyn Layers;
}

/// One layer of a decoder family.
pub trait Layer: 'static {
    /// `shared`: what every layer of a pass reads (Llama's rotary angles; nothing for GPT-2).
    fn forward(
        &self,
        x: &Tensor,
        shared: &[Tensor],
        cache: Option<(&mut KvCache, usize)>,
        train: bool,
    ) -> Tensor;
    /// The layer's dense projections (for merging adapters).
    fn projections(&mut self) -> Vec<&mut Projection>;
}

pub struct Stack<L> {
    layers: Vec<Arc<L>>,
    /// Each layer's variable prefix (`model.layers.3`): its unit under ZeRO-3.
    units: Vec<String>,
    /// Activation checkpointing of every k-th layer in training (`None`: off).
    checkpoint_every: Option<usize>,
}

impl<L: Layer> Stack<L> {
    /// The layers built under `under / i`, i = 0, 1, …
    pub fn new(under: &nn::Path, layers: Vec<L>) -> Self {
        let units = (0..layers.len()).map(|i| unit_name(&(under / i))).collect();
        Self {
            layers: layers.into_iter().map(Arc::new).collect(),
            units,
            checkpoint_every: None,
        }
    }

    /// `n` layers made by `layer` under `under / i`, i = 0, 1, …, each handed to ZeRO-3's
    /// sharded build once made (so that under it a rank holds one whole layer at most).
    pub fn build(
        vs: &nn::VarStore,
        under: &nn::Path,
        n: i64,
        layer: impl Fn(&nn::Path) -> L,
    ) -> Result<Self> {
        let mut layers = Vec::with_capacity(n.max(0) as usize);
        for i in 0..n {
            let at = under / i;
            layers.push(layer(&at));
            trainbook_engine::sharded_build::unit_built(vs, &unit_name(&at))?;
        }
        Ok(Self::new(under, layers))
    }

    /// `x` through every layer; with a cache, generating (never recomputed).
    pub fn forward(
        &self,
        mut x: Tensor,
        shared: &[Tensor],
        mut cache: Option<&mut KvCache>,
        train: bool,
    ) -> Tensor {
        for (i, l) in self.layers.iter().enumerate() {
            let recompute = self.checkpoint_every.is_some_and(|k| train && i % k == 0);
            let c = cache.as_deref_mut();
            x = trainbook_engine::unit_forward(&self.units[i], &x, |x| match c {
                None if recompute => {
                    // The recomputation runs in the backward pass: it holds its own handles.
                    let layer = l.clone();
                    let shared: Vec<Tensor> = shared.iter().map(Tensor::shallow_clone).collect();
                    trainbook_engine::checkpointed(&[x], move |ins| {
                        layer.forward(&ins[0], &shared, None, true)
                    })
                    .unwrap_or_else(|e| panic!("{e:#}"))
                }
                c => l.forward(x, shared, c.map(|c| (c, i)), train),
            });
        }
        x
    }
}

/// The dotted name of a variable path (`model.layers.3`), as its variables' names begin.
pub fn unit_name(p: &nn::Path) -> String {
    p.components().collect::<Vec<_>>().join(".")
}

/// What a model's users change on its stack, whatever its layers.
pub trait Layers {
    fn len(&self) -> usize;
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// Activation checkpointing of every k-th layer in training (`None`: off).
    fn set_activation_checkpointing(&mut self, every: Option<usize>);
    /// Folds every layer's adapters into its base weights.
    fn merge_adapters(&mut self);
}

impl<L: Layer> Layers for Stack<L> {
    fn len(&self) -> usize {
        self.layers.len()
    }

    fn set_activation_checkpointing(&mut self, every: Option<usize>) {
        self.checkpoint_every = every.filter(|&k| k > 0);
    }

    fn merge_adapters(&mut self) {
        for l in &mut self.layers {
            let layer = Arc::get_mut(l).expect("no recomputation holds a layer outside a step");
            for p in layer.projections() {
                p.merge();
            }
        }
    }
}
