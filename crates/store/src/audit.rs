//! The audit chain: one record per decided call attempt, allowed or refused. Each record holds
//! `prev`, the hash of the previous record's canonical JSON, so any edit, insertion or deletion
//! breaks a link that [`verify_chain`](crate::Store::verify_chain) names by sequence number.
//! The columns rows are selected by (`ts`, `principal`, `run_id`, `step_id`) repeat fields of
//! the hashed record, and the walk checks each against it. The database refuses UPDATE and
//! DELETE on the table (triggers); appends are serialised on a single chain-head row so many
//! processes still write one chain. What the chain cannot show alone (its own end) signed
//! checkpoints show: [`crate::checkpoint`], `docs/audit-chain.md`.

use std::collections::{BTreeMap, BTreeSet};

use serde::{Deserialize, Serialize};
use serde_json::Value;
use toolgate_core::canon::{canonical_of, sha256_tagged};
use toolgate_core::{
    Check, Decision, Effect, PrincipalId, Rule, RunId, ShadowRule, StepId, StepStatus, Tier,
    Timestamp, Verdict,
};

use crate::db::{Conn, Row, Sql, Tx, args};
use crate::error::{Result, StoreError};
use crate::model::{Actor, StepOutcome};

/// The `prev` of the first record.
pub const GENESIS: &str = "genesis";

/// Who acted.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct AuditWho {
    pub principal: PrincipalId,
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
    pub rule: Option<Rule>,
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
    pub approvers: Vec<PrincipalId>,
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
    /// The handler's latency in microseconds (records before it was kept have only `latency_ms`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub latency_us: Option<i64>,
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
    pub run_id: Option<RunId>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub step_id: Option<StepId>,
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

impl AuditWho {
    /// `principal` acting as `role`, for no one else.
    pub fn new(principal: impl Into<PrincipalId>, role: impl Into<String>) -> Self {
        AuditWho {
            principal: principal.into(),
            role: role.into(),
            actor: Actor::default(),
        }
    }

    /// toolgate itself: a reload of its registry, a check of an upstream's pins.
    pub fn toolgate() -> Self {
        AuditWho::new("toolgate", "gateway")
    }

    /// A principal of `registry` with the role it has there (none for a name it does not
    /// know).
    pub fn of(registry: &toolgate_core::Registry, principal: &str) -> Self {
        let role = registry.principal(principal).map_or("", |p| p.role());
        AuditWho::new(principal, role)
    }
}

impl AuditOutcome {
    /// An outcome that is only its status: no handler answered (a refusal, a rejection, an
    /// event of toolgate's own).
    pub fn of(status: StepStatus) -> Self {
        AuditOutcome {
            status,
            target_ref: None,
            latency_ms: None,
            latency_us: None,
            error: None,
            governance_us: None,
        }
    }
}

/// The call a record is about: who made it, in which run and step, of which tool (as the
/// registry declares it), with which inputs as they may be kept (redacted), under which key, and
/// why the caller said it made it. Every kind of record about a call starts from one.
#[derive(Debug, Clone, PartialEq)]
pub struct AuditCall {
    pub who: AuditWho,
    pub run_id: Option<RunId>,
    pub step_id: Option<StepId>,
    pub tool: String,
    pub tool_version: Option<String>,
    pub effect: Option<Effect>,
    pub tier: Option<Tier>,
    /// The inputs with every field the tool marks sensitive replaced by a keyed hash.
    pub inputs: Value,
    pub redacted: Vec<String>,
    pub idem_key: Option<String>,
    pub purpose: Option<String>,
    pub reason: Option<String>,
    pub evidence: Vec<String>,
}

impl AuditCall {
    /// `who`'s call of `tool` as `declared` declares it (its version, effect and tier; `None`
    /// for a name the registry does not know), in no run, with no inputs and no reason yet.
    pub fn new(
        who: AuditWho,
        tool: impl Into<String>,
        declared: Option<&toolgate_core::registry::Tool>,
    ) -> Self {
        AuditCall {
            who,
            run_id: None,
            step_id: None,
            tool: tool.into(),
            tool_version: declared.map(|t| t.config.version.clone()),
            effect: declared.map(|t| t.config.effect),
            tier: declared.map(|t| t.config.tier),
            inputs: Value::Null,
            redacted: Vec::new(),
            idem_key: None,
            purpose: None,
            reason: None,
            evidence: Vec::new(),
        }
    }

    /// What an event of toolgate's own is about (an upstream's pins, the registry folder):
    /// `subject`, what `who` looked at (`inputs`), and what it found (`reason`).
    fn toolgate(who: AuditWho, subject: impl Into<String>, inputs: Value, reason: String) -> Self {
        AuditCall {
            inputs,
            reason: Some(reason),
            ..AuditCall::new(who, subject, None)
        }
    }
}

