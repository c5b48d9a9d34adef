//! The MCP server agents talk to, written by hand against rmcp's `ServerHandler`: a caller's
//! `tools/list` is its role's tools as the registry declares them (schemas unchanged,
//! annotations derived from the effect class, never copied from an upstream), and every
//! `tools/call` is one governed call through the store's executor.

use std::sync::Arc;

use arc_swap::ArcSwap;
use rmcp::model::{
    CacheScope, CallToolRequestParams, CallToolResponse, GetPromptRequestParams, GetPromptResponse,
    Implementation, JsonObject, ListPromptsResult, ListResourcesResult, ListToolsResult,
    PaginatedRequestParams, ReadResourceRequestParams, ReadResourceResponse, ServerCapabilities,
    ServerConfig, Tool, ToolAnnotations,
};
// Logging is deprecated (SEP-2577) but older clients and the conformance suite still set it.
#[allow(deprecated)]
use rmcp::model::SetLevelRequestParams;
use rmcp::service::RequestContext;
use rmcp::{ErrorData, RoleServer, ServerHandler};
use serde_json::Value;
use toolgate_core::registry::Tool as RegistryTool;
use toolgate_core::why::{PurposeSource, Split, Why};
use toolgate_core::{Effect, Registry, RunId};
use toolgate_store::{CallStatus, DirectCall, Executor, Store};
use tracing::Instrument;

use crate::auth::Caller;
use crate::meta::CallContext;
use crate::render;
use crate::upstream::Upstreams;

/// One loaded registry version and the executor that decides under it. A reload builds a new
/// one and swaps it in whole; a request takes one snapshot and keeps it to the end, so a call
/// in flight finishes under the version it started with.
pub struct Surface {
    pub registry: Arc<Registry>,
    pub executor: Executor,
}

/// What every connection shares. The registry is read through [`GatewayState::registry`] (or
/// [`GatewayState::surface`] for a consistent registry + executor pair), never cached across
/// requests: `toolgate serve` swaps it on reload.
pub struct GatewayState {
    live: ArcSwap<Surface>,
    /// The store: one for the process, whatever the registry version.
    pub store: Store,
    pub upstreams: Arc<Upstreams>,
    /// Connected clients to tell when the tool surface may have changed (a reload).
    listeners: std::sync::Mutex<Vec<rmcp::service::Peer<RoleServer>>>,
    /// Counts registry swaps, for what follows the serving version (the in-process worker).
    swaps: tokio::sync::watch::Sender<u64>,
}

impl GatewayState {
    pub fn new(executor: Executor, upstreams: Arc<Upstreams>) -> Self {
        GatewayState {
            store: executor.store.clone(),
            live: ArcSwap::from_pointee(Surface {
                registry: executor.registry.clone(),
                executor,
            }),
            upstreams,
            listeners: Default::default(),
            swaps: tokio::sync::watch::Sender::new(0),
        }
    }

    /// Changes each time [`GatewayState::swap_registry`] puts a version in service.
    pub fn watch_swaps(&self) -> tokio::sync::watch::Receiver<u64> {
        self.swaps.subscribe()
    }

    /// Remembers a connected client, to send it `notifications/tools/list_changed`.
    pub fn listen(&self, peer: rmcp::service::Peer<RoleServer>) {
        let mut l = self.listeners.lock().expect("listeners");
        l.retain(|p| !p.is_transport_closed());
        l.push(peer);
    }

    /// Sends `notifications/tools/list_changed` to every connected client (after a reload: what
    /// a role may list can have changed). Clients that left are forgotten.
    pub fn tools_changed(&self) {
        let peers = {
            let mut l = self.listeners.lock().expect("listeners");
            l.retain(|p| !p.is_transport_closed());
            l.clone()
        };
        for p in peers {
            tokio::spawn(async move {
                if let Err(e) = p.notify_tool_list_changed().await {
                    tracing::debug!(error = %e, "a client was not told that tools/list changed");
                }
            });
        }
    }

    /// The current registry version and its executor, as one snapshot.
    pub fn surface(&self) -> Arc<Surface> {
        self.live.load_full()
    }

    /// The current registry.
    pub fn registry(&self) -> Arc<Registry> {
        self.live.load().registry.clone()
    }

    /// The executor deciding under the current registry.
    pub fn executor(&self) -> Executor {
        self.live.load().executor.clone()
    }

