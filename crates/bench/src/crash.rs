//! `toolgate-bench crash`: faults that take a process down mid-step. The gateway is a real
//! `toolgate serve` child process; the fake ERP runs in the bench. Each episode, one at a time:
//! the agent asks to schedule the payment, the ERP holds the delivery (after booking it, or
//! before), and while it is held one of these happens:
//!
//! - `gateway-killed`: the gateway process gets SIGKILL, then a new one starts on the same
//!   store (the SQLite file, or the PostgreSQL database) and port;
//! - `upstream-restart`: the ERP's HTTP server goes down (its sessions and the held request
//!   with it) and comes back on the same port, its ledger intact;
//! - `database-restart` (PostgreSQL only): every connection of the store is terminated
//!   (`pg_terminate_backend` on the bench's own database; the server keeps running).
//!
//! The agent then retries up to three times, reconnecting each time. Afterwards a reconciler
//! (the executor a `toolgate worker` runs, in this process on the same store) settles what
//! the crash left: `recover_stale` turns a step whose lease expired into `unknown`, and
//! `reconcile` asks the ERP by key. The lease is the store's 5 minutes; rather than wait, the
//! reconciler's clock reads 5 minutes later. Scored per episode: payments booked (must be at
//! most one), steps not in a final state, steps whose record contradicts the ledger, steps
//! without an audit record; and the audit chain at the end.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;
use rmcp::transport::StreamableHttpServerConfig;
use rmcp::transport::StreamableHttpService;
use rmcp::transport::streamable_http_server::session::local::LocalSessionManager;
use serde::Serialize;
use serde_json::{Value, json};
use tokio::process::{Child, Command};
use tokio_util::sync::CancellationToken;
use toolgate_core::config::Durability;
use toolgate_core::{Clock, StepStatus, Timestamp};
use toolgate_fakes::{FakeServer, FaultPlan, Recorder};
use toolgate_gateway::{Gateway, ServeOptions};
use toolgate_store::Executor;

use crate::{
    AMOUNT, Answer, BENCH_KEY, Faulty, Hold, Mcp, REASONS, Timing, copy_dir, invoice,
    prepare_registry,
};

/// A fault that takes a process down while a payment is held at the ERP.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Crash {
    GatewayKilled,
    UpstreamRestart,
    DatabaseRestart,
}

impl Crash {
    pub fn name(self) -> &'static str {
        match self {
            Crash::GatewayKilled => "gateway-killed",
            Crash::UpstreamRestart => "upstream-restart",
            Crash::DatabaseRestart => "database-restart",
        }
    }
}

/// Per store × crash × whether the ERP had booked the payment when the crash came.
#[derive(Debug, Clone, Default, Serialize)]
pub struct CrashCell {
    pub episodes: u64,
    pub duplicate_episodes: u64,
    pub missed: u64,
    /// Steps left `running` or `unknown` after the reconciler ran.
    pub undefined_steps: u64,
    pub record_mismatch: u64,
    pub steps_without_audit: u64,
}

#[derive(Debug, Clone, Serialize)]
pub struct CrashReport {
    pub episodes: u64,
    pub durability: Durability,
    pub elapsed_secs: f64,
    /// `store/crash/booked-before|not-booked` → cell.
    pub cells: std::collections::BTreeMap<String, CrashCell>,
    /// `store` → chain intact.
    pub chains: std::collections::BTreeMap<String, (u64, bool)>,
}

/// A clock that reads `ahead` later than the wall clock: the reconciler as it runs once a
/// crashed call's lease has run out.
struct Later(Duration);

impl Clock for Later {
    fn now(&self) -> Timestamp {
        let now = toolgate_core::SystemClock.now();
        Timestamp::from_millis(now.millis() + self.0.as_millis() as i64)
    }
}

pub(crate) struct FakeHttp<D = Faulty> {
    pub(crate) fake: FakeServer<D>,
    pub(crate) addr: std::net::SocketAddr,
    pub(crate) stop: CancellationToken,
    task: tokio::task::JoinHandle<()>,
}

