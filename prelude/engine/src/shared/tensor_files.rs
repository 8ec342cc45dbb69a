//! Named tensors on disk in one safetensors file (`model.safetensors`) or in several that an
//! index names (`model.safetensors.index.json` with its `weight_map`: Hugging Face's sharded
//! layout, which `transformers` loads as it is). The files are memory-mapped and a tensor is
//! read when asked for, so a reader holds one tensor at a time, not the files.
//!
//! Sharded checkpoints (ZeRO-3) are written in this layout by every rank at once: each rank
//! writes the whole tensors [`owners`] gives it, and rank 0 the index ([`write_index`]).

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use safetensors::tensor::{Dtype, TensorInfo};
use safetensors::SafeTensors;
use tch::{Kind, Tensor};

/// `<stem>.safetensors`: the single file.
pub fn single_name(stem: &str) -> String {
    format!("{stem}.safetensors")
}

/// `<stem>.safetensors.index.json`: the index of a sharded set.
pub fn index_name(stem: &str) -> String {
    format!("{stem}.safetensors.index.json")
}

/// `<stem>-0000k-of-0000n.safetensors`: the `k`-th (from 1) of `n` files, as `transformers`
/// names its shards.
pub fn shard_name(stem: &str, k: usize, n: usize) -> String {
    format!("{stem}-{k:05}-of-{n:05}.safetensors")
}

/// Whether `dir` holds `stem`'s tensors, in one file or sharded.
pub fn exists(dir: &Path, stem: &str) -> bool {
    dir.join(single_name(stem)).is_file() || dir.join(index_name(stem)).is_file()
}

/// The names of `stem`'s files in `dir`: the single file, or the index and every file it
/// names (each must be there); what copying a checkpoint's weights copies.
pub fn files_of(dir: &Path, stem: &str) -> Result<Vec<String>> {
    if dir.join(single_name(stem)).is_file() {
        return Ok(vec![single_name(stem)]);
    }
    let index = dir.join(index_name(stem));
    if !index.is_file() {
        bail!(
            "{} has neither {} nor {}: give a complete checkpoint directory (result.last_checkpoint)",
            dir.display(),
            single_name(stem),
            index_name(stem)
        );
    }
    let mut files = index_files(&index)?;
    if let Some(gone) = files.iter().find(|f| !dir.join(f).is_file()) {
        bail!(
            "{} names {gone}, which is not there: the checkpoint is incomplete (copy every file of it)",
            index.display()
        );
    }
    files.insert(0, index_name(stem));
    Ok(files)
}

/// The files of `stem` in `dir`, removed (a retired checkpoint's optimizer state).
pub(crate) fn remove(dir: &Path, stem: &str) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for e in entries.filter_map(|e| e.ok()) {
        let name = e.file_name().to_string_lossy().into_owned();
        let ours = name == single_name(stem)
            || name == index_name(stem)
            || (name.starts_with(&format!("{stem}-")) && name.ends_with(".safetensors"));
        if ours {
            std::fs::remove_file(e.path()).ok();
        }
    }
}

struct File {
    path: PathBuf,
    /// The open file: tensors are read with positioned reads, not through a mapping, so what
    /// was read stays in the page cache, not in the process's resident set (a mapping's
    /// touched pages count there until it is dropped: a rank reading its slices would hold
    /// the bytes twice).
    file: std::fs::File,
    len: usize,
    /// Where the tensors' data begins (after the header).
    data: usize,
}

/// `stem`'s tensors in a directory, read one at a time.
pub struct TensorFiles {
    /// The directory they were opened in.
    origin: PathBuf,
    files: Vec<File>,
    tensors: BTreeMap<String, (usize, TensorInfo)>,
}

impl TensorFiles {
    /// The tensors of `dir/<stem>.safetensors` or of the files `dir/<stem>.safetensors.index.json`
    /// names; `None` when neither is there.
    pub fn open(dir: &Path, stem: &str) -> Result<Option<TensorFiles>> {
        let single = dir.join(single_name(stem));
        let paths = if single.is_file() {
            vec![single]
        } else {
            let index = dir.join(index_name(stem));
            if !index.is_file() {
                return Ok(None);
            }
            index_files(&index)?.iter().map(|f| dir.join(f)).collect()
        };
        let mut out = TensorFiles {
            origin: dir.to_path_buf(),
            files: Vec::new(),
            tensors: BTreeMap::new(),
        };
        for path in paths {
            out.add(path)?;
        }
        Ok(Some(out))
    }

