//! rustc's errors for a cell as the error the notebook shows, with a hint where a notebook
//! parameter is missing.

use super::outcome::{Outcome, red};

/// rustc's diagnostics drawn over the cell's own code (not evcxr's generated wrapper).
pub(super) fn compile_error(code: &str, errors: &[evcxr::CompilationError]) -> Outcome {
    // An undeclared parameter also leaves rustc unable to type `param!`'s value, which it reports
    // as "`!: Param` is not satisfied": noise next to the hint that says what to fix.
    let undeclared = errors
        .iter()
        .any(|e| undeclared_parameter(code, &e.message()).is_some());
    let errors: Vec<&evcxr::CompilationError> = errors
        .iter()
        .filter(|e| !(undeclared && e.message().contains("Param` is not satisfied")))
        .collect();
    let mut traceback = Vec::new();
    for e in &errors {
        let mut drawn = None;
        if let Some(report) = e.build_report("cell".into(), code.to_string(), evcxr::Theme::Light) {
            let mut buf = Vec::new();
            if report
                .write(("cell".to_string(), ariadne::Source::from(code)), &mut buf)
                .is_ok()
            {
                drawn = Some(String::from_utf8_lossy(&buf).into_owned());
            }
        }
        // ariadne colours every character separately, which makes the text unsearchable in
        // saved notebooks; keep it plain and colour only the headline.
        let text = strip_ansi(&drawn.unwrap_or_else(|| e.rendered()));
        for (i, line) in text.lines().enumerate() {
            traceback.push(if i == 0 { red(line) } else { line.to_string() });
        }
        for help in e.help() {
            traceback.push(format!("help: {help}"));
        }
        if let Some(hint) = undeclared_parameter(code, &e.message()) {
            traceback.push(format!("help: {hint}"));
        }
    }
    let evalue = errors
        .iter()
        .map(|e| {
            let message = e.message();
            match undeclared_parameter(code, &message) {
                Some(hint) => hint,
                None => message,
            }
        })
        .collect::<Vec<_>>()
        .join("; ");
    Outcome::error("CompileError", evalue, traceback)
}

/// papermill (and `scripts/notebook.py`) inject parameters as `let NAME =
/// trainbook::param!(NAME = VALUE)?;`, which needs a `NAME` declared by the notebook's
/// parameters cell; when there is none, rustc only says it cannot find the value. This says
/// what the user did wrong and how to fix it.
fn undeclared_parameter(code: &str, message: &str) -> Option<String> {
    let name = message
        .strip_prefix("cannot find value `")?
        .split_once("` in this scope")?
        .0;
    let injected = code.lines().any(|line| {
        let line: String = line.split_whitespace().collect();
        line.contains(&format!("param!({name}="))
    });
    injected.then(|| {
        format!(
            "the notebook has no parameter `{name}`: its cell tagged `parameters` declares none \
             by that name. Check the spelling of `-p {name}`, or declare it there, e.g. \
             `let {name}: usize = 2;`"
        )
    })
}

fn strip_ansi(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    let mut chars = s.chars();
    while let Some(c) = chars.next() {
        if c == '\x1b' {
            // CSI sequences: ESC [ parameters final-byte
            if chars.next() == Some('[') {
                for c in chars.by_ref() {
                    if c.is_ascii_alphabetic() {
                        break;
                    }
                }
            }
        } else {
            out.push(c);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_injected_parameter_the_notebook_does_not_declare_is_named() {
        let code = "// Parameters\nlet preset = trainbook::param!(preset = \"tiny\")?;\nlet nope = trainbook::param!( nope = 1 )?;";
        let hint = undeclared_parameter(code, "cannot find value `nope` in this scope").unwrap();
        assert!(hint.contains("no parameter `nope`"), "{hint}");
        assert!(hint.contains("-p nope"), "{hint}");
        // Other unknown names keep rustc's message.
        assert_eq!(
            undeclared_parameter(code, "cannot find value `x` in this scope"),
            None
        );
        assert_eq!(
            undeclared_parameter(
                "let y = nope + 1;",
                "cannot find value `nope` in this scope"
            ),
            None
        );
    }

    #[test]
    fn ansi_sequences_are_removed() {
        assert_eq!(strip_ansi("\x1b[38;5;249ml\x1b[0me\x1b[31mt"), "let");
    }
}
