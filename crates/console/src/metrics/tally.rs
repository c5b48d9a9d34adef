//! The audit-derived counters, advanced one record at a time. Every label is drawn from a
//! closed set (decisions, states) or from the registry (tools, policies), so the number of
//! series, and the memory they take, is bounded by the registry and not by what agents send.

use std::collections::BTreeMap;

use toolgate_core::{Registry, StepStatus};
use toolgate_store::{AuditDecision, AuditRecord};

/// The label of a tool the registry does not declare (typed by an agent, or removed since).
pub const UNKNOWN: &str = "unknown";
/// The label of a rule that is neither toolgate's own nor a policy of the registry.
pub const OTHER: &str = "other";

/// At most this many distinct rule labels; later new ones are counted under [`OTHER`].
pub const MAX_RULES: usize = 256;
/// At most this many unknown outcomes are remembered while they wait for reconciliation; past
/// it they are still counted as open, but a later reconciliation cannot be matched to them.
pub const MAX_OPEN_UNKNOWNS: usize = 4096;

/// The first segment of every rule toolgate itself names (`grant.tier`, `budget.window.x`, …).
const RULE_FAMILIES: &[&str] = &[
    "approval",
    "attempts",
    "budget",
    "config",
    "destination",
    "gate",
    "grant",
    "handler",
    "idempotency",
    "pin",
    "plan",
    "policy",
    "preview",
    "purpose",
    "rate_limit",
    "reason",
    "recovery",
    "reload",
    "review",
    "run",
    "schema",
    "timeout",
    "tool",
    "unanswered",
];

/// toolgate's own record subjects that are not registry tools.
const SYSTEM_TOOLS: &[&str] = &["registry.reload"];

/// The tool's label: its name when the registry declares it (or its preview), else `unknown`.
pub fn tool_label<'a>(registry: &Registry, tool: &'a str) -> &'a str {
    let declared = registry.tool(tool).is_some()
        || SYSTEM_TOOLS.contains(&tool)
        || tool
            .strip_suffix(".preview")
            .and_then(|t| registry.tool(t))
            .is_some_and(|t| t.config.preview.is_some());
    if declared { tool } else { UNKNOWN }
}

/// Whether `rule` is a name toolgate or the registry gives a rule: a policy id, or a dotted
/// name of one of toolgate's rule families.
pub fn is_known_rule(registry: &Registry, rule: &str) -> bool {
    if registry.policies.info(rule).is_some() {
        return true;
    }
    let family = rule.split('.').next().unwrap_or_default();
    rule.len() <= 80
        && RULE_FAMILIES.contains(&family)
        && rule
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'.' | b'-'))
}

/// A histogram with fixed bucket bounds, in seconds.
#[derive(Debug, Clone, PartialEq)]
pub struct Histogram {
    pub bounds: &'static [f64],
    /// Observations at or below each bound (not cumulative); the last slot is above them all.
    pub counts: Vec<u64>,
    pub sum: f64,
    pub count: u64,
}

impl Histogram {
    pub fn new(bounds: &'static [f64]) -> Self {
        Histogram {
            bounds,
            counts: vec![0; bounds.len() + 1],
            sum: 0.0,
            count: 0,
        }
    }

    pub fn observe(&mut self, seconds: f64) {
        let i = self
            .bounds
            .iter()
            .position(|b| seconds <= *b)
            .unwrap_or(self.bounds.len());
        self.counts[i] += 1;
        self.sum += seconds;
        self.count += 1;
    }
}

/// Handler latency: 1 ms … 30 s.
pub const CALL_BOUNDS: &[f64] = &[
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
];
/// Governance latency: 50 µs … 1 s.
pub const GOVERNANCE_BOUNDS: &[f64] = &[
    0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0,
];
/// Time to reconcile an unknown outcome: 1 s … 3 days.
pub const RECONCILE_BOUNDS: &[f64] = &[
    1.0, 10.0, 60.0, 300.0, 900.0, 3600.0, 21600.0, 86400.0, 259200.0,
];

/// An allowed call whose outcome was unknown, waiting for its reconcile record.
#[derive(Debug, Clone, PartialEq)]
struct OpenUnknown {
    step_id: Option<String>,
    idem_key: Option<String>,
    ts_ms: i64,
}

