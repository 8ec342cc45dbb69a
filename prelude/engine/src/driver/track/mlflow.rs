//! A run logged to an MLflow tracking server over its REST API (`/api/2.0/mlflow/...`), the
//! way a team's MLflow set-up already records its PyTorch runs: the resolved options as
//! params, every rank-0 metric with its step under the same names as in TensorBoard, tags
//! (recipe, workers, device, trainbook version, the run directory), the final status, and the
//! last checkpoint as artifacts when the server stores them (its path as a tag when not).
//!
//! The server is somebody else's and may be down, slow or refusing: nothing here may fail or
//! slow the training. The driver only pushes onto a channel; one thread owns the HTTP client,
//! batches metrics (`runs/log-batch`, at most 1,000 per request, about once a second),
//! keeps what failed queued and retries with back-off. At the end it gets a bounded time to
//! catch up, and whatever is still unsent is named in one warning, with where the complete
//! record is (metrics.parquet, the TensorBoard files).

use std::collections::{BTreeMap, VecDeque};
use std::path::{Path, PathBuf};
use std::sync::mpsc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use serde_json::{json, Value};
use trainbook_api::{JobStatus, MetricRow};

use crate::driver::handle::JobState;

/// How often queued metrics are sent while the job runs.
const SEND_EVERY: Duration = Duration::from_secs(1);
/// Longest wait between retries of a server that does not answer.
const MAX_BACKOFF: Duration = Duration::from_secs(30);
/// Time the run's end gives the queue to drain and the status to be set.
const FINISH_WITHIN: Duration = Duration::from_secs(10);
/// Time the last checkpoint's upload may take after that.
const ARTIFACTS_WITHIN: Duration = Duration::from_secs(120);
/// Entries per `log-batch` request (MLflow's limits: 1,000 metrics, 100 params, 100 tags).
const BATCH_METRICS: usize = 1000;
const BATCH_PARAMS: usize = 100;
/// Metric values kept for a server that stays down (a week of one value a second per tag
/// is far below this; beyond it the oldest are dropped and counted).
const QUEUE_LIMIT: usize = 2_000_000;
/// MLflow's older servers refuse longer param values.
const PARAM_VALUE_MAX: usize = 500;

struct Point {
    key: String,
    value: f64,
    step: u64,
    timestamp_ms: i64,
}

enum Msg {
    Metric(Point),
    Finish {
        status: &'static str,
        checkpoint: Option<PathBuf>,
        done: mpsc::Sender<Option<String>>,
    },
}

/// What the run starts with: where, and the run's identity.
pub(super) struct RunInfo {
    pub(super) uri: String,
    pub(super) run_name: String,
    pub(super) params: BTreeMap<String, Value>,
    pub(super) tags: Vec<(String, String)>,
}

/// The driver's end of the MLflow thread.
pub(super) struct Mlflow {
    tx: mpsc::Sender<Msg>,
    thread: Option<JoinHandle<()>>,
}

fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0)
}

impl Mlflow {
    pub(super) fn start(info: RunInfo) -> Mlflow {
        let (tx, rx) = mpsc::channel();
        let thread = std::thread::Builder::new()
            .name("trainbook-mlflow".into())
            .spawn(move || Client::new(info).run(rx))
            .ok();
        Mlflow { tx, thread }
    }

    /// A metric of rank 0, under `key` (TensorBoard's tag).
    pub(super) fn metric(&self, key: String, step: u64, value: f64) {
        let _ = self.tx.send(Msg::Metric(Point {
            key,
            value,
            step,
            timestamp_ms: now_ms(),
        }));
    }

    /// Ends the run: drains the queue, sets the status and uploads the checkpoint, within
    /// bounded time. Returns the warning naming what could not be logged, if anything.
    pub(super) fn finish(
        mut self,
        status: &'static str,
        checkpoint: Option<PathBuf>,
    ) -> Option<String> {
        let (done, got) = mpsc::channel();
        if self
            .tx
            .send(Msg::Finish {
                status,
                checkpoint,
                done,
            })
            .is_err()
        {
            return Some("MLflow: the logging thread is gone; nothing more was logged".into());
        }
        // The thread keeps to its own deadlines; this bound only guards against a request
        // that hangs past its timeouts.
        let warning = got
            .recv_timeout(FINISH_WITHIN + ARTIFACTS_WITHIN + Duration::from_secs(30))
            .unwrap_or_else(|_| {
                Some(
                    "MLflow: the server did not answer in time; the run's end was not logged"
                        .into(),
                )
            });
        if let Some(t) = self.thread.take() {
            if t.is_finished() {
                let _ = t.join();
            }
        }
        warning
    }
}

