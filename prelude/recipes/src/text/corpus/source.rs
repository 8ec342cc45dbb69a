//! Reading a corpus as a stream of texts, in bounded memory whatever its size.
//!
//! The texts, their order and what is skipped are exactly those of
//! [`crate::text::wordpiece::read_texts`] (which reads a whole file into memory): `.txt` gives
//! a text per non-empty line; tables give their text column's non-null values. Only the reading
//! differs: lines are read one at a time, JSON lines one at a time, CSV in chunks cut at record
//! boundaries, parquet in row slices.

use std::io::{BufRead, BufReader, Read};
use std::path::{Path, PathBuf};

use anyhow::{anyhow, bail, Context, Result};
use polars::prelude::*;

use super::arrow::{hf_dataset_files, is_hf_dataset, read_arrow};
use super::read::{missing_column, Push};
use crate::text::files::files_with_extensions;

/// File types a corpus is read from.
pub const CORPUS_EXTENSIONS: &[&str] = &[
    "txt", "parquet", "csv", "tsv", "jsonl", "ndjson", "json", "arrow",
];

/// Rows of a parquet file read at a time.
const PARQUET_ROWS: usize = 65_536;
/// Bytes of a CSV file parsed at a time (cut at a record boundary).
const CSV_CHUNK: usize = 8 << 20;

/// The files of a corpus, in reading order, and the text column of its tables.
#[derive(Clone, Debug)]
pub struct Corpus {
    pub files: Vec<PathBuf>,
    pub column: String,
}

impl Corpus {
    /// A file, a directory `datasets`' `save_to_disk` wrote, or every corpus file of a
    /// directory in name order, else every saved dataset among its subdirectories in name
    /// order (e.g. Wikipedia and BookCorpus side by side).
    pub fn open(path: &Path, column: &str) -> Result<Self> {
        let files = if path.is_file() {
            vec![path.to_path_buf()]
        } else if is_hf_dataset(path) {
            hf_dataset_files(path)?
        } else if path.is_dir() {
            let mut files = files_with_extensions(path, CORPUS_EXTENSIONS)?;
            if files.is_empty() {
                for dir in saved_datasets(path)? {
                    files.extend(hf_dataset_files(&dir)?);
                }
            }
            if files.is_empty() && crate::text::hdf5_shards::is_hdf5_dir(path) {
                bail!(
                    "{} holds HDF5 pre-training shards, which are tokenised and masked already: train on them directly (`--data {}`), or prepare them into records (`trainbook prepare --data {}`)",
                    path.display(),
                    path.display(),
                    path.display()
                );
            }
            if files.is_empty() {
                bail!(
                    "{} holds no text file ({}), no HDF5 pre-training shards (.hdf5, .h5) and no directory datasets' save_to_disk wrote: put the corpus there, a text per line or a table with a text column",
                    path.display(),
                    CORPUS_EXTENSIONS.join(", ")
                );
            }
            files
        } else {
            bail!(
                "{} does not exist: give a .txt file, a table or a directory of them",
                path.display()
            );
        };
        Ok(Corpus {
            files,
            column: column.to_string(),
        })
    }

    /// Bytes of all files (progress is counted in them).
    pub fn bytes(&self) -> u64 {
        self.files
            .iter()
            .map(|f| std::fs::metadata(f).map(|m| m.len()).unwrap_or(0))
            .sum()
    }

    /// Calls `each` with batches of texts (about `batch_bytes` of text each, the last one
    /// shorter) and the corpus bytes read so far, in corpus order.
    pub fn for_each_batch(
        &self,
        batch_bytes: usize,
        mut each: impl FnMut(Vec<String>, u64) -> Result<()>,
    ) -> Result<()> {
        let mut batch = Batcher {
            texts: Vec::new(),
            bytes: 0,
            limit: batch_bytes.max(1),
            done_before: 0,
        };
        for file in &self.files {
            let size = std::fs::metadata(file).map(|m| m.len()).unwrap_or(0);
            let mut push = |text: String, pos: u64| batch.push(text, pos, &mut each);
            read_file(file, &self.column, &mut push)?;
            batch.done_before += size;
        }
        batch.flush(batch.done_before, &mut each)
    }
}

/// The subdirectories of `dir` that `datasets`' `save_to_disk` wrote, in name order.
fn saved_datasets(dir: &Path) -> Result<Vec<PathBuf>> {
    let mut dirs: Vec<PathBuf> = std::fs::read_dir(dir)
        .with_context(|| format!("reading the directory {}", dir.display()))?
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.is_dir() && is_hf_dataset(p))
        .collect();
    dirs.sort();
    Ok(dirs)
}

