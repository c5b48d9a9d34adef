//! The lean upstream hop: a governed `tools/call` to a streamable-HTTP upstream goes out as one
//! HTTP POST on a kept-alive connection that the call drives in its own task ([`crate::kept`]),
//! inside the MCP session rmcp's client opened. rmcp's client routes every request through a worker task, a channel and its own
//! serialisation, and by default a new TCP connection per request; measured, that was most of
//! what toolgate added to a forwarded call. rmcp still does everything else on the upstream:
//! `initialize`, `tools/list`, list-changed notifications, prompts and resources, reconnection.
//!
//! - **Same session, same headers.** [`TappedClient`] is the HTTP client rmcp's transport posts
//!   through: it records the session id, bearer and protocol headers of each post made inside a
//!   session, and the lean hop sends exactly those with its call (only for protocol versions
//!   before 2026-07-28, whose per-request headers depend on the message: those stay on rmcp).
//!   Request ids are strings (`tg-N`), so they never meet rmcp's numeric ids in the session.
//! - **The answer** is an `application/json` body or a `text/event-stream` ([`crate::sse`]) whose
//!   message with the call's id is the answer. On the way, progress goes to the caller as on the
//!   rmcp path ([`crate::relay`]), `tools/list_changed` re-reads the list, a server-to-client
//!   request gets the answer rmcp's default client handler gives (sampling is not offered,
//!   elicitation declined, no roots, ping answered), other notifications (log lines) stay here.
//! - **What was delivered.** An HTTP 404 on the session, a connection never made, or a 4xx but
//!   408 left nothing at the upstream ([`HopError::Expired`], [`HopError::Refused`]); a 5xx, a
//!   connection lost after the request went out or a stream that ends unanswered may follow a
//!   committed effect ([`HopError::Lost`]). Only the first kind is ever sent again.
//! - **Nagle.** A reused connection to an upstream that leaves Nagle's algorithm on waits for
//!   the client's delayed ACK on every small write after the first (about 40 ms). The hop's
//!   sockets re-arm `TCP_QUICKACK` after every read, so the ACK goes out at once and a kept
//!   connection is safe whatever the upstream sets.
//! - **Cancellation.** A call dropped before its answer (the caller went away, the per-tool
//!   timeout fired) sends `notifications/cancelled` for its id, as rmcp does for its requests.

use std::collections::HashMap;
use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

use arc_swap::ArcSwapOption;
use http_body_util::{BodyExt, Full};
use hyper::body::{Bytes, Incoming};
use hyper::header::{ACCEPT, AUTHORIZATION, CONTENT_TYPE, HeaderName, HeaderValue};
use hyper::{Request, Response, StatusCode, Uri};
use hyper_util::rt::TokioIo;
use rmcp::model::{CallToolResult, ClientJsonRpcMessage, ClientRequest, ProgressNotificationParam};
use rmcp::transport::streamable_http_client::{
    SseError as RmcpSseError, StreamableHttpClient, StreamableHttpError,
    StreamableHttpPostResponse, StreamableHttpResponseLimits,
};
use serde_json::{Value, json};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;

use crate::kept::{Conns, SendError};
use crate::sse::{SseEvent, SseParser};

/// The largest event or JSON answer read from an upstream (rmcp's own limit).
const MAX_ANSWER: usize = 16 * 1024 * 1024;
/// How much of an error body is kept for the message.
const MAX_ERROR_BODY: usize = 64 * 1024;
/// How long an idle kept connection stays open.
const POOL_IDLE: Duration = Duration::from_secs(60);
const SESSION_HEADER: &str = "mcp-session-id";

/// The MCP session rmcp's transport opened, as it sends it on every post (a stateless upstream
/// gives no id: then only the headers).
#[derive(Debug, PartialEq, Eq)]
pub struct Session {
    pub id: Option<Arc<str>>,
    bearer: Option<String>,
    headers: Vec<(HeaderName, HeaderValue)>,
}

/// The session of one upstream, as last seen on rmcp's posts (none until one is opened).
#[derive(Default)]
pub struct SessionCell(ArcSwapOption<Session>);

impl SessionCell {
    pub fn current(&self) -> Option<Arc<Session>> {
        self.0.load_full()
    }

    /// Forgets `id` if it is still the current session (another call may have replaced it).
    pub fn forget(&self, id: Option<&str>) -> bool {
        let cur = self.0.load();
        if cur.as_ref().is_some_and(|s| s.id.as_deref() == id) {
            self.0.compare_and_swap(&*cur, None);
            return true;
        }
        false
    }

