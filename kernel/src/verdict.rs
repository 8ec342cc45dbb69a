//! Whether a cell failed, as the cell process itself saw it.
//!
//! evcxr runs a cell's failing `?` and its panics to completion inside the cell process: the
//! error goes to stderr, a marker line to stdout, and `execute` still returns `Ok`. Jupyter
//! clients (nbclient, nbconvert, papermill) judge a cell by its execute reply alone, so a kernel
//! that answered `ok` would let a broken training run pass CI. The cell process is this very
//! executable, so before it enters evcxr's runtime it routes its stdout and stderr through one
//! relay thread that watches for the markers and, before the cell's end-of-cell line, emits one
//! extra content block ([`MIME`]) with the verdict. evcxr hands that block back with the cell's
//! outputs, so the verdict reaches the evaluator in order with the result: no second channel, no
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
use std::time::{Duration, Instant};

/// Set by the kernel on the cell process it starts, so only that process installs the relay.
pub const CELL_PROCESS_ENV: &str = "TRAINBOOK_CELL_PROCESS";
/// The content type of the verdict block; the evaluator removes it from the cell's outputs.
pub const MIME: &str = "application/vnd.trainbook.cell-failure+json";

// evcxr's own lines (crate-private constants in evcxr 0.22; the kernel tests pin them).
const USER_ERROR: &str = "EVCXR_ERROR_OCCURRED";
const PANIC: &str = "EVCXR_PANIC_NOTIFICATION";
const COMPLETE: &str = "EVCXR_EXECUTION_COMPLETE";

/// The line the cells' panic hook prints: `PANIC_LINE <line>\t<file>\t<message as hex>`.
const PANIC_LINE: &str = "TRAINBOOK_CELL_PANIC";

/// Holds the kernel's own `RUST_BACKTRACE` for the cell process: evcxr sets the variable to 1
/// for its child, and [`install`] puts the user's setting back.
pub const USER_BACKTRACE_ENV: &str = "TRAINBOOK_USER_RUST_BACKTRACE";

/// Cell code that installs the panic hook (see the module's opening). Only panics on the thread
/// that runs cells count: the hook reports them, and prints nothing itself, so the cell's error
/// is its one output. With `RUST_BACKTRACE` set (in the kernel's environment, or by a cell) the
/// report carries the backtrace. A panic on a thread of the user's is theirs to join: the
/// previous hook prints it on stderr as usual.
pub const PANIC_HOOK_CODE: &str = r#"{
    let cell_thread = std::thread::current().id();
    let previous = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        if std::thread::current().id() != cell_thread {
            return previous(info);
        }
        let hex = |s: &str| -> String { s.bytes().map(|b| format!("{b:02x}")).collect() };
        let p = info.payload();
        let msg = p.downcast_ref::<&str>().map(|s| s.to_string())
            .or_else(|| p.downcast_ref::<String>().cloned()).unwrap_or_default();
        let (file, line) = info.location().map(|l| (l.file(), l.line())).unwrap_or(("", 0));
        let trace = match std::env::var("RUST_BACKTRACE") {
            Ok(v) if v != "0" => std::backtrace::Backtrace::force_capture().to_string(),
            _ => String::new(),
        };
        println!("TRAINBOOK_CELL_PANIC {line}\t{file}\t{}\t{}", hex(&msg), hex(&trace));
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
    /// A panic's backtrace, when the user turned backtraces on (std's text form).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub backtrace: Option<String>,
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
    // SAFETY: the first thing the cell process does, before any other thread exists.
    unsafe {
        match std::env::var_os(USER_BACKTRACE_ENV) {
            Some(v) if !v.is_empty() => std::env::set_var("RUST_BACKTRACE", v),
            _ => std::env::remove_var("RUST_BACKTRACE"),
        }
        std::env::remove_var(USER_BACKTRACE_ENV);
    }
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
        let timeout = watch
            .wait(Instant::now())
            .map_or(-1, |d| d.as_millis().clamp(1, 1000) as i32);
        // SAFETY: two valid pollfd entries that live for the call.
        let n = unsafe { libc::poll(fds.as_mut_ptr(), 2, timeout) };
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
            watch.stderr(&String::from_utf8_lossy(&err_buf), Instant::now());
            err_buf.clear();
        }
        // stderr read in this round may have been written after some of these stdout lines:
        // a failure marker among them claims it (an ordinary line before it does not).
        let marker_ahead = out_buf
            .split(|&b| b == b'\n')
            .any(|l| l == USER_ERROR.as_bytes() || l == PANIC.as_bytes());
        while let Some(i) = out_buf.iter().position(|&b| b == b'\n') {
            let line = String::from_utf8_lossy(&out_buf[..i]).into_owned();
            out_buf.drain(..=i);
            let ordinary = line != USER_ERROR && line != PANIC && line != COMPLETE;
            let pass = if marker_ahead && ordinary && !line.starts_with(PANIC_LINE) {
                Pass {
                    stderr: String::new(),
                    stdout: vec![line],
                }
            } else {
                watch.stdout_line(&line)
            };
            let _ = real_err.write_all(pass.stderr.as_bytes());
            let mut text = String::new();
            for l in pass.stdout {
                text.push_str(&l);
                text.push('\n');
            }
            if real_out.write_all(text.as_bytes()).is_err() {
                return;
            }
        }
        if let Some(text) = watch.release(Instant::now()) {
            let _ = real_err.write_all(text.as_bytes());
        }
        if !out_open {
            let _ = real_out.write_all(&out_buf);
            let _ = real_err.write_all(watch.held.as_bytes());
            return;
        }
    }
}

