//! The surface numbers (what an operator reads each week), computed from the audit chain, the
//! approval requests and today's budget counters: calls by tool and decision, refusals by rule,
//! each gate's rejection rate r with its break-even cost ratio 1/r and weekly trend, approvals'
//! age at decision, duplicates suppressed, unknowns and time to reconcile, budget use, latency,
//! and per shadow rule the calls it would have refused or gated (the evidence for enforcing it).
//! One [`Report`] feeds the page and `toolgate report`, so they cannot disagree; `/metrics`
//! folds the same records one at a time (`metrics/`), by the same rules, tested against it.
//!
//! Percentiles use the nearest-rank method (the smallest value with at least p % of the values
//! at or below it), so a hand count over a small log gives the same figure.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use serde::Serialize;
use toolgate_core::{Registry, ShadowEffect, StepStatus, Tier, Timestamp};
use toolgate_store::{
    ApprovalRequest, ApprovalStatus, AuditDecision, AuditRecord, BudgetUse, Store, StoreError,
};

const DAY_MS: i64 = 86_400_000;
const WEEK_MS: i64 = 7 * DAY_MS;

/// Nearest-rank percentiles of a sample.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct Percentiles {
    pub n: usize,
    pub p50: Option<i64>,
    pub p90: Option<i64>,
    pub p95: Option<i64>,
    pub p99: Option<i64>,
    pub max: Option<i64>,
    pub sum: i64,
}

impl Percentiles {
    pub fn of(mut v: Vec<i64>) -> Self {
        v.sort_unstable();
        let rank = |p: f64| -> Option<i64> {
            if v.is_empty() {
                return None;
            }
            let k = ((p / 100.0) * v.len() as f64).ceil() as usize;
            Some(v[k.clamp(1, v.len()) - 1])
        };
        Percentiles {
            n: v.len(),
            p50: rank(50.0),
            p90: rank(90.0),
            p95: rank(95.0),
            p99: rank(99.0),
            max: v.last().copied(),
            sum: v.iter().sum(),
        }
    }
}

/// One week of one gate.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Week {
    /// Monday 00:00 UTC of the week the requests were raised in.
    pub start: Timestamp,
    pub approved: u64,
    pub rejected: u64,
}

impl Week {
    pub fn rate(&self) -> Option<f64> {
        rate(self.approved, self.rejected)
    }
}

fn rate(approved: u64, rejected: u64) -> Option<f64> {
    let decided = approved + rejected;
    (decided > 0).then(|| rejected as f64 / decided as f64)
}

/// One gate: a tool and the rule that sends its calls to people.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Gate {
    pub tool: String,
    pub rule: String,
    pub raised: u64,
    pub approved: u64,
    pub rejected: u64,
    pub expired: u64,
    pub open: u64,
    /// Closed by a model reviewer's `step.reject` before a person decided: a check, not a
    /// person's rejection, so not in r.
    pub reviewer_closed: u64,
    /// Consumed or approved without the people it needed (a retry that superseded it, an
    /// approval carried by a presented token): not counted as approved.
    pub closed_without_people: u64,
    /// Approved by the people it needed, but the call never ran (refused when it was decided
    /// again, or the lease expired unused).
    pub approved_not_run: u64,
    pub weeks: Vec<Week>,
}

impl Gate {
    /// Rejection rate r = rejected / (approved + rejected); none before any decision.
    pub fn rejection_rate(&self) -> Option<f64> {
        rate(self.approved, self.rejected)
    }
    /// The break-even cost ratio 1/r: the gate pays when reversing a wrong action costs more
    /// than this many approvals. Infinite (none) while r is zero.
    pub fn break_even(&self) -> Option<f64> {
        self.rejection_rate().filter(|r| *r > 0.0).map(|r| 1.0 / r)
    }
}

/// How one approval request counts at its gate: exactly one of approved, rejected (by a
/// person), closed by a reviewer, closed without the people it needed, expired and open; and,
/// of the approved and expired ones, whether the people's approval never ran. The report and
/// `/metrics` both count through [`GateOutcome::of`], so their figures agree.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct GateOutcome {
    pub approved: bool,
    pub rejected: bool,
    pub reviewer_closed: bool,
    pub closed_without_people: bool,
    pub expired: bool,
    pub open: bool,
    pub approved_not_run: bool,
}

