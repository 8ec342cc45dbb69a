//! The shell and control sockets: requests in, replies out.
//!
//! `jupyter-zmq-client` reads a request into its typed form and fails the whole message when
//! the content lacks a field the type requires, which real clients do: jupyter_client sends a
//! `history_request` search without `n` or `unique`, both optional in the specification. A
//! dropped request is never answered and the client waits forever. Requests are therefore read
//! here: the signature is checked by the same code, and a content that does not fit its type is
//! kept as raw JSON ([`UnknownMessage`]) for its handler to read with the specification's
//! defaults. The client crate's connection owns its socket whole, so replies are framed and
//! signed here too, as the specification's wire format says.

use anyhow::{Context, Result};
use jupyter_protocol::{
    ConnectionInfo, Header, JupyterMessage, JupyterMessageContent, UnknownMessage,
};
use jupyter_zmq_client::RawMessage;
use zeromq::{Socket as _, SocketRecv as _, SocketSend as _};

/// The sending half of a ROUTER socket, with the session's signing key.
pub struct Replies {
    socket: zeromq::RouterSendHalf,
    key: Option<ring::hmac::Key>,
    session: String,
}

/// The receiving half of a ROUTER socket.
pub struct Requests {
    socket: zeromq::RouterRecvHalf,
    key: Option<ring::hmac::Key>,
    name: &'static str,
}

/// Binds a ROUTER socket at `url` (the shell's or control's address of the connection file).
pub async fn bind(
    info: &ConnectionInfo,
    url: String,
    name: &'static str,
    session: &str,
) -> Result<(Requests, Replies)> {
    let mut socket = zeromq::RouterSocket::new();
    socket
        .bind(&url)
        .await
        .with_context(|| format!("cannot bind the {name} socket at {url}"))?;
    let (send, recv) = socket.split();
    let key = (!info.key.is_empty())
        .then(|| ring::hmac::Key::new(ring::hmac::HMAC_SHA256, info.key.as_bytes()));
    Ok((
        Requests {
            socket: recv,
            key: key.clone(),
            name,
        },
        Replies {
            socket: send,
            key,
            session: session.to_string(),
        },
    ))
}

impl Replies {
    /// Sends `msg` to the peer its identities name (those of the request it answers).
    pub async fn send(&mut self, msg: JupyterMessage) -> Result<()> {
        let frames = frames(msg.with_session(&self.session), self.key.as_ref())?;
        let multipart = zeromq::ZmqMessage::try_from(frames)
            .map_err(|e| anyhow::anyhow!("an empty message: {e}"))?;
        self.socket.send(multipart).await?;
        Ok(())
    }
}

/// The specification's wire format: identities, `<IDS|MSG>`, the HMAC-SHA256 of the four JSON
/// parts (hex), header, parent header, metadata, content, then buffers.
fn frames(msg: JupyterMessage, key: Option<&ring::hmac::Key>) -> Result<Vec<bytes::Bytes>> {
    let parent = match &msg.parent_header {
        Some(h) => serde_json::to_vec(h)?,
        None => b"{}".to_vec(),
    };
    let parts = [
        serde_json::to_vec(&msg.header)?,
        parent,
        serde_json::to_vec(&msg.metadata)?,
        serde_json::to_vec(&msg.content)?,
    ];
    let signature = match key {
        Some(key) => {
            let mut ctx = ring::hmac::Context::with_key(key);
            for p in &parts {
                ctx.update(p);
            }
            let tag = ctx.sign();
            tag.as_ref().iter().map(|b| format!("{b:02x}")).collect()
        }
        None => String::new(),
    };
    let mut out: Vec<bytes::Bytes> = msg.zmq_identities;
    out.push(bytes::Bytes::from_static(b"<IDS|MSG>"));
    out.push(signature.into_bytes().into());
    out.extend(parts.into_iter().map(bytes::Bytes::from));
    out.extend(msg.buffers);
    Ok(out)
}

impl Requests {
    /// The next request whose signature checks out; others are dropped and logged.
    pub async fn next(&mut self) -> JupyterMessage {
        let mut failures = 0u32;
        loop {
            let why = match self.socket.recv().await {
                Ok(multipart) => match RawMessage::from_multipart(multipart, &self.key) {
                    Ok(raw) => match parse(raw) {
                        Ok(msg) => return msg,
                        Err(e) => format!("unreadable message ({e})"),
                    },
                    Err(e) => format!("bad or missing HMAC signature ({e})"),
                },
                Err(e) => format!("socket error ({e})"),
            };
            failures += 1;
            eprintln!(
                "trainbook-kernel: dropped a message on {}: {why}",
                self.name
            );
            if failures > 100 {
                // A broken socket would otherwise spin.
                tokio::time::sleep(std::time::Duration::from_millis(50)).await;
            }
        }
    }
}