/// What the relay passes on for one stdout line: stderr first, then stdout.
struct Pass {
    stderr: String,
    stdout: Vec<String>,
}

/// The relay's memory of the running cell: pure (time is a parameter), so its rules are
/// unit-tested.
///
/// stderr is passed on after [`HOLD`]: a cell's `?` error is written to stderr just before its
/// marker line on stdout, and the error reaches the notebook once, as the cell's error, not
/// also as stderr text above it.
#[derive(Default)]
struct Watch {
    /// stderr lines since the cell's last stdout line (the last [`TAIL_LINES`]).
    tail: VecDeque<String>,
    /// stderr text after the last newline.
    partial: String,
    /// stderr not passed on yet, and since when.
    held: String,
    held_since: Option<Instant>,
    failure: Option<Failure>,
    /// What the cells' panic hook reported for the running cell.
    panic: Option<Failure>,
}

/// How long stderr is held back before it is passed on (see [`Watch`]): the error and its
/// marker are microseconds apart, unless the machine is busy; the end of a cell passes on
/// what is held at once, so only text of a cell still running waits this long.
const HOLD: Duration = Duration::from_millis(250);
/// Held stderr beyond this size is passed on at once.
const MAX_HELD: usize = 64 * 1024;

impl Watch {
    fn stderr(&mut self, text: &str, now: Instant) {
        self.partial.push_str(text);
        while let Some(i) = self.partial.find('\n') {
            let line = self.partial[..i].to_string();
            self.partial.drain(..=i);
            self.tail.push_back(line);
            if self.tail.len() > TAIL_LINES {
                self.tail.pop_front();
            }
        }
        self.held.push_str(text);
        self.held_since.get_or_insert(now);
    }

    /// How long until held stderr is due.
    fn wait(&self, now: Instant) -> Option<Duration> {
        self.held_since
            .map(|t| (t + HOLD).saturating_duration_since(now))
    }

    /// Held stderr that is due (held for [`HOLD`], or too much to hold).
    fn release(&mut self, now: Instant) -> Option<String> {
        let since = self.held_since?;
        (now >= since + HOLD || self.held.len() > MAX_HELD).then(|| self.take_held())
    }

    fn take_held(&mut self) -> String {
        self.held_since = None;
        std::mem::take(&mut self.held)
    }

    fn message(&self) -> String {
        let mut lines: Vec<&str> = self.tail.iter().map(String::as_str).collect();
        if !self.partial.is_empty() {
            lines.push(&self.partial);
        }
        lines.join("\n").trim().to_string()
    }

    /// What to pass on for one stdout line of the cell process.
    fn stdout_line(&mut self, line: &str) -> Pass {
        let mut pass = Pass {
            stderr: String::new(),
            stdout: Vec::with_capacity(1),
        };
        if let Some(report) = line.strip_prefix(PANIC_LINE) {
            self.panic = parse_panic_line(report.trim_start());
            return pass;
        }
        match line {
            USER_ERROR => {
                // The error's text is the held stderr: it becomes the cell's error message.
                self.failure = Some(Failure {
                    kind: FailureKind::Error,
                    message: self.message(),
                    file: None,
                    line: None,
                    backtrace: None,
                });
                self.take_held();
            }
            PANIC => {
                let failure = match self.panic.take() {
                    Some(reported) => {
                        pass.stderr = self.take_held();
                        reported
                    }
                    None => {
                        // No report from the hook (it is not installed): the panic's text on
                        // stderr is the message.
                        self.take_held();
                        Failure {
                            kind: FailureKind::Panic,
                            message: self.message(),
                            file: None,
                            line: None,
                            backtrace: None,
                        }
                    }
                };
                self.failure = Some(failure);
            }
            COMPLETE => {
                pass.stderr = self.take_held();
                self.panic = None;
                if let Some(f) = self.failure.take() {
                    pass.stdout.push(format!("EVCXR_BEGIN_CONTENT {MIME}"));
                    pass.stdout
                        .push(serde_json::to_string(&f).unwrap_or_default());
                    pass.stdout.push("EVCXR_END_CONTENT".into());
                }
            }
            _ => pass.stderr = self.take_held(),
        }
        if line != USER_ERROR && line != PANIC {
            // A new stdout line (or the next cell) starts a new candidate message.
            self.tail.clear();
            self.partial.clear();
        }
        pass.stdout.push(line.to_string());
        pass
    }
}

