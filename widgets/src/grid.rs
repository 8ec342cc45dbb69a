//! A table of already formatted cells, sized for a notebook: the one way trainbook draws a
//! table (metrics per epoch, a DataFrame returned by a cell, a run's summary), as HTML and as
//! aligned text. Long tables show their head and tail around a "… N more rows" line, wide ones
//! their first and last columns around a "…" column, as pandas and polars do in Python
//! notebooks; the caller says how many rows and columns there are in all.

use crate::html::escape;
use crate::theme::GREY;
use std::ops::Range;

/// Rows a notebook table shows in full; longer ones show `MAX_ROWS / 2` at each end.
pub const MAX_ROWS: usize = 20;
/// Columns shown in full; wider tables show `MAX_COLUMNS / 2` at each end.
pub const MAX_COLUMNS: usize = 16;
/// Characters of one cell; longer values end in "…".
pub const MAX_CELL_CHARS: usize = 60;

/// Which of `n` items a table shows: everything when `n <= max`, else the first and the last
/// `max / 2`. The second range is empty when nothing is left out.
pub fn shown(n: usize, max: usize) -> (Range<usize>, Range<usize>) {
    if n <= max {
        (0..n, n..n)
    } else {
        let half = (max / 2).max(1);
        (0..half, n - half..n)
    }
}

#[derive(Clone, Debug, PartialEq)]
pub enum Row {
    Cells(Vec<String>),
    /// A line across the table in place of left-out rows ("… 980 more rows").
    Gap(String),
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Align {
    Left,
    Right,
}

#[derive(Clone, Debug, Default)]
pub struct Grid {
    /// Column names; empty for a table without a header (key / value summaries).
    pub columns: Vec<String>,
    /// A second header line under the names (polars' data types), when given.
    pub dtypes: Option<Vec<String>>,
    /// Per column; missing entries are right-aligned (numbers).
    pub align: Vec<Align>,
    pub rows: Vec<Row>,
    /// A line above the table ("shape: (1000, 5)").
    pub caption: Option<String>,
    /// The HTML `class` (for styling and for tests).
    pub class: &'static str,
}

impl Grid {
    /// Rows `0..n` drawn by `cell(row, column)` for `0..columns`, eliding the middle of long
    /// and wide tables (see [`shown`]). The column names, dtypes and alignments must already be
    /// elided the same way, with [`elide`].
    pub fn rows_of(
        n: usize,
        columns: usize,
        mut cell: impl FnMut(usize, usize) -> String,
    ) -> Vec<Row> {
        let (head, tail) = shown(n, MAX_ROWS);
        let (left, right) = shown(columns, MAX_COLUMNS);
        let mut row = |r: usize| {
            let mut cells: Vec<String> = left.clone().map(|c| clip(&cell(r, c))).collect();
            if !right.is_empty() {
                cells.push("…".into());
                cells.extend(right.clone().map(|c| clip(&cell(r, c))));
            }
            Row::Cells(cells)
        };
        let mut rows: Vec<Row> = head.map(&mut row).collect();
        if !tail.is_empty() {
            rows.push(Row::Gap(format!("… {} more rows", n - 2 * tail.len())));
            rows.extend(tail.map(row));
        }
        rows
    }

    fn width(&self) -> usize {
        self.rows
            .iter()
            .filter_map(|r| match r {
                Row::Cells(c) => Some(c.len()),
                Row::Gap(_) => None,
            })
            .chain([self.columns.len()])
            .max()
            .unwrap_or(0)
    }

    fn align(&self, col: usize) -> Align {
        self.align.get(col).copied().unwrap_or(Align::Right)
    }

