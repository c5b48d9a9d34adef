//! The idempotency ledger: one row per key, with the first call's input hash, whether it
//! settled and with what, and the step that holds it. A step row keeps its key unique too;
//! a key given up by a settled step is archived on that row as `KEY/STEP`.

use serde_json::{Value, json};
use toolgate_core::{IdempotencyKey, InputHash, PrincipalId, RunId, StepId, StepStatus, Timestamp};

use crate::db::{Row, Tx, args};
use crate::error::{Result, StoreError};
use crate::store::parse_status;

/// Where a key's record stands: its operation in flight (reserved, running or unknown), or
/// done with its outcome stored.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum KeyState {
    InFlight,
    Done,
}

impl KeyState {
    pub(crate) const fn as_str(self) -> &'static str {
        match self {
            KeyState::InFlight => "in_flight",
            KeyState::Done => "done",
        }
    }

    pub(crate) const ALL: [KeyState; 2] = [KeyState::InFlight, KeyState::Done];

    fn read(s: &str) -> Result<Self> {
        KeyState::ALL
            .into_iter()
            .find(|k| k.as_str() == s)
            .ok_or_else(|| StoreError::UnknownValue {
                what: "idempotency state",
                value: s.to_string(),
            })
    }
}

/// A key's record, as the decision needs it: the first call's inputs, whether it settled and
/// with what, and whose call it was (a key a tool shares across principals is never replayed
/// to another).
pub(crate) struct HeldKey {
    pub input_hash: String,
    pub state: KeyState,
    pub outcome: Option<String>,
    pub expires_at: Timestamp,
    pub step_id: StepId,
    pub principal: Option<PrincipalId>,
    pub created_at: Option<Timestamp>,
    pub step_status: Option<StepStatus>,
}

impl HeldKey {
    /// From a row of the key's record (`input_hash`, `state`, `outcome`, `expires_at`,
    /// `step_id`) joined with the step that holds it (`principal`, `created_at`, `status`).
    fn read(r: &Row) -> Result<HeldKey> {
        Ok(HeldKey {
            input_hash: r.text("input_hash")?,
            state: KeyState::read(&r.text("state")?)?,
            outcome: r.opt_text("outcome")?,
            expires_at: Timestamp::from_millis(r.i64("expires_at")?),
            step_id: StepId::new(r.text("step_id")?),
            principal: r.opt_text("principal")?.map(PrincipalId::new),
            created_at: r.opt_i64("created_at")?.map(Timestamp::from_millis),
            step_status: r
                .opt_text("status")?
                .map(|t| parse_status(&t))
                .transpose()?,
        })
    }

    /// A completed key past its retention at `now`: forgotten, so the operation may be made
    /// again.
    pub(crate) fn lapsed(&self, now: Timestamp) -> bool {
        self.state == KeyState::Done && self.expires_at.millis() <= now.millis()
    }
}

/// The record of `key`, with the step that holds it.
pub(crate) async fn held(tx: &mut Tx, key: &IdempotencyKey) -> Result<Option<HeldKey>> {
    let Some(r) = tx
        .opt(
            "SELECT i.input_hash, i.state, i.outcome, i.expires_at, i.step_id, s.principal, \
             s.created_at, s.status FROM idempotency i LEFT JOIN steps s ON s.step_id = i.step_id \
             WHERE i.idem_key = $1",
            args![key.as_str()],
        )
        .await?
    else {
        return Ok(None);
    };
    HeldKey::read(&r).map(Some)
}

/// The step row that holds `key` in its own key column: the one an earlier attempt of a direct
/// call left (to be retried, or replayed), whether or not the key's record is still there (a
/// failed attempt gives its record back and keeps its step).
#[derive(Clone)]
pub(crate) struct KeyStep {
    pub step_id: StepId,
    pub attempts: i64,
    pub principal: PrincipalId,
    pub updated_at: i64,
    pub run_id: RunId,
}

/// From the key's row of [`crate::ledger::runs::history_and_key`]: the record of the key with
/// the step that holds it (as [`held`] reads it: `input_hash` … `status`), and the step row
/// that carries the key in its key column ([`KeyStep`]: `own_step` … `own_run_id`).
pub(crate) fn held_and_step_of(r: &Row) -> Result<(Option<HeldKey>, Option<KeyStep>)> {
    let held = match r.opt_text("input_hash")? {
        None => None,
        Some(_) => Some(HeldKey::read(r)?),
    };
    let step = match r.opt_text("own_step")? {
        None => None,
        Some(step_id) => Some(KeyStep {
            step_id: StepId::new(step_id),
            attempts: r.i64("own_attempts")?,
            principal: PrincipalId::new(r.text("own_principal")?),
            updated_at: r.i64("own_updated_at")?,
            run_id: RunId::new(r.text("own_run_id")?),
        }),
    };
    Ok((held, step))
}

