//! Checkpoints of a run: when a step checkpoint is due, what a checkpoint records, the writer
//! (on the step's path or in the background), and what this run wrote: the latest keeps its
//! optimizer state, step checkpoints beyond `keep_checkpoints` are removed.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::Result;
use tch::Tensor;
use trainbook_api::Hyper;

use super::WorkerContext;
use crate::shared::checkpoint::{self, TrainerState};
use crate::shared::events::Event;
use crate::shared::run_dir::RunDir;
use crate::shared::tensor_files;
use crate::worker::checkpoint_writer::{
    to_host, CheckpointWriter, Contents, Finished, ShardedContents,
};
use crate::worker::ddp;
use crate::worker::device::Device;
use crate::worker::dist::ProcessGroup;
use crate::worker::recipe::Recipe;
use crate::worker::strategy::UpdateStrategy;

/// How often ranks agree on whether a time-based checkpoint is due: one scalar all-reduce
/// every this many steps (ranks' clocks differ, and all of them must take part in a checkpoint).
const CLOCK_CHECK_EVERY: u64 = 10;

/// Whether a step ends with a step checkpoint.
#[derive(Debug, PartialEq)]
pub(super) enum Due {
    Yes,
    No,
    /// When this many minutes (`checkpoint_every_minutes`) have passed on any rank since the
    /// last checkpoint: the ranks ask each other.
    IfTimeIsUp(f64),
}

/// When step checkpoints are due: every `every` steps, or when `every_minutes` have passed
/// since the last checkpoint (checked every [`CLOCK_CHECK_EVERY`] steps).
#[derive(Clone, Copy, Debug)]
pub(super) struct Cadence {
    pub(super) every: Option<u64>,
    pub(super) every_minutes: Option<f64>,
}

impl Cadence {
    /// Whether the step that makes `step` steps ends with a checkpoint.
    pub(super) fn due(&self, step: u64) -> Due {
        if self.every.is_some_and(|k| step.is_multiple_of(k)) {
            return Due::Yes;
        }
        let Some(minutes) = self.every_minutes else {
            return Due::No;
        };
        if !step.is_multiple_of(CLOCK_CHECK_EVERY) {
            return Due::No;
        }
        Due::IfTimeIsUp(minutes)
    }
}

/// Whether `minutes` have passed in `elapsed`.
fn time_is_up(elapsed: Duration, minutes: f64) -> bool {
    elapsed.as_secs_f64() >= minutes * 60.0
}

/// What a checkpoint's `trainer_state.json` records of the step `step` of epoch `epoch`.
pub(super) fn trainer_state(
    h: &Hyper,
    (epoch, step): (u64, u64),
    world: usize,
    accum: usize,
    metrics: BTreeMap<String, f64>,
) -> Result<TrainerState> {
    Ok(TrainerState {
        epoch,
        step,
        world_size: Some(world),
        global_batch_size: Some(h.global_batch_size),
        grad_accum: Some(accum),
        hyper: serde_json::to_value(h)?,
        metrics,
    })
}

/// What to delete once a checkpoint is in place.
#[derive(Debug, Default, PartialEq)]
pub(super) struct Retired {
    /// The checkpoint that was the latest: its optimizer state goes.
    pub(super) optimizer_of: Option<PathBuf>,
    /// Step checkpoints beyond `keep_checkpoints`, oldest first: they go whole.
    pub(super) removed: Vec<PathBuf>,
}

impl Retired {
    /// Deletes what was retired (what is gone already is no error).
    fn delete(self) {
        if let Some(prev) = self.optimizer_of {
            tensor_files::remove(&prev, checkpoint::OPTIMIZER_STEM);
        }
        for old in self.removed {
            std::fs::remove_dir_all(&old).ok();
        }
    }
}

/// The checkpoints this run wrote: the latest (which keeps its optimizer state) and the step
/// checkpoints still kept, and when the last one was written.
pub(super) struct Written {
    latest: Option<PathBuf>,
    steps: VecDeque<PathBuf>,
    at: Instant,
}

impl Written {
    fn new() -> Written {
        Written {
            latest: None,
            steps: VecDeque::new(),
            at: Instant::now(),
        }
    }

    /// What a start of the job finds of its own run: after a restart, the checkpoint it
    /// resumed from and the step checkpoints up to it (so `keep_checkpoints` still counts
    /// them).
    pub(super) fn found(run_dir: &RunDir, resumed: Option<&Path>, step: u64) -> Written {
        let mut written = Written::new();
        let checkpoints = run_dir.checkpoints();
        let Some(resumed) = resumed.filter(|r| r.parent() == Some(checkpoints.as_path())) else {
            return written;
        };
        written.latest = Some(resumed.to_path_buf());
        let dirs = std::fs::read_dir(&checkpoints)
            .into_iter()
            .flatten()
            .filter_map(|e| e.ok())
            .map(|e| e.path());
        written.steps = step_checkpoints(dirs, step);
        written
    }

