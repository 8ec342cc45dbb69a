//! Rotary position embeddings (RoPE): each pair of a head's dimensions is rotated by an angle
//! that grows with the position, at a frequency of its own. The frequencies as Llama-family
//! checkpoints specify them: `rope_theta`, and `rope_scaling` of type `linear` or `llama3`
//! (Llama 3.1 and 3.2 stretch the low frequencies to a longer context).

use anyhow::{bail, Result};
use serde::{Deserialize, Serialize};
use std::cell::RefCell;

use tch::{Device, Kind, Tensor};
use trainbook_engine::OnDeviceOf;

/// `rope_scaling` (or, as transformers 5 writes it, `rope_parameters`) of a `config.json`.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct RopeScaling {
    /// `default`, `linear` or `llama3` (older files call it `type`).
    #[serde(alias = "type", default)]
    pub rope_type: Option<String>,
    #[serde(default)]
    pub factor: Option<f64>,
    #[serde(default)]
    pub low_freq_factor: Option<f64>,
    #[serde(default)]
    pub high_freq_factor: Option<f64>,
    #[serde(default)]
    pub original_max_position_embeddings: Option<f64>,
    /// transformers 5 keeps the base here.
    #[serde(default)]
    pub rope_theta: Option<f64>,
}

/// The rotation frequencies of one head, and the cos/sin tables of every position on the
/// model's device (made there once, on the first forward pass: the model is placed on its
/// device after it is built).
pub struct Rotary {
    /// (d / 2,) float32.
    inv_freq: Tensor,
    positions: i64,
    tables: RefCell<Option<(Tensor, Tensor)>>,
}

impl Rotary {
    /// `dim`: the rotated dimensions of a head (its whole width here); `positions`: the most
    /// the model takes.
    pub fn new(
        dim: i64,
        theta: f64,
        scaling: Option<&RopeScaling>,
        positions: i64,
    ) -> Result<Self> {
        if dim % 2 != 0 {
            bail!("rotary embeddings need an even head dimension, not {dim}");
        }
        let freqs: Vec<f32> = (0..dim / 2)
            .map(|i| (1.0 / theta.powf((2 * i) as f64 / dim as f64)) as f32)
            .collect();
        let kind = scaling
            .and_then(|s| s.rope_type.as_deref())
            .unwrap_or("default");
        let freqs = match (kind, scaling) {
            ("default", _) | (_, None) => freqs,
            ("linear", Some(s)) => {
                let f = s.factor.unwrap_or(1.0) as f32;
                freqs.iter().map(|x| x / f).collect()
            }
            ("llama3", Some(s)) => llama3(&freqs, s)?,
            (other, _) => bail!(
                "rope_scaling of type '{other}' is not supported: trainbook reads default, linear and llama3 (Llama 3.1/3.2)"
            ),
        };
        Ok(Self {
            inv_freq: Tensor::from_slice(&freqs),
            positions,
            tables: RefCell::new(None),
        })
    }

    /// (cos, sin) of positions start..start + n, each (n, dim) in f32, on the device of
    /// `like`.
    pub fn angles(&self, start: i64, n: i64, like: &Tensor) -> (Tensor, Tensor) {
        let mut tables = self.tables.borrow_mut();
        let (cos, sin) = tables.get_or_insert_with(|| {
            let pos = Tensor::arange(self.positions, (Kind::Float, Device::Cpu));
            let freqs = pos.unsqueeze(1) * self.inv_freq.unsqueeze(0);
            let emb = Tensor::cat(&[&freqs, &freqs], 1);
            (emb.cos().to_device_of(like), emb.sin().to_device_of(like))
        });
        (cos.narrow(0, start, n), sin.narrow(0, start, n))
    }
}

/// Rotates `x` (batch, heads, n, dim) by the angles of its positions: the two halves of each
/// head are the pair's coordinates (the layout Hugging Face's Llama checkpoints use).
pub fn rotate(x: &Tensor, cos: &Tensor, sin: &Tensor) -> Tensor {
    let half = x.size()[3] / 2;
    let (x1, x2) = (x.narrow(3, 0, half), x.narrow(3, half, half));
    let rotated = Tensor::cat(&[&x2.neg(), &x1], 3);
    let kind = x.kind();
    x * cos.to_kind(kind) + rotated * sin.to_kind(kind)
}

/// Llama 3.1's frequencies: wavelengths longer than the original context / low_freq_factor
/// are divided by `factor`, shorter than context / high_freq_factor kept, and those between
/// blended smoothly.
fn llama3(freqs: &[f32], s: &RopeScaling) -> Result<Vec<f32>> {
    let (Some(factor), Some(low), Some(high), Some(context)) = (
        s.factor,
        s.low_freq_factor,
        s.high_freq_factor,
        s.original_max_position_embeddings,
    ) else {
        bail!("rope_scaling of type llama3 needs factor, low_freq_factor, high_freq_factor and original_max_position_embeddings");
    };
    if high <= low {
        bail!(
            "rope_scaling: high_freq_factor ({high}) must be larger than low_freq_factor ({low})"
        );
    }
    let (low_wavelen, high_wavelen) = (context / low, context / high);
    Ok(freqs
        .iter()
        .map(|&f| {
            let f = f as f64;
            let wavelen = 2.0 * std::f64::consts::PI / f;
            if wavelen < high_wavelen {
                f
            } else if wavelen > low_wavelen {
                f / factor
            } else {
                let smooth = (context / wavelen - low) / (high - low);
                (1.0 - smooth) * f / factor + smooth * f
            }
        })
        .map(|f| f as f32)
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn llama3_scales_long_wavelengths_keeps_short_ones_and_blends_between() {
        let s = RopeScaling {
            rope_type: Some("llama3".into()),
            factor: Some(8.0),
            low_freq_factor: Some(1.0),
            high_freq_factor: Some(4.0),
            original_max_position_embeddings: Some(32.0),
            rope_theta: None,
        };
        // head dim 8, theta 10: frequencies 1, 10^-1/4, 10^-1/2, 10^-3/4, wavelengths 6.3,
        // 11.2, 19.9, 35.3; kept below 32/4, divided by 8 above 32/1.
        let plain = Rotary::new(8, 10.0, None, 16).unwrap();
        let scaled = Rotary::new(8, 10.0, Some(&s), 16).unwrap();
        let p: Vec<f32> = Vec::try_from(&plain.inv_freq).unwrap();
        let q: Vec<f32> = Vec::try_from(&scaled.inv_freq).unwrap();
        // wavelength 2π < 32/4: kept.
        assert_eq!(p[0], q[0]);
        // wavelength ≈ 35.3 > 32: divided by 8.
        assert!((q[3] - p[3] / 8.0).abs() < 1e-7);
        // wavelength ≈ 11.2 lies between 8 and 32: blended, strictly between both.
        assert!(q[1] < p[1] && q[1] > p[1] / 8.0, "{} {}", q[1], p[1]);
    }

    #[test]
    fn an_unknown_scaling_is_named() {
        let s = RopeScaling {
            rope_type: Some("yarn".into()),
            ..Default::default()
        };
        let err = Rotary::new(8, 10.0, Some(&s), 16)
            .err()
            .unwrap()
            .to_string();
        assert!(err.contains("'yarn'") && err.contains("llama3"), "{err}");
    }
}
