//! Starting and stopping worker processes.
//!
//! Workers are always started by exec of the `trainbook-worker` binary, never by fork: a forked
//! copy of a process that already initialised libtorch, CUDA or the Gaudi runtime inherits
//! threads and driver state it cannot use. Each job's workers share one process group of their
//! own (so the driver can signal them all at once and a terminal's Ctrl-C does not hit them
//! directly), and each asks the kernel to kill it when its parent dies (`PR_SET_PDEATHSIG`).

use std::fs::File;
use std::io::Read;
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::thread;
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context, Result};
use nix::sys::signal::{killpg, Signal};
use nix::sys::wait::{waitpid, WaitPidFlag, WaitStatus};
use nix::unistd::Pid;

/// How long workers get to exit after SIGTERM before SIGKILL.
pub(crate) const STOP_GRACE: Duration = Duration::from_secs(2);

/// Locates the worker binary: `$TRAINBOOK_WORKER`, next to the running executable (or one
/// directory up, for test binaries in `target/*/deps`), the build this library came from,
/// then `$PATH`.
pub(crate) fn worker_binary() -> Result<PathBuf> {
    const NAME: &str = "trainbook-worker";
    if let Some(p) = std::env::var_os("TRAINBOOK_WORKER") {
        let p = PathBuf::from(p);
        return Ok(p);
    }
    let mut tried = Vec::new();
    if let Ok(exe) = std::env::current_exe() {
        for dir in exe.ancestors().skip(1).take(2) {
            tried.push(dir.join(NAME));
        }
    }
    // The kernel loads this library into an evcxr child, whose executable is not ours.
    let manifest = Path::new(env!("CARGO_MANIFEST_DIR"));
    for profile in ["release", "debug"] {
        tried.push(
            manifest
                .join("../..")
                .join("target")
                .join(profile)
                .join(NAME),
        );
    }
    if let Some(path) = std::env::var_os("PATH") {
        tried.extend(std::env::split_paths(&path).map(|d| d.join(NAME)));
    }
    tried.iter().find(|p| p.is_file()).cloned().ok_or_else(|| {
        anyhow!(
            "cannot find the {NAME} binary (looked next to this program, in {}/target and on PATH): \
             run `make build`, or set TRAINBOOK_WORKER=/path/to/{NAME}",
            manifest.join("..").display()
        )
    })
}

/// Raises this process's soft limit of open files to its hard limit (once). A driver holds
/// two pipes and a log file per worker, and node 0 an event connection per rank of the job:
/// 1,024 ranks need over 3,000 descriptors, and the usual soft limit is 1,024 (the hard one
/// far higher), so a job of 1,024 ranks failed at its 333rd worker.
pub(crate) fn raise_open_file_limit() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        let (soft, hard) = open_file_limits();
        if soft < hard {
            set_open_file_limit(hard);
        }
    });
}

/// This process's soft and hard limits of open files.
fn open_file_limits() -> (libc::rlim_t, libc::rlim_t) {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit writes the struct passed, nothing else.
    unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) };
    (lim.rlim_cur, lim.rlim_max)
}

/// Sets the soft limit of open files (at most the hard one).
fn set_open_file_limit(soft: libc::rlim_t) {
    let (_, hard) = open_file_limits();
    let lim = libc::rlimit {
        rlim_cur: soft.min(hard),
        rlim_max: hard,
    };
    // SAFETY: setrlimit reads the struct passed, nothing else.
    unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &lim) };
}

/// What to say when a worker cannot start for want of file descriptors.
fn open_file_hint(e: &std::io::Error) -> String {
    if e.raw_os_error() != Some(libc::EMFILE) {
        return String::new();
    }
    format!(
        " This process may hold {} open files, and each worker takes three: raise the limit \\
         (`ulimit -n`, or LimitNOFILE= for a service) or start fewer workers on this node.",
        open_file_limits().0
    )
}

/// One worker to start.
#[derive(Clone)]
pub(crate) struct WorkerCommand {
    pub rank: usize,
    pub program: PathBuf,
    pub env: Vec<(String, String)>,
    pub cwd: PathBuf,
}

/// A line of raw worker output (stdout/stderr), so panics and libtorch aborts reach the user.
pub(crate) enum RawOutput {
    Line {
        rank: usize,
        stderr: bool,
        text: String,
    },
}

/// The running workers of one job.
pub(crate) struct Workers {
    children: Vec<Option<Child>>,
    /// The global rank of each child (this node's share of the job's ranks).
    ranks: Vec<usize>,
    pgid: Option<Pid>,
    /// The one thread that reads every worker's output (see [`read_lines`]).
    reader: Option<thread::JoinHandle<()>>,
    /// When every worker was last waited for on its own (see [`Workers::poll`]).
    scanned: Instant,
}

