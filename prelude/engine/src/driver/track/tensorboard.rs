//! TensorBoard event files in the run directory, so `tensorboard --logdir trainbook_runs` shows
//! trainbook runs beside the PyTorch, Lightning and Ray Tune runs people already keep there.
//!
//! The file is TensorBoard's own format: a sequence of records (length, masked CRC-32C of the
//! length, a serialised `Event`, masked CRC-32C of the event), the first event naming the
//! format version. The messages below are the fields trainbook writes of TensorBoard's
//! `event.proto`, `summary.proto`, `tensor.proto` and `tensor_shape.proto`, with their field
//! numbers, encoded by prost.
//!
//! The run is also an HParams session ([`super::hparams`]): a session-start record with the
//! run's values of its columns (a sweep's swept options, else the options the job sets), the
//! experiment that declares those columns and the metric columns, and a session-end record
//! with the outcome, so the trials of a sweep line up in TensorBoard's HParams tab, one row per
//! trial. The metric columns are the run's evaluation metrics and training loss (a sweep's
//! metric first), so the experiment is written once they are known: after the first
//! evaluation (an epoch's evaluation metrics arrive together), else when the job ends.
//!
//! Like `dllogger.json`, the driver feeds it from the event stream it already reads (rank 0's
//! metrics under stable tags, the options and restarts as text), flushes it every few seconds
//! so a live TensorBoard follows the job, and a file that cannot be written costs the file,
//! never the job.

use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use trainbook_api::metric;
use trainbook_api::{JobStatus, MetricRow, Restart};

use super::hparams::{self, Columns, HParamsPluginData};
use crate::driver::handle::JobState;

/// How often buffered events reach the file while a job runs.
const FLUSH_EVERY: Duration = Duration::from_secs(2);

#[derive(Clone, PartialEq, prost::Message)]
struct Event {
    #[prost(double, tag = "1")]
    wall_time: f64,
    #[prost(int64, tag = "2")]
    step: i64,
    #[prost(oneof = "What", tags = "3, 5")]
    what: Option<What>,
}

#[derive(Clone, PartialEq, prost::Oneof)]
enum What {
    #[prost(string, tag = "3")]
    FileVersion(String),
    #[prost(message, tag = "5")]
    Summary(Summary),
}

#[derive(Clone, PartialEq, prost::Message)]
struct Summary {
    #[prost(message, repeated, tag = "1")]
    value: Vec<Value>,
}

#[derive(Clone, PartialEq, prost::Message)]
struct Value {
    #[prost(string, tag = "1")]
    tag: String,
    #[prost(message, optional, tag = "9")]
    metadata: Option<SummaryMetadata>,
    #[prost(oneof = "Kind", tags = "2, 8")]
    kind: Option<Kind>,
}

#[derive(Clone, PartialEq, prost::Oneof)]
enum Kind {
    #[prost(float, tag = "2")]
    SimpleValue(f32),
    #[prost(message, tag = "8")]
    Tensor(TensorProto),
}

#[derive(Clone, PartialEq, prost::Message)]
struct SummaryMetadata {
    #[prost(message, optional, tag = "1")]
    plugin_data: Option<PluginData>,
}

#[derive(Clone, PartialEq, prost::Message)]
struct PluginData {
    #[prost(string, tag = "1")]
    plugin_name: String,
    #[prost(bytes = "vec", tag = "2")]
    content: Vec<u8>,
}

/// `DT_STRING` of TensorFlow's `DataType`.
const DT_STRING: i32 = 7;

#[derive(Clone, PartialEq, prost::Message)]
struct TensorProto {
    #[prost(int32, tag = "1")]
    dtype: i32,
    #[prost(message, optional, tag = "2")]
    tensor_shape: Option<TensorShapeProto>,
    #[prost(bytes = "vec", repeated, tag = "8")]
    string_val: Vec<Vec<u8>>,
}

#[derive(Clone, PartialEq, prost::Message)]
struct TensorShapeProto {}

