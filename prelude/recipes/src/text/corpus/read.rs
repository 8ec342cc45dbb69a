//! What every corpus reader shares: where a reader puts each text ([`Push`]), the error for a
//! table without the text column, and a directory's files of some kinds.

use std::path::Path;

use anyhow::{anyhow, Result};

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
