//! A cell that ran and failed (a `?` returned an error, or it panicked) as the error the
//! notebook shows: the message, the cell line it can be placed on, and a panic's backtrace.

use super::outcome::{Outcome, red};
use crate::{scan, verdict};

/// A cell whose `?` returned an error or that panicked: an error reply that names the message
/// and, where it can be told, the cell line that failed.
pub(super) fn failed_cell(
    code: &str,
    failure: Option<verdict::Failure>,
    generated: impl FnOnce() -> Option<String>,
) -> Outcome {
    let Some(f) = failure else {
        let evalue = "the cell failed (its message is printed above)".to_string();
        return Outcome::headline("Error", evalue);
    };
    let generated = match f.kind {
        verdict::FailureKind::Panic => generated(),
        verdict::FailureKind::Error => None,
    };
    let (ename, place) = match f.kind {
        verdict::FailureKind::Error => ("Error", question_mark_lines(code)),
        verdict::FailureKind::Panic => {
            let line = (f.file.as_deref() == Some("src/lib.rs"))
                .then(|| {
                    f.line
                        .and_then(|l| cell_line_of(code, generated.as_deref()?, l))
                })
                .flatten();
            ("Panic", line.into_iter().collect())
        }
    };
    let message = if f.message.is_empty() {
        match f.kind {
            verdict::FailureKind::Error => "a `?` in the cell returned an error".to_string(),
            verdict::FailureKind::Panic => "the cell panicked".to_string(),
        }
    } else {
        f.message
    };
    let mut traceback: Vec<String> = message
        .lines()
        .enumerate()
        .map(|(i, l)| {
            if i == 0 {
                format!("{}: {l}", red(ename))
            } else {
                l.to_string()
            }
        })
        .collect();
    let lines: Vec<&str> = code.lines().collect();
    match place.as_slice() {
        [n] => traceback.push(format!("  at cell line {n}: {}", lines[n - 1].trim())),
        [] => match (f.kind, f.file, f.line) {
            (verdict::FailureKind::Panic, Some(file), Some(line)) if file != "src/lib.rs" => {
                traceback.push(format!("  at {file}:{line}"))
            }
            _ => {}
        },
        many => traceback.push(format!(
            "  at one of the `?` on cell lines {}",
            many.iter()
                .map(|n| n.to_string())
                .collect::<Vec<_>>()
                .join(", ")
        )),
    }
    if let Some(trace) = &f.backtrace {
        traceback.extend(backtrace_lines(code, generated.as_deref(), trace));
    }
    Outcome::error(ename, message, traceback)
}

/// A panic's backtrace as the user reads it: their own functions and libraries, innermost
/// first, each placed on a cell line where it is in this cell. Cells are compiled without
/// debug info, so their frames have no lines unless the user turned it on; a cell frame
/// without one says nothing the error's `at cell line` does not, and is left out.
fn backtrace_lines(code: &str, generated: Option<&str>, trace: &str) -> Vec<String> {
    let lines: Vec<&str> = code.lines().collect();
    let mut out = Vec::new();
    for frame in verdict::user_frames(trace) {
        let cell_line = match (&frame.at, generated) {
            (Some((file, line)), Some(source)) if file.ends_with("src/lib.rs") => {
                cell_line_of(code, source, *line)
            }
            _ => None,
        };
        let name = if frame.is_cell() {
            "the cell"
        } else {
            frame
                .function
                .strip_prefix("ctx::")
                .unwrap_or(&frame.function)
        };
        let entry = match (cell_line, &frame.at) {
            (Some(n), _) => format!("  {name}, cell line {n}: {}", lines[n - 1].trim()),
            (None, _) if frame.is_cell() => continue,
            (None, Some((file, line))) if !file.ends_with("src/lib.rs") => {
                format!("  {name}, {file}:{line}")
            }
            _ => format!("  {name}"),
        };
        if out.last() != Some(&entry) {
            out.push(entry);
        }
    }
    if !out.is_empty() {
        out.insert(
            0,
            "backtrace (RUST_BACKTRACE is set), innermost first:".into(),
        );
    }
    out
}

