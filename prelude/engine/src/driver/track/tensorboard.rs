//! TensorBoard event files in the run directory, so `tensorboard --logdir trainbook_runs` shows
//! trainbook runs beside the PyTorch, Lightning and Ray Tune runs people already keep there.
//!
//! The file is TensorBoard's own format: a sequence of records (length, masked CRC-32C of the
//! length, a serialised `Event`, masked CRC-32C of the event), the first event naming the
//! format version. The messages below are the fields trainbook writes of TensorBoard's
//! `event.proto`, `summary.proto`, `tensor.proto` and `tensor_shape.proto`, with their field
//! numbers, encoded by prost.
//!
//! The resolved options are also an HParams session (the hparams plugin's `plugin_data.proto`:
//! a session-start record with the options, a session-end record with the outcome), so the
//! trials of a sweep line up in TensorBoard's HParams tab, one row per trial, with the scalars
//! as their metrics.
//!
//! Like `dllogger.json`, the driver feeds it from the event stream it already reads (rank 0's
//! metrics under stable tags, the options and restarts as text), flushes it every few seconds
//! so a live TensorBoard follows the job, and a file that cannot be written costs the file,
//! never the job.

use std::collections::BTreeMap;
use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use trainbook_api::metric;
use trainbook_api::{JobStatus, MetricRow, Restart};

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

/// `HParamsPluginData` of the hparams plugin (`plugin_data.proto`): version 0, one of the
/// session's start or end.
#[derive(Clone, PartialEq, prost::Message)]
struct HParamsPluginData {
    #[prost(int32, tag = "1")]
    version: i32,
    #[prost(oneof = "Session", tags = "3, 4")]
    data: Option<Session>,
}

#[derive(Clone, PartialEq, prost::Oneof)]
enum Session {
    #[prost(message, tag = "3")]
    Start(SessionStartInfo),
    #[prost(message, tag = "4")]
    End(SessionEndInfo),
}

#[derive(Clone, PartialEq, prost::Message)]
struct SessionStartInfo {
    #[prost(btree_map = "string, message", tag = "1")]
    hparams: BTreeMap<String, ProtoValue>,
    #[prost(string, tag = "4")]
    group_name: String,
    #[prost(double, tag = "5")]
    start_time_secs: f64,
}

#[derive(Clone, PartialEq, prost::Message)]
struct SessionEndInfo {
    /// `tensorboard.hparams.Status`: 1 success, 2 failure.
    #[prost(int32, tag = "1")]
    status: i32,
    #[prost(double, tag = "2")]
    end_time_secs: f64,
}

/// `google.protobuf.Value`: the kinds an option's value takes.
#[derive(Clone, PartialEq, prost::Message)]
struct ProtoValue {
    #[prost(oneof = "ValueKind", tags = "2, 3, 4")]
    kind: Option<ValueKind>,
}

#[derive(Clone, PartialEq, prost::Oneof)]
enum ValueKind {
    #[prost(double, tag = "2")]
    Number(f64),
    #[prost(string, tag = "3")]
    Text(String),
    #[prost(bool, tag = "4")]
    Bool(bool),
}

/// Options (flattened, see `drive::flat_options`) as HParams values; lists as their JSON text.
fn hparam_values(options: &BTreeMap<String, serde_json::Value>) -> BTreeMap<String, ProtoValue> {
    use serde_json::Value as J;
    let value = |v: &J| match v {
        J::Bool(b) => ValueKind::Bool(*b),
        J::Number(n) => ValueKind::Number(n.as_f64().unwrap_or(f64::NAN)),
        J::String(s) => ValueKind::Text(s.clone()),
        other => ValueKind::Text(other.to_string()),
    };
    options
        .iter()
        .map(|(k, v)| {
            (
                k.clone(),
                ProtoValue {
                    kind: Some(value(v)),
                },
            )
        })
        .collect()
}

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
    fn hparams_record(&mut self, tag: &str, data: Session) {
        let content = prost::Message::encode_to_vec(&HParamsPluginData {
            version: 0,
            data: Some(data),
        });
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

    /// The run's options as an HParams session (TensorBoard's HParams tab; a sweep's trials
    /// compare there). `group` names the session's group: the run's own name.
    pub(super) fn hparams(&mut self, options: &BTreeMap<String, serde_json::Value>, group: &str) {
        self.hparams_record(
            "_hparams_/session_start_info",
            Session::Start(SessionStartInfo {
                hparams: hparam_values(options),
                group_name: group.into(),
                start_time_secs: now(),
            }),
        );
    }

    /// Ends the HParams session: succeeded or not.
    pub(super) fn session_end(&mut self, succeeded: bool) {
        self.hparams_record(
            "_hparams_/session_end_info",
            Session::End(SessionEndInfo {
                status: if succeeded { 1 } else { 2 },
                end_time_secs: now(),
            }),
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

/// The job's event file, headed by its options (the Text tab) and its HParams.
pub(super) fn for_job(job: &JobState, parameters: &serde_json::Value) -> TensorBoard {
    let mut tb = TensorBoard::create(&job.run_dir);
    let options = serde_json::to_string_pretty(parameters).unwrap_or_default();
    // Indented: markdown's code block, which TensorBoard's Text tab shows as is.
    let text: String = options.lines().map(|l| format!("    {l}\n")).collect();
    tb.text("options", 0, &text);
    let name = job.run_dir.file_name().unwrap_or_default();
    tb.hparams(&super::flat_options(parameters), &name.to_string_lossy());
    tb
}

impl super::Tracker for TensorBoard {
    fn metric(&mut self, row: &MetricRow) {
        self.scalar(&row.name, row.step, row.value);
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
    fn options_become_hparams_values_of_their_kind() {
        let flat: BTreeMap<String, serde_json::Value> = [
            ("lr".to_string(), serde_json::json!(0.001)),
            ("optimizer".to_string(), serde_json::json!("adamw")),
            ("bf16".to_string(), serde_json::json!(false)),
            ("betas".to_string(), serde_json::json!([0.9, 0.999])),
        ]
        .into_iter()
        .collect();
        let v = hparam_values(&flat);
        assert_eq!(v["lr"].kind, Some(ValueKind::Number(0.001)));
        assert_eq!(v["optimizer"].kind, Some(ValueKind::Text("adamw".into())));
        assert_eq!(v["bf16"].kind, Some(ValueKind::Bool(false)));
        assert_eq!(v["betas"].kind, Some(ValueKind::Text("[0.9,0.999]".into())));
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

    #[test]
    fn a_file_holds_the_version_then_each_summary() {
        let dir = std::env::temp_dir().join(format!("tb-unit-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let mut tb = TensorBoard::create(&dir);
        tb.scalar("loss", 3, 0.25);
        tb.text("config", 0, "lr = 0.001");
        tb.flush();
        let file = std::fs::read_dir(&dir)
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
