//! The executor: every call toolgate lets through, from the request to its audit record.
//!
//! - [`call`]: one governed call as its phases — the ledgers' view, the engine's decision,
//!   settling what does not run, reserving what does, forwarding it, recording it. Both the
//!   direct `tools/call` path ([`Executor::governed_call`]) and the planned-step queue decide
//!   through the same `prepare`.
//! - `queue`: claiming planned steps in batches (`run_batch`, `execute_step`, `drain`).
//! - `lookups`: the reads toolgate makes itself before deciding (allowed destinations, the
//!   values a write will change), outside any transaction.
//! - `recovery`, `reconcile`, `compensate`: steps whose worker died, `unknown` steps asked
//!   about by key, and undoing an aborted run.
//! - `dry`: a parked call decided again without doing anything, for the approval page.
//! - [`approve`]: people's decisions on parked calls, a grant or a rejection.
//!
//! Apart from the call's reservation phase, none of these write SQL: the ledgers they use are
//! [`crate::ledger`]'s.

use std::collections::{HashMap, HashSet};
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use toolgate_core::schema::FieldError;
use toolgate_core::why::{PurposeSource, replays};
use toolgate_core::{
    ApprovalClaims, ApprovalId, ApprovalKeys, ApprovalToken, BudgetView, CallRequest, CheckName,
    Clock, Decision, Definition, DestinationFacts, DestinationLookupCall, Effect, Engine,
    IdempotencyKey, IdempotencyState, InputHash, MAX_ATTEMPTS, PrincipalId, Registry, Rule,
    RunHistory, RunId, StepId, StepStatus, Tier, Timestamp, Verdict, canonical,
    destination_lookups,
};

use crate::audit::{self, AuditApproval, AuditCall, AuditDecision, AuditDraft, AuditWho};
use crate::db::Tx;
use crate::error::{Result, StoreError};
use crate::ledger::approvals::used_nonces;
use crate::ledger::steps::NewStep;
use crate::ledger::{runs, steps};
use crate::model::{Actor, Step, StepKind, StepOutcome, StepReport};
use crate::store::{BudgetAction, IdemAction, Ledger, Settle, Store, new_id, to_json};

/// A boxed future, so [`Handler`] stays object-safe.
pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// Where a call goes: the registry tool, and the upstream server and tool name its handler
/// declares (the gateway maps these to an MCP client).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Target {
    pub tool: String,
    pub upstream: Option<String>,
    pub upstream_tool: Option<String>,
}

/// What travels with a call in `_meta`: chosen by toolgate, never by the model.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CallMeta {
    pub idempotency_key: IdempotencyKey,
    pub run_id: RunId,
    pub step_id: StepId,
    pub approval_tokens: Vec<ApprovalToken>,
    pub principal: PrincipalId,
}

/// What a handler returned.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct HandlerOutput {
    pub result: Value,
    /// The target system's reference for what it did.
    pub target_ref: Option<String>,
}

/// How a handler call failed. The difference decides retries: an answer that says "no" is a
/// recorded failure; no answer at all may mean the effect happened.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum HandlerError {
    #[error("the call timed out without an answer")]
    Timeout,
    /// The target answered "no" (an MCP tool result with `isError`, a refused request), or the
    /// call was never sent: nothing happened.
    #[error("the call failed: {0}")]
    Failed(String),
    /// Not sent: when the call was about to go out, the upstream no longer served the tool at
    /// the definition `toolgate.lock` pins (it changed after the call was decided). Nothing
    /// happened; the call is recorded as refused by the pin, not as the target's "no".
    #[error("not sent: {0}")]
    NotPinned(String),
    /// No clean answer after the request may have reached the target (the connection broke
    /// mid-call, HTTP 5xx, an internal server error): like a timeout, the effect may have
    /// happened, so an irreversible call becomes `unknown`.
    #[error("no clean answer; the call may have happened: {0}")]
    Unanswered(String),
}

/// Something that performs tool calls: an upstream MCP server, a built-in, a test fake.
pub trait Handler: Send + Sync {
    fn call<'a>(
        &'a self,
        target: &'a Target,
        inputs: &'a Value,
        meta: &'a CallMeta,
    ) -> BoxFuture<'a, Result<HandlerOutput, HandlerError>>;

    /// How `target`'s definition is served now against `toolgate.lock`: the input of the
    /// engine's pin check. Its hash is bound into the call's decision and into approvals
    /// requested for it, so an approval given under one definition does not verify once the
    /// definition changed. A lookup, no I/O.
    fn served(&self, _target: &Target) -> Served {
        Served::Local
    }
}

/// How a handler serves a tool's definition (the owned form of [`Definition`]).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum Served {
    /// Nothing upstream to pin (a built-in, a test handler, pinning off).
    #[default]
    Local,
    /// At the pinned definition with this hash.
    Pinned(String),
    /// Its upstream has not been reached, so not checked yet.
    Unreached,
    /// Not served, and why.
    Blocked(String),
}

