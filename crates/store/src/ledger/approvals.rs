//! The approval ledger as the call path uses it: the grants people gave for a subject, the
//! request a gated call opens (or reuses), a person's rejection of the same call, and the
//! consumption of approvals when the call starts. Statuses are bound from
//! [`ApprovalStatus`], never spelled in business code.

use serde_json::Value;
use toolgate_core::{ApprovalToken, InputHash, Timestamp, canonical};

use crate::db::{Tx, args};
use crate::error::Result;
use crate::model::ApprovalStatus;
use crate::store::{new_id, to_json};

const PENDING: &str = ApprovalStatus::Pending.as_str();
const APPROVED: &str = ApprovalStatus::Approved.as_str();

/// The tokens people granted for `subject` on requests still open, oldest first.
pub(crate) async fn granted(tx: &mut Tx, subject: &str) -> Result<Vec<ApprovalToken>> {
    tx.rows(
        "SELECT g.token FROM approval_grants g JOIN approval_requests r \
         ON r.approval_id = g.approval_id \
         WHERE r.subject = $1 AND r.status IN ($2, $3) ORDER BY g.granted_at",
        args![subject, PENDING, APPROVED],
    )
    .await?
    .iter()
    .map(|r| Ok(ApprovalToken::from_wire(r.text("token")?)))
    .collect()
}

/// A request for people's approval of one exact call.
pub(crate) struct NewRequest<'a> {
    pub subject: &'a str,
    pub run_id: &'a str,
    pub principal: &'a str,
    pub tool: &'a str,
    pub tool_version: &'a str,
    pub input_hash: &'a InputHash,
    pub inputs: &'a Value,
    pub reason: Option<&'a str>,
    pub evidence: &'a [String],
    pub rule: &'a str,
    pub approvers_needed: i64,
    pub expires_at: Timestamp,
    pub definition_hash: Option<&'a str>,
    pub registry_version: &'a str,
}

/// The id of the pending request for this exact call: the one already open, or a new one.
/// Requests for the subject that lapsed are closed first.
pub(crate) async fn open_request(tx: &mut Tx, r: NewRequest<'_>, now: Timestamp) -> Result<String> {
    tx.exec(
        "UPDATE approval_requests SET status = $3, decided_at = $1 \
         WHERE subject = $2 AND status IN ($4, $5) AND expires_at <= $1",
        args![
            now.millis(),
            r.subject,
            ApprovalStatus::Expired.as_str(),
            PENDING,
            APPROVED
        ],
    )
    .await?;
    if let Some(open) = tx
        .opt(
            "SELECT approval_id FROM approval_requests WHERE subject = $1 \
             AND input_hash = $2 AND status = $3",
            args![r.subject, r.input_hash.as_str(), PENDING],
        )
        .await?
    {
        return open.text("approval_id");
    }
    let id = new_id();
    tx.exec(
        "INSERT INTO approval_requests (approval_id, subject, run_id, principal, \
         tool, tool_version, input_hash, inputs, reason, evidence, rule, \
         approvers_needed, status, created_at, expires_at, definition_hash, \
         registry_version) \
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16, $17)",
        args![
            &id,
            r.subject,
            r.run_id,
            r.principal,
            r.tool,
            r.tool_version,
            r.input_hash.as_str(),
            canonical(r.inputs),
            r.reason,
            to_json(&r.evidence),
            r.rule,
            r.approvers_needed,
            PENDING,
            now.millis(),
            r.expires_at.millis(),
            r.definition_hash,
            r.registry_version
        ],
    )
    .await?;
    Ok(id)
}

/// A person's latest rejection of this exact call decided after `since` (ms).
pub(crate) struct Rejection {
    pub approval_id: String,
    pub decided_by: Option<String>,
    pub note: Option<String>,
    pub decided_at: Option<Timestamp>,
}

pub(crate) async fn rejection(
    tx: &mut Tx,
    subject: &str,
    input_hash: &InputHash,
    since: i64,
) -> Result<Option<Rejection>> {
    let Some(r) = tx
        .opt(
            "SELECT approval_id, decided_by, note, decided_at FROM approval_requests \
             WHERE subject = $1 AND input_hash = $2 AND status = $4 AND decided_at > $3 \
             ORDER BY decided_at DESC LIMIT 1",
            args![
                subject,
                input_hash.as_str(),
                since,
                ApprovalStatus::Rejected.as_str()
            ],
        )
        .await?
    else {
        return Ok(None);
    };
    Ok(Some(Rejection {
        approval_id: r.text("approval_id")?,
        decided_by: r.opt_text("decided_by")?,
        note: r.opt_text("note")?,
        decided_at: r.opt_i64("decided_at")?.map(Timestamp::from_millis),
    }))
}
