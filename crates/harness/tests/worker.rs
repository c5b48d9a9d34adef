//! `toolgate worker` on PostgreSQL: two workers wait on one store with a 60-second idle poll, so
//! only LISTEN/NOTIFY can wake them in time; plans submitted through the gateway are executed
//! exactly once between them; a stop request ends both while they wait.

use std::time::Duration;

use serde_json::{Value, json};
use toolgate_gateway::{WorkerOptions, run_worker};
use toolgate_harness::Environment;
use toolgate_harness::demo::{FIN_PLANNER_KEY, examples_dir, run_status, submit};
use toolgate_harness::planner::{Plan, PlannedCall};
use toolgate_store::WorkOptions;

async fn fresh_database() -> Option<(sqlx::PgPool, String, String)> {
    let admin = std::env::var("TOOLGATE_TEST_DATABASE_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".into());
    let pool = match sqlx::PgPool::connect(&admin).await {
        Ok(p) => p,
        Err(e) if std::env::var("CI").as_deref() != Ok("true") => {
            eprintln!("skipping: no PostgreSQL at {admin} ({e}); under CI=true this fails");
            return None;
        }
        Err(e) => panic!("PostgreSQL must be reachable under CI=true: {e}"),
    };
    let name = format!("tg_worker_{}", std::process::id());
    for sql in [
        format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)"),
        format!("CREATE DATABASE {name}"),
    ] {
        sqlx::query(sqlx::AssertSqlSafe(sql))
            .execute(&pool)
            .await
            .unwrap();
    }
    let (base, _) = admin.rsplit_once('/').expect("a database URL");
    Some((pool, format!("{base}/{name}"), name))
}

/// One read step for the finance worker; `limit` makes each plan's inputs distinct.
fn plan(limit: i64) -> Plan {
    Plan {
        goal: format!("List received invoices, {limit} at most"),
        steps: vec![PlannedCall {
            tool: "invoice.search".into(),
            inputs: json!({"status": "received", "limit": limit}),
            purpose: "billing".into(),
            reason: "See what is waiting for payment.".into(),
            evidence: Vec::new(),
            worker: Some("fin-worker".into()),
        }],
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_workers_on_postgres_wake_on_submission_execute_each_step_once_and_stop_cleanly() {
    let Some((admin, url, name)) = fresh_database().await else {
        return;
    };
    let env = Environment::start(&examples_dir().join("finance"), Some(&url), Vec::new())
        .await
        .expect("the finance example starts on PostgreSQL");
    let (stop, rx) = tokio::sync::watch::channel(false);
    let opts = WorkerOptions {
        config_dir: env.dir.path().to_path_buf(),
        store_url: None,
        work: Some(WorkOptions {
            // Far longer than the test may take: only a notification wakes a waiting worker.
            idle: Duration::from_secs(60),
            ..WorkOptions::default()
        }),
        keys: toolgate_gateway::KeySource::Dev,
    };
    let planner = env.client(FIN_PLANNER_KEY).await.unwrap();
    let drive = async {
        // Let both workers reach their wait first, so the plans must wake them.
        tokio::time::sleep(Duration::from_millis(500)).await;
        let mut runs = Vec::new();
        for limit in 1..=8 {
            runs.push(submit(&planner, &plan(limit), "billing").await.unwrap());
        }
        let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
        loop {
            let mut settled = 0;
            for run in &runs {
                let st: Value = run_status(&planner, run).await.unwrap();
                if st["steps"][0]["status"] == "done" {
                    settled += 1;
                }
            }
            if settled == runs.len() {
                break;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "only {settled} of {} plans ran: the workers were not woken",
                runs.len()
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        stop.send(true).unwrap();
        runs
    };
    let all = tokio::time::timeout(Duration::from_secs(40), async {
        tokio::join!(
            run_worker(&opts, rx.clone()),
            run_worker(&opts, rx.clone()),
            drive
        )
    })
    .await
    .expect("both workers stop when asked, even while waiting");
    let (a, b, runs) = all;
    let (a, b) = (a.unwrap(), b.unwrap());
    assert_eq!(a.executed + b.executed, 8, "{a:?} {b:?}");
    assert_eq!((a.errors, b.errors), (0, 0));
    let searches = env
        .upstream_calls("erp")
        .into_iter()
        .filter(|r| r.tool == "search_invoices")
        .count();
    assert_eq!(
        searches, 8,
        "each planned step reached the ERP exactly once"
    );
    for run in &runs {
        let records = env
            .store()
            .audit_records(None, Some(&run.as_str().into()))
            .await
            .unwrap();
        assert_eq!(records.len(), 1, "one decided attempt per step");
        assert_eq!(records[0].body.who.principal, "fin-worker");
    }
    planner.close().await;
    env.shutdown().await;
    sqlx::query(sqlx::AssertSqlSafe(format!(
        "DROP DATABASE IF EXISTS {name} WITH (FORCE)"
    )))
    .execute(&admin)
    .await
    .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stop_request_lets_the_step_in_hand_finish_and_be_recorded() {
    // The ERP takes 1.5 s per search, so the stop arrives while the step is running.
    let slow = "slow=1500,tool=search_invoices".parse().unwrap();
    let env = Environment::start(&examples_dir().join("finance"), None, vec![slow])
        .await
        .unwrap();
    let planner = env.client(FIN_PLANNER_KEY).await.unwrap();
    let run = submit(&planner, &plan(3), "billing").await.unwrap();
    let (stop, rx) = tokio::sync::watch::channel(false);
    let opts = WorkerOptions {
        config_dir: env.dir.path().to_path_buf(),
        store_url: None,
        work: None,
        keys: toolgate_gateway::KeySource::Dev,
    };
    let drive = async {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        loop {
            let st = run_status(&planner, &run).await.unwrap();
            if st["steps"][0]["status"] == "running" {
                break;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "the step never started: {st}"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        stop.send(true).unwrap();
    };
    let (stats, ()) = tokio::time::timeout(Duration::from_secs(20), async {
        tokio::join!(run_worker(&opts, rx), drive)
    })
    .await
    .expect("the worker stops once the step in hand is recorded");
    let stats = stats.unwrap();
    assert_eq!((stats.executed, stats.done), (1, 1), "{stats:?}");
    let st = run_status(&planner, &run).await.unwrap();
    assert_eq!(st["steps"][0]["status"], "done", "finished, not abandoned");
    let records = env
        .store()
        .audit_records(None, Some(&run.as_str().into()))
        .await
        .unwrap();
    assert_eq!(records.len(), 1);
    assert_eq!(env.upstream_calls("erp").len(), 1);
    planner.close().await;
    env.shutdown().await;
}
