//! The step rows as the call path claims and settles them.

use toolgate_core::Timestamp;

use crate::db::{Tx, args};
use crate::error::Result;
use crate::model::{Step, StepOutcome};
use crate::store::{step_cols, step_from_row, to_json};

/// Records `outcome` on the step and ends its lease.
pub(crate) async fn settle(
    tx: &mut Tx,
    step_id: &str,
    outcome: &StepOutcome,
    now: Timestamp,
) -> Result<()> {
    tx.exec(
        "UPDATE steps SET status = $1, outcome = $2, lease_until = NULL, updated_at = $3 \
         WHERE step_id = $4",
        args![
            outcome.status.as_str(),
            to_json(outcome),
            now.millis(),
            step_id
        ],
    )
    .await?;
    Ok(())
}

/// Claims up to `limit` queued planned steps (pending, or failed and due for a retry), leased
/// until `lease` (ms). PostgreSQL skips rows another worker holds (`FOR UPDATE SKIP LOCKED`);
/// on SQLite the transaction is the only writer.
///
/// `status IN ('pending', 'failed')` repeats what the OR implies so that SQLite's planner uses
/// the `steps_queue` partial index; without it the claim scanned every planned step ever made
/// and slowed as the table grew. (The statuses are literals here for that reason: a partial
/// index is matched against the query's text.)
pub(crate) async fn claim_queued(
    tx: &mut Tx,
    lease: i64,
    now: Timestamp,
    limit: usize,
) -> Result<Vec<Step>> {
    let sql: &'static str = if tx.is_pg() {
        concat!(
            "UPDATE steps SET status = 'running', attempts = attempts + 1, lease_until = $1, \
             updated_at = $2, retry_at = NULL WHERE step_id IN (SELECT step_id FROM steps \
             WHERE status IN ('pending', 'failed') \
             AND (status = 'pending' OR (status = 'failed' AND retry_at IS NOT NULL AND retry_at <= $2)) \
             AND attempts < $4 AND kind = 'planned' ORDER BY created_at, seq LIMIT $3 \
             FOR UPDATE SKIP LOCKED) RETURNING ",
            step_cols!()
        )
    } else {
        concat!(
            "UPDATE steps SET status = 'running', attempts = attempts + 1, lease_until = $1, \
             updated_at = $2, retry_at = NULL WHERE step_id IN (SELECT step_id FROM steps \
             WHERE status IN ('pending', 'failed') \
             AND (status = 'pending' OR (status = 'failed' AND retry_at IS NOT NULL AND retry_at <= $2)) \
             AND attempts < $4 AND kind = 'planned' ORDER BY created_at, seq LIMIT $3) RETURNING ",
            step_cols!()
        )
    };
    let max = i64::from(toolgate_core::MAX_ATTEMPTS);
    tx.rows(sql, args![lease, now.millis(), limit as i64, max])
        .await?
        .iter()
        .map(step_from_row)
        .collect()
}

/// Claims the step `step_id` if it is pending or retryable.
pub(crate) async fn claim_one(
    tx: &mut Tx,
    step_id: &str,
    lease: i64,
    now: Timestamp,
) -> Result<Vec<Step>> {
    tx.rows(
        concat!(
            "UPDATE steps SET status = 'running', attempts = attempts + 1, lease_until = $1, \
             updated_at = $2, retry_at = NULL WHERE step_id = $3 \
             AND status IN ('pending', 'failed') AND attempts < $4 RETURNING ",
            step_cols!()
        ),
        args![
            lease,
            now.millis(),
            step_id,
            i64::from(toolgate_core::MAX_ATTEMPTS)
        ],
    )
    .await?
    .iter()
    .map(step_from_row)
    .collect()
}
