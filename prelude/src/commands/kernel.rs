//! `trainbook kernel ...`: the Jupyter kernel's own program, run in this one's place.

use std::path::PathBuf;

use clap::Args;

/// Everything after `trainbook kernel`, for `trainbook-kernel`.
#[derive(Args, Debug)]
pub struct KernelArgs {
    #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
    pub args: Vec<std::ffi::OsString>,
}

/// Hands `trainbook kernel ...` to the `trainbook-kernel` program, which sits next to this one.
/// The kernel is its own binary because it carries the Rust compiler front end (evcxr) and must
/// not link trainbook itself (cells load trainbook as a shared library).
pub(super) fn run(args: &[std::ffi::OsString]) -> i32 {
    use std::os::unix::process::CommandExt;
    const NAME: &str = "trainbook-kernel";
    let beside = std::env::current_exe()
        .ok()
        .and_then(|e| e.canonicalize().ok())
        .and_then(|e| e.parent().map(|d| d.join(NAME)))
        .filter(|p| p.is_file());
    let program = beside.unwrap_or_else(|| PathBuf::from(NAME));
    let err = std::process::Command::new(&program).args(args).exec();
    eprintln!(
        "error: cannot run {}: {err}; build it with `make build` (it is built next to `trainbook`)",
        program.display()
    );
    1
}
