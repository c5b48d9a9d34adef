//! The step rows: as the call path claims and settles them, as plans, reviews, approvals,
//! recovery, reconciliation and aborted runs change them, and as they are read back.

use std::collections::HashMap;

use serde_json::Value;
use toolgate_core::{
    Effect, IdempotencyKey, InputHash, PrincipalId, RunId, StepId, StepStatus, Tier, Timestamp,
    canonical,
};

use crate::db::{Arg, Row, Sql, Tx, args};
use crate::error::{Result, StoreError};
use crate::model::{Actor, PlannedStep, RunState, Step, StepKind, StepOutcome};
use crate::pg::PgConn;
use crate::store::{parse_effect, parse_status, parse_tier, to_json};

/// The columns a [`Step`] is read from.
macro_rules! step_cols {
    () => {
        "step_id, run_id, seq, kind, principal, role, tool, effect, tier, purpose, reason, \
         evidence, actor, inputs, input_hash, idem_key, status, attempts, approval, outcome, \
         compensates, created_at, updated_at"
    };
}

/// A JSON column's stored text, parsed.
fn json(text: &str) -> Result<Value> {
    serde_json::from_str(text).map_err(|source| StoreError::Unparsable {
        what: "stored JSON".into(),
        source,
    })
}

/// A step row, read by column name.
pub(crate) fn step_from_row(r: &Row) -> Result<Step> {
    let kind = r.text("kind")?;
    Ok(Step {
        step_id: StepId::new(r.text("step_id")?),
        run_id: RunId::new(r.text("run_id")?),
        seq: r.i64("seq")?,
        kind: StepKind::parse(&kind).ok_or_else(|| StoreError::UnknownValue {
            what: "step kind",
            value: kind.clone(),
        })?,
        principal: PrincipalId::new(r.text("principal")?),
        role: r.text("role")?,
        tool: r.text("tool")?,
        effect: parse_effect(&r.text("effect")?)?,
        tier: parse_tier(&r.text("tier")?)?,
        purpose: r.opt_text("purpose")?,
        reason: r.opt_text("reason")?,
        evidence: serde_json::from_value(json(&r.text("evidence")?)?).unwrap_or_default(),
        actor: serde_json::from_value(json(&r.text("actor")?)?).unwrap_or_default(),
        inputs: json(&r.text("inputs")?)?,
        input_hash: InputHash::from_stored(r.text("input_hash")?),
        idem_key: IdempotencyKey::from_stored(r.text("idem_key")?),
        status: parse_status(&r.text("status")?)?,
        attempts: r.i64("attempts")?,
        approval: r.opt_text("approval")?.map(|t| json(&t)).transpose()?,
        outcome: r
            .opt_text("outcome")?
            .map(|t| {
                serde_json::from_str(&t).map_err(|source| StoreError::Unparsable {
                    what: "stored outcome".into(),
                    source,
                })
            })
            .transpose()?,
        compensates: r.opt_text("compensates")?.map(StepId::new),
        created_at: Timestamp::from_millis(r.i64("created_at")?),
        updated_at: Timestamp::from_millis(r.i64("updated_at")?),
    })
}

/// A step row to insert.
#[derive(Clone)]
pub(crate) struct NewStep<'a> {
    pub step_id: &'a str,
    pub run_id: &'a str,
    pub seq: i64,
    pub kind: StepKind,
    pub principal: &'a str,
    pub role: &'a str,
    pub tool: &'a str,
    pub effect: Effect,
    pub tier: Tier,
    pub purpose: Option<&'a str>,
    pub reason: Option<&'a str>,
    pub evidence: &'a [String],
    pub actor: &'a Actor,
    pub inputs: &'a Value,
    pub idem_key: &'a str,
    pub status: StepStatus,
    pub attempts: i64,
    pub compensates: Option<&'a str>,
    pub lease_until: Option<i64>,
    /// The decision that let a direct call through (see `exec::decision_json`).
    pub decision: Option<&'a str>,
    pub now: Timestamp,
}

