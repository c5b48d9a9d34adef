//! The [`Store`]: one handle over either backend, chosen by URL. It owns the state of runs and
//! steps, the idempotency and budget ledgers, approvals and the audit chain, and it folds the
//! outcome records of concurrent calls into group commits ([`crate::combine`]), so an fsync is
//! shared by every call that finished while the previous commit was in flight.

use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{OwnedMutexGuard, oneshot};
use toolgate_core::config::Durability;
use toolgate_core::{
    ApprovalId, Effect, IdempotencyKey, PrincipalId, Redactor, Registry, RunId, StepId, StepStatus,
    Tier, Timestamp,
};

use crate::audit::{self, AuditDraft, AuditRecord, ChainPoint, ChainReport};
use crate::combine::Combiner;
use crate::db::{ConnectOptions, Migrations, Pool, Tx};
use crate::error::{Result, StoreError};
use crate::exec::{Executor, Pending, Prepared};
use crate::group::{ChainWriter, Changes};
use crate::ledger::{approvals, budgets, keys, runs, steps};
use crate::model::{
    ApprovalDecision, ApprovalRequest, ApprovalStatus, BudgetUse, PlannedStep, Step, StepOutcome,
};
use crate::reserve::{self, ReserveJob};

/// Tunables. Defaults: 24 h idempotency retention, never shorter than the
/// 72 h approval expiry it must outlive.
#[derive(Debug, Clone)]
pub struct StoreConfig {
    pub idempotency_retention_hours: i64,
    pub approval_expiry_hours: i64,
    /// How long a claimed step is leased to its worker before recovery may settle it.
    pub lease: Duration,
    /// How long a handler call may take before it is a timeout.
    pub call_timeout: Duration,
    /// Steps claimed per transaction by [`crate::Executor::run_batch`].
    pub claim_batch: usize,
    /// Records folded into one group commit at most.
    pub max_group_commit: usize,
    /// Key for the keyed hashes that replace sensitive fields in the audit log.
    pub redactor: Redactor,
    /// Delay before a timed-out read or write step is claimed again.
    pub retry_backoff: Duration,
    /// How long after a call became `unknown` the reconciler believes a "not found" answer (a
    /// late commit may still land before that); `None`: the call timeout. "Found" settles at once.
    pub reconcile_quiet: Option<Duration>,
    /// SQLite: grow the WAL file to this many bytes in the background after opening, so
    /// commits overwrite blocks already written instead of extending the file (see
    /// `Lite::preallocate_wal`). 0: off. Long-running processes (`serve`, `worker`) set it.
    pub wal_preallocate: u64,
    /// Whether acknowledged records are flushed to the disk one commit at a time
    /// ([`Durability::Fsync`]) or only survive this process being killed
    /// ([`Durability::Process`]).
    pub durability: Durability,
}

impl StoreConfig {
    /// How long one attempt of a call can hold its step: its handler's timeout and two
    /// seconds to record the outcome, never longer than a worker's lease. Past that, whoever
    /// made the attempt is gone and recovery may settle it.
    pub fn attempt_lease(&self) -> Duration {
        self.lease.min(self.call_timeout + Duration::from_secs(2))
    }
}

impl Default for StoreConfig {
    fn default() -> Self {
        StoreConfig {
            idempotency_retention_hours: 24,
            approval_expiry_hours: 72,
            lease: Duration::from_secs(300),
            call_timeout: Duration::from_secs(30),
            claim_batch: 64,
            max_group_commit: 512,
            // The development key: a process that redacts for real sets its own (see
            // toolgate_gateway::keys); hashes made with this one read `hmac:dev:…`.
            redactor: Redactor::dev(),
            retry_backoff: Duration::from_secs(5),
            reconcile_quiet: None,
            wal_preallocate: 0,
            durability: Durability::Fsync,
        }
    }
}

impl StoreConfig {
    /// Retention of idempotency records: the configured value, raised to the approval expiry.
    pub fn retention_ms(&self) -> i64 {
        self.idempotency_retention_hours
            .max(self.approval_expiry_hours)
            * 3_600_000
    }
}

/// Durable state, on SQLite or PostgreSQL. Cheap to clone.
#[derive(Clone)]
pub struct Store {
    pub(crate) inner: Arc<Inner>,
}

