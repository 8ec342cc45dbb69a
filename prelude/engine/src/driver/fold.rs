//! Folding what the workers say into the job: every event and raw output line, in arrival
//! order, becomes the job's state (metrics, progress, logs, errors, summaries), reaches its
//! subscribers, its log files and its trackers. What supervision needs from an event (an
//! error, a heartbeat, a `done`, another node's report) comes back as a [`Signal`]; the fold
//! itself decides nothing about failures or restarts.

use std::fs::File;
use std::io::Write;
use std::path::PathBuf;
use std::time::Instant;

use trainbook_api::Stream;
use trainbook_api::{JobStatus, JobUpdate, LogRecord, MetricRow, Progress, TrainError};

use super::dedup::Deduplicator;
use super::handle::JobState;
use super::history::{Thinning, OTHER_RANK_ROWS};
use super::incoming::Incoming;
use super::metrics;
use super::processes::{Exit, RawOutput};
use super::track::Trackers;
use crate::shared::checkpoint::{self, RunStatus};
use crate::shared::events::{Emitter, Event};

/// Lines of each rank kept for error reports.
pub(super) const TAIL_LINES: usize = 20;
/// Log lines kept in memory per job (the run directory has them all).
const MEMORY_LOG_LINES: usize = 10_000;

/// What an event means for the job's supervision (hang detection, failure causes, nodes).
#[derive(Debug, PartialEq)]
pub(super) enum Signal {
    Error {
        rank: usize,
        step: Option<u64>,
    },
    Done {
        rank: usize,
    },
    Heartbeat {
        rank: usize,
        step: u64,
        work: u64,
        busy: bool,
    },
    NodeAlive {
        node: usize,
    },
    /// Another node's driver reports a failed worker of the given start.
    Exited {
        attempt: u32,
        node: usize,
        exit: Exit,
    },
}

/// The job the events fold into, and what is written on the way.
pub(super) struct Fold<'a> {
    pub(super) job: &'a JobState,
    dedup: Deduplicator,
    log_files: Vec<Option<File>>,
    /// dllogger, TensorBoard, MLflow (node 0; none on the others).
    pub(super) trackers: Trackers,
    /// On nodes other than 0: node 0's event stream, which gets this node's worker output and
    /// failures (their events go there directly).
    pub(super) forward: Option<Emitter>,
    /// This node joined node 0's job (its workers' events go to node 0).
    pub(super) joined: bool,
    /// How the job's metric rows stay bounded (see `history`).
    thinning: Thinning,
}

impl<'a> Fold<'a> {
    pub(super) fn new(job: &'a JobState, forward: Option<Emitter>) -> Self {
        let world = job.spec.world_size();
        // Node 0 logs every rank (other nodes forward their output to it); other nodes their own.
        let local = job.spec.local_ranks();
        let log_files = (0..world)
            .map(|r| {
                (forward.is_none() || local.contains(&r))
                    .then(|| File::create(job.run_dir.rank_log(r)).ok())
                    .flatten()
            })
            .collect();
        let joined = forward.is_some();
        Fold {
            job,
            dedup: Deduplicator::new(job.spec.dedup),
            log_files,
            trackers: if joined {
                Trackers::none()
            } else {
                Trackers::for_job(job)
            },
            forward,
            joined,
            thinning: Thinning::new(OTHER_RANK_ROWS),
        }
    }

    pub(super) fn elapsed(&self) -> f64 {
        self.job.started.elapsed().as_secs_f64()
    }

    pub(super) fn line(&mut self, rank: usize, stream: Stream, text: String) {
        if let Some(fwd) = &self.forward {
            fwd.send(Event::Log {
                rank,
                stream,
                text: text.clone(),
            });
        }
        // The ranks of another node change with an elastic job's size: its log files come as
        // its ranks do.
        if self.joined && matches!(self.log_files.get(rank), Some(None)) {
            self.log_files[rank] = File::options()
                .append(true)
                .create(true)
                .open(self.job.run_dir.rank_log(rank))
                .ok();
        }
        if let Some(Some(f)) = self.log_files.get_mut(rank) {
            let tag = if stream == Stream::Stderr {
                "[stderr] "
            } else {
                ""
            };
            let _ = writeln!(f, "{tag}{text}");
        }
        let now = Instant::now();
        let shown = self.dedup.push(rank, stream, &text, now);
        {
            let mut st = self.job.lock();
            if let Some(t) = st.tails.get_mut(rank) {
                if t.len() == TAIL_LINES {
                    t.pop_front();
                }
                t.push_back(text.clone());
            }
            if st.logs.len() == MEMORY_LOG_LINES {
                st.logs.pop_front();
            }
            let time = self.elapsed();
            st.logs.push_back(LogRecord {
                rank,
                stream,
                text,
                time,
            });
        }
        for s in shown {
            self.job.publish(JobUpdate::Log(s));
        }
    }

