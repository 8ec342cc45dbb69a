//! The Jupyter side: the five sockets of the connection file and one handler per message type.
//!
//! Shell requests are handled one at a time (an execute blocks the shell loop, as in ipykernel);
//! control runs beside it, so interrupt and shutdown work while a cell is busy. Every incoming
//! message's HMAC signature is checked (`wire.rs`); one that fails is dropped and logged, never
//! handled. A cell that fails with `stop_on_error` aborts the execute requests already queued
//! behind it, as ipykernel does, so "Run All" stops at the first failing cell.

use crate::cell_libs::CellLibs;
use crate::channel::ChannelServer;
use crate::evaluator::{ChildSetup, Evaluator, Outcome};
use crate::history::{self, History};
use crate::iopub::Publisher;
use crate::toolchain::Toolchain;
use crate::wire::{self, Replies, Requests};
use crate::{completion, is_complete, procs};
use anyhow::{Context, Result};
use jupyter_protocol::{
    CodeMirrorMode, CommInfoReply, CompleteReply, ConnectionInfo, ErrorOutput, ExecuteInput,
    ExecuteReply, ExecuteResult, ExecutionCount, InspectReply, InterruptReply, JupyterMessage,
    JupyterMessageContent, KernelInfoReply, LanguageInfo, Media, ReplyError, ReplyStatus,
    ShutdownReply, Status, Transient,
};
use jupyter_zmq_client::RuntimeError;
use std::collections::VecDeque;
use std::path::PathBuf;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use trainbook_channel::ToNotebook;

/// How long a cell gets to return after an interrupt before its process is killed.
pub const INTERRUPT_GRACE: Duration = Duration::from_secs(5);
/// How long shutdown waits for jobs to stop their workers cooperatively.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(5);

pub struct KernelConfig {
    pub connection: ConnectionInfo,
    pub run_dir: PathBuf,
    pub prelude: Option<CellLibs>,
    pub toolchain: Option<Toolchain>,
}

struct Kernel {
    publisher: Publisher,
    evaluator: Evaluator,
    channel: ChannelServer,
    history: Mutex<History>,
    run_dir: PathBuf,
    rust_version: String,
}

pub async fn serve(config: KernelConfig) -> Result<()> {
    let info = &config.connection;
    if !info.signature_scheme.is_empty() && info.signature_scheme != "hmac-sha256" {
        anyhow::bail!(
            "unsupported signature scheme {:?} in the connection file (trainbook speaks \
             hmac-sha256)",
            info.signature_scheme
        );
    }
    let session = format!("trainbook-{}-{}", std::process::id(), nanos());
    let bind = |what: &'static str| {
        move |e: RuntimeError| anyhow::anyhow!("cannot bind the {what} socket: {e}")
    };
    let mut iopub = jupyter_zmq_client::create_kernel_iopub_connection(info, &session)
        .await
        .map_err(bind("iopub"))?;
    let shell = wire::bind(info, info.shell_url(), "shell", &session).await?;
    let mut control = wire::bind(info, info.control_url(), "control", &session).await?;
    // Bound so clients can connect; input requests are not supported (evcxr reads no stdin).
    let _stdin = jupyter_zmq_client::create_kernel_stdin_connection(info, &session)
        .await
        .map_err(bind("stdin"))?;
    let mut heartbeat = jupyter_zmq_client::create_kernel_heartbeat_connection(info)
        .await
        .map_err(bind("heartbeat"))?;

    let history_path = crate::install::user_data_dir()
        .unwrap_or_default()
        .join("trainbook/history.jsonl");
    let (history, why) = History::open(&history_path);
    if let Some(why) = why {
        eprintln!("trainbook-kernel: {why}");
    }
    let (publisher, mut outbox) = Publisher::new();
    let channel = ChannelServer::start(&config.run_dir, publisher.clone())?;
    let evaluator = Evaluator::start(
        ChildSetup {
            prelude: config.prelude.clone(),
            toolchain: config.toolchain.clone(),
            channel_socket: channel.path().to_path_buf(),
            analysis_dir: Some(config.run_dir.join("analysis")),
        },
        publisher.clone(),
    );
    let kernel = Arc::new(Kernel {
        publisher: publisher.clone(),
        evaluator,
        channel,
        history: Mutex::new(history),
        run_dir: config.run_dir.clone(),
        rust_version: config
            .toolchain
            .as_ref()
            .map_or_else(|| "unknown".into(), |t| t.version.clone()),
    });

    tokio::spawn(async move {
        while let Some(msg) = outbox.recv().await {
            if let Err(e) = iopub.send(msg).await {
                eprintln!("trainbook-kernel: iopub send failed: {e}");
            }
        }
    });
    tokio::spawn(async move { while heartbeat.single_heartbeat().await.is_ok() {} });
    publisher.send(Status::starting(), None);

    let k = kernel.clone();
    tokio::spawn(async move { control_loop(&k, &mut control.0, &mut control.1).await });
    let k = kernel.clone();
    tokio::spawn(async move {
        let mut term =
            tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()).ok();
        let mut int =
            tokio::signal::unix::signal(tokio::signal::unix::SignalKind::interrupt()).ok();
        loop {
            tokio::select! {
                Some(_) = async { term.as_mut()?.recv().await } => k.shutdown().await,
                Some(_) = async { int.as_mut()?.recv().await } => k.interrupt(),
            }
        }
    });
    // Like ipykernel's parent poller: a kernel whose launcher died (Jupyter crashed or was
    // killed) shuts down instead of lingering with its jobs.
    let k = kernel.clone();
    let parent = unsafe { libc::getppid() };
    tokio::spawn(async move {
        loop {
            tokio::time::sleep(Duration::from_secs(1)).await;
            if unsafe { libc::getppid() } != parent {
                eprintln!(
                    "trainbook-kernel: the process that started this kernel is gone; shutting down"
                );
                k.shutdown().await;
            }
        }
    });
    let (mut requests, mut replies) = shell;
    shell_loop(&kernel, &mut requests, &mut replies).await;
    Ok(())
}

