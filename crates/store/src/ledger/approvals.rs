//! The approval ledger: the requests gated calls open (or reuse), the grants people give and
//! the tokens issued with them, rejections, expiry, and the requests as the approval page
//! lists them. Statuses are bound from [`ApprovalStatus`], never spelled in business code.

use std::collections::HashSet;

use serde_json::Value;
use toolgate_core::{
    ApprovalId, ApprovalToken, InputHash, PrincipalId, Rule, RunId, Timestamp, canonical,
};

use crate::db::{Row, Sql, Tx, args};
use crate::error::{Result, StoreError};
use crate::model::{ApprovalDecision, ApprovalRequest, ApprovalStatus};
use crate::store::{new_id, to_json};
use crate::tail::GateCount;

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

/// Which of `nonces` (of the tokens a call presents) were consumed already: an approval is
/// single-use.
pub(crate) async fn used_nonces(tx: &mut Tx, nonces: &[String]) -> Result<HashSet<String>> {
    let mut used = HashSet::new();
    for n in nonces {
        if tx
            .opt(
                "SELECT nonce FROM consumed_nonces WHERE nonce = $1",
                args![n],
            )
            .await?
            .is_some()
        {
            used.insert(n.clone());
        }
    }
    Ok(used)
}

/// Spends an approval's single-use `nonce` for `subject`: false when another call spent it
/// first.
pub(crate) async fn consume_nonce(
    tx: &mut Tx,
    nonce: &str,
    subject: &str,
    now: Timestamp,
) -> Result<bool> {
    let fresh = tx
        .exec(
            "INSERT INTO consumed_nonces (nonce, subject, consumed_at) VALUES ($1, $2, $3) \
             ON CONFLICT (nonce) DO NOTHING",
            args![nonce, subject, now.millis()],
        )
        .await?;
    Ok(fresh > 0)
}

