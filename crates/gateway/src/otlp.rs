//! OpenTelemetry traces over OTLP/HTTP (JSON encoding), when an endpoint is configured: one
//! span per governed call (`toolgate.call <tool>`), its attributes the caller, the outcome, the
//! deciding rule and the audit sequence number, and each check of the decision as a span event
//! (name, outcome, rule, detail).
//!
//! Configured by the standard variables: `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT` (the full URL,
//! e.g. `http://collector:4318/v1/traces`) or `OTEL_EXPORTER_OTLP_ENDPOINT` (the base URL;
//! `/v1/traces` is appended), and `OTEL_SERVICE_NAME` (default `toolgate`); or in process by
//! [`install`]. Without either, nothing is recorded or sent. Spans are sent in the background
//! in batches; a collector that is down loses spans (a warning is logged), never a call.
//! Written directly against the OTLP JSON encoding (a few dozen lines) instead of the
//! opentelemetry SDK crates: `http://` endpoints only (reqwest here has no TLS).

use std::sync::OnceLock;
use std::time::{SystemTime, UNIX_EPOCH};

use serde_json::{Value, json};
use tokio::sync::mpsc;
use toolgate_core::Verdict;
use toolgate_store::CallResult;

use crate::auth::Caller;

/// The most spans one export request carries.
const BATCH: usize = 512;
/// Spans waiting to be sent before new ones are dropped.
const QUEUE: usize = 8192;

struct Exporter {
    tx: mpsc::Sender<Value>,
}

static EXPORTER: OnceLock<Option<Exporter>> = OnceLock::new();

fn env_endpoint() -> Option<String> {
    let var = |k: &str| std::env::var(k).ok().filter(|v| !v.trim().is_empty());
    var("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT").or_else(|| {
        var("OTEL_EXPORTER_OTLP_ENDPOINT")
            .map(|base| format!("{}/v1/traces", base.trim_end_matches('/')))
    })
}

fn start(endpoint: String, service: String) -> Exporter {
    let (tx, mut rx) = mpsc::channel::<Value>(QUEUE);
    tracing::info!(endpoint = %endpoint, "exporting a trace span per governed call over OTLP/HTTP");
    tokio::spawn(async move {
        let client = reqwest::Client::new();
        let resource = json!({"attributes": [attr("service.name", &service)]});
        while let Some(first) = rx.recv().await {
            let mut spans = vec![first];
            while spans.len() < BATCH {
                match rx.try_recv() {
                    Ok(s) => spans.push(s),
                    Err(_) => break,
                }
            }
            let n = spans.len();
            let body = json!({"resourceSpans": [{
                "resource": resource,
                "scopeSpans": [{"scope": {"name": "toolgate", "version": env!("CARGO_PKG_VERSION")}, "spans": spans}]
            }]});
            let sent = client
                .post(&endpoint)
                .json(&body)
                .send()
                .await
                .and_then(|r| r.error_for_status());
            if let Err(e) = sent {
                tracing::warn!(endpoint = %endpoint, spans = n, error = %e, "OTLP export failed; spans dropped");
            }
        }
    });
    Exporter { tx }
}

/// Sends spans to `endpoint` (an OTLP/HTTP traces URL) from now on. Must run inside a tokio
/// runtime. Returns false when an exporter was already set (from the environment or earlier).
pub fn install(endpoint: &str, service: &str) -> bool {
    let mut installed = false;
    EXPORTER.get_or_init(|| {
        installed = true;
        Some(start(endpoint.to_string(), service.to_string()))
    });
    installed
}

fn exporter() -> Option<&'static Exporter> {
    EXPORTER
        .get_or_init(|| {
            let endpoint = env_endpoint()?;
            let service = std::env::var("OTEL_SERVICE_NAME").unwrap_or_else(|_| "toolgate".into());
            Some(start(endpoint, service))
        })
        .as_ref()
}

fn attr(key: &str, value: &str) -> Value {
    json!({"key": key, "value": {"stringValue": value}})
}

fn nanos(t: SystemTime) -> String {
    t.duration_since(UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or_default()
        .to_string()
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn name_of<T: serde::Serialize + std::fmt::Debug>(v: &T) -> String {
    match serde_json::to_value(v) {
        Ok(Value::String(s)) => s,
        _ => format!("{v:?}").to_lowercase(),
    }
}

/// Records the span of one governed call that started at `started` (when exporting is on).
pub fn record_call(tool: &str, caller: &Caller, result: &CallResult, started: SystemTime) {
    let Some(exporter) = exporter() else {
        return;
    };
    let ended = SystemTime::now();
    let trace = uuid::Uuid::new_v4();
    let span = uuid::Uuid::new_v4();
    let status = format!("{:?}", result.status).to_lowercase();
    let decision = match &result.decision.verdict {
        Verdict::Allow => "allow",
        Verdict::Deny { .. } => "deny",
        Verdict::NeedsApproval { .. } => "needs_approval",
    };
    let events: Vec<Value> = result
        .decision
        .checks
        .iter()
        .map(|c| {
            json!({
                "timeUnixNano": nanos(started),
                "name": c.name.to_string(),
                "attributes": [
                    attr("toolgate.check.outcome", &name_of(&c.outcome)),
                    attr("toolgate.check.rule", c.rule.as_deref().unwrap_or("")),
                    attr("toolgate.check.detail", &c.detail),
                ],
            })
        })
        .collect();
    let failed = decision == "deny" || status == "failed";
    let span = json!({
        "traceId": hex(trace.as_bytes()),
        "spanId": hex(&span.as_bytes()[..8]),
        "name": format!("toolgate.call {tool}"),
        "kind": 2,
        "startTimeUnixNano": nanos(started),
        "endTimeUnixNano": nanos(ended),
        "attributes": [
            attr("toolgate.tool", tool),
            attr("toolgate.principal", &caller.principal),
            attr("toolgate.role", &caller.role),
            attr("toolgate.decision", decision),
            attr("toolgate.status", &status),
            attr("toolgate.rule", result.decision.rule().unwrap_or("")),
            attr("toolgate.idempotency_key", result.idem_key.as_str()),
            {"key": "toolgate.audit_seq", "value": {"intValue": result.audit_seq.to_string()}},
        ],
        "events": events,
        "status": {"code": if failed { 2 } else { 1 }},
    });
    if exporter.tx.try_send(span).is_err() {
        tracing::warn!("the OTLP export queue is full; a span was dropped");
    }
}
