//! Everything the kernel publishes on IOPub goes through the [`Publisher`], which decides which
//! cell (parent message) each output belongs to.
//!
//! Front ends route outputs by parent: JupyterLab drops a `display_data` or `stream` whose cell
//! has finished but applies `update_display_data` to every output with that display id; nbclient
//! (headless runs) only reads messages whose parent is the cell it is executing. So:
//! - a display created while a cell runs belongs to that cell; one created while no cell runs is
//!   sent again, as new output, with the next cell;
//! - an update goes to the running cell if there is one (both front ends apply it), else to the
//!   display's own cell, and is sent again with the next cell so headless runs catch up;
//! - text printed while no cell runs is kept (bounded) and printed with the next cell.

use jupyter_protocol::{
    ClearOutput, DisplayData, JupyterMessage, JupyterMessageContent, Media, StreamContent,
    Transient, UpdateDisplayData,
};
use serde_json::{Map, Value};
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use tokio::sync::mpsc::{UnboundedReceiver, UnboundedSender, unbounded_channel};
use trainbook_channel::ToKernel;

/// Text kept for the next cell while no cell runs.
const MAX_HELD_TEXT: usize = 64 * 1024;

#[derive(Clone)]
pub struct Publisher {
    inner: Arc<Inner>,
}

struct Inner {
    tx: UnboundedSender<JupyterMessage>,
    route: Mutex<Route>,
}

#[derive(Default)]
struct Route {
    /// The execute request now running, and the last one that ran.
    current: Option<JupyterMessage>,
    last: Option<JupyterMessage>,
    displays: HashMap<String, Shown>,
    held: Vec<(String, String)>,
    held_bytes: usize,
    dropped_bytes: usize,
}

struct Shown {
    origin: Option<JupyterMessage>,
    data: Media,
    metadata: Map<String, Value>,
    /// Never delivered to a running cell (created between cells).
    unseen: bool,
    /// Updated since a running cell last saw it.
    stale: bool,
}

impl Publisher {
    pub fn new() -> (Publisher, UnboundedReceiver<JupyterMessage>) {
        let (tx, rx) = unbounded_channel();
        let p = Publisher {
            inner: Arc::new(Inner {
                tx,
                route: Mutex::new(Route::default()),
            }),
        };
        (p, rx)
    }

    fn route(&self) -> std::sync::MutexGuard<'_, Route> {
        self.inner.route.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Queues one IOPub message with `parent` as its parent header.
    pub fn send(&self, content: impl Into<JupyterMessageContent>, parent: Option<&JupyterMessage>) {
        let msg = JupyterMessage::new(content, parent).with_zmq_identities(Vec::new());
        let _ = self.inner.tx.send(msg);
    }

    /// A cell starts: outputs go to it from now on, and it receives what happened meanwhile.
    pub fn begin_cell(&self, request: &JupyterMessage) {
        let mut r = self.route();
        r.current = Some(request.clone());
        r.last = Some(request.clone());
        let held = std::mem::take(&mut r.held);
        let dropped = std::mem::take(&mut r.dropped_bytes);
        r.held_bytes = 0;
        if dropped > 0 {
            self.send(
                StreamContent::stderr(&format!(
                    "[{dropped} bytes of output printed between cells were dropped]\n"
                )),
                Some(request),
            );
        }
        for (name, text) in held {
            self.send(stream(&name, &text), Some(request));
        }
        for (id, shown) in r.displays.iter_mut() {
            if shown.unseen {
                shown.unseen = false;
                shown.stale = false;
                self.send(display(id, shown), Some(request));
            } else if shown.stale {
                shown.stale = false;
                self.send(update(id, shown), Some(request));
            }
        }
    }

    pub fn end_cell(&self) {
        self.route().current = None;
    }

    /// Text from the cell process: to the running cell, or held for the next one.
    pub fn stream(&self, name: &str, text: &str) {
        let mut r = self.route();
        if let Some(cur) = r.current.clone() {
            drop(r);
            self.send(stream(name, text), Some(&cur));
            return;
        }
        if r.held_bytes + text.len() > MAX_HELD_TEXT {
            r.dropped_bytes += text.len();
            return;
        }
        r.held_bytes += text.len();
        match r.held.last_mut() {
            Some((n, t)) if n == name => t.push_str(text),
            _ => r.held.push((name.to_string(), text.to_string())),
        }
    }

    /// A note from the kernel itself (stderr of the running or next cell).
    pub fn kernel_note(&self, text: &str) {
        self.stream("stderr", text);
    }

    /// A message from notebook code over the side channel.
    pub fn notebook_message(&self, msg: ToKernel) {
        match msg {
            ToKernel::Hello { .. } | ToKernel::Sync { .. } => {}
            ToKernel::Display {
                display_id,
                data,
                metadata,
            } => {
                let mut r = self.route();
                let origin = r.current.clone().or_else(|| r.last.clone());
                let running = r.current.clone();
                let shown = Shown {
                    origin,
                    data: media(data),
                    metadata,
                    unseen: running.is_none(),
                    stale: false,
                };
                if let Some(cur) = &running {
                    self.send(display(&display_id, &shown), Some(cur));
                }
                r.displays.insert(display_id, shown);
            }
            ToKernel::Update {
                display_id,
                data,
                metadata,
            } => {
                let mut r = self.route();
                let running = r.current.clone();
                let Some(shown) = r.displays.get_mut(&display_id) else {
                    return;
                };
                shown.data = media(data);
                shown.metadata = metadata;
                if shown.unseen {
                    // Its display_data has not reached any cell yet; the next cell gets the
                    // latest content as new output.
                    return;
                }
                match &running {
                    Some(cur) => {
                        shown.stale = false;
                        self.send(update(&display_id, shown), Some(cur));
                    }
                    None => {
                        shown.stale = true;
                        self.send(update(&display_id, shown), shown.origin.as_ref());
                    }
                }
            }
            ToKernel::Clear { wait } => {
                // Only a running cell's output can be cleared: front ends drop outputs whose
                // cell has finished.
                let running = self.route().current.clone();
                if let Some(cur) = running {
                    self.send(ClearOutput { wait }, Some(&cur));
                }
            }
            ToKernel::Stream { name, text, .. } => self.stream(name.as_str(), &text),
        }
    }
}

