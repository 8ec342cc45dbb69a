//! What TensorBoard's HParams tab shows of a run, as the hparams plugin reads it from event
//! files (its `plugin_data.proto` and `api.proto`, with `google.protobuf.Value`): an
//! *experiment* that declares the columns, hyper-parameters and metrics, and a *session* per
//! run, whose start holds the run's value in each hyper-parameter column and whose end holds
//! its outcome. The metric columns take each run's last value of the scalar of that tag.
//!
//! The columns are what the run was about, not the 30-odd options every job resolves: for a
//! trial of a sweep, the swept options (their space as the column's domain, the sweep's
//! metric as the first metric column); for any other job, the options it sets itself (a
//! training option given, a recipe option, a task's field), not the preset's defaults. Every
//! option stays in the Text tab. TensorBoard takes the experiment from any one run of the
//! directory it shows, so every trial of a sweep declares the same one.
//!
//! The messages below are the fields trainbook writes, with their field numbers; the
//! TensorBoard tracker frames them as summaries.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use serde_json::Value as J;
use trainbook_api::{JobKind, JobSpec, ParamValue, Space};

/// `HParamsPluginData`: version 0, and one of the experiment, a session's start or its end.
#[derive(Clone, PartialEq, prost::Message)]
pub(super) struct HParamsPluginData {
    #[prost(int32, tag = "1")]
    pub(super) version: i32,
    #[prost(oneof = "Data", tags = "2, 3, 4")]
    pub(super) data: Option<Data>,
}

#[derive(Clone, PartialEq, prost::Oneof)]
pub(super) enum Data {
    #[prost(message, tag = "2")]
    Experiment(Experiment),
    #[prost(message, tag = "3")]
    Start(SessionStartInfo),
    #[prost(message, tag = "4")]
    End(SessionEndInfo),
}

/// The tags TensorBoard looks the three records up by.
pub(super) const EXPERIMENT_TAG: &str = "_hparams_/experiment";
pub(super) const SESSION_START_TAG: &str = "_hparams_/session_start_info";
pub(super) const SESSION_END_TAG: &str = "_hparams_/session_end_info";

/// `Experiment` (`api.proto`): the HParams tab's columns.
#[derive(Clone, PartialEq, prost::Message)]
pub(super) struct Experiment {
    #[prost(double, tag = "3")]
    pub(super) time_created_secs: f64,
    #[prost(message, repeated, tag = "4")]
    pub(super) hparam_infos: Vec<HParamInfo>,
    #[prost(message, repeated, tag = "5")]
    pub(super) metric_infos: Vec<MetricInfo>,
}

/// `HParamInfo`: a hyper-parameter column.
#[derive(Clone, PartialEq, prost::Message)]
pub(super) struct HParamInfo {
    #[prost(string, tag = "1")]
    pub(super) name: String,
    /// `DataType`: [`STRING`], [`BOOL`] or [`FLOAT64`].
    #[prost(int32, tag = "4")]
    pub(super) data_type: i32,
    #[prost(oneof = "Domain", tags = "5, 6")]
    pub(super) domain: Option<Domain>,
    /// The column's values differ between the sessions (TensorBoard shows such columns first).
    #[prost(bool, tag = "7")]
    pub(super) differs: bool,
}

/// `DataType` of `api.proto`.
pub(super) const STRING: i32 = 1;
pub(super) const BOOL: i32 = 2;
pub(super) const FLOAT64: i32 = 3;

/// The values a column takes: the tab's filter offers them.
#[derive(Clone, PartialEq, prost::Oneof)]
pub(super) enum Domain {
    #[prost(message, tag = "5")]
    Discrete(ListValue),
    #[prost(message, tag = "6")]
    Interval(Interval),
}