/// TensorBoard's masked CRC-32C (a CRC of data that holds CRCs is weak, so it is rotated and
/// offset).
fn masked_crc(data: &[u8]) -> u32 {
    let crc = crc32c::crc32c(data);
    (crc.rotate_right(15)).wrapping_add(0xa282_ead8)
}

/// One record of an event file.
fn record(event: &Event) -> Vec<u8> {
    let data = prost::Message::encode_to_vec(event);
    let len = (data.len() as u64).to_le_bytes();
    let mut out = Vec::with_capacity(data.len() + 16);
    out.extend_from_slice(&len);
    out.extend_from_slice(&masked_crc(&len).to_le_bytes());
    out.extend_from_slice(&data);
    out.extend_from_slice(&masked_crc(&data).to_le_bytes());
    out
}

/// The tag a metric is shown under: `train/loss`, `train/learning_rate`, `eval/accuracy`,
/// `throughput/samples_per_second`, a task's own `train/<name>` and `eval/<name>`.
pub(super) fn tag(name: &str) -> String {
    match name {
        metric::LOSS => "train/loss".into(),
        metric::LR => "train/learning_rate".into(),
        metric::SAMPLES_PER_SECOND | metric::TRAIN_SAMPLES_PER_SECOND => {
            format!("throughput/{name}")
        }
        _ => {
            if let Some(rest) = name.strip_prefix(metric::EVAL_PREFIX) {
                format!("eval/{rest}")
            } else if let Some(rest) = name.strip_prefix(metric::EPOCH_TRAIN_PREFIX) {
                format!("train/epoch_{rest}")
            } else {
                format!("train/{name}")
            }
        }
    }
}

fn now() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs_f64())
        .unwrap_or(0.0)
}

/// The event file of one run.
pub(super) struct TensorBoard {
    out: Option<BufWriter<File>>,
    flushed: Instant,
    /// The HParams experiment, until it is written.
    declaring: Option<Declaring>,
}

/// The HParams experiment of a run while its metric columns are gathered: the evaluation
/// metrics of its first evaluation and whether it reports a training loss.
struct Declaring {
    columns: Columns,
    created: f64,
    eval: Vec<String>,
    train_loss: bool,
}

impl Declaring {
    /// Notes metric `name`; whether the metric columns are known now (the first evaluation's
    /// metrics are all in: a metric of another kind follows them).
    fn note(&mut self, name: &str) -> bool {
        if name.starts_with(metric::EVAL_PREFIX) {
            let t = tag(name);
            if !self.eval.contains(&t) {
                self.eval.push(t);
            }
            return false;
        }
        self.train_loss |= name == metric::LOSS;
        !self.eval.is_empty()
    }

    /// The metric columns: the sweep's metric, the evaluation loss, the other evaluation
    /// metrics, the training loss.
    fn metric_tags(&self) -> Vec<String> {
        let mut tags: Vec<String> = self.columns.lead.iter().map(|m| tag(m)).collect();
        let eval_loss = tag(metric::EVAL_LOSS);
        tags.extend(self.eval.iter().filter(|t| **t == eval_loss).cloned());
        tags.extend(self.eval.iter().cloned());
        if self.train_loss {
            tags.push(tag(metric::LOSS));
        }
        let mut seen = std::collections::BTreeSet::new();
        tags.retain(|t| seen.insert(t.clone()));
        tags
    }
}

impl TensorBoard {
    /// Starts `dir/events.out.tfevents.<time>.<host>.trainbook` (TensorBoard reads every file
    /// whose name contains `tfevents`).
    pub(super) fn create(dir: &Path) -> TensorBoard {
        let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
            .map(|h| h.trim().to_string())
            .ok()
            .filter(|h| !h.is_empty() && !h.contains('/'))
            .unwrap_or_else(|| "localhost".into());
        let path = dir.join(format!(
            "events.out.tfevents.{}.{host}.trainbook",
            now() as u64
        ));
        let mut tb = TensorBoard {
            out: File::create(&path).ok().map(BufWriter::new),
            flushed: Instant::now(),
            declaring: None,
        };
        tb.write(&Event {
            wall_time: now(),
            step: 0,
            what: Some(What::FileVersion("brain.Event:2".into())),
        });
        tb.flush();
        tb
    }

