//! `toolgate-bench faults`: seeded fault-injection episodes against the fake ERP of the finance
//! example. In each episode a scripted agent strategy tries to schedule one payment while one
//! fault fires at the service boundary (on the first delivery of the episode's payment); the
//! same episode runs through the gateway and direct against the fake, in the same run. The
//! fake's booked payments are the ledger of committed effects.
//!
//! The bench brings up its own environment rather than `toolgate_harness::Environment`: the
//! harness fixes the upstream timeout at 5 s and the faults per server at start, while the bench
//! needs a sub-second timeout (thousands of timeout episodes) and a fault chosen per episode.
//! The registry is `examples/finance` with three documented changes (see [`prepare_registry`]).

pub mod crash;
mod database;
pub mod fleet;
pub mod peers;
pub mod scale;
pub mod storm;

use std::collections::{BTreeMap, HashMap};
use std::net::SocketAddr;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::Context;
use rmcp::model::{CallToolRequestParams, CallToolResult, MetaObject, RequestMetaObject};
use rmcp::service::{RequestContext, RunningService};
use rmcp::transport::streamable_http_client::StreamableHttpClientTransportConfig;
use rmcp::transport::streamable_http_server::session::local::LocalSessionManager;
use rmcp::transport::{
    StreamableHttpClientTransport, StreamableHttpServerConfig, StreamableHttpService,
};
use rmcp::{RoleClient, RoleServer, ServiceExt};
use serde::Serialize;
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;
use toolgate_core::StepStatus;
use toolgate_core::registry::api_key_hash;
use toolgate_fakes::finance::Finance;
use toolgate_fakes::{Call, Domain, FakeServer, FaultPlan, Recorder, Reply};
use toolgate_gateway::Gateway;
use toolgate_store::ExecutorToggles;
use toolgate_store::audit::AuditDecision;

/// The bench principal's API key (added to the copied registry only).
pub const BENCH_KEY: &str = "tgbench_agent";
/// The one invoice of the finance fake that is approved and below the 10,000 EUR gate policy.
/// The invoice of payment `n`: a bulk invoice of the fake ERP (a copy of `INV-20260611` under
/// its own number, see `Finance::with_bulk_invoices`). toolgate pays one invoice once, whichever
/// run or session asks, so every payment a benchmark makes is for an invoice of its own.
pub(crate) fn invoice(n: u64) -> String {
    format!("INV-9{:07}", n % 10_000_000)
}
pub(crate) const AMOUNT: f64 = 4180.0;

/// A fault at the service boundary, fired on the first delivery of an episode's payment.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Fault {
    /// The request is held without committing until the caller gives up.
    TimeoutBeforeCommit,
    /// The payment is booked, then no answer (lost acknowledgement).
    TimeoutAfterCommit,
    /// The payment is booked after the caller gave up (held past the timeout, then committed).
    LateCommit,
    /// The network delivers the request twice.
    DuplicateDelivery,
    /// The payment is booked, then the service answers with an internal error (HTTP 500-like).
    ErrorAfterCommit,
}

impl Fault {
    pub const ALL: [Fault; 5] = [
        Fault::TimeoutBeforeCommit,
        Fault::TimeoutAfterCommit,
        Fault::LateCommit,
        Fault::DuplicateDelivery,
        Fault::ErrorAfterCommit,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Fault::TimeoutBeforeCommit => "timeout-before-commit",
            Fault::TimeoutAfterCommit => "timeout-after-commit",
            Fault::LateCommit => "late-commit",
            Fault::DuplicateDelivery => "duplicate-delivery",
            Fault::ErrorAfterCommit => "error-after-commit",
        }
    }
}

/// A scripted agent standing in for a model.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Strategy {
    /// Up to three attempts, back to back, until one succeeds.
    RetryImmediately,
    /// Up to three attempts with a pause between them longer than a late commit takes to land.
    RetryBackoff,
    /// Up to three attempts, each with a reworded `reason` (identity fields unchanged); calling
    /// direct, each attempt is a new request with a fresh idempotency key of its own.
    Replan,
    /// One attempt; reports success whatever came back.
    GiveUp,
}

impl Strategy {
    pub const ALL: [Strategy; 4] = [
        Strategy::RetryImmediately,
        Strategy::RetryBackoff,
        Strategy::Replan,
        Strategy::GiveUp,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Strategy::RetryImmediately => "retry-immediately",
            Strategy::RetryBackoff => "retry-backoff",
            Strategy::Replan => "replan",
            Strategy::GiveUp => "give-up",
        }
    }
}

/// Through toolgate, or the agent calling the fake itself.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Route {
    Toolgate,
    Direct,
}

impl Route {
    pub fn name(self) -> &'static str {
        match self {
            Route::Toolgate => "toolgate",
            Route::Direct => "direct",
        }
    }
}

/// Timings of the fault model. The upstream timeout is the gateway's `timeout_secs` and the
/// direct agent's own patience.
#[derive(Debug, Clone, Copy)]
pub struct Timing {
    pub timeout: Duration,
    /// How long a timeout fault holds the request at most (cancellation ends it earlier).
    pub hold: Duration,
    /// When a late commit lands, counted from its arrival.
    pub late: Duration,
    /// The retry-after-backoff pause.
    pub backoff: Duration,
    /// How often the bench's reconciler calls `Executor::reconcile()`.
    pub reconcile_every: Duration,
}

impl Default for Timing {
    fn default() -> Self {
        Timing {
            timeout: Duration::from_millis(800),
            hold: Duration::from_millis(1600),
            late: Duration::from_millis(1200),
            backoff: Duration::from_millis(1500),
            reconcile_every: Duration::from_millis(300),
        }
    }
}

#[derive(Debug, Default)]
struct Episode {
    fault: Option<Fault>,
    fired: bool,
    booked: u32,
    /// The arguments of each booked payment, in order.
    booked_inputs: Vec<Value>,
    in_flight: u32,
    /// A crash episode's hold: the first delivery (booked first or not) is held until the
    /// caller goes away, and the bench is told it arrived (see `crash`).
    hold: Option<Hold>,
}

/// How a crash episode's first delivery is held.
#[derive(Debug)]
pub(crate) struct Hold {
    pub commit_first: bool,
    pub arrived: Option<tokio::sync::oneshot::Sender<()>>,
}

