//! The Rust toolchain that compiles cells, asked once when the kernel starts, and the process
//! environment that makes evcxr's first compile the one cells reuse.
//!
//! Two costs of a kernel start are set by the environment, not by code:
//! - evcxr and the rust-analyzer inside it start `cargo` and `rustc` about thirty times while
//!   a kernel starts. Through rustup's proxies every start is two processes; with the
//!   toolchain's own `bin/` first on `PATH` it is one (the same toolchain: the proxy's choice
//!   is read once, here).
//! - evcxr compiles a first cell (`42`) before the kernel can pass it any setting, and the
//!   prelude's flags then change every compile's fingerprint, so the prelude's first cell was
//!   built from scratch a second time. With the cell flags already in the kernel's environment
//!   the first compile uses them, and the prelude's cell is an incremental one.
//!
//! The cell process gets the user's `PATH` and no cell flags back (see `evaluator/context.rs`), so
//! code in a cell that runs `cargo +nightly` or `cargo build` behaves as in a terminal.

use anyhow::{Context, Result, bail};
use std::ffi::OsString;
use std::path::PathBuf;
use std::process::Command;

#[derive(Clone, Debug)]
pub struct Toolchain {
    /// `rustc --print sysroot`.
    pub sysroot: PathBuf,
    /// `<sysroot>/lib/rustlib/<host>/lib`, where the `libstd-*.so` cells link lives.
    pub target_libdir: PathBuf,
    /// `1.95.0`.
    pub version: String,
    /// `PATH` as the kernel was started with it.
    pub user_path: Option<OsString>,
}

impl Toolchain {
    /// Asks the `rustc` on `PATH` (rustup's proxy, when there is one) where its toolchain is.
    pub fn find() -> Result<Toolchain> {
        let out = Command::new("rustc")
            .args(["--print", "sysroot", "--print", "target-libdir"])
            .output()
            .context(
                "cannot run `rustc`: the kernel compiles cells with it; install Rust (rustup)",
            )?;
        if !out.status.success() {
            bail!(
                "`rustc --print sysroot` failed: {}",
                String::from_utf8_lossy(&out.stderr).trim()
            );
        }
        let text = String::from_utf8_lossy(&out.stdout);
        let mut lines = text.lines().map(str::trim);
        let (Some(sysroot), Some(libdir)) = (lines.next(), lines.next()) else {
            bail!("`rustc --print sysroot --print target-libdir` printed {text:?}");
        };
        let sysroot = PathBuf::from(sysroot);
        let rustc = sysroot.join("bin/rustc");
        let version = Command::new(&rustc)
            .arg("--version")
            .output()
            .ok()
            .and_then(|o| {
                String::from_utf8_lossy(&o.stdout)
                    .split_whitespace()
                    .nth(1)
                    .map(str::to_string)
            })
            .unwrap_or_else(|| "unknown".into());
        Ok(Toolchain {
            sysroot,
            target_libdir: PathBuf::from(libdir),
            version,
            user_path: std::env::var_os("PATH"),
        })
    }

    /// `PATH` for the compilers' side of the kernel: the toolchain's `bin/` first.
    fn compiler_path(&self) -> Result<OsString> {
        let mut dirs = vec![self.sysroot.join("bin")];
        if let Some(p) = &self.user_path {
            dirs.extend(std::env::split_paths(p));
        }
        Ok(std::env::join_paths(dirs)?)
    }

    /// Sets this process's environment for evcxr: the toolchain's `bin/` first on `PATH`, and
    /// the cell flags (`CARGO_ENCODED_RUSTFLAGS`, which cargo prefers to the `RUSTFLAGS` evcxr
    /// sets) when there are any.
    ///
    /// # Safety
    /// Must run before the process starts a thread (it changes the environment).
    pub unsafe fn apply(&self, cell_rustflags: Option<&str>) -> Result<()> {
        let path = self.compiler_path()?;
        unsafe {
            std::env::set_var("PATH", path);
            match cell_rustflags {
                Some(flags) => std::env::set_var("CARGO_ENCODED_RUSTFLAGS", flags),
                None => std::env::remove_var("CARGO_ENCODED_RUSTFLAGS"),
            }
        }
        Ok(())
    }

    /// The user's environment back, for a child that runs user code.
    pub fn restore_user_env(&self, cmd: &mut Command) {
        match &self.user_path {
            Some(p) => cmd.env("PATH", p),
            None => cmd.env_remove("PATH"),
        };
        cmd.env_remove("CARGO_ENCODED_RUSTFLAGS");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_the_toolchain_that_builds_trainbook() {
        let t = Toolchain::find().unwrap();
        assert!(t.sysroot.join("bin/rustc").is_file(), "{t:?}");
        assert!(t.target_libdir.starts_with(&t.sysroot), "{t:?}");
        let std_so = std::fs::read_dir(&t.target_libdir)
            .unwrap()
            .flatten()
            .any(|e| e.file_name().to_string_lossy().starts_with("libstd-"));
        assert!(std_so, "no libstd-*.so in {}", t.target_libdir.display());
        assert!(t.version.split('.').count() == 3, "{t:?}");
    }

    #[test]
    fn compiler_path_puts_the_toolchain_first_and_keeps_the_rest() {
        let t = Toolchain {
            sysroot: "/opt/rust".into(),
            target_libdir: "/opt/rust/lib/rustlib/x/lib".into(),
            version: "1.0.0".into(),
            user_path: Some("/usr/bin:/bin".into()),
        };
        assert_eq!(t.compiler_path().unwrap(), "/opt/rust/bin:/usr/bin:/bin");
        let mut cmd = Command::new("true");
        t.restore_user_env(&mut cmd);
        let envs: Vec<_> = cmd.get_envs().collect();
        assert!(envs.contains(&("PATH".as_ref(), Some("/usr/bin:/bin".as_ref()))));
        assert!(envs.contains(&("CARGO_ENCODED_RUSTFLAGS".as_ref(), None)));
    }
}
