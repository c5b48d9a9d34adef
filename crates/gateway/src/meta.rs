//! What a client may say about a call in `_meta`: why (purpose, reason, evidence), which run it
//! belongs to, which model and prompt revision made it, and approval tokens it was given. It is
//! recorded and used by the checks; it never says who the caller is.

use serde_json::{Map, Value};
use toolgate_core::ApprovalToken;
use toolgate_store::Actor;

/// The `_meta` fields toolgate reads from a `tools/call`.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct CallContext {
    pub purpose: Option<String>,
    pub reason: Option<String>,
    pub run_id: Option<String>,
    pub evidence: Vec<String>,
    pub approvals: Vec<ApprovalToken>,
    pub actor: Actor,
}

fn text(m: &Map<String, Value>, keys: &[&str]) -> Option<String> {
    keys.iter()
        .find_map(|k| m.get(*k).and_then(Value::as_str))
        .map(str::to_string)
        .filter(|s| !s.trim().is_empty())
}

fn texts(m: &Map<String, Value>, keys: &[&str]) -> Vec<String> {
    let mut out = Vec::new();
    for k in keys {
        match m.get(*k) {
            Some(Value::String(s)) if !s.is_empty() => out.push(s.clone()),
            Some(Value::Array(a)) => {
                out.extend(a.iter().filter_map(Value::as_str).map(str::to_string))
            }
            _ => {}
        }
    }
    out
}

impl CallContext {
    /// Reads the fields from a request's `_meta` object. Keys are accepted bare (`purpose`) or
    /// namespaced (`toolgate/purpose`).
    pub fn from_meta(m: &Map<String, Value>) -> CallContext {
        CallContext {
            purpose: text(m, &["purpose", "toolgate/purpose"]),
            reason: text(m, &["reason", "toolgate/reason"]),
            run_id: text(m, &["run_id", "toolgate/run_id"]),
            evidence: texts(m, &["evidence", "toolgate/evidence"]),
            approvals: texts(
                m,
                &[
                    "approval_token",
                    "approval_tokens",
                    "toolgate/approval_token",
                    "toolgate/approval_tokens",
                ],
            )
            .into_iter()
            .map(ApprovalToken::from_wire)
            .collect(),
            actor: Actor {
                model: text(m, &["model", "toolgate/model"]),
                prompt_rev: text(m, &["prompt_rev", "toolgate/prompt_rev"]),
                usage: m.get("usage").or_else(|| m.get("toolgate/usage")).cloned(),
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn reads_bare_and_namespaced_keys() {
        let m = json!({
            "purpose": "billing",
            "toolgate/reason": "pay invoice INV-00000001 against PO-77812",
            "run_id": "run-1",
            "evidence": ["inv:1", "po:2"],
            "approval_token": "tok",
            "model": "m-1",
            "progressToken": 3
        });
        let c = CallContext::from_meta(m.as_object().unwrap());
        assert_eq!(c.purpose.as_deref(), Some("billing"));
        assert_eq!(
            c.reason.as_deref(),
            Some("pay invoice INV-00000001 against PO-77812")
        );
        assert_eq!(c.run_id.as_deref(), Some("run-1"));
        assert_eq!(c.evidence, vec!["inv:1", "po:2"]);
        assert_eq!(c.approvals.len(), 1);
        assert_eq!(c.actor.model.as_deref(), Some("m-1"));
    }

    #[test]
    fn blank_values_are_absent() {
        let m = json!({"purpose": "  ", "reason": ""});
        let c = CallContext::from_meta(m.as_object().unwrap());
        assert_eq!(c.purpose, None);
        assert_eq!(c.reason, None);
    }
}
