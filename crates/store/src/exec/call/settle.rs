//! Calls that do not run, settled in the deciding transaction with their audit record: a
//! replay of a done key, a report of one in flight, a refusal, a call parked for approval.

use crate::exec::*;

use super::LedgerView;

impl Executor {
    /// The key is done: its stored outcome (errors included) is the answer; nothing runs.
    pub(crate) async fn replay(
        &self,
        tx: &mut Tx,
        p: Pending,
        decision: Decision,
        view: LedgerView,
        now: Timestamp,
    ) -> Result<Prepared> {
        let stored = view
            .key
            .held
            .and_then(|h| h.outcome)
            .ok_or_else(|| StoreError::Corrupt("a done key has no stored outcome".into()))?;
        let outcome: StepOutcome =
            serde_json::from_str(&stored).map_err(|source| StoreError::Unparsable {
                what: "the stored outcome of a done key".into(),
                source,
            })?;
        if p.kind != StepKind::Direct {
            self.settle_inline(tx, &p, &outcome, now).await?;
        }
        let status = CallStatus::Replayed;
        self.settled(tx, p, status, decision, AuditDecision::Replay, outcome, now)
            .await
    }

    /// An earlier attempt has not settled (still running, or its outcome unknown until
    /// reconciliation): nothing runs, the retry hears its state. Not a denial: a retry after a
    /// crash must not count against the run.
    pub(crate) async fn report_in_flight(
        &self,
        tx: &mut Tx,
        mut p: Pending,
        decision: Decision,
        view: LedgerView,
        now: Timestamp,
    ) -> Result<Prepared> {
        let h = view.key.held.expect("an in-flight key was read");
        let unknown = h.step_status == Some(StepStatus::Unknown);
        let (status, step_status, rule) = if unknown {
            (
                CallStatus::Unknown,
                StepStatus::Unknown,
                Rule::IDEMPOTENCY_UNKNOWN,
            )
        } else {
            (
                CallStatus::InProgress,
                StepStatus::Running,
                Rule::IDEMPOTENCY_IN_PROGRESS,
            )
        };
        let mut outcome = StepOutcome::status(step_status);
        outcome.rule = Some(rule);
        if p.kind == StepKind::Direct {
            p.step_id = h.step_id;
        }
        self.settled(tx, p, status, decision, AuditDecision::Replay, outcome, now)
            .await
    }

    /// A check failed.
    pub(crate) async fn refuse(
        &self,
        tx: &mut Tx,
        p: Pending,
        decision: Decision,
        check: CheckName,
        view: &LedgerView,
        now: Timestamp,
    ) -> Result<Prepared> {
        let status = match (check, view.key.state) {
            (CheckName::Idempotency, IdempotencyState::InputsDiffer) => CallStatus::InputsDiffer,
            _ => CallStatus::Refused,
        };
        let outcome = outcome_of(StepStatus::Refused, &decision);
        if p.kind != StepKind::Direct {
            self.settle_inline(tx, &p, &outcome, now).await?;
        }
        // The gate check fails only for a call a person already rejected: the answer repeats
        // that person's decision (recorded when it was made), so it is recorded as a replay,
        // not as a new denial of the run — whether the agent retries or not changes nothing
        // about what the run may do next.
        let kind = if check == CheckName::Gate {
            AuditDecision::Replay
        } else {
            AuditDecision::Deny
        };
        self.settled(tx, p, status, decision, kind, outcome, now)
            .await
    }

    /// The call needs people's approval: parked under an approval request. A request already
    /// open for the same exact call is reused; one that lapsed is closed, and the call goes
    /// back through the gate with a new one.
    #[allow(clippy::too_many_arguments)]
    pub(crate) async fn park(
        &self,
        tx: &mut Tx,
        p: Pending,
        decision: Decision,
        rule: &Rule,
        approvers_needed: i64,
        view: &LedgerView,
        now: Timestamp,
    ) -> Result<Prepared> {
        let tool = self
            .registry
            .tool(&p.tool)
            .expect("a gated call names a registry tool");
        let input_hash = InputHash::of(&p.inputs);
        let approval_id = crate::ledger::approvals::open_request(
            tx,
            crate::ledger::approvals::NewRequest {
                subject: &view.subject,
                run_id: &p.run_id,
                principal: &p.principal,
                tool: &p.tool,
                tool_version: &tool.config.version,
                input_hash: &input_hash,
                inputs: &p.inputs,
                reason: p.reason.as_deref(),
                evidence: &p.evidence,
                rule,
                approvers_needed: approvers_needed.max(1),
                expires_at: now.plus_hours(self.store.config().approval_expiry_hours),
                definition_hash: view.served.as_definition().hash(),
                registry_version: &decision.registry_version,
            },
            now,
        )
        .await?;
        let mut outcome = outcome_of(StepStatus::NeedsApproval, &decision);
        outcome.approval_id = Some(ApprovalId::new(approval_id));
        if p.kind != StepKind::Direct {
            self.settle_inline(tx, &p, &outcome, now).await?;
        }
        let status = CallStatus::NeedsApproval;
        self.settled(
            tx,
            p,
            status,
            decision,
            AuditDecision::NeedsApproval,
            outcome,
            now,
        )
        .await
    }

    /// Appends the audit record of a call settled without running.
    #[allow(clippy::too_many_arguments)]
    pub(crate) async fn settled(
        &self,
        tx: &mut Tx,
        p: Pending,
        status: CallStatus,
        decision: Decision,
        kind: AuditDecision,
        outcome: StepOutcome,
        now: Timestamp,
    ) -> Result<Prepared> {
        let d = self.draft(&p, &decision, kind, &outcome, &[], &[], now);
        let audit_seq = audit::append(tx, vec![d]).await?[0];
        Ok(Prepared::Settled {
            p,
            status,
            decision,
            outcome,
            audit_seq,
        })
    }

    /// Records a planned step's outcome on its row, in the deciding transaction.
    pub(crate) async fn settle_inline(
        &self,
        tx: &mut Tx,
        p: &Pending,
        outcome: &StepOutcome,
        now: Timestamp,
    ) -> Result<()> {
        crate::ledger::steps::settle(tx, &p.step_id, outcome, now).await
    }
}
