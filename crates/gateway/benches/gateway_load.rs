//! Load benchmark (not a test): the finance fake called directly, through a relay that only
//! forwards (rmcp on both sides, as toolgate is built), and through toolgate, over streamable
//! HTTP, in one run, at concurrency 1, 8 and 32, with the durable audit on (SQLite, WAL, fsync
//! on commit). Each call is a governed read (`invoice.search`) in its own run, so
//! every call is decided, reserved, forwarded and recorded — none is a replay.
//!
//! Run: `cargo bench -p toolgate-gateway --bench gateway_load` (`-- --secs N` per level;
//! `-- --no-pin` serves without checking `toolgate.lock`, to compare;
//! `-- --wal-preallocate-mb 0` lets commits grow the WAL file instead of preallocating it;
//! `-- --no-keep-alive` has toolgate open a new connection to the fake for every request;
//! `-- --conc N` runs one level only; `-- --durability process` does not fsync each record).

use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::serve::ListenerExt;
use rmcp::model::{CallToolRequestParams, JsonObject, MetaObject, RequestMetaObject};
use rmcp::model::{CallToolResponse, ServerCapabilities, ServerConfig};
use rmcp::service::RequestContext;
use rmcp::service::RunningService;
use rmcp::transport::streamable_http_client::StreamableHttpClientTransportConfig;
use rmcp::transport::streamable_http_server::session::local::LocalSessionManager;
use rmcp::transport::{
    StreamableHttpClientTransport, StreamableHttpServerConfig, StreamableHttpService,
};
use rmcp::{ErrorData, RoleClient, RoleServer, ServerHandler, ServiceExt};
use serde_json::json;
use tokio_util::sync::CancellationToken;
use toolgate_core::registry::api_key_hash;
use toolgate_fakes::{FakeServer, FaultPlan, Recorder};
use toolgate_gateway::{Gateway, ServeOptions};

const KEY: &str = "tg-bench-worker-key";

/// The allocator of the `toolgate` binary, so the gateway measured here runs as it ships.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

async fn fake() -> String {
    let server = FakeServer::new(
        toolgate_fakes::finance::Finance::seeded(),
        Recorder::disabled(),
        FaultPlan::new(Vec::new(), 1),
    );
    let service = StreamableHttpService::new(
        move || Ok(server.clone()),
        Arc::new(LocalSessionManager::default()),
        StreamableHttpServerConfig::default(),
    );
    serve_mcp(service).await
}

/// Serves `service` at `/mcp` on a loopback port; returns its URL.
async fn serve_mcp<S, M>(service: StreamableHttpService<S, M>) -> String
where
    S: ServerHandler + Send + 'static,
    M: rmcp::transport::streamable_http_server::SessionManager,
{
    let app = axum::Router::new().nest_service("/mcp", service);
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    // TCP_NODELAY, as the fake binary (and Node's and Python's HTTP servers) set it.
    let l = l.tap_io(|tcp| {
        let _ = tcp.set_nodelay(true);
    });
    tokio::spawn(async move { axum::serve(l, app).await.unwrap() });
    format!("http://{addr}/mcp")
}

/// A relay that does nothing but forward `tools/call` to the fake, built with rmcp on both sides
/// and configured as toolgate's endpoint and upstream client are (sessions, JSON replies,
/// TCP_NODELAY, one kept-alive upstream connection): what any rmcp-built MCP proxy adds on this
/// machine before it governs anything.
#[derive(Clone)]
struct Relay(Arc<RunningService<RoleClient, ()>>);

impl ServerHandler for Relay {
    fn get_info(&self) -> ServerConfig {
        ServerConfig::new(ServerCapabilities::builder().enable_tools().build())
    }

    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        _: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, ErrorData> {
        self.0
            .peer()
            .call_tool_once(request)
            .await
            .map_err(|e| ErrorData::internal_error(e.to_string(), None))
    }
}

async fn relay(upstream: &str) -> String {
    let http = reqwest::Client::builder()
        .tcp_nodelay(true)
        .build()
        .unwrap();
    let up = ()
        .serve(StreamableHttpClientTransport::with_client(
            http,
            StreamableHttpClientTransportConfig::with_uri(upstream),
        ))
        .await
        .unwrap();
    let relay = Relay(Arc::new(up));
    serve_mcp(StreamableHttpService::new(
        move || Ok(relay.clone()),
        Arc::new(LocalSessionManager::default()),
        StreamableHttpServerConfig::default().with_json_response(true),
    ))
    .await
}

