//! The lean path for the request that matters most: a `tools/call` on an open MCP session.
//!
//! rmcp serves MCP over streamable HTTP here (sessions, initialization, notifications, every
//! method). For each request on a session it hands the message to the session's worker task
//! over a channel and streams the reply back as an event stream, which costs hundreds of
//! microseconds per call and serialises the calls that share a session. This middleware,
//! inside the credential and session-owner checks, answers the plain case itself: a POST
//! holding one JSON-RPC `tools/call` request on a live session the caller opened, with the
//! headers rmcp requires and nothing it would have to validate further. It runs the same
//! [`GatewayServer::call`] rmcp's handler runs and answers with one JSON reply, which the
//! transport allows whenever the client accepts `application/json`. A call with a progress
//! token (rmcp's client, among others, sends one with every request) is answered as an event
//! stream instead: each progress notification as the upstream reports it, under the caller's
//! token, then the result; the relay ([`crate::relay`]) hands progress over before the call
//! returns, so none comes after the result.
//!
//! Anything else goes on to rmcp untouched (the body, when read, is put back as it was): no
//! session or another principal's, a batch, a notification, a response, another method, a
//! progress token that is neither a string nor an integer, an `MCP-Protocol-Version` rmcp does not
//! know, request-level protocol metadata or standard `Mcp-*` headers, a body without a
//! `Content-Length` or over the limit, or one that does not parse. rmcp then answers as it
//! always has, errors included.
//!
//! A client that hangs up mid-call does not cancel the call halfway: it goes on in a task of
//! its own ([`RunToEnd`]), decided, forwarded and recorded as if the client had waited, and a
//! retry finds it.

use std::sync::Arc;

