//! torchvision's ImageNet classification transforms on `image::RgbImage`, producing float32 CHW
//! tensors:
//!
//! * [`train_transform`] = `RandomResizedCrop(size)` + `RandomHorizontalFlip()` + `ToTensor()` +
//!   `Normalize(mean, std)`,
//! * [`eval_transform`] = `Resize(size * 256 / 224)` + `CenterCrop(size)` + `ToTensor()` +
//!   `Normalize(mean, std)` (torchvision's reference recipe: 256 → 224).
//!
//! Crop geometry follows torchvision to the pixel (same formulas, Python's round-half-to-even,
//! same truncations), so a model sees the same framing as in PyTorch. Random draws come from the
//! caller's `rand::Rng` in torchvision's order (scale, log-ratio, top, left per attempt, then the
//! flip), so a seeded RNG makes a sample's augmentation reproducible; the numbers differ from
//! PyTorch's generator, the distributions do not. Resampling is the `image` crate's separable
//! triangle filter, which — like PIL's BILINEAR used by torchvision — widens its support when
//! downscaling (antialiased), so values match PIL to within rounding, not bit for bit.
//!
//! The tensor is filled from a `Vec<f32>` in one pass (flip and crop folded into the indexing)
//! and handed to libtorch once: no per-pixel tensor calls.

use anyhow::{bail, Result};
use image::imageops::{self, FilterType};
use image::RgbImage;
use rand::Rng;
use tch::{Kind, Tensor};

/// `transforms.Normalize(mean, std)` applied after `ToTensor()` (values in [0, 1]).
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Normalize {
    pub mean: [f32; 3],
    pub std: [f32; 3],
}

impl Normalize {
    /// The ImageNet statistics every torchvision classification model was trained with.
    pub const IMAGENET: Normalize = Normalize {
        mean: [0.485, 0.456, 0.406],
        std: [0.229, 0.224, 0.225],
    };

    /// No normalisation: `ToTensor()` alone, values in [0, 1].
    pub const NONE: Normalize = Normalize {
        mean: [0.0; 3],
        std: [1.0; 3],
    };

    /// Per channel, the output value of each of the 256 input levels, computed with torchvision's
    /// float32 operations (`x / 255`, then `(x - mean) / std`) so the values agree bit for bit.
    fn table(&self) -> Result<[[f32; 256]; 3]> {
        for c in 0..3 {
            let (m, s) = (self.mean[c], self.std[c]);
            if !m.is_finite() || !s.is_finite() || s <= 0.0 {
                bail!(
                    "invalid Normalize for channel {c}: mean {m}, std {s}; std must be a positive \
                     finite number (e.g. Normalize::IMAGENET)"
                );
            }
        }
        let mut t = [[0f32; 256]; 3];
        for (c, row) in t.iter_mut().enumerate() {
            for (v, out) in row.iter_mut().enumerate() {
                *out = (v as f32 / 255.0 - self.mean[c]) / self.std[c];
            }
        }
        Ok(t)
    }
}

/// `RandomResizedCrop`'s default range of the crop's area, as a fraction of the image's.
pub const SCALE: (f64, f64) = (Augment::TORCHVISION.min_scale, 1.0);
/// `RandomResizedCrop`'s default range of the crop's aspect ratio (width / height).
pub const RATIO: (f64, f64) = (3.0 / 4.0, 4.0 / 3.0);

/// Largest output (width × height) a transform will allocate: a guard against a size typo or an
/// absurd aspect ratio (a 1×10000 banner resized to a 256 short side) exhausting memory.
const MAX_PIXELS: u64 = 1 << 28;

/// A crop rectangle in torchvision's `(i, j, h, w)` terms.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Crop {
    pub top: u32,
    pub left: u32,
    pub height: u32,
    pub width: u32,
}

