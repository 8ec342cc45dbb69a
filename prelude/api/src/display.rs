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
    /// Shows `data` as a new output of the running cell, under `id` (a new one when `None`);
    /// returns the id. Outside the kernel its `text/plain` is printed.
    fn show_output(&self, id: Option<&str>, data: Bundle) -> Result<String>;
    /// Redraws the output `id` with `data`.
    fn update_output(&self, id: &str, data: Bundle) -> Result<()>;
    /// Clears the running cell's output (with `wait`, once its next output arrives).
    fn clear_output(&self, wait: bool) -> Result<()>;
}

/// An output a cell showed with [`display`] (a Jupyter `display_data` with a display id), which
/// [`DisplayHandle::update`] redraws in place, also after the cell has returned.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DisplayHandle {
    id: String,
}

impl DisplayHandle {
    /// The display id (Jupyter's `transient.display_id`).
    pub fn id(&self) -> &str {
        &self.id
    }

    /// Redraws the output with `data` of type `mime` (see [`display`]).
    pub fn update(&self, mime: &str, data: impl Into<serde_json::Value>) -> Result<()> {
        self.update_bundle(bundle_of_one(mime, data.into())?)
    }

    /// Redraws the output with a whole MIME bundle.
    pub fn update_bundle(&self, bundle: Bundle) -> Result<()> {
        port::<dyn Notebook>()?.update_output(&self.id, checked(bundle)?)
    }
}

/// Shows `data` of MIME type `mime` as an output of the running cell, IPython's `display`:
/// `display("text/html", "<b>done</b>")?`, `display("image/svg+xml", svg)?`,
/// `display("application/json", json)?` (a JSON value, see [`display_json`]; every other type
/// takes text, binary types base64 text: see [`display_png`]). A `text/plain` stand-in is added for front ends
/// that show text only. Returns a handle that redraws the output in place.
pub fn display(mime: &str, data: impl Into<serde_json::Value>) -> Result<DisplayHandle> {
    display_bundle(bundle_of_one(mime, data.into())?)
}

/// Shows any serializable value (a struct of yours, a map, a list) as `application/json`, which
/// JupyterLab draws as a collapsible tree.
pub fn display_json(value: &impl serde::Serialize) -> Result<DisplayHandle> {
    let json = serde_json::to_value(value)
        .map_err(|e| anyhow::anyhow!("display_json: the value does not serialize to JSON: {e}"))?;
    display("application/json", json)
}

/// Shows a PNG image (the file's bytes) as an output of the running cell.
pub fn display_png(png: &[u8]) -> Result<DisplayHandle> {
    use base64::Engine as _;
    if !png.starts_with(b"\x89PNG\r\n\x1a\n") {
        anyhow::bail!(
            "display_png: these {} bytes are not a PNG file (no PNG signature); pass the bytes \
             of a .png file, or use display(\"image/jpeg\", base64_text) for other formats",
            png.len()
        );
    }
    display(
        "image/png",
        base64::engine::general_purpose::STANDARD.encode(png),
    )
}

/// Shows a whole MIME bundle (`{"text/html": ..., "text/plain": ...}`) as one output.
pub fn display_bundle(bundle: Bundle) -> Result<DisplayHandle> {
    let id = port::<dyn Notebook>()?.show_output(None, checked(bundle)?)?;
    Ok(DisplayHandle { id })
}

/// [`display_bundle`] under a display id of your choosing: showing the same id in another cell
/// shows the same output there, and an update redraws every copy.
pub fn display_as(id: &str, bundle: Bundle) -> Result<DisplayHandle> {
    if id.trim().is_empty() {
        anyhow::bail!("display_as: the display id is empty; name the output, e.g. \"loss-plot\"");
    }
    let id = port::<dyn Notebook>()?.show_output(Some(id), checked(bundle)?)?;
    Ok(DisplayHandle { id })
}

/// Clears the running cell's output, IPython's `clear_output`: with `wait`, the old output
/// stays until the next one arrives (for redrawing without flicker).
pub fn clear_output(wait: bool) -> Result<()> {
    port::<dyn Notebook>()?.clear_output(wait)
}

fn bundle_of_one(mime: &str, data: serde_json::Value) -> Result<Bundle> {
    let mut b = Bundle::new();
    b.insert(mime.to_string(), data);
    Ok(b)
}

/// `bundle` with every entry checked (a MIME type, text or JSON as the type wants) and a
/// `text/plain` stand-in when it has none.
fn checked(mut bundle: Bundle) -> Result<Bundle> {
    if bundle.is_empty() {
        anyhow::bail!("nothing to display: the bundle is empty; give it at least one MIME type");
    }
    for (mime, value) in &bundle {
        let Some((kind, sub)) = mime.split_once('/') else {
            anyhow::bail!(
                "`{mime}` is not a MIME type: write it as type/subtype, e.g. text/html, \
                 image/svg+xml, image/png, application/json"
            );
        };
        let valid = |s: &str| {
            !s.is_empty()
                && s.chars()
                    .all(|c| c.is_ascii_alphanumeric() || "-+.".contains(c) || c == '_')
        };
        if !valid(kind) || !valid(sub) {
            anyhow::bail!("`{mime}` is not a MIME type: write it as type/subtype, e.g. text/html");
        }
        let json = sub == "json" || sub.ends_with("+json");
        if !json && !value.is_string() {
            anyhow::bail!(
                "{mime} content must be text (binary types as base64 text); only JSON types \
                 (application/json, ...+json) take a JSON value"
            );
        }
    }
    if !bundle.contains_key("text/plain") {
        let kinds: Vec<&str> = bundle.keys().map(String::as_str).collect();
        bundle.insert(
            "text/plain".into(),
            format!("<{} output>", kinds.join(", ")).into(),
        );
    }
    Ok(bundle)
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
    fn bundles_are_checked_and_get_a_text_stand_in() {
        let b = checked(bundle_of_one("text/html", "<b>x</b>".into()).unwrap()).unwrap();
        assert_eq!(b["text/plain"], "<text/html output>");
        let j = checked(bundle_of_one("application/json", serde_json::json!({"a": 1})).unwrap());
        assert!(j.is_ok());
        let e = checked(bundle_of_one("html", "x".into()).unwrap()).unwrap_err();
        assert!(e.to_string().contains("type/subtype"), "{e}");
        let e = checked(bundle_of_one("image/svg+xml", serde_json::json!([1])).unwrap());
        assert!(e.unwrap_err().to_string().contains("must be text"));
        assert!(display_png(b"GIF89a")
            .unwrap_err()
            .to_string()
            .contains("not a PNG"));
    }

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