/// `google.protobuf.ListValue`.
#[derive(Clone, PartialEq, prost::Message)]
pub(super) struct ListValue {
    #[prost(message, repeated, tag = "1")]
    pub(super) values: Vec<ProtoValue>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub(super) struct Interval {
    #[prost(double, tag = "1")]
    pub(super) min_value: f64,
    #[prost(double, tag = "2")]
    pub(super) max_value: f64,
}

/// `MetricInfo`: a metric column, named as the scalar it shows.
#[derive(Clone, PartialEq, prost::Message)]
pub(super) struct MetricInfo {
    #[prost(message, optional, tag = "1")]
    pub(super) name: Option<MetricName>,
    /// `DatasetType`: 1 training, 2 validation.
    #[prost(int32, tag = "5")]
    pub(super) dataset_type: i32,
}

/// `MetricName`: the scalar's run below the session's (empty: the session's own) and tag.
#[derive(Clone, PartialEq, prost::Message)]
pub(super) struct MetricName {
    #[prost(string, tag = "1")]
    pub(super) group: String,
    #[prost(string, tag = "2")]
    pub(super) tag: String,
}

#[derive(Clone, PartialEq, prost::Message)]
pub(super) struct SessionStartInfo {
    #[prost(btree_map = "string, message", tag = "1")]
    pub(super) hparams: BTreeMap<String, ProtoValue>,
    #[prost(string, tag = "4")]
    pub(super) group_name: String,
    #[prost(double, tag = "5")]
    pub(super) start_time_secs: f64,
}

#[derive(Clone, PartialEq, prost::Message)]
pub(super) struct SessionEndInfo {
    /// `Status`: 1 success, 2 failure.
    #[prost(int32, tag = "1")]
    pub(super) status: i32,
    #[prost(double, tag = "2")]
    pub(super) end_time_secs: f64,
}

/// `google.protobuf.Value`: the kinds an option's value takes.
#[derive(Clone, PartialEq, prost::Message)]
pub(super) struct ProtoValue {
    #[prost(oneof = "ValueKind", tags = "2, 3, 4")]
    pub(super) kind: Option<ValueKind>,
}

#[derive(Clone, PartialEq, prost::Oneof)]
pub(super) enum ValueKind {
    #[prost(double, tag = "2")]
    Number(f64),
    #[prost(string, tag = "3")]
    Text(String),
    #[prost(bool, tag = "4")]
    Bool(bool),
}

/// The column type of a value: true/false, a number, else text (lists and objects as their
/// JSON).
fn data_type(v: &J) -> i32 {
    match v {
        J::Bool(_) => BOOL,
        J::Number(_) => FLOAT64,
        _ => STRING,
    }
}

/// `v` as a value of a column of type `data_type` (a column of text holds every value as
/// text, so a sweep over `1, auto` has one type).
fn value_as(v: &J, data_type: i32) -> ProtoValue {
    let kind = match (data_type, v) {
        (BOOL, J::Bool(b)) => ValueKind::Bool(*b),
        (FLOAT64, J::Number(n)) => ValueKind::Number(n.as_f64().unwrap_or(f64::NAN)),
        (_, J::String(s)) => ValueKind::Text(s.clone()),
        (_, other) => ValueKind::Text(other.to_string()),
    };
    ProtoValue { kind: Some(kind) }
}

/// A swept option's column: its type, domain and whether its values differ, from its space.
fn swept_column(name: &str, space: &Space) -> HParamInfo {
    let (data_type, domain, differs) = match space {
        Space::Grid(values) | Space::Choice(values) => {
            let mut distinct: Vec<J> = Vec::new();
            for v in values.iter().map(ParamValue::to_json) {
                if !distinct.contains(&v) {
                    distinct.push(v);
                }
            }
            let types: Vec<i32> = distinct.iter().map(data_type).collect();
            let t = if types.windows(2).all(|w| w[0] == w[1]) {
                types.first().copied().unwrap_or(STRING)
            } else {
                STRING
            };
            let values = distinct.iter().map(|v| value_as(v, t)).collect();
            (
                t,
                Domain::Discrete(ListValue { values }),
                distinct.len() > 1,
            )
        }
        Space::Uniform { low, high } | Space::LogUniform { low, high } => (
            FLOAT64,
            Domain::Interval(Interval {
                min_value: *low,
                max_value: *high,
            }),
            true,
        ),
    };
    HParamInfo {
        name: name.into(),
        data_type,
        domain: Some(domain),
        differs,
    }
}

/// A column of an option a job sets: its value's type; true/false offers both values. Text and
/// numbers get no domain, so that runs that set other values are not filtered out when
/// TensorBoard shows this run's experiment for a directory of several jobs.
fn set_column(name: &str, value: &J) -> HParamInfo {
    let t = data_type(value);
    let domain = (t == BOOL).then(|| {
        Domain::Discrete(ListValue {
            values: [false, true]
                .map(|b| ProtoValue {
                    kind: Some(ValueKind::Bool(b)),
                })
                .to_vec(),
        })
    });
    HParamInfo {
        name: name.into(),
        data_type: t,
        domain,
        differs: false,
    }
}

/// The options `spec` sets itself, with the values it sets, in the order they are declared:
/// the training options given, then a recipe's options, or a task's fields (the task is the
/// user's own value). Unset options (the preset decides) are not among them.
fn set_options(spec: &JobSpec) -> Vec<(String, J)> {
    let mut set: Vec<(String, J)> = match serde_json::to_value(&spec.train) {
        Ok(J::Object(train)) => train.into_iter().filter(|(_, v)| !v.is_null()).collect(),
        _ => Vec::new(),
    };
    if spec.kind == JobKind::Task {
        let mut spec = spec.clone();
        if let Some(fields) = crate::worker::task::task_fields(&mut spec) {
            let scalar = |v: &J| matches!(v, J::Bool(_) | J::Number(_) | J::String(_));
            set.extend(
                fields
                    .iter()
                    .filter(|(_, v)| scalar(v))
                    .map(|(k, v)| (k.clone(), v.clone())),
            );
        }
    } else {
        set.extend(spec.options.iter().map(|(k, v)| (k.clone(), v.clone())));
    }
    let mut seen = std::collections::BTreeSet::new();
    set.retain(|(k, _)| seen.insert(k.clone()));
    set
}

/// The value `spec` gives option `name` (a training option, a task's field, a recipe's
/// option), as a sweep puts it there.
fn option_value(spec: &JobSpec, name: &str) -> Option<J> {
    if let Ok(train) = serde_json::to_value(&spec.train) {
        if let Some(v) = train.get(name).filter(|v| !v.is_null()) {
            return Some(v.clone());
        }
    }
    if spec.kind == JobKind::Task {
        let mut spec = spec.clone();
        return crate::worker::task::task_fields(&mut spec).and_then(|f| f.get(name).cloned());
    }
    spec.options.get(name).cloned()
}

/// A sweep of this process as its trials' trackers see it: its swept options, in the order
/// given, and the metric that ranks its trials.
#[derive(Clone, Debug)]
pub(crate) struct Swept {
    pub(crate) space: Vec<(String, Space)>,
    pub(crate) metric: String,
}

/// The sweeps whose trials run in this process, by the directory their trials' runs go in.
static SWEEPS: Mutex<Vec<(PathBuf, Swept)>> = Mutex::new(Vec::new());

/// A sweep's registration, held while the sweep runs: a job whose runs root is `dir` is one of
/// its trials, and declares the swept options as its HParams columns.
pub(crate) struct SweepColumns(PathBuf);

impl SweepColumns {
    pub(crate) fn register(dir: &Path, swept: Swept) -> SweepColumns {
        let mut all = SWEEPS.lock().unwrap_or_else(|e| e.into_inner());
        all.push((dir.to_path_buf(), swept));
        SweepColumns(dir.to_path_buf())
    }
}

impl Drop for SweepColumns {
    fn drop(&mut self) {
        let mut all = SWEEPS.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(i) = all.iter().position(|(d, _)| *d == self.0) {
            all.remove(i);
        }
    }
}

/// The sweep whose trials run in `runs_root`, if any.
fn sweep_of(runs_root: &Path) -> Option<Swept> {
    let all = SWEEPS.lock().unwrap_or_else(|e| e.into_inner());
    all.iter()
        .rev()
        .find(|(d, _)| d == runs_root)
        .map(|(_, s)| s.clone())
}

/// A run's HParams: its columns, its value in each, and the metric that leads the metric
/// columns (a sweep's).
#[derive(Clone, Debug, PartialEq)]
pub(super) struct Columns {
    pub(super) hparams: Vec<HParamInfo>,
    pub(super) values: BTreeMap<String, ProtoValue>,
    /// The sweep's metric (its name as the workers report it), for a trial.
    pub(super) lead: Option<String>,
    /// A trial of a sweep (its experiment must be the one every trial declares).
    pub(super) trial: bool,
}

impl Columns {
    /// The columns of the job `spec` runs: a sweep's trial's, else its own.
    pub(super) fn for_job(spec: &JobSpec) -> Columns {
        match spec.runs_root.as_deref().and_then(sweep_of) {
            Some(sweep) => Columns::of_trial(spec, &sweep),
            None => Columns::of_job(spec),
        }
    }

