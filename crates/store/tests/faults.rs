//! Faults: four workers racing over one queue, and a worker killed with SIGKILL between
//! reserving and calling, and between calling and recording. Each runs on both backends.

use std::collections::HashMap;
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::common::*;
use serde_json::json;
use toolgate_core::{StepStatus, SystemClock};
use toolgate_store::{Actor, Executor, PlannedStep, Store, StoreConfig, SyncPoint};

fn step(principal: &str, tool: &str, inputs: serde_json::Value) -> PlannedStep {
    PlannedStep {
        tool: tool.into(),
        inputs,
        principal: principal.into(),
        purpose: Some("ops".into()),
        reason: Some("fault test".into()),
        evidence: vec![],
        actor: Actor::default(),
    }
}

// ------------------------------------------------------------------ concurrency

async fn four_workers_execute_each_step_once(backend: Backend) {
    let Some(db) = TestDb::new(backend).await else {
        return;
    };
    let setup = db.store(StoreConfig::default()).await;
    let reg = registry();
    // 1,000 steps: half for child-a, half for child-b (400 each), whose parent allows 600.
    for r in 0..100 {
        let steps: Vec<PlannedStep> = (0..10)
            .map(|i| {
                let who = if (r + i) % 2 == 0 {
                    "child-a"
                } else {
                    "child-b"
                };
                step(
                    who,
                    "ticket.update",
                    json!({"ticket_id": format!("T-{}", r * 10 + i), "status": "closed"}),
                )
            })
            .collect();
        setup
            .create_run(&reg, &"capped-lead".into(), Some("ops"), &steps, T0)
            .await
            .unwrap();
    }
    let fake = Recorder::new();
    let mut workers = Vec::new();
    for _ in 0..4 {
        // Each worker has its own pool (its own connections) and its own group-commit writer.
        let store = Store::connect_with(&db.url, StoreConfig::default(), db.options(4))
            .await
            .unwrap();
        let ex = executor(&store, fake.clone(), clock());
        workers.push(tokio::spawn(async move {
            let mut n = 0;
            loop {
                let b = ex.run_batch(8).await.unwrap();
                if b.is_empty() {
                    return n;
                }
                n += b.len();
            }
        }));
    }
    let mut claimed = Vec::new();
    for w in workers {
        claimed.push(w.await.unwrap());
    }
    assert_eq!(
        claimed.iter().sum::<usize>(),
        1000,
        "every step claimed exactly once: {claimed:?}"
    );

    // Every executed step was executed exactly once.
    let keys = fake.keys_of("ticket.update");
    let mut per_key: HashMap<&String, usize> = HashMap::new();
    for k in &keys {
        *per_key.entry(k).or_default() += 1;
    }
    assert!(per_key.values().all(|&n| n == 1), "a key was called twice");
    assert_eq!(
        keys.len(),
        600,
        "the parent's budget of 600 bounds the tree"
    );

    let counts: HashMap<StepStatus, i64> =
        setup.status_counts().await.unwrap().into_iter().collect();
    assert_eq!(counts.get(&StepStatus::Done), Some(&600));
    assert_eq!(counts.get(&StepStatus::Refused), Some(&400));
    let used = setup.budget_use(T0).await.unwrap();
    let get = |p: &str| {
        used.iter()
            .find(|u| u.principal == p)
            .map(|u| u.used)
            .unwrap_or(0)
    };
    assert_eq!(get("capped-lead"), 600, "no overrun");
    assert!(get("child-a") <= 400 && get("child-b") <= 400);
    // Four writers appended to one chain.
    let report = setup.verify_chain().await.unwrap();
    assert!(report.is_intact(), "{report}");
    assert_eq!(report.records, 1000);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn four_workers_execute_each_step_once_postgres() {
    four_workers_execute_each_step_once(Backend::Postgres).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn four_workers_execute_each_step_once_sqlite() {
    four_workers_execute_each_step_once(Backend::Sqlite).await;
}

// ------------------------------------------------------------------ crash

/// The child half of the crash tests: runs one claimed step and stops dead at the sync point
/// named in `TG_CRASH_POINT` until the parent kills it. Does nothing when run normally.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn crash_child() {
    let Ok(url) = std::env::var("TG_CRASH_URL") else {
        return;
    };
    let schema = std::env::var("TG_CRASH_SCHEMA")
        .ok()
        .filter(|s| !s.is_empty());
    let point = match std::env::var("TG_CRASH_POINT").unwrap().as_str() {
        "reserved" => SyncPoint::Reserved,
        _ => SyncPoint::Called,
    };
    let mark = std::env::var("TG_CRASH_MARK").unwrap();
    let log = std::env::var("TG_CRASH_LOG").unwrap();
    let cfg = StoreConfig {
        lease: Duration::from_millis(1),
        ..StoreConfig::default()
    };
    let store = Store::connect_with(
        &url,
        cfg,
        toolgate_store::ConnectOptions {
            schema,
            max_connections: 2,
        },
    )
    .await
    .unwrap();
    let reg = match std::env::var("TG_CRASH_REGISTRY")
        .ok()
        .filter(|s| !s.is_empty())
    {
        Some(dir) => Arc::new(toolgate_core::Registry::load(dir).unwrap()),
        None => registry(),
    };
    let mut ex = Executor::new(
        store,
        reg,
        keys(),
        Recorder::with_log(log.into()),
        Arc::new(SystemClock),
    );
    ex.hook = Some(Arc::new(move |at| {
        if at == point {
            std::fs::write(&mark, b"here").unwrap();
            loop {
                std::thread::sleep(Duration::from_secs(60));
            }
        }
    }));
    ex.run_batch(1).await.unwrap();
    panic!("the child was not stopped at its sync point");
}

fn wait_for(path: &Path, child: &mut std::process::Child) {
    let start = Instant::now();
    while !path.exists() {
        if let Some(status) = child.try_wait().unwrap() {
            let mut out = String::new();
            use std::io::Read as _;
            if let Some(mut e) = child.stderr.take() {
                let _ = e.read_to_string(&mut out);
            }
            panic!("the child exited ({status}) before its sync point: {out}");
        }
        assert!(
            start.elapsed() < Duration::from_secs(120),
            "the child never reached its sync point"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

async fn crash_at(backend: Backend, point: &str) {
    crash_at_with(backend, point, false).await
}

/// As `crash_at`, with `bank`: the payment is a transfer of a bank without lookups by key,
/// whose `reconcile_query` lists recent transactions and matches the call's inputs.
async fn crash_at_with(backend: Backend, point: &str, bank: bool) {
    let Some(db) = TestDb::new(backend).await else {
        return;
    };
    // The killed worker's call cannot land late (its target died with it): "not found" is
    // believed at once.
    let store = db
        .store(StoreConfig {
            reconcile_quiet: Some(Duration::ZERO),
            ..StoreConfig::default()
        })
        .await;
    let bank_dir = crate::bank::bank_registry_dir();
    let reg = if bank {
        Arc::new(toolgate_core::Registry::load(&bank_dir).unwrap())
    } else {
        registry()
    };
    let pay = |inv: &str, amount: f64| {
        if bank {
            step(
                "worker",
                "bank.send_money",
                json!({"recipient": "GB29NWBK60161331926819", "amount": amount,
                       "subject": format!("invoice {inv}"), "date": "2026-11-30"}),
            )
        } else {
            step(
                "worker",
                "payment.send",
                json!({"invoice_id": inv, "amount": amount, "currency": "EUR", "iban": "X"}),
            )
        }
    };
    let run = store
        .create_run(
            &reg,
            &"worker".into(),
            Some("ops"),
            &[
                pay("INV-1", 100.0),
                pay("INV-2", 200.0),
                pay("INV-3", 300.0),
            ],
            T0,
        )
        .await
        .unwrap();
    let log = db.dir.path().join("calls.log");
    let mark = db.dir.path().join("mark");
    let mut child = Command::new(std::env::current_exe().unwrap())
        .args([
            "faults::crash_child",
            "--exact",
            "--nocapture",
            "--test-threads=1",
        ])
        .env("TG_CRASH_URL", &db.url)
        .env("TG_CRASH_SCHEMA", db.schema.clone().unwrap_or_default())
        .env("TG_CRASH_POINT", point)
        .env("TG_CRASH_MARK", &mark)
        .env("TG_CRASH_LOG", &log)
        .env(
            "TG_CRASH_REGISTRY",
            if bank {
                bank_dir.clone()
            } else {
                Default::default()
            },
        )
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    wait_for(&mark, &mut child);
    child.kill().unwrap(); // SIGKILL
    child.wait().unwrap();

    let calls_before = std::fs::read_to_string(&log).unwrap_or_default();
    let crashed_called = calls_before.lines().count();
    assert_eq!(crashed_called, if point == "called" { 1 } else { 0 });
    let steps = store.steps(&run).await.unwrap();
    assert_eq!(
        steps
            .iter()
            .filter(|s| s.status == StepStatus::Running)
            .count(),
        1
    );

    // Restart: a new process would do exactly this.
    tokio::time::sleep(Duration::from_millis(20)).await;
    let ex = Executor::new(
        store.clone(),
        reg.clone(),
        keys(),
        Recorder::with_log(log.clone()),
        Arc::new(SystemClock),
    );
    let recovered = ex.recover_stale().await.unwrap();
    assert_eq!(recovered.len(), 1);
    assert_eq!(
        recovered[0].status,
        StepStatus::Unknown,
        "an irreversible call is never re-run blind"
    );
    let settled = ex.reconcile().await.unwrap();
    assert_eq!(settled.len(), 1);
    if bank {
        assert_eq!(
            settled[0].outcome.as_ref().unwrap().rule.as_deref(),
            Some("reconciled.bank.transactions"),
            "settled by the reconciling query"
        );
    }
    let expected = if point == "called" {
        StepStatus::Done
    } else {
        StepStatus::Failed
    };
    assert_eq!(settled[0].status, expected, "the target's answer decides");
    ex.drain().await.unwrap();

    let steps = store.steps(&run).await.unwrap();
    assert!(
        steps.iter().all(|s| s.status == StepStatus::Done),
        "{:?}",
        steps.iter().map(|s| s.status).collect::<Vec<_>>()
    );
    let text = std::fs::read_to_string(&log).unwrap();
    let mut per_key: HashMap<&str, usize> = HashMap::new();
    for line in text.lines() {
        *per_key.entry(line.split_once(' ').unwrap().1).or_default() += 1;
    }
    assert_eq!(per_key.len(), 3, "every step executed");
    assert!(
        per_key.values().all(|&n| n == 1),
        "nothing executed twice: {text}"
    );
    let report = store.verify_chain().await.unwrap();
    assert!(report.is_intact(), "{report}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn crash_between_reserve_and_call_sqlite() {
    crash_at(Backend::Sqlite, "reserved").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn crash_between_call_and_record_sqlite() {
    crash_at(Backend::Sqlite, "called").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn crash_between_reserve_and_call_postgres() {
    crash_at(Backend::Postgres, "reserved").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn crash_between_call_and_record_postgres() {
    crash_at(Backend::Postgres, "called").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn crash_between_call_and_record_reconciled_by_query_sqlite() {
    crash_at_with(Backend::Sqlite, "called", true).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn crash_between_reserve_and_call_reconciled_by_query_sqlite() {
    crash_at_with(Backend::Sqlite, "reserved", true).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn crash_between_call_and_record_reconciled_by_query_postgres() {
    crash_at_with(Backend::Postgres, "called", true).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn crash_between_reserve_and_call_reconciled_by_query_postgres() {
    crash_at_with(Backend::Postgres, "reserved", true).await;
}
