//! Shared test support: one database per test on either backend, the fixture registry, and a
//! recording fake handler.

#![allow(dead_code)]

use std::collections::{HashMap, HashSet};
use std::io::Write as _;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use serde_json::{Value, json};
use toolgate_core::{ApprovalKeys, FixedClock, Registry, Timestamp};
use toolgate_store::{
    BoxFuture, CallMeta, ConnectOptions, Executor, Handler, HandlerError, HandlerOutput, Store,
    StoreConfig, Target,
};

pub const T0: Timestamp = Timestamp::from_millis(1_780_000_000_000);

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backend {
    Sqlite,
    Postgres,
}

pub fn pg_url() -> String {
    std::env::var("TOOLGATE_TEST_DATABASE_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".to_string())
}

pub fn ci() -> bool {
    std::env::var("CI").is_ok_and(|v| v == "true")
}

/// One test's database: a SQLite file in a temp dir, or a fresh PostgreSQL schema that is
/// dropped when this value is.
pub struct TestDb {
    pub backend: Backend,
    pub url: String,
    pub schema: Option<String>,
    pub dir: tempfile::TempDir,
}

impl TestDb {
    /// `None` (with a notice) when PostgreSQL is unreachable outside CI.
    pub async fn new(backend: Backend) -> Option<TestDb> {
        let dir = tempfile::tempdir().expect("temp dir");
        match backend {
            Backend::Sqlite => Some(TestDb {
                backend,
                url: format!("sqlite://{}", dir.path().join("toolgate.db").display()),
                schema: None,
                dir,
            }),
            Backend::Postgres => {
                let url = pg_url();
                let probe = sqlx::PgPool::connect(&url).await;
                match probe {
                    Ok(p) => p.close().await,
                    Err(e) => {
                        if ci() {
                            panic!("CI=true and PostgreSQL at {url} is unreachable: {e}");
                        }
                        eprintln!("NOTICE: skipping PostgreSQL test: {url} unreachable ({e})");
                        return None;
                    }
                }
                let schema = format!("tg_test_{}", uuid::Uuid::new_v4().simple());
                Some(TestDb {
                    backend,
                    url,
                    schema: Some(schema),
                    dir,
                })
            }
        }
    }

    pub fn options(&self, max_connections: u32) -> ConnectOptions {
        ConnectOptions {
            schema: self.schema.clone(),
            max_connections,
        }
    }

    pub async fn store(&self, cfg: StoreConfig) -> Store {
        Store::connect_with(&self.url, cfg, self.options(8))
            .await
            .expect("connect")
    }
}

/// A run's counts as the triggers keep them, or as counted from its steps: (run, tool, tier,
/// outcome, n), sorted.
type Counts = Vec<(String, String, String, String, i64)>;

const KEPT_COUNTS: &str = "SELECT run_id, tool, tier, outcome, n FROM step_tally WHERE n > 0 \
     ORDER BY run_id, tool, tier, outcome";
const COUNTED: &str = "SELECT run_id, tool, tier, \
     CASE status WHEN 'refused' THEN 'denied' WHEN 'needs_approval' THEN 'gated' \
     ELSE 'allowed' END AS outcome, COUNT(*) AS n FROM steps \
     WHERE kind <> 'compensation' AND status NOT IN ('pending', 'failed') \
     GROUP BY 1, 2, 3, 4 ORDER BY 1, 2, 3, 4";

impl TestDb {
    /// Whatever the test did to its steps, the counts the triggers keep (`step_tally`, which
    /// deciding a direct call reads) are the counts of the steps themselves. Nothing to check
    /// when the test made no store.
    pub async fn assert_step_tally_exact(&self) {
        let (kept, counted): (sqlx::Result<Counts>, sqlx::Result<Counts>) = match &self.schema {
            None => {
                let opts = sqlx::sqlite::SqliteConnectOptions::new()
                    .filename(self.dir.path().join("toolgate.db"))
                    .create_if_missing(false);
                let Ok(pool) = sqlx::SqlitePool::connect_with(opts).await else {
                    return;
                };
                let kept = sqlx::query_as(KEPT_COUNTS).fetch_all(&pool).await;
                let counted = sqlx::query_as(COUNTED).fetch_all(&pool).await;
                pool.close().await;
                (kept, counted)
            }
            Some(schema) => {
                let Ok(pool) = sqlx::PgPool::connect(&self.url).await else {
                    return;
                };
                let mut c = pool.acquire().await.expect("a connection");
                let set = format!("SET search_path TO \"{schema}\"");
                sqlx::raw_sql(sqlx::AssertSqlSafe(set))
                    .execute(&mut *c)
                    .await
                    .expect("search_path");
                let kept = sqlx::query_as(KEPT_COUNTS).fetch_all(&mut *c).await;
                let counted = sqlx::query_as(COUNTED).fetch_all(&mut *c).await;
                drop(c);
                pool.close().await;
                (kept, counted)
            }
        };
        let (kept, counted) = match (kept, counted) {
            (Ok(kept), Ok(counted)) => (kept, counted),
            // Neither table: the test made no store.
            (Err(_), Err(_)) => return,
            (kept, counted) => panic!("reading the counts failed: {kept:?} / {counted:?}"),
        };
        assert_eq!(
            kept, counted,
            "step_tally (left) drifted from the steps (right)"
        );
    }
}

