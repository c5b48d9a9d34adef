//! The upstream side: one rmcp client per upstream server declared in `toolgate.yaml`, a child
//! process over stdio or a streamable-HTTP URL. This is the store's [`Handler`]: the executor
//! calls it only after a call was decided and reserved. The upstream's `_meta` is built here,
//! never copied from the agent's: it carries exactly `idempotency_key` (derived by toolgate),
//! `run_id`, `step_id`, the `progressToken` of toolgate's own request (progress the upstream
//! reports is relayed under it) and, when spans are exported or the caller sent one,
//! `traceparent`.
//! Approval tokens stay in toolgate (they were verified and consumed here; the upstream cannot
//! verify them and must not be able to replay them), as does every other `_meta` field the agent
//! sent (`purpose`, `reason`, `evidence`, `model`…: they are in the audit record).
//!
//! An upstream that does not answer within its `timeout_secs` is a [`HandlerError::Timeout`];
//! an error that may follow a committed effect (HTTP 5xx, a JSON-RPC internal error, a
//! connection lost mid-call) is [`HandlerError::Unanswered`]; a tool result with `isError`, a
//! refused request or a call never sent is [`HandlerError::Failed`], a clean "no" (the store
//! decides what each means for the effect class); a dropped connection is
//! re-established on the next call; `notifications/tools/list_changed` re-reads the upstream's
//! `tools/list`. Each connect, reconnect and change is checked against `toolgate.lock` (see
//! [`crate::pins`]) before anything of the new list is served, then handed to a hook. Progress
//! the upstream reports on a call goes back to the client that made it ([`crate::relay`]).
//! A `tools/call` to a plain-`http` upstream goes out on the lean hop ([`crate::hop`]) in the
//! session rmcp opened, and one to a child process on the lean stdio hop ([`crate::child`]),
//! with the same mapping of what came back; rmcp carries everything else.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};
use std::time::Duration;

use rmcp::model::{
    CallToolRequest, CallToolRequestParams, CallToolResult, ClientCapabilities, ClientConfig,
    ClientRequest, Implementation, JsonObject, MetaObject, NumberOrString,
    ProgressNotificationParam, ProgressToken, ProtocolVersion, RequestMetaObject, ServerResult,
    Tool,
};
use rmcp::service::{NotificationContext, Peer, PeerRequestOptions, RunningService, ServiceError};
use rmcp::transport::StreamableHttpClientTransport;
use rmcp::transport::streamable_http_client::StreamableHttpClientTransportConfig;
use rmcp::{ClientHandler, RoleClient, ServiceExt};
use serde_json::{Value, json};
use toolgate_contract::{DefinitionHash, PinVerdict, ServerIdentity};
use toolgate_core::config::UpstreamConfig;
use toolgate_store::{BoxFuture, CallMeta, Handler, HandlerError, HandlerOutput, Served, Target};

use crate::child::ChildLink;
use crate::hop::{HopError, LeanHop, Listener, Session, SessionCell, TappedClient};
use crate::pins::{PinGuard, PinRefusal, Pins};
use crate::relay::{Routes, Watched};
use crate::render::to_stored;

/// Called with an upstream's name and its new `tools/list` after it announced a change, once
/// the new list was checked against `toolgate.lock` and the verdict is in force.
pub type ToolsChangedHook = Arc<dyn Fn(&str, &[Tool]) + Send + Sync>;

/// The client side of one upstream connection: answers `tools/list_changed`.
#[derive(Clone)]
struct UpstreamClient {
    name: String,
    tools: Arc<RwLock<Vec<Tool>>>,
    hook: Option<ToolsChangedHook>,
    pins: Arc<PinGuard>,
}

impl ClientHandler for UpstreamClient {
    fn get_info(&self) -> ClientConfig {
        ClientConfig::new(
            ClientCapabilities::default(),
            Implementation::new("toolgate", env!("CARGO_PKG_VERSION")),
        )
    }

    async fn on_tool_list_changed(&self, context: NotificationContext<RoleClient>) {
        self.clone().reread(context.peer.clone());
    }
}

impl UpstreamClient {
    /// Re-reads the upstream's `tools/list` after it announced a change, checks it against
    /// `toolgate.lock` and hands it to the hook (in a task of its own).
    fn reread(self, peer: Peer<RoleClient>) {
        let this = self;
        tokio::spawn(async move {
            match peer.list_all_tools().await {
                Ok(tools) => {
                    tracing::warn!(upstream = %this.name, tools = tools.len(), "upstream tools/list changed; re-read");
                    match peer.peer_info() {
                        Some(info) => this.pins.check(info, &tools).await,
                        None => {
                            tracing::error!(upstream = %this.name, "no initialize answer to check the new tools/list against")
                        }
                    }
                    *this.tools.write().expect("tools lock") = tools.clone();
                    if let Some(h) = &this.hook {
                        h(&this.name, &tools);
                    }
                }
                Err(e) => {
                    tracing::error!(upstream = %this.name, error = %e, "re-reading tools/list failed")
                }
            }
        });
    }
}