impl GateOutcome {
    /// `status` of a request that `by_people` (as many people approved as it needed),
    /// `decided_by_person` (a person is named as having decided it), `any_grant` (someone
    /// approved it), whose lease had `lapsed`, and whose step was `refused` when it ran.
    pub fn of(
        status: ApprovalStatus,
        by_people: bool,
        decided_by_person: bool,
        any_grant: bool,
        lapsed: bool,
        refused: bool,
    ) -> GateOutcome {
        let mut o = GateOutcome::default();
        match status {
            ApprovalStatus::Approved | ApprovalStatus::Consumed if !by_people => {
                o.closed_without_people = true;
            }
            ApprovalStatus::Rejected if !decided_by_person && !any_grant => {
                o.reviewer_closed = true;
            }
            ApprovalStatus::Approved | ApprovalStatus::Consumed => {
                o.approved = true;
                o.approved_not_run = status == ApprovalStatus::Approved && (lapsed || refused);
            }
            ApprovalStatus::Rejected => o.rejected = true,
            ApprovalStatus::Expired => {
                o.expired = true;
                o.approved_not_run = by_people;
            }
            ApprovalStatus::Pending => o.open = true,
        }
        o
    }
}

/// Calls whose outcome was unknown (irreversible timeouts) and their reconciliation.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct Unknowns {
    pub total: u64,
    pub reconciled: u64,
    pub open: u64,
    /// Milliseconds from the unknown outcome to its reconciliation.
    pub time_to_reconcile: Percentiles,
}

/// One budget counter today.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Budget {
    pub principal: String,
    pub tier: Tier,
    pub used: i64,
    pub limit: Option<u32>,
}

/// One call a shadow rule matched.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ShadowCall {
    pub seq: i64,
    pub ts: Timestamp,
    pub tool: String,
    pub principal: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub run_id: Option<String>,
    /// What was actually decided (`allow`, `deny`, `needs_approval`, …).
    pub decision: String,
}

/// One shadow rule over the period: how many calls it would have refused (or gated), which,
/// and how many of those the enforcing rules let through, i.e. what enforcing it would change.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ShadowUse {
    pub rule: String,
    pub would: ShadowEffect,
    /// Audit records whose decision it matched.
    pub matched: u64,
    /// Of those, calls that were allowed (or replayed): the ones enforcing it would have stopped.
    pub let_through: u64,
    pub calls: Vec<ShadowCall>,
}

impl ShadowUse {
    /// What the rule would have done to the calls it matched: `refused` or `gated`.
    pub fn verb(&self) -> &'static str {
        match self.would {
            ShadowEffect::Deny => "refused",
            ShadowEffect::Gate => "gated",
        }
    }
}

/// The surface numbers over a period.
#[derive(Debug, Clone, PartialEq)]
pub struct Report {
    pub since: Option<Timestamp>,
    pub until: Timestamp,
    /// Audit records in the period.
    pub records: u64,
    /// (tool, decision) → records.
    pub calls: BTreeMap<(String, String), u64>,
    /// rule → denials.
    pub refusals: BTreeMap<String, u64>,
    pub gates: Vec<Gate>,
    /// Milliseconds from a request being raised to a person's decision on it (the store's
    /// `decided_at`: the last approval needed, or the rejection). Requests stored before
    /// `decided_at` was kept fall back to the record of the approved call or the rejection.
    pub approval_age: Percentiles,
    /// Calls answered from a stored outcome: duplicate effects that did not happen.
    pub duplicates_suppressed: u64,
    /// Calls refused because the same key was in flight or reused with other inputs.
    pub key_conflicts: u64,
    pub unknowns: Unknowns,
    pub budgets: Vec<Budget>,
    /// Handler latency of calls that ran, in milliseconds.
    pub call_latency: Percentiles,
    /// The same in microseconds (records that kept only milliseconds count as whole ms), so a
    /// fast upstream does not read as 0 ms.
    pub call_latency_us: Percentiles,
    /// Governance latency of decided calls, in microseconds: from the request to its decision
    /// and reservation (destination lookups included), without the handler.
    pub governance_latency: Percentiles,
    /// Shadow rules that matched in the period, by rule and what it would have done.
    pub shadow: Vec<ShadowUse>,
    /// Per person: decisions per active day and the median time per decision.
    pub approvers: Vec<ApproverLoad>,
}

/// One person's decisions on approval requests: the fatigue signal.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ApproverLoad {
    pub approver: String,
    pub approvals: u64,
    pub rejections: u64,
    /// Distinct UTC days with at least one decision.
    pub days: u64,
    /// Median seconds between one decision and the next by the same person, counting only
    /// gaps under 15 minutes (a working session); none with fewer than two such decisions.
    pub median_secs: Option<f64>,
}

