//! The metrics table: one row per epoch, like Hugging Face Trainer's notebook table.

use crate::format::{format_duration, format_metric};
use crate::grid::{Grid, Row};
use std::collections::BTreeMap;

/// Rows shown at most (the newest); the metrics DataFrame has them all.
pub const MAX_ROWS: usize = 50;

#[derive(Clone, Debug, Default, PartialEq)]
pub struct EpochRow {
    pub train_loss: Option<f64>,
    pub train_accuracy: Option<f64>,
    pub val_loss: Option<f64>,
    pub val_accuracy: Option<f64>,
    pub samples_per_second: Option<f64>,
    /// Seconds since the run started when the epoch ended.
    pub elapsed: Option<f64>,
    /// Further scores by column name (`"val f1"`, a task's own `"train confidence"`): shown
    /// between the accuracy and throughput columns, in name order.
    pub extra: BTreeMap<String, f64>,
}

#[derive(Clone, Debug, Default)]
pub struct MetricsTable {
    rows: BTreeMap<u64, EpochRow>,
}

type Column = (&'static str, fn(&EpochRow) -> Option<String>);

const COLUMNS: [Column; 6] = [
    ("train loss", |r| r.train_loss.map(format_metric)),
    ("train acc", |r| r.train_accuracy.map(format_metric)),
    ("val loss", |r| r.val_loss.map(format_metric)),
    ("val acc", |r| r.val_accuracy.map(format_metric)),
    ("samples/s", |r| {
        r.samples_per_second.map(|v| format!("{v:.1}"))
    }),
    ("time", |r| r.elapsed.map(format_duration)),
];

impl MetricsTable {
    /// The row of a (zero-based) epoch, created on first use.
    pub fn row_mut(&mut self, epoch: u64) -> &mut EpochRow {
        self.rows.entry(epoch).or_default()
    }
    pub fn rows(&self) -> impl Iterator<Item = (u64, &EpochRow)> {
        self.rows.iter().map(|(e, r)| (*e, r))
    }
    pub fn is_empty(&self) -> bool {
        self.rows.is_empty()
    }

    /// The newest [`MAX_ROWS`] rows of the columns that have at least one value.
    fn grid(&self) -> Grid {
        let used = |c: &&Column| self.rows.values().any(|r| c.1(r).is_some());
        // The fixed scores, then the extra ones, then throughput and time.
        let (scores, pace) = COLUMNS.split_at(4);
        let extra: std::collections::BTreeSet<&str> = self
            .rows
            .values()
            .flat_map(|r| r.extra.keys().map(String::as_str))
            .collect();
        let cell = |r: &EpochRow| -> Vec<String> {
            let dash = || "–".to_string();
            let fixed = |cols: &[Column]| -> Vec<String> {
                cols.iter()
                    .filter(used)
                    .map(|c| c.1(r).unwrap_or_else(dash))
                    .collect()
            };
            let mut cells = fixed(scores);
            cells.extend(extra.iter().map(|k| {
                r.extra
                    .get(*k)
                    .map(|v| format_metric(*v))
                    .unwrap_or_else(dash)
            }));
            cells.extend(fixed(pace));
            cells
        };
        let skip = self.rows.len().saturating_sub(MAX_ROWS);
        let mut rows: Vec<Row> = Vec::new();
        if skip > 0 {
            rows.push(Row::Gap(format!("… {skip} earlier epochs")));
        }
        rows.extend(
            self.rows
                .iter()
                .skip(skip)
                .map(|(e, r)| Row::Cells(std::iter::once(e.to_string()).chain(cell(r)).collect())),
        );
        let mut columns = vec!["epoch".to_string()];
        columns.extend(scores.iter().filter(used).map(|(h, _)| h.to_string()));
        columns.extend(extra.iter().map(|k| k.to_string()));
        columns.extend(pace.iter().filter(used).map(|(h, _)| h.to_string()));
        Grid {
            columns,
            rows,
            class: "trainbook-metrics",
            ..Grid::default()
        }
    }

    pub fn text(&self) -> String {
        if self.rows.is_empty() {
            return String::new();
        }
        self.grid().text()
    }

    pub fn html(&self) -> String {
        if self.rows.is_empty() {
            return String::new();
        }
        self.grid().html()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_columns_with_values_and_aligned_text() {
        let mut t = MetricsTable::default();
        assert_eq!(t.text(), "");
        *t.row_mut(0) = EpochRow {
            train_loss: Some(0.69),
            val_loss: Some(0.65),
            val_accuracy: Some(0.61),
            elapsed: Some(62.0),
            ..EpochRow::default()
        };
        t.row_mut(1).train_loss = Some(0.4);
        let text = t.text();
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines[0], "epoch  train loss  val loss  val acc    time");
        assert_eq!(lines[1], "    0      0.6900    0.6500   0.6100  1m 02s");
        assert_eq!(lines[2], "    1      0.4000         –        –       –");
        assert!(!t.html().contains("samples/s") && t.html().contains("<th "));
    }

    #[test]
    fn extra_scores_get_columns_between_accuracy_and_time() {
        let mut t = MetricsTable::default();
        let row = t.row_mut(0);
        row.val_accuracy = Some(0.9);
        row.elapsed = Some(3.0);
        row.extra.insert("val f1".into(), 0.875);
        t.row_mut(1).extra.insert("train confidence".into(), 0.5);
        let text = t.text();
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines[0], "epoch  val acc  train confidence  val f1  time");
        assert_eq!(lines[1], "    0   0.9000                 –  0.8750  3.0s");
        assert_eq!(lines[2], "    1        –            0.5000       –     –");
        assert!(t.html().contains(">train confidence<"));
    }

    #[test]
    fn long_runs_show_the_newest_rows() {
        let mut t = MetricsTable::default();
        for e in 0..(MAX_ROWS as u64 + 5) {
            t.row_mut(e).train_loss = Some(1.0);
        }
        assert!(t.text().contains("… 5 earlier epochs"));
        assert_eq!(t.text().lines().count(), MAX_ROWS + 2);
    }
}
