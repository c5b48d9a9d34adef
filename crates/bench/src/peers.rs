//! `toolgate-bench peers`: what one hop costs, toolgate beside the peers a user would compare it
//! with, measured by an external load generator over the same upstream in one run.
//!
//! The upstream is the finance fake over streamable HTTP (in this process; it idles between
//! loads). In front of it, each in its own process so its CPU can be read from `/proc`:
//!
//! - **direct**: no hop;
//! - **haproxy**: a tuned reverse proxy (HTTP mode, kept-alive connections both sides, no
//!   buffering), as most gateways are deployed behind one;
//! - **relay**: an MCP relay built with rmcp on both sides (`toolgate-bench relay`), configured as
//!   toolgate's endpoint and upstream client are, governing nothing;
//! - **toolgate** with `durability: process` and with the default `fsync`: every call decided,
//!   reserved where it must be, forwarded and recorded in the audit chain.
//!
//! wrk posts `tools/call` on kept-alive connections within one MCP session per path (opened
//! before the load), for a read (`search_invoices` / `invoice.search`) and a write
//! (`schedule_payment` / `payment.schedule`, a distinct invoice per request, so none is a
//! replay). Each toolgate call names its own run in `_meta.run_id` unless `--implicit-runs`
//! (then, as an unmodified client, none: every call joins the principal's current run). A reply
//! that is an error (HTTP status, JSON-RPC error or a tool error) is counted and shown; the
//! figures of a cell with errors are not comparable. Rounds alternate the paths, so drift on the
//! machine falls on all of them alike; every figure is a range over rounds. For the toolgate
//! paths the table also gives how much the store grew per call (its SQLite pages in use, read
//! before and after each load).

use std::fmt::Write as _;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;
use rmcp::model::{CallToolRequestParams, CallToolResponse, ServerCapabilities, ServerConfig};
use rmcp::service::{RequestContext, RunningService};
use rmcp::transport::streamable_http_client::StreamableHttpClientTransportConfig;
use rmcp::transport::streamable_http_server::session::local::LocalSessionManager;
use rmcp::transport::{
    StreamableHttpClientTransport, StreamableHttpServerConfig, StreamableHttpService,
};
use rmcp::{ErrorData, RoleClient, RoleServer, ServerHandler, ServiceExt};
use serde_json::{Value, json};
use tokio::process::{Child, Command};
use toolgate_fakes::{FakeServer, FaultPlan, Recorder, finance::Finance};

use crate::crash::{FakeHttp, free_port, spawn_gateway};
use crate::{AMOUNT, BENCH_KEY, REASONS, copy_dir};

/// The finance example's planner: may read invoices (the bench principal may only pay).
const READ_KEY: &str = "tgdev_fin_planner";

/// Options of `toolgate-bench peers`.
#[derive(Debug, Clone)]
pub struct PeersOptions {
    pub secs: u64,
    pub rounds: u32,
    pub conc: Vec<u32>,
    pub toolgate: PathBuf,
    /// Another `toolgate` build measured beside `toolgate` in the same rounds (a before/after
    /// comparison), with both durabilities.
    pub baseline: Option<PathBuf>,
    /// The paths to measure (direct is always measured: `added` is against it).
    pub hops: Vec<Hop>,
    pub implicit_runs: bool,
    pub writes: bool,
}

/// A path a call takes to the upstream.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Hop {
    Direct,
    Haproxy,
    Relay,
    #[value(name = "toolgate-process")]
    ToolgateProcess,
    #[value(name = "toolgate-fsync")]
    ToolgateFsync,
    /// The `--baseline` build, durability process.
    #[value(skip)]
    BaselineProcess,
    /// The `--baseline` build, durability fsync.
    #[value(skip)]
    BaselineFsync,
}

impl Hop {
    pub const ALL: [Hop; 5] = [
        Hop::Direct,
        Hop::Haproxy,
        Hop::Relay,
        Hop::ToolgateProcess,
        Hop::ToolgateFsync,
    ];