impl<'a> NewStep<'a> {
    /// A step of a submitted plan, queued (`pending`, not yet attempted) under its derived key.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn queued(
        step_id: &'a str,
        run_id: &'a str,
        seq: u32,
        s: &'a PlannedStep,
        role: &'a str,
        tool: &toolgate_core::registry::Tool,
        purpose: Option<&'a str>,
        idem_key: &'a str,
        now: Timestamp,
    ) -> NewStep<'a> {
        NewStep {
            step_id,
            run_id,
            seq: seq as i64,
            kind: StepKind::Planned,
            principal: &s.principal,
            role,
            tool: &s.tool,
            effect: tool.config.effect,
            tier: tool.config.tier,
            purpose,
            reason: s.reason.as_deref(),
            evidence: &s.evidence,
            actor: &s.actor,
            inputs: &s.inputs,
            idem_key,
            status: StepStatus::Pending,
            attempts: 0,
            compensates: None,
            lease_until: None,
            decision: None,
            now,
        }
    }
}

/// Inserts the step `s`.
pub(crate) async fn insert(tx: &mut Tx, s: NewStep<'_>) -> Result<()> {
    tx.exec(
        "INSERT INTO steps (step_id, run_id, seq, kind, principal, role, tool, effect, tier, \
         purpose, reason, evidence, actor, inputs, input_hash, idem_key, status, attempts, \
         compensates, lease_until, created_at, updated_at, decision) \
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16, $17, $18, \
         $19, $20, $21, $21, $22)",
        step_args(&s),
    )
    .await?;
    Ok(())
}

/// Inserts `s` as its run's next step, numbered in the same statement (its `seq` is not
/// used), and returns the number it took.
pub(crate) async fn insert_next(tx: &mut Tx, s: NewStep<'_>) -> Result<i64> {
    let mut args = step_args(&s);
    args.remove(2); // the number is the statement's own
    let row = tx
        .opt(
            "INSERT INTO steps (step_id, run_id, seq, kind, principal, role, tool, effect, tier, \
             purpose, reason, evidence, actor, inputs, input_hash, idem_key, status, attempts, \
             compensates, lease_until, created_at, updated_at, decision) \
             SELECT $1, $2, COALESCE(MAX(seq), 0) + 1, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, \
             $13, $14, $15, $16, $17, $18, $19, $20, $20, $21 \
             FROM steps WHERE run_id = $2 RETURNING seq",
            args,
        )
        .await?;
    row.ok_or_else(|| StoreError::Bug("a step insert returned no row".into()))?
        .i64("seq")
}

/// The values of `s` in the order of the insert statements' columns.
fn step_args(s: &NewStep<'_>) -> Vec<crate::db::Arg> {
    args![
        s.step_id,
        s.run_id,
        s.seq,
        s.kind.as_str(),
        s.principal,
        s.role,
        s.tool,
        s.effect.as_str(),
        s.tier.as_str(),
        s.purpose,
        s.reason,
        to_json(&s.evidence),
        to_json(s.actor),
        canonical(s.inputs),
        InputHash::of(s.inputs).as_str(),
        s.idem_key,
        s.status.as_str(),
        s.attempts,
        s.compensates,
        s.lease_until,
        s.now.millis(),
        s.decision
    ]
}

/// The number [`open_keyed`] gives a step whose writing its batch deferred: steps are
/// numbered from 1, and the batch learns the real number when it writes them.
pub(crate) const NUMBERED_LATER: i64 = 0;

/// Direct steps a reservation batch opened and has not written yet ([`crate::db::Tx::defer_opens`]):
/// written as one statement before the transaction's next one. The batch's calls decide on
/// its run counts read once at its start and kept current in memory, so a batch of `n` calls in
/// one run costs a read and a write of the database instead of `n` of each.
#[derive(Debug, Default)]
pub(crate) struct DeferredOpens {
    /// Each step's [`open_keyed`] parameters, `$1`–`$24`.
    rows: Vec<Vec<Arg>>,
    /// The steps written so far, by id: their numbers in their runs.
    pub(crate) numbered: HashMap<String, i64>,
}

impl DeferredOpens {
    pub(crate) fn pending(&self) -> bool {
        !self.rows.is_empty()
    }
}

