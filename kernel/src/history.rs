//! The cells this kernel and its earlier runs executed, for the protocol's `history_request`
//! (a console's up arrow, JupyterLab's console history, `%history`-like tools).
//!
//! Kept as IPython keeps its history: numbered by session (one per kernel start) and execution
//! count, outliving the kernel. The store is an append-only file of JSON lines,
//! `<Jupyter data dir>/trainbook/history.jsonl`: a session's start, a cell's input when it
//! starts, its `text/plain` result when it ends. The file is locked while a session number is
//! taken, so kernels started together get different ones. Only the newest [`KEPT`] cells are
//! read back (and kept, when the file is rewritten at start); a query reaches no further.

use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use std::fs::{File, OpenOptions};
use std::io::Write;
use std::path::Path;

/// Cells kept in memory and in the file.
const KEPT: usize = 10_000;
/// A result longer than this is stored cut (with a note).
const MAX_OUTPUT: usize = 4096;

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
enum Record {
    Input {
        session: u32,
        line: u32,
        input: String,
    },
    Output {
        session: u32,
        line: u32,
        output: String,
    },
    Session {
        session: u32,
    },
}

#[derive(Debug, Clone, PartialEq)]
struct Cell {
    session: u32,
    line: u32,
    input: String,
    output: Option<String>,
}

pub struct History {
    /// None: nothing is written (the store could not be opened); the session's cells are still
    /// answered from memory.
    file: Option<File>,
    session: u32,
    cells: Vec<Cell>,
}

/// A `history_request`'s content, read with the specification's defaults.
#[derive(Debug, Deserialize)]
pub struct Query {
    #[serde(default)]
    output: bool,
    hist_access_type: Access,
    #[serde(default)]
    session: Option<i64>,
    #[serde(default)]
    start: Option<i64>,
    #[serde(default)]
    stop: Option<i64>,
    #[serde(default)]
    n: Option<i64>,
    #[serde(default)]
    pattern: Option<String>,
    #[serde(default)]
    unique: bool,
}

#[derive(Debug, Deserialize, PartialEq)]
#[serde(rename_all = "lowercase")]
enum Access {
    Range,
    Tail,
    Search,
}

impl History {
    /// Opens the store at `path` and starts a new session in it. A store that cannot be opened
    /// leaves the history in memory only; the reason is returned to be logged.
    pub fn open(path: &Path) -> (History, Option<String>) {
        match Self::try_open(path) {
            Ok(h) => (h, None),
            Err(e) => (
                History {
                    file: None,
                    session: 1,
                    cells: Vec::new(),
                },
                Some(format!(
                    "the history is not kept across restarts: {} ({e})",
                    path.display()
                )),
            ),
        }
    }