/// `<line>\t<file>\t<hex message>\t<hex backtrace>` from the cells' panic hook.
fn parse_panic_line(report: &str) -> Option<Failure> {
    let mut parts = report.splitn(4, '\t');
    let line: u32 = parts.next()?.parse().ok()?;
    let file = parts.next()?.to_string();
    let message = unhex(parts.next()?.trim())?;
    let backtrace = parts.next().and_then(|h| unhex(h.trim()));
    Some(Failure {
        kind: FailureKind::Panic,
        message,
        file: (!file.is_empty()).then_some(file),
        line: (line > 0).then_some(line),
        backtrace: backtrace.filter(|b| !b.is_empty()),
    })
}

fn unhex(hex: &str) -> Option<String> {
    let bytes: Option<Vec<u8>> = (0..hex.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(hex.get(i..i + 2)?, 16).ok())
        .collect();
    Some(String::from_utf8_lossy(&bytes?).into_owned())
}

/// One frame of a panic's backtrace that belongs to the user: a function of the cells (crate
/// `ctx`, in evcxr's generated `src/lib.rs`) or of a library they call.
#[derive(Debug, Clone, PartialEq)]
pub struct Frame {
    pub function: String,
    /// `file:line:column` as std prints it.
    pub at: Option<(String, u32)>,
}

impl Frame {
    /// The running cell's own body (evcxr's `run_user_code_N` and its closures).
    pub fn is_cell(&self) -> bool {
        let f = &self.function;
        f.strip_prefix("ctx::")
            .unwrap_or(f)
            .starts_with("run_user_code_")
    }
}

/// The user's frames of std's backtrace text, innermost first: the hook and the panic
/// machinery above them, the standard library and evcxr's runtime are left out, and nothing
/// below the cell is kept.
pub fn user_frames(backtrace: &str) -> Vec<Frame> {
    let mut frames: Vec<Frame> = Vec::new();
    for line in backtrace.lines() {
        let t = line.trim();
        if let Some(at) = t.strip_prefix("at ") {
            if let Some(f) = frames.last_mut()
                && f.at.is_none()
            {
                f.at = file_line(at);
            }
        } else if let Some((n, function)) = t.split_once(": ")
            && n.chars().all(|c| c.is_ascii_digit())
        {
            frames.push(Frame {
                function: function.to_string(),
                at: None,
            });
        }
    }
    let outermost_cell = frames.iter().rposition(Frame::is_cell);
    if let Some(i) = outermost_cell {
        frames.truncate(i + 1);
    }
    // The backtrace is taken in the hook: what is above the panic's start is the hook itself.
    if let Some(i) = frames.iter().rposition(|f| is_panic_machinery(&f.function)) {
        frames.drain(..=i);
    }
    frames.retain(|f| !is_runtime(&f.function));
    frames
}

fn file_line(at: &str) -> Option<(String, u32)> {
    let mut parts = at.rsplitn(3, ':');
    let _column = parts.next()?;
    let line = parts.next()?.parse().ok()?;
    Some((parts.next()?.to_string(), line))
}

fn is_panic_machinery(function: &str) -> bool {
    function.contains("rust_begin_unwind")
        || function.starts_with("core::panicking::")
        || function.starts_with("std::panicking::")
}

fn is_runtime(function: &str) -> bool {
    let f = function.trim_start_matches('<');
    [
        "std::",
        "core::",
        "alloc::",
        "evcxr",
        "__rust",
        "rust_begin_unwind",
        "_start",
        "__libc",
    ]
    .iter()
    .any(|p| f.starts_with(p))
        || f == "main"
        || f == "<unknown>"
        || f.contains("panicking")
}