/// The rule `decision` was decided by, if not a plain allow.
fn deciding_rule(decision: &Decision) -> Option<Rule> {
    match &decision.verdict {
        Verdict::Allow => None,
        Verdict::Deny { rule, .. } | Verdict::NeedsApproval { rule, .. } => Some(rule.clone()),
    }
}

/// One constructor per kind of record, each taking what its event has.
impl AuditDraft {
    /// An event of `kind` about `call` that ended as `outcome` says, decided by `rule` (when
    /// one decided), with the checks and shadow rules of `decision` (when the engine was
    /// asked) and the approvers of `approval`.
    #[allow(clippy::too_many_arguments)]
    fn about(
        ts: Timestamp,
        kind: AuditDecision,
        call: AuditCall,
        rule: Option<Rule>,
        decision: Option<&Decision>,
        outcome: AuditOutcome,
        approval: Option<AuditApproval>,
        registry_version: String,
    ) -> Self {
        let AuditCall {
            who,
            run_id,
            step_id,
            tool,
            tool_version,
            effect,
            tier,
            inputs,
            redacted,
            idem_key,
            purpose,
            reason,
            evidence,
        } = call;
        AuditDraft {
            ts,
            run_id,
            step_id,
            who,
            tool,
            tool_version,
            effect,
            tier,
            inputs,
            redacted,
            idem_key,
            why: AuditWhy {
                purpose,
                reason,
                evidence,
                decision: kind,
                rule,
                checks: decision.map(|d| d.checks.clone()).unwrap_or_default(),
                shadow: decision.map(|d| d.shadow.clone()).unwrap_or_default(),
            },
            approval,
            outcome,
            registry_version,
        }
    }

    /// A governed call as the engine decided it (`kind`: allow, deny, needs approval, replay),
    /// with what came back: the deciding rule is the decision's, else the outcome's (a timeout,
    /// a handler's refusal). `governance_us`: the time from the request to its decision and
    /// reservation, when this process measured it.
    pub fn call(
        ts: Timestamp,
        kind: AuditDecision,
        call: AuditCall,
        decision: &Decision,
        approval: Option<AuditApproval>,
        outcome: &StepOutcome,
        governance_us: Option<i64>,
    ) -> Self {
        let rule = deciding_rule(decision).or_else(|| outcome.rule.clone());
        let outcome = AuditOutcome {
            target_ref: outcome.target_ref.clone(),
            latency_ms: outcome.latency_ms,
            latency_us: outcome.latency_us,
            error: outcome.error.clone(),
            governance_us,
            ..AuditOutcome::of(outcome.status)
        };
        let version = decision.registry_version.clone();
        AuditDraft::about(
            ts,
            kind,
            call,
            rule,
            Some(decision),
            outcome,
            approval,
            version,
        )
    }

    /// A read toolgate made itself before deciding a call (a destination lookup, the values a
    /// write will change): allowed by no check of its own, under `rule`; the call's own record
    /// follows.
    pub fn lookup(
        ts: Timestamp,
        call: AuditCall,
        rule: impl Into<Rule>,
        outcome: &StepOutcome,
        registry_version: impl Into<String>,
    ) -> Self {
        AuditDraft::system(
            ts,
            AuditDecision::Lookup,
            call,
            rule,
            outcome,
            registry_version,
        )
    }

    /// A step toolgate settled or undid itself (`kind`: recovery, reconcile, compensation),
    /// under `rule`, with what came back.
    pub fn system(
        ts: Timestamp,
        kind: AuditDecision,
        call: AuditCall,
        rule: impl Into<Rule>,
        outcome: &StepOutcome,
        registry_version: impl Into<String>,
    ) -> Self {
        let outcome = AuditOutcome {
            target_ref: outcome.target_ref.clone(),
            latency_ms: outcome.latency_ms,
            latency_us: outcome.latency_us,
            error: outcome.error.clone(),
            ..AuditOutcome::of(outcome.status)
        };
        let (rule, version) = (Some(rule.into()), registry_version.into());
        AuditDraft::about(ts, kind, call, rule, None, outcome, None, version)
    }

    /// A call refused before the executor decided it (a plan-bound call that matches no planned
    /// step, a plan with a step that cannot run, a commit of no current plan): refused by
    /// `rule`, telling the caller `error` when it was told more than the rule.
    pub fn refusal(
        ts: Timestamp,
        call: AuditCall,
        rule: impl Into<Rule>,
        error: Option<String>,
        registry_version: impl Into<String>,
    ) -> Self {
        let outcome = AuditOutcome {
            error,
            ..AuditOutcome::of(StepStatus::Refused)
        };
        let (rule, version) = (Some(rule.into()), registry_version.into());
        AuditDraft::about(
            ts,
            AuditDecision::Deny,
            call,
            rule,
            None,
            outcome,
            None,
            version,
        )
    }

