//! The values the store hands out and takes in. Statuses and classes are core's enums; ids,
//! keys and hashes keep core's newtypes, so nothing here is compared as a bare string.

use serde::{Deserialize, Serialize};
use serde_json::Value;
use toolgate_core::{
    ApprovalId, Check, Effect, IdempotencyKey, InputHash, PrincipalId, Rule, RunId, StepId,
    StepStatus, Tier, Timestamp,
};

/// Who is behind a call beyond its credential: the model and prompt revision the client
/// reported in `_meta`, and the token usage it reported. Recorded, never trusted for decisions.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Actor {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prompt_rev: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub usage: Option<Value>,
}

/// One step of a submitted plan.
#[derive(Debug, Clone, PartialEq)]
pub struct PlannedStep {
    pub tool: String,
    pub inputs: Value,
    /// The principal that executes it (a worker); its role and budgets apply.
    pub principal: PrincipalId,
    pub purpose: Option<String>,
    /// The planner's justification, shown to approvers and kept in the audit record.
    pub reason: Option<String>,
    /// Evidence ids the planner cited.
    pub evidence: Vec<String>,
    pub actor: Actor,
}

/// Why a step row exists.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum StepKind {
    /// Part of a submitted plan.
    Planned,
    /// A `tools/call` outside a plan.
    Direct,
    /// The compensating call of an aborted run's write step.
    Compensation,
}

impl StepKind {
    pub fn as_str(self) -> &'static str {
        match self {
            StepKind::Planned => "planned",
            StepKind::Direct => "direct",
            StepKind::Compensation => "compensation",
        }
    }
    pub fn parse(s: &str) -> Option<Self> {
        Some(match s {
            "planned" => StepKind::Planned,
            "direct" => StepKind::Direct,
            "compensation" => StepKind::Compensation,
            _ => return None,
        })
    }
}

/// Where a run stands: open for calls, or aborted (nothing more runs in it).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RunState {
    Open,
    Aborted,
}

impl RunState {
    pub const fn as_str(self) -> &'static str {
        match self {
            RunState::Open => "open",
            RunState::Aborted => "aborted",
        }
    }
    pub fn parse(s: &str) -> Option<Self> {
        Some(match s {
            "open" => RunState::Open,
            "aborted" => RunState::Aborted,
            _ => return None,
        })
    }
    /// A stored run status: one the store writes, or [`StoreError::UnknownValue`].
    pub(crate) fn read(s: &str) -> crate::error::Result<Self> {
        RunState::parse(s).ok_or_else(|| crate::error::StoreError::UnknownValue {
            what: "run status",
            value: s.to_string(),
        })
    }
}

/// What a step (or a direct call) came to, as stored and replayed.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StepOutcome {
    pub status: StepStatus,
    /// The handler's structured result.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub result: Option<Value>,
    /// The handler's error, or why the step was refused or parked.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// The rule that refused, gated or settled it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rule: Option<Rule>,
    /// The target system's reference for what it did (a payment run id…).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub target_ref: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub latency_ms: Option<i64>,
    /// The same, in microseconds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub latency_us: Option<i64>,
    /// The approval request a parked step waits on.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub approval_id: Option<ApprovalId>,
}

impl StepOutcome {
    pub fn status(status: StepStatus) -> Self {
        StepOutcome {
            status,
            result: None,
            error: None,
            rule: None,
            target_ref: None,
            latency_ms: None,
            latency_us: None,
            approval_id: None,
        }
    }
}

/// A step as stored.
#[derive(Debug, Clone, PartialEq)]
pub struct Step {
    pub step_id: StepId,
    pub run_id: RunId,
    pub seq: i64,
    pub kind: StepKind,
    pub principal: PrincipalId,
    pub role: String,
    pub tool: String,
    pub effect: Effect,
    pub tier: Tier,
    pub purpose: Option<String>,
    pub reason: Option<String>,
    pub evidence: Vec<String>,
    pub actor: Actor,
    pub inputs: Value,
    pub input_hash: InputHash,
    pub idem_key: IdempotencyKey,
    pub status: StepStatus,
    pub attempts: i64,
    pub approval: Option<Value>,
    pub outcome: Option<StepOutcome>,
    pub compensates: Option<StepId>,
    pub created_at: Timestamp,
    pub updated_at: Timestamp,
}

/// Status of an approval request.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ApprovalStatus {
    Pending,
    Approved,
    Rejected,
    Expired,
    Consumed,
}

impl ApprovalStatus {
    pub const fn as_str(self) -> &'static str {
        match self {
            ApprovalStatus::Pending => "pending",
            ApprovalStatus::Approved => "approved",
            ApprovalStatus::Rejected => "rejected",
            ApprovalStatus::Expired => "expired",
            ApprovalStatus::Consumed => "consumed",
        }
    }
    pub fn parse(s: &str) -> Option<Self> {
        Some(match s {
            "pending" => ApprovalStatus::Pending,
            "approved" => ApprovalStatus::Approved,
            "rejected" => ApprovalStatus::Rejected,
            "expired" => ApprovalStatus::Expired,
            "consumed" => ApprovalStatus::Consumed,
            _ => return None,
        })
    }
}

/// A parked call waiting for people: exactly what will be sent, why, and the rule that gated it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ApprovalRequest {
    pub approval_id: ApprovalId,
    /// The step id (planned), or for a direct call `PRINCIPAL/KEY` (its caller and idempotency
    /// key), that the approval binds to.
    pub subject: String,
    pub run_id: Option<RunId>,
    pub principal: PrincipalId,
    pub tool: String,
    pub tool_version: String,
    pub input_hash: InputHash,
    pub inputs: Value,
    pub reason: Option<String>,
    pub evidence: Vec<String>,
    pub rule: Rule,
    pub approvers_needed: i64,
    pub approved_by: Vec<PrincipalId>,
    pub status: ApprovalStatus,
    pub created_at: Timestamp,
    pub expires_at: Timestamp,
    /// When people decided it: approved (the last approval needed), rejected or expired. A
    /// consumed approval keeps the time it was approved.
    #[serde(default)]
    pub decided_at: Option<Timestamp>,
    /// The person who rejected it. A rejected request that names nobody was closed by a
    /// model reviewer's `step.reject`, not decided by a person.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub decided_by: Option<PrincipalId>,
}

impl ApprovalRequest {
    /// The subject read as a step id: the parked planned step (a direct call's subject names
    /// no step row).
    pub fn subject_step(&self) -> StepId {
        StepId::new(self.subject.as_str())
    }
}

/// One decision a person made on an approval request.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ApprovalDecision {
    pub approval_id: ApprovalId,
    pub approver: PrincipalId,
    pub at: Timestamp,
    /// An approval given (false: a rejection).
    pub approved: bool,
}

/// Today's use of one budget counter.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct BudgetUse {
    pub principal: PrincipalId,
    pub tier: Tier,
    pub day: i64,
    pub used: i64,
}

/// Summary of one step after an executor pass.
#[derive(Debug, Clone, PartialEq)]
pub struct StepReport {
    pub step_id: StepId,
    pub status: StepStatus,
    pub outcome: Option<StepOutcome>,
    /// True when nothing ran: the recorded outcome was returned.
    pub replayed: bool,
}

/// The checks of one decision as the trace shows them.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TraceEntry {
    pub audit_seq: i64,
    pub step_id: Option<StepId>,
    pub tool: String,
    pub decision: String,
    pub status: StepStatus,
    pub checks: Vec<Check>,
}
