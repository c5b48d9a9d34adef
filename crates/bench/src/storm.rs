//! `toolgate-bench storm`: agents paying invoices through a real `toolgate serve` that the bench
//! kills with SIGKILL again and again, each time while the ERP holds at least one payment (booked
//! and not yet answered, or not yet booked). The agents are unmodified MCP clients: no `_meta`
//! at all (the purpose is the only one their grant allows, the reason is the payment's own
//! `reason` input, and the run is the agent's current one), and they do what an ordinary agent
//! does — on a broken connection reconnect and call again, on "in progress" or "unknown for
//! now" wait and call again, on an answer stop. The ERP books every delivery (it does not
//! deduplicate on the key), so a payment booked twice is toolgate's doing.
//!
//! Scored at the end, from the ERP's bookings, the agents' last answers and the audit chain:
//! payments booked; booked twice (must be 0); agents told "refused" for a payment that was
//! booked (must be 0); bookings without an `allow` record of their idempotency key in the chain
//! (must be 0); payments left without a final answer; the chain intact.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::Context;
use rmcp::RoleServer;
use rmcp::service::RequestContext;
use serde::Serialize;
use serde_json::{Value, json};
use toolgate_core::config::Durability;
use toolgate_fakes::finance::Finance;
use toolgate_fakes::{Call, Domain, FakeServer, FaultPlan, Recorder, Reply};
use toolgate_store::Store;
use toolgate_store::audit::AuditDecision;

use crate::crash::{FakeHttp, StoreKind, free_port, spawn_gateway};
use crate::{AMOUNT, Answer, BENCH_KEY, Mcp, REASONS, copy_dir, invoice};

/// Options of `toolgate-bench storm`.
#[derive(Debug, Clone)]
pub struct StormOptions {
    pub toolgate: PathBuf,
    pub store: StoreKind,
    pub durability: Durability,
    /// Payments in all, each for an invoice of its own.
    pub payments: u64,
    /// Agents paying at once (each its own MCP client).
    pub agents: usize,
    /// SIGKILLs of the gateway during the run.
    pub kills: u32,
    /// Longest the ERP holds a payment before or after booking it (ms).
    pub hold_ms: u64,
}

#[derive(Debug, Clone, Default, Serialize)]
pub struct StormReport {
    pub store: String,
    pub durability: String,
    pub payments: u64,
    pub kills: u32,
    /// Kills that came while the ERP held a payment.
    pub kills_while_held: u32,
    pub elapsed_secs: f64,
    /// Invoices booked at least once.
    pub booked: u64,
    pub booked_twice: u64,
    /// Agents whose last answer was "refused" although the ERP booked the payment.
    pub refused_but_booked: u64,
    /// Bookings whose idempotency key has no `allow` record in the chain.
    pub bookings_without_allow: u64,
    /// Payments whose agent gave up without a final answer.
    pub unsettled: u64,
    /// Calls the agents made (first tries and retries).
    pub calls: u64,
    /// Last answers by kind (`done`, `refused`, …).
    pub answers: BTreeMap<String, u64>,
    /// Retries by what the agent had heard (`in_progress`, `unknown`, `disconnected`).
    pub retried: BTreeMap<String, u64>,
    pub audit_records: u64,
    pub audit_chain_intact: bool,
}

/// The finance ERP that books every delivery it gets (under a key of its own, finding a payment
/// by the caller's key for reconciliation), holding each payment up to `hold` before or after
/// booking it.
pub struct Jittery {
    inner: Finance,
    hold: Duration,
    deliveries: AtomicU64,
    held: AtomicU64,
    /// Caller's key → the key the first booking under it was made with.
    aliases: Mutex<HashMap<String, String>>,
    /// Invoice → the caller's key of each booking.
    bookings: Mutex<HashMap<String, Vec<String>>>,
}