    /// Puts `registry` in service: later requests decide under it; requests that took a
    /// snapshot before keep theirs. Returns the version it replaced.
    pub fn swap_registry(&self, registry: Arc<Registry>) -> Arc<Surface> {
        let executor = Executor {
            registry: registry.clone(),
            ..self.executor()
        };
        let old = self.live.swap(Arc::new(Surface { registry, executor }));
        self.swaps.send_modify(|n| *n += 1);
        old
    }
}

/// One MCP server instance: one per HTTP session (or per stateless request), or the single
/// stdio connection. It holds nothing a call depends on: who calls comes from the request's
/// credential, and the run, the key and any approval from the store, so a retry on another
/// session, after a reconnect or from a stateless client is the same call.
#[derive(Clone)]
pub struct GatewayServer {
    state: Arc<GatewayState>,
    /// The stdio caller, fixed at start. Over HTTP the caller comes from each request.
    fixed: Option<Caller>,
}

/// MCP annotations from the registry's effect class and handler (never from the upstream):
/// read → read-only; write → not destructive, idempotent when identity fields derive its key;
/// irreversible → destructive; open world when an upstream system does the work.
pub fn derive_annotations(tool: &RegistryTool) -> ToolAnnotations {
    let cfg = &tool.config;
    let open = tool.handler().is_upstream();
    let a = ToolAnnotations::new().open_world(open);
    match cfg.effect {
        Effect::Read => a.read_only(true),
        Effect::Write => a
            .read_only(false)
            .destructive(false)
            .idempotent(!cfg.identity.is_empty()),
        Effect::Irreversible => a
            .read_only(false)
            .destructive(true)
            .idempotent(!cfg.identity.is_empty()),
    }
}

/// The MCP definition of a registry tool: its name, description and input schema exactly as
/// declared, its output schema if declared, and derived annotations.
pub fn mcp_tool(tool: &RegistryTool) -> Tool {
    mcp_tool_with(tool, &tool.config.input_schema)
}

/// As [`mcp_tool`], listed with `schema` (the declared one with the governance arguments this
/// caller is asked for; see `Registry::listed_schema`).
pub fn mcp_tool_with(tool: &RegistryTool, schema: &Value) -> Tool {
    let cfg = &tool.config;
    let schema: JsonObject = match schema {
        Value::Object(m) => m.clone(),
        _ => JsonObject::new(),
    };
    let mut t = Tool::new(cfg.name.clone(), cfg.description.clone(), Arc::new(schema))
        .annotate(derive_annotations(tool));
    if let Some(Value::Object(out)) = &cfg.output_schema {
        t = t.with_raw_output_schema(Arc::new(out.clone()));
    }
    t
}

impl GatewayServer {
    pub fn new(state: Arc<GatewayState>, fixed: Option<Caller>) -> Self {
        GatewayServer { state, fixed }
    }

    /// What every connection shares.
    pub(crate) fn state(&self) -> &Arc<GatewayState> {
        &self.state
    }

    /// Who makes this request, and the one registry version it is served under: over HTTP, the
    /// snapshot its credential was resolved against (`auth::require_caller`); for the fixed
    /// stdio caller, the version serving as the request comes in.
    fn request(
        &self,
        context: &RequestContext<RoleServer>,
    ) -> Result<(Caller, Arc<Surface>), ErrorData> {
        if let Some(c) = &self.fixed {
            return Ok((c.clone(), self.state.surface()));
        }
        let parts = context.extensions.get::<axum::http::request::Parts>();
        let caller = parts.and_then(|p| p.extensions.get::<Caller>()).cloned();
        let surface = parts
            .and_then(|p| p.extensions.get::<Arc<Surface>>())
            .cloned();
        match (caller, surface) {
            (Some(caller), Some(surface)) => Ok((caller, surface)),
            // The HTTP boundary refuses unauthenticated requests before they get here.
            _ => Err(ErrorData::invalid_request(
                "no authenticated caller for this request",
                None,
            )),
        }
    }

