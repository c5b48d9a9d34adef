//! The two backends behind one small surface. SQL is written once with `$n` placeholders
//! (SQLite accepts them too); the few statements that differ (`FOR UPDATE SKIP LOCKED`, the
//! chain-head lock) branch on [`Tx::is_pg`]. Only text and 64-bit integers cross the boundary,
//! so both backends store exactly the same values.

use rusqlite::types::Value;
use sqlx::migrate::{Migration, MigrationType, Migrator};
use sqlx::postgres::{PgConnectOptions, PgPool, PgPoolOptions, PgRow};
use sqlx::sqlite::{
    SqliteConnectOptions, SqliteJournalMode, SqlitePool, SqlitePoolOptions, SqliteSynchronous,
};
use sqlx::{AssertSqlSafe, Row as _, SqlSafeStr as _};
use std::collections::HashMap;
use std::str::FromStr;
use std::sync::{Arc, LazyLock};
use std::time::Duration;

use toolgate_core::config::Durability;

use crate::error::{Result, StoreError};
use crate::lite::{BACKSTOP_FRAMES, Lite, LiteConn, LiteTx};
use crate::pg::{IDLE_BEFORE_PING, PgConn, PgConns};

/// The migrations of each backend, embedded by `build.rs`: (version, description, SQL).
mod embedded {
    include!(concat!(env!("OUT_DIR"), "/migrations.rs"));
}

static SQLITE_MIGRATIONS: LazyLock<Migrator> = LazyLock::new(|| migrator(embedded::SQLITE));
static PG_MIGRATIONS: LazyLock<Migrator> = LazyLock::new(|| migrator(embedded::POSTGRES));

/// The migrator `sqlx::migrate!` would build from the same files, checksummed as sqlx does,
/// so a database migrated by either accepts the other.
fn migrator(files: &[(i64, &'static str, &'static str)]) -> Migrator {
    let migrations = files
        .iter()
        .map(|&(version, description, sql)| {
            let no_tx = sql.starts_with("-- no-transaction");
            let mut m = Migration::new(
                version,
                description.into(),
                MigrationType::Simple,
                sql.into_sql_str(),
                no_tx,
            );
            if let Some(checksum) = released_checksum(version) {
                m.checksum = checksum.into();
            }
            m
        })
        .collect();
    Migrator::with_migrations(migrations)
}

/// Migrations whose comments were reworded after databases had applied them (SHA-384, hex, of
/// the text as first released; the same on both backends). sqlx refuses a database whose
/// applied migration's checksum differs from the file's, so these keep the checksum they were
/// applied with; their statements did not change. A change to a statement is a new migration.
const RELEASED_CHECKSUMS: &[(i64, &str)] = &[
    (
        2,
        "90ca6c2ff48f8ce14dc26380a36e9baf819e698e0941695f75c505cf576d0eb7aa63d4d5ef54746fcccc610a55bf2e7b",
    ),
    (
        3,
        "3f7da02180c7abec1c058807e22d16eb1eed9c3afef49429ccf747d59e73733b23a86e471944b90f4397007aead5e44c",
    ),
    (
        5,
        "3b2f8950ea8cc108cdc0e12bbd82f1d194162ba8d444d320c94410d50ba464c9272a9840c952ed851fb1d4d02a42a99b",
    ),
];

fn released_checksum(version: i64) -> Option<Vec<u8>> {
    let (_, hex) = RELEASED_CHECKSUMS.iter().find(|(v, _)| *v == version)?;
    Some(
        (0..hex.len())
            .step_by(2)
            .map(|i| u8::from_str_radix(&hex[i..i + 2], 16).expect("a hex checksum"))
            .collect(),
    )
}

/// A bound value.
#[derive(Debug, Clone)]
pub(crate) enum Arg {
    I(i64),
    T(String),
    OptT(Option<String>),
    OptI(Option<i64>),
    /// PostgreSQL only: an array (`$1::text[]`), so one statement of stable text carries a
    /// batch of any size (`unnest`). SQLite has no arrays; binding one there is a bug.
    Texts(Vec<String>),
    OptTexts(Vec<Option<String>>),
    Ints(Vec<i64>),
    OptInts(Vec<Option<i64>>),
}

