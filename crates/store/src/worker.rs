//! The worker loop behind `toolgate worker`: claim queued planned steps, execute them through
//! the executor (every check, reservation and audit record of any call), and between empty
//! claims wait for a wake-up — PostgreSQL's LISTEN/NOTIFY, or a short poll on SQLite. Any number
//! of workers may share a PostgreSQL store (claims skip locked rows). A stop request lets the
//! batch in hand finish and be recorded before the loop returns.

use std::time::{Duration, Instant};

use tokio::sync::watch;
use toolgate_core::StepStatus;

use crate::error::Result;
use crate::exec::Executor;

/// How a worker paces itself.
#[derive(Debug, Clone)]
pub struct WorkOptions {
    /// Steps claimed per transaction.
    pub batch: usize,
    /// The longest wait between claims when nothing wakes the worker (a retry that comes due
    /// wakes no one, so the queue is also polled this often).
    pub idle: Duration,
    /// The poll interval on SQLite, which has no notifications.
    pub poll: Duration,
    /// How often steps whose worker died mid-call (lease expired) are settled.
    pub recover_every: Duration,
    /// Stop once the queue is empty instead of waiting for more work.
    pub until_idle: bool,
}

impl Default for WorkOptions {
    fn default() -> Self {
        WorkOptions {
            batch: 64,
            idle: Duration::from_secs(5),
            poll: Duration::from_millis(250),
            recover_every: Duration::from_secs(30),
            until_idle: false,
        }
    }
}

/// What a worker did before it stopped.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct WorkStats {
    pub batches: u64,
    pub executed: u64,
    pub done: u64,
    pub refused: u64,
    pub parked: u64,
    pub other: u64,
    pub recovered: u64,
    /// `unknown` steps the reconciler settled (done or failed) by asking the target.
    pub reconciled: u64,
    /// Claims that failed (the database was unreachable, say) and were retried.
    pub errors: u64,
}

impl std::ops::AddAssign for WorkStats {
    /// Sums two stretches of work (a worker that reloads its registry runs the loop in parts).
    fn add_assign(&mut self, s: WorkStats) {
        let WorkStats {
            batches,
            executed,
            done,
            refused,
            parked,
            other,
            recovered,
            reconciled,
            errors,
        } = s;
        self.batches += batches;
        self.executed += executed;
        self.done += done;
        self.refused += refused;
        self.parked += parked;
        self.other += other;
        self.recovered += recovered;
        self.reconciled += reconciled;
        self.errors += errors;
    }
}

impl Executor {
    /// Runs the worker loop until `stop` turns true (or, with `until_idle`, the queue is
    /// empty). A failed claim is logged and retried after a pause, so a database restart does
    /// not end the worker.
    pub async fn work(&self, opts: &WorkOptions, mut stop: watch::Receiver<bool>) -> WorkStats {
        let mut stats = WorkStats::default();
        let mut signal = self.store.work_signal().await;
        if let Err(e) = signal.listen().await {
            tracing::warn!(error = %e, "cannot LISTEN for work yet; will retry");
        }
        let mut last_recovery: Option<Instant> = None;
        while !*stop.borrow() {
            if last_recovery.is_none_or(|t| t.elapsed() >= opts.recover_every) {
                last_recovery = Some(Instant::now());
                match self.recover_stale().await {
                    Ok(r) => stats.recovered += r.len() as u64,
                    Err(e) => tracing::warn!(error = %e, "recovering stale steps failed"),
                }
                // The reconciler: `unknown` steps (a timeout on an irreversible call, or a
                // worker that died mid-call) are settled by asking the target by key.
                match self.reconcile().await {
                    Ok(r) => stats.reconciled += r.len() as u64,
                    Err(e) => tracing::warn!(error = %e, "reconciling unknown steps failed"),
                }
            }
            let claimed = match self.run_batch(opts.batch.max(1)).await {
                Ok(reports) => reports,
                Err(e) => {
                    stats.errors += 1;
                    tracing::warn!(error = %e, "claiming steps failed; retrying shortly");
                    pause(&mut stop, Duration::from_secs(1)).await;
                    continue;
                }
            };
            if !claimed.is_empty() {
                stats.batches += 1;
                for r in &claimed {
                    stats.executed += 1;
                    match r.status {
                        StepStatus::Done => stats.done += 1,
                        StepStatus::Refused => stats.refused += 1,
                        StepStatus::NeedsApproval => stats.parked += 1,
                        _ => stats.other += 1,
                    }
                    tracing::info!(step = %r.step_id, status = %r.status, "step executed");
                }
                continue;
            }
            if opts.until_idle {
                break;
            }
            tokio::select! {
                changed = stop.changed() => if changed.is_err() { break },
                _ = signal.wait(opts.idle, opts.poll) => {}
            }
        }
        stats
    }

    /// Executes queued steps until none is left; for tests and one-shot runs.
    pub async fn work_until_idle(&self) -> Result<WorkStats> {
        let (_tx, rx) = watch::channel(false);
        let opts = WorkOptions {
            until_idle: true,
            ..WorkOptions::default()
        };
        Ok(self.work(&opts, rx).await)
    }
}

async fn pause(stop: &mut watch::Receiver<bool>, d: Duration) {
    tokio::select! {
        _ = stop.changed() => {}
        _ = tokio::time::sleep(d) => {}
    }
}
