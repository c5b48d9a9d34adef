//! The planned-step queue: claims steps in batches (`FOR UPDATE SKIP LOCKED` on PostgreSQL, the
//! single writer on SQLite), decides and reserves them in the claim's transaction (or, when a
//! destination must be looked up first, in a second one after the lookups), calls the allowed
//! ones concurrently and records every outcome in one commit.

use super::*;

/// What a claim transaction came to.
enum Claimed {
    /// Decided and reserved in the claim's own transaction.
    Prepared(Vec<Prepared>),
    /// Claimed (committed) but not decided: some need destination lookups, which are made
    /// outside any transaction.
    NeedLookups(Vec<Pending>),
}

/// Which steps a claim takes.
#[derive(Clone, Copy)]
enum Claim<'a> {
    Queue(usize),
    Step(&'a str),
}

impl Executor {
    /// Claims up to `limit` queued steps in one transaction (`FOR UPDATE SKIP LOCKED` on
    /// PostgreSQL), decides and reserves each, calls the allowed ones concurrently and records
    /// every outcome. Returns what happened to each claimed step; empty when the queue is.
    pub async fn run_batch(&self, limit: usize) -> Result<Vec<StepReport>> {
        self.claim_and_run(Claim::Queue(limit)).await
    }

    /// Executes one step by id: claims it if it is pending or retryable, otherwise returns
    /// what was recorded (a step done, refused, parked or unknown never runs again).
    pub async fn execute_step(&self, step_id: &StepId) -> Result<StepReport> {
        let mut out = self.claim_and_run(Claim::Step(step_id)).await?;
        if out.is_empty() {
            let s = self.store.step(step_id).await?;
            return Ok(StepReport {
                step_id: s.step_id,
                status: s.status,
                outcome: s.outcome,
                replayed: true,
            });
        }
        Ok(out.remove(0))
    }

    /// Claims, decides and reserves (one transaction, tried again on a PostgreSQL conflict),
    /// then calls the allowed steps concurrently and records every outcome. Steps whose
    /// destinations are looked up are claimed first, looked up outside any transaction, then
    /// decided in a second one.
    async fn claim_and_run(&self, by: Claim<'_>) -> Result<Vec<StepReport>> {
        let now = self.clock.now();
        let started = Instant::now();
        let prepared = match retry_conflicts(|| self.claim(by, now, started)).await? {
            Claimed::Prepared(p) => p,
            Claimed::NeedLookups(mut pending) => {
                let mut cache = LookupCache::default();
                for p in &mut pending {
                    self.look_up_destinations(p, &mut cache).await;
                }
                retry_conflicts(|| async {
                    let mut tx = self.store.begin().await?;
                    let out = self.prepare_all(&mut tx, pending.clone(), now).await?;
                    tx.commit().await?;
                    Ok(out)
                })
                .await?
            }
        };
        self.call_prepared(prepared).await
    }

    /// The claim transaction: marks the steps running (leased), then decides and reserves them
    /// in the same transaction unless one needs a destination lookup.
    async fn claim(&self, by: Claim<'_>, now: Timestamp, started: Instant) -> Result<Claimed> {
        let lease = now.millis() + self.store.config().lease.as_millis() as i64;
        let mut tx = self.store.begin().await?;
        let mut claimed = match by {
            Claim::Queue(limit) => {
                crate::ledger::steps::claim_queued(&mut tx, lease, now, limit).await?
            }
            Claim::Step(step_id) => {
                crate::ledger::steps::claim_one(&mut tx, step_id, lease, now).await?
            }
        };
        claimed.sort_by_key(|a| (a.created_at, a.seq));
        let pending: Vec<Pending> = claimed
            .iter()
            .map(|s| Pending {
                started,
                ..Pending::from_step(s)
            })
            .collect();
        if pending.iter().any(|p| self.needs_lookups(p)) {
            tx.commit().await?;
            return Ok(Claimed::NeedLookups(pending));
        }
        let out = self.prepare_all(&mut tx, pending, now).await?;
        tx.commit().await?;
        Ok(Claimed::Prepared(out))
    }

    /// Decides and reserves claimed steps in order inside `tx` (the batch's decisions see each
    /// other), and writes the batched counters.
    pub(crate) async fn prepare_all(
        &self,
        tx: &mut Tx,
        pending: Vec<Pending>,
        now: Timestamp,
    ) -> Result<Vec<Prepared>> {
        let mut cache = BatchCache::default();
        let mut out = Vec::with_capacity(pending.len());
        for p in pending {
            out.push(self.prepare(tx, p, now, &mut cache).await?);
        }
        cache.flush(tx).await?;
        Ok(out)
    }

    /// Calls the reserved steps concurrently; their outcomes are recorded in one commit.
    pub(crate) async fn call_prepared(&self, prepared: Vec<Prepared>) -> Result<Vec<StepReport>> {
        if !prepared.is_empty() {
            self.point(SyncPoint::Reserved);
        }
        let mut reports = Vec::with_capacity(prepared.len());
        let mut set = tokio::task::JoinSet::new();
        for prepared in prepared {
            match prepared {
                Prepared::Settled {
                    p, status, outcome, ..
                } => reports.push(StepReport {
                    step_id: StepId::new(p.step_id),
                    status: outcome.status,
                    replayed: status == CallStatus::Replayed,
                    outcome: Some(outcome),
                }),
                Prepared::Call {
                    mut p,
                    decision,
                    tokens,
                    approvals,
                } => {
                    p.governance_us = Some(p.elapsed_us());
                    let this = self.clone();
                    set.spawn(async move { this.call_only(p, decision, tokens, approvals).await });
                }
            }
        }
        let mut units = Vec::new();
        while let Some(r) = set.join_next().await {
            let c = r.map_err(|source| StoreError::Task {
                what: "a call task",
                source,
            })?;
            reports.push(StepReport {
                step_id: StepId::new(c.p.step_id.clone()),
                status: c.outcome.status,
                outcome: Some(c.outcome),
                replayed: false,
            });
            units.push((Some(Ledger::Settle(c.settle)), c.draft));
        }
        if !units.is_empty() {
            self.store.commit_records(units).await?;
        }
        Ok(reports)
    }

    /// Runs the queue until it is empty.
    pub async fn drain(&self) -> Result<Vec<StepReport>> {
        let mut all = Vec::new();
        loop {
            let batch = self.run_batch(self.store.config().claim_batch).await?;
            if batch.is_empty() {
                return Ok(all);
            }
            all.extend(batch);
        }
    }
}
