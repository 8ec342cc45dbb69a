//! Whether a cell failed, as the cell process itself saw it.
//!
//! evcxr runs a cell's failing `?` and its panics to completion inside the cell process: the
//! error goes to stderr, a marker line to stdout, and `execute` still returns `Ok`. Jupyter
//! clients (nbclient, nbconvert, papermill) judge a cell by its execute reply alone, so a kernel
//! that answered `ok` would let a broken training run pass CI. The cell process is this very
//! executable, so before it enters evcxr's runtime it routes its stdout and stderr through one
//! relay thread that watches for the markers and, before the cell's end-of-cell line, emits one
//! extra content block ([`MIME`]) with the verdict. evcxr hands that block back with the cell's
//! outputs, so the verdict reaches the engine in order with the result: no second channel, no
//! race. Everything the cell prints still reaches evcxr unchanged.
//!
//! One thread reads both pipes and drains stderr before it looks at a stdout line: the cell
//! writes its error message to stderr before it writes the marker, so the message is always
//! read by then.
//!
//! Cells link the Rust standard library dynamically, a different copy from the one inside this
//! executable, so a panic hook set here would never see their panics. The hook is therefore
//! installed by a cell ([`PANIC_HOOK_CODE`], part of the kernel's init cell): it prints the
//! panic's message and place as one [`PANIC_LINE`] on stdout, which the relay takes out of the
//! stream.

use serde::{Deserialize, Serialize};
use std::collections::VecDeque;
use std::fs::File;
use std::io::Write;
use std::os::fd::{AsFd, AsRawFd, OwnedFd};

/// Set by the kernel on the cell process it starts, so only that process installs the relay.
pub const CELL_PROCESS_ENV: &str = "TRAINBOOK_CELL_PROCESS";
/// The content type of the verdict block; the engine removes it from the cell's outputs.
pub const MIME: &str = "application/vnd.trainbook.cell-failure+json";

// evcxr's own lines (crate-private constants in evcxr 0.22; the kernel tests pin them).
const USER_ERROR: &str = "EVCXR_ERROR_OCCURRED";
const PANIC: &str = "EVCXR_PANIC_NOTIFICATION";
const COMPLETE: &str = "EVCXR_EXECUTION_COMPLETE";

/// The line the cells' panic hook prints: `PANIC_LINE <line>\t<file>\t<message as hex>`.
const PANIC_LINE: &str = "TRAINBOOK_CELL_PANIC";

/// Cell code that installs the panic hook (see the module's opening). Only panics on the thread
/// that runs cells count; a panic on a thread of the user's is theirs to join. The previous
/// hook still prints the panic on stderr as usual.
pub const PANIC_HOOK_CODE: &str = r#"{
    let cell_thread = std::thread::current().id();
    let previous = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        if std::thread::current().id() == cell_thread {
            let p = info.payload();
            let msg = p.downcast_ref::<&str>().map(|s| s.to_string())
                .or_else(|| p.downcast_ref::<String>().cloned()).unwrap_or_default();
            let hex: String = msg.bytes().map(|b| format!("{b:02x}")).collect();
            let (file, line) = info.location().map(|l| (l.file(), l.line())).unwrap_or(("", 0));
            println!("TRAINBOOK_CELL_PANIC {line}\t{file}\t{hex}");
        }
        previous(info);
    }));
}"#;

/// Lines of stderr kept as the candidate error message.
const TAIL_LINES: usize = 40;

/// What the cell process reports about a failed cell.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Failure {
    pub kind: FailureKind,
    /// The error's text (a `?`: what the cell printed on stderr since its last stdout line; a
    /// panic: the panic message).
    pub message: String,
    /// Where a panic happened: file and line (the cell's generated source is `src/lib.rs`).
    pub file: Option<String>,
    pub line: Option<u32>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum FailureKind {
    /// A `?` returned an error from the cell.
    Error,
    /// The cell panicked.
    Panic,
}

