//! Data above an approver's sensitivity ceiling, masked: a person whose grants reach only
//! `confidential` data sees a `restricted` call's redacted and destination fields (an IBAN) as
//! their last four characters, so they can still tell "the same account" from "another one"
//! without reading it. The decision facts of a lookup tool above their ceiling are masked
//! whole, and a masked value is scrubbed from every text beside it (the reason, the evidence,
//! the run so far), so it cannot be read there instead.

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

/// True when `viewer` may not read `tool`'s data at all (a lookup tool's answer): its
/// sensitivity is above their ceiling.
pub fn above_ceiling(registry: &Registry, viewer: &str, tool: &str) -> bool {
    masks(registry, viewer, tool)
}

/// True when the dotted `path` of `tool`'s inputs is masked for a viewer it is above the
/// ceiling of: a redacted field (or inside one), or one that chooses a destination.
pub fn is_masked_field(registry: &Registry, tool: &str, path: &str) -> bool {
    is_redacted(registry, tool, path) || crate::item::is_destination(registry.tool(tool), path)
}

/// Masks `facts` for `viewer`: every fact of a lookup tool above their ceiling (its value and
/// the mismatches' values), and the values of redacted fields of any lookup tool in the
/// mismatches too. Returns the clear strings it hid, to scrub from the texts beside them.
pub fn facts(
    registry: &Registry,
    viewer: &str,
    request_tool: &str,
    facts: &mut [crate::facts::Facts],
) -> Vec<String> {
    let mut hidden = Vec::new();
    let inputs_masked = masks(registry, viewer, request_tool);
    for f in facts.iter_mut() {
        let whole = above_ceiling(registry, viewer, &f.tool);
        let lookup_tool = f.tool.clone();
        let redacted = |field: &str| {
            registry
                .tool(&lookup_tool)
                .is_some_and(|t| t.config.redact.iter().any(|r| r == field))
        };
        let fields: std::collections::BTreeMap<String, String> = registry
            .tool(request_tool)
            .and_then(|t| t.config.approval_context.iter().find(|l| l.tool == f.tool))
            .map(|l| l.show.clone())
            .unwrap_or_default();
        // A destination or redacted fact of a call above the ceiling (the account a
        // confidential payment goes to) is masked as the same input would be.
        let sensitive = |label: &str| {
            let field = fields.get(label).map(String::as_str).unwrap_or(label);
            inputs_masked && (redacted(field) || crate::item::is_destination(None, field))
        };
        for x in &mut f.facts {
            if (whole || sensitive(&x.label)) && !x.masked && !x.value.is_null() {
                remember(&mut hidden, &x.value);
                x.value = value(&x.value);
                x.masked = true;
            }
        }
        let show: Vec<(String, bool)> = f
            .facts
            .iter()
            .map(|x| (x.label.clone(), x.masked))
            .collect();
        for m in &mut f.mismatches {
            let fact_masked = show.iter().any(|(l, masked)| *l == m.label && *masked);
            let field = fields.get(&m.label).map(String::as_str).unwrap_or(&m.label);
            if whole || fact_masked || redacted(field) || sensitive(&m.label) {
                remember(&mut hidden, &m.found);
                m.found = value(&m.found);
            }
            if whole || (inputs_masked && is_masked_field(registry, request_tool, &m.input)) {
                remember(&mut hidden, &m.sent);
                m.sent = value(&m.sent);
            }
        }
        if whole && let Some((_, p)) = &mut f.party {
            remember(&mut hidden, p);
            *p = value(p);
        }
    }
    hidden
}

/// Keeps the clear text of a string value that is being masked (short ones are left: masking
/// "EUR" out of every sentence would hide nothing and garble the rest).
fn remember(hidden: &mut Vec<String>, v: &Value) {
    if let Value::String(s) = v
        && s.chars().count() >= 6
        && !hidden.contains(s)
    {
        hidden.push(s.clone());
    }
}

/// `text` with every `hidden` value in it replaced by its mask.
pub fn scrub(text: &str, hidden: &[String]) -> String {
    let mut out = text.to_string();
    for h in hidden {
        if out.contains(h.as_str())
            && let Value::String(m) = value(&Value::String(h.clone()))
        {
            out = out.replace(h.as_str(), &m);
        }
    }
    out
}

/// The clear strings `inputs` holds in the fields masked for `viewer` (see [`inputs`]).
pub fn hidden_inputs(registry: &Registry, viewer: &str, tool: &str, inputs: &Value) -> Vec<String> {
    let mut hidden = Vec::new();
    if masks(registry, viewer, tool) {
        for (path, v) in crate::item::leaves(inputs) {
            if is_masked_field(registry, tool, &path) {
                remember(&mut hidden, &v);
            }
        }
    }
    hidden
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

/// `inputs` as `viewer` may see them: redacted and destination fields masked when the tool's
/// sensitivity is above the viewer's ceiling, unchanged otherwise.
pub fn inputs(registry: &Registry, viewer: &str, tool: &str, inputs: &Value) -> Value {
    if !masks(registry, viewer, tool) {
        return inputs.clone();
    }
    let mut out = inputs.clone();
    for (path, _) in crate::item::leaves(inputs) {
        if path.is_empty() || !is_masked_field(registry, tool, &path) {
            continue;
        }
        let pointer = format!(
            "/{}",
            path.replace('~', "~0").replace('/', "~1").replace('.', "/")
        );
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

    #[test]
    fn a_hidden_value_is_scrubbed_from_text_beside_it() {
        let hidden = vec!["DE44500105175407324931".to_string()];
        assert_eq!(
            scrub("pay to DE44500105175407324931 today", &hidden),
            "pay to ••••4931 today"
        );
        assert_eq!(scrub("nothing here", &hidden), "nothing here");
    }
}