/// Everything `/metrics` counts from the audit chain, up to `last_seq`.
#[derive(Debug, Clone, PartialEq)]
pub struct Tally {
    /// The last record folded in; the next scrape reads the records after it.
    pub last_seq: i64,
    pub records: u64,
    /// (tool label, decision) → records.
    pub calls: BTreeMap<(String, &'static str), u64>,
    /// Rule label → denials.
    pub refusals: BTreeMap<String, u64>,
    /// (rule label, would) → records a shadow rule matched.
    pub shadow: BTreeMap<(String, &'static str), u64>,
    pub duplicates_suppressed: u64,
    pub key_conflicts: u64,
    pub unknowns_reconciled: u64,
    /// Unknown outcomes not (yet) reconciled, remembered or not.
    pub unknowns_open: u64,
    open: Vec<OpenUnknown>,
    pub reconcile: Histogram,
    pub call_latency: Histogram,
    pub governance_latency: Histogram,
}

impl Default for Tally {
    fn default() -> Self {
        Tally {
            last_seq: 0,
            records: 0,
            calls: BTreeMap::new(),
            refusals: BTreeMap::new(),
            shadow: BTreeMap::new(),
            duplicates_suppressed: 0,
            key_conflicts: 0,
            unknowns_reconciled: 0,
            unknowns_open: 0,
            open: Vec::new(),
            reconcile: Histogram::new(RECONCILE_BOUNDS),
            call_latency: Histogram::new(CALL_BOUNDS),
            governance_latency: Histogram::new(GOVERNANCE_BOUNDS),
        }
    }
}

/// The decision's name in the audit log (`allow`, `needs_approval`, …).
pub fn decision_name(d: AuditDecision) -> &'static str {
    match d {
        AuditDecision::Allow => "allow",
        AuditDecision::Deny => "deny",
        AuditDecision::NeedsApproval => "needs_approval",
        AuditDecision::Replay => "replay",
        AuditDecision::Reload => "reload",
        AuditDecision::Recovery => "recovery",
        AuditDecision::Reconcile => "reconcile",
        AuditDecision::Compensation => "compensation",
        AuditDecision::Rejected => "rejected",
        AuditDecision::Pin => "pin",
        AuditDecision::PinBlock => "pin_block",
        AuditDecision::LockApproval => "lock_approval",
        AuditDecision::Lookup => "lookup",
        AuditDecision::Preview => "preview",
    }
}

impl Tally {
    /// A bounded rule label: the rule if it is known and there is room, else `other`.
    fn rule_label(&self, registry: &Registry, rule: &str) -> String {
        let seen = self.refusals.contains_key(rule) || self.shadow.keys().any(|(r, _)| r == rule);
        let distinct = self.refusals.len() + self.shadow.len();
        if is_known_rule(registry, rule) && (seen || distinct < MAX_RULES) {
            rule.to_string()
        } else {
            OTHER.to_string()
        }
    }

    /// Folds one record in. Records must come in chain order, each once.
    pub fn fold(&mut self, registry: &Registry, r: &AuditRecord) {
        let b = &r.body;
        self.last_seq = self.last_seq.max(r.seq);
        self.records += 1;
        if let Some(us) = b.outcome.governance_us {
            self.governance_latency.observe(us as f64 / 1e6);
        }
        let tool = tool_label(registry, &b.tool).to_string();
        *self
            .calls
            .entry((tool, decision_name(b.why.decision)))
            .or_insert(0) += 1;
        match b.why.decision {
            AuditDecision::Deny => {
                let rule = b.why.rule.as_deref().unwrap_or("(none)");
                if rule.starts_with("idempotency.") {
                    self.key_conflicts += 1;
                }
                let label = if b.why.rule.is_none() {
                    "(none)".to_string()
                } else {
                    self.rule_label(registry, rule)
                };
                *self.refusals.entry(label).or_insert(0) += 1;
            }
            AuditDecision::Replay => self.duplicates_suppressed += 1,
            AuditDecision::Allow => {
                if let Some(us) = b.outcome.latency_us {
                    self.call_latency.observe(us as f64 / 1e6);
                } else if let Some(ms) = b.outcome.latency_ms {
                    self.call_latency.observe(ms as f64 / 1e3);
                }
                if b.outcome.status == StepStatus::Unknown {
                    self.unknowns_open += 1;
                    if self.open.len() < MAX_OPEN_UNKNOWNS
                        && (b.step_id.is_some() || b.idem_key.is_some())
                    {
                        self.open.push(OpenUnknown {
                            step_id: b.step_id.as_deref().map(str::to_string),
                            idem_key: b.idem_key.clone(),
                            ts_ms: b.ts.millis(),
                        });
                    }
                }
            }
            AuditDecision::Reconcile if b.outcome.status != StepStatus::Unknown => {
                self.settle(r);
            }
            _ => {}
        }
        for m in &b.why.shadow {
            let label = self.rule_label(registry, &m.rule);
            *self.shadow.entry((label, m.would.as_str())).or_insert(0) += 1;
        }
    }

