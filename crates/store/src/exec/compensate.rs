//! Aborting a run: its steps not yet run are refused, and each done `write` step is undone by
//! its compensating tool (or by itself with the values read before it), newest first, each
//! as a compensation step with its own audit record.

use toolgate_core::registry::Tool;

use super::*;

/// The call that undoes a done write step: which tool, with which inputs.
struct Compensation<'a> {
    tool: String,
    declared: &'a Tool,
    inputs: Value,
    undoes: &'a Step,
}

/// A compensation step opened (running, committed), to be called.
struct Opened {
    step_id: StepId,
    key: IdempotencyKey,
    tool: String,
    inputs: Value,
    undoes: Step,
}

impl Executor {
    /// Aborts a run: steps not yet run are refused, then each done `write` step's compensating
    /// tool is called, newest first, each recorded as a compensation step with its own audit
    /// record. Returns the compensation steps.
    pub async fn abort_run(&self, run_id: &RunId, note: &str) -> Result<Vec<StepReport>> {
        let now = self.clock.now();
        let mut tx = self.store.begin().await?;
        let done = self.stop_run(&mut tx, run_id, note, now).await?;
        let mut planned = Vec::new();
        for s in &done {
            if let Some(c) = self.compensation_for(&mut tx, s).await? {
                planned.push(c);
            }
        }
        let opened = self
            .open_compensations(&mut tx, run_id, note, planned, now)
            .await?;
        tx.commit().await?;
        let mut reports = Vec::with_capacity(opened.len());
        for o in opened {
            reports.push(self.compensate(run_id, note, o).await?);
        }
        Ok(reports)
    }

    /// Marks the run aborted and refuses its steps not yet run; returns its done `write`
    /// steps, newest first.
    async fn stop_run(
        &self,
        tx: &mut Tx,
        run_id: &str,
        note: &str,
        now: Timestamp,
    ) -> Result<Vec<Step>> {
        if !runs::abort(tx, run_id, now).await? {
            return Err(StoreError::NotFound {
                what: "run",
                id: run_id.to_string(),
            });
        }
        let mut refused = StepOutcome::status(StepStatus::Refused);
        refused.rule = Some(Rule::RUN_ABORTED);
        refused.error = Some(format!("the run was aborted: {note}"));
        steps::refuse_unrun_of_run(tx, run_id, &refused, now).await?;
        steps::done_writes(tx, run_id).await
    }

