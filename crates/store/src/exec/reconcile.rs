//! The reconciler of `unknown` steps: asks the target whether the call landed (by key, or by a
//! query matched against the call's inputs) and settles the step either way once the answer
//! can be believed.

use super::*;

impl Executor {
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
            let unknown = steps::unknown(&mut tx).await?;
            tx.commit().await?;
            unknown
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
                let retry = (s.attempts < i64::from(MAX_ATTEMPTS)).then_some(now.millis());
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
}
