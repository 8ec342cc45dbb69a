//! RMSNorm (the Llama family's normalisation): `x / √(mean(x²) + ε) · w`, computed in f32
//! whatever the activations' dtype, as the checkpoints' reference implementation does.

use tch::nn::{self, Init};
use tch::{Kind, Tensor};

pub struct RmsNorm {
    pub weight: Tensor,
    eps: f64,
}

impl RmsNorm {
    /// `weight` under `path`, ones.
    pub fn new(path: &nn::Path, size: i64, eps: f64) -> Self {
        Self {
            weight: path.var("weight", &[size], Init::Const(1.0)),
            eps,
        }
    }

    pub fn forward(&self, x: &Tensor) -> Tensor {
        let kind = x.kind();
        let x32 = x.to_kind(Kind::Float);
        let var = x32.square().mean_dim(-1, true, Kind::Float);
        let normed = (x32 * (var + self.eps).rsqrt()).to_kind(kind);
        normed * self.weight.to_kind(kind)
    }
}
