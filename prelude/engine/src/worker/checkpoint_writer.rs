//! Writing rank 0's checkpoints, on the step's path or, for step checkpoints, in the background
//! (`checkpoint_async`); and under ZeRO-3 every rank's part of a sharded checkpoint
//! ([`CheckpointWriter::write_sharded`]).
//!
//! In the background the step pays only for a copy of the weights and the optimizer state into
//! host memory (and the recipe's small files); a thread writes the tensors into the staged
//! directory and renames it into place, so a failure at any moment, a kill during the write
//! included, leaves only complete checkpoints to restart from. At most one write is in flight:
//! the next checkpoint first waits for the previous one, and says how long it waited, since a
//! disk slower than the checkpoint interval would otherwise pile up copies in memory.

use std::path::{Path, PathBuf};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context, Result};
use tch::{Device, Tensor};

use crate::shared::checkpoint::{self, StagedDir, TrainerState};
use crate::shared::tensor_files;
use crate::worker::ddp;
use crate::worker::dist::ProcessGroup;
use crate::worker::optim;
use crate::worker::recipe::Recipe;

/// Waits shorter than this for the previous write are not worth a log line.
const WAIT_WORTH_SAYING: Duration = Duration::from_millis(100);

/// A checkpoint whose files are all in place.
pub(crate) struct Finished {
    pub(crate) dir: PathBuf,
    pub(crate) step: u64,
    pub(crate) epoch: u64,
    /// A step checkpoint (kept under `keep_checkpoints`) rather than an epoch's.
    pub(crate) step_checkpoint: bool,
}

/// What one checkpoint holds besides the recipe's files.
pub(crate) struct Contents<'a> {
    pub(crate) optimizer: &'a [(String, Tensor)],
    pub(crate) state: TrainerState,
    pub(crate) step_checkpoint: bool,
}

struct InFlight {
    finished: Finished,
    thread: JoinHandle<Result<()>>,
}

pub(crate) struct CheckpointWriter {
    background: bool,
    in_flight: Option<InFlight>,
}

impl CheckpointWriter {
    pub(crate) fn new(background: bool) -> CheckpointWriter {
        CheckpointWriter {
            background,
            in_flight: None,
        }
    }

    /// Writes `recipe`'s checkpoint into `dir`. Returns the checkpoints finished by now: this
    /// one when written on the step's path, the previous background one (waited for) when
    /// this one goes to the background; and a line to log when that wait was long.
    pub(crate) fn write(
        &mut self,
        dir: &Path,
        recipe: &dyn Recipe,
        contents: Contents,
    ) -> Result<(Vec<Finished>, Option<String>)> {
        let waited = Instant::now();
        let mut done: Vec<Finished> = self.wait()?.into_iter().collect();
        let waited = waited.elapsed();
        if let Some(parent) = dir.parent() {
            std::fs::create_dir_all(parent)
                .with_context(|| format!("creating {}", parent.display()))?;
        }
        let staged = StagedDir::new(dir)?;
        recipe.save_files(staged.path())?;
        let finished = Finished {
            dir: dir.to_path_buf(),
            step: contents.state.step,
            epoch: contents.state.epoch,
            step_checkpoint: contents.step_checkpoint,
        };
        // Only step checkpoints go to the background. An epoch's checkpoint is in place before
        // the epoch ends: its metrics were reported already, and what acts on them (a sweep
        // pruning the trial, a reader of the epoch's row) expects that epoch's checkpoint.
        if !(self.background && contents.step_checkpoint) {
            let weights = recipe.weights();
            write_tensors(&staged, &weights, contents.optimizer, &contents.state)?;
            staged.commit()?;
            done.push(finished);
            return Ok((done, None));
        }
        // The copies are taken now, before the next step changes the tensors in place.
        let weights = to_host(recipe.weights());
        let optimizer = to_host(
            contents
                .optimizer
                .iter()
                .map(|(n, t)| (n.clone(), t.shallow_clone()))
                .collect(),
        );
        let state = contents.state;
        let thread = std::thread::Builder::new()
            .name("checkpoint-writer".into())
            .spawn(move || {
                write_tensors(&staged, &weights, &optimizer, &state)?;
                staged.commit()
            })
            .context("starting the checkpoint writer thread")?;
        self.in_flight = Some(InFlight { finished, thread });
        let note = (waited >= WAIT_WORTH_SAYING).then(|| {
            format!(
                "checkpoint {} waited {:.1} s for the previous one to finish writing: the disk is \
                 slower than the checkpoint interval (checkpoint less often, or write to a faster disk)",
                dir.display(),
                waited.as_secs_f64()
            )
        });
        Ok((done, note))
    }

