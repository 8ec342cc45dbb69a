//! Metrics as a polars DataFrame (columns rank, step, epoch, name, value, time), the run
//! directory's `metrics.parquet`.

use std::path::Path;

use anyhow::{Context, Result};
// polars' prelude has its own `Context`; the anyhow one is called by path where both apply.
use polars::prelude::*;

pub(crate) use trainbook_api::MetricRow;

pub(crate) fn to_dataframe(rows: &[MetricRow]) -> Result<DataFrame> {
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
pub(crate) fn write_parquet(rows: &[MetricRow], path: &Path) -> Result<()> {
    let mut df = to_dataframe(rows)?;
    crate::shared::checkpoint::write_file_atomic(path, |tmp| {
        let file =
            std::fs::File::create(tmp).with_context(|| format!("creating {}", tmp.display()))?;
        anyhow::Context::context(ParquetWriter::new(file).finish(&mut df), "writing parquet")?;
        Ok(())
    })
}

pub fn read_parquet(path: &Path) -> Result<DataFrame> {
    let file = std::fs::File::open(path).with_context(|| format!("opening {}", path.display()))?;
    anyhow::Context::with_context(ParquetReader::new(file).finish(), || {
        format!("reading {}", path.display())
    })
}
