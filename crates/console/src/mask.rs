//! Data above an approver's sensitivity ceiling, masked: a person whose grants reach only
//! `confidential` data sees a `restricted` call's redacted fields (an IBAN) as their last four
//! characters, so they can still tell "the same account" from "another one" without reading it.

use serde_json::Value;
use toolgate_core::Registry;

/// What a masked value shows in place of the value.
pub const MASK: &str = "••••";

/// True when `viewer` may not read `tool`'s redacted fields in clear.
pub fn masks(registry: &Registry, viewer: &str, tool: &str) -> bool {
    registry
        .tool(tool)
        .is_some_and(|t| t.config.sensitivity > registry.sensitivity_ceiling(viewer))
}

/// One value, masked: a string keeps its last four characters, anything else is hidden.
pub fn value(v: &Value) -> Value {
    match v {
        Value::String(s) => {
            let n = s.chars().count();
            let tail: String = s.chars().skip(n.saturating_sub(4)).collect();
            if n > 8 {
                Value::String(format!("{MASK}{tail}"))
            } else {
                Value::String(MASK.into())
            }
        }
        Value::Null => Value::Null,
        _ => Value::String(MASK.into()),
    }
}

/// True when the dotted `path` is one of `tool`'s redacted fields (or inside one).
pub fn is_redacted(registry: &Registry, tool: &str, path: &str) -> bool {
    registry.tool(tool).is_some_and(|t| {
        t.config
            .redact
            .iter()
            .any(|r| path == r || path.starts_with(&format!("{r}.")))
    })
}

/// `inputs` as `viewer` may see them: redacted fields masked when the tool's sensitivity is
/// above the viewer's ceiling, unchanged otherwise.
pub fn inputs(registry: &Registry, viewer: &str, tool: &str, inputs: &Value) -> Value {
    if !masks(registry, viewer, tool) {
        return inputs.clone();
    }
    let Some(t) = registry.tool(tool) else {
        return inputs.clone();
    };
    let mut out = inputs.clone();
    for r in &t.config.redact {
        let pointer = format!("/{}", r.replace('.', "/"));
        if let Some(at) = out.pointer_mut(&pointer) {
            *at = value(at);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn strings_keep_their_last_four_characters() {
        assert_eq!(value(&json!("ES9121000418450200051332")), json!("••••1332"));
        assert_eq!(value(&json!("short")), json!("••••"));
        assert_eq!(value(&json!(12)), json!("••••"));
    }
}