/// The finance fake with per-episode faults on `schedule_payment`, counting committed payments
/// per episode (the episode is the `_meta.run_id` of the delivery).
pub struct Faulty {
    inner: Finance,
    timing: Timing,
    /// Whether the ERP deduplicates on `_meta.idempotency_key` (the finance fake does). Without,
    /// it books every delivery under a key of its own, and still finds a payment by the
    /// caller's key (the first one booked with it), as a service that stores a client
    /// reference without enforcing it.
    dedupe: bool,
    /// Caller's key → the key the first delivery was booked under (when not deduplicating).
    aliases: Mutex<HashMap<String, String>>,
    deliveries: std::sync::atomic::AtomicU64,
    episodes: Mutex<HashMap<String, Episode>>,
}

impl Faulty {
    pub(crate) fn new(timing: Timing, dedupe: bool) -> Faulty {
        Faulty {
            inner: Finance::with_bulk_invoices(),
            timing,
            dedupe,
            aliases: Mutex::new(HashMap::new()),
            deliveries: std::sync::atomic::AtomicU64::new(0),
            episodes: Mutex::new(HashMap::new()),
        }
    }

    /// Holds the first delivery of `run_id`'s payment (booked first, or not) until the caller
    /// goes away; `arrived` fires when it is held.
    pub(crate) fn arm_hold(&self, run_id: &str, hold: Hold) {
        self.episodes
            .lock()
            .expect("episodes")
            .entry(run_id.to_string())
            .or_default()
            .hold = Some(hold);
    }

    /// Deliveries of `run_id`'s payment the fake is still working on.
    pub(crate) fn busy(&self, run_id: &str) -> u32 {
        self.in_flight(run_id)
    }

    /// The arguments of the payments booked for an episode.
    pub fn booked_inputs(&self, run_id: &str) -> Vec<Value> {
        self.episodes
            .lock()
            .expect("episodes")
            .get(run_id)
            .map(|e| e.booked_inputs.clone())
            .unwrap_or_default()
    }

    fn arm(&self, run_id: &str, fault: Fault) {
        self.episodes
            .lock()
            .expect("episodes")
            .entry(run_id.to_string())
            .or_default()
            .fault = Some(fault);
    }

    /// Payments booked for an episode.
    pub fn booked(&self, run_id: &str) -> u32 {
        self.episodes
            .lock()
            .expect("episodes")
            .get(run_id)
            .map_or(0, |e| e.booked)
    }

    fn in_flight(&self, run_id: &str) -> u32 {
        self.episodes
            .lock()
            .expect("episodes")
            .get(run_id)
            .map_or(0, |e| e.in_flight)
    }

    async fn commit(&self, tag: &str, call: &Call, ctx: &RequestContext<RoleServer>) -> Reply {
        let reply = match call.idempotency_key() {
            Some(key) if !self.dedupe => {
                let n = self
                    .deliveries
                    .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                let own = format!("{key}#{n}");
                self.aliases
                    .lock()
                    .expect("aliases")
                    .entry(key.to_string())
                    .or_insert_with(|| own.clone());
                let mut c = call.clone();
                c.meta.insert("idempotency_key".into(), Value::String(own));
                self.inner.call(&c, ctx).await
            }
            _ => self.inner.call(call, ctx).await,
        };
        if reply.committed {
            let mut eps = self.episodes.lock().expect("episodes");
            let ep = eps.entry(tag.to_string()).or_default();
            ep.booked += 1;
            ep.booked_inputs.push(Value::Object(call.arguments.clone()));
        }
        reply
    }

    async fn hold(&self, ctx: &RequestContext<RoleServer>) {
        tokio::select! {
            _ = ctx.ct.cancelled() => {}
            _ = tokio::time::sleep(self.timing.hold) => {}
        }
    }
}

pub(crate) fn error_result(text: &str) -> CallToolResult {
    CallToolResult::error(vec![rmcp::model::ContentBlock::text(text.to_string())])
}

impl Domain for Faulty {
    fn name(&self) -> &'static str {
        self.inner.name()
    }

    fn server_name(&self) -> &'static str {
        self.inner.server_name()
    }

    fn tools(&self) -> Vec<rmcp::model::Tool> {
        self.inner.tools()
    }

    async fn call(&self, call: &Call, ctx: &RequestContext<RoleServer>) -> Reply {
        if call.tool == "lookup_payment_by_key" && !self.dedupe {
            let mut c = call.clone();
            let alias = c
                .arguments
                .get("idempotency_key")
                .and_then(Value::as_str)
                .and_then(|k| self.aliases.lock().expect("aliases").get(k).cloned());
            if let Some(own) = alias {
                c.arguments
                    .insert("idempotency_key".into(), Value::String(own));
            }
            return self.inner.call(&c, ctx).await;
        }
        if call.tool != "schedule_payment" {
            return self.inner.call(call, ctx).await;
        }
        let tag = call
            .meta
            .get("run_id")
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_string();
        let (fault, hold) = {
            let mut eps = self.episodes.lock().expect("episodes");
            let ep = eps.entry(tag.clone()).or_default();
            ep.in_flight += 1;
            if ep.fired {
                (None, None)
            } else {
                ep.fired = true;
                (ep.fault, ep.hold.take())
            }
        };
        if let Some(mut hold) = hold {
            let reply = if hold.commit_first {
                Some(self.commit(&tag, call, ctx).await)
            } else {
                None
            };
            if let Some(tx) = hold.arrived.take() {
                let _ = tx.send(());
            }
            tokio::select! {
                _ = ctx.ct.cancelled() => {}
                _ = tokio::time::sleep(Duration::from_secs(20)) => {}
            }
            if let Some(ep) = self.episodes.lock().expect("episodes").get_mut(&tag) {
                ep.in_flight -= 1;
            }
            return reply.unwrap_or_else(|| {
                Reply::read(error_result("no answer (the request was dropped)"))
            });
        }
        let reply = match fault {
            None => self.commit(&tag, call, ctx).await,
            Some(Fault::TimeoutBeforeCommit) => {
                self.hold(ctx).await;
                Reply::read(error_result("no answer (the request was dropped)"))
            }
            Some(Fault::TimeoutAfterCommit) => {
                let r = self.commit(&tag, call, ctx).await;
                self.hold(ctx).await;
                r
            }
            Some(Fault::LateCommit) => {
                tokio::time::sleep(self.timing.late).await;
                self.commit(&tag, call, ctx).await
            }
            Some(Fault::DuplicateDelivery) => {
                let _first = self.commit(&tag, call, ctx).await;
                self.commit(&tag, call, ctx).await
            }
            Some(Fault::ErrorAfterCommit) => {
                // Committed, then the request fails as a whole (a JSON-RPC internal error,
                // as an HTTP 500 would), not with a tool result that says "no".
                let r = self.commit(&tag, call, ctx).await;
                Reply::internal_error("HTTP 500: internal server error", r.committed)
            }
        };
        if let Some(ep) = self.episodes.lock().expect("episodes").get_mut(&tag) {
            ep.in_flight -= 1;
        }
        reply
    }
}

