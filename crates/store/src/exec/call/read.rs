//! A direct read that needs no reservation. Nothing about it can happen twice or use anything
//! up: a read that is not replayed holds no idempotency key, takes no budget (a read tier has
//! none) and no window, and presents no approval to consume. So there is nothing to reserve
//! before it runs: it is decided from a read of its run, forwarded, and recorded with its
//! outcome in one group-committed write — its audit record, and its count in the run's tally
//! (no step row; see `ledger::runs`). A call that needs more (a gate, a rate limit, a
//! window, a presented token) goes through the reservation like any other call.
//!
//! Other calls of the same run decided while such a read is under way count it: the process
//! keeps the reads it has forwarded and not yet recorded ([`InFlightRead`]), and every direct
//! call's view of its run adds them. A read counts itself from before it reads its run, so
//! two reads deciding at once each see the other (a run's count is never under-stated).
//! Across gateways sharing PostgreSQL, a read under way at another gateway is seen once it is
//! recorded; a tool whose limit must hold exactly across them declares a `rate_limit`, which
//! takes the reservation.
//!
//! If the process dies after the read was forwarded and before its record commits, the read
//! left no record (the upstream's own log has it); there is no step to recover, and nothing
//! to undo.

use crate::exec::*;
use crate::ledger::runs::Stepless;
use crate::store::SteplessCall;
use toolgate_core::{PriorCall, PriorCalls, PriorOutcome};

use super::LedgerView;

/// A direct read's run, read before it is decided: counted from before the read (see the
/// module docs) until it is recorded.
pub(crate) struct ReadRun {
    in_flight: InFlightRead,
    history: RunHistory,
    exists: bool,
}

/// What a direct read came to on this path.
pub(crate) enum Unreserved {
    /// Decided and settled here: forwarded and recorded, or refused and recorded.
    Settled(CallResult),
    /// It needs what only the reservation gives (a person's approval): decide it there.
    Reserve(Pending),
}

/// A read forwarded and not yet recorded, counted for its run until it is dropped.
pub(crate) struct InFlightRead {
    store: Store,
    key: (String, String),
}

impl InFlightRead {
    fn start(store: &Store, run_id: &str, tool: &str) -> Self {
        let key = (run_id.to_string(), tool.to_string());
        *store
            .inner
            .unrecorded
            .lock()
            .expect("unrecorded reads")
            .entry(key.clone())
            .or_default() += 1;
        InFlightRead {
            store: store.clone(),
            key,
        }
    }
}

impl Drop for InFlightRead {
    fn drop(&mut self) {
        let mut reads = self
            .store
            .inner
            .unrecorded
            .lock()
            .expect("unrecorded reads");
        if let Some(n) = reads.get_mut(&self.key) {
            *n -= 1;
            if *n <= 0 {
                reads.remove(&self.key);
            }
        }
    }
}

impl Store {
    /// Adds to `run` the reads of `run_id` this process forwarded without a reservation and
    /// has not recorded yet (`own`: the calling read's own (tool), not counted).
    pub(crate) fn count_unrecorded(&self, run_id: &str, own: Option<&str>, run: &mut RunHistory) {
        let reads = self.inner.unrecorded.lock().expect("unrecorded reads");
        for ((r, tool), n) in reads.iter() {
            let n = *n - i64::from(own == Some(tool.as_str()));
            if r == run_id && n > 0 {
                run.counted.push(PriorCalls {
                    call: PriorCall {
                        tool: tool.clone(),
                        tier: Tier::Read,
                        outcome: PriorOutcome::Allowed,
                    },
                    n,
                });
            }
        }
    }
}

impl Executor {
    /// Whether `p`, a direct call, is a read that needs nothing reserved (see the module
    /// docs). Decided from the registry alone, before anything is read.
    pub(crate) fn unreserved(&self, p: &Pending) -> bool {
        let Some(t) = self.registry.tool(&p.tool) else {
            return false;
        };
        p.kind == StepKind::Direct
            && t.config.effect == Effect::Read
            && t.config.tier == Tier::Read
            && !replays(t)
            && t.windows.is_empty()
            && t.config.rate_limit.is_none()
            && p.presented.is_empty()
    }

