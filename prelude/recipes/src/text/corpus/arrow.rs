//! Arrow IPC files and the directories Hugging Face `datasets` writes with `save_to_disk`.
//!
//! A saved `Dataset` is a directory with `state.json` (its `.arrow` files, in order, under
//! `_data_files`), `dataset_info.json` and the files themselves, each an Arrow IPC *stream*; a
//! saved `DatasetDict` is a directory with `dataset_dict.json` (its split names) and a
//! directory per split. The files are read one record batch at a time (datasets writes batches
//! of about a thousand rows), only the text column decoded, so memory stays bounded whatever
//! the file size.

use std::cell::Cell;
use std::io::{BufReader, Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};
use std::rc::Rc;

use anyhow::{anyhow, bail, Context, Result};
use polars_arrow::array::{Array, Utf8Array, Utf8ViewArray};
use polars_arrow::datatypes::ArrowSchema;
use polars_arrow::io::ipc::read::{
    read_file_metadata, read_stream_metadata, FileReader, StreamReader, StreamState,
};

use super::read::{missing_column, Push};

/// The split a `DatasetDict` is read from (the one pre-training reads; a job holds out its
/// own evaluation share).
const SPLIT: &str = "train";

/// Whether `dir` is a directory written by `datasets`' `save_to_disk`.
pub fn is_hf_dataset(dir: &Path) -> bool {
    dir.join("state.json").is_file() || dir.join("dataset_dict.json").is_file()
}

/// The `.arrow` files of a saved `Dataset`, in its order; of a `DatasetDict`, those of its
/// `train` split.
pub fn hf_dataset_files(dir: &Path) -> Result<Vec<PathBuf>> {
    let dict = dir.join("dataset_dict.json");
    if dict.is_file() {
        let splits = read_json(&dict)?;
        let names: Vec<String> = splits["splits"]
            .as_array()
            .map(|a| {
                a.iter()
                    .filter_map(|s| s.as_str().map(String::from))
                    .collect()
            })
            .unwrap_or_default();
        if !names.iter().any(|n| n == SPLIT) {
            bail!(
                "{} is a datasets DatasetDict with the splits {} and no '{SPLIT}': give the directory of the split to read, e.g. {}",
                dir.display(),
                names.join(", "),
                dir.join(names.first().map(String::as_str).unwrap_or("SPLIT")).display()
            );
        }
        return hf_dataset_files(&dir.join(SPLIT));
    }
    let state_path = dir.join("state.json");
    let state = read_json(&state_path)?;
    let files: Vec<PathBuf> = state["_data_files"]
        .as_array()
        .ok_or_else(|| {
            anyhow!(
                "{} has no '_data_files' list: is {} a directory written by datasets' save_to_disk?",
                state_path.display(),
                dir.display()
            )
        })?
        .iter()
        .map(|f| f["filename"].as_str().map(|name| dir.join(name)))
        .collect::<Option<_>>()
        .ok_or_else(|| {
            anyhow!(
                "{}: an entry of '_data_files' has no filename",
                state_path.display()
            )
        })?;
    if let Some(missing) = files.iter().find(|f| !f.is_file()) {
        bail!(
            "{} is missing {}, which its state.json lists: copy the whole directory save_to_disk wrote",
            dir.display(),
            missing.display()
        );
    }
    if files.is_empty() {
        bail!("{} lists no data files in its state.json", dir.display());
    }
    Ok(files)
}

fn read_json(path: &Path) -> Result<serde_json::Value> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    serde_json::from_str(&text).with_context(|| format!("{} is not JSON", path.display()))
}

/// A reader that counts the bytes it has passed (progress is reported in bytes of input).
struct Counted<R> {
    inner: R,
    pos: Rc<Cell<u64>>,
}

impl<R: Read> Read for Counted<R> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.pos.set(self.pos.get() + n as u64);
        Ok(n)
    }
}

impl<R: Seek> Seek for Counted<R> {
    fn seek(&mut self, to: SeekFrom) -> std::io::Result<u64> {
        let at = self.inner.seek(to)?;
        self.pos.set(at);
        Ok(at)
    }
}

/// The IPC file format starts with this magic; the stream format (what datasets writes) with
/// a message length.
const FILE_MAGIC: &[u8; 6] = b"ARROW1";

/// The `column` strings of an Arrow IPC file or stream, record batch by record batch; nulls
/// are skipped, as the table readers skip them.
pub fn read_arrow(path: &Path, column: &str, push: &mut Push) -> Result<()> {
    let context = || format!("reading {} (Arrow IPC)", path.display());
    let pos = Rc::new(Cell::new(0));
    let mut reader = Counted {
        inner: BufReader::with_capacity(1 << 20, std::fs::File::open(path).with_context(context)?),
        pos: pos.clone(),
    };
    let mut magic = [0u8; 6];
    let is_file = reader.read_exact(&mut magic).is_ok() && &magic == FILE_MAGIC;
    reader.seek(SeekFrom::Start(0)).with_context(context)?;
    let not_arrow = |e: polars::prelude::PolarsError| {
        anyhow!(
            "{} is not an Arrow IPC stream or file ({e}): give the .arrow files datasets' save_to_disk wrote, or its directory",
            path.display()
        )
    };
    let mut each_batch = |schema: &ArrowSchema, arrays: &[Box<dyn Array>]| -> Result<()> {
        push_strings(path, schema, column, arrays[0].as_ref(), pos.get(), push)
    };
    if is_file {
        let meta = read_file_metadata(&mut reader).map_err(not_arrow)?;
        let schema = meta.schema.clone();
        let index = column_index(path, &schema, column)?;
        for batch in FileReader::new(reader, meta, Some(vec![index]), None) {
            each_batch(&schema, batch.with_context(context)?.arrays())?;
        }
        return Ok(());
    }
    let meta = read_stream_metadata(&mut reader).map_err(not_arrow)?;
    let schema = meta.schema.clone();
    let index = column_index(path, &schema, column)?;
    for state in StreamReader::new(reader, meta, Some(vec![index])) {
        match state.with_context(context)? {
            StreamState::Some(batch) => each_batch(&schema, batch.arrays())?,
            // The end of the file without the stream's end marker: the data has ended.
            StreamState::Waiting => break,
        }
    }
    Ok(())
}

fn column_index(path: &Path, schema: &ArrowSchema, column: &str) -> Result<usize> {
    schema.index_of(column).ok_or_else(|| {
        let names: Vec<&str> = schema.iter_names().map(|n| n.as_str()).collect();
        missing_column(path, &names, column)
    })
}

fn push_strings(
    path: &Path,
    schema: &ArrowSchema,
    column: &str,
    array: &dyn Array,
    pos: u64,
    push: &mut Push,
) -> Result<()> {
    let any = array.as_any();
    if let Some(a) = any.downcast_ref::<Utf8Array<i32>>() {
        a.iter()
            .flatten()
            .try_for_each(|t| push(t.to_string(), pos))
    } else if let Some(a) = any.downcast_ref::<Utf8Array<i64>>() {
        a.iter()
            .flatten()
            .try_for_each(|t| push(t.to_string(), pos))
    } else if let Some(a) = any.downcast_ref::<Utf8ViewArray>() {
        a.iter()
            .flatten()
            .try_for_each(|t| push(t.to_string(), pos))
    } else {
        let dtype = schema
            .get(column)
            .map(|f| format!("{:?}", f.dtype))
            .unwrap_or_default();
        bail!(
            "column '{column}' of {} holds {dtype}, not text: choose the text column with text_column",
            path.display()
        )
    }
}