impl Arg {
    /// One column of many rows' parameters, as one array (PostgreSQL, for `unnest`): text
    /// values as a text array, integers as a bigint array, either with NULLs.
    pub(crate) fn column<'a>(values: impl Iterator<Item = &'a Arg>) -> Result<Arg> {
        let mut texts = Vec::new();
        let mut ints = Vec::new();
        for v in values {
            match v {
                Arg::T(t) => texts.push(Some(t.clone())),
                Arg::OptT(t) => texts.push(t.clone()),
                Arg::I(i) => ints.push(Some(*i)),
                Arg::OptI(i) => ints.push(*i),
                _ => return Err(StoreError::Bug("an array in a column of parameters".into())),
            }
        }
        match (texts.is_empty(), ints.is_empty()) {
            (_, true) => Ok(Arg::OptTexts(texts)),
            (true, false) => Ok(Arg::OptInts(ints)),
            (false, false) => Err(StoreError::Bug(
                "text and integers in one column of parameters".into(),
            )),
        }
    }
}

impl From<i64> for Arg {
    fn from(v: i64) -> Self {
        Arg::I(v)
    }
}
impl From<String> for Arg {
    fn from(v: String) -> Self {
        Arg::T(v)
    }
}
impl From<&str> for Arg {
    fn from(v: &str) -> Self {
        Arg::T(v.to_string())
    }
}
impl From<&String> for Arg {
    fn from(v: &String) -> Self {
        Arg::T(v.clone())
    }
}
impl From<Option<String>> for Arg {
    fn from(v: Option<String>) -> Self {
        Arg::OptT(v)
    }
}
impl From<Option<&str>> for Arg {
    fn from(v: Option<&str>) -> Self {
        Arg::OptT(v.map(str::to_string))
    }
}
impl From<Option<i64>> for Arg {
    fn from(v: Option<i64>) -> Self {
        Arg::OptI(v)
    }
}
impl From<Vec<String>> for Arg {
    fn from(v: Vec<String>) -> Self {
        Arg::Texts(v)
    }
}
impl From<Vec<Option<String>>> for Arg {
    fn from(v: Vec<Option<String>>) -> Self {
        Arg::OptTexts(v)
    }
}
impl From<Vec<i64>> for Arg {
    fn from(v: Vec<i64>) -> Self {
        Arg::Ints(v)
    }
}
impl From<Vec<Option<i64>>> for Arg {
    fn from(v: Vec<Option<i64>>) -> Self {
        Arg::OptInts(v)
    }
}

/// The ids are bound as the text they wrap.
macro_rules! id_args {
    ($($id:ty),*) => {$(
        impl From<&$id> for Arg {
            fn from(v: &$id) -> Self {
                Arg::T(v.as_str().to_string())
            }
        }
        impl From<Vec<$id>> for Arg {
            fn from(v: Vec<$id>) -> Self {
                Arg::Texts(v.into_iter().map(<$id>::into_string).collect())
            }
        }
    )*};
}
id_args!(
    toolgate_core::RunId,
    toolgate_core::StepId,
    toolgate_core::PrincipalId,
    toolgate_core::ApprovalId
);

/// `args![a, b, c]`: a list of bound values.
macro_rules! args {
    ($($e:expr),* $(,)?) => { vec![$($crate::db::Arg::from($e)),*] };
}
pub(crate) use args;

macro_rules! bind_all {
    ($q:expr, $args:expr) => {{
        let mut q = $q;
        for a in $args {
            q = match a {
                Arg::I(v) => q.bind(v),
                Arg::T(v) => q.bind(v),
                Arg::OptT(v) => q.bind(v),
                Arg::OptI(v) => q.bind(v),
                Arg::Texts(v) => q.bind(v),
                Arg::OptTexts(v) => q.bind(v),
                Arg::Ints(v) => q.bind(v),
                Arg::OptInts(v) => q.bind(v),
            };
        }
        q
    }};
}

/// One result row from either backend. Its columns are read by name (`r.text("step_id")`),
/// as the statement names them (`AS` for an expression) on both backends.
pub(crate) enum Row {
    /// SQLite: the statement's column names (shared by its rows) and this row's values.
    S(Arc<[String]>, Vec<Value>),
    P(PgRow),
}

