//! Runs: who owns each and whether it is open, each principal's current run, and what a run
//! did so far as the engine's policies and rate limits count it. A direct call reads that as
//! counts kept beside the run (`step_tally`, maintained by triggers on `steps`, and
//! `run_tally`), a few rows whatever the run's length, so a call in a long run — a client that
//! never names a run joins its principal's implicit one — costs what a call in a short one
//! does. A planned step counts only the steps before it, so it counts them (one `GROUP BY`
//! over a plan's steps, which a plan bounds).

use std::collections::HashMap;

use toolgate_core::{
    PriorCall, PriorCalls, PriorOutcome, RunHistory, RunId, StepStatus, Tier, Timestamp,
};

use crate::db::{Row, Sql, Tx, args};
use crate::error::{Result, StoreError};
use crate::ledger::keys::{self, HeldKey, KeyStep};
use crate::model::RunState;
use crate::store::{parse_status, parse_tier};

/// A count's outcome as `step_tally` keeps it.
fn parse_outcome(s: &str) -> Result<PriorOutcome> {
    match s {
        "allowed" => Ok(PriorOutcome::Allowed),
        "denied" => Ok(PriorOutcome::Denied),
        "gated" => Ok(PriorOutcome::Gated),
        other => Err(StoreError::UnknownValue {
            what: "step outcome",
            value: other.to_string(),
        }),
    }
}

/// How an earlier step of the run counts: `None` for one that decided nothing yet (pending) or
/// may run again (failed).
fn prior_outcome(status: StepStatus) -> Option<PriorOutcome> {
    match status {
        StepStatus::Refused => Some(PriorOutcome::Denied),
        StepStatus::NeedsApproval => Some(PriorOutcome::Gated),
        StepStatus::Pending | StepStatus::Failed => None,
        StepStatus::Running | StepStatus::Done | StepStatus::Unknown => Some(PriorOutcome::Allowed),
    }
}

/// A whole run's steps as the triggers count them (`$1`: the run), by outcome (in the `status`
/// column): compensations and the steps that decided nothing yet or may run again are not.
/// With a literal, these columns are added to each row.
macro_rules! step_counts {
    () => {
        step_counts!("")
    };
    ($more:literal) => {
        concat!(
            "SELECT 'kept' AS src, tool, tier, outcome AS status, n",
            $more,
            " FROM step_tally WHERE run_id = $1 AND n > 0"
        )
    };
}

/// The run's calls that hold no step row (`$1`: the run). With a literal, as `step_counts!`.
macro_rules! tallies {
    () => {
        tallies!("")
    };
    ($more:literal) => {
        concat!(
            "SELECT 'tally' AS src, tool, tier, status, n",
            $more,
            " FROM run_tally WHERE run_id = $1"
        )
    };
}

/// The run `run_id` so far: its steps numbered below `before` (all of them for `None`),
/// compensations left out, and the calls that hold no step row, counted in `run_tally` as
/// their audit records are appended (refused direct calls; direct reads made without a
/// reservation). A planned step (`before` set) sees the steps before it and every refusal of
/// its run — a denial anywhere in a run counts against what it may do next — but not the
/// stepless reads, which have no place in the plan's order (a direct call's step, numbered
/// after the plan's, never counted for them either). One statement: every count travels in
/// one result. Also whether any step row of the run was counted: then the run's row exists (a
/// step references it, and runs are never deleted).
pub(crate) async fn history(
    db: &mut impl Sql,
    run_id: &str,
    before: Option<i64>,
) -> Result<(RunHistory, bool)> {
    let Some(before) = before else {
        let rows = db
            .rows(
                concat!(step_counts!(), " UNION ALL ", tallies!()),
                args![run_id],
            )
            .await?;
        let (history, has_steps, _) = counts(rows)?;
        return Ok((history, has_steps));
    };
    let rows = db
        .rows(
            "SELECT 'step' AS src, tool, tier, status, COUNT(*) AS n FROM steps \
             WHERE run_id = $1 AND seq < $2 AND kind <> 'compensation' \
             AND status NOT IN ('pending', 'failed') GROUP BY tool, tier, status \
             UNION ALL \
             SELECT 'tally' AS src, tool, tier, status, n FROM run_tally \
             WHERE run_id = $1 AND status = 'refused'",
            args![run_id, before],
        )
        .await?;
    let (history, has_steps, _) = counts(rows)?;
    Ok((history, has_steps))
}

