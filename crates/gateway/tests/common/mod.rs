//! Shared set-up: a fake upstream (in-process, streamable HTTP, recording every delivery), a
//! registry folder made from the finance example's tools and policies with known test keys,
//! toolgate serving it on a free port, and rmcp clients holding role credentials.
#![allow(dead_code)]

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use axum::serve::ListenerExt;

use rmcp::model::{
    CallToolRequestParams, CallToolResult, JsonObject, MetaObject, RequestMetaObject,
};
use rmcp::service::{RunningService, ServiceError};
use rmcp::transport::streamable_http_client::StreamableHttpClientTransportConfig;
use rmcp::transport::streamable_http_server::session::local::LocalSessionManager;
use rmcp::transport::{
    StreamableHttpClientTransport, StreamableHttpServerConfig, StreamableHttpService,
};
use rmcp::{RoleClient, ServiceExt};
use serde_json::Value;
use tokio_util::sync::CancellationToken;
use toolgate_core::registry::api_key_hash;
use toolgate_fakes::record::{Record, read_records};
use toolgate_fakes::{FakeServer, FaultPlan, FaultSpec, Recorder};
use toolgate_gateway::{Gateway, OAuthOptions, ServeOptions};

pub const WORKER_KEY: &str = "tg-test-worker-key-0001";
pub const PLANNER_KEY: &str = "tg-test-planner-key-0001";
/// A second finance worker with the same grants as the first: two principals, one tool surface.
pub const WORKER_B_KEY: &str = "tg-test-worker-b-key-0001";
pub const CLERK_KEY: &str = "tg-test-clerk-key-0001";
pub const OAUTH_SUBJECT: &str = "oauth|planner-7";

pub fn example_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../examples/finance")
}

pub fn fixtures() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures")
}

/// Serves the finance fake over streamable HTTP on a free port, recording to `record`.
pub async fn start_fake_finance(
    record: &Path,
    faults: Vec<FaultSpec>,
) -> (SocketAddr, CancellationToken) {
    let (addr, ct, _) = start_fake_finance_counted(record, faults).await;
    (addr, ct)
}

/// As [`start_fake_finance`], also counting the TCP connections the fake accepts. Like the
/// fake binary (and Node's and Python's HTTP servers), it sets `TCP_NODELAY` on each.
pub async fn start_fake_finance_counted(
    record: &Path,
    faults: Vec<FaultSpec>,
) -> (SocketAddr, CancellationToken, Arc<AtomicUsize>) {
    let server = FakeServer::new(
        toolgate_fakes::finance::Finance::seeded(),
        Recorder::to_file(record).expect("record file"),
        FaultPlan::new(faults, 1),
    );
    let ct = CancellationToken::new();
    let service = StreamableHttpService::new(
        move || Ok(server.clone()),
        Arc::new(LocalSessionManager::default()),
        StreamableHttpServerConfig::default().with_cancellation_token(ct.clone()),
    );
    let app = axum::Router::new().nest_service("/mcp", service);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let accepted = Arc::new(AtomicUsize::new(0));
    let counter = accepted.clone();
    let listener = listener.tap_io(move |tcp| {
        counter.fetch_add(1, Ordering::SeqCst);
        let _ = tcp.set_nodelay(true);
    });
    let stop = ct.clone();
    tokio::spawn(async move {
        axum::serve(listener, app)
            .with_graceful_shutdown(async move { stop.cancelled().await })
            .await
            .unwrap();
    });
    (addr, ct, accepted)
}

fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for e in std::fs::read_dir(from).unwrap() {
        let e = e.unwrap();
        std::fs::copy(e.path(), to.join(e.file_name())).unwrap();
    }
}

