//! Completion and hover (Tab and Shift-Tab): the trainbook-aware analyzer's answer where it
//! has one, else evcxr's own.

use super::Completion;
use super::analyzer::Analysis;
use crate::analysis::Analyzer;
use crate::completion::{Match, insert_text};
use evcxr::CommandContext;

/// Completions at `cursor` (a byte offset into `code`).
pub(super) fn complete(
    ctx: &mut CommandContext,
    analysis: &mut Analysis,
    code: &str,
    cursor: usize,
) -> Option<Completion> {
    analysis
        .get()
        .and_then(|a| trainbook_completions(ctx, a, code, cursor))
        .or_else(|| {
            let c = ctx.completions(code, cursor).ok()?;
            Some(Completion {
                matches: c
                    .completions
                    .into_iter()
                    .map(|c| Match {
                        text: insert_text(&c.code).to_string(),
                        kind: c.kind,
                        signature: c.label,
                    })
                    .collect(),
                start: c.start_offset,
                end: c.end_offset,
            })
        })
}

/// What Shift-Tab shows for the name at `cursor`: plain text and HTML.
pub(super) fn inspect(
    ctx: &mut CommandContext,
    analysis: &mut Analysis,
    code: &str,
    cursor: usize,
) -> Option<(String, String)> {
    analysis
        .get()
        .and_then(|a| trainbook_hover(ctx, a, code, cursor))
        .or_else(|| ctx.hover_at(code, cursor).ok())
}

/// Marks the cursor in the cell so it can be found in the source evcxr writes for it.
const CURSOR: &str = "trainbook_cursor_mark";

/// The source evcxr analyses for `code` (earlier variables and items around the cell) and the
/// cursor's offset in it. evcxr writes that source to its crate's `src/lib.rs` when asked for
/// completions; the cursor is marked so it can be found there.
fn analysed_source(ctx: &mut CommandContext, code: &str, cursor: usize) -> Option<(String, usize)> {
    let marked = format!("{}{CURSOR}{}", code.get(..cursor)?, code.get(cursor..)?);
    ctx.completions(&marked, cursor + CURSOR.len()).ok()?;
    let source = ctx.last_source().ok()?;
    let at = source.find(CURSOR)?;
    Some((source.replacen(CURSOR, "", 1), at))
}

fn trainbook_completions(
    ctx: &mut CommandContext,
    analyzer: &mut Analyzer,
    code: &str,
    cursor: usize,
) -> Option<Completion> {
    let (source, at) = analysed_source(ctx, code, cursor)?;
    let c = analyzer.completions(&source, at).ok()?;
    // The replaced text surrounds the cursor, so it maps back by the same distances.
    let start = cursor.checked_sub(at.checked_sub(c.start)?)?;
    let end = cursor + c.end.checked_sub(at)?;
    (end <= code.len()).then_some(Completion {
        matches: c.matches,
        start,
        end,
    })
}

fn trainbook_hover(
    ctx: &mut CommandContext,
    analyzer: &mut Analyzer,
    code: &str,
    cursor: usize,
) -> Option<(String, String)> {
    let (source, at) = analysed_source(ctx, code, cursor)?;
    // Jupyter puts the cursor after the name it asks about.
    analyzer
        .hover(&source, at)
        .or_else(|| analyzer.hover(&source, at.checked_sub(1)?))
}
