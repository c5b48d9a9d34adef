//! The audit chain: one record per decided call attempt, allowed or refused. Each record holds
//! `prev`, the hash of the previous record's canonical JSON, so any edit, insertion or deletion
//! breaks a link that [`verify_chain`](crate::Store::verify_chain) names by sequence number.
//! The database refuses UPDATE and DELETE on the table (triggers); appends are serialised on a
//! single chain-head row so many processes still write one chain.

use serde::{Deserialize, Serialize};
use serde_json::Value;
use toolgate_core::canon::sha256_tagged;
use toolgate_core::{Check, Effect, ShadowRule, StepStatus, Tier, Timestamp, canonical};

use crate::db::{Tx, args};
use crate::error::{Result, StoreError};
use crate::model::Actor;

/// The `prev` of the first record.
pub const GENESIS: &str = "genesis";

/// Who acted.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct AuditWho {
    pub principal: String,
    pub role: String,
    #[serde(flatten)]
    pub actor: Actor,
}

/// Why it was decided as it was.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct AuditWhy {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub purpose: Option<String>,
    /// The model's (or planner's) reason.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub evidence: Vec<String>,
    pub decision: AuditDecision,
    /// The deciding rule, when a rule decided.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rule: Option<String>,
    /// Every check of the decision, passed or failed.
    #[serde(default)]
    pub checks: Vec<Check>,
    /// Shadow rules that would have refused or gated the call; they did not decide it.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub shadow: Vec<ShadowRule>,
}

/// What kind of event the record is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum AuditDecision {
    /// Allowed and sent to the handler.
    Allow,
    Deny,
    NeedsApproval,
    /// Allowed, and the stored outcome was replayed: nothing ran.
    Replay,
    /// `toolgate serve` loaded its registry folder again: applied (outcome done), or refused
    /// because it failed validation (outcome refused; the old version kept serving).
    Reload,
    /// A worker died mid-call; the step was settled by recovery.
    Recovery,
    /// An `unknown` step settled by asking the target by key.
    Reconcile,
    /// The compensating call of an aborted run.
    Compensation,
    /// A person rejected a parked call.
    Rejected,
    /// The gateway checked an upstream against `toolgate.lock` (at connect, on
    /// `tools/list_changed`, on reconnect) and serves the listed tools at their pinned hashes.
    Pin,
    /// The same check blocked a tool or a whole upstream server (changed, new or unpinned).
    PinBlock,
    /// A person re-pinned upstream definitions with `toolgate lock approve`.
    LockApproval,
    /// A read made by toolgate itself to look up a call's allowed destinations (the declared
    /// `destinations[].lookup` tool); the call's own record follows.
    Lookup,
    /// A plan rendered by a preview tool (`T.preview`): nothing was done; the outcome's
    /// `target_ref` is the plan id. A preview refused is a `deny` record of `T.preview`.
    Preview,
}

/// Who approved, by token fingerprint (never the token itself).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct AuditApproval {
    pub approvers: Vec<String>,
    pub token_fingerprints: Vec<String>,
}

/// What came back.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct AuditOutcome {
    pub status: StepStatus,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub target_ref: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub latency_ms: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// Governance latency in microseconds: from the request to its decision and reservation
    /// (destination lookups included), without the governed call itself.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub governance_us: Option<i64>,
}

/// A record before it joins the chain.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct AuditDraft {
    pub ts: Timestamp,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub run_id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub step_id: Option<String>,
    pub who: AuditWho,
    pub tool: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_version: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub effect: Option<Effect>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tier: Option<Tier>,
    /// The inputs with every field the tool marks sensitive replaced by a keyed hash.
    pub inputs: Value,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub redacted: Vec<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub idem_key: Option<String>,
    pub why: AuditWhy,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub approval: Option<AuditApproval>,
    pub outcome: AuditOutcome,
    pub registry_version: String,
}

/// A record in the chain: the draft, its position and the hash of its predecessor.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct AuditRecord {
    pub seq: i64,
    pub prev: String,
    #[serde(flatten)]
    pub body: AuditDraft,
}

impl AuditRecord {
    /// The canonical JSON the chain hashes.
    pub fn canonical(&self) -> String {
        canonical(&serde_json::to_value(self).expect("audit records serialise"))
    }
}

/// One row of the `audit` table, ready to insert.
struct AuditRow {
    seq: i64,
    ts: i64,
    principal: String,
    run_id: Option<String>,
    step_id: Option<String>,
    record: String,
    hash: String,
}

