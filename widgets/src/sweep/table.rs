//! The sweep table: one row per trial (its parameters, status, steps, the metric's latest and
//! best value, time, and a note when one says why it was pruned or failed), the best trial's
//! row starred. Aligned text for terminals; HTML with the status coloured, the best row
//! highlighted and each labelled plot line's colour beside its trial's number.

use super::plot::plot_lines;
use super::{SweepView, TrialRow};
use crate::format::{format_duration, format_metric};
use crate::grid::{Align, Grid, Row};
use crate::html::escape;
use crate::theme::{css, BLUE, GREEN, GREY, ORANGE, RED};
use plotters::style::RGBColor;
use trainbook_api::TrialStatus;

/// The HTML status cell's symbol (`×` is also the plot's pruned marker).
fn status_symbol(s: TrialStatus) -> &'static str {
    match s {
        TrialStatus::Pending => "○",
        TrialStatus::Running => "●",
        TrialStatus::Pruned => "×",
        TrialStatus::Succeeded => "✓",
        TrialStatus::Failed => "✗",
        TrialStatus::Stopped => "■",
    }
}

/// The status colour (readable on light and dark notebook themes).
pub fn status_color(s: TrialStatus) -> &'static str {
    match s {
        TrialStatus::Pending | TrialStatus::Pruned => GREY,
        TrialStatus::Running => BLUE,
        TrialStatus::Succeeded => GREEN,
        TrialStatus::Failed => RED,
        TrialStatus::Stopped => ORANGE,
    }
}

impl TrialRow {
    /// `120/480`, `120` (total unknown), `–` (pending, nothing done); thousands separated
    /// (`1,200/4,800`) as every table shows counts.
    fn step_text(&self) -> String {
        if self.state == TrialStatus::Pending && self.step == 0 {
            "–".into()
        } else if self.total_steps > 0 {
            format!("{}/{}", count(self.step), count(self.total_steps))
        } else {
            count(self.step)
        }
    }
}

impl SweepView {
    /// Whether the note column has anything to show.
    fn has_notes(&self) -> bool {
        self.trials
            .iter()
            .any(|t| t.note.as_deref().is_some_and(|n| !n.trim().is_empty()))
    }

    /// Column names and alignments. A parameter column is right-aligned when every value in it
    /// is a number.
    fn columns(&self) -> (Vec<String>, Vec<Align>) {
        let mut names = vec!["trial".to_string()];
        let mut align = vec![Align::Right];
        for (i, p) in self.params.iter().enumerate() {
            names.push(p.clone());
            let numeric = self
                .trials
                .iter()
                .filter_map(|t| t.params.get(i))
                .all(|v| v.trim().parse::<f64>().is_ok());
            align.push(if numeric { Align::Right } else { Align::Left });
        }
        names.push("status".into());
        align.push(Align::Left);
        names.push("step".into());
        align.push(Align::Right);
        names.push(format!("latest {}", self.metric));
        align.push(Align::Right);
        names.push(format!("best {}", self.metric));
        align.push(Align::Right);
        names.push("time".into());
        align.push(Align::Right);
        if self.has_notes() {
            names.push("note".into());
            align.push(Align::Left);
        }
        (names, align)
    }

    /// A trial's cells after the trial column: parameters, status, step, latest, best, time
    /// (and note, when the table has that column).
    fn cells(&self, t: &TrialRow, notes: bool) -> Vec<String> {
        let dash = || "–".to_string();
        let mut cells: Vec<String> = (0..self.params.len())
            .map(|i| t.params.get(i).cloned().unwrap_or_else(dash))
            .collect();
        cells.push(t.state.name().into());
        cells.push(t.step_text());
        cells.push(t.latest.map(format_metric).unwrap_or_else(dash));
        cells.push(t.best.map(format_metric).unwrap_or_else(dash));
        cells.push(if t.state == TrialStatus::Pending && t.elapsed <= 0.0 {
            dash()
        } else {
            format_duration(t.elapsed)
        });
        if notes {
            cells.push(note_line(t.note.as_deref()));
        }
        cells
    }

    /// The table as text: every trial, the best one's number marked `★`.
    pub(super) fn table_text(&self) -> String {
        let (columns, align) = self.columns();
        let notes = self.has_notes();
        let rows = self
            .trials
            .iter()
            .enumerate()
            .map(|(i, t)| {
                let mark = if self.is_best(i) { "★ " } else { "" };
                let mut cells = vec![format!("{mark}{}", t.id)];
                cells.extend(self.cells(t, notes));
                Row::Cells(cells)
            })
            .collect();
        Grid {
            columns,
            align,
            rows,
            class: "trainbook-sweep-table",
            ..Grid::default()
        }
        .text()
    }