/// The HTTP side, on its own thread.
struct Client {
    base: String,
    agent: ureq::Agent,
    info: RunInfo,
    run_id: Option<String>,
    artifact_uri: Option<String>,
    params_sent: bool,
    queue: VecDeque<Point>,
    dropped: u64,
    sent: u64,
    last_error: Option<String>,
    backoff: Duration,
    next_try: Instant,
}

impl Client {
    fn new(info: RunInfo) -> Client {
        let agent = ureq::AgentBuilder::new()
            .timeout_connect(Duration::from_secs(3))
            .timeout(Duration::from_secs(10))
            .build();
        Client {
            base: info.uri.trim_end_matches('/').to_string(),
            agent,
            info,
            run_id: None,
            artifact_uri: None,
            params_sent: false,
            queue: VecDeque::new(),
            dropped: 0,
            sent: 0,
            last_error: None,
            backoff: SEND_EVERY,
            next_try: Instant::now(),
        }
    }

    fn run(mut self, rx: mpsc::Receiver<Msg>) {
        loop {
            let wait = self.next_try.saturating_duration_since(Instant::now());
            match rx.recv_timeout(wait) {
                Ok(Msg::Metric(p)) => self.push(p),
                Ok(Msg::Finish {
                    status,
                    checkpoint,
                    done,
                }) => {
                    // Whatever else is queued on the channel first.
                    while let Ok(Msg::Metric(p)) = rx.try_recv() {
                        self.push(p);
                    }
                    let _ = done.send(self.finish(status, checkpoint.as_deref()));
                    return;
                }
                Err(mpsc::RecvTimeoutError::Timeout) => {
                    self.try_send();
                }
                Err(mpsc::RecvTimeoutError::Disconnected) => {
                    // The driver went away without finishing (it panicked): mark the run failed.
                    let _ = self.finish("FAILED", None);
                    return;
                }
            }
        }
    }

    fn push(&mut self, p: Point) {
        if self.queue.len() >= QUEUE_LIMIT {
            self.queue.pop_front();
            self.dropped += 1;
        }
        self.queue.push_back(p);
    }

    /// One round of sending; on failure, waits longer before the next.
    fn try_send(&mut self) {
        match self.send_all() {
            Ok(()) => {
                self.backoff = SEND_EVERY;
                self.next_try = Instant::now() + SEND_EVERY;
            }
            Err(e) => {
                self.last_error = Some(e);
                self.next_try = Instant::now() + self.backoff;
                self.backoff = (self.backoff * 2).min(MAX_BACKOFF);
            }
        }
    }

    fn post(&self, path: &str, body: Value) -> Result<Value, String> {
        let url = format!("{}/api/2.0/mlflow/{path}", self.base);
        let req = authorise(self.agent.post(&url));
        match req.send_json(body) {
            Ok(r) => r.into_json::<Value>().or_else(|_| Ok(json!({}))),
            Err(ureq::Error::Status(code, r)) => {
                let text = r.into_string().unwrap_or_default();
                let msg = serde_json::from_str::<Value>(&text)
                    .ok()
                    .and_then(|v| v["message"].as_str().map(str::to_string))
                    .unwrap_or(text);
                Err(format!("{url} answered {code}: {}", first_line(&msg)))
            }
            // ureq's transport errors name the URL themselves.
            Err(e) => Err(first_line(&e.to_string()).to_string()),
        }
    }

    fn experiment_id(&self) -> Result<String, String> {
        if let Ok(id) = std::env::var("MLFLOW_EXPERIMENT_ID") {
            return Ok(id);
        }
        let Ok(name) = std::env::var("MLFLOW_EXPERIMENT_NAME") else {
            return Ok("0".into()); // MLflow's "Default" experiment
        };
        let url = format!("{}/api/2.0/mlflow/experiments/get-by-name", self.base);
        match authorise(self.agent.get(&url))
            .query("experiment_name", &name)
            .call()
        {
            Ok(r) => {
                let v: Value = r.into_json().map_err(|e| e.to_string())?;
                Ok(v["experiment"]["experiment_id"]
                    .as_str()
                    .unwrap_or("0")
                    .to_string())
            }
            Err(ureq::Error::Status(404, _)) => {
                let v = self.post("experiments/create", json!({ "name": name }))?;
                Ok(v["experiment_id"].as_str().unwrap_or("0").to_string())
            }
            Err(e) => Err(first_line(&e.to_string()).to_string()),
        }
    }