impl ApproverLoad {
    pub fn per_day(&self) -> f64 {
        (self.approvals + self.rejections) as f64 / self.days.max(1) as f64
    }
}

/// A gap longer than this between two decisions starts a new working session.
const SESSION_GAP_MS: i64 = 15 * 60 * 1000;

/// Per-approver load from the decisions in the period.
pub fn approver_loads(decisions: &[toolgate_store::ApprovalDecision]) -> Vec<ApproverLoad> {
    let mut by: BTreeMap<&str, Vec<&toolgate_store::ApprovalDecision>> = BTreeMap::new();
    for d in decisions {
        by.entry(d.approver.as_str()).or_default().push(d);
    }
    by.into_iter()
        .map(|(who, mut ds)| {
            ds.sort_by_key(|d| d.at);
            let days: std::collections::BTreeSet<i64> = ds.iter().map(|d| d.at.utc_day()).collect();
            let mut gaps: Vec<i64> = ds
                .windows(2)
                .map(|w| w[1].at.millis() - w[0].at.millis())
                .filter(|g| *g < SESSION_GAP_MS)
                .collect();
            gaps.sort_unstable();
            let median_secs = (!gaps.is_empty()).then(|| {
                let n = gaps.len();
                let mid = if n % 2 == 1 {
                    gaps[n / 2] as f64
                } else {
                    (gaps[n / 2 - 1] + gaps[n / 2]) as f64 / 2.0
                };
                mid / 1000.0
            });
            ApproverLoad {
                approver: who.to_string(),
                approvals: ds.iter().filter(|d| d.approved).count() as u64,
                rejections: ds.iter().filter(|d| !d.approved).count() as u64,
                days: days.len() as u64,
                median_secs,
            }
        })
        .collect()
}

fn decision_name(d: AuditDecision) -> String {
    serde_json::to_value(d)
        .ok()
        .and_then(|v| v.as_str().map(str::to_string))
        .unwrap_or_else(|| format!("{d:?}"))
}

/// Monday 00:00 UTC of the week holding `t`.
pub fn week_start(t: Timestamp) -> Timestamp {
    let day = t.utc_day();
    // Day 0 (1970-01-01) was a Thursday: (day + 3) mod 7 is 0 on Mondays.
    Timestamp::from_millis((day - (day + 3).rem_euclid(7)) * DAY_MS)
}

