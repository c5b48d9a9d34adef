//! The reservation batcher for direct governed calls. Each `tools/call` first decides and
//! reserves (idempotency key, step row, budgets, approval nonces) in a write transaction.
//! Calls that arrive together are decided one after another in one transaction, so they
//! share its `BEGIN`/`COMMIT` and, on SQLite, its single writer lock — the same shape as the
//! planned-step claim in [`crate::Executor::run_batch`]. Whichever waiting call finds no batch
//! under way runs the batch, in its own task ([`crate::combine`]).
//!
//! Durability. A reservation that only lets a call proceed is committed without waiting for
//! an fsync: it survives the gateway being killed (SQLite WAL, `synchronous = NORMAL`;
//! PostgreSQL `synchronous_commit = off` for that transaction), and the outcome record that
//! follows is fsync'd, which makes the WAL before it durable too. A batch holding an
//! irreversible call is fsync'd before the call is made, so a power loss cannot forget that
//! an irreversible call may be under way. A batch that settles a call on the spot (a refusal,
//! a replay, a parked approval) has acknowledged something, so it is made durable before any
//! caller hears of it: on PostgreSQL by committing normally, on SQLite by a sync barrier
//! through the group-commit writer. With `durability: process` no commit waits for the
//! disk, so neither of those flushes is made.

use tokio::sync::oneshot;
use toolgate_core::{Effect, Timestamp};

use crate::db::Pool;
use crate::error::{Result, StoreError};
use crate::exec::{BatchCache, BatchRead, Executor, Pending, Prepared, retry_conflicts};

/// One direct call waiting to be decided and reserved.
pub(crate) struct ReserveJob {
    pub exec: Executor,
    pub p: Pending,
    pub now: Timestamp,
    pub reply: oneshot::Sender<Result<Prepared>>,
}

impl ReserveJob {
    fn irreversible(&self) -> bool {
        self.exec
            .registry
            .tool(&self.p.tool)
            .is_some_and(|t| t.config.effect == Effect::Irreversible)
    }
}

/// Decides and reserves a batch in one transaction and answers each caller. If the batch
/// fails as a whole (one call's error rolls back all), each call is retried on its own, so
/// one bad call cannot sink the others.
pub(crate) async fn run(pool: &Pool, jobs: Vec<ReserveJob>) {
    let durable = jobs.iter().any(ReserveJob::irreversible);
    let inputs: Vec<Pending> = jobs.iter().map(|j| j.p.clone()).collect();
    match batch(pool, &jobs, inputs, durable).await {
        Ok(prepared) => {
            let settled = prepared
                .iter()
                .any(|p| matches!(p, Prepared::Settled { .. }));
            if settled && !durable && pool.is_fsyncd_sqlite() {
                // Something was acknowledged in a transaction that was not fsync'd.
                if let Err(e) = jobs[0].exec.store.sync_barrier().await {
                    let e = std::sync::Arc::new(e);
                    for j in jobs {
                        let _ = j.reply.send(Err(StoreError::NotDurable {
                            what: "a refusal",
                            source: e.clone(),
                        }));
                    }
                    return;
                }
            }
            for (j, p) in jobs.into_iter().zip(prepared) {
                let _ = j.reply.send(Ok(p));
            }
        }
        Err(batch_err) if jobs.len() > 1 || batch_err.is_conflict() => {
            tracing::debug!(error = %batch_err, n = jobs.len(), "reservation batch failed; one by one");
            // Rare: each retried call is committed durably on its own, and tried again (a few
            // times) when PostgreSQL aborts it for a deadlock or a serialization failure.
            for j in jobs {
                let res = retry_conflicts(|| {
                    batch(pool, std::slice::from_ref(&j), vec![j.p.clone()], true)
                })
                .await
                .map(|mut v| v.remove(0));
                let _ = j.reply.send(res);
            }
        }
        Err(e) => {
            let j = jobs.into_iter().next().expect("one job");
            let _ = j.reply.send(Err(e));
        }
    }
}

async fn batch(
    pool: &Pool,
    jobs: &[ReserveJob],
    inputs: Vec<Pending>,
    durable: bool,
) -> Result<Vec<Prepared>> {
    let mut tx = if durable {
        pool.begin().await?
    } else {
        pool.begin_relaxed().await?
    };
    let mut cache = BatchCache::default();
    if pool.is_pg() {
        let mut counters: Vec<_> = jobs
            .iter()
            .flat_map(|j| j.exec.budget_counters(&j.p, j.now))
            .collect();
        counters.sort();
        counters.dedup();
        crate::ledger::budgets::lock_counters(&mut tx, &mut cache, &counters).await?;
    }
    // PostgreSQL: the batch's runs and keys are read in one statement, and the steps its calls
    // open are written in one (see `BatchRead`), instead of one of each per call. A lone call
    // reads and writes as it goes, which is as many statements.
    let together = pool.is_pg() && jobs.len() > 1;
    if together {
        tx.defer_opens();
        let calls = jobs
            .iter()
            .zip(&inputs)
            .map(|(j, p)| j.exec.batch_read_of(p));
        cache.read = Some(BatchRead::read(&mut tx, calls).await?);
    }
    let mut out = Vec::with_capacity(jobs.len());
    for (j, p) in jobs.iter().zip(inputs) {
        // Each call reads its run inside this transaction, so it sees the calls before it.
        out.push(j.exec.prepare(&mut tx, p, j.now, &mut cache).await?);
    }
    if together {
        let numbered = tx.write_deferred().await?;
        for prepared in &mut out {
            prepared.numbered(&numbered);
        }
    }
    cache.flush(&mut tx).await?;
    let settled = out.iter().any(|p| matches!(p, Prepared::Settled { .. }));
    if !durable && settled {
        // Something was acknowledged on the spot (a refusal, a replay, a parked call).
        tx.unrelax().await?;
    }
    tx.commit().await?;
    Ok(out)
}
