//! The built-in tools of the planner, worker and reviewer roles, and the binding of plan-bound
//! roles.
//!
//! - `plan.submit` (planner): a plan as data — steps with tool, inputs, purpose, justification
//!   and cited evidence — becomes a run whose steps wait for workers. It executes nothing.
//! - `step.approve` / `step.reject` (reviewer): a model's check of a planned step before a
//!   person's time is spent. Recorded; a rejection stops a step that has not run; an approval
//!   never replaces the gate.
//! - `run.status`: a run's steps, their outcomes and reviews.
//!
//! Built-ins are registry tools (`handler: {builtin: …}`), listed per role like any other, and
//! `plan.submit`, `step.approve` and `step.reject` are governed calls: every check, the key, the
//! audit record; only the handler is toolgate itself. `run.status` reads toolgate's own records
//! and, like `tools/list`, is answered without a record (a governed read would replay its first
//! answer for the rest of the session).
//!
//! A principal whose role is `plan_bound` makes no direct calls: a `tools/call` from it runs the
//! planned step it matches exactly (tool and canonical inputs, and the run when `_meta` names
//! one) through the executor, or is refused and recorded as a denial of that run.

use std::sync::Arc;

use rmcp::ErrorData;
use rmcp::model::CallToolResult;
use serde::Deserialize;
use serde_json::{Value, json};
use toolgate_core::registry::{UNPLANNED, unplanned_reason};
use toolgate_core::{
    Builtin, CheckName, Clock, PrincipalId, Registry, Rule, RunId, StepId, StepStatus,
};
use toolgate_store::{
    BoxFuture, CallMeta, DirectCall, Executor, Handler, HandlerError, HandlerOutput,
    PlanSubmission, PlannedStep, ReviewVerdict, Store, StoreError, Target, assign_worker,
    check_step,
};

use crate::render::{self, Asked, NotDone, Refusal};
use crate::server::Surface;

/// The executor a call to `tool` runs under: for a built-in, the current one with toolgate's
/// own handler in place of the upstreams.
pub(crate) fn executor_for(surface: &Surface, tool: &str) -> Executor {
    let ex = surface.executor.clone();
    match ex.registry.tool(tool).and_then(|t| t.builtin()) {
        Some(_) => Executor {
            handler: Arc::new(Builtins {
                store: ex.store.clone(),
                registry: ex.registry.clone(),
                clock: ex.clock.clone(),
            }),
            ..ex
        },
        None => ex,
    }
}

/// Answers the calls that do not take the direct governed path: `run.status`, and every call
/// of a plan-bound principal to a tool its role lists. `None`: the governed path decides.
/// Whether [`intercept`] may answer `tool` for `caller` instead of the governed call path: the
/// call's run is then checked before it (the path checks it itself, with its read of the run).
pub(crate) fn may_intercept(reg: &Registry, caller: &crate::auth::Caller, tool: &str) -> bool {
    let Some(principal) = reg.principal(&caller.principal) else {
        return false;
    };
    let Some(t) = reg.tool(tool).filter(|t| t.is_listed_for(principal.role())) else {
        return false;
    };
    matches!(t.builtin(), Some(Builtin::RunStatus | Builtin::PlanSubmit))
        || reg.is_plan_bound_call(&caller.principal, tool)
}

pub(crate) async fn intercept(
    surface: &Surface,
    call: &DirectCall,
    run_named: bool,
) -> Option<Result<CallToolResult, ErrorData>> {
    let ex = surface.executor.clone();
    let reg = ex.registry.clone();
    let principal = reg.principal(&call.principal)?;
    let tool = reg
        .tool(&call.tool)
        .filter(|t| t.is_listed_for(principal.role()))?;
    match tool.builtin() {
        Some(Builtin::RunStatus) => return Some(run_status(&ex, &reg, call, tool).await),
        Some(Builtin::PlanSubmit) => return refuse_plan(&ex, &reg, call, tool).await,
        _ => {}
    }
    if !reg.is_plan_bound_call(&call.principal, &call.tool) {
        return None;
    }
    Some(planned_call(ex, &reg, call, run_named).await)
}

fn internal(e: impl std::fmt::Display) -> ErrorData {
    tracing::error!(error = %e, "a built-in could not reach the store");
    ErrorData::internal_error(
        format!(
            "toolgate could not record or read this call, so its outcome is not confirmed: {e}"
        ),
        None,
    )
}