    fn write(&mut self, event: &Event) {
        if let Some(out) = &mut self.out {
            if out.write_all(&record(event)).is_err() {
                // Full disk, removed directory: stop writing, keep training.
                self.out = None;
            }
        }
        if self.flushed.elapsed() >= FLUSH_EVERY {
            self.flush();
        }
    }

    fn summary(&mut self, step: u64, value: Value) {
        self.write(&Event {
            wall_time: now(),
            step: step as i64,
            what: Some(What::Summary(Summary { value: vec![value] })),
        });
    }

    /// A metric of rank 0, under its [`tag`].
    pub(super) fn scalar(&mut self, name: &str, step: u64, value: f64) {
        self.summary(
            step,
            Value {
                tag: tag(name),
                metadata: None,
                kind: Some(Kind::SimpleValue(value as f32)),
            },
        );
    }

    /// Text for TensorBoard's Text tab (markdown).
    pub(super) fn text(&mut self, tag: &str, step: u64, text: &str) {
        self.summary(
            step,
            Value {
                tag: tag.into(),
                metadata: Some(SummaryMetadata {
                    plugin_data: Some(PluginData {
                        plugin_name: "text".into(),
                        content: Vec::new(),
                    }),
                }),
                kind: Some(Kind::Tensor(TensorProto {
                    dtype: DT_STRING,
                    tensor_shape: Some(TensorShapeProto {}),
                    string_val: vec![text.as_bytes().to_vec()],
                })),
            },
        );
    }

    /// A record of the hparams plugin (its content is in the metadata; the tensor is empty).
    fn hparams_record(&mut self, tag: &str, data: HParamsPluginData) {
        let content = prost::Message::encode_to_vec(&data);
        self.summary(
            0,
            Value {
                tag: tag.into(),
                metadata: Some(SummaryMetadata {
                    plugin_data: Some(PluginData {
                        plugin_name: "hparams".into(),
                        content,
                    }),
                }),
                kind: Some(Kind::Tensor(TensorProto {
                    dtype: DT_STRING,
                    tensor_shape: Some(TensorShapeProto {}),
                    string_val: Vec::new(),
                })),
            },
        );
    }

    /// Starts the run's HParams session with its values of `columns` (TensorBoard's HParams
    /// tab; a sweep's trials compare there). `group` names the session's group: the run's own
    /// name. The experiment that declares the columns follows once the metrics are known.
    pub(super) fn hparams(&mut self, columns: Columns, group: &str) {
        let start = now();
        self.hparams_record(
            hparams::SESSION_START_TAG,
            columns.session_start(group, start),
        );
        self.declaring = Some(Declaring {
            columns,
            created: start,
            eval: Vec::new(),
            train_loss: false,
        });
    }

    /// A metric of rank 0: its scalar, and the experiment once its metric columns are known.
    pub(super) fn report(&mut self, name: &str, step: u64, value: f64) {
        self.scalar(name, step, value);
        if self.declaring.as_mut().is_some_and(|d| d.note(name)) {
            self.declare();
        }
    }

    /// Writes the HParams experiment (once).
    fn declare(&mut self) {
        if let Some(d) = self.declaring.take() {
            let experiment = d.columns.experiment(&d.metric_tags(), d.created);
            self.hparams_record(hparams::EXPERIMENT_TAG, experiment);
            self.flush();
        }
    }

    /// Ends the HParams session: succeeded or not. A run that has not declared its experiment
    /// yet does now, with the metrics it has, unless it is a trial that failed before its
    /// first evaluation (every trial declares the same experiment, and TensorBoard shows any
    /// one of them).
    pub(super) fn session_end(&mut self, succeeded: bool) {
        let declare = self
            .declaring
            .as_ref()
            .is_some_and(|d| succeeded || !d.columns.trial || !d.eval.is_empty());
        if declare {
            self.declare();
        }
        self.hparams_record(
            hparams::SESSION_END_TAG,
            hparams::session_end(succeeded, now()),
        );
        self.flush();
    }

