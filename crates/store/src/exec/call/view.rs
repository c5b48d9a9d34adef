//! The ledgers' view of a call: everything the engine decides on that is not in the request
//! itself, read inside the deciding transaction. A claimed batch reads each principal's budgets
//! once ([`BatchCache`]) and keeps them current with its own reservations.

use toolgate_core::{PriorCall, PriorCalls, PriorOutcome};

use crate::exec::*;
use crate::ledger::runs::{KeysRead, RunsRead};

/// What the ledgers hold for one call, read once before it is decided.
pub(crate) struct LedgerView {
    /// The run so far, as policies and rate limits count it.
    pub(crate) run: RunHistory,
    /// Whether the run's row is known to exist: it has steps (runs are never deleted), so a
    /// new step of it need not create it.
    pub(crate) run_exists: bool,
    /// The principal and every ancestor it draws budget from, nearest first.
    pub(crate) chain: Vec<String>,
    /// Today's budget use along `chain`, and the tool's window budgets.
    pub(crate) budgets: BudgetView,
    pub(crate) key: KeyView,
    /// What an approval for this call binds to (see [`Executor::subject`]).
    pub(crate) subject: String,
    /// The approvals the caller presented, then (once [`Self::grants_read`]) those people
    /// granted for `subject`.
    pub(crate) tokens: Vec<ApprovalToken>,
    /// The nonces of `tokens` already spent (read with the grants).
    pub(crate) used_nonces: HashSet<String>,
    /// Whether the grants and spent nonces have been read. Approvals change only the gate
    /// check's outcome, so they are read only for a call the engine would gate without them
    /// ([`Executor::read_grants`]): an ungated call that presents none reads nothing for them.
    /// Presented tokens are read with their nonces at once.
    pub(crate) grants_read: bool,
    /// How the handler serves the tool's definition now (the pin check's input).
    pub(crate) served: Served,
}

/// A direct call's key as read with its run: the key's record, and the step row that carries
/// the key.
type ReadKey = Option<(Option<HeldKey>, Option<KeyStep>)>;

/// What a reservation batch read of all its direct calls' runs and keys, in one statement
/// before deciding the first ([`BatchRead::read`]). It is current while the batch's
/// transaction sends no other statement: the calls decided on it whose steps are deferred
/// ([`crate::ledger::steps::open_keyed`]) keep their runs' counts current here, as those steps
/// will count once written. Any other statement (a refusal written, a budget read, a key read
/// again) ends it, and the calls after it read their own runs and keys as usual.
#[derive(Default)]
pub(crate) struct BatchRead {
    /// The transaction's statement count when read ([`Tx::epoch`]).
    epoch: u64,
    runs: RunsRead,
    keys: KeysRead,
}

impl BatchRead {
    /// Reads the runs of `calls` and the keys of those that replay (`(run, key)`, the key
    /// `None` for a call that does not replay).
    pub(crate) async fn read(
        tx: &mut Tx,
        calls: impl Iterator<Item = (String, Option<String>)>,
    ) -> Result<BatchRead> {
        let (mut runs, mut keys) = (Vec::new(), Vec::new());
        for (run, key) in calls {
            runs.push(run);
            keys.extend(key);
        }
        for v in [&mut runs, &mut keys] {
            v.sort_unstable();
            v.dedup();
        }
        let (runs, keys) = crate::ledger::runs::histories_and_keys(tx, &runs, &keys).await?;
        Ok(BatchRead {
            epoch: tx.epoch(),
            runs,
            keys,
        })
    }

    /// `run`'s counts, whether it has steps, and `key`'s record (for a call that replays), as
    /// read: `None` when either was not read, or the read is no longer current at `epoch`. A
    /// key is handed out once, so a second call of the batch with the same key reads it again
    /// (and finds the first's step, written before that read).
    fn take(
        &mut self,
        epoch: u64,
        run: &str,
        key: Option<&str>,
    ) -> Option<(RunHistory, bool, ReadKey)> {
        if epoch != self.epoch {
            *self = BatchRead::default();
            return None;
        }
        let (history, exists) = self.runs.get(run)?.clone();
        let key = match key {
            Some(k) => Some(self.keys.remove(k)?),
            None => None,
        };
        Some((history, exists, key))
    }

