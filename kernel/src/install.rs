//! `trainbook kernel install`: writes the Jupyter kernelspec, after checking that the prelude
//! really loads into a cell (so a broken build fails here, not in a user's first cell).

use anyhow::{Context, Result, bail};
use serde_json::json;
use std::path::{Path, PathBuf};

#[derive(Clone, Debug)]
pub enum Target {
    /// `~/.local/share/jupyter` (or `$JUPYTER_DATA_DIR`).
    User,
    /// The active Python environment: `$VIRTUAL_ENV`, else `python3`'s `sys.prefix`.
    SysPrefix,
    /// `<prefix>/share/jupyter`.
    Prefix(PathBuf),
}

/// Jupyter's per-user data directory, as `jupyter --data-dir` prints it on Linux.
pub fn user_data_dir() -> Option<PathBuf> {
    let env = |k: &str| {
        std::env::var_os(k)
            .filter(|v| !v.is_empty())
            .map(PathBuf::from)
    };
    env("JUPYTER_DATA_DIR")
        .or_else(|| env("XDG_DATA_HOME").map(|d| d.join("jupyter")))
        .or_else(|| env("HOME").map(|h| h.join(".local/share/jupyter")))
}

/// The `share/jupyter` directory a target means.
pub fn data_dir(target: &Target) -> Result<PathBuf> {
    Ok(match target {
        Target::User => {
            user_data_dir().context("HOME is not set; use --prefix to say where to install")?
        }
        Target::SysPrefix => {
            let prefix = match std::env::var_os("VIRTUAL_ENV") {
                Some(v) => PathBuf::from(v),
                None => {
                    let out = std::process::Command::new("python3")
                        .args(["-c", "import sys; print(sys.prefix)"])
                        .output()
                        .context(
                            "--sys-prefix asks python3 for its prefix, and python3 did not run; \
                             activate the environment Jupyter runs in, or use --prefix",
                        )?;
                    PathBuf::from(String::from_utf8_lossy(&out.stdout).trim())
                }
            };
            prefix.join("share/jupyter")
        }
        Target::Prefix(p) => p.join("share/jupyter"),
    })
}

/// Writes `<data dir>/kernels/<name>/kernel.json`; returns the kernelspec directory.
pub fn write_kernelspec(
    target: &Target,
    name: &str,
    display_name: &str,
    kernel_exe: &Path,
) -> Result<PathBuf> {
    if name.is_empty()
        || !name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "._-".contains(c))
    {
        bail!("kernel name {name:?} is not allowed: use letters, digits, '.', '_' or '-'");
    }
    let dir = data_dir(target)?.join("kernels").join(name);
    std::fs::create_dir_all(&dir)
        .with_context(|| format!("cannot create {} (try --user)", dir.display()))?;
    let spec = json!({
        "argv": [kernel_exe, "run", "--connection-file", "{connection_file}"],
        "display_name": display_name,
        "language": "rust",
        // Interrupts arrive as messages, so the kernel can stop jobs and keep variables
        // instead of being signalled.
        "interrupt_mode": "message",
        "metadata": { "trainbook": { "version": env!("CARGO_PKG_VERSION") } },
    });
    let tmp = dir.join(".kernel.json.tmp");
    std::fs::write(&tmp, serde_json::to_string_pretty(&spec)? + "\n")
        .with_context(|| format!("cannot write {}", tmp.display()))?;
    std::fs::rename(&tmp, dir.join("kernel.json"))?;
    Ok(dir)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kernelspec_is_written_atomically_with_message_interrupts() {
        let d = std::env::temp_dir().join(format!("tb-kspec-{}", std::process::id()));
        let dir = write_kernelspec(
            &Target::Prefix(d.clone()),
            "trainbook",
            "Rust (trainbook)",
            Path::new("/x/trainbook-kernel"),
        )
        .unwrap();
        assert_eq!(dir, d.join("share/jupyter/kernels/trainbook"));
        let spec: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(dir.join("kernel.json")).unwrap())
                .unwrap();
        assert_eq!(spec["interrupt_mode"], "message");
        assert_eq!(spec["language"], "rust");
        assert_eq!(spec["argv"][3], "{connection_file}");
        assert!(!dir.join(".kernel.json.tmp").exists());
        assert!(write_kernelspec(&Target::Prefix(d.clone()), "a b", "x", Path::new("/x")).is_err());
        let _ = std::fs::remove_dir_all(d);
    }
}
