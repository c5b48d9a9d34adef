//! The executor: claims steps, decides each again with core's [`Engine`] at execution time
//! (with the allowed destinations looked up through the tool's declared read tool, outside any
//! transaction), reserves what an allowed call needs (idempotency key, budgets up the parent
//! chain, approval nonces) in the same transaction, calls the [`Handler`], and records the
//! outcome with its audit record. It also holds the direct (non-planned) governed call path the gateway uses
//! for each `tools/call`, recovery of steps whose worker died, the reconciler of `unknown`
//! steps, and run abortion with compensation.

use std::collections::{HashMap, HashSet};
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use toolgate_core::schema::FieldError;
use toolgate_core::why::{PurposeSource, replays};
use toolgate_core::{
    ApprovalClaims, ApprovalKeys, ApprovalToken, BudgetView, CallRequest, CheckName, Clock,
    Decision, DestinationFacts, DestinationLookupCall, Effect, Engine, IdempotencyKey,
    IdempotencyState, InputHash, PriorCall, PriorOutcome, Registry, RunHistory, StepStatus, Tier,
    Timestamp, Verdict, canonical, destination_lookups,
};

use crate::audit::{
    self, AuditApproval, AuditDecision, AuditDraft, AuditOutcome, AuditRecord, AuditWho, AuditWhy,
};
use crate::db::{Tx, args};
use crate::error::{Result, StoreError};
use crate::model::{Actor, Step, StepKind, StepOutcome, StepReport};
use crate::store::{
    BudgetAction, IdemAction, NewStep, Settle, Store, insert_step, new_id, parse_status,
    parse_tier, step_cols, step_from_row, to_json, used_nonces,
};

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
    pub run_id: String,
    pub step_id: String,
    pub approval_tokens: Vec<ApprovalToken>,
    pub principal: String,
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

    /// The pinned upstream definition hash `target` is served under now (`toolgate.lock`), if
    /// any: bound into the call's decision and into approvals requested for it, so an approval
    /// given under one definition does not verify once the definition changed. A lookup, no I/O.
    fn definition_hash(&self, _target: &Target) -> Option<String> {
        None
    }
}

/// A direct call (a `tools/call` outside a plan), as the gateway sees it after authentication.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct DirectCall {
    pub principal: String,
    pub tool: String,
    /// The tool's inputs, without toolgate's own arguments (see `toolgate_core::why`).
    pub inputs: Value,
    /// The run: the one `_meta.run_id` names, or the principal's current run
    /// ([`Store::current_run`]). Never the connection's: keys and approvals do not depend on it.
    pub run_id: String,
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
    pub step_id: Option<String>,
    pub outcome: Option<StepOutcome>,
    pub approval_id: Option<String>,
    pub audit_seq: i64,
}

