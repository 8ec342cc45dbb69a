//! Code-completeness for console front ends (`is_complete_request`) and the unicode-character
//! offsets Jupyter uses versus the byte offsets evcxr uses.

use crate::scan;
use jupyter_protocol::IsCompleteReply;

/// Incomplete while a bracket, string or block comment is still open; invalid when a closing
/// bracket has no opener. Enough for a console to decide whether Enter runs the cell.
pub fn is_complete(code: &str) -> IsCompleteReply {
    let tokens = scan::code(code);
    if tokens.iter().any(|t| t.depth < 0) {
        return IsCompleteReply::invalid();
    }
    // No indent inside a string: it would become part of the string.
    if tokens.iter().any(|t| t.unterminated && t.is_string()) {
        return IsCompleteReply::incomplete(String::new());
    }
    let open = tokens.last().map_or(0, |t| t.depth);
    if open > 0 || tokens.iter().any(|t| t.unterminated) {
        IsCompleteReply::incomplete("    ".repeat(open.max(0) as usize))
    } else {
        IsCompleteReply::complete()
    }
}

/// Jupyter counts cursor positions in unicode code points.
pub fn char_to_byte(code: &str, chars: usize) -> usize {
    code.char_indices()
        .nth(chars)
        .map(|(b, _)| b)
        .unwrap_or(code.len())
}

pub fn byte_to_char(code: &str, byte: usize) -> usize {
    code.get(..byte.min(code.len()))
        .map(|s| s.chars().count())
        .unwrap_or_else(|| code.chars().count())
}

#[cfg(test)]
mod tests {
    use super::*;
    use jupyter_protocol::IsCompleteReplyStatus as S;

    #[test]
    fn brackets_strings_and_comments() {
        assert_eq!(is_complete("let x = 1;").status, S::Complete);
        assert_eq!(is_complete("fn f() {").status, S::Incomplete);
        assert_eq!(is_complete("fn f() {").indent, "    ");
        assert_eq!(is_complete("let s = \"{\";").status, S::Complete);
        assert_eq!(is_complete("let s = \"abc").status, S::Incomplete);
        assert_eq!(is_complete("// {\nlet x = 1;").status, S::Complete);
        assert_eq!(is_complete("/* { */ 1").status, S::Complete);
        assert_eq!(is_complete("/* /* */").status, S::Incomplete);
        assert_eq!(is_complete("}").status, S::Invalid);
        assert_eq!(is_complete("let s = \"\\\"{\";").status, S::Complete);
    }

    #[test]
    fn chars_and_raw_strings_hold_no_brackets() {
        assert_eq!(is_complete("let c = '{';").status, S::Complete);
        assert_eq!(is_complete("fn f<'a>(s: &'a str) {").indent, "    ");
        assert_eq!(is_complete("let s = r#\"\"}\"#;").status, S::Complete);
        assert_eq!(is_complete("let s = r#\"{").status, S::Incomplete);
        assert_eq!(is_complete("let s = r#\"{").indent, "");
    }

    #[test]
    fn offsets_count_code_points() {
        let code = "let é = 1;";
        assert_eq!(char_to_byte(code, 5), 6);
        assert_eq!(byte_to_char(code, 6), 5);
        assert_eq!(char_to_byte(code, 100), code.len());
    }
}
