//! `dllogger.json` in the run directory: the JSON-lines log BERT pre-training scripts write
//! (NVIDIA's and Habana's, through dllogger), so the tools people point at those files read
//! trainbook runs too. One line per entry, `DLLL {json}`: the job's parameters first, then one
//! line per optimizer step of rank 0 with every metric of that step, then a summary whose
//! `step` is `[]` with `e2e_train_time`, `training_sequences_per_second`, `final_loss` and
//! `raw_train_time`, the figures the reference's last line prints. A restart writes a line
//! whose `step` is `"RESTART"`; the step lines after it replay the steps after `resumed_step`
//! (a reader keeps, per step, the last line).
//!
//! The driver feeds it from the event stream it already reads (workers → events → driver), so
//! workers write nothing extra; a file that cannot be written costs the log, never the job.

use std::collections::BTreeMap;
use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::Path;

use serde_json::{json, Value};
use trainbook_api::metric;

use trainbook_api::{MetricRow, Restart};

use crate::shared::events::WorkerSummary;

pub(super) struct DlLog {
    out: Option<BufWriter<File>>,
    /// The step being collected: (epoch, step) and its metrics so far.
    pending: Option<((u64, u64), BTreeMap<String, f64>)>,
}

impl DlLog {
    /// Starts `file` (a run's `dllogger.json`) with a `PARAMETER` line of `parameters`.
    pub(super) fn create(file: &Path, parameters: Value) -> Self {
        let mut log = DlLog {
            out: File::create(file).ok().map(BufWriter::new),
            pending: None,
        };
        log.line("PARAMETER", json!("PARAMETER"), parameters, 0.0);
        log
    }

    /// A metric of rank 0; a new step writes the previous step's line.
    pub(super) fn metric(&mut self, epoch: u64, step: u64, name: &str, value: f64, elapsed: f64) {
        if self
            .pending
            .as_ref()
            .is_some_and(|(at, _)| *at != (epoch, step))
        {
            self.flush_step(elapsed);
        }
        self.pending
            .get_or_insert_with(|| ((epoch, step), BTreeMap::new()))
            .1
            .insert(name.to_string(), value);
    }

    /// Rank 0's summary: the last step's line, then the run's summary line.
    pub(super) fn finish(&mut self, summary: &WorkerSummary, elapsed: f64) {
        self.flush_step(elapsed);
        let throughput = summary
            .metrics
            .get(metric::TRAIN_SAMPLES_PER_SECOND)
            .or(summary.metrics.get(metric::SAMPLES_PER_SECOND))
            .copied()
            .unwrap_or(0.0);
        let data = json!({
            "e2e_train_time": elapsed,
            "training_sequences_per_second": throughput,
            "final_loss": summary.final_train_loss,
            "raw_train_time": summary.train_seconds,
        });
        self.line("LOG", json!([]), data, elapsed);
        if let Some(out) = &mut self.out {
            let _ = out.flush();
        }
    }

    /// The job restarted from `resumed_step`: a step still being collected past it is dropped
    /// (it will be replayed), and a line says so.
    pub(super) fn restart(&mut self, resumed_step: u64, reason: &str, elapsed: f64) {
        if self
            .pending
            .as_ref()
            .is_some_and(|((_, step), _)| *step > resumed_step)
        {
            self.pending = None;
        } else {
            self.flush_step(elapsed);
        }
        let data = json!({"resumed_step": resumed_step, "reason": reason});
        self.line("LOG", json!("RESTART"), data, elapsed);
    }

    fn flush_step(&mut self, elapsed: f64) {
        if let Some(((epoch, step), metrics)) = self.pending.take() {
            self.line("LOG", json!([epoch, step]), json!(metrics), elapsed);
        }
    }

    fn line(&mut self, kind: &str, step: Value, data: Value, elapsed: f64) {
        let Some(out) = &mut self.out else { return };
        let timestamp = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_secs_f64())
            .unwrap_or(0.0);
        let entry = json!({
            "timestamp": timestamp,
            "elapsedtime": elapsed,
            "type": kind,
            "step": step,
            "data": data,
        });
        if writeln!(out, "DLLL {entry}").is_err() {
            self.out = None;
        }
    }
}