    /// A person's rejection of a parked call or a planned step: `rule` says which
    /// (`approval.rejected`, `review.rejected`), `note` is what they wrote (the record's
    /// reason), `error` what the step was told, `approval` who rejected it when that was an
    /// approver. The step is refused.
    pub fn rejection(
        ts: Timestamp,
        call: AuditCall,
        rule: impl Into<Rule>,
        note: &str,
        error: Option<String>,
        approval: Option<AuditApproval>,
        registry_version: impl Into<String>,
    ) -> Self {
        let call = AuditCall {
            reason: Some(note.to_string()),
            ..call
        };
        let outcome = AuditOutcome {
            error,
            ..AuditOutcome::of(StepStatus::Refused)
        };
        let (rule, version) = (Some(rule.into()), registry_version.into());
        AuditDraft::about(
            ts,
            AuditDecision::Rejected,
            call,
            rule,
            None,
            outcome,
            approval,
            version,
        )
    }

    /// A plan made by a preview call (`T.preview`), decided by `decision`: nothing was done;
    /// the plan id is the record's target reference.
    pub fn preview(ts: Timestamp, call: AuditCall, decision: &Decision, plan_id: String) -> Self {
        let outcome = AuditOutcome {
            target_ref: Some(plan_id),
            ..AuditOutcome::of(StepStatus::Done)
        };
        let version = decision.registry_version.clone();
        AuditDraft::about(
            ts,
            AuditDecision::Preview,
            call,
            None,
            Some(decision),
            outcome,
            None,
            version,
        )
    }

    /// A preview refused by the engine's `decision`: no plan was made.
    pub fn preview_refusal(ts: Timestamp, call: AuditCall, decision: &Decision) -> Self {
        let rule = deciding_rule(decision);
        let outcome = AuditOutcome::of(StepStatus::Refused);
        let version = decision.registry_version.clone();
        AuditDraft::about(
            ts,
            AuditDecision::Deny,
            call,
            rule,
            Some(decision),
            outcome,
            None,
            version,
        )
    }

    /// toolgate checked an upstream against `toolgate.lock` and serves its listed tools at
    /// their pinned definitions: `subject` is the upstream, `checked` what was compared.
    pub fn pin(
        ts: Timestamp,
        subject: impl Into<String>,
        checked: Value,
        reason: String,
        registry_version: impl Into<String>,
    ) -> Self {
        let call = AuditCall::toolgate(AuditWho::toolgate(), subject, checked, reason);
        let (rule, version) = (Some(Rule::PIN_SERVED), registry_version.into());
        let outcome = AuditOutcome::of(StepStatus::Done);
        AuditDraft::about(
            ts,
            AuditDecision::Pin,
            call,
            rule,
            None,
            outcome,
            None,
            version,
        )
    }

    /// The same check blocked `subject` (an upstream, or one of its tools) under `rule`;
    /// `error` is what a call of it is told.
    pub fn pin_block(
        ts: Timestamp,
        subject: impl Into<String>,
        checked: Value,
        rule: impl Into<Rule>,
        reason: String,
        error: String,
        registry_version: impl Into<String>,
    ) -> Self {
        let call = AuditCall::toolgate(AuditWho::toolgate(), subject, checked, reason);
        let (rule, version) = (Some(rule.into()), registry_version.into());
        let outcome = AuditOutcome {
            error: Some(error),
            ..AuditOutcome::of(StepStatus::Refused)
        };
        AuditDraft::about(
            ts,
            AuditDecision::PinBlock,
            call,
            rule,
            None,
            outcome,
            None,
            version,
        )
    }

    /// `toolgate serve` loaded its registry folder again (`attempt`: the folder, the trigger,
    /// the versions): applied, or refused with the folder's validation errors (`invalid`) while
    /// `serving_version` keeps serving.
    pub fn reload(
        ts: Timestamp,
        attempt: Value,
        reason: String,
        invalid: Option<String>,
        serving_version: impl Into<String>,
    ) -> Self {
        let call = AuditCall::toolgate(AuditWho::toolgate(), "registry.reload", attempt, reason);
        let rule = invalid.as_ref().map(|_| Rule::RELOAD_INVALID);
        let status = match invalid {
            None => StepStatus::Done,
            Some(_) => StepStatus::Refused,
        };
        let outcome = AuditOutcome {
            error: invalid,
            ..AuditOutcome::of(status)
        };
        let version = serving_version.into();
        AuditDraft::about(
            ts,
            AuditDecision::Reload,
            call,
            rule,
            None,
            outcome,
            None,
            version,
        )
    }

