//! Reads for figures kept incrementally (the console's `/metrics`): the audit records after a
//! sequence number, one page at a time, and the approval requests counted per gate and status
//! by the database. Neither reads the whole log, so a scrape costs what was appended since the
//! last one, not the length of the chain.
//!
//! Appends are serialised on the chain-head row, so a record is visible only after every record
//! before it: reading "after the last seq folded in" never skips one that commits late.

use crate::audit::AuditRecord;
use crate::db::args;
use crate::error::{Result, StoreError};
use crate::model::ApprovalStatus;
use crate::store::Store;
use toolgate_core::Timestamp;

/// Approval requests of one gate (tool and rule) in one status, with what tells a person's
/// decision from the others (a reviewer's closure, a request consumed without the people it
/// needed, an approval that never ran): the console's report and `/metrics` classify them
/// with the same function.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GateCount {
    pub tool: String,
    pub rule: String,
    pub status: ApprovalStatus,
    /// As many people approved as the request needed.
    pub by_people: bool,
    /// A person is named as having decided it (`decided_by`): rejections by people.
    pub decided_by_person: bool,
    /// At least one person approved it.
    pub any_grant: bool,
    /// Its expiry had passed when counted.
    pub lapsed: bool,
    /// The planned step it parks was refused (decided again when it ran).
    pub step_refused: bool,
    pub requests: i64,
    /// Of those, requests a person decided (approved, or rejected) with `decided_at` kept.
    pub decided: i64,
    /// The sum of their ages at decision, in milliseconds.
    pub age_ms_sum: i64,
}

impl Store {
    /// Up to `limit` audit records with `seq > after`, in chain order.
    pub async fn audit_after(&self, after: i64, limit: u32) -> Result<Vec<AuditRecord>> {
        let mut c = self.inner.pool.conn().await?;
        let rows = c
            .rows(
                "SELECT seq, record FROM audit WHERE seq > $1 ORDER BY seq LIMIT $2",
                args![after, i64::from(limit)],
            )
            .await?;
        rows.iter()
            .map(|r| {
                let (seq, text) = (r.i64("seq")?, r.text("record")?);
                let record: AuditRecord = serde_json::from_str(&text)
                    .map_err(|e| StoreError::Corrupt(format!("audit record {seq}: {e}")))?;
                // Selected by the column: it must say what the hashed record says.
                if record.seq != seq {
                    return Err(StoreError::Corrupt(format!(
                        "audit row {seq} holds record {}: run `toolgate log verify`",
                        record.seq
                    )));
                }
                Ok(record)
            })
            .collect()
    }

    /// The approval requests counted per tool, rule, status and what tells their outcome
    /// apart (see [`GateCount`]), with their ages at decision; `now` decides which have lapsed.
    pub async fn gate_counts(&self, now: Timestamp) -> Result<Vec<GateCount>> {
        let mut c = self.inner.pool.conn().await?;
        let rows = c
            .rows(
                "SELECT a.tool AS tool, a.rule AS rule, a.status AS status, \
                 CAST(CASE WHEN COALESCE(g.n, 0) >= a.approvers_needed AND COALESCE(g.n, 0) > 0 \
                      THEN 1 ELSE 0 END AS BIGINT) AS by_people, \
                 CAST(CASE WHEN a.decided_by IS NULL THEN 0 ELSE 1 END AS BIGINT) AS by_person, \
                 CAST(CASE WHEN COALESCE(g.n, 0) > 0 THEN 1 ELSE 0 END AS BIGINT) AS any_grant, \
                 CAST(CASE WHEN a.expires_at <= $1 THEN 1 ELSE 0 END AS BIGINT) AS lapsed, \
                 CAST(CASE WHEN s.status = 'refused' THEN 1 ELSE 0 END AS BIGINT) AS step_refused, \
                 COUNT(*) AS requests, COUNT(a.decided_at) AS decided, \
                 CAST(COALESCE(SUM(a.decided_at - a.created_at), 0) AS BIGINT) AS age_ms_sum \
                 FROM approval_requests a \
                 LEFT JOIN (SELECT approval_id, COUNT(*) AS n FROM approval_grants \
                            GROUP BY approval_id) g ON g.approval_id = a.approval_id \
                 LEFT JOIN steps s ON s.step_id = a.subject \
                 GROUP BY a.tool, a.rule, a.status, 4, 5, 6, 7, 8 \
                 ORDER BY a.tool, a.rule, a.status",
                args![now.millis()],
            )
            .await?;
        rows.iter()
            .map(|r| {
                let status = r.text("status")?;
                Ok(GateCount {
                    tool: r.text("tool")?,
                    rule: r.text("rule")?,
                    status: ApprovalStatus::parse(&status).ok_or_else(|| {
                        StoreError::Corrupt(format!("approval status '{status}'"))
                    })?,
                    by_people: r.i64("by_people")? != 0,
                    decided_by_person: r.i64("by_person")? != 0,
                    any_grant: r.i64("any_grant")? != 0,
                    lapsed: r.i64("lapsed")? != 0,
                    step_refused: r.i64("step_refused")? != 0,
                    requests: r.i64("requests")?,
                    decided: r.i64("decided")?,
                    age_ms_sum: r.i64("age_ms_sum")?,
                })
            })
            .collect()
    }

    /// People's decisions counted per person: approvals given (grants) and requests rejected
    /// (`decided_by`), for `/metrics`' per-approver series.
    pub async fn decisions_per_approver(&self) -> Result<Vec<(String, i64, i64)>> {
        let mut c = self.inner.pool.conn().await?;
        let mut out: std::collections::BTreeMap<String, (i64, i64)> = Default::default();
        for r in c
            .rows(
                "SELECT approver, COUNT(*) AS n FROM approval_grants GROUP BY approver",
                args![],
            )
            .await?
        {
            out.entry(r.text("approver")?).or_default().0 += r.i64("n")?;
        }
        for r in c
            .rows(
                "SELECT decided_by, COUNT(*) AS n FROM approval_requests \
                 WHERE status = 'rejected' AND decided_by IS NOT NULL GROUP BY decided_by",
                args![],
            )
            .await?
        {
            out.entry(r.text("decided_by")?).or_default().1 += r.i64("n")?;
        }
        Ok(out.into_iter().map(|(p, (a, r))| (p, a, r)).collect())
    }
}