/// The 1-based cell lines that hold a `?` operator (outside strings, chars and comments).
pub(super) fn question_mark_lines(code: &str) -> Vec<usize> {
    let mut lines: Vec<usize> = scan::code(code)
        .iter()
        .filter(|t| t.kind == scan::T![?])
        .map(|t| code[..t.at].matches('\n').count() + 1)
        .collect();
    lines.dedup();
    lines
}

/// The cell line that evcxr's generated source has at `line` (1-based), matched by its text.
fn cell_line_of(code: &str, generated: &str, line: u32) -> Option<usize> {
    let text = generated.lines().nth(line.checked_sub(1)? as usize)?.trim();
    if text.is_empty() {
        return None;
    }
    code.lines()
        .position(|l| same_statement(l.trim(), text))
        .map(|i| i + 1)
}

/// Whether `ran` is the cell's line `written`, possibly with the type the kernel added to its
/// `let` (`let v = f();` runs as `let v: u32 = f();`, see `infer`).
fn same_statement(written: &str, ran: &str) -> bool {
    if written == ran {
        return true;
    }
    let Some(eq) = written.find(" = ").filter(|_| written.starts_with("let ")) else {
        return false;
    };
    let (head, tail) = written.split_at(eq);
    ran.len() > written.len()
        && ran.starts_with(head)
        && ran.ends_with(tail)
        && ran[head.len()..].starts_with(':')
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_the_lines_with_a_question_mark() {
        let code = "let a = f()?;\nlet s = \"why?\"; // ok?\nlet c = '?';\n/* x? */ g()?.h()?;";
        assert_eq!(question_mark_lines(code), [1, 4]);
        let code = "let s = r#\"a \"?\"#;\nlet c = '\\'';\nf::<'a>(b'?')?;";
        assert_eq!(question_mark_lines(code), [3]);
    }

    #[test]
    fn a_panic_is_placed_on_the_cell_line_with_the_same_text() {
        let generated = "fn x() {\n    let v = None::<u32>.unwrap();\n}";
        let code = "let w = 1;\nlet v = None::<u32>.unwrap();";
        assert_eq!(cell_line_of(code, generated, 2), Some(2));
        assert_eq!(cell_line_of(code, generated, 9), None);
        // The kernel may have given the binding its type before compiling.
        let typed = "fn x() {\n    let v: u32 = None::<u32>.unwrap();\n}";
        assert_eq!(cell_line_of(code, typed, 2), Some(2));
        assert!(!same_statement("let v = a;", "let w: u8 = a;"));
    }

    #[test]
    fn a_failed_cell_is_an_error_that_names_its_line() {
        let failure = verdict::Failure {
            kind: verdict::FailureKind::Error,
            message: "No such file or directory (os error 2)".into(),
            file: None,
            line: None,
            backtrace: None,
        };
        let code = "let n = 1;\nstd::fs::read(\"/nonexistent\")?;";
        let Outcome::Error(error) = failed_cell(code, Some(failure), || None) else {
            panic!("not an error")
        };
        assert_eq!(error.ename, "Error");
        assert_eq!(error.evalue, "No such file or directory (os error 2)");
        assert_eq!(
            error.traceback.last().unwrap(),
            "  at cell line 2: std::fs::read(\"/nonexistent\")?;"
        );
    }

    #[test]
    fn a_backtrace_names_the_cell_lines_and_the_libraries() {
        let code = "let x = 1;\ndeep(x);";
        let generated =
            "fn deep(x: u32) {\n    panic!(\"boom\");\n}\nfn run_user_code_3() {\n    deep(x);\n}";
        let trace = "\
   0: core::panicking::panic_fmt
   1: ctx::deep
             at ./src/lib.rs:2:5
   2: trainbook_api::job::Job::wait
             at /work/prelude/api/src/job.rs:44:9
   3: ctx::run_user_code_3::{{closure}}
             at ./src/lib.rs:5:5
   4: ctx::run_user_code_3
             at ./src/lib.rs:4:1
   5: evcxr::runtime::Runtime::run_loop
";
        assert_eq!(
            backtrace_lines(code, Some(generated), trace),
            [
                "backtrace (RUST_BACKTRACE is set), innermost first:",
                "  deep",
                "  trainbook_api::job::Job::wait, /work/prelude/api/src/job.rs:44",
                "  the cell, cell line 2: deep(x);",
            ]
        );
    }
}
