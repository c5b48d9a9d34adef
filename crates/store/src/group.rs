//! A group commit on PostgreSQL in one round trip. The group commit ([`crate::combine`]) folds
//! the records of calls that finished together into one commit; on PostgreSQL that commit is
//! one statement: the chain head moved, the audit rows appended, the runs of stepless calls
//! made, their counts added to `run_tally`, and the steps settled with their keys and budget
//! reservations — each as column arrays (`unnest`), so the statement's text is the same for a
//! batch of one call or of hundreds and is prepared once per connection. One statement is
//! atomic on its own, so it is sent without `BEGIN` and `COMMIT`, and commits as the store is
//! configured (`synchronous_commit` untouched). The writer keeps its connection between
//! batches: taking one from the pool and giving it back costs a round trip each.
//!
//! The chain head. Each record's hash covers the previous record's, so a batch is hashed
//! before it is written, on the head it follows. The writer keeps the head it last wrote, and
//! the statement moves the head row only from exactly that point (`WHERE seq = … AND hash =
//! …`); every other part of the statement is joined to that move. If anything else appended
//! meanwhile — another gateway of the fleet on the same database, a refusal recorded in a
//! reservation, recovery — the move finds another head and the statement changes nothing.
//! The writer then takes the locked path: `BEGIN`, the head read `FOR UPDATE`, the same
//! statement (which cannot lose under the lock), `COMMIT`. A shared chain therefore costs
//! four round trips per batch where it is contended, never a retry loop, and the head row is
//! locked only from the statement to its commit.
//!
//! Its plan. The writer's connection plans the statement once (`plan_cache_mode =
//! force_generic_plan`, set on that connection only, which is closed rather than handed to
//! anyone else): left to choose, PostgreSQL planned this statement afresh for every batch
//! (its generic plan looks dearer than one planned for the arrays at hand), about a fifth of a
//! millisecond of the server's CPU per commit. A generic plan cannot know how large the tables
//! are, so every join of an array to a table also names the array as `= ANY(…)` on the
//! table's key: the table is then reached through its index whatever the planner believes of
//! its size (joined by the array alone, the plan made while the tables were small scanned all
//! of `steps` and `idempotency` at every commit, a cost that grew with the store).
//!
//! A batch that gives back a budget (a call that failed after its budget was reserved) takes
//! the transaction of several statements instead ([`ChainWriter::apply`]): that settlement reads
//! what was reserved before undoing it. So does a batch with a call that failed or was refused
//! on its way out ([`Changes::fit_one_statement`]).

use std::collections::BTreeMap;

use toolgate_core::StepStatus;

use crate::audit::{self, AuditDraft, ChainPoint};
use crate::db::{Arg, Conn, Pool, Sql, args};
use crate::error::{Result, StoreError};
use crate::ledger::runs::{self, Stepless};
use crate::ledger::settle;
use crate::model::RunState;
use crate::store::{BudgetAction, IdemAction, Settle, SteplessCall, to_json};

/// The statement. `$1`–`$4`: the head it expects and the head it leaves; `$5`–`$11`: the audit
/// rows; `$12`–`$16`: the runs of stepless calls; `$17`–`$21`: run tallies; `$22`–`$26`:
/// settled steps; `$27`–`$28`: keys done; `$29`: keys released; `$30`: budget reservations
/// charged; `$31`: 1 for a sync barrier (nothing else to write, but the commit must flush).
const GROUP_COMMIT: &str = "WITH head AS ( \
       UPDATE audit_head SET seq = $3, hash = $4 WHERE id = 1 AND seq = $1 AND hash = $2 \
       RETURNING id), \
     records AS ( \
       INSERT INTO audit (seq, ts, principal, run_id, step_id, record, hash) \
       SELECT a.seq, a.ts, a.principal, a.run_id, a.step_id, a.record, a.hash \
       FROM unnest($5::bigint[], $6::bigint[], $7::text[], $8::text[], $9::text[], $10::text[], \
       $11::text[]) AS a(seq, ts, principal, run_id, step_id, record, hash), head), \
     new_runs AS ( \
       INSERT INTO runs (run_id, principal, purpose, status, created_at, updated_at) \
       SELECT r.run_id, r.principal, r.purpose, $16, r.at, r.at \
       FROM unnest($12::text[], $13::text[], $14::text[], $15::bigint[]) \
       AS r(run_id, principal, purpose, at), head \
       ON CONFLICT (run_id) DO NOTHING), \
     tallies AS ( \
       INSERT INTO run_tally (run_id, tool, tier, status, n) \
       SELECT t.run_id, t.tool, t.tier, t.status, t.n \
       FROM unnest($17::text[], $18::text[], $19::text[], $20::text[], $21::bigint[]) \
       AS t(run_id, tool, tier, status, n), head \
       ON CONFLICT (run_id, tool, tier, status) DO UPDATE SET n = run_tally.n + excluded.n), \
     settled AS ( \
       UPDATE steps SET status = s.status, outcome = s.outcome, retry_at = s.retry_at, \
       lease_until = NULL, updated_at = s.at \
       FROM unnest($22::text[], $23::text[], $24::text[], $25::bigint[], $26::bigint[]) \
       AS s(step_id, status, outcome, retry_at, at), head \
       WHERE steps.step_id = s.step_id AND steps.step_id = ANY($22::text[]) \
       AND steps.status IN ('running', 'unknown')), \
     done_keys AS ( \
       UPDATE idempotency SET state = 'done', outcome = d.outcome \
       FROM unnest($27::text[], $28::text[]) AS d(idem_key, outcome), head \
       WHERE idempotency.idem_key = d.idem_key AND idempotency.idem_key = ANY($27::text[])), \
     released_keys AS ( \
       DELETE FROM idempotency USING head \
       WHERE idempotency.state = 'in_flight' AND idempotency.idem_key = ANY($29::text[])), \
     charged AS ( \
       DELETE FROM budget_reservations USING head \
       WHERE budget_reservations.step_id = ANY($30::text[])), \
     barrier AS ( \
       UPDATE sync_barrier SET n = sync_barrier.n + 1 FROM head \
       WHERE sync_barrier.id = 1 AND $31::bigint = 1) \
     SELECT COUNT(*) AS won FROM head";