/// Writes the steps `conn`'s batch deferred, as [`open_keyed`] would one by one, in one
/// statement: their keys, the runs new among them, and the steps, numbered after their runs'
/// last in the order they were opened. Every key must be taken: the batch read each as free,
/// so one found taken was taken by another transaction since, and the batch fails (its calls
/// are then reserved one by one, which settles each as its key's state says).
pub(crate) async fn write_deferred(conn: &mut PgConn) -> Result<()> {
    let Some(rows) = conn.deferred.as_mut().map(|d| std::mem::take(&mut d.rows)) else {
        return Ok(());
    };
    let n = rows.len();
    let columns = (0..rows.first().map_or(0, Vec::len))
        .map(|j| Arg::column(rows.iter().map(|r| &r[j])))
        .collect::<Result<Vec<Arg>>>()?;
    let written = conn
        .rows_as_is(
            "WITH d AS (SELECT * FROM unnest($1::text[], $2::text[], $3::text[], $4::text[], \
               $5::text[], $6::text[], $7::text[], $8::text[], $9::text[], $10::text[], \
               $11::text[], $12::text[], $13::text[], $14::text[], $15::text[], $16::text[], \
               $17::bigint[], $18::text[], $19::bigint[], $20::bigint[], $21::text[], \
               $22::bigint[], $23::text[], $24::bigint[]) WITH ORDINALITY AS d (step_id, \
               run_id, kind, principal, role, tool, effect, tier, purpose, reason, evidence, \
               actor, inputs, input_hash, idem_key, status, attempts, compensates, \
               lease_until, at, decision, expires_at, run_status, new_run, ord)), \
             k AS ( \
               INSERT INTO idempotency (idem_key, input_hash, state, outcome, step_id, \
               created_at, expires_at) \
               SELECT idem_key, input_hash, 'in_flight', NULL, step_id, at, expires_at FROM d \
               ON CONFLICT (idem_key) DO NOTHING RETURNING idem_key), \
             o AS (SELECT d.* FROM d JOIN k USING (idem_key)), \
             r AS ( \
               INSERT INTO runs (run_id, principal, purpose, status, created_at, updated_at) \
               SELECT DISTINCT ON (run_id) run_id, principal, purpose, run_status, at, at \
               FROM o WHERE new_run = 1 ORDER BY run_id, ord \
               ON CONFLICT (run_id) DO NOTHING), \
             s AS ( \
               INSERT INTO steps (step_id, run_id, seq, kind, principal, role, tool, effect, \
               tier, purpose, reason, evidence, actor, inputs, input_hash, idem_key, status, \
               attempts, compensates, lease_until, created_at, updated_at, decision) \
               SELECT step_id, run_id, \
               (SELECT COALESCE(MAX(x.seq), 0) FROM steps x WHERE x.run_id = o.run_id) \
               + row_number() OVER (PARTITION BY run_id ORDER BY ord), \
               kind, principal, role, tool, effect, tier, purpose, reason, evidence, actor, \
               inputs, input_hash, idem_key, status, attempts, compensates, lease_until, at, \
               at, decision FROM o RETURNING step_id, seq) \
             SELECT d.step_id, s.seq FROM d LEFT JOIN s USING (step_id)",
            columns,
        )
        .await?;
    if written.len() != n {
        return Err(StoreError::Bug(format!(
            "writing {n} deferred steps answered for {}",
            written.len()
        )));
    }
    let mut numbered = Vec::with_capacity(n);
    for r in written {
        let Some(seq) = r.opt_i64("seq")? else {
            return Err(StoreError::Contended(
                "another transaction took a key this batch had read as free".into(),
            ));
        };
        numbered.push((r.text("step_id")?, seq));
    }
    if let Some(d) = conn.deferred.as_mut() {
        d.numbered.extend(numbered);
    }
    Ok(())
}

