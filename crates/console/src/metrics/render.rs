//! The Prometheus text exposition of a [`Tally`] and the table-derived gauges.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use toolgate_core::Registry;
use toolgate_store::{BudgetUse, GateCount, NotifySummary};

use super::tally::{Histogram, OTHER, Tally, is_known_rule, tool_label};
use crate::report::{GateOutcome, float, labels};

/// What is read from the mutable tables (approval requests, today's budget counters).
#[derive(Debug, Clone, Default)]
pub struct Tables {
    pub gates: Vec<GateCount>,
    pub budgets: Vec<BudgetUse>,
    pub notifications: Vec<NotifySummary>,
    /// (person, approvals given, requests rejected).
    pub approvers: Vec<(String, i64, i64)>,
}

/// The states a gate's requests are reported in: each request is in exactly one, as the
/// report counts it ([`GateOutcome::of`]).
const GATE_STATES: [&str; 6] = [
    "approved",
    "rejected",
    "reviewer_closed",
    "closed_without_people",
    "expired",
    "open",
];

fn state_of(o: &GateOutcome) -> usize {
    [
        o.approved,
        o.rejected,
        o.reviewer_closed,
        o.closed_without_people,
        o.expired,
        o.open,
    ]
    .iter()
    .position(|x| *x)
    .unwrap_or(5)
}

struct Out(String);

impl Out {
    fn family(&mut self, name: &str, kind: &str, help: &str) {
        let _ = writeln!(self.0, "# HELP {name} {help}");
        let _ = writeln!(self.0, "# TYPE {name} {kind}");
    }
    fn row(&mut self, name: &str, l: &str, value: impl std::fmt::Display) {
        if l.is_empty() {
            let _ = writeln!(self.0, "{name} {value}");
        } else {
            let _ = writeln!(self.0, "{name}{{{l}}} {value}");
        }
    }
    fn histogram(&mut self, name: &str, help: &str, h: &Histogram) {
        self.family(name, "histogram", help);
        let mut below = 0;
        for (bound, n) in h.bounds.iter().zip(&h.counts) {
            below += n;
            self.row(
                &format!("{name}_bucket"),
                &labels(&[("le", &float(*bound))]),
                below,
            );
        }
        self.row(
            &format!("{name}_bucket"),
            &labels(&[("le", "+Inf")]),
            h.count,
        );
        self.row(&format!("{name}_sum"), "", float(h.sum));
        self.row(&format!("{name}_count"), "", h.count);
    }
}

/// One gate's figures: requests per state, approved but not run, people's decisions (approved
/// or rejected with `decided_at` kept) and the sum of their ages at decision.
#[derive(Default)]
struct GateFigures {
    states: [i64; 6],
    approved_not_run: i64,
    decided: i64,
    age_ms: i64,
}

/// Per gate (tool label, rule label).
type Gates = BTreeMap<(String, String), GateFigures>;

fn gates(registry: &Registry, rows: &[GateCount]) -> Gates {
    let mut out = Gates::new();
    for g in rows {
        let tool = tool_label(registry, &g.tool).to_string();
        let rule = if is_known_rule(registry, &g.rule) {
            g.rule.to_string()
        } else {
            OTHER.to_string()
        };
        let o = GateOutcome::of(
            g.status,
            g.by_people,
            g.decided_by_person,
            g.any_grant,
            g.lapsed,
            g.step_refused,
        );
        let e = out.entry((tool, rule)).or_default();
        e.states[state_of(&o)] += g.requests;
        if o.approved_not_run {
            e.approved_not_run += g.requests;
        }
        // Only people's decisions have an age at decision.
        if o.approved || o.rejected {
            e.decided += g.decided;
            e.age_ms += g.age_ms_sum;
        }
    }
    out
}

