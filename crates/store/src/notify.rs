//! The outbox of notifications: for each raised approval request and each webhook that takes
//! it, whether it was posted, how many times it was tried, when it is due again and why it
//! last failed. A row is claimed by a conditional UPDATE before it is posted, so gateways
//! sharing one PostgreSQL never post the same row at once; a claim whose process died runs
//! out and is taken again (a post that succeeded just before a crash can be repeated, never
//! lost). The gateway's notifier does the posting; nothing here blocks a call.

use serde::Serialize;
use toolgate_core::{ApprovalId, Rule, Timestamp};

use crate::error::Result;
use crate::ledger::outbox::{self, OutboxState};
use crate::store::Store;

/// A pending request the notifier has to match to its webhooks.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RaisedRequest {
    pub approval_id: ApprovalId,
    pub tool: String,
    pub rule: Rule,
    pub created_at: Timestamp,
}

/// One claimed delivery: post it, then record the outcome.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Delivery {
    pub approval_id: ApprovalId,
    /// The webhook's name in `approvals.notify`.
    pub destination: String,
    /// Including this one.
    pub attempts: i64,
}

/// How one webhook's deliveries stand.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct NotifySummary {
    pub destination: String,
    pub sent: i64,
    /// Not posted yet (first attempt due, or being posted).
    pub waiting: i64,
    /// Failed at least once, to be tried again.
    pub retrying: i64,
    /// Given up on after the last attempt.
    pub failed: i64,
    pub last_error: Option<String>,
    pub last_error_at: Option<Timestamp>,
}

impl NotifySummary {
    /// Whether anything is failing or has failed for good.
    pub fn failing(&self) -> bool {
        self.retrying > 0 || self.failed > 0
    }
}

impl Store {
    /// Pending approval requests raised at or after `since`, oldest first.
    pub async fn raised_since(&self, since: Timestamp) -> Result<Vec<RaisedRequest>> {
        let mut c = self.inner.pool.conn().await?;
        outbox::raised_since(&mut c, since).await
    }

    /// Puts a notification of `approval_id` to `destination` in the outbox, due now; false when
    /// it is there already (another gateway, or an earlier look, put it there).
    pub async fn enqueue_notification(
        &self,
        approval_id: &ApprovalId,
        destination: &str,
        now: Timestamp,
    ) -> Result<bool> {
        let mut tx = self.inner.pool.begin().await?;
        let queued = outbox::enqueue(&mut tx, approval_id, destination, now).await?;
        tx.commit().await?;
        Ok(queued)
    }

    /// Claims up to `limit` deliveries due at `now` (or whose claim ran out), each for
    /// `lease_ms`: a row another process claimed first is skipped.
    pub async fn claim_notifications(
        &self,
        now: Timestamp,
        lease_ms: i64,
        limit: i64,
    ) -> Result<Vec<Delivery>> {
        let candidates = {
            let mut c = self.inner.pool.conn().await?;
            outbox::due(&mut c, now, limit).await?
        };
        let mut out = Vec::new();
        for (approval_id, destination) in candidates {
            let mut tx = self.inner.pool.begin().await?;
            let until = now.millis() + lease_ms;
            let claimed = outbox::claim(&mut tx, &approval_id, &destination, now, until).await?;
            tx.commit().await?;
            if let Some(attempts) = claimed {
                out.push(Delivery {
                    approval_id,
                    destination,
                    attempts,
                });
            }
        }
        Ok(out)
    }

    /// Records that a claimed delivery was posted.
    pub async fn notification_sent(&self, d: &Delivery, now: Timestamp) -> Result<()> {
        let mut tx = self.inner.pool.begin().await?;
        outbox::sent(&mut tx, d, now).await?;
        tx.commit().await
    }

    /// Records that a claimed delivery failed with `error`: due again at `retry_at`, or failed
    /// for good when that is `None`.
    pub async fn notification_failed(
        &self,
        d: &Delivery,
        now: Timestamp,
        error: &str,
        retry_at: Option<Timestamp>,
    ) -> Result<()> {
        let error = toolgate_core::clip::clip(error, 500).into_owned();
        let mut tx = self.inner.pool.begin().await?;
        outbox::failed(&mut tx, d, now, &error, retry_at).await?;
        tx.commit().await
    }

    /// Each webhook's deliveries, by name.
    pub async fn notify_summary(&self) -> Result<Vec<NotifySummary>> {
        let mut c = self.inner.pool.conn().await?;
        let mut out: Vec<NotifySummary> = Vec::new();
        for count in outbox::counts(&mut c).await? {
            if out
                .last()
                .is_none_or(|s| s.destination != count.destination)
            {
                out.push(NotifySummary {
                    destination: count.destination.clone(),
                    ..NotifySummary::default()
                });
            }
            let s = out.last_mut().expect("pushed above");
            match (count.state, count.erred) {
                (OutboxState::Sent, _) => s.sent += count.n,
                (OutboxState::Failed, _) => s.failed += count.n,
                (OutboxState::Due | OutboxState::Sending, true) => s.retrying += count.n,
                (OutboxState::Due | OutboxState::Sending, false) => s.waiting += count.n,
            }
        }
        for s in &mut out {
            if let Some((error, at)) = outbox::last_error(&mut c, &s.destination).await? {
                s.last_error = error;
                s.last_error_at = at;
            }
        }
        Ok(out)
    }
}
