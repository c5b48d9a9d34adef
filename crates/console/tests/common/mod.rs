//! Shared test support: a real SQLite store in a temp dir, the fixture registry, a recording
//! fake handler standing in for the ERP, parked payments with a history of approved ones, and
//! an in-process HTTP client with a cookie jar.

#![allow(dead_code)]

use std::collections::HashMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use axum::Router;
use axum::body::Body;
use axum::extract::ConnectInfo;
use axum::http::{HeaderMap, Request, StatusCode, header};
use serde_json::{Value, json};
use toolgate_console::{ConsoleOptions, ConsoleState};
use toolgate_core::{ApprovalId, ApprovalKeys, FixedClock, Registry, RunId, StepId, Timestamp};
use toolgate_store::{
    BoxFuture, CallMeta, Executor, Handler, HandlerError, HandlerOutput, PlannedStep, Store,
    StoreConfig, Target,
};
use tower::ServiceExt;

/// 2026-05-28 20:26:40 UTC.
pub const T0: Timestamp = Timestamp::from_millis(1_780_000_000_000);

pub const ALICE_KEY: &str = "alice-console-key-0001";
pub const BOB_KEY: &str = "bob-console-key-0002";
/// A person without an approver role.
pub const CAROL_KEY: &str = "carol-console-key-0003";
/// An AP clerk whose sensitivity ceiling is `internal`.
pub const DAVE_KEY: &str = "dave-console-key-0005";
/// An agent.
pub const WORKER_KEY: &str = "worker-console-key-0004";

/// The scrape token of [`Env::console_scraped`].
pub const SCRAPE_TOKEN: &str = "scrape-token-for-the-tests-0001";

pub const OLD_IBAN: &str = "DE89370400440532013000";
pub const NEW_IBAN: &str = "ES9121000418450200051332";

/// The fake ERP: records every call it receives (tool, step id, inputs), and answers a tool
/// with what `answers` holds for it (`{"ok": true}` otherwise).
#[derive(Default)]
pub struct Recorder {
    pub calls: Mutex<Vec<(String, String, Value)>>,
    pub answers: Mutex<HashMap<String, Value>>,
}

impl Recorder {
    pub fn count(&self, tool: &str) -> usize {
        self.calls
            .lock()
            .unwrap()
            .iter()
            .filter(|c| c.0 == tool)
            .count()
    }
    pub fn count_step(&self, step_id: &str) -> usize {
        self.calls
            .lock()
            .unwrap()
            .iter()
            .filter(|c| c.1 == step_id)
            .count()
    }
}

impl Handler for Recorder {
    fn call<'a>(
        &'a self,
        target: &'a Target,
        inputs: &'a Value,
        meta: &'a CallMeta,
    ) -> BoxFuture<'a, Result<HandlerOutput, HandlerError>> {
        Box::pin(async move {
            let n = {
                let mut c = self.calls.lock().unwrap();
                c.push((
                    target.tool.clone(),
                    meta.step_id.to_string(),
                    inputs.clone(),
                ));
                c.len()
            };
            let answer = self.answers.lock().unwrap().get(&target.tool).cloned();
            Ok(HandlerOutput {
                result: answer.unwrap_or_else(|| json!({"ok": true})),
                target_ref: Some(format!("PAYRUN-2026-06-30/{n:04}")),
            })
        })
    }
}

pub fn fixtures() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures")
}

pub fn registry() -> Arc<Registry> {
    Arc::new(
        Registry::load(fixtures().join("registry"))
            .unwrap_or_else(|e| panic!("fixture registry: {e}")),
    )
}

pub struct Env {
    pub dir: tempfile::TempDir,
    pub store: Store,
    pub exec: Executor,
    pub clock: Arc<FixedClock>,
    pub rec: Arc<Recorder>,
}

pub async fn env() -> Env {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite://{}", dir.path().join("toolgate.db").display());
    let store = Store::connect(&url, StoreConfig::default()).await.unwrap();
    let clock = Arc::new(FixedClock::at(T0));
    let rec = Arc::new(Recorder::default());
    let exec = Executor::new(
        store.clone(),
        registry(),
        Arc::new(ApprovalKeys::new("k1", vec![9u8; 32])),
        rec.clone(),
        clock.clone(),
    );
    Env {
        dir,
        store,
        exec,
        clock,
        rec,
    }
}

pub fn step(tool: &str, inputs: Value, evidence: &[&str]) -> PlannedStep {
    PlannedStep {
        tool: tool.into(),
        inputs,
        principal: "fin-worker".into(),
        purpose: Some("billing".into()),
        reason: Some("Three-way match complete against PO-77840; net-30 from receipt.".into()),
        evidence: evidence.iter().map(|s| s.to_string()).collect(),
        actor: Default::default(),
    }
}

pub fn payment(supplier: &str, invoice: &str, amount: f64, iban: &str) -> Value {
    json!({
        "supplier_id": supplier,
        "invoice_id": invoice,
        "amount": amount,
        "currency": "EUR",
        "iban": iban,
        "reason": "Three-way match complete against PO-77840 line 2",
    })
}

