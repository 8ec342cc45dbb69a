//! Crash-safe files: everything is written beside its destination under a temporary name and
//! renamed into place, so a reader never sees half a checkpoint.

use std::io::Write;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result};

/// `dir/.name.tmp-<pid>` beside `path`.
pub fn temp_path(path: &Path) -> PathBuf {
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    path.with_file_name(format!(".{name}.tmp-{}", std::process::id()))
}

pub fn write_atomic(path: &Path, bytes: &[u8]) -> Result<()> {
    let tmp = temp_path(path);
    {
        let mut f =
            std::fs::File::create(&tmp).with_context(|| format!("creating {}", tmp.display()))?;
        f.write_all(bytes)
            .with_context(|| format!("writing {}", tmp.display()))?;
        f.sync_all().ok();
    }
    std::fs::rename(&tmp, path)
        .with_context(|| format!("renaming {} to {}", tmp.display(), path.display()))
}

/// Fills a fresh directory through `fill`, then renames it to `dir` (replacing an old one).
pub fn write_dir_atomic(dir: &Path, fill: impl FnOnce(&Path) -> Result<()>) -> Result<()> {
    let tmp = temp_path(dir);
    if tmp.exists() {
        std::fs::remove_dir_all(&tmp).ok();
    }
    std::fs::create_dir_all(&tmp).with_context(|| format!("creating {}", tmp.display()))?;
    if let Err(e) = fill(&tmp) {
        std::fs::remove_dir_all(&tmp).ok();
        return Err(e);
    }
    if dir.exists() {
        std::fs::remove_dir_all(dir).with_context(|| format!("replacing {}", dir.display()))?;
    }
    std::fs::rename(&tmp, dir)
        .with_context(|| format!("renaming {} to {}", tmp.display(), dir.display()))
}