    /// A person (`by`) re-pinned upstream definitions (`subject`: an upstream, one of its
    /// tools, or every one) with `toolgate lock approve`; `pins` is what was written, and
    /// `lock_version` the hash of the lockfile it left.
    pub fn lock_approval(
        ts: Timestamp,
        by: &str,
        subject: impl Into<String>,
        pins: Value,
        reason: String,
        lock_version: impl Into<String>,
    ) -> Self {
        let call = AuditCall::toolgate(AuditWho::new(by, "operator"), subject, pins, reason);
        let (rule, version) = (Some(Rule::LOCK_APPROVE), lock_version.into());
        let outcome = AuditOutcome::of(StepStatus::Done);
        AuditDraft::about(
            ts,
            AuditDecision::LockApproval,
            call,
            rule,
            None,
            outcome,
            None,
            version,
        )
    }
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
        canonical_of(self).expect("audit records serialise")
    }
}

/// A record as stored: its number and the canonical text the chain hashes.
pub(crate) struct Stored {
    pub seq: i64,
    pub text: String,
}

impl Stored {
    /// From a row with `seq` and `record`, the record unpacked ([`crate::packed`]).
    fn read(r: &Row) -> Result<Stored> {
        let seq = r.i64("seq")?;
        Ok(Stored {
            seq,
            text: unpacked(seq, r.text("record")?)?,
        })
    }
}

/// The canonical text of record `seq`, from the value its `record` column holds.
fn unpacked(seq: i64, stored: String) -> Result<String> {
    crate::packed::unpack(stored).map_err(|source| StoreError::UnreadableRecord { seq, source })
}

/// The stored records whose `principal` column is `principal`, else whose `run_id` column is
/// `run_id`, else every one, in chain order.
pub(crate) async fn stored(
    c: &mut impl Sql,
    principal: Option<&str>,
    run_id: Option<&str>,
) -> Result<Vec<Stored>> {
    let rows = match (principal, run_id) {
        (Some(p), _) => {
            c.rows(
                "SELECT seq, record FROM audit WHERE principal = $1 ORDER BY seq",
                args![p],
            )
            .await?
        }
        (None, Some(r)) => {
            c.rows(
                "SELECT seq, record FROM audit WHERE run_id = $1 ORDER BY seq",
                args![r],
            )
            .await?
        }
        (None, None) => {
            c.rows("SELECT seq, record FROM audit ORDER BY seq", args![])
                .await?
        }
    };
    rows.iter().map(Stored::read).collect()
}

/// Up to `limit` stored records with `seq > after`, in chain order.
pub(crate) async fn stored_after(c: &mut impl Sql, after: i64, limit: u32) -> Result<Vec<Stored>> {
    c.rows(
        "SELECT seq, record FROM audit WHERE seq > $1 ORDER BY seq LIMIT $2",
        args![after, i64::from(limit)],
    )
    .await?
    .iter()
    .map(Stored::read)
    .collect()
}

/// One row of the `audit` table, ready to insert.
struct AuditRow {
    seq: i64,
    ts: i64,
    principal: String,
    run_id: Option<String>,
    step_id: Option<String>,
    /// The record's canonical text as stored ([`crate::packed`]).
    record: String,
    hash: String,
}

/// Drafts hashed onto the chain after a known head: the rows to store, their numbers, the
/// refusals their runs count (a refused call without a step row; see `ledger::runs`), and
/// the head they leave. Pure: nothing is written until the rows are, under the head they
/// were linked to.
pub(crate) struct Linked {
    rows: Vec<AuditRow>,
    pub seqs: Vec<i64>,
    pub refusals: Vec<crate::ledger::runs::Stepless>,
    /// The head before these records (what the chain must still end at when they are written).
    pub after: ChainPoint,
    /// The head after them.
    pub head: ChainPoint,
}

/// A record as [`AuditRecord`] serialises it, over a borrowed draft: the same canonical JSON
/// without copying the draft.
#[derive(Serialize)]
struct RecordOf<'a> {
    seq: i64,
    prev: &'a str,
    #[serde(flatten)]
    body: &'a AuditDraft,
}

/// Links `drafts` onto the chain after `head`.
pub(crate) fn link(head: &ChainPoint, drafts: &[&AuditDraft]) -> Linked {
    let (mut seq, mut prev) = (head.seq, head.hash.clone());
    let mut seqs = Vec::with_capacity(drafts.len());
    let mut rows = Vec::with_capacity(drafts.len());
    let mut refusals = Vec::new();
    for &body in drafts {
        seq += 1;
        let principal = body.who.principal.clone();
        let (run_id, step_id, ts) = (body.run_id.clone(), body.step_id.clone(), body.ts.millis());
        if let (None, Some(run_id), AuditDecision::Deny) =
            (&body.step_id, &body.run_id, body.why.decision)
        {
            refusals.push(crate::ledger::runs::Stepless {
                run_id: run_id.clone(),
                tool: body.tool.clone(),
                tier: body.tier.unwrap_or(Tier::Read),
                status: StepStatus::Refused,
            });
        }
        let record = RecordOf {
            seq,
            prev: &prev,
            body,
        };
        let text = canonical_of(&record).expect("audit records serialise");
        let hash = sha256_tagged(text.as_bytes());
        prev = hash.clone();
        rows.push(AuditRow {
            seq,
            ts,
            principal: principal.into_string(),
            run_id: run_id.map(RunId::into_string),
            step_id: step_id.map(StepId::into_string),
            record: crate::packed::pack(text),
            hash,
        });
        seqs.push(seq);
    }
    Linked {
        rows,
        seqs,
        refusals,
        after: head.clone(),
        head: ChainPoint { seq, hash: prev },
    }
}

