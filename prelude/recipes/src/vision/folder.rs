//! `ImageFolder`: a labelled image dataset laid out as `root/<class>/<image files>`, indexed the
//! way torchvision's `datasets.ImageFolder` indexes it, so class ids (and sample order) agree with
//! a PyTorch run on the same directory.
//!
//! * Classes are the sorted subdirectory names of `root` (torchvision's `find_classes`); class
//!   id = position in that list. Hidden directories (`.ipynb_checkpoints`, `.git`, ...) are not
//!   classes: torchvision would count them, which silently shifts every id after them — a
//!   notebook autosave must not change the labels.
//! * Each class directory is walked recursively (symlinks followed, as torchvision does), in
//!   torchvision's order: directories sorted by path, files sorted by name within a directory.
//! * Files count when their extension is one of [`IMG_EXTENSIONS`] (case-insensitive); others
//!   (`notes.txt`, `.DS_Store`) are ignored silently, as torchvision ignores them.
//! * Unlike torchvision, every candidate file's header is read during the scan, so corrupt or
//!   mislabelled files (truncated downloads, macOS `._x.jpg` resource forks, HTML error pages
//!   saved as `.jpg`) are listed in [`ImageFolder::skipped`] with the reason, instead of crashing
//!   a worker in the middle of an epoch. Only the header is checked: a file whose pixel data is
//!   truncated still fails later, in [`ImageFolder::load`], with an error naming it.

use anyhow::{bail, Context, Result};
use image::{ImageError, ImageReader, RgbImage};
use std::collections::HashSet;
use std::fs;
use std::path::{Path, PathBuf};

/// The extensions scanned for (torchvision's `IMG_EXTENSIONS`, restricted to the formats used for
/// photo datasets). Matched case-insensitively. This build decodes PNG and JPEG; `.bmp`/`.webp`
/// files are still picked up so they show in [`ImageFolder::skipped`] with a "convert" hint
/// rather than vanishing silently.
pub const IMG_EXTENSIONS: &[&str] = &["jpg", "jpeg", "png", "bmp", "webp"];

/// Names accepted for the held-out split by [`find_splits`], in order of preference.
pub const HELD_OUT_SPLITS: &[&str] = &["val", "validation", "test"];

const LAYOUT_HINT: &str =
    "expected root/<class>/<image files>, e.g. hymenoptera_data/train/ants/x.jpg";

pub use trainbook_api::ImageFolder;

/// Scans `root/<class>/<image files>`. Fails when `root` is missing or not a directory, when it
/// has no class directories, when no file decodes, or when some class ends up with no valid
/// image (as torchvision does: an empty class would leave an id that can never be predicted
/// correctly, which is almost always a broken download).
pub fn scan(root: &Path) -> Result<ImageFolder> {
    let classes = class_dirs(root)?;
    let candidates = class_files(&classes)?;
    let checks = check_headers(&candidates);
    let mut samples = Vec::with_capacity(candidates.len());
    let mut skipped = Vec::new();
    for ((path, id), check) in candidates.into_iter().zip(checks) {
        match check {
            Ok(()) => samples.push((path, id)),
            Err(reason) => skipped.push((path, reason)),
        }
    }
    let class_names: Vec<String> = classes.into_iter().map(|(_, name, _)| name).collect();

    if samples.is_empty() {
        let why = match skipped.first() {
            Some((p, reason)) => format!(
                "; {} file(s) with image extensions failed to decode, e.g. {}: {reason}",
                skipped.len(),
                p.display()
            ),
            None => format!(" (extensions looked for: {})", IMG_EXTENSIONS.join(", ")),
        };
        bail!(
            "no valid images under {} (classes: {}){why}. {LAYOUT_HINT}; check the download \
             or re-extract the archive",
            root.display(),
            class_names.join(", ")
        );
    }
    no_empty_class(root, &class_names, &samples, &skipped)?;
    Ok(ImageFolder {
        root: root.to_path_buf(),
        classes: class_names,
        samples,
        skipped,
    })
}