fn stream(name: &str, text: &str) -> StreamContent {
    if name == "stderr" {
        StreamContent::stderr(text)
    } else {
        StreamContent::stdout(text)
    }
}

fn media(bundle: Map<String, Value>) -> Media {
    serde_json::from_value(Value::Object(bundle)).unwrap_or_else(|e| {
        let mut fallback = Map::new();
        fallback.insert(
            "text/plain".into(),
            Value::String(format!("(unreadable display bundle: {e})")),
        );
        serde_json::from_value(Value::Object(fallback)).unwrap_or_default()
    })
}

fn display(id: &str, shown: &Shown) -> DisplayData {
    DisplayData {
        data: shown.data.clone(),
        metadata: shown.metadata.clone(),
        transient: Some(Transient {
            display_id: Some(id.to_string()),
        }),
    }
}

fn update(id: &str, shown: &Shown) -> UpdateDisplayData {
    let mut u = UpdateDisplayData::new(shown.data.clone(), id);
    u.metadata = shown.metadata.clone();
    u
}

#[cfg(test)]
mod tests {
    use super::*;
    use jupyter_protocol::ExecuteRequest;

    fn drain(rx: &mut UnboundedReceiver<JupyterMessage>) -> Vec<(String, Option<String>)> {
        let mut out = Vec::new();
        while let Ok(m) = rx.try_recv() {
            out.push((m.header.msg_type.clone(), m.parent_header.map(|h| h.msg_id)));
        }
        out
    }

    fn bundle(text: &str) -> Map<String, Value> {
        trainbook_channel::bundle(text, None)
    }

    #[test]
    fn outputs_follow_the_running_cell_and_catch_up_later() {
        let (p, mut rx) = Publisher::new();
        let cell1 = JupyterMessage::new(ExecuteRequest::new("a".into()), None);
        let cell2 = JupyterMessage::new(ExecuteRequest::new("b".into()), None);
        let id1 = Some(cell1.header.msg_id.clone());
        let id2 = Some(cell2.header.msg_id.clone());

        p.begin_cell(&cell1);
        p.notebook_message(ToKernel::Display {
            display_id: "d".into(),
            data: bundle("0%"),
            metadata: Map::new(),
        });
        p.end_cell();
        // Between cells: the update goes to the display's own cell and is text is held.
        p.notebook_message(ToKernel::Update {
            display_id: "d".into(),
            data: bundle("50%"),
            metadata: Map::new(),
        });
        p.stream("stdout", "late line\n");
        assert_eq!(
            drain(&mut rx),
            vec![
                ("display_data".into(), id1.clone()),
                ("update_display_data".into(), id1.clone())
            ]
        );
        // The next cell receives the held text and the latest state of the display.
        p.begin_cell(&cell2);
        assert_eq!(
            drain(&mut rx),
            vec![
                ("stream".into(), id2.clone()),
                ("update_display_data".into(), id2.clone())
            ]
        );
        // Updates during a running cell go to that cell (nbclient only reads those).
        p.notebook_message(ToKernel::Update {
            display_id: "d".into(),
            data: bundle("100%"),
            metadata: Map::new(),
        });
        assert_eq!(
            drain(&mut rx),
            vec![("update_display_data".into(), id2.clone())]
        );
    }

    #[test]
    fn a_display_created_between_cells_appears_in_the_next_cell_with_its_latest_content() {
        let (p, mut rx) = Publisher::new();
        let cell1 = JupyterMessage::new(ExecuteRequest::new("a".into()), None);
        p.begin_cell(&cell1);
        p.end_cell();
        drain(&mut rx);
        p.notebook_message(ToKernel::Display {
            display_id: "late".into(),
            data: bundle("v1"),
            metadata: Map::new(),
        });
        p.notebook_message(ToKernel::Update {
            display_id: "late".into(),
            data: bundle("v2"),
            metadata: Map::new(),
        });
        assert!(drain(&mut rx).is_empty());
        let cell2 = JupyterMessage::new(ExecuteRequest::new("b".into()), None);
        p.begin_cell(&cell2);
        let m = rx.try_recv().unwrap();
        assert_eq!(m.header.msg_type, "display_data");
        let v = serde_json::to_value(&m.content).unwrap();
        assert_eq!(v["data"]["text/plain"], "v2");
        assert_eq!(v["transient"]["display_id"], "late");
    }

    #[test]
    fn text_between_cells_is_bounded() {
        let (p, mut rx) = Publisher::new();
        let big = "x".repeat(40 * 1024);
        p.stream("stdout", &big);
        p.stream("stdout", &big);
        let cell = JupyterMessage::new(ExecuteRequest::new("a".into()), None);
        p.begin_cell(&cell);
        let msgs: Vec<_> = std::iter::from_fn(|| rx.try_recv().ok()).collect();
        assert_eq!(msgs.len(), 2, "a drop note and the kept text");
        let note = serde_json::to_value(&msgs[0].content).unwrap();
        assert!(note["text"].as_str().unwrap().contains("40960 bytes"));
    }
}