impl Drop for TestDb {
    fn drop(&mut self) {
        if let Some(schema) = self.schema.take() {
            let url = self.url.clone();
            // A fresh runtime on its own thread: Drop cannot await.
            let _ = std::thread::spawn(move || {
                let rt = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                    .unwrap();
                rt.block_on(async move {
                    if let Ok(p) = sqlx::PgPool::connect(&url).await {
                        let _ = sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
                            "DROP SCHEMA IF EXISTS \"{schema}\" CASCADE"
                        )))
                        .execute(&p)
                        .await;
                        p.close().await;
                    }
                });
            })
            .join();
        }
    }
}

pub fn registry() -> Arc<Registry> {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/registry");
    Arc::new(Registry::load(&dir).unwrap_or_else(|e| panic!("fixture registry: {e}")))
}

pub fn keys() -> Arc<ApprovalKeys> {
    Arc::new(ApprovalKeys::new("k1", vec![7u8; 32]))
}

/// How the fake answers a tool.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    Ok,
    /// The call lands, but the answer never comes back.
    TimeoutAfterLanding,
    Fail,
    /// Stopped on its way out: the upstream no longer serves the tool at its pinned
    /// definition. Nothing is sent, so nothing lands.
    NotPinned,
}

/// A fake upstream that records every call it receives (tool and idempotency key), answers
/// `*.lookup` tools by key from what landed, and can also append each call to a file so a
/// killed process's calls are still counted.
#[derive(Default)]
pub struct Recorder {
    pub calls: Mutex<Vec<(String, String, Value)>>,
    pub landed: Mutex<HashSet<String>>,
    pub modes: Mutex<HashMap<String, Mode>>,
    pub log: Option<PathBuf>,
    pub gate: Option<Arc<tokio::sync::Notify>>,
    /// Notified when a call has arrived (before waiting on `gate`).
    pub entered: Option<Arc<tokio::sync::Notify>>,
}

impl Recorder {
    pub fn new() -> Arc<Recorder> {
        Arc::new(Recorder::default())
    }
    pub fn with_log(path: PathBuf) -> Arc<Recorder> {
        Arc::new(Recorder {
            log: Some(path),
            ..Recorder::default()
        })
    }
    pub fn set(&self, tool: &str, mode: Mode) {
        self.modes.lock().unwrap().insert(tool.to_string(), mode);
    }
    /// Calls of `tool` (lookups excluded unless asked for).
    pub fn count(&self, tool: &str) -> usize {
        self.calls
            .lock()
            .unwrap()
            .iter()
            .filter(|c| c.0 == tool)
            .count()
    }
    pub fn keys_of(&self, tool: &str) -> Vec<String> {
        self.calls
            .lock()
            .unwrap()
            .iter()
            .filter(|c| c.0 == tool)
            .map(|c| c.1.clone())
            .collect()
    }
    pub fn tools(&self) -> Vec<String> {
        self.calls
            .lock()
            .unwrap()
            .iter()
            .map(|c| c.0.clone())
            .collect()
    }
    fn landed_keys(&self) -> HashSet<String> {
        let mut set = self.landed.lock().unwrap().clone();
        if let Some(log) = &self.log
            && let Ok(text) = std::fs::read_to_string(log)
        {
            for line in text.lines() {
                if let Some((_, key)) = line.split_once(' ') {
                    set.insert(key.to_string());
                }
            }
        }
        set
    }
}

