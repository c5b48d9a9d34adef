//! `toolgate-bench scale`: replicas on one PostgreSQL database. Up to three `toolgate serve`
//! processes and two `toolgate worker` processes share a database the bench creates (and drops
//! after) on the given server; the fake ERP runs in the bench. Four phases:
//!
//! 1. **gateway throughput**: the load generator schedules payments through 1, 2 and 3 gateway
//!    replicas for a fixed time (`concurrency` clients spread over the replicas, each payment
//!    its own run) and counts completed calls per second;
//! 2. **budget across replicas**: a principal with a daily spend budget of `budget` asks for
//!    more payments than that, each call delivered to two different gateways at once (a
//!    duplicate delivery across replicas): exactly `budget` may be booked, each once;
//! 3. **workers**: plans with one payment step each go to the queue; one and then two
//!    `toolgate worker` processes execute them, each worker principal with a spend budget
//!    below the number of steps;
//! 4. the audit chain is verified.
//!
//! Every payment the ERP books is counted per run: no run may be booked twice.

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::Context;
use serde::Serialize;
use serde_json::{Value, json};
use tokio::process::Command;
use toolgate_core::registry::api_key_hash;
use toolgate_core::{Clock, SystemClock};
use toolgate_fakes::{FakeServer, FaultPlan, Recorder};
use toolgate_store::{PlanSubmission, PlannedStep, Store};

use crate::crash::{FakeHttp, free_port, spawn_gateway};
use crate::{AMOUNT, Answer, BENCH_KEY, Faulty, Mcp, REASONS, Timing, copy_dir, invoice};

const BUDGETED_KEY: &str = "tgbench_budgeted";

/// Options of `toolgate-bench scale`.
#[derive(Debug, Clone)]
pub struct ScaleOptions {
    pub toolgate: std::path::PathBuf,
    /// A PostgreSQL server URL (the bench creates its own database there).
    pub postgres: String,
    /// Seconds of load per replica count.
    pub secs: u64,
    pub concurrency: usize,
    /// Daily spend budget of the budgeted principal and of each worker principal.
    pub budget: u32,
    /// Payments asked for in the budget phase, and plan steps per worker phase.
    pub requests: u32,
}

#[derive(Debug, Clone, Serialize)]
pub struct Throughput {
    pub replicas: usize,
    pub calls: u64,
    pub errors: u64,
    pub per_sec: f64,
}

#[derive(Debug, Clone, Serialize)]
pub struct BudgetPhase {
    pub requested: u32,
    pub deliveries: u32,
    pub budget: u32,
    pub allowed: u64,
    pub booked_runs: u64,
    pub booked_payments: u64,
    pub runs_booked_twice: u64,
}

#[derive(Debug, Clone, Serialize)]
pub struct WorkerPhase {
    pub workers: usize,
    pub steps: u32,
    pub budget: u32,
    pub done: u64,
    pub refused: u64,
    pub other: u64,
    pub booked_payments: u64,
    pub runs_booked_twice: u64,
    pub secs: f64,
    pub steps_per_sec: f64,
}

#[derive(Debug, Clone, Serialize)]
pub struct ScaleReport {
    pub throughput: Vec<Throughput>,
    pub budget: BudgetPhase,
    pub workers: Vec<WorkerPhase>,
    pub audit_records: u64,
    pub audit_chain_intact: bool,
}