impl Jittery {
    fn new(hold: Duration) -> Jittery {
        Jittery {
            inner: Finance::with_bulk_invoices(),
            hold,
            deliveries: AtomicU64::new(0),
            held: AtomicU64::new(0),
            aliases: Mutex::default(),
            bookings: Mutex::default(),
        }
    }

    /// Payments the ERP holds right now.
    pub fn held(&self) -> u64 {
        self.held.load(Ordering::SeqCst)
    }

    async fn book(&self, call: &Call, ctx: &RequestContext<RoleServer>, n: u64) -> Reply {
        let key = call.idempotency_key().unwrap_or_default().to_string();
        let own = format!("{key}#{n}");
        self.aliases
            .lock()
            .expect("aliases")
            .entry(key.clone())
            .or_insert_with(|| own.clone());
        let mut c = call.clone();
        c.meta.insert("idempotency_key".into(), Value::String(own));
        let reply = self.inner.call(&c, ctx).await;
        if reply.committed {
            let invoice = call
                .arguments
                .get("invoice_id")
                .and_then(Value::as_str)
                .unwrap_or_default()
                .to_string();
            self.bookings
                .lock()
                .expect("bookings")
                .entry(invoice)
                .or_default()
                .push(key);
        }
        reply
    }
}

impl Domain for Jittery {
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
        if call.tool == "lookup_payment_by_key" {
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
        let n = self.deliveries.fetch_add(1, Ordering::SeqCst);
        // A spread of holds from a fixed sequence: every other payment is booked first.
        let hold = self.hold.mul_f64(((n * 7919) % 100) as f64 / 100.0);
        let commit_first = n.is_multiple_of(2);
        self.held.fetch_add(1, Ordering::SeqCst);
        let reply = if commit_first {
            let r = self.book(call, ctx, n).await;
            tokio::time::sleep(hold).await;
            r
        } else {
            tokio::select! {
                _ = ctx.ct.cancelled() => {
                    self.held.fetch_sub(1, Ordering::SeqCst);
                    return Reply::read(crate::error_result("no answer (the request was dropped)"));
                }
                _ = tokio::time::sleep(hold) => {}
            }
            self.book(call, ctx, n).await
        };
        self.held.fetch_sub(1, Ordering::SeqCst);
        reply
    }
}

/// The payment of invoice number `n`, exactly as an agent sends it (no `_meta`).
fn payment(n: u64) -> Value {
    json!({"invoice_id": invoice(n), "amount": AMOUNT, "currency": "EUR",
           "value_date": "2026-06-30", "reason": REASONS[0]})
}

/// What an agent ended with for one payment.
#[derive(Debug, Clone)]
struct Last {
    invoice: String,
    answer: String,
}

#[derive(Default)]
struct Tally {
    calls: AtomicU64,
    retried: Mutex<BTreeMap<String, u64>>,
}

impl Tally {
    fn retry(&self, why: &str) {
        *self
            .retried
            .lock()
            .expect("retried")
            .entry(why.to_string())
            .or_default() += 1;
    }
}

/// One agent: pays its invoices one after another, as an ordinary agent would retry.
async fn agent(url: String, invoices: Vec<u64>, tally: &Tally) -> Vec<Last> {
    let mut out = Vec::with_capacity(invoices.len());
    let mut client: Option<Mcp> = None;
    for n in invoices {
        let deadline = Instant::now() + Duration::from_secs(240);
        let answer = loop {
            if Instant::now() > deadline {
                break "unsettled".to_string();
            }
            let c = match client.as_ref() {
                Some(c) => c,
                None => match Mcp::connect(&url, Some(BENCH_KEY)).await {
                    Ok(c) => client.insert(c),
                    Err(_) => {
                        tokio::time::sleep(Duration::from_millis(200)).await;
                        continue;
                    }
                },
            };
            tally.calls.fetch_add(1, Ordering::Relaxed);
            // A live gateway answers within its upstream timeout (2 s) and a second: an agent
            // that hears nothing for longer takes the connection for lost.
            match c
                .call(
                    "payment.schedule",
                    payment(n),
                    Value::Null,
                    Duration::from_secs(6),
                )
                .await
            {
                Answer::Success => break "done".to_string(),
                Answer::Error(s) if s == "in_progress" || s == "unknown" => {
                    tally.retry(&s);
                    tokio::time::sleep(Duration::from_millis(500)).await;
                }
                Answer::Error(s) => break s,
                Answer::Protocol(_) | Answer::Timeout => {
                    tally.retry("disconnected");
                    if let Some(c) = client.take() {
                        c.close().await;
                    }
                    tokio::time::sleep(Duration::from_millis(200)).await;
                }
            }
        };
        out.push(Last {
            invoice: invoice(n),
            answer,
        });
    }
    if let Some(c) = client {
        c.close().await;
    }
    out
}