    fn add(&mut self, path: PathBuf) -> Result<()> {
        let f = std::fs::File::open(&path).with_context(|| {
            format!(
                "opening {}: the checkpoint is incomplete (copy every file of it)",
                path.display()
            )
        })?;
        // SAFETY: a read-only mapping of a file that nothing here writes; only its header is
        // read through it.
        let map = unsafe { memmap2::Mmap::map(&f) }
            .with_context(|| format!("mapping {}", path.display()))?;
        let (header, meta) = SafeTensors::read_metadata(&map)
            .map_err(|e| anyhow::anyhow!("{} is not a safetensors file: {e:?}", path.display()))?;
        let file = self.files.len();
        for (name, info) in meta.tensors() {
            self.tensors.insert(name, (file, info.clone()));
        }
        self.files.push(File {
            path,
            file: f,
            len: map.len(),
            data: 8 + header,
        });
        Ok(())
    }

    /// The directory the files are in (for messages).
    pub fn origin(&self) -> &Path {
        &self.origin
    }

    /// Every tensor's name, sorted.
    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.tensors.keys().map(String::as_str)
    }

    /// A tensor's shape, without reading it.
    pub fn shape(&self, name: &str) -> Option<Vec<i64>> {
        self.tensors
            .get(name)
            .map(|(_, i)| i.shape.iter().map(|&d| d as i64).collect())
    }

    /// The tensor `name` (a copy in memory, on the CPU); `None` when no file holds it.
    pub fn get(&self, name: &str) -> Result<Option<Tensor>> {
        let Some((file, info)) = self.tensors.get(name) else {
            return Ok(None);
        };
        let shape: Vec<i64> = info.shape.iter().map(|&d| d as i64).collect();
        let count = shape.iter().product();
        Ok(Some(
            self.read(*file, info, name, 0, count)?
                .view(shape.as_slice()),
        ))
    }

    /// Elements `[first, first + count)` of the tensor `name`, flattened: only their bytes
    /// are read (a ZeRO-3 rank's slice). `None` when no file holds it.
    pub fn get_range(&self, name: &str, first: i64, count: i64) -> Result<Option<Tensor>> {
        let Some((file, info)) = self.tensors.get(name) else {
            return Ok(None);
        };
        Ok(Some(self.read(*file, info, name, first, count)?))
    }

    /// Elements `[first, first + count)` of a stored tensor, read into a new one.
    fn read(
        &self,
        file: usize,
        info: &TensorInfo,
        name: &str,
        first: i64,
        count: i64,
    ) -> Result<Tensor> {
        let kind = kind_of(info.dtype)
            .with_context(|| format!("{name} in {}", self.files[file].path.display()))?;
        let t = Tensor::empty([count], (kind, tch::Device::Cpu));
        self.read_at(file, info, name, first, &t)?;
        Ok(t)
    }

    /// Reads the tensor `name` straight into `dst` when `dst` can take its bytes as they are
    /// (a contiguous CPU tensor of its dtype and element count): no copy of it is made in
    /// between, which halves what loading a large tensor adds to the peak. False otherwise
    /// (or when no file holds it).
    pub fn read_into(&self, name: &str, dst: &Tensor) -> Result<bool> {
        let Some((file, info)) = self.tensors.get(name) else {
            return Ok(false);
        };
        let numel: usize = info.shape.iter().product();
        let fits = kind_of(info.dtype).ok() == Some(dst.kind())
            && dst.device() == tch::Device::Cpu
            && dst.is_contiguous()
            && dst.numel() == numel
            && !dst.data_ptr().is_null();
        if fits {
            tch::no_grad(|| self.read_at(*file, info, name, 0, dst))?;
        }
        Ok(fits)
    }

    /// Fills `dst` (contiguous, on the CPU, of the stored dtype) with the stored tensor's
    /// elements from `first` on, with a positioned read.
    fn read_at(
        &self,
        file: usize,
        info: &TensorInfo,
        name: &str,
        first: i64,
        dst: &Tensor,
    ) -> Result<()> {
        use std::os::unix::fs::FileExt;
        let f = &self.files[file];
        let (start, end) = info.data_offsets;
        let size = dst.kind().elt_size_in_bytes();
        let from = start + first as usize * size;
        let bytes = dst.numel() * size;
        if from + bytes > end {
            bail!(
                "{name} in {} has fewer elements than asked for",
                f.path.display()
            );
        }
        if f.data + from + bytes > f.len {
            bail!(
                "{} is cut short: {name} lies past its end (the file was not written completely)",
                f.path.display()
            );
        }
        if bytes == 0 {
            return Ok(());
        }
        // SAFETY: `dst` is a live contiguous CPU tensor of exactly `bytes` bytes, which
        // nothing else touches during the read.
        let out = unsafe { std::slice::from_raw_parts_mut(dst.data_ptr() as *mut u8, bytes) };
        f.file
            .read_exact_at(out, (f.data + from) as u64)
            .with_context(|| format!("reading {name} from {}", f.path.display()))
    }

    /// Every tensor, read (the whole set in memory: for small models and tests).
    pub fn read_all(&self) -> Result<Vec<(String, Tensor)>> {
        self.names()
            .map(|n| Ok((n.to_string(), self.get(n)?.expect("a listed tensor"))))
            .collect()
    }

    /// Whether the files hold `name` (false when not); one of another shape than `dst` is an
    /// error that names it.
    pub(crate) fn holds(&self, name: &str, dst: &Tensor) -> Result<bool> {
        let Some(shape) = self.shape(name) else {
            return Ok(false);
        };
        if shape != dst.size() {
            bail!(
                "{name} has shape {shape:?} in the checkpoint, the model's is {:?}: the checkpoint was written by another model configuration",
                dst.size()
            );
        }
        Ok(true)
    }

    /// Copies each tensor of `vars` (by name) from the files, converting its dtype; returns
    /// the names the files do not hold. A tensor of another shape is an error that names it.
    pub fn load_into(&self, vars: &HashMap<String, Tensor>) -> Result<Vec<String>> {
        let mut missing = Vec::new();
        let mut names: Vec<&String> = vars.keys().collect();
        names.sort();
        for name in names {
            let dst = &vars[name];
            if !self.holds(name, dst)? {
                missing.push(name.clone());
                continue;
            }
            if !self.read_into(name, dst)? {
                let src = self
                    .get(name)?
                    .context("a tensor whose shape was just read")?;
                tch::no_grad(|| dst.shallow_clone().copy_(&src));
            }
        }
        Ok(missing)
    }
}

