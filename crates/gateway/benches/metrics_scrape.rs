//! `/metrics` benchmark (not a test): what a scrape costs with 100,000 records in the audit
//! chain, and what 8 scrapers scraping back to back do to a governed call's latency.
//!
//! The gateway is toolgate as `serve` runs it (the finance fake upstream over streamable HTTP,
//! SQLite with WAL and fsync on commit, `metrics.token_file` in toolgate.yaml). The chain is
//! seeded with copies of a real governed call's record (90 % allowed, 8 % denied by a rule,
//! 2 % for tool names an agent made up) and 2,000 approval requests. Then:
//!
//! 1. the first scrape, which folds the whole chain in (once per process);
//! 2. scrapes over HTTP with nothing new (the usual case between two calls), and after 100
//!    new records;
//! 3. the aggregate alone (`Metrics::scrape`) with the approval and budget tables re-read on
//!    every scrape, the worst case (the gateway reuses them for 5 s);
//! 4. a governed call (`invoice.search`, each in its own run, one at a time) without scrapers,
//!    with 8 scrapers holding the token in tight loops, and with 8 anonymous clients in tight
//!    loops, in `--rounds` interleaved slices of `--secs` each, pooled per phase.
//!
//! Run: `cargo bench -p toolgate-gateway --bench metrics_scrape` (`-- --records N`,
//! `-- --secs S` per slice, `-- --rounds N`).

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use axum::serve::ListenerExt;
use rmcp::model::{CallToolRequestParams, JsonObject, MetaObject, RequestMetaObject};
use rmcp::service::RunningService;
use rmcp::transport::streamable_http_client::StreamableHttpClientTransportConfig;
use rmcp::transport::streamable_http_server::session::local::LocalSessionManager;
use rmcp::transport::{
    StreamableHttpClientTransport, StreamableHttpServerConfig, StreamableHttpService,
};
use rmcp::{RoleClient, ServiceExt};
use serde_json::json;
use tokio_util::sync::CancellationToken;
use toolgate_console::metrics::Metrics;
use toolgate_console::{MetricsOptions, ScrapeToken};
use toolgate_core::Timestamp;
use toolgate_core::registry::api_key_hash;
use toolgate_fakes::{FakeServer, FaultPlan, Recorder};
use toolgate_gateway::{Gateway, ServeOptions};
use toolgate_store::{AuditDecision, AuditDraft};

const KEY: &str = "tg-bench-worker-key";
const TOKEN: &str = "tg-bench-scrape-token-0001";

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
    let app = axum::Router::new().nest_service("/mcp", service);
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    let l = l.tap_io(|tcp| {
        let _ = tcp.set_nodelay(true);
    });
    tokio::spawn(async move { axum::serve(l, app).await.unwrap() });
    format!("http://{addr}/mcp")
}

/// The finance example's tools and policies, one worker, the fake as `erp`, a scrape token file.
fn registry(dir: &std::path::Path, upstream: &str) {
    let ex = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples/finance");
    for sub in ["tools", "policies"] {
        std::fs::create_dir_all(dir.join(sub)).unwrap();
        for e in std::fs::read_dir(ex.join(sub)).unwrap() {
            let e = e.unwrap();
            std::fs::copy(e.path(), dir.join(sub).join(e.file_name())).unwrap();
        }
    }
    let mut p = String::from("roles:\n");
    for r in [
        "planner",
        "worker.finance",
        "worker.comms",
        "reviewer",
        "reconciler",
        "ap.clerk",
        "supplier.admin",
    ] {
        p.push_str(&format!("  {r}: {{description: \"{r}\"}}\n"));
    }
    p.push_str(&format!(
        "principals:\n  - id: bench\n    kind: agent\n    role: worker.finance\n    credentials:\n      - {{id: b, sha256: \"{}\"}}\n    grants:\n      - scopes: [invoices:read]\n        purposes: [billing]\n        max_tier: read\n        max_sensitivity: confidential\n",
        api_key_hash(KEY)
    ));
    std::fs::write(dir.join("principals.yaml"), p).unwrap();
    std::fs::write(dir.join("metrics-token"), format!("{TOKEN}\n")).unwrap();
    std::fs::write(
        dir.join("toolgate.yaml"),
        format!("label: bench\nstore:\n  url: \"sqlite://bench.db\"\nupstreams:\n  erp:\n    url: \"{upstream}\"\n    package: \"toolgate-fakes@0.1.0\"\n    timeout_secs: 10\n    keep_alive: true\nmetrics:\n  token_file: metrics-token\n"),
    )
    .unwrap();
    std::fs::copy(ex.join("toolgate.lock"), dir.join("toolgate.lock")).unwrap();
    toolgate_gateway::pins::rehome_lock(dir).unwrap();
}

