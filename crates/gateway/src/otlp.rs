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
//!
//! A caller that sends a W3C trace context as `_meta.traceparent` (the convention MCP clients
//! use for trace propagation) gets the call's span in its trace, as a child of its span; a
//! malformed or all-zero one is ignored and the span starts a trace of its own. The upstream
//! call carries `_meta.traceparent` on: naming toolgate's span when spans are exported, or the
//! caller's context unchanged when they are not (a span nobody records must not be a parent).
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
pub fn record_call(
    tool: &str,
    caller: &Caller,
    result: &CallResult,
    started: SystemTime,
    call: &CallSpan,
) {
    let Some(exporter) = exporter() else {
        return;
    };
    let ended = SystemTime::now();
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
        "traceId": call.trace_id,
        "spanId": call.span_id,
        "parentSpanId": call.parent.as_ref().map(|p| p.span_id.as_str()).unwrap_or(""),
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

/// The span of one governed call: the caller's trace (or a new one) and its own id. Ids are
/// made only when spans are exported; otherwise the span only carries the caller's context on.
pub struct CallSpan {
    trace_id: String,
    span_id: String,
    parent: Option<Parent>,
}

impl CallSpan {
    /// The span of a call whose `_meta` is `meta`.
    pub fn start(meta: &serde_json::Map<String, Value>) -> CallSpan {
        let parent = Parent::from_meta(meta);
        let exported = exporter().is_some();
        let trace_id = match &parent {
            Some(p) => p.trace_id.clone(),
            None if exported => hex(uuid::Uuid::new_v4().as_bytes()),
            None => String::new(),
        };
        let span_id = if exported {
            hex(&uuid::Uuid::new_v4().as_bytes()[..8])
        } else {
            String::new()
        };
        CallSpan {
            trace_id,
            span_id,
            parent,
        }
    }

    /// The `traceparent` for the upstream: this span when spans are exported, otherwise the
    /// caller's context as it came, if it came.
    pub(crate) fn outgoing(&self) -> Option<String> {
        if exporter().is_some() {
            return Some(format!("00-{}-{}-01", self.trace_id, self.span_id));
        }
        self.parent
            .as_ref()
            .map(|p| format!("00-{}-{}-{}", p.trace_id, p.span_id, p.flags))
    }
}

/// The caller's span a call's span is the child of (W3C `traceparent`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Parent {
    pub trace_id: String,
    pub span_id: String,
    pub flags: String,
}

impl Parent {
    /// `_meta.traceparent` of a call, if it is a valid version-00 trace context:
    /// `00-<32 hex trace id>-<16 hex span id>-<2 hex flags>`, ids not all zero.
    pub fn from_meta(meta: &serde_json::Map<String, Value>) -> Option<Parent> {
        Self::parse(meta.get("traceparent")?.as_str()?)
    }

    pub fn parse(header: &str) -> Option<Parent> {
        let mut parts = header.trim().split('-');
        let (version, trace, span, flags) =
            (parts.next()?, parts.next()?, parts.next()?, parts.next()?);
        let hex_of = |s: &str, n: usize| {
            s.len() == n
                && s.bytes()
                    .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
        };
        let zero = |s: &str| s.bytes().all(|b| b == b'0');
        (parts.next().is_none()
            && version == "00"
            && hex_of(trace, 32)
            && hex_of(span, 16)
            && hex_of(flags, 2)
            && !zero(trace)
            && !zero(span))
        .then(|| Parent {
            trace_id: trace.to_string(),
            span_id: span.to_string(),
            flags: flags.to_string(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::Parent;

    #[test]
    fn a_traceparent_is_taken_only_when_well_formed() {
        let p = Parent::parse("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01").unwrap();
        assert_eq!(p.trace_id, "4bf92f3577b34da6a3ce929d0e0e4736");
        assert_eq!(p.span_id, "00f067aa0ba902b7");
        for bad in [
            "",
            "01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "00-00000000000000000000000000000000-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",
            "00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e473-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-extra",
        ] {
            assert_eq!(Parent::parse(bad), None, "{bad}");
        }
    }
}