/// The files an index's `weight_map` names, sorted, once each.
fn index_files(index: &Path) -> Result<Vec<String>> {
    let json: serde_json::Value = serde_json::from_slice(
        &std::fs::read(index).with_context(|| format!("reading {}", index.display()))?,
    )
    .with_context(|| format!("{} is not JSON", index.display()))?;
    let map = json["weight_map"]
        .as_object()
        .with_context(|| format!("{} has no weight_map", index.display()))?;
    let mut files: Vec<String> = map
        .values()
        .filter_map(|v| v.as_str().map(String::from))
        .collect();
    files.sort();
    files.dedup();
    Ok(files)
}

fn kind_of(d: Dtype) -> Result<Kind> {
    Ok(match d {
        Dtype::F32 => Kind::Float,
        Dtype::F64 => Kind::Double,
        Dtype::F16 => Kind::Half,
        Dtype::BF16 => Kind::BFloat16,
        Dtype::I64 => Kind::Int64,
        Dtype::I32 => Kind::Int,
        Dtype::I16 => Kind::Int16,
        Dtype::I8 => Kind::Int8,
        Dtype::U8 => Kind::Uint8,
        Dtype::BOOL => Kind::Bool,
        other => bail!("tensors of dtype {other:?} are not read by trainbook"),
    })
}

/// Which of `world` ranks writes each tensor of a sharded set, from their sizes in bytes (in
/// the set's order): consecutive runs of about equal bytes, so every rank writes about 1/W of
/// the set and no rank holds more than its run while writing.
pub(crate) fn owners(bytes: &[u64], world: usize) -> Vec<usize> {
    let total: u64 = bytes.iter().sum::<u64>().max(1);
    let mut at = 0u64;
    bytes
        .iter()
        .map(|&b| {
            // The rank whose share the tensor's middle falls in.
            let mid = at as u128 * 2 + b as u128;
            at += b;
            ((mid * world as u128) / (2 * total as u128)).min(world as u128 - 1) as usize
        })
        .collect()
}