    /// Waits for the write in flight, if any; its checkpoint once it is in place.
    pub(crate) fn wait(&mut self) -> Result<Option<Finished>> {
        let Some(InFlight { finished, thread }) = self.in_flight.take() else {
            return Ok(None);
        };
        thread
            .join()
            .map_err(|_| anyhow!("the checkpoint writer thread panicked"))?
            .with_context(|| format!("writing checkpoint {}", finished.dir.display()))?;
        Ok(Some(finished))
    }

    /// The write in flight's checkpoint once it is in place, without waiting.
    pub(crate) fn poll(&mut self) -> Result<Option<Finished>> {
        match &self.in_flight {
            Some(f) if f.thread.is_finished() => self.wait(),
            _ => Ok(None),
        }
    }
}

/// One rank's part of a sharded checkpoint (ZeRO-3): host copies of the whole tensors it
/// writes (`tensor_files::owners`), and on rank 0 the trainer state.
pub(crate) struct ShardedContents {
    pub(crate) weights: Vec<(String, Tensor)>,
    pub(crate) optimizer: Vec<(String, Tensor)>,
    /// Rank 0's: it writes the trainer state, the recipe's files and the indexes, and
    /// renames the checkpoint into place.
    pub(crate) state: Option<TrainerState>,
    pub(crate) step_checkpoint: bool,
}

impl CheckpointWriter {
    /// Every rank writes its part of a sharded checkpoint into `dir` (a collective): rank 0
    /// stages the directory, each rank writes `model-0000k-of-0000n.safetensors` and
    /// `optimizer-0000k-of-0000n.safetensors` with the tensors it owns, and once all have,
    /// rank 0 writes the indexes and renames the directory into place. A rank that fails
    /// fails every rank, and nothing is renamed: the last complete checkpoint stays the
    /// latest. Written on the step's path (the ranks agree on the outcome). Returns the
    /// checkpoints finished by now (on rank 0).
    pub(crate) fn write_sharded(
        &mut self,
        dir: &Path,
        recipe: &dyn Recipe,
        contents: ShardedContents,
        pg: &ProcessGroup,
    ) -> Result<Vec<Finished>> {
        let mut done: Vec<Finished> = self.wait()?.into_iter().collect();
        let (rank, world) = (pg.rank(), pg.world_size());
        let staged = match &contents.state {
            Some(state) => Some(stage(dir, recipe, state)),
            None => None,
        };
        let (staged, staging) = match staged {
            Some(Ok(s)) => (Some(s), Ok(())),
            Some(Err(e)) => (None, Err(e)),
            None => (None, Ok(())),
        };
        agree(pg, staging, "stage checkpoint", dir)?;
        let at = StagedDir::shared_path(dir);
        let wrote = write_part(&at, &contents, rank, world);
        agree(pg, wrote, "write its part of checkpoint", dir)?;
        let Some(staged) = staged else {
            return Ok(done);
        };
        for stem in [checkpoint::MODEL_STEM, checkpoint::OPTIMIZER_STEM] {
            tensor_files::write_index(staged.path(), stem)?;
        }
        staged.commit()?;
        let state = contents.state.expect("rank 0 has the trainer state");
        done.push(Finished {
            dir: dir.to_path_buf(),
            step: state.step,
            epoch: state.epoch,
            step_checkpoint: contents.step_checkpoint,
        });
        Ok(done)
    }
}

