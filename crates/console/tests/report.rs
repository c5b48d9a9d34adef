//! The surface numbers from a seeded audit log: records appended to a real store's chain and
//! approval requests inserted as the executor writes them, then every figure compared with
//! values counted by hand (below, next to the data).

use crate::common::{RawRequest, insert_raw_requests};
use serde_json::json;
use toolgate_console::report::{self, Report};
use toolgate_core::{StepStatus, Timestamp};
use toolgate_store::audit::{AuditApproval, AuditOutcome, AuditWho, AuditWhy};
use toolgate_store::{AuditDecision, AuditDraft};

const H: i64 = 3_600_000;
const MIN: i64 = 60_000;
/// Monday 2026-06-01 00:00 UTC, and the Monday after.
const W1: i64 = 1_780_272_000_000;
const W2: i64 = W1 + 7 * 24 * H;
const NOW: i64 = W2 + 7 * 24 * H - H;

struct R {
    at: i64,
    tool: &'static str,
    decision: AuditDecision,
    rule: Option<&'static str>,
    status: StepStatus,
    latency: Option<i64>,
    step: Option<&'static str>,
    approved: bool,
    /// Governance latency (µs) recorded with a decided call.
    gov: Option<i64>,
}

fn r(at: i64, tool: &'static str, decision: AuditDecision) -> R {
    R {
        at,
        tool,
        decision,
        rule: None,
        status: StepStatus::Done,
        latency: None,
        step: None,
        approved: false,
        gov: None,
    }
}

fn draft(x: &R) -> AuditDraft {
    AuditDraft {
        ts: Timestamp::from_millis(x.at),
        run_id: Some("run-1".into()),
        step_id: x.step.map(Into::into),
        who: AuditWho {
            principal: "fin-worker".into(),
            role: "worker".into(),
            actor: Default::default(),
        },
        tool: x.tool.into(),
        tool_version: Some("1.0.0".into()),
        effect: None,
        tier: None,
        inputs: json!({}),
        redacted: vec![],
        idem_key: Some(format!("sha256:key-{}", x.step.unwrap_or("none"))),
        why: AuditWhy {
            purpose: Some("billing".into()),
            reason: None,
            evidence: vec![],
            decision: x.decision,
            rule: x.rule.map(toolgate_core::Rule::from),
            checks: vec![],
            shadow: Vec::new(),
        },
        approval: x.approved.then(|| AuditApproval {
            approvers: vec!["alice".into()],
            token_fingerprints: vec![],
        }),
        outcome: AuditOutcome {
            status: x.status,
            target_ref: None,
            latency_ms: x.latency,
            latency_us: None,
            governance_us: x.gov,
            error: None,
        },
        registry_version: "test".into(),
    }
}

/// (subject step, tool, created at, status, decided at). Requests without `decided_at` (as
/// stored before it was kept) are aged by the record of their approved call or rejection.
const REQUESTS: &[(&str, &str, i64, &str, Option<i64>)] = &[
    // s1 was approved 30 min after it was raised; its call ran 1 h after.
    (
        "s1",
        "payment.schedule",
        W1 + 2 * H,
        "consumed",
        Some(W1 + 2 * H + 30 * MIN),
    ),
    (
        "s2",
        "payment.schedule",
        W1 + 4 * H,
        "rejected",
        Some(W1 + 6 * H),
    ),
    ("s3", "payment.schedule", W1 + 20 * H, "consumed", None),
    ("s8", "payment.urgent", W1 + 5 * H, "consumed", None),
    ("s4", "payment.schedule", W2 + H, "consumed", None),
    ("s5", "payment.schedule", W2 + 3 * H, "rejected", None),
    (
        "s6",
        "payment.schedule",
        W2 + 4 * H,
        "expired",
        Some(W2 + 76 * H),
    ),
    ("s7", "payment.schedule", W2 + 6 * H, "pending", None),
];

