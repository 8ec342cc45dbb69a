//! evcxr's evaluation context, and the environment of the cell process it starts.

use super::{ChildSetup, timing};
use crate::verdict;
use anyhow::{Context, Result};
use evcxr::{CommandContext, EvalContext, EvalContextOutputs};
use std::os::unix::process::CommandExt;
use std::process::Command;
use std::time::Instant;

/// evcxr's context with the cell flags set and, when there is a prelude, [`init_code`] run
/// (the same compile that applies the flags). A failed init is returned, not fatal.
pub(super) fn create_context(setup: &ChildSetup) -> Result<(CommandContext, EvalContextOutputs)> {
    let exe = std::env::current_exe().context("cannot locate this executable")?;
    let mut cmd = Command::new(exe);
    cmd.env(trainbook_channel::SOCKET_ENV, &setup.channel_socket)
        .env(verdict::CELL_PROCESS_ENV, "1")
        // anyhow errors would otherwise carry a backtrace (evcxr sets RUST_BACKTRACE=1).
        .env("RUST_LIB_BACKTRACE", "0")
        // The user's own setting, which the cell process puts back (verdict.rs).
        .env(
            verdict::USER_BACKTRACE_ENV,
            std::env::var_os("RUST_BACKTRACE").unwrap_or_default(),
        );
    if let Some(t) = &setup.toolchain {
        t.restore_user_env(&mut cmd);
    }
    if let Some(p) = &setup.prelude {
        let std_dir = setup.toolchain.as_ref().map(|t| t.target_libdir.as_path());
        cmd.env("LD_LIBRARY_PATH", p.library_path(std_dir)?)
            .env("TRAINBOOK_TORCH_DYLIB", &p.dylib);
        if let Some(w) = &p.worker {
            cmd.env("TRAINBOOK_WORKER", w);
        }
    }
    // The cell process (and, through their own death signal, its jobs' workers) must not outlive
    // the kernel, even a SIGKILLed one. The signal follows the spawning thread, which is this
    // long-lived evaluator thread for the first start and for every restart evcxr does.
    unsafe {
        cmd.pre_exec(|| {
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let t = Instant::now();
    let (mut eval, outputs) = EvalContext::with_subprocess_command(cmd)
        .map_err(|e| anyhow::anyhow!("{e}"))
        .context("evcxr could not start its Rust process")?;
    timing("evcxr context", t);
    let mut state = eval.state();
    // Cells build offline: no registry round trip per cell, and kernels on machines without a
    // network work; `:dep` takes crates from cargo's cache.
    state.set_offline_mode(true);
    // Commits the settings without a compile. The cell flags are in this process's environment
    // already (`toolchain.rs`), so evcxr's first compile used them too.
    eval.eval_with_state("", state)
        .map_err(|e| anyhow::anyhow!("{e}"))?;
    Ok((CommandContext::with_eval_context(eval), outputs))
}
