//! The files of a run and its checkpoints: their names, the typed records that writers and
//! readers share, and crash-safe writing (everything is written beside its destination under a
//! temporary name and renamed into place, so a reader never sees half a checkpoint).
//!
//! The layout of a run directory is [`crate::shared::run_dir`]'s.
//!
//! Readers accept what older trainbook versions wrote: new fields are optional when reading.

use std::io::Write;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use serde::{Deserialize, Serialize};

use trainbook_api::{Hyper, JobSpec};

use super::run_dir::RunDir;

/// A checkpoint's training state.
pub const TRAINER_STATE: &str = "trainer_state.json";
/// A checkpoint's weights.
pub const MODEL: &str = "model.safetensors";
/// A checkpoint's optimizer state.
pub const OPTIMIZER: &str = "optimizer.safetensors";
/// The stems of the weights' and the optimizer state's files: `model.safetensors`, or under
/// ZeRO-3 `model-0000k-of-0000n.safetensors` with `model.safetensors.index.json`
/// ([`super::tensor_files`]).
pub const MODEL_STEM: &str = "model";
pub const OPTIMIZER_STEM: &str = "optimizer";

/// A run directory's `status.json`, written when its job ends.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct RunStatus {
    /// succeeded, failed or stopped.
    pub status: String,
    /// Optimizer steps the run had taken.
    pub steps: u64,
    /// Restarts after failures.
    #[serde(default)]
    pub restarts: usize,
}

impl RunStatus {
    /// The run directory's status, if its job ended and recorded it.
    pub fn read(run_dir: &Path) -> Option<Self> {
        let bytes = std::fs::read(RunDir::new(run_dir).status()).ok()?;
        serde_json::from_slice(&bytes).ok()
    }
}

/// The run's newest complete checkpoint, by step (at the same step an epoch checkpoint, which
/// has the epoch's evaluation, wins over a step checkpoint): what a restart or a resumed run
/// continues from. Only `step-N` and `epoch-N` directories whose trainer state reads count;
/// a checkpoint being written has another name until it is complete.
pub fn latest(run_dir: &Path) -> Option<(PathBuf, TrainerState)> {
    let entries = std::fs::read_dir(RunDir::new(run_dir).checkpoints()).ok()?;
    entries
        .filter_map(|e| e.ok())
        .filter_map(|e| {
            let name = e.file_name().to_string_lossy().into_owned();
            let epoch = if name.starts_with("epoch-") {
                1
            } else if name.starts_with("step-") {
                0
            } else {
                return None;
            };
            let dir = e.path();
            let state = TrainerState::read(&dir).ok()?;
            super::tensor_files::exists(&dir, MODEL_STEM).then_some((state.step, epoch, dir, state))
        })
        .max_by(|a, b| (a.0, a.1).cmp(&(b.0, b.1)))
        .map(|(_, _, dir, state)| (dir, state))
}

/// Removes what checkpoints staged by an earlier start of the run left behind: a worker killed
/// while writing leaves its temporary directory (see [`StagedDir`]). Called by the writing rank
/// before it writes anything.
pub(crate) fn remove_staged(run_dir: &Path) {
    let Ok(entries) = std::fs::read_dir(RunDir::new(run_dir).checkpoints()) else {
        return;
    };
    for e in entries.filter_map(|e| e.ok()) {
        let name = e.file_name().to_string_lossy().into_owned();
        if name.starts_with('.') && name.contains(".tmp-") {
            std::fs::remove_dir_all(e.path()).ok();
        }
    }
}

/// A run directory's `config.json`: the job as it was asked for, and the hyper-parameters its
/// recipe resolved at launch. Workers receive their job through this file; people and tools
/// read it to know what ran.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct RunConfig {
    #[serde(flatten)]
    pub spec: JobSpec,
    /// `None` for the engine's own jobs (`check`), which train nothing.
    #[serde(default)]
    pub hyper: Option<Hyper>,
}