/// An MCP client over streamable HTTP.
pub struct Mcp {
    service: RunningService<RoleClient, ()>,
}

/// What an agent saw.
#[derive(Debug, Clone)]
pub enum Answer {
    Success,
    /// A tool error; the gateway's `status` (`unknown`, `failed`, `refused`, …) when it gave one.
    Error(String),
    /// A JSON-RPC error.
    Protocol(String),
    /// No answer within the agent's patience.
    Timeout,
}

impl Mcp {
    pub async fn connect(url: &str, key: Option<&str>) -> anyhow::Result<Mcp> {
        let mut cfg = StreamableHttpClientTransportConfig::with_uri(url);
        if let Some(k) = key {
            cfg = cfg.auth_header(k);
        }
        let transport = StreamableHttpClientTransport::from_config(cfg);
        let service = ().serve(transport).await.context("connecting")?;
        Ok(Mcp { service })
    }

    pub async fn call(&self, tool: &str, args: Value, meta: Value, patience: Duration) -> Answer {
        let Value::Object(args) = args else {
            return Answer::Protocol("arguments must be an object".into());
        };
        let mut p = CallToolRequestParams::new(tool.to_string()).with_arguments(args);
        if let Value::Object(m) = meta {
            p.meta = Some(RequestMetaObject(MetaObject(m)));
        }
        match tokio::time::timeout(patience, self.service.peer().call_tool(p)).await {
            Err(_) => Answer::Timeout,
            Ok(Err(e)) => Answer::Protocol(e.to_string()),
            Ok(Ok(r)) if r.is_error != Some(true) => Answer::Success,
            Ok(Ok(r)) => Answer::Error(
                r.structured_content
                    .as_ref()
                    .and_then(|s| s.get("status"))
                    .and_then(Value::as_str)
                    .unwrap_or("error")
                    .to_string(),
            ),
        }
    }

    pub async fn close(self) {
        let _ = self.service.cancel().await;
    }
}

pub(crate) fn copy_dir(from: &Path, to: &Path) -> std::io::Result<()> {
    std::fs::create_dir_all(to)?;
    for e in std::fs::read_dir(from)? {
        let e = e?;
        let dest = to.join(e.file_name());
        if e.file_type()?.is_dir() {
            copy_dir(&e.path(), &dest)?;
        } else if e.path().extension().is_none_or(|x| x != "db") {
            std::fs::copy(e.path(), dest)?;
        }
    }
    Ok(())
}

fn replace_once(text: &str, from: &str, to: &str, file: &str) -> anyhow::Result<String> {
    anyhow::ensure!(text.contains(from), "{file} no longer contains '{from}'");
    Ok(text.replacen(from, to, 1))
}

/// Changes the copied finance registry for the bench, and nothing else:
///
/// 1. `payment.schedule` is `gate: never` instead of `always`: approvals are not what is
///    measured, and a parked call never reaches the faults (the 10,000 EUR `@gate` policy still
///    applies; the bench pays a 4,180 EUR invoice).
/// 2. its `rate_limit: 3` is removed, so thousands of episodes are not rate-limited (and, 4.,
///    its 24-hour window budget on the amount);
/// 3. a principal `bench-agent` with a role `bench.payer` that may call `payment.schedule`:
///    the example's `worker.finance` is plan-bound, and the bench makes direct calls.
///
/// With `gated` (the approval episodes of `toggles`), change 1 is not made: every payment waits
/// for a person, as in the example.
pub fn prepare_registry(dir: &Path, gated: bool) -> anyhow::Result<()> {
    let tools = dir.join("tools/payments.yaml");
    let mut t = std::fs::read_to_string(&tools)?;
    if !gated {
        t = replace_once(
            &t,
            "    gate: always\n",
            "    gate: never\n",
            "payments.yaml",
        )?;
    }
    t = replace_once(&t, "    rate_limit: 3\n", "", "payments.yaml")?;
    // 4. its 24-hour window budget on the amount (20,000 EUR per principal) is removed: the bench
    //    pays thousands of 4,180 EUR invoices in a few minutes.
    let window = "    window_budgets:\n      - {id: payment_value_24h, sum: amount, unit: EUR, limit: 20000, window: 24h}\n";
    t = t.replacen(window, "", 1);
    anyhow::ensure!(
        !t.contains("window_budgets"),
        "payments.yaml has a window budget the bench does not know how to remove"
    );
    t = replace_once(
        &t,
        "    roles: [worker.finance]\n",
        "    roles: [worker.finance, bench.payer]\n",
        "payments.yaml",
    )?;
    std::fs::write(&tools, t)?;

    let path = dir.join("principals.yaml");
    let mut doc: Value = yaml_serde::from_str(&std::fs::read_to_string(&path)?)?;
    doc["roles"]["bench.payer"] =
        json!({"description": "the fault benchmark's scripted agent: schedules payments directly"});
    doc["principals"]
        .as_array_mut()
        .context("principals.yaml has no principals list")?
        .push(json!({
            "id": "bench-agent",
            "kind": "agent",
            "role": "bench.payer",
            "credentials": [{"id": "bench", "sha256": api_key_hash(BENCH_KEY)}],
            "grants": [{
                "scopes": ["payments:write"],
                "purposes": ["billing"],
                "max_tier": "spend",
                "max_sensitivity": "confidential"
            }]
        }));
    std::fs::write(&path, yaml_serde::to_string(&doc)?)?;
    Ok(())
}

/// The fake ERP (with faults) and the gateway in front of it, in this process.
pub struct Bench {
    _dir: tempfile::TempDir,
    pub gateway: Gateway,
    pub gateway_url: String,
    pub fake_url: String,
    fake: FakeServer<Faulty>,
    stop: CancellationToken,
}