pub(crate) struct Inner {
    pub pool: Pool,
    pub cfg: StoreConfig,
    /// The group commit, and the chain head it last wrote.
    writer: Arc<Combiner<WriteJob, ChainWriter>>,
    /// The reservation batch.
    reserver: Arc<Combiner<ReserveJob, ()>>,
    /// Becomes true when the background WAL preallocation has finished (or was not asked for).
    wal_ready: tokio::sync::watch::Receiver<bool>,
    /// Each principal's current run (calls that name none), and when this process last told
    /// the store it was used: the store is written at most once a minute per principal.
    current_runs: std::sync::Mutex<HashMap<PrincipalId, (RunId, i64)>>,
    /// Held while a principal's current run is written ([`Store::current_run`]).
    refreshing_run: tokio::sync::Mutex<()>,
    /// Reads made without a reservation that are not recorded yet, per (run, tool): a call of
    /// the same run decided meanwhile counts them (see `exec::call::read`).
    pub(crate) unrecorded: std::sync::Mutex<HashMap<(String, String), i64>>,
}

/// What happens to the idempotency record when a call settles.
#[derive(Debug, Clone)]
pub(crate) enum IdemAction {
    /// Store the outcome; the key now replays it.
    Done(String),
    /// Delete the in-flight reservation: the call may run again.
    Release,
    /// Leave it in flight (unknown: only reconciliation may settle it).
    Keep,
}

/// What happens to the budget reserved for a call when it settles.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum BudgetAction {
    Charge,
    Release,
    Hold,
}

/// A step's settlement, applied with its audit record in one transaction.
#[derive(Debug, Clone)]
pub(crate) struct Settle {
    pub step_id: StepId,
    pub outcome: StepOutcome,
    pub retry_at: Option<i64>,
    pub idem_key: String,
    pub idem: IdemAction,
    pub budget: BudgetAction,
    pub now: Timestamp,
}

/// A call recorded without a step row (a direct read made without a reservation): its run,
/// made if it is new, and how the run counts it.
#[derive(Debug, Clone)]
pub(crate) struct SteplessCall {
    pub principal: String,
    pub purpose: Option<String>,
    pub now: Timestamp,
    pub tally: crate::ledger::runs::Stepless,
}

/// What a record changes in the ledgers besides the chain.
#[derive(Debug, Clone)]
pub(crate) enum Ledger {
    /// A step's settlement.
    Settle(Settle),
    /// A call that holds no step row.
    Stepless(SteplessCall),
}

/// One caller's records: applied and acknowledged together.
pub(crate) struct WriteJob {
    units: Vec<(Option<Ledger>, AuditDraft)>,
    reply: oneshot::Sender<Result<Vec<i64>>>,
}

fn corrupt(what: &'static str, value: &str) -> StoreError {
    StoreError::UnknownValue {
        what,
        value: value.to_string(),
    }
}

pub(crate) fn parse_effect(s: &str) -> Result<Effect> {
    Ok(match s {
        "read" => Effect::Read,
        "write" => Effect::Write,
        "irreversible" => Effect::Irreversible,
        _ => return Err(corrupt("effect", s)),
    })
}

pub(crate) fn parse_tier(s: &str) -> Result<Tier> {
    Ok(match s {
        "read" => Tier::Read,
        "act" => Tier::Act,
        "spend" => Tier::Spend,
        _ => return Err(corrupt("tier", s)),
    })
}

pub(crate) fn parse_status(s: &str) -> Result<StepStatus> {
    StepStatus::parse(s).ok_or_else(|| corrupt("step status", s))
}

pub(crate) fn new_id() -> String {
    uuid::Uuid::now_v7().to_string()
}

impl Store {
    /// Opens (and migrates) the store at `url`: `sqlite://path` or `postgres://…`.
    pub async fn connect(url: &str, cfg: StoreConfig) -> Result<Store> {
        Self::connect_with(url, cfg, ConnectOptions::default()).await
    }

    /// As [`Store::connect`], with pool settings (a PostgreSQL schema, the pool size).
    pub async fn connect_with(url: &str, cfg: StoreConfig, opts: ConnectOptions) -> Result<Store> {
        Self::open(url, cfg, opts, Migrations::Apply).await
    }