    /// One governed `tools/call` under `surface`, the one registry version the whole call
    /// keeps, however long it takes: a reload in the middle does not mix two versions' rules.
    pub(crate) async fn governed_in(
        &self,
        surface: &Surface,
        caller: &Caller,
        tool: &str,
        arguments: Option<JsonObject>,
        meta: &JsonObject,
    ) -> Result<rmcp::model::CallToolResult, ErrorData> {
        let ctx = CallContext::from_meta(meta);
        let registry = &surface.registry;
        let mut split =
            split_arguments(registry, caller, tool, arguments.unwrap_or_default(), &ctx);
        split.errors.extend(ctx.problems.iter().cloned());
        let run_named = ctx.run_id.is_some();
        // Whether the caller may join the run it names: checked here for a call the built-ins
        // may answer; for any other, by the store, with the read of the run the call makes
        // anyway (`governed_call_joining`), and refused the same way.
        let (run_id, joining) = match ctx.run_id {
            Some(run) if !crate::builtins::may_intercept(registry, caller, tool) => {
                let reviewer = registry.reviews_plans(&caller.role);
                (RunId::new(run), Some((reviewer, split.clone())))
            }
            named => match self.run_in(surface, caller, named).await? {
                Ok(run) => (run, None),
                Err(named) => {
                    return crate::builtins::foreign_run(surface, caller, tool, &split, &named)
                        .await;
                }
            },
        };
        let call = DirectCall {
            principal: caller.principal.as_str().into(),
            tool: tool.to_string(),
            inputs: split.inputs,
            run_id,
            purpose: split.why.purpose,
            reason: split.why.reason,
            purpose_from: split.why.purpose_from,
            argument_errors: split.errors,
            evidence: ctx.evidence,
            approvals: ctx.approvals,
            actor: ctx.actor,
        };
        let started = std::time::Instant::now();
        let started_at = std::time::SystemTime::now();
        if let Some(answer) = crate::builtins::intercept(surface, &call, run_named).await {
            return answer;
        }
        crate::pins::freshen(&self.state, registry, caller, &call).await;
        let executor = crate::builtins::executor_for(surface, tool);
        let unrecorded = |e: toolgate_store::StoreError| {
            tracing::error!(error = %e, "a governed call could not be recorded");
            ErrorData::internal_error(
                format!(
                    "toolgate could not record this call, so its outcome is not confirmed: {e}"
                ),
                None,
            )
        };
        // Only a call that replays holds an idempotency key another attempt can find running;
        // any other call is not kept for a second pass.
        let again = registry
            .tool(tool)
            .is_some_and(toolgate_core::why::replays)
            .then(|| call.clone());
        let mut result = match joining {
            None => executor.governed_call(call).await.map_err(unrecorded)?,
            Some((reviewer, split)) => {
                let run = call.run_id.clone();
                match executor
                    .governed_call_joining(call, reviewer)
                    .await
                    .map_err(unrecorded)?
                {
                    Some(result) => result,
                    None => {
                        return crate::builtins::foreign_run(surface, caller, tool, &split, &run)
                            .await;
                    }
                }
            }
        };
        // A retry that found an earlier attempt of its operation still running (a client that
        // retried after a reconnect): wait for that attempt, then go through the gate again,
        // which replays its outcome (or retries it, if it failed in a way that may be retried).
        if let (CallStatus::InProgress, Some(step), Some(call)) =
            (result.status, result.step_id.as_ref(), again)
        {
            let within = executor.store.config().attempt_lease();
            let settled = executor.store.step_when_settled(step, within).await;
            if settled.is_ok_and(|s| s.status != toolgate_core::StepStatus::Running) {
                result = executor.governed_call(call).await.map_err(unrecorded)?;
            }
        }
        let record = |span: &crate::otlp::CallSpan| {
            crate::otlp::record_call(tool, caller, &result, started_at, span)
        };
        if crate::relay::with_span(record).is_none() {
            record(&crate::otlp::CallSpan::start(meta));
        }
        for c in &result.decision.checks {
            tracing::debug!(check = %c.name, outcome = ?c.outcome, rule = c.rule.as_deref().unwrap_or(""), detail = %c.detail, "check");
        }
        tracing::info!(
            status = ?result.status,
            rule = result.decision.rule().unwrap_or(""),
            audit_seq = result.audit_seq,
            micros = started.elapsed().as_micros() as u64,
            "governed call"
        );
        render::call_result(tool, &result)
    }
}

