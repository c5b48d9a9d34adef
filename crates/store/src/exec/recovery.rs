//! Steps whose worker stopped mid-call (lease expired while `running`). Nothing is re-run
//! blind: the allow decision the reservation kept goes into the chain first, then a read goes
//! back to the queue and anything else becomes `unknown`, for reconciliation.

use super::*;

impl Executor {
    /// The allow record of a step whose call was reserved but never recorded, from the decision
    /// the reservation kept with the step (`None` for a step reserved before that was kept).
    pub(crate) async fn allowed_draft(
        &self,
        tx: &mut Tx,
        s: &Step,
        now: Timestamp,
    ) -> Result<Option<AuditDraft>> {
        let Some(text) = steps::kept_decision(tx, &s.step_id).await? else {
            return Ok(None);
        };
        #[derive(serde::Deserialize)]
        struct Kept {
            checks: Vec<toolgate_core::Check>,
            #[serde(default)]
            shadow: Vec<toolgate_core::ShadowRule>,
            registry_version: String,
        }
        let kept: Kept = serde_json::from_str(&text).map_err(|source| StoreError::Unparsable {
            what: format!("the decision kept with step {}", s.step_id),
            source,
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
        let approval = s
            .approval
            .as_ref()
            .and_then(|a| a.get("by"))
            .and_then(Value::as_array)
            .map(|by| AuditApproval {
                approvers: by
                    .iter()
                    .filter_map(Value::as_str)
                    .map(PrincipalId::from)
                    .collect(),
                token_fingerprints: Vec::new(),
            });
        let call = self.audit_call(&Pending::from_step(s), &decision.checks);
        let d = AuditDraft::call(
            now,
            AuditDecision::Allow,
            call,
            &decision,
            approval,
            &outcome,
            None,
        );
        Ok(Some(d))
    }

    /// Settles steps whose worker died mid-call (lease expired while `running`). Nothing is
    /// re-run blind: a read goes back to the queue; a write or irreversible call may have
    /// happened, so it becomes `unknown` and waits for reconciliation by key.
    pub async fn recover_stale(&self) -> Result<Vec<StepReport>> {
        let now = self.clock.now();
        let mut tx = self.store.begin().await?;
        let stale = steps::stale(&mut tx, now).await?;
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
                o.rule = Some(Rule::RECOVERY_READ);
                (o, Rule::RECOVERY_READ)
            } else {
                let mut o = StepOutcome::status(StepStatus::Unknown);
                o.error = Some(
                    "the worker stopped before recording the outcome: the call may have happened; \
                     it waits for reconciliation by key"
                        .into(),
                );
                o.rule = Some(Rule::RECOVERY_UNKNOWN);
                (o, Rule::RECOVERY_UNKNOWN)
            };
            let retry = (outcome.status == StepStatus::Failed
                && s.attempts < i64::from(MAX_ATTEMPTS))
            .then_some(now.millis());
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
            crate::ledger::settle::apply(&mut tx, &settle).await?;
            drafts.push(self.system_draft(s, AuditDecision::Recovery, &rule, &outcome, now));
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
}
