//! Plans as data. A planner submits steps — tool, inputs, the principal that executes each,
//! purpose, justification, cited evidence — and submitting creates a run whose steps wait in the
//! queue: nothing executes here. Workers claim them through the [`crate::Executor`], so a planned
//! step meets the same checks as any call. A model reviewer's verdict is recorded beside the
//! step: a rejection stops a step that has not run; an approval never stands in for a person's.

use serde::Serialize;
use serde_json::Value;
use toolgate_core::{
    IdempotencyKey, InputHash, PrincipalId, PrincipalKind, Registry, Rule, RunId, StepId,
    StepStatus, Timestamp,
};

use crate::audit::{AuditCall, AuditDraft, AuditWho};
use crate::db::Pool;
use crate::error::{Result, StoreError};
use crate::ledger::steps::NewStep;
use crate::ledger::{approvals, plans, runs, steps};
use crate::model::{PlannedStep, RunState, Step, StepKind, StepOutcome};
use crate::store::{Store, new_id};

/// A plan as submitted, with every step's executing principal resolved (see [`assign_worker`]).
#[derive(Debug, Clone, PartialEq)]
pub struct PlanSubmission {
    /// Chosen by the caller: the gateway derives it from the submitting call's idempotency key,
    /// so a retried submission names the same run and creates nothing new.
    pub run_id: RunId,
    pub planner: PrincipalId,
    pub goal: String,
    pub steps: Vec<PlannedStep>,
}

/// What a submission created (or, for a retry of the same plan, had created).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct SubmittedPlan {
    pub run_id: RunId,
    /// `(seq, step_id, executing principal)` in order.
    pub steps: Vec<(i64, StepId, PrincipalId)>,
    /// True when this exact plan was already submitted under this run id.
    pub existing: bool,
}

/// A reviewer's verdict on a step.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum ReviewVerdict {
    Approved,
    Rejected,
}

impl ReviewVerdict {
    pub fn as_str(self) -> &'static str {
        match self {
            ReviewVerdict::Approved => "approved",
            ReviewVerdict::Rejected => "rejected",
        }
    }
    pub(crate) fn parse(s: &str) -> Result<Self> {
        match s {
            "approved" => Ok(ReviewVerdict::Approved),
            "rejected" => Ok(ReviewVerdict::Rejected),
            other => Err(StoreError::UnknownValue {
                what: "review verdict",
                value: other.to_string(),
            }),
        }
    }
}

/// One review of a step, as stored.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Review {
    pub step_id: StepId,
    pub reviewer: PrincipalId,
    pub verdict: ReviewVerdict,
    pub note: String,
    pub reviewed_at: Timestamp,
}

/// A run as `run.status` reports it.
#[derive(Debug, Clone, PartialEq)]
pub struct RunStatus {
    pub run_id: RunId,
    /// The principal that opened the run (the planner, for a submitted plan).
    pub principal: PrincipalId,
    /// The goal, for a submitted plan.
    pub goal: Option<String>,
    pub status: RunState,
    pub steps: Vec<Step>,
    pub reviews: Vec<Review>,
}

/// Whether `planner` may hand a step to `id`: itself, or an agent in a plan-bound role.
pub fn may_execute(registry: &Registry, planner: &str, id: &str) -> bool {
    registry.principal(id).is_some_and(|p| {
        p.config.kind == PrincipalKind::Agent
            && (id == planner || registry.role(p.role()).is_some_and(|r| r.plan_bound))
    })
}

/// Who executes a planned step when the plan names nobody: the one agent in a plan-bound role
/// whose tools include it, or else the planner itself if its own role lists the tool. A plan
/// may only hand a step to the planner or to a plan-bound agent — never to a person or to an
/// agent that may act on its own, or a planner could borrow their grants.
pub fn assign_worker(
    registry: &Registry,
    planner: &str,
    tool: &str,
    named: Option<&str>,
) -> Result<String> {
    let may_execute = |id: &str| may_execute(registry, planner, id);
    let lists = |id: &str| {
        registry
            .principal(id)
            .zip(registry.tool(tool))
            .is_some_and(|(p, t)| t.is_listed_for(p.role()))
    };
    if let Some(id) = named {
        if !may_execute(id) {
            return Err(StoreError::NotAWorker {
                principal: id.to_string(),
            });
        }
        if !lists(id) {
            return Err(StoreError::NotListedFor {
                tool: tool.to_string(),
                principal: id.to_string(),
            });
        }
        return Ok(id.to_string());
    }
    let bound: Vec<&str> = registry
        .principals()
        .iter()
        .map(|p| p.id())
        .filter(|id| *id != planner && may_execute(id) && lists(id))
        .collect();
    match bound.as_slice() {
        [one] => Ok(one.to_string()),
        [] if lists(planner) => Ok(planner.to_string()),
        [] => Err(StoreError::NoWorker {
            tool: tool.to_string(),
        }),
        many => Err(StoreError::SeveralWorkers {
            tool: tool.to_string(),
            workers: many.iter().map(|w| w.to_string()).collect(),
        }),
    }
}

