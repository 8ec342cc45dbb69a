//! The one scanner for cell source: rust-analyzer's lexer (rustc's own underneath), so every
//! question about a cell's text (is it complete, which lines hold a `?`, where its `let`s are
//! and what their types say) agrees with the compiler on what is a string, a char, a lifetime
//! or a comment. The callers only count brackets over its tokens.

// The lexer behind `ra_ap_syntax`'s parser; `ra_ap_ide_db` re-exports it.
use ra_ap_ide_db::syntax_helpers::LexedStr;
pub use ra_ap_syntax::{SyntaxKind, T};

#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Token<'a> {
    pub kind: SyntaxKind,
    pub text: &'a str,
    /// Byte offset in the scanned text.
    pub at: usize,
    /// How many brackets are open around the token; a bracket stands outside its own pair, and
    /// one with no opener is at -1. The last token is the end of the text (`EOF`, empty), at the
    /// depth the text leaves open.
    pub depth: i32,
    /// A literal or block comment without its end: it runs to the end of the text.
    pub unterminated: bool,
}

impl Token<'_> {
    pub fn end(&self) -> usize {
        self.at + self.text.len()
    }

    pub fn is_string(&self) -> bool {
        matches!(
            self.kind,
            SyntaxKind::STRING | SyntaxKind::BYTE_STRING | SyntaxKind::C_STRING
        )
    }
}

/// Cell code: `(`, `[` and `{` are its brackets (its `<` may be a comparison).
pub fn code(text: &str) -> Vec<Token<'_>> {
    lex(text, false)
}

/// A type or a pattern: its `<` is a bracket too, and the `>` of `->` closes nothing.
pub fn type_tokens(text: &str) -> Vec<Token<'_>> {
    lex(text, true)
}

fn lex(text: &str, angles: bool) -> Vec<Token<'_>> {
    let lexed = LexedStr::new(crate::analysis::EDITION, text);
    let mut out: Vec<Token> = Vec::with_capacity(lexed.len() + 1);
    let mut depth = 0;
    for i in 0..lexed.len() {
        let kind = lexed.kind(i);
        let range = lexed.text_range(i);
        let arrow = out
            .last()
            .is_some_and(|t| t.kind == T![-] && t.end() == range.start);
        let step = match kind {
            T!['('] | T!['['] | T!['{'] => 1,
            T![')'] | T![']'] | T!['}'] => -1,
            T![<] if angles => 1,
            T![>] if angles && !arrow => -1,
            _ => 0,
        };
        if step < 0 {
            depth += step;
        }
        // An unclosed literal or comment runs to the end; the lexer's messages for that are
        // pinned by the tests below.
        let unterminated = range.end == text.len()
            && lexed.error(i).is_some_and(|e| {
                e.starts_with("Missing trailing") || e == "Invalid raw string literal"
            });
        out.push(Token {
            kind,
            text: &text[range.clone()],
            at: range.start,
            depth,
            unterminated,
        });
        if step > 0 {
            depth += step;
        }
    }
    out.push(Token {
        kind: SyntaxKind::EOF,
        text: "",
        at: text.len(),
        depth,
        unterminated: false,
    });
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use SyntaxKind::*;

    fn kinds(text: &str) -> Vec<(SyntaxKind, &str)> {
        code(text)
            .into_iter()
            .filter(|t| !matches!(t.kind, WHITESPACE | EOF))
            .map(|t| (t.kind, t.text))
            .collect()
    }

    #[test]
    fn chars_are_not_lifetimes() {
        assert_eq!(
            kinds(r#"f::<'a>('"', '{', '\'', b'x', &'static s)"#),
            [
                (IDENT, "f"),
                (T![:], ":"),
                (T![:], ":"),
                (T![<], "<"),
                (LIFETIME_IDENT, "'a"),
                (T![>], ">"),
                (T!['('], "("),
                (CHAR, "'\"'"),
                (T![,], ","),
                (CHAR, "'{'"),
                (T![,], ","),
                (CHAR, r"'\''"),
                (T![,], ","),
                (BYTE, "b'x'"),
                (T![,], ","),
                (T![&], "&"),
                (LIFETIME_IDENT, "'static"),
                (IDENT, "s"),
                (T![')'], ")"),
            ]
        );
    }

    #[test]
    fn comments_and_strings_hide_brackets() {
        let text = r####"/* a /* "{ */ ' */ x // }
r#"a " { "# "{(" b"[" br#"}"# c"\"}" {"####;
        assert_eq!(
            kinds(text),
            [
                (COMMENT, r#"/* a /* "{ */ ' */"#),
                (IDENT, "x"),
                (COMMENT, "// }"),
                (STRING, r##"r#"a " { "#"##),
                (STRING, r#""{(""#),
                (BYTE_STRING, r#"b"[""#),
                (BYTE_STRING, r##"br#"}"#"##),
                (C_STRING, r#"c"\"}""#),
                (T!['{'], "{"),
            ]
        );
        let tokens = code(text);
        assert_eq!(tokens.last().unwrap().depth, 1);
        assert!(tokens.iter().all(|t| !t.unterminated));
    }

    #[test]
    fn depth_counts_brackets_around_a_token() {
        let tokens = code("a(b{c}[d]) }");
        let depth = |s: &str| tokens.iter().find(|t| t.text == s).unwrap().depth;
        assert_eq!(
            ["a", "(", "b", "{", "c", "}", "[", "d", ")"].map(depth),
            [0, 0, 1, 1, 2, 1, 1, 2, 0]
        );
        assert_eq!(tokens.iter().rev().nth(1).unwrap().depth, -1);
        // In code `<` compares; in a type it opens, but not in `->`.
        assert_eq!(code("a < b").last().unwrap().depth, 0);
        let ty = type_tokens("Box<dyn Fn(u8) -> Vec<u8>> x");
        assert_eq!(ty.iter().find(|t| t.text == "x").unwrap().depth, 0);
        assert_eq!(ty.iter().find(|t| t.text == "dyn").unwrap().depth, 1);
    }

    #[test]
    fn unterminated_strings_and_comments_run_to_the_end() {
        for text in [
            "x = \"abc",
            "x = b\"abc",
            "x = r#\"abc\"",
            "/* /* */",
            "/* \" */ \"",
        ] {
            let last = code(text).into_iter().rev().nth(1).unwrap();
            assert!(last.unterminated, "{text}: {last:?}");
        }
        for text in ["\"\\q\"", "'a", "x /* */", "r#\"\"#"] {
            assert!(code(text).iter().all(|t| !t.unterminated), "{text}");
        }
    }
}
