//! Forwarding an allowed call: the handler is called outside any transaction, under the
//! store's call timeout, and what came back is classified by the tool's effect (a timeout on
//! an irreversible call is `unknown`, never retried blind; on a read or write it is retryable).

use crate::exec::*;

/// A call made, not yet recorded.
pub(crate) struct Called {
    pub(crate) status: CallStatus,
    pub(crate) outcome: StepOutcome,
    pub(crate) settle: Settle,
    pub(crate) draft: AuditDraft,
    pub(crate) p: Pending,
    pub(crate) decision: Decision,
}

impl Executor {
    /// Calls the handler for a reserved call and records the outcome (group commit).
    pub(crate) async fn call_and_record(
        &self,
        p: Pending,
        decision: Decision,
        tokens: Vec<ApprovalToken>,
        approvals: Vec<ApprovalClaims>,
    ) -> Result<(CallStatus, StepOutcome, i64, Pending, Decision)> {
        let c = self.call_only(p, decision, tokens, approvals).await;
        let seq = self
            .store
            .commit_record(Some(Ledger::Settle(c.settle)), c.draft)
            .await?;
        Ok((c.status, c.outcome, seq, c.p, c.decision))
    }

    /// Calls the handler for a reserved call and builds its settlement and audit record.
    pub(crate) async fn call_only(
        &self,
        p: Pending,
        decision: Decision,
        tokens: Vec<ApprovalToken>,
        approvals: Vec<ApprovalClaims>,
    ) -> Called {
        let reg: &Registry = &self.registry;
        let tool = reg.tool(&p.tool);
        let effect = tool.map_or(Effect::Irreversible, |t| t.config.effect);
        // A call reserved a daily budget only where someone on its chain has one for its tier
        // (never for a read; its window budgets a done call keeps): otherwise a done one has
        // nothing to charge. The same registry snapshot decided what was reserved.
        let charged = tool.is_some_and(|t| self.budgeted(&p.principal, t.config.tier));
        let charge = if charged {
            BudgetAction::Charge
        } else {
            BudgetAction::Hold
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
        let nothing_happened = |msg: String, rule: Rule| {
            let mut o = StepOutcome::status(StepStatus::Failed);
            o.error = Some(msg);
            o.rule = Some(rule);
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
        };
        let (status, outcome, idem, budget, retry_at) = match (res, unread) {
            (_, Some(why)) => {
                // Nothing was sent: retryable, like a call that never reached the target.
                let mut o = StepOutcome::status(StepStatus::Failed);
                o.error = Some(format!(
                    "not made: the values it would change could not be read first ({why}), so it \
                     could not be undone; retryable with the same key"
                ));
                o.rule = Some(Rule::COMPENSATE_UNREAD);
                o.latency_ms = Some(latency);
                let retry =
                    (p.attempts < i64::from(MAX_ATTEMPTS)).then_some(now.millis() + backoff);
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
            // The target answered "no", or the pin stopped the call on its way out: nothing
            // happened; recorded, and replayed to a retry with the same key.
            (Err(HandlerError::Failed(msg)), None) => nothing_happened(msg, Rule::HANDLER_FAILED),
            (Err(HandlerError::NotPinned(msg)), None) => nothing_happened(msg, Rule::PIN_BLOCKED),
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
                    HandlerError::Unanswered(_) => Rule::UNANSWERED_IRREVERSIBLE,
                    _ => Rule::TIMEOUT_IRREVERSIBLE,
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
                    o.rule = Some(Rule::UNANSWERED_RETRYABLE);
                } else {
                    o.error = Some("timed out; retryable with the same key".into());
                    o.rule = Some(Rule::TIMEOUT_RETRYABLE);
                }
                o.latency_ms = Some(latency);
                o.latency_us = Some(latency_us);
                let retry =
                    (p.attempts < i64::from(MAX_ATTEMPTS)).then_some(now.millis() + backoff);
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
}