/// A direct call's run so far (as [`history`] reads it for a direct call) and its owner, in
/// one statement: the counts, and one row more for the run itself when it exists. So the
/// check that the caller may put calls in a run it names costs the read of the run it needs
/// anyway, not a statement of its own.
pub(crate) async fn history_and_owner(
    db: &mut impl Sql,
    run_id: &str,
) -> Result<(RunHistory, bool, Option<RunOwner>)> {
    let rows = db
        .rows(
            concat!(
                step_counts!(),
                " UNION ALL ",
                tallies!(),
                " UNION ALL SELECT 'owner' AS src, r.principal AS tool, '' AS tier, \
                 CASE WHEN p.run_id IS NULL THEN '' ELSE 'planned' END AS status, 0 AS n \
                 FROM runs r LEFT JOIN plans p ON p.run_id = r.run_id WHERE r.run_id = $1"
            ),
            args![run_id],
        )
        .await?;
    counts(rows)
}

/// The row of each key in `q.k` (`$from` names `q`): the key's record with the step that holds
/// it (as [`keys::held_and_step_of`] reads it), and the step row that carries the key in its
/// key column; `src` = `key`, then `$tag` (columns to add, each followed by a comma), then
/// NULL for the counts' columns.
macro_rules! key_rows {
    ($tag:literal, $from:literal) => {
        concat!(
            "SELECT 'key' AS src, ",
            $tag,
            "NULL AS tool, NULL AS tier, h.status, NULL AS n, \
             i.input_hash, i.state, i.outcome, i.expires_at, i.step_id, h.principal, \
             h.created_at, s.step_id AS own_step, s.attempts AS own_attempts, \
             s.principal AS own_principal, s.updated_at AS own_updated_at, \
             s.run_id AS own_run_id FROM ",
            $from,
            " LEFT JOIN idempotency i ON i.idem_key = q.k \
             LEFT JOIN steps h ON h.step_id = i.step_id \
             LEFT JOIN steps s ON s.idem_key = q.k"
        )
    };
}

/// A direct call's run so far (as [`history`] reads it for a direct call) and its idempotency
/// key as the ledger holds it (as [`keys::held_and_step_of`] reads it), in one statement: what
/// deciding a direct call that replays needs of its run and its key, in one round trip (on
/// PostgreSQL also one snapshot). The key's row comes first and is always there (`src` =
/// `key`); the counts follow. Each kind of row has NULL in the other kind's columns, typed by
/// the key's row for PostgreSQL's `UNION`.
pub(crate) async fn history_and_key(
    db: &mut impl Sql,
    run_id: &str,
    key: &str,
) -> Result<(RunHistory, bool, Option<HeldKey>, Option<KeyStep>)> {
    let mut rows = db
        .rows(
            concat!(
                key_rows!("", "(SELECT $2 AS k) q"),
                " UNION ALL ",
                step_counts!(
                    ", NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL"
                ),
                " UNION ALL ",
                tallies!(
                    ", NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL"
                ),
            ),
            args![run_id, key],
        )
        .await?;
    let at = rows
        .iter()
        .position(|r| r.text("src").is_ok_and(|s| s == "key"))
        .ok_or_else(|| StoreError::Bug("the key lookup returned no row".into()))?;
    let (held, step) = keys::held_and_step_of(&rows.remove(at))?;
    let (history, exists, _) = counts(rows)?;
    Ok((history, exists, held, step))
}