/// Computes the report from what the store holds. Records and requests before `since` are
/// left out; budgets are today's.
pub fn compute(
    registry: &Registry,
    records: &[AuditRecord],
    approvals: &[ApprovalRequest],
    budgets: &[BudgetUse],
    since: Option<Timestamp>,
    now: Timestamp,
) -> Report {
    let in_period = |t: Timestamp| since.is_none_or(|s| t >= s) && t <= now;
    let records: Vec<&AuditRecord> = records.iter().filter(|r| in_period(r.body.ts)).collect();

    let mut calls = BTreeMap::new();
    let mut refusals = BTreeMap::new();
    let mut duplicates = 0;
    let mut conflicts = 0;
    let mut latencies = Vec::new();
    let mut latencies_us = Vec::new();
    let mut governance = Vec::new();
    for r in &records {
        let b = &r.body;
        if let Some(us) = b.outcome.governance_us {
            governance.push(us);
        }
        // A refused unknown tool's name is the agent's: kept as people may safely see it.
        *calls
            .entry((crate::fmt::text(&b.tool), decision_name(b.why.decision)))
            .or_insert(0) += 1;
        match b.why.decision {
            AuditDecision::Deny => {
                let rule = b.why.rule.as_deref().unwrap_or("(none)").to_string();
                if rule.starts_with("idempotency.") {
                    conflicts += 1;
                }
                *refusals.entry(rule).or_insert(0) += 1;
            }
            AuditDecision::Replay => duplicates += 1,
            AuditDecision::Allow => {
                if let Some(ms) = b.outcome.latency_ms {
                    latencies.push(ms);
                }
                if let Some(us) = b
                    .outcome
                    .latency_us
                    .or(b.outcome.latency_ms.map(|m| m * 1000))
                {
                    latencies_us.push(us);
                }
            }
            _ => {}
        }
    }

    // Unknowns: an allowed call that ended unknown, settled later by a reconcile record.
    let mut unknowns = Unknowns::default();
    let mut reconcile_ms = Vec::new();
    for r in &records {
        let b = &r.body;
        if b.why.decision == AuditDecision::Allow && b.outcome.status == StepStatus::Unknown {
            unknowns.total += 1;
            let settled = records.iter().find(|x| {
                x.seq > r.seq
                    && x.body.why.decision == AuditDecision::Reconcile
                    && x.body.outcome.status != StepStatus::Unknown
                    && match (&x.body.step_id, &b.step_id) {
                        (Some(a), Some(c)) => a == c,
                        _ => x.body.idem_key.is_some() && x.body.idem_key == b.idem_key,
                    }
            });
            match settled {
                Some(x) => {
                    unknowns.reconciled += 1;
                    reconcile_ms.push(x.body.ts.millis() - b.ts.millis());
                }
                None => unknowns.open += 1,
            }
        }
    }
    unknowns.time_to_reconcile = Percentiles::of(reconcile_ms);

    // Gates, from the requests raised in the period.
    let requests: Vec<&ApprovalRequest> = approvals
        .iter()
        .filter(|a| in_period(a.created_at))
        .collect();
    let mut gates: BTreeMap<(String, String), Gate> = BTreeMap::new();
    let mut weeks: BTreeMap<(String, String, i64), (u64, u64)> = BTreeMap::new();
    let mut ages = Vec::new();
    for a in &requests {
        let key = (a.tool.clone(), a.rule.to_string());
        let g = gates.entry(key.clone()).or_insert_with(|| Gate {
            tool: a.tool.clone(),
            rule: a.rule.to_string(),
            raised: 0,
            approved: 0,
            rejected: 0,
            expired: 0,
            open: 0,
            reviewer_closed: 0,
            closed_without_people: 0,
            approved_not_run: 0,
            weeks: Vec::new(),
        });
        g.raised += 1;
        let week = weeks
            .entry((key.0, key.1, week_start(a.created_at).millis()))
            .or_insert((0, 0));
        let by_people = a.approved_by.len() as i64 >= a.approvers_needed.max(1);
        // Approved and not consumed: it ran nowhere yet; refused at run time if its subject
        // was decided since.
        let refused = a.status == ApprovalStatus::Approved
            && records.iter().any(|x| {
                x.body.ts >= a.created_at
                    && x.body.why.decision == AuditDecision::Deny
                    && x.body.step_id.as_deref() == Some(a.subject.as_str())
            });
        let o = GateOutcome::of(
            a.status,
            by_people,
            a.decided_by.is_some(),
            !a.approved_by.is_empty(),
            a.expires_at <= now,
            refused,
        );
        g.closed_without_people += u64::from(o.closed_without_people);
        g.reviewer_closed += u64::from(o.reviewer_closed);
        g.approved_not_run += u64::from(o.approved_not_run);
        g.expired += u64::from(o.expired);
        g.open += u64::from(o.open);
        if o.approved {
            g.approved += 1;
            week.0 += 1;
            if let Some(at) = a.decided_at {
                ages.push(at.millis() - a.created_at.millis());
                continue;
            }
            let used = records.iter().find(|x| {
                x.body.approval.is_some()
                    && x.body.ts >= a.created_at
                    && (x.body.step_id.as_deref() == Some(a.subject.as_str())
                        || x.body.idem_key.as_deref() == Some(a.subject.as_str()))
            });
            if let Some(x) = used {
                ages.push(x.body.ts.millis() - a.created_at.millis());
            }
        } else if o.rejected {
            g.rejected += 1;
            week.1 += 1;
            if let Some(at) = a.decided_at {
                ages.push(at.millis() - a.created_at.millis());
                continue;
            }
            let rejected = records.iter().find(|x| {
                x.body.why.decision == AuditDecision::Rejected
                    && x.body.tool == a.tool
                    && x.body.run_id.as_deref() == a.run_id.as_deref()
                    && x.body.ts >= a.created_at
                    && x.body
                        .step_id
                        .as_deref()
                        .is_none_or(|s| s == a.subject.as_str())
            });
            if let Some(x) = rejected {
                ages.push(x.body.ts.millis() - a.created_at.millis());
            }
        }
    }
    for ((tool, rule, start), (approved, rejected)) in weeks {
        if let Some(g) = gates.get_mut(&(tool, rule)) {
            g.weeks.push(Week {
                start: Timestamp::from_millis(start),
                approved,
                rejected,
            });
        }
    }

    let shadow = shadow_uses(&records);

    let budgets = budgets
        .iter()
        .map(|b| Budget {
            principal: b.principal.to_string(),
            tier: b.tier,
            used: b.used,
            limit: registry
                .principal(&b.principal)
                .and_then(|p| p.budget(b.tier)),
        })
        .collect();

    Report {
        since,
        until: now,
        records: records.len() as u64,
        calls,
        refusals,
        gates: gates.into_values().collect(),
        approval_age: Percentiles::of(ages),
        duplicates_suppressed: duplicates,
        key_conflicts: conflicts,
        unknowns,
        budgets,
        call_latency: Percentiles::of(latencies),
        call_latency_us: Percentiles::of(latencies_us),
        governance_latency: Percentiles::of(governance),
        shadow,
        approvers: Vec::new(),
    }
}

