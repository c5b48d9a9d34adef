//! PostgreSQL connections for the store's statements, handed out without a round trip of
//! their own. sqlx pings every connection as it goes back to its pool (a `Sync` and the wait
//! for the server's answer), whatever the pool's options: a read that took two connections
//! paid two round trips for nothing, and the server a wake-up for each. So the connections the
//! store uses stay checked out of sqlx's pool and wait in [`PgConns`] between uses; sqlx's pool
//! still opens them (its limit counts them) and closes them when the store closes.
//!
//! What the release ping did is done here when it matters:
//! - a connection idle for longer than [`IDLE_BEFORE_PING`] is pinged when taken out (one that
//!   died sooner fails its statement, which the callers retry or report);
//! - a connection on which a statement failed other than with the server's answer (I/O, the
//!   protocol) is closed, never handed out again;
//! - a transaction given up without a commit (an error, a dropped future) is rolled back
//!   before its connection serves anyone else; a connection whose answer to a cancelled
//!   statement is still on the way is drained by sqlx itself before its next statement.
//!
//! Transactions are `BEGIN` and `COMMIT` sent as simple queries on such a connection, as
//! sqlx's own transaction sends them.
//!
//! At most the pool's size of these connections exist, waiting or in use (a semaphore of that
//! many permits, one held with each connection handed out): a connection given back here wakes
//! no one waiting in sqlx's pool, so a caller that finds none waiting and sqlx's pool full
//! (a `LISTEN` connection holds one of its places) also wakes when one is given back here.

use std::ops::{Deref, DerefMut};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use sqlx::pool::PoolConnection;
use sqlx::postgres::{PgConnection, PgPool};
use sqlx::{AssertSqlSafe, Postgres};
use tokio::sync::{Notify, OwnedSemaphorePermit, Semaphore};

use crate::error::Result;

/// How long a connection may wait unused before it is pinged when taken out.
pub(crate) const IDLE_BEFORE_PING: Duration = Duration::from_secs(1);

/// The store's PostgreSQL connections between uses.
#[derive(Clone, Debug)]
pub(crate) struct PgConns {
    pool: PgPool,
    idle: Arc<Mutex<Idle>>,
    /// One for each connection handed out.
    permits: Arc<Semaphore>,
    /// Signalled when a connection is given back.
    returned: Arc<Notify>,
}

#[derive(Debug, Default)]
struct Idle {
    /// Set when the store closes: a connection given back after that goes back to sqlx's
    /// pool, which closes it.
    closed: bool,
    conns: Vec<Waiting>,
}

#[derive(Debug)]
struct Waiting {
    conn: PoolConnection<Postgres>,
    since: Instant,
    /// A transaction was left open on it: rolled back before it is used again.
    open: bool,
}

impl Drop for Idle {
    fn drop(&mut self) {
        // Outside a runtime sqlx cannot return a connection to its pool (it spawns a task):
        // the connections are then closed where they are.
        if tokio::runtime::Handle::try_current().is_err() {
            for w in self.conns.drain(..) {
                drop(w.conn.detach());
            }
        }
    }
}

impl PgConns {
    /// At most `size` connections of `pool` (its size).
    pub(crate) fn new(pool: PgPool, size: u32) -> Self {
        PgConns {
            pool,
            idle: Arc::default(),
            permits: Arc::new(Semaphore::new(size.max(1) as usize)),
            returned: Arc::new(Notify::new()),
        }
    }

    /// A connection: the one used last, or a new one from sqlx's pool.
    pub(crate) async fn take(&self) -> Result<PgConn> {
        let permit = self
            .permits
            .clone()
            .acquire_owned()
            .await
            .expect("the semaphore is never closed");
        loop {
            let waiting = self.idle.lock().expect("idle connections").conns.pop();
            let Some(mut w) = waiting else {
                tokio::select! {
                    conn = self.pool.acquire() => return Ok(self.hand_out(conn?, permit)),
                    () = self.returned.notified() => continue,
                }
            };
            if w.open
                && sqlx::raw_sql(AssertSqlSafe("ROLLBACK"))
                    .execute(&mut *w.conn)
                    .await
                    .is_err()
            {
                w.conn.close_on_drop();
                continue;
            }
            if w.since.elapsed() > IDLE_BEFORE_PING
                && sqlx::Connection::ping(&mut *w.conn).await.is_err()
            {
                w.conn.close_on_drop();
                continue;
            }
            return Ok(self.hand_out(w.conn, permit));
        }
    }

