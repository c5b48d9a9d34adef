//! The step rows as the call path writes them.

use toolgate_core::Timestamp;

use crate::db::{Tx, args};
use crate::error::Result;
use crate::model::StepOutcome;
use crate::store::to_json;

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