    /// Creates the run (once), sends the params (once), then every queued metric.
    fn send_all(&mut self) -> Result<(), String> {
        if self.run_id.is_none() {
            let experiment_id = self.experiment_id()?;
            let tags: Vec<Value> = self
                .info
                .tags
                .iter()
                .map(|(k, v)| json!({ "key": k, "value": v }))
                .collect();
            let v = self.post(
                "runs/create",
                json!({
                    "experiment_id": experiment_id,
                    "run_name": self.info.run_name,
                    "start_time": now_ms(),
                    "tags": tags,
                }),
            )?;
            let id = v["run"]["info"]["run_id"]
                .as_str()
                .ok_or_else(|| format!("{}: runs/create answered without a run id", self.base))?;
            self.run_id = Some(id.to_string());
            self.artifact_uri = v["run"]["info"]["artifact_uri"]
                .as_str()
                .map(str::to_string);
        }
        let run_id = self.run_id.clone().unwrap_or_default();
        if !self.params_sent {
            let params: Vec<Value> = self
                .info
                .params
                .iter()
                .map(|(k, v)| json!({ "key": k, "value": param_text(v) }))
                .collect();
            for chunk in params.chunks(BATCH_PARAMS) {
                self.post(
                    "runs/log-batch",
                    json!({ "run_id": run_id, "params": chunk }),
                )?;
            }
            self.params_sent = true;
        }
        while !self.queue.is_empty() {
            let n = self.queue.len().min(BATCH_METRICS);
            let metrics: Vec<Value> = self
                .queue
                .iter()
                .take(n)
                .map(|p| {
                    json!({
                        "key": p.key,
                        // JSON has no NaN; MLflow's own clients send it as this string.
                        "value": if p.value.is_finite() { json!(p.value) } else { json!(p.value.to_string()) },
                        "timestamp": p.timestamp_ms,
                        "step": p.step,
                    })
                })
                .collect();
            self.post(
                "runs/log-batch",
                json!({ "run_id": run_id, "metrics": metrics }),
            )?;
            self.queue.drain(..n);
            self.sent += n as u64;
        }
        Ok(())
    }

    fn finish(&mut self, status: &'static str, checkpoint: Option<&Path>) -> Option<String> {
        let deadline = Instant::now() + FINISH_WITHIN;
        let mut drained = self.send_all();
        while drained.is_err()
            && Instant::now() + self.backoff.min(Duration::from_secs(2)) < deadline
        {
            std::thread::sleep(self.backoff.min(Duration::from_secs(2)));
            drained = self.send_all();
        }
        let mut problems = Vec::new();
        if let Err(e) = &drained {
            self.last_error = Some(e.clone());
        }
        let status_set = self.run_id.is_some()
            && self
                .post(
                    "runs/update",
                    json!({ "run_id": self.run_id, "status": status, "end_time": now_ms() }),
                )
                .map_err(|e| self.last_error = Some(e))
                .is_ok();
        if let (true, Some(dir)) = (status_set, checkpoint) {
            if let Err(e) = self.log_checkpoint(dir) {
                problems.push(format!(
                    "the checkpoint {} was not uploaded ({e})",
                    dir.display()
                ));
            }
        }
        if !self.queue.is_empty() || self.dropped > 0 {
            problems.insert(
                0,
                format!(
                    "{} metric value(s) were not logged ({})",
                    self.queue.len() as u64 + self.dropped,
                    describe(&self.queue)
                ),
            );
        }
        if self.run_id.is_none() {
            problems.insert(0, "the run was never created".into());
        } else if !self.params_sent {
            problems.insert(0, "its params were not logged".into());
        }
        if !status_set && self.run_id.is_some() {
            problems.push(format!("its status was not set to {status}"));
        }
        if problems.is_empty() {
            return None;
        }
        let why = self
            .last_error
            .as_deref()
            .map(|e| format!(": {e}"))
            .unwrap_or_default();
        Some(format!(
            "MLflow at {}: {}{why}. The run directory's metrics.parquet and TensorBoard files hold every value.",
            self.base,
            problems.join("; ")
        ))
    }

