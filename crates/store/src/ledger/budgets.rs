//! Daily budgets per principal and tier (`budget_usage`), and which step holds a unit of which
//! counter (`budget_reservations`), so an outcome can charge or release exactly what its call
//! reserved.

use std::collections::{HashMap, HashSet};

use serde_json::{Value, json};
use toolgate_core::Tier;

use crate::db::{Sql, Tx, args};
use crate::error::Result;
use crate::model::BudgetUse;
use crate::store::parse_tier;

/// What `principal` used of each tier's budget on `day`.
pub(crate) async fn used_today(
    tx: &mut Tx,
    principal: &str,
    day: i64,
) -> Result<HashMap<Tier, u32>> {
    let mut used = HashMap::new();
    for r in tx
        .rows(
            "SELECT tier, used FROM budget_usage WHERE principal = $1 AND day = $2",
            args![principal, day],
        )
        .await?
    {
        used.insert(parse_tier(&r.text("tier")?)?, r.i64("used")? as u32);
    }
    Ok(used)
}

/// What one claim transaction has read already: each principal's budget use, kept current by
/// the batch's own reservations. On SQLite the transaction holds the only
/// write lock, so this is exact; on PostgreSQL the conditional updates stay authoritative.
#[derive(Default)]
pub(crate) struct BatchCache {
    pub(crate) budgets: HashMap<String, HashMap<Tier, u32>>,
    ensured: HashSet<(String, Tier, i64)>,
    /// SQLite: budget increments and reservations to write when the batch commits.
    deltas: HashMap<(String, Tier, i64), u32>,
    reservations: Vec<(String, String, Tier, i64)>,
    /// A reservation batch's read of its calls' runs and keys, while it is current.
    pub(crate) read: Option<crate::exec::BatchRead>,
}

impl BatchCache {
    /// Writes the batched budget increments and reservations (SQLite), before commit.
    pub(crate) async fn flush(&mut self, tx: &mut Tx) -> Result<()> {
        let mut deltas: Vec<_> = self.deltas.drain().collect();
        deltas.sort();
        for ((id, tier, day), n) in deltas {
            tx.exec(
                "INSERT INTO budget_usage (principal, tier, day, used) VALUES ($1, $2, $3, 0) \
                 ON CONFLICT (principal, tier, day) DO NOTHING",
                args![&id, tier.as_str(), day],
            )
            .await?;
            tx.exec(
                "UPDATE budget_usage SET used = used + $4 WHERE principal = $1 AND tier = $2 AND day = $3",
                args![&id, tier.as_str(), day, n as i64],
            )
            .await?;
        }
        if !self.reservations.is_empty() {
            let rows: Vec<Value> = self
                .reservations
                .drain(..)
                .map(|(step, id, tier, day)| json!({"s": step, "p": id, "t": tier.as_str(), "d": day}))
                .collect();
            tx.exec(
                "INSERT INTO budget_reservations (step_id, principal, tier, day) \
                 SELECT j.value ->> 's', j.value ->> 'p', j.value ->> 't', j.value ->> 'd' \
                 FROM json_each($1) AS j",
                args![Value::Array(rows).to_string()],
            )
            .await?;
        }
        Ok(())
    }
}

/// PostgreSQL: locks the daily budget counters a reservation batch may charge, sorted, before
/// the batch writes anything. A batch charges a counter call by call, after the call's key is
/// inserted; two gateways' batches holding calls of one principal (a client that sent the same
/// calls to both) would otherwise each hold a key the other needs while one waits for the
/// counter the other holds — a deadlock PostgreSQL breaks only after a second. Taken first, a
/// counter makes the second batch wait holding nothing. (Not needed on SQLite: the batch holds
/// the only write lock already.)
pub(crate) async fn lock_counters(
    tx: &mut Tx,
    cache: &mut BatchCache,
    counters: &[(String, Tier, i64)],
) -> Result<()> {
    for (id, tier, day) in counters {
        if cache.ensured.insert((id.clone(), *tier, *day)) {
            tx.exec(
                "INSERT INTO budget_usage (principal, tier, day, used) VALUES ($1, $2, $3, 0) \
                 ON CONFLICT (principal, tier, day) DO NOTHING",
                args![id, tier.as_str(), *day],
            )
            .await?;
        }
        tx.rows(
            "SELECT used FROM budget_usage WHERE principal = $1 AND tier = $2 AND day = $3 \
             FOR UPDATE",
            args![id, tier.as_str(), *day],
        )
        .await?;
    }
    Ok(())
}

/// Takes one unit of `tier`'s budget of each counter in `limited` (sorted, so every worker
/// takes them in one order and none deadlock) for `step_id`. Returns the first counter that
/// Returns whether they were all taken: when one is used up, nothing is.
pub(crate) async fn charge(
    tx: &mut Tx,
    cache: &mut BatchCache,
    step_id: &str,
    limited: &[(&str, u32)],
    tier: Tier,
    day: i64,
) -> Result<bool> {
    if tx.is_pg() {
        charge_pg(tx, cache, step_id, limited, tier, day).await
    } else {
        Ok(charge_sqlite(cache, step_id, limited, tier, day))
    }
}

