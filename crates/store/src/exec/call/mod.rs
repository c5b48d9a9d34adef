//! One governed call, in the order it happens. Both ways in — a direct `tools/call`
//! ([`Executor::governed_call`]) and a claimed planned step (`queue`) — go through
//! [`Executor::prepare`], which reads as its phases:
//!
//! 1. [`view`]: what the ledgers hold that the engine decides on (the run's counts, today's
//!    budget use, the key's record, the approvals granted and the nonces spent);
//! 2. [`decide`]: core's [`Engine`] over that view, once — and again with a person's
//!    rejection if the call would be gated;
//! 3. [`settle`] or [`reserve`]: a call that does not run is settled in place (replayed,
//!    reported in flight, refused, parked); an allowed one reserves its key, step, budgets and
//!    approval nonces in the same transaction — and when a conditional write there loses a
//!    race the view could not show, what it found goes into the view and the call is decided
//!    again (2);
//! 4. [`forward`]: the handler is called outside any transaction, under the store's timeout,
//!    and the outcome is classified by the tool's effect;
//! 5. the outcome and its audit record ([`record`]) are committed together.
//!
//! A direct read that can neither happen twice nor use anything up skips the reservation
//! ([`read`]): decided from its run's counts, forwarded, then recorded in one write.
//!
//! Each phase is one function with one job; the SQL they need lives in [`crate::ledger`].

use super::*;

mod decide;
mod forward;
mod read;
mod record;
mod reserve;
mod settle;
mod view;

pub(crate) use view::{BatchRead, LedgerView};

use read::Unreserved;

use reserve::Reservation;

/// How often one call is decided again after its reservation lost a race, before it is given
/// up as contended.
const RESERVE_ROUNDS: usize = 3;

impl Executor {
    /// Decides one pending call inside `tx` and reserves (or settles) it.
    pub(crate) async fn prepare(
        &self,
        tx: &mut Tx,
        mut p: Pending,
        now: Timestamp,
        cache: &mut BatchCache,
    ) -> Result<Prepared> {
        if !p.lookups.is_empty() {
            // The lookups made for this call go in the chain before its own record.
            audit::append(tx, std::mem::take(&mut p.lookups)).await?;
        }
        let mut view = self.load_view(tx, &mut p, now, cache).await?;
        // A reservation that loses a race to another call (it took the last unit of a budget)
        // or finds what the view could not show (the attempts used up) puts that into the view,
        // and the engine decides again: its decision is what is recorded, never edited. The
        // race can repeat only while other calls keep taking and giving back what this one
        // needs; after a few rounds the call is given up as contended, nothing reserved.
        for _ in 0..RESERVE_ROUNDS {
            let decision = self.decide(tx, &p, &mut view, now).await?;
            return match decision.verdict.clone() {
                Verdict::Allow if view.key.state == IdempotencyState::Done => {
                    self.replay(tx, p, decision, view, now).await
                }
                Verdict::Allow if view.key.state == IdempotencyState::InFlight => {
                    self.report_in_flight(tx, p, decision, view, now).await
                }
                Verdict::Allow => match self
                    .reserve_allowed(tx, p, decision, view, now, cache)
                    .await?
                {
                    Reservation::Made(prepared) => Ok(prepared),
                    Reservation::Lost(lost, again, seen) => {
                        (p, view) = (again, seen);
                        self.learn(tx, &p, &mut view, lost, now, cache).await?;
                        continue;
                    }
                },
                Verdict::Deny { check, .. } => {
                    self.refuse(tx, p, decision, check, &view, now).await
                }
                Verdict::NeedsApproval {
                    rule,
                    approvers_needed,
                    approved_by,
                    ..
                } => {
                    let needed = approvers_needed as i64 + approved_by.len() as i64;
                    self.park(tx, p, decision, &rule, needed, &view, now).await
                }
            };
        }
        Err(StoreError::Contended(format!(
            "the reservation of '{}' lost to other calls {RESERVE_ROUNDS} times in a row",
            p.tool
        )))
    }