    /// Uploads the checkpoint's files under `checkpoint/` when the server proxies an artifact
    /// store (`mlflow-artifacts:` URIs, `mlflow server`'s default); otherwise records its path
    /// as the `trainbook.checkpoint` tag (the server cannot take files, and S3 or a shared
    /// disk are for MLflow's Python client to write).
    fn log_checkpoint(&mut self, dir: &Path) -> Result<(), String> {
        let run_id = self.run_id.clone().unwrap_or_default();
        let tag = |me: &Self| {
            me.post(
                "runs/set-tag",
                json!({ "run_id": run_id, "key": "trainbook.checkpoint", "value": dir.display().to_string() }),
            )
            .map(|_| ())
        };
        let Some(root) = self
            .artifact_uri
            .as_deref()
            .and_then(|u| u.strip_prefix("mlflow-artifacts:"))
            .map(|p| p.trim_start_matches('/').to_string())
        else {
            return tag(self);
        };
        let deadline = Instant::now() + ARTIFACTS_WITHIN;
        let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
            .map_err(|e| e.to_string())?
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| p.is_file())
            .collect();
        files.sort();
        let name = dir
            .file_name()
            .unwrap_or_default()
            .to_string_lossy()
            .to_string();
        for f in files {
            if Instant::now() >= deadline {
                tag(self)?;
                return Err(format!(
                    "took longer than {} s; its path is the trainbook.checkpoint tag",
                    ARTIFACTS_WITHIN.as_secs()
                ));
            }
            let file = f
                .file_name()
                .unwrap_or_default()
                .to_string_lossy()
                .to_string();
            let url = format!(
                "{}/api/2.0/mlflow-artifacts/artifacts/{root}/checkpoint/{name}/{file}",
                self.base
            );
            let body = std::fs::File::open(&f).map_err(|e| format!("{}: {e}", f.display()))?;
            let len = body.metadata().map(|m| m.len()).unwrap_or(0);
            authorise(self.agent.put(&url))
                .timeout(Duration::from_secs(60) + Duration::from_secs(len / (20 << 20)))
                .set("Content-Length", &len.to_string())
                .send(body)
                .map_err(|e| format!("{url}: {}", first_line(&e.to_string())))?;
        }
        Ok(())
    }
}

/// MLflow's clients' credentials: a bearer token or a user and password.
fn authorise(req: ureq::Request) -> ureq::Request {
    if let Ok(token) = std::env::var("MLFLOW_TRACKING_TOKEN") {
        return req.set("Authorization", &format!("Bearer {token}"));
    }
    if let (Ok(user), Ok(password)) = (
        std::env::var("MLFLOW_TRACKING_USERNAME"),
        std::env::var("MLFLOW_TRACKING_PASSWORD"),
    ) {
        use base64::Engine as _;
        let b = base64::engine::general_purpose::STANDARD.encode(format!("{user}:{password}"));
        return req.set("Authorization", &format!("Basic {b}"));
    }
    req
}

fn first_line(s: &str) -> &str {
    s.lines().next().unwrap_or("").trim()
}

/// A param's value as MLflow keeps it: text, cut to what every server accepts.
fn param_text(v: &Value) -> String {
    let s = match v {
        Value::String(s) => s.clone(),
        other => other.to_string(),
    };
    if s.chars().count() <= PARAM_VALUE_MAX {
        s
    } else {
        s.chars().take(PARAM_VALUE_MAX - 1).chain(['…']).collect()
    }
}

/// Which metrics are still queued, those with the most values first: "train/loss steps
/// 40–120, eval/loss steps 50–100".
fn describe(queue: &VecDeque<Point>) -> String {
    let mut spans: BTreeMap<&str, (u64, u64, usize)> = BTreeMap::new();
    for p in queue {
        let e = spans.entry(p.key.as_str()).or_insert((p.step, p.step, 0));
        e.0 = e.0.min(p.step);
        e.1 = e.1.max(p.step);
        e.2 += 1;
    }
    if spans.is_empty() {
        return "dropped while the server was down".into();
    }
    let mut by_count: Vec<_> = spans.into_iter().collect();
    by_count.sort_by(|a, b| b.1 .2.cmp(&a.1 .2).then(a.0.cmp(b.0)));
    let mut parts: Vec<String> = by_count
        .iter()
        .take(4)
        .map(|(k, (a, b, _))| {
            if a == b {
                format!("{k} step {a}")
            } else {
                format!("{k} steps {a}–{b}")
            }
        })
        .collect();
    if by_count.len() > 4 {
        parts.push(format!("{} more", by_count.len() - 4));
    }
    parts.join(", ")
}