    /// Counts in `run` a step of `tool` opened (running, so allowed) and deferred by the
    /// batch, as the step's trigger will count it once written.
    pub(crate) fn opened(&mut self, epoch: u64, run: &str, tool: &str, tier: Tier) {
        if epoch != self.epoch {
            return;
        }
        if let Some((history, exists)) = self.runs.get_mut(run) {
            history.counted.push(PriorCalls {
                call: PriorCall {
                    tool: tool.to_string(),
                    tier,
                    outcome: PriorOutcome::Allowed,
                },
                n: 1,
            });
            *exists = true;
        }
    }
}

impl Prepared {
    /// A call whose step the batch wrote deferred learns its number in its run.
    pub(crate) fn numbered(&mut self, numbered: &HashMap<String, i64>) {
        if let Prepared::Call { p, .. } = self
            && let Some(seq) = numbered.get(p.step_id.as_str())
        {
            p.seq = *seq;
        }
    }
}

impl Executor {
    /// Whether `p`'s tool replays a completed call (an unknown tool is treated as one that does).
    pub(crate) fn replays(&self, p: &Pending) -> bool {
        self.registry.tool(&p.tool).is_none_or(replays)
    }

    /// What [`BatchRead::read`] reads for direct call `p`: its run, and its key if it replays.
    pub(crate) fn batch_read_of(&self, p: &Pending) -> (String, Option<String>) {
        let replaying = self.replays(p);
        (
            p.run_id.to_string(),
            replaying.then(|| p.idem_key.to_string()),
        )
    }
}

/// The call's idempotency key as the ledger holds it.
pub(crate) struct KeyView {
    pub(crate) state: IdempotencyState,
    /// The key's record, when it has one.
    pub(crate) held: Option<HeldKey>,
    /// For a key another principal holds: by whom and when (for the refusal's message).
    pub(crate) elsewhere: Option<String>,
    /// A direct call's step row that carries the key, read with the key's record so the
    /// reservation need not look for it again: `None` when not read (or no longer current:
    /// a reservation that lost a race may have made or changed it), `Some(None)` when there
    /// is none.
    pub(crate) step: Option<Option<KeyStep>>,
}

impl Executor {
    /// Reads the ledgers' view of `p` (and takes the approvals it presented).
    pub(crate) async fn load_view(
        &self,
        tx: &mut Tx,
        p: &mut Pending,
        now: Timestamp,
        cache: &mut BatchCache,
    ) -> Result<LedgerView> {
        let (run, run_exists, read_key) = self.load_run(tx, p, cache).await?;
        let chain = self.budget_chain(p);
        let budgets = self.load_budgets(tx, p, &chain, now, cache).await?;
        let key = self.load_key(tx, p, now, read_key).await?;
        let subject = self.subject(p);
        let presented = !p.presented.is_empty();
        let mut view = LedgerView {
            run,
            run_exists,
            chain,
            budgets,
            key,
            subject,
            tokens: std::mem::take(&mut p.presented),
            used_nonces: HashSet::new(),
            grants_read: false,
            served: self.handler.served(&self.target(&p.tool)),
        };
        if presented {
            // A presented token must never be judged before its nonce is known to be unspent.
            self.read_grants(tx, p, &mut view).await?;
        }
        Ok(view)
    }

    /// Adds to `view` the approvals people granted for its subject and which of all its
    /// tokens' nonces are spent. A planned step on its first attempt cannot have been parked
    /// yet, so has no grants.
    pub(crate) async fn read_grants(
        &self,
        tx: &mut Tx,
        p: &Pending,
        view: &mut LedgerView,
    ) -> Result<()> {
        if p.kind == StepKind::Direct || p.attempts > 1 {
            for t in crate::ledger::approvals::granted(tx, &view.subject).await? {
                if !view.tokens.contains(&t) {
                    view.tokens.push(t);
                }
            }
        }
        let nonces: Vec<String> = view
            .tokens
            .iter()
            .filter_map(|t| self.keys.open(t).ok().map(|c| c.nonce))
            .collect();
        view.used_nonces = used_nonces(tx, &nonces).await?;
        view.grants_read = true;
        Ok(())
    }