    fn record(
        &self,
        id: Option<Arc<str>>,
        bearer: Option<String>,
        custom: &HashMap<HeaderName, HeaderValue>,
    ) {
        let mut headers: Vec<_> = custom.iter().map(|(k, v)| (k.clone(), v.clone())).collect();
        headers.sort_by(|a, b| a.0.as_str().cmp(b.0.as_str()));
        let seen = Session {
            id,
            bearer,
            headers,
        };
        if self.0.load().as_deref() != Some(&seen) {
            self.0.store(Some(Arc::new(seen)));
        }
    }
}

type SseStream =
    Pin<Box<dyn futures_util::Stream<Item = Result<sse_stream::Sse, RmcpSseError>> + Send>>;

/// The HTTP client rmcp's streamable-HTTP transport posts through: reqwest, as before, noting
/// the session each post is made in.
#[derive(Clone)]
pub struct TappedClient {
    inner: reqwest::Client,
    session: Arc<SessionCell>,
}

impl TappedClient {
    pub fn new(inner: reqwest::Client, session: Arc<SessionCell>) -> Self {
        TappedClient { inner, session }
    }
}

fn is_initialize(message: &ClientJsonRpcMessage) -> bool {
    matches!(message, ClientJsonRpcMessage::Request(r) if matches!(r.request, ClientRequest::InitializeRequest(_)))
}

impl StreamableHttpClient for TappedClient {
    type Error = reqwest::Error;

    async fn post_message(
        &self,
        uri: Arc<str>,
        message: ClientJsonRpcMessage,
        session_id: Option<Arc<str>>,
        auth_header: Option<String>,
        custom_headers: HashMap<HeaderName, HeaderValue>,
    ) -> Result<StreamableHttpPostResponse, StreamableHttpError<Self::Error>> {
        self.post_message_with_response_limits(
            uri,
            message,
            session_id,
            auth_header,
            custom_headers,
            StreamableHttpResponseLimits::default(),
        )
        .await
    }

    async fn post_message_with_max_sse_event_size(
        &self,
        uri: Arc<str>,
        message: ClientJsonRpcMessage,
        session_id: Option<Arc<str>>,
        auth_header: Option<String>,
        custom_headers: HashMap<HeaderName, HeaderValue>,
        max_sse_event_size: usize,
    ) -> Result<StreamableHttpPostResponse, StreamableHttpError<Self::Error>> {
        let mut limits = StreamableHttpResponseLimits::default();
        limits.max_sse_event_size = max_sse_event_size;
        self.post_message_with_response_limits(
            uri,
            message,
            session_id,
            auth_header,
            custom_headers,
            limits,
        )
        .await
    }

    async fn post_message_with_response_limits(
        &self,
        uri: Arc<str>,
        message: ClientJsonRpcMessage,
        session_id: Option<Arc<str>>,
        auth_header: Option<String>,
        custom_headers: HashMap<HeaderName, HeaderValue>,
        limits: StreamableHttpResponseLimits,
    ) -> Result<StreamableHttpPostResponse, StreamableHttpError<Self::Error>> {
        // Every post after `initialize` is made in the session it opened (with no id, when the
        // upstream is stateless).
        if !is_initialize(&message) {
            self.session
                .record(session_id.clone(), auth_header.clone(), &custom_headers);
        }
        self.inner
            .post_message_with_response_limits(
                uri,
                message,
                session_id,
                auth_header,
                custom_headers,
                limits,
            )
            .await
    }

    async fn delete_session(
        &self,
        uri: Arc<str>,
        session_id: Arc<str>,
        auth_header: Option<String>,
        custom_headers: HashMap<HeaderName, HeaderValue>,
    ) -> Result<(), StreamableHttpError<Self::Error>> {
        self.session.forget(Some(&session_id));
        self.inner
            .delete_session(uri, session_id, auth_header, custom_headers)
            .await
    }

    async fn get_stream(
        &self,
        uri: Arc<str>,
        session_id: Option<Arc<str>>,
        last_event_id: Option<String>,
        auth_header: Option<String>,
        custom_headers: HashMap<HeaderName, HeaderValue>,
    ) -> Result<SseStream, StreamableHttpError<Self::Error>> {
        self.inner
            .get_stream(uri, session_id, last_event_id, auth_header, custom_headers)
            .await
    }

