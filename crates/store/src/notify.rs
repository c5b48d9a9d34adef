//! The outbox of notifications: for each raised approval request and each webhook that takes
//! it, whether it was posted, how many times it was tried, when it is due again and why it
//! last failed. A row is claimed by a conditional UPDATE before it is posted, so gateways
//! sharing one PostgreSQL never post the same row at once; a claim whose process died runs
//! out and is taken again (a post that succeeded just before a crash can be repeated, never
//! lost). The gateway's notifier does the posting; nothing here blocks a call.

use serde::Serialize;
use toolgate_core::Timestamp;

use crate::db::args;
use crate::error::Result;
use crate::store::Store;

/// A pending request the notifier has to match to its webhooks.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RaisedRequest {
    pub approval_id: String,
    pub tool: String,
    pub rule: String,
    pub created_at: Timestamp,
}

/// One claimed delivery: post it, then record the outcome.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Delivery {
    pub approval_id: String,
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
        c.rows(
            "SELECT approval_id, tool, rule, created_at FROM approval_requests \
             WHERE status = 'pending' AND created_at >= $1 ORDER BY created_at",
            args![since.millis()],
        )
        .await?
        .iter()
        .map(|r| {
            Ok(RaisedRequest {
                approval_id: r.text("approval_id")?,
                tool: r.text("tool")?,
                rule: r.text("rule")?,
                created_at: Timestamp::from_millis(r.i64("created_at")?),
            })
        })
        .collect()
    }

    /// Puts a notification of `approval_id` to `destination` in the outbox, due now; false when
    /// it is there already (another gateway, or an earlier look, put it there).
    pub async fn enqueue_notification(
        &self,
        approval_id: &str,
        destination: &str,
        now: Timestamp,
    ) -> Result<bool> {
        let mut tx = self.inner.pool.begin().await?;
        let n = tx
            .exec(
                "INSERT INTO notify_outbox (approval_id, destination, state, attempts, next_at, \
                 created_at) VALUES ($1, $2, 'due', 0, $3, $3) \
                 ON CONFLICT (approval_id, destination) DO NOTHING",
                args![approval_id, destination, now.millis()],
            )
            .await?;
        tx.commit().await?;
        Ok(n == 1)
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
            c.rows(
                "SELECT approval_id, destination FROM notify_outbox \
                 WHERE (state = 'due' AND next_at <= $1) \
                    OR (state = 'sending' AND claimed_until <= $1) \
                 ORDER BY next_at LIMIT $2",
                args![now.millis(), limit],
            )
            .await?
            .iter()
            .map(|r| Ok((r.text("approval_id")?, r.text("destination")?)))
            .collect::<Result<Vec<_>>>()?
        };
        let mut out = Vec::new();
        for (approval_id, destination) in candidates {
            let mut tx = self.inner.pool.begin().await?;
            let row = tx
                .opt(
                    "UPDATE notify_outbox SET state = 'sending', claimed_until = $3, \
                     attempts = attempts + 1 \
                     WHERE approval_id = $1 AND destination = $2 \
                       AND ((state = 'due' AND next_at <= $4) \
                         OR (state = 'sending' AND claimed_until <= $4)) \
                     RETURNING attempts",
                    args![
                        &approval_id,
                        &destination,
                        now.millis() + lease_ms,
                        now.millis()
                    ],
                )
                .await?;
            tx.commit().await?;
            if let Some(r) = row {
                out.push(Delivery {
                    approval_id,
                    destination,
                    attempts: r.i64("attempts")?,
                });
            }
        }
        Ok(out)
    }

    /// Records that a claimed delivery was posted.
    pub async fn notification_sent(&self, d: &Delivery, now: Timestamp) -> Result<()> {
        let mut tx = self.inner.pool.begin().await?;
        tx.exec(
            "UPDATE notify_outbox SET state = 'sent', sent_at = $3, claimed_until = NULL \
             WHERE approval_id = $1 AND destination = $2 AND state = 'sending'",
            args![&d.approval_id, &d.destination, now.millis()],
        )
        .await?;
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
        match retry_at {
            Some(at) => {
                tx.exec(
                    "UPDATE notify_outbox SET state = 'due', next_at = $3, claimed_until = NULL, \
                     last_error = $4, last_error_at = $5 \
                     WHERE approval_id = $1 AND destination = $2 AND state = 'sending'",
                    args![
                        &d.approval_id,
                        &d.destination,
                        at.millis(),
                        &error,
                        now.millis()
                    ],
                )
                .await?
            }
            None => {
                tx.exec(
                    "UPDATE notify_outbox SET state = 'failed', claimed_until = NULL, \
                     last_error = $3, last_error_at = $4 \
                     WHERE approval_id = $1 AND destination = $2 AND state = 'sending'",
                    args![&d.approval_id, &d.destination, &error, now.millis()],
                )
                .await?
            }
        };
        tx.commit().await
    }

    /// Each webhook's deliveries, by name.
    pub async fn notify_summary(&self) -> Result<Vec<NotifySummary>> {
        let mut c = self.inner.pool.conn().await?;
        let mut out: Vec<NotifySummary> = Vec::new();
        for r in c
            .rows(
                "SELECT destination, state, \
                 CAST(CASE WHEN last_error IS NULL THEN 0 ELSE 1 END AS BIGINT) AS erred, COUNT(*) AS n \
                 FROM notify_outbox GROUP BY destination, state, erred ORDER BY destination",
                args![],
            )
            .await?
        {
            let dest = r.text("destination")?;
            if out.last().is_none_or(|s| s.destination != dest) {
                out.push(NotifySummary {
                    destination: dest,
                    ..NotifySummary::default()
                });
            }
            let s = out.last_mut().expect("pushed above");
            let n = r.i64("n")?;
            match (r.text("state")?.as_str(), r.i64("erred")? == 1) {
                ("sent", _) => s.sent += n,
                ("failed", _) => s.failed += n,
                (_, true) => s.retrying += n,
                (_, false) => s.waiting += n,
            }
        }
        for s in &mut out {
            if let Some(r) = c
                .opt(
                    "SELECT last_error, last_error_at FROM notify_outbox \
                     WHERE destination = $1 AND last_error_at IS NOT NULL \
                     ORDER BY last_error_at DESC LIMIT 1",
                    args![&s.destination],
                )
                .await?
            {
                s.last_error = r.opt_text("last_error")?;
                s.last_error_at = r.opt_i64("last_error_at")?.map(Timestamp::from_millis);
            }
        }
        Ok(out)
    }
}
