//! The little HTML every widget needs.

/// Escapes text for HTML element content and double-quoted attributes.
pub fn escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

/// Colours shared by the widgets (readable on light and dark notebook themes).
pub const BLUE: &str = "#1565c0";
pub const GREEN: &str = "#2e7d32";
pub const RED: &str = "#c62828";
pub const ORANGE: &str = "#ef6c00";
pub const GREY: &str = "#757575";