    fn try_open(path: &Path) -> std::io::Result<History> {
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir)?;
        }
        let mut file = OpenOptions::new()
            .read(true)
            .append(true)
            .create(true)
            .open(path)?;
        // Held until the session's first line is written: no other kernel takes its number.
        file.lock()?;
        let (records, lines, torn) = read(&file);
        if torn {
            file.write_all(b"\n")?;
        }
        let cells = cells_of(&records);
        let session = records.iter().map(session_of).max().unwrap_or(0) + 1;
        if lines > 2 * KEPT {
            rewrite(path, &cells)?;
            file = OpenOptions::new().read(true).append(true).open(path)?;
        }
        let mut h = History {
            file: Some(file),
            session,
            cells,
        };
        h.append(&Record::Session { session });
        if let Some(f) = &h.file {
            f.unlock()?;
        }
        Ok(h)
    }

    #[cfg(test)]
    fn session(&self) -> u32 {
        self.session
    }

    /// A cell starts (only cells run with `store_history`).
    pub fn input(&mut self, line: u32, input: &str) {
        self.cells.push(Cell {
            session: self.session,
            line,
            input: input.to_string(),
            output: None,
        });
        if self.cells.len() > KEPT {
            self.cells.drain(..self.cells.len() - KEPT);
        }
        self.append(&Record::Input {
            session: self.session,
            line,
            input: input.to_string(),
        });
    }

    /// The `text/plain` result of the cell at `line` of this session.
    pub fn output(&mut self, line: u32, text: &str) {
        let output = cut(text);
        let session = self.session;
        if let Some(c) = self
            .cells
            .iter_mut()
            .rev()
            .find(|c| c.session == session && c.line == line)
        {
            c.output = Some(output.clone());
        }
        self.append(&Record::Output {
            session,
            line,
            output,
        });
    }

    fn append(&mut self, record: &Record) {
        let Some(f) = &mut self.file else { return };
        let mut line = serde_json::to_string(record).unwrap_or_default();
        line.push('\n');
        // One write per record: appends from several kernels do not interleave within a line.
        if let Err(e) = f.write_all(line.as_bytes()) {
            eprintln!("trainbook-kernel: the history store stopped taking cells: {e}");
            self.file = None;
        }
    }

    /// The `history` list of a `history_reply`: `[session, line, input]` or, with `output`,
    /// `[session, line, [input, output]]` (output `null` when the cell had no result).
    pub fn answer(&self, q: &Query) -> Vec<Value> {
        let picked: Vec<&Cell> = match q.hist_access_type {
            Access::Tail => last(self.cells.iter().collect(), q.n.unwrap_or(10)),
            Access::Range => {
                let session = match q.session.unwrap_or(0) {
                    s if s <= 0 => self.session as i64 + s,
                    s => s,
                };
                let start = q.start.unwrap_or(1);
                self.cells
                    .iter()
                    .filter(|c| {
                        c.session as i64 == session
                            && c.line as i64 >= start
                            && q.stop.is_none_or(|stop| (c.line as i64) < stop)
                    })
                    .collect()
            }
            Access::Search => {
                let pattern = q.pattern.as_deref().unwrap_or("*");
                let Ok(glob) = glob::Pattern::new(pattern) else {
                    return Vec::new();
                };
                let mut found: Vec<&Cell> = self
                    .cells
                    .iter()
                    .filter(|c| glob.matches(&c.input))
                    .collect();
                if q.unique {
                    // The latest run of each input.
                    let mut seen = std::collections::HashSet::new();
                    found.reverse();
                    found.retain(|c| seen.insert(c.input.as_str()));
                    found.reverse();
                }
                match q.n {
                    Some(n) => last(found, n),
                    None => found,
                }
            }
        };
        picked
            .into_iter()
            .map(|c| {
                if q.output {
                    json!([c.session, c.line, [c.input, c.output]])
                } else {
                    json!([c.session, c.line, c.input])
                }
            })
            .collect()
    }
}

fn last(cells: Vec<&Cell>, n: i64) -> Vec<&Cell> {
    let n = n.max(0) as usize;
    let skip = cells.len().saturating_sub(n);
    cells.into_iter().skip(skip).collect()
}

fn cut(text: &str) -> String {
    if text.len() <= MAX_OUTPUT {
        return text.to_string();
    }
    let mut end = MAX_OUTPUT;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}… ({} bytes in all)", &text[..end], text.len())
}

fn session_of(r: &Record) -> u32 {
    match r {
        Record::Input { session, .. }
        | Record::Output { session, .. }
        | Record::Session { session } => *session,
    }
}

/// Every readable record (a torn last line, from a kernel killed mid-write, is skipped), the
/// number of lines, and whether the file ends mid-line.
fn read(mut file: &File) -> (Vec<Record>, usize, bool) {
    let mut text = String::new();
    let _ = std::io::Read::read_to_string(&mut file, &mut text);
    let records = text
        .lines()
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect();
    let torn = !text.is_empty() && !text.ends_with('\n');
    (records, text.lines().count(), torn)
}

/// The newest [`KEPT`] cells, with their outputs.
fn cells_of(records: &[Record]) -> Vec<Cell> {
    let mut cells: Vec<Cell> = Vec::new();
    let mut at = std::collections::HashMap::new();
    for r in records {
        match r {
            Record::Input {
                session,
                line,
                input,
            } => {
                at.insert((*session, *line), cells.len());
                cells.push(Cell {
                    session: *session,
                    line: *line,
                    input: input.clone(),
                    output: None,
                });
            }
            Record::Output {
                session,
                line,
                output,
            } => {
                if let Some(&i) = at.get(&(*session, *line)) {
                    cells[i].output = Some(output.clone());
                }
            }
            Record::Session { .. } => {}
        }
    }
    let skip = cells.len().saturating_sub(KEPT);
    cells.drain(..skip);
    cells
}