    /// A metric: rank 0’s go to the run’s trackers (dllogger, TensorBoard, MLflow); every
    /// rank’s to the job and its subscribers.
    pub(super) fn metric(&mut self, row: MetricRow) {
        if row.rank == 0 {
            self.trackers.metric(&row);
        }
        self.thinning
            .push(&mut self.job.lock().metrics, row.clone());
        self.job.publish(JobUpdate::Metric(row));
    }

    fn progress(&mut self, p: Progress) {
        self.job.lock().progress = Some(p.clone());
        self.job.publish(JobUpdate::Progress(p));
    }

    fn checkpoint(&mut self, epoch: u64, path: PathBuf) {
        self.job.lock().checkpoints.push((epoch, path.clone()));
        self.job.publish(JobUpdate::Checkpoint { epoch, path });
    }

    /// Folds one event into the job; what the supervision needs to know comes back.
    pub(super) fn event(&mut self, ev: Event) -> Option<Signal> {
        let elapsed = self.elapsed();
        match ev {
            Event::Log { rank, stream, text } => self.line(rank, stream, text),
            Event::Metric {
                rank,
                step,
                epoch,
                name,
                value,
                ..
            } => self.metric(MetricRow {
                rank: rank as u32,
                step,
                epoch,
                name,
                value,
                time: elapsed,
            }),
            Event::Progress {
                step,
                total_steps,
                epoch,
                epochs,
                samples,
                samples_per_second,
                ..
            } => self.progress(Progress {
                step,
                total_steps,
                epoch,
                epochs,
                samples,
                samples_per_second,
                elapsed,
            }),
            Event::Checkpoint { epoch, path, .. } => self.checkpoint(epoch, PathBuf::from(path)),
            Event::Error {
                rank,
                message,
                step,
            } => {
                if let Some(slot) = self.job.lock().errors.get_mut(rank) {
                    *slot = Some(message.clone());
                }
                self.line(rank, Stream::Stderr, format!("error: {message}"));
                return Some(Signal::Error { rank, step });
            }
            Event::Done { rank, summary } => {
                if rank == 0 {
                    self.trackers.done(&summary, elapsed);
                }
                if let Some(slot) = self.job.lock().summaries.get_mut(rank) {
                    *slot = Some(summary);
                }
                return Some(Signal::Done { rank });
            }
            Event::NodeAlive { node } => return Some(Signal::NodeAlive { node }),
            Event::Heartbeat {
                rank,
                step,
                work,
                busy,
            } => {
                return Some(Signal::Heartbeat {
                    rank,
                    step,
                    work,
                    busy,
                })
            }
            Event::Exited {
                attempt,
                rank,
                node,
                code,
                signal,
            } => {
                return Some(Signal::Exited {
                    attempt,
                    node,
                    exit: Exit { rank, code, signal },
                })
            }
        }
        None
    }

    pub(super) fn incoming(&mut self, m: Incoming) -> Option<Signal> {
        match m {
            Incoming::Event(e) => self.event(e),
            Incoming::Raw(RawOutput::Line { rank, stderr, text }) => {
                self.line(
                    rank,
                    if stderr {
                        Stream::Stderr
                    } else {
                        Stream::Stdout
                    },
                    text,
                );
                None
            }
        }
    }

    pub(super) fn flush_dedup(&mut self, finish: bool) {
        let shown = if finish {
            self.dedup.finish()
        } else {
            self.dedup.flush_due(Instant::now())
        };
        for s in shown {
            self.job.publish(JobUpdate::Log(s));
        }
    }

    pub(super) fn failure(&self, exit: &Exit) -> TrainError {
        self.failure_of(exit.rank, how_it_failed(exit))
    }

    /// The job’s error for a failure of `rank`, `how` it failed: its message, last lines and log.
    pub(super) fn failure_of(&self, rank: usize, mut how: String) -> TrainError {
        let st = self.job.lock();
        let tail: Vec<String> = st
            .tails
            .get(rank)
            .map(|t| t.iter().map(|l| format!("  {l}")).collect())
            .unwrap_or_default();
        let message = st
            .errors
            .get(rank)
            .cloned()
            .flatten()
            .map(|m| format!("\nerror: {m}"))
            .unwrap_or_default();
        if self.job.spec.nodes > 1 {
            if let Some(node) = st.membership.node_of(rank) {
                how = format!("{how}, on node {node}");
            }
        }
        TrainError::WorkerFailed {
            rank,
            how,
            message,
            tail: if tail.is_empty() && self.forward.is_some() {
                "  (no output here: this node's workers report to node 0, whose run directory has their logs)".into()
            } else if tail.is_empty() {
                "  (no output)".into()
            } else {
                tail.join("\n")
            },
            log: self.job.run_dir.rank_log(rank).display().to_string(),
        }
    }