fn structured(v: Value) -> CallToolResult {
    render::from_stored(&v)
}

/// The answer to a call whose `_meta.run_id` names another principal's run: refused and
/// recorded outside that run (a refusal caused by one principal never counts against
/// another's run), without running anything.
pub(crate) async fn foreign_run(
    surface: &Surface,
    caller: &crate::auth::Caller,
    tool: &str,
    split: &toolgate_core::why::Split,
    run: &RunId,
) -> Result<CallToolResult, ErrorData> {
    let ex = &surface.executor;
    let detail = format!(
        "run '{run}' is not one of yours, so this call cannot join it; leave _meta.run_id out \
         (your calls then belong to your current run) or name a run you started"
    );
    let seq = ex
        .store
        .record_refusal(
            &ex.registry,
            &caller.principal,
            tool,
            &split.inputs,
            None,
            split.why.purpose.as_deref(),
            split.why.reason.as_deref(),
            &Rule::RUN_FOREIGN,
            &detail,
            ex.clock.now(),
        )
        .await
        .map_err(internal)?;
    tracing::info!(principal = %caller.principal, tool, run = %run, audit_seq = seq, "a call named another principal's run");
    Ok(Refusal::new(tool, "run", Rule::RUN_FOREIGN, detail)
        .next("name a run of your own in `_meta.run_id`, or leave it out for a new one")
        .fact("audit_seq", seq)
        .into_result())
}

// ---------------------------------------------------------------- plan-bound calls

async fn planned_call(
    ex: Executor,
    reg: &Registry,
    call: &DirectCall,
    run_named: bool,
) -> Result<CallToolResult, ErrorData> {
    let run = run_named.then_some(&call.run_id);
    let found = ex
        .store
        .assigned_step(&call.principal, &call.tool, &call.inputs, run)
        .await
        .map_err(internal)?;
    let Some(step_id) = found else {
        let detail = unplanned_reason(&call.principal, &call.tool, run_named);
        let seq = ex
            .store
            .record_refusal(
                reg,
                &call.principal,
                &call.tool,
                &call.inputs,
                Some(&call.run_id),
                call.purpose.as_deref(),
                call.reason.as_deref(),
                &UNPLANNED,
                &detail,
                ex.clock.now(),
            )
            .await
            .map_err(internal)?;
        tracing::info!(principal = %call.principal, tool = %call.tool, audit_seq = seq, "unplanned call refused");
        return Ok(Refusal::new(&call.tool, "plan", UNPLANNED, detail)
            .next(
                "run the steps of your plan exactly as planned; anything else needs a new plan \
                 from the planner",
            )
            .fact("audit_seq", seq)
            .into_result());
    };
    let report = ex.execute_step(&step_id).await.map_err(internal)?;
    // Another worker may hold the step (serve's own worker ran it the moment it was
    // approved): the retry waits for that attempt and answers with its outcome.
    let within = ex.store.config().attempt_lease();
    let step = ex
        .store
        .step_when_settled(&step_id, within)
        .await
        .map_err(internal)?;
    tracing::info!(principal = %call.principal, tool = %call.tool, step = %step_id, status = %report.status, replayed = report.replayed, "planned step executed");
    Ok(step_result(&step))
}

/// The answer for an executed (or already executed) planned step.
fn step_result(step: &toolgate_store::Step) -> CallToolResult {
    let o = step.outcome.clone();
    let rule = o.as_ref().and_then(|o| o.rule.clone()).unwrap_or_default();
    let error = o.as_ref().and_then(|o| o.error.clone()).unwrap_or_default();
    let not_done = match step.status {
        StepStatus::Done => {
            return structured(o.and_then(|o| o.result).unwrap_or_else(|| json!({})));
        }
        StepStatus::Refused => {
            return Refusal::new(
                &step.tool,
                "step",
                rule,
                format!("{error} (step {} of run {})", step.seq, step.run_id),
            )
            .fact("run_id", step.run_id.as_str())
            .fact("step_id", step.step_id.as_str())
            .fact("seq", step.seq)
            .into_result();
        }
        StepStatus::NeedsApproval => NotDone::NeedsApproval {
            approval_id: o.and_then(|o| o.approval_id).unwrap_or_default(),
            rule,
            reason: error,
            approvers_needed: None,
        },
        StepStatus::Unknown => NotDone::Unknown,
        StepStatus::Failed => NotDone::Failed { rule, error },
        StepStatus::Pending | StepStatus::Running => NotDone::InProgress,
    };
    not_done.into_result(Asked::Step(step))
}