/// Routes this process's stdout and stderr through the verdict relay.
/// Call first thing in the cell process, before any other thread exists. If a pipe cannot be
/// made the process runs as before, without verdicts (cells that fail are then answered `ok`),
/// and says so on stderr.
pub fn install() {
    if let Err(e) = try_install() {
        eprintln!("trainbook-kernel: failed cells will not be reported as errors: {e}");
    }
}

fn try_install() -> std::io::Result<()> {
    use nix::fcntl::{FcntlArg, OFlag, fcntl};
    let (out_rx, out_tx) = nix::unistd::pipe2(OFlag::O_CLOEXEC)?;
    let (err_rx, err_tx) = nix::unistd::pipe2(OFlag::O_CLOEXEC)?;
    // The original descriptors (evcxr's pipes) now belong to the relay; fds 1 and 2 become the
    // write ends of the new pipes (dup2 clears close-on-exec, so workers inherit them as their
    // stdout/stderr, as before).
    let dup = |fd: std::os::fd::BorrowedFd<'_>| -> nix::Result<OwnedFd> {
        let raw = fcntl(fd, FcntlArg::F_DUPFD_CLOEXEC(3))?;
        // SAFETY: a fresh descriptor from fcntl, owned from here on.
        Ok(unsafe { std::os::fd::FromRawFd::from_raw_fd(raw) })
    };
    let real_out = dup(std::io::stdout().as_fd())?;
    let real_err = dup(std::io::stderr().as_fd())?;
    nix::unistd::dup2_stdout(&out_tx)?;
    nix::unistd::dup2_stderr(&err_tx)?;
    drop((out_tx, err_tx));
    for fd in [&out_rx, &err_rx] {
        set_nonblocking(fd)?;
    }
    std::thread::Builder::new()
        .name("cell-verdict".into())
        .spawn(move || relay(out_rx, err_rx, File::from(real_out), File::from(real_err)))?;
    Ok(())
}

fn set_nonblocking(fd: &OwnedFd) -> std::io::Result<()> {
    use nix::fcntl::{FcntlArg, OFlag, fcntl};
    let flags = OFlag::from_bits_truncate(fcntl(fd, FcntlArg::F_GETFL)?);
    fcntl(fd, FcntlArg::F_SETFL(flags | OFlag::O_NONBLOCK))?;
    Ok(())
}

/// Reads whatever is waiting on a non-blocking pipe. `None`: the pipe is closed.
fn read_available(fd: &OwnedFd, into: &mut Vec<u8>) -> Option<()> {
    let mut buf = [0u8; 8192];
    loop {
        match nix::unistd::read(fd, &mut buf) {
            Ok(0) => return None,
            Ok(n) => into.extend_from_slice(&buf[..n]),
            Err(nix::errno::Errno::EAGAIN) => return Some(()),
            Err(nix::errno::Errno::EINTR) => continue,
            Err(_) => return None,
        }
    }
}

fn relay(out_rx: OwnedFd, err_rx: OwnedFd, mut real_out: File, mut real_err: File) {
    let mut watch = Watch::default();
    let mut out_buf = Vec::new();
    let mut err_buf = Vec::new();
    // Set to false if a cell closes its stderr: poll then ignores that pipe instead of spinning.
    let mut err_open = true;
    loop {
        let mut fds = [
            libc::pollfd {
                fd: out_rx.as_raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            },
            libc::pollfd {
                fd: if err_open { err_rx.as_raw_fd() } else { -1 },
                events: libc::POLLIN,
                revents: 0,
            },
        ];
        // SAFETY: two valid pollfd entries that live for the call.
        let n = unsafe { libc::poll(fds.as_mut_ptr(), 2, -1) };
        if n < 0 {
            if std::io::Error::last_os_error().kind() == std::io::ErrorKind::Interrupted {
                continue;
            }
            return;
        }
        // stdout first into a buffer, then all of stderr: whatever the cell wrote to stderr
        // before a stdout line is in the stderr pipe by the time that line is read.
        let out_open = read_available(&out_rx, &mut out_buf).is_some();
        err_open = err_open && read_available(&err_rx, &mut err_buf).is_some();
        if !err_buf.is_empty() {
            let _ = real_err.write_all(&err_buf);
            watch.stderr(&String::from_utf8_lossy(&err_buf));
            err_buf.clear();
        }
        while let Some(i) = out_buf.iter().position(|&b| b == b'\n') {
            let line = String::from_utf8_lossy(&out_buf[..i]).into_owned();
            out_buf.drain(..=i);
            let mut text = String::new();
            for l in watch.stdout_line(&line) {
                text.push_str(&l);
                text.push('\n');
            }
            if real_out.write_all(text.as_bytes()).is_err() {
                return;
            }
        }
        if !out_open {
            let _ = real_out.write_all(&out_buf);
            return;
        }
    }
}