/// A parked step: its run, step id and approval id.
pub struct Parked {
    pub run: RunId,
    pub step: StepId,
    pub approval: ApprovalId,
}

/// Creates a run of `steps`, executes each in order, and returns the last one, parked.
pub async fn park(e: &Env, steps: Vec<PlannedStep>) -> Parked {
    let run = e
        .store
        .create_run(
            &e.exec.registry,
            &"fin-worker".into(),
            Some("billing"),
            &steps,
            e.clock_now(),
        )
        .await
        .unwrap();
    let ids: Vec<StepId> = e
        .store
        .steps(&run)
        .await
        .unwrap()
        .into_iter()
        .map(|s| s.step_id)
        .collect();
    let mut last = None;
    for id in &ids {
        last = Some(e.exec.execute_step(id).await.unwrap());
    }
    let last = last.unwrap();
    let approval = last
        .outcome
        .as_ref()
        .and_then(|o| o.approval_id.clone())
        .unwrap_or_else(|| panic!("the last step is not parked: {last:?}"));
    Parked {
        run,
        step: last.step_id,
        approval,
    }
}

impl Env {
    pub fn clock_now(&self) -> Timestamp {
        use toolgate_core::Clock;
        self.clock.now()
    }

    /// One payment to SUP-0001 with the old IBAN, approved by bob and run: the history the
    /// item page compares with.
    pub async fn history(&self) {
        let p = park(
            self,
            vec![step(
                "payment.schedule",
                payment("SUP-0001", "INV-20260501", 4180.0, OLD_IBAN),
                &[],
            )],
        )
        .await;
        let r = toolgate_console::actions::approve(
            &self.exec,
            &p.approval,
            "bob",
            self.store
                .approval(&p.approval)
                .await
                .unwrap()
                .input_hash
                .as_str(),
            true,
        )
        .await
        .unwrap();
        assert!(
            matches!(r, toolgate_console::actions::Approved::Ran(_)),
            "{r:?}"
        );
        self.clock.advance_hours(1);
    }

    /// The payment the tests decide on: 12,600.50 EUR to SUP-0001, to a new IBAN, after an
    /// invoice read in the same run.
    pub async fn new_iban_payment(&self) -> Parked {
        park(
            self,
            vec![
                step(
                    "invoice.get",
                    json!({"invoice_id": "INV-20260612"}),
                    &["INV-20260612"],
                ),
                step(
                    "payment.schedule",
                    payment("SUP-0001", "INV-20260612", 12600.5, NEW_IBAN),
                    &["INV-20260612", "PO-77840"],
                ),
            ],
        )
        .await
    }

    pub fn console(&self, base: &str) -> ConsoleState {
        self.console_with(base, |_| {})
    }

    /// As [`Env::console`], with `/metrics` open to [`SCRAPE_TOKEN`] and its tables read on
    /// every scrape.
    pub fn console_scraped(&self, base: &str) -> ConsoleState {
        self.console_with(base, |o| {
            o.metrics.token = Some(toolgate_console::ScrapeToken::new(SCRAPE_TOKEN).unwrap());
            o.metrics.table_refresh = std::time::Duration::ZERO;
            o.metrics.min_interval = std::time::Duration::ZERO;
        })
    }

    /// As [`Env::console`], with options changed by `f`.
    pub fn console_with(&self, base: &str, f: impl FnOnce(&mut ConsoleOptions)) -> ConsoleState {
        let ontology = toolgate_ontology::Ontology::load(fixtures().join("ontology.yaml")).unwrap();
        let mut opts = ConsoleOptions {
            base: base.into(),
            ontology: Some(Arc::new(ontology)),
            ..ConsoleOptions::default()
        };
        f(&mut opts);
        ConsoleState::new(self.exec.clone(), opts)
    }
}

/// Percent-encodes a form value.
pub fn enc(s: &str) -> String {
    let mut out = String::new();
    for b in s.bytes() {
        match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                out.push(b as char)
            }
            b' ' => out.push('+'),
            _ => out.push_str(&format!("%{b:02X}")),
        }
    }
    out
}

