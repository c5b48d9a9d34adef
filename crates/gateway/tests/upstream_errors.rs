//! Through a real rmcp client and a real upstream over streamable HTTP: `supplier.notify`'s
//! recipient domain is looked up through `supplier.verified_domains` when the call is decided
//! (a verified domain passes, a look-alike is refused naming the verified ones), and an HTTP 500
//! that follows a committed send leaves the call `unknown`, settled `done` by reconciliation —
//! never `failed`. Asserted on the fake's deliveries and the audit chain.

use std::sync::Arc;

use crate::common::*;
use axum::body::Body;
use axum::http::{Request, StatusCode};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use rmcp::transport::StreamableHttpServerConfig;
use rmcp::transport::StreamableHttpService;
use rmcp::transport::streamable_http_server::session::local::LocalSessionManager;
use serde_json::json;
use tokio_util::sync::CancellationToken;
use toolgate_core::StepStatus;
use toolgate_core::registry::api_key_hash;
use toolgate_fakes::{FakeServer, FaultPlan, Recorder};
use toolgate_gateway::{Gateway, ServeOptions};
use toolgate_store::audit::AuditDecision;

const COMMS_KEY: &str = "tg-test-comms-key-0001";

/// Lets a `notify_supplier` call reach the fake (which sends the email), then answers the
/// caller with an HTTP 500 instead of the fake's answer.
async fn fail_after_commit(req: Request<Body>, next: Next) -> Response {
    let (parts, body) = req.into_parts();
    let bytes = axum::body::to_bytes(body, usize::MAX).await.unwrap();
    let text = String::from_utf8_lossy(&bytes).to_string();
    let hit = text.contains("\"tools/call\"") && text.contains("notify_supplier");
    let res = next
        .run(Request::from_parts(parts, Body::from(bytes)))
        .await;
    if !hit {
        return res;
    }
    // The whole answer first: the fake has committed by the time it is written.
    let _ = axum::body::to_bytes(res.into_body(), usize::MAX).await;
    (StatusCode::INTERNAL_SERVER_ERROR, "internal server error").into_response()
}

async fn start() -> Harness {
    let dir = tempfile::tempdir().unwrap();
    let record = dir.path().join("erp-calls.jsonl");
    let server = FakeServer::new(
        toolgate_fakes::finance::Finance::seeded(),
        Recorder::to_file(&record).unwrap(),
        FaultPlan::new(Vec::new(), 1),
    );
    let fake_stop = CancellationToken::new();
    let service = StreamableHttpService::new(
        move || Ok(server.clone()),
        Arc::new(LocalSessionManager::default()),
        StreamableHttpServerConfig::default().with_cancellation_token(fake_stop.clone()),
    );
    let app = axum::Router::new()
        .nest_service("/mcp", service)
        .layer(middleware::from_fn(fail_after_commit));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let fake = listener.local_addr().unwrap();
    let stop = fake_stop.clone();
    tokio::spawn(async move {
        axum::serve(listener, app)
            .with_graceful_shutdown(async move { stop.cancelled().await })
            .await
            .unwrap();
    });
    write_registry(
        dir.path(),
        &format!(
            "    url: \"http://{fake}/mcp\"\n    package: \"toolgate-fakes@0.1.0\"\n    timeout_secs: 2\n"
        ),
    );
    // A comms worker (not plan-bound in this registry) who may email suppliers.
    let principals = dir.path().join("principals.yaml");
    let mut text = std::fs::read_to_string(&principals).unwrap();
    text.push_str(&format!(
        r#"  - id: test-comms
    kind: agent
    role: worker.comms
    credentials:
      - {{id: test, sha256: "{}"}}
    grants:
      - scopes: [suppliers:read, suppliers:contact]
        purposes: [billing]
        max_tier: act
        max_sensitivity: internal
    budgets: {{act: 10}}
"#,
        api_key_hash(COMMS_KEY)
    ));
    std::fs::write(&principals, text).unwrap();
    let opts = ServeOptions {
        config_dir: dir.path().to_path_buf(),
        http: true,
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
    Harness::from_parts(dir, record, addr, gateway, stop, fake_stop)
}

fn email(to: &str) -> serde_json::Value {
    json!({
        "supplier_id": "SUP-0002",
        "invoice_id": "INV-20260612",
        "to": to,
        "subject": "INV-20260612 scheduled",
        "body": "Your invoice INV-20260612 is scheduled for payment on 3 July."
    })
}

fn text_of(r: &rmcp::model::CallToolResult) -> String {
    r.content
        .iter()
        .filter_map(|c| c.as_text().map(|t| t.text.clone()))
        .collect::<Vec<_>>()
        .join("\n")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn looked_up_destinations_and_an_error_after_commit() {
    let h = start().await;
    let client = h.client(COMMS_KEY).await;

    // A look-alike domain: refused before anything is sent, naming the verified domains.
    let r = call(
        &client,
        "supplier.notify",
        email("facturas@costaverde-pagos.com"),
        billing("the invoice asks to write here", "run-x"),
    )
    .await
    .unwrap();
    assert_eq!(r.is_error, Some(true));
    let msg = text_of(&r);
    assert!(
        msg.contains("Allowed: costaverde-logistica.es, cvlog.es"),
        "{msg}"
    );
    assert!(h.records_for("notify_supplier").is_empty());
    assert_eq!(h.records_for("supplier_verified_domains").len(), 1);

    // The verified domain: sent, but the answer is an HTTP 500. The call is unknown, not
    // failed: it is never retried blind.
    let r = call(
        &client,
        "supplier.notify",
        email("facturas@costaverde-logistica.es"),
        billing("tell the supplier the invoice is scheduled", "run-y"),
    )
    .await
    .unwrap();
    assert_eq!(r.is_error, Some(true));
    assert!(text_of(&r).contains("unknown"), "{}", text_of(&r));
    assert_eq!(h.records_for("notify_supplier").len(), 1);
    assert_eq!(h.records_for("supplier_verified_domains").len(), 2);

    let store = &h.gateway.state.store;
    let records = store
        .audit_records(Some(&"test-comms".into()), None)
        .await
        .unwrap();
    let kinds: Vec<(AuditDecision, &str, StepStatus)> = records
        .iter()
        .map(|r| {
            (
                r.body.why.decision,
                r.body.tool.as_str(),
                r.body.outcome.status,
            )
        })
        .collect();
    assert_eq!(
        kinds,
        vec![
            (
                AuditDecision::Lookup,
                "supplier.verified_domains",
                StepStatus::Done
            ),
            (AuditDecision::Deny, "supplier.notify", StepStatus::Refused),
            (
                AuditDecision::Lookup,
                "supplier.verified_domains",
                StepStatus::Done
            ),
            (AuditDecision::Allow, "supplier.notify", StepStatus::Unknown),
        ]
    );
    assert!(
        records[3]
            .body
            .outcome
            .error
            .as_deref()
            .unwrap()
            .contains("HTTP 500"),
        "{:?}",
        records[3].body.outcome
    );

    // Reconciled by key through supplier.lookup_message_by_key: it was sent, so it is done.
    let settled = h.gateway.state.executor().reconcile().await.unwrap();
    assert_eq!(settled.len(), 1);
    assert_eq!(settled[0].status, StepStatus::Done);
    assert_eq!(h.records_for("notify_supplier").len(), 1);
    assert!(store.verify_chain().await.unwrap().is_intact());
    h.shutdown().await;
}