    fn hand_out(&self, conn: PoolConnection<Postgres>, permit: OwnedSemaphorePermit) -> PgConn {
        PgConn {
            conn: Some(conn),
            home: self.clone(),
            open: false,
            broken: false,
            statements: 0,
            deferred: None,
            _permit: permit,
        }
    }

    /// Gives every waiting connection back to sqlx's pool, and every one given back from now
    /// on: the store is closing.
    pub(crate) fn close(&self) {
        let conns = {
            let mut idle = self.idle.lock().expect("idle connections");
            idle.closed = true;
            std::mem::take(&mut idle.conns)
        };
        drop(conns);
    }
}

/// A connection taken from [`PgConns`], given back when dropped.
pub(crate) struct PgConn {
    conn: Option<PoolConnection<Postgres>>,
    home: PgConns,
    /// A transaction is open on it.
    open: bool,
    /// A statement failed other than with the server's answer, or its user changed the
    /// session: closed, never reused.
    broken: bool,
    /// Statements sent on it so far: what it read stays current while this is unchanged
    /// (see [`crate::db::Tx::epoch`]).
    pub(crate) statements: u64,
    /// Direct steps opened in a reservation batch and not written yet: written before the
    /// next statement on this connection (`None`: each is written as it is opened).
    pub(crate) deferred: Option<crate::ledger::steps::DeferredOpens>,
    /// Its place among the connections handed out; given up after the connection is back.
    _permit: OwnedSemaphorePermit,
}

impl PgConn {
    /// Notes how a statement on this connection ended: an error that is not the server's
    /// answer (a lost connection, a protocol error) means it is not used again.
    pub(crate) fn note<T>(&mut self, r: sqlx::Result<T>) -> sqlx::Result<T> {
        if let Err(e) = &r
            && !matches!(e, sqlx::Error::Database(_) | sqlx::Error::RowNotFound)
        {
            self.broken = true;
        }
        r
    }

    /// Closes the connection when it is dropped instead of giving it back: for a user that
    /// changed its session's settings.
    pub(crate) fn close_when_dropped(&mut self) {
        self.broken = true;
    }

    /// Opens a transaction with `begin` (`BEGIN`, and settings local to it, in one round
    /// trip).
    pub(crate) async fn begin(mut self, begin: &'static str) -> Result<PgConn> {
        // Open from before it is sent: if the answer never comes (an error, a dropped future),
        // the rollback before the next use is harmless where nothing was begun.
        self.open = true;
        let r = sqlx::raw_sql(AssertSqlSafe(begin))
            .execute(&mut *self)
            .await;
        self.note(r)?;
        Ok(self)
    }

    /// Commits the open transaction.
    pub(crate) async fn commit(mut self) -> Result<()> {
        let r = sqlx::raw_sql(AssertSqlSafe("COMMIT"))
            .execute(&mut *self)
            .await;
        self.note(r)?;
        self.open = false;
        Ok(())
    }
}

impl Deref for PgConn {
    type Target = PgConnection;
    fn deref(&self) -> &PgConnection {
        self.conn.as_ref().expect("held until dropped")
    }
}

impl DerefMut for PgConn {
    fn deref_mut(&mut self) -> &mut PgConnection {
        self.conn.as_mut().expect("held until dropped")
    }
}

impl Drop for PgConn {
    fn drop(&mut self) {
        let Some(mut conn) = self.conn.take() else {
            return;
        };
        if self.broken {
            conn.close_on_drop();
            return;
        }
        self.home.give_back(conn, self.open);
    }
}

impl PgConns {
    fn give_back(&self, mut conn: PoolConnection<Postgres>, open: bool) {
        let mut idle = self.idle.lock().expect("idle connections");
        if idle.closed {
            if open {
                // Never back into sqlx's pool with a transaction open on it.
                conn.close_on_drop();
            }
            return;
        }
        idle.conns.push(Waiting {
            conn,
            since: Instant::now(),
            open,
        });
        drop(idle);
        self.returned.notify_one();
    }
}