/// Why a step cannot be part of a plan: the rule (`tool.unknown`, `schema.<keyword>`) and what
/// is wrong.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StepProblem {
    pub rule: Rule,
    pub reason: String,
}

/// Checks one step against the registry: a tool (not a built-in) its executing principal may
/// call, and inputs that pass the tool's own closed schema. The reason names what is wrong.
pub fn check_step(registry: &Registry, step: &PlannedStep) -> std::result::Result<(), StepProblem> {
    let unknown = || StepProblem {
        rule: Rule::TOOL_UNKNOWN,
        reason: format!("unknown tool '{}' for '{}'", step.tool, step.principal),
    };
    let tool = registry
        .tool(&step.tool)
        .filter(|t| t.builtin().is_none())
        .ok_or_else(unknown)?;
    let principal = registry.principal(&step.principal).ok_or_else(unknown)?;
    if !tool.is_listed_for(principal.role()) {
        return Err(unknown());
    }
    tool.schema
        .validate(&step.inputs)
        .map_err(|errors| StepProblem {
            rule: Rule::schema(&errors[0].constraint),
            reason: format!(
                "inputs fail the schema of '{}': {}",
                step.tool,
                errors
                    .iter()
                    .map(|e| e.to_string())
                    .collect::<Vec<_>>()
                    .join("; ")
            ),
        })
}

fn plan_hash(sub: &PlanSubmission) -> String {
    let steps: Vec<Value> = sub
        .steps
        .iter()
        .map(|s| {
            serde_json::json!({
                "tool": s.tool, "inputs": s.inputs, "principal": s.principal,
                "purpose": s.purpose, "reason": s.reason, "evidence": s.evidence,
            })
        })
        .collect();
    InputHash::of(&serde_json::json!({"goal": sub.goal, "planner": sub.planner, "steps": steps}))
        .as_str()
        .to_string()
}

impl Store {
    /// Stores a plan: its run, one queued step per planned call (each with its derived key) and
    /// the plan's goal, in one transaction; on PostgreSQL the commit wakes waiting workers.
    /// Every step is checked first ([`check_step`]); the first that fails refuses the whole plan,
    /// naming the step. Submitting the same plan under the same run id again changes nothing.
    pub async fn submit_plan(
        &self,
        registry: &Registry,
        sub: &PlanSubmission,
        now: Timestamp,
    ) -> Result<SubmittedPlan> {
        if sub.steps.is_empty() {
            return Err(StoreError::PlanRefused(
                "a plan needs at least one step".into(),
            ));
        }
        for (i, s) in sub.steps.iter().enumerate() {
            if !may_execute(registry, &sub.planner, &s.principal) {
                return Err(StoreError::PlanRefused(format!(
                    "step {} ({}): '{}' cannot execute planned steps: a step goes to the planner \
                     itself or to an agent in a plan-bound role",
                    i + 1,
                    s.tool,
                    s.principal
                )));
            }
            check_step(registry, s).map_err(|p| {
                StoreError::PlanRefused(format!("step {} ({}): {}", i + 1, s.tool, p.reason))
            })?;
        }
        let hash = plan_hash(sub);
        let mut tx = self.begin().await?;
        if let Some(held) = plans::hash_of(&mut tx, &sub.run_id).await? {
            drop(tx);
            if held != hash {
                return Err(StoreError::PlanRefused(format!(
                    "run {} already holds a different plan; a changed plan is a new submission",
                    sub.run_id
                )));
            }
            let steps = self.steps(&sub.run_id).await?;
            return Ok(SubmittedPlan {
                run_id: sub.run_id.clone(),
                steps: steps
                    .into_iter()
                    .map(|s| (s.seq, s.step_id, s.principal))
                    .collect(),
                existing: true,
            });
        }
        runs::open(&mut tx, &sub.run_id, &sub.planner, None, now).await?;
        plans::insert(&mut tx, &sub.run_id, &sub.planner, &sub.goal, &hash, now).await?;
        let mut created = Vec::with_capacity(sub.steps.len());
        for (i, s) in sub.steps.iter().enumerate() {
            let seq = i as u32 + 1;
            let tool = registry.tool(&s.tool).expect("checked above");
            let role = registry
                .principal(&s.principal)
                .map(|p| p.role().to_string())
                .expect("checked above");
            let step_id = StepId::new(new_id());
            let key = IdempotencyKey::for_step(&sub.run_id, seq, &s.inputs);
            steps::insert(
                &mut tx,
                NewStep::queued(
                    &step_id,
                    &sub.run_id,
                    seq,
                    s,
                    &role,
                    tool,
                    s.purpose.as_deref(),
                    key.as_str(),
                    now,
                ),
            )
            .await?;
            created.push((seq as i64, step_id, s.principal.clone()));
        }
        // Delivered at commit: waiting workers claim the new steps at once.
        steps::signal_queued(&mut tx, &sub.run_id).await?;
        tx.commit().await?;
        Ok(SubmittedPlan {
            run_id: sub.run_id.clone(),
            steps: created,
            existing: false,
        })
    }