/// After a lost [`charge`], makes the next read of `chain`'s use today come from the table: on
/// PostgreSQL other transactions charged those counters since this one read them. On SQLite
/// this transaction is the only writer and the cache holds the batch's own charges, not yet
/// written, so the cache is what is exact.
pub(crate) fn read_again(tx: &Tx, cache: &mut BatchCache, chain: &[String]) {
    if tx.is_pg() {
        for id in chain {
            cache.budgets.remove(id);
        }
    }
}

/// SQLite: this transaction holds the only write lock and the cache was read inside it, so
/// the check is exact; the increments are written once per counter when the batch commits
/// ([`BatchCache::flush`]).
fn charge_sqlite(
    cache: &mut BatchCache,
    step_id: &str,
    limited: &[(&str, u32)],
    tier: Tier,
    day: i64,
) -> bool {
    for (id, limit) in limited {
        let used = cache
            .budgets
            .get(*id)
            .and_then(|m| m.get(&tier))
            .copied()
            .unwrap_or(0);
        if used >= *limit {
            return false;
        }
    }
    for (id, _) in limited {
        *cache
            .budgets
            .entry(id.to_string())
            .or_default()
            .entry(tier)
            .or_default() += 1;
        *cache.deltas.entry((id.to_string(), tier, day)).or_default() += 1;
        cache
            .reservations
            .push((step_id.to_string(), id.to_string(), tier, day));
    }
    true
}

/// PostgreSQL: other transactions charge the same counters concurrently, so each unit is a
/// conditional increment; a counter used up gives back the units this call took already.
async fn charge_pg(
    tx: &mut Tx,
    cache: &mut BatchCache,
    step_id: &str,
    limited: &[(&str, u32)],
    tier: Tier,
    day: i64,
) -> Result<bool> {
    let mut taken: Vec<&str> = Vec::new();
    for (id, limit) in limited {
        if cache.ensured.insert((id.to_string(), tier, day)) {
            tx.exec(
                "INSERT INTO budget_usage (principal, tier, day, used) VALUES ($1, $2, $3, 0) \
                 ON CONFLICT (principal, tier, day) DO NOTHING",
                args![*id, tier.as_str(), day],
            )
            .await?;
        }
        let ok = tx
            .exec(
                "UPDATE budget_usage SET used = used + 1 \
                 WHERE principal = $1 AND tier = $2 AND day = $3 AND used < $4",
                args![*id, tier.as_str(), day, *limit as i64],
            )
            .await?;
        if ok == 0 {
            for t in &taken {
                tx.exec(
                    "UPDATE budget_usage SET used = used - 1 \
                     WHERE principal = $1 AND tier = $2 AND day = $3",
                    args![*t, tier.as_str(), day],
                )
                .await?;
            }
            return Ok(false);
        }
        taken.push(id);
    }
    for id in &taken {
        *cache
            .budgets
            .entry(id.to_string())
            .or_default()
            .entry(tier)
            .or_default() += 1;
        tx.exec(
            "INSERT INTO budget_reservations (step_id, principal, tier, day) \
             VALUES ($1, $2, $3, $4)",
            args![step_id, *id, tier.as_str(), day],
        )
        .await?;
    }
    Ok(true)
}

/// A call that spent what it reserved: its units stay used; the rows that said which step
/// held them go.
pub(crate) async fn keep_charged(tx: &mut Tx, step_id: &str) -> Result<()> {
    tx.exec(
        "DELETE FROM budget_reservations WHERE step_id = $1",
        args![step_id],
    )
    .await?;
    Ok(())
}

/// As [`keep_charged`] for many steps in one statement, the step ids as one JSON array.
pub(crate) async fn keep_charged_all(tx: &mut Tx, step_ids: &[&str]) -> Result<()> {
    if step_ids.is_empty() {
        return Ok(());
    }
    tx.exec(
        if tx.is_pg() {
            "DELETE FROM budget_reservations \
             WHERE step_id IN (SELECT jsonb_array_elements_text($1::jsonb))"
        } else {
            "DELETE FROM budget_reservations WHERE step_id IN (SELECT value FROM json_each($1))"
        },
        args![serde_json::to_string(step_ids).expect("strings serialise")],
    )
    .await?;
    Ok(())
}

/// Gives back every unit of daily budget the step `step_id` reserved (its failure means
/// nothing was spent).
pub(crate) async fn release(tx: &mut Tx, step_id: &str) -> Result<()> {
    let rows = tx
        .rows(
            "SELECT principal, tier, day FROM budget_reservations WHERE step_id = $1 ORDER BY principal",
            args![step_id],
        )
        .await?;
    for r in &rows {
        tx.exec(
            "UPDATE budget_usage SET used = used - 1 WHERE principal = $1 AND tier = $2 AND day = $3 AND used > 0",
            args![r.text("principal")?, r.text("tier")?, r.i64("day")?],
        )
        .await?;
    }
    keep_charged(tx, step_id).await
}

/// Every principal's use of each tier's budget on `day`, by principal and tier.
pub(crate) async fn usage_on(c: &mut impl Sql, day: i64) -> Result<Vec<BudgetUse>> {
    c.rows(
        "SELECT principal, tier, day, used FROM budget_usage WHERE day = $1 \
         ORDER BY principal, tier",
        args![day],
    )
    .await?
    .iter()
    .map(|r| {
        Ok(BudgetUse {
            principal: toolgate_core::PrincipalId::new(r.text("principal")?),
            tier: parse_tier(&r.text("tier")?)?,
            day: r.i64("day")?,
            used: r.i64("used")?,
        })
    })
    .collect()
}