    /// Writes what is buffered to the file (a live TensorBoard reads it from there).
    pub(super) fn flush(&mut self) {
        if let Some(out) = &mut self.out {
            let _ = out.flush();
        }
        self.flushed = Instant::now();
    }

    /// Flushes when the last flush is [`FLUSH_EVERY`] old (the driver calls this while idle,
    /// so a quiet job's last metrics do not wait for the next one).
    pub(super) fn tick(&mut self) {
        if self.flushed.elapsed() >= FLUSH_EVERY {
            self.flush();
        }
    }
}

impl Drop for TensorBoard {
    fn drop(&mut self) {
        self.flush();
    }
}

/// The job's event file, headed by its options (all of them, the Text tab) and its HParams
/// session.
pub(super) fn for_job(job: &JobState, parameters: &serde_json::Value) -> TensorBoard {
    let mut tb = TensorBoard::create(&job.run_dir);
    let options = serde_json::to_string_pretty(parameters).unwrap_or_default();
    // Indented: markdown's code block, which TensorBoard's Text tab shows as is.
    let text: String = options.lines().map(|l| format!("    {l}\n")).collect();
    tb.text("options", 0, &text);
    let name = job.run_dir.file_name().unwrap_or_default();
    tb.hparams(Columns::for_job(&job.spec), &name.to_string_lossy());
    tb
}