async fn client(url: &str) -> RunningService<RoleClient, ()> {
    let cfg = StreamableHttpClientTransportConfig::with_uri(url).auth_header(KEY);
    ().serve(StreamableHttpClientTransport::from_config(cfg))
        .await
        .unwrap()
}

fn obj(v: serde_json::Value) -> JsonObject {
    v.as_object().unwrap().clone()
}

/// One governed read in its own run; returns its latency in µs.
async fn governed(c: &RunningService<RoleClient, ()>, run: String) -> u64 {
    let mut p = CallToolRequestParams::new("invoice.search")
        .with_arguments(obj(json!({"invoice_id": "INV-20260615"})));
    p.meta = Some(RequestMetaObject(MetaObject(obj(json!({
        "purpose": "billing", "reason": "benchmark", "run_id": run
    })))));
    let t = Instant::now();
    let r = c.peer().call_tool(p).await.expect("call");
    assert_ne!(r.is_error, Some(true), "{r:?}");
    t.elapsed().as_micros() as u64
}

/// Governed calls one at a time for `secs`; sorted latencies (µs).
async fn calls(c: &RunningService<RoleClient, ()>, secs: f64, tag: &str) -> Vec<u64> {
    let deadline = Instant::now() + Duration::from_secs_f64(secs);
    let mut lat = Vec::new();
    let mut i = 0;
    while Instant::now() < deadline {
        i += 1;
        lat.push(governed(c, format!("{tag}-{i}")).await);
    }
    lat.sort_unstable();
    lat
}

/// Governed calls for `secs` while `n` clients request `/metrics` back to back (with `token`,
/// or none); returns the calls' latencies (µs), the requests the clients made, and the time.
async fn with_scrapers(
    worker: &RunningService<RoleClient, ()>,
    url: &str,
    n: usize,
    token: Option<&'static str>,
    secs: f64,
    tag: &str,
) -> (Vec<u64>, u64, f64) {
    let stop = Arc::new(AtomicBool::new(false));
    let scraped = Arc::new(AtomicU64::new(0));
    let mut clients = Vec::new();
    for _ in 0..n {
        let (stop, scraped, url) = (stop.clone(), scraped.clone(), url.to_string());
        let http = reqwest::Client::builder()
            .tcp_nodelay(true)
            .build()
            .unwrap();
        clients.push(tokio::spawn(async move {
            while !stop.load(Ordering::Relaxed) {
                let mut req = http.get(&url);
                if let Some(t) = token {
                    req = req.bearer_auth(t);
                }
                let r = req.send().await.unwrap();
                assert_eq!(r.status().as_u16(), if token.is_some() { 200 } else { 401 });
                r.bytes().await.unwrap();
                scraped.fetch_add(1, Ordering::Relaxed);
            }
        }));
    }
    let t = Instant::now();
    let lat = calls(worker, secs, tag).await;
    let took = t.elapsed().as_secs_f64();
    stop.store(true, Ordering::Relaxed);
    for c in clients {
        c.await.unwrap();
    }
    (lat, scraped.load(Ordering::Relaxed), took)
}

fn pct(v: &[u64], p: f64) -> u64 {
    v[((v.len() as f64 - 1.0) * p).round() as usize]
}

fn ms(us: u64) -> String {
    format!("{:.2}", us as f64 / 1000.0)
}

