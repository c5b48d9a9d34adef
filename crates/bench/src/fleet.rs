//! `toolgate-bench fleet`: what one governed call costs the database that a fleet of gateways
//! shares, PostgreSQL beside the embedded SQLite on the same machine.
//!
//! One fake ERP upstream (in this process) behind two `toolgate serve` processes with
//! `durability: fsync`: one on SQLite, one on a PostgreSQL database this bench creates (and drops
//! afterwards) on the server at `--postgres`. wrk posts `tools/call` on kept-alive connections,
//! one MCP session per connection, for a read (`invoice.search`) and a write
//! (`payment.schedule`, a distinct invoice per request), at each concurrency, in alternated
//! rounds.
//!
//! Each gateway first takes a few seconds of unmeasured load per tool (a fresh database's first
//! seconds cost more than its steady state). Then, for each load:
//!
//! - calls/s, p50 and p99 as wrk saw them;
//! - toolgate's CPU per call (user + system time of the `serve` process over its calls);
//! - on PostgreSQL, the database's CPU per call: the user + system time of every `postgres`
//!   process on the machine over the same load, divided by the calls (the server should serve
//!   nothing else meanwhile; background workers are included, as they are part of the cost).
//!
//! With `--baseline OLD/toolgate`, a third gateway of that older build runs on a PostgreSQL
//! database of its own beside them, in the same rounds, so the two builds are compared load by
//! load under the same conditions (this machine's other work moves every figure).
//!
//! Then one pass per tool through one more `toolgate serve` whose store connection goes through
//! a counting relay in this process: it reads the PostgreSQL wire protocol the gateway sends
//! and counts statements (Execute and simple Query messages), round trips (Sync and simple
//! Query: each makes the client wait for the server) and explicit commits. The relay adds a
//! hop, so its pass is only counted, never timed.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use anyhow::Context;
use serde_json::json;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::process::Child;
use toolgate_fakes::{FakeServer, FaultPlan, Recorder, finance::Finance};

use crate::BENCH_KEY;
use crate::crash::{FakeHttp, free_port, spawn_gateway};
use crate::peers::{Hop, Sample, Tool, group, lua, open_session, range, registry, which, wrk};

/// Seconds of unmeasured load per gateway and tool before the first round.
const WARM_UP_SECS: u64 = 3;

/// The finance example's planner: may read invoices.
const READ_KEY: &str = "tgdev_fin_planner";

/// Options of `toolgate-bench fleet`.
#[derive(Debug, Clone)]
pub struct FleetOptions {
    pub secs: u64,
    pub rounds: u32,
    pub conc: Vec<u32>,
    pub toolgate: PathBuf,
    /// An older `toolgate` to run on PostgreSQL beside `toolgate`, load by load.
    pub baseline: Option<PathBuf>,
    /// A PostgreSQL server URL whose user may create databases.
    pub postgres: String,
    pub reads_only: bool,
    /// Calls send no `_meta` and join their principal's current run (else each names a run of
    /// its own, which the call creates).
    pub implicit_runs: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Backend {
    Sqlite,
    Postgres,
    /// The `--baseline` build, on PostgreSQL.
    Baseline,
}

impl Backend {
    const ALL: [Backend; 3] = [Backend::Sqlite, Backend::Postgres, Backend::Baseline];

    fn label(self) -> &'static str {
        match self {
            Backend::Sqlite => "SQLite (embedded)",
            Backend::Postgres => "PostgreSQL",
            Backend::Baseline => "PostgreSQL, baseline build",
        }
    }

    fn on_postgres(self) -> bool {
        self != Backend::Sqlite
    }

    fn runs(self, opts: &FleetOptions) -> bool {
        self != Backend::Baseline || opts.baseline.is_some()
    }
}

struct Gateway {
    backend: Backend,
    url: String,
    pid: Option<u32>,
    /// The PostgreSQL database it uses (none on SQLite).
    database: Option<String>,
    /// A connection to that database, for the `VACUUM` before each of its loads.
    vacuum: Option<toolgate_store::Store>,
    /// The database's CPU those `VACUUM`s took, and the calls of the loads before them (µs).
    vacuumed_us: f64,
    calls: f64,
    read_sessions: Vec<String>,
    write_sessions: Vec<String>,
}