    /// A run with its steps, the plan's goal and every review of its steps.
    pub async fn run_status(&self, run_id: &RunId) -> Result<RunStatus> {
        let mut c = self.inner.pool.conn().await?;
        let run = runs::summary(&mut c, run_id)
            .await?
            .ok_or_else(|| StoreError::NotFound {
                what: "run",
                id: run_id.to_string(),
            })?;
        let reviews = plans::reviews_of_run(&mut c, run_id).await?;
        drop(c);
        Ok(RunStatus {
            run_id: run_id.clone(),
            principal: PrincipalId::new(run.principal),
            goal: run.goal,
            status: run.status,
            steps: self.steps(run_id).await?,
            reviews,
        })
    }

    /// Every reviewer's verdict on one step, oldest first (none for a direct call's key).
    pub async fn step_reviews(&self, step_id: &StepId) -> Result<Vec<Review>> {
        let mut c = self.inner.pool.conn().await?;
        plans::reviews_of_step(&mut c, step_id).await
    }

    /// Records a reviewer's verdict on a planned step. A rejection refuses the step if it has
    /// not run (pending, parked for a person, or waiting to retry) and closes its open approval
    /// request, so no person spends time on it; the step's trace records why. An approval is a
    /// note for the people who decide: it changes no status and issues no token. One verdict
    /// per reviewer and step; repeating the same verdict is a no-op.
    pub async fn review_step(
        &self,
        registry: &Registry,
        step_id: &StepId,
        reviewer: &PrincipalId,
        verdict: ReviewVerdict,
        note: &str,
        now: Timestamp,
    ) -> Result<Step> {
        let mut tx = self.begin().await?;
        let step = steps::by_id(&mut tx, step_id)
            .await?
            .filter(|s| s.kind == StepKind::Planned)
            .ok_or_else(|| StoreError::NotFound {
                what: "planned step",
                id: step_id.to_string(),
            })?;
        if !plans::add_review(&mut tx, step_id, reviewer, verdict, note, now).await? {
            let before = plans::verdict_of(&mut tx, step_id, reviewer).await?;
            drop(tx);
            if before == Some(verdict) {
                return self.step(step_id).await;
            }
            return Err(StoreError::AlreadyReviewed {
                step: step_id.to_string(),
                verdict: before.map(|v| v.as_str().to_string()).unwrap_or_default(),
            });
        }
        if verdict == ReviewVerdict::Rejected {
            let mut outcome = StepOutcome::status(StepStatus::Refused);
            outcome.rule = Some(Rule::REVIEW_REJECTED);
            outcome.error = Some(format!("rejected by reviewer {reviewer}: {note}"));
            if steps::refuse_unrun(&mut tx, step_id, &outcome, now).await? {
                approvals::close_pending(&mut tx, step_id, now).await?;
                let declared = registry.tool(&step.tool);
                let call = AuditCall {
                    run_id: Some(step.run_id.clone()),
                    step_id: Some(step.step_id.clone()),
                    effect: Some(step.effect),
                    tier: Some(step.tier),
                    idem_key: Some(step.idem_key.to_string()),
                    purpose: step.purpose.clone(),
                    ..AuditCall::new(AuditWho::of(registry, reviewer), &step.tool, declared)
                };
                let draft = AuditDraft::rejection(
                    now,
                    call,
                    Rule::REVIEW_REJECTED,
                    note,
                    outcome.error.clone(),
                    None,
                    registry.version.hash.clone(),
                );
                crate::audit::append(&mut tx, vec![draft]).await?;
            }
        }
        tx.commit().await?;
        self.step(step_id).await
    }

