//! What a completion offers: the text a client inserts, and the kind and signature JupyterLab
//! shows beside it (`complete_reply`'s metadata, as ipykernel writes it).

use serde_json::{Value, json};

/// One completion: the text a client inserts, and what JupyterLab shows beside it.
#[derive(Debug, Clone, PartialEq)]
pub struct Match {
    pub text: String,
    /// ipykernel's kinds: function, class, module, keyword, instance, ...
    pub kind: &'static str,
    /// The item's signature or type (`fn(&mut self, T)`), empty when unknown.
    pub signature: String,
}

/// A `complete_reply`'s `metadata`: each match's kind and signature, under the key ipykernel
/// uses (`_jupyter_types_experimental`), in character offsets `start..end`.
pub fn reply_metadata(
    matches: &[Match],
    start: usize,
    end: usize,
) -> serde_json::Map<String, Value> {
    let types: Vec<Value> = matches
        .iter()
        .map(|m| {
            json!({
                "start": start,
                "end": end,
                "text": m.text,
                "type": m.kind,
                "signature": m.signature,
            })
        })
        .collect();
    let mut metadata = serde_json::Map::new();
    metadata.insert("_jupyter_types_experimental".into(), Value::Array(types));
    metadata
}

/// What a completion inserts, from evcxr's text for it: a call's name without the
/// placeholder arguments (`push(value)` → `push`).
pub fn insert_text(code: &str) -> &str {
    match code.find('(') {
        Some(i) if code.ends_with(')') && i > 0 => &code[..i],
        _ => code,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_match_is_what_to_insert_and_its_kind_goes_beside_it() {
        assert_eq!(insert_text("push(value)"), "push");
        assert_eq!(insert_text("len()"), "len");
        assert_eq!(insert_text("value"), "value");
        let m = Match {
            text: "push".into(),
            kind: "function",
            signature: "fn(&mut self, T)".into(),
        };
        let meta = reply_metadata(&[m], 3, 5);
        assert_eq!(
            meta["_jupyter_types_experimental"],
            json!([{"start": 3, "end": 5, "text": "push", "type": "function",
                    "signature": "fn(&mut self, T)"}])
        );
    }
}
