//! A plain allowed-read audit draft, for tests and the benchmark (included with `#[path]`).

use serde_json::json;
use toolgate_core::{StepStatus, Timestamp};
use toolgate_store::audit::{AuditOutcome, AuditWho, AuditWhy};
use toolgate_store::{Actor, AuditDecision, AuditDraft};

/// The `i`th draft of run `run_id`: `ticket.read` of ticket `T-i`, allowed and done.
pub fn draft(run_id: &str, i: i64) -> AuditDraft {
    AuditDraft {
        ts: Timestamp::from_millis(1_780_000_000_000 + i),
        run_id: Some(run_id.into()),
        step_id: None,
        who: AuditWho {
            principal: "worker".into(),
            role: "worker".into(),
            actor: Actor::default(),
        },
        tool: "ticket.read".into(),
        tool_version: Some("1.0.0".into()),
        effect: None,
        tier: None,
        inputs: json!({"ticket_id": format!("T-{i}")}),
        redacted: vec![],
        idem_key: None,
        why: AuditWhy {
            purpose: Some("ops".into()),
            reason: None,
            evidence: vec![],
            decision: AuditDecision::Allow,
            rule: None,
            checks: vec![],
            shadow: Vec::new(),
        },
        approval: None,
        outcome: AuditOutcome {
            status: StepStatus::Done,
            target_ref: None,
            latency_ms: Some(1),
            latency_us: None,
            governance_us: None,
            error: None,
        },
        registry_version: run_id.into(),
    }
}
