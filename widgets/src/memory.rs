//! Memory per rank at the end of a run: what the parameters, gradients, optimizer state and
//! communication buffers take, and the peak. Where ZeRO pays off is visible at a glance: the
//! optimizer-state column shrinks to 1/W. A job of many ranks stays a short table: beyond
//! [`MAX_ROWS`] ranks, ranks whose parts are the same share a row (their peaks as a range).

pub use trainbook_api::MemoryUse;

use trainbook_api::plumbing::format::format_ranks;

use crate::grid::{Grid, Row};

/// Most rows the table has, however many ranks the job had.
pub const MAX_ROWS: usize = 16;

/// One row of the table: the ranks it stands for, their parts (those of its first rank; the
/// same for all of them unless `mixed`), and the lowest and highest peak among them.
struct Group<'a> {
    ranks: Vec<usize>,
    parts: &'a MemoryUse,
    mixed: bool,
    peaks: (u64, u64),
}

/// The table's rows: one per rank up to [`MAX_ROWS`] ranks; beyond, one per set of equal
/// parts, and the sets past the first `MAX_ROWS - 1` in one last row.
fn groups(rows: &[MemoryUse]) -> Vec<Group<'_>> {
    let key = |r: &MemoryUse| (r.parameters, r.gradients, r.optimizer_state, r.buffers);
    let mut out: Vec<Group> = Vec::new();
    for r in rows {
        let same = (rows.len() > MAX_ROWS)
            .then(|| out.iter().position(|g| key(g.parts) == key(r)))
            .flatten()
            .or_else(|| (out.len() >= MAX_ROWS).then_some(MAX_ROWS - 1));
        match same {
            Some(i) => {
                let g = &mut out[i];
                g.mixed |= key(g.parts) != key(r);
                g.ranks.push(r.rank);
                // A peak of 0 is one that could not be read: not the lowest.
                let low = match (g.peaks.0, r.peak) {
                    (0, p) | (p, 0) => p,
                    (a, b) => a.min(b),
                };
                g.peaks = (low, g.peaks.1.max(r.peak));
            }
            None => out.push(Group {
                ranks: vec![r.rank],
                parts: r,
                mixed: false,
                peaks: (r.peak, r.peak),
            }),
        }
    }
    out
}

fn peak_cell(g: &Group) -> String {
    match g.peaks {
        (_, 0) => "–".into(),
        (lo, hi) if lo == hi => format_bytes(hi),
        (lo, hi) => format!("{}–{}", format_bytes(lo), format_bytes(hi)),
    }
}

/// Bytes in the unit people read them in: `512 B`, `3.4 MiB`, `1.25 GiB`.
pub fn format_bytes(b: u64) -> String {
    const KIB: f64 = 1024.0;
    let b = b as f64;
    if b < KIB {
        format!("{b} B")
    } else if b < KIB * KIB {
        format!("{:.1} KiB", b / KIB)
    } else if b < KIB * KIB * KIB {
        format!("{:.1} MiB", b / (KIB * KIB))
    } else {
        format!("{:.2} GiB", b / (KIB * KIB * KIB))
    }
}

fn grid(rows: &[MemoryUse]) -> Grid {
    let peak_name = match rows.first().map(|r| r.peak_of.as_str()) {
        Some("rss") => "peak RSS".to_string(),
        Some(d) if !d.is_empty() => format!("peak {d}"),
        _ => "peak".to_string(),
    };
    let columns = [
        "rank",
        "parameters",
        "gradients",
        "optimizer",
        "buffers",
        &peak_name,
    ];
    Grid {
        columns: columns.iter().map(|c| c.to_string()).collect(),
        rows: groups(rows)
            .iter()
            .map(|g| {
                let r = g.parts;
                let part = |b: u64| {
                    if g.mixed {
                        "…".to_string()
                    } else {
                        format_bytes(b)
                    }
                };
                Row::Cells(vec![
                    format_ranks(&g.ranks),
                    part(r.parameters),
                    part(r.gradients),
                    part(r.optimizer_state),
                    part(r.buffers),
                    peak_cell(g),
                ])
            })
            .collect(),
        class: "trainbook-memory",
        ..Grid::default()
    }
}

/// The table as text; empty without rows.
pub fn memory_text(rows: &[MemoryUse]) -> String {
    if rows.is_empty() {
        return String::new();
    }
    format!("memory per rank:\n{}", grid(rows).text())
}

/// The table as HTML, folded under a summary line; empty without rows.
pub fn memory_html(rows: &[MemoryUse]) -> String {
    if rows.is_empty() {
        return String::new();
    }
    format!(
        "<details><summary style=\"color:{}\">memory per rank</summary>{}</details>",
        crate::theme::GREY,
        grid(rows).html()
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bytes_read_in_their_unit() {
        assert_eq!(format_bytes(512), "512 B");
        assert_eq!(format_bytes(3 * 1024 + 512), "3.5 KiB");
        assert_eq!(format_bytes(440 << 20), "440.0 MiB");
        assert_eq!(format_bytes(5 << 29), "2.50 GiB");
    }

    #[test]
    fn one_line_per_rank_with_the_peak_named() {
        let row = |rank, opt| MemoryUse {
            rank,
            parameters: 420 << 20,
            gradients: 420 << 20,
            optimizer_state: opt,
            buffers: 25 << 20,
            peak: 3 << 30,
            peak_of: "rss".into(),
        };
        let text = memory_text(&[row(0, 420 << 20), row(1, 420 << 20)]);
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines[0], "memory per rank:");
        assert!(
            lines[1].contains("optimizer") && lines[1].contains("peak RSS"),
            "{text}"
        );
        assert!(
            lines[2].trim_start().starts_with('0') && lines[2].contains("420.0 MiB"),
            "{text}"
        );
        assert_eq!(lines.len(), 4, "{text}");
        let html = memory_html(&[row(0, 1)]);
        assert!(
            html.contains("trainbook-memory") && html.contains("1 B"),
            "{html}"
        );
        assert_eq!(memory_text(&[]), "");
        assert_eq!(memory_html(&[]), "");
    }

    #[test]
    fn a_thousand_ranks_make_a_short_table() {
        // ZeRO-1 over 1,024 ranks: the last rank's optimizer shard is smaller; peaks vary.
        let rows: Vec<MemoryUse> = (0..1024)
            .map(|rank| MemoryUse {
                rank,
                parameters: 420 << 20,
                gradients: 420 << 20,
                optimizer_state: if rank == 1023 { 1 << 20 } else { 2 << 20 },
                buffers: 25 << 20,
                peak: (3 << 30) + rank as u64 * (1 << 20),
                peak_of: "rss".into(),
            })
            .collect();
        let text = memory_text(&rows);
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), 4, "{text}");
        assert!(
            lines[2].trim_start().starts_with("0-1022")
                && lines[2].contains("2.0 MiB")
                && lines[2].contains("3.00 GiB–4.00 GiB"),
            "{text}"
        );
        assert!(
            lines[3].trim_start().starts_with("1023") && lines[3].contains("1.0 MiB"),
            "{text}"
        );
        assert!(memory_html(&rows).len() < 4096);

        // Every rank different: the first 15 alone, the rest in one row whose parts are mixed.
        let apart: Vec<MemoryUse> = (0..100)
            .map(|rank| MemoryUse {
                rank,
                optimizer_state: rank as u64,
                ..rows[0].clone()
            })
            .collect();
        let text = memory_text(&apart);
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), 2 + MAX_ROWS, "{text}");
        let last = lines.last().unwrap();
        assert!(
            last.trim_start().starts_with("15-99") && last.contains('…'),
            "{text}"
        );
    }
}
