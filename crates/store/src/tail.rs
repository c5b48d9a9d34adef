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

/// Approval requests of one gate (tool and rule) in one status.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GateCount {
    pub tool: String,
    pub rule: String,
    pub status: ApprovalStatus,
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
                let record = crate::store::audit_record(seq, &text)?;
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

    /// The approval requests counted per tool, rule and status, with their ages at decision.
    pub async fn gate_counts(&self) -> Result<Vec<GateCount>> {
        let mut c = self.inner.pool.conn().await?;
        let rows = c
            .rows(
                "SELECT tool, rule, status, COUNT(*) AS requests, COUNT(decided_at) AS decided, \
                 CAST(COALESCE(SUM(decided_at - created_at), 0) AS BIGINT) AS age_ms_sum \
                 FROM approval_requests GROUP BY tool, rule, status ORDER BY tool, rule, status",
                args![],
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
                    requests: r.i64("requests")?,
                    decided: r.i64("decided")?,
                    age_ms_sum: r.i64("age_ms_sum")?,
                })
            })
            .collect()
    }
}