type Client = RunningService<RoleClient, UpstreamClient>;

/// One upstream server.
struct Upstream {
    name: String,
    cfg: UpstreamConfig,
    dir: PathBuf,
    timeout: Duration,
    /// The running client (dropping it closes the connection or ends the child).
    service: tokio::sync::Mutex<Option<Client>>,
    /// A handle to the connected peer, for calls without taking the lock above.
    peer: RwLock<Option<Peer<RoleClient>>>,
    tools: Arc<RwLock<Vec<Tool>>>,
    hook: Option<ToolsChangedHook>,
    /// The verdict of `toolgate.lock` on what this upstream lists.
    pins: Arc<PinGuard>,
    /// Progress tokens of calls in flight, back to their callers.
    routes: Arc<Routes>,
    /// The session rmcp's HTTP transport opened, as the lean hop reuses it.
    session: Arc<SessionCell>,
    /// The lean `tools/call` hop, for a plain-`http` upstream ([`crate::hop`]).
    lean: Option<LeanHop>,
    /// The running child's stdio as the lean stdio hop shares it ([`crate::child`]).
    child: RwLock<Option<Arc<ChildLink>>>,
}

/// Why an upstream could not be connected (or is not there to connect). Each names the
/// upstream and the step that failed, and keeps the error beneath it as its source.
#[derive(Debug, thiserror::Error)]
pub enum UpstreamError {
    #[error("no upstream named '{0}' is declared in toolgate.yaml")]
    Undeclared(String),
    #[error("upstream '{0}' has neither `command` nor `url`")]
    NoEndpoint(String),
    #[error("upstream '{0}': `keep_alive` is for an upstream reached by `url`, not `command`")]
    KeepAliveCommand(String),
    #[error("building the HTTP client for upstream '{name}': {source}")]
    HttpClient {
        name: String,
        source: reqwest::Error,
    },
    #[error("connecting to upstream '{name}' at {url}: {source}")]
    Connect {
        name: String,
        url: String,
        source: rmcp::service::ClientInitializeError,
    },
    #[error("starting upstream '{name}' ({}): {source}", program.display())]
    Spawn {
        name: String,
        program: PathBuf,
        source: std::io::Error,
    },
    #[error("initializing upstream '{name}': {source}")]
    Initialize {
        name: String,
        source: rmcp::service::ClientInitializeError,
    },
    #[error("upstream '{0}' did not complete the handshake in time")]
    HandshakeTimeout(String),
    #[error("upstream '{0}' completed no initialize handshake")]
    NoHandshake(String),
    #[error("reading tools/list of upstream '{name}': {source}")]
    ListTools {
        name: String,
        source: rmcp::ServiceError,
    },
}

