//! Metrics as rows and as a polars DataFrame (columns rank, step, epoch, name, value, time).

use std::path::Path;

use anyhow::{Context, Result};
// polars' prelude has its own `Context`; the anyhow one is called by path where both apply.
use polars::prelude::*;
use serde::Serialize;

#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct MetricRow {
    pub rank: u32,
    pub step: u64,
    pub epoch: u64,
    pub name: String,
    pub value: f64,
    /// Seconds since the job started.
    pub time: f64,
}

pub fn to_dataframe(rows: &[MetricRow]) -> Result<DataFrame> {
    let df = df!(
        "rank" => rows.iter().map(|r| r.rank).collect::<Vec<u32>>(),
        "step" => rows.iter().map(|r| r.step).collect::<Vec<u64>>(),
        "epoch" => rows.iter().map(|r| r.epoch).collect::<Vec<u64>>(),
        "name" => rows.iter().map(|r| r.name.as_str()).collect::<Vec<&str>>(),
        "value" => rows.iter().map(|r| r.value).collect::<Vec<f64>>(),
        "time" => rows.iter().map(|r| r.time).collect::<Vec<f64>>(),
    );
    anyhow::Context::context(df, "building the metrics DataFrame")
}

/// Writes the metrics as parquet, atomically (temporary file, then rename).
pub fn write_parquet(rows: &[MetricRow], path: &Path) -> Result<()> {
    let mut df = to_dataframe(rows)?;
    let tmp = crate::checkpoint::temp_path(path);
    {
        let file =
            std::fs::File::create(&tmp).with_context(|| format!("creating {}", tmp.display()))?;
        anyhow::Context::context(ParquetWriter::new(file).finish(&mut df), "writing parquet")?;
    }
    std::fs::rename(&tmp, path)
        .with_context(|| format!("renaming {} to {}", tmp.display(), path.display()))?;
    Ok(())
}

pub fn read_parquet(path: &Path) -> Result<DataFrame> {
    let file = std::fs::File::open(path).with_context(|| format!("opening {}", path.display()))?;
    anyhow::Context::with_context(ParquetReader::new(file).finish(), || {
        format!("reading {}", path.display())
    })
}

/// The per-epoch metrics, one row per epoch (Hugging Face Trainer's log history as a table):
/// `epoch` then whichever of `train_loss`, `train_accuracy`, `eval_loss`, `eval_accuracy`,
/// `samples_per_second` and `time` (seconds since the start when the epoch's last metric came)
/// the run reported. Per-step metrics (`loss`, `lr`) stay in the full metrics table.
pub fn per_epoch(df: &DataFrame) -> Result<DataFrame> {
    const COLUMNS: [(&str, &str); 5] = [
        ("epoch_train_loss", "train_loss"),
        ("epoch_train_accuracy", "train_accuracy"),
        ("eval_loss", "eval_loss"),
        ("eval_accuracy", "eval_accuracy"),
        ("samples_per_second", "samples_per_second"),
    ];
    let col = |name: &str| {
        df.column(name)
            .map_err(|_| anyhow::anyhow!("the metrics table has no '{name}' column"))
    };
    let epochs = anyhow::Context::context(col("epoch")?.u64(), "column 'epoch'")?;
    let names = anyhow::Context::context(col("name")?.str(), "column 'name'")?;
    let values = anyhow::Context::context(col("value")?.f64(), "column 'value'")?;
    let times = anyhow::Context::context(col("time")?.f64(), "column 'time'")?;
    // epoch → (value per column, time of the latest); global metrics come once per epoch, the
    // last report wins if a resumed run repeated one.
    let mut rows: std::collections::BTreeMap<u64, ([Option<f64>; 5], f64)> = Default::default();
    for i in 0..df.height() {
        let (Some(epoch), Some(name), Some(value)) = (epochs.get(i), names.get(i), values.get(i))
        else {
            continue;
        };
        let Some(c) = COLUMNS.iter().position(|(n, _)| *n == name) else {
            continue;
        };
        let row = rows.entry(epoch).or_insert(([None; 5], 0.0));
        row.0[c] = Some(value);
        row.1 = row.1.max(times.get(i).unwrap_or(0.0));
    }
    let mut columns: Vec<Column> = vec![Column::new(
        "epoch".into(),
        rows.keys().copied().collect::<Vec<u64>>(),
    )];
    for (c, (_, label)) in COLUMNS.iter().enumerate() {
        if rows.values().any(|r| r.0[c].is_some()) {
            let v: Vec<Option<f64>> = rows.values().map(|r| r.0[c]).collect();
            columns.push(Column::new((*label).into(), v));
        }
    }
    columns.push(Column::new(
        "time".into(),
        rows.values().map(|r| r.1).collect::<Vec<f64>>(),
    ));
    anyhow::Context::context(
        DataFrame::new(rows.len(), columns),
        "building the per-epoch table",
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(epoch: u64, name: &str, value: f64, time: f64) -> MetricRow {
        MetricRow {
            rank: 0,
            step: epoch * 10,
            epoch,
            name: name.into(),
            value,
            time,
        }
    }

    #[test]
    fn per_epoch_has_one_row_per_epoch_and_only_reported_columns() {
        let rows = vec![
            row(0, "loss", 0.9, 1.0),
            row(0, "epoch_train_loss", 0.8, 2.0),
            row(0, "eval_loss", 0.7, 3.0),
            row(1, "loss", 0.5, 4.0),
            row(1, "epoch_train_loss", 0.4, 5.0),
            row(1, "eval_loss", 0.45, 6.0),
        ];
        let t = per_epoch(&to_dataframe(&rows).unwrap()).unwrap();
        let names: Vec<String> = t.get_column_names().iter().map(|c| c.to_string()).collect();
        assert_eq!(names, ["epoch", "train_loss", "eval_loss", "time"]);
        assert_eq!(t.height(), 2);
        let eval: Vec<Option<f64>> = t
            .column("eval_loss")
            .unwrap()
            .f64()
            .unwrap()
            .iter()
            .collect();
        assert_eq!(eval, [Some(0.7), Some(0.45)]);
        let time: Vec<Option<f64>> = t.column("time").unwrap().f64().unwrap().iter().collect();
        assert_eq!(time, [Some(3.0), Some(6.0)]);
    }

    #[test]
    fn per_epoch_of_a_table_without_the_columns_is_a_clear_error() {
        let df = df!("x" => [1u64]).unwrap();
        let e = per_epoch(&df).unwrap_err().to_string();
        assert!(e.contains("no 'epoch' column"), "{e}");
    }
}
