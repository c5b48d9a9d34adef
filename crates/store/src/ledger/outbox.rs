//! The notification outbox: one row per (approval request, webhook), with its state, attempts,
//! when it is due and why it last failed. A row is claimed by a conditional `UPDATE` before it
//! is posted, so processes sharing a database never post it at once.
//!
//! The claim's candidates are read with the states spelled in the statement: the partial index
//! `notify_outbox_due` is matched against the query's text. Everywhere else the state is bound
//! from [`OutboxState`].

use toolgate_core::{ApprovalId, Rule, Timestamp};

use crate::db::{Sql, Tx, args};
use crate::error::{Result, StoreError};
use crate::notify::{Delivery, RaisedRequest};

/// Where one delivery stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum OutboxState {
    /// Waiting for its (next) attempt at `next_at`.
    Due,
    /// Claimed by a process until `claimed_until`.
    Sending,
    Sent,
    /// Given up on after its last attempt.
    Failed,
}

impl OutboxState {
    pub(crate) const fn as_str(self) -> &'static str {
        match self {
            OutboxState::Due => "due",
            OutboxState::Sending => "sending",
            OutboxState::Sent => "sent",
            OutboxState::Failed => "failed",
        }
    }

    fn parse(s: &str) -> Result<Self> {
        Ok(match s {
            "due" => OutboxState::Due,
            "sending" => OutboxState::Sending,
            "sent" => OutboxState::Sent,
            "failed" => OutboxState::Failed,
            other => {
                return Err(StoreError::UnknownValue {
                    what: "notification state",
                    value: other.to_string(),
                });
            }
        })
    }
}

const SENDING: &str = OutboxState::Sending.as_str();

/// Pending approval requests raised at or after `since`, oldest first. (`pending` is spelled
/// in the statement for the partial index `approval_requests_open`.)
pub(crate) async fn raised_since(c: &mut impl Sql, since: Timestamp) -> Result<Vec<RaisedRequest>> {
    c.rows(
        "SELECT approval_id, tool, rule, created_at FROM approval_requests \
         WHERE status = 'pending' AND created_at >= $1 ORDER BY created_at",
        args![since.millis()],
    )
    .await?
    .iter()
    .map(|r| {
        Ok(RaisedRequest {
            approval_id: ApprovalId::new(r.text("approval_id")?),
            tool: r.text("tool")?,
            rule: Rule::new(r.text("rule")?),
            created_at: Timestamp::from_millis(r.i64("created_at")?),
        })
    })
    .collect()
}

/// Puts a delivery of `approval_id` to `destination` in the outbox, due at `now`; false when it
/// is there already.
pub(crate) async fn enqueue(
    tx: &mut Tx,
    approval_id: &ApprovalId,
    destination: &str,
    now: Timestamp,
) -> Result<bool> {
    let n = tx
        .exec(
            "INSERT INTO notify_outbox (approval_id, destination, state, attempts, next_at, \
             created_at) VALUES ($1, $2, $4, 0, $3, $3) \
             ON CONFLICT (approval_id, destination) DO NOTHING",
            args![
                approval_id.as_str(),
                destination,
                now.millis(),
                OutboxState::Due.as_str()
            ],
        )
        .await?;
    Ok(n == 1)
}

/// Up to `limit` (approval id, destination) pairs due at `now` or whose claim ran out, by when
/// they fell due.
pub(crate) async fn due(
    c: &mut impl Sql,
    now: Timestamp,
    limit: i64,
) -> Result<Vec<(ApprovalId, String)>> {
    c.rows(
        "SELECT approval_id, destination FROM notify_outbox \
         WHERE (state = 'due' AND next_at <= $1) \
            OR (state = 'sending' AND claimed_until <= $1) \
         ORDER BY next_at LIMIT $2",
        args![now.millis(), limit],
    )
    .await?
    .iter()
    .map(|r| {
        Ok((
            ApprovalId::new(r.text("approval_id")?),
            r.text("destination")?,
        ))
    })
    .collect()
}