/// How a worker ended.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Exit {
    pub rank: usize,
    pub code: Option<i32>,
    pub signal: Option<i32>,
}

impl Exit {
    fn from_status(rank: usize, s: ExitStatus) -> Self {
        Self {
            rank,
            code: s.code(),
            signal: s.signal(),
        }
    }

    pub(crate) fn success(&self) -> bool {
        self.code == Some(0)
    }

    /// "exit code 1" / "killed by signal 9 (SIGKILL)".
    pub(crate) fn describe(&self) -> String {
        match (self.code, self.signal) {
            (Some(c), _) => format!("exit code {c}"),
            (None, Some(s)) => {
                let name = Signal::try_from(s)
                    .map(|s| s.as_str().to_string())
                    .unwrap_or_else(|_| "?".into());
                format!("killed by signal {s} ({name})")
            }
            _ => "unknown exit status".into(),
        }
    }
}

impl Workers {
    /// Starts every worker. Output lines go to `out`. If any worker cannot start, the ones
    /// already started are stopped and the error says which rank failed and why.
    pub(crate) fn spawn<F>(cmds: Vec<WorkerCommand>, out: F) -> Result<Self>
    where
        F: Fn(RawOutput) -> bool + Clone + Send + 'static,
    {
        let mut me = Workers {
            children: Vec::new(),
            ranks: Vec::new(),
            pgid: None,
            reader: None,
            scanned: Instant::now(),
        };
        let mut pipes = Vec::new();
        let parent = std::process::id() as i32;
        for wc in cmds {
            let mut cmd = Command::new(&wc.program);
            cmd.envs(wc.env.iter().map(|(k, v)| (k, v)))
                .current_dir(&wc.cwd)
                .stdin(Stdio::null())
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                // All workers of a job join the first one's process group.
                .process_group(me.pgid.map(|p| p.as_raw()).unwrap_or(0));
            // SAFETY: only async-signal-safe calls (prctl, getppid, sigprocmask, signal, _exit)
            // between fork and exec.
            unsafe {
                cmd.pre_exec(move || {
                    if libc::prctl(
                        libc::PR_SET_PDEATHSIG,
                        libc::SIGKILL as libc::c_ulong,
                        0,
                        0,
                        0,
                    ) != 0
                    {
                        return Err(std::io::Error::last_os_error());
                    }
                    // The parent may have died before prctl took effect.
                    if libc::getppid() != parent {
                        libc::_exit(1);
                    }
                    // Signal masks and ignored signals survive exec: a launcher that blocks
                    // SIGTERM (the CLI waits for signals on a helper thread) or a front end that
                    // ignores SIGINT must not pass that on, or workers could not be stopped.
                    let mut empty: libc::sigset_t = std::mem::zeroed();
                    libc::sigemptyset(&mut empty);
                    libc::sigprocmask(libc::SIG_SETMASK, &empty, std::ptr::null_mut());
                    libc::signal(libc::SIGTERM, libc::SIG_DFL);
                    libc::signal(libc::SIGINT, libc::SIG_DFL);
                    Ok(())
                });
            }
            let mut child = match cmd.spawn() {
                Ok(c) => c,
                Err(e) => {
                    me.stop(STOP_GRACE);
                    let hint = open_file_hint(&e);
                    if !hint.is_empty() {
                        bail!("worker {} could not start: {e}.{hint}", wc.rank);
                    }
                    bail!(
                        "worker {} could not start: {}: {e}. Check that the worker binary exists and \
                         is executable (set TRAINBOOK_WORKER to override it)",
                        wc.rank,
                        wc.program.display()
                    );
                }
            };
            if me.pgid.is_none() {
                me.pgid = Some(Pid::from_raw(child.id() as i32));
            }
            let rank = wc.rank;
            if let Some(so) = child.stdout.take() {
                pipes.push(Pipe::new(so.into(), rank, false));
            }
            if let Some(se) = child.stderr.take() {
                pipes.push(Pipe::new(se.into(), rank, true));
            }
            me.children.push(Some(child));
            me.ranks.push(rank);
        }
        // Read only once every worker is started: see `read_lines` on why one thread, started last.
        me.reader = Some(read_lines(pipes, out)?);
        Ok(me)
    }