    /// Records how the job ended, writes `metrics.parquet` and tells subscribers.
    pub(super) fn finish(mut self, dropped_events: u64, stopped_by_user: bool) {
        let job = self.job;
        let rows = {
            let mut st = job.lock();
            st.dropped_events = dropped_events;
            st.elapsed = job.started.elapsed().as_secs_f64();
            // Other nodes see their own workers’ clean exits; node 0 every rank’s `done`.
            let every_rank_done = self.joined || st.every_rank_done();
            st.status = final_status(st.failure.is_some(), stopped_by_user, every_rank_done);
            if st.status == JobStatus::Failed {
                st.fail_once(TrainError::WorkerFailed {
                    rank: 0,
                    how: "workers exited without reporting completion".into(),
                    message: String::new(),
                    tail: String::new(),
                    log: job.run_dir.logs().display().to_string(),
                });
            }
            st.metrics.clone()
        };
        if let Err(e) = metrics::write_parquet(&rows, &job.run_dir.metrics()) {
            eprintln!("trainbook: could not write metrics.parquet: {e:#}");
        }
        if !self.joined {
            let st = job.lock();
            let status = RunStatus {
                status: st.status.name().into(),
                steps: st
                    .summaries
                    .first()
                    .cloned()
                    .flatten()
                    .map_or(0, |s| s.steps),
                restarts: st.restarts.len(),
            };
            drop(st);
            let file = job.run_dir.status();
            if let Err(e) = checkpoint::write_json_atomic(&file, &status) {
                eprintln!("trainbook: could not write {}: {e:#}", file.display());
            }
        }
        let status = job.lock().status;
        let checkpoint = job.lock().checkpoints.last().map(|(_, p)| p.clone());
        let trackers = std::mem::replace(&mut self.trackers, Trackers::none());
        let warnings = trackers.finish(status, checkpoint);
        job.lock().warnings.extend(warnings);
        job.publish(JobUpdate::Finished(status));
        job.finished.notify_all();
    }
}

/// How a failed worker ended, for its error: its exit, or a clean exit without its `done`.
pub(super) fn how_it_failed(exit: &Exit) -> String {
    if exit.success() {
        "exited before reporting completion".to_string()
    } else {
        exit.describe()
    }
}

/// How a job ended once all its workers are gone: a recorded failure wins over a stop, and
/// success needs every rank’s `done` event.
fn final_status(failed: bool, stopped_by_user: bool, every_rank_done: bool) -> JobStatus {
    if failed {
        JobStatus::Failed
    } else if stopped_by_user {
        JobStatus::Stopped
    } else if every_rank_done {
        JobStatus::Succeeded
    } else {
        JobStatus::Failed
    }
}

#[cfg(test)]
pub(super) mod tests {
    //! The folding of events into a job, fed synthetic event sequences: no worker processes,
    //! sockets or UI.
    use super::*;
    use crate::shared::run_dir::RunDir;
    use std::sync::mpsc;
    use trainbook_api::DeviceKind;
    use trainbook_api::{Configure, JobSpec};

