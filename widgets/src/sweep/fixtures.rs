//! What the sweep view's tests share: a sweep of six trials, and readers of its SVG and HTML.

use super::{SweepView, TrialRow};
use crate::logs::LogLevel;
use trainbook_api::{Goal, TrialStatus};

pub(super) fn trial(id: usize, lr: &str, state: TrialStatus, curve: &[(u64, f64)]) -> TrialRow {
    let best = curve.iter().map(|p| p.1).reduce(f64::min);
    TrialRow {
        id,
        params: vec![lr.into(), "32".into()],
        state,
        step: curve.last().map_or(0, |p| p.0),
        total_steps: 480,
        latest: curve.last().map(|p| p.1),
        best,
        elapsed: curve.len() as f64 * 30.0,
        curve: curve.to_vec(),
        note: None,
    }
}

/// Six trials, two running, one pruned, three pending; trial 3 is the best.
pub(super) fn sweep() -> SweepView {
    let mut v = SweepView::new(
        "sweep · bert · 6 trials, 2 at a time".into(),
        "eval_loss".into(),
        Goal::Min,
        vec!["lr".into(), "batch".into()],
        LogLevel::Info,
    );
    v.trials = vec![
        TrialRow {
            note: Some("pruned at report 1: 0.693 worse than 0.651".into()),
            ..trial(1, "0.01", TrialStatus::Pruned, &[(120, 0.693)])
        },
        trial(
            2,
            "0.003",
            TrialStatus::Running,
            &[(120, 0.651), (240, 0.60)],
        ),
        trial(
            3,
            "0.001",
            TrialStatus::Running,
            &[(120, 0.62), (240, 0.512)],
        ),
        trial(4, "0.0003", TrialStatus::Pending, &[]),
        trial(5, "0.0001", TrialStatus::Pending, &[]),
        trial(6, "0.00003", TrialStatus::Pending, &[]),
    ];
    v.best = Some(2);
    v.elapsed = 65.0;
    v
}

/// The trials' lines in an SVG document, (stroke, stroke-width, point count): polylines
/// drawn opaque (coloured lines) or at 0.35 (faint ones); label leaders are drawn at 0.5.
pub(super) fn polylines(svg: &str) -> Vec<(String, String, usize)> {
    let doc = roxmltree::Document::parse(svg).expect("the SVG is well-formed XML");
    doc.descendants()
        .filter(|n| n.has_tag_name("polyline"))
        .filter(|n| matches!(n.attribute("opacity"), Some("1") | Some("0.35")))
        .map(|n| {
            (
                n.attribute("stroke").unwrap_or("").to_string(),
                n.attribute("stroke-width").unwrap_or("").to_string(),
                n.attribute("points")
                    .unwrap_or("")
                    .split_whitespace()
                    .count(),
            )
        })
        .collect()
}

pub(super) fn texts(svg: &str) -> Vec<String> {
    let doc = roxmltree::Document::parse(svg).unwrap();
    doc.descendants()
        .filter(|n| n.has_tag_name("text"))
        .map(|n| n.text().unwrap_or("").trim().to_string())
        .collect()
}

/// The HTML parsed as XML (it is written well-formed, so a stray `<` shows up here).
pub(super) fn parse_html(html: &str) -> roxmltree::Document<'_> {
    roxmltree::Document::parse(html).unwrap_or_else(|e| panic!("{e}: {html}"))
}