// A column is read by its name only, never by position: adding or moving a column in a
// SELECT would silently shift every read after it.
impl Row {
    /// SQLite's value in column `c`.
    fn lite<'a>(names: &[String], r: &'a [Value], c: &str) -> Result<&'a Value> {
        names
            .iter()
            .position(|n| n == c)
            .and_then(|i| r.get(i))
            .ok_or_else(|| StoreError::Bug(format!("no column {c:?} in a row of {names:?}")))
    }

    fn lite_type(c: &str, v: &Value, want: &str) -> StoreError {
        StoreError::Corrupt(format!(
            "column {c:?}: expected {want}, found {:?}",
            v.data_type()
        ))
    }

    pub fn i64(&self, c: &str) -> Result<i64> {
        Ok(match self {
            Row::S(n, r) => match Self::lite(n, r, c)? {
                Value::Integer(v) => *v,
                v => return Err(Self::lite_type(c, v, "an integer")),
            },
            Row::P(r) => r.try_get(c)?,
        })
    }
    pub fn text(&self, c: &str) -> Result<String> {
        Ok(match self {
            Row::S(n, r) => match Self::lite(n, r, c)? {
                Value::Text(v) => v.clone(),
                v => return Err(Self::lite_type(c, v, "text")),
            },
            Row::P(r) => r.try_get(c)?,
        })
    }
    pub fn opt_text(&self, c: &str) -> Result<Option<String>> {
        Ok(match self {
            Row::S(n, r) => match Self::lite(n, r, c)? {
                Value::Null => None,
                Value::Text(v) => Some(v.clone()),
                v => return Err(Self::lite_type(c, v, "text or null")),
            },
            Row::P(r) => r.try_get(c)?,
        })
    }
    pub fn opt_i64(&self, c: &str) -> Result<Option<i64>> {
        Ok(match self {
            Row::S(n, r) => match Self::lite(n, r, c)? {
                Value::Null => None,
                Value::Integer(v) => Some(*v),
                v => return Err(Self::lite_type(c, v, "an integer or null")),
            },
            Row::P(r) => r.try_get(c)?,
        })
    }
}

/// A pool of either backend.
#[derive(Clone, Debug)]
pub(crate) enum Pool {
    /// sqlx's pool for migrations and administration; [`Lite`] for the store's statements.
    Sqlite(SqlitePool, Lite),
    /// sqlx's pool, and the connections the store's statements use ([`PgConns`]).
    Postgres(PgPool, PgConns),
}

/// Connection settings beyond the URL.
#[derive(Debug, Clone)]
pub struct ConnectOptions {
    /// PostgreSQL only: the schema to use (created if missing) instead of `public`.
    pub schema: Option<String>,
    /// Maximum connections in the pool.
    pub max_connections: u32,
}

impl Default for ConnectOptions {
    fn default() -> Self {
        ConnectOptions {
            schema: None,
            max_connections: 8,
        }
    }
}

/// What opening a database does about its schema.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Migrations {
    /// Create the database (SQLite) and the schema if missing, and apply what is new:
    /// the long-running processes (`serve`, `worker`) and tests.
    Apply,
    /// Change nothing: the database and exactly this binary's schema must be there already
    /// (the commands that read or decide on what `serve` recorded).
    Require,
}

