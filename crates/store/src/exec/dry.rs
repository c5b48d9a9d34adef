//! A parked call decided again without effect, inside a transaction that is rolled back, so
//! the approval page can show what would happen if people approved it.

use super::*;

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
    /// Decides a parked call again, dry: the same gathering and every check as when it runs
    /// (run so far, budgets, windows, idempotency, destination lookups), inside a transaction
    /// that is rolled back, so nothing is reserved, recorded or sent. The approval page shows
    /// its verdict before anyone approves.
    pub async fn dry_decide(&self, req: &crate::model::ApprovalRequest) -> Result<DryRun> {
        let now = self.clock.now();
        let mut p = self.pending_for(req).await?;
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

    /// The parked call of `req` as the executor would take it up again.
    async fn pending_for(&self, req: &crate::model::ApprovalRequest) -> Result<Pending> {
        Ok(match self.store.step(&req.subject_step()).await {
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
                    step_id: StepId::default(),
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
        })
    }

    /// Several parked calls (a run's parked steps, in order) decided again together, dry, as
    /// if `approver` approved them all now and they then ran one after another: inside one
    /// transaction that is rolled back, `approver`'s grants are taken, each step is claimed
    /// and decided in turn, and each one allowed reserves what it would (budgets, windows, its
    /// key), so a later step sees what the earlier ones would have used. A step that would
    /// only be refused once the steps before it ran is refused here, before anyone approves.
    /// The approver must be eligible for every request (the grants are taken as real ones).
    pub async fn dry_decide_together(
        &self,
        reqs: &[crate::model::ApprovalRequest],
        approver: &PrincipalId,
    ) -> Result<Vec<DryRun>> {
        let now = self.clock.now();
        let mut pending = Vec::with_capacity(reqs.len());
        let mut lookups = LookupCache::default();
        for r in reqs {
            let mut p = self.pending_for(r).await?;
            self.look_up_destinations(&mut p, &mut lookups).await;
            pending.push(p);
        }
        let lease = now.millis() + self.store.config().lease.as_millis() as i64;
        let mut tx = self.store.begin().await?;
        for r in reqs {
            crate::exec::approve::grant(
                &mut tx,
                &self.registry,
                &self.keys,
                &r.approval_id,
                approver,
                now,
            )
            .await?;
        }
        let mut cache = BatchCache::default();
        let mut out = Vec::with_capacity(reqs.len());
        for mut p in pending {
            if p.kind != StepKind::Direct {
                // Claimed as a worker would claim it once approved (a step still waiting for
                // another person stays parked and is decided as it stands).
                if let Some(s) = crate::ledger::steps::claim_one(&mut tx, &p.step_id, lease, now)
                    .await?
                    .into_iter()
                    .next()
                {
                    p.attempts = s.attempts;
                }
            }
            let decision = match self.prepare(&mut tx, p, now, &mut cache).await? {
                Prepared::Call { decision, .. } | Prepared::Settled { decision, .. } => decision,
            };
            out.push(DryRun { decision });
        }
        // Dropped, never committed: neither the grants nor the reservations are kept.
        drop(tx);
        Ok(out)
    }
}
