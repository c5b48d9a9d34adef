//! Throughput of the store with durability on (SQLite WAL + synchronous=FULL; PostgreSQL
//! defaults): audit appends per second through the group-commit writer, and full governed step
//! executions (claim → decide → reserve → call a no-op handler → record + audit) per second.
//!
//! Also direct governed calls (the gateway's `tools/call` path: decide → reserve → no-op
//! handler → record + audit, each call in its own run) at 1, 8 and 32 concurrent callers,
//! with per-call latency.
//!
//! cargo bench -p toolgate-store --bench store            (SQLite, and PostgreSQL if reachable)
//! env: TOOLGATE_BENCH_STEPS (default 20000), TOOLGATE_BENCH_BATCH (steps claimed per
//! transaction, default 256), TOOLGATE_BENCH_ONLY=direct|steps|audit, TOOLGATE_TEST_DATABASE_URL

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use toolgate_core::{ApprovalKeys, Registry, StepStatus, SystemClock, Timestamp};
use toolgate_store::{
    Actor, AuditDraft, BoxFuture, CallMeta, ConnectOptions, DirectCall, Executor, Handler,
    HandlerError, HandlerOutput, PlannedStep, Store, StoreConfig, Target,
};

struct Noop;

impl Handler for Noop {
    fn call<'a>(
        &'a self,
        _target: &'a Target,
        _inputs: &'a Value,
        _meta: &'a CallMeta,
    ) -> BoxFuture<'a, Result<HandlerOutput, HandlerError>> {
        Box::pin(async { Ok(HandlerOutput::default()) })
    }
}

#[path = "../tests/shared/draft.rs"]
mod shared;

fn draft(i: usize) -> AuditDraft {
    shared::draft("bench", i as i64)
}

struct Target_ {
    name: &'static str,
    url: String,
    schema: Option<String>,
}

async fn connect(t: &Target_, pool: u32) -> Store {
    let cfg = StoreConfig {
        claim_batch: 256,
        ..StoreConfig::default()
    };
    Store::connect_with(
        &t.url,
        cfg,
        ConnectOptions {
            schema: t.schema.clone(),
            max_connections: pool,
        },
    )
    .await
    .expect("connect")
}

async fn bench_audit(t: &Target_, n: usize) {
    let store = connect(t, 8).await;
    // One caller at a time: every append waits for its own commit.
    let seq_n = 300;
    let start = Instant::now();
    for i in 0..seq_n {
        store.append_audit_grouped(draft(i)).await.unwrap();
    }
    let one = seq_n as f64 / start.elapsed().as_secs_f64();
    // Many concurrent callers: the writer folds them into group commits.
    let start = Instant::now();
    let mut set = tokio::task::JoinSet::new();
    let per = n / 256;
    for w in 0..256 {
        let s = store.clone();
        set.spawn(async move {
            for i in 0..per {
                s.append_audit_grouped(draft(w * per + i)).await.unwrap();
            }
        });
    }
    while set.join_next().await.is_some() {}
    let many = (per * 256) as f64 / start.elapsed().as_secs_f64();
    let report = store.verify_chain().await.unwrap();
    assert!(report.is_intact());
    println!(
        "{:<8} audit appends/s: {:>8.0} (1 caller, a commit each)   {:>8.0} (256 callers, group commit)   chain of {} verified",
        t.name, one, many, report.records
    );
}

async fn bench_steps(t: &Target_, reg: &Arc<Registry>, n: usize, workers: usize, tool: &str) {
    let setup = connect(t, 8).await;
    let runs = n / 10;
    let mut tasks = tokio::task::JoinSet::new();
    for r in 0..runs {
        let s = setup.clone();
        let reg = reg.clone();
        let tool = tool.to_string();
        tasks.spawn(async move {
            let steps: Vec<PlannedStep> = (0..10)
                .map(|i| PlannedStep {
                    tool: tool.clone(),
                    inputs: if tool == "ticket.update" {
                        json!({"ticket_id": format!("T-{}", r * 10 + i), "status": "closed"})
                    } else {
                        json!({"ticket_id": format!("T-{}", r * 10 + i)})
                    },
                    principal: "worker".into(),
                    purpose: Some("ops".into()),
                    reason: Some("bench".into()),
                    evidence: vec![],
                    actor: Actor::default(),
                })
                .collect();
            s.create_run(
                &reg,
                &"worker".into(),
                Some("ops"),
                &steps,
                SystemClock.now_ts(),
            )
            .await
            .unwrap();
        });
        if tasks.len() >= 32 {
            tasks.join_next().await;
        }
    }
    while tasks.join_next().await.is_some() {}

    let keys = Arc::new(ApprovalKeys::new("k1", vec![7u8; 32]));
    let batch: usize = std::env::var("TOOLGATE_BENCH_BATCH")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(256);
    let start = Instant::now();
    let mut set = tokio::task::JoinSet::new();
    for _ in 0..workers {
        let store = connect(t, 4).await;
        let ex = Executor::new(
            store,
            reg.clone(),
            keys.clone(),
            Arc::new(Noop),
            Arc::new(SystemClock),
        );
        set.spawn(async move {
            let mut done = 0usize;
            loop {
                let b = ex.run_batch(batch).await.unwrap();
                if b.is_empty() {
                    return done;
                }
                done += b.iter().filter(|r| r.status == StepStatus::Done).count();
            }
        });
    }
    let mut done = 0;
    while let Some(r) = set.join_next().await {
        done += r.unwrap();
    }
    let secs = start.elapsed().as_secs_f64();
    assert_eq!(done, runs * 10, "every step done");
    println!(
        "{:<8} governed step executions/s ({tool}, {workers} worker(s), {n} steps): {:>8.0}   ({:.2} s)",
        t.name,
        done as f64 / secs,
        secs
    );
}