/// The MLflow run of `job`, when a tracking server is named (`JobSpec::mlflow`, else an HTTP
/// `MLFLOW_TRACKING_URI`; another kind of URI there is a warning, not an error: it is the
/// environment's, for MLflow's Python client).
pub(super) fn for_job(job: &JobState, parameters: &Value) -> Option<Mlflow> {
    let uri = match &job.spec.mlflow {
        Some(uri) => uri.clone(),
        None => {
            let uri = std::env::var("MLFLOW_TRACKING_URI")
                .ok()
                .filter(|u| !u.is_empty())?;
            if let Err(e) = trainbook_api::plumbing::settings::check_mlflow_uri(&uri) {
                job.lock()
                    .warnings
                    .push(format!("MLFLOW_TRACKING_URI is set but not used: {e:#}"));
                return None;
            }
            uri
        }
    };
    let name = job
        .run_dir
        .file_name()
        .unwrap_or_default()
        .to_string_lossy()
        .to_string();
    let tag = |k: &str, v: String| (k.to_string(), v);
    let mut tags = vec![
        tag("mlflow.runName", name.clone()),
        tag("mlflow.source.name", "trainbook".into()),
        tag("mlflow.source.type", "JOB".into()),
        tag("trainbook.recipe", job.spec.recipe.clone()),
        tag("trainbook.workers", job.spec.world_size().to_string()),
        tag("trainbook.device", job.device.name().to_string()),
        tag("trainbook.version", env!("CARGO_PKG_VERSION").to_string()),
        tag("trainbook.run_dir", job.run_dir.display().to_string()),
    ];
    if let Ok(user) = std::env::var("USER") {
        tags.push(tag("mlflow.user", user));
    }
    Some(Mlflow::start(RunInfo {
        uri,
        run_name: name,
        params: super::flat_options(parameters),
        tags,
    }))
}

impl super::Tracker for Mlflow {
    fn metric(&mut self, row: &MetricRow) {
        Mlflow::metric(
            self,
            super::tensorboard::tag(&row.name),
            row.step,
            row.value,
        );
    }
    fn finish(self: Box<Self>, status: JobStatus, checkpoint: Option<PathBuf>) -> Option<String> {
        let status = match status {
            JobStatus::Succeeded => "FINISHED",
            JobStatus::Stopped => "KILLED",
            _ => "FAILED",
        };
        Mlflow::finish(*self, status, checkpoint)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn point(key: &str, step: u64) -> Point {
        Point {
            key: key.into(),
            value: 1.0,
            step,
            timestamp_ms: 0,
        }
    }

    #[test]
    fn the_warning_names_the_unsent_metrics_by_tag_and_steps() {
        let q: VecDeque<Point> = [
            point("train/loss", 40),
            point("train/loss", 120),
            point("eval/loss", 50),
        ]
        .into_iter()
        .collect();
        assert_eq!(describe(&q), "train/loss steps 40–120, eval/loss step 50");
    }

    #[test]
    fn long_param_values_are_cut_to_what_every_server_takes() {
        assert_eq!(param_text(&json!(0.001)), "0.001");
        assert_eq!(param_text(&json!("adamw")), "adamw");
        let long = param_text(&json!("x".repeat(900)));
        assert_eq!(long.chars().count(), PARAM_VALUE_MAX);
        assert!(long.ends_with('…'));
    }

    #[test]
    fn a_server_that_is_not_there_costs_bounded_time_and_one_warning() {
        // A port nothing listens on: connection refused at once.
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let m = Mlflow::start(RunInfo {
            uri: format!("http://127.0.0.1:{port}"),
            run_name: "r".into(),
            params: BTreeMap::new(),
            tags: Vec::new(),
        });
        for s in 1..=5 {
            m.metric("train/loss".into(), s, 0.5);
        }
        let t = Instant::now();
        let w = m.finish("FINISHED", None).expect("a warning");
        assert!(
            t.elapsed() < FINISH_WITHIN + Duration::from_secs(5),
            "{:?}",
            t.elapsed()
        );
        assert!(w.contains("the run was never created"), "{w}");
        assert!(
            w.contains("5 metric value(s) were not logged (train/loss steps 1–5)"),
            "{w}"
        );
        assert!(w.contains(&format!("127.0.0.1:{port}")), "{w}");
    }
}