impl Linked {
    /// PostgreSQL: the rows as seven column arrays, in the order of the `audit` columns
    /// `seq, ts, principal, run_id, step_id, record, hash` (one statement of stable text
    /// inserts any number of them with `unnest`).
    pub(crate) fn take_columns(&mut self) -> Vec<crate::db::Arg> {
        let rows = std::mem::take(&mut self.rows);
        let n = rows.len();
        let (mut seq, mut ts, mut principal) = (
            Vec::with_capacity(n),
            Vec::with_capacity(n),
            Vec::with_capacity(n),
        );
        let (mut run_id, mut step_id) = (Vec::with_capacity(n), Vec::with_capacity(n));
        let (mut record, mut hash) = (Vec::with_capacity(n), Vec::with_capacity(n));
        for r in rows {
            seq.push(r.seq);
            ts.push(r.ts);
            principal.push(r.principal);
            run_id.push(r.run_id);
            step_id.push(r.step_id);
            record.push(r.record);
            hash.push(r.hash);
        }
        args![seq, ts, principal, run_id, step_id, record, hash]
    }
}

/// The chain head, locked for this transaction on PostgreSQL (`FOR UPDATE`: appenders in
/// other transactions and processes queue behind it); SQLite's `BEGIN IMMEDIATE` already
/// holds the only write lock.
pub(crate) async fn lock_head(tx: &mut Tx) -> Result<ChainPoint> {
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
    Ok(ChainPoint {
        seq: head.i64("seq")?,
        hash: head.text("hash")?,
    })
}

/// Appends drafts to the chain inside `tx`, returning their sequence numbers. The chain head
/// is locked ([`lock_head`]) so concurrent appenders in other processes queue behind this one.
pub(crate) async fn append(tx: &mut Tx, drafts: Vec<AuditDraft>) -> Result<Vec<i64>> {
    append_linked(tx, &drafts.iter().collect::<Vec<_>>()).await
}

/// As [`append`], for borrowed drafts.
pub(crate) async fn append_linked(tx: &mut Tx, drafts: &[&AuditDraft]) -> Result<Vec<i64>> {
    if drafts.is_empty() {
        return Ok(Vec::new());
    }
    let head = lock_head(tx).await?;
    let mut linked = link(&head, drafts);
    if tx.is_pg() {
        // All rows in one statement (one round trip): the records travel as column arrays.
        tx.exec(
            "INSERT INTO audit (seq, ts, principal, run_id, step_id, record, hash) \
             SELECT * FROM unnest($1::bigint[], $2::bigint[], $3::text[], $4::text[], \
             $5::text[], $6::text[], $7::text[])",
            linked.take_columns(),
        )
        .await?;
    } else {
        // SQLite runs statements in process: one prepared insert per row.
        for r in std::mem::take(&mut linked.rows) {
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
    crate::ledger::runs::tally(tx, &linked.refusals).await?;
    tx.exec(
        "UPDATE audit_head SET seq = $1, hash = $2 WHERE id = 1",
        args![linked.head.seq, linked.head.hash],
    )
    .await?;
    Ok(linked.seqs)
}

/// A point on the chain: a record's number and hash (`0` and [`GENESIS`] before the first).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ChainPoint {
    pub seq: i64,
    pub hash: String,
}

impl ChainPoint {
    /// Before the first record.
    pub fn genesis() -> ChainPoint {
        ChainPoint {
            seq: 0,
            hash: GENESIS.to_string(),
        }
    }
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
    /// [`BrokenLink::fault`] in words.
    pub reason: String,
    pub fault: LinkFault,
}

impl BrokenLink {
    fn at(seq: i64, fault: LinkFault) -> BrokenLink {
        BrokenLink {
            seq,
            reason: fault.to_string(),
            fault,
        }
    }
}

impl std::fmt::Display for ChainReport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.broken {
            None => write!(f, "audit chain intact: {} record(s) verified", self.records),
            Some(b) => write!(
                f,
                "audit chain BROKEN at record {}: {} ({} record(s) before it verified)",
                b.seq, b.reason, self.records
            ),
        }
    }
}