/// `n` direct calls of `tool` by `callers` concurrent callers, each call in its own run.
async fn bench_direct(t: &Target_, reg: &Arc<Registry>, n: usize, callers: usize, tool: &str) {
    let store = connect(t, 8).await;
    let ex = Executor::new(
        store,
        reg.clone(),
        Arc::new(ApprovalKeys::new("k1", vec![7u8; 32])),
        Arc::new(Noop),
        Arc::new(SystemClock),
    );
    let per = n / callers;
    let start = Instant::now();
    let mut set = tokio::task::JoinSet::new();
    for c in 0..callers {
        let ex = ex.clone();
        let tool = tool.to_string();
        set.spawn(async move {
            let mut lat = Vec::with_capacity(per);
            for i in 0..per {
                let call = DirectCall {
                    principal: "worker".into(),
                    tool: tool.clone(),
                    inputs: json!({"ticket_id": format!("T-{}", c * per + i)}),
                    run_id: format!("direct-{c}-{i}").into(),
                    purpose: Some("ops".into()),
                    reason: Some("bench".into()),
                    purpose_from: None,
                    argument_errors: Vec::new(),
                    evidence: vec![],
                    approvals: vec![],
                    actor: Actor::default(),
                };
                let t0 = Instant::now();
                let r = ex.governed_call(call).await.unwrap();
                assert_eq!(r.status, toolgate_store::CallStatus::Done, "{r:?}");
                lat.push(t0.elapsed().as_micros() as u64);
            }
            lat
        });
    }
    let mut lat = Vec::with_capacity(n);
    while let Some(r) = set.join_next().await {
        lat.extend(r.unwrap());
    }
    let secs = start.elapsed().as_secs_f64();
    lat.sort_unstable();
    let pct = |p: f64| lat[((lat.len() - 1) as f64 * p).round() as usize];
    println!(
        "{:<8} direct governed calls ({tool}, {callers:>2} caller(s)): {:>8.0} calls/s   p50 {:>6} µs   p99 {:>6} µs",
        t.name,
        lat.len() as f64 / secs,
        pct(0.5),
        pct(0.99)
    );
    ex.store.close().await;
}

trait NowTs {
    fn now_ts(&self) -> Timestamp;
}
impl NowTs for SystemClock {
    fn now_ts(&self) -> Timestamp {
        toolgate_core::Clock::now(self)
    }
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let n: usize = std::env::var("TOOLGATE_BENCH_STEPS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(20_000);
    let reg = Arc::new(
        Registry::load(PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/registry"))
            .expect("fixture registry"),
    );
    let dir = tempfile::tempdir().unwrap();
    let mut targets = Vec::new();
    let sqlite = |name: &str| Target_ {
        name: "sqlite",
        url: format!("sqlite://{}", dir.path().join(name).display()),
        schema: None,
    };
    targets.push(("audit", sqlite("audit.db")));
    let pg_url = std::env::var("TOOLGATE_TEST_DATABASE_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".to_string());
    let pg_up = sqlx::PgPool::connect(&pg_url).await.is_ok();
    let mut schemas = Vec::new();
    let pg = |tag: &str, schemas: &mut Vec<String>| {
        let schema = format!("tg_bench_{tag}_{}", uuid::Uuid::new_v4().simple());
        schemas.push(schema.clone());
        Target_ {
            name: "postgres",
            url: pg_url.clone(),
            schema: Some(schema),
        }
    };
    let only = std::env::var("TOOLGATE_BENCH_ONLY").unwrap_or_default();
    let run = |what: &str| only.is_empty() || only == what;
    if !pg_up {
        println!("postgres unreachable at {pg_url}: skipped");
    }
    if run("direct") {
        for callers in [1, 8, 32] {
            let t = sqlite(&format!("direct-{callers}.db"));
            bench_direct(
                &t,
                &reg,
                n.min(5_000) / callers * callers,
                callers,
                "ticket.read",
            )
            .await;
        }
        if pg_up {
            for callers in [1, 8, 32] {
                let t = pg(&format!("d{callers}"), &mut schemas);
                bench_direct(
                    &t,
                    &reg,
                    n.min(5_000) / callers * callers,
                    callers,
                    "ticket.read",
                )
                .await;
            }
        }
    }
    if run("audit") {
        bench_audit(&targets[0].1, n).await;
        if pg_up {
            bench_audit(&pg("audit", &mut schemas), n).await;
        }
    }
    for tool in ["ticket.update", "ticket.read"] {
        if !run("steps") {
            break;
        }
        for workers in [1, 2] {
            bench_steps(
                &sqlite(&format!("steps-{tool}-{workers}.db")),
                &reg,
                n,
                workers,
                tool,
            )
            .await;
        }
    }
    if pg_up && run("steps") {
        for tool in ["ticket.update", "ticket.read"] {
            for workers in [1, 2] {
                let t = pg(&format!("w{workers}"), &mut schemas);
                bench_steps(&t, &reg, n, workers, tool).await;
            }
        }
    }
    if pg_up {
        let p = sqlx::PgPool::connect(&pg_url).await.unwrap();
        for s in schemas {
            let _ = sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
                "DROP SCHEMA IF EXISTS \"{s}\" CASCADE"
            )))
            .execute(&p)
            .await;
        }
    }
    let _ = Duration::ZERO;
}