// ---------------------------------------------------------------- plan.submit

/// A plan with a step that cannot run is refused before it is decided, naming the step and the
/// rule (`schema.maximum`, `tool.unknown`…) as a call of that tool would be refused, and the
/// refusal is recorded. `None`: the plan goes on to the governed path (which checks it again).
async fn refuse_plan(
    ex: &Executor,
    reg: &Registry,
    call: &DirectCall,
    tool: &toolgate_core::registry::Tool,
) -> Option<Result<CallToolResult, ErrorData>> {
    if tool.schema.validate(&call.inputs).is_err() {
        return None;
    }
    let plan: PlanInputs = serde_json::from_value(call.inputs.clone()).ok()?;
    let problem = plan.steps.iter().enumerate().find_map(|(i, s)| {
        let at = |rule: Rule, why: String| Some((i + 1, s.tool.clone(), rule, why));
        let worker = match assign_worker(reg, &call.principal, &s.tool, s.worker.as_deref()) {
            Ok(w) => w,
            Err(why) => return at(Rule::PLAN_WORKER, why.to_string()),
        };
        let step = PlannedStep {
            tool: s.tool.clone(),
            inputs: s.inputs.clone(),
            principal: worker.into(),
            purpose: Some(s.purpose.clone()),
            reason: None,
            evidence: Vec::new(),
            actor: Default::default(),
        };
        match check_step(reg, &step) {
            Ok(()) => None,
            Err(p) => at(p.rule, p.reason),
        }
    });
    let (n, step_tool, rule, why) = problem?;
    let reason = format!("step {n} ({step_tool}): {why}");
    let recorded = ex
        .store
        .record_refusal(
            reg,
            &call.principal,
            &call.tool,
            &redact_steps(ex, reg, &call.inputs),
            Some(&call.run_id),
            call.purpose.as_deref(),
            call.reason.as_deref(),
            &rule,
            &reason,
            ex.clock.now(),
        )
        .await;
    Some(recorded.map_err(internal).map(|seq| {
        Refusal::new(Builtin::PlanSubmit.name(), "plan", rule, reason)
            .next(
                "nothing was created; correct that step (or leave it out) and submit the plan \
                 again",
            )
            .fact("step", n)
            .fact("step_tool", step_tool)
            .fact("audit_seq", seq)
            .into_result()
    }))
}

/// A plan as the audit log may hold it: each step's inputs redacted as its own tool redacts
/// them (an IBAN in a planned step is stored as a keyed hash, as in that tool's own records).
fn redact_steps(ex: &Executor, reg: &Registry, plan: &Value) -> Value {
    let mut plan = plan.clone();
    if let Some(steps) = plan.get_mut("steps").and_then(Value::as_array_mut) {
        for step in steps {
            let paths = step
                .get("tool")
                .and_then(Value::as_str)
                .and_then(|t| reg.tool(t))
                .map(|t| t.config.redact.clone())
                .unwrap_or_default();
            if let Some(inputs) = step.get_mut("inputs") {
                *inputs = ex.store.config().redactor.redact(inputs, &paths).0;
            }
        }
    }
    plan
}

// ---------------------------------------------------------------- run.status

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RunStatusInputs {
    run_id: String,
}

