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
use toolgate_core::{Rule, Timestamp};

/// Approval requests of one gate (tool and rule) in one status, with what tells a person's
/// decision from the others (a reviewer's closure, a request consumed without the people it
/// needed, an approval that never ran): the console's report and `/metrics` classify them
/// with the same function.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GateCount {
    pub tool: String,
    pub rule: Rule,
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

    /// The approval requests counted per tool, rule, status and what tells their outcome
    /// apart (see [`GateCount`]), with their ages at decision; `now` decides which have lapsed.
    pub async fn gate_counts(&self, now: Timestamp) -> Result<Vec<GateCount>> {
        let mut c = self.inner.pool.conn().await?;
        approvals::counts_by_gate(&mut c, now).await
    }

    /// People's decisions counted per person: approvals given (grants) and requests rejected
    /// (`decided_by`), for `/metrics`' per-approver series.
    pub async fn decisions_per_approver(&self) -> Result<Vec<(String, i64, i64)>> {
        let mut c = self.inner.pool.conn().await?;
        approvals::decisions_per_person(&mut c).await
    }
}