fn nanos() -> u128 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or_default()
}

async fn shell_loop(k: &Arc<Kernel>, requests: &mut Requests, replies: &mut Replies) {
    let mut count = ExecutionCount::new(0);
    // Requests read ahead after a failed cell; the first `aborting` of them are aborted if
    // they are execute requests.
    let mut queued: VecDeque<JupyterMessage> = VecDeque::new();
    let mut aborting = 0usize;
    loop {
        let req = match queued.pop_front() {
            Some(req) => req,
            None => requests.next().await,
        };
        let abort = aborting > 0;
        aborting = aborting.saturating_sub(1);
        k.publisher.send(Status::busy(), Some(&req));
        let reply: Option<JupyterMessageContent> = match &req.content {
            JupyterMessageContent::ExecuteRequest(_) if abort => Some(
                ExecuteReply {
                    status: ReplyStatus::Aborted,
                    execution_count: count,
                    user_expressions: Some(Default::default()),
                    ..Default::default()
                }
                .into(),
            ),
            JupyterMessageContent::ExecuteRequest(r) => {
                let r = r.clone();
                let stop_on_error = r.stop_on_error;
                let reply = k.execute(&req, r, &mut count).await;
                if stop_on_error && matches!(reply.status, ReplyStatus::Error) {
                    // What the client queued behind the failed cell (JupyterLab's "Run All"
                    // sends every cell at once) is here by now; a request sent after this
                    // reply is not behind it, so nothing is waited for.
                    while let Ok(next) = tokio::time::timeout(Duration::ZERO, requests.next()).await
                    {
                        queued.push_back(next);
                    }
                    aborting = queued.len();
                }
                Some(reply.into())
            }
            JupyterMessageContent::KernelInfoRequest(_) => Some(k.kernel_info().into()),
            JupyterMessageContent::IsCompleteRequest(r) => {
                Some(is_complete::is_complete(&r.code).into())
            }
            JupyterMessageContent::CompleteRequest(r) => {
                Some(k.complete(&r.code, r.cursor_pos).await.into())
            }
            JupyterMessageContent::InspectRequest(r) => {
                Some(k.inspect(&r.code, r.cursor_pos).await.into())
            }
            c if c.message_type() == "history_request" => Some(k.history_reply(&req)),
            JupyterMessageContent::CommInfoRequest(_) => Some(CommInfoReply::default().into()),
            JupyterMessageContent::ShutdownRequest(r) => {
                let reply = ShutdownReply {
                    restart: r.restart,
                    ..Default::default()
                };
                let _ = replies.send(reply.as_child_of(&req)).await;
                k.shutdown().await;
                None
            }
            // No comms: widgets are drawn with display data, not comm-based ipywidgets.
            JupyterMessageContent::CommOpen(_)
            | JupyterMessageContent::CommMsg(_)
            | JupyterMessageContent::CommClose(_) => None,
            other => {
                eprintln!(
                    "trainbook-kernel: no handler for {} on shell",
                    other.message_type()
                );
                None
            }
        };
        if let Some(content) = reply {
            let msg = JupyterMessage::new(content, Some(&req));
            if let Err(e) = replies.send(msg).await {
                eprintln!("trainbook-kernel: shell reply failed: {e}");
            }
        }
        k.publisher.send(Status::idle(), Some(&req));
    }
}