impl<D: toolgate_fakes::Domain> FakeHttp<D> {
    pub(crate) async fn start(
        fake: FakeServer<D>,
        addr: Option<std::net::SocketAddr>,
    ) -> anyhow::Result<FakeHttp<D>> {
        let stop = CancellationToken::new();
        let served = fake.clone();
        let service = StreamableHttpService::new(
            move || Ok(served.clone()),
            Arc::new(LocalSessionManager::default()),
            StreamableHttpServerConfig::default().with_cancellation_token(stop.clone()),
        );
        let app = axum::Router::new().nest_service("/mcp", service);
        let listener = match addr {
            Some(a) => {
                // The port was just released; it may take a moment to be free again.
                let deadline = Instant::now() + Duration::from_secs(10);
                loop {
                    match tokio::net::TcpListener::bind(a).await {
                        Ok(l) => break l,
                        Err(e) if Instant::now() < deadline => {
                            let _ = e;
                            tokio::time::sleep(Duration::from_millis(50)).await;
                        }
                        Err(e) => return Err(e.into()),
                    }
                }
            }
            None => tokio::net::TcpListener::bind("127.0.0.1:0").await?,
        };
        let addr = listener.local_addr()?;
        // TCP_NODELAY, as the fake binary (and Node's and Python's HTTP servers) set it: without
        // it a reply waits for the client's delayed ACK (40 ms).
        let listener = axum::serve::ListenerExt::tap_io(listener, |tcp| {
            let _ = tcp.set_nodelay(true);
        });
        let s = stop.clone();
        let task = tokio::spawn(async move {
            let _ = axum::serve(listener, app)
                .with_graceful_shutdown(async move { s.cancelled().await })
                .await;
        });
        Ok(FakeHttp {
            fake,
            addr,
            stop,
            task,
        })
    }

    /// Down (every session and request in flight dropped) and up again on the same port.
    async fn restart(self) -> anyhow::Result<FakeHttp<D>> {
        self.stop.cancel();
        let _ = tokio::time::timeout(Duration::from_secs(10), self.task).await;
        FakeHttp::start(self.fake, Some(self.addr)).await
    }
}

/// Where the gateway keeps its state.
#[derive(Debug, Clone)]
pub enum StoreKind {
    Sqlite,
    /// A PostgreSQL server URL; the bench creates its own database there and drops it after.
    Postgres(String),
}

impl StoreKind {
    fn name(&self) -> &'static str {
        match self {
            StoreKind::Sqlite => "sqlite",
            StoreKind::Postgres(_) => "postgres",
        }
    }
}

/// Options of `toolgate-bench crash`.
#[derive(Debug, Clone)]
pub struct CrashOptions {
    /// Episodes per store.
    pub episodes: u64,
    /// The `toolgate` binary to run as the gateway.
    pub toolgate: PathBuf,
    pub stores: Vec<StoreKind>,
    /// `store.durability` of the gateway under test.
    pub durability: Durability,
}

pub(crate) const APPROVAL_KEY: &str = "toolgate-bench-crash-approval-key-0123456789";
/// The redaction key the benchmark's processes share (at least 32 bytes, as any key).
pub(crate) const REDACTION_KEY: &str = "toolgate-bench-crash-redaction-key-0123456789";

pub(crate) fn free_port() -> anyhow::Result<std::net::SocketAddr> {
    let l = std::net::TcpListener::bind("127.0.0.1:0")?;
    Ok(l.local_addr()?)
}

