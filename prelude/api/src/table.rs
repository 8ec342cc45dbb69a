//! [`Table`]: the tables trainbook hands to notebooks (metrics, per-epoch results, data
//! previews), as plain columns.
//!
//! Why not polars' `DataFrame`: a notebook cell compiles against the crate it uses, and naming
//! polars in this crate's signatures would put polars' ~150 crates into every cell's compile
//! (measured: ~0.3 s per cell). trainbook reads and writes its tables with polars inside the
//! engine; a program that wants a `DataFrame` converts with `trainbook::frames::to_polars`, and
//! a notebook can pass [`Table::to_csv`] to any reader. In the trainbook kernel a table shown
//! as a cell's value renders as an HTML table (head and tail of long ones).

use std::fmt;
use std::path::Path;

use anyhow::{bail, Context, Result};

/// One column's values; `None` is a missing value.
#[derive(Clone, Debug, PartialEq)]
pub enum Values {
    Int(Vec<Option<i64>>),
    UInt(Vec<Option<u64>>),
    Float(Vec<Option<f64>>),
    Bool(Vec<Option<bool>>),
    Str(Vec<Option<String>>),
}

/// One value of a table.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Value<'a> {
    Null,
    Int(i64),
    UInt(u64),
    Float(f64),
    Bool(bool),
    Str(&'a str),
}

impl Value<'_> {
    /// The value as a number (integers converted), `None` for text, booleans and nulls.
    pub fn as_f64(&self) -> Option<f64> {
        match *self {
            Value::Int(v) => Some(v as f64),
            Value::UInt(v) => Some(v as f64),
            Value::Float(v) => Some(v),
            _ => None,
        }
    }
}

impl fmt::Display for Value<'_> {
    /// Numbers as Rust prints them, text as is, nulls as `null`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Value::Null => f.write_str("null"),
            Value::Int(v) => write!(f, "{v}"),
            Value::UInt(v) => write!(f, "{v}"),
            Value::Float(v) => write!(f, "{v}"),
            Value::Bool(v) => write!(f, "{v}"),
            Value::Str(v) => f.write_str(v),
        }
    }
}

/// A named column. `dtype` names the column's type as the source called it (polars' `i64`,
/// `str`, `f64`, ...), so a table read from a file shows the types the file has.
#[derive(Clone, Debug, PartialEq)]
pub struct Column {
    name: String,
    dtype: String,
    values: Values,
}

impl Column {
    /// A column with the default dtype name of its values (`i64`, `u64`, `f64`, `bool`, `str`).
    pub fn new(name: impl Into<String>, values: Values) -> Column {
        let dtype = match &values {
            Values::Int(_) => "i64",
            Values::UInt(_) => "u64",
            Values::Float(_) => "f64",
            Values::Bool(_) => "bool",
            Values::Str(_) => "str",
        };
        Column {
            name: name.into(),
            dtype: dtype.into(),
            values,
        }
    }

    /// The same column with `dtype` as its type name.
    pub fn with_dtype(mut self, dtype: impl Into<String>) -> Column {
        self.dtype = dtype.into();
        self
    }

    pub fn int(name: &str, values: impl IntoIterator<Item = Option<i64>>) -> Column {
        Column::new(name, Values::Int(values.into_iter().collect()))
    }

    pub fn uint(name: &str, values: impl IntoIterator<Item = Option<u64>>) -> Column {
        Column::new(name, Values::UInt(values.into_iter().collect()))
    }

    pub fn float(name: &str, values: impl IntoIterator<Item = Option<f64>>) -> Column {
        Column::new(name, Values::Float(values.into_iter().collect()))
    }

    pub fn bool(name: &str, values: impl IntoIterator<Item = Option<bool>>) -> Column {
        Column::new(name, Values::Bool(values.into_iter().collect()))
    }

