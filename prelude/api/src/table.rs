//! [`Table`]: the tables trainbook hands to notebooks (metrics, per-epoch results, data
//! previews), as plain columns.
//!
//! Why not polars' `DataFrame`: a notebook cell compiles against the crate it uses, and naming
//! polars in this crate's signatures would put polars' ~150 crates into every cell's compile
//! (measured: ~0.3 s per cell). trainbook reads and writes its tables with polars inside the
//! engine; a program that wants a `DataFrame` converts with `trainbook::frames::to_polars`, and
//! a notebook can pass [`Table::to_csv`] to any reader. In the trainbook kernel a table shown
//! as a cell's value renders as an HTML table (head and tail of long ones). Its cells are
//! for reading ([`Column::cell_text`]): floats to 6 significant digits, counts with thousands
//! separators; [`Table::to_csv`] keeps every digit.

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

    /// The value as a table shows it to a reader (the HTML and text of a [`Table`] shown in a
    /// notebook, the sweep table's steps): floats to 6 significant digits (C's `%.6g` with one
    /// decimal kept: `0.146223`, `3.0`, `1.23457e+06`, `1e-07`, `NaN`), integers
    /// with thousands separators (`12,345,678`), text as is, nulls as `null`. Lossy, for reading
    /// only: the value's `Display` (and so [`Table::to_csv`]) keeps every digit.
    pub fn display_short(&self) -> String {
        match *self {
            Value::Int(v) => grouped(v as i128),
            Value::UInt(v) => grouped(v as i128),
            Value::Float(v) => short_float(v),
            v => v.to_string(),
        }
    }
}

/// Significant digits a table shows of a float (pandas and polars show 6 too).
const SHORT_DIGITS: usize = 6;

/// A float to [`SHORT_DIGITS`] significant digits, the rule of C's and Python's `%.6g`:
/// positional for magnitudes from 1e-4 below 1e6, scientific otherwise, trailing zeros
/// dropped; except that positional floats keep one decimal, as polars and pandas print them,
/// so that a whole float reads as a float (`3.0`, not `3`; from 1e5 the six digits are all
/// before the point: `123457`). The exponent has a sign and at least two digits.
///
/// `0.14622268317274092` → `0.146223`, `0.000123456` → `0.000123456`,
/// `0.0000123456` → `1.23456e-05`, `1e-7` → `1e-07`, `123456.7` → `123457`,
/// `1234567.891` → `1.23457e+06`, `-2.5` → `-2.5`, `-0.0` → `0.0`, NaN → `NaN`,
/// infinities → `inf` / `-inf`.
fn short_float(v: f64) -> String {
    if v.is_nan() {
        return "NaN".into();
    }
    if v.is_infinite() {
        return if v > 0.0 { "inf" } else { "-inf" }.into();
    }
    if v == 0.0 {
        return "0.0".into();
    }
    let digits = SHORT_DIGITS as i32;
    // Rounded to the significant digits first: the exponent is the rounded value's
    // (999999.7 is 1e+06).
    let sci = format!("{:.*e}", SHORT_DIGITS - 1, v);
    let (mantissa, exponent) = sci.split_once('e').expect("`{:e}` writes an exponent");
    let exponent: i32 = exponent.parse().expect("`{:e}` writes an integer exponent");
    if !(-4..digits).contains(&exponent) {
        let mantissa = mantissa.trim_end_matches('0').trim_end_matches('.');
        let sign = if exponent < 0 { '-' } else { '+' };
        return format!("{mantissa}e{sign}{:02}", exponent.abs());
    }
    let decimals = (digits - 1 - exponent) as usize;
    let mut s = format!("{v:.decimals$}");
    if decimals > 0 {
        // Trailing zeros dropped, one decimal kept.
        let keep = s
            .trim_end_matches('0')
            .len()
            .max(s.find('.').unwrap_or(0) + 2);
        s.truncate(keep);
    }
    s
}

