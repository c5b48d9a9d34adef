//! The HTTP face: the MCP endpoint (`/mcp`, streamable HTTP) behind the credential middleware,
//! the approver's page (`/approvals`) and `/metrics`,
//! health (`/healthz`: the process answers) and readiness (`/readyz`: the store answers and
//! every upstream is connected and serves something it pinned), and the OAuth protected-resource metadata document the MCP
//! authorization spec asks for (RFC 9728).

use std::sync::Arc;

use axum::Json;
use axum::Router;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::IntoResponse;
use axum::routing::get;
use rmcp::transport::streamable_http_server::session::local::LocalSessionManager;
use rmcp::transport::{StreamableHttpServerConfig, StreamableHttpService};
use serde_json::json;
use tokio_util::sync::CancellationToken;

use crate::auth::{Admission, Authenticator, require_caller};
use crate::server::{GatewayServer, GatewayState};
use crate::sessions::SessionOwners;

/// What the HTTP routes need.
#[derive(Clone)]
pub struct HttpState {
    pub gateway: Arc<GatewayState>,
    pub auth: Arc<Authenticator>,
    /// The resource identifier (the MCP endpoint's public URL).
    pub resource: String,
    pub authorization_servers: Vec<String>,
    /// Which keys are development keys (`--dev`), reported by `/readyz`.
    pub keys: crate::keys::KeyStatus,
}

/// The router: `/mcp`, `/healthz`, `/readyz`, `/.well-known/oauth-protected-resource[/mcp]`.
/// `allowed_hosts` are the `Host` values accepted on `/mcp` (DNS-rebinding protection).
pub fn router(state: HttpState, allowed_hosts: Vec<String>, shutdown: CancellationToken) -> Router {
    let gateway = state.gateway.clone();
    // A reply that is one message goes back as plain JSON, not as an event stream of one
    // event (rmcp still streams when the handler sends progress or a request first): 50–100 µs
    // less per call at one call at a time.
    let hosts: Arc<[String]> = allowed_hosts.clone().into();
    let config = StreamableHttpServerConfig::default()
        .with_allowed_hosts(allowed_hosts)
        .with_json_response(true);
    let sessions = Arc::new(LocalSessionManager::default());
    let owners = SessionOwners::new(sessions.clone(), shutdown.clone());
    let lean = Arc::new(crate::lean::Lean {
        server: GatewayServer::new(gateway.clone(), None),
        owners: owners.clone(),
        hosts,
    });
    let mcp = StreamableHttpService::new(
        move || Ok(GatewayServer::new(gateway.clone(), None)),
        sessions,
        config.with_cancellation_token(shutdown),
    );
    // The credential check runs first (the outer layer; it takes the registry snapshot the
    // request is resolved against and served under), then the session's owner is checked,
    // then a plain `tools/call` on a live session is answered without rmcp (lean.rs).
    let mcp = Router::new()
        .nest_service("/mcp", mcp)
        .layer(axum::middleware::from_fn_with_state(
            lean,
            crate::lean::tools_call,
        ))
        .layer(axum::middleware::from_fn_with_state(
            owners,
            crate::sessions::bind,
        ))
        .layer(axum::middleware::from_fn_with_state(
            Admission {
                auth: state.auth.clone(),
                gateway: state.gateway.clone(),
            },
            require_caller,
        ));
    // The approver's page and the surface numbers, in the same process (its own sign-in:
    // people with an approver role, session cookies, CSRF on every form).
    let registry = state.gateway.registry();
    let ontology = registry.gateway.ontology.as_ref().and_then(|file| {
        match toolgate_ontology::Ontology::load(registry.dir.join(file)) {
            Ok(o) => Some(Arc::new(o)),
            Err(e) => {
                tracing::warn!(error = %e, "the ontology does not load; evidence links show bare ids");
                None
            }
        }
    });
    let console = toolgate_console::ConsoleState::new(
        state.gateway.executor(),
        toolgate_console::ConsoleOptions {
            base: "/approvals".into(),
            ontology,
            // Approvals decided and run on the page follow hot reloads.
            live: Some({
                let gw = state.gateway.clone();
                Arc::new(move || gw.executor())
            }),
            metrics: toolgate_console::MetricsOptions::from_config(
                &registry.gateway.metrics,
                &registry.dir,
            ),
            ..Default::default()
        },
    );
    Router::new()
        .route("/healthz", get(|| async { "ok\n" }))
        .route("/readyz", get(ready))
        .route(
            "/.well-known/oauth-protected-resource",
            get(resource_metadata),
        )
        .route(
            "/.well-known/oauth-protected-resource/mcp",
            get(resource_metadata),
        )
        .with_state(state)
        .nest("/approvals", toolgate_console::router(console.clone()))
        .merge(toolgate_console::metrics_router(console))
        .merge(mcp)
        // nosniff, no framing and a CSP on every reply, /mcp's and the fallback's included.
        .layer(axum::middleware::map_response(
            toolgate_console::headers::secure,
        ))
}

async fn ready(State(s): State<HttpState>) -> impl IntoResponse {
    let store_ok = s.gateway.store.status_counts().await.is_ok();
    let down = s.gateway.upstreams.disconnected();
    // A lock approved since the last check counts (one small file read when nothing changed).
    s.gateway.upstreams.refresh_pins().await;
    // An upstream that answers but of which nothing is served (never pinned, or blocked by
    // the lock) is not ready either: calls to its tools would all be refused.
    let idle = s.gateway.upstreams.not_serving();
    let ok = store_ok && down.is_empty() && idle.is_empty();
    let not_serving: Vec<_> = idle
        .iter()
        .map(|(name, why)| json!({"upstream": name, "why": why}))
        .collect();
    let body = json!({
        "ready": ok,
        "store": store_ok,
        "upstreams_down": down,
        "upstreams_not_serving": not_serving,
        "keys": s.keys.to_json(),
    });
    let code = if ok {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    };
    (code, Json(body))
}

async fn resource_metadata(State(s): State<HttpState>) -> impl IntoResponse {
    Json(json!({
        "resource": s.resource,
        "authorization_servers": s.authorization_servers,
        "bearer_methods_supported": ["header"],
        "resource_name": "toolgate",
    }))
}