/// How a bench environment is set up.
#[derive(Debug, Clone, Copy)]
pub struct Setup {
    pub timing: Timing,
    /// The ERP deduplicates on the idempotency key (the finance fake does).
    pub upstream_dedupes: bool,
    /// `payment.schedule` waits for a person (`gate: always`).
    pub gated: bool,
}

impl Setup {
    pub fn new(timing: Timing) -> Setup {
        Setup {
            timing,
            upstream_dedupes: true,
            gated: false,
        }
    }
}

impl Bench {
    pub async fn start(setup: Setup) -> anyhow::Result<Bench> {
        let timing = setup.timing;
        let example = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples/finance");
        let dir = tempfile::tempdir()?;
        copy_dir(&example, dir.path())?;
        prepare_registry(dir.path(), setup.gated)?;
        let stop = CancellationToken::new();

        let fake = FakeServer::new(
            Faulty::new(timing, setup.upstream_dedupes),
            Recorder::disabled(),
            FaultPlan::none(),
        );
        let served = fake.clone();
        let service = StreamableHttpService::new(
            move || Ok(served.clone()),
            Arc::new(LocalSessionManager::default()),
            StreamableHttpServerConfig::default().with_cancellation_token(stop.clone()),
        );
        let app = axum::Router::new().nest_service("/mcp", service);
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let addr: SocketAddr = listener.local_addr()?;
        let fstop = stop.clone();
        tokio::spawn(async move {
            let _ = axum::serve(listener, app)
                .with_graceful_shutdown(async move { fstop.cancelled().await })
                .await;
        });
        let fake_url = format!("http://{addr}/mcp");

        let top = dir.path().join("toolgate.yaml");
        let mut config: Value = yaml_serde::from_str(&std::fs::read_to_string(&top)?)?;
        config["upstreams"]["erp"] = json!({
            "url": fake_url,
            "package": config["upstreams"]["erp"]["package"].clone(),
            "timeout_secs": timing.timeout.as_secs_f64(),
        });
        config["store"] =
            json!({"url": format!("sqlite://{}", dir.path().join("bench.db").display())});
        std::fs::write(&top, yaml_serde::to_string(&config)?)?;
        // The example's pins, moved to the loopback URL (definitions are still checked).
        let (gateway, gateway_url) = Gateway::start_loopback(dir.path(), stop.clone())
            .await
            .context("starting the gateway")?;
        Ok(Bench {
            _dir: dir,
            gateway,
            gateway_url,
            fake_url,
            fake,
            stop,
        })
    }

    pub fn fake(&self) -> &Faulty {
        self.fake.domain()
    }

    pub async fn shutdown(self) {
        self.stop.cancel();
        self.gateway.close().await;
    }
}

/// One episode's plan.
#[derive(Debug, Clone, Copy)]
pub struct EpisodeSpec {
    pub index: u64,
    pub fault: Fault,
    pub strategy: Strategy,
}

/// The episodes of a run: every fault × strategy in turn, in an order shuffled by the seed.
pub fn plan(episodes: u64, seed: u64) -> Vec<EpisodeSpec> {
    let cells: Vec<(Fault, Strategy)> = Fault::ALL
        .iter()
        .flat_map(|f| Strategy::ALL.iter().map(move |s| (*f, *s)))
        .collect();
    let mut rng = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    let mut out = Vec::with_capacity(episodes as usize);
    let mut block: Vec<(Fault, Strategy)> = Vec::new();
    for index in 0..episodes {
        if block.is_empty() {
            block = cells.clone();
            // Fisher–Yates with xorshift: each block of 20 covers every cell once.
            for i in (1..block.len()).rev() {
                rng ^= rng << 13;
                rng ^= rng >> 7;
                rng ^= rng << 17;
                block.swap(i, (rng % (i as u64 + 1)) as usize);
            }
        }
        let (fault, strategy) = block.pop().expect("refilled");
        out.push(EpisodeSpec {
            index,
            fault,
            strategy,
        });
    }
    out
}

/// What one episode came to on one route.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Outcome {
    pub attempts: u32,
    pub booked: u32,
    pub reported_done: bool,
    /// Toolgate only: steps of the run that were `unknown` at some point.
    pub unknown: u32,
    /// … of which were settled (not `unknown`) when the episode was scored.
    pub settled: u32,
    /// Toolgate only: governed attempts without an audit record.
    pub audit_missing: u32,
    /// Toolgate only: the run's recorded outcome (a step `done` or not) disagrees with the
    /// ledger (a payment booked or not).
    pub record_mismatch: bool,
}

pub(crate) const REASONS: [&str; 3] = [
    "Pay invoice INV-20260611, matched against PO-77812 lines 1-2, due 2026-06-30.",
    "Retrying: schedule the payment for INV-20260611 (PO-77812), amount as invoiced.",
    "Invoice INV-20260611 is approved and matches PO-77812; please book the payment now.",
];

fn run_id(seed: u64, spec: &EpisodeSpec, route: Route) -> String {
    format!("bench-s{seed}-e{}-{}", spec.index, route.name())
}