/// What a reservation batch's direct calls read of their runs and keys, as
/// [`history_and_key`] reads one call's, for all of them in one statement (PostgreSQL: the
/// runs and keys as arrays): each run's counts and whether it has steps, and each key's
/// record and the step row that carries it. Every run and key asked for is in the answer.
pub(crate) async fn histories_and_keys(
    tx: &mut Tx,
    runs: &[String],
    keys: &[String],
) -> Result<(RunsRead, KeysRead)> {
    let rows = tx
        .rows(
            concat!(
                key_rows!("q.k AS tag, ", "unnest($2::text[]) AS q (k)"),
                " UNION ALL \
             SELECT 'kept' AS src, run_id AS tag, tool, tier, outcome AS status, n, NULL, NULL, \
             NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL \
             FROM step_tally WHERE run_id = ANY($1::text[]) AND n > 0 \
             UNION ALL \
             SELECT 'tally' AS src, run_id AS tag, tool, tier, status, n, NULL, NULL, NULL, \
             NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL \
             FROM run_tally WHERE run_id = ANY($1::text[])"
            ),
            args![runs.to_vec(), keys.to_vec()],
        )
        .await?;
    let mut by_run: HashMap<String, Vec<Row>> =
        runs.iter().map(|r| (r.clone(), Vec::new())).collect();
    let mut read_keys = KeysRead::new();
    for r in rows {
        let tag = r.text("tag")?;
        if r.text("src")? == "key" {
            read_keys.insert(tag, keys::held_and_step_of(&r)?);
        } else if let Some(of_run) = by_run.get_mut(&tag) {
            of_run.push(r);
        }
    }
    if let Some(missing) = keys.iter().find(|k| !read_keys.contains_key(*k)) {
        return Err(StoreError::Bug(format!("the key {missing} was not read")));
    }
    let mut read_runs = RunsRead::new();
    for (run, rows) in by_run {
        let (history, exists, _) = counts(rows)?;
        read_runs.insert(run, (history, exists));
    }
    Ok((read_runs, read_keys))
}

/// Runs as [`histories_and_keys`] read them: the counts, and whether the run has steps.
pub(crate) type RunsRead = HashMap<String, (RunHistory, bool)>;

/// Keys as [`histories_and_keys`] read them: the key's record, and the step that carries it.
pub(crate) type KeysRead = HashMap<String, (Option<HeldKey>, Option<KeyStep>)>;

/// The counts of [`history`]'s and [`history_and_owner`]'s rows; whether a step was counted;
/// and the owner row, if one came.
fn counts(rows: Vec<Row>) -> Result<(RunHistory, bool, Option<RunOwner>)> {
    let mut counted = Vec::new();
    let mut has_steps = false;
    let mut owner = None;
    for r in rows {
        let src = r.text("src")?;
        let outcome = match src.as_str() {
            "owner" => {
                owner = Some(RunOwner {
                    principal: r.text("tool")?,
                    planned: r.text("status")? == "planned",
                });
                continue;
            }
            // Kept by the triggers as the outcome itself.
            "kept" => Some(parse_outcome(&r.text("status")?)?),
            // Counted from steps or run_tally by status.
            _ => prior_outcome(parse_status(&r.text("status")?)?),
        };
        has_steps |= src == "kept" || src == "step";
        let Some(outcome) = outcome else {
            continue;
        };
        counted.push(PriorCalls {
            call: PriorCall {
                tool: r.text("tool")?,
                tier: parse_tier(&r.text("tier")?)?,
                outcome,
            },
            n: r.i64("n")?,
        });
    }
    let history = RunHistory {
        calls: Vec::new(),
        counted,
    };
    Ok((history, has_steps, owner))
}

/// A call recorded in the audit chain that holds no step row: how its run counts it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Stepless {
    pub run_id: RunId,
    pub tool: String,
    pub tier: Tier,
    /// `Refused`, or `Done` for a read made without a reservation.
    pub status: StepStatus,
}

/// Counts `calls` with their runs; written with their audit records.
pub(crate) async fn tally(tx: &mut Tx, calls: &[Stepless]) -> Result<()> {
    for c in calls {
        tx.exec(
            "INSERT INTO run_tally (run_id, tool, tier, status, n) VALUES ($1, $2, $3, $4, 1) \
             ON CONFLICT (run_id, tool, tier, status) DO UPDATE SET n = run_tally.n + 1",
            args![&c.run_id, &c.tool, c.tier.as_str(), c.status.as_str()],
        )
        .await?;
    }
    Ok(())
}

/// The number the run's next step takes (compensations included).
pub(crate) async fn next_seq(tx: &mut Tx, run_id: &str) -> Result<i64> {
    Ok(tx
        .opt(
            "SELECT COALESCE(MAX(seq), 0) + 1 AS next_seq FROM steps WHERE run_id = $1",
            args![run_id],
        )
        .await?
        .map(|r| r.i64("next_seq"))
        .transpose()?
        .unwrap_or(1))
}

/// Opens run `run_id` for `principal` (fails if it exists).
pub(crate) async fn open(
    tx: &mut Tx,
    run_id: &str,
    principal: &str,
    purpose: Option<&str>,
    now: Timestamp,
) -> Result<()> {
    tx.exec(
        "INSERT INTO runs (run_id, principal, purpose, status, created_at, updated_at) \
         VALUES ($1, $2, $3, $5, $4, $4)",
        args![
            run_id,
            principal,
            purpose,
            now.millis(),
            RunState::Open.as_str()
        ],
    )
    .await?;
    Ok(())
}