async fn seeded() -> crate::common::Env {
    use AuditDecision::*;
    let e = crate::common::env().await;
    let log = vec![
        R {
            latency: Some(10),
            gov: Some(120),
            ..r(W1 + H, "invoice.get", Allow)
        },
        R {
            latency: Some(20),
            gov: Some(80),
            ..r(W1 + H + MIN, "invoice.get", Allow)
        },
        R {
            latency: Some(30),
            gov: Some(100),
            ..r(W1 + H + 2 * MIN, "invoice.get", Allow)
        },
        r(W1 + H + 3 * MIN, "invoice.get", Replay),
        R {
            rule: Some("schema.maximum"),
            status: StepStatus::Refused,
            gov: Some(50),
            ..r(W1 + H + 4 * MIN, "payment.schedule", Deny)
        },
        R {
            rule: Some("schema.maximum"),
            status: StepStatus::Refused,
            gov: Some(60),
            ..r(W1 + H + 5 * MIN, "payment.schedule", Deny)
        },
        R {
            rule: Some("idempotency.inputs_differ"),
            status: StepStatus::Refused,
            ..r(W1 + H + 6 * MIN, "payment.schedule", Deny)
        },
        // s1: raised 2 h, approved and run 3 h (age 1 h).
        R {
            rule: Some("gate.always"),
            status: StepStatus::NeedsApproval,
            step: Some("s1"),
            ..r(W1 + 2 * H, "payment.schedule", NeedsApproval)
        },
        R {
            latency: Some(40),
            step: Some("s1"),
            approved: true,
            ..r(W1 + 3 * H, "payment.schedule", Allow)
        },
        // s2: raised 4 h, rejected 6 h (age 2 h).
        R {
            rule: Some("gate.always"),
            status: StepStatus::NeedsApproval,
            step: Some("s2"),
            ..r(W1 + 4 * H, "payment.schedule", NeedsApproval)
        },
        R {
            rule: Some("approval.rejected"),
            status: StepStatus::Refused,
            step: Some("s2"),
            ..r(W1 + 6 * H, "payment.schedule", Rejected)
        },
        // s8: two-person tool, raised 5 h, run 5 h 10 min (age 10 min).
        R {
            latency: Some(50),
            step: Some("s8"),
            approved: true,
            ..r(W1 + 5 * H + 10 * MIN, "payment.urgent", Allow)
        },
        // s3: raised 20 h, run 24 h (age 4 h), timed out (unknown), reconciled 30 min later.
        R {
            latency: Some(30_000),
            status: StepStatus::Unknown,
            step: Some("s3"),
            approved: true,
            ..r(W1 + 24 * H, "payment.schedule", Allow)
        },
        R {
            step: Some("s3"),
            ..r(W1 + 24 * H + 30 * MIN, "payment.schedule", Reconcile)
        },
        // Week 2. s4: raised 1 h, run 2 h (age 1 h), unknown and never reconciled.
        R {
            latency: Some(30_000),
            status: StepStatus::Unknown,
            step: Some("s4"),
            approved: true,
            ..r(W2 + 2 * H, "payment.schedule", Allow)
        },
        // s5: raised 3 h, rejected 5 h (age 2 h).
        R {
            rule: Some("gate.always"),
            status: StepStatus::NeedsApproval,
            step: Some("s5"),
            ..r(W2 + 3 * H, "payment.schedule", NeedsApproval)
        },
        R {
            rule: Some("approval.rejected"),
            status: StepStatus::Refused,
            step: Some("s5"),
            ..r(W2 + 5 * H, "payment.schedule", Rejected)
        },
    ];
    e.store
        .append_audit(log.iter().map(draft).collect())
        .await
        .unwrap();
    for (i, (subject, tool, at, status, decided)) in REQUESTS.iter().enumerate() {
        let decided = decided
            .map(|d| d.to_string())
            .unwrap_or_else(|| "NULL".into());
        e.store
            .execute_raw(&format!(
                "INSERT INTO approval_requests (approval_id, subject, run_id, principal, tool, \
                 tool_version, input_hash, inputs, reason, evidence, rule, approvers_needed, \
                 status, created_at, expires_at, decided_at) VALUES ('a{i}', '{subject}', 'run-1', \
                 'fin-worker', '{tool}', '1.0.0', 'sha256:00', '{{}}', NULL, '[]', \
                 'gate.always', 1, '{status}', {at}, {}, {decided})",
                at + 72 * H
            ))
            .await
            .unwrap();
        // People decided them: an approval granted for each consumed request, and the
        // rejections name who rejected (a rejection naming nobody is a reviewer's closure).
        if *status == "consumed" {
            let granted = decided.parse::<i64>().unwrap_or(at + 30 * MIN);
            e.store
                .execute_raw(&format!(
                    "INSERT INTO approval_grants (approval_id, approver, token, fingerprint, nonce, \
                     granted_at) VALUES ('a{i}', 'alice', 't', 'f', 'n{i}', {granted})"
                ))
                .await
                .unwrap();
        }
        if *status == "rejected" {
            e.store
                .execute_raw(&format!(
                    "UPDATE approval_requests SET decided_by = 'bob' WHERE approval_id = 'a{i}'"
                ))
                .await
                .unwrap();
        }
    }
    let day = Timestamp::from_millis(NOW).utc_day();
    e.store
        .execute_raw(&format!(
            "INSERT INTO budget_usage (principal, tier, day, used) VALUES ('fin-worker', 'spend', {day}, 3)"
        ))
        .await
        .unwrap();
    assert!(e.store.verify_chain().await.unwrap().is_intact());
    e
}

