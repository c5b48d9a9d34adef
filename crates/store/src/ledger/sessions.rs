//! Approvers' console sessions, stored under the hash of their id.

use crate::db::{Sql, Tx, args};
use crate::error::Result;
use crate::sessions::ConsoleSession;

/// Forgets every session expired at `now_ms`.
pub(crate) async fn forget_expired(tx: &mut Tx, now_ms: i64) -> Result<()> {
    tx.exec(
        "DELETE FROM console_sessions WHERE expires_at <= $1",
        args![now_ms],
    )
    .await?;
    Ok(())
}

/// Stores `s` under `id_hash`.
pub(crate) async fn insert(
    tx: &mut Tx,
    id_hash: &str,
    s: &ConsoleSession,
    now_ms: i64,
) -> Result<()> {
    tx.exec(
        "INSERT INTO console_sessions (id_hash, principal, csrf, created_at, expires_at) \
         VALUES ($1, $2, $3, $4, $5)",
        args![id_hash, &s.principal, &s.csrf, now_ms, s.expires_at],
    )
    .await?;
    Ok(())
}

/// The session stored under `id_hash`, if it is live at `now_ms`.
pub(crate) async fn live(
    c: &mut impl Sql,
    id_hash: &str,
    now_ms: i64,
) -> Result<Option<ConsoleSession>> {
    let row = c
        .opt(
            "SELECT principal, csrf, expires_at FROM console_sessions \
             WHERE id_hash = $1 AND expires_at > $2",
            args![id_hash, now_ms],
        )
        .await?;
    row.map(|r| {
        Ok(ConsoleSession {
            principal: r.text("principal")?,
            csrf: r.text("csrf")?,
            expires_at: r.i64("expires_at")?,
        })
    })
    .transpose()
}

/// Forgets the session stored under `id_hash`.
pub(crate) async fn delete(tx: &mut Tx, id_hash: &str) -> Result<()> {
    tx.exec(
        "DELETE FROM console_sessions WHERE id_hash = $1",
        args![id_hash],
    )
    .await?;
    Ok(())
}
