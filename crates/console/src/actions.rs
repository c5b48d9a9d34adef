//! Approve and reject, for the page and the terminal alike. An approval is only taken for the
//! exact inputs the person was shown: the hash they saw must be the request's, and the parked
//! step's inputs must still hash to it. The store then issues the single-use lease bound to that
//! hash and the approver, and once enough different people have approved, the step runs once
//! through the executor (every check again, the lease consumed in the transaction that starts
//! the call).

use toolgate_core::{ApprovalId, InputHash, PrincipalId, Registry, StepId, StepStatus};
use toolgate_store::{ApprovalRequest, ApprovalStatus, Executor, Step, StepReport};

use crate::error::ConsoleError;

/// What an approval led to.
#[derive(Debug, Clone, PartialEq)]
pub enum Approved {
    /// One of several approvals needed is in; the page names who approved so far.
    Waiting {
        approved_by: Vec<String>,
        needed: i64,
    },
    /// Enough people approved and the parked step ran (or was settled) through the executor.
    Ran(Box<StepReport>),
    /// Enough people approved a step that was left for a worker to run (`run_now` false).
    Queued { step_id: StepId },
    /// Enough people approved a direct call: the agent's retry of the same call now passes.
    DirectCall,
}

/// True when `principal` is a person who may approve some gate (and so may sign in).
pub fn is_approver(registry: &Registry, principal: &str) -> bool {
    registry.approves_anything(principal)
}

/// Whether `approver` may decide `req`: not its requester (nor the person behind it), and one
/// of its gate's approvers. Requests they may not decide are not shown to them at all.
pub fn may_decide(registry: &Registry, approver: &str, req: &ApprovalRequest) -> bool {
    registry
        .may_approve(approver, &req.principal, &req.tool, &req.rule)
        .is_ok()
}

fn require_eligible(
    registry: &Registry,
    approver: &str,
    req: &ApprovalRequest,
) -> Result<(), ConsoleError> {
    registry
        .may_approve(approver, &req.principal, &req.tool, &req.rule)
        .map_err(|why| ConsoleError::Ineligible(Box::new(why)))
}

/// Refuses unless the request is open and not past its expiry. A lapsed request is marked
/// expired in the store, so it leaves the queue.
async fn require_open(exec: &Executor, req: &ApprovalRequest) -> Result<(), ConsoleError> {
    if req.status != ApprovalStatus::Pending {
        return Err(ConsoleError::Closed {
            id: req.approval_id.to_string(),
            status: req.status.as_str().to_string(),
        });
    }
    let now = exec.clock.now();
    if now >= req.expires_at {
        exec.store.expire_approvals(now).await?;
        return Err(ConsoleError::Expired {
            id: req.approval_id.to_string(),
            expires_at: crate::fmt::datetime(req.expires_at),
        });
    }
    Ok(())
}

/// Approves `approval_id` as `approver`, who was shown inputs hashing to `shown_hash`.
/// With `run_now`, a planned step whose approvals are complete is executed here, once.
pub async fn approve(
    exec: &Executor,
    approval_id: &ApprovalId,
    approver: &str,
    shown_hash: &str,
    run_now: bool,
) -> Result<Approved, ConsoleError> {
    let step = approvable(exec, approval_id, approver, shown_hash).await?;
    refuse_if_it_cannot_run(exec, approval_id).await?;
    let now = exec.clock.now();
    exec.store
        .approve(
            &exec.registry,
            &exec.keys,
            approval_id,
            &PrincipalId::from(approver),
            now,
        )
        .await?;
    after_grant(exec, approval_id, step, run_now).await
}

/// Refuses (nothing approved) when the request's call, decided again now under the current
/// registry and run state (a dry run of every check), would be refused once approved: an
/// approver is never told "approved" for a call that cannot run. The page and the terminal
/// both approve through [`approve`], which asks this first.
pub async fn refuse_if_it_cannot_run(
    exec: &Executor,
    approval_id: &ApprovalId,
) -> Result<(), ConsoleError> {
    let req = exec.store.approval(approval_id).await?;
    if req.status != ApprovalStatus::Pending {
        return Ok(());
    }
    match exec.dry_decide(&req).await?.refused_by() {
        Some((rule, reason)) => Err(ConsoleError::WouldBeRefused {
            rule: crate::fmt::text(rule),
            reason: crate::fmt::text(reason),
        }),
        None => Ok(()),
    }
}

