//! The reservation of an allowed call, in the transaction that decided it: the idempotency
//! key, the step row, window and daily budgets up the parent chain, and the approval nonces.
//! A conditional write can still lose a race the engine could not see (another call took the
//! key or the last unit of budget): nothing stays reserved, what the write found goes into the
//! view, and the engine decides the call again (see [`super`]). The engine's decision is never
//! edited here.

use crate::exec::*;

use super::LedgerView;
use crate::ledger::approvals;

/// Why a reservation of a call the engine allowed could not be made: a conditional write lost
/// to what the engine could not see.
pub(crate) enum Lost {
    /// Another attempt of the same operation holds the key: nothing runs, and the retry hears
    /// that the call is in progress (no denial of the run). Settled by [`Executor::reserve_allowed`].
    InProgress,
    /// The operation was attempted as often as it may be ([`MAX_ATTEMPTS`]): the view's key
    /// did not say so, since a key is given back when an attempt fails.
    AttemptsExhausted,
    /// A window or daily budget was used up by another call since the view was read.
    Budget,
}

/// What reserving an allowed call came to.
pub(crate) enum Reservation {
    /// Reserved, or settled on the spot (another attempt of it is in progress).
    Made(Prepared),
    /// Lost to what the view did not show: the call, and its view, to be decided again.
    Lost(Lost, Pending, LedgerView),
}

impl Executor {
    /// Reserves an allowed call: `Call` when it may run; settled when another attempt of it
    /// holds the key; or lost, with nothing left reserved, to be decided again.
    pub(crate) async fn reserve_allowed(
        &self,
        tx: &mut Tx,
        mut p: Pending,
        decision: Decision,
        view: LedgerView,
        now: Timestamp,
        cache: &mut BatchCache,
    ) -> Result<Reservation> {
        let tier = self
            .registry
            .tool(&p.tool)
            .expect("an allowed call names a registry tool")
            .config
            .tier;
        let lost = self
            .reserve(tx, &mut p, &decision, tier, &view, now, cache)
            .await?;
        match lost {
            None => Ok(Reservation::Made(Prepared::Call {
                p,
                approvals: decision.approvals.clone(),
                decision,
                tokens: view.tokens,
            })),
            // Another attempt of the same call took the key first: no failure. Nothing runs,
            // and the retry hears that it is in progress.
            Some(Lost::InProgress) => {
                let mut outcome = StepOutcome::status(StepStatus::Running);
                outcome.rule = Some(Rule::IDEMPOTENCY_IN_PROGRESS);
                outcome.error = Some(
                    "the same call is in progress; check its status instead of retrying".into(),
                );
                let status = CallStatus::InProgress;
                let prepared = self
                    .settled(tx, p, status, decision, AuditDecision::Replay, outcome, now)
                    .await?;
                Ok(Reservation::Made(prepared))
            }
            Some(lost) => Ok(Reservation::Lost(lost, p, view)),
        }
    }

    /// Puts what a lost reservation found into the view, for the engine to decide on: the
    /// attempts used up, or the budgets as other calls left them.
    pub(crate) async fn learn(
        &self,
        tx: &mut Tx,
        p: &Pending,
        view: &mut LedgerView,
        lost: Lost,
        now: Timestamp,
        cache: &mut BatchCache,
    ) -> Result<()> {
        match lost {
            Lost::InProgress => {}
            Lost::AttemptsExhausted => view.key.state = IdempotencyState::Exhausted,
            Lost::Budget => {}
        }
        // The lost reservation may have made or changed the key's step: read it again.
        view.key.step = None;
        match lost {
            Lost::InProgress | Lost::AttemptsExhausted => {}
            Lost::Budget => {
                crate::ledger::budgets::read_again(tx, cache, &view.chain);
                view.budgets = self.load_budgets(tx, p, &view.chain, now, cache).await?;
            }
        }
        Ok(())
    }

    /// How long a completed call of `tool` is replayed (ms): the tool's own retention or the
    /// registry's, never shorter than the approval expiry.
    pub(crate) fn retention_ms(&self, tool: &str) -> i64 {
        let cfg = self.store.config();
        match self
            .registry
            .tool(tool)
            .and_then(|t| t.config.idempotency.retention_hours)
        {
            Some(h) => h.max(cfg.approval_expiry_hours) * 3_600_000,
            None => cfg.retention_ms(),
        }
    }