/// Why a pin check did not find a tool served: its upstream could not be reached (or is not
/// declared) to be checked, or the pins in force refuse the tool. Its text is the refusal.
#[derive(Debug, thiserror::Error)]
pub enum PinCheckError {
    #[error("{0}")]
    Unreached(#[source] Box<UpstreamError>),
    #[error("{0}")]
    Refused(#[from] PinRefusal),
}

impl Upstream {
    fn current_peer(&self) -> Option<Peer<RoleClient>> {
        let p = self.peer.read().expect("peer lock").clone();
        p.filter(|p| !p.is_transport_closed())
    }

    /// The connected peer, connecting (or reconnecting) first when needed.
    async fn connected(&self) -> Result<Peer<RoleClient>, UpstreamError> {
        if let Some(p) = self.current_peer() {
            return Ok(p);
        }
        let mut guard = self.service.lock().await;
        if let Some(p) = self.current_peer() {
            return Ok(p);
        }
        if let Some(old) = guard.take() {
            let _ = old.cancel().await;
        }
        let handler = self.client_handler();
        let service = tokio::time::timeout(
            self.timeout.max(Duration::from_secs(5)),
            self.start(handler),
        )
        .await
        .map_err(|_| UpstreamError::HandshakeTimeout(self.name.clone()))??;
        let peer = service.peer().clone();
        let info = peer
            .peer_info()
            .ok_or_else(|| UpstreamError::NoHandshake(self.name.clone()))?;
        // A server that declares no tools capability (one serving only prompts or resources)
        // has no tools/list to read; asking would fail the whole connection.
        let tools = if info.capabilities.tools.is_some() {
            peer.list_all_tools()
                .await
                .map_err(|source| UpstreamError::ListTools {
                    name: self.name.clone(),
                    source,
                })?
        } else {
            Vec::new()
        };
        tracing::info!(upstream = %self.name, tools = tools.len(), "connected to upstream");
        // Checked before the peer is published: nothing of a (re)connection is served unchecked.
        self.pins.check(info, &tools).await;
        self.routes.reconnected();
        *self.tools.write().expect("tools lock") = tools;
        *self.peer.write().expect("peer lock") = Some(peer.clone());
        *guard = Some(service);
        Ok(peer)
    }

    async fn start(&self, handler: UpstreamClient) -> Result<Client, UpstreamError> {
        if let Some(url) = &self.cfg.url {
            let client = self
                .http_client()
                .map_err(|source| UpstreamError::HttpClient {
                    name: self.name.clone(),
                    source,
                })?;
            let transport = StreamableHttpClientTransport::with_client(
                TappedClient::new(client, self.session.clone()),
                StreamableHttpClientTransportConfig::with_uri(url.as_str()),
            );
            return handler
                .serve(Watched::new(transport, self.routes.clone()))
                .await
                .map_err(|source| UpstreamError::Connect {
                    name: self.name.clone(),
                    url: url.to_string(),
                    source,
                });
        }
        let Some(command) = &self.cfg.command else {
            return Err(UpstreamError::NoEndpoint(self.name.clone()));
        };
        if self.cfg.keep_alive {
            return Err(UpstreamError::KeepAliveCommand(self.name.clone()));
        }
        let program = resolve_command(&self.dir, command);
        let mut cmd = tokio::process::Command::new(&program);
        cmd.args(&self.cfg.args).current_dir(&self.dir).env_clear();
        // Only the variables the registry names pass through, plus what finding binaries needs.
        for name in ["PATH", "HOME", "LANG", "TMPDIR"]
            .iter()
            .copied()
            .chain(self.cfg.env.iter().map(String::as_str))
        {
            if let Ok(v) = std::env::var(name) {
                cmd.env(name, v);
            }
        }
        let (link, transport) =
            crate::child::spawn(&self.name, cmd, self.routes.clone()).map_err(|source| {
                UpstreamError::Spawn {
                    name: self.name.clone(),
                    program: program.clone(),
                    source,
                }
            })?;
        let service = handler
            .serve(Watched::new(transport, self.routes.clone()))
            .await
            .map_err(|source| UpstreamError::Initialize {
                name: self.name.clone(),
                source,
            })?;
        *self.child.write().expect("child lock") = Some(link);
        Ok(service)
    }

    fn client_handler(&self) -> UpstreamClient {
        UpstreamClient {
            name: self.name.clone(),
            tools: self.tools.clone(),
            hook: self.hook.clone(),
            pins: self.pins.clone(),
        }
    }

    /// The reqwest client rmcp's transport posts through: kept-alive connections with
    /// `keep_alive`, otherwise as rmcp's own default client (a connection per request,
    /// same-origin 307/308 redirects followed).
    fn http_client(&self) -> Result<reqwest::Client, reqwest::Error> {
        let builder = reqwest::Client::builder();
        let builder = if self.cfg.keep_alive {
            builder
                .tcp_nodelay(true)
                .redirect(reqwest::redirect::Policy::none())
        } else {
            builder
                .pool_max_idle_per_host(0)
                .redirect(same_origin_redirects())
        };
        builder.build()
    }

    /// Forgets a broken connection so the next call reconnects.
    fn drop_peer(&self) {
        *self.peer.write().expect("peer lock") = None;
    }

    async fn call(
        &self,
        tool: &str,
        inputs: &Value,
        meta: &CallMeta,
    ) -> Result<HandlerOutput, HandlerError> {
        let peer = self.connected().await.map_err(|e| {
            tracing::error!(upstream = %self.name, error = %e, "upstream unavailable");
            // Nothing was sent: the call certainly did not happen.
            HandlerError::Failed(format!("upstream '{}' is unavailable: {e}", self.name))
        })?;
        // A tool not served at a pinned definition is never forwarded, whoever asks.
        if let Err(refusal) = self.pins.allows(tool) {
            tracing::warn!(upstream = %self.name, tool, "not forwarded: not served at a pinned definition");
            return Err(HandlerError::NotPinned(refusal.to_string()));
        }
        let arguments: JsonObject = match inputs {
            Value::Object(m) => m.clone(),
            Value::Null => JsonObject::new(),
            other => {
                return Err(HandlerError::Failed(format!(
                    "inputs must be a JSON object, not {other}"
                )));
            }
        };
        let mut m = JsonObject::new();
        m.insert(
            "idempotency_key".into(),
            json!(meta.idempotency_key.as_str()),
        );
        m.insert("run_id".into(), json!(meta.run_id));
        m.insert("step_id".into(), json!(meta.step_id));
        if let Some(tp) = crate::relay::traceparent() {
            m.insert("traceparent".into(), json!(tp));
        }
        let mut params = CallToolRequestParams::new(tool.to_string()).with_arguments(arguments);
        params.meta = Some(RequestMetaObject(MetaObject(m)));
        if let Some(link) = self.lean_child(&peer) {
            return match tokio::time::timeout(self.timeout, self.call_child(tool, link, params))
                .await
            {
                Err(_) => Err(HandlerError::Timeout),
                Ok(out) => out,
            };
        }
        if let Some(lean) = self.lean_session(&peer) {
            return match tokio::time::timeout(
                self.timeout,
                self.call_lean(tool, &peer, lean, params),
            )
            .await
            {
                Err(_) => Err(HandlerError::Timeout),
                Ok(out) => out,
            };
        }
        match tokio::time::timeout(self.timeout, self.send_call(&peer, params)).await {
            Err(_) | Ok(Err(ServiceError::Timeout { .. })) => Err(HandlerError::Timeout),
            Ok(Ok(result)) => output_of(result),
            // A request the server rejected as such (unparsable, unknown method, bad params) did
            // nothing; an internal or server-defined error (what a JSON-RPC 500 carries) may
            // come after the effect committed.
            Ok(Err(ServiceError::McpError(e))) => Err(self.rpc_error(e.code.0, &e.message)),
            Ok(Err(ServiceError::TransportSend(e))) => {
                self.drop_peer();
                let msg = format!("could not send the call to upstream '{}': {e}", self.name);
                if never_delivered(&e) {
                    Err(HandlerError::Failed(msg))
                } else {
                    // An HTTP 5xx (or a connection that broke once the request was out) may
                    // follow a committed effect.
                    Err(HandlerError::Unanswered(msg))
                }
            }
            Ok(Err(e)) => {
                // The request may have reached the upstream before the connection broke: no
                // answer, which the store treats like a timeout.
                tracing::warn!(upstream = %self.name, error = %e, "upstream connection lost during a call");
                self.drop_peer();
                Err(HandlerError::Unanswered(format!(
                    "the connection to upstream '{}' was lost during the call: {e}",
                    self.name
                )))
            }
        }
    }

    /// A JSON-RPC error answer: refused before running, or possibly after an effect.
    fn rpc_error(&self, code: i32, message: &str) -> HandlerError {
        if rejected_before_running(code) {
            HandlerError::Failed(format!("the upstream refused the call: {message}"))
        } else {
            HandlerError::Unanswered(format!(
                "upstream '{}' answered with error {code}: {message}",
                self.name
            ))
        }
    }

    /// The session a call can take the lean hop in: an HTTP upstream whose rmcp transport has
    /// opened one, on a protocol version whose requests carry no per-message headers.
    fn lean_session(&self, peer: &Peer<RoleClient>) -> Option<Arc<Session>> {
        let lean = self.lean.as_ref()?;
        let info = peer.peer_info()?;
        if info.protocol_version >= ProtocolVersion::STANDARD_HEADERS {
            return None;
        }
        lean.session()
    }

    /// Sends one `tools/call` over the lean hop in `session`. An expired session was left
    /// without the call: the upstream is reconnected through rmcp and the call sent once more,
    /// in the new session (or through rmcp, if it has none yet). Nothing else is sent twice.
    async fn call_lean(
        &self,
        tool: &str,
        peer: &Peer<RoleClient>,
        session: Arc<Session>,
        params: CallToolRequestParams,
    ) -> Result<HandlerOutput, HandlerError> {
        let lean = self.lean.as_ref().expect("a lean session has a lean hop");
        let mut params = serde_json::to_value(&params).expect("tool call parameters serialise");
        let answer = match self
            .send_lean(lean, session.clone(), peer, &mut params)
            .await
        {
            Err(HopError::Expired) => {
                tracing::info!(upstream = %self.name, "upstream session expired; reconnecting before sending the call again");
                if lean.forget(&session) {
                    self.drop_peer();
                }
                let peer = self.connected().await.map_err(|e| {
                    HandlerError::Failed(format!(
                        "upstream '{}' forgot the session and could not be reconnected: {e}",
                        self.name
                    ))
                })?;
                if let Err(refusal) = self.pins.allows(tool) {
                    return Err(HandlerError::NotPinned(refusal.to_string()));
                }
                match self.lean_session(&peer) {
                    Some(fresh) => self.send_lean(lean, fresh, &peer, &mut params).await,
                    None => {
                        return self
                            .send_again_through_rmcp(&peer, params, "reconnecting")
                            .await;
                    }
                }
            }
            other => other,
        };
        self.lean_outcome(answer)
    }

    /// Sends a call that was never delivered once more, through rmcp, on the upstream reached
    /// again (`after`: what was done to reach it, for the error).
    async fn send_again_through_rmcp(
        &self,
        peer: &Peer<RoleClient>,
        params: serde_json::Value,
        after: &str,
    ) -> Result<HandlerOutput, HandlerError> {
        let params =
            serde_json::from_value(params).expect("parameters read back as they were written");
        match self.send_call(peer, params).await {
            Ok(result) => output_of(result),
            Err(e) => Err(HandlerError::Unanswered(format!(
                "the call to upstream '{}' failed after {after}: {e}",
                self.name
            ))),
        }
    }

    /// What an answer over a lean hop means for the store, as for an answer through rmcp.
    fn lean_outcome(
        &self,
        answer: Result<CallToolResult, HopError>,
    ) -> Result<HandlerOutput, HandlerError> {
        match answer {
            Ok(result) => output_of(result),
            Err(HopError::Rpc { code, message }) => Err(self.rpc_error(code, &message)),
            Err(e @ (HopError::Refused(_) | HopError::Unsupported(_))) => {
                Err(HandlerError::Failed(e.to_string()))
            }
            Err(HopError::Expired) => Err(HandlerError::Failed(format!(
                "upstream '{}' forgot its new session too (HTTP 404); the call was not delivered",
                self.name
            ))),
            Err(HopError::Lost(msg)) => {
                tracing::warn!(upstream = %self.name, error = %msg, "no answer to a call over the lean hop");
                Err(HandlerError::Unanswered(msg))
            }
        }
    }

    /// The child a call can take the lean stdio hop to: an upstream started as a child process,
    /// still answering, on a protocol version with `initialize` (a later one carries protocol
    /// metadata in each request, which stays on rmcp).
    fn lean_child(&self, peer: &Peer<RoleClient>) -> Option<Arc<ChildLink>> {
        let info = peer.peer_info()?;
        if info.protocol_version >= ProtocolVersion::NO_INITIALIZE {
            return None;
        }
        let link = self.child.read().expect("child lock").clone()?;
        link.is_open().then_some(link)
    }

    /// Sends one `tools/call` over the lean stdio hop. A child that had exited before the call
    /// was written never saw it: the upstream is started again and the call sent once more (on
    /// the new child, or through rmcp). Nothing else is sent twice.
    async fn call_child(
        &self,
        tool: &str,
        link: Arc<ChildLink>,
        params: CallToolRequestParams,
    ) -> Result<HandlerOutput, HandlerError> {
        let mut params = serde_json::to_value(&params).expect("tool call parameters serialise");
        let answer = match self.send_child(&link, &mut params).await {
            Err(HopError::Refused(why)) if !link.is_open() => {
                tracing::info!(upstream = %self.name, error = %why, "upstream process gone; starting it again before sending the call");
                self.drop_peer();
                let peer = self.connected().await.map_err(|e| {
                    HandlerError::Failed(format!(
                        "upstream '{}' exited and could not be started again: {e}",
                        self.name
                    ))
                })?;
                if let Err(refusal) = self.pins.allows(tool) {
                    return Err(HandlerError::NotPinned(refusal.to_string()));
                }
                match self.lean_child(&peer) {
                    Some(fresh) => self.send_child(&fresh, &mut params).await,
                    None => {
                        return self
                            .send_again_through_rmcp(&peer, params, "restarting it")
                            .await;
                    }
                }
            }
            other => other,
        };
        self.lean_outcome(answer)
    }

    /// One send over the lean stdio hop, with a fresh id that is also its progress token;
    /// progress on it goes to the caller when it asked for progress.
    async fn send_child(
        &self,
        link: &Arc<ChildLink>,
        params: &mut Value,
    ) -> Result<CallToolResult, HopError> {
        let id = link.next_id();
        params["_meta"]["progressToken"] = json!(&*id);
        let route = if crate::relay::wanted() {
            self.routes
                .open(ProgressToken(NumberOrString::String(id.clone())))
        } else {
            None
        };
        let call = link.call(id, params, route.is_some());
        match route {
            Some(route) => route.relay(call).await,
            None => call.await,
        }
    }

    /// One send over the lean hop, with a fresh id that is also its progress token; progress
    /// on it goes to the caller when it asked for progress.
    async fn send_lean(
        &self,
        lean: &LeanHop,
        session: Arc<Session>,
        peer: &Peer<RoleClient>,
        params: &mut Value,
    ) -> Result<CallToolResult, HopError> {
        let id = lean.next_id();
        params["_meta"]["progressToken"] = json!(&*id);
        let route = if crate::relay::wanted() {
            self.routes
                .open(ProgressToken(NumberOrString::String(id.clone())))
        } else {
            None
        };
        let listener = CallListener {
            upstream: self,
            peer,
            relay: route.is_some(),
        };
        let call = lean.call(session, id, params.clone(), &listener);
        match route {
            Some(route) => route.relay(call).await,
            None => call.await,
        }
    }

    /// Sends one `tools/call`. When the caller asked for progress, the upstream's progress on
    /// this call is routed back to it for as long as the call is open.
    async fn send_call(
        &self,
        peer: &Peer<RoleClient>,
        params: CallToolRequestParams,
    ) -> Result<CallToolResult, ServiceError> {
        if !crate::relay::wanted() {
            return peer.call_tool(params).await;
        }
        // rmcp's own timeout (just inside the caller's) cancels the request upstream when it
        // fires, as `call_tool` does when dropped.
        let handle = peer
            .send_request_with_option(
                ClientRequest::CallToolRequest(CallToolRequest::new(params)),
                PeerRequestOptions::with_timeout(
                    self.timeout.saturating_sub(Duration::from_millis(1)),
                ),
            )
            .await?;
        let answer = match self.routes.open(handle.progress_token.clone()) {
            Some(route) => route.relay(handle.await_response()).await,
            None => handle.await_response().await,
        };
        match answer? {
            ServerResult::CallToolResult(r) => Ok(r),
            _ => Err(ServiceError::UnexpectedResponse),
        }
    }
}

/// What a tool result means for the store: an `isError` result is a clean "no".
fn output_of(result: CallToolResult) -> Result<HandlerOutput, HandlerError> {
    if result.is_error == Some(true) {
        let text: Vec<String> = result
            .content
            .iter()
            .filter_map(|c| c.as_text().map(|t| t.text.clone()))
            .collect();
        let msg = if text.is_empty() {
            "the upstream reported an error without a message".to_string()
        } else {
            text.join("\n")
        };
        return Err(HandlerError::Failed(msg));
    }
    let target_ref = result
        .structured_content
        .as_ref()
        .and_then(|s| s.get("target_ref").or_else(|| s.get("reference")))
        .and_then(Value::as_str)
        .map(str::to_string);
    Ok(HandlerOutput {
        result: to_stored(&result),
        target_ref,
    })
}

/// What a call over the lean hop hears on the way: progress for its caller, a changed list.
struct CallListener<'a> {
    upstream: &'a Upstream,
    peer: &'a Peer<RoleClient>,
    relay: bool,
}

impl Listener for CallListener<'_> {
    fn progress(&self, progress: ProgressNotificationParam) {
        if self.relay {
            self.upstream.routes.arrived(progress);
        }
    }