    async fn get_stream_with_max_sse_event_size(
        &self,
        uri: Arc<str>,
        session_id: Option<Arc<str>>,
        last_event_id: Option<String>,
        auth_header: Option<String>,
        custom_headers: HashMap<HeaderName, HeaderValue>,
        max_sse_event_size: usize,
    ) -> Result<SseStream, StreamableHttpError<Self::Error>> {
        self.inner
            .get_stream_with_max_sse_event_size(
                uri,
                session_id,
                last_event_id,
                auth_header,
                custom_headers,
                max_sse_event_size,
            )
            .await
    }
}

/// Why a call over the lean hop has no answer.
#[derive(Debug, thiserror::Error)]
pub enum HopError {
    /// HTTP 404 on the session: the upstream no longer knows it, and did not take the call.
    #[error("the upstream's session expired (HTTP 404)")]
    Expired,
    /// Certainly not delivered: no connection was made, or the upstream refused the request.
    #[error("{0}")]
    Refused(String),
    /// The upstream answered the request with a JSON-RPC error.
    #[error("error {code}: {message}")]
    Rpc { code: i32, message: String },
    /// Something the lean hop does not follow (a redirect): nothing was delivered, and the call
    /// fails cleanly (it is not tried again through rmcp).
    #[error("{0}")]
    Unsupported(String),
    /// The request may have been delivered (and its effect committed) but no answer came.
    #[error("{0}")]
    Lost(String),
}

/// What the call's stream brings besides its answer, handed to the upstream that made it.
pub trait Listener: Send + Sync {
    fn progress(&self, progress: ProgressNotificationParam);
    fn tools_changed(&self);
}

/// A connection to the upstream that acknowledges at once (see the module doc).
pub struct QuickAck(TcpStream);

impl AsyncRead for QuickAck {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let before = buf.filled().len();
        let out = Pin::new(&mut self.0).poll_read(cx, buf);
        if matches!(out, Poll::Ready(Ok(()))) && buf.filled().len() > before {
            rearm_quickack(&self.0);
        }
        out
    }
}

#[cfg(target_os = "linux")]
fn rearm_quickack(tcp: &TcpStream) {
    let _ = tcp.set_quickack(true);
}

#[cfg(not(target_os = "linux"))]
fn rearm_quickack(_: &TcpStream) {}

impl AsyncWrite for QuickAck {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.0).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.0).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.0.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.0).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.0).poll_shutdown(cx)
    }
}

/// Opens a plain TCP connection to the origin of `uri`, with `TCP_NODELAY`, wrapped in
/// [`QuickAck`].
pub(crate) async fn dial(uri: &Uri) -> io::Result<TokioIo<QuickAck>> {
    let host = uri
        .host()
        .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "no host in the URL"))?
        .trim_start_matches('[')
        .trim_end_matches(']');
    let port = uri.port_u16().unwrap_or(80);
    let tcp = TcpStream::connect((host, port)).await?;
    tcp.set_nodelay(true)?;
    Ok(TokioIo::new(QuickAck(tcp)))
}

/// The lean hop to one upstream.
pub struct LeanHop {
    name: String,
    uri: Uri,
    conns: Arc<Conns>,
    session: Arc<SessionCell>,
    next_id: AtomicU64,
}

/// A call in flight: dropped before its answer, it tells the upstream the call is cancelled.
struct InFlight<'a> {
    hop: &'a LeanHop,
    session: Arc<Session>,
    id: Arc<str>,
    answered: bool,
}

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        if self.answered {
            return;
        }
        let note = json!({"jsonrpc": "2.0", "method": "notifications/cancelled",
            "params": {"requestId": &*self.id, "reason": "the caller is no longer waiting"}});
        self.hop.post_aside(&self.session, note);
    }
}

impl LeanHop {
    /// A hop to `url` when it is plain `http` (rmcp's client here has no TLS either), sharing
    /// `session` with the upstream's rmcp transport.
    pub fn new(name: &str, url: &str, session: Arc<SessionCell>) -> Option<LeanHop> {
        let uri: Uri = url.parse().ok()?;
        if uri.scheme_str() != Some("http") || uri.host().is_none() {
            return None;
        }
        let conns = Arc::new(Conns::new(&uri, POOL_IDLE)?);
        Some(LeanHop {
            name: name.to_string(),
            uri,
            conns,
            session,
            next_id: AtomicU64::new(1),
        })
    }