use axum::body::{Body, Bytes};
use axum::extract::{Request, State};
use axum::http::{HeaderMap, HeaderValue, Method, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use rmcp::ErrorData;
use rmcp::model::{
    CallToolRequestParams, CallToolResult, JsonObject, ProgressNotificationParam, ProgressToken,
    ProtocolVersion,
};
use serde_json::{Value, json};
use tokio::sync::mpsc;
use toolgate_store::{Panicked, RunToEnd};

use crate::auth::Caller;
use crate::relay::ProgressSink;
use crate::server::{GatewayServer, Surface};
use crate::sessions::SessionOwners;

/// The largest body the lean path reads (rmcp's own limit).
const MAX_BODY: usize = 4 * 1024 * 1024;

/// What the lean path needs: the server every call runs through, the sessions' owners, and
/// the `Host` values the endpoint answers to (rmcp's DNS-rebinding check, which this path
/// would otherwise skip).
#[derive(Clone)]
pub(crate) struct Lean {
    pub(crate) server: GatewayServer,
    pub(crate) owners: Arc<SessionOwners>,
    pub(crate) hosts: Arc<[String]>,
}

/// axum middleware on `/mcp`, inside the credential check and the session-owner check.
pub(crate) async fn tools_call(
    State(lean): State<Arc<Lean>>,
    req: Request,
    next: Next,
) -> Response {
    let Some((caller, surface, session)) = eligible(&req, &lean.hosts) else {
        return next.run(req).await;
    };
    let (parts, body) = req.into_parts();
    let bytes = match axum::body::to_bytes(body, MAX_BODY).await {
        Ok(b) => b,
        // Content-Length said it fits; a body that does not is the client's error.
        Err(_) => return (StatusCode::BAD_REQUEST, "Bad Request: unreadable body").into_response(),
    };
    let Some(call) = parse(&bytes) else {
        return next
            .run(Request::from_parts(parts, Body::from(bytes)))
            .await;
    };
    if !lean.owners.is_live(&session, &caller.principal).await {
        return next
            .run(Request::from_parts(parts, Body::from(bytes)))
            .await;
    }
    let server = lean.server.clone();
    let LeanCall {
        id,
        params,
        meta,
        progress,
    } = call;
    if let Some(token) = progress {
        return answer_as_stream(server, caller, surface, id, params, meta, token);
    }
    let call = RunToEnd::new(async move { server.call(caller, surface, params, meta, None).await });
    let body = serde_json::to_vec(&reply(&id, call.await)).expect("a JSON value serialises");
    (
        [(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/json"),
        )],
        body,
    )
        .into_response()
}

type CallOutcome = Result<Result<CallToolResult, ErrorData>, Panicked>;

/// The JSON-RPC reply to the call `id`.
fn reply(id: &Value, outcome: CallOutcome) -> Value {
    match outcome {
        Ok(Ok(result)) => json!({"jsonrpc": "2.0", "id": id, "result": result}),
        Ok(Err(error)) => json!({"jsonrpc": "2.0", "id": id, "error": error}),
        Err(e) => {
            tracing::error!(error = %e, "a tools/call task failed");
            json!({"jsonrpc": "2.0", "id": id, "error": {
                "code": -32603, "message": "toolgate failed while handling this call"}})
        }
    }
}

/// One server-sent event holding `message`.
fn event(message: &Value) -> Bytes {
    let mut out = b"data: ".to_vec();
    serde_json::to_writer(&mut out, message).expect("a JSON value serialises");
    out.extend_from_slice(b"\n\n");
    Bytes::from(out)
}

/// Runs the call (in a task of its own, like the JSON answer) and answers as an event stream:
/// its progress under `token` as it comes, then its reply.
fn answer_as_stream(
    server: GatewayServer,
    caller: Caller,
    surface: Arc<Surface>,
    id: Value,
    params: CallToolRequestParams,
    meta: JsonObject,
    token: ProgressToken,
) -> Response {
    let (progress_tx, mut progress) = mpsc::unbounded_channel();
    let relay = crate::relay::ProgressRecipient {
        to: ProgressSink::Stream(progress_tx),
        token,
    };
    let mut call = tokio::spawn(async move {
        server
            .call(caller, surface, params, meta, Some(relay))
            .await
    });
    let (frames, body) = mpsc::unbounded_channel::<Bytes>();
    tokio::spawn(async move {
        let outcome = loop {
            tokio::select! {
                biased;
                Some(p) = progress.recv() => {
                    let _ = frames.send(event(&progress_message(p)));
                }
                out = &mut call => break out.map_err(|_| Panicked),
            }
        };
        // Everything the relay told before the call returned is queued: it goes first.
        while let Ok(p) = progress.try_recv() {
            let _ = frames.send(event(&progress_message(p)));
        }
        let _ = frames.send(event(&reply(&id, outcome)));
    });
    let body = futures_util::stream::unfold(body, |mut rx| async move {
        rx.recv()
            .await
            .map(|b| (Ok::<_, std::convert::Infallible>(b), rx))
    });
    (
        [
            (
                header::CONTENT_TYPE,
                HeaderValue::from_static("text/event-stream"),
            ),
            (header::CACHE_CONTROL, HeaderValue::from_static("no-cache")),
        ],
        Body::from_stream(body),
    )
        .into_response()
}

fn progress_message(p: ProgressNotificationParam) -> Value {
    json!({"jsonrpc": "2.0", "method": "notifications/progress", "params": p})
}

/// The caller, the registry snapshot its credential was resolved against, and the session of a
/// request the lean path may take, judged by its head alone.
fn eligible(req: &Request, hosts: &[String]) -> Option<(Caller, Arc<Surface>, String)> {
    if req.method() != Method::POST {
        return None;
    }
    let headers = req.headers();
    if !served_host(headers, hosts) || headers.contains_key(header::ORIGIN) {
        // rmcp judges the host and a browser's origin, and refuses what it must.
        return None;
    }
    let session = headers.get("mcp-session-id")?.to_str().ok()?.to_string();
    if !accepts_json_and_events(headers) || !is_json(headers) || !plain_mcp_headers(headers) {
        return None;
    }
    let length: usize = headers
        .get(header::CONTENT_LENGTH)?
        .to_str()
        .ok()?
        .parse()
        .ok()?;
    if length > MAX_BODY {
        return None;
    }
    let caller = req.extensions().get::<Caller>()?.clone();
    let surface = req.extensions().get::<Arc<Surface>>()?.clone();
    Some((caller, surface, session))
}

/// The `Host` header names one of `hosts` exactly (as rmcp would allow it: the same name, and
/// the same port when the allowed entry names one). Anything less plain is left to rmcp.
fn served_host(headers: &HeaderMap, hosts: &[String]) -> bool {
    let Some(authority) = headers
        .get(header::HOST)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| axum::http::uri::Authority::try_from(v).ok())
    else {
        return false;
    };
    let host = authority.host().trim_matches(['[', ']']);
    hosts.iter().any(|allowed| {
        let (name, port) = match axum::http::uri::Authority::try_from(allowed.as_str()) {
            Ok(a) => (a.host().trim_matches(['[', ']']).to_string(), a.port_u16()),
            Err(_) => (allowed.trim_matches(['[', ']']).to_string(), None),
        };
        name.eq_ignore_ascii_case(host) && port.is_none_or(|p| authority.port_u16() == Some(p))
    })
}