struct Batcher {
    texts: Vec<String>,
    bytes: usize,
    limit: usize,
    /// Bytes of the files before the current one.
    done_before: u64,
}

impl Batcher {
    /// `pos`: bytes of the current file read so far.
    fn push(
        &mut self,
        text: String,
        pos: u64,
        each: &mut impl FnMut(Vec<String>, u64) -> Result<()>,
    ) -> Result<()> {
        self.bytes += text.len();
        self.texts.push(text);
        if self.bytes >= self.limit {
            self.flush(self.done_before + pos, each)?;
        }
        Ok(())
    }

    fn flush(
        &mut self,
        done: u64,
        each: &mut impl FnMut(Vec<String>, u64) -> Result<()>,
    ) -> Result<()> {
        self.bytes = 0;
        if self.texts.is_empty() {
            return Ok(());
        }
        each(std::mem::take(&mut self.texts), done)
    }
}

fn read_file(path: &Path, column: &str, push: &mut Push) -> Result<()> {
    let ext = path
        .extension()
        .and_then(|e| e.to_str())
        .unwrap_or("")
        .to_ascii_lowercase();
    match ext.as_str() {
        "txt" => read_lines(path, push),
        "jsonl" | "ndjson" | "json" => read_json_lines(path, column, push),
        "csv" | "tsv" => read_csv(path, column, if ext == "tsv" { b'\t' } else { b',' }, push),
        "parquet" => read_parquet(path, column, push),
        "arrow" => read_arrow(path, column, push),
        other => bail!(
            "{}: unsupported file type '.{other}': use {}",
            path.display(),
            CORPUS_EXTENSIONS.join(", ")
        ),
    }
}

fn open(path: &Path) -> Result<std::fs::File> {
    std::fs::File::open(path).with_context(|| format!("opening {}", path.display()))
}

/// A text per non-empty line.
fn read_lines(path: &Path, push: &mut Push) -> Result<()> {
    let mut reader = BufReader::with_capacity(1 << 20, open(path)?);
    let (mut line, mut pos, mut number) = (String::new(), 0u64, 0u64);
    loop {
        line.clear();
        let n = reader.read_line(&mut line).with_context(|| {
            format!(
                "reading {} line {} (UTF-8 text)",
                path.display(),
                number + 1
            )
        })?;
        if n == 0 {
            return Ok(());
        }
        pos += n as u64;
        number += 1;
        let text = line.strip_suffix('\n').unwrap_or(&line);
        let text = text.strip_suffix('\r').unwrap_or(text);
        if !text.trim().is_empty() {
            push(text.to_string(), pos)?;
        }
    }
}

/// The `column` string of each JSON line; lines without it (or null) are skipped, as a table
/// reader skips nulls.
fn read_json_lines(path: &Path, column: &str, push: &mut Push) -> Result<()> {
    let mut reader = BufReader::with_capacity(1 << 20, open(path)?);
    let (mut line, mut pos, mut number, mut seen) = (String::new(), 0u64, 0u64, false);
    loop {
        line.clear();
        let n = reader
            .read_line(&mut line)
            .with_context(|| format!("reading {} line {}", path.display(), number + 1))?;
        if n == 0 {
            break;
        }
        pos += n as u64;
        number += 1;
        if line.trim().is_empty() {
            continue;
        }
        let value: serde_json::Value = serde_json::from_str(&line).map_err(|e| {
            anyhow!(
                "{} line {number} is not JSON ({e}): a .jsonl file holds one JSON object per line",
                path.display()
            )
        })?;
        match value.get(column) {
            Some(serde_json::Value::String(s)) => {
                seen = true;
                push(s.clone(), pos)?;
            }
            Some(serde_json::Value::Null) => seen = true,
            None => {}
            Some(other) => bail!(
                "column '{column}' of {} holds {} at line {number}, not text: choose the text column with text_column",
                path.display(),
                json_kind(other)
            ),
        }
    }
    if !seen && number > 0 {
        bail!(
            "{} has no column '{column}': choose the text column with text_column",
            path.display()
        );
    }
    Ok(())
}

fn json_kind(v: &serde_json::Value) -> &'static str {
    match v {
        serde_json::Value::Bool(_) => "a boolean",
        serde_json::Value::Number(_) => "a number",
        serde_json::Value::Array(_) => "a list",
        serde_json::Value::Object(_) => "an object",
        _ => "a value",
    }
}

