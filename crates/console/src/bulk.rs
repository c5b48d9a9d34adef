//! Bulk approval of like, low-risk items: one decision for a group a person has read as one,
//! bound to the exact set of requests and input hashes shown, with the count and total, and a
//! typed confirmation. "Low-risk" is enforced, not assumed: an item qualifies only below an
//! amount and a risk score, and never when it is a new destination or a first-time payee, a
//! two-person item, one a reviewer flagged, a possible duplicate, restricted data, one whose
//! decision facts warn (a mismatch, an account changed recently, no answer), or a call that
//! would be refused now; and the whole set is refused, nothing approved, if any member changed
//! since it was shown.

use std::collections::BTreeMap;

use serde_json::Value;
use toolgate_core::{ApprovalId, PrincipalId, Sensitivity};
use toolgate_store::{ApprovalRequest, ApprovalStatus, Executor, ReviewVerdict, StoreError};

use crate::actions::{self, Approved};
use crate::error::ConsoleError;
use crate::facts::Memo;

/// Amounts from this one up are decided one at a time, whatever the currency.
pub const MAX_AMOUNT: f64 = 10_000.0;

/// The highest risk score (see [`crate::queue::QueueItem::risk`]) a bulk item may have: a
/// routine confidential payment of a few thousand; more sensitive data, a larger amount or a
/// new destination lifts an item above it.
pub const MAX_RISK: u32 = 7;

/// A group's offer: the members (approval id, input hash) and their total per currency.
#[derive(Debug, Clone, PartialEq)]
pub struct Offer {
    pub members: Vec<(ApprovalId, String)>,
    /// Currency (empty when the calls name none) → total amount; never summed across.
    pub totals: BTreeMap<String, f64>,
}

impl Offer {
    /// The set as the form carries it: `id:hash` joined by commas.
    pub fn set(&self) -> String {
        self.members
            .iter()
            .map(|(id, h)| format!("{id}:{h}"))
            .collect::<Vec<_>>()
            .join(",")
    }
    /// What the person types to confirm.
    pub fn phrase(&self) -> String {
        format!("approve {}", self.members.len())
    }
    /// The totals as people read money: `20,900.00 EUR`, one per currency, joined by ` + `.
    pub fn total_text(&self) -> String {
        self.totals
            .iter()
            .map(|(c, x)| crate::fmt::money(*x, c))
            .collect::<Vec<_>>()
            .join(" + ")
    }
}

/// Adds `req`'s amount to the total of its currency.
fn add_amount(totals: &mut BTreeMap<String, f64>, req: &ApprovalRequest) {
    let amount = req
        .inputs
        .get("amount")
        .and_then(Value::as_f64)
        .unwrap_or(0.0);
    let currency = req
        .inputs
        .get("currency")
        .and_then(Value::as_str)
        .unwrap_or_default()
        .to_string();
    *totals.entry(currency).or_insert(0.0) += amount;
}