impl Pool {
    /// Opens the database named by `url`, applying or requiring its migrations.
    /// With [`Durability::Process`], no commit is flushed to the disk on its own.
    pub async fn connect(
        url: &str,
        opts: &ConnectOptions,
        durability: Durability,
        migrations: Migrations,
    ) -> Result<Pool> {
        let apply = migrations == Migrations::Apply;
        let fsync = durability == Durability::Fsync;
        if url.starts_with("sqlite:") {
            if url.contains(":memory:") || url.contains("mode=memory") {
                return Err(StoreError::BadUrl(format!(
                    "{url} (an in-memory database: the store needs a file, sqlite://PATH)"
                )));
            }
            let o = SqliteConnectOptions::from_str(url)
                .map_err(|_| StoreError::BadUrl(url.to_string()))?
                .create_if_missing(apply)
                .journal_mode(SqliteJournalMode::Wal)
                // fsync the WAL on every commit: an acknowledged record survives power loss.
                // (`durability: process`: written to the WAL, flushed at checkpoints.)
                .synchronous(if fsync {
                    SqliteSynchronous::Full
                } else {
                    SqliteSynchronous::Normal
                })
                .busy_timeout(Duration::from_secs(30))
                // Checkpoints run on the hot path's own thread (`lite`); this is the backstop.
                .pragma("wal_autocheckpoint", BACKSTOP_FRAMES.to_string())
                .foreign_keys(true);
            let pool = SqlitePoolOptions::new()
                .max_connections(opts.max_connections.max(2))
                .connect_with(o.clone())
                .await?;
            if apply {
                SQLITE_MIGRATIONS.run(&pool).await?;
            } else {
                let applied = applied_migrations(
                    sqlx::query_scalar::<_, i64>(
                        "SELECT count(*) FROM sqlite_master WHERE type = 'table' \
                         AND name = '_sqlx_migrations'",
                    )
                    .fetch_one(&pool)
                    .await?
                        > 0,
                    || {
                        sqlx::query_scalar::<_, i64>(
                            "SELECT version FROM _sqlx_migrations WHERE success",
                        )
                        .fetch_all(&pool)
                    },
                )
                .await?;
                require_schema(&SQLITE_MIGRATIONS, applied)?;
            }
            let lite = Lite::open(o.get_filename(), fsync)?;
            Ok(Pool::Sqlite(pool, lite))
        } else if url.starts_with("postgres:") || url.starts_with("postgresql:") {
            let mut o =
                PgConnectOptions::from_str(url).map_err(|_| StoreError::BadUrl(url.to_string()))?;
            if let Some(schema) = opts.schema.as_ref().filter(|_| apply) {
                if !schema
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || c == '_')
                {
                    return Err(StoreError::BadUrl(format!(
                        "{url} (schema '{schema}' must be letters, digits and _)"
                    )));
                }
                let admin = PgPoolOptions::new()
                    .max_connections(1)
                    .connect_with(o.clone())
                    .await?;
                sqlx::query(AssertSqlSafe(format!(
                    "CREATE SCHEMA IF NOT EXISTS \"{schema}\""
                )))
                .execute(&admin)
                .await?;
                admin.close().await;
                o = o.options([("search_path", schema.as_str())]);
            }
            if let (false, Some(schema)) = (apply, &opts.schema) {
                if !schema
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || c == '_')
                {
                    return Err(StoreError::BadUrl(format!(
                        "{url} (schema '{schema}' must be letters, digits and _)"
                    )));
                }
                o = o.options([("search_path", schema.as_str())]);
            }
            if !fsync {
                // The server acknowledges a commit before its WAL is flushed.
                o = o.options([("synchronous_commit", "off")]);
            }
            // sqlx pings a connection (a round trip) when it is taken out, and again when it
            // goes back. The store's statements take their connections from `PgConns`, which
            // keeps them out of sqlx's pool between uses (no ping on the way back) and pings
            // only one idle for longer than a second; the rest (migrations, administration,
            // listeners) go through sqlx's pool, which pings on the same terms when taking out.
            let pool = PgPoolOptions::new()
                .max_connections(opts.max_connections)
                .test_before_acquire(false)
                .before_acquire(|conn, meta| {
                    Box::pin(async move {
                        if meta.idle_for > IDLE_BEFORE_PING {
                            sqlx::Connection::ping(conn).await?;
                        }
                        Ok(true)
                    })
                })
                .connect_with(o)
                .await?;
            if apply {
                PG_MIGRATIONS.run(&pool).await?;
            } else {
                let applied = applied_migrations(
                    sqlx::query_scalar::<_, bool>(
                        "SELECT to_regclass('_sqlx_migrations') IS NOT NULL",
                    )
                    .fetch_one(&pool)
                    .await?,
                    || {
                        sqlx::query_scalar::<_, i64>(
                            "SELECT version FROM _sqlx_migrations WHERE success",
                        )
                        .fetch_all(&pool)
                    },
                )
                .await?;
                require_schema(&PG_MIGRATIONS, applied)?;
            }
            let conns = PgConns::new(pool.clone(), opts.max_connections);
            Ok(Pool::Postgres(pool, conns))
        } else {
            Err(StoreError::BadUrl(url.to_string()))
        }
    }

    pub fn is_pg(&self) -> bool {
        matches!(self, Pool::Postgres(..))
    }

    /// SQLite whose durable commits are fsync'd (`durability: fsync`): a relaxed commit that
    /// acknowledged something must be followed by one of those.
    pub fn is_fsyncd_sqlite(&self) -> bool {
        matches!(self, Pool::Sqlite(_, lite) if lite.fsyncs())
    }

    /// A write transaction whose commit is durable (fsync'd) before it returns:
    /// `BEGIN IMMEDIATE` on SQLite (the single writer), plain `BEGIN` (read committed, with
    /// row locks) on PostgreSQL.
    pub async fn begin(&self) -> Result<Tx> {
        Ok(match self {
            // Set on every transaction: a pooled connection may have run a relaxed one.
            Pool::Sqlite(_, lite) => Tx::S(lite.begin(true).await?),
            Pool::Postgres(_, c) => Tx::P(c.take().await?.begin("BEGIN").await?),
        })
    }

    /// A write transaction whose commit survives the process being killed but is not
    /// fsync'd (SQLite: WAL with `synchronous = NORMAL`; PostgreSQL: `synchronous_commit`
    /// off for this transaction, set in the same round trip as its `BEGIN`: it survives the
    /// gateway being killed, not the database server losing power before its next flush). A
    /// later durable commit makes it durable too, since the WAL is one append-only file.
    /// [`Tx::unrelax`] takes it back before a commit that must be durable after all.
    pub async fn begin_relaxed(&self) -> Result<Tx> {
        Ok(match self {
            Pool::Sqlite(_, lite) => Tx::S(lite.begin(false).await?),
            Pool::Postgres(_, c) => Tx::P(
                c.take()
                    .await?
                    .begin("BEGIN; SET LOCAL synchronous_commit = off")
                    .await?,
            ),
        })
    }

    /// A connection for reads outside a write transaction.
    pub async fn conn(&self) -> Result<Conn> {
        Ok(match self {
            Pool::Sqlite(_, lite) => Conn::S(lite.conn()?),
            Pool::Postgres(_, c) => Conn::P(c.take().await?),
        })
    }

    pub async fn close(&self) {
        match self {
            Pool::Sqlite(p, lite) => {
                lite.close();
                p.close().await
            }
            Pool::Postgres(p, c) => {
                c.close();
                p.close().await
            }
        }
    }

    /// Runs raw SQL (tests and administration: dropping triggers, tampering on purpose).
    pub async fn execute_raw(&self, sql: &str) -> Result<u64> {
        Ok(match self {
            Pool::Sqlite(p, _) => sqlx::raw_sql(AssertSqlSafe(sql.to_string()))
                .execute(p)
                .await?
                .rows_affected(),
            Pool::Postgres(p, _) => sqlx::raw_sql(AssertSqlSafe(sql.to_string()))
                .execute(p)
                .await?
                .rows_affected(),
        })
    }
}

