//! The MCP side shared by every fake: a hand-written `ServerHandler` around a [`Domain`], the
//! record and the faults, served over stdio or streamable HTTP.

use std::future::Future;
use std::path::PathBuf;
use std::sync::Arc;

use axum::serve::ListenerExt;

use clap::Parser;
use rmcp::model::{
    CallToolRequestParams, CallToolResponse, CallToolResult, Implementation, JsonObject,
    ListToolsResult, PaginatedRequestParams, ProgressNotificationParam, ServerCapabilities,
    ServerConfig, Tool,
};
use rmcp::service::RequestContext;
use rmcp::transport::streamable_http_server::session::local::LocalSessionManager;
use rmcp::transport::{StreamableHttpServerConfig, StreamableHttpService};
use rmcp::{ErrorData, RoleServer, ServerHandler, ServiceExt};
use serde_json::Value;

use crate::fault::{FaultKind, FaultPlan, FaultSpec};
use crate::record::{Record, RecordOutcome, Recorder, now_rfc3339};

/// One call as the domain sees it.
#[derive(Debug, Clone)]
pub struct Call {
    pub tool: String,
    pub arguments: JsonObject,
    /// The request's `_meta`.
    pub meta: JsonObject,
}

impl Call {
    /// `_meta.idempotency_key`, stamped by the gateway (never chosen by the model).
    pub fn idempotency_key(&self) -> Option<&str> {
        self.meta.get("idempotency_key").and_then(Value::as_str)
    }
}

/// What the domain did with one delivery.
#[derive(Debug, Clone)]
pub struct Reply {
    pub result: CallToolResult,
    /// The delivery changed state at the target.
    pub committed: bool,
    /// An earlier result was returned for the same idempotency key.
    pub replayed: bool,
}

/// Marks a reply the server answers with a JSON-RPC internal error instead of a tool result.
const INTERNAL_ERROR: &str = "toolgate-fakes/internal-error";

impl Reply {
    /// The target failed the request itself — what an HTTP 500 or a JSON-RPC internal error
    /// says — possibly after committing it (`committed`). The server answers with an error,
    /// not a tool result, so the caller cannot tell whether the call happened.
    pub fn internal_error(message: &str, committed: bool) -> Reply {
        let mut result =
            CallToolResult::error(vec![rmcp::model::ContentBlock::text(message.to_string())]);
        let mut meta = serde_json::Map::new();
        meta.insert(INTERNAL_ERROR.into(), Value::String(message.into()));
        result.meta = Some(rmcp::model::MetaObject(meta));
        Reply {
            result,
            committed,
            replayed: false,
        }
    }

    /// The message of a reply made by [`Reply::internal_error`].
    fn internal_error_message(&self) -> Option<String> {
        self.result
            .meta
            .as_ref()
            .and_then(|m| m.0.get(INTERNAL_ERROR))
            .and_then(Value::as_str)
            .map(str::to_string)
    }

    /// A read, or a refused write: nothing changed.
    pub fn read(result: CallToolResult) -> Reply {
        Reply {
            result,
            committed: false,
            replayed: false,
        }
    }

    /// A delivery that changed state.
    pub fn committed(result: CallToolResult) -> Reply {
        Reply {
            result,
            committed: true,
            replayed: false,
        }
    }

    /// A delivery answered from the key ledger.
    pub fn replayed(result: CallToolResult) -> Reply {
        Reply {
            result,
            committed: false,
            replayed: true,
        }
    }
}

impl From<CallToolResult> for Reply {
    fn from(result: CallToolResult) -> Reply {
        Reply::read(result)
    }
}

/// A target system: its tools and what a call does to its data.
pub trait Domain: Send + Sync + 'static {
    /// Short name used in the record (`finance`).
    fn name(&self) -> &'static str;
    /// The MCP server name (`toolgate-fake-finance`).
    fn server_name(&self) -> &'static str;
    fn tools(&self) -> Vec<Tool>;
    /// Extra capabilities beyond tools (the conformance fake logs).
    fn capabilities(&self) -> ServerCapabilities {
        ServerCapabilities::builder().enable_tools().build()
    }
    /// Whether `logging/setLevel` is answered (only when the capabilities declare logging).
    fn logs(&self) -> bool {
        false
    }
    /// Handles one delivery. Called twice for a duplicated delivery.
    fn call(
        &self,
        call: &Call,
        context: &RequestContext<RoleServer>,
    ) -> impl Future<Output = Reply> + Send;
}