/// Why an item is kept out of a bulk approval, or `None` when it may be in one. `all` is every
/// request the store keeps; `memo` holds the lookups already made for this page.
pub async fn excluded(
    exec: &Executor,
    viewer: &str,
    req: &ApprovalRequest,
    all: &[ApprovalRequest],
    memo: &mut Memo,
) -> Result<Option<&'static str>, ConsoleError> {
    let reg = &exec.registry;
    let now = exec.clock.now();
    if req.status != ApprovalStatus::Pending || now >= req.expires_at {
        return Ok(Some("not open"));
    }
    if !actions::may_decide(reg, viewer, req) {
        return Ok(Some("not yours to decide"));
    }
    if req.approvers_needed > 1 || !req.approved_by.is_empty() {
        return Ok(Some("two-person"));
    }
    if reg
        .tool(&req.tool)
        .is_none_or(|t| t.config.sensitivity >= Sensitivity::Restricted)
    {
        return Ok(Some("restricted"));
    }
    let item = crate::queue::QueueItem::of(reg, req, all, now);
    if item.amount.is_some_and(|a| a.abs() >= MAX_AMOUNT) {
        return Ok(Some("amount above the bulk limit"));
    }
    if !item.new_destinations.is_empty() {
        return Ok(Some("new destination"));
    }
    if item.risk() > MAX_RISK {
        return Ok(Some("too risky for bulk"));
    }
    if !crate::facts::duplicates(reg, req, all, exec.store.config().retention_ms()).is_empty() {
        return Ok(Some("possible duplicate"));
    }
    match exec.store.step(&req.subject_step()).await {
        Ok(s) => {
            if toolgate_core::InputHash::of(&s.inputs) != req.input_hash {
                return Ok(Some("inputs changed"));
            }
            let reviews = exec.store.step_reviews(&s.step_id).await?;
            if reviews.iter().any(|r| r.verdict != ReviewVerdict::Approved) {
                return Ok(Some("reviewer-flagged"));
            }
        }
        Err(StoreError::NotFound { .. }) => {}
        Err(e) => return Err(e.into()),
    }
    let facts = crate::facts::look_up_with(exec, req, all, memo).await;
    if let Some(why) = facts.iter().find_map(crate::facts::Facts::warning) {
        return Ok(Some(why));
    }
    let party = crate::item::party(req).or_else(|| facts.iter().find_map(|f| f.party.clone()));
    if let Some(p) = &party
        && crate::facts::first_time_party(exec, req, p, all, memo).await
    {
        return Ok(Some("first-time payee"));
    }
    if exec.dry_decide(req).await?.refused_by().is_some() {
        return Ok(Some("would be refused"));
    }
    Ok(None)
}

