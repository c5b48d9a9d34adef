//! People's decisions on parked calls: a grant (who may decide, whether the request is still
//! open, the token bound to the exact call, and the parked step back in the queue once enough
//! people approved) and a rejection (the request closed, a parked step refused, its audit
//! record). What they change in the ledgers is [`crate::ledger::approvals`]'s and
//! [`crate::ledger::steps`]'s; the [`Store`] methods here are their entry points, one
//! transaction each.

use toolgate_core::{
    ApprovalClaims, ApprovalId, ApprovalKeys, ApprovalToken, InputHash, PrincipalId, Registry,
    Rule, StepId, StepStatus, Timestamp,
};

use crate::audit::{self, AuditApproval, AuditCall, AuditDraft, AuditWho};
use crate::db::Tx;
use crate::error::{Result, StoreError};
use crate::ledger::{approvals, steps};
use crate::model::{ApprovalRequest, ApprovalStatus, StepOutcome};
use crate::store::{Store, new_id};

impl Store {
    /// A person approves a parked call. Issues a token bound to the exact inputs, the tool
    /// version and the approver, expiring with the request. When enough distinct people have
    /// approved, a parked planned step goes back to the queue. An expired request fails closed.
    pub async fn approve(
        &self,
        registry: &Registry,
        keys: &ApprovalKeys,
        approval_id: &ApprovalId,
        approver: &PrincipalId,
        now: Timestamp,
    ) -> Result<ApprovalToken> {
        approver_of_anything(registry, approver)?;
        let mut tx = self.begin().await?;
        match grant(&mut tx, registry, keys, approval_id, approver, now).await {
            Ok(token) => {
                tx.commit().await?;
                Ok(token)
            }
            Err(e @ StoreError::ApprovalExpired { .. }) => {
                // The lapse is recorded, so the request leaves the queue.
                tx.commit().await?;
                Err(e)
            }
            Err(e) => Err(e),
        }
    }

    /// One person approves several parked calls as one decision (a run's parked steps), in
    /// one transaction: every grant is taken, or none is (a request that closed, expired or
    /// was already approved by this person refuses the whole set, and nothing is written).
    pub async fn approve_all(
        &self,
        registry: &Registry,
        keys: &ApprovalKeys,
        approval_ids: &[&ApprovalId],
        approver: &PrincipalId,
        now: Timestamp,
    ) -> Result<Vec<ApprovalToken>> {
        approver_of_anything(registry, approver)?;
        let mut tx = self.begin().await?;
        let mut tokens = Vec::with_capacity(approval_ids.len());
        for id in approval_ids {
            // An error drops the transaction: the grants before it are rolled back.
            tokens.push(grant(&mut tx, registry, keys, id, approver, now).await?);
        }
        tx.commit().await?;
        Ok(tokens)
    }

    /// A person rejects a parked call: the request closes and a parked step is refused.
    pub async fn reject(
        &self,
        registry: &Registry,
        approval_id: &ApprovalId,
        approver: &PrincipalId,
        note: &str,
        now: Timestamp,
    ) -> Result<()> {
        let mut tx = self.begin().await?;
        reject(&mut tx, registry, approval_id, approver, note, now).await?;
        tx.commit().await
    }
}

/// Only a person with an approver role decides approval requests.
fn approver_of_anything(registry: &Registry, approver: &PrincipalId) -> Result<()> {
    if registry.approves_anything(approver) {
        Ok(())
    } else {
        Err(StoreError::NotAnApprover(approver.to_string()))
    }
}

/// Segregation of duties, under the registry serving now: whether `approver` may decide the
/// request `approval_id` raised for `principal`'s call of `tool`, gated by `rule`.
fn may_decide(
    registry: &Registry,
    approval_id: &ApprovalId,
    approver: &PrincipalId,
    principal: &str,
    tool: &str,
    rule: &Rule,
) -> Result<()> {
    registry
        .may_approve(approver, principal, tool, rule)
        .map_err(|why| StoreError::Ineligible {
            id: approval_id.to_string(),
            why: Box::new(why),
        })
}

fn not_found(approval_id: &ApprovalId) -> StoreError {
    StoreError::NotFound {
        what: "approval request",
        id: approval_id.to_string(),
    }
}