/// The versions of the migrations applied to a database (`None`: it has no migration table,
/// so no toolgate schema at all).
async fn applied_migrations<F, Fut>(has_table: bool, read: F) -> Result<Option<Vec<i64>>>
where
    F: FnOnce() -> Fut,
    Fut: Future<Output = std::result::Result<Vec<i64>, sqlx::Error>>,
{
    if !has_table {
        return Ok(None);
    }
    Ok(Some(read().await?))
}

/// Refuses a database whose schema is not exactly `migrator`'s: none at all, older (a
/// migration of this binary not applied) or newer (one applied that this binary lacks).
fn require_schema(migrator: &sqlx::migrate::Migrator, applied: Option<Vec<i64>>) -> Result<()> {
    let Some(applied) = applied else {
        return Err(StoreError::Schema(SchemaProblem::Missing));
    };
    let known: Vec<i64> = migrator
        .iter()
        .filter(|m| !m.migration_type.is_down_migration())
        .map(|m| m.version)
        .collect();
    if applied.is_empty() {
        return Err(StoreError::Schema(SchemaProblem::Missing));
    }
    let mut missing: Vec<i64> = known
        .iter()
        .copied()
        .filter(|v| !applied.contains(v))
        .collect();
    let mut unknown: Vec<i64> = applied
        .iter()
        .copied()
        .filter(|v| !known.contains(v))
        .collect();
    missing.sort_unstable();
    unknown.sort_unstable();
    if !unknown.is_empty() {
        return Err(StoreError::Schema(SchemaProblem::Newer { unknown }));
    }
    if !missing.is_empty() {
        return Err(StoreError::Schema(SchemaProblem::Older { missing }));
    }
    Ok(())
}