/// The step row that carries `key` in its key column.
pub(crate) async fn step_of(tx: &mut Tx, key: &IdempotencyKey) -> Result<Option<KeyStep>> {
    tx.opt(
        "SELECT step_id, attempts, principal, updated_at, run_id FROM steps WHERE idem_key = $1",
        args![key.as_str()],
    )
    .await?
    .map(|r| {
        Ok(KeyStep {
            step_id: StepId::new(r.text("step_id")?),
            attempts: r.i64("attempts")?,
            principal: PrincipalId::new(r.text("principal")?),
            updated_at: r.i64("updated_at")?,
            run_id: RunId::new(r.text("run_id")?),
        })
    })
    .transpose()
}

/// Takes `key` for `step_id`, in flight until `expires_at` (ms); `false` when it is held.
pub(crate) async fn take(
    tx: &mut Tx,
    key: &IdempotencyKey,
    input_hash: &InputHash,
    step_id: &str,
    now: Timestamp,
    expires_at: i64,
) -> Result<bool> {
    let n = tx
        .exec(
            "INSERT INTO idempotency (idem_key, input_hash, state, outcome, step_id, created_at, expires_at) \
             VALUES ($1, $2, 'in_flight', NULL, $3, $4, $5) ON CONFLICT (idem_key) DO NOTHING",
            args![key.as_str(), input_hash.as_str(), step_id, now.millis(), expires_at],
        )
        .await?;
    Ok(n > 0)
}

/// Points a held key at a newer step (only with reservation switched off, for fault
/// evaluation).
pub(crate) async fn move_to(tx: &mut Tx, key: &IdempotencyKey, step_id: &str) -> Result<()> {
    tx.exec(
        "UPDATE idempotency SET step_id = $1 WHERE idem_key = $2",
        args![step_id, key.as_str()],
    )
    .await?;
    Ok(())
}

/// Forgets `key`'s record, settled or not.
pub(crate) async fn forget(tx: &mut Tx, key: &IdempotencyKey) -> Result<()> {
    tx.exec(
        "DELETE FROM idempotency WHERE idem_key = $1",
        args![key.as_str()],
    )
    .await?;
    Ok(())
}

/// Gives back a key taken for a call that will not be made (still in flight).
pub(crate) async fn release_in_flight(tx: &mut Tx, key: &IdempotencyKey) -> Result<()> {
    tx.exec(
        "DELETE FROM idempotency WHERE idem_key = $1 AND state = 'in_flight'",
        args![key.as_str()],
    )
    .await?;
    Ok(())
}

/// Keeps the outcome of a settled call with its key (`KEY` as the step holds it): the key
/// replays it from now on.
pub(crate) async fn record_outcome(tx: &mut Tx, key: &str, outcome: &str) -> Result<()> {
    tx.exec(
        "UPDATE idempotency SET state = 'done', outcome = $1 WHERE idem_key = $2",
        args![outcome, key],
    )
    .await?;
    Ok(())
}

/// As [`record_outcome`] for many `(key, outcome)` pairs in one statement, the pairs as one
/// JSON array.
pub(crate) async fn record_outcomes(tx: &mut Tx, done: &[(&str, &str)]) -> Result<()> {
    if done.is_empty() {
        return Ok(());
    }
    let rows: Vec<Value> = done
        .iter()
        .map(|(key, outcome)| json!({"key": key, "outcome": outcome}))
        .collect();
    tx.exec(
        if tx.is_pg() {
            "UPDATE idempotency SET state = 'done', outcome = j.outcome \
             FROM jsonb_to_recordset($1::jsonb) AS j(key text, outcome text) \
             WHERE idempotency.idem_key = j.key"
        } else {
            "UPDATE idempotency SET state = 'done', outcome = j.value ->> 'outcome' \
             FROM json_each($1) AS j WHERE idempotency.idem_key = j.value ->> 'key'"
        },
        args![Value::Array(rows).to_string()],
    )
    .await?;
    Ok(())
}

/// As [`release_in_flight`] for many keys in one statement, the keys as one JSON array.
pub(crate) async fn release_all_in_flight(tx: &mut Tx, keys: &[&str]) -> Result<()> {
    if keys.is_empty() {
        return Ok(());
    }
    tx.exec(
        if tx.is_pg() {
            "DELETE FROM idempotency WHERE state = 'in_flight' \
             AND idem_key IN (SELECT jsonb_array_elements_text($1::jsonb))"
        } else {
            "DELETE FROM idempotency WHERE state = 'in_flight' \
             AND idem_key IN (SELECT value FROM json_each($1))"
        },
        args![serde_json::to_string(keys).expect("strings serialise")],
    )
    .await?;
    Ok(())
}

/// Frees a key held by a settled step row: the step keeps it as `KEY/STEP`, so the record of
/// what it did stays and a new step may take the key.
pub(crate) async fn archive(tx: &mut Tx, key: &IdempotencyKey) -> Result<()> {
    tx.exec(
        "UPDATE steps SET idem_key = idem_key || '/' || step_id WHERE idem_key = $1",
        args![key.as_str()],
    )
    .await?;
    Ok(())
}

/// Forgets settled keys whose retention ran out at `now`; how many.
pub(crate) async fn purge_settled(tx: &mut Tx, now: Timestamp) -> Result<u64> {
    tx.exec(
        "DELETE FROM idempotency WHERE state = 'done' AND expires_at <= $1",
        args![now.millis()],
    )
    .await
}