/// Runs the storm.
pub async fn run_storm(opts: &StormOptions) -> anyhow::Result<StormReport> {
    let started = Instant::now();
    let example = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples/finance");
    let dir = tempfile::tempdir()?;
    copy_dir(&example, dir.path())?;
    crate::prepare_registry(dir.path(), false)?;
    let fake = FakeServer::new(
        Jittery::new(Duration::from_millis(opts.hold_ms)),
        Recorder::disabled(),
        FaultPlan::none(),
    );
    let http: FakeHttp<Jittery> = FakeHttp::start(fake, None).await?;
    let (store_url, pg) = match &opts.store {
        StoreKind::Sqlite => (
            format!("sqlite://{}", dir.path().join("storm.db").display()),
            None,
        ),
        StoreKind::Postgres(server) => {
            let db = crate::database::BenchDatabase::create(server, "storm").await?;
            (db.url.clone(), Some(db))
        }
    };
    let top = dir.path().join("toolgate.yaml");
    let mut config: Value = yaml_serde::from_str(&std::fs::read_to_string(&top)?)?;
    config["upstreams"]["erp"] = json!({
        "url": format!("http://{}/mcp", http.addr),
        "package": config["upstreams"]["erp"]["package"].clone(),
        "timeout_secs": 2.0,
    });
    config["store"] = json!({ "url": store_url, "durability": opts.durability.as_str() });
    std::fs::write(&top, yaml_serde::to_string(&config)?)?;
    toolgate_gateway::pins::rehome_lock(dir.path())?;

    let result = storm(opts, dir.path(), &http, &store_url).await;
    http.stop.cancel();
    if let Some(db) = pg {
        db.drop().await;
    }
    let mut report = result?;
    report.store = match opts.store {
        StoreKind::Sqlite => "sqlite".into(),
        StoreKind::Postgres(_) => "postgres".into(),
    };
    report.durability = opts.durability.as_str().into();
    report.elapsed_secs = started.elapsed().as_secs_f64();
    Ok(report)
}