    fn label(self) -> &'static str {
        match self {
            Hop::Direct => "direct to the upstream",
            Hop::Haproxy => "haproxy (keep-alive, no buffering)",
            Hop::Relay => "an rmcp relay that governs nothing",
            Hop::ToolgateProcess => "toolgate, durability process",
            Hop::ToolgateFsync => "toolgate, durability fsync (default)",
            Hop::BaselineProcess => "baseline build, durability process",
            Hop::BaselineFsync => "baseline build, durability fsync",
        }
    }

    fn governed(self) -> bool {
        !matches!(self, Hop::Direct | Hop::Haproxy | Hop::Relay)
    }

    /// The store durability of a governed path.
    fn durability(self) -> &'static str {
        match self {
            Hop::ToolgateProcess | Hop::BaselineProcess => "process",
            _ => "fsync",
        }
    }
}

/// The paths `opts` measures, in the order each round takes them: direct first, then the
/// chosen ones, each baseline path right after the same path of the build under test.
fn hops(opts: &PeersOptions) -> Vec<Hop> {
    let mut out = vec![Hop::Direct];
    for &hop in Hop::ALL.iter().filter(|h| opts.hops.contains(h)) {
        if hop != Hop::Direct {
            out.push(hop);
        }
        match (hop, opts.baseline.is_some()) {
            (Hop::ToolgateProcess, true) => out.push(Hop::BaselineProcess),
            (Hop::ToolgateFsync, true) => out.push(Hop::BaselineFsync),
            _ => {}
        }
    }
    out
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Tool {
    Read,
    Write,
}

/// One wrk run.
#[derive(Debug, Clone)]
pub(crate) struct Sample {
    pub(crate) p50_us: f64,
    pub(crate) p99_us: f64,
    pub(crate) per_sec: f64,
    /// Calls answered.
    pub(crate) requests: f64,
    /// CPU of the hop's process per call (µs); none for direct.
    pub(crate) cpu_us: Option<f64>,
    pub(crate) errors: u64,
    /// The first error reply, as wrk saw it.
    pub(crate) first_error: Option<String>,
    /// How much the store grew per call (bytes in use, free pages not counted); governed
    /// paths only.
    pub(crate) store_bytes: Option<f64>,
}

struct Endpoint {
    hop: Hop,
    url: String,
    pid: Option<u32>,
    /// A governed path's SQLite store.
    store: Option<PathBuf>,
}

/// Runs the benchmark and returns its table (Markdown).
pub async fn run_peers(opts: &PeersOptions) -> anyhow::Result<String> {
    for tool in ["wrk", "haproxy"] {
        anyhow::ensure!(
            which(tool),
            "{tool} is not on PATH: run scripts/install-bench-peers.sh (Debian's wrk and haproxy)"
        );
    }
    let scratch = tempfile::tempdir()?;
    let fake = FakeServer::new(
        Finance::with_bulk_invoices(),
        Recorder::disabled(),
        FaultPlan::none(),
    );
    let fake: FakeHttp<Finance> = FakeHttp::start(fake, None).await?;
    let upstream = format!("http://{}/mcp", fake.addr);

    let mut children: Vec<Child> = Vec::new();
    let mut endpoints = Vec::new();
    let paths = hops(opts);
    for &hop in &paths {
        let mut store_path = None;
        let (url, child) = match hop {
            Hop::Direct => (upstream.clone(), None),
            Hop::Haproxy => {
                let (url, child) = haproxy(scratch.path(), fake.addr)?;
                (url, Some(child))
            }
            Hop::Relay => {
                let addr = free_port()?;
                let child = Command::new(std::env::current_exe()?)
                    .args([
                        "relay",
                        "--listen",
                        &addr.to_string(),
                        "--upstream",
                        &upstream,
                    ])
                    .stdout(Stdio::null())
                    .kill_on_drop(true)
                    .spawn()
                    .context("starting the relay")?;
                let url = format!("http://{addr}/mcp");
                wait_listening(addr).await?;
                (url, Some(child))
            }
            Hop::ToolgateProcess
            | Hop::ToolgateFsync
            | Hop::BaselineProcess
            | Hop::BaselineFsync => {
                let durability = hop.durability();
                let (binary, build) = match hop {
                    Hop::BaselineProcess | Hop::BaselineFsync => (
                        opts.baseline
                            .as_ref()
                            .expect("a baseline path has a binary"),
                        "baseline",
                    ),
                    _ => (&opts.toolgate, "toolgate"),
                };
                let dir = scratch.path().join(format!("{build}-{durability}"));
                let store = json!({
                    "url": format!("sqlite://{}", dir.join("bench.db").display()),
                    "durability": durability,
                });
                registry(&dir, &upstream, store)?;
                let addr = free_port()?;
                let log = scratch.path().join(format!("{build}-{durability}.log"));
                let child = spawn_gateway(binary, &dir, addr, &log).await?;
                store_path = Some(dir.join("bench.db"));
                (format!("http://{addr}/mcp"), Some(child))
            }
        };
        let pid = child.as_ref().and_then(Child::id);
        if let Some(c) = child {
            children.push(c);
        }
        endpoints.push(Endpoint {
            hop,
            url,
            pid,
            store: store_path,
        });
    }

    let tools: &[Tool] = if opts.writes {
        &[Tool::Read, Tool::Write]
    } else {
        &[Tool::Read]
    };
    let mut samples: Vec<(Tool, Hop, u32, Sample)> = Vec::new();
    // The next block of invoice ids for each tool's loads.
    let mut blocks = [0u64; 2];
    for round in 1..=opts.rounds {
        for &tool in tools {
            for &c in &opts.conc {
                for e in &endpoints {
                    let key = match (tool, e.hop.governed()) {
                        (_, false) => "none",
                        (Tool::Read, true) => READ_KEY,
                        (Tool::Write, true) => BENCH_KEY,
                    };
                    // A session per connection, opened just before its load, as a client
                    // would hold one: sessions idle for minutes between loads may expire.
                    let sessions = (0..c)
                        .map(|_| open_session(&e.url, key))
                        .collect::<anyhow::Result<Vec<_>>>()?;
                    let script = lua(
                        scratch.path(),
                        tool,
                        e.hop,
                        key,
                        &sessions,
                        blocks[tool as usize],
                        opts.implicit_runs,
                    )?;
                    blocks[tool as usize] += 1;
                    let before = e.store.as_deref().map(store_bytes).transpose()?;
                    let mut sample = wrk(&e.url, &script, c, opts.secs, e.pid).await?;
                    let after = e.store.as_deref().map(store_bytes).transpose()?;
                    sample.store_bytes = before
                        .zip(after)
                        .map(|(b, a)| (a as f64 - b as f64) / sample.requests.max(1.0));
                    eprintln!(
                        "round {round} {tool:?} c={c} {}: p50 {:.0} µs, {:.0}/s, errors {}",
                        e.hop.label(),
                        sample.p50_us,
                        sample.per_sec,
                        sample.errors
                    );
                    if let Some(e) = &sample.first_error {
                        eprintln!("  first error: {e}");
                    }
                    samples.push((tool, e.hop, c, sample));
                }
            }
        }
    }
    for mut c in children {
        let _ = c.kill().await;
    }
    fake.stop.cancel();
    Ok(table(opts, &paths, tools, &samples))
}

pub(crate) fn which(tool: &str) -> bool {
    std::env::var_os("PATH")
        .is_some_and(|paths| std::env::split_paths(&paths).any(|p| p.join(tool).is_file()))
}

async fn wait_listening(addr: SocketAddr) -> anyhow::Result<()> {
    let deadline = Instant::now() + Duration::from_secs(30);
    while TcpStream::connect(addr).is_err() {
        anyhow::ensure!(
            Instant::now() < deadline,
            "nothing listens on {addr} after 30 s"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    Ok(())
}

/// haproxy in HTTP mode in front of the fake: connections kept alive to the client and reused
/// to the server, responses streamed (no buffering of a body), logs off.
fn haproxy(dir: &Path, upstream: SocketAddr) -> anyhow::Result<(String, Child)> {
    let addr = free_port()?;
    let cfg = dir.join("haproxy.cfg");
    std::fs::write(
        &cfg,
        format!(
            "global\n  maxconn 4096\n  nbthread 1\n\
             defaults\n  mode http\n  option http-keep-alive\n  http-reuse always\n\
             \x20 timeout connect 5s\n  timeout client 60s\n  timeout server 60s\n\
             frontend mcp\n  bind {addr}\n  default_backend fake\n\
             backend fake\n  server fake {upstream}\n"
        ),
    )?;
    let child = Command::new("haproxy")
        .arg("-db")
        .arg("-f")
        .arg(&cfg)
        .stdout(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .context("starting haproxy")?;
    std::thread::sleep(Duration::from_millis(300));
    Ok((format!("http://{addr}/mcp"), child))
}

/// The finance example for the bench: payments ungated and unlimited, the bench principal (see
/// [`crate::prepare_registry`]), the fake at `upstream`, `store` as toolgate.yaml's `store`.
pub(crate) fn registry(dir: &Path, upstream: &str, store: Value) -> anyhow::Result<()> {
    let example = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples/finance");
    copy_dir(&example, dir)?;
    crate::prepare_registry(dir, false)?;
    let top = dir.join("toolgate.yaml");
    let mut config: Value = yaml_serde::from_str(&std::fs::read_to_string(&top)?)?;
    config["upstreams"]["erp"] = json!({
        "url": upstream,
        "package": config["upstreams"]["erp"]["package"].clone(),
        "timeout_secs": 10.0,
    });
    config["store"] = store;
    std::fs::write(&top, yaml_serde::to_string(&config)?)?;
    toolgate_gateway::pins::rehome_lock(dir)?;
    Ok(())
}

/// Initializes an MCP session at `url` over plain HTTP and returns its id.
pub(crate) fn open_session(url: &str, key: &str) -> anyhow::Result<String> {
    let init = json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
        "protocolVersion": "2025-06-18", "capabilities": {},
        "clientInfo": {"name": "toolgate-bench-peers", "version": "1"}}});
    let (head, body) = post(url, key, None, &init.to_string())?;
    let session = head
        .lines()
        .find_map(|l| {
            let (name, value) = l.split_once(':')?;
            name.eq_ignore_ascii_case("mcp-session-id")
                .then(|| value.trim().to_string())
        })
        .with_context(|| format!("{url} opened no session: {head}{body}"))?;
    post(
        url,
        key,
        Some(&session),
        r#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#,
    )?;
    Ok(session)
}

/// One HTTP/1.1 POST on its own connection; returns the head and the body.
fn post(
    url: &str,
    key: &str,
    session: Option<&str>,
    body: &str,
) -> anyhow::Result<(String, String)> {
    let rest = url.strip_prefix("http://").context("an http:// URL")?;
    let (authority, path) = rest.split_once('/').context("a URL with a path")?;
    let mut tcp = TcpStream::connect(authority)?;
    tcp.set_read_timeout(Some(Duration::from_secs(10)))?;
    let mut request = format!(
        "POST /{path} HTTP/1.1\r\nHost: {authority}\r\nAuthorization: Bearer {key}\r\n\
         Content-Type: application/json\r\nAccept: application/json, text/event-stream\r\n\
         Content-Length: {}\r\nConnection: close\r\n",
        body.len()
    );
    if let Some(s) = session {
        let _ = write!(request, "Mcp-Session-Id: {s}\r\n");
    }
    request.push_str("\r\n");
    request.push_str(body);
    tcp.write_all(request.as_bytes())?;
    let mut reply = Vec::new();
    // An event stream may stay open after its last event; what arrived is enough.
    let _ = tcp.read_to_end(&mut reply);
    let reply = String::from_utf8_lossy(&reply).into_owned();
    let (head, body) = reply.split_once("\r\n\r\n").unwrap_or((&reply, ""));
    anyhow::ensure!(
        head.starts_with("HTTP/1.1 2"),
        "{url} answered {head}\n{body}"
    );
    Ok((head.to_string(), body.to_string()))
}

/// The wrk script of one load: the request body (a distinct invoice per write request, in a
/// block of ids of its own), the session's headers, and the count of error replies.
pub(crate) fn lua(
    dir: &Path,
    tool: Tool,
    hop: Hop,
    key: &str,
    sessions: &[String],
    block: u64,
    implicit_runs: bool,
) -> anyhow::Result<PathBuf> {
    let (name, args) = match (tool, hop.governed()) {
        (Tool::Read, false) => ("search_invoices", json!({"status": "received"})),
        (Tool::Read, true) => ("invoice.search", json!({"status": "received"})),
        (Tool::Write, governed) => (
            if governed {
                "payment.schedule"
            } else {
                "schedule_payment"
            },
            json!({"invoice_id": "INV-9{ID}", "amount": AMOUNT, "currency": "EUR",
                   "value_date": "2026-06-30", "reason": REASONS[0]}),
        ),
    };
    const BLOCK: u64 = 100_000;
    let mut params = json!({"name": name, "arguments": args});
    if hop.governed() && !implicit_runs {
        params["_meta"] = json!({"run_id": "bench-{RUN}"});
    }
    let body = json!({"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": params});
    // Ids: INV-9 and seven digits; each load of a tool has a block of 100,000 (3,125 per
    // connection at c = 32, 100,000 at c = 1, several times what a load of 10 s makes), so a
    // run may make 100 loads of each tool: four rounds of every path at three concurrencies
    // with a baseline build beside them take 84. Run ids name the tool too, so a read's and a
    // write's load may share a block number.
    let per_thread = BLOCK / sessions.len().max(1) as u64;
    let base = block * BLOCK;
    anyhow::ensure!(
        base + BLOCK <= 10_000_000,
        "too many loads of one tool for distinct invoices"
    );
    let tag = match tool {
        Tool::Read => "r",
        Tool::Write => "w",
    };
    let sessions = sessions
        .iter()
        .map(|s| format!("\"{s}\""))
        .collect::<Vec<_>>()
        .join(", ");
    let script = format!(
        r#"
wrk.method = "POST"
wrk.headers["Content-Type"] = "application/json"
wrk.headers["Accept"] = "application/json, text/event-stream"
wrk.headers["Authorization"] = "Bearer {key}"
local sessions = {{ {sessions} }}
local template = [==[{body}]==]
local threads = {{}}
local next_thread = 0
function setup(thread)
  thread:set("tid", next_thread)
  next_thread = next_thread + 1
  table.insert(threads, thread)
end
counter = 0
errors = 0
function init(args)
  wrk.headers["Mcp-Session-Id"] = sessions[tid + 1]
end
function request()
  counter = counter + 1
  local n = {base} + tid * {per_thread} + counter
  local body = string.gsub(template, "{{ID}}", string.format("%07d", n))
  body = string.gsub(body, "{{RUN}}", string.format("{tag}%d-%d", {block}, n))
  return wrk.format(nil, nil, nil, body)
end
function response(status, headers, body)
  if status ~= 200 or string.find(body, '"isError":true', 1, true)
     or string.find(body, '"error":{{', 1, true) then
    errors = errors + 1
    if first_error == nil then first_error = string.sub(status .. " " .. body, 1, 400) end
  end
end
function done(summary, latency, requests)
  local e = 0
  local first = nil
  for _, t in ipairs(threads) do
    e = e + t:get("errors")
    first = first or t:get("first_error")
  end
  if first then io.write("TG_FIRST_ERROR " .. string.gsub(first, "\n", " ") .. "\n") end
  io.write(string.format("TG_ERRORS %d\nTG_P50 %d\nTG_P99 %d\nTG_REQUESTS %d\nTG_MICROS %d\n",
    e, latency:percentile(50), latency:percentile(99), summary.requests, summary.duration))
end
"#,
        body = body
    );
    let path = dir.join(format!("load-{block}.lua"));
    std::fs::write(&path, script)?;
    Ok(path)
}

/// CPU time (user + system) of a process so far, in µs.
pub(crate) fn cpu_us(pid: u32) -> anyhow::Result<f64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"))?;
    // Fields after the command name (which may hold spaces) start at its closing parenthesis.
    let rest = stat.rsplit_once(')').context("a /proc stat line")?.1;
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let utime: f64 = fields[11].parse()?;
    let stime: f64 = fields[12].parse()?;
    // Clock ticks: 100 per second on Linux.
    Ok((utime + stime) * 10_000.0)
}

