//! Image classification (the `resnet` recipe) as notebooks drive it: [`train_resnet`] with
//! the reference's defaults, [`ResnetTrainer`] for everything else, the recipe's own options,
//! and [`ImageFolder`], the torchvision-style dataset layout it trains on.

use std::path::{Path, PathBuf};

use anyhow::{bail, Result};

use crate::job::TrainResult;
use crate::run::Train;
use crate::runtime::port;
use crate::spec::Configure;

/// The network of an image-classification recipe.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Arch {
    #[default]
    Resnet18,
    Resnet34,
    Resnet50,
}

impl std::str::FromStr for Arch {
    type Err = anyhow::Error;
    fn from_str(s: &str) -> Result<Self> {
        match s.to_ascii_lowercase().replace(['-', '_'], "").as_str() {
            "resnet18" | "18" => Ok(Self::Resnet18),
            "resnet34" | "34" => Ok(Self::Resnet34),
            "resnet50" | "50" => Ok(Self::Resnet50),
            o => bail!("unknown architecture '{o}': use resnet18, resnet34 or resnet50"),
        }
    }
}

impl std::fmt::Display for Arch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Self::Resnet18 => "resnet18",
            Self::Resnet34 => "resnet34",
            Self::Resnet50 => "resnet50",
        })
    }
}

/// How strong the training augmentation is.
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Augment {
    /// Smallest crop area as a fraction of the image (torchvision: 0.08).
    pub min_scale: f64,
    /// RandomHorizontalFlip(0.5); wrong for data where mirroring changes the class (digits).
    pub flip: bool,
}

impl Augment {
    /// torchvision's `RandomResizedCrop(size)` (scale 0.08 to 1) + `RandomHorizontalFlip()`,
    /// the reference's.
    pub const TORCHVISION: Augment = Augment {
        min_scale: 0.08,
        flip: true,
    };
}

/// torchvision's (what a setting recorded before augmentation was recorded meant).
impl Default for Augment {
    fn default() -> Self {
        Augment::TORCHVISION
    }
}

crate::options! {
    /// Options of the image-classification recipe (resnet).
    struct VisionOptions => VisionSettings, trait ConfigureVision(vision_options) {
        /// The network: resnet18, resnet34 or resnet50.
        #[arg(value_name = "resnet18|resnet34|resnet50")]
        arch: Arch => Arch,
        /// Side of the square input in pixels (the reference's 224).
        #[arg(value_name = "PX")]
        image_size: u32 => u32,
        /// Threads per worker that decode and augment images ahead of the training loop.
        #[arg(value_name = "N")]
        loader_threads: usize => usize,
        /// Model and batches in channels-last memory (NHWC), which convolutions run faster on
        /// (cuDNN, oneDNN) [default: on for CUDA and CPU, off for Gaudi].
        #[arg(value_name = "BOOL", num_args = 0..=1, default_missing_value = "true")]
        channels_last: bool => Option<bool>,
        /// Decode the images once (resized and centre-cropped, as for evaluation: no
        /// augmentation) and keep them on the device as uint8, each step picking its batch
        /// there: the model's own speed with the input pipeline out of the loop. For
        /// benchmarks, and for a dataset small enough to sit in device memory [default: off].
        #[arg(value_name = "BOOL", num_args = 0..=1, default_missing_value = "true")]
        data_on_device: bool => bool,
    }
    extra {
        /// The training augmentation (the preset's).
        augment: Augment,
    }
}

/// A scanned image-classification split (see the module docs for the rules).
#[derive(Debug, Clone)]
pub struct ImageFolder {
    /// The directory that was scanned (the split directory, e.g. `.../train`).
    pub root: PathBuf,
    /// Class names, sorted; a sample's class id indexes this list.
    pub classes: Vec<String>,
    /// `(path, class id)` for every file whose header decoded, in torchvision's order.
    pub samples: Vec<(PathBuf, usize)>,
    /// Image-extension files that were left out, with the reason (not fatal).
    pub skipped: Vec<(PathBuf, String)>,
}

/// The engine's side of image folders. The `trainbook` crate implements it (see
/// `crate::runtime`).
pub trait ImageFolders: Send + Sync {
    /// Scans an image folder (see [`ImageFolder::scan`]).
    fn scan_images(&self, root: &Path) -> Result<ImageFolder>;
}

impl ImageFolder {
    /// Scans `root/<class>/<image files>` as torchvision's `ImageFolder` does: classes are the
    /// sorted subdirectories (hidden ones skipped), files with an image extension are samples
    /// in torchvision's order, and files whose header does not decode are listed in `skipped`.
    /// Fails when `root` is missing, has no class directories, or some class has no valid image.
    pub fn scan(root: &Path) -> Result<ImageFolder> {
        port::<dyn ImageFolders>()?.scan_images(root)
    }

    /// `scan(root.join(split))`, e.g. `ImageFolder::scan_split(&data, "train")`.
    pub fn scan_split(root: &Path, split: &str) -> Result<ImageFolder> {
        Self::scan(&root.join(split))
    }

    /// Number of (valid) samples.
    pub fn len(&self) -> usize {
        self.samples.len()
    }

    pub fn is_empty(&self) -> bool {
        self.samples.is_empty()
    }

    /// Samples per class id.
    pub fn class_counts(&self) -> Vec<usize> {
        let mut counts = vec![0usize; self.classes.len()];
        for (_, id) in &self.samples {
            counts[*id] += 1;
        }
        counts
    }
}

/// Trains image classification with `num_workers` data-parallel workers: the reference
/// notebook's ResNet-50 job when a hymenoptera-style folder is on this machine, else the
/// offline default (ResNet-18 on MNIST digits; see `trainbook recipes`).
pub fn train_resnet(num_workers: usize) -> Result<TrainResult> {
    ResnetTrainer::new().workers(num_workers).fit()
}

trainer!(
    /// Every option of the ResNet recipe:
    /// `ResnetTrainer::new().workers(2).data("hymenoptera_data").arch(Arch::Resnet50).image_size(224).fit()?`
    ResnetTrainer,
    "resnet"
);

/// `arch`, `image_size`, `loader_threads`, `channels_last`, `data_on_device`.
impl ConfigureVision for ResnetTrainer {
    fn vision_options(&mut self, edit: impl FnOnce(&mut VisionOptions)) {
        self.spec.edit_recipe_options(edit)
    }
}