/// One call being decided: a claimed planned step or a direct call.
#[derive(Debug, Clone)]
pub(crate) struct Pending {
    step_id: String,
    pub(crate) run_id: String,
    seq: i64,
    kind: StepKind,
    principal: String,
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

/// What a claim transaction came to.
enum Claimed {
    /// Decided and reserved in the claim's own transaction.
    Prepared(Vec<Prepared>),
    /// Claimed (committed) but not decided: some need destination lookups, which are made
    /// outside any transaction.
    NeedLookups(Vec<Pending>),
}

/// Which steps a claim takes.
#[derive(Clone, Copy)]
enum Claim<'a> {
    Queue(usize),
    Step(&'a str),
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

/// A call made, not yet recorded.
struct Called {
    status: CallStatus,
    outcome: StepOutcome,
    settle: Settle,
    draft: AuditDraft,
    p: Pending,
    decision: Decision,
}

/// One step of a run as the batch's decisions see it.
pub(crate) struct RunEntry {
    seq: i64,
    step_id: String,
    tool: String,
    tier: Tier,
    status: StepStatus,
}

/// A key's record, as the decision needs it: the first call's inputs, whether it settled and
/// with what, and whose call it was (a key a tool shares across principals is never replayed
/// to another).
pub(crate) struct HeldKey {
    input_hash: String,
    done: bool,
    outcome: Option<String>,
    step_id: String,
    principal: Option<String>,
    created_at: Option<Timestamp>,
    step_status: Option<StepStatus>,
}

/// What one claim transaction has read already: each run's steps and each principal's budget
/// use, kept current by the batch's own decisions. On SQLite the transaction holds the only
/// write lock, so this is exact; on PostgreSQL the conditional updates stay authoritative.
#[derive(Default)]
pub(crate) struct BatchCache {
    pub(crate) runs: HashMap<String, Vec<RunEntry>>,
    /// SQLite: the next step number of each run in `runs` (compensations included), read
    /// with it and advanced as this transaction adds steps.
    next_seq: HashMap<String, i64>,
    budgets: HashMap<String, HashMap<Tier, u32>>,
    ensured: HashSet<(String, Tier, i64)>,
    /// SQLite: budget increments and reservations to write when the batch commits.
    deltas: HashMap<(String, Tier, i64), u32>,
    reservations: Vec<(String, String, Tier, i64)>,
}

impl BatchCache {
    /// Writes the batched budget increments and reservations (SQLite), before commit.
    pub(crate) async fn flush(&mut self, tx: &mut Tx) -> Result<()> {
        let mut deltas: Vec<_> = self.deltas.drain().collect();
        deltas.sort();
        for ((id, tier, day), n) in deltas {
            tx.exec(
                "INSERT INTO budget_usage (principal, tier, day, used) VALUES ($1, $2, $3, 0) \
                 ON CONFLICT (principal, tier, day) DO NOTHING",
                args![&id, tier.as_str(), day],
            )
            .await?;
            tx.exec(
                "UPDATE budget_usage SET used = used + $4 WHERE principal = $1 AND tier = $2 AND day = $3",
                args![&id, tier.as_str(), day, n as i64],
            )
            .await?;
        }
        if !self.reservations.is_empty() {
            let rows: Vec<Value> = self
                .reservations
                .drain(..)
                .map(|(step, id, tier, day)| json!({"s": step, "p": id, "t": tier.as_str(), "d": day}))
                .collect();
            tx.exec(
                "INSERT INTO budget_reservations (step_id, principal, tier, day) \
                 SELECT j.value ->> 's', j.value ->> 'p', j.value ->> 't', j.value ->> 'd' \
                 FROM json_each($1) AS j",
                args![Value::Array(rows).to_string()],
            )
            .await?;
        }
        Ok(())
    }

    fn set_status(&mut self, run_id: &str, step_id: &str, status: StepStatus) {
        if let Some(entries) = self.runs.get_mut(run_id)
            && let Some(e) = entries.iter_mut().find(|e| e.step_id == step_id)
        {
            e.status = status;
        }
    }
}

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

/// Marks `check` failed in a decision the engine allowed, because the store's conditional
/// write lost a race the engine could not see (a key or the last unit of budget taken).
fn overrule(decision: &mut Decision, check: CheckName, rule: &str, reason: &str) {
    for c in decision.checks.iter_mut().filter(|c| c.name == check) {
        c.outcome = toolgate_core::Outcome::Fail;
        c.detail = reason.to_string();
        c.rule = Some(rule.to_string());
    }
    decision.verdict = Verdict::Deny {
        check,
        rule: rule.to_string(),
        reason: reason.to_string(),
    };
    decision.approvals.clear();
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

/// Frees a key held by a settled step row (steps keep their key unique): the step keeps it
/// as `KEY/STEP`, so the record of what it did stays and a new step may take the key.
async fn archive_key(tx: &mut Tx, key: &str) -> Result<()> {
    tx.exec(
        "UPDATE steps SET idem_key = idem_key || '/' || step_id WHERE idem_key = $1",
        args![key],
    )
    .await?;
    Ok(())
}

/// The schema check (3) for toolgate's own calls — destination lookups, reconciliation and
/// compensation — whose inputs toolgate builds: inputs the tool would refuse are never sent.
/// The other checks do not apply to them (see README, "Design notes").
fn system_inputs_fit(registry: &Registry, tool: &str, inputs: &Value) -> Result<(), String> {
    let Some(t) = registry.tool(tool) else {
        return Err(format!("tool '{tool}' is not in the registry"));
    };
    t.schema.validate(inputs).map_err(|errors| {
        let list: Vec<String> = errors.iter().map(ToString::to_string).collect();
        format!(
            "the inputs built for {tool} do not fit its schema: {}",
            list.join("; ")
        )
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

    /// The audit record of a read toolgate made itself (a destination lookup, the previous
    /// values before a write): allowed by no check of its own, under `rule`, with no governance
    /// time.
    fn lookup_draft(&self, lookup: &Pending, outcome: &StepOutcome, rule: String) -> AuditDraft {
        let decision = Decision {
            verdict: Verdict::Allow,
            checks: Vec::new(),
            input_hash: InputHash::of(&lookup.inputs),
            approvals: Vec::new(),
            shadow: Vec::new(),
            registry_version: self.registry.version.hash.clone(),
        };
        let mut d = self.draft(
            lookup,
            &decision,
            AuditDecision::Lookup,
            outcome,
            &[],
            &[],
            self.clock.now(),
        );
        d.why.rule = Some(rule);
        d.outcome.governance_us = None;
        d
    }

    #[allow(clippy::too_many_arguments)]
    fn draft(
        &self,
        p: &Pending,
        decision: &Decision,
        kind: AuditDecision,
        outcome: &StepOutcome,
        tokens: &[ApprovalToken],
        approvals: &[ApprovalClaims],
        now: Timestamp,
    ) -> AuditDraft {
        let reg: &Registry = &self.registry;
        let tool = reg.tool(&p.tool);
        let (inputs, redacted) = match tool {
            Some(t) => self
                .store
                .config()
                .redactor
                .redact(&p.inputs, &t.config.redact),
            None => (p.inputs.clone(), Vec::new()),
        };
        // Inputs no schema admitted (an unknown tool's, or refused by the schema check) are
        // the caller's to size: past a bound they are kept as their size and hash.
        let admitted = tool.is_some()
            && decision
                .checks
                .iter()
                .all(|c| c.name != CheckName::Schema || c.outcome == toolgate_core::Outcome::Pass);
        let inputs = if admitted {
            inputs
        } else {
            toolgate_core::clip::bounded_inputs(&inputs).into_owned()
        };
        AuditDraft {
            ts: now,
            run_id: Some(p.run_id.clone()),
            step_id: (!p.step_id.is_empty()).then(|| p.step_id.clone()),
            who: AuditWho {
                principal: p.principal.clone(),
                role: reg
                    .principal(&p.principal)
                    .map(|x| x.role().to_string())
                    .unwrap_or_default(),
                actor: p.actor.clone(),
            },
            tool: match tool {
                Some(_) => p.tool.clone(),
                None => {
                    toolgate_core::clip::clip(&p.tool, toolgate_core::clip::NAME_CHARS).into_owned()
                }
            },
            tool_version: tool.map(|t| t.config.version.clone()),
            effect: tool.map(|t| t.config.effect),
            tier: tool.map(|t| t.config.tier),
            inputs,
            redacted,
            idem_key: Some(p.idem_key.to_string()),
            why: AuditWhy {
                purpose: p.purpose.clone(),
                reason: p.reason.clone(),
                evidence: p.evidence.clone(),
                decision: kind,
                rule: decision
                    .rule()
                    .map(str::to_string)
                    .or_else(|| outcome.rule.clone()),
                checks: decision.checks.clone(),
                shadow: decision.shadow.clone(),
            },
            approval: (!approvals.is_empty()).then(|| AuditApproval {
                approvers: approvals.iter().map(|c| c.approver.clone()).collect(),
                token_fingerprints: tokens.iter().map(|t| t.fingerprint()).collect(),
            }),
            outcome: AuditOutcome {
                status: outcome.status,
                target_ref: outcome.target_ref.clone(),
                latency_ms: outcome.latency_ms,
                latency_us: outcome.latency_us,
                error: outcome.error.clone(),
                governance_us: Some(p.governance_us.unwrap_or_else(|| p.elapsed_us())),
            },
            registry_version: decision.registry_version.clone(),
        }
    }

    /// Decides one pending call inside `tx` and reserves (or settles) it.
    pub(crate) async fn prepare(
        &self,
        tx: &mut Tx,
        mut p: Pending,
        now: Timestamp,
        cache: &mut BatchCache,
    ) -> Result<Prepared> {
        let reg: &Registry = &self.registry;
        let tool = reg.tool(&p.tool);
        let principal = reg.principal(&p.principal);
        let definition = self.handler.definition_hash(&self.target(&p.tool));
        if !p.lookups.is_empty() {
            audit::append(tx, std::mem::take(&mut p.lookups)).await?;
        }

        // The run so far, as policies and rate limits see it: the steps before this one
        // (a direct call sees every step of its run). Loaded once per run per batch; the
        // batch's own decisions update it as they are taken, in order.
        if !cache.runs.contains_key(&p.run_id) {
            let rows = tx
                .rows(
                    "SELECT seq, step_id, tool, tier, status, kind FROM steps WHERE run_id = $1 \
                     ORDER BY seq",
                    args![&p.run_id],
                )
                .await?;
            let mut entries = Vec::with_capacity(rows.len());
            let mut last_seq = 0;
            for r in &rows {
                last_seq = last_seq.max(r.i64(0)?);
                if r.text(5)? == StepKind::Compensation.as_str() {
                    continue;
                }
                entries.push(RunEntry {
                    seq: r.i64(0)?,
                    step_id: r.text(1)?,
                    tool: r.text(2)?,
                    tier: parse_tier(&r.text(3)?)?,
                    status: parse_status(&r.text(4)?)?,
                });
            }
            // A refused direct call holds no step row (it must not hold its idempotency key),
            // so its refusal is read back from the audit chain: policies see every denial.
            for r in &tx
                .rows(
                    "SELECT seq, record FROM audit WHERE run_id = $1 AND step_id IS NULL ORDER BY seq",
                    args![&p.run_id],
                )
                .await?
            {
                let seq = r.i64(0)?;
                let record: AuditRecord = serde_json::from_str(&r.text(1)?).map_err(|e| {
                    StoreError::Corrupt(format!("audit record {seq} does not parse: {e}"))
                })?;
                if record.body.why.decision == AuditDecision::Deny {
                    entries.push(RunEntry {
                        seq: 0,
                        step_id: format!("audit:{}", record.seq),
                        tool: record.body.tool,
                        tier: record.body.tier.unwrap_or(Tier::Read),
                        status: StepStatus::Refused,
                    });
                }
            }
            cache.runs.insert(p.run_id.clone(), entries);
            cache.next_seq.insert(p.run_id.clone(), last_seq + 1);
        }
        let mut run = RunHistory::default();
        for e in &cache.runs[&p.run_id] {
            if e.step_id == p.step_id || (p.kind != StepKind::Direct && e.seq >= p.seq) {
                continue;
            }
            let outcome = match e.status {
                StepStatus::Refused => PriorOutcome::Denied,
                StepStatus::NeedsApproval => PriorOutcome::Gated,
                StepStatus::Pending | StepStatus::Failed => continue,
                _ => PriorOutcome::Allowed,
            };
            run.calls.push(PriorCall {
                tool: e.tool.clone(),
                tier: e.tier,
                outcome,
            });
        }

        // Today's budget use of the principal and every ancestor it draws from.
        let day = now.utc_day();
        let chain: Vec<String> = principal
            .map(|pr| {
                std::iter::once(pr.id().to_string())
                    .chain(pr.ancestors.iter().cloned())
                    .collect()
            })
            .unwrap_or_default();
        let mut budgets = BudgetView::default();
        for id in &chain {
            if !cache.budgets.contains_key(id) {
                let mut used = HashMap::new();
                for r in tx
                    .rows(
                        "SELECT tier, used FROM budget_usage WHERE principal = $1 AND day = $2",
                        args![id, day],
                    )
                    .await?
                {
                    used.insert(parse_tier(&r.text(0)?)?, r.i64(1)? as u32);
                }
                cache.budgets.insert(id.clone(), used);
            }
            for (tier, used) in &cache.budgets[id] {
                budgets.set(id, *tier, *used);
            }
        }
        if let Some(t) = tool.filter(|t| !t.windows.is_empty()) {
            budgets.windows = crate::window::load(tx, t, &chain, &p.inputs, now).await?;
        }

        // The key's state. A direct read that does not replay has no key record to look up:
        // it runs every time. A planned step's key is its own (run, seq, inputs): on its first
        // attempt no record can exist yet either.
        let input_hash = InputHash::of(&p.inputs);
        let replay = tool.is_none_or(replays);
        let mut idem = IdempotencyState::Fresh;
        let mut stored_outcome = None;
        let mut held: Option<HeldKey> = None;
        let first_attempt = p.kind == StepKind::Planned && p.attempts <= 1;
        if !first_attempt && (p.kind != StepKind::Direct || replay) {
            match self.key_state(tx, &p, now).await? {
                None => {}
                Some(h) => {
                    idem = if p.kind == StepKind::Direct
                        && h.principal.as_deref().is_some_and(|o| o != p.principal)
                    {
                        IdempotencyState::Elsewhere
                    } else if h.input_hash != input_hash.as_str() {
                        IdempotencyState::InputsDiffer
                    } else if h.done {
                        stored_outcome = h.outcome.clone();
                        IdempotencyState::Done
                    } else if self.toggles.get().reserve_before_call {
                        IdempotencyState::InFlight
                    } else {
                        IdempotencyState::Fresh
                    };
                    held = Some(h);
                }
            }
        }
        let elsewhere = held
            .as_ref()
            .filter(|_| idem == IdempotencyState::Elsewhere)
            .map(|h| {
                format!(
                    "by '{}' at {}",
                    h.principal.as_deref().unwrap_or("another principal"),
                    h.created_at
                        .map_or_else(|| "an earlier time".into(), |t| t.to_rfc3339())
                )
            });

        // Approvals: what the caller presented, plus what people granted for this subject.
        let subject = self.subject(&p);
        let mut tokens = std::mem::take(&mut p.presented);
        // A planned step on its first attempt cannot have been parked yet, so has no grants.
        let may_have_grants = p.kind == StepKind::Direct || p.attempts > 1;
        let granted = if may_have_grants {
            tx.rows(
                "SELECT g.token FROM approval_grants g JOIN approval_requests r \
                 ON r.approval_id = g.approval_id \
                 WHERE r.subject = $1 AND r.status IN ('pending', 'approved') ORDER BY g.granted_at",
                args![&subject],
            )
            .await?
        } else {
            Vec::new()
        };
        for r in granted {
            let t = ApprovalToken::from_wire(r.text(0)?);
            if !tokens.contains(&t) {
                tokens.push(t);
            }
        }
        let nonces: Vec<String> = tokens
            .iter()
            .filter_map(|t| self.keys.open(t).ok().map(|c| c.nonce))
            .collect();
        let used = used_nonces(tx, &nonces).await?;
        let destinations = p
            .destinations
            .clone()
            .unwrap_or_else(|| self.destinations.clone());
        // Decided in its own scope: the request borrows a non-`Send` closure.
        let decide = |rejection: Option<&str>| {
            let nonce_used = |n: &str| used.contains(n);
            let req = CallRequest {
                principal: &p.principal,
                tool: &p.tool,
                purpose: p.purpose.as_deref(),
                reason: p.reason.as_deref(),
                purpose_from: p.purpose_from,
                inputs: &p.inputs,
                subject: &subject,
                run: &run,
                budgets: &budgets,
                idempotency: idem,
                elsewhere: elsewhere.as_deref(),
                argument_errors: &p.argument_errors,
                rejection,
                approvals: &tokens,
                destinations: &destinations,
                definition_hash: definition.as_deref(),
                nonce_used: &nonce_used,
            };
            if self.toggles.get().approval_binding {
                self.engine().decide(&req, now)
            } else {
                let unbound = self.keys.as_ref().clone().without_input_binding();
                Engine::new(&self.registry, &unbound).decide(&req, now)
            }
        };
        let mut decision = decide(None);
        if matches!(decision.verdict, Verdict::NeedsApproval { .. })
            && let Some(rejection) = self.rejection(tx, &subject, &input_hash, now).await?
        {
            decision = decide(Some(&rejection));
        }

        match decision.verdict.clone() {
            Verdict::Allow if idem == IdempotencyState::Done => {
                let outcome: StepOutcome = stored_outcome
                    .as_deref()
                    .and_then(|t| serde_json::from_str(t).ok())
                    .ok_or_else(|| {
                        StoreError::Corrupt("a done key has no stored outcome".into())
                    })?;
                if p.kind != StepKind::Direct {
                    tx.exec(
                        "UPDATE steps SET status = $1, outcome = $2, lease_until = NULL, updated_at = $3 \
                         WHERE step_id = $4",
                        args![outcome.status.as_str(), to_json(&outcome), now.millis(), &p.step_id],
                    )
                    .await?;
                }
                let d = self.draft(
                    &p,
                    &decision,
                    AuditDecision::Replay,
                    &outcome,
                    &[],
                    &[],
                    now,
                );
                let seq = audit::append(tx, vec![d]).await?[0];
                Ok(Prepared::Settled {
                    p,
                    status: CallStatus::Replayed,
                    decision,
                    outcome,
                    audit_seq: seq,
                })
            }
            Verdict::Allow if idem == IdempotencyState::InFlight => {
                // An earlier attempt has not settled (still running, or its outcome unknown
                // until reconciliation): nothing runs, the retry hears its state. Not a denial:
                // a retry after a crash must not count against the run.
                let h = held.expect("an in-flight key was read");
                let unknown = h.step_status == Some(StepStatus::Unknown);
                let mut outcome = StepOutcome::status(if unknown {
                    StepStatus::Unknown
                } else {
                    StepStatus::Running
                });
                outcome.rule = Some(
                    if unknown {
                        "idempotency.unknown"
                    } else {
                        "idempotency.in_progress"
                    }
                    .into(),
                );
                if p.kind == StepKind::Direct {
                    p.step_id = h.step_id;
                }
                let d = self.draft(
                    &p,
                    &decision,
                    AuditDecision::Replay,
                    &outcome,
                    &[],
                    &[],
                    now,
                );
                let seq = audit::append(tx, vec![d]).await?[0];
                Ok(Prepared::Settled {
                    p,
                    status: if unknown {
                        CallStatus::Unknown
                    } else {
                        CallStatus::InProgress
                    },
                    decision,
                    outcome,
                    audit_seq: seq,
                })
            }
            Verdict::Allow => {
                let tool = tool.expect("an allowed call names a registry tool");
                match self
                    .reserve(
                        tx,
                        &mut p,
                        &decision,
                        tool.config.tier,
                        &chain,
                        &subject,
                        now,
                        cache,
                    )
                    .await?
                {
                    None => Ok(Prepared::Call {
                        p,
                        approvals: decision.approvals.clone(),
                        decision,
                        tokens,
                    }),
                    Some((status, rule, reason)) => {
                        // A race lost after the engine allowed: the record says which check
                        // ended up failing, not "allow" — except that another attempt of the
                        // same call taking the key first is no failure: nothing runs, and the
                        // retry hears that it is in progress (not a denial of the run).
                        let mut decision = decision;
                        let in_progress = status == CallStatus::InProgress;
                        if !in_progress {
                            let check = if rule.starts_with("budget.") {
                                CheckName::Budget
                            } else {
                                CheckName::Idempotency
                            };
                            overrule(&mut decision, check, &rule, &reason);
                        }
                        let mut outcome = StepOutcome::status(match status {
                            CallStatus::InProgress => StepStatus::Running,
                            _ => StepStatus::Refused,
                        });
                        outcome.rule = Some(rule);
                        outcome.error = Some(reason);
                        if p.kind != StepKind::Direct && status == CallStatus::Refused {
                            self.settle_inline(tx, &p, &outcome, now).await?;
                        }
                        let kind = if in_progress {
                            AuditDecision::Replay
                        } else {
                            AuditDecision::Deny
                        };
                        let d = self.draft(&p, &decision, kind, &outcome, &[], &[], now);
                        let seq = audit::append(tx, vec![d]).await?[0];
                        Ok(Prepared::Settled {
                            p,
                            status,
                            decision,
                            outcome,
                            audit_seq: seq,
                        })
                    }
                }
            }
            Verdict::Deny { check, .. } => {
                let status = match (check, idem) {
                    (CheckName::Idempotency, IdempotencyState::InputsDiffer) => {
                        CallStatus::InputsDiffer
                    }
                    _ => CallStatus::Refused,
                };
                let outcome = outcome_of(StepStatus::Refused, &decision);
                if p.kind != StepKind::Direct {
                    self.settle_inline(tx, &p, &outcome, now).await?;
                }
                // The gate check fails only for a call a person already rejected: the answer
                // repeats that person's decision (recorded when it was made), so it is recorded as
                // a replay, not as a new denial of the run — whether the agent retries or not
                // changes nothing about what the run may do next.
                let kind = if check == CheckName::Gate {
                    AuditDecision::Replay
                } else {
                    AuditDecision::Deny
                };
                let d = self.draft(&p, &decision, kind, &outcome, &[], &[], now);
                let seq = audit::append(tx, vec![d]).await?[0];
                Ok(Prepared::Settled {
                    p,
                    status,
                    decision,
                    outcome,
                    audit_seq: seq,
                })
            }
            Verdict::NeedsApproval {
                rule,
                approvers_needed,
                approved_by,
                ..
            } => {
                let tool = tool.expect("a gated call names a registry tool");
                // A request already open for the same exact call is reused; one that lapsed
                // is closed, and the call goes back through the gate with a new one.
                tx.exec(
                    "UPDATE approval_requests SET status = 'expired', decided_at = $1 \
                     WHERE subject = $2 AND status IN ('pending', 'approved') AND expires_at <= $1",
                    args![now.millis(), &subject],
                )
                .await?;
                let open = tx
                    .opt(
                        "SELECT approval_id FROM approval_requests WHERE subject = $1 \
                         AND input_hash = $2 AND status = 'pending'",
                        args![&subject, input_hash.as_str()],
                    )
                    .await?;
                let approval_id = match open {
                    Some(r) => r.text(0)?,
                    None => {
                        let id = new_id();
                        let needed = approvers_needed as i64 + approved_by.len() as i64;
                        tx.exec(
                            "INSERT INTO approval_requests (approval_id, subject, run_id, principal, \
                             tool, tool_version, input_hash, inputs, reason, evidence, rule, \
                             approvers_needed, status, created_at, expires_at, definition_hash, \
                             registry_version) \
                             VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, 'pending', $13, $14, $15, $16)",
                            args![
                                &id,
                                &subject,
                                &p.run_id,
                                &p.principal,
                                &p.tool,
                                &tool.config.version,
                                input_hash.as_str(),
                                canonical(&p.inputs),
                                p.reason.clone(),
                                to_json(&p.evidence),
                                &rule,
                                needed.max(1),
                                now.millis(),
                                now.plus_hours(self.store.config().approval_expiry_hours).millis(),
                                definition.clone(),
                                &decision.registry_version
                            ],
                        )
                        .await?;
                        id
                    }
                };
                let mut outcome = outcome_of(StepStatus::NeedsApproval, &decision);
                outcome.approval_id = Some(approval_id.clone());
                if p.kind != StepKind::Direct {
                    self.settle_inline(tx, &p, &outcome, now).await?;
                }
                let d = self.draft(
                    &p,
                    &decision,
                    AuditDecision::NeedsApproval,
                    &outcome,
                    &[],
                    &[],
                    now,
                );
                let seq = audit::append(tx, vec![d]).await?[0];
                Ok(Prepared::Settled {
                    p,
                    status: CallStatus::NeedsApproval,
                    decision,
                    outcome,
                    audit_seq: seq,
                })
            }
        }
    }

    /// How long a completed call of `tool` is replayed (ms): the tool's own retention or the
    /// registry's, never shorter than the approval expiry.
    fn retention_ms(&self, tool: &str) -> i64 {
        let cfg = self.store.config();
        match self
            .registry
            .tool(tool)
            .and_then(|t| t.config.idempotency.retention_hours)
        {
            Some(h) => h.max(cfg.approval_expiry_hours) * 3_600_000,
            None => cfg.retention_ms(),
        }
    }

    /// A person's rejection of this exact call (subject and inputs), within the key retention:
    /// "rejected by WHO at WHEN: NOTE".
    async fn rejection(
        &self,
        tx: &mut Tx,
        subject: &str,
        input_hash: &InputHash,
        now: Timestamp,
    ) -> Result<Option<String>> {
        let since = now.millis() - self.store.config().retention_ms();
        let row = tx
            .opt(
                "SELECT approval_id, decided_by, note, decided_at FROM approval_requests \
                 WHERE subject = $1 AND input_hash = $2 AND status = 'rejected' AND decided_at > $3 \
                 ORDER BY decided_at DESC LIMIT 1",
                args![subject, input_hash.as_str(), since],
            )
            .await?;
        let Some(r) = row else { return Ok(None) };
        let at = r.opt_i64(3)?.map_or_else(String::new, |t| {
            format!(" at {}", Timestamp::from_millis(t).to_rfc3339())
        });
        let by = r.opt_text(1)?.unwrap_or_else(|| "a person".into());
        let note = r.opt_text(2)?.filter(|n| !n.trim().is_empty());
        Ok(Some(format!(
            "request {}, rejected by {by}{at}{}",
            r.text(0)?,
            note.map(|n| format!(": {n}")).unwrap_or_default()
        )))
    }

    /// The record of `p`'s key, if it holds one. A completed key past its retention is
    /// forgotten here (its record deleted, its step's key archived as `KEY/STEP`), so the
    /// operation may be made again.
    async fn key_state(&self, tx: &mut Tx, p: &Pending, now: Timestamp) -> Result<Option<HeldKey>> {
        let Some(r) = tx
            .opt(
                "SELECT i.input_hash, i.state, i.outcome, i.expires_at, i.step_id, s.principal, \
                 s.created_at, s.status FROM idempotency i LEFT JOIN steps s ON s.step_id = i.step_id \
                 WHERE i.idem_key = $1",
                args![p.idem_key.as_str()],
            )
            .await?
        else {
            return Ok(None);
        };
        let done = r.text(1)? == "done";
        if done && r.i64(3)? <= now.millis() {
            tx.exec(
                "DELETE FROM idempotency WHERE idem_key = $1",
                args![p.idem_key.as_str()],
            )
            .await?;
            archive_key(tx, p.idem_key.as_str()).await?;
            return Ok(None);
        }
        Ok(Some(HeldKey {
            input_hash: r.text(0)?,
            done,
            outcome: r.opt_text(2)?,
            step_id: r.text(4)?,
            principal: r.opt_text(5)?,
            created_at: r.opt_i64(6)?.map(Timestamp::from_millis),
            step_status: r.opt_text(7)?.map(|t| parse_status(&t)).transpose()?,
        }))
    }

    /// The subject an approval binds to: the step id, or for a direct call the caller and its
    /// key, so an approval lets only the principal that asked run the call, also when the
    /// tool's key is shared across principals.
    fn subject(&self, p: &Pending) -> String {
        match p.kind {
            StepKind::Direct => format!("{}/{}", p.principal, p.idem_key),
            _ => p.step_id.clone(),
        }
    }

    async fn settle_inline(
        &self,
        tx: &mut Tx,
        p: &Pending,
        outcome: &StepOutcome,
        now: Timestamp,
    ) -> Result<()> {
        tx.exec(
            "UPDATE steps SET status = $1, outcome = $2, lease_until = NULL, updated_at = $3 \
             WHERE step_id = $4",
            args![
                outcome.status.as_str(),
                to_json(outcome),
                now.millis(),
                &p.step_id
            ],
        )
        .await?;
        Ok(())
    }

    /// Reserves the key, the budgets up the parent chain and the approval nonces. On a lost
    /// race returns why (and leaves nothing reserved).
    #[allow(clippy::too_many_arguments)]
    async fn reserve(
        &self,
        tx: &mut Tx,
        p: &mut Pending,
        decision: &Decision,
        tier: Tier,
        chain: &[String],
        subject: &str,
        now: Timestamp,
        cache: &mut BatchCache,
    ) -> Result<Option<(CallStatus, String, String)>> {
        let reg: &Registry = &self.registry;
        let input_hash = InputHash::of(&p.inputs);
        let retention = self.retention_ms(&p.tool);
        let expires = now.millis() + retention;
        // A direct read that does not replay takes no key: a new step every time, whose key
        // column is made unique with its id. Anything else takes the key.
        let keyed = p.kind != StepKind::Direct || reg.tool(&p.tool).is_none_or(replays);
        // A direct call's step: the one an earlier attempt of this operation left (to be
        // retried: it failed retryably), or a new one. Known before the key is taken, so the key
        // row names it from the start. An earlier step of another principal (a key shared
        // across principals), or one settled longer ago than the retention, is not this call's:
        // its key is archived and a new step made.
        let existing = if p.kind == StepKind::Direct && keyed {
            let found = match tx
                .opt(
                    "SELECT step_id, attempts, principal, updated_at, run_id FROM steps WHERE idem_key = $1",
                    args![p.idem_key.as_str()],
                )
                .await?
            {
                Some(r) if r.text(2)? == p.principal && r.i64(3)? + retention > now.millis() => {
                    // The retry is recorded in the run of the step it retries.
                    p.run_id = r.text(4)?;
                    Some((r.text(0)?, r.i64(1)?))
                }
                Some(_) => {
                    archive_key(tx, p.idem_key.as_str()).await?;
                    None
                }
                None => None,
            };
            p.step_id = found.as_ref().map_or_else(new_id, |(id, _)| id.clone());
            found
        } else {
            if p.kind == StepKind::Direct {
                p.step_id = new_id();
            }
            None
        };
        let won = if keyed {
            tx.exec(
                "INSERT INTO idempotency (idem_key, input_hash, state, outcome, step_id, created_at, expires_at) \
                 VALUES ($1, $2, 'in_flight', NULL, $3, $4, $5) ON CONFLICT (idem_key) DO NOTHING",
                args![p.idem_key.as_str(), input_hash.as_str(), &p.step_id, now.millis(), expires],
            )
            .await?
        } else {
            1
        };
        if won == 0 {
            if self.toggles.get().reserve_before_call {
                return Ok(Some((
                    CallStatus::InProgress,
                    "idempotency.in_progress".into(),
                    "the same call is in progress; check its status instead of retrying".into(),
                )));
            }
            // Reservation switched off (fault evaluation): the key row follows the newest step.
            tx.exec(
                "UPDATE idempotency SET step_id = $1 WHERE idem_key = $2",
                args![&p.step_id, p.idem_key.as_str()],
            )
            .await?;
        }

        // The step row: a planned step is already claimed; a direct call gets (or re-arms) one.
        if p.kind == StepKind::Direct {
            let tool = reg.tool(&p.tool).expect("checked by the caller");
            let role = reg
                .principal(&p.principal)
                .map(|x| x.role().to_string())
                .unwrap_or_default();
            Store::ensure_run(tx, &p.run_id, &p.principal, p.purpose.as_deref(), now).await?;
            // A direct call cannot outlast its timeout: once that (and two seconds to record the
            // outcome) has passed with the step still running, whoever made it is gone and
            // recovery may settle it.
            let cfg = self.store.config();
            let lease = now.millis()
                + cfg
                    .lease
                    .min(cfg.call_timeout + Duration::from_secs(2))
                    .as_millis() as i64;
            let allowed = decision_json(decision);
            match existing {
                Some((id, attempts)) => {
                    if attempts >= 4 {
                        tx.exec(
                            "DELETE FROM idempotency WHERE idem_key = $1",
                            args![p.idem_key.as_str()],
                        )
                        .await?;
                        return Ok(Some((
                            CallStatus::Refused,
                            "attempts.exhausted".into(),
                            "this call was attempted 4 times; it will not be retried again".into(),
                        )));
                    }
                    tx.exec(
                        "UPDATE steps SET status = 'running', attempts = attempts + 1, \
                         lease_until = $1, updated_at = $2, outcome = NULL, decision = $4 \
                         WHERE step_id = $3",
                        args![lease, now.millis(), &id, &allowed],
                    )
                    .await?;
                    p.step_id = id;
                    p.attempts = attempts + 1;
                }
                None => {
                    // On SQLite this transaction has held the only write lock since the run's
                    // steps were read, so the number read with them is still the next one.
                    let seq = match cache.next_seq.get_mut(&p.run_id).filter(|_| !tx.is_pg()) {
                        Some(next) => {
                            *next += 1;
                            *next - 1
                        }
                        None => tx
                            .opt(
                                "SELECT COALESCE(MAX(seq), 0) + 1 FROM steps WHERE run_id = $1",
                                args![&p.run_id],
                            )
                            .await?
                            .map(|r| r.i64(0))
                            .transpose()?
                            .unwrap_or(1),
                    };
                    p.seq = seq;
                    p.attempts = 1;
                    insert_step(
                        tx,
                        NewStep {
                            step_id: &p.step_id,
                            run_id: &p.run_id,
                            seq,
                            kind: StepKind::Direct,
                            principal: &p.principal,
                            role: &role,
                            tool: &p.tool,
                            effect: tool.config.effect,
                            tier: tool.config.tier,
                            purpose: p.purpose.as_deref(),
                            reason: p.reason.as_deref(),
                            evidence: &p.evidence,
                            actor: &p.actor,
                            inputs: &p.inputs,
                            idem_key: &if keyed {
                                p.idem_key.to_string()
                            } else {
                                format!("{}/{}", p.idem_key, p.step_id)
                            },
                            status: StepStatus::Running,
                            attempts: 1,
                            compensates: None,
                            lease_until: Some(lease),
                            decision: Some(&allowed),
                            now,
                        },
                    )
                    .await?;
                }
            }
        }

        if p.kind != StepKind::Direct {
            // A claimed planned step keeps its decision too, for recovery (see `decision_json`).
            tx.exec(
                "UPDATE steps SET decision = $1 WHERE step_id = $2",
                args![decision_json(decision), &p.step_id],
            )
            .await?;
        }

        // Window budgets first (`window`), so a refusal there leaves no counter to undo.
        if let Some(t) = reg.tool(&p.tool).filter(|t| !t.windows.is_empty())
            && let Some((rule, reason)) =
                crate::window::reserve(tx, t, chain, &p.principal, &p.inputs, &p.step_id, now)
                    .await?
        {
            self.unreserve_key(tx, p).await?;
            return Ok(Some((CallStatus::Refused, rule, reason)));
        }

        // Budgets: every counter in the chain that has a limit, in one order everywhere (no
        // deadlocks between workers), each a conditional increment.
        if tier != Tier::Read {
            let day = now.utc_day();
            let mut limited: Vec<(&str, u32)> = chain
                .iter()
                .filter_map(|id| {
                    reg.principal(id)
                        .and_then(|pr| pr.budget(tier))
                        .map(|l| (id.as_str(), l))
                })
                .collect();
            limited.sort();
            if !tx.is_pg() {
                // SQLite: this transaction holds the only write lock and the cache was read
                // inside it, so the check is exact; the increments are written once per
                // counter when the batch commits (`flush`).
                for (id, limit) in &limited {
                    let used = cache
                        .budgets
                        .get(*id)
                        .and_then(|m| m.get(&tier))
                        .copied()
                        .unwrap_or(0);
                    if used >= *limit {
                        crate::window::release(tx, &p.step_id).await?;
                        self.unreserve_key(tx, p).await?;
                        return Ok(Some((
                            CallStatus::Refused,
                            format!("budget.{tier}"),
                            format!(
                                "daily {tier} budget of '{id}' is used up ({limit} today); it frees at 00:00 UTC"
                            ),
                        )));
                    }
                }
                for (id, _) in &limited {
                    *cache
                        .budgets
                        .entry(id.to_string())
                        .or_default()
                        .entry(tier)
                        .or_default() += 1;
                    *cache.deltas.entry((id.to_string(), tier, day)).or_default() += 1;
                    cache
                        .reservations
                        .push((p.step_id.clone(), id.to_string(), tier, day));
                }
            } else {
                let mut taken: Vec<&str> = Vec::new();
                for (id, limit) in &limited {
                    if cache.ensured.insert((id.to_string(), tier, day)) {
                        tx.exec(
                        "INSERT INTO budget_usage (principal, tier, day, used) VALUES ($1, $2, $3, 0) \
                         ON CONFLICT (principal, tier, day) DO NOTHING",
                        args![*id, tier.as_str(), day],
                    )
                    .await?;
                    }
                    let ok = tx
                        .exec(
                            "UPDATE budget_usage SET used = used + 1 \
                         WHERE principal = $1 AND tier = $2 AND day = $3 AND used < $4",
                            args![*id, tier.as_str(), day, *limit as i64],
                        )
                        .await?;
                    if ok == 0 {
                        for t in &taken {
                            tx.exec(
                            "UPDATE budget_usage SET used = used - 1 WHERE principal = $1 AND tier = $2 AND day = $3",
                            args![*t, tier.as_str(), day],
                        )
                        .await?;
                        }
                        crate::window::release(tx, &p.step_id).await?;
                        self.unreserve_key(tx, p).await?;
                        return Ok(Some((
                            CallStatus::Refused,
                            format!("budget.{tier}"),
                            format!(
                                "daily {tier} budget of '{id}' is used up ({limit} today); it frees at 00:00 UTC"
                            ),
                        )));
                    }
                    taken.push(id);
                }
                for id in &taken {
                    *cache
                        .budgets
                        .entry(id.to_string())
                        .or_default()
                        .entry(tier)
                        .or_default() += 1;
                    tx.exec(
                    "INSERT INTO budget_reservations (step_id, principal, tier, day) VALUES ($1, $2, $3, $4)",
                    args![&p.step_id, *id, tier.as_str(), day],
                )
                .await?;
                }
            }
        }

        // Approvals: single-use, consumed here, in the transaction that starts the call.
        for c in &decision.approvals {
            let fresh = tx
                .exec(
                    "INSERT INTO consumed_nonces (nonce, subject, consumed_at) VALUES ($1, $2, $3) \
                     ON CONFLICT (nonce) DO NOTHING",
                    args![&c.nonce, subject, now.millis()],
                )
                .await?;
            if fresh == 0 {
                // Another call consumed it between our read and now: fail closed.
                return Err(StoreError::Token(toolgate_core::TokenError::Reused(
                    c.nonce.clone(),
                )));
            }
        }
        if !decision.approvals.is_empty() {
            tx.exec(
                "UPDATE approval_requests SET status = 'consumed', decided_at = COALESCE(decided_at, $1) \
                 WHERE subject = $2 AND status IN ('approved', 'pending')",
                args![now.millis(), subject],
            )
            .await?;
            let approval = json!({
                "by": decision.approvals.iter().map(|c| c.approver.clone()).collect::<Vec<_>>(),
                "at": now.millis(),
                "input_hash": decision.input_hash.as_str(),
            });
            tx.exec(
                "UPDATE steps SET approval = $1 WHERE step_id = $2",
                args![canonical(&approval), &p.step_id],
            )
            .await?;
        }
        Ok(None)
    }

    async fn unreserve_key(&self, tx: &mut Tx, p: &Pending) -> Result<()> {
        tx.exec(
            "DELETE FROM idempotency WHERE idem_key = $1 AND state = 'in_flight'",
            args![p.idem_key.as_str()],
        )
        .await?;
        if p.kind == StepKind::Direct {
            tx.exec(
                "UPDATE steps SET status = 'failed', lease_until = NULL WHERE step_id = $1",
                args![&p.step_id],
            )
            .await?;
        }
        Ok(())
    }

    /// Calls the handler for a reserved call and records the outcome (group commit).
    async fn call_and_record(
        &self,
        p: Pending,
        decision: Decision,
        tokens: Vec<ApprovalToken>,
        approvals: Vec<ApprovalClaims>,
    ) -> Result<(CallStatus, StepOutcome, i64, Pending, Decision)> {
        let c = self.call_only(p, decision, tokens, approvals).await;
        let seq = self.store.commit_record(Some(c.settle), c.draft).await?;
        Ok((c.status, c.outcome, seq, c.p, c.decision))
    }

    /// Calls the handler for a reserved call and builds its settlement and audit record.
    async fn call_only(
        &self,
        p: Pending,
        decision: Decision,
        tokens: Vec<ApprovalToken>,
        approvals: Vec<ApprovalClaims>,
    ) -> Called {
        let reg: &Registry = &self.registry;
        let tool = reg.tool(&p.tool);
        let effect = tool.map_or(Effect::Irreversible, |t| t.config.effect);
        // A read-tier call reserved no daily budget (only its window budgets, which a done call
        // keeps), so a done one has nothing to charge.
        let charge = match tool.map(|t| t.config.tier) {
            Some(Tier::Read) => BudgetAction::Hold,
            _ => BudgetAction::Charge,
        };
        let meta = CallMeta {
            idempotency_key: p.idem_key.clone(),
            run_id: p.run_id.clone(),
            step_id: p.step_id.clone(),
            approval_tokens: tokens.clone(),
            principal: p.principal.clone(),
        };
        let target = self.target(&p.tool);
        let started = Instant::now();
        // A write undone with the same tool and the previous values reads them first; one
        // whose previous values cannot be read is not made (it could not be undone).
        let unread = match tool {
            Some(t) if t.config.compensate_with.is_some() => self.read_previous(&p, t).await.err(),
            _ => None,
        };
        let res = match &unread {
            Some(_) => Err(HandlerError::Failed("not sent".into())),
            None => match tokio::time::timeout(
                self.store.config().call_timeout,
                self.handler.call(&target, &p.inputs, &meta),
            )
            .await
            {
                Ok(r) => r,
                Err(_) => Err(HandlerError::Timeout),
            },
        };
        let latency_us = started.elapsed().as_micros() as i64;
        let latency = latency_us / 1000;
        self.point(SyncPoint::Called);
        let now = self.clock.now();
        let backoff = self.store.config().retry_backoff.as_millis() as i64;
        let (status, outcome, idem, budget, retry_at) = match (res, unread) {
            (_, Some(why)) => {
                // Nothing was sent: retryable, like a call that never reached the target.
                let mut o = StepOutcome::status(StepStatus::Failed);
                o.error = Some(format!(
                    "not made: the values it would change could not be read first ({why}), so it \
                     could not be undone; retryable with the same key"
                ));
                o.rule = Some("compensate_with.unread".into());
                o.latency_ms = Some(latency);
                let retry = (p.attempts < 4).then_some(now.millis() + backoff);
                (
                    CallStatus::Failed,
                    o,
                    IdemAction::Release,
                    BudgetAction::Release,
                    retry,
                )
            }
            (Ok(out), None) => {
                let mut o = StepOutcome::status(StepStatus::Done);
                o.result = Some(out.result);
                o.target_ref = out.target_ref;
                o.latency_ms = Some(latency);
                o.latency_us = Some(latency_us);
                let stored = to_json(&o);
                (CallStatus::Done, o, IdemAction::Done(stored), charge, None)
            }
            (Err(HandlerError::Failed(msg)), None) => {
                // The target answered "no": recorded, and replayed to a retry with the same key.
                let mut o = StepOutcome::status(StepStatus::Failed);
                o.error = Some(msg);
                o.rule = Some("handler.failed".into());
                o.latency_ms = Some(latency);
                o.latency_us = Some(latency_us);
                let stored = to_json(&o);
                (
                    CallStatus::Failed,
                    o,
                    IdemAction::Done(stored),
                    BudgetAction::Release,
                    None,
                )
            }
            (Err(e @ (HandlerError::Timeout | HandlerError::Unanswered(_))), None)
                if effect == Effect::Irreversible && self.toggles.get().unknown_on_timeout =>
            {
                let mut o = StepOutcome::status(StepStatus::Unknown);
                o.error = Some(match &e {
                    HandlerError::Unanswered(why) => format!(
                        "no clean answer on an irreversible call ({why}): it may have happened; \
                         it is never retried blind and waits for reconciliation by key"
                    ),
                    _ => "timed out on an irreversible call: it may have happened; it is never \
                          retried blind and waits for reconciliation by key"
                        .into(),
                });
                o.rule = Some(match e {
                    HandlerError::Unanswered(_) => "unanswered.irreversible".into(),
                    _ => "timeout.irreversible".into(),
                });
                o.latency_ms = Some(latency);
                o.latency_us = Some(latency_us);
                (
                    CallStatus::Unknown,
                    o,
                    IdemAction::Keep,
                    BudgetAction::Hold,
                    None,
                )
            }
            (Err(e @ (HandlerError::Timeout | HandlerError::Unanswered(_))), None) => {
                let mut o = StepOutcome::status(StepStatus::Failed);
                if let HandlerError::Unanswered(why) = e {
                    o.error = Some(format!(
                        "no clean answer ({why}); retryable with the same key"
                    ));
                    o.rule = Some("unanswered.retryable".into());
                } else {
                    o.error = Some("timed out; retryable with the same key".into());
                    o.rule = Some("timeout.retryable".into());
                }
                o.latency_ms = Some(latency);
                o.latency_us = Some(latency_us);
                let retry = (p.attempts < 4).then_some(now.millis() + backoff);
                (
                    CallStatus::Failed,
                    o,
                    IdemAction::Release,
                    BudgetAction::Release,
                    retry,
                )
            }
        };
        // A direct read that does not replay took no key record: nothing to settle there.
        let idem = match tool {
            Some(t) if p.kind == StepKind::Direct && !replays(t) => IdemAction::Keep,
            _ => idem,
        };
        let settle = Settle {
            step_id: p.step_id.clone(),
            outcome: outcome.clone(),
            retry_at,
            idem_key: p.idem_key.to_string(),
            idem,
            budget,
            now,
        };
        let draft = self.draft(
            &p,
            &decision,
            AuditDecision::Allow,
            &outcome,
            &tokens,
            &approvals,
            now,
        );
        Called {
            status,
            outcome,
            settle,
            draft,
            p,
            decision,
        }
    }

    /// `compensate_with`: asks the declared read for the values the call is about to change
    /// and keeps them with the step (with a `lookup` audit record of the question), so
    /// aborting the run can set them back with the same tool.
    async fn read_previous(
        &self,
        p: &Pending,
        tool: &toolgate_core::registry::Tool,
    ) -> std::result::Result<(), String> {
        let Some(w) = &tool.config.compensate_with else {
            return Ok(());
        };
        let inputs = w.arguments(&p.inputs);
        let with: Vec<String> = inputs
            .as_object()
            .map(|o| o.keys().cloned().collect())
            .unwrap_or_default();
        let key = IdempotencyKey::for_call(&p.run_id, &w.read, &with, &inputs);
        let meta = CallMeta {
            idempotency_key: key.clone(),
            run_id: p.run_id.clone(),
            step_id: p.step_id.clone(),
            approval_tokens: Vec::new(),
            principal: p.principal.clone(),
        };
        let started = Instant::now();
        let res = match system_inputs_fit(&self.registry, &w.read, &inputs) {
            Err(why) => Err(why),
            Ok(()) => match tokio::time::timeout(
                self.store.config().call_timeout,
                self.handler.call(&self.target(&w.read), &inputs, &meta),
            )
            .await
            {
                Ok(Ok(out)) => w
                    .previous(&out.result, &p.inputs)
                    .map(|prev| (prev, out.target_ref)),
                Ok(Err(e)) => Err(e.to_string()),
                Err(_) => Err(HandlerError::Timeout.to_string()),
            },
        };
        let rule = format!("compensate_with.{}", w.read);
        let mut outcome = StepOutcome::status(if res.is_ok() {
            StepStatus::Done
        } else {
            StepStatus::Failed
        });
        outcome.latency_ms = Some(started.elapsed().as_millis() as i64);
        outcome.rule = Some(rule.clone());
        match &res {
            Ok((prev, target_ref)) => {
                outcome.result = Some(prev.clone());
                outcome.target_ref = target_ref.clone();
            }
            Err(why) => outcome.error = Some(why.clone()),
        }
        let lp = Pending {
            tool: w.read.clone(),
            inputs: inputs.clone(),
            idem_key: key,
            reason: Some(format!(
                "the values {} is about to change, to undo it",
                p.tool
            )),
            presented: Vec::new(),
            lookups: Vec::new(),
            ..p.clone()
        };
        let d = self.lookup_draft(&lp, &outcome, rule);
        let keep = async {
            let mut tx = self.store.begin().await?;
            if let Ok((prev, _)) = &res {
                tx.exec(
                    "UPDATE steps SET previous = $1 WHERE step_id = $2",
                    args![to_json(prev), &p.step_id],
                )
                .await?;
            }
            audit::append(&mut tx, vec![d]).await?;
            tx.commit().await
        };
        if let Err(e) = keep.await {
            return Err(format!("the previous values could not be stored: {e}"));
        }
        res.map(|_| ())
    }

    // ------------------------------------------------------------ the direct call path

    /// One governed `tools/call` outside a plan: derive the key, decide with the store's
    /// state, reserve, call, record, audit. Duplicates replay; a call in flight reports it;
    /// a key reused with other inputs is refused.
    pub async fn governed_call(&self, call: DirectCall) -> Result<CallResult> {
        let now = self.clock.now();
        let key = if self.toggles.get().derived_keys {
            match self.registry.tool(&call.tool) {
                Some(t) => self.registry.call_key(&call.principal, t, &call.inputs),
                // Refused as unknown; the key only labels the record.
                None => IdempotencyKey::for_call(
                    &format!("principal:{}", call.principal),
                    &call.tool,
                    &[],
                    &call.inputs,
                ),
            }
        } else {
            IdempotencyKey::from_stored(format!("minted:{}", new_id()))
        };
        let started = Instant::now();
        let mut p = Pending {
            step_id: String::new(),
            run_id: call.run_id,
            seq: 0,
            kind: StepKind::Direct,
            principal: call.principal,
            tool: call.tool,
            inputs: call.inputs,
            idem_key: key.clone(),
            purpose: call.purpose,
            reason: call.reason,
            purpose_from: call.purpose_from,
            argument_errors: call.argument_errors,
            evidence: call.evidence,
            actor: call.actor,
            presented: call.approvals,
            attempts: 0,
            started,
            governance_us: None,
            destinations: None,
            lookups: Vec::new(),
        };
        self.look_up_destinations(&mut p, &mut LookupCache::default())
            .await;
        let prepared = self.store.reserve_direct(self.clone(), p, now).await?;
        match prepared {
            Prepared::Settled {
                p,
                status,
                decision,
                outcome,
                audit_seq,
            } => Ok(CallResult {
                status,
                decision,
                idem_key: key,
                step_id: (!p.step_id.is_empty()).then_some(p.step_id),
                approval_id: outcome.approval_id.clone(),
                outcome: Some(outcome),
                audit_seq,
            }),
            Prepared::Call {
                mut p,
                decision,
                tokens,
                approvals,
            } => {
                p.governance_us = Some(p.elapsed_us());
                self.point(SyncPoint::Reserved);
                let (status, outcome, seq, p, decision) =
                    self.call_and_record(p, decision, tokens, approvals).await?;
                Ok(CallResult {
                    status,
                    decision,
                    idem_key: key,
                    step_id: Some(p.step_id),
                    outcome: Some(outcome),
                    approval_id: None,
                    audit_seq: seq,
                })
            }
        }
    }

    // ------------------------------------------------------------ planned steps

    /// Claims up to `limit` queued steps in one transaction (`FOR UPDATE SKIP LOCKED` on
    /// PostgreSQL), decides and reserves each, calls the allowed ones concurrently and records
    /// every outcome. Returns what happened to each claimed step; empty when the queue is.
    pub async fn run_batch(&self, limit: usize) -> Result<Vec<StepReport>> {
        self.claim_and_run(Claim::Queue(limit)).await
    }

    /// Executes one step by id: claims it if it is pending or retryable, otherwise returns
    /// what was recorded (a step done, refused, parked or unknown never runs again).
    pub async fn execute_step(&self, step_id: &str) -> Result<StepReport> {
        let mut out = self.claim_and_run(Claim::Step(step_id)).await?;
        if out.is_empty() {
            let s = self.store.step(step_id).await?;
            return Ok(StepReport {
                step_id: s.step_id,
                status: s.status,
                outcome: s.outcome,
                replayed: true,
            });
        }
        Ok(out.remove(0))
    }

    /// Claims, decides and reserves (one transaction, tried again on a PostgreSQL conflict),
    /// then calls the allowed steps concurrently and records every outcome. Steps whose
    /// destinations are looked up are claimed first, looked up outside any transaction, then
    /// decided in a second one.
    async fn claim_and_run(&self, by: Claim<'_>) -> Result<Vec<StepReport>> {
        let now = self.clock.now();
        let started = Instant::now();
        let prepared = match retry_conflicts(|| self.claim(by, now, started)).await? {
            Claimed::Prepared(p) => p,
            Claimed::NeedLookups(mut pending) => {
                let mut cache = LookupCache::default();
                for p in &mut pending {
                    self.look_up_destinations(p, &mut cache).await;
                }
                retry_conflicts(|| async {
                    let mut tx = self.store.begin().await?;
                    let out = self.prepare_all(&mut tx, pending.clone(), now).await?;
                    tx.commit().await?;
                    Ok(out)
                })
                .await?
            }
        };
        self.call_prepared(prepared).await
    }

    /// The claim transaction: marks the steps running (leased), then decides and reserves them
    /// in the same transaction unless one needs a destination lookup.
    async fn claim(&self, by: Claim<'_>, now: Timestamp, started: Instant) -> Result<Claimed> {
        let lease = now.millis() + self.store.config().lease.as_millis() as i64;
        let mut tx = self.store.begin().await?;
        let rows = match by {
            // `status IN ('pending', 'failed')` repeats what the OR implies so that SQLite's
            // planner uses the `steps_queue` partial index; without it the claim scanned every
            // planned step ever made and slowed as the table grew.
            Claim::Queue(limit) => {
                let sql: &'static str = if tx.is_pg() {
                    concat!(
                        "UPDATE steps SET status = 'running', attempts = attempts + 1, lease_until = $1, \
                         updated_at = $2, retry_at = NULL WHERE step_id IN (SELECT step_id FROM steps \
                         WHERE status IN ('pending', 'failed') \
                         AND (status = 'pending' OR (status = 'failed' AND retry_at IS NOT NULL AND retry_at <= $2)) \
                         AND attempts < 4 AND kind = 'planned' ORDER BY created_at, seq LIMIT $3 \
                         FOR UPDATE SKIP LOCKED) RETURNING ",
                        step_cols!()
                    )
                } else {
                    concat!(
                        "UPDATE steps SET status = 'running', attempts = attempts + 1, lease_until = $1, \
                         updated_at = $2, retry_at = NULL WHERE step_id IN (SELECT step_id FROM steps \
                         WHERE status IN ('pending', 'failed') \
                         AND (status = 'pending' OR (status = 'failed' AND retry_at IS NOT NULL AND retry_at <= $2)) \
                         AND attempts < 4 AND kind = 'planned' ORDER BY created_at, seq LIMIT $3) RETURNING ",
                        step_cols!()
                    )
                };
                tx.rows(sql, args![lease, now.millis(), limit as i64])
                    .await?
            }
            Claim::Step(step_id) => {
                tx.rows(
                    concat!(
                        "UPDATE steps SET status = 'running', attempts = attempts + 1, lease_until = $1, \
                         updated_at = $2, retry_at = NULL WHERE step_id = $3 \
                         AND status IN ('pending', 'failed') AND attempts < 4 RETURNING ",
                        step_cols!()
                    ),
                    args![lease, now.millis(), step_id],
                )
                .await?
            }
        };
        let mut claimed = rows.iter().map(step_from_row).collect::<Result<Vec<_>>>()?;
        claimed.sort_by_key(|a| (a.created_at, a.seq));
        let pending: Vec<Pending> = claimed
            .iter()
            .map(|s| Pending {
                started,
                ..Pending::from_step(s)
            })
            .collect();
        if pending.iter().any(|p| self.needs_lookups(p)) {
            tx.commit().await?;
            return Ok(Claimed::NeedLookups(pending));
        }
        let out = self.prepare_all(&mut tx, pending, now).await?;
        tx.commit().await?;
        Ok(Claimed::Prepared(out))
    }

    /// Decides and reserves claimed steps in order inside `tx` (the batch's decisions see each
    /// other), and writes the batched counters.
    async fn prepare_all(
        &self,
        tx: &mut Tx,
        pending: Vec<Pending>,
        now: Timestamp,
    ) -> Result<Vec<Prepared>> {
        let mut cache = BatchCache::default();
        let mut out = Vec::with_capacity(pending.len());
        for p in pending {
            let (run_id, step_id) = (p.run_id.clone(), p.step_id.clone());
            let prepared = self.prepare(tx, p, now, &mut cache).await?;
            let new_status = match &prepared {
                Prepared::Call { .. } => StepStatus::Running,
                Prepared::Settled { outcome, .. } => outcome.status,
            };
            cache.set_status(&run_id, &step_id, new_status);
            out.push(prepared);
        }
        cache.flush(tx).await?;
        Ok(out)
    }

    /// Calls the reserved steps concurrently; their outcomes are recorded in one commit.
    async fn call_prepared(&self, prepared: Vec<Prepared>) -> Result<Vec<StepReport>> {
        if !prepared.is_empty() {
            self.point(SyncPoint::Reserved);
        }
        let mut reports = Vec::with_capacity(prepared.len());
        let mut set = tokio::task::JoinSet::new();
        for prepared in prepared {
            match prepared {
                Prepared::Settled {
                    p, status, outcome, ..
                } => reports.push(StepReport {
                    step_id: p.step_id,
                    status: outcome.status,
                    replayed: status == CallStatus::Replayed,
                    outcome: Some(outcome),
                }),
                Prepared::Call {
                    mut p,
                    decision,
                    tokens,
                    approvals,
                } => {
                    p.governance_us = Some(p.elapsed_us());
                    let this = self.clone();
                    set.spawn(async move { this.call_only(p, decision, tokens, approvals).await });
                }
            }
        }
        let mut units = Vec::new();
        while let Some(r) = set.join_next().await {
            let c = r.map_err(|e| StoreError::Corrupt(format!("a call task panicked: {e}")))?;
            reports.push(StepReport {
                step_id: c.p.step_id.clone(),
                status: c.outcome.status,
                outcome: Some(c.outcome),
                replayed: false,
            });
            units.push((Some(c.settle), c.draft));
        }
        if !units.is_empty() {
            self.store.commit_records(units).await?;
        }
        Ok(reports)
    }

    // ------------------------------------------------------------ destination lookups

    fn needs_lookups(&self, p: &Pending) -> bool {
        self.registry.tool(&p.tool).is_some_and(|t| {
            self.registry
                .principal(&p.principal)
                .is_some_and(|pr| t.is_listed_for(pr.role()))
                && !destination_lookups(t, &p.inputs).is_empty()
        })
    }

    /// Looks up the allowed values of `p`'s looked-up destinations through each declared read
    /// tool (the same handler, outside any transaction), keeps them with `p` for its decision,
    /// and drafts one `lookup` audit record per question asked. A lookup that fails, times out
    /// or answers without the declared list leaves the field without facts: the destination
    /// check then fails closed.
    async fn look_up_destinations(&self, p: &mut Pending, cache: &mut LookupCache) {
        let Some(tool) = self.registry.tool(&p.tool) else {
            return;
        };
        // A caller the tool is not listed for is refused as for an unknown tool: nothing is
        // looked up on its behalf.
        let listed = self
            .registry
            .principal(&p.principal)
            .is_some_and(|pr| tool.is_listed_for(pr.role()));
        if !listed {
            return;
        }
        let wanted = destination_lookups(tool, &p.inputs);
        if wanted.is_empty() {
            return;
        }
        let mut facts = (*self.destinations).clone();
        for l in wanted {
            let key = (l.tool.clone(), canonical(&l.inputs));
            let values = match cache.0.get(&key) {
                Some(v) => v.clone(),
                None => {
                    let (values, draft) = self.look_up(p, &l).await;
                    p.lookups.push(draft);
                    cache.0.insert(key, values.clone());
                    values
                }
            };
            match values {
                Some(v) => {
                    facts.allowed.insert(l.field.clone(), v);
                }
                None => {
                    facts.allowed.remove(&l.field);
                }
            }
        }
        p.destinations = Some(Arc::new(facts));
    }

    async fn look_up(
        &self,
        p: &Pending,
        l: &DestinationLookupCall,
    ) -> (Option<Vec<String>>, AuditDraft) {
        let with: Vec<String> = l
            .inputs
            .as_object()
            .map(|o| o.keys().cloned().collect())
            .unwrap_or_default();
        let key = IdempotencyKey::for_call(&p.run_id, &l.tool, &with, &l.inputs);
        let meta = CallMeta {
            idempotency_key: key.clone(),
            run_id: p.run_id.clone(),
            step_id: p.step_id.clone(),
            approval_tokens: Vec::new(),
            principal: p.principal.clone(),
        };
        let target = self.target(&l.tool);
        let started = Instant::now();
        let res = match system_inputs_fit(&self.registry, &l.tool, &l.inputs) {
            Err(why) => Err(HandlerError::Failed(why)),
            Ok(()) => match tokio::time::timeout(
                self.store.config().call_timeout,
                self.handler.call(&target, &l.inputs, &meta),
            )
            .await
            {
                Ok(r) => r,
                Err(_) => Err(HandlerError::Timeout),
            },
        };
        let (values, mut outcome) = match res {
            Ok(out) => match l.allowed_in(&out.result) {
                Some(v) => {
                    let mut o = StepOutcome::status(StepStatus::Done);
                    o.target_ref = out.target_ref;
                    (Some(v), o)
                }
                None => {
                    let mut o = StepOutcome::status(StepStatus::Failed);
                    o.error = Some(format!(
                        "the answer of {} has no list of strings '{}'",
                        l.tool, l.result
                    ));
                    (None, o)
                }
            },
            Err(e) => {
                let mut o = StepOutcome::status(StepStatus::Failed);
                o.error = Some(e.to_string());
                (None, o)
            }
        };
        outcome.latency_ms = Some(started.elapsed().as_millis() as i64);
        let rule = format!("destination.{}", l.field);
        outcome.rule = Some(rule.clone());
        let lp = Pending {
            tool: l.tool.clone(),
            inputs: l.inputs.clone(),
            idem_key: key,
            reason: Some(format!(
                "allowed values of '{}' for a call of {}",
                l.field, p.tool
            )),
            presented: Vec::new(),
            lookups: Vec::new(),
            ..p.clone()
        };
        let d = self.lookup_draft(&lp, &outcome, rule);
        (values, d)
    }

    /// Runs the queue until it is empty.
    pub async fn drain(&self) -> Result<Vec<StepReport>> {
        let mut all = Vec::new();
        loop {
            let batch = self.run_batch(self.store.config().claim_batch).await?;
            if batch.is_empty() {
                return Ok(all);
            }
            all.extend(batch);
        }
    }

    // ------------------------------------------------------------ recovery and reconciliation

    fn system_draft(
        &self,
        s: &Step,
        kind: AuditDecision,
        rule: &str,
        outcome: &StepOutcome,
        now: Timestamp,
    ) -> AuditDraft {
        let p = Pending::from_step(s);
        let decision = Decision {
            verdict: Verdict::Allow,
            checks: Vec::new(),
            input_hash: s.input_hash.clone(),
            approvals: Vec::new(),
            shadow: Vec::new(),
            registry_version: self.registry.version.hash.clone(),
        };
        let mut d = self.draft(&p, &decision, kind, outcome, &[], &[], now);
        d.why.rule = Some(rule.to_string());
        d.outcome.governance_us = None;
        d
    }

    /// The allow record of a step whose call was reserved but never recorded, from the decision
    /// the reservation kept with the step (`None` for a step reserved before that was kept).
    async fn allowed_draft(
        &self,
        tx: &mut Tx,
        s: &Step,
        now: Timestamp,
    ) -> Result<Option<AuditDraft>> {
        let Some(text) = tx
            .opt(
                "SELECT decision FROM steps WHERE step_id = $1",
                args![&s.step_id],
            )
            .await?
            .map(|r| r.opt_text(0))
            .transpose()?
            .flatten()
        else {
            return Ok(None);
        };
        #[derive(serde::Deserialize)]
        struct Kept {
            checks: Vec<toolgate_core::Check>,
            #[serde(default)]
            shadow: Vec<toolgate_core::ShadowRule>,
            registry_version: String,
        }
        let kept: Kept = serde_json::from_str(&text).map_err(|e| {
            StoreError::Corrupt(format!(
                "the decision kept with step {} does not parse: {e}",
                s.step_id
            ))
        })?;
        let decision = Decision {
            verdict: Verdict::Allow,
            checks: kept.checks,
            input_hash: s.input_hash.clone(),
            approvals: Vec::new(),
            shadow: kept.shadow,
            registry_version: kept.registry_version,
        };
        let mut outcome = StepOutcome::status(StepStatus::Running);
        outcome.error = Some(
            "recorded by recovery: the call was let through, and the process stopped before its \
             outcome was recorded"
                .into(),
        );
        let mut d = self.draft(
            &Pending::from_step(s),
            &decision,
            AuditDecision::Allow,
            &outcome,
            &[],
            &[],
            now,
        );
        d.approval = s
            .approval
            .as_ref()
            .and_then(|a| a.get("by"))
            .and_then(Value::as_array)
            .map(|by| AuditApproval {
                approvers: by
                    .iter()
                    .filter_map(Value::as_str)
                    .map(str::to_string)
                    .collect(),
                token_fingerprints: Vec::new(),
            });
        d.outcome.governance_us = None;
        Ok(Some(d))
    }

    /// Settles steps whose worker died mid-call (lease expired while `running`). Nothing is
    /// re-run blind: a read goes back to the queue; a write or irreversible call may have
    /// happened, so it becomes `unknown` and waits for reconciliation by key.
    pub async fn recover_stale(&self) -> Result<Vec<StepReport>> {
        let now = self.clock.now();
        let mut tx = self.store.begin().await?;
        let rows = tx
            .rows(
                concat!(
                    "SELECT ",
                    step_cols!(),
                    " FROM steps WHERE status = 'running' AND lease_until < $1 ORDER BY seq"
                ),
                args![now.millis()],
            )
            .await?;
        let stale = rows.iter().map(step_from_row).collect::<Result<Vec<_>>>()?;
        let mut drafts = Vec::new();
        let mut reports = Vec::new();
        for s in &stale {
            // The call was let through and may have reached the target; its own record (with
            // the decision) was never written. Put the decision in the chain first.
            if let Some(allowed) = self.allowed_draft(&mut tx, s, now).await? {
                drafts.push(allowed);
            }
            let (outcome, rule) = if s.effect == Effect::Read {
                let mut o = StepOutcome::status(StepStatus::Failed);
                o.error =
                    Some("the worker stopped before recording; a read is safe to repeat".into());
                o.rule = Some("recovery.read".into());
                (o, "recovery.read")
            } else {
                let mut o = StepOutcome::status(StepStatus::Unknown);
                o.error = Some(
                    "the worker stopped before recording the outcome: the call may have happened; \
                     it waits for reconciliation by key"
                        .into(),
                );
                o.rule = Some("recovery.unknown".into());
                (o, "recovery.unknown")
            };
            let retry =
                (outcome.status == StepStatus::Failed && s.attempts < 4).then_some(now.millis());
            let settle = Settle {
                step_id: s.step_id.clone(),
                outcome: outcome.clone(),
                retry_at: retry,
                idem_key: s.idem_key.to_string(),
                idem: if outcome.status == StepStatus::Failed {
                    IdemAction::Release
                } else {
                    IdemAction::Keep
                },
                budget: if outcome.status == StepStatus::Failed {
                    BudgetAction::Release
                } else {
                    BudgetAction::Hold
                },
                now,
            };
            crate::store::apply_settle(&mut tx, &settle).await?;
            drafts.push(self.system_draft(s, AuditDecision::Recovery, rule, &outcome, now));
            reports.push(StepReport {
                step_id: s.step_id.clone(),
                status: outcome.status,
                outcome: Some(outcome),
                replayed: false,
            });
        }
        audit::append(&mut tx, drafts).await?;
        tx.commit().await?;
        Ok(reports)
    }

    /// The reconciler: for each `unknown` step whose tool declares a reconciling read tool,
    /// asks the target by idempotency key (`{"idempotency_key": KEY}`; the answer's `found`
    /// says whether the call landed), or, for a tool declaring a `reconcile_query`, asks its
    /// read with arguments from the call's inputs and looks in the answer's list for an item
    /// whose `match` fields equal the call's inputs (found: the item is the call's result). Found → `done`, budget charged; not found, once the step
    /// has been unknown for `reconcile_quiet` (a late commit may land until then) → `failed`,
    /// budget released and retryable, because now it is known not to have happened. A step
    /// whose lookup fails, or whose tool has no reconciling tool, stays `unknown` for a person.
    pub async fn reconcile(&self) -> Result<Vec<StepReport>> {
        let unknown = {
            let mut tx = self.store.begin().await?;
            let rows = tx
                .rows(
                    concat!(
                        "SELECT ",
                        step_cols!(),
                        " FROM steps WHERE status = 'unknown' ORDER BY updated_at, seq"
                    ),
                    args![],
                )
                .await?;
            tx.commit().await?;
            rows.iter().map(step_from_row).collect::<Result<Vec<_>>>()?
        };
        let mut reports = Vec::new();
        for s in unknown {
            let Some(tool) = self.registry.tool(&s.tool) else {
                continue;
            };
            // By key when the target answers by key; else a query over what it did, matched
            // against the call's inputs.
            let query = tool.config.reconcile_query.clone();
            let (lookup, inputs) = match (&tool.config.reconcile, &query) {
                (Some(by_key), _) => (
                    by_key.clone(),
                    json!({"idempotency_key": s.idem_key.as_str()}),
                ),
                (None, Some(q)) => (q.tool.clone(), q.arguments(&s.inputs)),
                (None, None) => continue,
            };
            let meta = CallMeta {
                idempotency_key: s.idem_key.clone(),
                run_id: s.run_id.clone(),
                step_id: s.step_id.clone(),
                approval_tokens: Vec::new(),
                principal: s.principal.clone(),
            };
            if let Err(why) = system_inputs_fit(&self.registry, &lookup, &inputs) {
                tracing::error!(step = %s.step_id, %why, "not reconciled: a person must settle it");
                continue;
            }
            let target = self.target(&lookup);
            let answer = match tokio::time::timeout(
                self.store.config().call_timeout,
                self.handler.call(&target, &inputs, &meta),
            )
            .await
            {
                Ok(Ok(out)) => out,
                _ => continue, // no answer: still unknown
            };
            let now = self.clock.now();
            let (found, result) = match &query {
                Some(q) if tool.config.reconcile.is_none() => {
                    match q.find(&answer.result, &s.inputs) {
                        Ok(item) => (item.is_some(), item.cloned().unwrap_or(Value::Null)),
                        Err(why) => {
                            tracing::error!(step = %s.step_id, %why, "not reconciled: a person must settle it");
                            continue; // no usable answer: still unknown
                        }
                    }
                }
                _ => (
                    answer
                        .result
                        .get("found")
                        .and_then(Value::as_bool)
                        .unwrap_or(false),
                    answer.result.clone(),
                ),
            };
            // A late commit can still land a while after the call went unanswered: "not
            // found" is believed only once that while has passed.
            let quiet = self
                .store
                .config()
                .reconcile_quiet
                .unwrap_or(self.store.config().call_timeout);
            if !found && now.millis() - s.updated_at.millis() < quiet.as_millis() as i64 {
                continue;
            }
            let (outcome, idem, budget, retry) = if found {
                let mut o = StepOutcome::status(StepStatus::Done);
                o.target_ref = answer.target_ref.clone();
                o.result = Some(result);
                o.rule = Some(format!("reconciled.{lookup}"));
                let stored = to_json(&o);
                (o, IdemAction::Done(stored), BudgetAction::Charge, None)
            } else {
                let mut o = StepOutcome::status(StepStatus::Failed);
                o.error = Some(format!(
                    "{lookup} says the call never landed; it may be retried"
                ));
                o.rule = Some(format!("reconciled.{lookup}"));
                let retry = (s.attempts < 4).then_some(now.millis());
                (o, IdemAction::Release, BudgetAction::Release, retry)
            };
            let settle = Settle {
                step_id: s.step_id.clone(),
                outcome: outcome.clone(),
                retry_at: retry,
                idem_key: s.idem_key.to_string(),
                idem,
                budget,
                now,
            };
            let draft = self.system_draft(
                &s,
                AuditDecision::Reconcile,
                &format!("reconciled.{lookup}"),
                &outcome,
                now,
            );
            self.store.commit_record(Some(settle), draft).await?;
            reports.push(StepReport {
                step_id: s.step_id.clone(),
                status: outcome.status,
                outcome: Some(outcome),
                replayed: false,
            });
        }
        Ok(reports)
    }

    /// Aborts a run: steps not yet run are refused, then each done `write` step's compensating
    /// tool is called, newest first, each recorded as a compensation step with its own audit
    /// record. Returns the compensation steps.
    pub async fn abort_run(&self, run_id: &str, note: &str) -> Result<Vec<StepReport>> {
        let now = self.clock.now();
        let mut tx = self.store.begin().await?;
        let n = tx
            .exec(
                "UPDATE runs SET status = 'aborted', updated_at = $1 WHERE run_id = $2",
                args![now.millis(), run_id],
            )
            .await?;
        if n == 0 {
            return Err(StoreError::NotFound {
                what: "run",
                id: run_id.to_string(),
            });
        }
        let mut refused = StepOutcome::status(StepStatus::Refused);
        refused.rule = Some("run.aborted".into());
        refused.error = Some(format!("the run was aborted: {note}"));
        tx.exec(
            "UPDATE steps SET status = 'refused', outcome = $1, retry_at = NULL, updated_at = $2 \
             WHERE run_id = $3 AND status IN ('pending', 'failed', 'needs_approval')",
            args![to_json(&refused), now.millis(), run_id],
        )
        .await?;
        let rows = tx
            .rows(
                concat!(
                    "SELECT ",
                    step_cols!(),
                    " FROM steps WHERE run_id = $1 AND status = 'done' AND effect = 'write' \
                     AND kind <> 'compensation' ORDER BY seq DESC"
                ),
                args![run_id],
            )
            .await?;
        let done = rows.iter().map(step_from_row).collect::<Result<Vec<_>>>()?;
        let mut next_seq = tx
            .opt(
                "SELECT COALESCE(MAX(seq), 0) FROM steps WHERE run_id = $1",
                args![run_id],
            )
            .await?
            .map(|r| r.i64(0))
            .transpose()?
            .unwrap_or(0);
        let mut todo = Vec::new();
        for s in &done {
            let Some(tool) = self.registry.tool(&s.tool) else {
                continue;
            };
            if tool.config.compensate_with.is_some() {
                // The same tool, with the values read before the write set back.
                let previous = tx
                    .opt(
                        "SELECT previous FROM steps WHERE step_id = $1",
                        args![&s.step_id],
                    )
                    .await?
                    .map(|r| r.opt_text(0))
                    .transpose()?
                    .flatten();
                let Some(previous) = previous else {
                    tracing::error!(step = %s.step_id, "no previous values kept: a person must undo it");
                    continue;
                };
                let previous: Value = serde_json::from_str(&previous).map_err(|e| {
                    StoreError::Corrupt(format!(
                        "the previous values kept with step {} do not parse: {e}",
                        s.step_id
                    ))
                })?;
                let inputs = toolgate_core::config::CompensateWithConfig::compensation_inputs(
                    &s.inputs, &previous,
                );
                todo.push((tool.name().to_string(), tool, inputs, s));
                continue;
            }
            let Some(comp) = tool.config.compensate.clone() else {
                continue;
            };
            let Some(comp_tool) = self.registry.tool(&comp) else {
                continue;
            };
            // The compensating call takes the fields its schema names, from the original
            // inputs first, then from what the call returned.
            let mut inputs = serde_json::Map::new();
            if let Some(props) = comp_tool
                .config
                .input_schema
                .get("properties")
                .and_then(Value::as_object)
            {
                for name in props.keys() {
                    let v = s.inputs.get(name).cloned().or_else(|| {
                        s.outcome
                            .as_ref()
                            .and_then(|o| o.result.as_ref())
                            .and_then(|r| r.get(name).cloned())
                    });
                    if let Some(v) = v {
                        inputs.insert(name.clone(), v);
                    }
                }
            }
            todo.push((comp, comp_tool, Value::Object(inputs), s));
        }
        let mut calls = Vec::new();
        for (comp, comp_tool, inputs, s) in todo {
            next_seq += 1;
            let key = IdempotencyKey::for_step(
                run_id,
                next_seq as u32,
                &json!({"compensates": s.step_id, "inputs": inputs}),
            );
            let id = new_id();
            let lease = now.millis() + self.store.config().lease.as_millis() as i64;
            insert_step(
                &mut tx,
                NewStep {
                    step_id: &id,
                    run_id,
                    seq: next_seq,
                    kind: StepKind::Compensation,
                    principal: &s.principal,
                    role: &s.role,
                    tool: &comp,
                    effect: comp_tool.config.effect,
                    tier: comp_tool.config.tier,
                    purpose: s.purpose.as_deref(),
                    reason: Some(note),
                    evidence: &[],
                    actor: &Actor::default(),
                    inputs: &inputs,
                    idem_key: key.as_str(),
                    status: StepStatus::Running,
                    attempts: 1,
                    compensates: Some(&s.step_id),
                    lease_until: Some(lease),
                    decision: None,
                    now,
                },
            )
            .await?;
            calls.push((id, key, comp, inputs, s.clone()));
        }
        tx.commit().await?;

        let mut reports = Vec::new();
        for (id, key, comp, inputs, original) in calls {
            let meta = CallMeta {
                idempotency_key: key.clone(),
                run_id: run_id.to_string(),
                step_id: id.clone(),
                approval_tokens: Vec::new(),
                principal: original.principal.clone(),
            };
            let target = self.target(&comp);
            let started = Instant::now();
            let res = match system_inputs_fit(&self.registry, &comp, &inputs) {
                // Never sent: recorded failed, for a person to undo by hand.
                Err(why) => Err(HandlerError::Failed(why)),
                Ok(()) => match tokio::time::timeout(
                    self.store.config().call_timeout,
                    self.handler.call(&target, &inputs, &meta),
                )
                .await
                {
                    Ok(r) => r,
                    Err(_) => Err(HandlerError::Timeout),
                },
            };
            let now = self.clock.now();
            let mut outcome = match res {
                Ok(out) => {
                    let mut o = StepOutcome::status(StepStatus::Done);
                    o.result = Some(out.result);
                    o.target_ref = out.target_ref;
                    o
                }
                Err(HandlerError::Failed(e)) => {
                    let mut o = StepOutcome::status(StepStatus::Failed);
                    o.error = Some(e);
                    o
                }
                Err(HandlerError::Timeout) => {
                    let mut o = StepOutcome::status(StepStatus::Unknown);
                    o.error = Some("the compensation timed out; check the target".into());
                    o
                }
                Err(HandlerError::Unanswered(e)) => {
                    let mut o = StepOutcome::status(StepStatus::Unknown);
                    o.error = Some(format!(
                        "the compensation got no clean answer ({e}); check the target"
                    ));
                    o
                }
            };
            outcome.latency_ms = Some(started.elapsed().as_millis() as i64);
            outcome.rule = Some(format!("compensates.{}", original.step_id));
            let step = Step {
                step_id: id.clone(),
                seq: 0,
                kind: StepKind::Compensation,
                tool: comp.clone(),
                inputs: inputs.clone(),
                idem_key: key.clone(),
                input_hash: InputHash::of(&inputs),
                reason: Some(note.to_string()),
                ..original.clone()
            };
            let settle = Settle {
                step_id: id.clone(),
                outcome: outcome.clone(),
                retry_at: None,
                idem_key: key.to_string(),
                idem: IdemAction::Keep,
                budget: BudgetAction::Hold,
                now,
            };
            let draft = self.system_draft(
                &step,
                AuditDecision::Compensation,
                &format!("compensates.{}", original.step_id),
                &outcome,
                now,
            );
            self.store.commit_record(Some(settle), draft).await?;
            reports.push(StepReport {
                step_id: id,
                status: outcome.status,
                outcome: Some(outcome),
                replayed: false,
            });
        }
        Ok(reports)
    }
}

/// A parked call decided again now, without doing anything: what would happen if people
/// approved it.
#[derive(Debug, Clone)]
pub struct DryRun {
    /// The decision of every check under the registry serving now and the run as it stands.
    pub decision: Decision,
}

impl DryRun {
    /// The rule that would refuse the call once approved (a failing check other than the gate).
    pub fn refused_by(&self) -> Option<(&str, &str)> {
        match &self.decision.verdict {
            Verdict::Deny { rule, reason, .. } => Some((rule.as_str(), reason.as_str())),
            _ => None,
        }
    }
}

impl Executor {
    /// Asks a read tool on behalf of the approval page (the decision facts of a parked call),
    /// through the same handler as destination lookups, with the tool's schema checked first
    /// and the store's call timeout.
    pub async fn look_up_for_approval(
        &self,
        principal: &str,
        run_id: Option<&str>,
        tool: &str,
        inputs: &Value,
    ) -> std::result::Result<Value, String> {
        system_inputs_fit(&self.registry, tool, inputs)?;
        let with: Vec<String> = inputs
            .as_object()
            .map(|o| o.keys().cloned().collect())
            .unwrap_or_default();
        let run = run_id.unwrap_or("approval-page");
        let meta = CallMeta {
            idempotency_key: IdempotencyKey::for_call(run, tool, &with, inputs),
            run_id: run.to_string(),
            step_id: String::new(),
            approval_tokens: Vec::new(),
            principal: principal.to_string(),
        };
        let target = self.target(tool);
        match tokio::time::timeout(
            self.store.config().call_timeout,
            self.handler.call(&target, inputs, &meta),
        )
        .await
        {
            Ok(Ok(out)) => Ok(out.result),
            Ok(Err(e)) => Err(e.to_string()),
            Err(_) => Err(format!("{tool} did not answer in time")),
        }
    }

    /// Decides a parked call again, dry: the same gathering and every check as when it runs
    /// (run so far, budgets, windows, idempotency, destination lookups), inside a transaction
    /// that is rolled back, so nothing is reserved, recorded or sent. The approval page shows
    /// its verdict before anyone approves.
    pub async fn dry_decide(&self, req: &crate::model::ApprovalRequest) -> Result<DryRun> {
        let now = self.clock.now();
        let mut p = match self.store.step(&req.subject).await {
            Ok(s) => Pending::from_step(&s),
            Err(StoreError::NotFound { .. }) => {
                let key = req
                    .subject
                    .strip_prefix(&format!("{}/", req.principal))
                    .unwrap_or(&req.subject)
                    .to_string();
                // A direct call's purpose is recorded with its gated attempt.
                let purpose = match &req.run_id {
                    Some(run) => self
                        .store
                        .audit_records(None, Some(run))
                        .await?
                        .into_iter()
                        .rev()
                        .find(|r| r.body.idem_key.as_deref() == Some(key.as_str()))
                        .and_then(|r| r.body.why.purpose),
                    None => None,
                };
                Pending {
                    step_id: String::new(),
                    run_id: req.run_id.clone().unwrap_or_default(),
                    seq: 0,
                    kind: StepKind::Direct,
                    principal: req.principal.clone(),
                    tool: req.tool.clone(),
                    inputs: req.inputs.clone(),
                    idem_key: IdempotencyKey::from_stored(key),
                    purpose,
                    reason: req.reason.clone(),
                    purpose_from: None,
                    argument_errors: Vec::new(),
                    evidence: req.evidence.clone(),
                    actor: Actor::default(),
                    presented: Vec::new(),
                    attempts: 1,
                    started: Instant::now(),
                    governance_us: None,
                    destinations: None,
                    lookups: Vec::new(),
                }
            }
            Err(e) => return Err(e),
        };
        self.look_up_destinations(&mut p, &mut LookupCache::default())
            .await;
        let mut tx = self.store.begin().await?;
        let prepared = self
            .prepare(&mut tx, p, now, &mut BatchCache::default())
            .await;
        // Dropped, never committed: the dry run leaves no trace.
        drop(tx);
        let decision = match prepared? {
            Prepared::Call { decision, .. } | Prepared::Settled { decision, .. } => decision,
        };
        Ok(DryRun { decision })
    }
}

#[cfg(test)]
mod tests {
    use std::borrow::Cow;
    use std::sync::atomic::{AtomicU32, Ordering};

    use super::*;

    /// A database error carrying only a SQLSTATE.
    #[derive(Debug)]
    struct Sqlstate(&'static str);

    impl std::fmt::Display for Sqlstate {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            write!(f, "SQLSTATE {}", self.0)
        }
    }

    impl std::error::Error for Sqlstate {}

    impl sqlx::error::DatabaseError for Sqlstate {
        fn message(&self) -> &str {
            "test"
        }
        fn code(&self) -> Option<Cow<'_, str>> {
            Some(Cow::Borrowed(self.0))
        }
        fn as_error(&self) -> &(dyn std::error::Error + Send + Sync + 'static) {
            self
        }
        fn as_error_mut(&mut self) -> &mut (dyn std::error::Error + Send + Sync + 'static) {
            self
        }
        fn into_error(self: Box<Self>) -> Box<dyn std::error::Error + Send + Sync + 'static> {
            self
        }
        fn kind(&self) -> sqlx::error::ErrorKind {
            sqlx::error::ErrorKind::Other
        }
    }

    fn db_error(code: &'static str) -> StoreError {
        StoreError::Db(sqlx::Error::Database(Box::new(Sqlstate(code))))
    }

    #[test]
    fn deadlocks_and_serialization_failures_are_conflicts() {
        assert!(db_error("40P01").is_conflict());
        assert!(db_error("40001").is_conflict());
        assert!(!db_error("23505").is_conflict());
        assert!(!StoreError::WriterGone.is_conflict());
    }

    #[tokio::test]
    async fn a_conflict_is_tried_again_a_bounded_number_of_times() {
        // Two deadlocks, then the transaction goes through.
        let tries = AtomicU32::new(0);
        let r = retry_conflicts(|| async {
            match tries.fetch_add(1, Ordering::SeqCst) {
                0 | 1 => Err(db_error("40P01")),
                n => Ok(n),
            }
        })
        .await;
        assert_eq!(r.unwrap(), 2);
        assert_eq!(tries.load(Ordering::SeqCst), 3);

        // Always aborted: given up after five tries, with the conflict.
        let tries = AtomicU32::new(0);
        let r: Result<()> = retry_conflicts(|| async {
            tries.fetch_add(1, Ordering::SeqCst);
            Err(db_error("40001"))
        })
        .await;
        assert!(r.unwrap_err().is_conflict());
        assert_eq!(tries.load(Ordering::SeqCst), 5);

        // Any other error is not tried again.
        let tries = AtomicU32::new(0);
        let r: Result<()> = retry_conflicts(|| async {
            tries.fetch_add(1, Ordering::SeqCst);
            Err(db_error("23505"))
        })
        .await;
        assert!(r.is_err());
        assert_eq!(tries.load(Ordering::SeqCst), 1);
    }
}