/// A checkpoint's `trainer_state.json`.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct TrainerState {
    pub epoch: u64,
    /// Optimizer steps taken when this checkpoint was written.
    pub step: u64,
    /// Workers, global batch and accumulation fix the data order, so a resume must match them
    /// (absent in checkpoints of early versions: then they are not checked).
    #[serde(default)]
    pub world_size: Option<usize>,
    #[serde(default)]
    pub global_batch_size: Option<usize>,
    #[serde(default)]
    pub grad_accum: Option<usize>,
    /// Every resolved hyper-parameter, the recipe's own options included. Kept as written:
    /// older checkpoints recorded fewer fields, and it is read by people more than by code.
    #[serde(default)]
    pub hyper: serde_json::Value,
    /// The epoch's final metrics (train and eval loss and accuracy...).
    #[serde(default)]
    pub metrics: std::collections::BTreeMap<String, f64>,
}

impl TrainerState {
    /// Reads `dir/trainer_state.json`, with an error that says what `dir` should be.
    pub fn read(dir: &Path) -> Result<Self> {
        let file = dir.join(TRAINER_STATE);
        let bytes = std::fs::read(&file).with_context(|| {
            format!(
                "{} is not a trainbook checkpoint (no {TRAINER_STATE}): pass a directory like trainbook_runs/<run>/checkpoints/epoch-0",
                dir.display()
            )
        })?;
        serde_json::from_slice(&bytes)
            .with_context(|| format!("{} is not a trainbook trainer state", file.display()))
    }
}

impl RunConfig {
    /// Reads a run directory's `config.json`.
    pub fn read(file: &Path) -> Result<Self> {
        serde_json::from_slice(
            &std::fs::read(file).with_context(|| format!("reading {}", file.display()))?,
        )
        .with_context(|| format!("{} is not a trainbook run config", file.display()))
    }
}

/// `dir/.name.tmp-<pid>` beside `path`.
fn temp_path(path: &Path) -> PathBuf {
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    path.with_file_name(format!(".{name}.tmp-{}", std::process::id()))
}

/// Writes the file `path` through `fill`, which is given a temporary path beside it, then
/// renames it into place: a reader sees the old file or the whole new one, never half of it.
pub fn write_file_atomic(path: &Path, fill: impl FnOnce(&Path) -> Result<()>) -> Result<()> {
    let tmp = temp_path(path);
    if let Err(e) = fill(&tmp) {
        std::fs::remove_file(&tmp).ok();
        return Err(e);
    }
    std::fs::rename(&tmp, path)
        .with_context(|| format!("renaming {} to {}", tmp.display(), path.display()))
}

/// Writes `bytes` to `path` atomically (see [`write_file_atomic`]).
pub fn write_atomic(path: &Path, bytes: &[u8]) -> Result<()> {
    write_file_atomic(path, |tmp| {
        let mut f =
            std::fs::File::create(tmp).with_context(|| format!("creating {}", tmp.display()))?;
        f.write_all(bytes).map_err(|e| in_words(e.into(), tmp))?;
        f.sync_all().ok();
        Ok(())
    })
}

/// Writes `value` as pretty JSON to `path` atomically.
pub fn write_json_atomic<T: serde::Serialize>(path: &Path, value: &T) -> Result<()> {
    write_atomic(path, &serde_json::to_vec_pretty(value)?)
}

/// A checkpoint directory being written: a fresh temporary directory beside `dir`, renamed to
/// `dir` by [`StagedDir::commit`] (replacing an old one) and removed if dropped uncommitted, so
/// a reader finds the whole checkpoint or none of it. The writing may cross threads (a
/// background checkpoint writes its tensors on its own thread).
pub(crate) struct StagedDir {
    tmp: PathBuf,
    dir: PathBuf,
    committed: bool,
}

impl StagedDir {
    pub(crate) fn new(dir: &Path) -> Result<StagedDir> {
        Self::at(temp_path(dir), dir)
    }