async fn gather(e: &crate::common::Env, since: Option<i64>) -> Report {
    report::gather(
        &e.store,
        &e.exec.registry,
        since.map(Timestamp::from_millis),
        Timestamp::from_millis(NOW),
    )
    .await
    .unwrap()
}

fn calls(r: &Report, tool: &str, decision: &str) -> u64 {
    r.calls
        .get(&(tool.to_string(), decision.to_string()))
        .copied()
        .unwrap_or(0)
}

#[tokio::test]
async fn report_figures_match_a_hand_count_of_the_seeded_log() {
    let e = seeded().await;
    let r = gather(&e, None).await;

    assert_eq!(r.records, 17);
    assert_eq!(calls(&r, "invoice.get", "allow"), 3);
    assert_eq!(calls(&r, "invoice.get", "replay"), 1);
    assert_eq!(calls(&r, "payment.schedule", "deny"), 3);
    assert_eq!(calls(&r, "payment.schedule", "needs_approval"), 3);
    assert_eq!(calls(&r, "payment.schedule", "allow"), 3);
    assert_eq!(calls(&r, "payment.schedule", "rejected"), 2);
    assert_eq!(calls(&r, "payment.schedule", "reconcile"), 1);
    assert_eq!(calls(&r, "payment.urgent", "allow"), 1);
    assert_eq!(r.calls.values().sum::<u64>(), 17);

    assert_eq!(r.refusals.len(), 2);
    assert_eq!(r.refusals["schema.maximum"], 2);
    assert_eq!(r.refusals["idempotency.inputs_differ"], 1);
    assert_eq!((r.duplicates_suppressed, r.key_conflicts), (1, 1));

    // payment.schedule: 7 raised; approved s1 s3 s4, rejected s2 s5, expired s6, open s7.
    let g = r
        .gates
        .iter()
        .find(|g| g.tool == "payment.schedule")
        .unwrap();
    assert_eq!(
        (g.raised, g.approved, g.rejected, g.expired, g.open),
        (7, 3, 2, 1, 1)
    );
    assert_eq!(g.rejection_rate(), Some(0.4));
    assert_eq!(g.break_even(), Some(2.5));
    // Week 1: approved s1 s3, rejected s2 (r = 1/3); week 2: approved s4, rejected s5 (r = 1/2).
    assert_eq!(g.weeks.len(), 2);
    assert_eq!(g.weeks[0].start, Timestamp::from_millis(W1));
    assert_eq!((g.weeks[0].approved, g.weeks[0].rejected), (2, 1));
    assert_eq!(g.weeks[1].start, Timestamp::from_millis(W2));
    assert_eq!((g.weeks[1].approved, g.weeks[1].rejected), (1, 1));
    assert_eq!(g.weeks[1].rate(), Some(0.5));
    // payment.urgent: one approval, nothing rejected: r = 0 and 1/r is unbounded.
    let u = r.gates.iter().find(|g| g.tool == "payment.urgent").unwrap();
    assert_eq!((u.raised, u.approved, u.rejected), (1, 1, 0));
    assert_eq!(u.rejection_rate(), Some(0.0));
    assert_eq!(u.break_even(), None);

    // Ages at decision: 10 min (s8), 30 min (s1, by its decided_at), 1 h (s4), 2 h (s2, by
    // decided_at), 2 h (s5), 4 h (s3).
    assert_eq!(r.approval_age.n, 6);
    assert_eq!(r.approval_age.p50, Some(H));
    assert_eq!(r.approval_age.p90, Some(4 * H));
    assert_eq!(r.approval_age.max, Some(4 * H));
    assert_eq!(r.approval_age.sum, 9 * H + 40 * MIN);

    // Governance latency (µs): 50, 60, 80, 100, 120.
    assert_eq!(r.governance_latency.n, 5);
    assert_eq!(r.governance_latency.p50, Some(80));
    assert_eq!(r.governance_latency.p95, Some(120));
    assert_eq!(r.governance_latency.max, Some(120));

    // Unknowns: s3 reconciled after 30 min, s4 still open.
    assert_eq!(
        (r.unknowns.total, r.unknowns.reconciled, r.unknowns.open),
        (2, 1, 1)
    );
    assert_eq!(r.unknowns.time_to_reconcile.p50, Some(30 * MIN));

    // Handler latency: 10, 20, 30, 40, 50, 30000, 30000.
    assert_eq!(r.call_latency.n, 7);
    assert_eq!(r.call_latency.p50, Some(40));
    assert_eq!(r.call_latency.p95, Some(30_000));

    assert_eq!(r.budgets.len(), 1);
    assert_eq!(
        (
            r.budgets[0].principal.as_str(),
            r.budgets[0].used,
            r.budgets[0].limit
        ),
        ("fin-worker", 3, Some(50))
    );
}

