//! Reads for figures kept incrementally (the console's `/metrics`): the audit records after a
//! sequence number, one page at a time, and the approval requests counted per gate and status
//! by the database. Neither reads the whole log, so a scrape costs what was appended since the
//! last one, not the length of the chain.
//!
//! Appends are serialised on the chain-head row, so a record is visible only after every record
//! before it: reading "after the last seq folded in" never skips one that commits late.

use crate::audit::{self, AuditRecord};
use crate::error::{Result, StoreError};
use crate::ledger::approvals;
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
        audit::stored_after(&mut c, after, limit)
            .await?
            .iter()
            .map(|s| {
                let record = crate::store::audit_record(s.seq, &s.text)?;
                // Selected by the column: it must say what the hashed record says.
                if record.seq != s.seq {
                    return Err(StoreError::Corrupt(format!(
                        "audit row {} holds record {}: run `toolgate log verify`",
                        s.seq, record.seq
                    )));
                }
                Ok(record)
            })
            .collect()
    }

    /// The approval requests counted per tool, rule and status, with their ages at decision.
    pub async fn gate_counts(&self) -> Result<Vec<GateCount>> {
        let mut c = self.inner.pool.conn().await?;
        approvals::counts_by_gate(&mut c).await
    }
}