/// `RandomResizedCrop.get_params`: up to 10 tries of a random area fraction in `scale` and a
/// log-uniform aspect ratio in `ratio`, keeping the first crop that fits; otherwise the central
/// crop with the image's aspect ratio clamped to `ratio` (the whole image when it is in range).
pub fn random_resized_crop_params(
    width: u32,
    height: u32,
    scale: (f64, f64),
    ratio: (f64, f64),
    rng: &mut impl Rng,
) -> Crop {
    let area = width as f64 * height as f64;
    let (log_lo, log_hi) = (ratio.0.ln(), ratio.1.ln());
    // `a + (b - a) * u` like torch's uniform_, and no panic on an empty or reversed range.
    let uniform = |rng: &mut _, a: f64, b: f64| a + (b - a) * Rng::gen::<f64>(rng);
    for _ in 0..10 {
        let target_area = area * uniform(rng, scale.0, scale.1);
        let aspect = uniform(rng, log_lo, log_hi).exp();
        // Python's round() rounds half to even; `as` saturates NaN/inf to something that fails
        // the bounds check below.
        let w = (target_area * aspect).sqrt().round_ties_even() as i64;
        let h = (target_area / aspect).sqrt().round_ties_even() as i64;
        if 0 < w && w <= width as i64 && 0 < h && h <= height as i64 {
            let (w, h) = (w as u32, h as u32);
            let top = rng.gen_range(0..=height - h);
            let left = rng.gen_range(0..=width - w);
            return Crop {
                top,
                left,
                height: h,
                width: w,
            };
        }
    }
    let in_ratio = width as f64 / height as f64;
    let (lo, hi) = (ratio.0.min(ratio.1), ratio.0.max(ratio.1));
    let (w, h) = if in_ratio < lo {
        (
            width,
            ((width as f64 / lo).round_ties_even() as u32).min(height),
        )
    } else if in_ratio > hi {
        (
            ((height as f64 * hi).round_ties_even() as u32).min(width),
            height,
        )
    } else {
        (width, height)
    };
    Crop {
        top: (height - h) / 2,
        left: (width - w) / 2,
        height: h,
        width: w,
    }
}

pub use trainbook_api::Augment;

/// The pixels a transform chose: `crop` of `image`, mirrored left-right when `flip`.
pub struct Selection<'a> {
    image: std::borrow::Cow<'a, RgbImage>,
    crop: Crop,
    flip: bool,
}

impl Selection<'_> {
    /// ToTensor + Normalize: float32 `[3, h, w]`.
    pub fn chw(&self, norm: &Normalize) -> Result<Tensor> {
        chw_tensor(&self.image, self.crop, self.flip, norm)
    }

    /// The pixels as they are: uint8 `[h, w, 3]` (a quarter of the float bytes to copy; the
    /// device turns them into normalised floats, see [`DeviceNormalize`]).
    pub fn hwc(&self) -> Result<Tensor> {
        hwc_tensor(&self.image, self.crop, self.flip)
    }
}

/// Training selection: RandomResizedCrop(size, (`augment.min_scale`, 1), [`RATIO`]) with
/// bilinear resampling, RandomHorizontalFlip(0.5) when `augment.flip`.
pub fn train_selection(
    img: &RgbImage,
    size: u32,
    rng: &mut impl Rng,
    augment: Augment,
) -> Result<Selection<'static>> {
    check_inputs(img, size, size as u64 * size as u64)?;
    let scale = (augment.min_scale, SCALE.1);
    let c = random_resized_crop_params(img.width(), img.height(), scale, RATIO, rng);
    let region = imageops::crop_imm(img, c.left, c.top, c.width, c.height);
    let resized = imageops::resize(&*region, size, size, FilterType::Triangle);
    let flip = augment.flip && rng.gen::<f64>() < 0.5;
    Ok(Selection {
        crop: full(&resized),
        image: std::borrow::Cow::Owned(resized),
        flip,
    })
}

