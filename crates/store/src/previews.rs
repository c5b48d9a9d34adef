//! Plans made by preview calls (preview, then commit): kept so that the commit call,
//! which names only the plan id, runs exactly what was previewed.

use serde_json::Value;

use crate::error::{Result, StoreError};
use crate::ledger::previews;
use crate::store::Store;

/// One previewed plan.
#[derive(Debug, Clone, PartialEq)]
pub struct Preview {
    pub plan_id: String,
    pub principal: String,
    pub tool: String,
    pub tool_version: String,
    /// The hash of `inputs` approvals bind to (`InputHash::of`).
    pub input_hash: String,
    pub inputs: Value,
    /// The `_meta` of the preview call (purpose, reason, run id, evidence).
    pub meta: Value,
    /// Milliseconds since the Unix epoch.
    pub created_at: i64,
    pub expires_at: i64,
}

impl Store {
    /// Records a plan.
    pub async fn save_preview(&self, p: &Preview) -> Result<()> {
        let mut tx = self.inner.pool.begin().await?;
        previews::insert(&mut tx, p).await?;
        tx.commit().await
    }

    /// The plan with this id.
    pub async fn preview(&self, plan_id: &str) -> Result<Preview> {
        let mut c = self.inner.pool.conn().await?;
        previews::by_id(&mut c, plan_id)
            .await?
            .ok_or_else(|| StoreError::NotFound {
                what: "plan",
                id: plan_id.to_string(),
            })
    }
}