/// Opens run `run_id` for `principal` unless it exists.
pub(crate) async fn ensure(
    tx: &mut Tx,
    run_id: &str,
    principal: &str,
    purpose: Option<&str>,
    now: Timestamp,
) -> Result<()> {
    tx.exec(
        "INSERT INTO runs (run_id, principal, purpose, status, created_at, updated_at) \
         VALUES ($1, $2, $3, $5, $4, $4) ON CONFLICT (run_id) DO NOTHING",
        args![
            run_id,
            principal,
            purpose,
            now.millis(),
            RunState::Open.as_str()
        ],
    )
    .await?;
    Ok(())
}

/// Marks run `run_id` aborted; whether there is such a run.
pub(crate) async fn abort(tx: &mut Tx, run_id: &str, now: Timestamp) -> Result<bool> {
    let n = tx
        .exec(
            "UPDATE runs SET status = $3, updated_at = $1 WHERE run_id = $2",
            args![now.millis(), run_id, RunState::Aborted.as_str()],
        )
        .await?;
    Ok(n > 0)
}

/// Who a run belongs to, and whether it is a submitted plan's.
pub(crate) struct RunOwner {
    pub principal: String,
    pub planned: bool,
}

/// Whether `principal` may put calls in run `run_id`, owned by `owner` (`None`: nobody made it
/// yet, and it becomes theirs): their own, a plan's run with a step assigned to them, or — for
/// a `reviewer` (a role that reviews planned steps) — any plan's run.
pub(crate) async fn may_join(
    c: &mut impl Sql,
    run_id: &str,
    owner: Option<RunOwner>,
    principal: &str,
    reviewer: bool,
) -> Result<bool> {
    match owner {
        None => Ok(true),
        Some(o) if o.principal == principal => Ok(true),
        Some(o) if o.planned && reviewer => Ok(true),
        Some(_) => crate::ledger::steps::any_of(c, run_id, principal).await,
    }
}

/// The owner of run `run_id`, if there is such a run.
pub(crate) async fn owner(c: &mut impl Sql, run_id: &str) -> Result<Option<RunOwner>> {
    c.opt(
        "SELECT r.principal, p.run_id AS plan_run FROM runs r \
         LEFT JOIN plans p ON p.run_id = r.run_id WHERE r.run_id = $1",
        args![run_id],
    )
    .await?
    .map(|r| {
        Ok(RunOwner {
            principal: r.text("principal")?,
            planned: r.opt_text("plan_run")?.is_some(),
        })
    })
    .transpose()
}

/// A run as `run.status` reports it, without its steps.
pub(crate) struct RunSummary {
    pub principal: String,
    pub status: RunState,
    /// The goal, for a submitted plan.
    pub goal: Option<String>,
}

/// Run `run_id` with its plan's goal, if there is such a run.
pub(crate) async fn summary(c: &mut impl Sql, run_id: &str) -> Result<Option<RunSummary>> {
    c.opt(
        "SELECT r.principal, r.status, p.goal FROM runs r \
         LEFT JOIN plans p ON p.run_id = r.run_id WHERE r.run_id = $1",
        args![run_id],
    )
    .await?
    .map(|r| {
        Ok(RunSummary {
            principal: r.text("principal")?,
            status: RunState::read(&r.text("status")?)?,
            goal: r.opt_text("goal")?,
        })
    })
    .transpose()
}

/// `principal`'s current run at `now`: the one it last called in, unless that was before
/// `idle_since` (ms), in which case `fresh` becomes it.
pub(crate) async fn current(
    tx: &mut Tx,
    principal: &str,
    fresh: &str,
    now: Timestamp,
    idle_since: i64,
) -> Result<String> {
    tx.opt(
        "INSERT INTO principal_runs (principal, run_id, last_at) VALUES ($1, $2, $3) \
         ON CONFLICT (principal) DO UPDATE SET \
         run_id = CASE WHEN principal_runs.last_at < $4 THEN excluded.run_id \
         ELSE principal_runs.run_id END, last_at = excluded.last_at \
         RETURNING run_id",
        args![principal, fresh, now.millis(), idle_since],
    )
    .await?
    .ok_or_else(|| StoreError::Bug("the current-run upsert returned no row".into()))?
    .text("run_id")
}

