//! Submitted plans (one per run, with its goal and the hash a resubmission is compared by) and
//! the reviews model reviewers give their steps.

use toolgate_core::{StepId, Timestamp};

use crate::db::{Row, Sql, Tx, args};
use crate::error::Result;
use crate::plan::{Review, ReviewVerdict};

/// The hash of the plan submitted under `run_id`, if one was.
pub(crate) async fn hash_of(tx: &mut Tx, run_id: &str) -> Result<Option<String>> {
    tx.opt(
        "SELECT plan_hash FROM plans WHERE run_id = $1",
        args![run_id],
    )
    .await?
    .map(|r| r.text("plan_hash"))
    .transpose()
}

/// Records `planner`'s plan for `goal` under `run_id`.
pub(crate) async fn insert(
    tx: &mut Tx,
    run_id: &str,
    planner: &str,
    goal: &str,
    hash: &str,
    now: Timestamp,
) -> Result<()> {
    tx.exec(
        "INSERT INTO plans (run_id, planner, goal, plan_hash, submitted_at) \
         VALUES ($1, $2, $3, $4, $5)",
        args![run_id, planner, goal, hash, now.millis()],
    )
    .await?;
    Ok(())
}

fn review(r: &Row) -> Result<Review> {
    Ok(Review {
        step_id: StepId::new(r.text("step_id")?),
        reviewer: toolgate_core::PrincipalId::new(r.text("reviewer")?),
        verdict: ReviewVerdict::parse(&r.text("verdict")?)?,
        note: r.text("note")?,
        reviewed_at: Timestamp::from_millis(r.i64("reviewed_at")?),
    })
}

/// Every review of a step of run `run_id`, oldest first.
pub(crate) async fn reviews_of_run(c: &mut impl Sql, run_id: &str) -> Result<Vec<Review>> {
    c.rows(
        "SELECT v.step_id, v.reviewer, v.verdict, v.note, v.reviewed_at \
         FROM step_reviews v JOIN steps s ON s.step_id = v.step_id \
         WHERE s.run_id = $1 ORDER BY v.reviewed_at, v.reviewer",
        args![run_id],
    )
    .await?
    .iter()
    .map(review)
    .collect()
}

/// Every review of the step `step_id`, oldest first.
pub(crate) async fn reviews_of_step(c: &mut impl Sql, step_id: &str) -> Result<Vec<Review>> {
    c.rows(
        "SELECT step_id, reviewer, verdict, note, reviewed_at FROM step_reviews \
         WHERE step_id = $1 ORDER BY reviewed_at, reviewer",
        args![step_id],
    )
    .await?
    .iter()
    .map(review)
    .collect()
}

/// Records `reviewer`'s verdict on the step `step_id`; false when it gave one already.
pub(crate) async fn add_review(
    tx: &mut Tx,
    step_id: &str,
    reviewer: &str,
    verdict: ReviewVerdict,
    note: &str,
    now: Timestamp,
) -> Result<bool> {
    let inserted = tx
        .exec(
            "INSERT INTO step_reviews (step_id, reviewer, verdict, note, reviewed_at) \
             VALUES ($1, $2, $3, $4, $5) ON CONFLICT (step_id, reviewer) DO NOTHING",
            args![step_id, reviewer, verdict.as_str(), note, now.millis()],
        )
        .await?;
    Ok(inserted > 0)
}

/// The verdict `reviewer` gave the step `step_id`, if any.
pub(crate) async fn verdict_of(
    tx: &mut Tx,
    step_id: &str,
    reviewer: &str,
) -> Result<Option<ReviewVerdict>> {
    tx.opt(
        "SELECT verdict FROM step_reviews WHERE step_id = $1 AND reviewer = $2",
        args![step_id, reviewer],
    )
    .await?
    .map(|r| ReviewVerdict::parse(&r.text("verdict")?))
    .transpose()
}