    /// One governed `tools/call` outside a plan: derive the key, decide with the store's
    /// state, reserve, call, record, audit. Duplicates replay; a call in flight reports it;
    /// a key reused with other inputs is refused.
    pub async fn governed_call(&self, call: DirectCall) -> Result<CallResult> {
        let result = self.governed(call, None).await?;
        Ok(result.expect("no run check asked for"))
    }

    /// [`Self::governed_call`] for a call whose caller named its run, which it may join only
    /// as [`Store::may_join_run`] says (`reviewer`: the caller's role reviews planned steps).
    /// `None` when it may not: nothing was looked up, decided or recorded, and the caller
    /// refuses the call (`run.foreign`). A read that needs no reservation reads the run's
    /// owner with its counts, in the one statement it reads its run with.
    pub async fn governed_call_joining(
        &self,
        call: DirectCall,
        reviewer: bool,
    ) -> Result<Option<CallResult>> {
        self.governed(call, Some(reviewer)).await
    }

    async fn governed(&self, call: DirectCall, join: Option<bool>) -> Result<Option<CallResult>> {
        let now = self.clock.now();
        let key = if self.toggles.get().derived_keys {
            match self.registry.tool(&call.tool) {
                Some(t) => self.registry.call_key(&call.principal, t, &call.inputs),
                // Refused as unknown; the key only labels the record.
                None => IdempotencyKey::for_call(
                    &format!("principal:{}", call.principal),
                    &call.tool,
                    &[],
                    &call.inputs,
                ),
            }
        } else {
            IdempotencyKey::from_stored(format!("minted:{}", new_id()))
        };
        let started = Instant::now();
        let mut p = Pending {
            step_id: StepId::default(),
            run_id: call.run_id,
            seq: 0,
            kind: StepKind::Direct,
            principal: call.principal,
            tool: call.tool,
            inputs: call.inputs,
            idem_key: key.clone(),
            purpose: call.purpose,
            reason: call.reason,
            purpose_from: call.purpose_from,
            argument_errors: call.argument_errors,
            evidence: call.evidence,
            actor: call.actor,
            presented: call.approvals,
            attempts: 0,
            started,
            governance_us: None,
            destinations: None,
            lookups: Vec::new(),
        };
        if self.unreserved(&p) {
            // The run is read first (with its owner, if the caller named it): the destinations
            // are looked up only for a call that may join its run.
            let Some(run) = self.read_run(&p, join).await? else {
                return Ok(None);
            };
            self.look_up_destinations(&mut p, &mut LookupCache::default())
                .await;
            p = match self.read_unreserved(p, run, now).await? {
                Unreserved::Settled(result) => return Ok(Some(result)),
                Unreserved::Reserve(p) => p,
            };
        } else {
            if let Some(reviewer) = join
                && !self
                    .store
                    .may_join_run(&p.run_id, &p.principal, reviewer)
                    .await?
            {
                return Ok(None);
            }
            self.look_up_destinations(&mut p, &mut LookupCache::default())
                .await;
        }
        let prepared = self.store.reserve_direct(self.clone(), p, now).await?;
        match prepared {
            Prepared::Settled {
                p,
                status,
                decision,
                outcome,
                audit_seq,
            } => Ok(Some(CallResult {
                status,
                decision,
                idem_key: key,
                step_id: (!p.step_id.is_empty()).then_some(StepId::new(p.step_id)),
                approval_id: outcome.approval_id.clone(),
                outcome: Some(outcome),
                audit_seq,
            })),
            Prepared::Call {
                mut p,
                decision,
                tokens,
                approvals,
            } => {
                p.governance_us = Some(p.elapsed_us());
                self.point(SyncPoint::Reserved);
                let (status, outcome, seq, p, decision) =
                    self.call_and_record(p, decision, tokens, approvals).await?;
                Ok(Some(CallResult {
                    status,
                    decision,
                    idem_key: key,
                    step_id: Some(StepId::new(p.step_id)),
                    outcome: Some(outcome),
                    approval_id: None,
                    audit_seq: seq,
                }))
            }
        }
    }
}