    /// A job's own columns: the options it sets.
    pub(super) fn of_job(spec: &JobSpec) -> Columns {
        let set = set_options(spec);
        Columns {
            hparams: set.iter().map(|(k, v)| set_column(k, v)).collect(),
            values: set
                .iter()
                .map(|(k, v)| (k.clone(), value_as(v, data_type(v))))
                .collect(),
            lead: None,
            trial: false,
        }
    }

    /// A trial's columns: the swept options, with the trial's values.
    pub(super) fn of_trial(spec: &JobSpec, sweep: &Swept) -> Columns {
        let hparams: Vec<HParamInfo> = sweep
            .space
            .iter()
            .map(|(name, space)| swept_column(name, space))
            .collect();
        let values = hparams
            .iter()
            .filter_map(|h| {
                let v = option_value(spec, &h.name)?;
                Some((h.name.clone(), value_as(&v, h.data_type)))
            })
            .collect();
        Columns {
            hparams,
            values,
            lead: Some(sweep.metric.clone()),
            trial: true,
        }
    }

    /// The session's start: its values, its group (the run's name) and its start time.
    pub(super) fn session_start(&self, group: &str, time: f64) -> HParamsPluginData {
        plugin_data(Data::Start(SessionStartInfo {
            hparams: self.values.clone(),
            group_name: group.into(),
            start_time_secs: time,
        }))
    }