fn add_principals(dir: &Path, budget: u32) -> anyhow::Result<()> {
    let path = dir.join("principals.yaml");
    let mut doc: Value = yaml_serde::from_str(&std::fs::read_to_string(&path)?)?;
    let list = doc["principals"]
        .as_array_mut()
        .context("principals.yaml has no principals list")?;
    list.push(json!({
        "id": "bench-budgeted",
        "kind": "agent",
        "role": "bench.payer",
        "credentials": [{"id": "bench", "sha256": api_key_hash(BUDGETED_KEY)}],
        "grants": [{"scopes": ["payments:write"], "purposes": ["billing"],
                    "max_tier": "spend", "max_sensitivity": "confidential"}],
        "budgets": {"spend": budget},
    }));
    for n in 1..=2 {
        list.push(json!({
            "id": format!("bench-worker-{n}"),
            "kind": "agent",
            "role": "worker.finance",
            "credentials": [{"id": "bench", "sha256": api_key_hash(&format!("tgbench_worker_{n}"))}],
            "grants": [{"scopes": ["payments:write"], "purposes": ["billing"],
                        "max_tier": "spend", "max_sensitivity": "confidential"}],
            "budgets": {"spend": budget},
        }));
    }
    std::fs::write(&path, yaml_serde::to_string(&doc)?)?;
    Ok(())
}

/// The payment of invoice `n` (each payment of the bench is for an invoice of its own).
fn args(n: u64) -> Value {
    json!({"invoice_id": invoice(n), "amount": AMOUNT, "currency": "EUR",
           "value_date": "2026-06-30", "reason": REASONS[0]})
}

/// Runs the phases.
pub async fn run_scale(opts: &ScaleOptions) -> anyhow::Result<ScaleReport> {
    let example = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples/finance");
    let dir = tempfile::tempdir()?;
    copy_dir(&example, dir.path())?;
    crate::prepare_registry(dir.path(), false)?;
    add_principals(dir.path(), opts.budget)?;
    let fake = FakeServer::new(
        Faulty::new(Timing::default(), true),
        Recorder::disabled(),
        FaultPlan::none(),
    );
    let http = FakeHttp::start(fake, None).await?;

    let db = crate::database::BenchDatabase::create(&opts.postgres, "scale").await?;
    let url = db.url.clone();
    let top = dir.path().join("toolgate.yaml");
    let mut config: Value = yaml_serde::from_str(&std::fs::read_to_string(&top)?)?;
    config["upstreams"]["erp"] = json!({
        "url": format!("http://{}/mcp", http.addr),
        "package": config["upstreams"]["erp"]["package"].clone(),
        "timeout_secs": 10.0,
    });
    config["store"] = json!({ "url": url });
    std::fs::write(&top, yaml_serde::to_string(&config)?)?;
    toolgate_gateway::pins::rehome_lock(dir.path())?;

    let result = phases(opts, dir.path(), &http, &url).await;
    http.stop.cancel();
    db.drop().await;
    result
}