/// The principals of the test registry: the finance example's roles (not plan-bound here:
/// these tests exercise direct calls), a finance worker, a planner (API key and OAuth subject).
fn principals_yaml() -> String {
    format!(
        r#"roles:
  planner: {{description: "reads and proposes"}}
  worker.finance: {{description: "finance worker (direct calls in these tests)"}}
  worker.comms: {{description: "supplier correspondence"}}
  reviewer: {{description: "model reviewer"}}
  reconciler: {{description: "settles unknown outcomes"}}
  ap.clerk: {{description: "approves payments", approver: true}}
  supplier.admin: {{description: "changes supplier bank details"}}
principals:
  - id: test-planner
    kind: agent
    role: planner
    credentials:
      - {{id: test, sha256: "{planner}", oauth_subject: "{subject}"}}
    grants:
      - scopes: [invoices:read, purchase_orders:read]
        purposes: [billing]
        max_tier: read
        max_sensitivity: confidential
  - id: test-worker
    kind: agent
    role: worker.finance
    credentials:
      - {{id: test, sha256: "{worker}"}}
    grants:
      - scopes: [invoices:read, purchase_orders:read, notes:write, payments:write]
        purposes: [billing]
        max_tier: spend
        max_sensitivity: confidential
    budgets: {{act: 50, spend: 5}}
  - id: test-worker-b
    kind: agent
    role: worker.finance
    credentials:
      - {{id: test, sha256: "{worker_b}"}}
    grants:
      - scopes: [invoices:read, purchase_orders:read, notes:write, payments:write]
        purposes: [billing]
        max_tier: spend
        max_sensitivity: confidential
    budgets: {{act: 50, spend: 5}}
  - id: test-clerk
    kind: human
    role: ap.clerk
    credentials:
      - {{id: test, sha256: "{clerk}"}}
    grants:
      - scopes: [invoices:read, payments:read]
        purposes: [billing]
        max_tier: read
        max_sensitivity: confidential
  # A second person who may approve: the two-person IBAN change needs two (lint approval.nobody).
  - id: test-clerk-b
    kind: human
    role: ap.clerk
    credentials:
      - {{id: test, sha256: "{clerk_b}"}}
    grants:
      - scopes: [invoices:read, payments:read]
        purposes: [billing]
        max_tier: read
        max_sensitivity: confidential
"#,
        planner = api_key_hash(PLANNER_KEY),
        worker = api_key_hash(WORKER_KEY),
        worker_b = api_key_hash(WORKER_B_KEY),
        clerk = api_key_hash(CLERK_KEY),
        clerk_b = api_key_hash("tg-test-clerk-b-key-0001"),
        subject = OAUTH_SUBJECT,
    )
}

/// Writes a registry folder whose `erp` upstream is `upstream` (a toolgate.yaml fragment).
pub fn write_registry(dir: &Path, upstream: &str) {
    let ex = example_dir();
    copy_dir(&ex.join("tools"), &dir.join("tools"));
    copy_dir(&ex.join("policies"), &dir.join("policies"));
    std::fs::write(dir.join("principals.yaml"), principals_yaml()).unwrap();
    std::fs::write(
        dir.join("toolgate.yaml"),
        format!("label: gateway-test\nstore:\n  url: \"sqlite://toolgate-test.db\"\nupstreams:\n  erp:\n{upstream}"),
    )
    .unwrap();
    // The finance example's pins, moved to wherever this registry reaches the same fake.
    std::fs::copy(ex.join("toolgate.lock"), dir.join("toolgate.lock")).unwrap();
    toolgate_gateway::pins::rehome_lock(dir).unwrap();
}

/// toolgate in front of the finance fake, over streamable HTTP.
pub struct Harness {
    pub dir: tempfile::TempDir,
    pub record: PathBuf,
    pub url: String,
    pub addr: SocketAddr,
    pub gateway: Gateway,
    pub stop: CancellationToken,
    fake_stop: CancellationToken,
}

impl Harness {
    pub async fn start() -> Harness {
        Self::start_with(Vec::new(), None).await
    }

    /// A harness whose fake answers every call of `tool` (the fake's own name) after `ms`.
    pub async fn start_slow(tool: &str, ms: u64) -> Harness {
        let slow = FaultSpec {
            kind: toolgate_fakes::FaultKind::Slow(std::time::Duration::from_millis(ms)),
            selector: toolgate_fakes::fault::Selector::Always,
            tool: Some(tool.into()),
        };
        Self::start_with(vec![slow], None).await
    }

