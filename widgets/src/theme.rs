//! The widgets' colours, readable on light and dark notebook themes. Each is defined once, as
//! the CSS the HTML views write; the plots draw with the same colours ([`rgb`]).

use plotters::style::RGBColor;

/// Running; the training loss.
pub const BLUE: &str = "#1565c0";
/// Succeeded, the best trial; validation accuracy.
pub const GREEN: &str = "#2e7d32";
/// Failed, errors; the validation loss.
pub const RED: &str = "#c62828";
/// Stopped, warnings, restarts.
pub const ORANGE: &str = "#ef6c00";
/// Waiting, pruned, notes; lines in the background.
pub const GREY: &str = "#757575";

/// Colours of the sweep plot's labelled lines, one per trial; no grey, which is for the
/// unlabelled lines.
pub const LINES: [RGBColor; 10] = [
    rgb("#1f77b4"),
    rgb("#ff7f0e"),
    rgb("#2ca02c"),
    rgb("#d62728"),
    rgb("#9467bd"),
    rgb("#8c564b"),
    rgb("#e377c2"),
    rgb("#17becf"),
    rgb("#bcbd22"),
    rgb("#393b79"),
];

/// A `#rrggbb` colour as plotters draws it.
pub const fn rgb(css: &str) -> RGBColor {
    const fn digit(c: u8) -> u8 {
        match c {
            b'0'..=b'9' => c - b'0',
            b'a'..=b'f' => c - b'a' + 10,
            b'A'..=b'F' => c - b'A' + 10,
            _ => panic!("a colour is #rrggbb"),
        }
    }
    let b = css.as_bytes();
    assert!(b.len() == 7 && b[0] == b'#', "a colour is #rrggbb");
    RGBColor(
        digit(b[1]) * 16 + digit(b[2]),
        digit(b[3]) * 16 + digit(b[4]),
        digit(b[5]) * 16 + digit(b[6]),
    )
}

/// A plotters colour as CSS: `#rrggbb`.
pub fn css(c: RGBColor) -> String {
    format!("#{:02x}{:02x}{:02x}", c.0, c.1, c.2)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn css_and_plot_colours_are_the_same_colour() {
        assert_eq!(rgb(BLUE), RGBColor(0x15, 0x65, 0xc0));
        assert_eq!(rgb("#EF6C00"), RGBColor(0xef, 0x6c, 0x00));
        for c in [BLUE, GREEN, RED, ORANGE, GREY] {
            assert_eq!(css(rgb(c)), c);
        }
        assert_eq!(css(LINES[0]), "#1f77b4");
    }
}