    /// Opens a store that a `toolgate serve` created, changing nothing about its schema: for
    /// the commands that read what was recorded (or record a decision in it). A SQLite file
    /// that is not there, a database without toolgate's tables, or one whose schema is older
    /// or newer than this binary's is an error ([`StoreError::Schema`] for the last three)
    /// saying what to do, never a new empty store.
    pub async fn connect_existing(
        url: &str,
        cfg: StoreConfig,
        opts: ConnectOptions,
    ) -> Result<Store> {
        Self::open(url, cfg, opts, Migrations::Require).await
    }

    async fn open(
        url: &str,
        cfg: StoreConfig,
        opts: ConnectOptions,
        migrations: Migrations,
    ) -> Result<Store> {
        let pool = Pool::connect(url, &opts, cfg.durability, migrations).await?;
        let (wal_done, wal_ready) = tokio::sync::watch::channel(true);
        if let (Pool::Sqlite(_, lite), n @ 1..) = (&pool, cfg.wal_preallocate) {
            let lite = lite.clone();
            wal_done.send_replace(false);
            tokio::spawn(async move {
                match lite.preallocate_wal(n).await {
                    Ok(len) => tracing::debug!(bytes = len, "SQLite WAL preallocated"),
                    Err(e) => {
                        tracing::warn!(error = %e, "preallocating the SQLite WAL failed; commits still work, slower")
                    }
                }
                wal_done.send_replace(true);
            });
        }
        Ok(Store {
            inner: Arc::new(Inner {
                writer: Arc::new(Combiner::new(cfg.max_group_commit, ChainWriter::default())),
                reserver: Arc::new(Combiner::new(cfg.claim_batch, ())),
                pool,
                cfg,
                wal_ready,
                current_runs: Default::default(),
                refreshing_run: Default::default(),
                unrecorded: Default::default(),
            }),
        })
    }

    /// Returns once the WAL preallocation asked for by [`StoreConfig::wal_preallocate`] has
    /// finished (at once if none was). Benchmarks wait for it so it does not overlap a measure.
    pub async fn wal_preallocated(&self) {
        let mut ready = self.inner.wal_ready.clone();
        let _ = ready.wait_for(|done| *done).await;
    }

    pub fn config(&self) -> &StoreConfig {
        &self.inner.cfg
    }

    /// The run a call of `principal` that names none belongs to: its current run if its last
    /// such call was less than `idle` ago, else a new one. Kept in the store (one row per
    /// principal), so every gateway of a fleet, any session and a stateless client agree on
    /// it, and reconnecting does not start a new run. To the minute: this process writes a
    /// principal's row at most once a minute.
    pub async fn current_run(
        &self,
        principal: &PrincipalId,
        now: Timestamp,
        idle: Duration,
    ) -> Result<RunId> {
        const TOUCH_MS: i64 = 60_000;
        let idle_ms = idle.as_millis() as i64;
        let cached = || {
            let runs = self.inner.current_runs.lock().expect("runs");
            let (run, touched) = runs.get(principal)?;
            (now.millis() - touched < TOUCH_MS.min(idle_ms)).then(|| run.clone())
        };
        if let Some(run) = cached() {
            return Ok(run);
        }
        // One refresh at a time: the calls of a principal that arrive together once its row
        // is a minute old would each write the row, queued on its lock; the first writes it
        // and the others find it in the cache.
        let _one = self.inner.refreshing_run.lock().await;
        if let Some(run) = cached() {
            return Ok(run);
        }
        let fresh = format!("auto-{}", new_id());
        let mut tx = self.begin().await?;
        let run = RunId::new(
            runs::current(&mut tx, principal, &fresh, now, now.millis() - idle_ms).await?,
        );
        tx.commit().await?;
        self.inner
            .current_runs
            .lock()
            .expect("runs")
            .insert(principal.clone(), (run.clone(), now.millis()));
        Ok(run)
    }

    /// Whether `principal` may put calls in run `run_id`: a run nobody made yet (it becomes
    /// theirs), their own, a plan's run with a step assigned to them, or — for a `reviewer`
    /// (a role that reviews planned steps) — any plan's run.
    pub async fn may_join_run(
        &self,
        run_id: &RunId,
        principal: &PrincipalId,
        reviewer: bool,
    ) -> Result<bool> {
        let mut c = self.inner.pool.conn().await?;
        let owner = runs::owner(&mut c, run_id).await?;
        runs::may_join(&mut c, run_id, owner, principal, reviewer).await
    }

