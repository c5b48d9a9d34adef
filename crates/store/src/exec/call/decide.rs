//! The decision: core's engine over the request and the ledgers' view. The engine is pure;
//! the reads here are those only a gated call needs — the approvals people granted, and a
//! person's earlier rejection of the same call — asked for only when the engine would gate
//! it without them.

use crate::exec::*;

use super::LedgerView;

impl Executor {
    /// Decides `p` against `view`. A call that would be gated is decided again with the
    /// approvals people granted for it (read into `view` the first time), and then, if still
    /// gated, with a person's rejection of this exact call, if there is one, so it is refused
    /// instead of parked again. Approvals change nothing but the gate check, so deciding
    /// without them first gives the same decision for every call they could not pass.
    pub(crate) async fn decide(
        &self,
        tx: &mut Tx,
        p: &Pending,
        view: &mut LedgerView,
        now: Timestamp,
    ) -> Result<Decision> {
        let gated = |d: &Decision| matches!(d.verdict, Verdict::NeedsApproval { .. });
        let mut decision = self.decide_with(p, view, None, now);
        if gated(&decision) && !view.grants_read {
            self.read_grants(tx, p, view).await?;
            decision = self.decide_with(p, view, None, now);
        }
        if !gated(&decision) {
            return Ok(decision);
        }
        let input_hash = InputHash::of(&p.inputs);
        Ok(
            match self.rejection(tx, &view.subject, &input_hash, now).await? {
                Some(rejection) => self.decide_with(p, view, Some(&rejection), now),
                None => decision,
            },
        )
    }

    pub(super) fn decide_with(
        &self,
        p: &Pending,
        view: &LedgerView,
        rejection: Option<&str>,
        now: Timestamp,
    ) -> Decision {
        let destinations = p
            .destinations
            .clone()
            .unwrap_or_else(|| self.destinations.clone());
        let nonce_used = |n: &str| view.used_nonces.contains(n);
        let req = CallRequest {
            principal: &p.principal,
            tool: &p.tool,
            purpose: p.purpose.as_deref(),
            reason: p.reason.as_deref(),
            purpose_from: p.purpose_from,
            inputs: &p.inputs,
            subject: &view.subject,
            run: &view.run,
            budgets: &view.budgets,
            idempotency: view.key.state,
            elsewhere: view.key.elsewhere.as_deref(),
            argument_errors: &p.argument_errors,
            rejection,
            approvals: &view.tokens,
            destinations: &destinations,
            definition: view.served.as_definition(),
            nonce_used: &nonce_used,
        };
        if self.toggles.get().approval_binding {
            self.engine().decide(&req, now)
        } else {
            let unbound = self.keys.as_ref().clone().without_input_binding();
            Engine::new(&self.registry, &unbound).decide(&req, now)
        }
    }

    /// A person's rejection of this exact call (subject and inputs), within the key retention:
    /// "rejected by WHO at WHEN: NOTE".
    pub(crate) async fn rejection(
        &self,
        tx: &mut Tx,
        subject: &str,
        input_hash: &InputHash,
        now: Timestamp,
    ) -> Result<Option<String>> {
        let since = now.millis() - self.store.config().retention_ms();
        let Some(r) = crate::ledger::approvals::rejection(tx, subject, input_hash, since).await?
        else {
            return Ok(None);
        };
        let at = r
            .decided_at
            .map_or_else(String::new, |t| format!(" at {}", t.to_rfc3339()));
        let by = r.decided_by.unwrap_or_else(|| "a person".into());
        let note = r.note.filter(|n| !n.trim().is_empty());
        Ok(Some(format!(
            "request {}, rejected by {by}{at}{}",
            r.approval_id,
            note.map(|n| format!(": {n}")).unwrap_or_default()
        )))
    }
}