/// The relay's memory of the running cell: pure, so its rules are unit-tested.
#[derive(Default)]
struct Watch {
    /// stderr lines since the cell's last stdout line (the last [`TAIL_LINES`]).
    tail: VecDeque<String>,
    /// stderr text after the last newline.
    partial: String,
    failure: Option<Failure>,
    /// What the cells' panic hook reported for the running cell.
    panic: Option<Failure>,
}

impl Watch {
    fn stderr(&mut self, text: &str) {
        self.partial.push_str(text);
        while let Some(i) = self.partial.find('\n') {
            let line = self.partial[..i].to_string();
            self.partial.drain(..=i);
            self.tail.push_back(line);
            if self.tail.len() > TAIL_LINES {
                self.tail.pop_front();
            }
        }
    }

    fn message(&self) -> String {
        let mut lines: Vec<&str> = self.tail.iter().map(String::as_str).collect();
        if !self.partial.is_empty() {
            lines.push(&self.partial);
        }
        lines.join("\n").trim().to_string()
    }

    /// The lines to pass on for one stdout line of the cell process.
    fn stdout_line(&mut self, line: &str) -> Vec<String> {
        let mut out = Vec::with_capacity(1);
        if let Some(report) = line.strip_prefix(PANIC_LINE) {
            self.panic = parse_panic_line(report.trim_start());
            return out;
        }
        match line {
            USER_ERROR => {
                self.failure = Some(Failure {
                    kind: FailureKind::Error,
                    message: self.message(),
                    file: None,
                    line: None,
                });
            }
            PANIC => {
                self.failure = Some(self.panic.take().unwrap_or(Failure {
                    kind: FailureKind::Panic,
                    message: self.message(),
                    file: None,
                    line: None,
                }));
            }
            COMPLETE => {
                self.panic = None;
                if let Some(f) = self.failure.take() {
                    out.push(format!("EVCXR_BEGIN_CONTENT {MIME}"));
                    out.push(serde_json::to_string(&f).unwrap_or_default());
                    out.push("EVCXR_END_CONTENT".into());
                }
            }
            _ => {}
        }
        if line != USER_ERROR && line != PANIC {
            // A new stdout line (or the next cell) starts a new candidate message.
            self.tail.clear();
            self.partial.clear();
        }
        out.push(line.to_string());
        out
    }
}

/// `<line>\t<file>\t<hex message>` from the cells' panic hook.
fn parse_panic_line(report: &str) -> Option<Failure> {
    let mut parts = report.splitn(3, '\t');
    let line: u32 = parts.next()?.parse().ok()?;
    let file = parts.next()?.to_string();
    let hex = parts.next()?.trim();
    let bytes: Option<Vec<u8>> = (0..hex.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(hex.get(i..i + 2)?, 16).ok())
        .collect();
    Some(Failure {
        kind: FailureKind::Panic,
        message: String::from_utf8_lossy(&bytes?).into_owned(),
        file: (!file.is_empty()).then_some(file),
        line: (line > 0).then_some(line),
    })
}