#[tokio::test]
async fn since_keeps_only_the_later_records_and_requests() {
    let e = seeded().await;
    let r = gather(&e, Some(W2)).await;
    // Week 2 holds: s4 allow, s5 needs_approval and rejected.
    assert_eq!(r.records, 3);
    let g = r
        .gates
        .iter()
        .find(|g| g.tool == "payment.schedule")
        .unwrap();
    assert_eq!(
        (g.raised, g.approved, g.rejected, g.expired, g.open),
        (4, 1, 1, 1, 1)
    );
    assert_eq!(g.rejection_rate(), Some(0.5));
    assert!(r.gates.iter().all(|g| g.tool != "payment.urgent"));
    assert_eq!(r.approval_age.n, 2);
    assert_eq!((r.unknowns.total, r.unknowns.open), (1, 1));
}

#[tokio::test]
async fn text_and_prometheus_carry_the_same_figures() {
    let e = seeded().await;
    let r = gather(&e, None).await;
    let text = r.to_text();
    assert!(
        text.contains("payment.schedule [gate.always]: raised 7, approved 3, rejected 2, expired 1, open 1; r = 40.0 %, 1/r = 2.5"),
        "{text}"
    );
    assert!(
        text.contains("week of 2026-06-01: approved 2, rejected 1, r = 33.3 %"),
        "{text}"
    );
    assert!(
        text.contains("unknown outcomes: 2 (1 reconciled, 1 open)"),
        "{text}"
    );
    assert!(
        text.contains(
            "governance latency (decision and reservation, before the handler, µs): n 5, p50 80, p95 120, p99 120, max 120"
        ),
        "{text}"
    );

    let prom = r.to_prometheus();
    for line in [
        "toolgate_calls_total{tool=\"payment.schedule\",decision=\"deny\"} 3",
        "toolgate_refusals_total{rule=\"schema.maximum\"} 2",
        "toolgate_gate_requests_total{tool=\"payment.schedule\",rule=\"gate.always\",status=\"rejected\"} 2",
        "toolgate_gate_rejection_rate{tool=\"payment.schedule\",rule=\"gate.always\"} 0.4",
        "toolgate_gate_break_even_ratio{tool=\"payment.schedule\",rule=\"gate.always\"} 2.5",
        "toolgate_gate_break_even_ratio{tool=\"payment.urgent\",rule=\"gate.always\"} +Inf",
        "toolgate_approval_age_seconds{quantile=\"0.5\"} 3600",
        "toolgate_approval_age_seconds_count 6",
        "toolgate_approval_age_seconds_sum 34800",
        "toolgate_duplicates_suppressed_total 1",
        "toolgate_unknown_outcomes_total{state=\"open\"} 1",
        "toolgate_budget_used{principal=\"fin-worker\",tier=\"spend\"} 3",
        "toolgate_budget_limit{principal=\"fin-worker\",tier=\"spend\"} 50",
        "toolgate_call_latency_seconds{quantile=\"0.5\"} 0.04",
        "toolgate_governance_latency_seconds{quantile=\"0.5\"} 0.00008",
        "toolgate_governance_latency_seconds_count 5",
    ] {
        assert!(prom.contains(line), "missing `{line}` in:\n{prom}");
    }
}