/// Per shadow rule, the records that name it (`why.shadow`), in chain order.
fn shadow_uses(records: &[&AuditRecord]) -> Vec<ShadowUse> {
    let mut uses: BTreeMap<(String, ShadowEffect), ShadowUse> = BTreeMap::new();
    for r in records {
        let b = &r.body;
        for m in &b.why.shadow {
            let u = uses
                .entry((m.rule.to_string(), m.would))
                .or_insert_with(|| ShadowUse {
                    rule: m.rule.to_string(),
                    would: m.would,
                    matched: 0,
                    let_through: 0,
                    calls: Vec::new(),
                });
            u.matched += 1;
            if matches!(b.why.decision, AuditDecision::Allow | AuditDecision::Replay) {
                u.let_through += 1;
            }
            u.calls.push(ShadowCall {
                seq: r.seq,
                ts: b.ts,
                tool: crate::fmt::text(&b.tool),
                principal: b.who.principal.to_string(),
                run_id: b.run_id.as_deref().map(crate::fmt::text),
                decision: decision_name(b.why.decision),
            });
        }
    }
    uses.into_values().collect()
}

/// Reads what the report needs from the store and computes it.
pub async fn gather(
    store: &Store,
    registry: &Registry,
    since: Option<Timestamp>,
    now: Timestamp,
) -> Result<Report, StoreError> {
    let records = store.audit_records(None, None).await?;
    let approvals = store.approvals(None).await?;
    let budgets = store.budget_use(now).await?;
    let mut report = compute(registry, &records, &approvals, &budgets, since, now);
    let decisions: Vec<_> = store
        .approval_decisions()
        .await?
        .into_iter()
        .filter(|d| since.is_none_or(|s| d.at >= s) && d.at <= now)
        .collect();
    report.approvers = approver_loads(&decisions);
    Ok(report)
}

/// Parses `--since`: `7d`, `36h`, `2w`, or a date `2026-06-01` (UTC midnight).
pub fn parse_since(text: &str, now: Timestamp) -> Option<Timestamp> {
    let t = text.trim();
    let (num, unit) = t.split_at(t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len()));
    if let (Ok(n), Some(ms)) = (
        num.parse::<i64>(),
        match unit {
            "h" => Some(3_600_000),
            "d" => Some(DAY_MS),
            "w" => Some(WEEK_MS),
            _ => None,
        },
    ) {
        return Some(Timestamp::from_millis(now.millis() - n * ms));
    }
    let fmt = time::macros::format_description!("[year]-[month]-[day]");
    let date = time::Date::parse(t, &fmt).ok()?;
    let secs = date.midnight().assume_utc().unix_timestamp();
    Some(Timestamp::from_millis(secs * 1000))
}

fn pct(r: Option<f64>) -> String {
    r.map(|r| format!("{:.1} %", r * 100.0))
        .unwrap_or_else(|| "-".into())
}

fn ratio(x: Option<f64>) -> String {
    x.map(|x| format!("{x:.1}")).unwrap_or_else(|| "∞".into())
}

fn ms(x: Option<i64>) -> String {
    x.map(crate::fmt::duration_ms).unwrap_or_else(|| "-".into())
}