/// CSV in chunks of about [`CSV_CHUNK`] bytes, each cut after a record (a newline outside
/// quotes) and parsed with the header in front.
fn read_csv(path: &Path, column: &str, sep: u8, push: &mut Push) -> Result<()> {
    let mut file = BufReader::with_capacity(1 << 20, open(path)?);
    let mut header = Vec::new();
    file.read_until(b'\n', &mut header)
        .with_context(|| format!("reading {}", path.display()))?;
    let mut pos = header.len() as u64;
    let mut carry: Vec<u8> = Vec::new();
    let mut buf = vec![0u8; CSV_CHUNK];
    let mut in_quotes = false;
    loop {
        let n = file
            .read(&mut buf)
            .with_context(|| format!("reading {}", path.display()))?;
        let start = carry.len();
        carry.extend_from_slice(&buf[..n]);
        // The end of the last complete record in `carry`.
        let mut cut = None;
        for (i, &b) in carry[start..].iter().enumerate() {
            if b == b'"' {
                in_quotes = !in_quotes;
            } else if b == b'\n' && !in_quotes {
                cut = Some(start + i + 1);
            }
        }
        let end = if n == 0 { Some(carry.len()) } else { cut };
        if let Some(end) = end.filter(|&e| e > 0) {
            pos += end as u64;
            let rest = carry.split_off(end);
            let mut chunk = header.clone();
            if !chunk.ends_with(b"\n") {
                chunk.push(b'\n');
            }
            chunk.extend_from_slice(&carry);
            carry = rest;
            parse_csv_chunk(path, column, sep, chunk, pos, push)?;
        }
        if n == 0 {
            return Ok(());
        }
    }
}

fn parse_csv_chunk(
    path: &Path,
    column: &str,
    sep: u8,
    chunk: Vec<u8>,
    pos: u64,
    push: &mut Push,
) -> Result<()> {
    let mut overwrite = Schema::default();
    overwrite.with_column(column.into(), DataType::String);
    let df = CsvReadOptions::default()
        .with_has_header(true)
        .with_schema_overwrite(Some(std::sync::Arc::new(overwrite)))
        .with_parse_options(CsvParseOptions::default().with_separator(sep))
        .into_reader_with_file_handle(std::io::Cursor::new(chunk))
        .finish()
        .map_err(|e| anyhow!(e).context(format!("reading {}", path.display())))?;
    push_column(path, &df, column, pos, push)
}

/// Parquet in slices of [`PARQUET_ROWS`] rows, only the text column read.
fn read_parquet(path: &Path, column: &str, push: &mut Push) -> Result<()> {
    let rows = ParquetReader::new(open(path)?)
        .num_rows()
        .map_err(|e| anyhow!(e).context(format!("reading {}", path.display())))?;
    let size = std::fs::metadata(path).map(|m| m.len()).unwrap_or(0);
    let mut offset = 0;
    while offset < rows {
        let n = PARQUET_ROWS.min(rows - offset);
        let df = ParquetReader::new(open(path)?)
            .with_slice(Some((offset, n)))
            .with_columns(Some(vec![column.to_string()]))
            .finish();
        let df = match df {
            Ok(df) => df,
            Err(e) => {
                // A missing column reads as an error: say which columns there are.
                let all = ParquetReader::new(open(path)?)
                    .with_slice(Some((0, 1)))
                    .finish()?;
                if all.column(column).is_err() {
                    return Err(no_column(path, &all, column));
                }
                return Err(anyhow!(e).context(format!("reading {}", path.display())));
            }
        };
        offset += n;
        let pos = size * offset as u64 / rows as u64;
        push_column(path, &df, column, pos, push)?;
    }
    Ok(())
}

fn no_column(path: &Path, df: &DataFrame, column: &str) -> anyhow::Error {
    let names: Vec<&str> = df.get_column_names().iter().map(|n| n.as_str()).collect();
    missing_column(path, &names, column)
}

/// The text column `column` of a table read from `path`, or an error naming the columns there
/// are (or the type the column holds).
pub fn text_column<'a>(path: &Path, df: &'a DataFrame, column: &str) -> Result<&'a StringChunked> {
    let col = df.column(column).map_err(|_| no_column(path, df, column))?;
    col.str().map_err(|_| {
        anyhow!(
            "column '{column}' of {} holds {}, not text",
            path.display(),
            col.dtype()
        )
    })
}