    fn tools_changed(&self) {
        self.upstream.client_handler().reread(self.peer.clone());
    }
}

/// JSON-RPC errors that say the request itself was refused before any tool ran: parse error,
/// invalid request, method not found, invalid params.
fn rejected_before_running(code: i32) -> bool {
    matches!(code, -32700 | -32600 | -32601 | -32602)
}

/// Whether a send error certainly left nothing at the upstream: no connection was made, or the
/// server answered with an HTTP status that means it did not take the request (4xx but 408).
/// Anything else (HTTP 5xx above all) may have been delivered.
fn never_delivered(e: &rmcp::transport::DynamicTransportError) -> bool {
    use rmcp::transport::streamable_http_client::StreamableHttpError;
    match e
        .error
        .downcast_ref::<StreamableHttpError<reqwest::Error>>()
    {
        Some(StreamableHttpError::HttpStatus(h)) => {
            (400..500).contains(&h.status) && h.status != 408
        }
        Some(StreamableHttpError::Client(r)) => r.is_connect() || r.is_builder(),
        _ => false,
    }
}

/// Redirects as rmcp's default client follows them: same-origin 307 and 308 only (they keep the
/// method and the body), at most ten; any other is returned as the answer.
fn same_origin_redirects() -> reqwest::redirect::Policy {
    reqwest::redirect::Policy::custom(|attempt| {
        let keeps_body = matches!(
            attempt.status(),
            reqwest::StatusCode::TEMPORARY_REDIRECT | reqwest::StatusCode::PERMANENT_REDIRECT
        );
        let same_origin = attempt
            .previous()
            .first()
            .is_some_and(|first| first.origin() == attempt.url().origin());
        if !keeps_body || !same_origin {
            attempt.stop()
        } else if attempt.previous().len() > 10 {
            attempt.error("exceeded 10 redirects")
        } else {
            attempt.follow()
        }
    })
}