    /// The call that undoes `s`: its own tool with the values read before the write set back
    /// (`compensate_with`), or its declared compensating tool with the fields its schema names,
    /// from the original inputs first, then from what the call returned. `None`: nothing
    /// declared, or no previous values were kept (a person must undo it).
    async fn compensation_for<'a>(
        &'a self,
        tx: &mut Tx,
        s: &'a Step,
    ) -> Result<Option<Compensation<'a>>> {
        let Some(tool) = self.registry.tool(&s.tool) else {
            return Ok(None);
        };
        if tool.config.compensate_with.is_some() {
            let Some(previous) = steps::previous(tx, &s.step_id).await? else {
                tracing::error!(step = %s.step_id, "no previous values kept: a person must undo it");
                return Ok(None);
            };
            let previous: Value =
                serde_json::from_str(&previous).map_err(|source| StoreError::Unparsable {
                    what: format!("the previous values kept with step {}", s.step_id),
                    source,
                })?;
            let inputs = toolgate_core::config::CompensateWithConfig::compensation_inputs(
                &s.inputs, &previous,
            );
            return Ok(Some(Compensation {
                tool: tool.name().to_string(),
                declared: tool,
                inputs,
                undoes: s,
            }));
        }
        let Some(comp) = tool.config.compensate.clone() else {
            return Ok(None);
        };
        let Some(comp_tool) = self.registry.tool(&comp) else {
            return Ok(None);
        };
        let mut inputs = serde_json::Map::new();
        let names = comp_tool
            .config
            .input_schema
            .get("properties")
            .and_then(Value::as_object);
        for name in names.into_iter().flat_map(|p| p.keys()) {
            let returned = || {
                s.outcome
                    .as_ref()
                    .and_then(|o| o.result.as_ref())
                    .and_then(|r| r.get(name).cloned())
            };
            if let Some(v) = s.inputs.get(name).cloned().or_else(returned) {
                inputs.insert(name.clone(), v);
            }
        }
        Ok(Some(Compensation {
            tool: comp,
            declared: comp_tool,
            inputs: Value::Object(inputs),
            undoes: s,
        }))
    }

    /// Opens a running compensation step for each planned call, numbered after the run's last
    /// step, each with its own key and lease.
    async fn open_compensations(
        &self,
        tx: &mut Tx,
        run_id: &str,
        note: &str,
        planned: Vec<Compensation<'_>>,
        now: Timestamp,
    ) -> Result<Vec<Opened>> {
        let mut seq = runs::next_seq(tx, run_id).await? - 1;
        let mut opened = Vec::with_capacity(planned.len());
        for c in planned {
            seq += 1;
            let s = c.undoes;
            let key = IdempotencyKey::for_step(
                run_id,
                seq as u32,
                &json!({"compensates": s.step_id, "inputs": c.inputs}),
            );
            let id = new_id();
            let lease = now.millis() + self.store.config().lease.as_millis() as i64;
            steps::insert(
                tx,
                NewStep {
                    step_id: &id,
                    run_id,
                    seq,
                    kind: StepKind::Compensation,
                    principal: &s.principal,
                    role: &s.role,
                    tool: &c.tool,
                    effect: c.declared.config.effect,
                    tier: c.declared.config.tier,
                    purpose: s.purpose.as_deref(),
                    reason: Some(note),
                    evidence: &[],
                    actor: &Actor::default(),
                    inputs: &c.inputs,
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
            opened.push(Opened {
                step_id: StepId::new(id),
                key,
                tool: c.tool,
                inputs: c.inputs,
                undoes: s.clone(),
            });
        }
        Ok(opened)
    }

    /// Calls one opened compensation and records what came back (never retried: a failure or
    /// an unclear answer is for a person to look at).
    async fn compensate(&self, run_id: &RunId, note: &str, o: Opened) -> Result<StepReport> {
        let meta = CallMeta {
            idempotency_key: o.key.clone(),
            run_id: run_id.clone(),
            step_id: o.step_id.clone(),
            approval_tokens: Vec::new(),
            principal: o.undoes.principal.clone(),
        };
        let target = self.target(&o.tool);
        let started = Instant::now();
        let res = match system_inputs_fit(&self.registry, &o.tool, &o.inputs) {
            // Never sent: recorded failed, for a person to undo by hand.
            Err(why) => Err(HandlerError::Failed(why.to_string())),
            Ok(()) => match tokio::time::timeout(
                self.store.config().call_timeout,
                self.handler.call(&target, &o.inputs, &meta),
            )
            .await
            {
                Ok(r) => r,
                Err(_) => Err(HandlerError::Timeout),
            },
        };
        let now = self.clock.now();
        let rule = Rule::compensates(&o.undoes.step_id);
        let mut outcome = compensation_outcome(res);
        outcome.latency_ms = Some(started.elapsed().as_millis() as i64);
        outcome.rule = Some(rule.clone());
        let step = Step {
            step_id: o.step_id.clone(),
            seq: 0,
            kind: StepKind::Compensation,
            tool: o.tool,
            input_hash: InputHash::of(&o.inputs),
            inputs: o.inputs,
            idem_key: o.key.clone(),
            reason: Some(note.to_string()),
            ..o.undoes
        };
        let settle = Settle {
            step_id: o.step_id.clone(),
            outcome: outcome.clone(),
            retry_at: None,
            idem_key: o.key.to_string(),
            idem: IdemAction::Keep,
            budget: BudgetAction::Hold,
            now,
        };
        let draft = self.system_draft(&step, AuditDecision::Compensation, &rule, &outcome, now);
        self.store
            .commit_record(Some(Ledger::Settle(settle)), draft)
            .await?;
        Ok(StepReport {
            step_id: o.step_id,
            status: outcome.status,
            outcome: Some(outcome),
            replayed: false,
        })
    }
}

/// What a compensating call's answer makes of its step.
fn compensation_outcome(res: std::result::Result<HandlerOutput, HandlerError>) -> StepOutcome {
    match res {
        Ok(out) => StepOutcome {
            result: Some(out.result),
            target_ref: out.target_ref,
            ..StepOutcome::status(StepStatus::Done)
        },
        Err(HandlerError::Failed(e)) => StepOutcome {
            error: Some(e),
            ..StepOutcome::status(StepStatus::Failed)
        },
        Err(HandlerError::NotPinned(e)) => StepOutcome {
            error: Some(e),
            rule: Some(Rule::PIN_BLOCKED),
            ..StepOutcome::status(StepStatus::Failed)
        },
        Err(HandlerError::Timeout) => StepOutcome {
            error: Some("the compensation timed out; check the target".into()),
            ..StepOutcome::status(StepStatus::Unknown)
        },
        Err(HandlerError::Unanswered(e)) => StepOutcome {
            error: Some(format!(
                "the compensation got no clean answer ({e}); check the target"
            )),
            ..StepOutcome::status(StepStatus::Unknown)
        },
    }
}