/// One group's bulk offer, and why each item left out of it was: `(offer, [(approval id,
/// reason)])`. There is an offer when at least two items qualify.
pub type GroupOffer = (Option<Offer>, Vec<(ApprovalId, &'static str)>);

/// The offer for one queue group, when at least two of its items qualify, with the reason
/// each other item is kept out.
pub async fn offer(
    exec: &Executor,
    viewer: &str,
    group: &[ApprovalRequest],
    all: &[ApprovalRequest],
    memo: &mut Memo,
) -> Result<GroupOffer, ConsoleError> {
    let mut members = Vec::new();
    let mut totals = BTreeMap::new();
    let mut out = Vec::new();
    for r in group {
        match excluded(exec, viewer, r, all, memo).await? {
            None => {
                members.push((r.approval_id.clone(), r.input_hash.to_string()));
                add_amount(&mut totals, r);
            }
            Some(why) => out.push((r.approval_id.clone(), why)),
        }
    }
    Ok((
        (members.len() >= 2).then_some(Offer { members, totals }),
        out,
    ))
}

/// Approves the exact set shown, or nothing: every member must still be open, unchanged (the
/// same input hash) and qualify, and the confirmation must name the count.
pub async fn approve(
    exec: &Executor,
    viewer: &str,
    set: &str,
    confirm: &str,
    run_now: bool,
) -> Result<Vec<(ApprovalId, Approved)>, ConsoleError> {
    let members: Vec<(ApprovalId, &str)> = set
        .split(',')
        .filter(|m| !m.is_empty())
        .filter_map(|m| m.split_once(':'))
        .map(|(id, hash)| (ApprovalId::from(id), hash))
        .collect();
    if members.len() < 2 || confirm.trim() != format!("approve {}", members.len()) {
        return Err(ConsoleError::BulkRefused(format!(
            "type 'approve {}' to confirm the {} calls shown",
            members.len(),
            members.len()
        )));
    }
    let all = exec.store.approvals(None).await?;
    let mut memo = Memo::default();
    for (id, hash) in &members {
        let Some(req) = all.iter().find(|r| r.approval_id == *id) else {
            return Err(ConsoleError::BulkRefused(format!("{id} is not a request")));
        };
        if req.input_hash.as_str() != *hash {
            return Err(ConsoleError::BulkRefused(format!(
                "the inputs of {id} changed after they were shown (shown {hash}, now {})",
                req.input_hash
            )));
        }
        if let Some(why) = excluded(exec, viewer, req, &all, &mut memo).await? {
            return Err(ConsoleError::BulkRefused(format!(
                "{id} can no longer be approved with the others ({why})"
            )));
        }
    }
    let mut out = Vec::new();
    for (id, hash) in members {
        let approved = actions::approve(exec, &id, viewer, hash, run_now).await?;
        out.push((id, approved));
    }
    Ok(out)
}

/// A run's parked steps offered as one decision, like approving a saved plan: every open
/// request of the run, in the order they were raised, each bound to its input hash.
#[derive(Debug, Clone, PartialEq)]
pub struct RunOffer {
    pub run_id: String,
    /// (approval id, input hash, tool), in the order raised.
    pub members: Vec<(ApprovalId, String, String)>,
    /// Why the run cannot be approved as one now (a step the viewer may not decide, one that
    /// would be refused, one whose inputs changed), or `None`.
    pub refusal: Option<String>,
}

impl RunOffer {
    /// The set as the form carries it: `id:hash` joined by commas.
    pub fn set(&self) -> String {
        self.members
            .iter()
            .map(|(id, h, _)| format!("{id}:{h}"))
            .collect::<Vec<_>>()
            .join(",")
    }
}

/// The offer for the run `run_id` as `viewer` would decide it, when it has two or more open
/// requests. Every open request of the run is a member, so a step the viewer may not decide
/// (segregation of duties) refuses the whole run rather than being left out of it.
pub async fn run_offer(
    exec: &Executor,
    viewer: &str,
    run_id: &str,
) -> Result<Option<RunOffer>, ConsoleError> {
    let now = exec.clock.now();
    let mut open: Vec<ApprovalRequest> = exec
        .store
        .approvals(Some(ApprovalStatus::Pending))
        .await?
        .into_iter()
        // The run as given, or as the page shows it (its control and direction characters
        // written out, as the run form carries it); the set still binds each request.
        .filter(|r| {
            r.run_id
                .as_deref()
                .is_some_and(|id| id == run_id || crate::fmt::text(id) == run_id)
                && now < r.expires_at
        })
        .collect();
    if open.len() < 2 {
        return Ok(None);
    }
    open.sort_by(|a, b| (a.created_at, &a.approval_id).cmp(&(b.created_at, &b.approval_id)));
    let refusal = run_refusal(exec, viewer, &open).await?;
    Ok(Some(RunOffer {
        run_id: run_id.to_string(),
        members: open
            .iter()
            .map(|r| {
                (
                    r.approval_id.clone(),
                    r.input_hash.to_string(),
                    r.tool.clone(),
                )
            })
            .collect(),
        refusal,
    }))
}

/// Why `viewer` cannot approve the run's open requests `open` (in the order raised) as one,
/// or `None`. Each request is checked as a single approval would be; then all of them are
/// decided together, dry, as if approved and run in order (see
/// [`Executor::dry_decide_together`]), so a step that only the earlier steps' effects would
/// refuse (a budget they use up) refuses the run before anything is approved.
async fn run_refusal(
    exec: &Executor,
    viewer: &str,
    open: &[ApprovalRequest],
) -> Result<Option<String>, ConsoleError> {
    for (n, r) in open.iter().enumerate() {
        let step = n + 1;
        let why = if !actions::may_decide(&exec.registry, viewer, r) {
            Some(format!(
                "parked step {step} ({}) is not yours to decide",
                crate::fmt::text(&r.tool)
            ))
        } else if r.approved_by.iter().any(|a| a == viewer) {
            Some(format!("you already approved parked step {step}"))
        } else {
            match exec.store.step(&r.subject_step()).await {
                Ok(s) if toolgate_core::InputHash::of(&s.inputs) != r.input_hash => {
                    Some(format!("the inputs of parked step {step} changed"))
                }
                Ok(s) if s.status != toolgate_core::StepStatus::NeedsApproval => Some(format!(
                    "parked step {step} is no longer parked (it is {})",
                    s.status
                )),
                Ok(_) | Err(StoreError::NotFound { .. }) => None,
                Err(e) => return Err(e.into()),
            }
        };
        if why.is_some() {
            return Ok(why);
        }
    }
    let dry = match exec
        .dry_decide_together(open, &PrincipalId::from(viewer))
        .await
    {
        Ok(d) => d,
        Err(e) => {
            let e = ConsoleError::from(e);
            if e.is_refusal() {
                return Ok(Some(e.to_string()));
            }
            return Err(e);
        }
    };
    for (n, (r, d)) in open.iter().zip(&dry).enumerate() {
        if let Some((rule, reason)) = d.refused_by() {
            return Ok(Some(format!(
                "parked step {} ({}) would be refused by {}: {}{}",
                n + 1,
                crate::fmt::text(&r.tool),
                crate::fmt::text(rule),
                crate::fmt::text(reason),
                if n > 0 {
                    " (decided as if the steps before it were approved and ran)"
                } else {
                    ""
                }
            )));
        }
    }
    Ok(None)
}

/// Approves the run's parked steps as one, all or nothing: the set must be exactly the run's
/// open requests as shown (none added, none changed), and none may be refused, decided
/// together as if approved and run in order; then every grant is taken in one transaction,
/// each bound to its hash, and (with `run_now`) each step runs once, in the order raised.
pub async fn approve_run(
    exec: &Executor,
    viewer: &str,
    run_id: &str,
    set: &str,
    run_now: bool,
) -> Result<Vec<(ApprovalId, Approved)>, ConsoleError> {
    let Some(offer) = run_offer(exec, viewer, run_id).await? else {
        return Err(ConsoleError::BulkRefused(
            "this run no longer has two or more parked steps to approve together".into(),
        ));
    };
    if offer.set() != set {
        return Err(ConsoleError::BulkRefused(
            "the run's parked steps changed after they were shown (a step was added, decided \
             or revised): open the run again"
                .into(),
        ));
    }
    if let Some(why) = offer.refusal {
        return Err(ConsoleError::BulkRefused(why));
    }
    // Every condition of a single approval, for every step, before anything is granted.
    let mut steps = Vec::with_capacity(offer.members.len());
    for (id, hash, _) in &offer.members {
        steps.push(actions::approvable(exec, id, viewer, hash).await?);
    }
    // All the grants in one transaction: all taken, or none.
    let ids: Vec<&ApprovalId> = offer.members.iter().map(|(id, _, _)| id).collect();
    exec.store
        .approve_all(
            &exec.registry,
            &exec.keys,
            &ids,
            &PrincipalId::from(viewer),
            exec.clock.now(),
        )
        .await?;
    let mut out = Vec::new();
    for ((id, _, _), step) in offer.members.iter().zip(steps) {
        out.push((
            id.clone(),
            actions::after_grant(exec, id, step, run_now).await?,
        ));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;
    use toolgate_core::{InputHash, Timestamp};

    fn req(amount: f64, currency: &str) -> ApprovalRequest {
        ApprovalRequest {
            approval_id: "a".into(),
            subject: "a".into(),
            run_id: None,
            principal: "fin-worker".into(),
            tool: "payment.schedule".into(),
            tool_version: "1".into(),
            input_hash: InputHash::from_stored("sha256:00"),
            inputs: json!({"amount": amount, "currency": currency}),
            reason: None,
            evidence: vec![],
            rule: "gate.always".into(),
            approvers_needed: 1,
            approved_by: vec![],
            status: ApprovalStatus::Pending,
            created_at: Timestamp::from_millis(0),
            expires_at: Timestamp::from_millis(1),
            decided_at: None,
            decided_by: None,
        }
    }

    #[test]
    fn totals_are_never_summed_across_currencies() {
        let mut totals = BTreeMap::new();
        for r in [req(4180.0, "EUR"), req(300.0, "USD"), req(1000.0, "EUR")] {
            add_amount(&mut totals, &r);
        }
        let offer = Offer {
            members: vec![],
            totals,
        };
        assert_eq!(offer.total_text(), "5,180.00 EUR + 300.00 USD");
    }
}