    pub async fn start_with(faults: Vec<FaultSpec>, oauth: Option<OAuthOptions>) -> Harness {
        let dir = tempfile::tempdir().unwrap();
        let record = dir.path().join("erp-calls.jsonl");
        let (fake, fake_stop) = start_fake_finance(&record, faults).await;
        Self::serve(dir, record, fake, fake_stop, "", oauth).await
    }

    /// toolgate in front of a fake already listening at `fake`, with `extra` (toolgate.yaml
    /// lines, indented) added to its upstream's entry.
    pub async fn serve(
        dir: tempfile::TempDir,
        record: PathBuf,
        fake: SocketAddr,
        fake_stop: CancellationToken,
        extra: &str,
        oauth: Option<OAuthOptions>,
    ) -> Harness {
        write_registry(
            dir.path(),
            &format!(
                "    url: \"http://{fake}/mcp\"\n    package: \"toolgate-fakes@0.1.0\"\n    timeout_secs: 2\n{extra}"
            ),
        );
        let opts = ServeOptions {
            config_dir: dir.path().to_path_buf(),
            http: true,
            oauth,
            keys: toolgate_gateway::KeySource::Dev,
            ..ServeOptions::default()
        };
        let gateway = Gateway::build(&opts).await.expect("gateway builds");
        let stop = CancellationToken::new();
        let (addr, fut) = gateway
            .bind_http("127.0.0.1:0", stop.clone())
            .await
            .unwrap();
        tokio::spawn(fut);
        Harness {
            url: format!("http://{addr}/mcp"),
            dir,
            record,
            addr,
            gateway,
            stop,
            fake_stop,
        }
    }

    /// A harness around a gateway a test built itself (e.g. from a registry it edited).
    pub fn from_parts(
        dir: tempfile::TempDir,
        record: PathBuf,
        addr: SocketAddr,
        gateway: Gateway,
        stop: CancellationToken,
        fake_stop: CancellationToken,
    ) -> Harness {
        Harness {
            url: format!("http://{addr}/mcp"),
            dir,
            record,
            addr,
            gateway,
            stop,
            fake_stop,
        }
    }

    pub async fn client(&self, key: &str) -> RunningService<RoleClient, ()> {
        connect(&self.url, key).await
    }

    /// Every delivery the fake ERP received.
    pub fn records(&self) -> Vec<Record> {
        if !self.record.exists() {
            return Vec::new();
        }
        read_records(&self.record).unwrap()
    }

    pub fn records_for(&self, upstream_tool: &str) -> Vec<Record> {
        self.records()
            .into_iter()
            .filter(|r| r.tool == upstream_tool)
            .collect()
    }

    pub async fn audit(&self, principal: &str) -> Vec<Value> {
        self.gateway
            .state
            .store
            .audit_records(Some(&principal.into()), None)
            .await
            .unwrap()
            .into_iter()
            .map(|r| serde_json::to_value(r).unwrap())
            .collect()
    }

    pub async fn shutdown(self) {
        self.stop.cancel();
        self.gateway.close().await;
        self.fake_stop.cancel();
    }
}

pub async fn connect(url: &str, key: &str) -> RunningService<RoleClient, ()> {
    let transport = StreamableHttpClientTransport::from_config(
        StreamableHttpClientTransportConfig::with_uri(url).auth_header(key),
    );
    ().serve(transport).await.expect("client connects")
}

pub fn obj(v: Value) -> JsonObject {
    match v {
        Value::Object(m) => m,
        _ => panic!("not an object"),
    }
}

/// Calls `tool` with `args` and `_meta`.
pub async fn call(
    client: &RunningService<RoleClient, ()>,
    tool: &str,
    args: Value,
    meta: Value,
) -> Result<CallToolResult, ServiceError> {
    let mut p = CallToolRequestParams::new(tool.to_string()).with_arguments(obj(args));
    p.meta = Some(RequestMetaObject(MetaObject(obj(meta))));
    client.peer().call_tool(p).await
}

pub fn billing(reason: &str, run: &str) -> Value {
    serde_json::json!({"purpose": "billing", "reason": reason, "run_id": run})
}
