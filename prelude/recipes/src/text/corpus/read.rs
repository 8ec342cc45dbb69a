//! What every corpus reader shares: where a reader puts each text ([`Push`]), the error for a
//! table without the text column, and a directory's files of some kinds.

use std::path::{Path, PathBuf};

use anyhow::{anyhow, Context, Result};

/// Where a reader puts each text it reads, with the byte offset in its file where the text
/// ends (what progress and resuming count by).
pub(crate) type Push<'a> = dyn FnMut(String, u64) -> Result<()> + 'a;

/// A table at `path` with the columns `names` has no `column`.
pub(crate) fn missing_column(path: &Path, names: &[&str], column: &str) -> anyhow::Error {
    anyhow!(
        "{} has no column '{column}': its columns are {}; choose one with text_column",
        path.display(),
        names.join(", ")
    )
}

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
