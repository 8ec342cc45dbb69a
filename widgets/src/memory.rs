//! Memory per rank at the end of a run: what the parameters, gradients, optimizer state and
//! communication buffers take, and the peak. Where ZeRO pays off is visible at a glance: the
//! optimizer-state column shrinks to 1/W.

pub use trainbook_api::MemoryUse;

use crate::grid::{Grid, Row};

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
        rows: rows
            .iter()
            .map(|r| {
                let peak = if r.peak > 0 {
                    format_bytes(r.peak)
                } else {
                    "–".into()
                };
                Row::Cells(vec![
                    r.rank.to_string(),
                    format_bytes(r.parameters),
                    format_bytes(r.gradients),
                    format_bytes(r.optimizer_state),
                    format_bytes(r.buffers),
                    peak,
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
        crate::html::GREY,
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
}
