//! Decision facts: what a person needs beside the inputs to decide at a glance, looked up when
//! the item is opened through the read tools the tool declares (`approval_context`), the same
//! handler destination lookups use. For a payment: who is paid, to which account (masked), the
//! invoice's own amount and status against the amount being paid, mismatches marked.

use serde_json::Value;
use toolgate_core::Registry;
use toolgate_core::approvers::ContextLookup;
use toolgate_store::{ApprovalRequest, Executor};

/// One looked-up fact.
#[derive(Debug, Clone, PartialEq)]
pub struct Fact {
    pub label: String,
    pub value: Value,
    /// Shown masked (a redacted field of the lookup tool).
    pub masked: bool,
}

/// An input that differs from the looked-up value it must equal.
#[derive(Debug, Clone, PartialEq)]
pub struct Mismatch {
    pub input: String,
    pub label: String,
    pub sent: Value,
    pub found: Value,
}

/// The answer of one declared lookup.
#[derive(Debug, Clone, PartialEq)]
pub struct Facts {
    pub tool: String,
    pub facts: Vec<Fact>,
    pub mismatches: Vec<Mismatch>,
    /// The lookup gave no usable answer (the facts are missing, not "fine").
    pub error: Option<String>,
}

fn same(a: &Value, b: &Value) -> bool {
    match (a.as_f64(), b.as_f64()) {
        (Some(x), Some(y)) => (x - y).abs() < 0.005,
        _ => a == b,
    }
}

/// The record a lookup answered with: `result` names the field (a list: its first item).
fn record<'a>(answer: &'a Value, l: &ContextLookup) -> Option<&'a Value> {
    let v = match &l.result {
        Some(f) => answer.pointer(&format!("/{}", f.replace('.', "/")))?,
        None => answer,
    };
    match v {
        Value::Array(a) => a.first(),
        other => Some(other),
    }
}

/// Reads one declared lookup's answer into facts and mismatches.
pub fn read(
    registry: &Registry,
    req: &ApprovalRequest,
    l: &ContextLookup,
    answer: &Value,
) -> Facts {
    let redacted = |field: &str| {
        registry
            .tool(&l.tool)
            .is_some_and(|t| t.config.redact.iter().any(|r| r == field))
    };
    let Some(rec) = record(answer, l) else {
        return Facts {
            tool: l.tool.clone(),
            facts: Vec::new(),
            mismatches: Vec::new(),
            error: Some(format!("{} found nothing for this call", l.tool)),
        };
    };
    let facts: Vec<Fact> = l
        .show
        .iter()
        .map(|(label, field)| {
            let v = rec.get(field.as_str()).cloned().unwrap_or(Value::Null);
            let masked = redacted(field);
            Fact {
                label: label.clone(),
                value: if masked { crate::mask::value(&v) } else { v },
                masked,
            }
        })
        .collect();
    let mismatches = l
        .expect
        .iter()
        .filter_map(|(input, label)| {
            let field = l.show.get(label).unwrap_or(label);
            let found = rec.get(field.as_str()).cloned().unwrap_or(Value::Null);
            let sent = req
                .inputs
                .get(input.as_str())
                .cloned()
                .unwrap_or(Value::Null);
            (!same(&sent, &found)).then(|| Mismatch {
                input: input.clone(),
                label: label.clone(),
                sent,
                found,
            })
        })
        .collect();
    Facts {
        tool: l.tool.clone(),
        facts,
        mismatches,
        error: None,
    }
}

/// Looks up every fact the request's tool declares, through the executor's handler.
pub async fn look_up(exec: &Executor, req: &ApprovalRequest) -> Vec<Facts> {
    let Some(tool) = exec.registry.tool(&req.tool) else {
        return Vec::new();
    };
    let mut out = Vec::new();
    for l in &tool.config.approval_context {
        let mut inputs = serde_json::Map::new();
        for f in &l.with {
            if let Some(v) = req.inputs.get(f.as_str()) {
                inputs.insert(f.clone(), v.clone());
            }
        }
        let inputs = Value::Object(inputs);
        match exec
            .look_up_for_approval(&req.principal, req.run_id.as_deref(), &l.tool, &inputs)
            .await
        {
            Ok(answer) => out.push(read(&exec.registry, req, l, &answer)),
            Err(e) => out.push(Facts {
                tool: l.tool.clone(),
                facts: Vec::new(),
                mismatches: Vec::new(),
                error: Some(e),
            }),
        }
    }
    out
}

/// Another request for the same operation (same tool, same identity values) in the retention
/// window, whichever run or agent raised it: a duplicate to look at before approving.
pub fn duplicates<'a>(
    registry: &Registry,
    req: &ApprovalRequest,
    all: &'a [ApprovalRequest],
    retention_ms: i64,
) -> Vec<&'a ApprovalRequest> {
    let Some(tool) = registry.tool(&req.tool) else {
        return Vec::new();
    };
    let identity = &tool.config.identity;
    if identity.is_empty() {
        return Vec::new();
    }
    all.iter()
        .filter(|o| {
            o.approval_id != req.approval_id
                && o.tool == req.tool
                && o.status != toolgate_store::ApprovalStatus::Expired
                && (req.created_at.millis() - o.created_at.millis()).abs() <= retention_ms
                && identity
                    .iter()
                    .all(|f| o.inputs.get(f.as_str()) == req.inputs.get(f.as_str()))
        })
        .collect()
}