/// Runs one episode on one route with the given client.
async fn episode(
    bench: &Bench,
    timing: &Timing,
    seed: u64,
    spec: &EpisodeSpec,
    route: Route,
    client: &Mcp,
) -> anyhow::Result<Outcome> {
    let run = run_id(seed, spec, route);
    bench.fake().arm(&run, spec.fault);
    let attempts = if spec.strategy == Strategy::GiveUp {
        1
    } else {
        3
    };
    let patience = match route {
        Route::Direct => timing.timeout,
        // The gateway answers by itself once its upstream timeout passes.
        Route::Toolgate => timing.timeout * 4 + Duration::from_secs(5),
    };
    let mut out = Outcome::default();
    let mut success = false;
    for (attempt, reworded) in REASONS.iter().enumerate().take(attempts) {
        if attempt > 0 && spec.strategy == Strategy::RetryBackoff {
            tokio::time::sleep(timing.backoff).await;
        }
        let reason = if spec.strategy == Strategy::Replan {
            reworded
        } else {
            REASONS[0]
        };
        let args = json!({
            "invoice_id": invoice(spec.index),
            "amount": AMOUNT,
            "currency": "EUR",
            "value_date": "2026-06-30",
            "reason": reason,
        });
        let (tool, meta) = match route {
            Route::Toolgate => (
                "payment.schedule",
                json!({"purpose": "billing", "reason": reason, "run_id": run}),
            ),
            Route::Direct => {
                let mut m = json!({"run_id": run});
                if spec.strategy == Strategy::Replan {
                    // A re-planned request is a new request: the agent mints a new key.
                    m["idempotency_key"] = json!(format!("agent-{run}-{attempt}"));
                }
                ("schedule_payment", m)
            }
        };
        out.attempts += 1;
        if let Answer::Success = client.call(tool, args, meta, patience).await {
            success = true;
            break;
        }
    }
    out.reported_done = success || spec.strategy == Strategy::GiveUp;

    // Let anything still held at the fake land (or be dropped) before counting.
    let deadline = Instant::now() + timing.hold + timing.late + Duration::from_secs(5);
    while bench.fake().in_flight(&run) > 0 && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }

    if route == Route::Toolgate {
        let store = &bench.gateway.state.store;
        // Wait for the reconciler to settle what is unknown (it runs every `reconcile_every`).
        let deadline = Instant::now() + timing.reconcile_every * 10 + Duration::from_secs(2);
        loop {
            let steps = store.steps(&run.as_str().into()).await?;
            let open = steps.iter().any(|s| s.status == StepStatus::Unknown);
            if !open || Instant::now() >= deadline {
                break;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let records = store
            .audit_records(None, Some(&run.as_str().into()))
            .await?;
        let governed = records
            .iter()
            .filter(|r| r.body.why.decision != AuditDecision::Reconcile)
            .count() as u32;
        out.audit_missing = out.attempts.saturating_sub(governed);
        let unknown_steps: std::collections::BTreeSet<toolgate_core::StepId> = records
            .iter()
            .filter(|r| r.body.outcome.status == StepStatus::Unknown)
            .filter_map(|r| r.body.step_id.clone())
            .collect();
        out.unknown = unknown_steps.len() as u32;
        let steps = store.steps(&run.as_str().into()).await?;
        out.settled = unknown_steps
            .iter()
            .filter(|id| {
                steps
                    .iter()
                    .any(|s| &s.step_id == *id && s.status != StepStatus::Unknown)
            })
            .count() as u32;
        out.booked = bench.fake().booked(&run);
        let done = steps.iter().any(|s| s.status == StepStatus::Done);
        out.record_mismatch = done != (out.booked > 0);
    }
    out.booked = bench.fake().booked(&run);
    Ok(out)
}

/// Per fault × strategy × route.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Cell {
    pub episodes: u64,
    pub attempts: u64,
    /// Episodes in which the one intended payment was booked more than once.
    pub duplicate_episodes: u64,
    /// Payments booked beyond the first, summed.
    pub duplicate_effects: u64,
    /// Episodes in which the payment was never booked.
    pub missed: u64,
    /// Episodes in which the agent reported success but nothing was booked.
    pub false_done: u64,
    pub unknown: u64,
    pub unknown_settled: u64,
    pub audit_missing: u64,
    /// Episodes whose recorded outcome disagrees with the ledger.
    pub record_mismatch: u64,
}

impl Cell {
    fn add(&mut self, o: &Outcome) {
        self.episodes += 1;
        self.attempts += u64::from(o.attempts);
        if o.booked > 1 {
            self.duplicate_episodes += 1;
            self.duplicate_effects += u64::from(o.booked - 1);
        }
        if o.booked == 0 {
            self.missed += 1;
            if o.reported_done {
                self.false_done += 1;
            }
        }
        self.unknown += u64::from(o.unknown);
        self.unknown_settled += u64::from(o.settled);
        self.audit_missing += u64::from(o.audit_missing);
        self.record_mismatch += u64::from(o.record_mismatch);
    }

    fn merge(&mut self, o: &Cell) {
        self.episodes += o.episodes;
        self.attempts += o.attempts;
        self.duplicate_episodes += o.duplicate_episodes;
        self.duplicate_effects += o.duplicate_effects;
        self.missed += o.missed;
        self.false_done += o.false_done;
        self.unknown += o.unknown;
        self.unknown_settled += o.unknown_settled;
        self.audit_missing += o.audit_missing;
        self.record_mismatch += o.record_mismatch;
    }
}

/// The result of a run.
#[derive(Debug, Clone, Serialize)]
pub struct Report {
    pub episodes: u64,
    pub seed: u64,
    pub concurrency: usize,
    pub elapsed_secs: f64,
    /// `route/fault/strategy` → cell.
    pub cells: BTreeMap<String, Cell>,
    /// `route` → totals.
    pub totals: BTreeMap<String, Cell>,
    /// `route/fault` → totals.
    pub by_fault: BTreeMap<String, Cell>,
    pub audit_chain_intact: bool,
    pub audit_records: u64,
}

/// Options of a run.
#[derive(Debug, Clone, Copy)]
pub struct RunOptions {
    pub episodes: u64,
    pub seed: u64,
    pub concurrency: usize,
    pub timing: Timing,
    /// The gateway's safety mechanisms (all on, except in `toggles`).
    pub toggles: ExecutorToggles,
    /// The ERP deduplicates on the idempotency key.
    pub upstream_dedupes: bool,
    /// Also run every episode with the agent calling the fake directly.
    pub direct: bool,
}

impl RunOptions {
    /// Both routes, every mechanism on, the finance fake as it is.
    pub fn new(episodes: u64, seed: u64, concurrency: usize) -> RunOptions {
        RunOptions {
            episodes,
            seed,
            concurrency,
            timing: Timing::default(),
            toggles: ExecutorToggles::default(),
            upstream_dedupes: true,
            direct: true,
        }
    }
}