impl GatewayServer {
    /// The run a call belongs to, under the snapshot its request holds: the one `_meta.run_id`
    /// names, if the caller may use it (`Err` with the name when it is another principal's), or
    /// the caller's current run.
    pub(crate) async fn run_in(
        &self,
        surface: &Surface,
        caller: &Caller,
        named: Option<String>,
    ) -> Result<Result<RunId, RunId>, ErrorData> {
        let store = &self.state.store;
        let unrecorded = |e: toolgate_store::StoreError| {
            ErrorData::internal_error(
                format!("toolgate could not read this call's run, so nothing was done: {e}"),
                None,
            )
        };
        match named {
            Some(run) => {
                let run = RunId::new(run);
                let ok = store
                    .may_join_run(
                        &run,
                        &caller.principal,
                        surface.registry.reviews_plans(&caller.role),
                    )
                    .await
                    .map_err(unrecorded)?;
                Ok(if ok { Ok(run) } else { Err(run) })
            }
            None => {
                let idle = surface.registry.gateway.runs.idle_minutes;
                let now = toolgate_core::Clock::now(surface.executor.clock.as_ref());
                store
                    .current_run(
                        &caller.principal,
                        now,
                        std::time::Duration::from_secs(u64::from(idle) * 60),
                    )
                    .await
                    .map(Ok)
                    .map_err(unrecorded)
            }
        }
    }
}

/// A call's arguments split into the tool's inputs and its purpose and reason (from `_meta`,
/// the arguments the tool lists, or the caller's defaults). A tool the caller may not use is
/// left whole: it is refused as unknown whatever its arguments.
pub(crate) fn split_arguments(
    registry: &Registry,
    caller: &Caller,
    tool: &str,
    arguments: JsonObject,
    ctx: &CallContext,
) -> Split {
    match (registry.principal(&caller.principal), registry.tool(tool)) {
        (Some(p), Some(t)) if t.is_listed_for(p.role()) => registry.split_call(
            p,
            caller.credential_id.as_deref(),
            t,
            arguments,
            ctx.purpose.as_deref(),
            ctx.reason.as_deref(),
        ),
        _ => Split {
            inputs: Value::Object(arguments),
            why: Why {
                purpose: ctx.purpose.clone(),
                purpose_from: ctx.purpose.as_ref().map(|_| PurposeSource::Meta),
                reason: ctx.reason.clone(),
                reason_from: None,
            },
            errors: Vec::new(),
        },
    }
}

#[allow(deprecated)]
impl ServerHandler for GatewayServer {
    fn get_info(&self) -> ServerConfig {
        let mut capabilities = ServerCapabilities::builder()
            .enable_tools()
            .enable_tool_list_changed()
            .enable_logging()
            .build();
        // Prompts and resources only when the registry lets some through (passthrough.rs).
        let (prompts, resources) = crate::passthrough::declared(&self.state.registry());
        if prompts {
            capabilities.prompts = Some(Default::default());
        }
        if resources {
            capabilities.resources = Some(Default::default());
        }
        ServerConfig::new(capabilities)
            .with_server_info(Implementation::new("toolgate", env!("CARGO_PKG_VERSION")))
            .with_instructions(
                "toolgate governs every tool call. Fill in each tool's arguments as its schema \
                 asks, including `purpose` and `reason` where a tool lists them (they are recorded \
                 and checked). A refusal comes back as a result with isError: true that says what \
                 to change. A call that needs a person's approval says so; retry the same call \
                 later and it runs once approved. Clients may also send `purpose`, `reason`, \
                 `run_id` and `evidence` in _meta.",
            )
    }

    async fn on_initialized(&self, context: rmcp::service::NotificationContext<RoleServer>) {
        // Told when a reload changes the registry (see `GatewayState::tools_changed`).
        self.state.listen(context.peer);
    }