/// The message in `raw`: typed where its content fits the type, raw JSON otherwise.
fn parse(raw: RawMessage) -> Result<JupyterMessage> {
    let part = |i: usize| -> &[u8] { raw.jparts.get(i).map_or(&b"{}"[..], |p| &p[..]) };
    let header: Header = serde_json::from_slice(part(0)).context("its header")?;
    let content: serde_json::Value = serde_json::from_slice(part(3)).context("its content")?;
    let content = JupyterMessageContent::from_type_and_content(&header.msg_type, content.clone())
        .unwrap_or_else(|_| {
            JupyterMessageContent::UnknownMessage(UnknownMessage {
                msg_type: header.msg_type.clone(),
                content,
            })
        });
    Ok(JupyterMessage {
        // An empty parent header (`{}`) is no header.
        parent_header: serde_json::from_slice(part(1)).ok(),
        metadata: serde_json::from_slice(part(2)).context("its metadata")?,
        buffers: raw.jparts.iter().skip(4).cloned().collect(),
        zmq_identities: raw.zmq_identities,
        header,
        content,
        channel: None,
    })
}

/// A request's content as JSON, whichever form it was read in.
pub fn content_json(msg: &JupyterMessage) -> serde_json::Value {
    match &msg.content {
        JupyterMessageContent::UnknownMessage(u) => u.content.clone(),
        typed => serde_json::to_value(typed).unwrap_or_default(),
    }
}

/// A reply whose content is written as JSON (for replies the typed forms cannot express).
pub fn json_reply(msg_type: &str, content: serde_json::Value) -> JupyterMessageContent {
    JupyterMessageContent::UnknownMessage(UnknownMessage {
        msg_type: msg_type.into(),
        content,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn raw(msg_type: &str, content: &str) -> RawMessage {
        let header = format!(
            r#"{{"msg_id":"m1","username":"u","session":"s","date":"2026-11-28T00:00:00Z","msg_type":"{msg_type}","version":"5.3"}}"#
        );
        RawMessage {
            zmq_identities: vec![bytes_of("client")],
            jparts: vec![
                bytes_of(&header),
                bytes_of("{}"),
                bytes_of("{}"),
                bytes_of(content),
            ],
        }
    }

    fn bytes_of(s: &str) -> bytes::Bytes {
        s.as_bytes().to_vec().into()
    }

    #[test]
    fn a_request_missing_optional_fields_is_kept_as_json() {
        // jupyter_client's search: no `n`, no `unique`.
        let msg = parse(raw(
            "history_request",
            r#"{"raw":true,"output":false,"hist_access_type":"search","pattern":"a*"}"#,
        ))
        .unwrap();
        assert_eq!(msg.content.message_type(), "history_request");
        assert_eq!(content_json(&msg)["pattern"], "a*");
        assert!(msg.parent_header.is_none());
        assert_eq!(msg.zmq_identities.len(), 1);
    }

    #[test]
    fn a_reply_is_framed_and_signed_as_the_client_crate_checks_it() {
        let key = ring::hmac::Key::new(ring::hmac::HMAC_SHA256, b"secret");
        let req = parse(raw("kernel_info_request", "{}")).unwrap();
        let reply = JupyterMessage::new(jupyter_protocol::InterruptReply::new(), Some(&req));
        let frames = frames(reply, Some(&key)).unwrap();
        assert_eq!(&frames[0][..], b"client");
        let multipart = zeromq::ZmqMessage::try_from(frames).unwrap();
        // The client crate's own reading verifies the signature.
        let back = RawMessage::from_multipart(multipart, &Some(key)).unwrap();
        let msg = parse(back).unwrap();
        assert_eq!(msg.content.message_type(), "interrupt_reply");
        assert_eq!(msg.parent_header.unwrap().msg_id, "m1");
    }

    #[test]
    fn a_well_formed_request_is_typed() {
        let msg = parse(raw("kernel_info_request", "{}")).unwrap();
        assert!(matches!(
            msg.content,
            JupyterMessageContent::KernelInfoRequest(_)
        ));
    }
}