/// Runs the episodes on both routes and scores them.
pub async fn run_faults(opts: RunOptions) -> anyhow::Result<Report> {
    let started = Instant::now();
    let bench = Arc::new(
        Bench::start(Setup {
            upstream_dedupes: opts.upstream_dedupes,
            ..Setup::new(opts.timing)
        })
        .await?,
    );
    bench.gateway.state.executor().toggles.set(opts.toggles);
    let specs = Arc::new(plan(opts.episodes, opts.seed));
    let next = Arc::new(std::sync::atomic::AtomicUsize::new(0));

    // The reconciler a deployment runs next to the gateway, every `reconcile_every`.
    let rstop = CancellationToken::new();
    let reconciler = {
        let bench = bench.clone();
        let rstop = rstop.clone();
        let every = opts.timing.reconcile_every;
        tokio::spawn(async move {
            loop {
                tokio::select! {
                    _ = rstop.cancelled() => break,
                    _ = tokio::time::sleep(every) => {}
                }
                if let Err(e) = bench.gateway.state.executor().reconcile().await {
                    eprintln!("reconcile: {e}");
                }
            }
        })
    };

    let mut workers = Vec::new();
    for _ in 0..opts.concurrency.max(1) {
        let bench = bench.clone();
        let specs = specs.clone();
        let next = next.clone();
        let timing = opts.timing;
        let seed = opts.seed;
        let with_direct = opts.direct;
        workers.push(tokio::spawn(async move {
            let governed = Mcp::connect(&bench.gateway_url, Some(BENCH_KEY)).await?;
            let direct = Mcp::connect(&bench.fake_url, None).await?;
            let mut results = Vec::new();
            loop {
                let i = next.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                let Some(spec) = specs.get(i) else { break };
                let t = episode(&bench, &timing, seed, spec, Route::Toolgate, &governed).await?;
                let d = if with_direct {
                    Some(episode(&bench, &timing, seed, spec, Route::Direct, &direct).await?)
                } else {
                    None
                };
                results.push((*spec, t, d));
            }
            governed.close().await;
            direct.close().await;
            anyhow::Ok(results)
        }));
    }
    let mut results = Vec::new();
    for w in workers {
        results.extend(w.await??);
    }
    rstop.cancel();
    let _ = reconciler.await;
    results.sort_by_key(|(s, _, _)| s.index);

    let mut cells: BTreeMap<String, Cell> = BTreeMap::new();
    for (spec, t, d) in &results {
        let routes =
            std::iter::once((Route::Toolgate, t)).chain(d.iter().map(|d| (Route::Direct, d)));
        for (route, o) in routes {
            cells
                .entry(format!(
                    "{}/{}/{}",
                    route.name(),
                    spec.fault.name(),
                    spec.strategy.name()
                ))
                .or_default()
                .add(o);
        }
    }
    let mut totals: BTreeMap<String, Cell> = BTreeMap::new();
    let mut by_fault: BTreeMap<String, Cell> = BTreeMap::new();
    for (k, c) in &cells {
        let mut parts = k.split('/');
        let route = parts.next().unwrap_or_default();
        let fault = parts.next().unwrap_or_default();
        totals.entry(route.to_string()).or_default().merge(c);
        by_fault
            .entry(format!("{route}/{fault}"))
            .or_default()
            .merge(c);
    }
    let store = &bench.gateway.state.store;
    let chain = store.verify_chain().await?;
    let audit_records = store.audit_records(None, None).await?.len() as u64;
    let report = Report {
        episodes: opts.episodes,
        seed: opts.seed,
        concurrency: opts.concurrency,
        elapsed_secs: started.elapsed().as_secs_f64(),
        cells,
        totals,
        by_fault,
        audit_chain_intact: chain.is_intact(),
        audit_records,
    };
    if let Ok(b) = Arc::try_unwrap(bench) {
        b.shutdown().await;
    }
    Ok(report)
}

fn pct(n: u64, d: u64) -> String {
    if d == 0 {
        "-".into()
    } else {
        format!("{:.1}%", 100.0 * n as f64 / d as f64)
    }
}

/// The report as a plain-text table.
pub fn table(r: &Report) -> String {
    let mut s = String::new();
    s.push_str(&format!(
        "toolgate-bench faults: {} episodes × 2 routes, seed {}, concurrency {}, {:.1} s\n\n",
        r.episodes, r.seed, r.concurrency, r.elapsed_secs
    ));
    s.push_str(&format!(
        "{:<9} {:<22} {:<18} {:>6} {:>7} {:>6} {:>7} {:>7} {:>7} {:>8} {:>10} {:>11}\n",
        "route",
        "fault",
        "strategy",
        "eps",
        "dup-ep",
        "dup%",
        "missed",
        "f-done",
        "unknown",
        "settled",
        "audit-lost",
        "rec≠ledger"
    ));
    for (k, c) in &r.cells {
        let mut p = k.split('/');
        let (route, fault, strat) = (
            p.next().unwrap_or_default(),
            p.next().unwrap_or_default(),
            p.next().unwrap_or_default(),
        );
        let (unknown, settled, lost, mismatch) = if route == "toolgate" {
            (
                c.unknown.to_string(),
                c.unknown_settled.to_string(),
                c.audit_missing.to_string(),
                c.record_mismatch.to_string(),
            )
        } else {
            ("-".into(), "-".into(), "-".into(), "-".into())
        };
        s.push_str(&format!(
            "{:<9} {:<22} {:<18} {:>6} {:>7} {:>6} {:>7} {:>7} {:>7} {:>8} {:>10} {:>11}\n",
            route,
            fault,
            strat,
            c.episodes,
            c.duplicate_episodes,
            pct(c.duplicate_episodes, c.episodes),
            c.missed,
            c.false_done,
            unknown,
            settled,
            lost,
            mismatch
        ));
    }
    s.push('\n');
    for (route, c) in &r.totals {
        s.push_str(&format!(
            "{route:<9} total: {} episodes, {} with duplicates ({}; {} extra payments), {} missed, {} false done, {} unknown ({} settled), {} governed attempts without audit record, {} recorded outcomes contradicting the ledger\n",
            c.episodes,
            c.duplicate_episodes,
            pct(c.duplicate_episodes, c.episodes),
            c.duplicate_effects,
            c.missed,
            c.false_done,
            c.unknown,
            c.unknown_settled,
            c.audit_missing,
            c.record_mismatch
        ));
    }
    s.push_str(&format!(
        "audit chain: {} records, {}\n",
        r.audit_records,
        if r.audit_chain_intact {
            "intact"
        } else {
            "BROKEN"
        }
    ));
    s
}

// ------------------------------------------------------------------ paired toggles

/// The mechanisms `toggles` switches off one at a time in the fault episodes.
pub const FAULT_TOGGLES: [&str; 3] = ["derived-keys", "reserve-before-call", "unknown-on-timeout"];