/// One load's figures: wrk's, and the database's CPU per call (PostgreSQL only).
struct Point {
    tool: Tool,
    backend: Backend,
    c: u32,
    sample: Sample,
    db_cpu_us: Option<f64>,
    /// The part of it spent by the backends serving the gateway's own database (not the
    /// server's background processes, nor anyone else's connections).
    backends_cpu_us: Option<f64>,
}

/// What the counting relay saw per call.
struct Counted {
    tool: Tool,
    calls: f64,
    statements: f64,
    round_trips: f64,
    commits: f64,
    /// Executions per call of each statement, most first.
    by_sql: Vec<(String, f64)>,
}

/// Runs the benchmark and returns its tables (Markdown).
pub async fn run_fleet(opts: &FleetOptions) -> anyhow::Result<String> {
    anyhow::ensure!(
        which("wrk"),
        "wrk is not on PATH: run scripts/install-bench-peers.sh"
    );
    let db = crate::database::BenchDatabase::create(&opts.postgres, "fleet")
        .await
        .with_context(|| format!("creating a database on {}", opts.postgres))?;
    let old = match &opts.baseline {
        Some(_) => Some(
            crate::database::BenchDatabase::create(&opts.postgres, "fleet_baseline")
                .await
                .with_context(|| format!("creating a database on {}", opts.postgres))?,
        ),
        None => None,
    };
    let result = measure(opts, db.name(), old.as_ref().map(|d| d.name())).await;
    db.drop().await;
    if let Some(old) = old {
        old.drop().await;
    }
    result
}