struct Shared<D> {
    domain: D,
    recorder: Recorder,
    faults: FaultPlan,
}

/// The MCP server around a domain. Cheap to clone: HTTP sessions share one state.
pub struct FakeServer<D> {
    shared: Arc<Shared<D>>,
}

impl<D> Clone for FakeServer<D> {
    fn clone(&self) -> Self {
        FakeServer {
            shared: self.shared.clone(),
        }
    }
}

impl<D: Domain> FakeServer<D> {
    pub fn new(domain: D, recorder: Recorder, faults: FaultPlan) -> Self {
        FakeServer {
            shared: Arc::new(Shared {
                domain,
                recorder,
                faults,
            }),
        }
    }

    pub fn domain(&self) -> &D {
        &self.shared.domain
    }

    fn record(
        &self,
        call: &Call,
        delivery: u32,
        faults: &[FaultKind],
        status: &str,
        reply: &Reply,
    ) {
        let result = reply
            .result
            .structured_content
            .clone()
            .or_else(|| {
                reply
                    .result
                    .content
                    .first()
                    .and_then(|c| c.as_text())
                    .map(|t| Value::String(t.text.clone()))
            })
            .unwrap_or(Value::Null);
        let shared = &self.shared;
        shared.recorder.write(&Record {
            ts: now_rfc3339(),
            server: shared.domain.name().to_string(),
            seq: shared.recorder.next_seq(),
            tool: call.tool.clone(),
            arguments: Value::Object(call.arguments.clone()),
            meta: Value::Object(call.meta.clone()),
            idempotency_key: call.idempotency_key().map(str::to_string),
            delivery,
            faults: faults.iter().map(|f| f.name().to_string()).collect(),
            outcome: RecordOutcome {
                status: status.to_string(),
                committed: reply.committed,
                replayed: reply.replayed,
                result,
            },
        });
    }

    fn status_of(reply: &Reply) -> &'static str {
        if reply.result.is_error == Some(true) {
            "tool_error"
        } else {
            "ok"
        }
    }
}

impl<D: Domain> ServerHandler for FakeServer<D> {
    fn get_info(&self) -> ServerConfig {
        ServerConfig::new(self.shared.domain.capabilities()).with_server_info(Implementation::new(
            self.shared.domain.server_name(),
            env!("CARGO_PKG_VERSION"),
        ))
    }

    #[allow(deprecated)] // logging is deprecated by 2026-07-28, still part of 2025-11-25
    async fn set_level(
        &self,
        _request: rmcp::model::SetLevelRequestParams,
        _context: RequestContext<RoleServer>,
    ) -> Result<(), ErrorData> {
        if self.shared.domain.logs() {
            Ok(())
        } else {
            Err(ErrorData::method_not_found::<
                rmcp::model::SetLevelRequestMethod,
            >())
        }
    }