impl super::Tracker for TensorBoard {
    fn metric(&mut self, row: &MetricRow) {
        self.report(&row.name, row.step, row.value);
    }
    fn restart(&mut self, resumed_step: u64, restart: &Restart) {
        self.text("restarts", resumed_step, &restart.to_string());
    }
    fn tick(&mut self) {
        TensorBoard::tick(self);
    }
    fn finish(
        mut self: Box<Self>,
        status: JobStatus,
        _checkpoint: Option<PathBuf>,
    ) -> Option<String> {
        self.session_end(status == JobStatus::Succeeded);
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn metric_names_map_to_stable_tags() {
        assert_eq!(tag("loss"), "train/loss");
        assert_eq!(tag("lr"), "train/learning_rate");
        assert_eq!(tag("eval_loss"), "eval/loss");
        assert_eq!(tag("eval_f1_macro"), "eval/f1_macro");
        assert_eq!(tag("epoch_train_accuracy"), "train/epoch_accuracy");
        assert_eq!(tag("samples_per_second"), "throughput/samples_per_second");
        assert_eq!(tag("margin"), "train/margin");
    }

    #[test]
    fn records_are_framed_with_masked_crcs() {
        // TensorFlow's own test vector for the mask: crc32c("foo") = 0xcfc4ae1d.
        assert_eq!(crc32c::crc32c(b"foo"), 0xcfc4_ae1d);
        assert_eq!(
            masked_crc(b"foo"),
            0xcfc4_ae1du32.rotate_right(15).wrapping_add(0xa282_ead8)
        );
        let e = Event {
            wall_time: 1.5,
            step: 7,
            what: Some(What::FileVersion("brain.Event:2".into())),
        };
        let r = record(&e);
        let len = u64::from_le_bytes(r[..8].try_into().unwrap()) as usize;
        assert_eq!(r.len(), 8 + 4 + len + 4);
        assert_eq!(
            u32::from_le_bytes(r[8..12].try_into().unwrap()),
            masked_crc(&r[..8])
        );
        let data = &r[12..12 + len];
        assert_eq!(
            u32::from_le_bytes(r[12 + len..].try_into().unwrap()),
            masked_crc(data)
        );
        let back: Event = prost::Message::decode(data).unwrap();
        assert_eq!(back, e);
    }

    /// A fresh directory for one test's event file.
    fn scratch(name: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("tb-unit-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }

    /// The events of the event file in `dir`, decoded.
    fn events_in(dir: &Path) -> Vec<Event> {
        let file = std::fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().path())
            .find(|p| p.to_string_lossy().contains("tfevents"))
            .unwrap();
        let bytes = std::fs::read(file).unwrap();
        let mut events = Vec::new();
        let mut at = 0;
        while at < bytes.len() {
            let len = u64::from_le_bytes(bytes[at..at + 8].try_into().unwrap()) as usize;
            let e: Event = prost::Message::decode(&bytes[at + 12..at + 12 + len]).unwrap();
            events.push(e);
            at += 16 + len;
        }
        events
    }

    /// The hparams plugin's records among `events`: tag and decoded content, in order.
    fn hparams_records(events: &[Event]) -> Vec<(String, hparams::Data)> {
        events
            .iter()
            .filter_map(|e| match &e.what {
                Some(What::Summary(s)) => s.value.first(),
                _ => None,
            })
            .filter_map(|v| {
                let p = v.metadata.as_ref()?.plugin_data.as_ref()?;
                (p.plugin_name == "hparams").then(|| {
                    let d: HParamsPluginData = prost::Message::decode(&p.content[..]).unwrap();
                    assert_eq!(d.version, 0);
                    (v.tag.clone(), d.data.unwrap())
                })
            })
            .collect()
    }

    fn experiment_of(records: &[(String, hparams::Data)]) -> Option<hparams::Experiment> {
        let mut found = records.iter().filter_map(|(tag, d)| match d {
            hparams::Data::Experiment(e) => {
                assert_eq!(tag, hparams::EXPERIMENT_TAG);
                Some(e.clone())
            }
            _ => None,
        });
        let e = found.next();
        assert!(found.next().is_none(), "one experiment per run");
        e
    }

    fn metric_tags(e: &hparams::Experiment) -> Vec<&str> {
        e.metric_infos
            .iter()
            .map(|m| m.name.as_ref().unwrap().tag.as_str())
            .collect()
    }

    /// One epoch as the workers report it: step losses, then the epoch's metrics in name order.
    fn an_epoch(tb: &mut TensorBoard, eval: bool) {
        tb.report("loss", 1, 0.7);
        tb.report("lr", 1, 1e-3);
        tb.report("loss", 2, 0.6);
        tb.report("epoch_train_loss", 2, 0.65);
        if eval {
            tb.report("eval_accuracy", 2, 0.5);
            tb.report("eval_f1", 2, 0.4);
            tb.report("eval_loss", 2, 0.69);
        }
        tb.report("samples_per_second", 2, 100.0);
    }

    #[test]
    fn a_job_with_two_options_set_has_those_two_columns_and_its_metrics() {
        use trainbook_api::ConfigureTraining;
        let dir = scratch("job");
        let mut tb = TensorBoard::create(&dir);
        let spec = trainbook_api::JobSpec::new("bert").lr(1e-3).epochs(2);
        tb.hparams(Columns::for_job(&spec), "bert-1");
        an_epoch(&mut tb, true);
        // Declared after the first evaluation, while the job runs.
        tb.flush();
        let records = hparams_records(&events_in(&dir));
        let e = experiment_of(&records).expect("declared after the first evaluation");
        let names: Vec<&str> = e.hparam_infos.iter().map(|h| h.name.as_str()).collect();
        assert_eq!(names, ["epochs", "lr"]);
        assert_eq!(
            metric_tags(&e),
            ["eval/loss", "eval/accuracy", "eval/f1", "train/loss"]
        );
        // Each metric column is a scalar the file holds, under the same tag.
        let scalars: Vec<String> = events_in(&dir)
            .iter()
            .filter_map(|e| match &e.what {
                Some(What::Summary(s)) if matches!(s.value[0].kind, Some(Kind::SimpleValue(_))) => {
                    Some(s.value[0].tag.clone())
                }
                _ => None,
            })
            .collect();
        assert!(metric_tags(&e)
            .iter()
            .all(|t| scalars.iter().any(|s| s == t)));
        // The session holds the values of exactly those columns.
        let hparams::Data::Start(start) = &records[0].1 else {
            panic!("{records:?}")
        };
        assert_eq!(records[0].0, hparams::SESSION_START_TAG);
        assert_eq!(start.group_name, "bert-1");
        assert_eq!(start.hparams.keys().collect::<Vec<_>>(), ["epochs", "lr"]);
        assert_eq!(
            start.hparams["lr"].kind,
            Some(hparams::ValueKind::Number(1e-3))
        );
        // A second epoch declares nothing more; the end is the last record.
        an_epoch(&mut tb, true);
        tb.session_end(true);
        let records = hparams_records(&events_in(&dir));
        assert_eq!(records.len(), 3);
        let (tag, hparams::Data::End(end)) = &records[2] else {
            panic!("{records:?}")
        };
        assert_eq!((tag.as_str(), end.status), (hparams::SESSION_END_TAG, 1));
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_trial_leads_with_the_sweeps_metric_and_a_job_without_evaluation_declares_at_its_end() {
        use trainbook_api::{ConfigureTraining, ParamValue, Space};
        let swept = hparams::Swept {
            space: vec![(
                "lr".into(),
                Space::Grid(vec![ParamValue::Float(1e-3), ParamValue::Float(1e-2)]),
            )],
            metric: "epoch_train_loss".into(),
        };
        let spec = trainbook_api::JobSpec::new("bert").lr(1e-2).epochs(2);

        // A trial: the swept option only, the sweep's metric first.
        let dir = scratch("trial");
        let mut tb = TensorBoard::create(&dir);
        tb.hparams(Columns::of_trial(&spec, &swept), "trial-2");
        an_epoch(&mut tb, true);
        tb.session_end(true);
        let e = experiment_of(&hparams_records(&events_in(&dir))).unwrap();
        assert_eq!(e.hparam_infos.len(), 1);
        assert_eq!(e.hparam_infos[0].name, "lr");
        assert_eq!(
            metric_tags(&e),
            [
                "train/epoch_loss",
                "eval/loss",
                "eval/accuracy",
                "eval/f1",
                "train/loss"
            ]
        );

        // No evaluation: declared when the job ends, with what it reported.
        let dir2 = scratch("no-eval");
        let mut tb = TensorBoard::create(&dir2);
        tb.hparams(Columns::of_job(&spec), "bert-2");
        an_epoch(&mut tb, false);
        tb.flush();
        assert!(experiment_of(&hparams_records(&events_in(&dir2))).is_none());
        tb.session_end(false);
        let e = experiment_of(&hparams_records(&events_in(&dir2))).unwrap();
        assert_eq!(metric_tags(&e), ["train/loss"]);

        // A trial that fails before its first evaluation declares nothing: the other trials'
        // experiment, with the evaluation metrics, is the one TensorBoard shows.
        let dir3 = scratch("failed-trial");
        let mut tb = TensorBoard::create(&dir3);
        tb.hparams(Columns::of_trial(&spec, &swept), "trial-3");
        tb.report("loss", 1, 0.7);
        tb.session_end(false);
        assert!(experiment_of(&hparams_records(&events_in(&dir3))).is_none());
        for d in [dir, dir2, dir3] {
            std::fs::remove_dir_all(&d).unwrap();
        }
    }

    #[test]
    fn a_file_holds_the_version_then_each_summary() {
        let dir = scratch("file");
        let mut tb = TensorBoard::create(&dir);
        tb.scalar("loss", 3, 0.25);
        tb.text("config", 0, "lr = 0.001");
        tb.flush();
        let events = events_in(&dir);
        assert_eq!(events.len(), 3);
        assert_eq!(
            events[0].what,
            Some(What::FileVersion("brain.Event:2".into()))
        );
        let Some(What::Summary(s)) = &events[1].what else {
            panic!("{:?}", events[1])
        };
        assert_eq!((events[1].step, s.value[0].tag.as_str()), (3, "train/loss"));
        assert_eq!(s.value[0].kind, Some(Kind::SimpleValue(0.25)));
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