pub(crate) async fn wrk(
    url: &str,
    script: &Path,
    c: u32,
    secs: u64,
    pid: Option<u32>,
) -> anyhow::Result<Sample> {
    // A thread per connection, so each holds its own session, as clients do.
    let threads = c;
    let before = pid.map(cpu_us).transpose()?;
    let out = Command::new("wrk")
        .arg(format!("-t{threads}"))
        .arg(format!("-c{c}"))
        .arg(format!("-d{secs}s"))
        .arg("-s")
        .arg(script)
        .arg(url)
        .output()
        .await
        .context("running wrk")?;
    let after = pid.map(cpu_us).transpose()?;
    let text = String::from_utf8_lossy(&out.stdout);
    anyhow::ensure!(
        out.status.success(),
        "wrk failed: {text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let field = |name: &str| -> anyhow::Result<f64> {
        text.lines()
            .find_map(|l| l.strip_prefix(name))
            .with_context(|| format!("wrk printed no {name}: {text}"))?
            .trim()
            .parse::<f64>()
            .context("a number")
    };
    let requests = field("TG_REQUESTS ")?;
    let micros = field("TG_MICROS ")?;
    Ok(Sample {
        p50_us: field("TG_P50 ")?,
        p99_us: field("TG_P99 ")?,
        per_sec: requests / (micros / 1e6),
        requests,
        cpu_us: before.zip(after).map(|(b, a)| (a - b) / requests.max(1.0)),
        errors: field("TG_ERRORS ")? as u64,
        first_error: text
            .lines()
            .find_map(|l| l.strip_prefix("TG_FIRST_ERROR "))
            .map(str::to_string),
        store_bytes: None,
    })
}