fn registry(
    dir: &std::path::Path,
    upstream: &str,
    wal_mb: u64,
    keep_alive: bool,
    durability: &str,
) {
    let ex = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples/finance");
    std::fs::create_dir_all(dir.join("tools")).unwrap();
    std::fs::create_dir_all(dir.join("policies")).unwrap();
    for sub in ["tools", "policies"] {
        for e in std::fs::read_dir(ex.join(sub)).unwrap() {
            let e = e.unwrap();
            std::fs::copy(e.path(), dir.join(sub).join(e.file_name())).unwrap();
        }
    }
    let roles = [
        "planner",
        "worker.finance",
        "worker.comms",
        "reviewer",
        "reconciler",
        "ap.clerk",
        "supplier.admin",
    ];
    let mut p = String::from("roles:\n");
    for r in roles {
        p.push_str(&format!("  {r}: {{description: \"{r}\"}}\n"));
    }
    p.push_str(&format!(
        "principals:\n  - id: bench\n    kind: agent\n    role: worker.finance\n    credentials:\n      - {{id: b, sha256: \"{}\"}}\n    grants:\n      - scopes: [invoices:read]\n        purposes: [billing]\n        max_tier: read\n        max_sensitivity: confidential\n",
        api_key_hash(KEY)
    ));
    std::fs::write(dir.join("principals.yaml"), p).unwrap();
    std::fs::write(
        dir.join("toolgate.yaml"),
        format!("label: bench\nstore:\n  url: \"sqlite://bench.db\"\n  wal_preallocate_mb: {wal_mb}\n  durability: {durability}\nupstreams:\n  erp:\n    url: \"{upstream}\"\n    package: \"toolgate-fakes@0.1.0\"\n    timeout_secs: 10\n    keep_alive: {keep_alive}\n"),
    )
    .unwrap();
}

async fn client(url: &str, key: Option<&str>) -> RunningService<RoleClient, ()> {
    let mut cfg = StreamableHttpClientTransportConfig::with_uri(url);
    if let Some(k) = key {
        cfg = cfg.auth_header(k);
    }
    ().serve(StreamableHttpClientTransport::from_config(cfg))
        .await
        .unwrap()
}

fn obj(v: serde_json::Value) -> JsonObject {
    v.as_object().unwrap().clone()
}

/// Runs `conc` clients calling `tool` for `secs`; returns the sorted latencies (µs).
async fn level(
    url: &str,
    key: Option<&str>,
    tool: &'static str,
    conc: usize,
    secs: f64,
    tag: &str,
) -> (Vec<u64>, f64) {
    let mut clients = Vec::new();
    for _ in 0..conc {
        clients.push(client(url, key).await);
    }
    let deadline = Instant::now() + Duration::from_secs_f64(secs);
    let started = Instant::now();
    let mut tasks = Vec::new();
    for (c, cl) in clients.into_iter().enumerate() {
        let tag = tag.to_string();
        tasks.push(tokio::spawn(async move {
            let mut lat = Vec::new();
            let mut i = 0u64;
            while Instant::now() < deadline {
                i += 1;
                let mut p = CallToolRequestParams::new(tool)
                    .with_arguments(obj(json!({"invoice_id": "INV-20260615"})));
                p.meta = Some(RequestMetaObject(MetaObject(obj(json!({
                    "purpose": "billing", "reason": "benchmark", "run_id": format!("{tag}-{c}-{i}")
                })))));
                let t = Instant::now();
                let r = cl.peer().call_tool(p).await.expect("call");
                assert_ne!(r.is_error, Some(true), "{r:?}");
                lat.push(t.elapsed().as_micros() as u64);
            }
            let _ = cl.cancel().await;
            lat
        }));
    }
    let mut all = Vec::new();
    for t in tasks {
        all.extend(t.await.unwrap());
    }
    let elapsed = started.elapsed().as_secs_f64();
    all.sort_unstable();
    let rate = all.len() as f64 / elapsed;
    (all, rate)
}