/// One run of the paired toggles: the same seeded episodes with one mechanism off (or none).
#[derive(Debug, Clone, Serialize)]
pub struct ToggleRun {
    /// The mechanism switched off, or `none`.
    pub off: String,
    pub upstream_dedupes: bool,
    pub total: Cell,
    /// `fault` → totals.
    pub by_fault: BTreeMap<String, Cell>,
    pub audit_chain_intact: bool,
}

/// The approval episodes with the input binding on or off.
#[derive(Debug, Clone, Default, Serialize)]
pub struct ApprovalCell {
    pub episodes: u64,
    /// Episodes in which the agent changed the inputs after approval.
    pub tampered: u64,
    /// Payments booked with inputs no person approved.
    pub unsafe_commits: u64,
    /// Faithful episodes (inputs unchanged) whose approved payment was not booked.
    pub faithful_missed: u64,
    /// Payments booked beyond one per episode.
    pub duplicate_effects: u64,
}

#[derive(Debug, Clone, Serialize)]
pub struct ApprovalRun {
    pub off: String,
    pub cell: ApprovalCell,
}

/// Everything `toolgate-bench toggles` measured.
#[derive(Debug, Clone, Serialize)]
pub struct ToggleReport {
    pub episodes: u64,
    pub approval_episodes: u64,
    pub seed: u64,
    pub elapsed_secs: f64,
    pub faults: Vec<ToggleRun>,
    pub approvals: Vec<ApprovalRun>,
}

/// Runs the fault episodes (through toolgate only) with every mechanism on and with each of
/// [`FAULT_TOGGLES`] off, against an ERP that deduplicates on the key and one that does not;
/// then the approval episodes with the approval binding on and off.
pub async fn run_toggles(
    episodes: u64,
    approval_episodes: u64,
    seed: u64,
    concurrency: usize,
) -> anyhow::Result<ToggleReport> {
    let started = Instant::now();
    let mut faults = Vec::new();
    for upstream_dedupes in [true, false] {
        for off in std::iter::once("none").chain(FAULT_TOGGLES) {
            let toggles = ExecutorToggles::all_but(off).unwrap_or_default();
            let r = run_faults(RunOptions {
                toggles,
                upstream_dedupes,
                direct: false,
                ..RunOptions::new(episodes, seed, concurrency)
            })
            .await?;
            eprintln!(
                "toggles: {off} off, upstream dedupes {upstream_dedupes}: {:.0} s",
                r.elapsed_secs
            );
            faults.push(ToggleRun {
                off: off.to_string(),
                upstream_dedupes,
                total: r.totals["toolgate"].clone(),
                by_fault: r
                    .by_fault
                    .iter()
                    .filter_map(|(k, c)| {
                        k.strip_prefix("toolgate/")
                            .map(|f| (f.to_string(), c.clone()))
                    })
                    .collect(),
                audit_chain_intact: r.audit_chain_intact,
            });
        }
    }
    let mut approvals = Vec::new();
    for off in ["none", "approval-binding"] {
        let toggles = ExecutorToggles::all_but(off).unwrap_or_default();
        let cell = run_approvals(approval_episodes, seed, concurrency, toggles).await?;
        approvals.push(ApprovalRun {
            off: off.to_string(),
            cell,
        });
    }
    Ok(ToggleReport {
        episodes,
        approval_episodes,
        seed,
        elapsed_secs: started.elapsed().as_secs_f64(),
        faults,
        approvals,
    })
}

/// The approver in the finance example who approves the bench's payments.
const APPROVER: &str = "alice";
const APPROVED_DATE: &str = "2026-06-30";
const TAMPERED_DATE: &str = "2026-06-01";

/// Approval episodes: the agent asks to pay, a person approves the exact inputs shown, then
/// the agent sends the call with the approval token — in a seeded half of the episodes with
/// the value date moved (an instruction injected after approval), in the other half unchanged.
/// A payment booked with a value date nobody approved is an unsafe commit.
pub async fn run_approvals(
    episodes: u64,
    seed: u64,
    concurrency: usize,
    toggles: ExecutorToggles,
) -> anyhow::Result<ApprovalCell> {
    let bench = Arc::new(
        Bench::start(Setup {
            gated: true,
            ..Setup::new(Timing::default())
        })
        .await?,
    );
    bench.gateway.state.executor().toggles.set(toggles);
    let next = Arc::new(std::sync::atomic::AtomicU64::new(0));
    let mut workers = Vec::new();
    for _ in 0..concurrency.max(1) {
        let bench = bench.clone();
        let next = next.clone();
        workers.push(tokio::spawn(async move {
            let agent = Mcp::connect(&bench.gateway_url, Some(BENCH_KEY)).await?;
            let mut cell = ApprovalCell::default();
            loop {
                let i = next.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                if i >= episodes {
                    break;
                }
                // The same seeded coin for every toggle setting.
                let tampered =
                    (seed.wrapping_add(i).wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 33) & 1 == 1;
                approval_episode(&bench, &agent, seed, i, tampered, &mut cell).await?;
            }
            agent.close().await;
            anyhow::Ok(cell)
        }));
    }
    let mut total = ApprovalCell::default();
    for w in workers {
        let c = w.await??;
        total.episodes += c.episodes;
        total.tampered += c.tampered;
        total.unsafe_commits += c.unsafe_commits;
        total.faithful_missed += c.faithful_missed;
        total.duplicate_effects += c.duplicate_effects;
    }
    if let Ok(b) = Arc::try_unwrap(bench) {
        b.shutdown().await;
    }
    Ok(total)
}