/// The bytes a SQLite store holds: its pages in use, what was committed to the write-ahead
/// log included (read through a read-only connection beside the gateway's).
fn store_bytes(path: &Path) -> anyhow::Result<u64> {
    let db =
        rusqlite::Connection::open_with_flags(path, rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY)
            .with_context(|| format!("opening {} to read its size", path.display()))?;
    let pragma = |name: &str| -> anyhow::Result<u64> {
        Ok(db.query_row(&format!("PRAGMA {name}"), [], |r| r.get::<_, i64>(0))? as u64)
    };
    Ok((pragma("page_count")? - pragma("freelist_count")?) * pragma("page_size")?)
}

pub(crate) fn range(values: impl Iterator<Item = f64>) -> String {
    let v: Vec<f64> = values.collect();
    if v.is_empty() {
        return "—".into();
    }
    let lo = v.iter().cloned().fold(f64::INFINITY, f64::min);
    let hi = v.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
    let f = |x: f64| group(x.round() as i64);
    if f(lo) == f(hi) {
        f(lo)
    } else {
        format!("{}–{}", f(lo), f(hi))
    }
}

/// An integer with thousands separators.
pub(crate) fn group(n: i64) -> String {
    let digits = n.unsigned_abs().to_string();
    let mut out = String::new();
    for (i, ch) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(ch);
    }
    if n < 0 { format!("-{out}") } else { out }
}