async fn control_loop(k: &Arc<Kernel>, requests: &mut Requests, control: &mut Replies) {
    loop {
        let req = requests.next().await;
        match &req.content {
            JupyterMessageContent::InterruptRequest(_) => {
                k.interrupt();
                let _ = control.send(InterruptReply::new().as_child_of(&req)).await;
            }
            JupyterMessageContent::ShutdownRequest(r) => {
                let reply = ShutdownReply {
                    restart: r.restart,
                    ..Default::default()
                };
                let _ = control.send(reply.as_child_of(&req)).await;
                k.shutdown().await;
            }
            JupyterMessageContent::KernelInfoRequest(_) => {
                let _ = control.send(k.kernel_info().as_child_of(&req)).await;
            }
            other => eprintln!(
                "trainbook-kernel: no handler for {} on control",
                other.message_type()
            ),
        }
    }
}

impl Kernel {
    fn kernel_info(&self) -> KernelInfoReply {
        KernelInfoReply {
            status: ReplyStatus::Ok,
            protocol_version: "5.3".into(),
            implementation: "trainbook".into(),
            implementation_version: env!("CARGO_PKG_VERSION").into(),
            language_info: LanguageInfo {
                name: "rust".into(),
                version: self.rust_version.clone(),
                mimetype: Some("text/rust".into()),
                file_extension: Some(".rs".into()),
                pygments_lexer: Some("rust".into()),
                codemirror_mode: Some(CodeMirrorMode::Simple("rust".into())),
                nbconvert_exporter: None,
            },
            banner: "Rust (trainbook): the trainbook prelude is loaded — try `train_bert(2)?`"
                .into(),
            help_links: Vec::new(),
            debugger: false,
            error: None,
        }
    }

    async fn execute(
        &self,
        req: &JupyterMessage,
        r: jupyter_protocol::ExecuteRequest,
        count: &mut ExecutionCount,
    ) -> ExecuteReply {
        let stored = !r.silent && r.store_history;
        if stored {
            count.increment();
            self.history().input(count.value() as u32, &r.code);
        }
        if !r.silent {
            self.publisher.send(
                ExecuteInput {
                    code: r.code.clone(),
                    execution_count: *count,
                },
                Some(req),
            );
        }
        self.publisher.begin_cell(req);
        let outcome = self.evaluator.execute(r.code).await;
        let reply = match outcome {
            Outcome::Ok { data } => {
                if stored && let Some(text) = data.get("text/plain").and_then(|t| t.as_str()) {
                    self.history().output(count.value() as u32, text);
                }
                if !r.silent && !data.is_empty() {
                    match serde_json::from_value::<Media>(serde_json::Value::Object(data)) {
                        Ok(media) => self.publisher.send(
                            ExecuteResult {
                                execution_count: *count,
                                data: media,
                                metadata: Default::default(),
                                transient: Some(Transient { display_id: None }),
                            },
                            Some(req),
                        ),
                        Err(e) => self
                            .publisher
                            .stream("stderr", &format!("unreadable cell result: {e}\n")),
                    }
                }
                ExecuteReply {
                    status: ReplyStatus::Ok,
                    execution_count: *count,
                    user_expressions: Some(Default::default()),
                    ..Default::default()
                }
            }
            Outcome::Error(error) => {
                if !r.silent {
                    self.publisher.send(error.clone(), Some(req));
                }
                let ErrorOutput {
                    ename,
                    evalue,
                    traceback,
                } = error;
                ExecuteReply {
                    status: ReplyStatus::Error,
                    execution_count: *count,
                    user_expressions: Some(Default::default()),
                    error: Some(Box::new(ReplyError {
                        ename,
                        evalue,
                        traceback,
                    })),
                    ..Default::default()
                }
            }
        };
        self.publisher.end_cell();
        reply
    }