#[cfg(test)]
mod tests {
    use serde_json::json;
    use toolgate_core::{Effect, StepStatus, Tier};

    use super::*;
    use crate::ledger::steps::{NewStep, insert};
    use crate::model::{Actor, StepKind};
    use crate::store::{Store, StoreConfig};

    /// The view of a run is its counts: as long as the run grows with calls alike, what is read
    /// to decide the next call stays the same size.
    #[tokio::test]
    async fn a_long_run_is_read_as_counts_not_as_its_steps() {
        let dir = tempfile::tempdir().unwrap();
        let url = format!("sqlite://{}", dir.path().join("t.db").display());
        let store = Store::connect(&url, StoreConfig::default()).await.unwrap();
        let now = Timestamp::from_millis(1_000);
        let mut tx = store.begin().await.unwrap();
        Store::ensure_run(&mut tx, "r", "p", None, now)
            .await
            .unwrap();
        let statuses = [
            (StepStatus::Done, 40),
            (StepStatus::Refused, 10),
            (StepStatus::Failed, 5),
            (StepStatus::NeedsApproval, 3),
        ];
        let mut seq = 0;
        for (status, n) in statuses {
            for _ in 0..n {
                seq += 1;
                let (id, key) = (format!("s{seq}"), format!("k{seq}"));
                insert(
                    &mut tx,
                    NewStep {
                        step_id: &id,
                        run_id: "r",
                        seq,
                        kind: StepKind::Direct,
                        principal: "p",
                        role: "worker",
                        tool: "pay",
                        effect: Effect::Irreversible,
                        tier: Tier::Spend,
                        purpose: None,
                        reason: None,
                        evidence: &[],
                        actor: &Actor::default(),
                        inputs: &json!({"n": seq}),
                        idem_key: &key,
                        status,
                        attempts: 1,
                        compensates: None,
                        lease_until: None,
                        decision: None,
                        now,
                    },
                )
                .await
                .unwrap();
            }
        }
        let stepless = |tool: &str, tier, status| Stepless {
            run_id: "r".into(),
            tool: tool.into(),
            tier,
            status,
        };
        let refusals = vec![stepless("pay", Tier::Spend, StepStatus::Refused); 7];
        tally(&mut tx, &refusals).await.unwrap();
        let reads = vec![stepless("look", Tier::Read, StepStatus::Done); 25];
        tally(&mut tx, &reads).await.unwrap();
        // However many, a run's stepless calls of one tool and outcome are one row.
        let rows = tx
            .opt(
                "SELECT COUNT(*) AS n FROM run_tally WHERE run_id = 'r'",
                args![],
            )
            .await
            .unwrap()
            .unwrap();
        assert_eq!(rows.i64("n").unwrap(), 2);

        let (run, has_steps) = history(&mut tx, "r", None).await.unwrap();
        assert!(has_steps);
        assert!(run.calls.is_empty(), "no call is listed one by one");
        // done, refused, needs_approval steps, the stepless refusals and reads: five kinds.
        assert_eq!(run.counted.len(), 5, "{:?}", run.counted);
        let c = run.counts("pay");
        assert_eq!(
            (c.steps, c.denials, c.spend_steps, c.tool_calls),
            (40 + 10 + 3 + 7 + 25, 10 + 7, 40, 40)
        );
        assert_eq!(run.counts("look").tool_calls, 25);
        // A planned step sees only the steps before it and every stepless refusal, not the
        // stepless reads (which have no place in the plan's order).
        let c = history(&mut tx, "r", Some(11))
            .await
            .unwrap()
            .0
            .counts("pay");
        assert_eq!((c.steps, c.denials, c.tool_calls), (10 + 7, 7, 10));
        assert_eq!(next_seq(&mut tx, "r").await.unwrap(), seq + 1);
        // A run with only stepless calls has no step to show that its row exists.
        tally(
            &mut tx,
            &[Stepless {
                run_id: "only-stepless".into(),
                ..stepless("pay", Tier::Spend, StepStatus::Refused)
            }],
        )
        .await
        .unwrap();
        let (run, has_steps) = history(&mut tx, "only-stepless", None).await.unwrap();
        assert_eq!(run.counts("pay").denials, 1);
        assert!(!has_steps);
    }
}