impl Report {
    /// The report as the terminal prints it.
    pub fn to_text(&self) -> String {
        let mut s = String::new();
        let since = self
            .since
            .map(crate::fmt::datetime)
            .unwrap_or_else(|| "the first record".into());
        let _ = writeln!(
            s,
            "toolgate report: {} audit record(s) from {since} to {}",
            self.records,
            crate::fmt::datetime(self.until)
        );
        let _ = writeln!(s, "\ncalls by tool and decision");
        if self.calls.is_empty() {
            let _ = writeln!(s, "  (none)");
        }
        for ((tool, decision), n) in &self.calls {
            let _ = writeln!(s, "  {tool:<28} {decision:<16} {n:>6}");
        }
        let _ = writeln!(s, "\nrefusals by rule");
        if self.refusals.is_empty() {
            let _ = writeln!(s, "  (none)");
        }
        for (rule, n) in &self.refusals {
            let _ = writeln!(s, "  {rule:<44} {n:>6}");
        }
        let _ = writeln!(
            s,
            "\ngates (r = rejected / decided; a gate pays when undoing a wrong call costs more than 1/r approvals)"
        );
        if self.gates.is_empty() {
            let _ = writeln!(s, "  (no approval requests)");
        }
        for g in &self.gates {
            let _ = writeln!(
                s,
                "  {} [{}]: raised {}, approved {}, rejected {}, expired {}, open {}; r = {}, 1/r = {}",
                g.tool,
                g.rule,
                g.raised,
                g.approved,
                g.rejected,
                g.expired,
                g.open,
                pct(g.rejection_rate()),
                ratio(g.break_even())
            );
            for w in &g.weeks {
                let _ = writeln!(
                    s,
                    "    week of {}: approved {}, rejected {}, r = {}",
                    &crate::fmt::datetime(w.start)[..10],
                    w.approved,
                    w.rejected,
                    pct(w.rate())
                );
            }
        }
        for g in self
            .gates
            .iter()
            .filter(|g| g.reviewer_closed + g.closed_without_people + g.approved_not_run > 0)
        {
            let _ = writeln!(
                s,
                "  {} [{}]: closed by a reviewer {}, closed without the people it needed {}, approved but not run {}",
                g.tool, g.rule, g.reviewer_closed, g.closed_without_people, g.approved_not_run
            );
        }
        if !self.approvers.is_empty() {
            let _ = writeln!(
                s,
                "\napprovers (decisions per active day, median time per decision)"
            );
        }
        for a in &self.approvers {
            let _ = writeln!(
                s,
                "  {:<16} {} approved, {} rejected over {} day(s): {:.1} a day; median {}",
                a.approver,
                a.approvals,
                a.rejections,
                a.days,
                a.per_day(),
                a.median_secs
                    .map(|x| format!("{x:.1} s"))
                    .unwrap_or_else(|| "-".into())
            );
        }
        let a = &self.approval_age;
        let _ = writeln!(
            s,
            "\napprovals' age at decision: {} decided; p50 {}, p90 {}, max {}",
            a.n,
            ms(a.p50),
            ms(a.p90),
            ms(a.max)
        );
        let _ = writeln!(
            s,
            "duplicates suppressed (replayed, nothing ran): {}; key conflicts refused: {}",
            self.duplicates_suppressed, self.key_conflicts
        );
        let u = &self.unknowns;
        let _ = writeln!(
            s,
            "unknown outcomes: {} ({} reconciled, {} open); time to reconcile p50 {}, max {}",
            u.total,
            u.reconciled,
            u.open,
            ms(u.time_to_reconcile.p50),
            ms(u.time_to_reconcile.max)
        );
        let _ = writeln!(s, "\nbudget use today");
        if self.budgets.is_empty() {
            let _ = writeln!(s, "  (none used)");
        }
        for b in &self.budgets {
            let limit = b
                .limit
                .map(|l| l.to_string())
                .unwrap_or_else(|| "no limit".into());
            let _ = writeln!(
                s,
                "  {:<24} {:<6} {} of {limit}",
                b.principal, b.tier, b.used
            );
        }
        let _ = writeln!(
            s,
            "\nshadow rules (evaluated on every call, recorded, never deciding)"
        );
        if self.shadow.is_empty() {
            let _ = writeln!(s, "  (none matched)");
        }
        for u in &self.shadow {
            let verb = u.verb();
            let _ = writeln!(
                s,
                "  {} would have {verb} {} call(s); {} of them were let through",
                u.rule, u.matched, u.let_through
            );
            const SHOWN: usize = 10;
            for c in u.calls.iter().take(SHOWN) {
                let _ = writeln!(
                    s,
                    "    #{} {} {} by {} ({}){}",
                    c.seq,
                    crate::fmt::datetime(c.ts),
                    c.tool,
                    c.principal,
                    c.decision,
                    c.run_id
                        .as_deref()
                        .map(|r| format!(" run {r}"))
                        .unwrap_or_default()
                );
            }
            if u.calls.len() > SHOWN {
                let _ = writeln!(
                    s,
                    "    … and {} more (`toolgate log export` has them all)",
                    u.calls.len() - SHOWN
                );
            }
        }
        let l = &self.call_latency_us;
        let _ = writeln!(
            s,
            "\ncall latency (handler, µs): n {}, p50 {}, p95 {}, p99 {}, max {}",
            l.n,
            opt(l.p50),
            opt(l.p95),
            opt(l.p99),
            opt(l.max)
        );
        let g = &self.governance_latency;
        let _ = writeln!(
            s,
            "governance latency (decision and reservation, before the handler, µs): n {}, p50 {}, p95 {}, p99 {}, max {}",
            g.n,
            opt(g.p50),
            opt(g.p95),
            opt(g.p99),
            opt(g.max)
        );
        s
    }