impl Served {
    pub fn as_definition(&self) -> Definition<'_> {
        match self {
            Served::Local => Definition::Local,
            Served::Pinned(h) => Definition::Pinned(h),
            Served::Unreached => Definition::Unreached,
            Served::Blocked(why) => Definition::Blocked(why),
        }
    }
}

/// A direct call (a `tools/call` outside a plan), as the gateway sees it after authentication.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct DirectCall {
    pub principal: PrincipalId,
    pub tool: String,
    /// The tool's inputs, without toolgate's own arguments (see `toolgate_core::why`).
    pub inputs: Value,
    /// The run: the one `_meta.run_id` names, or the principal's current run
    /// ([`Store::current_run`]). Never the connection's: keys and approvals do not depend on it.
    pub run_id: RunId,
    pub purpose: Option<String>,
    pub reason: Option<String>,
    /// Where the purpose came from (`_meta`, an argument, a default); the record names it.
    pub purpose_from: Option<PurposeSource>,
    /// Governance arguments that did not pass (the schema check refuses the call with them).
    pub argument_errors: Vec<FieldError>,
    pub evidence: Vec<String>,
    pub approvals: Vec<ApprovalToken>,
    pub actor: Actor,
}

/// How a governed call ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum CallStatus {
    /// The handler ran and answered.
    Done,
    /// The handler ran and failed (the error is stored and replayed), or timed out on a
    /// read/write (retryable).
    Failed,
    /// Timed out on an irreversible call: it may have happened; reconciliation decides.
    Unknown,
    /// The same key is done: its stored outcome (errors included) is returned, nothing ran.
    Replayed,
    /// The same key is in flight (409-like).
    InProgress,
    /// The same key was used with different inputs (422-like).
    InputsDiffer,
    /// A check refused the call.
    Refused,
    /// Parked for a person; `approval_id` names the request.
    NeedsApproval,
}

/// The answer to one governed call.
#[derive(Debug, Clone, PartialEq)]
pub struct CallResult {
    pub status: CallStatus,
    pub decision: Decision,
    pub idem_key: IdempotencyKey,
    pub step_id: Option<StepId>,
    pub outcome: Option<StepOutcome>,
    pub approval_id: Option<ApprovalId>,
    pub audit_seq: i64,
}

/// One call being decided: a claimed planned step or a direct call.
#[derive(Debug, Clone)]
pub(crate) struct Pending {
    step_id: StepId,
    pub(crate) run_id: RunId,
    seq: i64,
    kind: StepKind,
    principal: PrincipalId,
    pub(crate) tool: String,
    inputs: Value,
    idem_key: IdempotencyKey,
    purpose: Option<String>,
    reason: Option<String>,
    purpose_from: Option<PurposeSource>,
    argument_errors: Vec<FieldError>,
    evidence: Vec<String>,
    actor: Actor,
    presented: Vec<ApprovalToken>,
    attempts: i64,
    /// When the request arrived (a direct call) or its batch was claimed (a planned step).
    started: Instant,
    /// Governance latency, once the call is decided and reserved (µs).
    governance_us: Option<i64>,
    /// Allowed destinations looked up for this call (`None`: the executor's static facts).
    destinations: Option<Arc<DestinationFacts>>,
    /// Audit records of those lookups, appended before the call's own record.
    lookups: Vec<AuditDraft>,
}

impl Pending {
    fn from_step(s: &Step) -> Self {
        Pending {
            step_id: s.step_id.clone(),
            run_id: s.run_id.clone(),
            seq: s.seq,
            kind: s.kind,
            principal: s.principal.clone(),
            tool: s.tool.clone(),
            inputs: s.inputs.clone(),
            idem_key: s.idem_key.clone(),
            purpose: s.purpose.clone(),
            reason: s.reason.clone(),
            purpose_from: None,
            argument_errors: Vec::new(),
            evidence: s.evidence.clone(),
            actor: s.actor.clone(),
            presented: Vec::new(),
            attempts: s.attempts,
            started: Instant::now(),
            governance_us: None,
            destinations: None,
            lookups: Vec::new(),
        }
    }

    fn elapsed_us(&self) -> i64 {
        self.started.elapsed().as_micros() as i64
    }
}

/// Looked-up destinations per (lookup tool, canonical inputs): within one call or one claimed
/// batch, the same question is asked of the upstream once. `None`: no usable answer.
#[derive(Default)]
pub(crate) struct LookupCache(HashMap<(String, String), Option<Vec<String>>>);

/// PostgreSQL aborts one of two transactions that deadlock (SQLSTATE 40P01) or fail to
/// serialize (40001); nothing was called yet, so the whole transaction is tried again, a few
/// times, after a short pause that grows.
pub(crate) async fn retry_conflicts<T, F, Fut>(mut f: F) -> Result<T>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T>>,
{
    const TRIES: u32 = 5;
    let mut tried = 1;
    loop {
        match f().await {
            Err(e) if e.is_conflict() && tried < TRIES => {
                tracing::debug!(error = %e, tried, "transaction aborted by a conflict; again");
                tokio::time::sleep(Duration::from_millis(2u64 << tried)).await;
                tried += 1;
            }
            r => return r,
        }
    }
}

