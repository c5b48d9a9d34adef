//! A call's settlement across the ledgers, in the caller's transaction (its audit record is
//! appended by the caller): the step's outcome, then its idempotency key (the outcome stored,
//! the key released, or kept in flight), then its budgets (charged, given back, or held).

use toolgate_core::IdempotencyKey;

use crate::db::Tx;
use crate::error::Result;
use crate::ledger::{budgets, keys, steps, windows};
use crate::store::{BudgetAction, IdemAction, Settle};

/// Applies one settlement inside a transaction (the audit record is appended by the caller).
pub(crate) async fn apply(tx: &mut Tx, s: &Settle) -> Result<()> {
    apply_all(tx, &[s]).await
}

/// Applies many settlements with a handful of set-based statements: on PostgreSQL the rows
/// travel as one JSON array per ledger, so a group commit costs the same few statements
/// whether it carries one call or hundreds. SQLite runs statements in process, so packing rows
/// into JSON would only add work: there each settlement is applied in turn.
pub(crate) async fn apply_all(tx: &mut Tx, settles: &[&Settle]) -> Result<()> {
    if settles.is_empty() {
        return Ok(());
    }
    if !tx.is_pg() {
        for s in settles {
            apply_in_turn(tx, s).await?;
        }
        return Ok(());
    }
    let attempts: Vec<steps::Attempt<'_>> = settles
        .iter()
        .map(|s| steps::Attempt {
            step_id: &s.step_id,
            outcome: &s.outcome,
            retry_at: s.retry_at,
            now: s.now,
        })
        .collect();
    steps::settle_attempts(tx, &attempts).await?;
    let done: Vec<(&str, &str)> = settles
        .iter()
        .filter_map(|s| match &s.idem {
            IdemAction::Done(o) => Some((s.idem_key.as_str(), o.as_str())),
            _ => None,
        })
        .collect();
    keys::record_outcomes(tx, &done).await?;
    let released: Vec<&str> = settles
        .iter()
        .filter(|s| matches!(s.idem, IdemAction::Release))
        .map(|s| s.idem_key.as_str())
        .collect();
    keys::release_all_in_flight(tx, &released).await?;
    let charged: Vec<&str> = settles
        .iter()
        .filter(|s| s.budget == BudgetAction::Charge)
        .map(|s| s.step_id.as_str())
        .collect();
    budgets::keep_charged_all(tx, &charged).await?;
    for s in settles.iter().filter(|s| s.budget == BudgetAction::Release) {
        release_budget(tx, &s.step_id).await?;
    }
    Ok(())
}

/// One settlement: the step's outcome, then its key, then its budget.
async fn apply_in_turn(tx: &mut Tx, s: &Settle) -> Result<()> {
    steps::settle_attempt(tx, &s.step_id, &s.outcome, s.retry_at, s.now).await?;
    match &s.idem {
        IdemAction::Done(o) => keys::record_outcome(tx, &s.idem_key, o).await?,
        IdemAction::Release => {
            keys::release_in_flight(tx, &IdempotencyKey::from_stored(s.idem_key.as_str())).await?
        }
        IdemAction::Keep => {}
    }
    match s.budget {
        BudgetAction::Charge => budgets::keep_charged(tx, &s.step_id).await?,
        BudgetAction::Release => release_budget(tx, &s.step_id).await?,
        BudgetAction::Hold => {}
    }
    Ok(())
}

/// Gives back what a step reserved, daily and window budgets (its failure means nothing was
/// spent).
pub(crate) async fn release_budget(tx: &mut Tx, step_id: &str) -> Result<()> {
    budgets::release(tx, step_id).await?;
    windows::release(tx, step_id).await
}