    /// The same figures in the Prometheus text exposition format.
    pub fn to_prometheus(&self) -> String {
        let mut s = String::new();
        let mut family = |name: &str, kind: &str, help: &str, rows: Vec<(String, String)>| {
            let _ = writeln!(s, "# HELP {name} {help}");
            let _ = writeln!(s, "# TYPE {name} {kind}");
            for (labels, value) in rows {
                // A row keyed `_count` or `_sum` is that series of a summary.
                if let Some(suffix) = labels.strip_prefix('_') {
                    let _ = writeln!(s, "{name}_{suffix} {value}");
                } else if labels.is_empty() {
                    let _ = writeln!(s, "{name} {value}");
                } else {
                    let _ = writeln!(s, "{name}{{{labels}}} {value}");
                }
            }
        };
        family(
            "toolgate_calls_total",
            "counter",
            "Audit records by tool and decision.",
            self.calls
                .iter()
                .map(|((t, d), n)| (labels(&[("tool", t), ("decision", d)]), n.to_string()))
                .collect(),
        );
        family(
            "toolgate_refusals_total",
            "counter",
            "Denied calls by the rule that refused them.",
            self.refusals
                .iter()
                .map(|(r, n)| (labels(&[("rule", r)]), n.to_string()))
                .collect(),
        );
        let mut rows = Vec::new();
        for g in &self.gates {
            for (status, n) in [
                ("approved", g.approved),
                ("rejected", g.rejected),
                ("expired", g.expired),
                ("open", g.open),
            ] {
                rows.push((
                    labels(&[("tool", &g.tool), ("rule", &g.rule), ("status", status)]),
                    n.to_string(),
                ));
            }
        }
        family(
            "toolgate_gate_requests_total",
            "counter",
            "Approval requests by gate and status.",
            rows,
        );
        family(
            "toolgate_gate_rejection_rate",
            "gauge",
            "Rejected / decided approval requests per gate (r).",
            self.gates
                .iter()
                .filter_map(|g| {
                    g.rejection_rate()
                        .map(|r| (labels(&[("tool", &g.tool), ("rule", &g.rule)]), float(r)))
                })
                .collect(),
        );
        family(
            "toolgate_gate_break_even_ratio",
            "gauge",
            "1/r: the cost of undoing a wrong call, in approvals, above which the gate pays (+Inf while r is 0).",
            self.gates
                .iter()
                .filter(|g| g.rejection_rate().is_some())
                .map(|g| {
                    (
                        labels(&[("tool", &g.tool), ("rule", &g.rule)]),
                        g.break_even().map(float).unwrap_or_else(|| "+Inf".into()),
                    )
                })
                .collect(),
        );
        family(
            "toolgate_approval_age_seconds",
            "summary",
            "Age of approval requests at decision.",
            summary(&self.approval_age, 1000.0),
        );
        family(
            "toolgate_duplicates_suppressed_total",
            "counter",
            "Calls answered from a stored outcome (nothing ran).",
            vec![(String::new(), self.duplicates_suppressed.to_string())],
        );
        family(
            "toolgate_key_conflicts_total",
            "counter",
            "Calls refused because the same key was in flight or reused with other inputs.",
            vec![(String::new(), self.key_conflicts.to_string())],
        );
        family(
            "toolgate_unknown_outcomes_total",
            "counter",
            "Irreversible calls whose outcome was unknown, by reconciliation state.",
            vec![
                (
                    labels(&[("state", "reconciled")]),
                    self.unknowns.reconciled.to_string(),
                ),
                (labels(&[("state", "open")]), self.unknowns.open.to_string()),
            ],
        );
        family(
            "toolgate_reconcile_seconds",
            "summary",
            "Time from an unknown outcome to its reconciliation.",
            summary(&self.unknowns.time_to_reconcile, 1000.0),
        );
        family(
            "toolgate_budget_used",
            "gauge",
            "Today's budget use per principal and tier.",
            self.budgets
                .iter()
                .map(|b| {
                    (
                        labels(&[("principal", &b.principal), ("tier", b.tier.as_str())]),
                        b.used.to_string(),
                    )
                })
                .collect(),
        );
        family(
            "toolgate_budget_limit",
            "gauge",
            "Daily budget limit per principal and tier.",
            self.budgets
                .iter()
                .filter_map(|b| {
                    b.limit.map(|l| {
                        (
                            labels(&[("principal", &b.principal), ("tier", b.tier.as_str())]),
                            l.to_string(),
                        )
                    })
                })
                .collect(),
        );
        family(
            "toolgate_shadow_matches_total",
            "counter",
            "Calls a shadow rule would have refused or gated (it did not decide them).",
            self.shadow
                .iter()
                .map(|u| {
                    (
                        labels(&[("rule", &u.rule), ("would", u.would.as_str())]),
                        u.matched.to_string(),
                    )
                })
                .collect(),
        );
        family(
            "toolgate_call_latency_seconds",
            "summary",
            "Handler latency of calls that ran.",
            summary(&self.call_latency, 1000.0),
        );
        family(
            "toolgate_governance_latency_seconds",
            "summary",
            "Time from a call's request to its decision and reservation, without the handler.",
            summary(&self.governance_latency, 1_000_000.0),
        );
        s
    }
}

