//! How a cell's final value is shown in the trainbook kernel.
//!
//! evcxr shows a cell's final value by compiling `value.evcxr_display()`, and when that does
//! not compile, compiling the cell again with the value's `Debug` form. [`ShowValue`] (in scope
//! through the prelude) gives every `Debug` value that method, so a cell that shows a value is
//! one compile instead of two; it prints the rich bundle of trainbook's values (tables, results,
//! jobs: drawn by the engine) and the `Debug` text of anything else, in evcxr's content-block
//! format on stdout, which the kernel turns into the cell's `execute_result`.

use std::any::Any;

use anyhow::Result;

use crate::runtime::port;

/// A value's rich display: MIME type → content (`text/html`, `text/plain`, ...).
pub type Bundle = serde_json::Map<String, serde_json::Value>;

/// The engine's side of the notebook: how values are drawn and how this process reaches the
/// trainbook kernel. The `trainbook` crate implements it (see `crate::runtime`).
pub trait Notebook: Send + Sync {
    /// Connects this process to the trainbook kernel's display channel, when it runs in one.
    fn attach_notebook(&self) -> Result<bool>;
    /// The rich display of trainbook's values (tables, results, jobs); `None` for other values.
    fn display(&self, value: &dyn Any) -> Option<Bundle>;
}

/// Connects this process to the trainbook kernel's display channel (the kernel's first cell
/// calls it); `Ok(false)` outside the kernel.
pub fn attach() -> Result<bool> {
    port::<dyn Notebook>()?.attach_notebook()
}

/// The text a notebook shows for `value` (its rich display's `text/plain`), when the engine
/// is loaded and draws such values.
pub(crate) fn plain_text(value: &dyn Any) -> Option<String> {
    let bundle = port::<dyn Notebook>().ok()?.display(value)?;
    bundle.get("text/plain")?.as_str().map(String::from)
}

/// How a cell's final value is shown (evcxr calls the method by this name).
pub trait ShowValue {
    fn evcxr_display(&self);
}

// The generic part is one call: it is compiled into every cell that shows a value (once per
// value type), the rest once, here.
impl<T: std::fmt::Debug + 'static> ShowValue for T {
    fn evcxr_display(&self) {
        show(self, self)
    }
}

fn show(any: &dyn Any, debug: &dyn std::fmt::Debug) {
    let bundle = port::<dyn Notebook>()
        .ok()
        .and_then(|r| r.display(any))
        .unwrap_or_else(|| {
            let mut b = Bundle::new();
            b.insert("text/plain".into(), format!("{debug:?}").into());
            b
        });
    print!("{}", content_blocks(&bundle));
}

/// A bundle in evcxr's stdout format: one `EVCXR_BEGIN_CONTENT <mime>` … `EVCXR_END_CONTENT`
/// block per type.
pub fn content_blocks(bundle: &Bundle) -> String {
    let mut out = String::new();
    for (mime, value) in bundle {
        if let Some(text) = value.as_str() {
            out.push_str(&format!(
                "EVCXR_BEGIN_CONTENT {mime}\n{text}\nEVCXR_END_CONTENT\n"
            ));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn content_blocks_are_what_evcxr_reads() {
        let mut b = Bundle::new();
        b.insert("text/html".into(), "<b>x</b>".into());
        b.insert("text/plain".into(), "x".into());
        assert_eq!(
            content_blocks(&b),
            "EVCXR_BEGIN_CONTENT text/html\n<b>x</b>\nEVCXR_END_CONTENT\n\
             EVCXR_BEGIN_CONTENT text/plain\nx\nEVCXR_END_CONTENT\n"
        );
    }
}