    async fn list_tools(
        &self,
        _request: Option<PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, ErrorData> {
        Ok(ListToolsResult::with_all_items(self.shared.domain.tools()))
    }

    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, ErrorData> {
        let call = Call {
            tool: request.name.to_string(),
            arguments: request.arguments.unwrap_or_default(),
            meta: context.meta.0.0.clone(),
        };
        let shared = &self.shared;
        if !shared.domain.tools().iter().any(|t| t.name == call.tool) {
            let reply = Reply::read(crate::tool_error(format!("unknown tool '{}'", call.tool)));
            self.record(&call, 1, &[], "unknown_tool", &reply);
            return Err(ErrorData::invalid_params(
                format!("unknown tool '{}'", call.tool),
                None,
            ));
        }
        let faults = shared.faults.select(&call.tool);
        for f in &faults {
            if let FaultKind::Slow(d) = f {
                // A slow call reports its progress to a caller that asked for it (two steps,
                // each naming the tool, the last just before the answer), as a long-running
                // tool would.
                let token = context.meta.get_progress_token();
                for (step, wait) in [(1.0, *d / 2), (2.0, *d - *d / 2)] {
                    tokio::time::sleep(wait).await;
                    if let Some(t) = &token {
                        let p = ProgressNotificationParam::new(t.clone(), step)
                            .with_total(2.0)
                            .with_message(format!("{} step {step}", call.tool));
                        let _ = context.peer.notify_progress(p).await;
                    }
                }
            }
        }
        let duplicate = faults.contains(&FaultKind::DuplicateDelivery);
        let timeout = faults.contains(&FaultKind::TimeoutAfterCommit);
        let error = faults.contains(&FaultKind::ErrorAfterCommit);

        let mut reply = shared.domain.call(&call, &context).await;
        let status = |r: &Reply| {
            if timeout {
                "no_response"
            } else if error {
                "error_after_commit"
            } else {
                Self::status_of(r)
            }
        };
        if duplicate {
            self.record(&call, 1, &faults, Self::status_of(&reply), &reply);
            reply = shared.domain.call(&call, &context).await;
            self.record(&call, 2, &faults, status(&reply), &reply);
        } else {
            self.record(&call, 1, &faults, status(&reply), &reply);
        }
        if timeout {
            // The effect is committed; the caller never hears about it.
            context.ct.cancelled().await;
            return Err(ErrorData::internal_error("cancelled by the caller", None));
        }
        if error {
            return Err(ErrorData::internal_error(
                "injected fault: the upstream failed after committing the call",
                None,
            ));
        }
        if let Some(message) = reply.internal_error_message() {
            return Err(ErrorData::internal_error(message, None));
        }
        Ok(reply.result.into())
    }
}

/// The flags every fake takes.
#[derive(Debug, Clone, Parser)]
pub struct FakeArgs {
    /// Serve streamable HTTP at ADDR (e.g. 127.0.0.1:9901, endpoint /mcp) instead of stdio.
    #[arg(long, value_name = "ADDR")]
    pub http: Option<String>,
    /// Append one JSON line per call delivery to FILE.
    #[arg(long, value_name = "FILE")]
    pub record: Option<PathBuf>,
    /// A fault: KIND[=VALUE][,every=N|,rate=P][,tool=NAME]; KIND is slow=MS,
    /// timeout-after-commit, error-after-commit or duplicate-delivery. Repeatable.
    #[arg(long = "fault", value_name = "SPEC")]
    pub faults: Vec<FaultSpec>,
    /// Seed for rate-selected faults, so a run can be repeated.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
}

/// Parses the flags and serves `domain` until the client disconnects (stdio) or forever (HTTP).
pub async fn run<D: Domain>(domain: D) -> anyhow::Result<()> {
    let args = FakeArgs::parse();
    let recorder = match &args.record {
        Some(path) => Recorder::to_file(path)
            .map_err(|e| anyhow::anyhow!("cannot open the record file {}: {e}", path.display()))?,
        None => Recorder::disabled(),
    };
    let server = FakeServer::new(domain, recorder, FaultPlan::new(args.faults, args.seed));
    match args.http {
        None => {
            let running = server.serve(rmcp::transport::stdio()).await?;
            running.waiting().await?;
        }
        Some(addr) => {
            let service = StreamableHttpService::new(
                move || Ok(server.clone()),
                Arc::new(LocalSessionManager::default()),
                StreamableHttpServerConfig::default(),
            );
            let app = axum::Router::new().nest_service("/mcp", service);
            let listener = tokio::net::TcpListener::bind(&addr)
                .await
                .map_err(|e| anyhow::anyhow!("cannot listen on {addr}: {e}"))?;
            eprintln!("listening on http://{}/mcp", listener.local_addr()?);
            // As Node's and Python's HTTP servers do: a client that keeps its connection open
            // (toolgate's `keep_alive`) must not wait on Nagle's algorithm for each small write.
            let listener = listener.tap_io(|tcp| {
                let _ = tcp.set_nodelay(true);
            });
            axum::serve(listener, app).await?;
        }
    }
    Ok(())
}