/// What one group commit changes besides the chain, gathered from its records' ledgers.
#[derive(Default)]
pub(crate) struct Changes<'a> {
    pub settles: Vec<&'a Settle>,
    pub stepless: Vec<&'a SteplessCall>,
    /// Nothing to write: a sync barrier only.
    pub barrier: bool,
}

impl Changes<'_> {
    /// Whether the one statement can carry these changes: not a budget given back (which
    /// reads what it undoes), nor a step settled to a status its run counts otherwise than a
    /// running one (failed, refused): that moves the run's `step_tally` counts, which the
    /// statement would lock after the chain head, where a reservation locks them before it —
    /// the transaction settles first, in the reservation's order.
    pub(crate) fn fit_one_statement(&self) -> bool {
        self.settles.iter().all(|s| {
            s.budget != BudgetAction::Release
                && matches!(
                    s.outcome.status,
                    StepStatus::Done | StepStatus::Unknown | StepStatus::Running
                )
        })
    }
}

/// The group-commit writer's hold on PostgreSQL: its connection, and the chain head it last
/// wrote (`None`: not known, read it under the lock).
#[derive(Default)]
pub(crate) struct ChainWriter {
    conn: Option<Conn>,
    head: Option<ChainPoint>,
}

impl ChainWriter {
    /// Forgets the head: something else may have moved it (the writer's own transaction
    /// path, or an error after which nothing is known).
    pub(crate) fn forget(&mut self) {
        self.head = None;
    }

    /// Gives the connection back (the pool is closing, or it failed).
    pub(crate) fn release(&mut self) {
        self.conn = None;
    }

    /// Applies a batch of records and what they change in one commit: on PostgreSQL one
    /// statement when it fits ([`ChainWriter::commit`]), else one transaction of a few
    /// statements.
    pub(crate) async fn apply(
        &mut self,
        pool: &Pool,
        drafts: &[&AuditDraft],
        changes: &Changes<'_>,
    ) -> Result<Vec<i64>> {
        if pool.is_pg() && changes.fit_one_statement() {
            return self.commit(pool, drafts, changes).await;
        }
        // The transaction below moves the chain head without the writer's knowing where to.
        self.forget();
        let mut tx = pool.begin().await?;
        settle::apply_all(&mut tx, &changes.settles).await?;
        for c in &changes.stepless {
            let run = &c.tally.run_id;
            runs::ensure(&mut tx, run, &c.principal, c.purpose.as_deref(), c.now).await?;
        }
        // A read that failed is not counted (as a failed step is not); its record still is.
        let tallies: Vec<_> = changes
            .stepless
            .iter()
            .filter(|c| c.tally.status == StepStatus::Done)
            .map(|c| c.tally.clone())
            .collect();
        runs::tally(&mut tx, &tallies).await?;
        if changes.barrier {
            // Only sync barriers: write something so the commit fsyncs the WAL.
            audit::touch_sync_barrier(&mut tx).await?;
        }
        let seqs = audit::append_linked(&mut tx, drafts).await?;
        tx.commit().await?;
        Ok(seqs)
    }

    /// Commits `drafts` and `changes` in one statement on the head this writer knows, or
    /// under the head's lock when it does not know it or another appender moved it.
    pub(crate) async fn commit(
        &mut self,
        pool: &Pool,
        drafts: &[&AuditDraft],
        changes: &Changes<'_>,
    ) -> Result<Vec<i64>> {
        let result = self.commit_inner(pool, drafts, changes).await;
        if result.is_err() {
            self.forget();
            self.release();
        }
        result
    }