async fn scrape(http: &reqwest::Client, url: &str) -> (u64, usize) {
    let t = Instant::now();
    let r = http.get(url).bearer_auth(TOKEN).send().await.unwrap();
    assert_eq!(r.status().as_u16(), 200);
    let body = r.text().await.unwrap();
    (t.elapsed().as_micros() as u64, body.len())
}

/// The value after `flag` on the command line, if any.
fn arg<T: std::str::FromStr>(flag: &str) -> Option<T> {
    std::env::args()
        .skip_while(|a| a != flag)
        .nth(1)
        .and_then(|s| s.parse().ok())
}

/// `n` copies of `template` (seq and time advance), 8 % denied by a rule, 2 % for made-up tools.
fn seeds(template: &AuditDraft, from: usize, n: usize) -> Vec<AuditDraft> {
    (from..from + n)
        .map(|i| {
            let mut d = template.clone();
            d.ts = Timestamp::from_millis(template.ts.millis() + i as i64);
            d.run_id = Some(format!("seed-{i}").into());
            match i % 50 {
                0 => {
                    d.tool = format!("made.up.tool.{i}.{}", "x".repeat(200));
                    d.why.decision = AuditDecision::Deny;
                    d.why.rule = Some("tool.unknown".into());
                }
                1..=4 => {
                    d.why.decision = AuditDecision::Deny;
                    d.why.rule = Some("grant.purpose".into());
                }
                _ => {}
            }
            d
        })
        .collect()
}