/// Writes `dir/<stem>.safetensors.index.json` for the shard files `<stem>-*-of-*.safetensors`
/// in `dir`, from their headers: each tensor's file (`weight_map`) and the set's bytes
/// (`metadata.total_size`), as `transformers` reads it.
pub(crate) fn write_index(dir: &Path, stem: &str) -> Result<()> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .with_context(|| format!("listing {}", dir.display()))?
        .filter_map(|e| e.ok())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| {
            n.starts_with(&format!("{stem}-")) && n.contains("-of-") && n.ends_with(".safetensors")
        })
        .collect();
    names.sort();
    let mut set = TensorFiles {
        origin: dir.to_path_buf(),
        files: Vec::new(),
        tensors: BTreeMap::new(),
    };
    for n in &names {
        set.add(dir.join(n))?;
    }
    let mut total_size = 0u64;
    let mut weight_map = BTreeMap::new();
    for (name, (file, info)) in &set.tensors {
        total_size += (info.data_offsets.1 - info.data_offsets.0) as u64;
        weight_map.insert(name.clone(), names[*file].clone());
    }
    let json = serde_json::json!({
        "metadata": { "total_size": total_size, "format": "pt" },
        "weight_map": weight_map,
    });
    let path = dir.join(index_name(stem));
    std::fs::write(&path, serde_json::to_vec_pretty(&json)?)
        .with_context(|| format!("writing {}", path.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn owners_split_the_bytes_into_consecutive_runs() {
        assert_eq!(owners(&[10, 10, 10, 10], 2), [0, 0, 1, 1]);
        assert_eq!(owners(&[10, 10, 10, 10], 4), [0, 1, 2, 3]);
        // One large tensor among small ones: its rank takes few others.
        assert_eq!(owners(&[1, 100, 1, 1, 1], 2), [0, 0, 1, 1, 1]);
        // More ranks than tensors: some write nothing.
        assert_eq!(owners(&[5, 5], 4), [1, 3]);
        assert_eq!(owners(&[], 3), Vec::<usize>::new());
        assert_eq!(owners(&[0, 0], 2), [0, 0]);
    }

    #[test]
    fn a_sharded_set_reads_as_the_single_file_did() {
        let dir =
            std::env::temp_dir().join(format!("trainbook-tensor-files-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let a = Tensor::arange(6, (Kind::Float, tch::Device::Cpu)).view([2, 3]);
        let b = Tensor::from_slice(&[1i64, 2]);
        let c = Tensor::ones([4], (Kind::BFloat16, tch::Device::Cpu));
        tch::Tensor::write_safetensors(
            &[("a", &a), ("c", &c)],
            dir.join(shard_name("model", 1, 2)),
        )
        .unwrap();
        tch::Tensor::write_safetensors(&[("b", &b)], dir.join(shard_name("model", 2, 2))).unwrap();
        write_index(&dir, "model").unwrap();
        let index: serde_json::Value =
            serde_json::from_slice(&std::fs::read(dir.join(index_name("model"))).unwrap()).unwrap();
        assert_eq!(index["weight_map"]["b"], shard_name("model", 2, 2));
        assert_eq!(index["metadata"]["total_size"], 6 * 4 + 2 * 8 + 4 * 2);
        assert!(exists(&dir, "model") && !exists(&dir, "optimizer"));
        let files = TensorFiles::open(&dir, "model").unwrap().unwrap();
        assert_eq!(files.names().collect::<Vec<_>>(), ["a", "b", "c"]);
        assert_eq!(files.shape("a"), Some(vec![2, 3]));
        assert!(files.get("a").unwrap().unwrap().equal(&a));
        assert!(files.get("b").unwrap().unwrap().equal(&b));
        assert_eq!(files.get("c").unwrap().unwrap().kind(), Kind::BFloat16);
        assert!(files.get("d").unwrap().is_none());
        // A range reads those elements only, flattened; past the end is an error.
        let part = files.get_range("a", 2, 3).unwrap().unwrap();
        assert!(part.equal(&Tensor::from_slice(&[2.0f32, 3.0, 4.0])));
        assert!(files.get_range("a", 4, 3).is_err());
        // Straight into a tensor of its dtype and size; not into another dtype.
        let into = Tensor::zeros([2, 3], (Kind::Float, tch::Device::Cpu));
        assert!(files.read_into("a", &into).unwrap() && into.equal(&a));
        let double = Tensor::zeros([2, 3], (Kind::Double, tch::Device::Cpu));
        assert!(!files.read_into("a", &double).unwrap());
        // Into variables of the same shapes; a name the files lack is reported.
        let vars: HashMap<String, Tensor> = [
            (
                "a".to_string(),
                Tensor::zeros([2, 3], (Kind::Float, tch::Device::Cpu)),
            ),
            (
                "z".to_string(),
                Tensor::zeros([1], (Kind::Float, tch::Device::Cpu)),
            ),
        ]
        .into_iter()
        .collect();
        assert_eq!(files.load_into(&vars).unwrap(), ["z"]);
        assert!(vars["a"].equal(&a));
        let wrong: HashMap<String, Tensor> = [(
            "a".to_string(),
            Tensor::zeros([3, 2], (Kind::Float, tch::Device::Cpu)),
        )]
        .into_iter()
        .collect();
        let e = format!("{:#}", files.load_into(&wrong).unwrap_err());
        assert!(e.contains("a has shape [2, 3] in the checkpoint"), "{e}");
        // A shard gone: the error names it.
        std::fs::remove_file(dir.join(shard_name("model", 2, 2))).unwrap();
        let e = format!("{:#}", TensorFiles::open(&dir, "model").err().unwrap());
        assert!(
            e.contains("model-00002-of-00002.safetensors") && e.contains("incomplete"),
            "{e}"
        );
        remove(&dir, "model");
        assert!(std::fs::read_dir(&dir).unwrap().next().is_none());
        std::fs::remove_dir_all(&dir).ok();
    }
}