/// The page `/metrics` answers with.
pub fn render(registry: &Registry, t: &Tally, tables: &Tables) -> String {
    let mut o = Out(String::with_capacity(8 * 1024));
    o.family(
        "toolgate_audit_records_total",
        "counter",
        "Audit records counted, up to the chain's last record when scraped.",
    );
    o.row("toolgate_audit_records_total", "", t.records);

    o.family(
        "toolgate_calls_total",
        "counter",
        "Audit records by tool and decision (tools the registry does not declare: tool=\"unknown\").",
    );
    for ((tool, decision), n) in &t.calls {
        o.row(
            "toolgate_calls_total",
            &labels(&[("tool", tool), ("decision", decision)]),
            n,
        );
    }

    o.family(
        "toolgate_refusals_total",
        "counter",
        "Denied calls by the rule that refused them.",
    );
    for (rule, n) in &t.refusals {
        o.row("toolgate_refusals_total", &labels(&[("rule", rule)]), n);
    }

    let gates = gates(registry, &tables.gates);
    o.family(
        "toolgate_gate_requests_total",
        "counter",
        "Approval requests by gate and outcome, as the report counts them: approved (by the people \
         it needed), rejected (by a person), reviewer_closed (a model reviewer's step.reject), \
         closed_without_people (consumed or approved without them), expired, open.",
    );
    for ((tool, rule), f) in &gates {
        for (state, n) in GATE_STATES.iter().zip(&f.states) {
            o.row(
                "toolgate_gate_requests_total",
                &labels(&[("tool", tool), ("rule", rule), ("status", state)]),
                n,
            );
        }
    }
    o.family(
        "toolgate_gate_rejection_rate",
        "gauge",
        "Rejected / decided approval requests per gate (r).",
    );
    let rates: Vec<(String, f64)> = gates
        .iter()
        .filter_map(|((tool, rule), f)| {
            let decided = f.states[0] + f.states[1];
            (decided > 0).then(|| {
                (
                    labels(&[("tool", tool), ("rule", rule)]),
                    f.states[1] as f64 / decided as f64,
                )
            })
        })
        .collect();
    for (l, r) in &rates {
        o.row("toolgate_gate_rejection_rate", l, float(*r));
    }
    o.family(
        "toolgate_gate_break_even_ratio",
        "gauge",
        "1/r: the cost of undoing a wrong call, in approvals, above which the gate pays (+Inf while r is 0).",
    );
    for (l, r) in &rates {
        let v = if *r > 0.0 {
            float(1.0 / r)
        } else {
            "+Inf".into()
        };
        o.row("toolgate_gate_break_even_ratio", l, v);
    }
    o.family(
        "toolgate_gate_approved_not_run_total",
        "counter",
        "Approval requests the people it needed approved, whose call never ran (refused when \
         decided again, or the lease expired unused).",
    );
    for ((tool, rule), f) in &gates {
        o.row(
            "toolgate_gate_approved_not_run_total",
            &labels(&[("tool", tool), ("rule", rule)]),
            f.approved_not_run,
        );
    }
    o.family(
        "toolgate_approver_decisions_total",
        "counter",
        "People's decisions on approval requests, by person (principals of the registry) and \
         decision; the report page has decisions per day and median seconds per decision.",
    );
    for (who, approved, rejected) in &tables.approvers {
        if registry.principal(who).is_none() {
            continue;
        }
        for (decision, n) in [("approved", approved), ("rejected", rejected)] {
            o.row(
                "toolgate_approver_decisions_total",
                &labels(&[("approver", who), ("decision", decision)]),
                n,
            );
        }
    }
    o.family(
        "toolgate_approval_age_seconds",
        "summary",
        "Age of approval requests at a person's decision (sum and count; the report page has percentiles).",
    );
    let (decided, age_ms) = gates
        .values()
        .fold((0, 0), |(n, s), f| (n + f.decided, s + f.age_ms));
    o.row(
        "toolgate_approval_age_seconds_sum",
        "",
        float(age_ms as f64 / 1e3),
    );
    o.row("toolgate_approval_age_seconds_count", "", decided);

    o.family(
        "toolgate_duplicates_suppressed_total",
        "counter",
        "Calls answered from a stored outcome (nothing ran).",
    );
    o.row(
        "toolgate_duplicates_suppressed_total",
        "",
        t.duplicates_suppressed,
    );
    o.family(
        "toolgate_key_conflicts_total",
        "counter",
        "Calls refused because the same key was in flight or reused with other inputs.",
    );
    o.row("toolgate_key_conflicts_total", "", t.key_conflicts);
    o.family(
        "toolgate_unknown_outcomes_total",
        "counter",
        "Irreversible calls whose outcome was unknown, by reconciliation state.",
    );
    o.row(
        "toolgate_unknown_outcomes_total",
        &labels(&[("state", "reconciled")]),
        t.unknowns_reconciled,
    );
    o.row(
        "toolgate_unknown_outcomes_total",
        &labels(&[("state", "open")]),
        t.unknowns_open,
    );
    o.histogram(
        "toolgate_reconcile_seconds",
        "Time from an unknown outcome to its reconciliation.",
        &t.reconcile,
    );

    // Principals only from the registry: a counter row of a principal removed since is left out.
    let budgets: Vec<(&BudgetUse, Option<u32>)> = tables
        .budgets
        .iter()
        .filter_map(|b| {
            registry
                .principal(&b.principal)
                .map(|p| (b, p.budget(b.tier)))
        })
        .collect();
    o.family(
        "toolgate_budget_used",
        "gauge",
        "Today's budget use per principal and tier.",
    );
    for (b, _) in &budgets {
        o.row(
            "toolgate_budget_used",
            &labels(&[("principal", &b.principal), ("tier", b.tier.as_str())]),
            b.used,
        );
    }
    o.family(
        "toolgate_budget_limit",
        "gauge",
        "Daily budget limit per principal and tier.",
    );
    for (b, limit) in &budgets {
        if let Some(l) = limit {
            o.row(
                "toolgate_budget_limit",
                &labels(&[("principal", &b.principal), ("tier", b.tier.as_str())]),
                l,
            );
        }
    }

    o.family(
        "toolgate_shadow_matches_total",
        "counter",
        "Calls a shadow rule would have refused or gated (it did not decide them).",
    );
    for ((rule, would), n) in &t.shadow {
        o.row(
            "toolgate_shadow_matches_total",
            &labels(&[("rule", rule), ("would", would)]),
            n,
        );
    }
    o.family(
        "toolgate_notifications",
        "gauge",
        "Notifications of raised approval requests per webhook (approvals.notify) and state: \
         sent, waiting (not tried yet), retrying (failed, to be tried again), failed (given up).",
    );
    // Webhooks no longer in the registry are left out (their names may be anything once).
    for n in &tables.notifications {
        if !registry
            .gateway
            .approvals
            .notify
            .contains_key(&n.destination)
        {
            continue;
        }
        let dest = n.destination.as_str();
        for (state, v) in [
            ("sent", n.sent),
            ("waiting", n.waiting),
            ("retrying", n.retrying),
            ("failed", n.failed),
        ] {
            o.row(
                "toolgate_notifications",
                &labels(&[("webhook", dest), ("state", state)]),
                v,
            );
        }
    }
    o.family(
        "toolgate_notification_last_failure_timestamp_seconds",
        "gauge",
        "When a post to the webhook last failed (Unix seconds).",
    );
    for n in &tables.notifications {
        if let Some(at) = n.last_error_at
            && registry
                .gateway
                .approvals
                .notify
                .contains_key(&n.destination)
        {
            o.row(
                "toolgate_notification_last_failure_timestamp_seconds",
                &labels(&[("webhook", &n.destination)]),
                float(at.millis() as f64 / 1000.0),
            );
        }
    }
    o.histogram(
        "toolgate_call_latency_seconds",
        "Handler latency of calls that ran.",
        &t.call_latency,
    );
    o.histogram(
        "toolgate_governance_latency_seconds",
        "Time from a call's request to its decision and reservation, without the handler.",
        &t.governance_latency,
    );
    o.0
}