    /// Reserves the key, the budgets up the parent chain and the approval nonces. On a lost
    /// race returns why (and leaves nothing reserved).
    #[allow(clippy::too_many_arguments)]
    pub(crate) async fn reserve(
        &self,
        tx: &mut Tx,
        p: &mut Pending,
        decision: &Decision,
        tier: Tier,
        view: &LedgerView,
        now: Timestamp,
        cache: &mut BatchCache,
    ) -> Result<Option<Lost>> {
        let (chain, subject) = (&view.chain, view.subject.as_str());
        if let Some(lost) = self
            .reserve_key_and_step(tx, p, decision, view, now, cache)
            .await?
        {
            return Ok(Some(lost));
        }
        if let Some(lost) = self.reserve_budgets(tx, p, tier, chain, now, cache).await? {
            return Ok(Some(lost));
        }
        self.consume_approvals(tx, p, decision, subject, now)
            .await?;
        Ok(None)
    }

    /// The idempotency key and the step row: a direct call's step is made (or re-armed for a
    /// retry); a planned step, already claimed, keeps the decision that let it through.
    async fn reserve_key_and_step(
        &self,
        tx: &mut Tx,
        p: &mut Pending,
        decision: &Decision,
        view: &LedgerView,
        now: Timestamp,
        cache: &mut BatchCache,
    ) -> Result<Option<Lost>> {
        let run_exists = view.run_exists;
        let reg: &Registry = &self.registry;
        let input_hash = InputHash::of(&p.inputs);
        let retention = self.retention_ms(&p.tool);
        let expires = now.millis() + retention;
        // A direct read that does not replay takes no key: a new step every time, whose key
        // column is made unique with its id. Anything else takes the key.
        let keyed = p.kind != StepKind::Direct || self.replays(p);
        // A direct call's step: the one an earlier attempt of this operation left (to be
        // retried: it failed retryably), or a new one. Known before the key is taken, so the key
        // row names it from the start. An earlier step of another principal (a key shared
        // across principals), or one settled longer ago than the retention, is not this call's:
        // its key is archived and a new step made.
        let existing = if p.kind == StepKind::Direct && keyed {
            // Read with the key's record, unless a lost reservation may have changed it since.
            let step = match &view.key.step {
                Some(known) => known.clone(),
                None => crate::ledger::keys::step_of(tx, &p.idem_key).await?,
            };
            let found = match step {
                Some(s)
                    if s.principal == p.principal && s.updated_at + retention > now.millis() =>
                {
                    // The retry is recorded in the run of the step it retries.
                    p.run_id = s.run_id;
                    Some((s.step_id, s.attempts))
                }
                Some(_) => {
                    crate::ledger::keys::archive(tx, &p.idem_key).await?;
                    None
                }
                None => None,
            };
            p.step_id = found
                .as_ref()
                .map_or_else(|| StepId::new(new_id()), |(id, _)| id.clone());
            found
        } else {
            if p.kind == StepKind::Direct {
                p.step_id = StepId::new(new_id());
            }
            None
        };
        let reserving = self.toggles.get().reserve_before_call;
        let allowed = decision_json(decision);
        let role = reg
            .principal(&p.principal)
            .map(|x| x.role().to_string())
            .unwrap_or_default();
        // A direct call cannot outlast its timeout (see `StoreConfig::attempt_lease`).
        let lease = now.millis() + self.store.config().attempt_lease().as_millis() as i64;
        let step_key = if keyed {
            p.idem_key.to_string()
        } else {
            format!("{}/{}", p.idem_key, p.step_id)
        };

        // A new direct step under its key: the key, the run (if new) and the step row, taken
        // together (one statement on PostgreSQL).
        if p.kind == StepKind::Direct && keyed && existing.is_none() && reserving {
            let step = self.direct_step(p, &role, &step_key, lease, &allowed, now);
            let opened = crate::ledger::steps::open_keyed(tx, &step, expires, !run_exists).await?;
            let Some(seq) = opened else {
                return Ok(Some(Lost::InProgress));
            };
            if seq == crate::ledger::steps::NUMBERED_LATER
                && let Some(read) = cache.read.as_mut()
            {
                read.opened(tx.epoch(), &p.run_id, &p.tool, step.tier);
            }
            p.attempts = 1;
            p.seq = seq;
            return Ok(None);
        }

        let won = !keyed
            || crate::ledger::keys::take(tx, &p.idem_key, &input_hash, &p.step_id, now, expires)
                .await?;
        if !won {
            if reserving {
                return Ok(Some(Lost::InProgress));
            }
            // Reservation switched off (fault evaluation): the key row follows the newest step.
            crate::ledger::keys::move_to(tx, &p.idem_key, &p.step_id).await?;
        }

        // The step row: a planned step is already claimed; a direct call gets (or re-arms) one.
        if p.kind == StepKind::Direct {
            if !run_exists {
                Store::ensure_run(tx, &p.run_id, &p.principal, p.purpose.as_deref(), now).await?;
            }
            match existing {
                Some((id, attempts)) => {
                    if attempts >= i64::from(MAX_ATTEMPTS) {
                        crate::ledger::keys::forget(tx, &p.idem_key).await?;
                        return Ok(Some(Lost::AttemptsExhausted));
                    }
                    steps::rearm(tx, &id, lease, &allowed, now).await?;
                    p.step_id = id;
                    p.attempts = attempts + 1;
                }
                None => {
                    let step = self.direct_step(p, &role, &step_key, lease, &allowed, now);
                    let seq = steps::insert_next(tx, step).await?;
                    p.attempts = 1;
                    p.seq = seq;
                }
            }
        }

        if p.kind != StepKind::Direct {
            // A claimed planned step keeps its decision too, for recovery (see `decision_json`).
            steps::keep_decision(tx, &p.step_id, &decision_json(decision)).await?;
        }
        Ok(None)
    }

