//! Reads toolgate makes on its own behalf, through the same handler as the calls it governs:
//! the allowed values of a destination field (before deciding, outside any transaction), the
//! values a `compensate_with` write is about to change, and the facts the approval page shows.
//! Only the schema check applies to them; each is recorded as a `lookup` audit record.

use super::*;

impl Executor {
    pub(crate) fn needs_lookups(&self, p: &Pending) -> bool {
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
    pub(crate) async fn look_up_destinations(&self, p: &mut Pending, cache: &mut LookupCache) {
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

    pub(crate) async fn look_up(
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
            Err(why) => Err(HandlerError::Failed(why.to_string())),
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
        let rule = Rule::destination(&l.field);
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

    /// `compensate_with`: asks the declared read for the values the call is about to change
    /// and keeps them with the step (with a `lookup` audit record of the question), so
    /// aborting the run can set them back with the same tool.
    pub(crate) async fn read_previous(
        &self,
        p: &Pending,
        tool: &toolgate_core::registry::Tool,
    ) -> Result<()> {
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
                    .map(|prev| (prev, out.target_ref))
                    .map_err(StoreError::from),
                Ok(Err(e)) => Err(StoreError::from(e)),
                Err(_) => Err(StoreError::from(HandlerError::Timeout)),
            },
        };
        let rule = Rule::compensate_with(&w.read);
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
            Err(why) => outcome.error = Some(why.to_string()),
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
                steps::keep_previous(&mut tx, &p.step_id, prev).await?;
            }
            audit::append(&mut tx, vec![d]).await?;
            tx.commit().await
        };
        if let Err(e) = keep.await {
            return Err(StoreError::PreviousNotKept(Box::new(e)));
        }
        res.map(|_| ())
    }

    /// Asks a read tool on behalf of the approval page (the decision facts of a parked call),
    /// through the same handler as destination lookups, with the tool's schema checked first
    /// and the store's call timeout.
    pub async fn look_up_for_approval(
        &self,
        principal: &str,
        run_id: Option<&str>,
        tool: &str,
        inputs: &Value,
    ) -> Result<Value> {
        system_inputs_fit(&self.registry, tool, inputs)?;
        let with: Vec<String> = inputs
            .as_object()
            .map(|o| o.keys().cloned().collect())
            .unwrap_or_default();
        let run = run_id.unwrap_or("approval-page");
        let meta = CallMeta {
            idempotency_key: IdempotencyKey::for_call(run, tool, &with, inputs),
            run_id: run.into(),
            step_id: StepId::default(),
            approval_tokens: Vec::new(),
            principal: principal.into(),
        };
        let target = self.target(tool);
        match tokio::time::timeout(
            self.store.config().call_timeout,
            self.handler.call(&target, inputs, &meta),
        )
        .await
        {
            Ok(Ok(out)) => Ok(out.result),
            Ok(Err(e)) => Err(e.into()),
            Err(_) => Err(StoreError::NoAnswer {
                tool: tool.to_string(),
            }),
        }
    }
}