    /// A staged directory every rank of a job writes into (a sharded checkpoint): its name is
    /// [`StagedDir::shared_path`], which every rank knows without being told.
    pub(crate) fn shared(dir: &Path) -> Result<StagedDir> {
        Self::at(Self::shared_path(dir), dir)
    }

    pub(crate) fn shared_path(dir: &Path) -> PathBuf {
        let name = dir
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        dir.with_file_name(format!(".{name}.tmp-ranks"))
    }

    fn at(tmp: PathBuf, dir: &Path) -> Result<StagedDir> {
        if tmp.exists() {
            std::fs::remove_dir_all(&tmp).ok();
        }
        std::fs::create_dir_all(&tmp).with_context(|| format!("creating {}", tmp.display()))?;
        Ok(StagedDir {
            tmp,
            dir: dir.to_path_buf(),
            committed: false,
        })
    }

    /// Where the files go until the commit.
    pub(crate) fn path(&self) -> &Path {
        &self.tmp
    }

    pub(crate) fn commit(mut self) -> Result<()> {
        if self.dir.exists() {
            std::fs::remove_dir_all(&self.dir)
                .with_context(|| format!("replacing {}", self.dir.display()))?;
        }
        std::fs::rename(&self.tmp, &self.dir).with_context(|| {
            format!("renaming {} to {}", self.tmp.display(), self.dir.display())
        })?;
        self.committed = true;
        Ok(())
    }
}

impl Drop for StagedDir {
    fn drop(&mut self) {
        if !self.committed {
            std::fs::remove_dir_all(&self.tmp).ok();
        }
    }
}

#[cfg(test)]
mod tests {
    //! Files written by trainbook before this module existed (tests/fixtures) still read.
    use super::*;

    fn fixture(name: &str) -> PathBuf {
        Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../../tests/fixtures/checkpoint-v0")
            .join(name)
    }