/// A column of the `audit` table that repeats a field of the hashed record, so that rows can
/// be selected by it (`log export --principal` by `principal`, `trace` by `run_id`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum AuditColumn {
    Ts,
    Principal,
    RunId,
    StepId,
}

impl AuditColumn {
    pub fn as_str(self) -> &'static str {
        match self {
            AuditColumn::Ts => "ts",
            AuditColumn::Principal => "principal",
            AuditColumn::RunId => "run_id",
            AuditColumn::StepId => "step_id",
        }
    }
}

impl std::fmt::Display for AuditColumn {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// What is wrong with one link of the chain.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, thiserror::Error)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum LinkFault {
    #[error("expected record {expected} next, found {found} (a record is missing)")]
    Missing { expected: i64, found: i64 },
    #[error(
        "the row is numbered {stored} but its record says it is number {record} (the seq \
         column was edited)"
    )]
    Renumbered { stored: i64, record: i64 },
    #[error("the record is not a valid audit record: {error}")]
    Unreadable { error: String },
    #[error("its prev is {prev} but the record before it hashes to {expected}")]
    Prev { prev: String, expected: String },
    #[error("the stored text is not the canonical form of the record (it was edited)")]
    NotCanonical,
    #[error("its content hashes to {computed} but {stored} was recorded (it was edited)")]
    Hash { computed: String, stored: String },
    #[error(
        "its {column} column is {stored} but the record says {record} (the column was edited; \
         commands that select rows by it see the wrong rows)"
    )]
    Column {
        column: AuditColumn,
        stored: String,
        record: String,
    },
    #[error(
        "the chain head says record {head_seq} ({head_hash}) is last, but the table ends at \
         {last_seq} ({last_hash}): records were removed or added"
    )]
    Head {
        head_seq: i64,
        head_hash: String,
        last_seq: i64,
        last_hash: String,
    },
    #[error(
        "record {seq} is stored past the chain head (record {head_seq}): it was added outside \
         the chain, or the head was moved back"
    )]
    PastHead { seq: i64, head_seq: i64 },
}

/// One row of the `audit` table as read back.
pub(crate) struct StoredRow {
    pub seq: i64,
    pub ts: i64,
    pub principal: String,
    pub run_id: Option<String>,
    pub step_id: Option<String>,
    pub record: String,
    pub hash: String,
}

impl StoredRow {
    /// From `SELECT seq, ts, principal, run_id, step_id, record, hash`.
    fn read(r: &Row) -> Result<StoredRow> {
        Ok(StoredRow {
            seq: r.i64("seq")?,
            ts: r.i64("ts")?,
            principal: r.text("principal")?,
            run_id: r.opt_text("run_id")?,
            step_id: r.opt_text("step_id")?,
            record: r.text("record")?,
            hash: r.text("hash")?,
        })
    }
}

/// A column value as the fault message shows it.
fn shown(v: Option<&str>) -> String {
    // A stored value may be anything written into the table: shown, never obeyed.
    v.map_or_else(
        || "null".to_string(),
        |s| format!("'{}'", toolgate_core::clip::printable(s)),
    )
}

/// Checks one stored row against the link before it; returns the row's true hash.
pub(crate) fn check_link(
    expected_seq: i64,
    expected_prev: &str,
    row: &StoredRow,
) -> std::result::Result<String, LinkFault> {
    let text = crate::packed::unpack(row.record.clone()).map_err(|e| e.to_string());
    let parsed = text
        .as_ref()
        .map_err(String::clone)
        .and_then(|t| serde_json::from_str::<AuditRecord>(t).map_err(|e| e.to_string()));
    if row.seq != expected_seq {
        return Err(match &parsed {
            Ok(record) if record.seq != row.seq => LinkFault::Renumbered {
                stored: row.seq,
                record: record.seq,
            },
            _ => LinkFault::Missing {
                expected: expected_seq,
                found: row.seq,
            },
        });
    }
    let record = parsed.map_err(|error| LinkFault::Unreadable { error })?;
    let text = text.expect("a record that parsed was read");
    if record.seq != row.seq {
        return Err(LinkFault::Renumbered {
            stored: row.seq,
            record: record.seq,
        });
    }
    if record.prev != expected_prev {
        return Err(LinkFault::Prev {
            prev: record.prev,
            expected: expected_prev.to_string(),
        });
    }
    if record.canonical() != text {
        return Err(LinkFault::NotCanonical);
    }
    let hash = sha256_tagged(text.as_bytes());
    if hash != row.hash {
        return Err(LinkFault::Hash {
            computed: hash,
            stored: row.hash.clone(),
        });
    }
    check_columns(&record, row)?;
    Ok(hash)
}