    /// The session calls go out in, once rmcp's transport has opened one.
    pub fn session(&self) -> Option<Arc<Session>> {
        self.session.current()
    }

    /// Forgets an expired session (unless another call already replaced it); true if it did.
    pub fn forget(&self, session: &Session) -> bool {
        self.session.forget(session.id.as_deref())
    }

    /// A fresh request id, which is also the call's progress token.
    pub fn next_id(&self) -> Arc<str> {
        format!("tg-{}", self.next_id.fetch_add(1, Ordering::Relaxed)).into()
    }

    /// Sends `tools/call` with `params` (whose `_meta.progressToken` the caller set to `id`) in
    /// `session` and reads until its answer.
    pub async fn call(
        &self,
        session: Arc<Session>,
        id: Arc<str>,
        params: Value,
        listener: &dyn Listener,
    ) -> Result<CallToolResult, HopError> {
        let body = json!({"jsonrpc": "2.0", "id": &*id, "method": "tools/call", "params": params});
        let mut flight = InFlight {
            hop: self,
            session: session.clone(),
            id: id.clone(),
            answered: false,
        };
        let request = self.request(&session, &body);
        let read = async |response| self.read_answer(&session, &id, response, listener).await;
        let out = self.conns.exchange(request, read).await;
        // Whatever came back, the upstream is done with the request (or told us it never was),
        // or it never reached the upstream.
        flight.answered = true;
        out.map_err(|e| self.send_error(e))?
    }

    fn request(&self, session: &Session, body: &Value) -> Request<Full<Bytes>> {
        let mut builder = Request::post(self.uri.clone())
            .header(ACCEPT, "text/event-stream, application/json")
            .header(CONTENT_TYPE, "application/json");
        if let Some(bearer) = &session.bearer {
            builder = builder.header(AUTHORIZATION, format!("Bearer {bearer}"));
        }
        for (k, v) in &session.headers {
            builder = builder.header(k, v);
        }
        if let Some(id) = &session.id {
            builder = builder.header(SESSION_HEADER, &**id);
        }
        let bytes = serde_json::to_vec(body).expect("a JSON value serialises");
        builder
            .body(Full::new(Bytes::from(bytes)))
            .expect("a request from checked parts")
    }

    /// A request that got no answer: never delivered only when no connection was made.
    fn send_error(&self, e: SendError) -> HopError {
        let msg = format!("could not send the call to upstream '{}': {e}", self.name);
        match e {
            SendError::Connect(_) => HopError::Refused(msg),
            SendError::Lost(_) => HopError::Lost(msg),
        }
    }

    async fn read_answer(
        &self,
        session: &Arc<Session>,
        id: &str,
        response: Response<Incoming>,
        listener: &dyn Listener,
    ) -> Result<CallToolResult, HopError> {
        let status = response.status();
        if status == StatusCode::NOT_FOUND && session.id.is_some() {
            return Err(HopError::Expired);
        }
        let media = media_type(&response);
        if !status.is_success() {
            return Err(self.status_error(status, &media, response).await);
        }
        if matches!(status, StatusCode::ACCEPTED | StatusCode::NO_CONTENT) {
            return Err(HopError::Lost(format!(
                "upstream '{}' accepted the call (HTTP {status}) without answering it",
                self.name
            )));
        }
        match media.as_str() {
            "text/event-stream" => self.read_stream(session, id, response, listener).await,
            "application/json" => {
                let body = read_bounded(response.into_body(), MAX_ANSWER)
                    .await
                    .map_err(|e| self.lost_reading(e))?;
                let message: Value = serde_json::from_slice(&body).map_err(|e| {
                    HopError::Lost(format!(
                        "upstream '{}' answered with JSON that is not a JSON-RPC message: {e}",
                        self.name
                    ))
                })?;
                match self.take_message(session, id, message, listener) {
                    Some(answer) => answer,
                    None => Err(HopError::Lost(format!(
                        "upstream '{}' answered with a JSON message that is not the call's answer",
                        self.name
                    ))),
                }
            }
            other => Err(HopError::Lost(format!(
                "upstream '{}' answered the call as '{other}', neither JSON nor an event stream",
                self.name
            ))),
        }
    }