impl super::Tracker for DlLog {
    fn metric(&mut self, row: &MetricRow) {
        DlLog::metric(self, row.epoch, row.step, &row.name, row.value, row.time);
    }
    fn restart(&mut self, resumed_step: u64, restart: &Restart) {
        DlLog::restart(self, resumed_step, &restart.reason, restart.time);
    }
    fn done(&mut self, summary: &WorkerSummary, elapsed: f64) {
        DlLog::finish(self, summary, elapsed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::shared::run_dir::RunDir;

    fn entries(dir: &Path) -> Vec<Value> {
        std::fs::read_to_string(RunDir::new(dir).dllogger())
            .unwrap()
            .lines()
            .map(|l| serde_json::from_str(l.strip_prefix("DLLL ").expect(l)).unwrap())
            .collect()
    }

    #[test]
    fn one_line_per_step_then_the_summary() {
        let dir = std::env::temp_dir().join(format!("trainbook-dllog-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let mut log = DlLog::create(&RunDir::new(&dir).dllogger(), json!({"lr": 0.1}));
        log.metric(0, 1, "loss", 2.5, 0.1);
        log.metric(0, 1, "lr", 0.1, 0.1);
        log.metric(0, 2, "loss", 2.0, 0.2);
        let mut summary = WorkerSummary {
            final_train_loss: 2.0,
            train_seconds: 0.15,
            ..Default::default()
        };
        summary.metrics.insert("samples_per_second".into(), 10.0);
        summary
            .metrics
            .insert("train_samples_per_second".into(), 12.0);
        log.finish(&summary, 0.3);
        drop(log);
        let e = entries(&dir);
        assert_eq!(e.len(), 4, "{e:?}");
        assert_eq!(e[0]["type"], "PARAMETER");
        assert_eq!(e[0]["data"]["lr"], 0.1);
        assert_eq!(e[1]["step"], json!([0, 1]));
        assert_eq!(e[1]["data"], json!({"loss": 2.5, "lr": 0.1}));
        assert_eq!(e[2]["data"], json!({"loss": 2.0}));
        assert_eq!(e[3]["step"], json!([]));
        assert_eq!(e[3]["data"]["training_sequences_per_second"], 12.0);
        assert_eq!(e[3]["data"]["final_loss"], 2.0);
        assert_eq!(e[3]["data"]["raw_train_time"], 0.15);
        std::fs::remove_dir_all(dir).ok();
    }

    #[test]
    fn a_restart_drops_the_step_being_collected_and_says_where_the_replay_starts() {
        let dir = std::env::temp_dir().join(format!("trainbook-dllog-r-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let mut log = DlLog::create(&RunDir::new(&dir).dllogger(), json!({}));
        log.metric(0, 20, "loss", 1.0, 0.1);
        log.metric(0, 21, "loss", 0.9, 0.2);
        log.restart(20, "rank 1 killed by signal 9 (SIGKILL)", 0.3);
        log.metric(0, 21, "loss", 0.9, 0.4);
        log.finish(&WorkerSummary::default(), 0.5);
        drop(log);
        let e = entries(&dir);
        let steps: Vec<&Value> = e.iter().map(|e| &e["step"]).collect();
        assert_eq!(
            steps,
            [
                &json!("PARAMETER"),
                &json!([0, 20]),
                &json!("RESTART"),
                &json!([0, 21]),
                &json!([])
            ]
        );
        assert_eq!(e[2]["data"]["resumed_step"], 20);
        std::fs::remove_dir_all(dir).ok();
    }

    #[test]
    fn an_unwritable_directory_costs_only_the_log() {
        let mut log = DlLog::create(Path::new("/nonexistent/trainbook"), json!({}));
        log.metric(0, 1, "loss", 1.0, 0.0);
        log.finish(&WorkerSummary::default(), 1.0);
    }
}
