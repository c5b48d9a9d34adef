//! The reconciler of `unknown` steps: asks the target whether the call landed (by key, or by a
//! query matched against the call's inputs) and settles the step either way once the answer
//! can be believed.

use toolgate_core::config::ReconcileQueryConfig;

use super::*;

/// How an `unknown` step is asked about: the read tool and its inputs, and the query whose
/// list answer is matched against the call (`None`: asked by key, the answer says `found`).
struct Question<'a> {
    lookup: String,
    inputs: Value,
    query: Option<&'a ReconcileQueryConfig>,
}

/// What an answer says of the call: whether it landed, and what it did if it did.
struct Landed {
    found: bool,
    result: Value,
    target_ref: Option<String>,
}

impl Executor {
    /// The reconciler: for each `unknown` step whose tool declares a reconciling read tool,
    /// asks the target by idempotency key (`{"idempotency_key": KEY}`; the answer's `found`
    /// says whether the call landed), or, for a tool declaring a `reconcile_query`, asks its
    /// read with arguments from the call's inputs and looks in the answer's list for an item
    /// whose `match` fields equal the call's inputs (found: the item is the call's result).
    /// Found → `done`, budget charged; not found, once the step has been unknown for
    /// `reconcile_quiet` (a late commit may land until then) → `failed`, budget released and
    /// retryable, because now it is known not to have happened. A step whose lookup fails, or
    /// whose tool has no reconciling tool, stays `unknown` for a person.
    pub async fn reconcile(&self) -> Result<Vec<StepReport>> {
        let unknown = {
            let mut tx = self.store.begin().await?;
            let unknown = steps::unknown(&mut tx).await?;
            tx.commit().await?;
            unknown
        };
        let mut reports = Vec::new();
        for s in unknown {
            let Some(question) = self.question_for(&s) else {
                continue;
            };
            let Some(landed) = self.ask(&s, &question).await else {
                continue; // no usable answer: still unknown
            };
            let now = self.clock.now();
            if !landed.found && !self.quiet_since(&s, now) {
                continue;
            }
            reports.push(
                self.settle_reconciled(&s, &question.lookup, landed, now)
                    .await?,
            );
        }
        Ok(reports)
    }

    /// What to ask about `s`: by key when the target answers by key; else a query over what it
    /// did, matched against the call's inputs. `None`: its tool declares neither.
    fn question_for<'a>(&'a self, s: &Step) -> Option<Question<'a>> {
        let tool = self.registry.tool(&s.tool)?;
        match (&tool.config.reconcile, &tool.config.reconcile_query) {
            (Some(by_key), _) => Some(Question {
                lookup: by_key.clone(),
                inputs: json!({"idempotency_key": s.idem_key.as_str()}),
                query: None,
            }),
            (None, Some(q)) => Some(Question {
                lookup: q.tool.clone(),
                inputs: q.arguments(&s.inputs),
                query: Some(q),
            }),
            (None, None) => None,
        }
    }

    /// Asks the question about `s`; `None` when there is no usable answer (the inputs do not
    /// fit the read, it did not answer, or its answer holds no list where one was declared).
    async fn ask(&self, s: &Step, q: &Question<'_>) -> Option<Landed> {
        if let Err(why) = system_inputs_fit(&self.registry, &q.lookup, &q.inputs) {
            tracing::error!(step = %s.step_id, %why, "not reconciled: a person must settle it");
            return None;
        }
        let meta = CallMeta {
            idempotency_key: s.idem_key.clone(),
            run_id: s.run_id.clone(),
            step_id: s.step_id.clone(),
            approval_tokens: Vec::new(),
            principal: s.principal.clone(),
        };
        let target = self.target(&q.lookup);
        let answer = match tokio::time::timeout(
            self.store.config().call_timeout,
            self.handler.call(&target, &q.inputs, &meta),
        )
        .await
        {
            Ok(Ok(out)) => out,
            _ => return None,
        };
        let (found, result) = match q.query {
            Some(query) => match query.find(&answer.result, &s.inputs) {
                Ok(item) => (item.is_some(), item.cloned().unwrap_or(Value::Null)),
                Err(why) => {
                    tracing::error!(step = %s.step_id, %why, "not reconciled: a person must settle it");
                    return None;
                }
            },
            None => (
                answer
                    .result
                    .get("found")
                    .and_then(Value::as_bool)
                    .unwrap_or(false),
                answer.result.clone(),
            ),
        };
        Some(Landed {
            found,
            result,
            target_ref: answer.target_ref,
        })
    }

    /// Whether `s` has been unknown long enough at `now` for "not found" to be believed: a
    /// late commit can still land a while after the call went unanswered.
    fn quiet_since(&self, s: &Step, now: Timestamp) -> bool {
        let config = self.store.config();
        let quiet = config.reconcile_quiet.unwrap_or(config.call_timeout);
        now.millis() - s.updated_at.millis() >= quiet.as_millis() as i64
    }

    /// Settles `s` as the answer of `lookup` says: done (budget charged) when the call landed,
    /// failed and retryable (budget released) when it did not; with its audit record.
    async fn settle_reconciled(
        &self,
        s: &Step,
        lookup: &str,
        landed: Landed,
        now: Timestamp,
    ) -> Result<StepReport> {
        let rule = Rule::reconciled(lookup);
        let (outcome, idem, budget, retry) = if landed.found {
            let mut o = StepOutcome::status(StepStatus::Done);
            o.target_ref = landed.target_ref;
            o.result = Some(landed.result);
            o.rule = Some(rule.clone());
            let stored = to_json(&o);
            (o, IdemAction::Done(stored), BudgetAction::Charge, None)
        } else {
            let mut o = StepOutcome::status(StepStatus::Failed);
            o.error = Some(format!(
                "{lookup} says the call never landed; it may be retried"
            ));
            o.rule = Some(rule.clone());
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
        let draft = self.system_draft(s, AuditDecision::Reconcile, &rule, &outcome, now);
        self.store
            .commit_record(Some(Ledger::Settle(settle)), draft)
            .await?;
        Ok(StepReport {
            step_id: s.step_id.clone(),
            status: outcome.status,
            outcome: Some(outcome),
            replayed: false,
        })
    }
}