async fn measure(
    opts: &FleetOptions,
    database: &str,
    baseline_db: Option<&str>,
) -> anyhow::Result<String> {
    let server = Server::parse(&opts.postgres)?;
    let scratch = tempfile::tempdir()?;
    let fake = FakeServer::new(
        Finance::with_bulk_invoices(),
        Recorder::disabled(),
        FaultPlan::none(),
    );
    let fake: FakeHttp<Finance> = FakeHttp::start(fake, None).await?;
    let upstream = format!("http://{}/mcp", fake.addr);
    let most = opts.conc.iter().copied().max().unwrap_or(1) as usize;

    let mut children: Vec<Child> = Vec::new();
    let mut gateways = Vec::new();
    for backend in Backend::ALL.into_iter().filter(|b| b.runs(opts)) {
        let dir = scratch.path().join(format!("{backend:?}").to_lowercase());
        let (url, binary) = match (backend, &opts.baseline, baseline_db) {
            (Backend::Sqlite, ..) => (
                format!("sqlite://{}", dir.join("bench.db").display()),
                &opts.toolgate,
            ),
            (Backend::Postgres, ..) => (server.url(&server.authority(), database), &opts.toolgate),
            (Backend::Baseline, Some(old), Some(db)) => (server.url(&server.authority(), db), old),
            (Backend::Baseline, ..) => unreachable!("a baseline runs only with its build"),
        };
        let (gateway, child) = start(opts, binary, &dir, &upstream, &url, most).await?;
        children.push(child);
        let database = match backend {
            Backend::Sqlite => None,
            Backend::Postgres => Some(database.to_string()),
            Backend::Baseline => baseline_db.map(str::to_string),
        };
        let vacuum = match &database {
            Some(_) => Some(toolgate_store::Store::connect(&url, Default::default()).await?),
            None => None,
        };
        gateways.push(Gateway {
            backend,
            database,
            vacuum,
            ..gateway
        });
    }
    // The counted gateway: the same database, its connections through the relay.
    let counts = Arc::new(WireCounts::default());
    let relay = TcpListener::bind("127.0.0.1:0").await?;
    let relay_addr = relay.local_addr()?;
    tokio::spawn(count_relay(relay, server.authority(), counts.clone()));
    let (counted, child) = start(
        opts,
        &opts.toolgate,
        &scratch.path().join("counted"),
        &upstream,
        &server.url(&relay_addr.to_string(), database),
        8,
    )
    .await?;
    children.push(child);

    let tools: &[Tool] = if opts.reads_only {
        &[Tool::Read]
    } else {
        &[Tool::Read, Tool::Write]
    };
    let mut points = Vec::new();
    let mut block = 0u64;
    // Warm-up, not measured: a fresh database's first seconds of load cost more (its tables,
    // indexes and write-ahead log growing into new files), and measured so they would count
    // against whichever gateway went first.
    for &tool in tools {
        for g in &gateways {
            let script = load_script(opts, scratch.path(), tool, g, block)?;
            block += 1;
            let most = u32::try_from(most).unwrap_or(u32::MAX);
            wrk(&g.url, &script, most, WARM_UP_SECS, g.pid).await?;
        }
    }
    for round in 1..=opts.rounds {
        for &tool in tools {
            for &c in &opts.conc {
                for g in gateways.iter_mut() {
                    let script = load_script(opts, scratch.path(), tool, g, block)?;
                    block += 1;
                    vacuum(g).await?;
                    let db_before = postgres_cpu_us(None);
                    let own = g.database.as_deref();
                    let backends_before = own.map(|d| postgres_cpu_us(Some(d)));
                    let sample = wrk(&g.url, &script, c, opts.secs, g.pid).await?;
                    let per_call = |before: f64, db: Option<&str>| {
                        (postgres_cpu_us(db) - before) / sample.requests.max(1.0)
                    };
                    let db_cpu_us = g.backend.on_postgres().then(|| per_call(db_before, None));
                    let backends_cpu_us = backends_before.map(|b| per_call(b, own));
                    g.calls += sample.requests;
                    eprintln!(
                        "round {round} {tool:?} c={c} {}: p50 {:.0} µs, {:.0}/s, database CPU {} µs/call ({} in its backends), errors {}",
                        g.backend.label(),
                        sample.p50_us,
                        sample.per_sec,
                        db_cpu_us.map_or("—".into(), |v| format!("{v:.0}")),
                        backends_cpu_us.map_or("—".into(), |v| format!("{v:.0}")),
                        sample.errors
                    );
                    if let Some(e) = &sample.first_error {
                        eprintln!("  first error: {e}");
                    }
                    points.push(Point {
                        tool,
                        backend: g.backend,
                        c,
                        sample,
                        db_cpu_us,
                        backends_cpu_us,
                    });
                }
            }
        }
    }
    let mut wire = Vec::new();
    for &tool in tools {
        let script = load_script(opts, scratch.path(), tool, &counted, block)?;
        block += 1;
        let before = counts.snapshot();
        let sql_before = counts.by_sql();
        let sample = wrk(&counted.url, &script, 8, opts.secs.min(5), None).await?;
        let after = counts.snapshot();
        let calls = sample.requests.max(1.0);
        let mut by_sql: Vec<(String, f64)> = counts
            .by_sql()
            .into_iter()
            .map(|(sql, n)| {
                let n = n - sql_before.get(&sql).copied().unwrap_or(0);
                (sql, n as f64 / calls)
            })
            .filter(|(_, n)| *n >= 0.01)
            .collect();
        by_sql.sort_by(|a, b| b.1.total_cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
        wire.push(Counted {
            by_sql,
            tool,
            calls: sample.requests,
            statements: (after.0 - before.0) as f64 / calls,
            round_trips: (after.1 - before.1) as f64 / calls,
            commits: (after.2 - before.2) as f64 / calls,
        });
    }
    for mut c in children {
        let _ = c.kill().await;
    }
    let vacuumed: Vec<(Backend, f64)> = gateways
        .iter()
        .filter(|g| g.vacuum.is_some())
        .map(|g| (g.backend, g.vacuumed_us / g.calls.max(1.0)))
        .collect();
    for g in gateways {
        if let Some(store) = g.vacuum {
            store.close().await;
        }
    }
    fake.stop.cancel();
    Ok(table(opts, tools, &points, &wire, &vacuumed))
}

/// `VACUUM (ANALYZE)` of `g`'s database, outside the measured loads: what autovacuum does in
/// the background on a server that runs it (this one may not: then dead row versions and
/// stale statistics pile up load after load, and each load costs more than the one before).
/// Its CPU, taken from the database's processes, is kept apart and reported per call.
async fn vacuum(g: &mut Gateway) -> anyhow::Result<()> {
    let (Some(store), Some(db)) = (&g.vacuum, g.database.as_deref()) else {
        return Ok(());
    };
    let before = postgres_cpu_us(Some(db));
    store.execute_raw("VACUUM (ANALYZE)").await?;
    g.vacuumed_us += postgres_cpu_us(Some(db)) - before;
    Ok(())
}

/// Starts a `toolgate serve` over the finance example on `store_url` and opens `sessions`
/// sessions per tool.
async fn start(
    opts: &FleetOptions,
    toolgate: &Path,
    dir: &Path,
    upstream: &str,
    store_url: &str,
    sessions: usize,
) -> anyhow::Result<(Gateway, Child)> {
    registry(
        dir,
        upstream,
        json!({"url": store_url, "durability": "fsync"}),
    )?;
    let addr = free_port()?;
    let log = dir.join("toolgate.log");
    let child = spawn_gateway(toolgate, dir, addr, &log).await?;
    let url = format!("http://{addr}/mcp");
    let read_sessions = (0..sessions)
        .map(|_| open_session(&url, READ_KEY))
        .collect::<anyhow::Result<_>>()?;
    let write_sessions = if opts.reads_only {
        Vec::new()
    } else {
        (0..sessions)
            .map(|_| open_session(&url, BENCH_KEY))
            .collect::<anyhow::Result<_>>()?
    };
    let gateway = Gateway {
        backend: Backend::Postgres,
        url,
        pid: child.id(),
        database: None,
        vacuum: None,
        vacuumed_us: 0.0,
        calls: 0.0,
        read_sessions,
        write_sessions,
    };
    Ok((gateway, child))
}

fn load_script(
    opts: &FleetOptions,
    dir: &Path,
    tool: Tool,
    g: &Gateway,
    block: u64,
) -> anyhow::Result<PathBuf> {
    let (key, sessions) = match tool {
        Tool::Read => (READ_KEY, &g.read_sessions),
        Tool::Write => (BENCH_KEY, &g.write_sessions),
    };
    let hop = Hop::ToolgateFsync;
    lua(dir, tool, hop, key, sessions, block, opts.implicit_runs)
}

/// The user + system CPU time so far of every process named `postgres` on this machine, in µs;
/// with `database`, only of the backends connected to it (their process title names it).
fn postgres_cpu_us(database: Option<&str>) -> f64 {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return 0.0;
    };
    entries
        .flatten()
        .filter(|e| {
            e.file_name()
                .to_string_lossy()
                .bytes()
                .all(|b| b.is_ascii_digit())
        })
        .filter(|e| {
            database.is_none_or(|db| {
                let title = std::fs::read(e.path().join("cmdline")).unwrap_or_default();
                String::from_utf8_lossy(&title)
                    .split_whitespace()
                    .any(|word| word == db)
            })
        })
        .filter_map(|e| std::fs::read_to_string(e.path().join("stat")).ok())
        .filter_map(|stat| {
            let (head, rest) = stat.rsplit_once(')')?;
            let comm = head.split_once('(')?.1;
            (comm == "postgres").then_some(())?;
            let fields: Vec<&str> = rest.split_whitespace().collect();
            let utime: f64 = fields.get(11)?.parse().ok()?;
            let stime: f64 = fields.get(12)?.parse().ok()?;
            // Clock ticks: 100 per second on Linux.
            Some((utime + stime) * 10_000.0)
        })
        .sum()
}