    pub fn text(&self) -> String {
        let width = self.width();
        let mut lines: Vec<Vec<String>> = Vec::new();
        if !self.columns.is_empty() {
            lines.push(self.columns.clone());
        }
        if let Some(d) = &self.dtypes {
            lines.push(d.clone());
        }
        let widths: Vec<usize> = (0..width)
            .map(|i| {
                let cells = self.rows.iter().filter_map(|r| match r {
                    Row::Cells(c) => c.get(i),
                    Row::Gap(_) => None,
                });
                lines
                    .iter()
                    .filter_map(|l| l.get(i))
                    .chain(cells)
                    .map(|s| s.chars().count())
                    .max()
                    .unwrap_or(0)
            })
            .collect();
        let fmt = |cols: &[String]| {
            let line: Vec<String> = cols
                .iter()
                .enumerate()
                .map(|(i, c)| match self.align(i) {
                    Align::Right => format!("{c:>w$}", w = widths[i]),
                    Align::Left => format!("{c:<w$}", w = widths[i]),
                })
                .collect();
            line.join("  ").trim_end().to_string()
        };
        let mut out: Vec<String> = self.caption.iter().cloned().collect();
        out.extend(lines.iter().map(|l| fmt(l)));
        for row in &self.rows {
            out.push(match row {
                Row::Cells(c) => fmt(c),
                Row::Gap(g) => g.clone(),
            });
        }
        out.join("\n")
    }

    pub fn html(&self) -> String {
        let cell = |tag: &str, i: usize, s: &str| {
            let align = match self.align(i) {
                Align::Right => "right",
                Align::Left => "left",
            };
            format!(
                "<{tag} style=\"padding:2px 10px;text-align:{align};font-variant-numeric:tabular-nums;white-space:pre\">{}</{tag}>",
                escape(s)
            )
        };
        let mut h = String::new();
        if let Some(c) = &self.caption {
            h.push_str(&format!(
                "<div style=\"font-size:11px;color:{GREY}\">{}</div>",
                escape(c)
            ));
        }
        h.push_str(&format!(
            "<table class=\"{}\" style=\"border-collapse:collapse;margin:4px 0;font-size:12px\">",
            self.class
        ));
        if !self.columns.is_empty() {
            h.push_str("<thead><tr>");
            for (i, c) in self.columns.iter().enumerate() {
                h.push_str(&cell("th", i, c));
            }
            h.push_str("</tr>");
            if let Some(d) = &self.dtypes {
                h.push_str(&format!("<tr style=\"color:{GREY};font-size:11px\">"));
                for (i, c) in d.iter().enumerate() {
                    h.push_str(&cell("td", i, c));
                }
                h.push_str("</tr>");
            }
            h.push_str("</thead>");
        }
        h.push_str("<tbody>");
        let width = self.width().max(1);
        for row in &self.rows {
            match row {
                Row::Cells(cells) => {
                    h.push_str("<tr>");
                    for (i, c) in cells.iter().enumerate() {
                        let tag = if self.columns.is_empty() && i == 0 { "th" } else { "td" };
                        h.push_str(&cell(tag, i, c));
                    }
                    h.push_str("</tr>");
                }
                Row::Gap(g) => h.push_str(&format!(
                    "<tr><td colspan=\"{width}\" style=\"padding:2px 10px;color:{GREY}\">{}</td></tr>",
                    escape(g)
                )),
            }
        }
        h.push_str("</tbody></table>");
        h
    }