    /// Checkpoint `dir` is in place: it becomes the latest, and the previous latest gives up
    /// its optimizer state, which is as large as the model (AdamW: twice), since a resume
    /// normally starts from the latest; unless it is a step checkpoint kept under
    /// `keep` (the user's choice of what to resume from). A step checkpoint joins the kept
    /// ones, of which the oldest beyond `keep` go.
    pub(super) fn add(
        &mut self,
        dir: PathBuf,
        step_checkpoint: bool,
        keep: Option<usize>,
    ) -> Retired {
        let mut retired = Retired::default();
        if let Some(prev) = self.latest.replace(dir.clone()) {
            if keep.is_none() || !self.steps.contains(&prev) {
                retired.optimizer_of = Some(prev);
            }
        }
        if step_checkpoint {
            self.steps.push_back(dir);
            while self.steps.len() > keep.unwrap_or(usize::MAX) {
                if let Some(old) = self.steps.pop_front() {
                    retired.removed.push(old);
                }
            }
        }
        retired
    }
}

/// The step checkpoints (`step-<S>`) among `dirs` up to step `step`, in step order.
fn step_checkpoints(dirs: impl Iterator<Item = PathBuf>, step: u64) -> VecDeque<PathBuf> {
    let mut steps: Vec<(u64, PathBuf)> = dirs
        .filter_map(|path| {
            let n = path
                .file_name()?
                .to_str()?
                .strip_prefix("step-")?
                .parse()
                .ok()?;
            (n <= step).then_some((n, path))
        })
        .collect();
    steps.sort();
    steps.into_iter().map(|(_, p)| p).collect()
}

/// A run's checkpoints: when they are due, their writer, what was written.
pub(super) struct Checkpoints {
    cadence: Cadence,
    keep: Option<usize>,
    written: Written,
    writer: CheckpointWriter,
}

impl Checkpoints {
    /// The checkpoints of a run at `step`, resumed from `resumed` if at all.
    pub(super) fn new(
        ctx: &WorkerContext,
        h: &Hyper,
        resumed: Option<&Path>,
        step: u64,
    ) -> Checkpoints {
        Checkpoints {
            cadence: Cadence {
                every: h.checkpoint_every,
                every_minutes: h.checkpoint_every_minutes,
            },
            keep: h.keep_checkpoints,
            written: Written::found(&ctx.run_dir, resumed, step),
            // In the background where the host has cores to spare: on CPU, training uses
            // them all and a background write measured no faster (docs/benchmarks.md).
            writer: CheckpointWriter::new(
                h.checkpoint_async
                    .unwrap_or(!matches!(ctx.device, Device::Cpu)),
            ),
        }
    }

    /// Whether the step that makes `step` steps ends with a step checkpoint: every
    /// `checkpoint_every` steps, or when `checkpoint_every_minutes` have passed on any rank
    /// since the last checkpoint (checked by all ranks together).
    pub(super) fn due(&self, step: u64, pg: &ProcessGroup) -> Result<bool> {
        match self.cadence.due(step) {
            Due::Yes => Ok(true),
            Due::No => Ok(false),
            Due::IfTimeIsUp(minutes) => {
                let mine = time_is_up(self.written.at.elapsed(), minutes) as u8 as f64;
                Ok(ddp::allreduce_sums(pg, &[mine])?[0] > 0.0)
            }
        }
    }

    /// A checkpoint is being written: the time to the next time-based one counts from now.
    pub(super) fn started(&mut self) {
        self.written.at = Instant::now();
    }

    /// Rank 0 writes `recipe`'s checkpoint into `dir`, and announces those finished by now.
    pub(super) fn write(
        &mut self,
        ctx: &WorkerContext,
        dir: &Path,
        recipe: &dyn Recipe,
        contents: Contents,
    ) -> Result<()> {
        let (done, note) = self.writer.write(dir, recipe, contents)?;
        if let Some(note) = note {
            ctx.events.log(format!("warning: {note}"));
        }
        for f in done {
            self.announce(ctx, f);
        }
        Ok(())
    }

