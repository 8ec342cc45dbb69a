//! ResNet-18/34/50 for image classification (torchvision's layer names: `conv1`, `bn1`,
//! `layer1.0.conv1`, `layer1.0.downsample.0`, `fc`; each block a ZeRO-3 unit), a head sized to
//! the dataset, and torchvision checkpoints converted to safetensors.

use std::path::Path;

use anyhow::{bail, Context, Result};
use tch::nn::{self, ModuleT};
use tch::Tensor;

use trainbook_engine::checkpoint;

use super::{load_into, LoadReport, LoadRules};

pub use trainbook_api::Arch;

/// A built network: `forward_t(images, train)` gives logits.
pub type Model = Box<dyn ModuleT>;

/// Builds `arch` with a `num_classes`-way head under the VarStore's root.
pub fn build(root: &nn::Path, arch: Arch, num_classes: i64) -> Model {
    Box::new(ResNet::new(root, arch, num_classes))
}

/// Blocks per stage, and whether they are bottlenecks (1x1, 3x3, 1x1 with 4x the width out).
fn stages(arch: Arch) -> ([i64; 4], bool) {
    match arch {
        Arch::Resnet18 => ([2, 2, 2, 2], false),
        Arch::Resnet34 => ([3, 4, 6, 3], false),
        Arch::Resnet50 => ([3, 4, 6, 3], true),
    }
}

fn conv(p: nn::Path, c_in: i64, c_out: i64, k: i64, stride: i64) -> nn::Conv2D {
    let cfg = nn::ConvConfig {
        stride,
        padding: k / 2,
        bias: false,
        ..Default::default()
    };
    nn::conv2d(p, c_in, c_out, k, cfg)
}

/// A convolution and its batch norm.
#[derive(Debug)]
struct ConvBn(nn::Conv2D, nn::BatchNorm);

impl ConvBn {
    fn new(p: &nn::Path, n: &str, (c_in, c_out, k, stride): (i64, i64, i64, i64)) -> Self {
        let bn = if n == "0" {
            "1".to_string()
        } else {
            n.replace("conv", "bn")
        };
        let c = conv(p / n, c_in, c_out, k, stride);
        Self(
            c,
            nn::batch_norm2d(p / bn.as_str(), c_out, Default::default()),
        )
    }

    fn forward_t(&self, x: &Tensor, train: bool) -> Tensor {
        x.apply(&self.0).apply_t(&self.1, train)
    }
}

/// A residual block (`layer2.1`): its convolutions in order, and the projection of its input
/// when the shape changes. Its variable prefix is its unit under ZeRO-3.
#[derive(Debug)]
struct Block {
    unit: String,
    convs: Vec<ConvBn>,
    downsample: Option<ConvBn>,
}

impl Block {
    fn new(p: &nn::Path, c_in: i64, width: i64, stride: i64, bottleneck: bool) -> Self {
        let c_out = if bottleneck { 4 * width } else { width };
        let shapes = if bottleneck {
            vec![
                (c_in, width, 1, 1),
                (width, width, 3, stride),
                (width, c_out, 1, 1),
            ]
        } else {
            vec![(c_in, width, 3, stride), (width, width, 3, 1)]
        };
        let convs = shapes
            .into_iter()
            .enumerate()
            .map(|(i, shape)| ConvBn::new(p, &format!("conv{}", i + 1), shape))
            .collect();
        let downsample = (stride != 1 || c_in != c_out)
            .then(|| ConvBn::new(&(p / "downsample"), "0", (c_in, c_out, 1, stride)));
        Self {
            unit: crate::models::decoder::unit_name(p),
            convs,
            downsample,
        }
    }

    fn forward_t(&self, x: &Tensor, train: bool) -> Tensor {
        let last = self.convs.len() - 1;
        let mut y = x.shallow_clone();
        for (i, c) in self.convs.iter().enumerate() {
            y = c.forward_t(&y, train);
            if i < last {
                y = y.relu();
            }
        }
        let skip = match &self.downsample {
            Some(d) => d.forward_t(x, train),
            None => x.shallow_clone(),
        };
        (skip + y).relu()
    }
}

/// torchvision's ResNet (v1.5: a bottleneck's stride on its 3x3 convolution), with its
/// variable names.
#[derive(Debug)]
struct ResNet {
    stem: ConvBn,
    blocks: Vec<Block>,
    fc: nn::Linear,
}

