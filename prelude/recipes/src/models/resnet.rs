//! ResNet-18/34/50 for image classification: tch's implementation (torchvision's layer names:
//! `conv1`, `bn1`, `layer1.0.conv1`, `layer1.0.downsample.0`, `fc`), a head sized to the
//! dataset, and torchvision checkpoints converted to safetensors.

use std::path::Path;

use anyhow::{bail, Context, Result};
use tch::nn::{self, ModuleT};
use tch::Tensor;

use super::{load_into, LoadReport, LoadRules};

pub use trainbook_api::Arch;

/// A built network: `forward_t(images, train)` gives logits.
pub type Model = Box<dyn ModuleT>;

/// Builds `arch` with a `num_classes`-way head under the VarStore's root.
pub fn build(root: &nn::Path, arch: Arch, num_classes: i64) -> Model {
    use tch::vision::resnet;
    match arch {
        Arch::Resnet18 => Box::new(resnet::resnet18(root, num_classes)),
        Arch::Resnet34 => Box::new(resnet::resnet34(root, num_classes)),
        Arch::Resnet50 => Box::new(resnet::resnet50(root, num_classes)),
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
    if !file.exists() {
        bail!(
            "{} does not exist: pass a .safetensors file with torchvision parameter names (convert a .pth with safetensors.torch.save_file(torch.load(path), 'resnet50.safetensors'))",
            file.display()
        );
    }
    let tensors =
        Tensor::read_safetensors(&file).with_context(|| format!("reading {}", file.display()))?;
    load_into(
        vs,
        tensors.into_iter().collect(),
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