/// `Accept` lists both `application/json` and `text/event-stream`, with no parameters (a
/// weighted list is rmcp's to judge).
fn accepts_json_and_events(headers: &HeaderMap) -> bool {
    let mut json = false;
    let mut events = false;
    for value in headers.get_all(header::ACCEPT) {
        let Ok(value) = value.to_str() else {
            return false;
        };
        if value.contains(';') || value.contains('"') {
            return false;
        }
        for entry in value.split(',') {
            let entry = entry.trim();
            json |= entry.eq_ignore_ascii_case("application/json");
            events |= entry.eq_ignore_ascii_case("text/event-stream");
        }
    }
    json && events
}

fn is_json(headers: &HeaderMap) -> bool {
    headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| {
            let essence = v.split_once(';').map_or(v, |(e, _)| e);
            essence.trim().eq_ignore_ascii_case("application/json")
        })
}

/// No `Mcp-*` header but the session id and a protocol version rmcp knows.
fn plain_mcp_headers(headers: &HeaderMap) -> bool {
    headers.iter().all(|(name, value)| {
        let name = name.as_str();
        if !name.starts_with("mcp-") || name == "mcp-session-id" {
            return true;
        }
        name == "mcp-protocol-version"
            && value.to_str().is_ok_and(|v| {
                ProtocolVersion::KNOWN_VERSIONS
                    .iter()
                    .any(|k| k.as_str() == v)
            })
    })
}

/// One `tools/call` the lean path takes.
pub(crate) struct LeanCall {
    pub(crate) id: Value,
    pub(crate) params: CallToolRequestParams,
    pub(crate) meta: JsonObject,
    /// The caller's progress token, when it asked for progress.
    pub(crate) progress: Option<ProgressToken>,
}

/// One JSON-RPC `tools/call` request: its id, its parameters, its `_meta` and progress token.
/// None for any other message, and for a request whose `_meta` holds protocol metadata or a
/// progress token that is neither a string nor an integer.
fn parse(bytes: &Bytes) -> Option<LeanCall> {
    let Value::Object(message) = serde_json::from_slice::<Value>(bytes).ok()? else {
        return None;
    };
    parse_message(message)
}