    pub(in crate::driver) fn fold(job: &JobState) -> Fold<'_> {
        Fold {
            job,
            dedup: Deduplicator::new(job.spec.dedup),
            log_files: Vec::new(),
            trackers: Trackers::none(),
            forward: None,
            joined: false,
            thinning: Thinning::new(OTHER_RANK_ROWS),
        }
    }

    pub(in crate::driver) fn job(workers: usize) -> JobState {
        let spec = JobSpec::new("synthetic").workers(workers);
        JobState::new(
            spec,
            DeviceKind::Cpu,
            RunDir::new("/runs/r1"),
            "tcp://x".into(),
        )
    }

    fn subscribe(shared: &JobState) -> mpsc::Receiver<JobUpdate> {
        let (tx, rx) = mpsc::channel();
        shared.subscribers.lock().unwrap().push(tx);
        rx
    }

    fn metric(rank: usize, step: u64, name: &str, value: f64) -> Event {
        Event::Metric {
            rank,
            step,
            epoch: 0,
            name: name.into(),
            value,
            time: 0.0,
        }
    }

    fn log(rank: usize, text: &str) -> Event {
        Event::Log {
            rank,
            stream: Stream::Stdout,
            text: text.into(),
        }
    }

    #[test]
    fn events_fold_into_the_jobs_state_and_reach_subscribers_in_order() {
        let shared = job(2);
        let updates = subscribe(&shared);
        let mut d = fold(&shared);
        d.event(metric(0, 1, "loss", 0.9));
        d.event(Event::Progress {
            rank: 0,
            step: 1,
            total_steps: 10,
            epoch: 0,
            epochs: 1,
            samples: 8,
            samples_per_second: 4.0,
        });
        d.event(metric(1, 1, "loss", 0.8));
        d.event(Event::Checkpoint {
            rank: 0,
            step: 10,
            epoch: 0,
            path: "/runs/r1/checkpoints/epoch-0".into(),
        });
        let st = shared.lock();
        assert_eq!(st.metrics.len(), 2);
        assert_eq!((st.metrics[1].rank, st.metrics[1].value), (1, 0.8));
        assert_eq!(st.progress.as_ref().map(|p| p.step), Some(1));
        assert_eq!(st.checkpoints[0].0, 0);
        drop(st);
        let got: Vec<&str> = updates
            .try_iter()
            .map(|u| match u {
                JobUpdate::Metric(_) => "metric",
                JobUpdate::Progress(_) => "progress",
                JobUpdate::Checkpoint { .. } => "checkpoint",
                _ => "other",
            })
            .collect();
        assert_eq!(got, ["metric", "progress", "metric", "checkpoint"]);
    }

    #[test]
    fn a_failure_names_the_rank_its_error_its_last_lines_and_its_log() {
        let shared = job(2);
        let mut d = fold(&shared);
        for i in 0..30 {
            d.event(log(1, &format!("step {i}")));
        }
        d.event(log(0, "rank 0 is fine"));
        d.event(Event::Error {
            rank: 1,
            message: "loss became NaN at step 3".into(),
            step: Some(3),
        });
        let failure = d.failure(&Exit {
            rank: 1,
            code: Some(1),
            signal: None,
        });
        let TrainError::WorkerFailed {
            rank,
            how,
            message,
            tail,
            log,
        } = failure
        else {
            panic!("not a worker failure: {failure:?}")
        };
        assert_eq!((rank, how.as_str()), (1, "exit code 1"));
        assert_eq!(message, "\nerror: loss became NaN at step 3");
        // The last TAIL_LINES lines of that rank only, its error included.
        let lines: Vec<&str> = tail.lines().collect();
        assert_eq!(lines.len(), TAIL_LINES);
        assert_eq!(lines.last(), Some(&"  error: loss became NaN at step 3"));
        assert!(!tail.contains("rank 0 is fine") && !tail.contains("step 10\n"));
        assert_eq!(log, "/runs/r1/logs/rank1.log");
    }

    #[test]
    fn a_clean_exit_without_its_done_event_is_a_failure_too() {
        let shared = job(1);
        let d = fold(&shared);
        let TrainError::WorkerFailed { how, tail, .. } = d.failure(&Exit {
            rank: 0,
            code: Some(0),
            signal: None,
        }) else {
            panic!()
        };
        assert_eq!(how, "exited before reporting completion");
        assert_eq!(tail, "  (no output)");
    }

    #[test]
    fn the_final_status_follows_failure_then_stop_then_completion() {
        use JobStatus::*;
        // (failed, stopped by the user, every rank reported done) → status
        let table = [
            ((true, false, false), Failed),
            ((true, true, true), Failed),
            ((false, true, false), Stopped),
            ((false, true, true), Stopped),
            ((false, false, true), Succeeded),
            ((false, false, false), Failed),
        ];
        for ((f, s, d), want) in table {
            assert_eq!(
                final_status(f, s, d),
                want,
                "failed={f} stopped={s} done={d}"
            );
        }
    }

    #[test]
    fn repeated_lines_of_several_ranks_reach_subscribers_once_plus_a_summary() {
        let shared = job(3);
        let updates = subscribe(&shared);
        let mut d = fold(&shared);
        for rank in 0..3 {
            d.event(log(rank, "loading the tokenizer"));
        }
        d.flush_dedup(true);
        let shown: Vec<crate::driver::dedup::Shown> = updates
            .try_iter()
            .filter_map(|u| match u {
                JobUpdate::Log(s) => Some(s),
                _ => None,
            })
            .collect();
        assert_eq!(shown.len(), 2, "{shown:?}");
        assert_eq!((shown[0].rank, shown[0].repeats.is_none()), (0, true));
        let repeats = shown[1].repeats.as_ref().expect("a summary of the repeats");
        assert_eq!(repeats.ranks.iter().copied().collect::<Vec<_>>(), [0, 1, 2]);
        assert_eq!(repeats.count, 3);
        // Every line is still kept for job.logs(), one record per rank.
        assert_eq!(shared.lock().logs.len(), 3);
    }
}