/// A class per directory of `root` (hidden ones skipped), as (name bytes, name, path) in
/// byte order of the names; an error for a missing root, a file, no class directories or
/// split directories where classes belong.
type ClassDir = (Vec<u8>, String, PathBuf);
fn class_dirs(root: &Path) -> Result<Vec<ClassDir>> {
    let meta = fs::metadata(root).map_err(|e| {
        anyhow::anyhow!(
            "image folder {} cannot be read ({e}): {LAYOUT_HINT}. Check the path; for the \
             bundled digits data run `bash scripts/fetch-data.sh`",
            root.display()
        )
    })?;
    if !meta.is_dir() {
        bail!(
            "image folder {} is a file, not a directory: {LAYOUT_HINT}. Pass the split \
             directory (unpack archives first)",
            root.display()
        );
    }

    let entries = list_dir(root)?;
    let mut classes: Vec<ClassDir> = Vec::new();
    let mut loose_images = 0usize;
    for path in entries {
        let name = path.file_name().unwrap_or_default();
        let is_dir = fs::metadata(&path).map(|m| m.is_dir()).unwrap_or(false);
        if is_dir && !is_hidden(name) {
            let key = name.as_encoded_bytes().to_vec();
            classes.push((key, name.to_string_lossy().into_owned(), path));
        } else if !is_dir && has_image_ext(&path) {
            loose_images += 1;
        }
    }
    if classes.is_empty() {
        let hint = if loose_images > 0 {
            format!(
                "; it holds {loose_images} image file(s) directly — move them into one \
                 subdirectory per class (a single class is fine: root/all/x.jpg)"
            )
        } else {
            String::new()
        };
        bail!(
            "image folder {} has no class directories: {LAYOUT_HINT}{hint}",
            root.display()
        );
    }
    // Byte order of the names = Python's code-point order of `sorted(...)` for UTF-8 names.
    classes.sort_by(|a, b| a.0.cmp(&b.0));
    // `train` next to `val` as "classes" is a dataset root passed where a split was meant: it
    // would scan fine and train a 2-class split classifier, so refuse it.
    let is_class = |n: &str| classes.iter().any(|c| c.1 == n);
    if is_class("train") && HELD_OUT_SPLITS.iter().any(|s| is_class(s)) {
        bail!(
            "{} holds split directories (train, {}), not class directories: scan one split, \
             e.g. ImageFolder::scan_split(root, \"train\"), or use find_splits(root)",
            root.display(),
            HELD_OUT_SPLITS
                .iter()
                .filter(|s| is_class(s))
                .copied()
                .collect::<Vec<_>>()
                .join(", ")
        );
    }
    Ok(classes)
}

/// Every file under each class directory with its class id, in torchvision's order.
fn class_files(classes: &[ClassDir]) -> Result<Vec<(PathBuf, usize)>> {
    let mut candidates: Vec<(PathBuf, usize)> = Vec::new();
    for (id, (_, _, dir)) in classes.iter().enumerate() {
        let mut files = Vec::new();
        walk(dir, &mut HashSet::new(), &mut files)?;
        // torchvision: `sorted(os.walk(dir))`, then `sorted(fnames)` within each directory.
        files.sort_by_cached_key(|p| {
            let dir = p.parent().unwrap_or(Path::new("")).as_os_str();
            let name = p.file_name().unwrap_or_default();
            (
                dir.as_encoded_bytes().to_vec(),
                name.as_encoded_bytes().to_vec(),
            )
        });
        candidates.extend(files.into_iter().map(|p| (p, id)));
    }
    Ok(candidates)
}

/// Every class keeps at least one valid image (an empty one would leave an id that can never
/// be predicted).
fn no_empty_class(
    root: &Path,
    class_names: &[String],
    samples: &[(PathBuf, usize)],
    skipped: &[(PathBuf, String)],
) -> Result<()> {
    let mut counts = vec![0usize; class_names.len()];
    for (_, id) in samples {
        counts[*id] += 1;
    }
    let empty: Vec<&str> = counts
        .iter()
        .zip(class_names)
        .filter(|(n, _)| **n == 0)
        .map(|(_, name)| name.as_str())
        .collect();
    if !empty.is_empty() {
        let undecodable = match skipped.len() {
            0 => String::new(),
            n => format!(" ({n} undecodable file(s) are listed in `skipped`)"),
        };
        bail!(
            "class directories without a valid image under {}: {}{undecodable}. Add images \
             (extensions {}) or remove those directories, so that class ids stay meaningful",
            root.display(),
            empty.join(", "),
            IMG_EXTENSIONS.join(", "),
        );
    }
    Ok(())
}