/// Replaces the store with `cells` (written beside it, then renamed over it).
fn rewrite(path: &Path, cells: &[Cell]) -> std::io::Result<()> {
    let tmp = path.with_extension("jsonl.tmp");
    let mut out = std::io::BufWriter::new(File::create(&tmp)?);
    for c in cells {
        let input = Record::Input {
            session: c.session,
            line: c.line,
            input: c.input.clone(),
        };
        writeln!(out, "{}", serde_json::to_string(&input)?)?;
        if let Some(o) = &c.output {
            let output = Record::Output {
                session: c.session,
                line: c.line,
                output: o.clone(),
            };
            writeln!(out, "{}", serde_json::to_string(&output)?)?;
        }
    }
    out.into_inner()?.sync_all()?;
    std::fs::rename(&tmp, path)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::PathBuf;

    fn query(json: Value) -> Query {
        serde_json::from_value(json).unwrap()
    }

    /// A store in a directory of its own, removed when the test ends.
    struct Store(PathBuf);

    impl Store {
        fn new() -> Store {
            static N: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
            let n = N.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            let dir = std::env::temp_dir().join(format!("tb-history-{}-{n}", std::process::id()));
            Store(dir.join("trainbook/history.jsonl"))
        }
    }

    impl Drop for Store {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(self.0.parent().unwrap().parent().unwrap());
        }
    }

    #[test]
    fn sessions_outlive_the_kernel_and_are_numbered_in_turn() {
        let store = Store::new();
        let path = &store.0;
        let (mut first, err) = History::open(path);
        assert!(err.is_none(), "{err:?}");
        assert_eq!(first.session(), 1);
        first.input(1, "let a = 1;");
        first.input(2, "a + 1");
        first.output(2, "2");
        drop(first);
        let (mut second, _) = History::open(path);
        assert_eq!(second.session(), 2);
        second.input(1, "a * 3");
        let tail = second.answer(&query(
            json!({"hist_access_type": "tail", "n": 2, "output": true}),
        ));
        assert_eq!(
            tail,
            vec![
                json!([1, 2, ["a + 1", "2"]]),
                json!([2, 1, ["a * 3", null]])
            ]
        );
        // Range: 0 or absent is this session, -1 the one before.
        let range = second.answer(&query(
            json!({"hist_access_type": "range", "session": -1, "start": 2, "stop": 3}),
        ));
        assert_eq!(range, vec![json!([1, 2, "a + 1"])]);
        let here = second.answer(&query(json!({"hist_access_type": "range", "start": 1})));
        assert_eq!(here, vec![json!([2, 1, "a * 3"])]);
    }

    #[test]
    fn search_matches_globs_with_unique_and_n() {
        let store = Store::new();
        let path = &store.0;
        let (mut h, _) = History::open(path);
        for (i, code) in ["x + 1", "y + 1", "x + 1", "x + 2", "x + 1"]
            .iter()
            .enumerate()
        {
            h.input(i as u32 + 1, code);
        }
        let search = |j: Value| h.answer(&query(j));
        let all = search(json!({"hist_access_type": "search", "pattern": "x + ?"}));
        assert_eq!(all.len(), 4);
        let unique = search(json!({"hist_access_type": "search", "pattern": "x*", "unique": true}));
        assert_eq!(unique, vec![json!([1, 4, "x + 2"]), json!([1, 5, "x + 1"])]);
        let n = search(json!({"hist_access_type": "search", "pattern": "*1", "n": 2}));
        assert_eq!(n, vec![json!([1, 3, "x + 1"]), json!([1, 5, "x + 1"])]);
        // A pattern must match the whole input, as IPython's (SQLite's GLOB) does.
        assert!(search(json!({"hist_access_type": "search", "pattern": "x"})).is_empty());
    }

    #[test]
    fn a_torn_line_is_skipped_and_a_long_result_is_cut() {
        let store = Store::new();
        let path = &store.0;
        let (mut h, _) = History::open(path);
        h.input(1, "big()");
        h.output(1, &"é".repeat(MAX_OUTPUT));
        drop(h);
        let mut f = OpenOptions::new().append(true).open(path).unwrap();
        f.write_all(b"{\"session\": 1, \"li").unwrap();
        drop(f);
        let (h, _) = History::open(path);
        assert_eq!(h.session(), 2);
        let tail = h.answer(&query(
            json!({"hist_access_type": "tail", "n": 5, "output": true}),
        ));
        let out = tail[0][2][1].as_str().unwrap();
        assert!(
            out.ends_with(&format!("({} bytes in all)", 2 * MAX_OUTPUT)),
            "{out}"
        );
    }

    #[test]
    fn a_store_that_cannot_be_opened_leaves_the_history_in_memory() {
        let (h, err) = History::open(Path::new("/proc/trainbook/history.jsonl"));
        assert!(err.unwrap().contains("not kept across restarts"));
        assert_eq!(h.session(), 1);
    }
}