async fn storm(
    opts: &StormOptions,
    dir: &Path,
    http: &FakeHttp<Jittery>,
    store_url: &str,
) -> anyhow::Result<StormReport> {
    let addr = free_port()?;
    let log = dir.join("gateway.log");
    let mut gateway = spawn_gateway(&opts.toolgate, dir, addr, &log).await?;
    let url = format!("http://{addr}/mcp");
    let tally = std::sync::Arc::new(Tally::default());

    // Each agent pays every `agents`-th invoice.
    let mut tasks = Vec::new();
    for a in 0..opts.agents {
        let invoices: Vec<u64> = (0..opts.payments)
            .filter(|n| *n as usize % opts.agents == a)
            .collect();
        let (url, tally) = (url.clone(), tally.clone());
        tasks.push(tokio::spawn(
            async move { agent(url, invoices, &tally).await },
        ));
    }

    // The kills: spread over the run, each while the ERP holds a payment.
    let ledger = http.fake.domain();
    let (mut kills, mut while_held) = (0u32, 0u32);
    let gap = Duration::from_millis(700);
    while kills < opts.kills && tasks.iter().any(|t| !t.is_finished()) {
        tokio::time::sleep(gap).await;
        // Until the ERP holds a payment (after a kill the agents first hear "in progress" or
        // "unknown for now" for a few seconds, until recovery has settled what was cut off).
        let wait_until = Instant::now() + Duration::from_secs(30);
        while ledger.held() == 0
            && Instant::now() < wait_until
            && tasks.iter().any(|t| !t.is_finished())
        {
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
        while_held += u32::from(ledger.held() > 0);
        gateway.start_kill().context("SIGKILL")?;
        gateway.wait().await?;
        kills += 1;
        gateway = spawn_gateway(&opts.toolgate, dir, addr, &log)
            .await
            .with_context(|| format!("restarting after kill {kills}"))?;
    }
    let mut last = Vec::new();
    for t in tasks {
        last.extend(t.await?);
    }
    let deadline = Instant::now() + Duration::from_secs(30);
    while ledger.held() > 0 && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let _ = gateway.start_kill();
    let _ = gateway.wait().await;

    // The score.
    let store = Store::connect(store_url, Default::default()).await?;
    let records = store.audit_records(None, None).await?;
    let allowed: HashSet<&str> = records
        .iter()
        .filter(|r| r.body.why.decision == AuditDecision::Allow)
        .filter_map(|r| r.body.idem_key.as_deref())
        .collect();
    let bookings = ledger.bookings.lock().expect("bookings").clone();
    let retried = tally.retried.lock().expect("retried").clone();
    let intact = store.verify_chain().await?.is_intact();
    let mut report = StormReport {
        payments: opts.payments,
        kills,
        kills_while_held: while_held,
        calls: tally.calls.load(Ordering::Relaxed),
        retried,
        audit_records: records.len() as u64,
        audit_chain_intact: intact,
        ..StormReport::default()
    };
    for keys in bookings.values() {
        report.booked += 1;
        report.booked_twice += u64::from(keys.len() > 1);
        report.bookings_without_allow += keys
            .iter()
            .filter(|k| !allowed.contains(k.as_str()))
            .count() as u64;
    }
    for l in &last {
        *report.answers.entry(l.answer.clone()).or_default() += 1;
        let booked = bookings.contains_key(&l.invoice);
        report.refused_but_booked += u64::from(l.answer == "refused" && booked);
        report.unsettled += u64::from(l.answer == "unsettled");
    }
    store.close().await;
    Ok(report)
}

/// The storm report as plain text.
pub fn storm_table(r: &StormReport) -> String {
    let answers: Vec<String> = r.answers.iter().map(|(k, v)| format!("{k} {v}")).collect();
    let retried: Vec<String> = r.retried.iter().map(|(k, v)| format!("{k} {v}")).collect();
    format!(
        "toolgate-bench storm ({}, durability {}): {} payments, {} SIGKILLs ({} while the ERP held a payment), {:.0} s\n\
         \n\
         payments booked                          {:>7}\n\
         booked twice                             {:>7}\n\
         agents told \"refused\" for a booking      {:>7}\n\
         bookings without an allow record         {:>7}\n\
         payments left without a final answer     {:>7}\n\
         \n\
         last answers: {}\n\
         calls: {} (retries: {})\n\
         audit chain: {} records, {}\n",
        r.store,
        r.durability,
        r.payments,
        r.kills,
        r.kills_while_held,
        r.elapsed_secs,
        r.booked,
        r.booked_twice,
        r.refused_but_booked,
        r.bookings_without_allow,
        r.unsettled,
        answers.join(", "),
        r.calls,
        retried.join(", "),
        r.audit_records,
        if r.audit_chain_intact {
            "intact"
        } else {
            "BROKEN"
        }
    )
}