/// Opens a direct call's new step under its idempotency key: takes the key (in flight until
/// `expires_at`, ms), makes the step's run if `new_run`, and inserts the step, numbered after
/// its run's last. `None`, with nothing written, when another call holds the key.
///
/// PostgreSQL does it in one statement: the run and the step are inserted only from the row
/// the key's insert returned, so a key held elsewhere leaves both untouched (the step's
/// foreign key to its run is checked at the statement's end, where the run is there). SQLite
/// has no data-modifying `WITH`: the same three statements, one after another, in the caller's
/// transaction.
///
/// In a batch that defers them ([`crate::db::Tx::defer_opens`]), the step is written with the
/// batch's others before the transaction's next statement, and numbered [`NUMBERED_LATER`]
/// until then.
pub(crate) async fn open_keyed(
    tx: &mut Tx,
    step: &NewStep<'_>,
    expires_at: i64,
    new_run: bool,
) -> Result<Option<i64>> {
    let key = IdempotencyKey::from_stored(step.idem_key.to_string());
    let input_hash = InputHash::of(step.inputs);
    if !tx.is_pg() {
        let won =
            crate::ledger::keys::take(tx, &key, &input_hash, step.step_id, step.now, expires_at)
                .await?;
        if !won {
            return Ok(None);
        }
        if new_run {
            crate::ledger::runs::ensure(tx, step.run_id, step.principal, step.purpose, step.now)
                .await?;
        }
        return Ok(Some(insert_next(tx, step.clone()).await?));
    }
    // `$1`–`$21`: the step as `insert_next` binds it; `$22`: the key's expiry; `$23`: a
    // new run's status; `$24`: 1 to make the run.
    let mut args = step_args(step);
    args.remove(2); // the number is the statement's own
    args.extend(args![
        expires_at,
        RunState::Open.as_str(),
        i64::from(new_run)
    ]);
    if let Tx::P(c) = tx
        && let Some(deferred) = c.deferred.as_mut()
    {
        deferred.rows.push(args);
        return Ok(Some(NUMBERED_LATER));
    }
    let row = tx
        .opt(
            "WITH k AS ( \
               INSERT INTO idempotency (idem_key, input_hash, state, outcome, step_id, created_at, \
               expires_at) VALUES ($15, $14, 'in_flight', NULL, $1, $20, $22) \
               ON CONFLICT (idem_key) DO NOTHING RETURNING idem_key), \
             r AS ( \
               INSERT INTO runs (run_id, principal, purpose, status, created_at, updated_at) \
               SELECT $2, $4, $9, $23, $20, $20 FROM k WHERE $24::bigint = 1 \
               ON CONFLICT (run_id) DO NOTHING), \
             s AS ( \
               INSERT INTO steps (step_id, run_id, seq, kind, principal, role, tool, effect, tier, \
               purpose, reason, evidence, actor, inputs, input_hash, idem_key, status, attempts, \
               compensates, lease_until, created_at, updated_at, decision) \
               SELECT $1, $2, (SELECT COALESCE(MAX(seq), 0) + 1 FROM steps WHERE run_id = $2), \
               $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16, $17, $18, $19, \
               $20, $20, $21 FROM k RETURNING seq) \
             SELECT (SELECT seq FROM s) AS seq",
            args,
        )
        .await?
        .ok_or_else(|| StoreError::Bug("opening a keyed step returned no row".into()))?;
    row.opt_i64("seq")
}

/// Starts another attempt of a direct call's existing step: running until `lease`, its last
/// outcome cleared, and the decision that allowed this attempt kept (for recovery).
pub(crate) async fn rearm(
    tx: &mut Tx,
    step_id: &str,
    lease: i64,
    decision: &str,
    now: Timestamp,
) -> Result<()> {
    tx.exec(
        "UPDATE steps SET status = $1, attempts = attempts + 1, lease_until = $2, \
         updated_at = $3, outcome = NULL, decision = $4 WHERE step_id = $5",
        args![
            StepStatus::Running.as_str(),
            lease,
            now.millis(),
            decision,
            step_id
        ],
    )
    .await?;
    Ok(())
}

/// Keeps on a claimed step the decision that allowed it (for recovery).
pub(crate) async fn keep_decision(tx: &mut Tx, step_id: &str, decision: &str) -> Result<()> {
    tx.exec(
        "UPDATE steps SET decision = $1 WHERE step_id = $2",
        args![decision, step_id],
    )
    .await?;
    Ok(())
}

