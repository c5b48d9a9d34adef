//! Plans made by preview calls (preview, then commit): kept so that the commit call,
//! which names only the plan id, runs exactly what was previewed.

use serde_json::Value;

use crate::db::args;
use crate::error::{Result, StoreError};
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
        tx.exec(
            "INSERT INTO previews (plan_id, principal, tool, tool_version, input_hash, inputs, \
             meta, created_at, expires_at) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9)",
            args![
                &p.plan_id,
                &p.principal,
                &p.tool,
                &p.tool_version,
                &p.input_hash,
                &p.inputs.to_string(),
                &p.meta.to_string(),
                p.created_at,
                p.expires_at
            ],
        )
        .await?;
        tx.commit().await
    }

    /// The plan with this id.
    pub async fn preview(&self, plan_id: &str) -> Result<Preview> {
        let mut c = self.inner.pool.conn().await?;
        let row = c
            .opt(
                "SELECT plan_id, principal, tool, tool_version, input_hash, inputs, meta, \
                 created_at, expires_at FROM previews WHERE plan_id = $1",
                args![plan_id],
            )
            .await?
            .ok_or_else(|| StoreError::NotFound {
                what: "plan",
                id: plan_id.to_string(),
            })?;
        let json = |c: &str| -> Result<Value> {
            Ok(serde_json::from_str(&row.text(c)?).unwrap_or(Value::Null))
        };
        Ok(Preview {
            plan_id: row.text("plan_id")?,
            principal: row.text("principal")?,
            tool: row.text("tool")?,
            tool_version: row.text("tool_version")?,
            input_hash: row.text("input_hash")?,
            inputs: json("inputs")?,
            meta: json("meta")?,
            created_at: row.i64("created_at")?,
            expires_at: row.i64("expires_at")?,
        })
    }
}