    /// Every rank writes its part of a sharded checkpoint (ZeRO-3) of `weights` into `dir`
    /// (a collective): each rank gathers one unit at a time and keeps host copies of only the
    /// tensors it writes, so no rank ever holds the whole model; `state` is rank 0's.
    pub(super) fn write_sharded(
        &mut self,
        ctx: &WorkerContext,
        dir: &Path,
        recipe: &dyn Recipe,
        update: &mut UpdateStrategy,
        state: Option<TrainerState>,
        step_checkpoint: bool,
    ) -> Result<()> {
        let (rank, world) = (ctx.rank, ctx.world_size);
        let weights = recipe.weights();
        let bytes: Vec<u64> = weights
            .iter()
            .map(|(_, t)| (t.numel() * t.kind().elt_size_in_bytes()) as u64)
            .collect();
        let owner: HashMap<String, usize> = weights
            .iter()
            .map(|(n, _)| n.clone())
            .zip(tensor_files::owners(&bytes, world))
            .collect();
        // A trained tensor outside the checkpoint's weights has its state written by rank 0.
        let mine = |n: &str| owner.get(n).copied().unwrap_or(0) == rank;
        let optimizer = update.owned_state(&ctx.pg, &mine, rank == 0)?;
        let wanted: std::collections::HashSet<&str> =
            weights.iter().map(|(n, _)| n.as_str()).collect();
        let mut copied: HashMap<String, Tensor> = HashMap::new();
        update.visit_units(&mut |whole| {
            for (n, t) in whole {
                if wanted.contains(n) && mine(n) && !copied.contains_key(*n) {
                    copied.extend(to_host(vec![(n.to_string(), t.shallow_clone())]));
                }
            }
            Ok(())
        })?;
        // What is not sharded (batch-norm statistics) is whole on every rank.
        let rest: Vec<(String, Tensor)> = weights
            .iter()
            .filter(|(n, _)| mine(n) && !copied.contains_key(n))
            .map(|(n, t)| (n.clone(), t.shallow_clone()))
            .collect();
        copied.extend(to_host(rest));
        let mut weights: Vec<(String, Tensor)> = copied.into_iter().collect();
        weights.sort_by(|a, b| a.0.cmp(&b.0));
        let contents = ShardedContents {
            weights,
            optimizer,
            state,
            step_checkpoint,
        };
        for f in self.writer.write_sharded(dir, recipe, contents, &ctx.pg)? {
            self.announce(ctx, f);
        }
        Ok(())
    }

    /// Announces a background write that has finished meanwhile.
    pub(super) fn poll(&mut self, ctx: &WorkerContext) -> Result<()> {
        if let Some(f) = self.writer.poll()? {
            self.announce(ctx, f);
        }
        Ok(())
    }

    /// Waits for a background write, and announces it.
    pub(super) fn wait(&mut self, ctx: &WorkerContext) -> Result<()> {
        if let Some(f) = self.writer.wait()? {
            self.announce(ctx, f);
        }
        Ok(())
    }

