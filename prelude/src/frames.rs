//! `trainbook_api::Table` ⇄ polars `DataFrame`, for programs that want polars (notebook cells
//! get `Table`s: see `trainbook_api::table` for why), and a run's tables as DataFrames
//! directly: `result.history_df()?`, `job.history_df()?`, `sweep.trials_df()?` (in a notebook
//! the kernel imports this module for the first cell that uses polars).

// polars' prelude has its own `Context`; anyhow's is called by path.
use anyhow::Result;
use polars::prelude::*;
use trainbook_api::plumbing::format::metrics_table;
use trainbook_api::{Column as TableColumn, Table, Values};
use trainbook_api::{Job, SweepJob, SweepResult, TrainResult};

pub use polars;
pub use polars::prelude::{
    ChunkAgg, ChunkCompareEq, ChunkCompareIneq, DataFrame, DataType, NamedFrom, PolarsResult,
    Series,
};

/// A finished run's tables as polars DataFrames.
pub trait ResultFrames {
    /// Every metric reported: rank, step, epoch, name, value, time (`history()` as a
    /// DataFrame).
    fn history_df(&self) -> Result<DataFrame>;
    /// One row per epoch (`epochs()` as a DataFrame).
    fn epochs_df(&self) -> Result<DataFrame>;
    /// One row per rank: parameters, gradients, optimizer state, buffers, peak (MiB).
    fn memory_df(&self) -> Result<DataFrame>;
}

impl ResultFrames for TrainResult {
    fn history_df(&self) -> Result<DataFrame> {
        to_polars(&self.history())
    }
    fn epochs_df(&self) -> Result<DataFrame> {
        to_polars(&self.epochs()?)
    }
    fn memory_df(&self) -> Result<DataFrame> {
        to_polars(&self.memory_table())
    }
}

/// A running (or finished) job's metrics so far, as a polars DataFrame.
pub trait JobFrames {
    /// Every metric reported so far: rank, step, epoch, name, value, time.
    fn history_df(&self) -> Result<DataFrame>;
}

impl JobFrames for Job {
    fn history_df(&self) -> Result<DataFrame> {
        to_polars(&metrics_table(&self.metric_rows()))
    }
}

/// A sweep's trials as a polars DataFrame: one row per trial (`trials()`).
pub trait SweepFrames {
    fn trials_df(&self) -> Result<DataFrame>;
}

impl SweepFrames for SweepResult {
    fn trials_df(&self) -> Result<DataFrame> {
        to_polars(&self.trials())
    }
}

impl SweepFrames for SweepJob {
    fn trials_df(&self) -> Result<DataFrame> {
        to_polars(&self.trials())
    }
}

/// The table as a polars DataFrame (same names, values and missing values).
pub fn to_polars(table: &Table) -> Result<DataFrame> {
    let columns: Vec<Column> = table
        .columns()
        .iter()
        .map(|c| {
            let name: PlSmallStr = c.name().into();
            match c.values() {
                Values::Int(v) => Column::new(name, v),
                Values::UInt(v) => Column::new(name, v),
                Values::Float(v) => Column::new(name, v),
                Values::Bool(v) => Column::new(name, v),
                Values::Str(v) => Column::new(name, v),
            }
        })
        .collect();
    anyhow::Context::context(
        DataFrame::new(table.height(), columns),
        "building a DataFrame from a table",
    )
}

/// The DataFrame as a table. Integers, floats, booleans and strings keep their values; other
/// types (dates, lists, ...) become their text as polars prints it. Each column keeps polars'
/// name of its type.
pub fn from_polars(df: &DataFrame) -> Result<Table> {
    let columns =
        anyhow::Context::context(convert_columns(df), "converting a DataFrame to a table")?;
    Table::from_columns(columns)
}

fn convert_columns(df: &DataFrame) -> PolarsResult<Vec<TableColumn>> {
    df.columns()
        .iter()
        .map(|c| {
            let name = c.name().as_str();
            let dtype = c.dtype();
            let column = if dtype.is_signed_integer() {
                let s = c.cast(&DataType::Int64)?;
                TableColumn::int(name, s.i64()?.iter())
            } else if dtype.is_unsigned_integer() {
                let s = c.cast(&DataType::UInt64)?;
                TableColumn::uint(name, s.u64()?.iter())
            } else if dtype.is_float() {
                let s = c.cast(&DataType::Float64)?;
                TableColumn::float(name, s.f64()?.iter())
            } else if dtype == &DataType::Boolean {
                TableColumn::bool(name, c.bool()?.iter())
            } else if dtype == &DataType::String {
                TableColumn::str(name, c.str()?.iter().map(|v| v.map(String::from)))
            } else {
                TableColumn::str(
                    name,
                    (0..c.len()).map(|i| match c.get(i) {
                        Ok(AnyValue::Null) => None,
                        Ok(v) => Some(v.to_string()),
                        Err(e) => Some(format!("<{e}>")),
                    }),
                )
            };
            Ok(column.with_dtype(dtype.to_string()))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_frame_round_trips_with_its_types() {
        let df = df!(
            "step" => [1u32, 2, 3],
            "loss" => [Some(0.5), None, Some(0.25)],
            "text" => ["a", "b", "c"],
            "ok" => [true, false, true],
        )
        .unwrap();
        let t = from_polars(&df).unwrap();
        assert_eq!(t.shape(), (3, 4));
        let dtypes: Vec<&str> = t.columns().iter().map(|c| c.dtype()).collect();
        assert_eq!(dtypes, ["u32", "f64", "str", "bool"]);
        assert_eq!(
            t.column("loss").unwrap().f64s(),
            [Some(0.5), None, Some(0.25)]
        );
        let back = to_polars(&t).unwrap();
        assert_eq!(
            back.column("text").unwrap().str().unwrap().get(2),
            Some("c")
        );
        assert_eq!(back.column("loss").unwrap().null_count(), 1);
    }
}