    pub fn bundle(&self) -> crate::Bundle {
        let mut b = crate::Bundle::new();
        b.insert("text/plain".into(), self.text().into());
        b.insert("text/html".into(), self.html().into());
        b
    }
}

/// A per-column list (names, dtypes, alignments) elided as [`Grid::rows_of`] elides the cells,
/// with `gap` in place of the left-out columns.
pub fn elide<T: Clone>(items: &[T], gap: T) -> Vec<T> {
    let (left, right) = shown(items.len(), MAX_COLUMNS);
    let mut out: Vec<T> = items[left].to_vec();
    if !right.is_empty() {
        out.push(gap);
        out.extend_from_slice(&items[right]);
    }
    out
}

/// A value cut to [`MAX_CELL_CHARS`] characters, on one line.
fn clip(s: &str) -> String {
    let one_line = s.replace('\n', "\\n");
    if one_line.chars().count() <= MAX_CELL_CHARS {
        one_line
    } else {
        let mut out: String = one_line.chars().take(MAX_CELL_CHARS - 1).collect();
        out.push('…');
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn grid(n: usize, cols: usize) -> Grid {
        let names: Vec<String> = (0..cols).map(|c| format!("c{c}")).collect();
        Grid {
            columns: elide(&names, "…".into()),
            rows: Grid::rows_of(n, cols, |r, c| format!("{r}.{c}")),
            class: "t",
            ..Grid::default()
        }
    }

    #[test]
    fn short_tables_are_shown_whole() {
        assert_eq!(shown(3, 20), (0..3, 3..3));
        let text = grid(3, 2).text();
        assert_eq!(text, " c0   c1\n0.0  0.1\n1.0  1.1\n2.0  2.1");
    }

    #[test]
    fn long_tables_show_head_and_tail_around_a_gap() {
        let g = grid(1000, 2);
        assert_eq!(g.rows.len(), MAX_ROWS + 1);
        assert_eq!(g.rows[MAX_ROWS / 2], Row::Gap("… 980 more rows".into()));
        assert_eq!(g.rows[0], Row::Cells(vec!["0.0".into(), "0.1".into()]));
        assert_eq!(
            g.rows[MAX_ROWS],
            Row::Cells(vec!["999.0".into(), "999.1".into()])
        );
        let html = g.html();
        assert!(html.contains("colspan=\"2\""), "{html}");
        assert!(html.contains("… 980 more rows"));
    }

    #[test]
    fn wide_tables_show_both_edges_around_an_ellipsis_column() {
        let g = grid(2, 40);
        let half = MAX_COLUMNS / 2;
        assert_eq!(g.columns.len(), MAX_COLUMNS + 1);
        assert_eq!(g.columns[half], "…");
        assert_eq!(g.columns[half + 1], "c32");
        match &g.rows[1] {
            Row::Cells(c) => {
                assert_eq!(c.len(), MAX_COLUMNS + 1);
                assert_eq!(c[half], "…");
                assert_eq!(c.last().unwrap(), "1.39");
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn cells_are_escaped_clipped_and_on_one_line() {
        let values = [format!("<b>{}", "x".repeat(100)), "a\nb".to_string()];
        let g = Grid {
            columns: vec!["text".into()],
            align: vec![Align::Left],
            rows: Grid::rows_of(2, 1, |r, _| values[r].clone()),
            ..Grid::default()
        };
        let html = g.html();
        assert!(html.contains("&lt;b&gt;") && !html.contains("<b>"));
        let text = g.text();
        let first = text.lines().nth(1).unwrap();
        assert_eq!(first.chars().count(), MAX_CELL_CHARS);
        assert!(first.ends_with('…'));
        assert_eq!(text.lines().nth(2).unwrap(), "a\\nb");
    }

    #[test]
    fn headerless_tables_draw_keys_as_row_headers() {
        let g = Grid {
            rows: vec![Row::Cells(vec!["status".into(), "finished".into()])],
            align: vec![Align::Left, Align::Left],
            ..Grid::default()
        };
        assert_eq!(g.text(), "status  finished");
        assert!(g
            .html()
            .contains("<th style=\"padding:2px 10px;text-align:left"));
        assert!(!g.html().contains("<thead>"));
    }

    #[test]
    fn dtypes_and_caption_are_drawn_under_and_above() {
        let mut g = grid(1, 2);
        g.dtypes = Some(vec!["i64".into(), "str".into()]);
        g.caption = Some("shape: (1, 2)".into());
        assert_eq!(g.text(), "shape: (1, 2)\n c0   c1\ni64  str\n0.0  0.1");
        assert!(g.html().contains(">i64</td>"));
    }
}