    fn history(&self) -> std::sync::MutexGuard<'_, History> {
        self.history.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A `history_reply`, written as JSON: a cell without a result has `null` output, which
    /// the typed reply cannot say.
    fn history_reply(&self, req: &JupyterMessage) -> JupyterMessageContent {
        let content = match serde_json::from_value::<history::Query>(wire::content_json(req)) {
            Ok(q) => serde_json::json!({"status": "ok", "history": self.history().answer(&q)}),
            Err(e) => serde_json::json!({
                "status": "error",
                "ename": "HistoryRequest",
                "evalue": format!("unreadable history_request: {e}"),
                "traceback": [],
            }),
        };
        wire::json_reply("history_reply", content)
    }

    async fn complete(&self, code: &str, cursor: usize) -> CompleteReply {
        let byte = is_complete::char_to_byte(code, cursor);
        match self.evaluator.complete(code.to_string(), byte).await {
            Some(c) => {
                let (start, end) = (
                    is_complete::byte_to_char(code, c.start),
                    is_complete::byte_to_char(code, c.end),
                );
                CompleteReply {
                    metadata: completion::reply_metadata(&c.matches, start, end),
                    matches: c.matches.into_iter().map(|m| m.text).collect(),
                    cursor_start: start,
                    cursor_end: end,
                    ..Default::default()
                }
            }
            None => CompleteReply {
                cursor_start: cursor,
                cursor_end: cursor,
                ..Default::default()
            },
        }
    }

    async fn inspect(&self, code: &str, cursor: usize) -> InspectReply {
        let byte = is_complete::char_to_byte(code, cursor);
        match self.evaluator.inspect(code.to_string(), byte).await {
            Some((plain, html)) if !plain.trim().is_empty() => {
                let mut bundle = serde_json::Map::new();
                bundle.insert("text/plain".into(), plain.into());
                if !html.is_empty() {
                    bundle.insert("text/html".into(), html.into());
                }
                InspectReply {
                    found: true,
                    data: serde_json::from_value(bundle.into()).unwrap_or_default(),
                    ..Default::default()
                }
            }
            _ => InspectReply::default(),
        }
    }

    /// Stops running jobs cooperatively (the waiting cell returns an error, variables stay);
    /// kills the cell process only if the cell does not return within [`INTERRUPT_GRACE`].
    fn interrupt(&self) {
        self.channel.send(&ToNotebook::Interrupt);
        let cell_process = self.evaluator.cell_process.clone();
        let id = cell_process.executing.load(Ordering::SeqCst);
        if id == 0 {
            return;
        }
        cell_process.interrupted.store(id, Ordering::SeqCst);
        let publisher = self.publisher.clone();
        tokio::spawn(async move {
            tokio::time::sleep(INTERRUPT_GRACE).await;
            if cell_process.executing.load(Ordering::SeqCst) == id {
                publisher.kernel_note(&format!(
                    "trainbook: the cell did not stop within {} s of the interrupt; restarting \
                     its Rust process (all variables are lost)\n",
                    INTERRUPT_GRACE.as_secs()
                ));
                cell_process.killed.store(id, Ordering::SeqCst);
                cell_process.kill_child();
            }
        });
    }

    /// Stops every job (workers get SIGTERM, then SIGKILL), then the cell process, then exits.
    async fn shutdown(&self) {
        self.channel.send(&ToNotebook::Shutdown);
        if let Some(pid) = self.evaluator.cell_process.child_pid() {
            let deadline = tokio::time::Instant::now() + SHUTDOWN_GRACE;
            while !procs::descendants(pid).is_empty() && tokio::time::Instant::now() < deadline {
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
        self.evaluator.cell_process.kill_child();
        let _ = std::fs::remove_dir_all(&self.run_dir);
        // Let the reply and the last IOPub messages leave before the sockets close.
        tokio::time::sleep(Duration::from_millis(100)).await;
        std::process::exit(0);
    }
}

pub fn read_connection_file(path: &std::path::Path) -> Result<ConnectionInfo> {
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("cannot read the connection file {}", path.display()))?;
    serde_json::from_str(&text).with_context(|| {
        format!(
            "{} is not a Jupyter connection file (ip, ports, key, transport)",
            path.display()
        )
    })
}
