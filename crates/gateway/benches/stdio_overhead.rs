//! stdio overhead benchmark (not a test): the same fake ERP binary called over stdio directly,
//! and through `toolgate serve --stdio` (which runs that binary as its stdio upstream), one call
//! at a time, in one run. Each call through toolgate is a governed read (`invoice.search`) in
//! its own run id, decided, forwarded and recorded in the SQLite audit (WAL; fsync on commit
//! unless `--durability process`). Reports per-call median and p99 and the ratio through/direct
//! (the target: ≤ 1.5× with `durability: process`).
//!
//! Uses the release binaries `toolgate` and `toolgate-fake-finance` (built here when missing).
//! Run: `cargo bench -p toolgate-gateway --bench stdio_overhead` (`-- --calls N`, default 2000;
//! `-- --durability process` leaves the commits unsynced, `store.durability: process`;
//! `-- --baseline PATH`, repeatable, also measures other `toolgate` binaries, e.g. an older
//! build, in the same alternated rounds, each on its own copy of the registry).

use std::path::{Path, PathBuf};
use std::time::Instant;

use rmcp::model::{CallToolRequestParams, JsonObject, MetaObject, RequestMetaObject};
use rmcp::service::RunningService;
use rmcp::transport::TokioChildProcess;
use rmcp::{RoleClient, ServiceExt};
use serde_json::json;
use toolgate_core::registry::api_key_hash;

const KEY: &str = "tg-bench-stdio-key";

fn release_dir() -> PathBuf {
    // target/release/deps/stdio_overhead-… → target/release
    std::env::current_exe()
        .unwrap()
        .parent()
        .unwrap()
        .parent()
        .unwrap()
        .to_path_buf()
}

fn binaries() -> (PathBuf, PathBuf) {
    let dir = release_dir();
    let (tg, fake) = (dir.join("toolgate"), dir.join("toolgate-fake-finance"));
    if !tg.exists() || !fake.exists() {
        let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
        let ok = std::process::Command::new(cargo)
            .args([
                "build",
                "--release",
                "-p",
                "toolgate",
                "-p",
                "toolgate-fakes",
            ])
            .status()
            .unwrap()
            .success();
        assert!(ok, "building the release binaries failed");
    }
    (tg, fake)
}

fn registry(dir: &Path, fake: &Path, durability: &str) {
    let ex = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples/finance");
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
    std::fs::write(
        dir.join("toolgate.yaml"),
        format!(
            "label: bench-stdio\nstore:\n  url: \"sqlite://bench.db\"\n  durability: {durability}\nupstreams:\n  erp:\n    command: \"{}\"\n    args: []\n    package: \"toolgate-fakes@0.1.0\"\n    timeout_secs: 10\n",
            fake.display(),
        ),
    )
    .unwrap();
    // The finance example's pins, moved to this command (definitions are still checked).
    std::fs::copy(ex.join("toolgate.lock"), dir.join("toolgate.lock")).unwrap();
    toolgate_gateway::pins::rehome_lock(dir).unwrap();
}

fn obj(v: serde_json::Value) -> JsonObject {
    match v {
        serde_json::Value::Object(m) => m,
        _ => unreachable!(),
    }
}

async fn spawn(cmd: tokio::process::Command) -> RunningService<RoleClient, ()> {
    ().serve(TokioChildProcess::new(cmd).unwrap())
        .await
        .expect("the stdio server answers initialize")
}

/// `calls` sequential calls; per-call microseconds, sorted.
async fn measure(
    client: &RunningService<RoleClient, ()>,
    tool: &str,
    meta: bool,
    calls: usize,
) -> Vec<u64> {
    let mut v = Vec::with_capacity(calls);
    for i in 0..calls {
        let mut p = CallToolRequestParams::new(tool.to_string())
            .with_arguments(obj(json!({"invoice_id": "INV-20260611"})));
        if meta {
            p.meta = Some(RequestMetaObject(MetaObject(obj(
                json!({"purpose": "billing", "run_id": format!("stdio-bench-{i}")}),
            ))));
        }
        let t = Instant::now();
        let r = client.peer().call_tool(p).await.expect("call");
        v.push(t.elapsed().as_micros() as u64);
        assert_ne!(r.is_error, Some(true), "{r:?}");
    }
    v.sort_unstable();
    v
}