    /// The process id of `rank`'s worker, while it runs on this node.
    pub(crate) fn pid_of(&self, rank: usize) -> Option<u32> {
        self.ranks
            .iter()
            .zip(&self.children)
            .find(|(r, _)| **r == rank)
            .and_then(|(_, c)| c.as_ref().map(|c| c.id()))
    }

    pub(crate) fn pids(&self) -> Vec<u32> {
        self.children.iter().flatten().map(|c| c.id()).collect()
    }

    /// Reaps workers that have exited since the last call. One wait for the job's process
    /// group, not one per worker: each wait is a system call in which the kernel walks every
    /// child of the process, so a wait per worker costs workers² (with 1,024 workers it was a
    /// quarter of the driver's CPU time). Workers that left the group (a program that calls
    /// setsid) are still found by a wait of their own, once a second.
    pub(crate) fn poll(&mut self) -> Vec<Exit> {
        let mut exits = Vec::new();
        if let Some(pgid) = self.pgid {
            let group = Pid::from_raw(-pgid.as_raw());
            loop {
                let (pid, code, signal) = match waitpid(group, Some(WaitPidFlag::WNOHANG)) {
                    Ok(WaitStatus::Exited(pid, code)) => (pid, Some(code), None),
                    Ok(WaitStatus::Signaled(pid, sig, _)) => (pid, None, Some(sig as i32)),
                    Ok(WaitStatus::StillAlive) | Err(_) => break,
                    Ok(_) => continue,
                };
                let found = self
                    .ranks
                    .iter()
                    .zip(self.children.iter_mut())
                    .find(|(_, c)| c.as_ref().is_some_and(|c| c.id() as i32 == pid.as_raw()));
                if let Some((&rank, slot)) = found {
                    *slot = None;
                    exits.push(Exit { rank, code, signal });
                }
            }
        }
        if self.scanned.elapsed() >= Duration::from_secs(1) || self.pgid.is_none() {
            self.scanned = Instant::now();
            for (&rank, slot) in self.ranks.iter().zip(self.children.iter_mut()) {
                if let Some(child) = slot {
                    if let Ok(Some(status)) = child.try_wait() {
                        exits.push(Exit::from_status(rank, status));
                        *slot = None;
                    }
                }
            }
        }
        exits
    }

    /// SIGKILLs one rank's worker and reaps it (a rank stuck after its work is done).
    pub(crate) fn kill_rank(&mut self, rank: usize) -> Option<Exit> {
        let (_, slot) = self
            .ranks
            .iter()
            .zip(self.children.iter_mut())
            .find(|(r, c)| **r == rank && c.is_some())?;
        let mut child = slot.take()?;
        let _ = child.kill();
        child.wait().ok().map(|s| Exit::from_status(rank, s))
    }

    pub(crate) fn all_exited(&self) -> bool {
        self.children.iter().all(|c| c.is_none())
    }

    /// SIGTERM to the whole group, SIGKILL after `grace`; reaps everything. Returns the exits
    /// that happened during the stop.
    pub(crate) fn stop(&mut self, grace: Duration) -> Vec<Exit> {
        let mut exits = self.poll();
        if self.all_exited() {
            return exits;
        }
        self.signal(Signal::SIGTERM);
        // A stopped worker (SIGSTOP, a debugger) acts on SIGTERM only once it runs again.
        self.signal(Signal::SIGCONT);
        let deadline = Instant::now() + grace;
        while Instant::now() < deadline && !self.all_exited() {
            thread::sleep(Duration::from_millis(20));
            exits.extend(self.poll());
        }
        if !self.all_exited() {
            self.signal(Signal::SIGKILL);
            for (&rank, slot) in self.ranks.iter().zip(self.children.iter_mut()) {
                if let Some(mut child) = slot.take() {
                    let _ = child.kill();
                    if let Ok(status) = child.wait() {
                        exits.push(Exit::from_status(rank, status));
                    }
                }
            }
        }
        exits
    }

    fn signal(&self, sig: Signal) {
        if let Some(pgid) = self.pgid {
            let _ = killpg(pgid, sig);
        }
        for child in self.children.iter().flatten() {
            let _ = nix::sys::signal::kill(Pid::from_raw(child.id() as i32), sig);
        }
    }

    /// Waits for the output reader to drain (call after every worker exited).
    pub(crate) fn join_readers(&mut self, timeout: Duration) {
        let deadline = Instant::now() + timeout;
        if let Some(r) = self.reader.take() {
            while !r.is_finished() && Instant::now() < deadline {
                thread::sleep(Duration::from_millis(5));
            }
            if r.is_finished() {
                let _ = r.join();
            } else {
                self.reader = Some(r);
            }
        }
    }
}

