//! SQLite's hot path. Statements run on the calling task, synchronously, on a connection of
//! our own (`rusqlite`), instead of each statement taking a trip to a driver thread and back:
//! a governed call makes about twenty statements, each a microsecond or two of work in SQLite
//! once its pages are cached, and with a thread hop per statement the hops would be most of
//! the call's cost.
//!
//! What could block the runtime for long is kept off it: writers in this process queue on an
//! async lock before `BEGIN IMMEDIATE`; a writer in another process (the CLI, a second
//! gateway on the same file) is waited for with async sleeps, never with SQLite's busy
//! handler; and a commit that must be fsync'd runs on the blocking pool. What remains inline
//! is SQLite work on cached pages and the WAL `write` of a commit that is not fsync'd.
//!
//! Checkpoints run on a thread of their own ([`checkpointer`]), not inside whichever commit
//! crosses SQLite's auto-checkpoint threshold: that commit would copy thousands of WAL frames
//! into the database file and fsync it while holding the write lock, on a runtime thread, and
//! every call queued behind it would wait; under concurrent load the tail latency is what it
//! saves (docs/design-notes.md).
//!
//! Migrations and raw administration still go through sqlx's pool on the same file.

use std::cell::RefCell;
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc::SyncSender;
use std::sync::{Arc, LazyLock, Mutex};
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
/// How often the background checkpointer looks for new commits. A governed call writes 8–25
/// WAL frames (4 KiB pages); at 500 calls/s that is about 2,000 frames a turn, at 2,500 about
/// 10,000. (A checkpoint every 100 ms measured the same under load and slowed single calls:
/// its fsyncs queue with theirs.)
const CHECKPOINT_EVERY: Duration = Duration::from_millis(250);
/// The WAL length (frames, 16 MiB) at which the checkpointer makes the next writer start it
/// over, so the WAL file stays within a few turns' frames (its preallocated 40 MiB by default).
const RESTART_FRAMES: i64 = 4_096;
/// SQLite's own auto-checkpoint, in frames, on every connection to the file (these and sqlx's):
/// only a backstop, for when the background checkpointer falls far behind (64 MiB of WAL).
pub(crate) const BACKSTOP_FRAMES: u32 = 16_384;

/// Runs a statement that returns no rows from the connection's cache of prepared statements
/// (`execute_batch` parses its text every time: a transaction's `BEGIN` and `COMMIT` are run
/// once per group commit).
fn run_cached(c: &Connection, sql: &str) -> rusqlite::Result<()> {
    c.prepare_cached(sql)?.execute([]).map(|_| ())
}

/// Connections to one SQLite file.
#[derive(Clone)]
pub(crate) struct Lite {
    inner: Arc<Inner>,
}

struct Inner {
    path: PathBuf,
    idle: Mutex<Vec<Lc>>,
    /// Set by [`Lite::close`]: no new connection is lent, and one coming back is closed.
    closed: AtomicBool,
    /// One writer at a time in this process, queued without blocking a thread.
    writer: Arc<tokio::sync::Mutex<()>>,
    /// Commits through this handle: the checkpointer skips its turn when none was made.
    commits: Arc<AtomicU64>,
    /// Dropped on close, which ends the checkpoint thread.
    checkpoint: Mutex<Option<SyncSender<()>>>,
    /// `false` with `durability: process`: no commit is fsync'd, durable or not.
    fsync: bool,
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
    /// The column names of each statement that returned rows, by its SQL: read once per
    /// connection, shared by every row it returns.
    names: RefCell<HashMap<String, Arc<[String]>>>,
}

impl Lite {
    /// Connections to the database at `path`, which must exist (sqlx created and migrated it).
    /// `fsync`: whether a durable commit is flushed to the disk before it returns.
    pub fn open(path: &Path, fsync: bool) -> Result<Lite> {
        let lite = Lite {
            inner: Arc::new(Inner {
                path: path.to_path_buf(),
                idle: Mutex::new(Vec::new()),
                closed: AtomicBool::new(false),
                writer: Arc::new(tokio::sync::Mutex::new(())),
                commits: Arc::new(AtomicU64::new(0)),
                checkpoint: Mutex::new(None),
                fsync,
            }),
        };
        // Fail at start, not on the first call, if the file cannot be opened.
        let first = lite.connect()?;
        lite.inner.idle.lock().expect("idle lock").push(first);
        let stop = checkpointer(
            lite.connect()?.c,
            lite.inner.commits.clone(),
            lite.inner.writer.clone(),
        )?;
        *lite.inner.checkpoint.lock().expect("checkpoint lock") = Some(stop);
        Ok(lite)
    }