/// What deciding a pending call led to.
pub(crate) enum Prepared {
    /// Reserved: call the handler, then settle.
    Call {
        p: Pending,
        decision: Decision,
        tokens: Vec<ApprovalToken>,
        approvals: Vec<ApprovalClaims>,
    },
    /// Settled without a call (refused, parked, replayed); its audit record is written.
    Settled {
        p: Pending,
        status: CallStatus,
        decision: Decision,
        outcome: StepOutcome,
        audit_seq: i64,
    },
}

/// Points in a call's life where a test can stop the process (crash tests kill a worker
/// there). Production passes no hook.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SyncPoint {
    /// The reservation transaction committed; the handler has not been called.
    Reserved,
    /// The handler answered; the outcome is not recorded yet.
    Called,
}

/// A callback at each [`SyncPoint`].
pub type SyncHook = Arc<dyn Fn(SyncPoint) + Send + Sync>;

pub(crate) use crate::ledger::budgets::BatchCache;
pub(crate) use crate::ledger::keys::{HeldKey, KeyStep};

/// Claims, decides, calls and records. Holds the registry, the approval keys, the handler
/// and a clock; cheap to clone.
#[derive(Clone)]
pub struct Executor {
    pub store: Store,
    pub registry: Arc<Registry>,
    pub keys: Arc<ApprovalKeys>,
    pub handler: Arc<dyn Handler>,
    pub clock: Arc<dyn Clock>,
    /// Allowed destination values known up front, by input field (none by default). Fields a
    /// tool declares a `lookup` for are looked up at decision time instead (see
    /// `look_up_destinations`); a lookup that gives no answer fails closed.
    pub destinations: Arc<DestinationFacts>,
    /// Test hook at each sync point.
    pub hook: Option<SyncHook>,
    /// Bench/test switches for the safety mechanisms (all on; see [`crate::toggles`]).
    pub toggles: crate::toggles::Toggles,
}

fn outcome_of(status: StepStatus, decision: &Decision) -> StepOutcome {
    let mut o = StepOutcome::status(status);
    match &decision.verdict {
        Verdict::Deny { rule, reason, .. } | Verdict::NeedsApproval { rule, reason, .. } => {
            o.rule = Some(rule.clone());
            o.error = Some(reason.clone());
        }
        Verdict::Allow => {}
    }
    o
}

/// What recovery needs to put a call's allow decision in the chain if the process dies before
/// the call's own record: its checks, shadow rules and registry version (the approval is kept
/// in the step's `approval` column).
fn decision_json(d: &Decision) -> String {
    json!({
        "checks": d.checks,
        "shadow": d.shadow,
        "registry_version": d.registry_version,
    })
    .to_string()
}

/// The schema check (3) for toolgate's own calls — destination lookups, reconciliation and
/// compensation — whose inputs toolgate builds: inputs the tool would refuse are never sent.
/// The other checks do not apply to them (see README, "Design notes").
fn system_inputs_fit(registry: &Registry, tool: &str, inputs: &Value) -> Result<()> {
    let Some(t) = registry.tool(tool) else {
        return Err(StoreError::UnknownTool(tool.to_string()));
    };
    t.schema
        .validate(inputs)
        .map_err(|errors| StoreError::InputsUnfit {
            tool: tool.to_string(),
            errors,
        })
}

impl Executor {
    pub fn new(
        store: Store,
        registry: Arc<Registry>,
        keys: Arc<ApprovalKeys>,
        handler: Arc<dyn Handler>,
        clock: Arc<dyn Clock>,
    ) -> Self {
        Executor {
            store,
            registry,
            keys,
            handler,
            clock,
            destinations: Arc::new(DestinationFacts::default()),
            hook: None,
            toggles: Default::default(),
        }
    }

    /// The decision engine over this executor's registry and keys.
    pub fn engine(&self) -> Engine<'_> {
        Engine::new(&self.registry, &self.keys)
    }

    fn point(&self, at: SyncPoint) {
        if let Some(h) = &self.hook {
            h(at);
        }
    }

    fn target(&self, tool: &str) -> Target {
        let h = self.registry.tool(tool).map(|t| &t.config.handler);
        Target {
            tool: tool.to_string(),
            upstream: h.and_then(|h| h.upstream.clone()),
            upstream_tool: h.and_then(|h| h.tool.clone()),
        }
    }
}

pub(crate) mod approve;
mod call;
mod compensate;
mod dry;
mod lookups;
mod queue;
mod reconcile;
mod recovery;

pub(crate) use call::BatchRead;

pub use dry::DryRun;

#[cfg(test)]
mod tests;