fn table(
    opts: &PeersOptions,
    paths: &[Hop],
    tools: &[Tool],
    samples: &[(Tool, Hop, u32, Sample)],
) -> String {
    let mut t = String::new();
    let _ = writeln!(
        t,
        "{} rounds of {} s per point; wrk on kept-alive connections; CPU per call is the hop \
         process's user+system time over its calls; `added` is against direct in the same round.\n",
        opts.rounds, opts.secs
    );
    for &tool in tools {
        let _ = writeln!(
            t,
            "### {}\n",
            match tool {
                Tool::Read => "read (search_invoices / invoice.search)",
                Tool::Write =>
                    "write (schedule_payment / payment.schedule, a new invoice per call)",
            }
        );
        let _ = write!(t, "| path |");
        for c in &opts.conc {
            let _ = write!(
                t,
                " c={c} p50 µs | added p50 | p99 µs | calls/s | CPU/call µs |"
            );
        }
        let _ = writeln!(t, " store bytes/call | errors |");
        let _ = write!(t, "|---|");
        for _ in &opts.conc {
            let _ = write!(t, "---:|---:|---:|---:|---:|");
        }
        let _ = writeln!(t, "---:|---:|");
        for &hop in paths {
            let _ = write!(t, "| {} |", hop.label());
            let mut errors = 0;
            for &c in &opts.conc {
                let cell: Vec<(usize, Sample)> = samples
                    .iter()
                    .enumerate()
                    .filter(|(_, (tl, h, cc, _))| *tl == tool && *h == hop && *cc == c)
                    .map(|(i, (_, _, _, s))| (i, s.clone()))
                    .collect();
                errors += cell.iter().map(|(_, s)| s.errors).sum::<u64>();
                // The direct sample of the same round: the one with the same tool and level
                // measured before this one, nearest.
                let added = cell.iter().filter_map(|(i, s)| {
                    samples[..*i]
                        .iter()
                        .rev()
                        .find(|(tl, h, cc, _)| *tl == tool && *h == Hop::Direct && *cc == c)
                        .map(|(_, _, _, d)| s.p50_us - d.p50_us)
                });
                let _ = write!(
                    t,
                    " {} | {} | {} | {} | {} |",
                    range(cell.iter().map(|(_, s)| s.p50_us)),
                    if hop == Hop::Direct {
                        "—".into()
                    } else {
                        range(added)
                    },
                    range(cell.iter().map(|(_, s)| s.p99_us)),
                    range(cell.iter().map(|(_, s)| s.per_sec)),
                    range(cell.iter().filter_map(|(_, s)| s.cpu_us)),
                );
            }
            let grew = samples
                .iter()
                .filter(|(tl, h, _, _)| *tl == tool && *h == hop)
                .filter_map(|(_, _, _, s)| s.store_bytes);
            let _ = writeln!(t, " {} | {errors} |", range(grew));
        }
        let _ = writeln!(t);
    }
    t
}

/// `toolgate-bench relay`: forwards every `tools/call` to `upstream` and does nothing else,
/// built with rmcp on both sides as toolgate is (sessions, JSON replies, TCP_NODELAY, one
/// kept-alive upstream connection).
pub async fn run_relay(listen: &str, upstream: &str) -> anyhow::Result<()> {
    let http = reqwest::Client::builder().tcp_nodelay(true).build()?;
    let up = ()
        .serve(StreamableHttpClientTransport::with_client(
            http,
            StreamableHttpClientTransportConfig::with_uri(upstream),
        ))
        .await
        .context("connecting to the upstream")?;
    let relay = Relay(Arc::new(up));
    let service = StreamableHttpService::new(
        move || Ok(relay.clone()),
        Arc::new(LocalSessionManager::default()),
        StreamableHttpServerConfig::default().with_json_response(true),
    );
    let app = axum::Router::new().nest_service("/mcp", service);
    let listener = tokio::net::TcpListener::bind(listen).await?;
    use axum::serve::ListenerExt;
    let listener = listener.tap_io(|tcp| {
        let _ = tcp.set_nodelay(true);
    });
    axum::serve(listener, app).await?;
    Ok(())
}

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
