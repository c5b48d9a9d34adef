//! SQLite's hot path. Statements run on the calling task, synchronously, on a connection of
//! our own (`rusqlite`), instead of each statement taking a trip to a driver thread and back:
//! a governed call makes about twenty statements, each a microsecond or two of work in SQLite
//! once its pages are cached, and with a thread hop per statement the hops were most of the
//! call's cost.
//!
//! What could block the runtime for long is kept off it: writers in this process queue on an
//! async lock before `BEGIN IMMEDIATE`; a writer in another process (the CLI, a second
//! gateway on the same file) is waited for with async sleeps, never with SQLite's busy
//! handler; and a commit that must be fsync'd runs on the blocking pool. What remains inline
//! is SQLite work on cached pages and the WAL `write` of a commit that is not fsync'd.
//!
//! Migrations and raw administration still go through sqlx's pool on the same file.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rusqlite::types::Value;
use rusqlite::{Connection, ErrorCode, OpenFlags};
use tokio::sync::OwnedMutexGuard;

use crate::db::Arg;
use crate::error::{Result, StoreError};

/// How long a writer waits for another process's write transaction before giving up.
const WRITE_WAIT: Duration = Duration::from_secs(30);
/// How long a reader lets SQLite's busy handler wait (WAL readers rarely wait at all).
const READ_WAIT: Duration = Duration::from_secs(5);
/// Distinct statements the store runs; each connection keeps all of them prepared.
const STATEMENT_CACHE: usize = 256;

/// Connections to one SQLite file.
#[derive(Clone)]
pub(crate) struct Lite {
    inner: Arc<Inner>,
}

struct Inner {
    path: PathBuf,
    idle: Mutex<Vec<Lc>>,
    /// One writer at a time in this process, queued without blocking a thread.
    writer: Arc<tokio::sync::Mutex<()>>,
}

impl std::fmt::Debug for Lite {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Lite")
            .field("path", &self.inner.path)
            .finish()
    }
}

/// A connection and the `synchronous` level it was last set to.
struct Lc {
    c: Connection,
    full_sync: Option<bool>,
}

impl Lite {
    /// Connections to the database at `path`, which must exist (sqlx created and migrated it).
    pub fn open(path: &Path) -> Result<Lite> {
        let lite = Lite {
            inner: Arc::new(Inner {
                path: path.to_path_buf(),
                idle: Mutex::new(Vec::new()),
                writer: Arc::new(tokio::sync::Mutex::new(())),
            }),
        };
        // Fail at start, not on the first call, if the file cannot be opened.
        let first = lite.connect()?;
        lite.inner.idle.lock().expect("idle lock").push(first);
        Ok(lite)
    }

    fn connect(&self) -> Result<Lc> {
        let c = Connection::open_with_flags(
            &self.inner.path,
            OpenFlags::SQLITE_OPEN_READ_WRITE | OpenFlags::SQLITE_OPEN_NO_MUTEX,
        )?;
        c.set_prepared_statement_cache_capacity(STATEMENT_CACHE);
        c.busy_timeout(READ_WAIT)?;
        c.execute_batch(
            "PRAGMA foreign_keys = ON; PRAGMA wal_autocheckpoint = 8192; PRAGMA journal_mode = WAL",
        )?;
        Ok(Lc { c, full_sync: None })
    }

    /// A connection for reads outside a write transaction.
    pub fn conn(&self) -> Result<LiteConn> {
        let popped = self.inner.idle.lock().expect("idle lock").pop();
        let lc = match popped {
            Some(lc) => lc,
            None => self.connect()?,
        };
        Ok(LiteConn {
            lc: Some(lc),
            home: self.inner.clone(),
        })
    }

    /// A write transaction (`BEGIN IMMEDIATE`). `durable`: its commit is fsync'd
    /// (`synchronous = FULL`) before [`LiteTx::commit`] returns; otherwise it survives the
    /// process being killed but not a power loss until the next durable commit.
    pub async fn begin(&self, durable: bool) -> Result<LiteTx> {
        let guard = self.inner.writer.clone().lock_owned().await;
        let mut conn = self.conn()?;
        let lc = conn.lc.as_mut().expect("open connection");
        if lc.full_sync != Some(durable) {
            let level = if durable { "FULL" } else { "NORMAL" };
            lc.c.execute_batch(&format!("PRAGMA synchronous = {level}"))?;
            lc.full_sync = Some(durable);
        }
        // Another process may hold the write lock: wait for it here, asynchronously.
        lc.c.busy_timeout(Duration::ZERO)?;
        let deadline = Instant::now() + WRITE_WAIT;
        let mut pause = Duration::from_millis(1);
        let begun = loop {
            let lc = conn.lc.as_mut().expect("open connection");
            match lc.c.execute_batch("BEGIN IMMEDIATE") {
                Err(e) if is_busy(&e) && Instant::now() < deadline => {
                    tokio::time::sleep(pause).await;
                    pause = (pause * 2).min(Duration::from_millis(50));
                }
                r => break r,
            }
        };
        let lc = conn.lc.as_mut().expect("open connection");
        lc.c.busy_timeout(READ_WAIT)?;
        begun?;
        Ok(LiteTx {
            conn,
            durable,
            open: true,
            _writer: guard,
        })
    }