fn resolve_command(dir: &Path, command: &str) -> PathBuf {
    let p = Path::new(command);
    if p.is_absolute() || !command.contains('/') {
        p.to_path_buf()
    } else {
        dir.join(p)
    }
}

/// The upstream servers of one registry.
pub struct Upstreams {
    map: BTreeMap<String, Arc<Upstream>>,
    pins: Arc<Pins>,
}

impl Upstreams {
    /// Declares the upstreams of `toolgate.yaml` (relative commands resolve against `dir`);
    /// nothing connects until [`Upstreams::connect_all`] or the first call. Every tool is
    /// served only as `pins` allows.
    pub fn new(
        dir: &Path,
        configs: &BTreeMap<String, UpstreamConfig>,
        hook: Option<ToolsChangedHook>,
        pins: Arc<Pins>,
    ) -> Upstreams {
        let map = configs
            .iter()
            .map(|(name, cfg)| {
                let secs = if cfg.timeout_secs.is_finite() && cfg.timeout_secs > 0.0 {
                    cfg.timeout_secs
                } else {
                    30.0
                };
                let session = Arc::new(SessionCell::default());
                (
                    name.clone(),
                    Arc::new(Upstream {
                        name: name.clone(),
                        cfg: cfg.clone(),
                        dir: dir.to_path_buf(),
                        timeout: Duration::from_secs_f64(secs),
                        service: tokio::sync::Mutex::new(None),
                        peer: RwLock::new(None),
                        tools: Arc::new(RwLock::new(Vec::new())),
                        hook: hook.clone(),
                        pins: Arc::new(PinGuard::new(
                            name,
                            ServerIdentity::from_upstream(cfg),
                            pins.clone(),
                        )),
                        routes: Arc::default(),
                        lean: cfg
                            .url
                            .as_deref()
                            .and_then(|url| LeanHop::new(name, url, session.clone())),
                        session,
                        child: RwLock::new(None),
                    }),
                )
            })
            .collect();
        Upstreams { map, pins }
    }