/// Decodes sample `i` as 8-bit RGB (see [`load_rgb`]).
pub fn load(folder: &ImageFolder, i: usize) -> Result<RgbImage> {
    let (path, _) = folder.samples.get(i).with_context(|| {
        format!(
            "sample index {i} is out of range: {} has {} samples (0..{})",
            folder.root.display(),
            folder.samples.len(),
            folder.samples.len()
        )
    })?;
    load_rgb(path)
}

/// Decodes an image file as 8-bit RGB like PIL's `Image.open(p).convert("RGB")`: grayscale is
/// replicated to three channels, alpha is dropped (not composited), palettes are expanded.
/// The format is taken from the file's magic bytes first, the extension second (a PNG saved as
/// `.jpg` still loads). EXIF orientation is not applied, as torchvision's loader does not.
pub fn load_rgb(path: &Path) -> Result<RgbImage> {
    let reader = ImageReader::open(path)
        .and_then(|r| r.with_guessed_format())
        .map_err(|e| {
            anyhow::anyhow!(
                "cannot open image {} ({e}): check that it exists and is readable",
                path.display()
            )
        })?;
    // Decoder panics on hostile files become errors naming the file (a worker must not die).
    let img = std::panic::catch_unwind(std::panic::AssertUnwindSafe(move || reader.decode()))
        .map_err(|_| {
            anyhow::anyhow!(
                "the decoder crashed on image {}: delete or re-encode it",
                path.display()
            )
        })?
        .map_err(|e| {
            anyhow::anyhow!(
                "cannot decode image {}: {}",
                path.display(),
                decode_reason(&e)
            )
        })?;
    if img.width() == 0 || img.height() == 0 {
        bail!(
            "image {} is empty ({}x{}): remove or replace the file",
            path.display(),
            img.width(),
            img.height()
        );
    }
    Ok(img.into_rgb8())
}

/// The split directories of a dataset root: `(root/train, root/<held-out>)`, where the held-out
/// split is the first of [`HELD_OUT_SPLITS`] that exists (`val`, `validation`, `test`).
pub fn find_splits(root: &Path) -> Result<(PathBuf, PathBuf)> {
    if !root.is_dir() {
        bail!(
            "dataset root {} is not a directory: expected root/train/<class>/<images> and \
             root/val/<class>/<images> (e.g. hymenoptera_data/train/ants/x.jpg); check the path",
            root.display()
        );
    }
    let train = root.join("train");
    let held_out = HELD_OUT_SPLITS
        .iter()
        .map(|s| root.join(s))
        .find(|p| p.is_dir());
    match (train.is_dir(), held_out) {
        (true, Some(val)) => Ok((train, val)),
        (has_train, held_out) => {
            let mut found: Vec<String> = list_dir(root)?
                .into_iter()
                .filter(|p| p.is_dir())
                .filter_map(|p| p.file_name().map(|n| n.to_string_lossy().into_owned()))
                .collect();
            found.sort();
            let missing = match (has_train, held_out.is_some()) {
                (false, false) => "neither `train` nor a held-out split".to_string(),
                (false, true) => "no `train` directory".to_string(),
                _ => format!("no held-out split ({})", HELD_OUT_SPLITS.join(" / ")),
            };
            bail!(
                "dataset root {} has {missing}; its subdirectories are [{}]. Expected \
                 root/train/<class>/<images> plus root/val (or validation, test)/<class>/<images>; \
                 rename the split directories or point at the directory that holds them",
                root.display(),
                found.join(", ")
            )
        }
    }
}