    /// The table as HTML: every trial (in a scrolling box when long), the best row bold on a
    /// green tint, status cells coloured, labelled plot lines' colours beside the trial numbers.
    pub(super) fn table_html(&self) -> String {
        let (columns, align) = self.columns();
        let notes = self.has_notes();
        let colors: Vec<Option<RGBColor>> = if self.plot {
            let mut c = vec![None; self.trials.len()];
            for l in plot_lines(self).iter().filter(|l| l.labelled) {
                c[l.index] = Some(l.color);
            }
            c
        } else {
            vec![None; self.trials.len()]
        };
        let status_col = 1 + self.params.len();
        let note_col = status_col + 5;
        let style = |i: usize| {
            let a = match align.get(i) {
                Some(Align::Left) => "left",
                _ => "right",
            };
            let wrap = if i == note_col {
                "white-space:normal;min-width:12em;max-width:36em"
            } else {
                "white-space:pre"
            };
            format!("padding:2px 8px;text-align:{a};font-variant-numeric:tabular-nums;{wrap}")
        };
        let mut h = String::from(
            "<div style=\"display:inline-block;max-width:100%;max-height:36em;overflow:auto;margin:4px 0;vertical-align:top\">\
             <table class=\"trainbook-sweep-table\" style=\"border-collapse:collapse;font-size:12px\"><thead><tr>",
        );
        for (i, c) in columns.iter().enumerate() {
            h.push_str(&format!(
                "<th style=\"{};position:sticky;top:0;background:var(--jp-layout-color1,var(--vscode-editor-background,#fff));\
                 border-bottom:1px solid rgba(127,127,127,0.45)\">{}</th>",
                style(i),
                escape(c)
            ));
        }
        h.push_str("</tr></thead><tbody>");
        for (i, t) in self.trials.iter().enumerate() {
            let best = self.is_best(i);
            let row_style = if best {
                "font-weight:bold;background:rgba(46,125,50,0.16)"
            } else if t.state == TrialStatus::Pending {
                "opacity:0.6"
            } else {
                ""
            };
            h.push_str(&format!("<tr style=\"{row_style}\">"));
            let swatch = colors[i]
                .map(|c| format!("<span style=\"color:{}\">━</span> ", css(c)))
                .unwrap_or_default();
            let mark = if best { "★ " } else { "" };
            h.push_str(&format!(
                "<td style=\"{}\" title=\"trial {}\">{swatch}{mark}{}</td>",
                style(0),
                t.id,
                t.id
            ));
            for (j, cell) in self.cells(t, notes).iter().enumerate() {
                let col = j + 1;
                let content = if col == status_col {
                    format!(
                        "<span style=\"color:{}\">{} {}</span>",
                        status_color(t.state),
                        status_symbol(t.state),
                        escape(cell)
                    )
                } else if col == note_col && t.state == TrialStatus::Failed {
                    format!("<span style=\"color:{RED}\">{}</span>", escape(cell))
                } else if col == note_col {
                    format!("<span style=\"color:{GREY}\">{}</span>", escape(cell))
                } else {
                    escape(cell)
                };
                h.push_str(&format!("<td style=\"{}\">{content}</td>", style(col)));
            }
            h.push_str("</tr>");
        }
        h.push_str("</tbody></table></div>");
        h
    }
}

/// A count as tables show it: `12,345` (`trainbook_api::Value::display_short`).
fn count(n: u64) -> String {
    trainbook_api::Value::UInt(n).display_short()
}

/// The first line of a note, or "" (one line per row).
fn note_line(note: Option<&str>) -> String {
    note.and_then(|n| n.lines().map(str::trim).find(|l| !l.is_empty()))
        .unwrap_or("")
        .to_string()
}

#[cfg(test)]
mod tests {
    use super::super::fixtures::{parse_html, sweep};
    use super::*;
    use crate::logs::LogLine;
    use serde_json::Value;

    #[test]
    fn states_have_names_and_know_when_they_are_finished() {
        let names: Vec<&str> = [
            TrialStatus::Pending,
            TrialStatus::Running,
            TrialStatus::Pruned,
            TrialStatus::Succeeded,
            TrialStatus::Failed,
            TrialStatus::Stopped,
        ]
        .iter()
        .map(|s| s.name())
        .collect();
        assert_eq!(
            names,
            [
                "pending",
                "running",
                "pruned",
                "succeeded",
                "failed",
                "stopped"
            ]
        );
        assert!(!TrialStatus::Pending.is_finished());
        assert!(!TrialStatus::Running.is_finished());
        assert!(TrialStatus::Pruned.is_finished());
        assert!(TrialStatus::Succeeded.is_finished());
        assert!(TrialStatus::Failed.is_finished());
        assert!(TrialStatus::Stopped.is_finished());
        assert_eq!(status_color(TrialStatus::Running), BLUE);
        assert_eq!(status_color(TrialStatus::Succeeded), GREEN);
        assert_eq!(status_color(TrialStatus::Failed), RED);
    }

