//! Code-completeness for console front ends (`is_complete_request`) and the unicode-character
//! offsets Jupyter uses versus the byte offsets evcxr uses.

use jupyter_protocol::IsCompleteReply;

/// Incomplete while a bracket, string or block comment is still open; invalid when a closing
/// bracket has no opener. Enough for a console to decide whether Enter runs the cell.
pub fn is_complete(code: &str) -> IsCompleteReply {
    let mut depth: i64 = 0;
    let mut chars = code.chars().peekable();
    let mut block_comments = 0u32;
    while let Some(c) = chars.next() {
        if block_comments > 0 {
            match (c, chars.peek()) {
                ('*', Some('/')) => {
                    chars.next();
                    block_comments -= 1;
                }
                ('/', Some('*')) => {
                    chars.next();
                    block_comments += 1;
                }
                _ => {}
            }
            continue;
        }
        match c {
            '/' if chars.peek() == Some(&'/') => {
                for c in chars.by_ref() {
                    if c == '\n' {
                        break;
                    }
                }
            }
            '/' if chars.peek() == Some(&'*') => {
                chars.next();
                block_comments += 1;
            }
            '"' => {
                let mut closed = false;
                while let Some(c) = chars.next() {
                    match c {
                        '\\' => {
                            chars.next();
                        }
                        '"' => {
                            closed = true;
                            break;
                        }
                        _ => {}
                    }
                }
                if !closed {
                    return IsCompleteReply::incomplete(String::new());
                }
            }
            '(' | '[' | '{' => depth += 1,
            ')' | ']' | '}' => {
                depth -= 1;
                if depth < 0 {
                    return IsCompleteReply::invalid();
                }
            }
            _ => {}
        }
    }
    if depth > 0 || block_comments > 0 {
        IsCompleteReply::incomplete("    ".repeat(depth.max(0) as usize))
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
    fn offsets_count_code_points() {
        let code = "let é = 1;";
        assert_eq!(char_to_byte(code, 5), 6);
        assert_eq!(byte_to_char(code, 6), 5);
        assert_eq!(char_to_byte(code, 100), code.len());
    }
}