/// Keeps on the step who approved its call (canonical JSON: approvers, when, the input hash).
pub(crate) async fn keep_approval(tx: &mut Tx, step_id: &str, approval: &str) -> Result<()> {
    tx.exec(
        "UPDATE steps SET approval = $1 WHERE step_id = $2",
        args![approval, step_id],
    )
    .await?;
    Ok(())
}

/// A direct call's step whose reservation is given back before it ran: failed, no lease.
pub(crate) async fn fail_unstarted(tx: &mut Tx, step_id: &str) -> Result<()> {
    tx.exec(
        "UPDATE steps SET status = $1, lease_until = NULL WHERE step_id = $2",
        args![StepStatus::Failed.as_str(), step_id],
    )
    .await?;
    Ok(())
}

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

/// Records the outcome of a call's attempt on its step, if the step is still running or
/// `unknown` (recovery may have settled it meanwhile), ends its lease and sets when a
/// retryable failure may be claimed again (`retry_at`, ms).
pub(crate) async fn settle_attempt(
    tx: &mut Tx,
    step_id: &str,
    outcome: &StepOutcome,
    retry_at: Option<i64>,
    now: Timestamp,
) -> Result<()> {
    tx.exec(
        "UPDATE steps SET status = $1, outcome = $2, retry_at = $3, lease_until = NULL, \
         updated_at = $4 WHERE step_id = $5 AND status IN ('running', 'unknown')",
        args![
            outcome.status.as_str(),
            to_json(outcome),
            retry_at,
            now.millis(),
            step_id
        ],
    )
    .await?;
    Ok(())
}

/// The settlement of one attempt, as [`settle_attempts`] records it.
pub(crate) struct Attempt<'a> {
    pub step_id: &'a str,
    pub outcome: &'a StepOutcome,
    pub retry_at: Option<i64>,
    pub now: Timestamp,
}