    pub fn str(name: &str, values: impl IntoIterator<Item = Option<String>>) -> Column {
        Column::new(name, Values::Str(values.into_iter().collect()))
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    pub fn dtype(&self) -> &str {
        &self.dtype
    }

    pub fn values(&self) -> &Values {
        &self.values
    }

    pub fn len(&self) -> usize {
        match &self.values {
            Values::Int(v) => v.len(),
            Values::UInt(v) => v.len(),
            Values::Float(v) => v.len(),
            Values::Bool(v) => v.len(),
            Values::Str(v) => v.len(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Whether the values are numbers (shown right-aligned).
    pub fn is_numeric(&self) -> bool {
        matches!(
            self.values,
            Values::Int(_) | Values::UInt(_) | Values::Float(_)
        )
    }

    /// The value in row `i` (`Value::Null` past the end).
    pub fn get(&self, i: usize) -> Value<'_> {
        fn at<T: Copy>(
            v: &[Option<T>],
            i: usize,
            f: impl Fn(T) -> Value<'static>,
        ) -> Value<'static> {
            v.get(i).copied().flatten().map(f).unwrap_or(Value::Null)
        }
        match &self.values {
            Values::Int(v) => at(v, i, Value::Int),
            Values::UInt(v) => at(v, i, Value::UInt),
            Values::Float(v) => at(v, i, Value::Float),
            Values::Bool(v) => at(v, i, Value::Bool),
            Values::Str(v) => v
                .get(i)
                .and_then(|s| s.as_deref())
                .map(Value::Str)
                .unwrap_or(Value::Null),
        }
    }

    /// Every value as a number (integers converted; text, booleans and nulls as `None`).
    pub fn f64s(&self) -> Vec<Option<f64>> {
        (0..self.len()).map(|i| self.get(i).as_f64()).collect()
    }

    /// Rows `start..start + len` (clipped to the column).
    fn slice(&self, start: usize, len: usize) -> Column {
        fn cut<T: Clone>(v: &[T], start: usize, len: usize) -> Vec<T> {
            let start = start.min(v.len());
            v[start..(start + len).min(v.len())].to_vec()
        }
        let values = match &self.values {
            Values::Int(v) => Values::Int(cut(v, start, len)),
            Values::UInt(v) => Values::UInt(cut(v, start, len)),
            Values::Float(v) => Values::Float(cut(v, start, len)),
            Values::Bool(v) => Values::Bool(cut(v, start, len)),
            Values::Str(v) => Values::Str(cut(v, start, len)),
        };
        Column {
            name: self.name.clone(),
            dtype: self.dtype.clone(),
            values,
        }
    }
}

/// Named columns of equal length.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Table {
    columns: Vec<Column>,
}

impl Table {
    /// A table of `columns`; they must have distinct names and the same length.
    pub fn from_columns(columns: Vec<Column>) -> Result<Table> {
        if let Some(first) = columns.first() {
            if let Some(c) = columns.iter().find(|c| c.len() != first.len()) {
                bail!(
                    "column '{}' has {} values but column '{}' has {}: every column of a table \
                     needs one value per row",
                    c.name,
                    c.len(),
                    first.name,
                    first.len()
                );
            }
        }
        for (i, c) in columns.iter().enumerate() {
            if columns[..i].iter().any(|o| o.name == c.name) {
                bail!(
                    "two columns are named '{}': column names must be distinct",
                    c.name
                );
            }
        }
        Ok(Table { columns })
    }

    /// Number of rows.
    pub fn height(&self) -> usize {
        self.columns.first().map_or(0, Column::len)
    }

    /// Number of columns.
    pub fn width(&self) -> usize {
        self.columns.len()
    }

    /// `(rows, columns)`.
    pub fn shape(&self) -> (usize, usize) {
        (self.height(), self.width())
    }

    pub fn columns(&self) -> &[Column] {
        &self.columns
    }

    pub fn column_names(&self) -> Vec<&str> {
        self.columns.iter().map(|c| c.name.as_str()).collect()
    }