    async fn set_level(
        &self,
        request: SetLevelRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<(), ErrorData> {
        // Accepted and noted; toolgate sends no log notifications of its own yet, and upstream
        // log messages are not relayed (see tests/conformance/exclusions.txt).
        let (caller, _) = self.request(&context)?;
        tracing::debug!(principal = %caller.principal, level = ?request.level, "logging/setLevel");
        Ok(())
    }

    async fn list_tools(
        &self,
        _request: Option<PaginatedRequestParams>,
        context: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, ErrorData> {
        let (caller, surface) = self.request(&context)?;
        crate::pins::refresh(&self.state).await;
        let registry = &surface.registry;
        let principal = registry.principal(&caller.principal);
        let tools: Vec<Tool> = registry
            .tools_for_role(&caller.role)
            .filter(|t| crate::pins::listed(&self.state, t))
            .flat_map(|t| {
                let schema = match principal {
                    Some(p) => registry.listed_schema(p, caller.credential_id.as_deref(), t),
                    None => t.config.input_schema.clone(),
                };
                crate::preview::listed(t, &schema)
            })
            .collect();
        tracing::debug!(principal = %caller.principal, role = %caller.role, tools = tools.len(), "tools/list");
        Ok(ListToolsResult::with_all_items(tools).with_cache_scope(CacheScope::Private))
    }

    async fn list_prompts(
        &self,
        _request: Option<PaginatedRequestParams>,
        context: RequestContext<RoleServer>,
    ) -> Result<ListPromptsResult, ErrorData> {
        let (caller, surface) = self.request(&context)?;
        crate::passthrough::list_prompts(&surface.registry, &self.state.upstreams, &caller).await
    }

    async fn get_prompt(
        &self,
        request: GetPromptRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<GetPromptResponse, ErrorData> {
        let (caller, surface) = self.request(&context)?;
        crate::passthrough::get_prompt(&surface.registry, &self.state.upstreams, &caller, request)
            .await
            .map(Into::into)
    }

    async fn list_resources(
        &self,
        _request: Option<PaginatedRequestParams>,
        context: RequestContext<RoleServer>,
    ) -> Result<ListResourcesResult, ErrorData> {
        let (caller, surface) = self.request(&context)?;
        crate::passthrough::list_resources(&surface.registry, &self.state.upstreams, &caller).await
    }

    async fn read_resource(
        &self,
        request: ReadResourceRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<ReadResourceResponse, ErrorData> {
        let (caller, surface) = self.request(&context)?;
        crate::passthrough::read_resource(
            &surface.registry,
            &self.state.upstreams,
            &caller,
            request,
        )
        .await
        .map(Into::into)
    }

    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, ErrorData> {
        let (caller, surface) = self.request(&context)?;
        let mut meta = context.meta.0.0.clone();
        if let Some(m) = &request.meta {
            for (k, v) in &m.0.0 {
                meta.insert(k.clone(), v.clone());
            }
        }
        // Progress an upstream reports goes back to this client under its token.
        let progress = context
            .meta
            .get_progress_token()
            .or_else(|| request.meta.as_ref()?.get_progress_token())
            .map(|token| crate::relay::ProgressRecipient {
                to: crate::relay::ProgressSink::Peer(context.peer.clone()),
                token,
            });
        let result = self.call(caller, surface, request, meta, progress).await?;
        Ok(result.into())
    }
}

impl GatewayServer {
    /// One `tools/call` for `caller` under `surface`, the registry version taken when the request
    /// came in: routed (preview, commit or plain call) and decided under it, whatever is reloaded
    /// meanwhile. For callers that hold a snapshot of their own (tests, embedders).
    pub async fn call_under(
        &self,
        surface: Arc<Surface>,
        caller: Caller,
        request: CallToolRequestParams,
        meta: JsonObject,
    ) -> Result<rmcp::model::CallToolResult, ErrorData> {
        self.call(caller, surface, request, meta, None).await
    }

    /// One `tools/call` for `caller` under `surface`: a preview step or a governed call, every
    /// phase under that one registry version. `meta` is the request's `_meta`; `progress`, the
    /// client waiting for progress, if it asked. Boxed: the governed call's future is large, and
    /// rmcp and the lean path both move it into a task.
    pub(crate) fn call(
        &self,
        caller: Caller,
        surface: Arc<Surface>,
        request: CallToolRequestParams,
        meta: JsonObject,
        progress: Option<crate::relay::ProgressRecipient>,
    ) -> std::pin::Pin<
        Box<
            dyn std::future::Future<Output = Result<rmcp::model::CallToolResult, ErrorData>>
                + Send
                + '_,
        >,
    > {
        Box::pin(async move {
            let tool = request.name.to_string();
            let span = tracing::info_span!("tools/call", tool = %tool, principal = %caller.principal, role = %caller.role);
            // For the upstream call this may lead to (a preview commit's too): progress and the
            // trace context of this request.
            let forward = crate::relay::Forward {
                progress,
                span: crate::otlp::CallSpan::start(&meta),
            };
            let call = async {
                match crate::preview::route(&surface.registry, &caller.role, &tool) {
                    Some(route) => {
                        let args = request.arguments;
                        crate::preview::handle(self, &surface, &caller, route, args, &meta).await
                    }
                    None => {
                        self.governed_in(&surface, &caller, &tool, request.arguments, &meta)
                            .await
                    }
                }
            };
            crate::relay::scope(forward, call).instrument(span).await
        })
    }
}