    /// Drops the idle connections (the file stays).
    pub fn close(&self) {
        self.inner.idle.lock().expect("idle lock").clear();
    }
}

fn is_busy(e: &rusqlite::Error) -> bool {
    matches!(
        e.sqlite_error_code(),
        Some(ErrorCode::DatabaseBusy | ErrorCode::DatabaseLocked)
    )
}

/// A connection on loan; it goes back to the idle list when dropped.
pub(crate) struct LiteConn {
    lc: Option<Lc>,
    home: Arc<Inner>,
}

impl Drop for LiteConn {
    fn drop(&mut self) {
        if let Some(lc) = self.lc.take() {
            self.home.idle.lock().expect("idle lock").push(lc);
        }
    }
}

impl LiteConn {
    fn c(&self) -> &Connection {
        &self.lc.as_ref().expect("open connection").c
    }

    /// Runs one statement; `$n` placeholders take `args[n - 1]`. Returns the rows it
    /// produced and the rows it changed.
    fn run(&self, sql: &str, args: &[Arg]) -> Result<(Vec<Vec<Value>>, u64)> {
        let c = self.c();
        let mut st = c.prepare_cached(sql)?;
        for i in 1..=st.parameter_count() {
            let n = match st.parameter_name(i) {
                Some(name) => name
                    .strip_prefix(['$', '?'])
                    .and_then(|d| d.parse::<usize>().ok())
                    .ok_or_else(|| {
                        StoreError::Corrupt(format!("placeholder {name} in `{sql}` is not $n"))
                    })?,
                None => i,
            };
            let arg = args.get(n.wrapping_sub(1)).ok_or_else(|| {
                StoreError::Corrupt(format!("`{sql}` wants ${n}; {} bound", args.len()))
            })?;
            match arg {
                Arg::I(v) => st.raw_bind_parameter(i, v)?,
                Arg::T(v) => st.raw_bind_parameter(i, v)?,
                Arg::OptT(v) => st.raw_bind_parameter(i, v)?,
                Arg::OptI(v) => st.raw_bind_parameter(i, v)?,
            }
        }
        let width = st.column_count();
        let mut out = Vec::new();
        let mut rows = st.raw_query();
        while let Some(r) = rows.next()? {
            let mut row = Vec::with_capacity(width);
            for i in 0..width {
                row.push(r.get::<_, Value>(i)?);
            }
            out.push(row);
        }
        drop(rows);
        Ok((out, c.changes()))
    }

    pub fn exec(&mut self, sql: &str, args: &[Arg]) -> Result<u64> {
        Ok(self.run(sql, args)?.1)
    }

    pub fn rows(&mut self, sql: &str, args: &[Arg]) -> Result<Vec<Vec<Value>>> {
        Ok(self.run(sql, args)?.0)
    }
}

/// A write transaction; rolled back if dropped before [`LiteTx::commit`].
pub(crate) struct LiteTx {
    conn: LiteConn,
    durable: bool,
    open: bool,
    _writer: OwnedMutexGuard<()>,
}

impl LiteTx {
    pub fn conn(&mut self) -> &mut LiteConn {
        &mut self.conn
    }

    pub async fn commit(mut self) -> Result<()> {
        self.open = false;
        if !self.durable {
            return self.finish("COMMIT");
        }
        // The fsync runs on the blocking pool; the connection comes back with the answer.
        let lc = self.conn.lc.take().expect("open connection");
        let (lc, r) = tokio::task::spawn_blocking(move || {
            let r = lc.c.execute_batch("COMMIT");
            (lc, r)
        })
        .await
        .map_err(|e| StoreError::Corrupt(format!("the commit task failed: {e}")))?;
        self.conn.lc = Some(lc);
        if let Err(e) = r {
            self.rollback_or_discard();
            return Err(e.into());
        }
        Ok(())
    }

    fn finish(&mut self, sql: &str) -> Result<()> {
        let r = self.conn.c().execute_batch(sql);
        if let Err(e) = r {
            self.rollback_or_discard();
            return Err(e.into());
        }
        Ok(())
    }

    /// After a failed commit: roll back; a connection that cannot is not reused.
    fn rollback_or_discard(&mut self) {
        let c = self.conn.c();
        if !c.is_autocommit() && c.execute_batch("ROLLBACK").is_err() {
            self.conn.lc = None;
        }
    }
}

impl Drop for LiteTx {
    fn drop(&mut self) {
        if self.open && self.conn.lc.is_some() {
            self.open = false;
            self.rollback_or_discard();
        }
    }
}