    /// The run so far, as policies and rate limits see it: the steps before this one (a
    /// direct call sees every step of its run, and the reads this process has under way in
    /// it), and the calls that hold no step row; and whether the run has steps (so its row
    /// exists). A direct call that replays also gets its key's record and the step that
    /// carries its key, read in the same statement (`None` for any other call).
    /// In a reservation batch that read its calls' runs and keys at its start, that read is
    /// used while it is current ([`BatchRead`]).
    async fn load_run(
        &self,
        tx: &mut Tx,
        p: &Pending,
        cache: &mut BatchCache,
    ) -> Result<(RunHistory, bool, ReadKey)> {
        let replaying = self.replays(p);
        let read = cache.read.as_mut().filter(|_| p.kind == StepKind::Direct);
        let key = replaying.then_some(p.idem_key.as_str());
        if let Some((mut run, exists, key)) = read.and_then(|r| r.take(tx.epoch(), &p.run_id, key))
        {
            self.store.count_unrecorded(&p.run_id, None, &mut run);
            return Ok((run, exists, key));
        }
        let (mut run, exists, key) = match p.kind {
            StepKind::Direct if replaying => {
                let (run, exists, held, step) =
                    crate::ledger::runs::history_and_key(tx, &p.run_id, p.idem_key.as_str())
                        .await?;
                (run, exists, Some((held, step)))
            }
            StepKind::Direct => {
                let (run, exists) = crate::ledger::runs::history(tx, &p.run_id, None).await?;
                (run, exists, None)
            }
            _ => {
                let (run, exists) =
                    crate::ledger::runs::history(tx, &p.run_id, Some(p.seq)).await?;
                return Ok((run, exists, None));
            }
        };
        self.store.count_unrecorded(&p.run_id, None, &mut run);
        Ok((run, exists, key))
    }

    /// `id`'s daily budget for `tier`, if it has one (a read tier never has one).
    pub(crate) fn daily_limit(&self, id: &str, tier: Tier) -> Option<u32> {
        self.registry.principal(id).and_then(|p| p.budget(tier))
    }

    /// Whether anyone on `principal`'s chain has a daily budget for `tier`: whether a call of
    /// that tier reserves and charges one.
    pub(crate) fn budgeted(&self, principal: &str, tier: Tier) -> bool {
        self.registry.principal(principal).is_some_and(|pr| {
            std::iter::once(principal)
                .chain(pr.ancestors.iter().map(String::as_str))
                .any(|id| self.daily_limit(id, tier).is_some())
        })
    }

    /// The daily budget counters `p` would charge if allowed — (principal, tier, day) for
    /// everyone on its chain with a daily budget for its tool's tier — sorted.
    pub(crate) fn budget_counters(&self, p: &Pending, now: Timestamp) -> Vec<(String, Tier, i64)> {
        let Some(tier) = self.registry.tool(&p.tool).map(|t| t.config.tier) else {
            return Vec::new();
        };
        let day = now.utc_day();
        let mut counters: Vec<_> = self
            .budget_chain(p)
            .into_iter()
            .filter(|id| self.daily_limit(id, tier).is_some())
            .map(|id| (id, tier, day))
            .collect();
        counters.sort();
        counters
    }

    /// The principal and every ancestor it draws from.
    fn budget_chain(&self, p: &Pending) -> Vec<String> {
        self.registry
            .principal(&p.principal)
            .map(|pr| {
                std::iter::once(pr.id().to_string())
                    .chain(pr.ancestors.iter().cloned())
                    .collect()
            })
            .unwrap_or_default()
    }