/// `s` as maud writes text into a page (`&`, `<`, `>`, `"` escaped).
pub fn html_text(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

/// The value of `<input ... name="NAME" value="...">` in a page.
pub fn hidden(html: &str, name: &str) -> Option<String> {
    let at = html.find(&format!("name=\"{name}\""))?;
    let rest = &html[at..];
    let v = rest.find("value=\"")? + 7;
    let end = rest[v..].find('"')?;
    Some(rest[v..v + end].to_string())
}

/// The peer address requests come from unless a test says otherwise.
pub const LOOPBACK: &str = "127.0.0.1:40000";

/// A browser-like client over the router in process: keeps cookies, follows nothing. Each
/// request carries `peer` as the TCP peer (axum's `ConnectInfo`), as a served app records it.
pub struct Http {
    pub app: Router,
    pub jar: HashMap<String, String>,
    pub peer: Option<SocketAddr>,
}

pub struct Reply {
    pub status: StatusCode,
    pub location: Option<String>,
    pub set_cookies: Vec<String>,
    pub headers: HeaderMap,
    pub body: String,
}

impl Http {
    pub fn new(app: Router) -> Self {
        Http {
            app,
            jar: HashMap::new(),
            peer: Some(LOOPBACK.parse().unwrap()),
        }
    }

    /// The same client, its requests coming from `peer` (None: the peer is not recorded).
    pub fn at_peer(mut self, peer: Option<&str>) -> Self {
        self.peer = peer.map(|p| p.parse().unwrap());
        self
    }

    pub async fn send(&mut self, mut req: Request<Body>) -> Reply {
        if let Some(p) = self.peer {
            req.extensions_mut().insert(ConnectInfo(p));
        }
        let res = self.app.clone().oneshot(req).await.unwrap();
        let status = res.status();
        let headers = res.headers().clone();
        let location = res
            .headers()
            .get(header::LOCATION)
            .map(|v| v.to_str().unwrap().to_string());
        let set_cookies: Vec<String> = res
            .headers()
            .get_all(header::SET_COOKIE)
            .iter()
            .map(|v| v.to_str().unwrap().to_string())
            .collect();
        for c in &set_cookies {
            let pair = c.split(';').next().unwrap();
            let (k, v) = pair.split_once('=').unwrap();
            if v.is_empty() {
                self.jar.remove(k);
            } else {
                self.jar.insert(k.to_string(), v.to_string());
            }
        }
        let bytes = axum::body::to_bytes(res.into_body(), usize::MAX)
            .await
            .unwrap();
        Reply {
            status,
            location,
            set_cookies,
            headers,
            body: String::from_utf8_lossy(&bytes).into_owned(),
        }
    }

    fn cookie_header(&self) -> String {
        self.jar
            .iter()
            .map(|(k, v)| format!("{k}={v}"))
            .collect::<Vec<_>>()
            .join("; ")
    }

    pub async fn get(&mut self, path: &str) -> Reply {
        let req = Request::get(path)
            .header(header::COOKIE, self.cookie_header())
            .body(Body::empty())
            .unwrap();
        self.send(req).await
    }

    /// A GET with `Authorization: Bearer <token>`.
    pub async fn get_bearer(&mut self, path: &str, token: &str) -> Reply {
        let req = Request::get(path)
            .header(header::AUTHORIZATION, format!("Bearer {token}"))
            .body(Body::empty())
            .unwrap();
        self.send(req).await
    }

    pub async fn post(&mut self, path: &str, form: &[(&str, &str)]) -> Reply {
        let body = form
            .iter()
            .map(|(k, v)| format!("{}={}", enc(k), enc(v)))
            .collect::<Vec<_>>()
            .join("&");
        let req = Request::post(path)
            .header(header::COOKIE, self.cookie_header())
            .header(header::CONTENT_TYPE, "application/x-www-form-urlencoded")
            .body(Body::from(body))
            .unwrap();
        self.send(req).await
    }

    /// Signs in with `key`; returns the sign-in reply.
    pub async fn sign_in(&mut self, key: &str) -> Reply {
        let page = self.get("/login").await;
        let csrf = hidden(&page.body, "csrf").expect("sign-in form has a CSRF token");
        self.post("/login", &[("api_key", key), ("csrf", &csrf)])
            .await
    }
}

/// One raw approval request on the two-person tool `payment.urgent`: `(id, status, grants,
/// decided_by)`, each grant `(person, offset)` from the request's own start.
pub type RawRequest<'a> = (&'a str, &'a str, &'a [(&'a str, i64)], Option<&'a str>);

/// Writes `rows` as stored approval requests and grants, bypassing the executor (for figures
/// over states a test cannot reach quickly): row i raised at `start + i * step`, decided 3 ms
/// later, open until `open_until` (an expired one until `expired_at`), each grant at
/// `start + offset`.
pub async fn insert_raw_requests(
    e: &Env,
    rows: &[RawRequest<'_>],
    start: i64,
    step: i64,
    open_until: i64,
    expired_at: i64,
) {
    for (i, (id, status, grants, by)) in rows.iter().enumerate() {
        let at = start + i as i64 * step;
        e.store
            .execute_raw(&format!(
                "INSERT INTO approval_requests (approval_id, subject, run_id, principal, tool, \
                 tool_version, input_hash, inputs, reason, evidence, rule, approvers_needed, \
                 status, created_at, expires_at, decided_at, decided_by) VALUES ('{id}', 'sub-{id}', \
                 'run-1', 'fin-worker', 'payment.urgent', '1.0.0', 'sha256:00', '{{}}', NULL, '[]', \
                 'gate.always', 2, '{status}', {at}, {}, {}, {})",
                if *status == "expired" { expired_at } else { open_until },
                at + 3,
                by.map(|b| format!("'{b}'")).unwrap_or_else(|| "NULL".into())
            ))
            .await
            .unwrap();
        for (who, t) in grants.iter() {
            e.store
                .execute_raw(&format!(
                    "INSERT INTO approval_grants (approval_id, approver, token, fingerprint, nonce, \
                     granted_at) VALUES ('{id}', '{who}', 't', 'f', 'n-{id}-{who}', {})",
                    start + t
                ))
                .await
                .unwrap();
        }
    }
}