    pub fn is_postgres(&self) -> bool {
        self.inner.pool.is_pg()
    }

    /// Waits until there may be work for a worker, at most `timeout`: on PostgreSQL until a
    /// parked step is approved and re-queued (LISTEN `toolgate_steps`, fed by a trigger), on
    /// SQLite by polling (it has no notifications). Either way the caller then claims.
    pub async fn wait_for_work(&self, timeout: Duration) -> Result<()> {
        match &self.inner.pool {
            Pool::Postgres(pool, _) => {
                let mut listener = sqlx::postgres::PgListener::connect_with(pool).await?;
                listener.listen("toolgate_steps").await?;
                let _ = tokio::time::timeout(timeout, listener.recv()).await;
            }
            Pool::Sqlite(..) => {
                tokio::time::sleep(timeout.min(Duration::from_millis(250))).await;
            }
        }
        Ok(())
    }

    /// Closes the pool. A group commit under way finishes first.
    pub async fn close(&self) {
        // The group commit's connection goes back, or PostgreSQL's pool would wait for it.
        self.inner.writer.state().await.release();
        self.inner.pool.close().await;
    }

    /// Raw SQL, for administration and for tests that tamper on purpose.
    pub async fn execute_raw(&self, sql: &str) -> Result<u64> {
        self.inner.pool.execute_raw(sql).await
    }

    pub(crate) async fn begin(&self) -> Result<Tx> {
        self.inner.pool.begin().await
    }

    /// Queues a settlement and its audit record for the next group commit and waits until it
    /// is durable. Returns the audit sequence number.
    pub(crate) async fn commit_record(
        &self,
        ledger: Option<Ledger>,
        audit: AuditDraft,
    ) -> Result<i64> {
        Ok(self.commit_records(vec![(ledger, audit)]).await?[0])
    }

    /// As [`Store::commit_record`] for several records, acknowledged together.
    pub(crate) async fn commit_records(
        &self,
        units: Vec<(Option<Ledger>, AuditDraft)>,
    ) -> Result<Vec<i64>> {
        let (reply, rx) = oneshot::channel();
        let pool = self.inner.pool.clone();
        let answer = self
            .inner
            .writer
            .clone()
            .submit(WriteJob { units, reply }, rx, move |chain, jobs| {
                commit_batch(pool.clone(), chain, jobs)
            })
            .await;
        match answer {
            Some(Ok(seqs)) => Ok(seqs),
            Some(Err(e)) => Err(StoreError::Recording(Box::new(e))),
            None => Err(StoreError::WriterGone),
        }
    }

    /// Decides and reserves one direct call in the next reservation batch.
    pub(crate) async fn reserve_direct(
        &self,
        exec: Executor,
        p: Pending,
        now: Timestamp,
    ) -> Result<Prepared> {
        let (reply, rx) = oneshot::channel();
        let job = ReserveJob {
            exec,
            p,
            now,
            reply,
        };
        let pool = self.inner.pool.clone();
        self.inner
            .reserver
            .clone()
            .submit(job, rx, move |lead, jobs| {
                let pool = pool.clone();
                async move {
                    reserve::run(&pool, jobs).await;
                    drop(lead);
                }
            })
            .await
            .ok_or(StoreError::WriterGone)?
    }

    /// Returns once everything committed before the call is fsync'd: a durable group commit
    /// (which writes a barrier row when it has nothing else to write).
    pub(crate) async fn sync_barrier(&self) -> Result<()> {
        self.commit_records(Vec::new()).await.map(|_| ())
    }

    /// Appends audit records directly (one transaction), for events outside a call.
    pub async fn append_audit(&self, drafts: Vec<AuditDraft>) -> Result<Vec<i64>> {
        let mut tx = self.begin().await?;
        let seqs = audit::append(&mut tx, drafts).await?;
        tx.commit().await?;
        Ok(seqs)
    }

    /// Appends one audit record through the group-commit writer.
    pub async fn append_audit_grouped(&self, draft: AuditDraft) -> Result<i64> {
        self.commit_record(None, draft).await
    }

    // ---------------------------------------------------------------- runs and steps