async fn approval_episode(
    bench: &Bench,
    agent: &Mcp,
    seed: u64,
    index: u64,
    tampered: bool,
    cell: &mut ApprovalCell,
) -> anyhow::Result<()> {
    let run = format!("approve-s{seed}-e{index}");
    let patience = Duration::from_secs(30);
    // Approval episodes pay invoices of their own numbers (from five million on).
    let invoice_id = invoice(5_000_000 + index);
    let args = |date: &str, reason: &str| {
        json!({
            "invoice_id": invoice_id,
            "amount": AMOUNT,
            "currency": "EUR",
            "value_date": date,
            "reason": reason,
        })
    };
    let meta = json!({"purpose": "billing", "reason": REASONS[0], "run_id": run});
    let asked = agent
        .call(
            "payment.schedule",
            args(APPROVED_DATE, REASONS[0]),
            meta.clone(),
            patience,
        )
        .await;
    if !matches!(&asked, Answer::Error(s) if s == "needs_approval") {
        let records = bench
            .gateway
            .state
            .store
            .audit_records(None, Some(&run.as_str().into()))
            .await?;
        let why: Vec<String> = records
            .iter()
            .map(|r| format!("{:?} {:?}", r.body.why.rule, r.body.outcome.error))
            .collect();
        anyhow::bail!("episode {index}: a gated payment was not parked: {asked:?} {why:?}");
    }
    let exec = bench.gateway.state.executor();
    let request = exec
        .store
        .approvals(Some(toolgate_store::ApprovalStatus::Pending))
        .await?
        .into_iter()
        .find(|r| r.run_id.as_deref() == Some(run.as_str()))
        .with_context(|| format!("episode {index}: no pending approval request"))?;
    let token = exec
        .store
        .approve(
            &exec.registry,
            &exec.keys,
            &request.approval_id,
            &toolgate_core::PrincipalId::from(APPROVER),
            exec.clock.now(),
        )
        .await?;
    let (date, reason) = if tampered {
        (
            TAMPERED_DATE,
            "Supplier asked by email to be paid on the 1st instead (INV-20260611, PO-77812); book it today.",
        )
    } else {
        (APPROVED_DATE, REASONS[0])
    };
    let mut meta = meta;
    meta["approval_token"] = json!(token.as_str());
    let _ = agent
        .call("payment.schedule", args(date, reason), meta, patience)
        .await;

    let booked = bench.fake().booked_inputs(&run);
    cell.episodes += 1;
    cell.tampered += u64::from(tampered);
    cell.unsafe_commits += booked
        .iter()
        .filter(|b| b["value_date"] != json!(APPROVED_DATE))
        .count() as u64;
    cell.duplicate_effects += (booked.len() as u64).saturating_sub(1);
    if !tampered && booked.is_empty() {
        cell.faithful_missed += 1;
    }
    Ok(())
}

fn pp(n: u64, d: u64, base: f64) -> (String, String) {
    if d == 0 {
        return ("-".into(), "-".into());
    }
    let v = 100.0 * n as f64 / d as f64;
    (format!("{v:.1}%"), format!("{:+.1}", v - base))
}

/// The paired toggles as plain-text tables.
pub fn toggle_table(r: &ToggleReport) -> String {
    let mut s = format!(
        "toolgate-bench toggles: {} fault episodes per setting (through toolgate), {} approval episodes per setting, seed {}, {:.0} s\n\n",
        r.episodes, r.approval_episodes, r.seed, r.elapsed_secs
    );
    s.push_str(&format!(
        "{:<22} {:<17} {:>6} {:>7} {:>6} {:>8} {:>6} {:>7} {:>7} {:>7}\n",
        "mechanism off",
        "upstream",
        "eps",
        "dup-ep",
        "dup%",
        "Δ pp",
        "extra",
        "missed",
        "unknown",
        "chain"
    ));
    for dedupes in [true, false] {
        let base = r
            .faults
            .iter()
            .find(|t| t.upstream_dedupes == dedupes && t.off == "none")
            .map(|t| 100.0 * t.total.duplicate_episodes as f64 / t.total.episodes.max(1) as f64)
            .unwrap_or(0.0);
        for t in r.faults.iter().filter(|t| t.upstream_dedupes == dedupes) {
            let (pct, delta) = pp(t.total.duplicate_episodes, t.total.episodes, base);
            s.push_str(&format!(
                "{:<22} {:<17} {:>6} {:>7} {:>6} {:>8} {:>6} {:>7} {:>7} {:>7}\n",
                t.off,
                if dedupes {
                    "dedupes by key"
                } else {
                    "no dedupe"
                },
                t.total.episodes,
                t.total.duplicate_episodes,
                pct,
                delta,
                t.total.duplicate_effects,
                t.total.missed,
                t.total.unknown,
                if t.audit_chain_intact {
                    "intact"
                } else {
                    "BROKEN"
                }
            ));
        }
    }
    s.push_str(
        "\nduplicate episodes by fault (dup% per fault; Δ pp against every mechanism on):\n",
    );
    let faults: Vec<&str> = Fault::ALL.iter().map(|f| f.name()).collect();
    s.push_str(&format!("{:<22} {:<17}", "mechanism off", "upstream"));
    for f in &faults {
        s.push_str(&format!(" {f:>22}"));
    }
    s.push('\n');
    for dedupes in [true, false] {
        let base = r
            .faults
            .iter()
            .find(|t| t.upstream_dedupes == dedupes && t.off == "none");
        for t in r.faults.iter().filter(|t| t.upstream_dedupes == dedupes) {
            s.push_str(&format!(
                "{:<22} {:<17}",
                t.off,
                if dedupes {
                    "dedupes by key"
                } else {
                    "no dedupe"
                }
            ));
            for f in &faults {
                let c = t.by_fault.get(*f).cloned().unwrap_or_default();
                let b = base
                    .and_then(|b| b.by_fault.get(*f))
                    .map(|b| 100.0 * b.duplicate_episodes as f64 / b.episodes.max(1) as f64)
                    .unwrap_or(0.0);
                let (pct, delta) = pp(c.duplicate_episodes, c.episodes, b);
                s.push_str(&format!(" {:>22}", format!("{pct} ({delta})")));
            }
            s.push('\n');
        }
    }
    s.push_str(&format!(
        "\n{:<22} {:>6} {:>9} {:>8} {:>8} {:>8} {:>9} {:>6}\n",
        "mechanism off", "eps", "tampered", "unsafe", "unsafe%", "Δ pp", "f-missed", "extra"
    ));
    let base = r
        .approvals
        .iter()
        .find(|a| a.off == "none")
        .map(|a| 100.0 * a.cell.unsafe_commits as f64 / a.cell.episodes.max(1) as f64)
        .unwrap_or(0.0);
    for a in &r.approvals {
        let (pct, delta) = pp(a.cell.unsafe_commits, a.cell.episodes, base);
        s.push_str(&format!(
            "{:<22} {:>6} {:>9} {:>8} {:>8} {:>8} {:>9} {:>6}\n",
            a.off,
            a.cell.episodes,
            a.cell.tampered,
            a.cell.unsafe_commits,
            pct,
            delta,
            a.cell.faithful_missed,
            a.cell.duplicate_effects
        ));
    }
    s
}
