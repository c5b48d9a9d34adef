//! What a client may say about a call in `_meta`: why (purpose, reason, evidence), which run it
//! belongs to, which model and prompt revision made it, and approval tokens it was given. It is
//! recorded and used by the checks; it never says who the caller is. Every field is bounded
//! here, where it enters: a purpose, reason, run id or evidence list out of bounds is a problem
//! the schema check refuses the call with (naming `_meta.<field>`), and descriptive fields (the
//! model, the prompt revision, usage) are cut to size.

use serde_json::{Map, Value, json};
use toolgate_core::ApprovalToken;
use toolgate_core::clip::{NAME_CHARS, clip};
use toolgate_core::schema::FieldError;
use toolgate_store::Actor;

/// The longest `_meta.purpose` (purposes are short identifiers).
const PURPOSE_CHARS: usize = 64;
/// The longest `_meta.reason`.
const REASON_CHARS: usize = 2_000;
/// At most this many evidence ids, each at most [`EVIDENCE_CHARS`].
const EVIDENCE_ITEMS: usize = 32;
const EVIDENCE_CHARS: usize = 200;
/// The most bytes of `_meta.usage` kept (token counts and the like).
const USAGE_BYTES: usize = 2_048;

/// The `_meta` fields toolgate reads from a `tools/call`.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct CallContext {
    pub purpose: Option<String>,
    pub reason: Option<String>,
    pub run_id: Option<String>,
    pub evidence: Vec<String>,
    pub approvals: Vec<ApprovalToken>,
    pub actor: Actor,
    /// Fields out of bounds (left out of the context above; the call is refused with them).
    pub problems: Vec<FieldError>,
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

fn too_long(field: &str, max: usize, got: usize) -> FieldError {
    FieldError {
        field: format!("/_meta/{field}"),
        constraint: "maxLength".into(),
        expected: format!("at most {max} characters (got {got})"),
    }
}

impl CallContext {
    /// Reads the fields from a request's `_meta` object. Keys are accepted bare (`purpose`) or
    /// namespaced (`toolgate/purpose`).
    pub fn from_meta(m: &Map<String, Value>) -> CallContext {
        let mut c = Self::read(m);
        let mut problems = Vec::new();
        let mut bound = |field: &str, v: &mut Option<String>, max: usize| {
            if let Some(s) = v.as_deref()
                && s.chars().count() > max
            {
                problems.push(too_long(field, max, s.chars().count()));
                *v = None;
            }
        };
        bound("purpose", &mut c.purpose, PURPOSE_CHARS);
        bound("reason", &mut c.reason, REASON_CHARS);
        bound("run_id", &mut c.run_id, NAME_CHARS);
        if let Some(r) = c.run_id.as_deref()
            && toolgate_core::clip::printable(r) != r
        {
            problems.push(FieldError {
                field: "/_meta/run_id".into(),
                constraint: "pattern".into(),
                expected: "a run id of visible characters, without control or direction characters"
                    .into(),
            });
            c.run_id = None;
        }
        if c.evidence.len() > EVIDENCE_ITEMS {
            problems.push(FieldError {
                field: "/_meta/evidence".into(),
                constraint: "maxItems".into(),
                expected: format!("at most {EVIDENCE_ITEMS} ids (got {})", c.evidence.len()),
            });
            c.evidence.truncate(EVIDENCE_ITEMS);
        }
        if let Some(long) = c
            .evidence
            .iter()
            .find(|e| e.chars().count() > EVIDENCE_CHARS)
        {
            problems.push(too_long("evidence", EVIDENCE_CHARS, long.chars().count()));
            c.evidence.retain(|e| e.chars().count() <= EVIDENCE_CHARS);
        }
        for v in [&mut c.actor.model, &mut c.actor.prompt_rev]
            .into_iter()
            .flatten()
        {
            *v = clip(v, NAME_CHARS).into_owned();
        }
        if let Some(u) = &c.actor.usage {
            let bytes = toolgate_core::canonical(u).len();
            if bytes > USAGE_BYTES {
                c.actor.usage = Some(json!({"$omitted": {"bytes": bytes}}));
            }
        }
        c.problems = problems;
        c
    }

    fn read(m: &Map<String, Value>) -> CallContext {
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
            problems: Vec::new(),
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
    fn fields_out_of_bounds_are_problems_and_left_out() {
        let m = json!({
            "purpose": "p".repeat(65),
            "reason": "r".repeat(2_001),
            "run_id": "run\u{202e}1",
            "evidence": (0..40).map(|i| format!("e{i}")).collect::<Vec<_>>(),
            "model": "m".repeat(500),
            "usage": {"blob": "u".repeat(5_000)},
        });
        let c = CallContext::from_meta(m.as_object().unwrap());
        let fields: Vec<(&str, &str)> = c
            .problems
            .iter()
            .map(|p| (p.field.as_str(), p.constraint.as_str()))
            .collect();
        assert_eq!(
            fields,
            [
                ("/_meta/purpose", "maxLength"),
                ("/_meta/reason", "maxLength"),
                ("/_meta/run_id", "pattern"),
                ("/_meta/evidence", "maxItems")
            ]
        );
        assert_eq!((c.purpose, c.reason, c.run_id), (None, None, None));
        assert_eq!(c.evidence.len(), 32);
        assert!(c.actor.model.unwrap().chars().count() < 200);
        assert!(
            c.actor.usage.unwrap()["$omitted"]["bytes"]
                .as_u64()
                .unwrap()
                > 5_000
        );
    }

    #[test]
    fn blank_values_are_absent() {
        let m = json!({"purpose": "  ", "reason": ""});
        let c = CallContext::from_meta(m.as_object().unwrap());
        assert_eq!(c.purpose, None);
        assert_eq!(c.reason, None);
    }
}