    /// Creates a run and its planned steps (status `pending`), each with its derived key.
    /// Unknown tools and principals are refused here, before anything is stored.
    pub async fn create_run(
        &self,
        registry: &Registry,
        principal: &PrincipalId,
        purpose: Option<&str>,
        steps: &[PlannedStep],
        now: Timestamp,
    ) -> Result<RunId> {
        let run_id = RunId::new(new_id());
        self.create_run_with_id(registry, &run_id, principal, purpose, steps, now)
            .await?;
        Ok(run_id)
    }

    /// As [`Store::create_run`] with a caller-chosen run id.
    pub async fn create_run_with_id(
        &self,
        registry: &Registry,
        run_id: &RunId,
        principal: &PrincipalId,
        purpose: Option<&str>,
        steps: &[PlannedStep],
        now: Timestamp,
    ) -> Result<()> {
        let mut rows = Vec::with_capacity(steps.len());
        for (i, s) in steps.iter().enumerate() {
            let tool = registry
                .tool(&s.tool)
                .ok_or_else(|| StoreError::UnknownTool(s.tool.clone()))?;
            let p = registry
                .principal(&s.principal)
                .ok_or_else(|| StoreError::UnknownPrincipal(s.principal.to_string()))?;
            rows.push((i as u32 + 1, s, tool, p.role().to_string()));
        }
        let mut tx = self.begin().await?;
        runs::open(&mut tx, run_id, principal, purpose, now).await?;
        for (seq, s, tool, role) in rows {
            let key = IdempotencyKey::for_step(run_id, seq, &s.inputs);
            steps::insert(
                &mut tx,
                steps::NewStep::queued(
                    &new_id(),
                    run_id,
                    seq,
                    s,
                    &role,
                    tool,
                    s.purpose.as_deref().or(purpose),
                    key.as_str(),
                    now,
                ),
            )
            .await?;
        }
        tx.commit().await
    }

    /// Ensures a run row exists (direct calls name their run in `_meta`).
    pub(crate) async fn ensure_run(
        tx: &mut Tx,
        run_id: &str,
        principal: &str,
        purpose: Option<&str>,
        now: Timestamp,
    ) -> Result<()> {
        runs::ensure(tx, run_id, principal, purpose, now).await
    }

    pub async fn step(&self, step_id: &StepId) -> Result<Step> {
        let mut c = self.inner.pool.conn().await?;
        steps::by_id(&mut c, step_id)
            .await?
            .ok_or_else(|| StoreError::NotFound {
                what: "step",
                id: step_id.to_string(),
            })
    }

    /// The step once it is no longer running, read again with a growing pause
    /// (10 ms up to 250 ms) for at most `within`; the last reading if it is still running
    /// then. For a retry that found another attempt of its operation in progress, so it can
    /// answer with that attempt's outcome instead of "ask later".
    pub async fn step_when_settled(&self, step_id: &StepId, within: Duration) -> Result<Step> {
        let deadline = tokio::time::Instant::now() + within;
        let mut pause = Duration::from_millis(10);
        loop {
            let step = self.step(step_id).await?;
            if step.status != StepStatus::Running || tokio::time::Instant::now() + pause > deadline
            {
                return Ok(step);
            }
            tokio::time::sleep(pause).await;
            pause = (pause * 2).min(Duration::from_millis(250));
        }
    }

    /// The steps of a run in order (compensations after the steps they undo).
    pub async fn steps(&self, run_id: &RunId) -> Result<Vec<Step>> {
        let mut c = self.inner.pool.conn().await?;
        steps::of_run(&mut c, run_id).await
    }

    /// How many steps are in each status (all runs).
    pub async fn status_counts(&self) -> Result<Vec<(StepStatus, i64)>> {
        let mut c = self.inner.pool.conn().await?;
        steps::count_by_status(&mut c).await
    }

    // ---------------------------------------------------------------- budgets

    /// Today's (UTC) budget use of every principal that has used any.
    pub async fn budget_use(&self, now: Timestamp) -> Result<Vec<BudgetUse>> {
        let mut c = self.inner.pool.conn().await?;
        budgets::usage_on(&mut c, now.utc_day()).await
    }

    // ---------------------------------------------------------------- approvals

