//! A run directory and every path in it: the one place that knows the layout.
//!
//! ```text
//! trainbook_runs/<run>/
//!   config.json                 RunConfig: the job as asked, and its resolved hyper-parameters
//!   status.json                 RunStatus: how the job ended (absent while it runs or if its
//!                               driver was killed): a finished named run is not trained again
//!   hangs/attempt-<A>-rank-<R>.txt   a hung rank's report: last step, last lines, native stack
//!   logs/rank<R>.log            every line of each worker
//!   metrics.parquet             one row per logged metric
//!   dllogger.json               the same metrics as BERT pre-training scripts log them
//!   profile/rank<R>.pt.trace.json    a profiled rank's trace (Chrome trace format)
//!   checkpoints/step-<S>/       every `checkpoint_every` steps, the last `keep_checkpoints`
//!   checkpoints/epoch-<E>/
//!     trainer_state.json        TrainerState: where training stood, what it ran with
//!     model.safetensors         the weights (names as the recipe's model defines them)
//!     optimizer.safetensors     optimizer state (the latest checkpoint, and kept step ones)
//!     config.json ...           the recipe's model files (see the recipe's `save`)
//! ```
//!
//! The names inside a checkpoint directory are [`crate::shared::checkpoint`]'s constants.

use std::ops::Deref;
use std::path::{Path, PathBuf};

/// A run directory's job record.
const RUN_CONFIG: &str = "config.json";
/// A run directory's record of how its job ended.
const RUN_STATUS: &str = "status.json";
/// The directory of a run's checkpoints.
const CHECKPOINTS: &str = "checkpoints";
/// The directory of each worker's log.
const LOGS: &str = "logs";

/// A run directory. It derefs to its path for what is not a file of the layout (its name,
/// display).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RunDir(PathBuf);

impl RunDir {
    pub fn new(path: impl Into<PathBuf>) -> RunDir {
        RunDir(path.into())
    }

    pub fn path(&self) -> &Path {
        &self.0
    }

    /// `config.json`: the job as asked ([`crate::shared::checkpoint::RunConfig`]).
    pub fn config(&self) -> PathBuf {
        self.0.join(RUN_CONFIG)
    }

    /// `status.json`: how the job ended ([`crate::shared::checkpoint::RunStatus`]).
    pub fn status(&self) -> PathBuf {
        self.0.join(RUN_STATUS)
    }

    /// `logs/`: every worker's log.
    pub fn logs(&self) -> PathBuf {
        self.0.join(LOGS)
    }

    /// `logs/rank<R>.log`: every line of one worker.
    pub fn rank_log(&self, rank: usize) -> PathBuf {
        self.logs().join(format!("rank{rank}.log"))
    }

    /// `metrics.parquet`: one row per logged metric.
    pub fn metrics(&self) -> PathBuf {
        self.0.join("metrics.parquet")
    }

    /// `dllogger.json`: the metrics as BERT pre-training scripts log them.
    pub fn dllogger(&self) -> PathBuf {
        self.0.join("dllogger.json")
    }

    /// `hangs/`: the reports of hung ranks.
    pub fn hangs(&self) -> PathBuf {
        self.0.join("hangs")
    }

    /// `hangs/attempt-<A>-rank-<R>.txt`: one hung rank's report, for the start it hung in.
    pub fn hang_report(&self, attempt: u32, rank: usize) -> PathBuf {
        self.hangs()
            .join(format!("attempt-{attempt}-rank-{rank}.txt"))
    }

    /// `profile/`: the profiled ranks' traces.
    pub fn profile(&self) -> PathBuf {
        self.0.join("profile")
    }

    /// `profile/rank<R>.pt.trace.json`: one rank's trace.
    pub fn rank_trace(&self, rank: usize) -> PathBuf {
        self.profile().join(format!("rank{rank}.pt.trace.json"))
    }

    /// `checkpoints/`.
    pub fn checkpoints(&self) -> PathBuf {
        self.0.join(CHECKPOINTS)
    }

    /// `checkpoints/<name>` (`step-<S>`, `epoch-<E>`).
    pub fn checkpoint(&self, name: &str) -> PathBuf {
        self.checkpoints().join(name)
    }
}

impl Deref for RunDir {
    type Target = Path;
    fn deref(&self) -> &Path {
        &self.0
    }
}

impl AsRef<Path> for RunDir {
    fn as_ref(&self) -> &Path {
        &self.0
    }
}

impl From<PathBuf> for RunDir {
    fn from(path: PathBuf) -> RunDir {
        RunDir(path)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_path_is_under_the_run_directory() {
        let run = RunDir::new("/runs/r1");
        assert_eq!(run.rank_log(3), Path::new("/runs/r1/logs/rank3.log"));
        assert_eq!(run.config(), Path::new("/runs/r1/config.json"));
        assert_eq!(run.status(), Path::new("/runs/r1/status.json"));
        assert_eq!(
            run.hang_report(2, 1),
            Path::new("/runs/r1/hangs/attempt-2-rank-1.txt")
        );
        assert_eq!(
            run.rank_trace(0),
            Path::new("/runs/r1/profile/rank0.pt.trace.json")
        );
        assert_eq!(
            run.checkpoint("step-4"),
            Path::new("/runs/r1/checkpoints/step-4")
        );
        assert_eq!(run.file_name().unwrap(), "r1");
    }
}