/// Why a database's schema is not the one this binary reads.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SchemaProblem {
    /// No toolgate tables at all (an empty database, or the wrong one).
    Missing,
    /// Migrations of this binary not applied yet.
    Older { missing: Vec<i64> },
    /// Migrations applied by a newer toolgate that this binary does not know.
    Newer { unknown: Vec<i64> },
}

impl std::fmt::Display for SchemaProblem {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let list = |v: &[i64]| {
            v.iter()
                .map(|n| format!("{n:04}"))
                .collect::<Vec<_>>()
                .join(", ")
        };
        match self {
            SchemaProblem::Missing => f.write_str(
                "the database holds no toolgate store (no toolgate tables): nothing has been \
                 recorded there, or the URL names the wrong database; `toolgate serve` (or \
                 `toolgate worker`) creates the store when it starts",
            ),
            SchemaProblem::Older { missing } => write!(
                f,
                "the store's schema is older than this toolgate's (migration(s) {} not applied): \
                 start this version's `toolgate serve` (or `toolgate worker`) once, which \
                 migrates it, then run this command again",
                list(missing)
            ),
            SchemaProblem::Newer { unknown } => write!(
                f,
                "the store was migrated by a newer toolgate (migration(s) {} unknown to this \
                 one): use that version of toolgate to read it",
                list(unknown)
            ),
        }
    }
}

/// A transaction on either backend.
pub(crate) enum Tx {
    S(LiteTx),
    P(PgConn),
}

/// A pooled connection on either backend.
pub(crate) enum Conn {
    S(LiteConn),
    P(PgConn),
}

macro_rules! impl_exec {
    ($t:ty) => {
        #[allow(dead_code)]
        impl $t {
            pub fn is_pg(&self) -> bool {
                matches!(self, Self::P(_))
            }

            /// Executes one statement, returning the rows it affected.
            pub async fn exec(&mut self, sql: &'static str, args: Vec<Arg>) -> Result<u64> {
                Ok(match self {
                    Self::S(c) => c.lite().exec(sql, &args)?,
                    Self::P(c) => {
                        c.before_statement().await?;
                        let r = bind_all!(sqlx::query(sql), args).execute(&mut **c).await;
                        c.note(r)?.rows_affected()
                    }
                })
            }

            pub async fn rows(&mut self, sql: &'static str, args: Vec<Arg>) -> Result<Vec<Row>> {
                Ok(match self {
                    Self::S(c) => {
                        let r = c.lite().rows(sql, &args)?;
                        r.rows
                            .into_iter()
                            .map(|v| Row::S(r.names.clone(), v))
                            .collect()
                    }
                    Self::P(c) => {
                        c.before_statement().await?;
                        let r = bind_all!(sqlx::query(sql), args).fetch_all(&mut **c).await;
                        c.note(r)?.into_iter().map(Row::P).collect()
                    }
                })
            }

            pub async fn opt(&mut self, sql: &'static str, args: Vec<Arg>) -> Result<Option<Row>> {
                Ok(match self {
                    Self::S(c) => {
                        let r = c.lite().rows(sql, &args)?;
                        r.rows.into_iter().next().map(|v| Row::S(r.names, v))
                    }
                    Self::P(c) => {
                        c.before_statement().await?;
                        let r = bind_all!(sqlx::query(sql), args)
                            .fetch_optional(&mut **c)
                            .await;
                        c.note(r)?.map(Row::P)
                    }
                })
            }
        }
    };
}
impl_exec!(Tx);
impl_exec!(Conn);

impl PgConn {
    /// Before each statement: counts it, and first writes the steps a reservation batch
    /// deferred, so no statement can see the store without them.
    async fn before_statement(&mut self) -> Result<()> {
        self.statements += 1;
        if self.deferred.as_ref().is_some_and(|d| d.pending()) {
            crate::ledger::steps::write_deferred(self).await?;
        }
        Ok(())
    }