impl Recorder {
    /// The inputs of every call that landed (this process's and, through the log, a killed
    /// one's), oldest first.
    fn landed_inputs(&self) -> Vec<Value> {
        if let Some(log) = &self.log {
            return std::fs::read_to_string(log.with_extension("inputs"))
                .unwrap_or_default()
                .lines()
                .filter_map(|l| serde_json::from_str(l).ok())
                .collect();
        }
        self.calls
            .lock()
            .unwrap()
            .iter()
            .map(|c| c.2.clone())
            .collect()
    }
}

impl Handler for Recorder {
    fn call<'a>(
        &'a self,
        target: &'a Target,
        inputs: &'a Value,
        meta: &'a CallMeta,
    ) -> BoxFuture<'a, Result<HandlerOutput, HandlerError>> {
        Box::pin(async move {
            if target.tool.ends_with(".transactions") {
                // A reconciling query: every call that landed, with its inputs.
                return Ok(HandlerOutput {
                    result: json!({"transactions": self.landed_inputs()}),
                    target_ref: None,
                });
            }
            if target.tool.ends_with(".lookup") {
                let key = inputs["idempotency_key"]
                    .as_str()
                    .unwrap_or_default()
                    .to_string();
                let found = self.landed_keys().contains(&key);
                return Ok(HandlerOutput {
                    result: json!({"found": found}),
                    target_ref: found.then(|| format!("REF-{}", &key[7..19])),
                });
            }
            if self.modes.lock().unwrap().get(&target.tool) == Some(&Mode::NotPinned) {
                return Err(HandlerError::NotPinned(format!(
                    "'{}' is not served at its pinned definition",
                    target.tool
                )));
            }
            if let Some(e) = &self.entered {
                e.notify_one();
            }
            if let Some(g) = &self.gate {
                g.notified().await;
            }
            let key = meta.idempotency_key.to_string();
            self.calls
                .lock()
                .unwrap()
                .push((target.tool.clone(), key.clone(), inputs.clone()));
            self.landed.lock().unwrap().insert(key.clone());
            if let Some(log) = &self.log {
                let mut f = std::fs::OpenOptions::new()
                    .create(true)
                    .append(true)
                    .open(log)
                    .unwrap();
                // One write per line, so concurrent appenders never interleave.
                f.write_all(format!("{} {}\n", target.tool, key).as_bytes())
                    .unwrap();
                f.sync_all().unwrap();
                let mut f = std::fs::OpenOptions::new()
                    .create(true)
                    .append(true)
                    .open(log.with_extension("inputs"))
                    .unwrap();
                f.write_all(format!("{}\n", inputs).as_bytes()).unwrap();
                f.sync_all().unwrap();
            }
            let mode = self
                .modes
                .lock()
                .unwrap()
                .get(&target.tool)
                .copied()
                .unwrap_or(Mode::Ok);
            match mode {
                Mode::Ok => Ok(HandlerOutput {
                    result: json!({"ok": true, "tool": target.tool}),
                    target_ref: Some(format!("REF-{}", &key[7..19])),
                }),
                Mode::TimeoutAfterLanding => Err(HandlerError::Timeout),
                Mode::Fail => Err(HandlerError::Failed(
                    "the target refused: account closed".into(),
                )),
                Mode::NotPinned => unreachable!("returned before it was sent"),
            }
        })
    }
}

pub fn clock() -> Arc<FixedClock> {
    Arc::new(FixedClock::at(T0))
}

pub fn executor(store: &Store, handler: Arc<dyn Handler>, clock: Arc<FixedClock>) -> Executor {
    Executor::new(store.clone(), registry(), keys(), handler, clock)
}

/// Declares each named `async fn NAME(db: &TestDb)` of the calling file as two tests, one per
/// backend: `sqlite::NAME` and `postgres::NAME` (which runs whenever PostgreSQL is reachable,
/// and under CI=true must be; see [`TestDb::new`]).
#[allow(unused_macros)]
macro_rules! both_backends {
    ($($name:ident),* $(,)?) => {
        mod sqlite {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $name() {
                    let db = super::TestDb::new(super::Backend::Sqlite).await.unwrap();
                    super::$name(&db).await;
                    db.assert_step_tally_exact().await;
                }
            )*
        }
        mod postgres {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $name() {
                    let Some(db) = super::TestDb::new(super::Backend::Postgres).await else { return };
                    super::$name(&db).await;
                    db.assert_step_tally_exact().await;
                }
            )*
        }
    };
}