    /// Whether durable commits are fsync'd (`durability: fsync`).
    pub fn fsyncs(&self) -> bool {
        self.inner.fsync
    }

    fn connect(&self) -> Result<Lc> {
        let c = Connection::open_with_flags(
            &self.inner.path,
            OpenFlags::SQLITE_OPEN_READ_WRITE | OpenFlags::SQLITE_OPEN_NO_MUTEX,
        )?;
        c.set_prepared_statement_cache_capacity(STATEMENT_CACHE);
        c.busy_timeout(READ_WAIT)?;
        c.execute_batch(&format!(
            "PRAGMA foreign_keys = ON; PRAGMA wal_autocheckpoint = {BACKSTOP_FRAMES}; \
             PRAGMA journal_mode = WAL"
        ))?;
        Ok(Lc {
            c,
            full_sync: None,
            names: RefCell::default(),
        })
    }

    /// A connection for reads outside a write transaction.
    pub fn conn(&self) -> Result<LiteConn> {
        if self.inner.closed.load(Ordering::Acquire) {
            return Err(StoreError::Closed);
        }
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
    /// process being killed but not a power loss until the next durable commit. With
    /// `durability: process` no commit is durable in this sense.
    pub async fn begin(&self, durable: bool) -> Result<LiteTx> {
        let durable = durable && self.inner.fsync;
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
            match run_cached(&lc.c, "BEGIN IMMEDIATE") {
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

    /// Grows the WAL file to `bytes` with zeros, a chunk at a time, each written under the
    /// write lock (so no commit is appending meanwhile), then fsyncs it once. Returns the size
    /// reached.
    ///
    /// Why: a commit that makes the WAL file longer must also journal the new size, and on
    /// ext4 that fdatasync cost 0.2–4 ms here, against 80–100 µs for one that overwrites blocks
    /// already written. SQLite reuses its WAL from the start after each checkpoint, so once the
    /// file is as long as the WAL gets between checkpoints, commits never grow it again; this gets
    /// there at start instead of over the first tens of thousands of commits. Safe: frames past
    /// the last valid commit are never read (recovery stops at the first frame whose salt or
    /// checksum does not match, and all-zero bytes match nothing), and a zeroed header reads as
    /// an empty WAL.
    pub async fn preallocate_wal(&self, bytes: u64) -> Result<u64> {
        const CHUNK: u64 = 1 << 20;
        let mut wal = self.inner.path.clone().into_os_string();
        wal.push("-wal");
        let wal = PathBuf::from(wal);
        let file = match std::fs::OpenOptions::new().write(true).open(&wal) {
            Ok(f) => Arc::new(f),
            // No WAL file (a database not in WAL mode): nothing to grow.
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(0),
            Err(e) => return Err(e.into()),
        };
        let reached = loop {
            // The transaction holds SQLite's write lock across processes; it writes nothing
            // and is rolled back when dropped.
            let _tx = self.begin(false).await?;
            let f = file.clone();
            let len = blocking(move || {
                use std::os::unix::fs::FileExt;
                let len = f.metadata()?.len();
                let n = CHUNK.min(bytes.saturating_sub(len));
                f.write_all_at(&vec![0u8; n as usize], len)?;
                Ok(len + n)
            })
            .await?;
            if len >= bytes {
                break len;
            }
        };
        // Outside the lock: flushing blocks nobody reads needs no exclusion.
        blocking(move || file.sync_data()).await?;
        Ok(reached)
    }

    /// Closes the idle connections, and each lent one as it comes back (the file stays).
    /// The checkpoint thread ends once it has finished any checkpoint under way.
    pub fn close(&self) {
        self.inner.closed.store(true, Ordering::Release);
        self.inner.idle.lock().expect("idle lock").clear();
        self.inner
            .checkpoint
            .lock()
            .expect("checkpoint lock")
            .take();
    }
}

/// Starts the thread that checkpoints the WAL, on a connection of its own, every
/// [`CHECKPOINT_EVERY`] in which something was committed; returns what stops it (dropping
/// it).
///
/// A passive checkpoint takes no write lock: commits go on while it copies frames into the
/// database file. But SQLite starts the WAL over from its beginning only when a write
/// transaction begins with every frame already copied, which under steady load is never (a
/// commit lands while the checkpoint runs), and the WAL would grow past its preallocated
/// length. So once the WAL is [`RESTART_FRAMES`] long, a second checkpoint runs holding this
/// process's write lock: it copies only the frames committed during the first, and the next
/// writer starts the WAL over.
fn checkpointer(
    c: Connection,
    commits: Arc<AtomicU64>,
    writer: Arc<tokio::sync::Mutex<()>>,
) -> Result<SyncSender<()>> {
    use std::sync::mpsc::RecvTimeoutError;
    let passive = move || -> rusqlite::Result<i64> {
        let started = Instant::now();
        let (frames, copied) = c.query_row("PRAGMA wal_checkpoint(PASSIVE)", [], |row| {
            Ok((row.get::<_, i64>(1)?, row.get::<_, i64>(2)?))
        })?;
        let ms = started.elapsed().as_secs_f64() * 1e3;
        tracing::debug!(frames, copied, ms, "WAL checkpoint");
        Ok(frames)
    };
    let (stop, stopped) = std::sync::mpsc::sync_channel::<()>(1);
    std::thread::Builder::new()
        .name("toolgate-checkpoint".into())
        .spawn(move || {
            let mut seen = 0;
            while let Err(RecvTimeoutError::Timeout) = stopped.recv_timeout(CHECKPOINT_EVERY) {
                let now = commits.load(Ordering::Relaxed);
                if now == seen {
                    continue;
                }
                seen = now;
                let r = passive().and_then(|frames| {
                    if frames < RESTART_FRAMES {
                        return Ok(frames);
                    }
                    let _writer = writer.blocking_lock();
                    passive()
                });
                if let Err(e) = r {
                    tracing::warn!(error = %e, "a WAL checkpoint failed; the next turn retries");
                }
            }
        })?;
    Ok(stop)
}

/// Runs file I/O on the blocking pool.
async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> std::io::Result<T> + Send + 'static,
) -> Result<T> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|source| StoreError::Task {
            what: "a blocking file task",
            source,
        })?
        .map_err(Into::into)
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
        if let Some(lc) = self.lc.take()
            && !self.home.closed.load(Ordering::Acquire)
        {
            self.home.idle.lock().expect("idle lock").push(lc);
        }
    }
}