/// The parts of a `postgres://user@host:port/database?…` URL the bench rebuilds.
struct Server {
    /// `postgres://user[:password]@`
    scheme_user: String,
    host: String,
    port: u16,
}

impl Server {
    fn parse(url: &str) -> anyhow::Result<Server> {
        let (scheme, rest) = url
            .split_once("://")
            .context("a postgres:// URL for --postgres")?;
        let (user, rest) = rest.rsplit_once('@').unwrap_or(("", rest));
        let authority = rest.split(['/', '?']).next().unwrap_or(rest);
        let (host, port) = match authority.rsplit_once(':') {
            Some((h, p)) => (h.to_string(), p.parse().context("the port of --postgres")?),
            None => (authority.to_string(), 5432),
        };
        let scheme_user = if user.is_empty() {
            format!("{scheme}://")
        } else {
            format!("{scheme}://{user}@")
        };
        Ok(Server {
            scheme_user,
            host,
            port,
        })
    }

    fn authority(&self) -> String {
        format!("{}:{}", self.host, self.port)
    }

    /// The URL of `database` through `authority`. TLS off: the counting relay reads the
    /// protocol, and the server is local.
    fn url(&self, authority: &str, database: &str) -> String {
        format!("{}{authority}/{database}?sslmode=disable", self.scheme_user)
    }
}

