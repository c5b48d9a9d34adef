//! What a run did so far, as the engine's policies and rate limits count it. Read as counts
//! (one `GROUP BY` over the run's steps), not as the steps themselves, so a call in a long run
//! — a client that never names a run joins its principal's implicit one — costs about what a
//! call in a short one does.

use toolgate_core::{PriorCall, PriorCalls, PriorOutcome, RunHistory, StepStatus, Tier};

use crate::db::{Tx, args};
use crate::error::Result;
use crate::store::{parse_status, parse_tier};

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

/// The run `run_id` so far: its steps numbered below `before` (all of them for `None`),
/// compensations left out, and the refusals of direct calls, which hold no step row (a refused
/// direct call must not hold its idempotency key) and are counted in `run_refusals` as their
/// audit records are appended. One statement: both counts travel in one result. Also
/// whether any step row of the run was counted: then the run's row exists (a step references
/// it, and runs are never deleted).
pub(crate) async fn history(
    tx: &mut Tx,
    run_id: &str,
    before: Option<i64>,
) -> Result<(RunHistory, bool)> {
    let mut counted = Vec::new();
    let mut has_steps = false;
    for r in tx
        .rows(
            "SELECT 'step' AS src, tool, tier, status, COUNT(*) AS n FROM steps \
             WHERE run_id = $1 AND seq < $2 AND kind <> 'compensation' \
             AND status NOT IN ('pending', 'failed') GROUP BY tool, tier, status \
             UNION ALL \
             SELECT 'refusal' AS src, tool, tier, 'refused' AS status, COUNT(*) AS n FROM run_refusals \
             WHERE run_id = $1 GROUP BY tool, tier",
            args![run_id, before.unwrap_or(i64::MAX)],
        )
        .await?
    {
        has_steps |= r.text("src")? == "step";
        let Some(outcome) = prior_outcome(parse_status(&r.text("status")?)?) else {
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
    Ok((history, has_steps))
}

/// A refusal recorded in the audit chain that holds no step row.
pub(crate) struct Refusal {
    pub audit_seq: i64,
    pub run_id: String,
    pub tool: String,
    pub tier: Tier,
}

/// Counts `refusals` with their runs; written with their audit records.
pub(crate) async fn record_refusals(tx: &mut Tx, refusals: &[Refusal]) -> Result<()> {
    for r in refusals {
        tx.exec(
            "INSERT INTO run_refusals (audit_seq, run_id, tool, tier) VALUES ($1, $2, $3, $4)",
            args![r.audit_seq, &r.run_id, &r.tool, r.tier.as_str()],
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

#[cfg(test)]
mod tests {
    use serde_json::json;
    use toolgate_core::{Effect, StepStatus, Tier, Timestamp};

    use super::*;
    use crate::model::{Actor, StepKind};
    use crate::store::{NewStep, Store, StoreConfig, insert_step};

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
                insert_step(
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
        let refusals: Vec<Refusal> = (0..7)
            .map(|i| Refusal {
                audit_seq: i,
                run_id: "r".into(),
                tool: "pay".into(),
                tier: Tier::Spend,
            })
            .collect();
        record_refusals(&mut tx, &refusals).await.unwrap();

        let (run, has_steps) = history(&mut tx, "r", None).await.unwrap();
        assert!(has_steps);
        assert!(run.calls.is_empty(), "no call is listed one by one");
        // done, refused, needs_approval steps and the stepless refusals: four kinds.
        assert_eq!(run.counted.len(), 4, "{:?}", run.counted);
        let c = run.counts("pay");
        assert_eq!(
            (c.steps, c.denials, c.spend_steps, c.tool_calls),
            (40 + 10 + 3 + 7, 10 + 7, 40, 40)
        );
        // A planned step sees only the steps before it (and every stepless refusal).
        let c = history(&mut tx, "r", Some(11))
            .await
            .unwrap()
            .0
            .counts("pay");
        assert_eq!((c.steps, c.denials, c.tool_calls), (10 + 7, 7, 10));
        assert_eq!(next_seq(&mut tx, "r").await.unwrap(), seq + 1);
        // A run with only stepless refusals has no step to show that its row exists.
        record_refusals(
            &mut tx,
            &[Refusal {
                audit_seq: 1_000,
                run_id: "only-refused".into(),
                tool: "pay".into(),
                tier: Tier::Spend,
            }],
        )
        .await
        .unwrap();
        let (run, has_steps) = history(&mut tx, "only-refused", None).await.unwrap();
        assert_eq!(run.counts("pay").denials, 1);
        assert!(!has_steps);
    }
}