/// Training transform: [`train_selection`], ToTensor, Normalize. Returns a float32
/// `[3, size, size]` tensor.
pub fn train_transform(
    img: &RgbImage,
    size: u32,
    rng: &mut impl Rng,
    norm: &Normalize,
    augment: Augment,
) -> Result<Tensor> {
    train_selection(img, size, rng, augment)?.chw(norm)
}

/// Evaluation selection: Resize the shorter side to `size * 256 / 224` (bilinear), CenterCrop
/// `size`.
pub fn eval_selection(img: &RgbImage, size: u32) -> Result<Selection<'_>> {
    check_inputs(img, size, 0)?;
    let (nw, nh) = resize_shorter_dims(img.width(), img.height(), eval_resize_size(size));
    check_inputs(img, size, nw as u64 * nh as u64)?;
    let crop = center_crop_params(nw, nh, size);
    // torchvision returns the image untouched when it already has the target size.
    let image = if (nw, nh) == img.dimensions() {
        std::borrow::Cow::Borrowed(img)
    } else {
        std::borrow::Cow::Owned(imageops::resize(img, nw, nh, FilterType::Triangle))
    };
    Ok(Selection {
        image,
        crop,
        flip: false,
    })
}

/// Evaluation transform: [`eval_selection`], ToTensor, Normalize. Returns a float32
/// `[3, size, size]` tensor.
pub fn eval_transform(img: &RgbImage, size: u32, norm: &Normalize) -> Result<Tensor> {
    eval_selection(img, size)?.chw(norm)
}

/// Normalize's mean and std as `(1, 3, 1, 1)` float32 tensors on a device, made once per
/// job: copying them there for every batch would make the host wait for the device each step.
pub struct DeviceNormalize {
    mean: Tensor,
    std: Tensor,
}

impl DeviceNormalize {
    pub fn new(norm: &Normalize, device: trainbook_engine::Device) -> Result<Self> {
        let stat = |v: &[f32; 3]| -> Result<Tensor> {
            device.put(&Tensor::f_from_slice(v)?.f_view([1, 3, 1, 1])?)
        };
        Ok(DeviceNormalize {
            mean: stat(&norm.mean)?,
            std: stat(&norm.std)?,
        })
    }

    /// A batch of uint8 `[n, h, w, 3]` pixels (on the same device) as normalised float32
    /// `[n, 3, h, w]`: `(x / 255 - mean) / std`, ToTensor and Normalize's float32 arithmetic.
    /// Stored channels-last (NHWC memory, the pixels' own order) when `channels_last`, else in
    /// the usual NCHW order.
    pub fn apply(&self, x: &Tensor, channels_last: bool) -> Result<Tensor> {
        let x = x.f_permute([0, 3, 1, 2])?.f_to_kind(Kind::Float)?;
        let y = ((x / 255.0) - &self.mean) / &self.std;
        trainbook_engine::memory_format(&y, channels_last)
    }
}

/// `ToTensor()` + `Normalize` of a whole image: float32 `[3, height, width]`.
pub fn to_tensor(img: &RgbImage, norm: &Normalize) -> Result<Tensor> {
    chw_tensor(img, full(img), false, norm)
}

/// The shorter side `Resize` gets in the eval transform: `int(size * 256 / 224)` (256 for 224).
fn eval_resize_size(size: u32) -> u32 {
    (size as u64 * 256 / 224) as u32
}

/// torchvision's `_compute_resized_output_size` for an int size: the shorter side becomes
/// `short`, the longer `int(short * long / shorter)` (truncated). Integer division gives the same
/// result as Python's float division + int() here: a non-integer quotient is at least 1/shorter
/// away from the next integer, far more than a float's rounding error.
fn resize_shorter_dims(width: u32, height: u32, short: u32) -> (u32, u32) {
    let scaled = |long: u32, shorter: u32| (short as u64 * long as u64 / shorter as u64) as u32;
    if width <= height {
        (short, scaled(height, width))
    } else {
        (scaled(width, height), short)
    }
}