/// Messages the gateway sent the database, counted by [`count_relay`].
#[derive(Default)]
struct WireCounts {
    statements: AtomicU64,
    round_trips: AtomicU64,
    commits: AtomicU64,
    /// Executions per statement text (whitespace folded), simple queries included.
    by_sql: Mutex<HashMap<String, u64>>,
}

impl WireCounts {
    fn snapshot(&self) -> (u64, u64, u64) {
        (
            self.statements.load(Ordering::Relaxed),
            self.round_trips.load(Ordering::Relaxed),
            self.commits.load(Ordering::Relaxed),
        )
    }

    fn executed(&self, sql: &str) {
        let folded = sql.split_whitespace().collect::<Vec<_>>().join(" ");
        *self
            .by_sql
            .lock()
            .expect("the counts' lock")
            .entry(folded)
            .or_default() += 1;
    }

    fn by_sql(&self) -> HashMap<String, u64> {
        self.by_sql.lock().expect("the counts' lock").clone()
    }
}

/// Relays every connection accepted on `listener` to `server`, counting what clients send.
async fn count_relay(listener: TcpListener, server: String, counts: Arc<WireCounts>) {
    while let Ok((client, _)) = listener.accept().await {
        let (server, counts) = (server.clone(), counts.clone());
        tokio::spawn(async move {
            let Ok(upstream) = TcpStream::connect(&server).await else {
                return;
            };
            let _ = client.set_nodelay(true);
            let _ = upstream.set_nodelay(true);
            let (mut from_client, mut to_client) = client.into_split();
            let (mut from_server, mut to_server) = upstream.into_split();
            let down = tokio::io::copy(&mut from_server, &mut to_client);
            let up = async {
                let mut reader = Frontend::default();
                let mut buf = vec![0u8; 64 * 1024];
                loop {
                    let n = from_client.read(&mut buf).await?;
                    if n == 0 {
                        break;
                    }
                    reader.feed(&buf[..n], &counts);
                    to_server.write_all(&buf[..n]).await?;
                }
                to_server.shutdown().await
            };
            let _ = tokio::join!(down, up);
        });
    }
}

/// The client side of the PostgreSQL wire protocol, read message by message: untyped start-up
/// messages (an SSL or GSS request, then the start-up packet), then typed messages — a type
/// byte and a length that counts itself.
#[derive(Default)]
struct Frontend {
    started: bool,
    pending: Vec<u8>,
    /// The text of each statement this connection prepared, by name.
    prepared: HashMap<String, String>,
}

/// The NUL-terminated strings at the start of a message body.
fn c_strings(body: &[u8]) -> impl Iterator<Item = String> + '_ {
    body.split(|&b| b == 0)
        .map(|s| String::from_utf8_lossy(s).into_owned())
}

/// The protocol version 3.0 a start-up packet carries.
const STARTUP_V3: u32 = 196_608;

impl Frontend {
    fn feed(&mut self, bytes: &[u8], counts: &WireCounts) {
        self.pending.extend_from_slice(bytes);
        loop {
            let header = usize::from(self.started);
            let Some(len) = self.pending.get(header..header + 4) else {
                return;
            };
            let len = u32::from_be_bytes(len.try_into().expect("four bytes")) as usize;
            let total = header + len;
            if self.pending.len() < total || len < 4 {
                return;
            }
            if self.started {
                match self.pending[0] {
                    b'Q' => {
                        counts.statements.fetch_add(1, Ordering::Relaxed);
                        counts.round_trips.fetch_add(1, Ordering::Relaxed);
                        let sql = &self.pending[5..total];
                        if sql.len() >= 6 && sql[..6].eq_ignore_ascii_case(b"COMMIT") {
                            counts.commits.fetch_add(1, Ordering::Relaxed);
                        }
                        if let Some(sql) = c_strings(sql).next() {
                            counts.executed(&sql);
                        }
                    }
                    b'P' => {
                        let mut parts = c_strings(&self.pending[5..total]);
                        if let (Some(name), Some(sql)) = (parts.next(), parts.next()) {
                            self.prepared.insert(name, sql);
                        }
                    }
                    b'B' => {
                        let statement = c_strings(&self.pending[5..total]).nth(1);
                        let sql = statement.and_then(|s| self.prepared.get(&s));
                        counts.executed(sql.map_or("(an unknown prepared statement)", |s| s));
                    }
                    b'E' => {
                        counts.statements.fetch_add(1, Ordering::Relaxed);
                    }
                    b'S' => {
                        counts.round_trips.fetch_add(1, Ordering::Relaxed);
                    }
                    _ => {}
                }
            } else if len >= 8
                && u32::from_be_bytes(self.pending[4..8].try_into().expect("four bytes"))
                    == STARTUP_V3
            {
                self.started = true;
            }
            self.pending.drain(..total);
        }
    }
}

