//! Approvers' sessions on the web page (the console), kept in the database so they survive a
//! restart and hold across gateway replicas sharing one PostgreSQL. The console hashes the
//! session id before it gets here; the store never sees a cookie's value.

use crate::error::Result;
use crate::ledger::sessions;
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
        sessions::forget_expired(&mut tx, now_ms).await?;
        sessions::insert(&mut tx, id_hash, s, now_ms).await?;
        tx.commit().await
    }

    /// The live session stored under `id_hash`, if any.
    pub async fn console_session(
        &self,
        id_hash: &str,
        now_ms: i64,
    ) -> Result<Option<ConsoleSession>> {
        let mut c = self.inner.pool.conn().await?;
        sessions::live(&mut c, id_hash, now_ms).await
    }

    /// Ends a session.
    pub async fn delete_console_session(&self, id_hash: &str) -> Result<()> {
        let mut tx = self.inner.pool.begin().await?;
        sessions::delete(&mut tx, id_hash).await?;
        tx.commit().await
    }
}
