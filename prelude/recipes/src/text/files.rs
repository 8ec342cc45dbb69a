//! Listing a directory's files by kind: what the corpus readers and the HDF5 shards share.

use std::path::{Path, PathBuf};

use anyhow::{Context, Result};

/// The files of `dir` whose extension is one of `extensions` (any case), in name order.
pub(crate) fn files_with_extensions(dir: &Path, extensions: &[&str]) -> Result<Vec<PathBuf>> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
        .with_context(|| format!("reading the directory {}", dir.display()))?
        .flatten()
        .map(|e| e.path())
        .filter(|p| {
            p.is_file()
                && p.extension()
                    .and_then(|e| e.to_str())
                    .is_some_and(|e| extensions.contains(&e.to_ascii_lowercase().as_str()))
        })
        .collect();
    files.sort();
    Ok(files)
}