/// `CenterCrop`: `top = int(round((h - size) / 2))` (half to even), same for `left`. The eval
/// resize makes both sides at least `size`, so torchvision's padding branch never applies.
fn center_crop_params(width: u32, height: u32, size: u32) -> Crop {
    let offset = |side: u32| (side.saturating_sub(size) as f64 / 2.0).round_ties_even() as u32;
    Crop {
        top: offset(height),
        left: offset(width),
        height: size.min(height),
        width: size.min(width),
    }
}

fn full(img: &RgbImage) -> Crop {
    Crop {
        top: 0,
        left: 0,
        height: img.height(),
        width: img.width(),
    }
}

fn check_inputs(img: &RgbImage, size: u32, out_pixels: u64) -> Result<()> {
    if size == 0 {
        bail!("transform size is 0: pass the model's input size, e.g. 224");
    }
    if img.width() == 0 || img.height() == 0 {
        bail!(
            "cannot transform an empty {}x{} image: drop it from the dataset",
            img.width(),
            img.height()
        );
    }
    if out_pixels > MAX_PIXELS {
        bail!(
            "transform of a {}x{} image to size {size} needs {out_pixels} pixels (limit \
             {MAX_PIXELS}): use a smaller size, or crop images with extreme aspect ratios first",
            img.width(),
            img.height()
        );
    }
    Ok(())
}

/// `crop` of `img` (mirrored left-right when `flip`) as uint8 HWC.
fn hwc_tensor(img: &RgbImage, crop: Crop, flip: bool) -> Result<Tensor> {
    check_crop(img, crop)?;
    let (w, h) = (crop.width as usize, crop.height as usize);
    let stride = img.width() as usize * 3;
    let raw = img.as_raw();
    let mut out = Vec::with_capacity(3 * w * h);
    for y in 0..h {
        let start = (crop.top as usize + y) * stride + crop.left as usize * 3;
        let row = &raw[start..start + 3 * w];
        if flip {
            for px in row.chunks_exact(3).rev() {
                out.extend_from_slice(px);
            }
        } else {
            out.extend_from_slice(row);
        }
    }
    Ok(Tensor::f_from_slice(&out)?.f_view([h as i64, w as i64, 3])?)
}

fn check_crop(img: &RgbImage, crop: Crop) -> Result<()> {
    if crop.left as u64 + crop.width as u64 > img.width() as u64
        || crop.top as u64 + crop.height as u64 > img.height() as u64
    {
        bail!(
            "crop {crop:?} exceeds the {}x{} image (internal error: please report)",
            img.width(),
            img.height()
        );
    }
    Ok(())
}

/// ToTensor + Normalize of `crop` of `img` (mirrored left-right when `flip`), as float32 CHW.
fn chw_tensor(img: &RgbImage, crop: Crop, flip: bool, norm: &Normalize) -> Result<Tensor> {
    let lut = norm.table()?;
    check_crop(img, crop)?;
    let (w, h) = (crop.width as usize, crop.height as usize);
    let (stride, plane) = (img.width() as usize * 3, w * h);
    let raw = img.as_raw();
    let mut out = vec![0f32; 3 * plane];
    for y in 0..h {
        let start = (crop.top as usize + y) * stride + crop.left as usize * 3;
        let row = &raw[start..start + 3 * w];
        for x in 0..w {
            let sx = if flip { w - 1 - x } else { x };
            let px = &row[3 * sx..3 * sx + 3];
            for c in 0..3 {
                out[c * plane + y * w + x] = lut[c][px[c] as usize];
            }
        }
    }
    Ok(Tensor::f_from_slice(&out)?.f_view([3, h as i64, w as i64])?)
}

#[cfg(test)]
mod tests {
    use super::*;
    use image::Rgb;
    use rand::rngs::StdRng;
    use rand::SeedableRng;

    /// R encodes x, G encodes y (mod 256), B is constant: crops and flips can be read back.
    fn coords(w: u32, h: u32) -> RgbImage {
        RgbImage::from_fn(w, h, |x, y| Rgb([(x % 256) as u8, (y % 256) as u8, 77]))
    }