    /// A reconcile record settles every open unknown of its step (or, without step ids, of its
    /// idempotency key), as the report matches them.
    fn settle(&mut self, x: &AuditRecord) {
        let xb = &x.body;
        let ts = xb.ts.millis();
        let mut settled = Vec::new();
        self.open.retain(|u| {
            let matches = match (&xb.step_id, &u.step_id) {
                (Some(a), Some(c)) => a == c,
                _ => xb.idem_key.is_some() && xb.idem_key == u.idem_key,
            };
            if matches {
                settled.push(ts - u.ts_ms);
            }
            !matches
        });
        for ms in settled {
            self.unknowns_open -= 1;
            self.unknowns_reconciled += 1;
            self.reconcile.observe(ms as f64 / 1e3);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn registry() -> Registry {
        Registry::load(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/tests/fixtures/registry"
        ))
        .unwrap()
    }

    fn record(seq: i64, ts: i64, body: serde_json::Value) -> AuditRecord {
        let mut v = json!({
            "seq": seq, "prev": "x", "ts": ts, "who": {"principal": "fin-worker", "role": "r"},
            "tool": "invoice.get", "inputs": {}, "registry_version": "v",
            "why": {"decision": "allow"}, "outcome": {"status": "done"},
        });
        for (k, x) in body.as_object().unwrap() {
            v[k] = x.clone();
        }
        serde_json::from_value(v).unwrap()
    }

    #[test]
    fn an_unknown_outcome_is_open_until_its_step_is_reconciled() {
        let reg = registry();
        let mut t = Tally::default();
        let unknown = json!({"step_id": "s1", "outcome": {"status": "unknown"}});
        t.fold(&reg, &record(1, 1_000, unknown.clone()));
        t.fold(
            &reg,
            &record(
                2,
                2_000,
                json!({"step_id": "s2", "outcome": {"status": "unknown"}}),
            ),
        );
        assert_eq!((t.unknowns_open, t.unknowns_reconciled), (2, 0));
        // A reconcile that is still unknown settles nothing; one of another step neither.
        let still = json!({"step_id": "s1", "why": {"decision": "reconcile"}, "outcome": {"status": "unknown"}});
        t.fold(&reg, &record(3, 3_000, still));
        let other = json!({"step_id": "s9", "why": {"decision": "reconcile"}, "outcome": {"status": "done"}});
        t.fold(&reg, &record(4, 4_000, other));
        assert_eq!((t.unknowns_open, t.unknowns_reconciled), (2, 0));
        let settled = json!({"step_id": "s1", "why": {"decision": "reconcile"}, "outcome": {"status": "done"}});
        t.fold(&reg, &record(5, 6_000, settled));
        assert_eq!((t.unknowns_open, t.unknowns_reconciled), (1, 1));
        assert_eq!(t.reconcile.count, 1);
        assert_eq!(t.reconcile.sum, 5.0, "settled 5 s after it was unknown");
        assert_eq!((t.last_seq, t.records), (5, 5));
    }

    #[test]
    fn rule_labels_are_toolgates_or_the_registrys_and_capped() {
        let reg = registry();
        let mut t = Tally::default();
        let deny = |seq: i64, rule: &str| {
            record(seq, seq, json!({"why": {"decision": "deny", "rule": rule}}))
        };
        t.fold(&reg, &deny(1, "grant.purpose"));
        t.fold(&reg, &deny(2, "idempotency.inputs_differ"));
        t.fold(&reg, &deny(3, "made-up rule\n"));
        t.fold(&reg, &deny(4, &format!("budget.{}", "x".repeat(100))));
        assert_eq!(t.refusals["grant.purpose"], 1);
        assert_eq!(t.refusals[OTHER], 2);
        assert_eq!(t.key_conflicts, 1);
        for i in 0..2 * MAX_RULES as i64 {
            t.fold(&reg, &deny(10 + i, &format!("budget.window.w{i}")));
        }
        assert!(t.refusals.len() <= MAX_RULES + 1, "{}", t.refusals.len());
        assert!(t.refusals[OTHER] > MAX_RULES as u64);
        // Known rules already counted keep their own series past the cap.
        t.fold(&reg, &deny(10_000, "grant.purpose"));
        assert_eq!(t.refusals["grant.purpose"], 2);
    }

    #[test]
    fn tools_the_registry_does_not_declare_are_unknown() {
        let reg = registry();
        assert_eq!(tool_label(&reg, "invoice.get"), "invoice.get");
        assert_eq!(tool_label(&reg, "registry.reload"), "registry.reload");
        assert_eq!(
            tool_label(&reg, "invoice.get.preview"),
            UNKNOWN,
            "no preview declared"
        );
        assert_eq!(tool_label(&reg, &"x".repeat(100_000)), UNKNOWN);
    }

    #[test]
    fn open_unknowns_are_remembered_up_to_a_bound() {
        let reg = registry();
        let mut t = Tally::default();
        for i in 0..(MAX_OPEN_UNKNOWNS as i64 + 10) {
            let u = json!({"step_id": format!("s{i}"), "outcome": {"status": "unknown"}});
            t.fold(&reg, &record(i + 1, i, u));
        }
        assert_eq!(t.open.len(), MAX_OPEN_UNKNOWNS);
        assert_eq!(t.unknowns_open, MAX_OPEN_UNKNOWNS as u64 + 10);
    }
}