/// Rank 0's part before the others write: the staged directory, the recipe's files and the
/// trainer state.
fn stage(dir: &Path, recipe: &dyn Recipe, state: &TrainerState) -> Result<StagedDir> {
    if let Some(parent) = dir.parent() {
        std::fs::create_dir_all(parent)
            .with_context(|| format!("creating {}", parent.display()))?;
    }
    let staged = StagedDir::shared(dir)?;
    recipe.save_files(staged.path())?;
    let file = staged.path().join(checkpoint::TRAINER_STATE);
    std::fs::write(&file, serde_json::to_vec_pretty(state)?)
        .map_err(|e| checkpoint::in_words(e.into(), &file))?;
    Ok(staged)
}

/// One rank's files of a sharded checkpoint, into the directory rank 0 staged.
fn write_part(at: &Path, contents: &ShardedContents, rank: usize, world: usize) -> Result<()> {
    if !at.is_dir() {
        bail!(
            "rank {rank} does not see {}, which rank 0 made: under ZeRO-3 every rank writes its part of a checkpoint into the run directory, so put the runs on a filesystem every node mounts (--runs-root)",
            at.display()
        );
    }
    let file = |stem| at.join(tensor_files::shard_name(stem, rank + 1, world));
    if !contents.weights.is_empty() {
        checkpoint::write_tensors(&contents.weights, &file(checkpoint::MODEL_STEM))?;
    }
    if !contents.optimizer.is_empty() {
        optim::save_state(&contents.optimizer, &file(checkpoint::OPTIMIZER_STEM))?;
    }
    Ok(())
}

/// The ranks' outcomes of one part of a sharded checkpoint, agreed (a collective): this
/// rank's error, or an error when another rank failed (its own error is reported beside).
fn agree(pg: &ProcessGroup, outcome: Result<()>, what: &str, dir: &Path) -> Result<()> {
    let failed = ddp::allreduce_sums(pg, &[outcome.is_err() as u8 as f64])?[0];
    outcome?;
    if failed > 0.0 {
        // The driver reports the first error it hears as the job's: the failed rank's own
        // (a full disk, say) is on its way and should be that one, not this consequence.
        std::thread::sleep(std::time::Duration::from_millis(500));
        bail!(
            "{} rank(s) could not {what} {} (their errors are reported beside this one); the checkpoints written before are complete",
            failed as usize,
            dir.display()
        );
    }
    Ok(())
}

impl Drop for CheckpointWriter {
    /// A run that fails still completes the checkpoint it started: it is one more complete
    /// point to restart from.
    fn drop(&mut self) {
        if let Some(f) = self.in_flight.take() {
            f.thread.join().ok();
        }
    }
}

fn write_tensors(
    staged: &StagedDir,
    weights: &[(String, Tensor)],
    optimizer: &[(String, Tensor)],
    state: &TrainerState,
) -> Result<()> {
    let dir = staged.path();
    checkpoint::write_tensors(weights, &dir.join(checkpoint::MODEL))?;
    optim::save_state(optimizer, &dir.join(checkpoint::OPTIMIZER))?;
    std::fs::write(
        dir.join(checkpoint::TRAINER_STATE),
        serde_json::to_vec_pretty(state)?,
    )
    .map_err(|e| checkpoint::in_words(e.into(), &dir.join(checkpoint::TRAINER_STATE)))
}

/// Host copies of `named`, detached from autograd and from the tensors training goes on
/// changing.
pub(crate) fn to_host(named: Vec<(String, Tensor)>) -> Vec<(String, Tensor)> {
    tch::no_grad(|| {
        named
            .into_iter()
            .map(|(n, t)| {
                let t = t.detach();
                let host = if t.device() == Device::Cpu {
                    t.copy()
                } else {
                    t.to_device(Device::Cpu)
                };
                (n, host)
            })
            .collect()
    })
}