/// Claims one delivery until `until` if it is still due at `now` (or its claim ran out): its
/// attempts so far, this one included; `None` when another process claimed it first.
pub(crate) async fn claim(
    tx: &mut Tx,
    approval_id: &ApprovalId,
    destination: &str,
    now: Timestamp,
    until: i64,
) -> Result<Option<i64>> {
    tx.opt(
        "UPDATE notify_outbox SET state = $5, claimed_until = $3, attempts = attempts + 1 \
         WHERE approval_id = $1 AND destination = $2 \
           AND ((state = $6 AND next_at <= $4) OR (state = $5 AND claimed_until <= $4)) \
         RETURNING attempts",
        args![
            approval_id.as_str(),
            destination,
            until,
            now.millis(),
            SENDING,
            OutboxState::Due.as_str()
        ],
    )
    .await?
    .map(|r| r.i64("attempts"))
    .transpose()
}

/// A claimed delivery was posted at `now`.
pub(crate) async fn sent(tx: &mut Tx, d: &Delivery, now: Timestamp) -> Result<()> {
    tx.exec(
        "UPDATE notify_outbox SET state = $4, sent_at = $3, claimed_until = NULL \
         WHERE approval_id = $1 AND destination = $2 AND state = $5",
        args![
            d.approval_id.as_str(),
            &d.destination,
            now.millis(),
            OutboxState::Sent.as_str(),
            SENDING
        ],
    )
    .await?;
    Ok(())
}

/// A claimed delivery failed with `error` at `now`: due again at `retry_at`, or failed for
/// good when that is `None`.
pub(crate) async fn failed(
    tx: &mut Tx,
    d: &Delivery,
    now: Timestamp,
    error: &str,
    retry_at: Option<Timestamp>,
) -> Result<()> {
    let (state, next_at) = match retry_at {
        Some(at) => (OutboxState::Due, Some(at.millis())),
        None => (OutboxState::Failed, None),
    };
    tx.exec(
        "UPDATE notify_outbox SET state = $3, next_at = COALESCE($4, next_at), \
         claimed_until = NULL, last_error = $5, last_error_at = $6 \
         WHERE approval_id = $1 AND destination = $2 AND state = $7",
        args![
            d.approval_id.as_str(),
            &d.destination,
            state.as_str(),
            next_at,
            error,
            now.millis(),
            SENDING
        ],
    )
    .await?;
    Ok(())
}

/// How many deliveries of one webhook are in one state, and whether they erred before.
pub(crate) struct StateCount {
    pub destination: String,
    pub state: OutboxState,
    pub erred: bool,
    pub n: i64,
}

/// The deliveries of every webhook, counted by state and by whether they erred, by webhook.
pub(crate) async fn counts(c: &mut impl Sql) -> Result<Vec<StateCount>> {
    c.rows(
        "SELECT destination, state, \
         CAST(CASE WHEN last_error IS NULL THEN 0 ELSE 1 END AS BIGINT) AS erred, COUNT(*) AS n \
         FROM notify_outbox GROUP BY destination, state, erred ORDER BY destination",
        args![],
    )
    .await?
    .iter()
    .map(|r| {
        Ok(StateCount {
            destination: r.text("destination")?,
            state: OutboxState::parse(&r.text("state")?)?,
            erred: r.i64("erred")? == 1,
            n: r.i64("n")?,
        })
    })
    .collect()
}

/// The last error of a delivery to `destination`, and when.
pub(crate) async fn last_error(
    c: &mut impl Sql,
    destination: &str,
) -> Result<Option<(Option<String>, Option<Timestamp>)>> {
    c.opt(
        "SELECT last_error, last_error_at FROM notify_outbox \
         WHERE destination = $1 AND last_error_at IS NOT NULL \
         ORDER BY last_error_at DESC LIMIT 1",
        args![destination],
    )
    .await?
    .map(|r| {
        Ok((
            r.opt_text("last_error")?,
            r.opt_i64("last_error_at")?.map(Timestamp::from_millis),
        ))
    })
    .transpose()
}