/// Reads the verdict back out of the content evcxr returned.
pub fn parse(content: &str) -> Option<Failure> {
    serde_json::from_str(content).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn feed(w: &mut Watch, line: &str) -> Vec<String> {
        w.stdout_line(line).stdout
    }

    fn stderr(w: &mut Watch, text: &str) {
        w.stderr(text, Instant::now())
    }

    #[test]
    fn stderr_is_passed_on_after_a_moment_and_a_question_marks_error_never() {
        let t0 = Instant::now();
        let mut w = Watch::default();
        w.stderr("a warning\n", t0);
        assert_eq!(w.release(t0), None);
        assert_eq!(w.wait(t0), Some(HOLD));
        assert_eq!(w.release(t0 + HOLD).as_deref(), Some("a warning\n"));
        assert_eq!(w.wait(t0 + HOLD), None);
        // A stdout line passes on what was held before it.
        w.stderr("note\n", t0);
        assert_eq!(w.stdout_line("progress").stderr, "note\n");
        // The error of a `?` is the cell's error, not stderr text.
        w.stderr("No such file\n", t0);
        assert_eq!(w.stdout_line(USER_ERROR).stderr, "");
        assert_eq!(w.release(t0 + HOLD * 10), None);
        let f = parse(&feed(&mut w, COMPLETE)[1]).unwrap();
        assert_eq!(f.message, "No such file");
    }

    #[test]
    fn text_printed_before_a_reported_panic_is_kept() {
        let mut w = Watch::default();
        stderr(&mut w, "step 3 of 5\n");
        feed(&mut w, &format!("{PANIC_LINE} 2\tsrc/lib.rs\t6f6b\t"));
        assert_eq!(w.stdout_line(PANIC).stderr, "step 3 of 5\n");
        let f = parse(&feed(&mut w, COMPLETE)[1]).unwrap();
        assert_eq!((f.message.as_str(), f.backtrace), ("ok", None));
    }

    #[test]
    fn a_question_mark_error_is_reported_before_the_end_of_the_cell() {
        let mut w = Watch::default();
        feed(&mut w, "hello");
        stderr(&mut w, "No such file or directory (os error 2)\n");
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
        stderr(&mut w, "an earlier warning\n");
        feed(&mut w, "loading");
        stderr(
            &mut w,
            "preset `nope` is not a preset of bert\nchoose one of: tiny, ",
        );
        stderr(&mut w, "default\n");
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
        stderr(&mut w, "thread '<unnamed>' panicked at src/lib.rs:12:5:\n");
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
                backtrace: None,
            }
        );
    }

    #[test]
    fn a_backtrace_keeps_the_users_frames_down_to_the_cell() {
        let trace = "\
   0: std::backtrace_rs::backtrace::libunwind::trace
             at /rustc/abc/library/std/src/../../backtrace/src/backtrace/libunwind.rs:117:9
   1: std::backtrace::Backtrace::create
   2: ctx::run_user_code_1::{{closure}}::{{closure}}
   3: std::panicking::begin_panic_handler::{{closure}}
   4: core::panicking::panic_fmt
             at /rustc/abc/library/core/src/panicking.rs:75:14
   5: ctx::deep
             at ./src/lib.rs:20:5
   6: trainbook_api::job::Job::wait
             at /work/prelude/api/src/job.rs:44:9
   7: ctx::run_user_code_3::{{closure}}
             at ./src/lib.rs:31:9
   8: <core::panic::unwind_safe::AssertUnwindSafe<F> as core::ops::function::FnOnce<()>>::call_once
   9: run_user_code_3
             at ./src/lib.rs:29:5
  10: evcxr::runtime::Runtime::run_loop
  11: main
";
        let frames = user_frames(trace);
        let names: Vec<&str> = frames.iter().map(|f| f.function.as_str()).collect();
        assert_eq!(
            names,
            [
                "ctx::deep",
                "trainbook_api::job::Job::wait",
                "ctx::run_user_code_3::{{closure}}",
                "run_user_code_3"
            ]
        );
        assert_eq!(frames[0].at, Some(("./src/lib.rs".into(), 20)));
        assert!(frames[3].is_cell());
    }

    #[test]
    fn a_panic_the_cell_caught_itself_is_forgotten_at_the_end_of_the_cell() {
        let mut w = Watch::default();
        feed(&mut w, &format!("{PANIC_LINE} 3\tsrc/lib.rs\t6f6b\t"));
        assert_eq!(feed(&mut w, COMPLETE), [COMPLETE]);
        stderr(&mut w, "later\n");
        feed(&mut w, PANIC);
        let f = parse(&feed(&mut w, COMPLETE)[1]).unwrap();
        assert_eq!((f.message.as_str(), f.line), ("later", None));
    }

    #[test]
    fn a_panic_without_a_record_falls_back_to_stderr() {
        let mut w = Watch::default();
        stderr(&mut w, "boom\n");
        feed(&mut w, PANIC);
        let f = parse(&feed(&mut w, COMPLETE)[1]).unwrap();
        assert_eq!((f.kind, f.message.as_str()), (FailureKind::Panic, "boom"));
    }

    #[test]
    fn a_cell_that_succeeds_passes_through_unchanged() {
        let mut w = Watch::default();
        stderr(&mut w, "a warning\n");
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
            stderr(&mut w, &format!("line {i}\n"));
        }
        assert_eq!(w.tail.len(), TAIL_LINES);
        assert!(w.message().ends_with("line 999"));
    }
}
