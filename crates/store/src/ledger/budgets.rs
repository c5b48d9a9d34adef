//! Daily budgets per principal and tier (`budget_usage`), and which step holds a unit of which
//! counter (`budget_reservations`), so an outcome can charge or release exactly what its call
//! reserved.

use std::collections::HashMap;

use toolgate_core::Tier;

use crate::db::{Tx, args};
use crate::error::Result;
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
        used.insert(parse_tier(&r.text(0)?)?, r.i64(1)? as u32);
    }
    Ok(used)
}
