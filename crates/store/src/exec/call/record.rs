//! The audit records the executor writes: a governed call's (inputs redacted by data class,
//! bounded when no schema admitted them), and those of the reads and settlements toolgate
//! makes itself (lookups, recovery, reconciliation, compensation). Each is built by its
//! kind's constructor in [`crate::audit`]; what is the executor's is what the call is about.

use crate::exec::*;

impl Executor {
    /// `p` as its audit records name it: the tool as the registry declares it, the inputs
    /// redacted as the tool redacts them, and, when the schema check among `checks` did not
    /// admit them (an unknown tool's, or refused by the schema check), bounded: the caller's to
    /// size, so past a bound they are kept as their size and hash.
    pub(crate) fn audit_call(&self, p: &Pending, checks: &[toolgate_core::Check]) -> AuditCall {
        let tool = self.registry.tool(&p.tool);
        let (inputs, redacted) = match tool {
            Some(t) => self
                .store
                .config()
                .redactor
                .redact(&p.inputs, &t.config.redact),
            None => (p.inputs.clone(), Vec::new()),
        };
        let admitted = tool.is_some()
            && checks
                .iter()
                .all(|c| c.name != CheckName::Schema || c.outcome == toolgate_core::Outcome::Pass);
        let inputs = if admitted {
            inputs
        } else {
            toolgate_core::clip::bounded_inputs(&inputs).into_owned()
        };
        let name = match tool {
            Some(_) => p.tool.clone(),
            None => {
                toolgate_core::clip::clip(&p.tool, toolgate_core::clip::NAME_CHARS).into_owned()
            }
        };
        let who = AuditWho {
            actor: p.actor.clone(),
            ..AuditWho::of(&self.registry, &p.principal)
        };
        AuditCall {
            run_id: Some(p.run_id.clone()),
            step_id: (!p.step_id.is_empty()).then(|| p.step_id.clone()),
            inputs,
            redacted,
            idem_key: Some(p.idem_key.to_string()),
            purpose: p.purpose.clone(),
            reason: p.reason.clone(),
            evidence: p.evidence.clone(),
            ..AuditCall::new(who, name, tool)
        }
    }

    /// The audit record of a read toolgate made itself (a destination lookup, the previous
    /// values before a write): allowed by no check of its own, under `rule`.
    pub(crate) fn lookup_draft(
        &self,
        lookup: &Pending,
        outcome: &StepOutcome,
        rule: Rule,
    ) -> AuditDraft {
        AuditDraft::lookup(
            self.clock.now(),
            self.audit_call(lookup, &[]),
            rule,
            outcome,
            self.registry.version.hash.clone(),
        )
    }

    /// The record of a governed call as `decision` decided it (`kind`), with what came back
    /// and the approvals it consumed (`approvals`, by the tokens' fingerprints).
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn draft(
        &self,
        p: &Pending,
        decision: &Decision,
        kind: AuditDecision,
        outcome: &StepOutcome,
        tokens: &[ApprovalToken],
        approvals: &[ApprovalClaims],
        now: Timestamp,
    ) -> AuditDraft {
        let approval = (!approvals.is_empty()).then(|| AuditApproval {
            approvers: approvals
                .iter()
                .map(|c| PrincipalId::from(&c.approver))
                .collect(),
            token_fingerprints: tokens.iter().map(|t| t.fingerprint()).collect(),
        });
        AuditDraft::call(
            now,
            kind,
            self.audit_call(p, &decision.checks),
            decision,
            approval,
            outcome,
            Some(p.governance_us.unwrap_or_else(|| p.elapsed_us())),
        )
    }

    /// The record of a step toolgate settled or undid itself (`kind`: recovery, reconcile,
    /// compensation), under `rule`.
    pub(crate) fn system_draft(
        &self,
        s: &Step,
        kind: AuditDecision,
        rule: &Rule,
        outcome: &StepOutcome,
        now: Timestamp,
    ) -> AuditDraft {
        AuditDraft::system(
            now,
            kind,
            self.audit_call(&Pending::from_step(s), &[]),
            rule.clone(),
            outcome,
            self.registry.version.hash.clone(),
        )
    }
}