impl ResNet {
    fn new(p: &nn::Path, arch: Arch, classes: i64) -> Self {
        let (counts, bottleneck) = stages(arch);
        let stem = ConvBn(
            conv(p / "conv1", 3, 64, 7, 2),
            nn::batch_norm2d(p / "bn1", 64, Default::default()),
        );
        let expansion = if bottleneck { 4 } else { 1 };
        let (mut c_in, mut blocks) = (64, Vec::new());
        for (stage, (&count, width)) in counts.iter().zip([64, 128, 256, 512]).enumerate() {
            let under = p / format!("layer{}", stage + 1);
            for i in 0..count {
                let stride = if stage > 0 && i == 0 { 2 } else { 1 };
                blocks.push(Block::new(&(&under / i), c_in, width, stride, bottleneck));
                c_in = width * expansion;
            }
        }
        let fc = nn::linear(p / "fc", c_in, classes, Default::default());
        Self { stem, blocks, fc }
    }
}

impl ModuleT for ResNet {
    fn forward_t(&self, xs: &Tensor, train: bool) -> Tensor {
        let mut x =
            self.stem
                .forward_t(xs, train)
                .relu()
                .max_pool2d([3, 3], [2, 2], [1, 1], [1, 1], false);
        for b in &self.blocks {
            x = trainbook_engine::unit_forward(&b.unit, &x, |x| b.forward_t(x, train));
        }
        x.adaptive_avg_pool2d([1, 1]).flat_view().apply(&self.fc)
    }
}

/// Loads torchvision-named weights (a `.safetensors` file, or a checkpoint directory holding
/// `model.safetensors`). A head of another size (`fc.*`, e.g. ImageNet's 1000 classes) is
/// skipped and reported; any other mismatch is an error.
pub fn load_weights(vs: &nn::VarStore, path: &Path) -> Result<LoadReport> {
    let file = if path.is_dir() {
        path.join("model.safetensors")
    } else {
        path.to_path_buf()
    };
    // A checkpoint written under ZeRO-3 is sharded, with an index.
    let sharded = path.is_dir() && !file.exists();
    if !file.exists() && !(sharded && checkpoint::has_tensors(path, checkpoint::MODEL_STEM)) {
        bail!(
            "{} does not exist: pass a .safetensors file with torchvision parameter names (convert a .pth with safetensors.torch.save_file(torch.load(path), 'resnet50.safetensors'))",
            file.display()
        );
    }
    let tensors = match checkpoint::TensorFiles::open(path, checkpoint::MODEL_STEM)? {
        Some(files) if sharded => files.read_all()?,
        _ => Tensor::read_safetensors(&file)
            .with_context(|| format!("reading {}", file.display()))?,
    };
    load_into(
        vs,
        tensors
            .into_iter()
            .collect::<std::collections::HashMap<_, _>>(),
        &file.display().to_string(),
        &LoadRules {
            optional_prefix: None,
            ignored: &["num_batches_tracked"],
            replaceable_head: &["fc."],
            mismatch_hint: "the checkpoint is for another architecture (check --arch)",
        },
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use tch::{Device, Kind};

    #[test]
    fn a_thousand_class_checkpoint_starts_a_ten_class_model() {
        let src = nn::VarStore::new(Device::Cpu);
        let _m = build(&src.root(), Arch::Resnet18, 1000);
        let dir = std::env::temp_dir().join(format!("trainbook-resnet-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("resnet18.safetensors");
        let mut named: Vec<(String, Tensor)> = src.variables().into_iter().collect();
        // torchvision state dicts carry this buffer; it must not be reported.
        named.push(("bn1.num_batches_tracked".into(), Tensor::from(0i64)));
        let refs: Vec<(&str, &Tensor)> = named.iter().map(|(n, t)| (n.as_str(), t)).collect();
        Tensor::write_safetensors(&refs, &file).unwrap();

        let dst = nn::VarStore::new(Device::Cpu);
        let model = build(&dst.root(), Arch::Resnet18, 10);
        let report = load_weights(&dst, &file).unwrap();
        assert_eq!(report.missing, ["fc.bias", "fc.weight"]);
        assert!(report.unexpected.is_empty(), "{report:?}");
        assert_eq!(
            report.mismatched[1],
            ("fc.weight".into(), vec![1000, 512], vec![10, 512])
        );
        let text = report.describe("ResNet", "x").unwrap();
        assert!(
            text.contains("fc.weight: found shape [1000, 512]"),
            "{text}"
        );
        let conv = &dst.variables()["conv1.weight"];
        assert!(conv.equal(&src.variables()["conv1.weight"]));
        let out = model.forward_t(
            &Tensor::zeros([2, 3, 32, 32], (Kind::Float, Device::Cpu)),
            false,
        );
        assert_eq!(out.size(), [2, 10]);

        let other = nn::VarStore::new(Device::Cpu);
        let _m = build(&other.root(), Arch::Resnet50, 10);
        let err = load_weights(&other, &file).unwrap_err().to_string();
        assert!(err.contains("another architecture"), "{err}");
        std::fs::remove_dir_all(dir).ok();
    }
}