/// `approver`'s grant of the request `approval_id`, inside `tx` (see [`Store::approve`]). An
/// expired request is marked so in `tx` and refused; the caller decides whether to commit.
pub(crate) async fn grant(
    tx: &mut Tx,
    registry: &Registry,
    keys: &ApprovalKeys,
    approval_id: &ApprovalId,
    approver: &PrincipalId,
    now: Timestamp,
) -> Result<ApprovalToken> {
    let req = approvals::gate_request(tx, approval_id)
        .await?
        .ok_or_else(|| not_found(approval_id))?;
    may_decide(
        registry,
        approval_id,
        approver,
        &req.principal,
        &req.tool,
        &req.rule,
    )?;
    if req.status != ApprovalStatus::Pending {
        return Err(StoreError::ApprovalClosed {
            id: approval_id.to_string(),
            status: req.status.as_str().to_string(),
        });
    }
    if now.millis() >= req.expires_at {
        approvals::expire(tx, approval_id, now).await?;
        return Err(StoreError::ApprovalExpired {
            id: approval_id.to_string(),
            expires_at: req.expires_at,
        });
    }
    let claims = ApprovalClaims {
        subject: req.subject.clone(),
        tool: req.tool,
        tool_version: req.tool_version,
        input_hash: InputHash::from_stored(req.input_hash),
        // The registry version and rule the gate was decided under: after a reload the
        // approval carries over only while the current rules gate the call the same way.
        registry_version: Some(
            req.registry_version
                .unwrap_or_else(|| registry.version.hash.clone()),
        ),
        gate_rule: Some(req.rule),
        // The upstream definition the call was parked under (none for built-in tools).
        definition_hash: req.definition_hash,
        approver: approver.to_string(),
        expires_at: Timestamp::from_millis(req.expires_at),
        nonce: new_id(),
    };
    let token = keys.issue(&claims);
    if !approvals::add_grant(tx, approval_id, approver, &token, &claims.nonce, now).await? {
        return Err(StoreError::SameApprover {
            id: approval_id.to_string(),
            approver: approver.to_string(),
        });
    }
    if approvals::grant_count(tx, approval_id).await? >= req.approvers_needed {
        approvals::mark_approved(tx, approval_id, now).await?;
        // A parked planned step goes back to the queue.
        steps::requeue_parked(tx, &req.subject, now).await?;
    }
    Ok(token)
}

/// `approver`'s rejection of the request `approval_id` with `note`, inside `tx` (see
/// [`Store::reject`]): the request closes, the step it parked (if it parked one) is refused
/// by `approval.rejected`, and the rejection is recorded in the audit chain.
async fn reject(
    tx: &mut Tx,
    registry: &Registry,
    approval_id: &ApprovalId,
    approver: &PrincipalId,
    note: &str,
    now: Timestamp,
) -> Result<()> {
    let request = approvals::by_id(tx, approval_id).await?;
    if let Some(r) = &request {
        may_decide(
            registry,
            approval_id,
            approver,
            &r.principal,
            &r.tool,
            &r.rule,
        )?;
    }
    if !approvals::reject(tx, approval_id, approver, note, now).await? {
        return Err(StoreError::ApprovalClosed {
            id: approval_id.to_string(),
            status: "not pending".into(),
        });
    }
    let request = request.ok_or_else(|| not_found(approval_id))?;
    let outcome = rejected(approval_id, approver, note);
    let parked = steps::refuse_parked(tx, &request.subject, &outcome, now).await?;
    let draft = rejection_record(registry, request, parked, &outcome, approver, note, now);
    audit::append(tx, vec![draft]).await?;
    Ok(())
}

/// What a step parked by `approval_id` comes to when `approver` rejects it with `note`.
fn rejected(approval_id: &ApprovalId, approver: &PrincipalId, note: &str) -> StepOutcome {
    let mut outcome = StepOutcome::status(StepStatus::Refused);
    outcome.rule = Some(Rule::APPROVAL_REJECTED);
    outcome.error = Some(format!("rejected by {approver}: {note}"));
    outcome.approval_id = Some(approval_id.clone());
    outcome
}

/// The audit record of `approver`'s rejection of `request` (naming its step when `parked`,
/// the request parked a step that was refused).
fn rejection_record(
    registry: &Registry,
    request: ApprovalRequest,
    parked: bool,
    outcome: &StepOutcome,
    approver: &PrincipalId,
    note: &str,
    now: Timestamp,
) -> AuditDraft {
    let ApprovalRequest {
        subject,
        tool,
        principal,
        run_id,
        ..
    } = request;
    let call = AuditCall {
        run_id,
        step_id: parked.then(|| StepId::from(subject)),
        ..AuditCall::new(AuditWho::of(registry, &principal), tool, None)
    };
    let rejected_by = AuditApproval {
        approvers: vec![approver.clone()],
        token_fingerprints: Vec::new(),
    };
    AuditDraft::rejection(
        now,
        call,
        Rule::APPROVAL_REJECTED,
        note,
        outcome.error.clone(),
        Some(rejected_by),
        registry.version.hash.clone(),
    )
}
