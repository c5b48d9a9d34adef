//! Unmodified MCP clients against the real `toolgate serve` with each shipped example: the
//! official Python SDK (as its README shows, `mcp.Client(url)`, which speaks 2026-07-28
//! statelessly; and its `ClientSession` with the `initialize` handshake, a stateful session) and
//! the official TypeScript SDK (stateful), sending no `_meta` at all. Everything a call needs —
//! purpose, reason, which run, which operation — comes from the tool's listed arguments, the
//! caller's defaults and the store, never from the connection: a write retried from a new
//! session or after a reconnect reaches the upstream once, a gated call approved by a person
//! runs on a plain retry exactly once, a rejected one stays rejected, and the approvers' queue
//! holds one item per operation throughout. People decide with the real `toolgate approvals`
//! command. Assertions are on the fake upstream's record of what it was asked, the store and the
//! audit chain.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use toolgate_fakes::record::{Record, read_records};
use toolgate_store::audit::AuditDecision;
use toolgate_store::{ApprovalStatus, Store, StoreConfig};

use crate::clients::{Client, python_client, ts_client, workspace_binary};

pub const APPROVAL_KEY: &str = "toolgate-test-approval-key-0123456789abcdef";
pub const REDACTION_KEY: &str = "toolgate-test-redaction-key-0123456789";

/// How a client speaks to the gateway.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// `initialize`, then requests on one `Mcp-Session-Id` (2025-11-25).
    Stateful,
    /// No session: every request stands alone (2026-07-28, `server/discover`).
    Stateless,
}

/// A shipped example folder served by the real `toolgate serve` binary on a loopback port,
/// its upstream the example's fake binary recording every call it receives.
pub struct Served {
    _tmp: tempfile::TempDir,
    pub dir: PathBuf,
    pub url: String,
    /// Where it serves: picked by the first `serve` (port 0), kept by restarts so clients
    /// reconnect to the same URL.
    addr: Option<std::net::SocketAddr>,
    record: PathBuf,
    log: PathBuf,
    child: Option<tokio::process::Child>,
}

fn copy_tree(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for e in std::fs::read_dir(from).unwrap() {
        let e = e.unwrap();
        let dest = to.join(e.file_name());
        if e.file_type().unwrap().is_dir() {
            copy_tree(&e.path(), &dest);
        } else {
            std::fs::copy(e.path(), dest).unwrap();
        }
    }
}

fn replace_line(text: &str, starts: &str, with: &str) -> String {
    let mut done = false;
    let out: Vec<String> = text
        .lines()
        .map(|l| {
            if !done && l.trim_start().starts_with(starts) {
                done = true;
                let indent = &l[..l.len() - l.trim_start().len()];
                format!("{indent}{with}")
            } else {
                l.to_string()
            }
        })
        .collect();
    assert!(done, "no line starting with {starts:?}");
    out.join("\n") + "\n"
}

impl Served {
    /// `examples/<example>` copied as shipped, with only its upstream's command made a full
    /// path (recording to a file) and its store put in the temporary folder.
    pub async fn start(example: &str) -> Served {
        let fake = match example {
            "finance" => "toolgate-fake-finance",
            "field-services" => "toolgate-fake-field",
            other => panic!("no example {other}"),
        };
        let src = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
            .join("../../examples")
            .join(example);
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join(example);
        copy_tree(&src, &dir);
        let record = tmp.path().join("upstream-calls.jsonl");
        let bin = workspace_binary(fake, "toolgate-fakes");
        let top = dir.join("toolgate.yaml");
        let mut text = std::fs::read_to_string(&top).unwrap();
        text = replace_line(
            &text,
            "command:",
            &format!("command: {:?}", bin.display().to_string()),
        );
        text = replace_line(
            &text,
            "args:",
            &format!("args: [\"--record\", {:?}]", record.display().to_string()),
        );
        text = replace_line(
            &text,
            "url: \"sqlite://",
            &format!(
                "url: \"sqlite://{}\"",
                tmp.path().join("store.db").display()
            ),
        );
        std::fs::write(&top, text).unwrap();
        toolgate_gateway::pins::rehome_lock(&dir).unwrap();
        let mut s = Served {
            url: String::new(),
            addr: None,
            log: tmp.path().join("serve.log"),
            record,
            dir,
            _tmp: tmp,
            child: None,
        };
        s.spawn().await;
        s
    }