impl LiteConn {
    fn c(&self) -> &Connection {
        &self.lc.as_ref().expect("open connection").c
    }

    /// The column names of `st`, prepared from `sql`.
    fn names(&self, sql: &str, st: &rusqlite::Statement<'_>) -> Arc<[String]> {
        let cache = &self.lc.as_ref().expect("open connection").names;
        if let Some(n) = cache.borrow().get(sql) {
            return n.clone();
        }
        let n: Arc<[String]> = st.column_names().into_iter().map(str::to_string).collect();
        cache.borrow_mut().insert(sql.to_string(), n.clone());
        n
    }

    /// Runs one statement; `$n` placeholders take `args[n - 1]`. Returns the rows it
    /// produced and the rows it changed.
    fn run(&self, sql: &str, args: &[Arg]) -> Result<(LiteRows, u64)> {
        let c = self.c();
        let mut st = c.prepare_cached(sql)?;
        for i in 1..=st.parameter_count() {
            let n = match st.parameter_name(i) {
                Some(name) => name
                    .strip_prefix(['$', '?'])
                    .and_then(|d| d.parse::<usize>().ok())
                    .ok_or_else(|| {
                        StoreError::Bug(format!("placeholder {name} in `{sql}` is not $n"))
                    })?,
                None => i,
            };
            let arg = args.get(n.wrapping_sub(1)).ok_or_else(|| {
                StoreError::Bug(format!("`{sql}` wants ${n}; {} bound", args.len()))
            })?;
            match arg {
                Arg::I(v) => st.raw_bind_parameter(i, v)?,
                Arg::T(v) => st.raw_bind_parameter(i, v)?,
                Arg::OptT(v) => st.raw_bind_parameter(i, v)?,
                Arg::OptI(v) => st.raw_bind_parameter(i, v)?,
                Arg::Texts(_) | Arg::OptTexts(_) | Arg::Ints(_) | Arg::OptInts(_) => {
                    return Err(StoreError::Bug(format!(
                        "an array bound to a SQLite statement: {sql}"
                    )));
                }
            }
        }
        let width = st.column_count();
        // A statement that returns no columns (most writes) shares one empty list: nothing is
        // allocated or looked up for it.
        static NO_COLUMNS: LazyLock<Arc<[String]>> = LazyLock::new(|| Arc::from(Vec::new()));
        let names = if width == 0 {
            NO_COLUMNS.clone()
        } else {
            self.names(sql, &st)
        };
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
        Ok((LiteRows { names, rows: out }, c.changes()))
    }

    pub fn exec(&mut self, sql: &str, args: &[Arg]) -> Result<u64> {
        Ok(self.run(sql, args)?.1)
    }