    /// The pins every upstream is checked against.
    pub fn pins(&self) -> &Arc<Pins> {
        &self.pins
    }

    /// Whether `tool` of `upstream` is served now (pinned and unchanged, or pinning off).
    pub fn is_served(&self, upstream: &str, tool: &str) -> bool {
        self.map
            .get(upstream)
            .is_some_and(|u| u.pins.allows(tool).is_ok())
    }

    /// Connects `upstream` (which checks it) unless it was checked already.
    pub async fn ensure_checked(&self, upstream: &str) -> Result<(), UpstreamError> {
        match self.map.get(upstream) {
            Some(u) if u.pins.unchecked() => u.connected().await.map(|_| ()),
            _ => Ok(()),
        }
    }

    /// The per-call pin check: the pinned definition hash `tool` of `upstream` is served at
    /// (`None` with pinning off), or the refusal. An upstream never checked is connected (and
    /// checked) first; a refusal re-reads `toolgate.lock` once, so an approval given since
    /// takes effect without a restart.
    pub async fn pin_check(
        &self,
        upstream: &str,
        tool: &str,
    ) -> Result<Option<DefinitionHash>, PinCheckError> {
        let Some(u) = self.map.get(upstream) else {
            let e = UpstreamError::Undeclared(upstream.to_string());
            return Err(PinCheckError::Unreached(Box::new(e)));
        };
        if u.pins.unchecked() {
            // The refusal's reason: why the definition could not be checked.
            u.connected()
                .await
                .map_err(|e| PinCheckError::Unreached(Box::new(e)))?;
        }
        match u.pins.allows(tool) {
            Ok(h) => Ok(h),
            Err(refusal) => {
                let tools = u.tools.read().expect("tools lock").clone();
                if u.pins.recheck_if_lock_changed(&tools).await {
                    Ok(u.pins.allows(tool)?)
                } else {
                    Err(refusal.into())
                }
            }
        }
    }