    /// The planned step assigned to `principal` that this exact call (tool and canonical
    /// inputs, and run when one is named) is: one still to run first, else one already run
    /// (whose recorded outcome a repeated call gets back).
    pub async fn assigned_step(
        &self,
        principal: &PrincipalId,
        tool: &str,
        inputs: &Value,
        run_id: Option<&RunId>,
    ) -> Result<Option<StepId>> {
        let hash = InputHash::of(inputs);
        let mut c = self.inner.pool.conn().await?;
        let mut first_run = None;
        for s in steps::assigned(&mut c, principal, tool, &hash).await? {
            if run_id.is_some_and(|want| *want != s.run_id) {
                continue;
            }
            if matches!(s.status, StepStatus::Pending | StepStatus::Failed) {
                return Ok(Some(StepId::new(s.step_id)));
            }
            if first_run.is_none() {
                first_run = Some(StepId::new(s.step_id));
            }
        }
        Ok(first_run)
    }

    /// Records a call refused before the executor saw it — a plan-bound principal's call that
    /// matches none of its planned steps (`plan.unplanned`), a plan with a step that cannot run
    /// (`schema.…`, `tool.unknown`). It counts as a denial of the run it names, so the run's
    /// policies see it.
    #[allow(clippy::too_many_arguments)]
    pub async fn record_refusal(
        &self,
        registry: &Registry,
        principal: &PrincipalId,
        tool: &str,
        inputs: &Value,
        run_id: Option<&RunId>,
        purpose: Option<&str>,
        reason: Option<&str>,
        rule: &Rule,
        detail: &str,
        now: Timestamp,
    ) -> Result<i64> {
        let t = registry.tool(tool);
        let (inputs, redacted) = match t {
            Some(t) => self.config().redactor.redact(inputs, &t.config.redact),
            None => (inputs.clone(), Vec::new()),
        };
        let tool = match t {
            Some(_) => tool.to_string(),
            None => toolgate_core::clip::clip(tool, toolgate_core::clip::NAME_CHARS).into_owned(),
        };
        let call = AuditCall {
            run_id: run_id.cloned(),
            inputs,
            redacted,
            purpose: purpose.map(str::to_string),
            reason: reason.map(str::to_string),
            ..AuditCall::new(AuditWho::of(registry, principal), tool, t)
        };
        let version = registry.version.hash.clone();
        let draft = AuditDraft::refusal(now, call, rule.clone(), Some(detail.to_string()), version);
        Ok(self.append_audit(vec![draft]).await?[0])
    }

    /// What a worker waits on between empty claims: a LISTEN on PostgreSQL (woken by plan
    /// submissions and approvals), a short poll on SQLite.
    pub async fn work_signal(&self) -> WorkSignal {
        WorkSignal {
            pool: self.inner.pool.clone(),
            listener: None,
        }
    }
}

/// See [`Store::work_signal`]. The PostgreSQL listener is opened on first use, kept between
/// waits (notifications sent while the worker was busy are buffered, not lost) and reopened
/// after a lost connection.
pub struct WorkSignal {
    pool: Pool,
    listener: Option<sqlx::postgres::PgListener>,
}

impl WorkSignal {
    /// Opens the listener now (PostgreSQL), so nothing sent after this call is missed.
    pub async fn listen(&mut self) -> Result<()> {
        if let (Pool::Postgres(pool, _), None) = (&self.pool, &self.listener) {
            let mut l = sqlx::postgres::PgListener::connect_with(pool).await?;
            l.listen("toolgate_steps").await?;
            self.listener = Some(l);
        }
        Ok(())
    }

    /// Waits until there may be work, at most `timeout` (SQLite: at most `poll`).
    pub async fn wait(&mut self, timeout: std::time::Duration, poll: std::time::Duration) {
        if matches!(self.pool, Pool::Sqlite(..)) {
            tokio::time::sleep(timeout.min(poll)).await;
            return;
        }
        if let Err(e) = self.listen().await {
            tracing::warn!(error = %e, "cannot LISTEN for work; polling");
            tokio::time::sleep(timeout.min(poll)).await;
            return;
        }
        let l = self.listener.as_mut().expect("listening");
        match tokio::time::timeout(timeout, l.recv()).await {
            Ok(Ok(_)) => while l.next_buffered().is_some() {},
            Ok(Err(e)) => {
                tracing::warn!(error = %e, "the LISTEN connection failed; reopening");
                self.listener = None;
            }
            Err(_) => {}
        }
    }
}