    #[test]
    fn old_trainer_states_read() {
        let s = TrainerState::read(&fixture("synthetic-epoch-0")).unwrap();
        assert_eq!((s.epoch, s.step, s.world_size), (0, 3, Some(1)));
        assert_eq!(s.hyper["optimizer"], "adamw");
        assert!(s.metrics.contains_key("eval_loss"));
        let dir = std::env::temp_dir().join(format!("trainbook-state-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::copy(
            fixture("resnet-trainer_state.json"),
            dir.join(TRAINER_STATE),
        )
        .unwrap();
        let s = TrainerState::read(&dir).unwrap();
        assert_eq!(s.global_batch_size, Some(32));
        std::fs::remove_dir_all(&dir).ok();
    }

    #[test]
    fn an_old_run_config_reads_without_resolved_hyper_parameters() {
        let c = RunConfig::read(&fixture("synthetic-run-config.json")).unwrap();
        assert_eq!((c.spec.recipe.as_str(), c.spec.workers), ("synthetic", 1));
        assert_eq!(c.spec.train.preset.as_deref(), Some("tiny"));
        assert!(c.hyper.is_none());
    }

    #[test]
    fn the_latest_checkpoint_is_the_newest_complete_one() {
        let run = std::env::temp_dir().join(format!("trainbook-latest-{}", std::process::id()));
        std::fs::remove_dir_all(&run).ok();
        assert!(latest(&run).is_none(), "no checkpoints directory");
        let write = |name: &str, step: u64, complete: bool| {
            let dir = RunDir::new(&run).checkpoint(name);
            std::fs::create_dir_all(&dir).unwrap();
            let state = TrainerState {
                epoch: 0,
                step,
                world_size: Some(2),
                global_batch_size: Some(8),
                grad_accum: Some(1),
                hyper: serde_json::Value::Null,
                metrics: Default::default(),
            };
            std::fs::write(dir.join(TRAINER_STATE), serde_json::to_vec(&state).unwrap()).unwrap();
            if complete {
                std::fs::write(dir.join(MODEL), b"weights").unwrap();
            }
        };
        write("step-10", 10, true);
        write("epoch-0", 20, true);
        write("step-20", 20, true);
        // Being written (another name), and one without weights: neither counts.
        write(".step-30.tmp-123", 30, true);
        write("step-40", 40, false);
        let (dir, state) = latest(&run).unwrap();
        assert_eq!(state.step, 20);
        assert!(dir.ends_with("epoch-0"), "{}", dir.display());
        std::fs::remove_dir_all(&run).ok();
    }

    #[test]
    fn a_full_disk_is_said_in_words_with_the_fixes() {
        let full = std::io::Error::from_raw_os_error(28);
        let path =
            Path::new("/runs/r/checkpoints/.step-6.tmp-ranks/model-00001-of-00002.safetensors");
        let e = format!("{:#}", in_words(full.into(), path));
        assert!(
            e.starts_with("the disk holding /runs/r/checkpoints is full, so model-00001-of-00002.safetensors could not be written"),
            "{e}"
        );
        assert!(
            e.contains("--keep-checkpoints") && e.contains("--runs-root"),
            "{e}"
        );
        assert!(!e.contains("StorageFull"), "{e}");
        // Anything else keeps its own words, with the file.
        let denied = std::io::Error::from(std::io::ErrorKind::PermissionDenied);
        let e = format!(
            "{:#}",
            in_words(denied.into(), Path::new("/x/model.safetensors"))
        );
        assert!(
            e.starts_with("writing /x/model.safetensors: permission denied"),
            "{e}"
        );
    }

    #[test]
    fn a_directory_without_a_trainer_state_is_named_with_the_fix() {
        let e = format!("{:#}", TrainerState::read(Path::new("/tmp")).unwrap_err());
        assert!(e.contains("/tmp is not a trainbook checkpoint"), "{e}");
        assert!(e.contains("checkpoints/epoch-0"), "{e}");
    }
}

/// Writes named tensors as safetensors, each in the usual contiguous layout (a channels-last
/// weight is copied into NCHW order first: safetensors stores the logical order).
pub fn write_tensors(named: &[(String, tch::Tensor)], path: &Path) -> Result<()> {
    let dense: Vec<(&str, tch::Tensor)> = named
        .iter()
        .map(|(n, t)| (n.as_str(), t.contiguous()))
        .collect();
    tch::Tensor::write_safetensors(&dense, path).map_err(|e| in_words(anyhow::Error::new(e), path))
}

/// A failed write's error as a user reads it: a full disk is said so, with the fixes (the raw
/// error is `Io(Os { code: 28, kind: StorageFull, .. })`); other errors name the file.
pub(crate) fn in_words(e: anyhow::Error, path: &Path) -> anyhow::Error {
    let raw = format!("{e:?}");
    let full = [
        "StorageFull",
        "No space left",
        "os error 28",
        "QuotaExceeded",
    ]
    .iter()
    .any(|s| raw.contains(s));
    if !full {
        return e.context(format!("writing {}", path.display()));
    }
    // A file staged for a checkpoint is named by the checkpoints' directory.
    let staged = |d: &&Path| {
        d.file_name().is_some_and(|n| {
            n.to_string_lossy().starts_with('.') && n.to_string_lossy().contains(".tmp-")
        })
    };
    let dir = path.parent().unwrap_or(path);
    let dir = Some(dir)
        .filter(staged)
        .and_then(Path::parent)
        .unwrap_or(dir);
    anyhow::anyhow!(
        "the disk holding {} is full, so {} could not be written: free space there, keep fewer step checkpoints (--keep-checkpoints), or put the runs on a larger disk (--runs-root); the checkpoints written before are complete and a rerun resumes from the latest",
        dir.display(),
        path.file_name().map(|n| n.to_string_lossy()).unwrap_or_default()
    )
}

/// A variable store's weights as safetensors ([`write_tensors`]).
pub fn save_vars(vs: &tch::nn::VarStore, path: &Path) -> Result<()> {
    let mut named: Vec<(String, tch::Tensor)> = vs.variables().into_iter().collect();
    named.sort_by(|a, b| a.0.cmp(&b.0));
    write_tensors(&named, path)
}