async fn run_status(
    ex: &Executor,
    reg: &Registry,
    call: &DirectCall,
    tool: &toolgate_core::registry::Tool,
) -> Result<CallToolResult, ErrorData> {
    if let Err(errors) = tool.schema.validate(&call.inputs) {
        let detail: Vec<String> = errors.iter().map(|e| e.to_string()).collect();
        return Ok(Refusal::new(
            Builtin::RunStatus.name(),
            CheckName::Schema,
            Rule::SCHEMA,
            detail.join("; "),
        )
        .next("call it with the `run_id` of one of your runs")
        .into_result());
    }
    let inputs: RunStatusInputs = match serde_json::from_value(call.inputs.clone()) {
        Ok(i) => i,
        Err(e) => {
            return Ok(Refusal::new(
                Builtin::RunStatus.name(),
                CheckName::Schema,
                Rule::SCHEMA,
                format!("it takes {{run_id}}: {e}"),
            )
            .next("call it with the `run_id` of one of your runs")
            .into_result());
        }
    };
    let missing = || {
        Refusal::new(
            Builtin::RunStatus.name(),
            "run",
            Rule::RUN_UNKNOWN,
            format!("no run '{}' for '{}'", inputs.run_id, call.principal),
        )
        .next("ask for the status of a run of your own")
        .into_result()
    };
    let st = match ex.store.run_status(&RunId::from(&inputs.run_id)).await {
        Ok(s) => s,
        Err(StoreError::NotFound { .. }) => return Ok(missing()),
        Err(e) => return Err(internal(e)),
    };
    // A run is visible to whoever opened it, to the principals it assigns steps to, and to
    // reviewers (a role that lists step.approve or step.reject).
    let role = reg
        .principal(&call.principal)
        .map(|p| p.role().to_string())
        .unwrap_or_default();
    let reviewer = reg.reviews_plans(&role);
    let involved =
        st.principal == call.principal || st.steps.iter().any(|s| s.principal == call.principal);
    if !(reviewer || involved) {
        return Ok(missing());
    }
    Ok(structured(run_status_json(&st)))
}

/// `run.status`'s answer: statuses, rules and reasons, approval ids and reviews — never the
/// steps' results, which the caller's own grants may not cover.
pub fn run_status_json(st: &toolgate_store::RunStatus) -> Value {
    let mut counts = serde_json::Map::new();
    let steps: Vec<Value> = st
        .steps
        .iter()
        .map(|s| {
            let n = counts.entry(s.status.to_string()).or_insert(json!(0));
            *n = json!(n.as_i64().unwrap_or(0) + 1);
            let o = s.outcome.as_ref();
            let reviews: Vec<Value> = st
                .reviews
                .iter()
                .filter(|r| r.step_id == s.step_id)
                .map(|r| json!({"reviewer": r.reviewer, "verdict": r.verdict, "note": r.note}))
                .collect();
            json!({
                "seq": s.seq,
                "step_id": s.step_id,
                "kind": s.kind.as_str(),
                "tool": s.tool,
                "worker": s.principal,
                "purpose": s.purpose,
                "status": s.status.to_string(),
                "attempts": s.attempts,
                "rule": o.and_then(|o| o.rule.clone()),
                "reason": o.and_then(|o| o.error.clone()),
                "approval_id": o.and_then(|o| o.approval_id.clone()),
                "target_ref": o.and_then(|o| o.target_ref.clone()),
                "latency_ms": o.and_then(|o| o.latency_ms),
                "reviews": reviews,
            })
        })
        .collect();
    json!({
        "run_id": st.run_id,
        "goal": st.goal,
        "planner": st.principal,
        "status": st.status,
        "steps": steps,
        "counts": counts,
    })
}

// ---------------------------------------------------------------- the handler

