//! Approvers' sessions on the web page (the console), kept in the database so they survive a
//! restart and hold across gateway replicas sharing one PostgreSQL. The console hashes the
//! session id before it gets here; the store never sees a cookie's value.

use crate::db::args;
use crate::error::Result;
use crate::store::Store;

/// One stored session.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConsoleSession {
    pub principal: String,
    pub csrf: String,
    /// Milliseconds since the Unix epoch.
    pub expires_at: i64,
}

impl Store {
    /// Stores a new session under the hash of its id, and forgets every expired one.
    pub async fn save_console_session(
        &self,
        id_hash: &str,
        s: &ConsoleSession,
        now_ms: i64,
    ) -> Result<()> {
        let mut tx = self.inner.pool.begin().await?;
        tx.exec(
            "DELETE FROM console_sessions WHERE expires_at <= $1",
            args![now_ms],
        )
        .await?;
        tx.exec(
            "INSERT INTO console_sessions (id_hash, principal, csrf, created_at, expires_at) \
             VALUES ($1, $2, $3, $4, $5)",
            args![id_hash, &s.principal, &s.csrf, now_ms, s.expires_at],
        )
        .await?;
        tx.commit().await
    }

    /// The live session stored under `id_hash`, if any.
    pub async fn console_session(
        &self,
        id_hash: &str,
        now_ms: i64,
    ) -> Result<Option<ConsoleSession>> {
        let mut c = self.inner.pool.conn().await?;
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

    /// Ends a session.
    pub async fn delete_console_session(&self, id_hash: &str) -> Result<()> {
        let mut tx = self.inner.pool.begin().await?;
        tx.exec(
            "DELETE FROM console_sessions WHERE id_hash = $1",
            args![id_hash],
        )
        .await?;
        tx.commit().await
    }
}