    async fn commit_inner(
        &mut self,
        pool: &Pool,
        drafts: &[&AuditDraft],
        changes: &Changes<'_>,
    ) -> Result<Vec<i64>> {
        if let Some(head) = &self.head {
            let mut linked = audit::link(head, drafts);
            if self.conn.is_none() {
                self.conn = Some(writer_conn(pool).await?);
            }
            let conn = self.conn.as_mut().expect("taken above");
            if write(conn, &mut linked, changes).await? {
                self.head = Some(linked.head);
                return Ok(linked.seqs);
            }
        }
        // Not known, or moved by another appender: read it under its lock, then it cannot
        // move until this commit.
        let mut tx = pool.begin().await?;
        let head = audit::lock_head(&mut tx).await?;
        let mut linked = audit::link(&head, drafts);
        if !write(&mut tx, &mut linked, changes).await? {
            return Err(StoreError::Bug(
                "the chain head moved while this transaction held its lock".into(),
            ));
        }
        tx.commit().await?;
        self.head = Some(linked.head);
        Ok(linked.seqs)
    }
}

/// The writer's own connection: on PostgreSQL it plans its statements once (see the module
/// docs), a setting no other user of the connection should inherit, so it is closed when the
/// writer lets it go.
async fn writer_conn(pool: &Pool) -> Result<Conn> {
    let mut conn = pool.conn().await?;
    if let Conn::P(c) = &mut conn {
        c.close_when_dropped();
        conn.exec("SET plan_cache_mode = force_generic_plan", Vec::new())
            .await?;
    }
    Ok(conn)
}

/// Runs the statement: whether it was written (`false`: the chain's head was not where the
/// records were linked, and nothing was written).
async fn write(
    db: &mut impl Sql,
    linked: &mut audit::Linked,
    changes: &Changes<'_>,
) -> Result<bool> {
    let mut args: Vec<Arg> = args![
        linked.after.seq,
        linked.after.hash.clone(),
        linked.head.seq,
        linked.head.hash.clone()
    ];
    args.extend(linked.take_columns());
    args.extend(runs(&changes.stepless));
    args.extend(tallies(changes, &linked.refusals));
    args.extend(settles(&changes.settles));
    args.push(Arg::I(i64::from(changes.barrier)));
    let won = db
        .opt(GROUP_COMMIT, args)
        .await?
        .ok_or_else(|| StoreError::Bug("the group commit returned no row".into()))?
        .i64("won")?;
    Ok(won == 1)
}

/// The runs of stepless calls, each once: `$12`–`$16`.
fn runs(stepless: &[&SteplessCall]) -> Vec<Arg> {
    let mut seen = std::collections::HashSet::new();
    let (mut id, mut principal, mut purpose, mut at) = (vec![], vec![], vec![], vec![]);
    for c in stepless {
        if seen.insert(c.tally.run_id.as_str()) {
            id.push(c.tally.run_id.clone());
            principal.push(c.principal.clone());
            purpose.push(c.purpose.clone());
            at.push(c.now.millis());
        }
    }
    args![id, principal, purpose, at, RunState::Open.as_str()]
}

/// The counts to add to `run_tally`, one per (run, tool, tier, status) — a statement may
/// change a row once: `$17`–`$21`. A stepless read that failed is not counted (as a failed
/// step is not); its record still is.
fn tallies(changes: &Changes<'_>, refusals: &[Stepless]) -> Vec<Arg> {
    let mut n: BTreeMap<(&str, &str, &str, &str), i64> = BTreeMap::new();
    let done = changes
        .stepless
        .iter()
        .map(|c| &c.tally)
        .filter(|t| t.status == toolgate_core::StepStatus::Done);
    for t in done.chain(refusals) {
        *n.entry((&t.run_id, &t.tool, t.tier.as_str(), t.status.as_str()))
            .or_default() += 1;
    }
    let (mut run, mut tool, mut tier, mut status, mut count) =
        (vec![], vec![], vec![], vec![], vec![]);
    for ((r, t, ti, s), c) in n {
        run.push(r.to_string());
        tool.push(t.to_string());
        tier.push(ti.to_string());
        status.push(s.to_string());
        count.push(c);
    }
    args![run, tool, tier, status, count]
}

/// Settled steps, their keys and charged reservations: `$22`–`$30`.
fn settles(settles: &[&Settle]) -> Vec<Arg> {
    let (mut step, mut status, mut outcome, mut retry_at, mut at) =
        (vec![], vec![], vec![], vec![], vec![]);
    let (mut done_key, mut done_outcome, mut released, mut charged) =
        (vec![], vec![], vec![], vec![]);
    for s in settles {
        step.push(s.step_id.to_string());
        status.push(s.outcome.status.as_str().to_string());
        outcome.push(to_json(&s.outcome));
        retry_at.push(s.retry_at);
        at.push(s.now.millis());
        match &s.idem {
            IdemAction::Done(o) => {
                done_key.push(s.idem_key.clone());
                done_outcome.push(o.clone());
            }
            IdemAction::Release => released.push(s.idem_key.clone()),
            IdemAction::Keep => {}
        }
        if s.budget == BudgetAction::Charge {
            charged.push(s.step_id.to_string());
        }
    }
    args![
        step,
        status,
        outcome,
        retry_at,
        at,
        done_key,
        done_outcome,
        released,
        charged
    ]
}
