//! The audit records the executor writes: a governed call's (inputs redacted by data class,
//! bounded when no schema admitted them), and those of the reads and settlements toolgate
//! makes itself (lookups, recovery, reconciliation, compensation).

use crate::exec::*;

impl Executor {
    /// The audit record of a read toolgate made itself (a destination lookup, the previous
    /// values before a write): allowed by no check of its own, under `rule`, with no governance
    /// time.
    pub(crate) fn lookup_draft(
        &self,
        lookup: &Pending,
        outcome: &StepOutcome,
        rule: String,
    ) -> AuditDraft {
        let decision = Decision {
            verdict: Verdict::Allow,
            checks: Vec::new(),
            input_hash: InputHash::of(&lookup.inputs),
            approvals: Vec::new(),
            shadow: Vec::new(),
            registry_version: self.registry.version.hash.clone(),
        };
        let mut d = self.draft(
            lookup,
            &decision,
            AuditDecision::Lookup,
            outcome,
            &[],
            &[],
            self.clock.now(),
        );
        d.why.rule = Some(rule);
        d.outcome.governance_us = None;
        d
    }

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
        let reg: &Registry = &self.registry;
        let tool = reg.tool(&p.tool);
        let (inputs, redacted) = match tool {
            Some(t) => self
                .store
                .config()
                .redactor
                .redact(&p.inputs, &t.config.redact),
            None => (p.inputs.clone(), Vec::new()),
        };
        // Inputs no schema admitted (an unknown tool's, or refused by the schema check) are
        // the caller's to size: past a bound they are kept as their size and hash.
        let admitted = tool.is_some()
            && decision
                .checks
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
            ..AuditWho::of(reg, &p.principal)
        };
        let version = decision.registry_version.clone();
        let mut d = AuditDraft::event(now, who, name, kind, outcome.status, version);
        d.run_id = Some(p.run_id.clone());
        d.step_id = (!p.step_id.is_empty()).then(|| p.step_id.clone());
        d.tool_version = tool.map(|t| t.config.version.clone());
        d.effect = tool.map(|t| t.config.effect);
        d.tier = tool.map(|t| t.config.tier);
        (d.inputs, d.redacted) = (inputs, redacted);
        d.idem_key = Some(p.idem_key.to_string());
        d.why.purpose = p.purpose.clone();
        d.why.reason = p.reason.clone();
        d.why.evidence = p.evidence.clone();
        d.why.rule = decision
            .rule()
            .map(str::to_string)
            .or_else(|| outcome.rule.clone());
        d.why.checks = decision.checks.clone();
        d.why.shadow = decision.shadow.clone();
        d.approval = (!approvals.is_empty()).then(|| AuditApproval {
            approvers: approvals.iter().map(|c| c.approver.clone()).collect(),
            token_fingerprints: tokens.iter().map(|t| t.fingerprint()).collect(),
        });
        d.outcome = AuditOutcome {
            target_ref: outcome.target_ref.clone(),
            latency_ms: outcome.latency_ms,
            latency_us: outcome.latency_us,
            error: outcome.error.clone(),
            governance_us: Some(p.governance_us.unwrap_or_else(|| p.elapsed_us())),
            ..AuditOutcome::of(outcome.status)
        };
        d
    }

    pub(crate) fn system_draft(
        &self,
        s: &Step,
        kind: AuditDecision,
        rule: &str,
        outcome: &StepOutcome,
        now: Timestamp,
    ) -> AuditDraft {
        let p = Pending::from_step(s);
        let decision = Decision {
            verdict: Verdict::Allow,
            checks: Vec::new(),
            input_hash: s.input_hash.clone(),
            approvals: Vec::new(),
            shadow: Vec::new(),
            registry_version: self.registry.version.hash.clone(),
        };
        let mut d = self.draft(&p, &decision, kind, outcome, &[], &[], now);
        d.why.rule = Some(rule.to_string());
        d.outcome.governance_us = None;
        d
    }
}