    /// The column called `name`; the error lists the columns there are.
    pub fn column(&self, name: &str) -> Result<&Column> {
        match self.columns.iter().find(|c| c.name == name) {
            Some(c) => Ok(c),
            None => bail!(
                "the table has no column '{name}': its columns are {}",
                self.column_names().join(", ")
            ),
        }
    }

    /// The first `n` rows.
    pub fn head(&self, n: usize) -> Table {
        self.slice(0, n)
    }

    /// The last `n` rows.
    pub fn tail(&self, n: usize) -> Table {
        self.slice(self.height().saturating_sub(n), n)
    }

    /// Rows `start..start + len` (clipped to the table).
    pub fn slice(&self, start: usize, len: usize) -> Table {
        Table {
            columns: self.columns.iter().map(|c| c.slice(start, len)).collect(),
        }
    }

    /// The table as CSV: a header row, then one line per row; fields with commas, quotes or
    /// line breaks quoted; nulls empty.
    pub fn to_csv(&self) -> String {
        fn field(s: &str) -> String {
            if s.contains([',', '"', '\n', '\r']) {
                format!("\"{}\"", s.replace('"', "\"\""))
            } else {
                s.to_string()
            }
        }
        let mut out = String::new();
        let line = |cells: Vec<String>| cells.join(",") + "\n";
        out.push_str(&line(self.columns.iter().map(|c| field(&c.name)).collect()));
        for i in 0..self.height() {
            out.push_str(&line(
                self.columns
                    .iter()
                    .map(|c| match c.get(i) {
                        Value::Null => String::new(),
                        v => field(&v.to_string()),
                    })
                    .collect(),
            ));
        }
        out
    }

    /// Writes [`Table::to_csv`] to `path`.
    pub fn write_csv(&self, path: impl AsRef<Path>) -> Result<()> {
        let path = path.as_ref();
        std::fs::write(path, self.to_csv())
            .with_context(|| format!("cannot write the table to {}", path.display()))
    }
}

impl fmt::Display for Table {
    /// The text form a notebook shows (a grid with head and tail of long tables), drawn by
    /// trainbook's engine; the shape only when the engine is not loaded.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match crate::display::plain_text(self) {
            Some(t) => f.write_str(&t),
            None => write!(
                f,
                "table: {} rows × {} columns",
                self.height(),
                self.width()
            ),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> Table {
        Table::from_columns(vec![
            Column::str(
                "text",
                ["a, b", "plain", "say \"hi\""].map(|s| Some(s.to_string())),
            ),
            Column::int("label", [Some(1), None, Some(3)]),
        ])
        .unwrap()
    }

    #[test]
    fn shape_head_tail_and_columns() {
        let t = sample();
        assert_eq!(t.shape(), (3, 2));
        assert_eq!(t.head(2).height(), 2);
        assert_eq!(t.head(10).height(), 3);
        assert_eq!(t.tail(1).column("label").unwrap().get(0), Value::Int(3));
        assert_eq!(t.column("label").unwrap().get(1), Value::Null);
        assert_eq!(
            t.column("label").unwrap().f64s(),
            [Some(1.0), None, Some(3.0)]
        );
        let e = t.column("lable").unwrap_err().to_string();
        assert!(
            e.contains("no column 'lable'") && e.contains("text, label"),
            "{e}"
        );
    }

    #[test]
    fn columns_must_agree_in_length_and_names() {
        let e = Table::from_columns(vec![Column::int("a", [Some(1)]), Column::int("b", [])])
            .unwrap_err()
            .to_string();
        assert!(e.contains("column 'b' has 0 values"), "{e}");
        let e = Table::from_columns(vec![Column::int("a", []), Column::int("a", [])])
            .unwrap_err()
            .to_string();
        assert!(e.contains("two columns are named 'a'"), "{e}");
    }

    #[test]
    fn csv_quotes_what_needs_quoting_and_leaves_nulls_empty() {
        assert_eq!(
            sample().to_csv(),
            "text,label\n\"a, b\",1\nplain,\n\"say \"\"hi\"\"\",3\n"
        );
    }
}
