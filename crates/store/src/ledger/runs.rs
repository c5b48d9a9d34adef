//! What a run did so far, as the engine's policies and rate limits count it. Read as counts
//! (one `GROUP BY` over the run's steps), not as the steps themselves, so a call in a long run
//! — a client that never names a run joins its principal's implicit one — costs about what a
//! call in a short one does.

use toolgate_core::{PriorCall, PriorCalls, PriorOutcome, RunHistory, StepStatus, Tier};

use crate::audit::{AuditDecision, AuditRecord};
use crate::db::{Tx, args};
use crate::error::{Result, StoreError};
use crate::store::{parse_status, parse_tier};

/// How an earlier step of the run counts: `None` for one that decided nothing yet (pending) or
/// may run again (failed).
fn prior_outcome(status: StepStatus) -> Option<PriorOutcome> {
    match status {
        StepStatus::Refused => Some(PriorOutcome::Denied),
        StepStatus::NeedsApproval => Some(PriorOutcome::Gated),
        StepStatus::Pending | StepStatus::Failed => None,
        StepStatus::Running | StepStatus::Done | StepStatus::Unknown => Some(PriorOutcome::Allowed),
    }
}

/// The run `run_id` so far: its steps numbered below `before` (all of them for `None`),
/// compensations left out, and the refusals of direct calls, which hold no step row (a refused
/// direct call must not hold its idempotency key), read back from the audit chain.
pub(crate) async fn history(tx: &mut Tx, run_id: &str, before: Option<i64>) -> Result<RunHistory> {
    let mut counted = Vec::new();
    for r in tx
        .rows(
            "SELECT tool, tier, status, COUNT(*) FROM steps \
             WHERE run_id = $1 AND seq < $2 AND kind <> 'compensation' \
             AND status NOT IN ('pending', 'failed') GROUP BY tool, tier, status",
            args![run_id, before.unwrap_or(i64::MAX)],
        )
        .await?
    {
        let Some(outcome) = prior_outcome(parse_status(&r.text(2)?)?) else {
            continue;
        };
        counted.push(PriorCalls {
            call: PriorCall {
                tool: r.text(0)?,
                tier: parse_tier(&r.text(1)?)?,
                outcome,
            },
            n: r.i64(3)?,
        });
    }
    let mut calls = Vec::new();
    for r in &tx
        .rows(
            "SELECT seq, record FROM audit WHERE run_id = $1 AND step_id IS NULL ORDER BY seq",
            args![run_id],
        )
        .await?
    {
        let seq = r.i64(0)?;
        let record: AuditRecord = serde_json::from_str(&r.text(1)?)
            .map_err(|e| StoreError::Corrupt(format!("audit record {seq} does not parse: {e}")))?;
        if record.body.why.decision == AuditDecision::Deny {
            calls.push(PriorCall {
                tool: record.body.tool,
                tier: record.body.tier.unwrap_or(Tier::Read),
                outcome: PriorOutcome::Denied,
            });
        }
    }
    Ok(RunHistory { calls, counted })
}

/// The number the run's next step takes (compensations included).
pub(crate) async fn next_seq(tx: &mut Tx, run_id: &str) -> Result<i64> {
    Ok(tx
        .opt(
            "SELECT COALESCE(MAX(seq), 0) + 1 FROM steps WHERE run_id = $1",
            args![run_id],
        )
        .await?
        .map(|r| r.i64(0))
        .transpose()?
        .unwrap_or(1))
}
