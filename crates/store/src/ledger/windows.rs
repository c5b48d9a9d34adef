//! Window budgets in the store: each allowed call of a tool with window budgets reserves its
//! amount (or one call) in the window of every (budget, principal, key) it falls into — its own
//! principal's and each ancestor's — in the transaction that reserves its key. A reservation
//! stays while the call is in flight, lands or is `unknown`, and is deleted when the call fails
//! ([`release`], from the budget release), so only what may have been spent is held.
//!
//! A sliding window has no single counter to update conditionally, so taking one is a read of
//! the live reservations and an insert: on SQLite the transaction is the only writer; on
//! PostgreSQL a lock row per (budget, principal, key), taken with `SELECT … FOR UPDATE` in one
//! order everywhere, makes concurrent reservations of one window take turns, and each sums what
//! the one before it committed (read committed reads afresh per statement).

use serde_json::Value;
use toolgate_core::Timestamp;
use toolgate_core::budget::{Held, WindowBudget, WindowView};
use toolgate_core::registry::Tool;

use crate::db::{Sql, Tx, args};
use crate::error::Result;

/// What the windows of `tool`'s budgets hold for this call's key, for each principal of the
/// chain (the caller, then its ancestors). A plain read: the engine decides on it, and
/// [`reserve`] checks again under the lock.
pub(crate) async fn load(
    tx: &mut Tx,
    tool: &Tool,
    chain: &[String],
    inputs: &Value,
    now: Timestamp,
) -> Result<WindowView> {
    let mut view = WindowView::default();
    for b in &tool.windows {
        let Some(key) = b.key_of(inputs) else {
            continue;
        };
        for id in chain {
            view.set(&b.id, id, live(tx, b, id, &key, now).await?);
        }
    }
    Ok(view)
}

/// Reserves the call's amount in every window it falls into, and returns whether it fit; when
/// it does not (or a window cannot measure the call), none of them stays reserved. Why not is
/// the engine's to say, over the windows read again ([`load`]).
pub(crate) async fn reserve(
    tx: &mut Tx,
    tool: &Tool,
    chain: &[String],
    inputs: &Value,
    step_id: &str,
    now: Timestamp,
) -> Result<bool> {
    let mut entries: Vec<(&WindowBudget, &str, String, i64)> = Vec::new();
    for b in &tool.windows {
        let (Some(key), Some(need)) = (b.key_of(inputs), b.amount_of(inputs)) else {
            return Ok(false);
        };
        for id in chain {
            entries.push((b, id.as_str(), key.clone(), need));
        }
    }
    // One lock order everywhere: no two reservations wait on each other.
    entries.sort_by(|a, b| (&a.0.id, a.1, &a.2).cmp(&(&b.0.id, b.1, &b.2)));
    for (b, id, key, need) in entries {
        lock(tx, &b.id, id, &key).await?;
        // What left the window is never read again.
        tx.exec(
            "DELETE FROM window_reservations WHERE budget = $1 AND principal = $2 \
             AND key_value = $3 AND at <= $4",
            args![&b.id, id, &key, now.millis() - b.window_ms],
        )
        .await?;
        let held = live(tx, b, id, &key, now).await?;
        let a = b.assess(id, &held, need, now);
        if !a.fits() {
            release(tx, step_id).await?;
            return Ok(false);
        }
        tx.exec(
            "INSERT INTO window_reservations (step_id, budget, principal, key_value, amount, at) \
             VALUES ($1, $2, $3, $4, $5, $6)",
            args![step_id, &b.id, id, &key, need, now.millis()],
        )
        .await?;
    }
    Ok(true)
}

/// Makes reservations of one window (budget, principal, key) take turns until `tx` ends: on
/// PostgreSQL a lock row, taken `FOR UPDATE`; on SQLite nothing, as its transaction is the only
/// writer.
async fn lock(tx: &mut Tx, budget: &str, principal: &str, key: &str) -> Result<()> {
    if !tx.is_pg() {
        return Ok(());
    }
    tx.exec(
        "INSERT INTO window_locks (budget, principal, key_value) VALUES ($1, $2, $3) \
         ON CONFLICT (budget, principal, key_value) DO NOTHING",
        args![budget, principal, key],
    )
    .await?;
    tx.exec(
        "SELECT 1 FROM window_locks WHERE budget = $1 AND principal = $2 AND key_value = $3 \
         FOR UPDATE",
        args![budget, principal, key],
    )
    .await?;
    Ok(())
}

/// Gives back what a step reserved in any window (its failure means nothing was spent).
pub(crate) async fn release(tx: &mut Tx, step_id: &str) -> Result<()> {
    tx.exec(
        "DELETE FROM window_reservations WHERE step_id = $1",
        args![step_id],
    )
    .await?;
    Ok(())
}

/// The live reservations of one window (`b`, `principal`, `key`) at `now`, oldest first.
pub(crate) async fn live(
    c: &mut impl Sql,
    b: &WindowBudget,
    principal: &str,
    key: &str,
    now: Timestamp,
) -> Result<Vec<Held>> {
    c.rows(
        "SELECT at, amount FROM window_reservations WHERE budget = $1 \
         AND principal = $2 AND key_value = $3 AND at > $4 ORDER BY at",
        args![&b.id, principal, key, now.millis() - b.window_ms],
    )
    .await?
    .iter()
    .map(|r| {
        Ok(Held {
            at: Timestamp::from_millis(r.i64("at")?),
            amount: r.i64("amount")?,
        })
    })
    .collect()
}