fn pct(v: &[u64], p: f64) -> u64 {
    v[((v.len() as f64 - 1.0) * p).round() as usize]
}

fn main() {
    let mut calls = 2000usize;
    let args: Vec<String> = std::env::args().collect();
    if let Some(i) = args.iter().position(|a| a == "--calls") {
        calls = args[i + 1].parse().expect("--calls N");
    }
    // `--durability process`: the audit commits are not fsync'd one by one.
    let durability = args
        .iter()
        .position(|a| a == "--durability")
        .map_or("fsync", |i| args[i + 1].as_str());
    // `--baseline PATH` (any number): other toolgate binaries, measured in the same rounds.
    let baselines: Vec<PathBuf> = args
        .windows(2)
        .filter(|w| w[0] == "--baseline")
        .map(|w| PathBuf::from(&w[1]))
        .collect();
    let (toolgate, fake) = binaries();
    let dir = tempfile::tempdir().unwrap();
    registry(dir.path(), &fake, durability);
    approve(&toolgate, dir.path());
    let base_dirs: Vec<tempfile::TempDir> = baselines
        .iter()
        .map(|b| {
            let d = tempfile::tempdir().unwrap();
            registry(d.path(), &fake, durability);
            approve(b, d.path());
            d
        })
        .collect();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let direct = spawn(tokio::process::Command::new(&fake)).await;
        let through = spawn(serve_cmd(&toolgate, dir.path())).await;
        let mut bases = Vec::new();
        for (b, d) in baselines.iter().zip(&base_dirs) {
            bases.push(spawn(serve_cmd(b, d.path())).await);
        }
        // Warm-up, then alternate blocks so every path sees the same machine load.
        measure(&direct, "search_invoices", false, 100).await;
        measure(&through, "invoice.search", true, 100).await;
        for b in &bases {
            measure(b, "invoice.search", true, 100).await;
        }
        let (mut d, mut t) = (Vec::new(), Vec::new());
        let mut o: Vec<Vec<u64>> = vec![Vec::new(); bases.len()];
        let block = (calls / 4).max(1);
        for _ in 0..4 {
            d.extend(measure(&direct, "search_invoices", false, block).await);
            t.extend(measure(&through, "invoice.search", true, block).await);
            for (b, v) in bases.iter().zip(o.iter_mut()) {
                v.extend(measure(b, "invoice.search", true, block).await);
            }
        }
        d.sort_unstable();
        t.sort_unstable();
        for v in &mut o {
            v.sort_unstable();
        }
        let dm = pct(&d, 0.5);
        println!(
            "stdio, one call at a time, {} calls each (SQLite audit, durability: {durability})",
            d.len()
        );
        println!("| path | p50 µs | p99 µs | p50 ratio to direct |");
        println!("|---|---|---|---|");
        println!(
            "| direct (fake over stdio) | {dm} | {} | 1.00× |",
            pct(&d, 0.99)
        );
        let row = |label: &str, v: &[u64]| {
            let m = pct(v, 0.5);
            println!(
                "| {label} | {m} | {} | {:.2}× (added {} µs) |",
                pct(v, 0.99),
                m as f64 / dm.max(1) as f64,
                m.saturating_sub(dm)
            );
        };
        row("through toolgate --stdio", &t);
        for (b, v) in baselines.iter().zip(&o) {
            row(&format!("through {}", b.display()), v);
        }
        let _ = direct.cancel().await;
        let _ = through.cancel().await;
        for b in bases {
            let _ = b.cancel().await;
        }
    });
}

/// Pins the fake as an operator would: nothing upstream is served without a lockfile.
fn approve(toolgate: &Path, dir: &Path) {
    let ok = std::process::Command::new(toolgate)
        .args(["lock", "approve", "--by", "bench", "--config"])
        .arg(dir)
        .env("RUST_LOG", "warn")
        .stdout(std::process::Stdio::null())
        .status()
        .unwrap()
        .success();
    assert!(ok, "toolgate lock approve failed");
}

fn serve_cmd(toolgate: &Path, dir: &Path) -> tokio::process::Command {
    let mut cmd = tokio::process::Command::new(toolgate);
    cmd.args(["serve", "--dev", "--stdio", "--config"])
        .arg(dir)
        .env("TOOLGATE_API_KEY", KEY)
        .env("RUST_LOG", "warn");
    cmd
}