/// Appends drafts to the chain inside `tx`, returning their sequence numbers. The chain head
/// is locked (`FOR UPDATE` on PostgreSQL; SQLite's `BEGIN IMMEDIATE` already holds the only
/// write lock) so concurrent appenders in other processes queue behind this one.
pub(crate) async fn append(tx: &mut Tx, drafts: Vec<AuditDraft>) -> Result<Vec<i64>> {
    if drafts.is_empty() {
        return Ok(Vec::new());
    }
    let head = if tx.is_pg() {
        tx.opt(
            "SELECT seq, hash FROM audit_head WHERE id = 1 FOR UPDATE",
            args![],
        )
        .await?
    } else {
        tx.opt("SELECT seq, hash FROM audit_head WHERE id = 1", args![])
            .await?
    };
    let head =
        head.ok_or_else(|| StoreError::Corrupt("the audit chain head row is missing".into()))?;
    let (mut seq, mut prev) = (head.i64(0)?, head.text(1)?);
    let mut seqs = Vec::with_capacity(drafts.len());
    let mut rows = Vec::with_capacity(drafts.len());
    for body in drafts {
        seq += 1;
        let principal = body.who.principal.clone();
        let (run_id, step_id, ts) = (body.run_id.clone(), body.step_id.clone(), body.ts.millis());
        let record = AuditRecord { seq, prev, body };
        let text = record.canonical();
        let hash = sha256_tagged(text.as_bytes());
        prev = hash.clone();
        rows.push(AuditRow {
            seq,
            ts,
            principal,
            run_id,
            step_id,
            record: text,
            hash,
        });
        seqs.push(seq);
    }
    if tx.is_pg() {
        // All rows in one statement (one round trip): the records travel as one JSON array.
        let rows: Vec<Value> = rows
            .into_iter()
            .map(|r| {
                serde_json::json!({
                    "seq": r.seq, "ts": r.ts, "principal": r.principal, "run_id": r.run_id,
                    "step_id": r.step_id, "record": r.record, "hash": r.hash,
                })
            })
            .collect();
        tx.exec(
            "INSERT INTO audit (seq, ts, principal, run_id, step_id, record, hash) \
             SELECT seq, ts, principal, run_id, step_id, record, hash \
             FROM jsonb_to_recordset($1::jsonb) AS j(seq bigint, ts bigint, principal text, \
             run_id text, step_id text, record text, hash text)",
            args![Value::Array(rows).to_string()],
        )
        .await?;
    } else {
        // SQLite runs statements in process: one prepared insert per row is cheaper than
        // packing the rows into JSON and unpacking them again.
        for r in rows {
            tx.exec(
                "INSERT INTO audit (seq, ts, principal, run_id, step_id, record, hash) \
                 VALUES ($1, $2, $3, $4, $5, $6, $7)",
                args![
                    r.seq,
                    r.ts,
                    r.principal,
                    r.run_id,
                    r.step_id,
                    r.record,
                    r.hash
                ],
            )
            .await?;
        }
    }
    tx.exec(
        "UPDATE audit_head SET seq = $1, hash = $2 WHERE id = 1",
        args![seq, prev],
    )
    .await?;
    Ok(seqs)
}

/// The result of walking the chain.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ChainReport {
    /// Records checked.
    pub records: i64,
    /// The first broken link, if any.
    pub broken: Option<BrokenLink>,
}

impl ChainReport {
    pub fn is_intact(&self) -> bool {
        self.broken.is_none()
    }
}

/// Where and why the chain breaks.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct BrokenLink {
    pub seq: i64,
    pub reason: String,
}

impl std::fmt::Display for ChainReport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.broken {
            None => write!(f, "audit chain intact: {} record(s) verified", self.records),
            Some(b) => write!(
                f,
                "audit chain BROKEN at record {}: {} ({} record(s) before it verified)",
                b.seq,
                b.reason,
                b.seq - 1
            ),
        }
    }
}

/// Checks one stored row against the link before it; returns the row's true hash.
pub(crate) fn check_link(
    expected_seq: i64,
    expected_prev: &str,
    seq: i64,
    text: &str,
    stored_hash: &str,
) -> std::result::Result<String, String> {
    if seq != expected_seq {
        return Err(format!(
            "expected record {expected_seq} next, found {seq} (a record is missing)"
        ));
    }
    let record: AuditRecord = serde_json::from_str(text)
        .map_err(|e| format!("the record is not a valid audit record: {e}"))?;
    if record.seq != seq {
        return Err(format!(
            "the record says it is number {}, but is stored as {seq}",
            record.seq
        ));
    }
    if record.prev != expected_prev {
        return Err(format!(
            "its prev is {} but the record before it hashes to {expected_prev}",
            record.prev
        ));
    }
    if record.canonical() != text {
        return Err(
            "the stored text is not the canonical form of the record (it was edited)".into(),
        );
    }
    let hash = sha256_tagged(text.as_bytes());
    if hash != stored_hash {
        return Err(format!(
            "its content hashes to {hash} but {stored_hash} was recorded (it was edited)"
        ));
    }
    Ok(hash)
}