/// An integer with a comma between groups of three digits: `-1234567` → `-1,234,567`.
fn grouped(v: i128) -> String {
    let digits = v.unsigned_abs().to_string();
    let mut out = String::with_capacity(digits.len() + digits.len() / 3 + 1);
    if v < 0 {
        out.push('-');
    }
    for (i, d) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(d);
    }
    out
}

/// Words of a column name that mark its integers as identifiers rather than counts: shown
/// without thousands separators (`trial_id` 20240101, `year` 2024, `seed` 1234567).
const IDENTIFIER_WORDS: [&str; 9] = [
    "id", "ids", "pid", "uid", "seed", "year", "port", "zip", "code",
];

/// The lowercase words of a column name: split at anything but letters and digits, and where
/// camelCase starts a word (`trial_id`, `Trial ID`, `trialId` → `trial`, `id`).
fn name_words(name: &str) -> Vec<String> {
    let mut words = vec![String::new()];
    let mut previous_lower = false;
    for c in name.chars() {
        if !c.is_alphanumeric() {
            words.push(String::new());
        } else {
            if c.is_uppercase() && previous_lower {
                words.push(String::new());
            }
            words.last_mut().unwrap().extend(c.to_lowercase());
        }
        previous_lower = c.is_lowercase() || c.is_ascii_digit();
    }
    words.retain(|w| !w.is_empty());
    words
}

