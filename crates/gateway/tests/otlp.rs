//! OpenTelemetry over OTLP/HTTP: with an endpoint configured, each governed call is one span
//! whose events are the decision's checks. An in-process OTLP/HTTP receiver collects what
//! toolgate exports; the spans are checked against the audit chain (one span per audit record,
//! the same sequence number, the same checks with the same outcomes), and the trace context
//! joins the caller's and is carried on to the upstream (checked in the fake ERP's record).

use std::time::Duration;

use crate::common::*;
use axum::Json;
use axum::extract::State;
use axum::routing::post;
use serde_json::{Value, json};
use tokio::sync::mpsc;

/// An OTLP/HTTP traces receiver on a free port: every span it is sent, as JSON.
async fn receiver() -> (String, mpsc::UnboundedReceiver<Value>) {
    let (tx, rx) = mpsc::unbounded_channel();
    async fn traces(
        State(tx): State<mpsc::UnboundedSender<Value>>,
        Json(body): Json<Value>,
    ) -> Json<Value> {
        for rs in body["resourceSpans"].as_array().into_iter().flatten() {
            assert_eq!(
                rs["resource"]["attributes"][0]["value"]["stringValue"],
                "toolgate-test"
            );
            for ss in rs["scopeSpans"].as_array().into_iter().flatten() {
                for span in ss["spans"].as_array().into_iter().flatten() {
                    let _ = tx.send(span.clone());
                }
            }
        }
        Json(json!({}))
    }
    let app = axum::Router::new()
        .route("/v1/traces", post(traces))
        .with_state(tx);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    (format!("http://{addr}/v1/traces"), rx)
}

fn attr<'a>(span: &'a Value, key: &str) -> &'a Value {
    let a = span["attributes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|a| a["key"] == key)
        .unwrap_or_else(|| panic!("attribute {key} in {span}"));
    a["value"]
        .get("stringValue")
        .or_else(|| a["value"].get("intValue"))
        .unwrap()
}

/// The exporter is installed once per process, and the other tests of this binary start
/// governed calls without one: the test runs itself again in a process of its own.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_governed_call_is_one_span_with_its_checks_as_events() {
    const CHILD: &str = "TG_OTLP_CHILD";
    if std::env::var_os(CHILD).is_none() {
        let name = "otlp::each_governed_call_is_one_span_with_its_checks_as_events";
        let out = tokio::process::Command::new(std::env::current_exe().unwrap())
            .args([name, "--exact", "--nocapture", "--test-threads=1"])
            .env(CHILD, "1")
            .output()
            .await
            .unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success() && stdout.contains("1 passed"),
            "the test in its own process failed:\n{stdout}\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
        return;
    }
    let (endpoint, mut spans) = receiver().await;
    assert!(toolgate_gateway::otlp::install(&endpoint, "toolgate-test"));
    let h = Harness::start().await;
    let worker = h.client(WORKER_KEY).await;
    let ok = call(
        &worker,
        "note.draft",
        json!({"invoice_id": "INV-20260615", "kind": "query", "text": "Please confirm the delivery date."}),
        billing("ask the supplier to confirm the delivery date", "run-otlp"),
    )
    .await
    .unwrap();
    assert_ne!(ok.is_error, Some(true));
    let refused = call(
        &worker,
        "payment.schedule",
        json!({"invoice_id": "INV-20260615", "amount": 60000, "currency": "EUR", "value_date": "2026-06-30",
               "reason": "Pay invoice INV-20260615 matched against PO-77901"}),
        billing("pay an approved invoice matched against PO-77901", "run-otlp-2"),
    )
    .await
    .unwrap();
    assert_eq!(refused.is_error, Some(true));
    // A caller in a trace of its own: the call's span joins it as a child of the caller's span.
    let mut traced = billing("list the supplier's open invoices", "run-otlp-3");
    traced["traceparent"] = json!("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01");
    let joined = call(
        &worker,
        "invoice.search",
        json!({"invoice_id": "INV-20260615"}),
        traced,
    )
    .await
    .unwrap();
    assert_ne!(joined.is_error, Some(true), "{joined:?}");

    let mut got = Vec::new();
    while got.len() < 3 {
        let span = tokio::time::timeout(Duration::from_secs(10), spans.recv())
            .await
            .expect("toolgate exports a span per call within 10 s")
            .unwrap();
        got.push(span);
    }
    let audit = h.audit("test-worker").await;
    assert_eq!(audit.len(), 3);
    for rec in &audit {
        let seq = rec["seq"].as_i64().unwrap().to_string();
        let matching: Vec<&Value> = got
            .iter()
            .filter(|s| attr(s, "toolgate.audit_seq") == seq.as_str())
            .collect();
        assert_eq!(matching.len(), 1, "one span for audit record {seq}");
        let span = matching[0];
        let tool = rec["tool"].as_str().unwrap();
        assert_eq!(span["name"], format!("toolgate.call {tool}"));
        assert_eq!(attr(span, "toolgate.principal"), "test-worker");
        assert_eq!(attr(span, "toolgate.decision"), &rec["why"]["decision"]);
        assert_eq!(attr(span, "toolgate.idempotency_key"), &rec["idem_key"]);
        assert_eq!(span["traceId"].as_str().unwrap().len(), 32);
        assert_eq!(span["spanId"].as_str().unwrap().len(), 16);
        // Each check of the decision, in order, as an event with its outcome.
        let checks = rec["why"]["checks"].as_array().unwrap();
        let events = span["events"].as_array().unwrap();
        assert!(!checks.is_empty());
        assert_eq!(events.len(), checks.len());
        for (e, c) in events.iter().zip(checks) {
            assert_eq!(e["name"], c["name"]);
            assert_eq!(
                e["attributes"][0]["value"]["stringValue"], c["outcome"],
                "{e} vs {c}"
            );
        }
    }
    let refused_span = got
        .iter()
        .find(|s| s["name"] == "toolgate.call payment.schedule")
        .unwrap();
    assert_eq!(refused_span["status"]["code"], 2);
    assert_eq!(attr(refused_span, "toolgate.decision"), "deny");
    let joined_span = got
        .iter()
        .find(|s| s["name"] == "toolgate.call invoice.search")
        .unwrap();
    assert_eq!(joined_span["traceId"], "4bf92f3577b34da6a3ce929d0e0e4736");
    assert_eq!(joined_span["parentSpanId"], "00f067aa0ba902b7");
    assert_ne!(
        refused_span["traceId"], joined_span["traceId"],
        "a trace of its own"
    );
    assert_eq!(refused_span["parentSpanId"], "");
    // The upstream call carried the trace on, naming toolgate's span as the parent.
    let sent = h.records_for("search_invoices");
    assert_eq!(sent.len(), 1);
    assert_eq!(
        sent[0].meta["traceparent"],
        format!(
            "00-4bf92f3577b34da6a3ce929d0e0e4736-{}-01",
            joined_span["spanId"].as_str().unwrap()
        )
    );
    let drafted = h.records_for("draft_note");
    let ok_span = got
        .iter()
        .find(|s| s["name"] == "toolgate.call note.draft")
        .unwrap();
    assert_eq!(
        drafted[0].meta["traceparent"],
        format!(
            "00-{}-{}-01",
            ok_span["traceId"].as_str().unwrap(),
            ok_span["spanId"].as_str().unwrap()
        ),
        "a call without a caller's trace starts one, and the upstream joins it"
    );
    h.shutdown().await;
}