    /// One statement's rows, sent as it is: for the statement that writes the deferred
    /// steps, which [`Self::before_statement`] itself sends.
    pub(crate) async fn rows_as_is(
        &mut self,
        sql: &'static str,
        args: Vec<Arg>,
    ) -> Result<Vec<Row>> {
        let r = bind_all!(sqlx::query(sql), args)
            .fetch_all(&mut **self)
            .await;
        Ok(self.note(r)?.into_iter().map(Row::P).collect())
    }
}

/// Reads in a transaction or on a loaned connection: what a ledger function that only reads
/// takes, so the same read serves a caller's transaction and a plain read.
pub(crate) trait Sql: Send {
    async fn rows(&mut self, sql: &'static str, args: Vec<Arg>) -> Result<Vec<Row>>;
    async fn opt(&mut self, sql: &'static str, args: Vec<Arg>) -> Result<Option<Row>>;
}

macro_rules! impl_sql {
    ($t:ident) => {
        impl Sql for $t {
            async fn rows(&mut self, sql: &'static str, args: Vec<Arg>) -> Result<Vec<Row>> {
                $t::rows(self, sql, args).await
            }
            async fn opt(&mut self, sql: &'static str, args: Vec<Arg>) -> Result<Option<Row>> {
                $t::opt(self, sql, args).await
            }
        }
    };
}
impl_sql!(Tx);
impl_sql!(Conn);

/// The SQLite connection under a transaction or a loaned connection.
trait LiteOf {
    fn lite(&mut self) -> &mut LiteConn;
}
impl LiteOf for LiteTx {
    fn lite(&mut self) -> &mut LiteConn {
        self.conn()
    }
}
impl LiteOf for LiteConn {
    fn lite(&mut self) -> &mut LiteConn {
        self
    }
}

impl Tx {
    /// PostgreSQL: a transaction begun [relaxed](Pool::begin_relaxed) commits as the store
    /// is configured after all (waiting for the WAL flush unless `durability: process`). No
    /// effect on SQLite, whose relaxed commits are made durable by a sync barrier instead.
    pub async fn unrelax(&mut self) -> Result<()> {
        if self.is_pg() {
            self.exec("SET LOCAL synchronous_commit TO DEFAULT", Vec::new())
                .await?;
        }
        Ok(())
    }

    pub async fn commit(self) -> Result<()> {
        match self {
            Tx::S(t) => t.commit().await?,
            Tx::P(t) => {
                if t.deferred.as_ref().is_some_and(|d| d.pending()) {
                    return Err(StoreError::Bug(
                        "a reservation batch committed steps it had not written".into(),
                    ));
                }
                t.commit().await?
            }
        }
        Ok(())
    }

    /// How many statements this transaction has sent (PostgreSQL; always 0 on SQLite). What
    /// a batch read at one count, none of its own statements has changed while the count is
    /// the same (other transactions' commits can, which the conditional writes settle).
    pub fn epoch(&self) -> u64 {
        match self {
            Tx::S(_) => 0,
            Tx::P(c) => c.statements,
        }
    }

    /// From now on, direct steps opened under their keys ([`crate::ledger::steps::open_keyed`])
    /// are written together, before the transaction's next statement (PostgreSQL; nothing on
    /// SQLite). [`Self::write_deferred`] writes them and says how each was numbered.
    pub fn defer_opens(&mut self) {
        if let Tx::P(c) = self {
            c.deferred = Some(Default::default());
        }
    }

    /// Writes the deferred steps, and returns each step's number in its run (by step id) for
    /// every step written since [`Self::defer_opens`].
    pub async fn write_deferred(&mut self) -> Result<HashMap<String, i64>> {
        let Tx::P(c) = self else {
            return Ok(HashMap::new());
        };
        if c.deferred.as_ref().is_some_and(|d| d.pending()) {
            crate::ledger::steps::write_deferred(c).await?;
        }
        Ok(c.deferred
            .as_mut()
            .map(|d| std::mem::take(&mut d.numbered))
            .unwrap_or_default())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_reworded_migrations_keep_a_released_checksum() {
        // Each override stands for a file whose text changed since release (else it is stale),
        // on both backends, and the migrators carry it.
        for (files, migrator) in [
            (embedded::SQLITE, &*SQLITE_MIGRATIONS),
            (embedded::POSTGRES, &*PG_MIGRATIONS),
        ] {
            for &(version, _) in RELEASED_CHECKSUMS {
                let (_, _, sql) = files.iter().find(|(v, ..)| *v == version).unwrap();
                let released = released_checksum(version).unwrap();
                assert_eq!(released.len(), 48, "SHA-384 of migration {version}");
                let current = Migration::new(
                    version,
                    "".into(),
                    MigrationType::Simple,
                    sql.into_sql_str(),
                    false,
                );
                assert_ne!(&*current.checksum, &released[..], "migration {version}");
                let m = migrator.iter().find(|m| m.version == version).unwrap();
                assert_eq!(&*m.checksum, &released[..], "migration {version}");
            }
        }
    }

    /// A relaxed reservation on PostgreSQL does not wait for the WAL flush — set in the same
    /// round trip as its `BEGIN` — and [`Tx::unrelax`] gives it back the store's setting; a
    /// plain transaction keeps the store's setting throughout. Runs whenever
    /// `TOOLGATE_TEST_DATABASE_URL` is set (under CI=true it must be), in a schema of its own.
    #[tokio::test]
    async fn a_relaxed_postgres_transaction_waits_for_no_flush_until_unrelaxed() {
        let ci = std::env::var("CI").is_ok_and(|v| v == "true" || v == "1");
        let Ok(url) = std::env::var("TOOLGATE_TEST_DATABASE_URL") else {
            assert!(!ci, "CI=true needs TOOLGATE_TEST_DATABASE_URL");
            eprintln!("SKIPPED: TOOLGATE_TEST_DATABASE_URL is not set");
            return;
        };
        let schema = format!("tg_unit_{}", uuid::Uuid::new_v4().simple());
        let opts = ConnectOptions {
            schema: Some(schema.clone()),
            max_connections: 2,
        };
        let pool = Pool::connect(&url, &opts, Durability::Fsync, Migrations::Apply)
            .await
            .unwrap();
        async fn setting(tx: &mut Tx) -> String {
            let row = tx.opt("SHOW synchronous_commit", args![]).await.unwrap();
            row.unwrap().text("synchronous_commit").unwrap()
        }
        let mut relaxed = pool.begin_relaxed().await.unwrap();
        assert_eq!(setting(&mut relaxed).await, "off");
        relaxed.unrelax().await.unwrap();
        assert_eq!(setting(&mut relaxed).await, "on");
        relaxed.commit().await.unwrap();
        let mut plain = pool.begin().await.unwrap();
        assert_eq!(setting(&mut plain).await, "on");
        plain.commit().await.unwrap();
        // The pooled connections are back at the session's setting.
        let mut next = pool.begin().await.unwrap();
        assert_eq!(setting(&mut next).await, "on");
        next.commit().await.unwrap();
        pool.execute_raw(&format!("DROP SCHEMA \"{schema}\" CASCADE"))
            .await
            .unwrap();
    }

    /// Every `.sql` file of a backend's folder is a migration, in version order, with the SQL
    /// of the file as it is on disk (what sqlx checksums): a new file is never left out.
    #[test]
    fn every_migration_file_is_embedded_as_it_is_on_disk() {
        for (dir, migrator) in [
            ("sqlite", &*SQLITE_MIGRATIONS),
            ("postgres", &*PG_MIGRATIONS),
        ] {
            let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
                .join("migrations")
                .join(dir);
            let mut on_disk: Vec<_> = std::fs::read_dir(&dir)
                .unwrap()
                .map(|e| e.unwrap().path())
                .filter(|p| p.extension().is_some_and(|x| x == "sql"))
                .collect();
            on_disk.sort();
            let embedded: Vec<_> = migrator.iter().collect();
            assert_eq!(embedded.len(), on_disk.len(), "{}", dir.display());
            for (m, file) in embedded.iter().zip(&on_disk) {
                let name = file.file_name().unwrap().to_str().unwrap();
                let version: i64 = name.split('_').next().unwrap().parse().unwrap();
                assert_eq!(m.version, version, "{name}");
                let sql = std::fs::read_to_string(file).unwrap();
                assert_eq!(m.sql.as_str(), sql, "{name}");
            }
            assert!(embedded.windows(2).all(|w| w[0].version < w[1].version));
        }
    }
}