    /// An HTTP error status: its JSON-RPC error when it carries one, else what it says about
    /// delivery (a redirect and a 4xx but 408: not delivered; anything else may have been).
    async fn status_error(
        &self,
        status: StatusCode,
        media: &str,
        response: Response<Incoming>,
    ) -> HopError {
        if status.is_redirection() {
            return HopError::Unsupported(format!(
                "upstream '{}' redirected the call (HTTP {status})",
                self.name
            ));
        }
        let body = read_bounded(response.into_body(), MAX_ERROR_BODY)
            .await
            .unwrap_or_default();
        if media == "application/json"
            && let Ok(v) = serde_json::from_slice::<Value>(&body)
            && let Some((code, message)) = rpc_error(&v)
        {
            return HopError::Rpc { code, message };
        }
        let text = String::from_utf8_lossy(&body);
        let msg = format!(
            "could not send the call to upstream '{}': HTTP {status}: {}",
            self.name,
            text.trim()
        );
        if status.is_client_error() && status != StatusCode::REQUEST_TIMEOUT {
            HopError::Refused(msg)
        } else {
            HopError::Lost(msg)
        }
    }

    fn lost_reading(&self, e: impl std::fmt::Display) -> HopError {
        HopError::Lost(format!(
            "the connection to upstream '{}' was lost during the call: {e}",
            self.name
        ))
    }

    /// Reads the call's event stream until the message that answers it.
    async fn read_stream(
        &self,
        session: &Arc<Session>,
        id: &str,
        response: Response<Incoming>,
        listener: &dyn Listener,
    ) -> Result<CallToolResult, HopError> {
        let mut body = response.into_body();
        let mut parser = SseParser::new(MAX_ANSWER);
        let mut events: Vec<SseEvent> = Vec::new();
        while let Some(frame) = body.frame().await {
            let frame = frame.map_err(|e| self.lost_reading(e))?;
            let Some(chunk) = frame.data_ref() else {
                continue;
            };
            parser
                .feed(chunk, &mut events)
                .map_err(|e| self.lost_reading(e))?;
            for event in events.drain(..) {
                if !(event.event.is_empty() || event.event == "message") {
                    continue;
                }
                let Ok(message) = serde_json::from_str::<Value>(&event.data) else {
                    tracing::debug!(upstream = %self.name, "an event that is not JSON; skipped");
                    continue;
                };
                if let Some(answer) = self.take_message(session, id, message, listener) {
                    return answer;
                }
            }
        }
        Err(HopError::Lost(format!(
            "upstream '{}' ended the call's event stream without answering",
            self.name
        )))
    }

    /// One JSON-RPC message from the call's reply: the answer (`Some`), or something the
    /// upstream sent on the way, dealt with here.
    fn take_message(
        &self,
        session: &Arc<Session>,
        id: &str,
        message: Value,
        listener: &dyn Listener,
    ) -> Option<Result<CallToolResult, HopError>> {
        let method = message.get("method").and_then(Value::as_str);
        match (method, message.get("id")) {
            (None, Some(Value::String(got))) if got == id => Some(self.answer_of(message)),
            (None, _) => {
                tracing::debug!(upstream = %self.name, "an answer to another request in the call's stream; skipped");
                None
            }
            (Some(method), Some(req_id)) => {
                self.answer_server_request(session, method, req_id.clone());
                None
            }
            (Some("notifications/progress"), None) => {
                match message
                    .get("params")
                    .cloned()
                    .map(serde_json::from_value::<ProgressNotificationParam>)
                {
                    Some(Ok(p)) => listener.progress(p),
                    _ => tracing::debug!(upstream = %self.name, "malformed progress; skipped"),
                }
                None
            }
            (Some("notifications/tools/list_changed"), None) => {
                listener.tools_changed();
                None
            }
            (Some(other), None) => {
                tracing::debug!(upstream = %self.name, method = other, "upstream notification during a call; not relayed");
                None
            }
        }
    }

    fn answer_of(&self, message: Value) -> Result<CallToolResult, HopError> {
        answer_of(&self.name, message)
    }

    /// Answers a request the upstream makes of its client during a call as rmcp's default
    /// client handler does (toolgate relays none of them to its callers).
    fn answer_server_request(&self, session: &Arc<Session>, method: &str, id: Value) {
        tracing::debug!(upstream = %self.name, method, "upstream request during a call; answered as a client without the capability");
        let reply = match method {
            "ping" => json!({"jsonrpc": "2.0", "id": id, "result": {}}),
            "roots/list" => json!({"jsonrpc": "2.0", "id": id, "result": {"roots": []}}),
            "elicitation/create" => {
                json!({"jsonrpc": "2.0", "id": id, "result": {"action": "decline"}})
            }
            other => json!({"jsonrpc": "2.0", "id": id,
                "error": {"code": -32601, "message": other}}),
        };
        self.post_aside(session, reply);
    }