    fn values(t: &Tensor) -> Vec<f32> {
        Vec::<f32>::try_from(t.flatten(0, -1)).unwrap()
    }

    /// Pixel (channel, y, x) of a CHW tensor, converted back to the 0..=255 level.
    fn level(t: &Tensor, c: i64, y: i64, x: i64) -> u8 {
        (t.double_value(&[c, y, x]) * 255.0).round() as u8
    }

    #[test]
    fn outputs_are_float_chw_of_the_requested_size() {
        let mut rng = StdRng::seed_from_u64(0);
        for (w, h) in [(500, 375), (375, 500), (28, 28), (5, 3), (1, 40)] {
            let img = coords(w, h);
            for size in [32, 224] {
                let t = train_transform(
                    &img,
                    size,
                    &mut rng,
                    &Normalize::IMAGENET,
                    Augment::TORCHVISION,
                )
                .unwrap();
                assert_eq!(t.size(), [3, size as i64, size as i64], "{w}x{h} train");
                assert_eq!(t.kind(), tch::Kind::Float);
                let t = eval_transform(&img, size, &Normalize::IMAGENET).unwrap();
                assert_eq!(t.size(), [3, size as i64, size as i64], "{w}x{h} eval");
                assert_eq!(t.kind(), tch::Kind::Float);
            }
        }
    }

    #[test]
    fn values_are_normalised_unit_range() {
        let mut rng = StdRng::seed_from_u64(1);
        let img = RgbImage::from_fn(64, 48, |x, y| {
            Rgb([(x * 4) as u8, (y * 5) as u8, ((x * y) % 256) as u8])
        });
        let n = Normalize::IMAGENET;
        for t in [
            train_transform(&img, 40, &mut rng, &n, Augment::TORCHVISION).unwrap(),
            eval_transform(&img, 40, &n).unwrap(),
        ] {
            for c in 0..3 {
                let v = values(&t.get(c as i64));
                let (lo, hi) = ((0.0 - n.mean[c]) / n.std[c], (1.0 - n.mean[c]) / n.std[c]);
                assert!(
                    v.iter().all(|&x| x >= lo - 1e-6 && x <= hi + 1e-6),
                    "channel {c}"
                );
            }
        }
        let raw = values(&to_tensor(&img, &Normalize::NONE).unwrap());
        assert!(raw.iter().all(|&x| (0.0..=1.0).contains(&x)));
        // Exactly torchvision's float32 arithmetic: (255 / 255 - 0.485) / 0.229.
        let one = to_tensor(&RgbImage::from_pixel(1, 1, Rgb([255, 0, 0])), &n).unwrap();
        assert_eq!(
            one.double_value(&[0, 0, 0]) as f32,
            (1.0f32 - 0.485) / 0.229
        );
        assert_eq!(
            one.double_value(&[1, 0, 0]) as f32,
            (0.0f32 - 0.456) / 0.224
        );
    }

    #[test]
    fn same_seed_same_tensor_different_seed_different() {
        let img = coords(120, 90);
        let run = |seed| {
            let mut rng = StdRng::seed_from_u64(seed);
            train_transform(
                &img,
                32,
                &mut rng,
                &Normalize::IMAGENET,
                Augment::TORCHVISION,
            )
            .unwrap()
        };
        assert!(run(7).equal(&run(7)));
        assert!(!run(7).equal(&run(8)));
    }