    /// The new step row of direct call `p`, running on its first attempt until `lease`.
    fn direct_step<'a>(
        &'a self,
        p: &'a Pending,
        role: &'a str,
        idem_key: &'a str,
        lease: i64,
        allowed: &'a str,
        now: Timestamp,
    ) -> NewStep<'a> {
        let tool = self.registry.tool(&p.tool).expect("checked by the caller");
        NewStep {
            step_id: &p.step_id,
            run_id: &p.run_id,
            seq: 0,
            kind: StepKind::Direct,
            principal: &p.principal,
            role,
            tool: &p.tool,
            effect: tool.config.effect,
            tier: tool.config.tier,
            purpose: p.purpose.as_deref(),
            reason: p.reason.as_deref(),
            evidence: &p.evidence,
            actor: &p.actor,
            inputs: &p.inputs,
            idem_key,
            status: StepStatus::Running,
            attempts: 1,
            compensates: None,
            lease_until: Some(lease),
            decision: Some(allowed),
            now,
        }
    }

    /// Window budgets, then the daily budgets of every counter up the parent chain that has a
    /// limit. A refusal gives back what the call took already, its key included.
    async fn reserve_budgets(
        &self,
        tx: &mut Tx,
        p: &mut Pending,
        tier: Tier,
        chain: &[String],
        now: Timestamp,
        cache: &mut BatchCache,
    ) -> Result<Option<Lost>> {
        let reg: &Registry = &self.registry;
        // Window budgets first (`window`), so a refusal there leaves no counter to undo.
        if let Some(t) = reg.tool(&p.tool).filter(|t| !t.windows.is_empty())
            && !crate::ledger::windows::reserve(tx, t, chain, &p.inputs, &p.step_id, now).await?
        {
            self.unreserve_key(tx, p).await?;
            return Ok(Some(Lost::Budget));
        }

        // Budgets: every counter in the chain that has a limit, in one order everywhere (no
        // deadlocks between workers), each a conditional increment.
        if tier != Tier::Read {
            let day = now.utc_day();
            let mut limited: Vec<(&str, u32)> = chain
                .iter()
                .filter_map(|id| self.daily_limit(id, tier).map(|l| (id.as_str(), l)))
                .collect();
            limited.sort();
            if !crate::ledger::budgets::charge(tx, cache, &p.step_id, &limited, tier, day).await? {
                crate::ledger::windows::release(tx, &p.step_id).await?;
                self.unreserve_key(tx, p).await?;
                return Ok(Some(Lost::Budget));
            }
        }

        Ok(None)
    }

    /// Approvals are single-use: their nonces are consumed here, in the transaction that
    /// starts the call, and the step keeps who approved it.
    async fn consume_approvals(
        &self,
        tx: &mut Tx,
        p: &Pending,
        decision: &Decision,
        subject: &str,
        now: Timestamp,
    ) -> Result<()> {
        // Approvals: single-use, consumed here, in the transaction that starts the call.
        for c in &decision.approvals {
            if !approvals::consume_nonce(tx, &c.nonce, subject, now).await? {
                // Another call consumed it between our read and now: fail closed.
                return Err(StoreError::Token(toolgate_core::TokenError::Reused(
                    c.nonce.clone(),
                )));
            }
        }
        if !decision.approvals.is_empty() {
            approvals::mark_consumed(tx, subject, now).await?;
            let approval = json!({
                "by": decision.approvals.iter().map(|c| c.approver.clone()).collect::<Vec<_>>(),
                "at": now.millis(),
                "input_hash": decision.input_hash.as_str(),
            });
            steps::keep_approval(tx, &p.step_id, &canonical(&approval)).await?;
        }
        Ok(())
    }

    pub(crate) async fn unreserve_key(&self, tx: &mut Tx, p: &Pending) -> Result<()> {
        crate::ledger::keys::release_in_flight(tx, &p.idem_key).await?;
        if p.kind == StepKind::Direct {
            steps::fail_unstarted(tx, &p.step_id).await?;
        }
        Ok(())
    }
}