/// The approved or pending requests for `subject` are consumed: the call they gate starts.
pub(crate) async fn mark_consumed(tx: &mut Tx, subject: &str, now: Timestamp) -> Result<()> {
    tx.exec(
        "UPDATE approval_requests SET status = $1, decided_at = COALESCE(decided_at, $2) \
         WHERE subject = $3 AND status IN ($4, $5)",
        args![
            ApprovalStatus::Consumed.as_str(),
            now.millis(),
            subject,
            APPROVED,
            PENDING
        ],
    )
    .await?;
    Ok(())
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

/// The columns an [`ApprovalRequest`] is read from.
macro_rules! request_cols {
    () => {
        "approval_id, subject, run_id, principal, tool, tool_version, input_hash, inputs, \
         reason, evidence, rule, approvers_needed, status, created_at, expires_at, decided_at, \
         decided_by"
    };
}

/// A stored approval status: one the store writes, or [`StoreError::UnknownValue`].
fn read_status(status: &str) -> Result<ApprovalStatus> {
    ApprovalStatus::parse(status).ok_or_else(|| StoreError::UnknownValue {
        what: "approval status",
        value: status.to_string(),
    })
}

fn request_from_row(r: &Row, approved_by: Vec<String>) -> Result<ApprovalRequest> {
    let status = r.text("status")?;
    Ok(ApprovalRequest {
        approval_id: ApprovalId::new(r.text("approval_id")?),
        subject: r.text("subject")?,
        run_id: r.opt_text("run_id")?.map(RunId::new),
        principal: PrincipalId::new(r.text("principal")?),
        tool: r.text("tool")?,
        tool_version: r.text("tool_version")?,
        input_hash: InputHash::from_stored(r.text("input_hash")?),
        inputs: stored_json("inputs", &r.text("inputs")?)?,
        reason: r.opt_text("reason")?,
        evidence: serde_json::from_value(stored_json("evidence", &r.text("evidence")?)?)
            .unwrap_or_default(),
        rule: Rule::new(r.text("rule")?),
        approvers_needed: r.i64("approvers_needed")?,
        approved_by: approved_by.into_iter().map(PrincipalId::new).collect(),
        status: read_status(&status)?,
        created_at: Timestamp::from_millis(r.i64("created_at")?),
        expires_at: Timestamp::from_millis(r.i64("expires_at")?),
        decided_at: r.opt_i64("decided_at")?.map(Timestamp::from_millis),
        decided_by: r.opt_text("decided_by")?.map(PrincipalId::new),
    })
}

fn stored_json(column: &str, text: &str) -> Result<Value> {
    serde_json::from_str(text).map_err(|source| StoreError::Unparsable {
        what: format!("stored JSON ({column})"),
        source,
    })
}

/// Approval requests with who approved each so far, newest first; `status` filters.
pub(crate) async fn list(
    c: &mut impl Sql,
    status: Option<ApprovalStatus>,
) -> Result<Vec<ApprovalRequest>> {
    let rows = match status {
        Some(s) => {
            c.rows(
                concat!(
                    "SELECT ",
                    request_cols!(),
                    " FROM approval_requests WHERE status = $1 ORDER BY created_at DESC"
                ),
                args![s.as_str()],
            )
            .await?
        }
        None => {
            c.rows(
                concat!(
                    "SELECT ",
                    request_cols!(),
                    " FROM approval_requests ORDER BY created_at DESC"
                ),
                args![],
            )
            .await?
        }
    };
    let mut out = Vec::with_capacity(rows.len());
    for r in &rows {
        let by = approvers(c, &r.text("approval_id")?).await?;
        out.push(request_from_row(r, by)?);
    }
    Ok(out)
}

/// The request `approval_id` with who approved it so far, if there is one.
pub(crate) async fn by_id(c: &mut impl Sql, approval_id: &str) -> Result<Option<ApprovalRequest>> {
    let Some(row) = c
        .opt(
            concat!(
                "SELECT ",
                request_cols!(),
                " FROM approval_requests WHERE approval_id = $1"
            ),
            args![approval_id],
        )
        .await?
    else {
        return Ok(None);
    };
    let by = approvers(c, approval_id).await?;
    request_from_row(&row, by).map(Some)
}

/// Who approved the request `approval_id`, in the order they did.
pub(crate) async fn approvers(c: &mut impl Sql, approval_id: &str) -> Result<Vec<String>> {
    c.rows(
        "SELECT approver FROM approval_grants WHERE approval_id = $1 ORDER BY granted_at",
        args![approval_id],
    )
    .await?
    .iter()
    .map(|g| g.text("approver"))
    .collect()
}

/// Every approval people gave, oldest first.
pub(crate) async fn grants(c: &mut impl Sql) -> Result<Vec<ApprovalDecision>> {
    c.rows(
        "SELECT approval_id, approver, granted_at FROM approval_grants ORDER BY granted_at",
        args![],
    )
    .await?
    .iter()
    .map(|r| {
        Ok(ApprovalDecision {
            approval_id: ApprovalId::new(r.text("approval_id")?),
            approver: PrincipalId::new(r.text("approver")?),
            at: Timestamp::from_millis(r.i64("granted_at")?),
            approved: true,
        })
    })
    .collect()
}

/// Every rejection by a person (a reviewer's closure of a request names nobody).
pub(crate) async fn rejections(c: &mut impl Sql) -> Result<Vec<ApprovalDecision>> {
    c.rows(
        "SELECT approval_id, decided_by, decided_at FROM approval_requests \
         WHERE status = $1 AND decided_by IS NOT NULL AND decided_at IS NOT NULL",
        args![ApprovalStatus::Rejected.as_str()],
    )
    .await?
    .iter()
    .map(|r| {
        Ok(ApprovalDecision {
            approval_id: ApprovalId::new(r.text("approval_id")?),
            approver: PrincipalId::new(r.text("decided_by")?),
            at: Timestamp::from_millis(r.i64("decided_at")?),
            approved: false,
        })
    })
    .collect()
}

/// `approver` rejects the pending request `approval_id` with `note`; whether it was pending.
pub(crate) async fn reject(
    tx: &mut Tx,
    approval_id: &str,
    approver: &str,
    note: &str,
    now: Timestamp,
) -> Result<bool> {
    let n = tx
        .exec(
            "UPDATE approval_requests SET status = $5, decided_at = $1, decided_by = $3, \
             note = $4 WHERE approval_id = $2 AND status = $6",
            args![
                now.millis(),
                approval_id,
                approver,
                note,
                ApprovalStatus::Rejected.as_str(),
                PENDING
            ],
        )
        .await?;
    Ok(n > 0)
}

/// Closes the pending request for `subject` as rejected, by no person (a reviewer rejected the
/// step it parks).
pub(crate) async fn close_pending(tx: &mut Tx, subject: &str, now: Timestamp) -> Result<()> {
    tx.exec(
        "UPDATE approval_requests SET status = $3, decided_at = $1 \
         WHERE subject = $2 AND status = $4",
        args![
            now.millis(),
            subject,
            ApprovalStatus::Rejected.as_str(),
            PENDING
        ],
    )
    .await?;
    Ok(())
}

/// Marks open requests past their expiry at `now` as expired; how many.
pub(crate) async fn expire_lapsed(tx: &mut Tx, now: Timestamp) -> Result<u64> {
    tx.exec(
        "UPDATE approval_requests SET status = $2, decided_at = $1 \
         WHERE status IN ($3, $4) AND expires_at <= $1",
        args![
            now.millis(),
            ApprovalStatus::Expired.as_str(),
            PENDING,
            APPROVED
        ],
    )
    .await
}

/// Marks the request `approval_id` expired.
pub(crate) async fn expire(tx: &mut Tx, approval_id: &str, now: Timestamp) -> Result<()> {
    tx.exec(
        "UPDATE approval_requests SET status = $3, decided_at = $1 WHERE approval_id = $2",
        args![now.millis(), approval_id, ApprovalStatus::Expired.as_str()],
    )
    .await?;
    Ok(())
}

/// What granting a request is decided on: the call it parks, the gate and its state.
pub(crate) struct GateRequest {
    pub subject: String,
    pub principal: String,
    pub tool: String,
    pub tool_version: String,
    pub input_hash: String,
    pub status: ApprovalStatus,
    pub expires_at: i64,
    pub approvers_needed: i64,
    pub rule: Rule,
    pub definition_hash: Option<String>,
    pub registry_version: Option<String>,
}

/// The request `approval_id` as a grant reads it, if there is one.
pub(crate) async fn gate_request(tx: &mut Tx, approval_id: &str) -> Result<Option<GateRequest>> {
    tx.opt(
        "SELECT subject, tool, tool_version, input_hash, status, expires_at, approvers_needed, \
         definition_hash, rule, registry_version, principal FROM approval_requests \
         WHERE approval_id = $1",
        args![approval_id],
    )
    .await?
    .map(|r| {
        Ok(GateRequest {
            subject: r.text("subject")?,
            principal: r.text("principal")?,
            tool: r.text("tool")?,
            tool_version: r.text("tool_version")?,
            input_hash: r.text("input_hash")?,
            status: read_status(&r.text("status")?)?,
            expires_at: r.i64("expires_at")?,
            approvers_needed: r.i64("approvers_needed")?,
            rule: Rule::new(r.text("rule")?),
            definition_hash: r.opt_text("definition_hash")?,
            registry_version: r.opt_text("registry_version")?,
        })
    })
    .transpose()
}

/// Records `approver`'s grant of `approval_id` with the token issued for it; false when this
/// approver already granted it.
pub(crate) async fn add_grant(
    tx: &mut Tx,
    approval_id: &str,
    approver: &str,
    token: &ApprovalToken,
    nonce: &str,
    now: Timestamp,
) -> Result<bool> {
    let inserted = tx
        .exec(
            "INSERT INTO approval_grants (approval_id, approver, token, fingerprint, nonce, \
             granted_at) VALUES ($1, $2, $3, $4, $5, $6) \
             ON CONFLICT (approval_id, approver) DO NOTHING",
            args![
                approval_id,
                approver,
                token.as_str(),
                token.fingerprint(),
                nonce,
                now.millis()
            ],
        )
        .await?;
    Ok(inserted > 0)
}

/// How many people granted `approval_id`.
pub(crate) async fn grant_count(tx: &mut Tx, approval_id: &str) -> Result<i64> {
    Ok(tx
        .opt(
            "SELECT COUNT(*) AS n FROM approval_grants WHERE approval_id = $1",
            args![approval_id],
        )
        .await?
        .map(|r| r.i64("n"))
        .transpose()?
        .unwrap_or(0))
}

/// Marks `approval_id` approved (enough people granted it).
pub(crate) async fn mark_approved(tx: &mut Tx, approval_id: &str, now: Timestamp) -> Result<()> {
    tx.exec(
        "UPDATE approval_requests SET status = $3, decided_at = $1 WHERE approval_id = $2",
        args![now.millis(), approval_id, APPROVED],
    )
    .await?;
    Ok(())
}

/// The approval requests counted per tool, rule, status and what tells their outcome apart
/// (see [`GateCount`]), with their ages at decision; `now` decides which have lapsed.
pub(crate) async fn counts_by_gate(c: &mut impl Sql, now: Timestamp) -> Result<Vec<GateCount>> {
    c.rows(
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
    .await?
    .iter()
    .map(|r| {
        let status = r.text("status")?;
        Ok(GateCount {
            tool: r.text("tool")?,
            rule: Rule::new(r.text("rule")?),
            status: read_status(&status)?,
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
/// (`decided_by`), as (person, approvals, rejections), by name.
pub(crate) async fn decisions_per_person(c: &mut impl Sql) -> Result<Vec<(String, i64, i64)>> {
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
