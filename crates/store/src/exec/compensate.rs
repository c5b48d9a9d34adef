//! Aborting a run: its steps not yet run are refused, and each done `write` step is undone by
//! its compensating tool (or by itself with the values read before it), newest first, each
//! as a compensation step with its own audit record.

use super::*;

impl Executor {
    /// Aborts a run: steps not yet run are refused, then each done `write` step's compensating
    /// tool is called, newest first, each recorded as a compensation step with its own audit
    /// record. Returns the compensation steps.
    pub async fn abort_run(&self, run_id: &str, note: &str) -> Result<Vec<StepReport>> {
        let now = self.clock.now();
        let mut tx = self.store.begin().await?;
        if !runs::abort(&mut tx, run_id, now).await? {
            return Err(StoreError::NotFound {
                what: "run",
                id: run_id.to_string(),
            });
        }
        let mut refused = StepOutcome::status(StepStatus::Refused);
        refused.rule = Some("run.aborted".into());
        refused.error = Some(format!("the run was aborted: {note}"));
        steps::refuse_unrun_of_run(&mut tx, run_id, &refused, now).await?;
        let done = steps::done_writes(&mut tx, run_id).await?;
        // Each compensation is numbered after the run's last step.
        let mut seq = runs::next_seq(&mut tx, run_id).await? - 1;
        let mut todo = Vec::new();
        for s in &done {
            let Some(tool) = self.registry.tool(&s.tool) else {
                continue;
            };
            if tool.config.compensate_with.is_some() {
                // The same tool, with the values read before the write set back.
                let Some(previous) = steps::previous(&mut tx, &s.step_id).await? else {
                    tracing::error!(step = %s.step_id, "no previous values kept: a person must undo it");
                    continue;
                };
                let previous: Value =
                    serde_json::from_str(&previous).map_err(|source| StoreError::Unparsable {
                        what: format!("the previous values kept with step {}", s.step_id),
                        source,
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
            seq += 1;
            let key = IdempotencyKey::for_step(
                run_id,
                seq as u32,
                &json!({"compensates": s.step_id, "inputs": inputs}),
            );
            let id = new_id();
            let lease = now.millis() + self.store.config().lease.as_millis() as i64;
            insert_step(
                &mut tx,
                NewStep {
                    step_id: &id,
                    run_id,
                    seq,
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
                Err(why) => Err(HandlerError::Failed(why.to_string())),
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