fn pct(v: &[u64], p: f64) -> u64 {
    v[((v.len() as f64 - 1.0) * p).round() as usize]
}

/// The value after `flag` on the command line, if any.
fn arg<T: std::str::FromStr>(flag: &str) -> Option<T> {
    std::env::args()
        .skip_while(|a| a != flag)
        .nth(1)
        .and_then(|s| s.parse().ok())
}

fn main() {
    let secs: f64 = arg("--secs").unwrap_or(3.0);
    // `--wal-preallocate-mb 0` measures without growing the WAL file ahead of the commits.
    let wal_mb: u64 = arg("--wal-preallocate-mb").unwrap_or(40);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let upstream = fake().await;
        let dir = tempfile::tempdir().unwrap();
        // `--no-keep-alive`: toolgate opens a connection to the fake per request, as rmcp's
        // default client does.
        let keep_alive = !std::env::args().any(|a| a == "--no-keep-alive");
        // `--durability process`: commits are not fsync'd one by one (they survive the gateway
        // being killed, not a power loss).
        let durability: String = arg("--durability").unwrap_or_else(|| "fsync".into());
        registry(dir.path(), &upstream, wal_mb, keep_alive, &durability);
        println!("upstream connections: {}", if keep_alive { "kept open (keep_alive: true)" } else { "one per request (--no-keep-alive)" });
        // Pinned as the finance example is (its toolgate.lock, moved to the fake's URL); with
        // `--no-pin` no pin check at all, to show what pinning costs per call.
        let no_pin = std::env::args().any(|a| a == "--no-pin");
        std::fs::copy(std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples/finance/toolgate.lock"), dir.path().join("toolgate.lock")).unwrap();
        toolgate_gateway::pins::rehome_lock(dir.path()).unwrap();
        let opts = ServeOptions { config_dir: dir.path().into(), http: true, keys: toolgate_gateway::KeySource::Dev, ..Default::default() };
        let gw = if no_pin { Gateway::build_without_pins(&opts).await } else { Gateway::build(&opts).await }.unwrap();
        println!("pinning: {}", if no_pin { "off (--no-pin)" } else { "on (toolgate.lock)" });
        gw.state.store.wal_preallocated().await;
        println!("SQLite WAL preallocated: {wal_mb} MiB");
        let (addr, fut) = gw.bind_http("127.0.0.1:0", CancellationToken::new()).await.unwrap();
        tokio::spawn(fut);
        let through = format!("http://{addr}/mcp");
        println!("gateway_load: {secs} s per level; direct = fake ERP over streamable HTTP; through = toolgate → same fake, SQLite audit (WAL, durability: {durability})");
        let relayed = relay(&upstream).await;
        println!("relay = a do-nothing rmcp proxy (rmcp server and client, configured as toolgate's) → same fake");
        println!("| conc | path | p50 µs | p99 µs | calls/s | added p50 µs | added p99 µs |");
        println!("|---:|---|---:|---:|---:|---:|---:|");
        let only: Option<usize> = arg("--conc");
        for conc in [1usize, 8, 32].into_iter().filter(|c| only.is_none_or(|o| o == *c)) {
            let (d, dr) = level(&upstream, None, "search_invoices", conc, secs, "direct").await;
            let (r, rr) = level(&relayed, None, "search_invoices", conc, secs, "relay").await;
            let (t, tr) = level(&through, Some(KEY), "invoice.search", conc, secs, &format!("gw{conc}")).await;
            println!("| {conc} | direct | {} | {} | {dr:.0} | | |", pct(&d, 0.5), pct(&d, 0.99));
            for (path, v, rate) in [("relay", &r, rr), ("toolgate", &t, tr)] {
                println!(
                    "| {conc} | {path} | {} | {} | {rate:.0} | {} | {} |",
                    pct(v, 0.5), pct(v, 0.99),
                    pct(v, 0.5) as i64 - pct(&d, 0.5) as i64,
                    pct(v, 0.99) as i64 - pct(&d, 0.99) as i64,
                );
            }
        }
        let audit = gw.state.store.audit_records(Some(&"bench".into()), None).await.unwrap();
        println!("audit records written: {}", audit.len());
        gw.close().await;
    });
}