/// The derived columns must say what the hashed record says.
fn check_columns(record: &AuditRecord, row: &StoredRow) -> std::result::Result<(), LinkFault> {
    let b = &record.body;
    let column = |column, stored: String, record: String| {
        Err(LinkFault::Column {
            column,
            stored,
            record,
        })
    };
    if row.ts != b.ts.millis() {
        return column(
            AuditColumn::Ts,
            row.ts.to_string(),
            b.ts.millis().to_string(),
        );
    }
    if row.principal != b.who.principal {
        return column(
            AuditColumn::Principal,
            shown(Some(&row.principal)),
            shown(Some(&b.who.principal)),
        );
    }
    if row.run_id.as_deref() != b.run_id.as_deref() {
        return column(
            AuditColumn::RunId,
            shown(row.run_id.as_deref()),
            shown(b.run_id.as_deref()),
        );
    }
    if row.step_id.as_deref() != b.step_id.as_deref() {
        return column(
            AuditColumn::StepId,
            shown(row.step_id.as_deref()),
            shown(b.step_id.as_deref()),
        );
    }
    Ok(())
}

/// The chain head row: the last record's number and hash, as the appenders left them.
pub(crate) async fn read_head(c: &mut Conn) -> Result<ChainPoint> {
    let head = c
        .opt("SELECT seq, hash FROM audit_head WHERE id = 1", args![])
        .await?
        .ok_or_else(|| StoreError::Corrupt("the audit chain head row is missing".into()))?;
    Ok(ChainPoint {
        seq: head.i64("seq")?,
        hash: head.text("hash")?,
    })
}

/// The store's identity, made at random when the database was created and never changed:
/// every checkpoint of its chain names it.
pub(crate) async fn store_id(c: &mut Conn) -> Result<String> {
    c.opt("SELECT store_id FROM audit_store WHERE id = 1", args![])
        .await?
        .ok_or_else(|| StoreError::Corrupt("the audit store identity row is missing".into()))?
        .text("store_id")
}

/// Writes the sync barrier row, so that a commit carrying no record still flushes the log
/// (a caller waiting for what was committed before it to be durable).
pub(crate) async fn touch_sync_barrier(tx: &mut Tx) -> Result<()> {
    tx.exec("UPDATE sync_barrier SET n = n + 1 WHERE id = 1", args![])
        .await?;
    Ok(())
}

/// What a walk of the chain found.
pub(crate) struct Walk {
    pub report: ChainReport,
    /// The last record verified (the head, when the chain is intact).
    pub last: ChainPoint,
    /// The verified hash of each watched record the walk reached.
    pub watched: BTreeMap<i64, String>,
}

/// Walks the rows after `from` (whose hash the first row's `prev` must be) up to the chain
/// head as it was when the walk began, so records appended meanwhile by a running gateway are
/// neither checked nor mistaken for tampering. Then the head must be the last record, and no
/// row may lie past it unless an append has since moved the head over it.
pub(crate) async fn walk(c: &mut Conn, from: &ChainPoint, watch: &BTreeSet<i64>) -> Result<Walk> {
    let head = read_head(c).await?;
    let mut prev = from.hash.clone();
    let mut expected = from.seq + 1;
    let mut watched = BTreeMap::new();
    let broken = |expected: i64,
                  prev: String,
                  watched: BTreeMap<i64, String>,
                  link: BrokenLink|
     -> Result<Walk> {
        Ok(Walk {
            report: ChainReport {
                records: expected - from.seq - 1,
                broken: Some(link),
            },
            last: ChainPoint {
                seq: expected - 1,
                hash: prev,
            },
            watched,
        })
    };
    let mut after = from.seq;
    loop {
        let rows = c
            .rows(
                "SELECT seq, ts, principal, run_id, step_id, record, hash FROM audit \
                 WHERE seq > $1 AND seq <= $2 ORDER BY seq LIMIT 2000",
                args![after, head.seq],
            )
            .await?;
        if rows.is_empty() {
            break;
        }
        for r in &rows {
            let row = StoredRow::read(r)?;
            match check_link(expected, &prev, &row) {
                Ok(hash) => {
                    if watch.contains(&row.seq) {
                        watched.insert(row.seq, hash.clone());
                    }
                    prev = hash;
                }
                Err(fault) => {
                    let link = BrokenLink::at(expected.min(row.seq), fault);
                    return broken(expected, prev, watched, link);
                }
            }
            expected += 1;
            after = row.seq;
        }
    }
    let last = ChainPoint {
        seq: expected - 1,
        hash: prev,
    };
    if last != head {
        // The first record missing from the end, or the head itself if it names another hash.
        let at = if head.seq > last.seq {
            last.seq + 1
        } else {
            head.seq
        };
        let link = BrokenLink::at(
            at,
            LinkFault::Head {
                head_seq: head.seq,
                head_hash: head.hash,
                last_seq: last.seq,
                last_hash: last.hash.clone(),
            },
        );
        return broken(expected, last.hash, watched, link);
    }
    let beyond = c
        .opt(
            "SELECT seq FROM audit WHERE seq > $1 ORDER BY seq LIMIT 1",
            args![head.seq],
        )
        .await?;
    if let Some(beyond) = beyond {
        let beyond = beyond.i64("seq")?;
        let now = read_head(c).await?;
        if now.seq < beyond {
            let link = BrokenLink::at(
                beyond,
                LinkFault::PastHead {
                    seq: beyond,
                    head_seq: now.seq,
                },
            );
            return broken(expected, last.hash, watched, link);
        }
    }
    Ok(Walk {
        report: ChainReport {
            records: expected - from.seq - 1,
            broken: None,
        },
        last,
        watched,
    })
}