async fn phases(
    opts: &ScaleOptions,
    dir: &Path,
    http: &FakeHttp,
    url: &str,
) -> anyhow::Result<ScaleReport> {
    let log = std::env::temp_dir().join("toolgate-bench-scale-gateways.log");
    eprintln!("scale: gateway logs in {}", log.display());
    let mut gateways = Vec::new();
    let mut urls = Vec::new();
    for _ in 0..3 {
        let addr = free_port()?;
        gateways.push(spawn_gateway(&opts.toolgate, dir, addr, &log).await?);
        urls.push(format!("http://{addr}/mcp"));
    }
    let ledger = http.fake.domain();

    // 1. Throughput with 1, 2, 3 replicas.
    let mut throughput = Vec::new();
    for replicas in 1..=3 {
        let calls = Arc::new(AtomicU64::new(0));
        let errors = Arc::new(AtomicU64::new(0));
        let seq = Arc::new(AtomicU64::new(0));
        let stop_at = Instant::now() + Duration::from_secs(opts.secs);
        let mut tasks = Vec::new();
        for c in 0..opts.concurrency {
            let url = urls[c % replicas].clone();
            let (calls, errors, seq) = (calls.clone(), errors.clone(), seq.clone());
            tasks.push(tokio::spawn(async move {
                let client = Mcp::connect(&url, Some(BENCH_KEY)).await?;
                while Instant::now() < stop_at {
                    let n = seq.fetch_add(1, Ordering::Relaxed);
                    let run = format!("scale-r{replicas}-{n}");
                    let meta = json!({"purpose": "billing", "reason": REASONS[0], "run_id": run});
                    let payment = args(replicas as u64 * 1_000_000 + n);
                    match client
                        .call("payment.schedule", payment, meta, Duration::from_secs(30))
                        .await
                    {
                        Answer::Success => calls.fetch_add(1, Ordering::Relaxed),
                        other => {
                            if errors.fetch_add(1, Ordering::Relaxed) == 0 {
                                eprintln!(
                                    "scale: first error with {replicas} replica(s): {other:?}"
                                );
                            }
                            0
                        }
                    };
                }
                client.close().await;
                anyhow::Ok(())
            }));
        }
        let started = Instant::now();
        for t in tasks {
            t.await??;
        }
        let secs = started.elapsed().as_secs_f64();
        let n = calls.load(Ordering::Relaxed);
        eprintln!("scale: {replicas} gateway(s): {n} calls in {secs:.1} s");
        throughput.push(Throughput {
            replicas,
            calls: n,
            errors: errors.load(Ordering::Relaxed),
            per_sec: n as f64 / secs,
        });
    }

    // 2. One budget across three replicas, every call delivered to two of them at once.
    let allowed = Arc::new(AtomicU64::new(0));
    let next = Arc::new(AtomicU64::new(0));
    let mut tasks = Vec::new();
    for c in 0..opts.concurrency {
        let (a_url, b_url) = (urls[c % 3].clone(), urls[(c + 1) % 3].clone());
        let (allowed, next) = (allowed.clone(), next.clone());
        let requests = u64::from(opts.requests);
        tasks.push(tokio::spawn(async move {
            let a = Mcp::connect(&a_url, Some(BUDGETED_KEY)).await?;
            let b = Mcp::connect(&b_url, Some(BUDGETED_KEY)).await?;
            loop {
                let n = next.fetch_add(1, Ordering::Relaxed);
                if n >= requests {
                    break;
                }
                let meta = json!({"purpose": "billing", "reason": REASONS[0],
                                  "run_id": format!("budget-{n}")});
                let payment = args(4_000_000 + n);
                let (x, y) = tokio::join!(
                    a.call(
                        "payment.schedule",
                        payment.clone(),
                        meta.clone(),
                        Duration::from_secs(30)
                    ),
                    b.call("payment.schedule", payment, meta, Duration::from_secs(30)),
                );
                if matches!(x, Answer::Success) || matches!(y, Answer::Success) {
                    allowed.fetch_add(1, Ordering::Relaxed);
                }
            }
            a.close().await;
            b.close().await;
            anyhow::Ok(())
        }));
    }
    for t in tasks {
        t.await??;
    }
    let mut booked_runs = 0;
    let mut booked_payments = 0;
    let mut twice = 0;
    for n in 0..opts.requests {
        let b = ledger.booked(&format!("budget-{n}"));
        booked_runs += u64::from(b > 0);
        booked_payments += u64::from(b);
        twice += u64::from(b > 1);
    }
    let budget = BudgetPhase {
        requested: opts.requests,
        deliveries: opts.requests * 2,
        budget: opts.budget,
        allowed: allowed.load(Ordering::Relaxed),
        booked_runs,
        booked_payments,
        runs_booked_twice: twice,
    };
    eprintln!("scale: budget phase {budget:?}");

    // 3. Workers: 1 then 2 `toolgate worker` processes on queued plans.
    let store = Store::connect(url, Default::default()).await?;
    let registry = toolgate_core::Registry::load(dir)?;
    let mut workers = Vec::new();
    for (n, count) in [(1usize, 1usize), (2, 2)] {
        let worker = format!("bench-worker-{n}");
        for i in 0..opts.requests {
            let sub = PlanSubmission {
                run_id: format!("plan-w{count}-{i}").into(),
                planner: "fin-planner".into(),
                goal: "pay the approved invoice".into(),
                steps: vec![PlannedStep {
                    tool: "payment.schedule".into(),
                    inputs: args(5_000_000 + count as u64 * 100_000 + u64::from(i)),
                    principal: worker.as_str().into(),
                    purpose: Some("billing".into()),
                    reason: Some(REASONS[0].into()),
                    evidence: Vec::new(),
                    actor: Default::default(),
                }],
            };
            store
                .submit_plan(&registry, &sub, SystemClock.now())
                .await?;
        }
        let started = Instant::now();
        let mut procs = Vec::new();
        for _ in 0..count {
            let out = std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(std::env::temp_dir().join("toolgate-bench-scale-workers.log"))?;
            procs.push(
                Command::new(&opts.toolgate)
                    .args(["worker", "--until-idle", "--idle-ms", "200", "-c"])
                    .arg(dir)
                    .env("TOOLGATE_APPROVAL_KEY", crate::crash::APPROVAL_KEY)
                    .env("TOOLGATE_REDACTION_KEY", crate::crash::REDACTION_KEY)
                    .env("RUST_LOG", "warn")
                    .stdout(out.try_clone()?)
                    .stderr(out)
                    .kill_on_drop(true)
                    .spawn()?,
            );
        }
        for mut p in procs {
            p.wait().await?;
        }
        let secs = started.elapsed().as_secs_f64();
        let (mut done, mut refused, mut other, mut booked, mut twice) = (0, 0, 0, 0, 0);
        for i in 0..opts.requests {
            let run = format!("plan-w{count}-{i}");
            for s in store.steps(&run.as_str().into()).await? {
                match s.status {
                    toolgate_core::StepStatus::Done => done += 1,
                    toolgate_core::StepStatus::Refused => refused += 1,
                    _ => other += 1,
                }
            }
            let b = ledger.booked(&run);
            booked += u64::from(b);
            twice += u64::from(b > 1);
        }
        let w = WorkerPhase {
            workers: count,
            steps: opts.requests,
            budget: opts.budget,
            done,
            refused,
            other,
            booked_payments: booked,
            runs_booked_twice: twice,
            secs,
            steps_per_sec: f64::from(opts.requests) / secs,
        };
        eprintln!("scale: worker phase {w:?}");
        workers.push(w);
    }

    let chain = store.verify_chain().await?;
    let audit_records = store.audit_records(None, None).await?.len() as u64;
    store.close().await;
    for mut g in gateways {
        let _ = g.start_kill();
        let _ = g.wait().await;
    }
    Ok(ScaleReport {
        throughput,
        budget,
        workers,
        audit_records,
        audit_chain_intact: chain.is_intact(),
    })
}