/// As [`parse`], for a message already read as a JSON object.
pub(crate) fn parse_message(mut message: JsonObject) -> Option<LeanCall> {
    if message.get("jsonrpc")? != "2.0" || message.get("method")? != "tools/call" {
        return None;
    }
    if message
        .keys()
        .any(|k| !matches!(k.as_str(), "jsonrpc" | "id" | "method" | "params"))
    {
        return None;
    }
    let id = message.remove("id")?;
    if !(id.is_string() || id.is_i64() || id.is_u64()) {
        return None;
    }
    let params = message.remove("params")?;
    let meta = match params.get("_meta") {
        None => JsonObject::new(),
        Some(Value::Object(m)) => m.clone(),
        Some(_) => return None,
    };
    if meta
        .keys()
        .any(|k| k.contains("protocolVersion") || k.starts_with("io.modelcontextprotocol"))
    {
        return None;
    }
    let progress = match meta.get("progressToken") {
        None => None,
        Some(t) if t.is_string() || t.is_i64() || t.is_u64() => {
            Some(serde_json::from_value::<ProgressToken>(t.clone()).ok()?)
        }
        Some(_) => return None,
    };
    let params: CallToolRequestParams = serde_json::from_value(params).ok()?;
    Some(LeanCall {
        id,
        params,
        meta,
        progress,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parsed(body: &str) -> Option<(Value, String, JsonObject)> {
        parse(&Bytes::from(body.to_string())).map(|c| (c.id, c.params.name.to_string(), c.meta))
    }

    #[test]
    fn a_progress_token_is_taken_when_it_is_a_string_or_an_integer() {
        let with = |token: &str| {
            parse(&Bytes::from(format!(
                r#"{{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{{"name":"x","_meta":{{"progressToken":{token}}}}}}}"#
            )))
        };
        let call = with("3").expect("an integer token");
        assert_eq!(
            call.progress,
            Some(serde_json::from_value(json!(3)).unwrap())
        );
        assert_eq!(call.meta.get("progressToken"), Some(&json!(3)));
        assert!(with(r#""abc""#).unwrap().progress.is_some());
        for odd in ["1.5", "null", "[1]", "{}", "true"] {
            assert!(with(odd).is_none(), "taken with token {odd}");
        }
        let plain = parse(&Bytes::from(
            r#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"x"}}"#,
        ))
        .unwrap();
        assert!(plain.progress.is_none());
    }

    #[test]
    fn only_a_single_plain_tools_call_request_is_taken() {
        let (id, name, meta) = parsed(
            r#"{"jsonrpc":"2.0","id":7,"method":"tools/call","params":{"name":"invoice.search",
                "arguments":{"status":"received"},"_meta":{"run_id":"r1"}}}"#,
        )
        .expect("a plain call");
        assert_eq!((id, name.as_str()), (json!(7), "invoice.search"));
        assert_eq!(meta.get("run_id"), Some(&json!("r1")));
        assert!(
            parsed(r#"{"jsonrpc":"2.0","id":"a","method":"tools/call","params":{"name":"x"}}"#)
                .is_some()
        );

        for other in [
            // a batch, a notification, another method, a response
            r#"[{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"x"}}]"#,
            r#"{"jsonrpc":"2.0","method":"tools/call","params":{"name":"x"}}"#,
            r#"{"jsonrpc":"2.0","id":1,"method":"tools/list"}"#,
            r#"{"jsonrpc":"2.0","id":1,"result":{}}"#,
            // protocol metadata, an odd id, an extra member, no name
            r#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"x","_meta":{"io.modelcontextprotocol/protocolVersion":"2025-06-18"}}}"#,
            r#"{"jsonrpc":"2.0","id":1.5,"method":"tools/call","params":{"name":"x"}}"#,
            r#"{"jsonrpc":"2.0","id":null,"method":"tools/call","params":{"name":"x"}}"#,
            r#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"x"},"extra":1}"#,
            r#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{}}"#,
            r#"{"jsonrpc":"1.0","id":1,"method":"tools/call","params":{"name":"x"}}"#,
            "not json",
        ] {
            assert!(parsed(other).is_none(), "taken: {other}");
        }
    }

    fn headers(pairs: &[(&str, &str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.append(
                axum::http::HeaderName::from_bytes(k.as_bytes()).unwrap(),
                HeaderValue::from_str(v).unwrap(),
            );
        }
        h
    }

    #[test]
    fn only_a_host_the_endpoint_serves_is_taken() {
        let hosts: Vec<String> = ["localhost", "127.0.0.1:8480", "::1", "gw.example.com"]
            .map(String::from)
            .to_vec();
        for served in [
            "localhost",
            "localhost:8480",
            "LOCALHOST:9",
            "127.0.0.1:8480",
            "[::1]:8480",
            "gw.example.com",
        ] {
            assert!(
                served_host(&headers(&[("host", served)]), &hosts),
                "{served}"
            );
        }
        for other in [
            "127.0.0.1:8481",
            "127.0.0.1",
            "attacker.example",
            "localhost.attacker.example",
            "gw.example.com.evil",
            "",
        ] {
            assert!(
                !served_host(&headers(&[("host", other)]), &hosts),
                "{other}"
            );
        }
        assert!(!served_host(&HeaderMap::new(), &hosts), "no Host at all");
    }

    #[test]
    fn unusual_headers_are_left_to_rmcp() {
        let both = headers(&[("accept", "application/json, text/event-stream")]);
        assert!(accepts_json_and_events(&both));
        let split = headers(&[
            ("accept", "application/json"),
            ("accept", "text/event-stream"),
        ]);
        assert!(accepts_json_and_events(&split));
        for (k, v) in [
            ("accept", "application/json"),
            ("accept", "application/json;q=0, text/event-stream"),
            ("accept", "*/*"),
        ] {
            assert!(!accepts_json_and_events(&headers(&[(k, v)])), "{v}");
        }
        assert!(is_json(&headers(&[(
            "content-type",
            "application/json; charset=utf-8"
        )])));
        assert!(!is_json(&headers(&[("content-type", "text/plain")])));

        let known = ProtocolVersion::KNOWN_VERSIONS[0].as_str();
        assert!(plain_mcp_headers(&headers(&[
            ("mcp-session-id", "abc"),
            ("mcp-protocol-version", known),
        ])));
        assert!(!plain_mcp_headers(&headers(&[(
            "mcp-protocol-version",
            "1999-01-01"
        )])));
        assert!(!plain_mcp_headers(&headers(&[(
            "mcp-method",
            "tools/call"
        )])));
    }
}