fn push_column(path: &Path, df: &DataFrame, column: &str, pos: u64, push: &mut Push) -> Result<()> {
    for t in text_column(path, df, column)?.iter().flatten() {
        push(t.to_string(), pos)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::text::wordpiece::read_texts;

    fn texts_of(path: &Path, column: &str, batch: usize) -> Vec<String> {
        let mut all = Vec::new();
        let mut last = 0;
        Corpus::open(path, column)
            .unwrap()
            .for_each_batch(batch, |t, done| {
                assert!(done >= last, "progress only grows");
                last = done;
                all.extend(t);
                Ok(())
            })
            .unwrap();
        assert_eq!(last, std::fs::metadata(path).unwrap().len());
        all
    }

    fn dir() -> PathBuf {
        let d = std::env::temp_dir().join(format!("trainbook-source-{}", std::process::id()));
        std::fs::create_dir_all(&d).unwrap();
        d
    }

    /// Streaming gives exactly the texts the whole-file reader gives, in every format, with
    /// quoted newlines in CSV and chunks far smaller than the file.
    #[test]
    fn streams_the_same_texts_as_the_whole_file_reader() {
        let d = dir();
        let txt = d.join("a.txt");
        std::fs::write(&txt, "one line\n\n  \nsecond\r\nlast without newline").unwrap();
        let jsonl = d.join("b.jsonl");
        std::fs::write(
            &jsonl,
            "{\"text\": \"first\", \"n\": 1}\n\n{\"text\": null}\n{\"other\": 2}\n{\"text\": \"é \\\"quoted\\\"\"}\n",
        )
        .unwrap();
        let csv = d.join("c.csv");
        let mut body = String::from("id,text\n");
        for i in 0..500 {
            body.push_str(&format!(
                "{i},\"row {i}, with a comma\nand a newline \"\"{i}\"\"\"\n"
            ));
        }
        body.push_str("500,\n501,plain\n");
        std::fs::write(&csv, &body).unwrap();
        let parquet = d.join("d.parquet");
        let mut df =
            df!("text" => (0..200_000).map(|i| format!("text {i}")).collect::<Vec<_>>()).unwrap();
        ParquetWriter::new(std::fs::File::create(&parquet).unwrap())
            .finish(&mut df)
            .unwrap();
        for (path, batch) in [(&txt, 3), (&jsonl, 1), (&csv, 100), (&parquet, 1 << 20)] {
            let whole = read_texts(path, Some("text")).unwrap();
            assert_eq!(texts_of(path, "text", batch), whole, "{}", path.display());
        }
        // A directory: its files in name order.
        let all = texts_of_dir(&d);
        assert_eq!(all.first().map(String::as_str), Some("one line"));
        assert_eq!(all.last().map(String::as_str), Some("text 199999"));
        std::fs::remove_dir_all(d).ok();
    }

    fn texts_of_dir(d: &Path) -> Vec<String> {
        let mut all = Vec::new();
        Corpus::open(d, "text")
            .unwrap()
            .for_each_batch(1 << 16, |t, _| {
                all.extend(t);
                Ok(())
            })
            .unwrap();
        all
    }

    #[test]
    fn a_missing_or_wrong_column_names_the_file_and_the_fix() {
        let d = dir().join("bad");
        std::fs::create_dir_all(&d).unwrap();
        let jsonl = d.join("x.jsonl");
        std::fs::write(&jsonl, "{\"body\": \"a\"}\n").unwrap();
        let e = Corpus::open(&jsonl, "text")
            .unwrap()
            .for_each_batch(10, |_, _| Ok(()))
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("x.jsonl") && e.contains("no column 'text'") && e.contains("text_column"),
            "{e}"
        );
        let csv = d.join("y.csv");
        std::fs::write(&csv, "body,n\na,1\n").unwrap();
        let e = format!(
            "{:#}",
            Corpus::open(&csv, "text")
                .unwrap()
                .for_each_batch(10, |_, _| Ok(()))
                .unwrap_err()
        );
        assert!(e.contains("y.csv") && e.contains("text"), "{e}");
        let empty = d.join("empty");
        std::fs::create_dir_all(&empty).unwrap();
        let e = Corpus::open(&empty, "text").unwrap_err().to_string();
        assert!(e.contains("holds no text file"), "{e}");
        std::fs::remove_dir_all(d).ok();
    }
}