    /// Today's budget use of everyone on `chain` with a daily budget for the tool's tier (no
    /// one else's counts: a read, or a principal without that budget, is never charged or
    /// checked), and the windows of the tool's window budgets.
    pub(crate) async fn load_budgets(
        &self,
        tx: &mut Tx,
        p: &Pending,
        chain: &[String],
        now: Timestamp,
        cache: &mut BatchCache,
    ) -> Result<BudgetView> {
        let day = now.utc_day();
        let mut budgets = BudgetView::default();
        let tier = self.registry.tool(&p.tool).map(|t| t.config.tier);
        let limited = |id: &&String| tier.is_some_and(|t| self.daily_limit(id, t).is_some());
        for id in chain.iter().filter(limited) {
            if !cache.budgets.contains_key(id) {
                let used = crate::ledger::budgets::used_today(tx, id, day).await?;
                cache.budgets.insert(id.clone(), used);
            }
            for (tier, used) in &cache.budgets[id] {
                budgets.set(id, *tier, *used);
            }
        }
        if let Some(t) = self
            .registry
            .tool(&p.tool)
            .filter(|t| !t.windows.is_empty())
        {
            budgets.windows = crate::ledger::windows::load(tx, t, chain, &p.inputs, now).await?;
        }
        Ok(budgets)
    }

    /// The key's state. A direct read that does not replay has no key record to look up: it
    /// runs every time. A planned step's key is its own (run, seq, inputs): on its first
    /// attempt no record can exist yet either.
    /// `read`: what [`Self::load_run`] read of a direct call's key (`None` for a direct call
    /// that does not replay).
    async fn load_key(
        &self,
        tx: &mut Tx,
        p: &Pending,
        now: Timestamp,
        read: ReadKey,
    ) -> Result<KeyView> {
        let first_attempt = p.kind == StepKind::Planned && p.attempts <= 1;
        let mut key = KeyView {
            state: IdempotencyState::Fresh,
            held: None,
            elsewhere: None,
            step: None,
        };
        let held = match (p.kind, read) {
            (StepKind::Direct, Some((held, step))) => {
                key.step = Some(step);
                held
            }
            (StepKind::Direct, None) => return Ok(key),
            _ if first_attempt => return Ok(key),
            _ => crate::ledger::keys::held(tx, &p.idem_key).await?,
        };
        // A completed key past its retention is forgotten, and its step's key archived: that
        // step no longer carries it.
        let lapsed = held.as_ref().is_some_and(|h| h.lapsed(now));
        let Some(h) = self.key_state(tx, p, held, now).await? else {
            if lapsed && key.step.is_some() {
                key.step = Some(None);
            }
            return Ok(key);
        };
        let input_hash = InputHash::of(&p.inputs);
        key.state = if p.kind == StepKind::Direct
            && h.principal.as_deref().is_some_and(|o| o != p.principal)
        {
            key.elsewhere = Some(format!(
                "by '{}' at {}",
                h.principal.as_deref().unwrap_or("another principal"),
                h.created_at
                    .map_or_else(|| "an earlier time".into(), |t| t.to_rfc3339())
            ));
            IdempotencyState::Elsewhere
        } else if h.input_hash != input_hash.as_str() {
            IdempotencyState::InputsDiffer
        } else if h.state == crate::ledger::keys::KeyState::Done {
            IdempotencyState::Done
        } else if self.toggles.get().reserve_before_call {
            IdempotencyState::InFlight
        } else {
            IdempotencyState::Fresh
        };
        key.held = Some(h);
        Ok(key)
    }

    /// The record of `p`'s key (`held`, as read), if it holds one. A completed key past its
    /// retention is forgotten here (its record deleted, its step's key archived as
    /// `KEY/STEP`), so the operation may be made again.
    pub(crate) async fn key_state(
        &self,
        tx: &mut Tx,
        p: &Pending,
        held: Option<HeldKey>,
        now: Timestamp,
    ) -> Result<Option<HeldKey>> {
        let Some(h) = held else {
            return Ok(None);
        };
        if h.lapsed(now) {
            crate::ledger::keys::forget(tx, &p.idem_key).await?;
            crate::ledger::keys::archive(tx, &p.idem_key).await?;
            return Ok(None);
        }
        Ok(Some(h))
    }

    /// The subject an approval binds to: the step id, or for a direct call the caller and its
    /// key, so an approval lets only the principal that asked run the call, also when the
    /// tool's key is shared across principals.
    pub(crate) fn subject(&self, p: &Pending) -> String {
        match p.kind {
            StepKind::Direct => format!("{}/{}", p.principal, p.idem_key),
            _ => p.step_id.to_string(),
        }
    }
}