/// Reads the verdict back out of the content evcxr returned.
pub fn parse(content: &str) -> Option<Failure> {
    serde_json::from_str(content).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn feed(w: &mut Watch, line: &str) -> Vec<String> {
        w.stdout_line(line)
    }

    #[test]
    fn a_question_mark_error_is_reported_before_the_end_of_the_cell() {
        let mut w = Watch::default();
        feed(&mut w, "hello");
        w.stderr("No such file or directory (os error 2)\n");
        assert_eq!(feed(&mut w, USER_ERROR), [USER_ERROR]);
        let out = feed(&mut w, COMPLETE);
        assert_eq!(out.len(), 4);
        assert_eq!(out[0], format!("EVCXR_BEGIN_CONTENT {MIME}"));
        let f = parse(&out[1]).unwrap();
        assert_eq!(f.kind, FailureKind::Error);
        assert_eq!(f.message, "No such file or directory (os error 2)");
        assert_eq!(out[2], "EVCXR_END_CONTENT");
        assert_eq!(out[3], COMPLETE);
        // The next cell starts clean.
        assert_eq!(feed(&mut w, COMPLETE), [COMPLETE]);
    }

    #[test]
    fn the_message_is_what_stderr_got_after_the_last_stdout_line() {
        let mut w = Watch::default();
        w.stderr("an earlier warning\n");
        feed(&mut w, "loading");
        w.stderr("preset `nope` is not a preset of bert\nchoose one of: tiny, ");
        w.stderr("default\n");
        feed(&mut w, USER_ERROR);
        let out = feed(&mut w, COMPLETE);
        let f = parse(&out[1]).unwrap();
        assert_eq!(
            f.message,
            "preset `nope` is not a preset of bert\nchoose one of: tiny, default"
        );
    }

    #[test]
    fn a_panic_takes_the_hooks_message_and_location() {
        let mut w = Watch::default();
        let msg = "called `Option::unwrap()` on a `None` value\nsecond line";
        let hex: String = msg.bytes().map(|b| format!("{b:02x}")).collect();
        // The hook's line is taken out of the stream.
        assert!(feed(&mut w, &format!("{PANIC_LINE} 12\tsrc/lib.rs\t{hex}")).is_empty());
        w.stderr("thread '<unnamed>' panicked at src/lib.rs:12:5:\n");
        assert_eq!(feed(&mut w, PANIC), [PANIC]);
        let out = feed(&mut w, COMPLETE);
        let f = parse(&out[1]).unwrap();
        assert_eq!(
            f,
            Failure {
                kind: FailureKind::Panic,
                message: msg.into(),
                file: Some("src/lib.rs".into()),
                line: Some(12),
            }
        );
    }

    #[test]
    fn a_panic_the_cell_caught_itself_is_forgotten_at_the_end_of_the_cell() {
        let mut w = Watch::default();
        feed(&mut w, &format!("{PANIC_LINE} 3\tsrc/lib.rs\t6f6b"));
        assert_eq!(feed(&mut w, COMPLETE), [COMPLETE]);
        w.stderr("later\n");
        feed(&mut w, PANIC);
        let f = parse(&feed(&mut w, COMPLETE)[1]).unwrap();
        assert_eq!((f.message.as_str(), f.line), ("later", None));
    }

    #[test]
    fn a_panic_without_a_record_falls_back_to_stderr() {
        let mut w = Watch::default();
        w.stderr("boom\n");
        feed(&mut w, PANIC);
        let f = parse(&feed(&mut w, COMPLETE)[1]).unwrap();
        assert_eq!((f.kind, f.message.as_str()), (FailureKind::Panic, "boom"));
    }

    #[test]
    fn a_cell_that_succeeds_passes_through_unchanged() {
        let mut w = Watch::default();
        w.stderr("a warning\n");
        assert_eq!(
            feed(&mut w, "EVCXR_BEGIN_CONTENT text/plain"),
            ["EVCXR_BEGIN_CONTENT text/plain"]
        );
        assert_eq!(feed(&mut w, "2"), ["2"]);
        assert_eq!(feed(&mut w, COMPLETE), [COMPLETE]);
    }

    #[test]
    fn the_tail_is_bounded() {
        let mut w = Watch::default();
        for i in 0..1000 {
            w.stderr(&format!("line {i}\n"));
        }
        assert_eq!(w.tail.len(), TAIL_LINES);
        assert!(w.message().ends_with("line 999"));
    }
}