/// Every condition for `approver` to approve `approval_id` shown as `shown_hash`, checked
/// without approving: an approver, eligible (segregation of duties), the request open and not
/// expired, the hash the one shown and still the parked step's, the step still parked, and not
/// approved by this person already. Returns the parked step, if the request parks one.
pub async fn approvable(
    exec: &Executor,
    approval_id: &ApprovalId,
    approver: &str,
    shown_hash: &str,
) -> Result<Option<Step>, ConsoleError> {
    if !is_approver(&exec.registry, approver) {
        return Err(ConsoleError::NotAnApprover(approver.to_string()));
    }
    let req = exec.store.approval(approval_id).await?;
    require_eligible(&exec.registry, approver, &req)?;
    require_open(exec, &req).await?;
    if shown_hash != req.input_hash.as_str() {
        return Err(ConsoleError::InputsChanged {
            shown: shown_hash.to_string(),
            current: req.input_hash.to_string(),
        });
    }
    // A planned step is the subject: its inputs now must be the ones the request holds.
    let step = match exec.store.step(&req.subject_step()).await {
        Ok(s) => Some(s),
        Err(toolgate_store::StoreError::NotFound { .. }) => None,
        Err(e) => return Err(e.into()),
    };
    if let Some(s) = &step {
        let now_hash = InputHash::of(&s.inputs);
        if now_hash != req.input_hash {
            return Err(ConsoleError::InputsChanged {
                shown: shown_hash.to_string(),
                current: now_hash.to_string(),
            });
        }
        if s.status != StepStatus::NeedsApproval {
            return Err(ConsoleError::Closed {
                id: req.approval_id.to_string(),
                status: format!("for a step that is {}", s.status),
            });
        }
    }
    if req.approved_by.iter().any(|a| a == approver) {
        return Err(ConsoleError::SameApprover {
            id: req.approval_id.to_string(),
            approver: approver.to_string(),
        });
    }
    Ok(step)
}

/// What a grant led to: still waiting for another person, or (enough people approved) the
/// step run here (`run_now`) or queued, or a direct call's retry let through.
pub async fn after_grant(
    exec: &Executor,
    approval_id: &ApprovalId,
    step: Option<Step>,
    run_now: bool,
) -> Result<Approved, ConsoleError> {
    let after = exec.store.approval(approval_id).await?;
    if after.status == ApprovalStatus::Pending {
        return Ok(Approved::Waiting {
            approved_by: after.approved_by.into_iter().map(String::from).collect(),
            needed: after.approvers_needed,
        });
    }
    match step {
        Some(s) if run_now => Ok(Approved::Ran(Box::new(
            exec.execute_step(&s.step_id).await?,
        ))),
        Some(s) => Ok(Approved::Queued { step_id: s.step_id }),
        None => Ok(Approved::DirectCall),
    }
}

/// Rejects `approval_id` as `approver`; the reason is required and recorded.
pub async fn reject(
    exec: &Executor,
    approval_id: &ApprovalId,
    approver: &str,
    reason: &str,
) -> Result<(), ConsoleError> {
    if !is_approver(&exec.registry, approver) {
        return Err(ConsoleError::NotAnApprover(approver.to_string()));
    }
    let reason = reason.trim();
    if reason.is_empty() {
        return Err(ConsoleError::ReasonRequired);
    }
    let req = exec.store.approval(approval_id).await?;
    require_eligible(&exec.registry, approver, &req)?;
    require_open(exec, &req).await?;
    let now = exec.clock.now();
    exec.store
        .reject(
            &exec.registry,
            approval_id,
            &PrincipalId::from(approver),
            reason,
            now,
        )
        .await?;
    Ok(())
}