fn main() {
    let records: usize = arg("--records").unwrap_or(100_000);
    let secs: f64 = arg("--secs").unwrap_or(1.5);
    let rounds: usize = arg("--rounds").unwrap_or(6);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let upstream = fake().await;
        let dir = tempfile::tempdir().unwrap();
        registry(dir.path(), &upstream);
        let opts = ServeOptions { config_dir: dir.path().into(), http: true, keys: toolgate_gateway::KeySource::Dev, ..Default::default() };
        let gw = Gateway::build(&opts).await.unwrap();
        gw.state.store.wal_preallocated().await;
        let (addr, fut) = gw.bind_http("127.0.0.1:0", CancellationToken::new()).await.unwrap();
        tokio::spawn(fut);
        let mcp = format!("http://{addr}/mcp");
        let metrics_url = format!("http://{addr}/metrics");
        let worker = client(&mcp).await;

        // A real governed call's record is the template of the seeds.
        governed(&worker, "template".into()).await;
        let store = &gw.state.store;
        let template = store.audit_records(Some(&"bench".into()), None).await.unwrap().pop().unwrap().body;
        let t = Instant::now();
        let mut seeded = 0;
        while seeded < records {
            let n = (records - seeded).min(2000);
            store.append_audit(seeds(&template, seeded, n)).await.unwrap();
            seeded += n;
        }
        store.execute_raw(
            "WITH RECURSIVE c(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM c WHERE i < 2000) \
             INSERT INTO approval_requests (approval_id, subject, principal, tool, tool_version, \
             input_hash, inputs, rule, approvers_needed, status, created_at, expires_at, decided_at) \
             SELECT 'ap-' || i, 'sub-' || i, 'bench', 'payment.schedule', '1.0.0', 'sha256:00', '{}', \
             'gate.always', 1, CASE i % 4 WHEN 0 THEN 'pending' WHEN 1 THEN 'rejected' ELSE 'consumed' END, \
             1780000000000 + i, 1780259200000 + i, CASE i % 4 WHEN 0 THEN NULL ELSE 1780000600000 + i END FROM c",
        ).await.unwrap();
        println!("metrics_scrape: {} audit records ({records} seeded in {:.1} s), 2,000 approval requests; SQLite WAL, fsync on commit", records + 1, t.elapsed().as_secs_f64());

        let http = reqwest::Client::builder().tcp_nodelay(true).build().unwrap();
        let (cold, size) = scrape(&http, &metrics_url).await;
        println!("| scrape | n | p50 ms | p99 ms | max ms | page bytes |");
        println!("|---|---:|---:|---:|---:|---:|");
        println!("| first (folds the whole chain once) | 1 | {} | | | {size} |", ms(cold));
        // Spaced past the gateway's 100 ms between pages, so each measures a scrape, not a wait.
        let gap = Duration::from_millis(110);
        let mut warm = Vec::new();
        for _ in 0..100 {
            tokio::time::sleep(gap).await;
            warm.push(scrape(&http, &metrics_url).await.0);
        }
        warm.sort_unstable();
        println!("| over HTTP, nothing new | {} | {} | {} | {} | |", warm.len(), ms(pct(&warm, 0.5)), ms(pct(&warm, 0.99)), ms(*warm.last().unwrap()));
        let mut after = Vec::new();
        for round in 0..50 {
            store.append_audit(seeds(&template, records + round * 100, 100)).await.unwrap();
            tokio::time::sleep(gap).await;
            after.push(scrape(&http, &metrics_url).await.0);
        }
        after.sort_unstable();
        println!("| over HTTP, 100 new records | {} | {} | {} | {} | |", after.len(), ms(pct(&after, 0.5)), ms(pct(&after, 0.99)), ms(*after.last().unwrap()));

        // The aggregate alone, with the tables re-read on every scrape (the worst case).
        let m = Metrics::new(MetricsOptions {
            token: Some(ScrapeToken::new(TOKEN).unwrap()),
            table_refresh: Duration::ZERO,
            min_interval: Duration::ZERO,
            ..MetricsOptions::default()
        });
        let exec = gw.state.executor();
        let t = Instant::now();
        m.scrape(&exec).await.unwrap();
        let fold_all = t.elapsed().as_micros() as u64;
        let mut fresh = Vec::new();
        for _ in 0..500 {
            let t = Instant::now();
            m.scrape(&exec).await.unwrap();
            fresh.push(t.elapsed().as_micros() as u64);
        }
        fresh.sort_unstable();
        println!("| in process, folding the whole chain | 1 | {} | | | |", ms(fold_all));
        println!("| in process, tables re-read every scrape | {} | {} | {} | {} | |", fresh.len(), ms(pct(&fresh, 0.5)), ms(pct(&fresh, 0.99)), ms(*fresh.last().unwrap()));

        // A governed call's latency without scrapers, with 8 scrapers holding the token, and
        // with 8 anonymous clients, in interleaved slices (so drift in the disk's fsync time
        // falls on every phase alike), pooled per phase.
        println!("\ngoverned call (invoice.search, one at a time): {rounds} rounds of {secs} s per phase, interleaved");
        println!("| phase | calls | p50 ms | p99 ms | requests to /metrics per s |");
        println!("|---|---:|---:|---:|---:|");
        let phases: [(&str, usize, Option<&'static str>); 3] = [
            ("no scrapers", 0, None),
            ("8 scrapers with the token, back to back", 8, Some(TOKEN)),
            ("8 anonymous clients, back to back (401)", 8, None),
        ];
        let mut pooled: Vec<(Vec<u64>, u64, f64)> = vec![(Vec::new(), 0, 0.0); phases.len()];
        for round in 0..rounds {
            for (i, (_, n, token)) in phases.iter().enumerate() {
                let (lat, scrapes, took) = with_scrapers(&worker, &metrics_url, *n, *token, secs, &format!("r{round}p{i}")).await;
                pooled[i].0.extend(lat);
                pooled[i].1 += scrapes;
                pooled[i].2 += took;
            }
        }
        let mut p50s = Vec::new();
        for ((phase, n, _), (lat, scrapes, took)) in phases.iter().zip(pooled.iter_mut()) {
            lat.sort_unstable();
            let rate = if *n > 0 { format!("{:.0}", *scrapes as f64 / *took) } else { String::new() };
            println!("| {phase} | {} | {} | {} | {rate} |", lat.len(), ms(pct(lat, 0.5)), ms(pct(lat, 0.99)));
            p50s.push(pct(lat, 0.5));
        }
        for (i, (phase, _, _)) in phases.iter().enumerate().skip(1) {
            println!(
                "p50 with {phase} vs without: {:+.1} %",
                (p50s[i] as f64 / p50s[0] as f64 - 1.0) * 100.0
            );
        }
        let _ = worker.cancel().await;
        gw.close().await;
    });
}