    #[test]
    fn eval_center_crop_matches_torchvision_rounding() {
        // size 28 -> shorter side int(28 * 256 / 224) = 32. A 32-wide image needs no resize, so
        // the crop offsets can be read straight from the coordinate colours.
        assert_eq!(eval_resize_size(224), 256);
        assert_eq!(eval_resize_size(28), 32);
        assert_eq!(resize_shorter_dims(500, 375, 256), (341, 256)); // int(256 * 500 / 375)
        assert_eq!(resize_shorter_dims(375, 500, 256), (256, 341));
        // (h - size) / 2 = 6.5 -> 6 and 7.5 -> 8 (Python's round: half to even); left = 2.
        for (h, top) in [(41, 6), (43, 8), (32, 2)] {
            let t = eval_transform(&coords(32, h), 28, &Normalize::NONE).unwrap();
            assert_eq!(level(&t, 0, 0, 0), 2, "left for h={h}");
            assert_eq!(level(&t, 1, 0, 0), top, "top for h={h}");
            assert_eq!(level(&t, 0, 5, 27), 2 + 27);
            assert_eq!(level(&t, 1, 27, 5), top + 27);
            assert_eq!(level(&t, 2, 9, 9), 77);
        }
    }

    #[test]
    fn eval_resizes_the_shorter_side() {
        // A uniform image stays uniform through resize + crop, whatever the geometry.
        let img = RgbImage::from_pixel(300, 100, Rgb([10, 200, 30]));
        let t = eval_transform(&img, 56, &Normalize::NONE).unwrap();
        assert_eq!(t.size(), [3, 56, 56]);
        assert_eq!(
            (
                level(&t, 0, 3, 50),
                level(&t, 1, 40, 0),
                level(&t, 2, 55, 55)
            ),
            (10, 200, 30)
        );
    }

    #[test]
    fn crop_params_fit_and_fall_back_like_torchvision() {
        let mut rng = StdRng::seed_from_u64(3);
        for (w, h) in [(500, 375), (28, 28), (3, 200), (1, 1)] {
            for _ in 0..200 {
                let c = random_resized_crop_params(w, h, SCALE, RATIO, &mut rng);
                assert!(c.width >= 1 && c.height >= 1);
                assert!(
                    c.left + c.width <= w && c.top + c.height <= h,
                    "{c:?} in {w}x{h}"
                );
            }
        }
        // An unreachable scale forces the fallback: central crop, ratio clamped to 4/3.
        let c = random_resized_crop_params(100, 10, (2.0, 2.0), RATIO, &mut rng);
        assert_eq!(
            c,
            Crop {
                top: 0,
                left: 43,
                height: 10,
                width: 13
            }
        );
        let c = random_resized_crop_params(10, 100, (2.0, 2.0), RATIO, &mut rng);
        assert_eq!(
            c,
            Crop {
                top: 43,
                left: 0,
                height: 13,
                width: 10
            }
        ); // round(10 / 0.75)
        let c = random_resized_crop_params(40, 35, (2.0, 2.0), RATIO, &mut rng);
        assert_eq!(
            c,
            Crop {
                top: 0,
                left: 0,
                height: 35,
                width: 40
            }
        );
        // A found crop has the drawn area and aspect (up to rounding).
        let (mut found, mut rng) = (0, StdRng::seed_from_u64(4));
        for _ in 0..500 {
            let c = random_resized_crop_params(1000, 1000, SCALE, RATIO, &mut rng);
            let (area, aspect) = (
                c.width as f64 * c.height as f64 / 1e6,
                c.width as f64 / c.height as f64,
            );
            if c != (Crop {
                top: 0,
                left: 0,
                height: 1000,
                width: 1000,
            }) {
                found += 1;
                assert!((0.075..=1.0).contains(&area), "{area}");
                assert!((0.74..=1.35).contains(&aspect), "{aspect}");
            }
        }
        assert!(found > 450);
    }