fn opt(x: Option<i64>) -> String {
    x.map(|v| v.to_string()).unwrap_or_else(|| "-".into())
}

pub(crate) fn float(x: f64) -> String {
    let s = format!("{x:.6}");
    s.trim_end_matches('0').trim_end_matches('.').to_string()
}

fn summary(p: &Percentiles, per_unit: f64) -> Vec<(String, String)> {
    let mut rows = Vec::new();
    for (q, v) in [
        ("0.5", p.p50),
        ("0.9", p.p90),
        ("0.95", p.p95),
        ("0.99", p.p99),
    ] {
        if let Some(v) = v {
            rows.push((labels(&[("quantile", q)]), float(v as f64 / per_unit)));
        }
    }
    rows.push(("_sum".into(), float(p.sum as f64 / per_unit)));
    rows.push(("_count".into(), p.n.to_string()));
    rows
}

/// `k="v",…` with Prometheus escaping.
pub(crate) fn labels(pairs: &[(&str, &str)]) -> String {
    pairs
        .iter()
        .map(|(k, v)| {
            let v = v
                .replace('\\', "\\\\")
                .replace('"', "\\\"")
                .replace('\n', "\\n");
            format!("{k}=\"{v}\"")
        })
        .collect::<Vec<_>>()
        .join(",")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nearest_rank_percentiles() {
        let p = Percentiles::of(vec![40, 10, 30, 20]);
        assert_eq!(
            (p.n, p.p50, p.p90, p.max),
            (4, Some(20), Some(40), Some(40))
        );
        assert_eq!(Percentiles::of(vec![]).p50, None);
    }

    #[test]
    fn weeks_start_on_monday() {
        // 2026-06-11 is a Thursday; its week starts on Monday 2026-06-08.
        let thu = parse_since("2026-06-11", Timestamp::from_millis(0)).unwrap();
        let mon = parse_since("2026-06-08", Timestamp::from_millis(0)).unwrap();
        assert_eq!(
            week_start(Timestamp::from_millis(thu.millis() + 5_000)),
            mon
        );
        assert_eq!(week_start(mon), mon);
    }

    #[test]
    fn since_accepts_spans_and_dates() {
        let now = Timestamp::from_millis(10 * DAY_MS);
        assert_eq!(
            parse_since("7d", now),
            Some(Timestamp::from_millis(3 * DAY_MS))
        );
        assert_eq!(
            parse_since("1w", now),
            Some(Timestamp::from_millis(3 * DAY_MS))
        );
        assert_eq!(
            parse_since("1970-01-02", now),
            Some(Timestamp::from_millis(DAY_MS))
        );
        assert_eq!(parse_since("soon", now), None);
    }

    #[test]
    fn prometheus_labels_escape() {
        assert_eq!(labels(&[("rule", "a\"b")]), "rule=\"a\\\"b\"");
    }
}