    /// What one window holds at `now`: the live reservations of `budget` for `principal` under
    /// `key` (empty for a budget without a key), oldest first. Amounts are in units of
    /// 1/10,000 for a sum, 1 per call for a count.
    pub async fn window_use(
        &self,
        budget: &toolgate_core::WindowBudget,
        principal: &PrincipalId,
        key: &str,
        now: Timestamp,
    ) -> Result<Vec<toolgate_core::Held>> {
        let mut c = self.inner.pool.conn().await?;
        crate::ledger::windows::live(&mut c, budget, principal, key, now).await
    }

    /// Approval requests, newest first; `status` filters.
    pub async fn approvals(&self, status: Option<ApprovalStatus>) -> Result<Vec<ApprovalRequest>> {
        let mut c = self.inner.pool.conn().await?;
        approvals::list(&mut c, status).await
    }

    /// Every decision people made on approval requests, oldest first: each approval given
    /// (`approval_grants`) and each rejection by a person (a reviewer's closure names nobody).
    pub async fn approval_decisions(&self) -> Result<Vec<ApprovalDecision>> {
        let mut c = self.inner.pool.conn().await?;
        let mut out = approvals::grants(&mut c).await?;
        out.extend(approvals::rejections(&mut c).await?);
        out.sort_by_key(|d| (d.at, d.approver.clone()));
        Ok(out)
    }

    pub async fn approval(&self, approval_id: &ApprovalId) -> Result<ApprovalRequest> {
        let mut c = self.inner.pool.conn().await?;
        approvals::by_id(&mut c, approval_id)
            .await?
            .ok_or_else(|| StoreError::NotFound {
                what: "approval request",
                id: approval_id.to_string(),
            })
    }

    /// Marks pending approval requests past their expiry as expired (they fail closed anyway;
    /// this keeps the queue people watch honest).
    pub async fn expire_approvals(&self, now: Timestamp) -> Result<u64> {
        let mut tx = self.begin().await?;
        let n = approvals::expire_lapsed(&mut tx, now).await?;
        tx.commit().await?;
        Ok(n)
    }

    /// Deletes completed idempotency records past their retention.
    pub async fn purge_idempotency(&self, now: Timestamp) -> Result<u64> {
        let mut tx = self.begin().await?;
        let n = keys::purge_settled(&mut tx, now).await?;
        tx.commit().await?;
        Ok(n)
    }

    // ---------------------------------------------------------------- the audit chain

    /// Walks the whole chain and names the first broken link by sequence number: each
    /// record's link to the one before it, its hash, and each column rows are selected by
    /// against the record; then that the chain head is the last record.
    pub async fn verify_chain(&self) -> Result<ChainReport> {
        let mut c = self.inner.pool.conn().await?;
        let walk = audit::walk(&mut c, &ChainPoint::genesis(), &BTreeSet::new()).await?;
        Ok(walk.report)
    }

    /// Audit records, in chain order; filters by principal or run. Rows are selected by their
    /// `principal` or `run_id` column; a row whose record says otherwise is an error (run
    /// `toolgate log verify`), but a row whose column was moved away is not seen here: only
    /// [`Store::verify_chain`] finds it.
    pub async fn audit_records(
        &self,
        principal: Option<&PrincipalId>,
        run_id: Option<&RunId>,
    ) -> Result<Vec<AuditRecord>> {
        let (principal, run_id) = (principal.map(|p| p.as_str()), run_id.map(|r| r.as_str()));
        let mut c = self.inner.pool.conn().await?;
        audit::stored(&mut c, principal, run_id)
            .await?
            .iter()
            .map(|s| {
                let record = audit_record(s.seq, &s.text)?;
                selected_as_stored(
                    s.seq,
                    &record,
                    principal,
                    run_id.filter(|_| principal.is_none()),
                )?;
                Ok(record)
            })
            .collect()
    }

    /// Writes one principal's audit records as JSON lines (the stored canonical text, so each
    /// line can be re-hashed against the chain). Returns how many were written. Rows are
    /// selected by the `principal` column, with the caveat of [`Store::audit_records`].
    pub async fn export_principal(
        &self,
        principal: &PrincipalId,
        mut out: impl std::io::Write,
    ) -> Result<u64> {
        let mut c = self.inner.pool.conn().await?;
        let rows = audit::stored(&mut c, Some(principal), None).await?;
        for s in &rows {
            let record = audit_record(s.seq, &s.text)?;
            selected_as_stored(s.seq, &record, Some(principal), None)?;
            out.write_all(s.text.as_bytes())?;
            out.write_all(b"\n")?;
        }
        out.flush()?;
        Ok(rows.len() as u64)
    }