    #[test]
    fn flip_mirrors_and_follows_the_seed() {
        // R grows left to right: a flipped output has R falling along x.
        let img = coords(200, 150);
        let (mut flipped, mut kept) = (0, 0);
        for seed in 0..40 {
            let mut rng = StdRng::seed_from_u64(seed);
            let t = train_transform(&img, 24, &mut rng, &Normalize::NONE, Augment::TORCHVISION)
                .unwrap();
            // Replay the draws: crop parameters first, then the flip coin.
            let mut replay = StdRng::seed_from_u64(seed);
            let c = random_resized_crop_params(200, 150, SCALE, RATIO, &mut replay);
            let flip = replay.gen::<f64>() < 0.5;
            let (first, last) = (level(&t, 0, 12, 0), level(&t, 0, 12, 23));
            if c.width > 24 {
                assert_eq!(
                    first > last,
                    flip,
                    "seed {seed}: R {first}..{last}, crop {c:?}"
                );
            }
            // Same pixels as the unflipped pipeline, mirrored.
            let region = imageops::crop_imm(&img, c.left, c.top, c.width, c.height);
            let mut expect = imageops::resize(&*region, 24, 24, FilterType::Triangle);
            if flip {
                expect = imageops::flip_horizontal(&expect);
            }
            assert!(
                t.equal(&to_tensor(&expect, &Normalize::NONE).unwrap()),
                "seed {seed}"
            );
            if flip {
                flipped += 1
            } else {
                kept += 1
            }
        }
        assert!(
            flipped >= 10 && kept >= 10,
            "flipped {flipped}, kept {kept}"
        );
    }

    #[test]
    fn bad_inputs_are_errors_not_panics() {
        let mut rng = StdRng::seed_from_u64(0);
        let img = coords(10, 10);
        let err = train_transform(
            &img,
            0,
            &mut rng,
            &Normalize::IMAGENET,
            Augment::TORCHVISION,
        )
        .unwrap_err();
        assert!(err.to_string().contains("size is 0"), "{err}");
        let err = eval_transform(&RgbImage::new(0, 0), 8, &Normalize::IMAGENET).unwrap_err();
        assert!(err.to_string().contains("empty"), "{err}");
        let err = eval_transform(&coords(1, 10_000), 224, &Normalize::IMAGENET).unwrap_err();
        assert!(err.to_string().contains("extreme aspect"), "{err}");
        let bad = Normalize {
            mean: [0.5; 3],
            std: [0.5, 0.0, 0.5],
        };
        let err = eval_transform(&img, 8, &bad).unwrap_err();
        assert!(err.to_string().contains("std must be a positive"), "{err}");
    }

    /// The uint8 pixels normalised on the device equal the host's float transform (ToTensor +
    /// Normalize, torchvision's arithmetic) exactly, in either memory format: a job's losses
    /// are those of float NCHW batches.
    #[test]
    fn pixels_normalised_on_the_device_equal_the_float_transform() {
        let img = RgbImage::from_fn(61, 47, |x, y| {
            Rgb([
                (x * 7 % 256) as u8,
                (y * 13 % 256) as u8,
                ((x + y) * 5 % 256) as u8,
            ])
        });
        let mut rng = StdRng::seed_from_u64(3);
        let train = train_selection(&img, 32, &mut rng, Augment::TORCHVISION).unwrap();
        for sel in [train, eval_selection(&img, 32).unwrap()] {
            let want = sel.chw(&Normalize::IMAGENET).unwrap().unsqueeze(0);
            let pixels = sel.hwc().unwrap();
            assert_eq!(pixels.kind(), Kind::Uint8);
            assert_eq!(pixels.size(), [32, 32, 3]);
            for channels_last in [false, true] {
                let norm =
                    DeviceNormalize::new(&Normalize::IMAGENET, trainbook_engine::Device::Cpu);
                let got = norm
                    .unwrap()
                    .apply(&pixels.unsqueeze(0), channels_last)
                    .unwrap();
                assert_eq!(got.size(), [1, 3, 32, 32]);
                assert_eq!(trainbook_engine::is_channels_last(&got), channels_last);
                assert_eq!(got.is_contiguous(), !channels_last);
                let diff = (&got - &want).abs().max().double_value(&[]);
                assert_eq!(diff, 0.0, "max difference {diff}");
            }
        }
    }
}