    /// Reads the run of `p`, a read that needs nothing reserved, counting it as under way from
    /// before; with `join` (the caller named the run; whether it reviews plans), also whether
    /// it may join that run: `None` when it may not.
    pub(crate) async fn read_run(
        &self,
        p: &Pending,
        join: Option<bool>,
    ) -> Result<Option<ReadRun>> {
        let in_flight = InFlightRead::start(&self.store, &p.run_id, &p.tool);
        let mut conn = self.store.inner.pool.conn().await?;
        let (history, exists) = match join {
            None => crate::ledger::runs::history(&mut conn, &p.run_id, None).await?,
            Some(reviewer) => {
                let (history, exists, owner) =
                    crate::ledger::runs::history_and_owner(&mut conn, &p.run_id).await?;
                let ok = crate::ledger::runs::may_join(
                    &mut conn,
                    &p.run_id,
                    owner,
                    &p.principal,
                    reviewer,
                )
                .await?;
                if !ok {
                    return Ok(None);
                }
                (history, exists)
            }
        };
        Ok(Some(ReadRun {
            in_flight,
            history,
            exists,
        }))
    }

    /// Decides a read that needs nothing reserved from its run's counts (`run`, read by
    /// [`Self::read_run`]), then forwards and records it, or records its refusal; a call the
    /// engine would gate goes back to be decided with the reservation (which reads the
    /// approvals people granted).
    pub(crate) async fn read_unreserved(
        &self,
        mut p: Pending,
        run: ReadRun,
        now: Timestamp,
    ) -> Result<Unreserved> {
        let ReadRun {
            in_flight,
            history: mut run,
            exists: run_exists,
        } = run;
        self.store
            .count_unrecorded(&p.run_id, Some(&p.tool), &mut run);
        let view = LedgerView {
            run,
            run_exists,
            chain: Vec::new(),
            budgets: BudgetView::default(),
            key: super::view::KeyView {
                state: IdempotencyState::Fresh,
                held: None,
                elsewhere: None,
                step: None,
            },
            subject: self.subject(&p),
            tokens: Vec::new(),
            used_nonces: HashSet::new(),
            grants_read: false,
            served: self.handler.served(&self.target(&p.tool)),
        };
        let decision = self.decide_with(&p, &view, None, now);
        let lookups = std::mem::take(&mut p.lookups);
        let mut units: Vec<(Option<Ledger>, AuditDraft)> =
            lookups.into_iter().map(|d| (None, d)).collect();
        match &decision.verdict {
            Verdict::NeedsApproval { .. } => {
                drop(in_flight);
                p.lookups = units.into_iter().map(|(_, d)| d).collect();
                Ok(Unreserved::Reserve(p))
            }
            Verdict::Deny { .. } => {
                drop(in_flight);
                // Recorded as every refused direct call is: no step row, counted in its
                // run's tally with its audit record.
                let outcome = outcome_of(StepStatus::Refused, &decision);
                let draft = self.draft(&p, &decision, AuditDecision::Deny, &outcome, &[], &[], now);
                units.push((None, draft));
                let audit_seq = self.commit_units(units).await?;
                Ok(Unreserved::Settled(CallResult {
                    status: CallStatus::Refused,
                    decision,
                    idem_key: p.idem_key.clone(),
                    step_id: None,
                    outcome: Some(outcome),
                    approval_id: None,
                    audit_seq,
                }))
            }
            Verdict::Allow => {
                // The upstream sees a step id, as for every call (its log can name it); the
                // audit record keeps it. No step row holds it.
                p.step_id = StepId::new(new_id());
                p.attempts = 1;
                p.governance_us = Some(p.elapsed_us());
                let idem_key = p.idem_key.clone();
                let called = self.call_only(p, decision, Vec::new(), Vec::new()).await;
                let tally = Stepless {
                    run_id: called.p.run_id.clone(),
                    tool: called.p.tool.clone(),
                    tier: Tier::Read,
                    status: called.outcome.status,
                };
                let ledger = Ledger::Stepless(SteplessCall {
                    principal: called.p.principal.to_string(),
                    purpose: called.p.purpose.clone(),
                    now: called.settle.now,
                    tally,
                });
                units.push((Some(ledger), called.draft));
                let audit_seq = self.commit_units(units).await?;
                drop(in_flight);
                Ok(Unreserved::Settled(CallResult {
                    status: called.status,
                    decision: called.decision,
                    idem_key,
                    step_id: None,
                    outcome: Some(called.outcome),
                    approval_id: None,
                    audit_seq,
                }))
            }
        }
    }

    /// Commits `units` in the next group commit; the last one's sequence number.
    async fn commit_units(&self, units: Vec<(Option<Ledger>, AuditDraft)>) -> Result<i64> {
        let seqs = self.store.commit_records(units).await?;
        Ok(*seqs.last().expect("one record at least"))
    }
}