    /// Posts a message that expects no answer (a reply, a notification), not waiting for it.
    fn post_aside(&self, session: &Arc<Session>, message: Value) {
        let request = self.request(session, &message);
        let conns = self.conns.clone();
        let name = self.name.clone();
        tokio::spawn(async move {
            // Read to the end, so the connection can be kept.
            let read = async |r: Response<Incoming>| {
                let _ = read_bounded(r.into_body(), MAX_ERROR_BODY).await;
            };
            if let Err(e) = conns.exchange(request, read).await {
                tracing::debug!(upstream = %name, error = %e, "a message to the upstream was not sent")
            }
        });
    }
}

/// The response's media type, lowercased, without parameters.
fn media_type(response: &Response<Incoming>) -> String {
    response
        .headers()
        .get(CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.split(';').next())
        .map(|v| v.trim().to_ascii_lowercase())
        .unwrap_or_default()
}

/// The tool result or the JSON-RPC error in `message`, the answer to a call made of `upstream`.
pub(crate) fn answer_of(upstream: &str, message: Value) -> Result<CallToolResult, HopError> {
    if let Some((code, msg)) = rpc_error(&message) {
        return Err(HopError::Rpc { code, message: msg });
    }
    let result = match message {
        Value::Object(mut m) => m.remove("result").unwrap_or(Value::Null),
        _ => Value::Null,
    };
    serde_json::from_value::<CallToolResult>(result).map_err(|e| {
        HopError::Lost(format!(
            "upstream '{upstream}' answered with something that is not a tool result: {e}"
        ))
    })
}

/// The code and message of a JSON-RPC error message.
fn rpc_error(message: &Value) -> Option<(i32, String)> {
    let e = message.get("error")?;
    let code = i32::try_from(e.get("code")?.as_i64()?).ok()?;
    let msg = e.get("message").and_then(Value::as_str).unwrap_or("");
    Some((code, msg.to_string()))
}

/// Why a body could not be read in full.
#[derive(Debug, thiserror::Error)]
enum ReadError {
    #[error("the answer exceeds {0} bytes")]
    TooLarge(usize),
    #[error("{0}")]
    Body(#[source] hyper::Error),
}

async fn read_bounded(mut body: Incoming, limit: usize) -> Result<Vec<u8>, ReadError> {
    let mut out = Vec::new();
    while let Some(frame) = body.frame().await {
        let frame = frame.map_err(ReadError::Body)?;
        if let Some(chunk) = frame.data_ref() {
            if out.len() + chunk.len() > limit {
                return Err(ReadError::TooLarge(limit));
            }
            out.extend_from_slice(chunk);
        }
    }
    Ok(out)
}

#[cfg(all(test, target_os = "linux"))]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    /// Linux leaves quick-ACK mode as soon as a connection looks interactive (a send soon after
    /// a receive): from then on each ACK waits for a reply to ride on or for the delayed-ACK
    /// timer. A plain socket is out of it after its second exchange; a dialled one is back in
    /// it after every read, and never waits on Nagle on its own writes.
    #[tokio::test]
    async fn a_dialled_connection_acknowledges_at_once_after_every_read() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let uri: Uri = format!("http://{}/mcp", listener.local_addr().unwrap())
            .parse()
            .unwrap();
        let (dialled, accepted) = tokio::join!(dial(&uri), listener.accept());
        let mut ours = dialled.unwrap().into_inner();
        let (mut theirs, _) = accepted.unwrap();
        assert!(ours.0.nodelay().unwrap(), "TCP_NODELAY on the hop's socket");

        let mut buf = [0u8; 16];
        for exchange in 1..=3 {
            ours.write_all(b"request").await.unwrap();
            let n = theirs.read(&mut buf).await.unwrap();
            assert_eq!(&buf[..n], b"request");
            theirs.write_all(b"answer").await.unwrap();
            let n = ours.read(&mut buf).await.unwrap();
            assert_eq!(&buf[..n], b"answer");
            assert!(
                ours.0.quickack().unwrap(),
                "quick-ACK mode after the read of exchange {exchange}"
            );
        }
    }
}