    /// Starts `toolgate serve` and waits until it is ready (store and upstream connected).
    pub async fn spawn(&mut self) {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log)
            .unwrap();
        let child = tokio::process::Command::new(workspace_binary("toolgate", "toolgate"))
            .arg("serve")
            .arg("-c")
            .arg(&self.dir)
            .arg("--http")
            .arg(
                self.addr
                    .map_or("127.0.0.1:0".to_string(), |a| a.to_string()),
            )
            .arg("--no-watch")
            .env("TOOLGATE_APPROVAL_KEY", APPROVAL_KEY)
            .env("TOOLGATE_REDACTION_KEY", REDACTION_KEY)
            .env("RUST_LOG", "warn")
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .kill_on_drop(true)
            .spawn()
            .unwrap();
        let pid = child.id().expect("running");
        self.child = Some(child);
        let addr = toolgate_testkit::served_addr(&self.dir, pid, Some(&self.log)).await;
        self.addr = Some(addr);
        self.url = format!("http://{addr}/mcp");
        let ready = format!("http://{addr}/readyz");
        let http = reqwest::Client::new();
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            if let Ok(r) = http.get(&ready).send().await
                && r.status().is_success()
            {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "toolgate serve was not ready in 60 s:\n{}",
                std::fs::read_to_string(&self.log).unwrap_or_default()
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// What the upstream was asked, by its tool name.
    pub fn records(&self, upstream_tool: &str) -> Vec<Record> {
        if !self.record.exists() {
            return Vec::new();
        }
        read_records(&self.record)
            .unwrap()
            .into_iter()
            .filter(|r| r.tool == upstream_tool)
            .collect()
    }

    /// The store `serve` writes (SQLite, opened beside it).
    pub async fn store(&self) -> Store {
        let url = format!(
            "sqlite://{}",
            self.dir.parent().unwrap().join("store.db").display()
        );
        Store::connect(&url, StoreConfig::default()).await.unwrap()
    }

    /// Runs `toolgate approvals …` as the holder of `key`; returns (success, stdout+stderr).
    pub async fn approvals(&self, args: &[&str], key: &str) -> (bool, String) {
        let out = tokio::process::Command::new(workspace_binary("toolgate", "toolgate"))
            .arg("approvals")
            .args(args)
            .arg("-c")
            .arg(&self.dir)
            .env("TOOLGATE_API_KEY", key)
            .env("TOOLGATE_APPROVAL_KEY", APPROVAL_KEY)
            .env("TOOLGATE_REDACTION_KEY", REDACTION_KEY)
            .env("RUST_LOG", "error")
            .output()
            .await
            .unwrap();
        let text = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        (out.status.success(), text)
    }

    /// A person approves request `id`, for the input hash the store holds (what `show` prints).
    pub async fn approve(&self, id: &str, key: &str) {
        let store = self.store().await;
        let hash = store.approval(&id.into()).await.unwrap().input_hash;
        store.close().await;
        let (ok, text) = self
            .approvals(&["approve", id, "--input-hash", hash.as_str()], key)
            .await;
        assert!(ok, "approving {id}: {text}");
    }

    pub async fn reject(&self, id: &str, key: &str, reason: &str) {
        let (ok, text) = self
            .approvals(&["reject", id, "--reason", reason], key)
            .await;
        assert!(ok, "rejecting {id}: {text}");
    }
}

/// A script for one client process: one session (connection) per entry.
fn script(s: &Served, mode: Mode, sessions: Vec<(&str, Vec<Value>)>) -> Value {
    json!({
        "transport": "http",
        "url": s.url,
        "client": if mode == Mode::Stateless { "modern" } else { "legacy" },
        "sessions": sessions
            .into_iter()
            .map(|(key, ops)| json!({"bearer": key, "ops": ops}))
            .collect::<Vec<_>>(),
    })
}

fn list() -> Value {
    json!({"op": "list"})
}

/// A call with no `_meta`: only the tool's arguments, as a model fills them in.
fn call(name: &str, arguments: Value) -> Value {
    json!({"op": "call", "name": name, "arguments": arguments})
}

fn results(out: &Value, session: usize) -> &Vec<Value> {
    out["sessions"][session]["results"].as_array().unwrap()
}

fn facts(result: &Value) -> &Value {
    &result["structuredContent"]
}

fn text(result: &Value) -> String {
    result["content"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|c| c["text"].as_str())
        .collect::<Vec<_>>()
        .join("\n")
}

fn tool<'a>(listed: &'a Value, name: &str) -> &'a Value {
    listed["tools"]
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["name"] == name)
        .unwrap_or_else(|| panic!("{name} is not listed: {listed}"))
}