    /// Re-reads `toolgate.lock` and, when it changed, re-checks every upstream against it (with
    /// what each last listed; no network). A read of one small file when nothing changed.
    pub async fn refresh_pins(&self) {
        if !self.pins.is_on() {
            return;
        }
        self.pins.refresh();
        for u in self.map.values().filter(|u| u.pins.stale()) {
            let tools = u.tools.read().expect("tools lock").clone();
            u.pins.recheck(&tools).await;
        }
    }

    /// The verdict of `toolgate.lock` on `upstream` as last checked.
    pub fn verdict(&self, upstream: &str) -> Option<Arc<PinVerdict>> {
        self.map.get(upstream).and_then(|u| u.pins.verdict())
    }

    /// Drops the connection to `upstream` and connects again (which re-reads `initialize` and
    /// `tools/list` and checks them against `toolgate.lock`).
    pub async fn reconnect(&self, upstream: &str) -> Result<(), UpstreamError> {
        let Some(u) = self.map.get(upstream) else {
            return Err(UpstreamError::Undeclared(upstream.to_string()));
        };
        u.drop_peer();
        u.connected().await.map(|_| ())
    }

    /// Connects every upstream and reads its tools; returns the ones that failed, with why.
    pub async fn connect_all(&self) -> Vec<(String, String)> {
        let mut failed = Vec::new();
        for (name, u) in &self.map {
            if let Err(e) = u.connected().await {
                tracing::error!(upstream = %name, error = %e, "upstream not connected at start");
                failed.push((name.clone(), e.to_string()));
            }
        }
        failed
    }

