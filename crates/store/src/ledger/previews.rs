//! Plans made by preview calls, kept until their commit.

use serde_json::Value;

use crate::db::{Sql, Tx, args};
use crate::error::Result;
use crate::previews::Preview;

/// Keeps the plan `p`.
pub(crate) async fn insert(tx: &mut Tx, p: &Preview) -> Result<()> {
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
    Ok(())
}

/// The plan `plan_id`, if there is one.
pub(crate) async fn by_id(c: &mut impl Sql, plan_id: &str) -> Result<Option<Preview>> {
    let Some(row) = c
        .opt(
            "SELECT plan_id, principal, tool, tool_version, input_hash, inputs, meta, \
             created_at, expires_at FROM previews WHERE plan_id = $1",
            args![plan_id],
        )
        .await?
    else {
        return Ok(None);
    };
    let json = |c: &str| -> Result<Value> {
        Ok(serde_json::from_str(&row.text(c)?).unwrap_or(Value::Null))
    };
    Ok(Some(Preview {
        plan_id: row.text("plan_id")?,
        principal: row.text("principal")?,
        tool: row.text("tool")?,
        tool_version: row.text("tool_version")?,
        input_hash: row.text("input_hash")?,
        inputs: json("inputs")?,
        meta: json("meta")?,
        created_at: row.i64("created_at")?,
        expires_at: row.i64("expires_at")?,
    }))
}