    /// The experiment: these hyper-parameter columns and a metric column per tag of `metrics`
    /// (scalars of the session's own run).
    pub(super) fn experiment(&self, metrics: &[String], created: f64) -> HParamsPluginData {
        let metric_infos = metrics
            .iter()
            .map(|tag| MetricInfo {
                name: Some(MetricName {
                    group: String::new(),
                    tag: tag.clone(),
                }),
                dataset_type: if tag.starts_with("eval/") {
                    2
                } else if tag.starts_with("train/") {
                    1
                } else {
                    0
                },
            })
            .collect();
        plugin_data(Data::Experiment(Experiment {
            time_created_secs: created,
            hparam_infos: self.hparams.clone(),
            metric_infos,
        }))
    }
}

/// The session's end: succeeded or failed, and when.
pub(super) fn session_end(succeeded: bool, time: f64) -> HParamsPluginData {
    plugin_data(Data::End(SessionEndInfo {
        status: if succeeded { 1 } else { 2 },
        end_time_secs: time,
    }))
}

fn plugin_data(data: Data) -> HParamsPluginData {
    HParamsPluginData {
        version: 0,
        data: Some(data),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use trainbook_api::{ConfigureTraining, OptimizerKind};

    fn names(c: &Columns) -> Vec<&str> {
        c.hparams.iter().map(|h| h.name.as_str()).collect()
    }

    #[test]
    fn a_job_declares_only_the_options_it_sets() {
        let spec = JobSpec::new("bert").lr(1e-3).optimizer(OptimizerKind::Sgd);
        let c = Columns::of_job(&spec);
        assert_eq!(names(&c), ["lr", "optimizer"]);
        assert_eq!(c.hparams[0].data_type, FLOAT64);
        assert_eq!(c.hparams[1].data_type, STRING);
        assert!(c.hparams.iter().all(|h| !h.differs && h.domain.is_none()));
        assert_eq!(
            c.values.keys().map(String::as_str).collect::<Vec<_>>(),
            ["lr", "optimizer"]
        );
        assert_eq!(c.values["lr"].kind, Some(ValueKind::Number(1e-3)));
        assert_eq!(
            c.values["optimizer"].kind,
            Some(ValueKind::Text("sgd".into()))
        );
        assert_eq!((c.lead.as_deref(), c.trial), (None, false));

        // A recipe's own option counts as set; nothing set, no columns.
        let mut spec = JobSpec::new("bert").dropout(0.0);
        spec.options.insert("max_length".into(), 64.into());
        assert_eq!(names(&Columns::of_job(&spec)), ["dropout", "max_length"]);
        assert!(Columns::of_job(&JobSpec::new("bert")).hparams.is_empty());
    }

    #[test]
    fn options_become_values_of_their_kind() {
        for (v, want) in [
            (serde_json::json!(0.001), ValueKind::Number(0.001)),
            (serde_json::json!("adamw"), ValueKind::Text("adamw".into())),
            (serde_json::json!(false), ValueKind::Bool(false)),
            (
                serde_json::json!([0.9, 0.999]),
                ValueKind::Text("[0.9,0.999]".into()),
            ),
        ] {
            assert_eq!(value_as(&v, data_type(&v)).kind, Some(want));
        }
        // A column of text holds a number as text.
        assert_eq!(
            value_as(&serde_json::json!(3), STRING).kind,
            Some(ValueKind::Text("3".into()))
        );
    }

    #[test]
    fn a_trial_declares_the_swept_options_with_their_space() {
        let swept = Swept {
            space: vec![
                (
                    "lr".into(),
                    Space::Grid(vec![ParamValue::Float(1e-3), ParamValue::Float(1e-2)]),
                ),
                (
                    "optimizer".into(),
                    Space::Choice(vec!["sgd".into(), "adamw".into()]),
                ),
                (
                    "warmup_ratio".into(),
                    Space::Uniform {
                        low: 0.0,
                        high: 0.2,
                    },
                ),
                ("max_length".into(), Space::Grid(vec![ParamValue::Int(64)])),
            ],
            metric: "eval_accuracy".into(),
        };
        let mut spec = JobSpec::new("bert")
            .lr(1e-2)
            .optimizer(OptimizerKind::Adamw)
            .warmup_ratio(0.05)
            .epochs(3);
        spec.options.insert("max_length".into(), 64.into());
        let c = Columns::of_trial(&spec, &swept);
        // Only the swept options: not epochs, which the base job sets for every trial.
        assert_eq!(names(&c), ["lr", "optimizer", "warmup_ratio", "max_length"]);
        let discrete = |h: &HParamInfo| -> Vec<Option<ValueKind>> {
            match &h.domain {
                Some(Domain::Discrete(l)) => l.values.iter().map(|v| v.kind.clone()).collect(),
                other => panic!("{other:?}"),
            }
        };
        assert_eq!(c.hparams[0].data_type, FLOAT64);
        assert_eq!(
            discrete(&c.hparams[0]),
            [Some(ValueKind::Number(1e-3)), Some(ValueKind::Number(1e-2))]
        );
        assert_eq!(c.hparams[1].data_type, STRING);
        assert_eq!(
            discrete(&c.hparams[1]),
            [
                Some(ValueKind::Text("sgd".into())),
                Some(ValueKind::Text("adamw".into()))
            ]
        );
        assert_eq!(
            c.hparams[2].domain,
            Some(Domain::Interval(Interval {
                min_value: 0.0,
                max_value: 0.2
            }))
        );
        assert_eq!(
            c.hparams.iter().map(|h| h.differs).collect::<Vec<_>>(),
            [true, true, true, false]
        );
        assert_eq!(c.values["lr"].kind, Some(ValueKind::Number(1e-2)));
        assert_eq!(
            c.values["optimizer"].kind,
            Some(ValueKind::Text("adamw".into()))
        );
        assert_eq!(c.values["warmup_ratio"].kind, Some(ValueKind::Number(0.05)));
        assert_eq!(c.values["max_length"].kind, Some(ValueKind::Number(64.0)));
        assert_eq!(c.values.len(), 4);
        assert_eq!((c.lead.as_deref(), c.trial), (Some("eval_accuracy"), true));
    }

    #[test]
    fn a_job_in_a_registered_sweeps_directory_is_its_trial() {
        let dir = std::env::temp_dir().join(format!("hparams-sweep-{}", std::process::id()));
        let mut spec = JobSpec::new("bert").lr(1e-3).epochs(2);
        spec.runs_root = Some(dir.clone());
        assert_eq!(names(&Columns::for_job(&spec)), ["epochs", "lr"]);
        {
            let _sweep = SweepColumns::register(
                &dir,
                Swept {
                    space: vec![("lr".into(), Space::Grid(vec![ParamValue::Float(1e-3)]))],
                    metric: "eval_loss".into(),
                },
            );
            assert_eq!(names(&Columns::for_job(&spec)), ["lr"]);
        }
        // Its registration ends with the sweep.
        assert_eq!(names(&Columns::for_job(&spec)), ["epochs", "lr"]);
    }

    #[test]
    fn the_experiment_names_its_metrics_as_scalar_tags() {
        let c = Columns::of_job(&JobSpec::new("bert").lr(1e-3));
        let tags = ["eval/loss".to_string(), "train/loss".to_string()];
        let Some(Data::Experiment(e)) = c.experiment(&tags, 5.0).data else {
            panic!()
        };
        let named: Vec<(&str, &str, i32)> = e
            .metric_infos
            .iter()
            .map(|m| {
                let n = m.name.as_ref().unwrap();
                (n.group.as_str(), n.tag.as_str(), m.dataset_type)
            })
            .collect();
        assert_eq!(named, [("", "eval/loss", 2), ("", "train/loss", 1)]);
        assert_eq!(e.hparam_infos, c.hparams);
        assert_eq!(e.time_created_secs, 5.0);
    }
}