    /// Whether every upstream is connected now.
    pub fn all_connected(&self) -> bool {
        self.map.values().all(|u| u.current_peer().is_some())
    }

    /// Names of the upstreams that are not connected.
    pub fn disconnected(&self) -> Vec<String> {
        self.map
            .iter()
            .filter(|(_, u)| u.current_peer().is_none())
            .map(|(n, _)| n.clone())
            .collect()
    }

    /// The upstreams that are connected but serve nothing, with why: not pinned in
    /// `toolgate.lock`, blocked by it, or every tool they list blocked (what `/readyz` reports).
    pub fn not_serving(&self) -> Vec<(String, String)> {
        let mut out = Vec::new();
        for name in self.map.keys() {
            let Some(v) = self.verdict(name) else {
                continue;
            };
            if !v.allowed.is_empty() {
                continue;
            }
            let why = match &v.server_blocked {
                Some(reason) => format!(
                    "blocked by toolgate.lock: {reason}; review `toolgate lock diff {name}`, then \
                     `toolgate lock approve {name}`"
                ),
                None if !v.blocked.is_empty() => format!(
                    "every tool it lists is blocked by toolgate.lock ({} changed); review \
                     `toolgate lock diff {name}`, then `toolgate lock approve {name}`",
                    v.blocked.len()
                ),
                None => continue,
            };
            out.push((name.clone(), why));
        }
        out
    }

    /// The connected client of `upstream` (connecting first when needed), for requests other
    /// than tool calls (the prompts and resources the registry lets through).
    pub async fn peer(&self, upstream: &str) -> Result<Peer<RoleClient>, UpstreamError> {
        let u = self
            .map
            .get(upstream)
            .ok_or_else(|| UpstreamError::Undeclared(upstream.to_string()))?;
        u.connected().await
    }

    /// The upstream's `tools/list` as last read.
    pub fn tools(&self, upstream: &str) -> Vec<Tool> {
        self.map
            .get(upstream)
            .map(|u| u.tools.read().expect("tools lock").clone())
            .unwrap_or_default()
    }

    /// The longest upstream timeout (the store's own call timeout must not be shorter).
    pub fn max_timeout(&self) -> Duration {
        self.map
            .values()
            .map(|u| u.timeout)
            .max()
            .unwrap_or(Duration::from_secs(30))
    }

    /// Closes every connection (children are asked to exit).
    pub async fn close(&self) {
        for u in self.map.values() {
            u.drop_peer();
            if let Some(s) = u.service.lock().await.take() {
                let _ = s.cancel().await;
            }
        }
    }

    /// Calls `tool` on `upstream`.
    pub async fn call(
        &self,
        upstream: &str,
        tool: &str,
        inputs: &Value,
        meta: &CallMeta,
    ) -> Result<HandlerOutput, HandlerError> {
        let Some(u) = self.map.get(upstream) else {
            return Err(HandlerError::Failed(format!(
                "no upstream named '{upstream}' is declared in toolgate.yaml"
            )));
        };
        u.call(tool, inputs, meta).await
    }
}

impl Handler for Upstreams {
    fn served(&self, target: &Target) -> Served {
        let Some(upstream) = target.upstream.as_deref() else {
            return Served::Local;
        };
        let Some(u) = self.map.get(upstream) else {
            return Served::Blocked(format!(
                "no upstream named '{upstream}' is declared in toolgate.yaml"
            ));
        };
        if u.pins.unchecked() {
            return Served::Unreached;
        }
        let name = target.upstream_tool.as_deref().unwrap_or(&target.tool);
        match u.pins.allows(name) {
            Ok(Some(hash)) => Served::Pinned(hash.as_str().to_string()),
            Ok(None) => Served::Local,
            Err(why) => Served::Blocked(why.to_string()),
        }
    }

    fn call<'a>(
        &'a self,
        target: &'a Target,
        inputs: &'a Value,
        meta: &'a CallMeta,
    ) -> BoxFuture<'a, Result<HandlerOutput, HandlerError>> {
        Box::pin(async move {
            let Some(upstream) = &target.upstream else {
                return Err(HandlerError::Failed(format!(
                    "tool '{}' has no upstream handler",
                    target.tool
                )));
            };
            let name = target.upstream_tool.as_deref().unwrap_or(&target.tool);
            Upstreams::call(self, upstream, name, inputs, meta).await
        })
    }
}