/// As [`settle_attempt`] for many steps in one statement: the rows travel as one JSON array
/// (`jsonb_to_recordset` on PostgreSQL, `json_each` on SQLite).
pub(crate) async fn settle_attempts(tx: &mut Tx, attempts: &[Attempt<'_>]) -> Result<()> {
    if attempts.is_empty() {
        return Ok(());
    }
    let rows: Vec<Value> = attempts
        .iter()
        .map(|a| {
            serde_json::json!({
                "step_id": a.step_id,
                "status": a.outcome.status.as_str(),
                "outcome": to_json(a.outcome),
                "retry_at": a.retry_at,
                "now": a.now.millis(),
            })
        })
        .collect();
    tx.exec(
        if tx.is_pg() {
            "UPDATE steps SET status = j.status, outcome = j.outcome, retry_at = j.retry_at, \
             lease_until = NULL, updated_at = j.now \
             FROM jsonb_to_recordset($1::jsonb) AS j(step_id text, status text, outcome text, \
             retry_at bigint, now bigint) \
             WHERE steps.step_id = j.step_id AND steps.status IN ('running', 'unknown')"
        } else {
            "UPDATE steps SET status = j.value ->> 'status', outcome = j.value ->> 'outcome', \
             retry_at = j.value ->> 'retry_at', lease_until = NULL, updated_at = j.value ->> 'now' \
             FROM json_each($1) AS j \
             WHERE steps.step_id = j.value ->> 'step_id' AND steps.status IN ('running', 'unknown')"
        },
        args![Value::Array(rows).to_string()],
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

/// The step `step_id`, if there is one.
pub(crate) async fn by_id(c: &mut impl Sql, step_id: &str) -> Result<Option<Step>> {
    c.opt(
        concat!("SELECT ", step_cols!(), " FROM steps WHERE step_id = $1"),
        args![step_id],
    )
    .await?
    .map(|r| step_from_row(&r))
    .transpose()
}

/// The steps of run `run_id` in order (compensations after the steps they undo).
pub(crate) async fn of_run(c: &mut impl Sql, run_id: &str) -> Result<Vec<Step>> {
    c.rows(
        concat!(
            "SELECT ",
            step_cols!(),
            " FROM steps WHERE run_id = $1 ORDER BY seq"
        ),
        args![run_id],
    )
    .await?
    .iter()
    .map(step_from_row)
    .collect()
}

/// How many steps are in each status (all runs), by status.
pub(crate) async fn count_by_status(c: &mut impl Sql) -> Result<Vec<(StepStatus, i64)>> {
    c.rows(
        "SELECT status, COUNT(*) AS n FROM steps GROUP BY status ORDER BY status",
        args![],
    )
    .await?
    .iter()
    .map(|r| Ok((parse_status(&r.text("status")?)?, r.i64("n")?)))
    .collect()
}

/// Whether run `run_id` has a step of `principal`'s.
pub(crate) async fn any_of(c: &mut impl Sql, run_id: &str, principal: &str) -> Result<bool> {
    Ok(c.opt(
        "SELECT 1 FROM steps WHERE run_id = $1 AND principal = $2 LIMIT 1",
        args![run_id, principal],
    )
    .await?
    .is_some())
}

/// A planned step assigned to a principal, as a plan-bound call looks for it.
pub(crate) struct Assigned {
    pub step_id: String,
    pub run_id: String,
    pub status: StepStatus,
}

/// The planned steps of `principal` calling `tool` with inputs hashing to `input_hash`, oldest
/// first. (`planned` is spelled in the statement for the partial index `steps_assigned`.)
pub(crate) async fn assigned(
    c: &mut impl Sql,
    principal: &str,
    tool: &str,
    input_hash: &InputHash,
) -> Result<Vec<Assigned>> {
    c.rows(
        "SELECT step_id, run_id, status FROM steps WHERE kind = 'planned' \
         AND principal = $1 AND tool = $2 AND input_hash = $3 ORDER BY created_at, seq",
        args![principal, tool, input_hash.as_str()],
    )
    .await?
    .iter()
    .map(|r| {
        Ok(Assigned {
            step_id: r.text("step_id")?,
            run_id: r.text("run_id")?,
            status: parse_status(&r.text("status")?)?,
        })
    })
    .collect()
}

/// Refuses the step `step_id` with `outcome` if it has not run (pending, parked for a person,
/// or waiting to retry); whether it was.
pub(crate) async fn refuse_unrun(
    tx: &mut Tx,
    step_id: &str,
    outcome: &StepOutcome,
    now: Timestamp,
) -> Result<bool> {
    let n = tx
        .exec(
            "UPDATE steps SET status = $4, outcome = $1, retry_at = NULL, updated_at = $2 \
             WHERE step_id = $3 AND status IN ($5, $6, $7)",
            args![
                to_json(outcome),
                now.millis(),
                step_id,
                StepStatus::Refused.as_str(),
                StepStatus::Pending.as_str(),
                StepStatus::NeedsApproval.as_str(),
                StepStatus::Failed.as_str()
            ],
        )
        .await?;
    Ok(n > 0)
}

/// Refuses every step of run `run_id` that has not run, with `outcome` (an aborted run).
pub(crate) async fn refuse_unrun_of_run(
    tx: &mut Tx,
    run_id: &str,
    outcome: &StepOutcome,
    now: Timestamp,
) -> Result<()> {
    tx.exec(
        "UPDATE steps SET status = $4, outcome = $1, retry_at = NULL, updated_at = $2 \
         WHERE run_id = $3 AND status IN ($5, $6, $7)",
        args![
            to_json(outcome),
            now.millis(),
            run_id,
            StepStatus::Refused.as_str(),
            StepStatus::Pending.as_str(),
            StepStatus::Failed.as_str(),
            StepStatus::NeedsApproval.as_str()
        ],
    )
    .await?;
    Ok(())
}

/// Refuses the step `step_id` with `outcome` if it is parked for a person; whether it was.
pub(crate) async fn refuse_parked(
    tx: &mut Tx,
    step_id: &str,
    outcome: &StepOutcome,
    now: Timestamp,
) -> Result<bool> {
    let n = tx
        .exec(
            "UPDATE steps SET status = $4, outcome = $1, updated_at = $2 \
             WHERE step_id = $3 AND status = $5",
            args![
                to_json(outcome),
                now.millis(),
                step_id,
                StepStatus::Refused.as_str(),
                StepStatus::NeedsApproval.as_str()
            ],
        )
        .await?;
    Ok(n > 0)
}

/// Puts the step `step_id` back in the queue if it is parked for a person (its approvals are
/// complete).
pub(crate) async fn requeue_parked(tx: &mut Tx, step_id: &str, now: Timestamp) -> Result<()> {
    tx.exec(
        "UPDATE steps SET status = $3, updated_at = $1 WHERE step_id = $2 AND status = $4",
        args![
            now.millis(),
            step_id,
            StepStatus::Pending.as_str(),
            StepStatus::NeedsApproval.as_str()
        ],
    )
    .await?;
    Ok(())
}

/// Wakes the workers waiting for queued steps when `tx` commits: a notification on PostgreSQL
/// (workers wait in `LISTEN`); nothing on SQLite, whose workers poll.
pub(crate) async fn signal_queued(tx: &mut Tx, run_id: &str) -> Result<()> {
    if tx.is_pg() {
        tx.exec("SELECT pg_notify('toolgate_steps', $1)", args![run_id])
            .await?;
    }
    Ok(())
}

/// The done `write` steps of run `run_id` (compensations left out), newest first: what
/// aborting the run undoes.
pub(crate) async fn done_writes(tx: &mut Tx, run_id: &str) -> Result<Vec<Step>> {
    tx.rows(
        concat!(
            "SELECT ",
            step_cols!(),
            " FROM steps WHERE run_id = $1 AND status = $2 AND effect = $3 \
             AND kind <> $4 ORDER BY seq DESC"
        ),
        args![
            run_id,
            StepStatus::Done.as_str(),
            toolgate_core::Effect::Write.as_str(),
            StepKind::Compensation.as_str()
        ],
    )
    .await?
    .iter()
    .map(step_from_row)
    .collect()
}

/// Keeps the values a compensable write is about to change with its step.
pub(crate) async fn keep_previous(tx: &mut Tx, step_id: &str, previous: &Value) -> Result<()> {
    tx.exec(
        "UPDATE steps SET previous = $1 WHERE step_id = $2",
        args![to_json(previous), step_id],
    )
    .await?;
    Ok(())
}

/// The values kept with the step `step_id` before its write ([`keep_previous`]), as stored.
pub(crate) async fn previous(tx: &mut Tx, step_id: &str) -> Result<Option<String>> {
    Ok(tx
        .opt(
            "SELECT previous FROM steps WHERE step_id = $1",
            args![step_id],
        )
        .await?
        .map(|r| r.opt_text("previous"))
        .transpose()?
        .flatten())
}

/// The decision the reservation kept with the step `step_id`, as stored (none for a step
/// reserved before decisions were kept).
pub(crate) async fn kept_decision(tx: &mut Tx, step_id: &str) -> Result<Option<String>> {
    Ok(tx
        .opt(
            "SELECT decision FROM steps WHERE step_id = $1",
            args![step_id],
        )
        .await?
        .map(|r| r.opt_text("decision"))
        .transpose()?
        .flatten())
}

/// Steps whose lease ran out at `now` while `running` (their worker stopped mid-call), in
/// order. (`running` is spelled in the statement for the partial index `steps_running`.)
pub(crate) async fn stale(tx: &mut Tx, now: Timestamp) -> Result<Vec<Step>> {
    tx.rows(
        concat!(
            "SELECT ",
            step_cols!(),
            " FROM steps WHERE status = 'running' AND lease_until < $1 ORDER BY seq"
        ),
        args![now.millis()],
    )
    .await?
    .iter()
    .map(step_from_row)
    .collect()
}

/// Steps whose outcome is `unknown`, longest unknown first. (`unknown` is spelled in the
/// statement for the partial index `steps_unknown`.)
pub(crate) async fn unknown(tx: &mut Tx) -> Result<Vec<Step>> {
    tx.rows(
        concat!(
            "SELECT ",
            step_cols!(),
            " FROM steps WHERE status = 'unknown' ORDER BY updated_at, seq"
        ),
        args![],
    )
    .await?
    .iter()
    .map(step_from_row)
    .collect()
}