fn list_dir(dir: &Path) -> Result<Vec<PathBuf>> {
    let unreadable = |e: std::io::Error| {
        anyhow::anyhow!(
            "cannot list directory {} ({e}): check that it exists and is readable",
            dir.display()
        )
    };
    let mut out = Vec::new();
    for entry in fs::read_dir(dir).map_err(unreadable)? {
        out.push(entry.map_err(unreadable)?.path());
    }
    Ok(out)
}

fn is_hidden(name: &std::ffi::OsStr) -> bool {
    name.as_encoded_bytes().first() == Some(&b'.')
}

fn has_image_ext(path: &Path) -> bool {
    path.extension()
        .and_then(|e| e.to_str())
        .is_some_and(|e| IMG_EXTENSIONS.iter().any(|x| e.eq_ignore_ascii_case(x)))
}

/// Collects the image-extension files below `dir`. `seen` holds the canonical directories already
/// walked, so a symlink cycle (followed like `os.walk(followlinks=True)`) cannot recurse forever.
fn walk(dir: &Path, seen: &mut HashSet<PathBuf>, out: &mut Vec<PathBuf>) -> Result<()> {
    if let Ok(canonical) = fs::canonicalize(dir) {
        if !seen.insert(canonical) {
            return Ok(());
        }
    }
    for path in list_dir(dir)? {
        let Ok(meta) = fs::metadata(&path) else {
            continue; // dangling symlink: nothing to read, torchvision's walk skips it too
        };
        if meta.is_dir() {
            if !is_hidden(path.file_name().unwrap_or_default()) {
                walk(&path, seen, out)?;
            }
        } else if has_image_ext(&path) {
            out.push(path);
        }
    }
    Ok(())
}

/// Reads every candidate's header (format + dimensions only), in parallel: on a large dataset the
/// scan is dominated by file-open latency, which threads hide well.
fn check_headers(files: &[(PathBuf, usize)]) -> Vec<Result<(), String>> {
    let threads = std::thread::available_parallelism()
        .map_or(1, |n| n.get())
        .min(16);
    let chunk = files.len().div_ceil(threads).max(256);
    std::thread::scope(|s| {
        let handles: Vec<_> = files
            .chunks(chunk)
            .map(|part| {
                let handle = s.spawn(move || part.iter().map(|(p, _)| check_header(p)).collect());
                (part.len(), handle)
            })
            .collect();
        handles
            .into_iter()
            .flat_map(|(n, h)| {
                // check_header catches decoder panics itself; this only keeps results aligned
                // with `files` should a thread die anyway.
                h.join()
                    .unwrap_or_else(|_| vec![Err("header check failed".to_string()); n])
            })
            .collect()
    })
}

fn check_header(path: &Path) -> Result<(), String> {
    // A decoder bug on a hostile file must cost one sample, not the whole scan.
    let header = std::panic::catch_unwind(|| {
        ImageReader::open(path)
            .and_then(|r| r.with_guessed_format())
            .map_err(|e| format!("cannot open: {e}"))?
            .into_dimensions()
            .map_err(|e| decode_reason(&e))
    });
    let (w, h) = header.unwrap_or_else(|_| Err("the decoder crashed on this file".to_string()))?;
    if w == 0 || h == 0 {
        return Err(format!("empty image ({w}x{h})"));
    }
    Ok(())
}