/// The text of record `seq`, if there is a row with that number: unpacked, or the stored value
/// as it is when it does not unpack (the walk names it unreadable).
pub(crate) async fn record_text_at(c: &mut Conn, seq: i64) -> Result<Option<String>> {
    match c
        .opt("SELECT record FROM audit WHERE seq = $1", args![seq])
        .await?
    {
        Some(row) => {
            let stored = row.text("record")?;
            Ok(Some(
                crate::packed::unpack(stored.clone()).unwrap_or(stored),
            ))
        }
        None => Ok(None),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn linked_records_are_stored_packed_and_hash_their_canonical_text() {
        let call = AuditCall {
            run_id: Some("run-7".into()),
            reason: Some("Read the invoice to plan its payment.".into()),
            ..AuditCall::new(AuditWho::new("ap-agent", "worker"), "invoice.search", None)
        };
        let refused = AuditDraft::rejection(
            Timestamp::from_millis(1),
            call,
            "approval.rejected",
            "wrong IBAN",
            Some("rejected by lead: wrong IBAN".into()),
            None,
            "sha256:0f1e",
        );
        let linked = link(&ChainPoint::genesis(), &[&refused, &refused]);
        for (i, row) in linked.rows.iter().enumerate() {
            let text = crate::packed::unpack(row.record.clone()).unwrap();
            assert!(row.record.starts_with("z1:"), "{}", row.record);
            assert!(
                row.record.len() < text.len(),
                "{} of {}",
                row.record.len(),
                text.len()
            );
            let record: AuditRecord = serde_json::from_str(&text).unwrap();
            assert_eq!(record.seq, i as i64 + 1);
            assert_eq!(record.canonical(), text);
            // The text the chain hashes is what records were always hashed over: the canonical
            // form of the record as a JSON value.
            let as_value = toolgate_core::canonical(&serde_json::to_value(&record).unwrap());
            assert_eq!(as_value, text);
            assert_eq!(sha256_tagged(text.as_bytes()), row.hash);
        }
    }

    #[test]
    fn a_rejection_is_the_call_refused_with_the_persons_note_as_its_reason() {
        let call = AuditCall {
            run_id: Some("r1".into()),
            reason: Some("the model's reason".into()),
            ..AuditCall::new(AuditWho::new("clerk", "ap"), "payment.schedule", None)
        };
        let approver = AuditApproval {
            approvers: vec!["lead".into()],
            token_fingerprints: Vec::new(),
        };
        let d = AuditDraft::rejection(
            Timestamp::from_millis(1),
            call,
            "approval.rejected",
            "wrong IBAN",
            Some("rejected by lead: wrong IBAN".into()),
            Some(approver.clone()),
            "v1",
        );
        assert_eq!(d.why.decision, AuditDecision::Rejected);
        assert_eq!(d.why.rule.as_deref(), Some("approval.rejected"));
        assert_eq!(d.why.reason.as_deref(), Some("wrong IBAN"));
        assert_eq!(d.run_id.as_deref(), Some("r1"));
        assert_eq!(d.outcome.status, StepStatus::Refused);
        assert_eq!(d.approval, Some(approver));
    }

    #[test]
    fn a_refused_reload_names_its_rule_and_the_folders_errors() {
        let attempt = serde_json::json!({"dir": "gw"});
        let refused = AuditDraft::reload(
            Timestamp::from_millis(1),
            attempt.clone(),
            "the folder failed validation; v1 keeps serving".into(),
            Some("tools/a.yaml: bad".into()),
            "v1",
        );
        assert_eq!(refused.tool, "registry.reload");
        assert_eq!(refused.who, AuditWho::toolgate());
        assert_eq!(refused.why.rule.as_deref(), Some("reload.invalid"));
        assert_eq!(refused.outcome.status, StepStatus::Refused);
        assert_eq!(refused.outcome.error.as_deref(), Some("tools/a.yaml: bad"));
        let applied =
            AuditDraft::reload(Timestamp::from_millis(1), attempt, "v2".into(), None, "v2");
        assert_eq!(applied.why.rule, None);
        assert_eq!(applied.outcome.status, StepStatus::Done);
    }
}