fn table(
    opts: &FleetOptions,
    tools: &[Tool],
    points: &[Point],
    wire: &[Counted],
    vacuumed: &[(Backend, f64)],
) -> String {
    use std::fmt::Write as _;
    let mut t = String::new();
    let _ = writeln!(
        t,
        "{} rounds of {} s per point; `toolgate serve` with durability fsync; wrk on kept-alive \
         connections, one session each; {}. CPU per call: the `serve` process's user+system time, and \
         every `postgres` process's (background processes and other clients of the server \
         included), over the calls of the load; `its backends`: only the processes serving the \
         gateway's own database. Each PostgreSQL database is vacuumed (`VACUUM (ANALYZE)`) \
         before each of its loads, outside the measured time, as autovacuum would keep it.\n",
        opts.rounds,
        opts.secs,
        if opts.implicit_runs {
            "calls send no `_meta` and join their principal's current run"
        } else {
            "each call names a run of its own, which it creates"
        }
    );
    for (backend, us) in vacuumed {
        let _ = writeln!(
            t,
            "{}: the vacuums took {us:.0} µs of the database's CPU per call of the loads before \
             them (not in the tables below).\n",
            backend.label()
        );
    }
    for &tool in tools {
        let _ = writeln!(
            t,
            "### {}\n",
            match tool {
                Tool::Read => "read (invoice.search)",
                Tool::Write => "write (payment.schedule, a new invoice per call)",
            }
        );
        let _ = write!(t, "| store |");
        for c in &opts.conc {
            let _ = write!(
                t,
                " c={c} calls/s | p50 µs | p99 µs | toolgate CPU/call µs | database CPU/call µs | its backends µs |"
            );
        }
        let _ = writeln!(t, " errors |");
        let _ = write!(t, "|---|");
        for _ in &opts.conc {
            let _ = write!(t, "---:|---:|---:|---:|---:|---:|");
        }
        let _ = writeln!(t, "---:|");
        for backend in Backend::ALL.into_iter().filter(|b| b.runs(opts)) {
            let _ = write!(t, "| {} |", backend.label());
            let mut errors = 0;
            for &c in &opts.conc {
                let cell: Vec<&Point> = points
                    .iter()
                    .filter(|p| p.tool == tool && p.backend == backend && p.c == c)
                    .collect();
                errors += cell.iter().map(|p| p.sample.errors).sum::<u64>();
                let _ = write!(
                    t,
                    " {} | {} | {} | {} | {} | {} |",
                    range(cell.iter().map(|p| p.sample.per_sec)),
                    range(cell.iter().map(|p| p.sample.p50_us)),
                    range(cell.iter().map(|p| p.sample.p99_us)),
                    range(cell.iter().filter_map(|p| p.sample.cpu_us)),
                    range(cell.iter().filter_map(|p| p.db_cpu_us)),
                    range(cell.iter().filter_map(|p| p.backends_cpu_us)),
                );
            }
            let _ = writeln!(t, " {errors} |");
        }
        // PostgreSQL's share of SQLite's throughput, per concurrency, as a range over rounds.
        for &c in &opts.conc {
            let of = |b: Backend| -> Vec<f64> {
                points
                    .iter()
                    .filter(|p| p.tool == tool && p.backend == b && p.c == c)
                    .map(|p| p.sample.per_sec)
                    .collect()
            };
            for pg in [Backend::Postgres, Backend::Baseline] {
                if !pg.runs(opts) {
                    continue;
                }
                let ratios = of(pg)
                    .into_iter()
                    .zip(of(Backend::Sqlite))
                    .map(|(pg, lite)| 100.0 * pg / lite.max(1.0));
                let _ = writeln!(
                    t,
                    "\nc={c}: {} carries {} % of SQLite's calls/s (round by round).",
                    pg.label(),
                    range(ratios)
                );
            }
        }
        let _ = writeln!(t);
    }
    let _ = writeln!(
        t,
        "### On the wire, per call (PostgreSQL, c=8, counted through a relay)\n\n\
         | tool | calls | statements | round trips | explicit commits |\n|---|---:|---:|---:|---:|"
    );
    for w in wire {
        let _ = writeln!(
            t,
            "| {} | {} | {:.2} | {:.2} | {:.2} |",
            match w.tool {
                Tool::Read => "read",
                Tool::Write => "write",
            },
            group(w.calls as i64),
            w.statements,
            w.round_trips,
            w.commits
        );
    }
    for w in wire {
        let _ = writeln!(
            t,
            "\n{} call, executions per call of each statement:\n",
            match w.tool {
                Tool::Read => "A read",
                Tool::Write => "A write",
            }
        );
        for (sql, n) in &w.by_sql {
            let shown: String = sql.chars().take(140).collect();
            let more = if shown.len() < sql.len() { "…" } else { "" };
            let _ = writeln!(t, "- {n:.2} × `{shown}{more}`");
        }
    }
    t
}