    #[test]
    fn text_is_an_aligned_table_with_the_best_trial_starred() {
        let mut v = sweep();
        v.finished = true;
        v.footer = Some("results: runs/sweep-1/results.csv".into());
        v.logs.push(LogLine {
            rank: None,
            text: "[trial 3] epoch 2 done".into(),
            repeats: None,
            is_error: false,
        });
        let t = v.text();
        let lines: Vec<&str> = t.lines().collect();
        assert_eq!(
            lines[1],
            "2 running · 1 pruned · 3 pending · finished after 1m 05s"
        );
        assert_eq!(
            lines[2],
            "best: trial 3 (lr=0.001, batch=32) eval_loss 0.5120"
        );
        let table = [
            "trial       lr  batch  status      step  latest eval_loss  best eval_loss    time  note",
            "    1     0.01     32  pruned   120/480            0.6930          0.6930   30.0s  pruned at report 1: 0.693 worse than 0.651",
            "    2    0.003     32  running  240/480            0.6000          0.6000  1m 00s",
            "  ★ 3    0.001     32  running  240/480            0.5120          0.5120  1m 00s",
            "    4   0.0003     32  pending        –                 –               –       –",
            "    5   0.0001     32  pending        –                 –               –       –",
            "    6  0.00003     32  pending        –                 –               –       –",
        ];
        assert_eq!(lines[3..10], table, "{t}");
        assert_eq!(lines[10], "results: runs/sweep-1/results.csv");
        assert_eq!(lines[11], "[trial 3] epoch 2 done");
        assert_eq!(t.matches('★').count(), 1);
    }

    #[test]
    fn steps_are_counts_with_thousands_separators() {
        let row = |step, total_steps, state| TrialRow {
            step,
            total_steps,
            state,
            ..TrialRow::default()
        };
        assert_eq!(
            row(12000, 48000, TrialStatus::Running).step_text(),
            "12,000/48,000"
        );
        assert_eq!(row(1234, 0, TrialStatus::Running).step_text(), "1,234");
        assert_eq!(row(999, 999, TrialStatus::Succeeded).step_text(), "999/999");
        assert_eq!(row(0, 1000, TrialStatus::Pending).step_text(), "–");
    }

    #[test]
    fn html_highlights_the_best_row_and_colours_status() {
        let v = sweep();
        let h = v.html();
        let doc = parse_html(&h);
        let rows: Vec<_> = doc
            .descendants()
            .filter(|n| n.has_tag_name("tbody"))
            .flat_map(|b| b.children().filter(|n| n.has_tag_name("tr")))
            .collect();
        assert_eq!(rows.len(), 6);
        let highlighted: Vec<usize> = rows
            .iter()
            .enumerate()
            .filter(|(_, r)| {
                r.attribute("style")
                    .unwrap_or("")
                    .contains("font-weight:bold")
            })
            .map(|(i, _)| i)
            .collect();
        assert_eq!(highlighted, [2], "only trial 3's row");
        let first_cell: String = rows[2]
            .children()
            .next()
            .unwrap()
            .descendants()
            .filter_map(|n| n.text())
            .collect();
        assert!(first_cell.ends_with("★ 3"), "{first_cell:?}");
        assert_eq!(h.matches("★ 3<").count(), 1);
        assert!(h.contains(&format!("<span style=\"color:{BLUE}\">● running</span>")));
        assert!(h.contains(&format!("<span style=\"color:{GREY}\">× pruned</span>")));
        assert!(h.contains("best: trial 3 (lr=0.001, batch=32) eval_loss 0.5120"));
        // Pending rows are dimmed, numbers tabular, the header sticks.
        assert!(rows[3].attribute("style").unwrap().contains("opacity:0.6"));
        assert!(h.contains("font-variant-numeric:tabular-nums"));
        assert!(h.contains("position:sticky"));
        let b = v.bundle();
        assert_eq!(b.len(), 2);
        assert_eq!(b["text/plain"], Value::String(v.text()));
        assert_eq!(b["text/html"], Value::String(h.clone()));
    }
}