impl Drop for Workers {
    fn drop(&mut self) {
        if !self.all_exited() {
            self.stop(STOP_GRACE);
        }
    }
}

/// One worker's stdout or stderr, and the part of a line read so far.
struct Pipe {
    file: File,
    rank: usize,
    stderr: bool,
    pending: Vec<u8>,
}

impl Pipe {
    fn new(fd: OwnedFd, rank: usize, stderr: bool) -> Self {
        Pipe {
            file: File::from(fd),
            rank,
            stderr,
            pending: Vec::new(),
        }
    }

    fn emit<F: Fn(RawOutput) -> bool>(&self, line: &[u8], out: &F) -> bool {
        let text = String::from_utf8_lossy(line)
            .trim_end_matches(['\n', '\r'])
            .to_string();
        out(RawOutput::Line {
            rank: self.rank,
            stderr: self.stderr,
            text,
        })
    }

    /// Adds what was read and hands on every complete line; false once nobody listens.
    fn take<F: Fn(RawOutput) -> bool>(&mut self, bytes: &[u8], out: &F) -> bool {
        self.pending.extend_from_slice(bytes);
        let mut start = 0;
        while let Some(n) = self.pending[start..].iter().position(|&b| b == b'\n') {
            if !self.emit(&self.pending[start..=start + n], out) {
                return false;
            }
            start += n + 1;
        }
        self.pending.drain(..start);
        true
    }

    /// At the end of the output: its last line, when it had no newline.
    fn finish<F: Fn(RawOutput) -> bool>(&self, out: &F) -> bool {
        self.pending.is_empty() || self.emit(&self.pending, out)
    }
}

/// Reads every worker's stdout and stderr line by line in one thread (poll(2)) until all of
/// them are closed or `out` says nobody listens. One thread, not one per pipe: a fork copies
/// the page tables of the driver's process, threads' stacks included, so every thread that
/// exists while workers are started makes each later start slower (fork and exec measured here:
/// 2.4 ms in a process without threads, 39 ms with 2,000 idle ones; 1,024 workers with two
/// reader threads each took 35–46 s to start). Started after the last worker for that reason.
fn read_lines<F>(mut pipes: Vec<Pipe>, out: F) -> Result<thread::JoinHandle<()>>
where
    F: Fn(RawOutput) -> bool + Send + 'static,
{
    thread::Builder::new()
        .name("trainbook-output".into())
        .spawn(move || {
            let mut buf = vec![0u8; 64 * 1024];
            while !pipes.is_empty() {
                let mut fds: Vec<libc::pollfd> = pipes
                    .iter()
                    .map(|p| libc::pollfd {
                        fd: p.file.as_raw_fd(),
                        events: libc::POLLIN,
                        revents: 0,
                    })
                    .collect();
                // SAFETY: `fds` is a valid array of `fds.len()` pollfd structs, alive for the call.
                let ready = unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, -1) };
                if ready < 0 {
                    if std::io::Error::last_os_error().kind() == std::io::ErrorKind::Interrupted {
                        continue;
                    }
                    return;
                }
                let mut closed = Vec::new();
                let ready = fds.iter().enumerate().filter(|(_, fd)| fd.revents != 0);
                for i in ready.map(|(i, _)| i) {
                    // Readable, or closed (POLLHUP): a read returns what is left, then 0.
                    match pipes[i].file.read(&mut buf) {
                        Ok(0) => closed.push(i),
                        Ok(n) => {
                            if !pipes[i].take(&buf[..n], &out) {
                                return;
                            }
                        }
                        Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                        Err(_) => closed.push(i),
                    }
                }
                for i in closed.into_iter().rev() {
                    if !pipes.remove(i).finish(&out) {
                        return;
                    }
                }
            }
        })
        .context("spawning the output reader thread")
}

/// True if a process with this pid exists and is not a zombie.
pub fn process_alive(pid: u32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(stat) => {
            // Field 3, after the parenthesised command name, is the state.
            let state = stat
                .rsplit_once(')')
                .and_then(|(_, rest)| rest.split_whitespace().next());
            !matches!(state, Some("Z") | Some("X") | None)
        }
        Err(_) => false,
    }
}