/// A decode error as a reason that says what to do about it.
fn decode_reason(e: &ImageError) -> String {
    match e {
        ImageError::Unsupported(_) => {
            format!("{e} (this build decodes PNG and JPEG only: convert the file, e.g. to PNG)")
        }
        ImageError::Limits(_) => format!("{e} (image too large to decode: downscale it)"),
        _ => {
            format!("not a valid image: {e} (corrupt or truncated file: re-download or delete it)")
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use image::{GrayImage, Luma, Rgb};

    /// A fresh directory under the system temp dir, removed on drop (no tempfile dependency).
    struct TempDir(PathBuf);

    impl TempDir {
        fn new(tag: &str) -> TempDir {
            use std::sync::atomic::{AtomicUsize, Ordering};
            static N: AtomicUsize = AtomicUsize::new(0);
            let dir = std::env::temp_dir().join(format!(
                "trainbook-folder-{tag}-{}-{}",
                std::process::id(),
                N.fetch_add(1, Ordering::Relaxed)
            ));
            let _ = fs::remove_dir_all(&dir);
            fs::create_dir_all(&dir).unwrap();
            TempDir(dir)
        }
    }

    impl Drop for TempDir {
        fn drop(&mut self) {
            let _ = fs::remove_dir_all(&self.0);
        }
    }

    fn write_png(path: &Path, w: u32, h: u32, shade: u8) {
        fs::create_dir_all(path.parent().unwrap()).unwrap();
        RgbImage::from_fn(w, h, |x, y| Rgb([shade, x as u8, y as u8]))
            .save(path)
            .unwrap();
    }

    /// root/{cats,ants}/ with valid PNGs, one corrupt .png, one notes.txt, one hidden dir.
    fn fixture() -> TempDir {
        let t = TempDir::new("fixture");
        let r = &t.0;
        write_png(&r.join("cats/b.png"), 8, 8, 10);
        write_png(&r.join("cats/a.PNG"), 8, 8, 20);
        write_png(&r.join("cats/sub/c.png"), 8, 6, 30);
        write_png(&r.join("ants/x.png"), 8, 8, 40);
        write_png(&r.join("ants/y.png"), 5, 7, 50);
        // Random bytes named .png: must be skipped with a reason, not crash the scan.
        let junk: Vec<u8> = (0..200u32)
            .map(|i| (i.wrapping_mul(2654435761) >> 13) as u8)
            .collect();
        fs::write(r.join("ants/broken.png"), junk).unwrap();
        fs::write(r.join("ants/notes.txt"), "not an image").unwrap();
        write_png(&r.join(".ipynb_checkpoints/z.png"), 8, 8, 0);
        t
    }

    #[test]
    fn scans_sorted_classes_and_skips_corrupt_files() {
        let t = fixture();
        let f = scan(&t.0).unwrap();
        assert_eq!(f.classes, vec!["ants", "cats"]);
        assert_eq!(f.len(), 5);
        assert!(!f.is_empty());
        assert_eq!(f.class_counts(), vec![2, 3]);
        let names: Vec<(String, usize)> = f
            .samples
            .iter()
            .map(|(p, c)| (p.strip_prefix(&t.0).unwrap().display().to_string(), *c))
            .collect();
        // Files of a directory by name (uppercase sorts first), then subdirectories.
        let expected = [
            ("ants/x.png", 0),
            ("ants/y.png", 0),
            ("cats/a.PNG", 1),
            ("cats/b.png", 1),
            ("cats/sub/c.png", 1),
        ];
        assert_eq!(names, expected.map(|(p, c)| (p.to_string(), c)));
        assert_eq!(f.skipped.len(), 1, "{:?}", f.skipped);
        assert_eq!(f.skipped[0].0, t.0.join("ants/broken.png"));
        assert!(
            f.skipped[0].1.contains("not a valid image"),
            "{}",
            f.skipped[0].1
        );
    }

    #[test]
    fn load_returns_rgb_of_the_file_size() {
        let t = fixture();
        let f = scan(&t.0).unwrap();
        let img = load(&f, 1).unwrap(); // ants/y.png, 5x7, shade 50
        assert_eq!(img.dimensions(), (5, 7));
        assert_eq!(img.get_pixel(3, 2), &Rgb([50, 3, 2]));
        let err = load(&f, 99).unwrap_err().to_string();
        assert!(
            err.contains("out of range") && err.contains("5 samples"),
            "{err}"
        );
    }

    #[test]
    fn grayscale_loads_as_replicated_rgb() {
        let t = TempDir::new("gray");
        let p = t.0.join("d/0.png");
        fs::create_dir_all(p.parent().unwrap()).unwrap();
        GrayImage::from_fn(28, 28, |x, _| Luma([x as u8 * 9]))
            .save(&p)
            .unwrap();
        let img = load(&scan(&t.0).unwrap(), 0).unwrap();
        assert_eq!(img.dimensions(), (28, 28));
        assert_eq!(img.get_pixel(3, 0), &Rgb([27, 27, 27]));
    }

    #[test]
    fn missing_root_says_what_layout_is_expected() {
        let err = scan(Path::new("/nonexistent/hymenoptera/train"))
            .unwrap_err()
            .to_string();
        assert!(err.contains("/nonexistent/hymenoptera/train"), "{err}");
        assert!(err.contains("root/<class>/<image files>"), "{err}");
    }

    #[test]
    fn layout_errors_are_explained() {
        // Images directly in root: no class directories.
        let t = TempDir::new("flat");
        write_png(&t.0.join("a.png"), 4, 4, 0);
        let err = scan(&t.0).unwrap_err().to_string();
        assert!(
            err.contains("no class directories") && err.contains("move them"),
            "{err}"
        );

        // Class directories, but nothing decodes.
        let t = TempDir::new("junk");
        fs::create_dir_all(t.0.join("a")).unwrap();
        fs::write(t.0.join("a/x.jpg"), b"<html>404</html>").unwrap();
        let err = scan(&t.0).unwrap_err().to_string();
        assert!(
            err.contains("no valid images") && err.contains("x.jpg"),
            "{err}"
        );

        // One class without images.
        let t = TempDir::new("emptyclass");
        write_png(&t.0.join("a/x.png"), 4, 4, 0);
        fs::create_dir_all(t.0.join("b")).unwrap();
        let err = scan(&t.0).unwrap_err().to_string();
        assert!(
            err.contains("without a valid image") && err.contains(": b. Add images"),
            "{err}"
        );
    }

    #[test]
    fn find_splits_accepts_val_names_and_lists_what_is_there() {
        let t = TempDir::new("splits");
        write_png(&t.0.join("train/a/x.png"), 4, 4, 0);
        write_png(&t.0.join("test/a/y.png"), 4, 4, 0);
        assert_eq!(
            find_splits(&t.0).unwrap(),
            (t.0.join("train"), t.0.join("test"))
        );
        // Scanning the dataset root instead of a split is refused, with the fix.
        let err = scan(&t.0).unwrap_err().to_string();
        assert!(
            err.contains("split directories (train, test)") && err.contains("scan_split"),
            "{err}"
        );
        assert_eq!(scan(&t.0.join("test")).unwrap().classes, vec!["a"]);
        fs::create_dir_all(t.0.join("validation")).unwrap();
        assert_eq!(find_splits(&t.0).unwrap().1, t.0.join("validation"));

        let t = TempDir::new("nosplits");
        fs::create_dir_all(t.0.join("training")).unwrap();
        fs::create_dir_all(t.0.join("dev")).unwrap();
        let err = find_splits(&t.0).unwrap_err().to_string();
        assert!(
            err.contains("[dev, training]") && err.contains("neither"),
            "{err}"
        );
    }

    /// The digits set written by scripts/fetch-data.sh, when it is there: counts and decoding.
    #[test]
    fn fetched_digits_when_present() {
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../.data/datasets/digits");
        if !root.join(".complete").exists() {
            eprintln!("skipping: {} not fetched", root.display());
            return;
        }
        let (train, val) = find_splits(&root).unwrap();
        let train = scan(&train).unwrap();
        let val = scan(&val).unwrap();
        let digits: Vec<String> = (0..10).map(|d| d.to_string()).collect();
        assert_eq!(
            (train.classes.clone(), val.classes.clone()),
            (digits.clone(), digits)
        );
        assert_eq!(train.class_counts(), vec![400; 10]);
        assert_eq!(val.class_counts(), vec![100; 10]);
        assert!(train.skipped.is_empty() && val.skipped.is_empty());
        let img = load(&val, 999).unwrap();
        assert_eq!(img.dimensions(), (28, 28));
        assert!(
            img.pixels().all(|p| p[0] == p[1] && p[1] == p[2]),
            "gray replicated"
        );
        assert!(img.pixels().any(|p| p[0] > 128), "a digit has ink");
    }
}