#[cfg(test)]
mod tests {
    use super::*;

    fn typed(kind: u8, body: &[u8]) -> Vec<u8> {
        let mut m = vec![kind];
        m.extend_from_slice(&((body.len() + 4) as u32).to_be_bytes());
        m.extend_from_slice(body);
        m
    }

    fn untyped(code: u32, body: &[u8]) -> Vec<u8> {
        let mut m = ((body.len() + 8) as u32).to_be_bytes().to_vec();
        m.extend_from_slice(&code.to_be_bytes());
        m.extend_from_slice(body);
        m
    }

    /// An SSL request, the start-up packet, a simple BEGIN, one prepared statement run (Parse,
    /// Describe, Sync, then Bind, Execute, Sync), an insert, and a simple COMMIT.
    fn session() -> Vec<u8> {
        let mut s = untyped(80_877_103, b"");
        s.extend(untyped(STARTUP_V3, b"user\0postgres\0\0"));
        s.extend(typed(b'Q', b"BEGIN\0"));
        s.extend(typed(b'P', b"s1\0SELECT 1\0\0\0"));
        s.extend(typed(b'D', b"Ss1\0"));
        s.extend(typed(b'S', b""));
        s.extend(typed(b'B', b"\0s1\0\0\0\0\0\0\0"));
        // An Execute whose body holds bytes that look like message types.
        s.extend(typed(b'E', b"\0\0\0\0\0"));
        s.extend(typed(b'S', b""));
        s.extend(typed(b'B', b"\0s2\0\0\0\0\0\0\0"));
        s.extend(typed(b'E', b"QSE\0\0\0\0\0"));
        s.extend(typed(b'S', b""));
        s.extend(typed(b'Q', b"commit\0"));
        s
    }

    #[test]
    fn the_relay_counts_statements_round_trips_and_commits_however_the_bytes_arrive() {
        let bytes = session();
        for chunk in [1, 2, 3, 7, bytes.len()] {
            let counts = WireCounts::default();
            let mut reader = Frontend::default();
            for part in bytes.chunks(chunk) {
                reader.feed(part, &counts);
            }
            // BEGIN, two Executes, COMMIT; BEGIN, three Syncs, COMMIT; one COMMIT.
            assert_eq!(counts.snapshot(), (4, 5, 1), "chunks of {chunk} bytes");
            let by_sql = counts.by_sql();
            assert_eq!(by_sql.get("SELECT 1"), Some(&1), "{by_sql:?}");
            assert_eq!(by_sql.get("(an unknown prepared statement)"), Some(&1));
            assert_eq!(by_sql.get("BEGIN"), Some(&1));
            assert!(reader.pending.is_empty());
        }
    }

    #[test]
    fn server_urls_keep_the_user_and_move_the_host() {
        let s = Server::parse("postgres://postgres@127.0.0.1:5432/test").unwrap();
        assert_eq!(s.authority(), "127.0.0.1:5432");
        assert_eq!(
            s.url("127.0.0.1:6000", "fleet"),
            "postgres://postgres@127.0.0.1:6000/fleet?sslmode=disable"
        );
        let s = Server::parse("postgresql://u:pw@db.example/x?sslmode=require").unwrap();
        assert_eq!(s.authority(), "db.example:5432");
        assert_eq!(
            s.url(&s.authority(), "y"),
            "postgresql://u:pw@db.example:5432/y?sslmode=disable"
        );
    }
}