fn ok(result: &Value) {
    assert_ne!(result["isError"], true, "{result}");
}

async fn pending(store: &Store) -> Vec<toolgate_store::ApprovalRequest> {
    store
        .approvals(Some(ApprovalStatus::Pending))
        .await
        .unwrap()
}

fn check_protocol(out: &Value, mode: Mode) {
    let protocol = out["sessions"][0]["protocol"].as_str().unwrap_or_default();
    match mode {
        Mode::Stateless => assert_eq!(protocol, "2026-07-28", "{out}"),
        Mode::Stateful => assert_ne!(protocol, "2026-07-28", "{out}"),
    }
}

const DISPATCH: &str = "tgdev_field_dispatch_agent";

/// Field services, as the dispatch agent: reads and a write with no `_meta`; the write retried
/// from a second session and from a second client process reaches the system once; a read after
/// the write sees it.
async fn field_services_without_meta(client: Client, mode: Mode) {
    let s = Served::start("field-services").await;
    let visit = json!({
        "work_order_id": "wo-001", "technician_id": "tech-001", "date": "2026-07-01",
        "window": "am", "reason": "Book Priya for the high-priority oven repair at Quay Street."
    });
    let first = script(
        &s,
        mode,
        vec![
            (
                DISPATCH,
                vec![
                    list(),
                    call(
                        "lookup_customer",
                        json!({"customer_id": "cust-001", "purpose": "service_delivery"}),
                    ),
                    call("list_technicians", json!({})),
                    call("schedule_technician", visit.clone()),
                    call("list_technicians", json!({})),
                ],
            ),
            (DISPATCH, vec![call("schedule_technician", visit.clone())]),
        ],
    );
    let out = client.run(&first).await;
    check_protocol(&out, mode);
    let a = results(&out, 0);

    // The listed schemas ask for what the model must say: lookup_customer may serve two of the
    // agent's purposes, so `purpose` is a required enum of those; a write asks for a reason.
    let lookup = tool(&a[0], "lookup_customer");
    assert_eq!(
        lookup["inputSchema"]["properties"]["purpose"]["enum"],
        json!(["service_delivery", "billing"])
    );
    assert!(
        lookup["inputSchema"]["required"]
            .as_array()
            .unwrap()
            .contains(&json!("purpose"))
    );
    let schedule = tool(&a[0], "schedule_technician");
    assert!(
        schedule["inputSchema"]["properties"]
            .get("purpose")
            .is_none()
    );
    assert!(
        schedule["inputSchema"]["required"]
            .as_array()
            .unwrap()
            .contains(&json!("reason"))
    );

    for r in &a[1..] {
        ok(r);
    }
    // toolgate's own arguments are stripped before forwarding: the system was asked exactly
    // the tool's inputs, and its _meta holds only what toolgate sends upstreams (the key, the
    // run and step, and the MCP progress token toolgate relays progress under).
    let lookups = s.records("lookup_customer");
    assert_eq!(lookups.len(), 1);
    assert_eq!(lookups[0].arguments, json!({"customer_id": "cust-001"}));
    let booked = s.records("schedule_technician");
    assert_eq!(booked.len(), 1, "booked once, however often retried");
    let mut forwarded = visit.clone();
    forwarded.as_object_mut().unwrap().remove("reason");
    assert_eq!(booked[0].arguments, forwarded);
    let keys: Vec<&String> = booked[0].meta.as_object().unwrap().keys().collect();
    assert!(
        keys.iter().all(|k| [
            "idempotency_key",
            "run_id",
            "step_id",
            "traceparent",
            "progressToken"
        ]
        .contains(&k.as_str())),
        "{keys:?}"
    );

    // A read after the write in the same run is asked again and sees the booking.
    let before = &facts(&a[2])["technicians"][0]["visits"];
    let after = &facts(&a[4])["technicians"][0]["visits"];
    assert_eq!(before, &json!([]));
    assert_eq!(after[0]["work_order_id"], "wo-001");
    assert_eq!(s.records("list_technicians").len(), 2);

    // The retry from a second session got the first booking's result.
    let retried = &results(&out, 1)[0];
    ok(retried);
    assert_eq!(facts(retried), facts(&a[3]));

    // After a reconnect (a new client process): still one booking, the same answer.
    let again = client
        .run(&script(
            &s,
            mode,
            vec![(DISPATCH, vec![call("schedule_technician", visit.clone())])],
        ))
        .await;
    let r = &results(&again, 0)[0];
    ok(r);
    assert_eq!(facts(r), facts(&a[3]));
    assert_eq!(s.records("schedule_technician").len(), 1);

    // The records say where each purpose came from and that the retries ran nothing.
    let store = s.store().await;
    let audit = store
        .audit_records(Some(&"dispatch-agent".into()), None)
        .await
        .unwrap();
    let of = |tool: &str| -> Vec<&toolgate_store::audit::AuditRecord> {
        audit.iter().filter(|r| r.body.tool == tool).collect()
    };
    let sched = of("schedule_technician");
    let kinds: Vec<AuditDecision> = sched.iter().map(|r| r.body.why.decision).collect();
    assert_eq!(
        kinds,
        [
            AuditDecision::Allow,
            AuditDecision::Replay,
            AuditDecision::Replay
        ]
    );
    let purpose = |r: &toolgate_store::audit::AuditRecord| {
        r.body
            .why
            .checks
            .iter()
            .find(|c| c.name == toolgate_core::CheckName::Purpose)
            .unwrap()
            .detail
            .clone()
    };
    assert!(
        purpose(sched[0]).contains("the only purpose the caller's grants allow"),
        "{}",
        purpose(sched[0])
    );
    assert!(purpose(of("lookup_customer")[0]).contains("given as an argument"));
    assert_eq!(
        sched[0].body.why.reason.as_deref(),
        Some("Book Priya for the high-priority oven repair at Quay Street.")
    );
    // One run for all of it, whatever the sessions: the agent's current run.
    let runs: std::collections::BTreeSet<Option<toolgate_core::RunId>> =
        audit.iter().map(|r| r.body.run_id.clone()).collect();
    assert_eq!(runs.len(), 1, "{runs:?}");
    assert!(store.verify_chain().await.unwrap().is_intact());
    store.close().await;
}