    pub fn rows(&mut self, sql: &str, args: &[Arg]) -> Result<LiteRows> {
        Ok(self.run(sql, args)?.0)
    }
}

/// The rows a statement returned, and the names of their columns.
pub(crate) struct LiteRows {
    pub names: Arc<[String]>,
    pub rows: Vec<Vec<Value>>,
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
        let r = if self.durable {
            // The fsync runs on the blocking pool; the connection comes back with the answer.
            let lc = self.conn.lc.take().expect("open connection");
            let (lc, r) = tokio::task::spawn_blocking(move || {
                let r = run_cached(&lc.c, "COMMIT");
                (lc, r)
            })
            .await
            .map_err(|source| StoreError::Task {
                what: "the commit task",
                source,
            })?;
            self.conn.lc = Some(lc);
            r
        } else {
            run_cached(self.conn.c(), "COMMIT")
        };
        if let Err(e) = r {
            self.rollback_or_discard();
            return Err(e.into());
        }
        self.conn.home.commits.fetch_add(1, Ordering::Relaxed);
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

#[cfg(test)]
mod tests {
    use super::*;

    fn idle(lite: &Lite) -> usize {
        lite.inner.idle.lock().unwrap().len()
    }

    #[test]
    fn a_closed_store_lends_nothing_and_keeps_nothing_lent_before() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("db.sqlite");
        Connection::open(&path).unwrap();
        let lite = Lite::open(&path, true).unwrap();
        let lent = lite.conn().unwrap();
        let second = lite.conn().unwrap();
        drop(second);
        assert_eq!(idle(&lite), 1, "a returned connection is kept while open");

        lite.close();
        assert_eq!(idle(&lite), 0);
        drop(lent);
        assert_eq!(
            idle(&lite),
            0,
            "a connection lent before close is closed on return"
        );
        assert!(matches!(lite.conn(), Err(StoreError::Closed)));
    }

    /// SQLite's `synchronous` level inside a write transaction: 2 is FULL (the commit is
    /// fsync'd), 1 is NORMAL (written to the WAL, flushed at a checkpoint).
    async fn synchronous_level(lite: &Lite, durable: bool) -> i64 {
        let mut tx = lite.begin(durable).await.unwrap();
        let level = tx
            .conn()
            .c()
            .query_row("PRAGMA synchronous", [], |r| r.get(0))
            .unwrap();
        tx.commit().await.unwrap();
        level
    }

    #[tokio::test]
    async fn a_durable_commit_is_fsyncd_unless_the_store_only_outlives_the_process() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("db.sqlite");
        Connection::open(&path).unwrap();
        let fsync = Lite::open(&path, true).unwrap();
        assert_eq!(synchronous_level(&fsync, true).await, 2);
        assert_eq!(synchronous_level(&fsync, false).await, 1);
        assert_eq!(
            synchronous_level(&fsync, true).await,
            2,
            "set again per commit"
        );
        fsync.close();

        let process = Lite::open(&path, false).unwrap();
        assert_eq!(synchronous_level(&process, true).await, 1);
        assert_eq!(synchronous_level(&process, false).await, 1);
    }

    #[tokio::test]
    async fn the_checkpointer_keeps_the_wal_short_under_steady_commits() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("db.sqlite");
        Connection::open(&path)
            .unwrap()
            .execute_batch("CREATE TABLE t (n INTEGER)")
            .unwrap();
        let lite = Lite::open(&path, true).unwrap();
        // Each commit appends one row: about one WAL frame. Three rounds of the restart
        // length stay under SQLite's own backstop, so without the checkpointer the WAL file
        // would end three rounds long.
        for _ in 0..3 {
            for _ in 0..RESTART_FRAMES {
                let mut tx = lite.begin(false).await.unwrap();
                tx.conn().exec("INSERT INTO t VALUES (1)", &[]).unwrap();
                tx.commit().await.unwrap();
            }
            tokio::time::sleep(4 * CHECKPOINT_EVERY).await;
        }
        let frame = 4096 + 24;
        let wal = std::fs::metadata(dir.path().join("db.sqlite-wal"))
            .unwrap()
            .len();
        assert!(
            wal < 2 * RESTART_FRAMES as u64 * frame,
            "the WAL was started over between rounds: {wal} bytes, {} frames",
            wal / frame
        );
        let rows: i64 = lite
            .conn()
            .unwrap()
            .c()
            .query_row("SELECT count(*) FROM t", [], |r| r.get(0))
            .unwrap();
        assert_eq!(rows, 3 * RESTART_FRAMES, "every commit is kept");
    }
}