/// The honest figures: a reviewer's closure is not a person's rejection, a request consumed
/// without the people it needed is not an approval, an approved call that never ran is
/// counted, and each person's decisions per day and median time per decision are reported.
#[tokio::test]
async fn reviewer_closures_auto_consumed_and_approved_not_run_are_told_apart() {
    let e = crate::common::env().await;
    // (id, status, grants, decided_by): on the two-person tool payment.urgent.
    let rows: &[RawRequest] = &[
        ("r1", "rejected", &[], None),        // a reviewer's step.reject
        ("r2", "rejected", &[], Some("bob")), // a person's rejection
        ("r3", "consumed", &[], None),        // consumed 3 ms after, by a retry
        (
            "r4",
            "consumed",
            &[("alice", 10 * MIN), ("bob", 10 * MIN + 40_000)],
            None,
        ),
        (
            "r5",
            "approved",
            &[("alice", 10 * MIN + 70_000), ("bob", 10 * MIN + 90_000)],
            None,
        ),
        (
            "r6",
            "expired",
            &[("alice", 10 * MIN + 100_000), ("bob", 2 * H)],
            None,
        ),
    ];
    insert_raw_requests(&e, rows, W2, MIN, NOW + H, W2 + 3 * H).await;
    let r = gather(&e, None).await;
    let g = r.gates.iter().find(|g| g.tool == "payment.urgent").unwrap();
    assert_eq!(g.raised, 6);
    assert_eq!(g.rejected, 1, "only bob's rejection is a person's");
    assert_eq!(g.reviewer_closed, 1);
    assert_eq!(
        g.closed_without_people, 1,
        "r3 was consumed by nobody's approval"
    );
    assert_eq!(g.approved, 2, "r4 ran, r5 is approved and waits");
    assert_eq!(g.expired, 1);
    assert_eq!(
        g.approved_not_run, 1,
        "r6 was approved by two people and expired unused"
    );
    assert_eq!(g.rejection_rate(), Some(1.0 / 3.0));
    // alice: 3 approvals at 10 min, +70 s, +100 s (gaps 70 s and 30 s: median 50 s).
    let alice = r.approvers.iter().find(|a| a.approver == "alice").unwrap();
    assert_eq!((alice.approvals, alice.rejections, alice.days), (3, 0, 1));
    assert_eq!(alice.median_secs, Some(50.0));
    assert_eq!(alice.per_day(), 3.0);
    // bob: the rejection of r2 at 1 min + 3 ms, approvals at 10 min + 40 s and + 90 s, and
    // one at 2 h (past the 15-minute session gap): gaps 579.997 s and 50 s.
    let bob = r.approvers.iter().find(|a| a.approver == "bob").unwrap();
    assert_eq!((bob.approvals, bob.rejections), (3, 1));
    let m = bob.median_secs.unwrap();
    assert!((m - 314.9985).abs() < 1e-6, "{m}");
    let text = r.to_text();
    assert!(
        text.contains("payment.urgent [gate.always]: closed by a reviewer 1, closed without the people it needed 1, approved but not run 1"),
        "{text}"
    );
    assert!(text.contains("call latency (handler, µs)"), "{text}");
}