pub(crate) async fn spawn_gateway(
    toolgate: &Path,
    dir: &Path,
    addr: std::net::SocketAddr,
    log: &Path,
) -> anyhow::Result<Child> {
    let out = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(log)?;
    let child = Command::new(toolgate)
        .arg("serve")
        .arg("-c")
        .arg(dir)
        .arg("--http")
        .arg(addr.to_string())
        // Planned steps are left to the `toolgate worker` processes the scale bench counts.
        .arg("--no-worker")
        .env("TOOLGATE_APPROVAL_KEY", APPROVAL_KEY)
        .env("TOOLGATE_REDACTION_KEY", REDACTION_KEY)
        .env("RUST_LOG", "warn")
        .stdout(out.try_clone()?)
        .stderr(out)
        .kill_on_drop(true)
        .spawn()
        .with_context(|| format!("starting {}", toolgate.display()))?;
    // Ready when an MCP client can connect.
    let url = format!("http://{addr}/mcp");
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        if let Ok(c) = Mcp::connect(&url, Some(BENCH_KEY)).await {
            c.close().await;
            return Ok(child);
        }
        anyhow::ensure!(
            Instant::now() < deadline,
            "toolgate serve did not come up in 60 s (log: {})",
            log.display()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Runs the crash episodes on each store.
pub async fn run_crash(opts: &CrashOptions) -> anyhow::Result<CrashReport> {
    let started = Instant::now();
    let mut report = CrashReport {
        episodes: 0,
        durability: opts.durability,
        elapsed_secs: 0.0,
        cells: Default::default(),
        chains: Default::default(),
    };
    for store in &opts.stores {
        run_store(opts, store, &mut report).await?;
    }
    report.elapsed_secs = started.elapsed().as_secs_f64();
    Ok(report)
}

async fn run_store(
    opts: &CrashOptions,
    store: &StoreKind,
    report: &mut CrashReport,
) -> anyhow::Result<()> {
    let example = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples/finance");
    let dir = tempfile::tempdir()?;
    copy_dir(&example, dir.path())?;
    prepare_registry(dir.path(), false)?;
    let timing = Timing {
        timeout: Duration::from_secs(5),
        ..Timing::default()
    };
    let fake = FakeServer::new(
        Faulty::new(timing, true),
        Recorder::disabled(),
        FaultPlan::none(),
    );
    let mut http = FakeHttp::start(fake, None).await?;

    // Its own database on a shared PostgreSQL server: created here, dropped at the end.
    let (store_url, pg) = match store {
        StoreKind::Sqlite => (
            format!("sqlite://{}", dir.path().join("crash.db").display()),
            None,
        ),
        StoreKind::Postgres(server) => {
            let db = crate::database::BenchDatabase::create(server, "crash").await?;
            (db.url.clone(), Some(db))
        }
    };
    let top = dir.path().join("toolgate.yaml");
    let mut config: Value = yaml_serde::from_str(&std::fs::read_to_string(&top)?)?;
    config["upstreams"]["erp"] = json!({
        "url": format!("http://{}/mcp", http.addr),
        "package": config["upstreams"]["erp"]["package"].clone(),
        "timeout_secs": timing.timeout.as_secs_f64(),
    });
    config["store"] = json!({ "url": store_url, "durability": opts.durability.as_str() });
    std::fs::write(&top, yaml_serde::to_string(&config)?)?;
    // The example's pins, moved to the loopback URL (definitions are still checked).
    toolgate_gateway::pins::rehome_lock(dir.path())?;

    let addr = free_port()?;
    let log = dir.path().join("gateway.log");
    let mut gateway = spawn_gateway(&opts.toolgate, dir.path(), addr, &log).await?;
    // SAFETY of the environment: the reconciler reads the same approval key as the child.
    // SAFETY: set before any other thread of this process reads the environment for it.
    unsafe {
        std::env::set_var("TOOLGATE_APPROVAL_KEY", APPROVAL_KEY);
        std::env::set_var("TOOLGATE_REDACTION_KEY", REDACTION_KEY);
    }
    let reconciler = Gateway::build(&ServeOptions {
        config_dir: dir.path().to_path_buf(),
        keys: toolgate_gateway::KeySource::Configured,
        ..ServeOptions::default()
    })
    .await
    .context("starting the reconciler")?;
    let lease = reconciler.state.store.config().lease;
    let later = Executor {
        clock: Arc::new(Later(lease + Duration::from_secs(5))),
        ..reconciler.state.executor()
    };
    let cfg = reconciler.state.store.config();
    let quiet = cfg.reconcile_quiet.unwrap_or(cfg.call_timeout);
    let even_later = Executor {
        clock: Arc::new(Later(lease + quiet + Duration::from_secs(10))),
        ..reconciler.state.executor()
    };

    let crashes: Vec<Crash> = match store {
        StoreKind::Sqlite => vec![Crash::GatewayKilled, Crash::UpstreamRestart],
        StoreKind::Postgres(_) => vec![
            Crash::GatewayKilled,
            Crash::UpstreamRestart,
            Crash::DatabaseRestart,
        ],
    };
    let url = format!("http://{addr}/mcp");
    for i in 0..opts.episodes {
        let crash = crashes[i as usize % crashes.len()];
        let commit_first = (i / crashes.len() as u64).is_multiple_of(2);
        let run = format!("crash-{}-e{i}", store.name());
        let (tx, rx) = tokio::sync::oneshot::channel();
        http.fake.domain().arm_hold(
            &run,
            Hold {
                commit_first,
                arrived: Some(tx),
            },
        );
        let args = json!({
            "invoice_id": invoice(i), "amount": AMOUNT, "currency": "EUR",
            "value_date": "2026-06-30", "reason": REASONS[0],
        });
        let meta = json!({"purpose": "billing", "reason": REASONS[0], "run_id": run});
        let first = {
            let (url, args, meta) = (url.clone(), args.clone(), meta.clone());
            tokio::spawn(async move {
                match Mcp::connect(&url, Some(BENCH_KEY)).await {
                    Ok(c) => {
                        let a = c
                            .call("payment.schedule", args, meta, Duration::from_secs(30))
                            .await;
                        c.close().await;
                        a
                    }
                    Err(e) => Answer::Protocol(e.to_string()),
                }
            })
        };
        tokio::time::timeout(Duration::from_secs(30), rx)
            .await
            .with_context(|| format!("episode {i}: the payment never reached the ERP"))??;
        match crash {
            Crash::GatewayKilled => {
                gateway.start_kill()?; // SIGKILL
                gateway.wait().await?;
                gateway = spawn_gateway(&opts.toolgate, dir.path(), addr, &log).await?;
            }
            Crash::UpstreamRestart => {
                http = http.restart().await?;
            }
            Crash::DatabaseRestart => {
                pg.as_ref()
                    .expect("postgres only")
                    .terminate_connections()
                    .await?;
            }
        }
        let _ = first.await;
        // The agent retries up to three times, on a new connection each time.
        for _ in 0..3 {
            let Ok(c) = Mcp::connect(&url, Some(BENCH_KEY)).await else {
                tokio::time::sleep(Duration::from_millis(200)).await;
                continue;
            };
            let a = c
                .call(
                    "payment.schedule",
                    args.clone(),
                    meta.clone(),
                    Duration::from_secs(30),
                )
                .await;
            c.close().await;
            if matches!(a, Answer::Success) {
                break;
            }
        }
        let deadline = Instant::now() + Duration::from_secs(30);
        while http.fake.domain().busy(&run) > 0 && Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        // The reconciler, as a worker runs it once the lease has run out.
        if let Err(e) = later.recover_stale().await {
            eprintln!("episode {i}: recover_stale: {e}");
        }
        if let Err(e) = later.reconcile().await {
            eprintln!("episode {i}: reconcile: {e}");
        }
        // "Not found" is believed only once a late commit could no longer land (the store's
        // quiet period after the step became `unknown`): the worker's next pass, later still.
        if let Err(e) = even_later.reconcile().await {
            eprintln!("episode {i}: reconcile: {e}");
        }
        for s in reconciler.state.store.steps(&run.as_str().into()).await? {
            if matches!(s.status, StepStatus::Running | StepStatus::Unknown) {
                eprintln!(
                    "episode {i} ({}): step {} left {:?}: {:?}",
                    crash.name(),
                    s.step_id,
                    s.status,
                    s.outcome
                );
            }
        }

        let st = &reconciler.state.store;
        let steps = st.steps(&run.as_str().into()).await?;
        let records = st.audit_records(None, Some(&run.as_str().into())).await?;
        let booked = http.fake.domain().booked(&run);
        let cell = report
            .cells
            .entry(format!(
                "{}/{}/{}",
                store.name(),
                crash.name(),
                if commit_first {
                    "booked-before-crash"
                } else {
                    "not-booked"
                }
            ))
            .or_default();
        cell.episodes += 1;
        cell.duplicate_episodes += u64::from(booked > 1);
        cell.missed += u64::from(booked == 0);
        cell.undefined_steps += steps
            .iter()
            .filter(|s| matches!(s.status, StepStatus::Running | StepStatus::Unknown))
            .count() as u64;
        let done = steps.iter().any(|s| s.status == StepStatus::Done);
        cell.record_mismatch += u64::from(done != (booked > 0));
        cell.steps_without_audit += steps
            .iter()
            .filter(|s| {
                !records
                    .iter()
                    .any(|r| r.body.step_id.as_deref() == Some(s.step_id.as_str()))
            })
            .count() as u64;
        report.episodes += 1;
    }
    let chain = reconciler.state.store.verify_chain().await?;
    let n = reconciler
        .state
        .store
        .audit_records(None, None)
        .await?
        .len() as u64;
    report
        .chains
        .insert(store.name().to_string(), (n, chain.is_intact()));
    let _ = gateway.start_kill();
    let _ = gateway.wait().await;
    reconciler.close().await;
    http.stop.cancel();
    if let Some(db) = pg {
        db.drop().await;
    }
    Ok(())
}

/// The crash report as a plain-text table.
pub fn crash_table(r: &CrashReport) -> String {
    let mut s = format!(
        "toolgate-bench crash: {} episodes, durability: {}, {:.0} s\n\n{:<9} {:<17} {:<20} {:>5} {:>7} {:>7} {:>10} {:>11} {:>10}\n",
        r.episodes,
        r.durability.as_str(),
        r.elapsed_secs,
        "store",
        "crash",
        "erp at the crash",
        "eps",
        "dup-ep",
        "missed",
        "undefined",
        "rec≠ledger",
        "no-audit"
    );
    for (k, c) in &r.cells {
        let mut p = k.split('/');
        s.push_str(&format!(
            "{:<9} {:<17} {:<20} {:>5} {:>7} {:>7} {:>10} {:>11} {:>10}\n",
            p.next().unwrap_or_default(),
            p.next().unwrap_or_default(),
            p.next().unwrap_or_default(),
            c.episodes,
            c.duplicate_episodes,
            c.missed,
            c.undefined_steps,
            c.record_mismatch,
            c.steps_without_audit
        ));
    }
    for (store, (n, ok)) in &r.chains {
        s.push_str(&format!(
            "audit chain ({store}): {n} records, {}\n",
            if *ok { "intact" } else { "BROKEN" }
        ));
    }
    s
}