    /// A checkpoint is in place: it becomes the latest, what it retires is deleted, and the
    /// driver hears of it (a restart resumes from it).
    fn announce(&mut self, ctx: &WorkerContext, f: Finished) {
        self.written
            .add(f.dir.clone(), f.step_checkpoint, self.keep)
            .delete();
        ctx.events.send(Event::Checkpoint {
            rank: 0,
            step: f.step,
            epoch: f.epoch,
            path: f.dir.display().to_string(),
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use trainbook_api::OptimizerKind;

    fn every(steps: Option<u64>, minutes: Option<f64>) -> Cadence {
        Cadence {
            every: steps,
            every_minutes: minutes,
        }
    }

    #[test]
    fn step_checkpoints_are_due_every_k_steps() {
        let c = every(Some(4), None);
        let due: Vec<u64> = (1..=12).filter(|s| c.due(*s) == Due::Yes).collect();
        assert_eq!(due, [4, 8, 12]);
        assert_eq!(c.due(10), Due::No);
        assert!((1..=30).all(|s| every(None, None).due(s) == Due::No));
    }

    #[test]
    fn time_based_checkpoints_are_asked_about_every_ten_steps() {
        let c = every(None, Some(0.5));
        assert_eq!(c.due(9), Due::No);
        assert_eq!(c.due(10), Due::IfTimeIsUp(0.5));
        assert_eq!(c.due(25), Due::No);
        // A step count that is due wins without asking.
        let both = every(Some(5), Some(1.0));
        assert_eq!(both.due(5), Due::Yes);
        assert_eq!(both.due(20), Due::Yes);
        assert_eq!(both.due(30), Due::Yes);
        assert_eq!(every(Some(7), Some(1.0)).due(20), Due::IfTimeIsUp(1.0));
    }

    #[test]
    fn time_is_up_after_the_minutes() {
        assert!(!time_is_up(Duration::from_secs(29), 0.5));
        assert!(time_is_up(Duration::from_secs(30), 0.5));
        assert!(time_is_up(Duration::ZERO, 0.0));
    }

    fn p(name: &str) -> PathBuf {
        PathBuf::from("/run/checkpoints").join(name)
    }

    #[test]
    fn without_keep_every_checkpoint_stays_and_only_the_latest_keeps_its_optimizer() {
        let mut w = Written::new();
        assert_eq!(w.add(p("step-2"), true, None), Retired::default());
        let r = w.add(p("step-4"), true, None);
        assert_eq!(r.optimizer_of, Some(p("step-2")));
        assert!(r.removed.is_empty());
        let r = w.add(p("epoch-0"), false, None);
        assert_eq!(r.optimizer_of, Some(p("step-4")));
        assert_eq!(w.steps, [p("step-2"), p("step-4")]);
        assert_eq!(w.latest, Some(p("epoch-0")));
    }

    #[test]
    fn keep_removes_the_oldest_step_checkpoints() {
        let mut w = Written::new();
        let keep = Some(2);
        for s in [2, 4] {
            assert!(w
                .add(p(&format!("step-{s}")), true, keep)
                .removed
                .is_empty());
        }
        let r = w.add(p("step-6"), true, keep);
        assert_eq!(r.removed, [p("step-2")]);
        // A kept step checkpoint keeps its optimizer state when it stops being the latest.
        assert_eq!(r.optimizer_of, None);
        assert_eq!(w.steps, [p("step-4"), p("step-6")]);
        // An epoch checkpoint is not counted, and gives up its optimizer state after.
        let r = w.add(p("epoch-0"), false, keep);
        assert_eq!(r, Retired::default());
        let r = w.add(p("step-8"), true, keep);
        assert_eq!(r.optimizer_of, Some(p("epoch-0")));
        assert_eq!(r.removed, [p("step-4")]);
        assert_eq!(w.steps, [p("step-6"), p("step-8")]);
    }

    #[test]
    fn keep_zero_keeps_no_step_checkpoint() {
        let mut w = Written::new();
        let r = w.add(p("step-3"), true, Some(0));
        assert_eq!(r.removed, [p("step-3")]);
        let r = w.add(p("step-6"), true, Some(0));
        // The removed one is not among the kept, so its optimizer file is retired too.
        assert_eq!(r.optimizer_of, Some(p("step-3")));
        assert_eq!(r.removed, [p("step-6")]);
    }

    #[test]
    fn step_checkpoints_are_found_in_step_order_up_to_the_resumed_step() {
        let dirs = [
            "step-10", "epoch-0", "step-9", "step-x", "step-30", "step-20",
        ]
        .map(p);
        let found = step_checkpoints(dirs.into_iter(), 20);
        assert_eq!(found, [p("step-9"), p("step-10"), p("step-20")]);
    }

    #[test]
    fn a_restart_finds_its_own_checkpoints_only() {
        let run = std::env::temp_dir().join(format!("trainbook-written-{}", std::process::id()));
        let run_dir = RunDir::new(&run);
        for name in ["step-5", "step-10", "step-15", "epoch-0"] {
            std::fs::create_dir_all(run_dir.checkpoint(name)).unwrap();
        }
        let resumed = run_dir.checkpoint("step-10");
        let w = Written::found(&run_dir, Some(&resumed), 10);
        assert_eq!(w.latest.as_ref(), Some(&resumed));
        assert_eq!(w.steps, [run_dir.checkpoint("step-5"), resumed.clone()]);
        // Resumed from another run's checkpoint: nothing of this run is counted.
        let elsewhere = std::env::temp_dir().join("elsewhere/step-10");
        let w = Written::found(&run_dir, Some(&elsewhere), 10);
        assert!(w.latest.is_none() && w.steps.is_empty());
        assert!(Written::found(&run_dir, None, 10).steps.is_empty());
        std::fs::remove_dir_all(&run).unwrap();
    }

    #[test]
    fn trainer_state_records_the_batch_layout() {
        let h = Hyper::new("tiny", 2, 32, 0.1, OptimizerKind::Sgd);
        let metrics: BTreeMap<String, f64> = [("loss".to_string(), 0.5)].into();
        let s = trainer_state(&h, (1, 40), 4, 2, metrics.clone()).unwrap();
        assert_eq!((s.epoch, s.step), (1, 40));
        assert_eq!(s.world_size, Some(4));
        assert_eq!((s.global_batch_size, s.grad_accum), (Some(32), Some(2)));
        assert_eq!(s.hyper["global_batch_size"], 32);
        assert_eq!(s.metrics, metrics);
    }
}