impl fmt::Display for Value<'_> {
    /// Numbers as Rust prints them (floats with every digit, the shortest text that reads back
    /// as the same float), text as is, nulls as `null`. [`Value::display_short`] is the form
    /// for reading.
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

    /// Whether the column's integers are identifiers rather than counts: a word of its name is
    /// `id`, `ids`, `pid`, `uid`, `seed`, `year`, `port`, `zip` or `code` (`id`, `trial_id`,
    /// `userId`, `Year`; not `valid`). Such integers are shown without thousands separators.
    pub fn is_identifier(&self) -> bool {
        name_words(&self.name)
            .iter()
            .any(|w| IDENTIFIER_WORDS.contains(&w.as_str()))
    }

    /// The value in row `i` as a table shows it to a reader: [`Value::display_short`] (floats
    /// to 6 significant digits, integers with thousands separators), but the integers of an
    /// identifier column ([`Column::is_identifier`]) with every digit and no separators.
    pub fn cell_text(&self, i: usize) -> String {
        match self.get(i) {
            v @ (Value::Int(_) | Value::UInt(_)) if self.is_identifier() => v.to_string(),
            v => v.display_short(),
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
    /// line breaks quoted; nulls empty. Numbers keep every digit (a float is the shortest
    /// text that reads back as the same float), unlike the shortened form a notebook shows.
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

    #[test]
    fn floats_read_short_to_six_significant_digits() {
        let cases: [(f64, &str); 31] = [
            (0.14622268317274092, "0.146223"),
            (0.5, "0.5"),
            (3.0, "3.0"),
            (-2.5, "-2.5"),
            (2.0000001, "2.0"),
            (1.0 / 3.0, "0.333333"),
            (0.1 + 0.2, "0.3"),
            (12.3456789, "12.3457"),
            (12345.6789, "12345.7"),
            (99999.5, "99999.5"),
            (100000.0, "100000"),
            (123456.7, "123457"),
            (999999.4, "999999"),
            (999999.7, "1e+06"),
            (1234567.891, "1.23457e+06"),
            (123456789.0, "1.23457e+08"),
            (-1234567.0, "-1.23457e+06"),
            (1e6, "1e+06"),
            (1e21, "1e+21"),
            (6.02214076e23, "6.02214e+23"),
            (1e300, "1e+300"),
            (0.001, "0.001"),
            (0.000123456, "0.000123456"),
            (0.0001234567, "0.000123457"),
            (0.0000123456, "1.23456e-05"),
            (1e-7, "1e-07"),
            (-3.5e-9, "-3.5e-09"),
            (0.0, "0.0"),
            (-0.0, "0.0"),
            (f64::NAN, "NaN"),
            (f64::NEG_INFINITY, "-inf"),
        ];
        for (v, want) in cases {
            assert_eq!(Value::Float(v).display_short(), want, "{v:?}");
        }
        assert_eq!(Value::Float(f64::INFINITY).display_short(), "inf");
        assert_eq!(Value::Float(5e-324).display_short(), "4.94066e-324");
    }

    #[test]
    fn integers_read_with_thousands_separators() {
        let cases: [(i64, &str); 10] = [
            (0, "0"),
            (7, "7"),
            (999, "999"),
            (1000, "1,000"),
            (-999, "-999"),
            (-1000, "-1,000"),
            (123456, "123,456"),
            (12345678, "12,345,678"),
            (-1234567, "-1,234,567"),
            (i64::MIN, "-9,223,372,036,854,775,808"),
        ];
        for (v, want) in cases {
            assert_eq!(Value::Int(v).display_short(), want, "{v}");
        }
        assert_eq!(
            Value::UInt(u64::MAX).display_short(),
            "18,446,744,073,709,551,615"
        );
        // Everything else as `Display` shows it.
        assert_eq!(Value::Bool(true).display_short(), "true");
        assert_eq!(Value::Str("a, b").display_short(), "a, b");
        assert_eq!(Value::Null.display_short(), "null");
    }

    #[test]
    fn cells_are_short_but_identifiers_keep_their_digits() {
        let t = Table::from_columns(vec![
            Column::uint("step", [Some(12345678), Some(7)]),
            Column::int("trial_id", [Some(20240101), Some(-1234)]),
            Column::int("Year", [Some(2024), None]),
            Column::int("userId", [Some(1234567), Some(1)]),
            Column::int("valid", [Some(1234567), Some(1)]),
            Column::float("loss", [Some(0.14622268317274092), None]),
            Column::str("note", [Some("1234567".to_string()), None]),
        ])
        .unwrap();
        let row =
            |i: usize| -> Vec<String> { t.columns().iter().map(|c| c.cell_text(i)).collect() };
        assert_eq!(
            row(0),
            [
                "12,345,678",
                "20240101",
                "2024",
                "1234567",
                "1,234,567",
                "0.146223",
                "1234567"
            ]
        );
        assert_eq!(row(1), ["7", "-1234", "null", "1", "1", "null", "null"]);
        let identifiers: Vec<bool> = t.columns().iter().map(Column::is_identifier).collect();
        assert_eq!(identifiers, [false, true, true, true, false, false, false]);
        for name in [
            "id",
            "ID",
            "run id",
            "trial-ids",
            "seed",
            "random_seed",
            "zipCode",
            "PID",
        ] {
            assert!(Column::int(name, []).is_identifier(), "{name}");
        }
        for name in [
            "epoch",
            "step",
            "rank",
            "trial",
            "tokens",
            "grid",
            "valid",
            "idle",
            "years_seen",
        ] {
            assert!(!Column::int(name, []).is_identifier(), "{name}");
        }
    }

    #[test]
    fn csv_keeps_every_digit() {
        let values = [0.14622268317274092, 1e-7, 123456789.0, 1.0 / 3.0, -0.0, 3.0];
        let t = Table::from_columns(vec![
            Column::float("loss", values.map(Some)),
            Column::int(
                "tokens",
                [
                    Some(12345678),
                    None,
                    Some(-1234567),
                    Some(0),
                    Some(1),
                    Some(2),
                ],
            ),
        ])
        .unwrap();
        let csv = t.to_csv();
        assert_eq!(
            csv,
            "loss,tokens\n0.14622268317274092,12345678\n0.0000001,\n123456789,-1234567\n\
             0.3333333333333333,0\n-0,1\n3,2\n"
        );
        // Every float reads back as itself.
        let read: Vec<f64> = csv
            .lines()
            .skip(1)
            .map(|l| l.split(',').next().unwrap().parse().unwrap())
            .collect();
        assert_eq!(
            read.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
            values.map(f64::to_bits)
        );
    }
}
