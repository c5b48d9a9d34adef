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
        let mut p = match self.store.step(&req.subject).await {
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
                    step_id: String::new(),
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
        };
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
}