/// toolgate's own handler for the governed built-ins.
struct Builtins {
    store: Store,
    registry: Arc<Registry>,
    clock: Arc<dyn Clock>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct PlanInputs {
    goal: String,
    steps: Vec<PlanStepInputs>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct PlanStepInputs {
    tool: String,
    inputs: Value,
    purpose: String,
    justification: String,
    #[serde(default)]
    evidence: Vec<String>,
    #[serde(default)]
    worker: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct ReviewInputs {
    step_id: String,
    #[serde(default)]
    note: Option<String>,
}

fn failed(msg: impl Into<String>) -> HandlerError {
    HandlerError::Failed(msg.into())
}

impl Builtins {
    async fn plan_submit(
        &self,
        inputs: &Value,
        meta: &CallMeta,
    ) -> Result<HandlerOutput, HandlerError> {
        let plan: PlanInputs = serde_json::from_value(inputs.clone())
            .map_err(|e| failed(format!("not a plan: {e}")))?;
        let mut steps = Vec::with_capacity(plan.steps.len());
        for (i, s) in plan.steps.into_iter().enumerate() {
            let worker = assign_worker(
                &self.registry,
                &meta.principal,
                &s.tool,
                s.worker.as_deref(),
            )
            .map_err(|why| failed(format!("plan refused: step {}: {why}", i + 1)))?;
            steps.push(PlannedStep {
                tool: s.tool,
                inputs: s.inputs,
                principal: worker.into(),
                purpose: Some(s.purpose),
                reason: Some(s.justification),
                evidence: s.evidence,
                actor: Default::default(),
            });
        }
        // The run id derives from the submitting call's key: a retried submission is the same run.
        let key = meta.idempotency_key.as_str();
        let hex = key.strip_prefix("sha256:").unwrap_or(key);
        let sub = PlanSubmission {
            run_id: RunId::new(format!("plan-{}", &hex[..hex.len().min(32)])),
            planner: PrincipalId::from(meta.principal.as_ref()),
            goal: plan.goal,
            steps,
        };
        let done = self
            .store
            .submit_plan(&self.registry, &sub, self.clock.now())
            .await
            .map_err(|e| match e {
                StoreError::PlanRefused(why) => failed(format!("plan refused: {why}")),
                other => failed(other.to_string()),
            })?;
        let steps: Vec<Value> = done
            .steps
            .iter()
            .zip(&sub.steps)
            .map(|((seq, id, worker), s)| json!({"seq": seq, "step_id": id, "tool": s.tool, "worker": worker}))
            .collect();
        Ok(HandlerOutput {
            result: json!({
                "run_id": done.run_id,
                "status": "submitted",
                "steps": steps,
                "next": "nothing has run: workers execute the steps through every check; follow the run with run.status",
            }),
            target_ref: Some(done.run_id.into_string()),
        })
    }

    async fn review(
        &self,
        inputs: &Value,
        meta: &CallMeta,
        verdict: ReviewVerdict,
    ) -> Result<HandlerOutput, HandlerError> {
        let r: ReviewInputs = serde_json::from_value(inputs.clone())
            .map_err(|e| failed(format!("takes {{step_id, note}}: {e}")))?;
        let note = r.note.unwrap_or_default();
        if verdict == ReviewVerdict::Rejected && note.trim().is_empty() {
            return Err(failed(
                "a rejection needs a note saying what is wrong with the step",
            ));
        }
        let step = self
            .store
            .review_step(
                &self.registry,
                &StepId::from(&r.step_id),
                &meta.principal,
                verdict,
                &note,
                self.clock.now(),
            )
            .await
            .map_err(|e| failed(e.to_string()))?;
        let effect = match (verdict, step.status) {
            (ReviewVerdict::Rejected, StepStatus::Refused) => {
                "the step is refused and will not run; its approval request, if any, is closed"
            }
            (ReviewVerdict::Rejected, _) => {
                "recorded; the step had already run, so nothing was stopped"
            }
            (ReviewVerdict::Approved, _) => {
                "recorded for the people who decide; the step still passes every check, and a \
                 person's approval where its gate asks for one"
            }
        };
        Ok(HandlerOutput {
            result: json!({
                "step_id": step.step_id,
                "run_id": step.run_id,
                "tool": step.tool,
                "verdict": verdict,
                "step_status": step.status.to_string(),
                "effect": effect,
            }),
            target_ref: Some(step.step_id.into_string()),
        })
    }
}

impl Handler for Builtins {
    fn call<'a>(
        &'a self,
        target: &'a Target,
        inputs: &'a Value,
        meta: &'a CallMeta,
    ) -> BoxFuture<'a, Result<HandlerOutput, HandlerError>> {
        Box::pin(async move {
            let builtin = self.registry.tool(&target.tool).and_then(|t| t.builtin());
            match builtin {
                Some(Builtin::PlanSubmit) => self.plan_submit(inputs, meta).await,
                Some(Builtin::StepApprove) => {
                    self.review(inputs, meta, ReviewVerdict::Approved).await
                }
                Some(Builtin::StepReject) => {
                    self.review(inputs, meta, ReviewVerdict::Rejected).await
                }
                // run.status is answered before the call reaches a handler.
                Some(Builtin::RunStatus) | None => Err(failed(format!(
                    "'{}' has no built-in handler here",
                    target.tool
                ))),
            }
        })
    }
}