    /// A run's trace: every step, and every check of every decided attempt, from the audit
    /// chain. `verbose` adds passed checks' details and the redacted inputs.
    pub async fn trace(&self, run_id: &RunId, verbose: bool) -> Result<String> {
        let steps = self.steps(run_id).await?;
        let records = self.audit_records(None, Some(run_id)).await?;
        Ok(crate::trace::render(run_id, &steps, &records, verbose))
    }
}

/// The stored text of audit record `seq`, parsed.
pub(crate) fn audit_record(seq: i64, text: &str) -> Result<AuditRecord> {
    serde_json::from_str(text).map_err(|source| StoreError::Unparsable {
        what: format!("audit record {seq}"),
        source,
    })
}

/// A row selected by its `principal` or `run_id` column must say the same in its record (and
/// be stored under its own number); otherwise the column was edited.
fn selected_as_stored(
    seq: i64,
    record: &AuditRecord,
    principal: Option<&str>,
    run_id: Option<&str>,
) -> Result<()> {
    let mismatch = |column: &str, asked: &str, says: Option<&str>| {
        StoreError::Corrupt(format!(
            "audit row {seq} was selected by its {column} column ('{asked}') but its record \
             says {}: the column was edited; run `toolgate log verify`",
            says.map_or_else(|| "none".to_string(), |s| format!("'{s}'"))
        ))
    };
    if record.seq != seq {
        return Err(StoreError::Corrupt(format!(
            "audit row {seq} holds record {}: the seq column was edited; run `toolgate log verify`",
            record.seq
        )));
    }
    if let Some(p) = principal
        && record.body.who.principal != p
    {
        return Err(mismatch("principal", p, Some(&record.body.who.principal)));
    }
    if let Some(r) = run_id
        && record.body.run_id.as_deref() != Some(r)
    {
        return Err(mismatch("run_id", r, record.body.run_id.as_deref()));
    }
    Ok(())
}

pub(crate) fn to_json<T: serde::Serialize>(v: &T) -> String {
    toolgate_core::canon::canonical_of(v).expect("store values serialise")
}

/// Applies a batch of records in one commit (see [`ChainWriter::apply`]).
async fn apply_batch(pool: &Pool, chain: &mut ChainWriter, jobs: &[WriteJob]) -> Result<Vec<i64>> {
    let mut changes = Changes::default();
    for unit in jobs.iter().flat_map(|j| &j.units) {
        match &unit.0 {
            Some(Ledger::Settle(s)) => changes.settles.push(s),
            Some(Ledger::Stepless(c)) => changes.stepless.push(c),
            None => {}
        }
    }
    changes.barrier = jobs.iter().all(|j| j.units.is_empty());
    let drafts: Vec<&AuditDraft> = jobs
        .iter()
        .flat_map(|j| j.units.iter().map(|u| &u.1))
        .collect();
    chain.apply(pool, &drafts, &changes).await
}

/// One group commit: applies `jobs` in one transaction, commits once, then answers each
/// caller. A batch that fails is retried one job at a time so one bad record cannot sink the
/// others. `chain` (the lead of the group commit) is let go after every answer is sent.
async fn commit_batch(pool: Pool, mut chain: OwnedMutexGuard<ChainWriter>, jobs: Vec<WriteJob>) {
    match apply_batch(&pool, &mut chain, &jobs).await {
        Ok(seqs) => {
            let mut seqs = seqs.into_iter();
            for j in jobs {
                let mine = seqs.by_ref().take(j.units.len()).collect();
                let _ = j.reply.send(Ok(mine));
            }
        }
        Err(batch_err) => {
            tracing::warn!(error = %batch_err, n = jobs.len(), "group commit failed; retrying one by one");
            for j in jobs {
                let one = std::slice::from_ref(&j);
                let mut res = apply_batch(&pool, &mut chain, one).await;
                for _ in 1..3 {
                    if res.is_ok() {
                        break;
                    }
                    res = apply_batch(&pool, &mut chain, one).await;
                }
                let _ = j.reply.send(res);
            }
        }
    }
    drop(chain);
}