const PLANNER: &str = "tgdev_fin_planner";
const WORKER: &str = "tgdev_fin_worker";
const SAM: &str = "tgdev_fin_sam";
const ALICE: &str = "tgdev_fin_alice";
const BOB: &str = "tgdev_fin_bob";

/// Finance, as shipped (plan-bound workers, every payment gated): the planner reads and submits
/// a plan; the worker's plain call of the planned payment is parked, a retry returns the same
/// request, a person approves it, and the worker's next plain retry pays it once; an IBAN change
/// rejected by a person stays rejected, with the person's note, on every retry.
async fn finance_without_meta(client: Client, mode: Mode) {
    let s = Served::start("finance").await;
    let payment = json!({
        "invoice_id": "INV-20260612", "amount": 12600.0, "currency": "EUR",
        "value_date": "2026-07-03",
        "reason": "Freight invoice INV-20260612 matched against PO-77840 line 1"
    });
    let plan = json!({
        "goal": "Pay the approved June freight invoice from Costa Verde.",
        "reason": "The invoice is approved and matches its purchase order; it is due on 3 July.",
        "steps": [{
            "tool": "payment.schedule", "inputs": payment, "purpose": "billing",
            "justification": "INV-20260612 is approved and matches PO-77840 exactly.",
            "evidence": ["INV-20260612", "PO-77840"], "worker": "fin-worker"
        }]
    });
    let out = client
        .run(&script(
            &s,
            mode,
            vec![(
                PLANNER,
                vec![
                    list(),
                    call("invoice.search", json!({"invoice_id": "INV-20260612"})),
                    call("plan.submit", plan),
                ],
            )],
        ))
        .await;
    check_protocol(&out, mode);
    let p = results(&out, 0);
    // The planner's only purpose is billing, so it states none; plan.submit asks for a reason.
    assert!(
        tool(&p[0], "invoice.search")["inputSchema"]["properties"]
            .get("purpose")
            .is_none()
    );
    assert!(
        tool(&p[0], "plan.submit")["inputSchema"]["properties"]
            .get("reason")
            .is_some()
    );
    ok(&p[1]);
    assert_eq!(facts(&p[1])["invoices"][0]["invoice_id"], "INV-20260612");
    ok(&p[2]);

    // The worker calls the planned payment, twice, from two sessions: parked once.
    let pay = || call("payment.schedule", payment.clone());
    let out = client
        .run(&script(
            &s,
            mode,
            vec![(WORKER, vec![pay()]), (WORKER, vec![pay()])],
        ))
        .await;
    let (r1, r2) = (&results(&out, 0)[0], &results(&out, 1)[0]);
    assert_eq!(facts(r1)["status"], "needs_approval", "{r1}");
    assert_eq!(facts(r2)["status"], "needs_approval", "{r2}");
    assert_eq!(facts(r1)["approval_id"], facts(r2)["approval_id"]);
    assert!(
        text(r1).contains("Retry the same call later"),
        "{}",
        text(r1)
    );
    let id = facts(r1)["approval_id"].as_str().unwrap().to_string();
    let store = s.store().await;
    assert_eq!(
        pending(&store).await.len(),
        1,
        "one queue item per operation"
    );
    assert!(s.records("schedule_payment").is_empty());

    // A person approves; the worker's plain retry pays it, once; later retries replay.
    s.approve(&id, ALICE).await;
    let out = client
        .run(&script(
            &s,
            mode,
            vec![(WORKER, vec![pay()]), (WORKER, vec![pay()])],
        ))
        .await;
    let (paid, again) = (&results(&out, 0)[0], &results(&out, 1)[0]);
    ok(paid);
    ok(again);
    assert_eq!(facts(paid)["invoice_id"], "INV-20260612");
    assert_eq!(facts(again), facts(paid));
    assert_eq!(s.records("schedule_payment").len(), 1, "paid once");
    assert!(pending(&store).await.is_empty());
    assert_eq!(
        store.approval(&id.as_str().into()).await.unwrap().status,
        ApprovalStatus::Consumed
    );

    // An IBAN change, asked twice (two people must approve): parked once; rejected by one.
    let change = json!({
        "supplier_id": "SUP-0002", "iban": "ES9121000418450200051332",
        "reason": "The supplier's letter of 28 June asks to move payments to a new account."
    });
    let ask = || call("supplier.update_iban", change.clone());
    let out = client
        .run(&script(
            &s,
            mode,
            vec![(SAM, vec![ask()]), (SAM, vec![ask()])],
        ))
        .await;
    let (c1, c2) = (&results(&out, 0)[0], &results(&out, 1)[0]);
    assert_eq!(facts(c1)["status"], "needs_approval", "{c1}");
    assert_eq!(facts(c1)["approval_id"], facts(c2)["approval_id"]);
    let change_id = facts(c1)["approval_id"].as_str().unwrap().to_string();
    assert_eq!(pending(&store).await.len(), 1);
    s.reject(&change_id, BOB, "not confirmed by phone with the supplier")
        .await;

    // Every retry hears the rejection and its note; no new request is raised.
    let out = client
        .run(&script(
            &s,
            mode,
            vec![(SAM, vec![ask()]), (SAM, vec![ask()])],
        ))
        .await;
    for session in 0..2 {
        let r = &results(&out, session)[0];
        assert_eq!(r["isError"], true, "{r}");
        assert_eq!(facts(r)["rule"], "approval.rejected", "{r}");
        assert!(text(r).contains("not confirmed by phone"), "{}", text(r));
        assert!(text(r).contains("bob"), "{}", text(r));
    }
    assert!(pending(&store).await.is_empty());
    let all = store.approvals(None).await.unwrap();
    assert_eq!(
        all.iter()
            .filter(|a| a.tool == "supplier.update_iban")
            .count(),
        1,
        "the rejected change was asked about once"
    );
    assert!(s.records("update_supplier_iban").is_empty());
    assert!(store.verify_chain().await.unwrap().is_intact());
    store.close().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn python_sdk_stateless_uses_field_services_without_meta() {
    if let Some(c) = python_client() {
        field_services_without_meta(c, Mode::Stateless).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn python_sdk_stateful_uses_field_services_without_meta() {
    if let Some(c) = python_client() {
        field_services_without_meta(c, Mode::Stateful).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn typescript_sdk_uses_field_services_without_meta() {
    if let Some(c) = ts_client() {
        field_services_without_meta(c, Mode::Stateful).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn python_sdk_stateless_pays_once_after_approval_without_meta() {
    if let Some(c) = python_client() {
        finance_without_meta(c, Mode::Stateless).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn python_sdk_stateful_pays_once_after_approval_without_meta() {
    if let Some(c) = python_client() {
        finance_without_meta(c, Mode::Stateful).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn typescript_sdk_pays_once_after_approval_without_meta() {
    if let Some(c) = ts_client() {
        finance_without_meta(c, Mode::Stateful).await;
    }
}