/// The scale report as plain text.
pub fn scale_table(r: &ScaleReport) -> String {
    let mut s = String::from(
        "toolgate-bench scale (PostgreSQL)\n\ngateway replicas  calls/s  calls  errors\n",
    );
    for t in &r.throughput {
        s.push_str(&format!(
            "{:>16} {:>8.1} {:>6} {:>7}\n",
            t.replicas, t.per_sec, t.calls, t.errors
        ));
    }
    let b = &r.budget;
    s.push_str(&format!(
        "\nbudget across 3 replicas: {} payments asked ({} deliveries, each call sent to two gateways), spend budget {}: {} allowed, {} runs booked, {} payments booked, {} runs booked twice\n",
        b.requested, b.deliveries, b.budget, b.allowed, b.booked_runs, b.booked_payments, b.runs_booked_twice
    ));
    s.push_str("\nworkers  steps  budget  done  refused  other  booked  booked-twice  steps/s\n");
    for w in &r.workers {
        s.push_str(&format!(
            "{:>7} {:>6} {:>7} {:>5} {:>8} {:>6} {:>7} {:>13} {:>8.1}\n",
            w.workers,
            w.steps,
            w.budget,
            w.done,
            w.refused,
            w.other,
            w.booked_payments,
            w.runs_booked_twice,
            w.steps_per_sec
        ));
    }
    s.push_str(&format!(
        "\naudit chain: {} records, {}\n",
        r.audit_records,
        if r.audit_chain_intact {
            "intact"
        } else {
            "BROKEN"
        }
    ));
    s
}