/// The pids whose parent is `pid` (from /proc): a launcher's workers, for tools and tests that
/// check none is left behind.
pub fn children_of(pid: u32) -> Vec<u32> {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .flatten()
        .filter_map(|e| e.file_name().to_string_lossy().parse::<u32>().ok())
        .filter(|p| {
            std::fs::read_to_string(format!("/proc/{p}/stat"))
                .ok()
                .and_then(|stat| {
                    // Field 4, after the parenthesised command name and the state.
                    let (_, rest) = stat.rsplit_once(')')?;
                    rest.split_whitespace().nth(1)?.parse::<u32>().ok()
                })
                == Some(pid)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;
    use std::sync::mpsc;

    /// Four workers running the shell script `body` (with RANK set), their output sent to
    /// `out`; and the folder that holds the script (remove it at the end).
    fn four_workers(
        name: &str,
        body: &str,
        out: impl Fn(RawOutput) -> bool + Clone + Send + 'static,
    ) -> (Workers, PathBuf) {
        let dir = std::env::temp_dir().join(format!("trainbook-{name}-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let program = dir.join("worker.sh");
        std::fs::write(&program, format!("#!/bin/sh\n{body}")).unwrap();
        std::fs::set_permissions(&program, std::fs::Permissions::from_mode(0o755)).unwrap();
        let cmds: Vec<WorkerCommand> = (0..4)
            .map(|rank| WorkerCommand {
                rank,
                program: program.clone(),
                env: vec![("RANK".into(), rank.to_string())],
                cwd: dir.clone(),
            })
            .collect();
        (Workers::spawn(cmds, out).unwrap(), dir)
    }

    /// Polls until every worker has exited; their exits.
    fn reap(workers: &mut Workers) -> Vec<Exit> {
        let mut exits = Vec::new();
        let deadline = Instant::now() + Duration::from_secs(30);
        while !workers.all_exited() && Instant::now() < deadline {
            exits.extend(workers.poll());
            thread::sleep(Duration::from_millis(10));
        }
        exits
    }

    #[test]
    fn one_reader_hands_on_every_line_of_every_worker_in_order() {
        // 3,000 numbered lines on stdout (more than a pipe holds), one line on stderr, and a
        // last stdout line without a newline.
        let (tx, rx) = mpsc::channel();
        let (mut workers, dir) = four_workers(
            "output",
            "i=1\nwhile [ $i -le 3000 ]; do echo \"line $i of rank $RANK\"; i=$((i+1)); done\n\
             echo \"warning from $RANK\" >&2\nprintf 'no newline'\n",
            move |o| tx.send(o).is_ok(),
        );
        reap(&mut workers);
        workers.join_readers(Duration::from_secs(10));
        let mut lines: Vec<Vec<String>> = vec![Vec::new(); 4];
        let mut errors: Vec<Vec<String>> = vec![Vec::new(); 4];
        for RawOutput::Line { rank, stderr, text } in rx.try_iter() {
            let to = if stderr { &mut errors } else { &mut lines };
            to[rank].push(text);
        }
        for rank in 0..4 {
            let mut want: Vec<String> = (1..=3000)
                .map(|i| format!("line {i} of rank {rank}"))
                .collect();
            want.push("no newline".into());
            assert_eq!(lines[rank], want, "rank {rank}'s stdout");
            assert_eq!(errors[rank], vec![format!("warning from {rank}")]);
        }
        std::fs::remove_dir_all(&dir).ok();
    }

    #[test]
    fn exits_are_reaped_with_their_codes_and_signals() {
        let (mut workers, dir) = four_workers(
            "exits",
            "case $RANK in 0) exit 0;; 1) exit 3;; 2) kill -9 $$;; *) sleep 0.3; exit 7;; esac\n",
            |_| true,
        );
        let mut exits = reap(&mut workers);
        exits.sort_by_key(|e| e.rank);
        let seen: Vec<(usize, Option<i32>, Option<i32>)> =
            exits.iter().map(|e| (e.rank, e.code, e.signal)).collect();
        assert_eq!(
            seen,
            vec![
                (0, Some(0), None),
                (1, Some(3), None),
                (2, None, Some(9)),
                (3, Some(7), None)
            ]
        );
        std::fs::remove_dir_all(&dir).ok();
    }

    #[test]
    fn the_soft_limit_of_open_files_is_raised_and_running_out_is_explained() {
        // Lowering this process's limit here would starve the tests running beside it; the
        // raise from a lower soft limit is checked by bench/driver_load.sh (docs/benchmarks.md).
        raise_open_file_limit();
        let (soft, hard) = open_file_limits();
        assert_eq!(soft, hard);
        let err = std::io::Error::from_raw_os_error(libc::EMFILE);
        assert!(open_file_hint(&err).contains(&format!("may hold {soft} open files")));
        assert!(open_file_hint(&err).contains("ulimit -n"));
        assert_eq!(
            open_file_hint(&std::io::Error::from_raw_os_error(libc::ENOENT)),
            ""
        );
    }
}
