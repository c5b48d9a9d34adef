//! MCP sessions belong to the principal that opened them. rmcp's session manager knows session
//! ids, not who opened them, so another principal holding a valid key of its own could send on
//! someone else's `Mcp-Session-Id` or DELETE it. This middleware, behind the credential check,
//! remembers which principal each session was opened by and answers a request on another
//! principal's session exactly as for a session that does not exist: the id is replaced by one
//! that names no session, and rmcp's own "session not found" goes back. Nothing in the answer
//! tells whether the session exists.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::extract::{Request, State};
use axum::http::{HeaderValue, Method};
use axum::middleware::Next;
use axum::response::Response;
use rmcp::transport::streamable_http_server::session::SessionManager;
use rmcp::transport::streamable_http_server::session::local::LocalSessionManager;
use tokio_util::sync::CancellationToken;
use toolgate_core::PrincipalId;

use crate::auth::Caller;

const HEADER: &str = "mcp-session-id";

/// Which principal opened each live session.
pub struct SessionOwners {
    owners: Mutex<HashMap<String, PrincipalId>>,
    manager: Arc<LocalSessionManager>,
}

impl SessionOwners {
    /// Owners of the sessions `manager` keeps; forgets sessions it no longer has, every
    /// minute, until `shutdown`.
    pub fn new(manager: Arc<LocalSessionManager>, shutdown: CancellationToken) -> Arc<Self> {
        let owners = Arc::new(SessionOwners {
            owners: Mutex::default(),
            manager,
        });
        let weak = Arc::downgrade(&owners);
        tokio::spawn(async move {
            loop {
                tokio::select! {
                    _ = shutdown.cancelled() => return,
                    _ = tokio::time::sleep(Duration::from_secs(60)) => {}
                }
                let Some(owners) = weak.upgrade() else { return };
                owners.forget_closed().await;
            }
        });
        owners
    }

    fn owner(&self, session: &str) -> Option<PrincipalId> {
        self.owners.lock().expect("owners").get(session).cloned()
    }

    async fn forget_closed(&self) {
        let ids: Vec<String> = self
            .owners
            .lock()
            .expect("owners")
            .keys()
            .cloned()
            .collect();
        for id in ids {
            let live = self
                .manager
                .has_session(&id.as_str().into())
                .await
                .unwrap_or(false);
            if !live {
                self.owners.lock().expect("owners").remove(&id);
            }
        }
    }

    /// Whether `session` is open and was opened by `principal`.
    pub(crate) async fn is_live(&self, session: &str, principal: &PrincipalId) -> bool {
        self.owner(session).is_some_and(|owner| &owner == principal)
            && self
                .manager
                .has_session(&session.into())
                .await
                .unwrap_or(false)
    }

    /// How many sessions are remembered (for tests).
    pub fn len(&self) -> usize {
        self.owners.lock().expect("owners").len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// axum middleware on `/mcp`, inside the credential check.
pub async fn bind(
    State(owners): State<Arc<SessionOwners>>,
    mut req: Request,
    next: Next,
) -> Response {
    let principal = req
        .extensions()
        .get::<Caller>()
        .map(|c| c.principal.clone());
    let session = req
        .headers()
        .get(HEADER)
        .and_then(|v| v.to_str().ok())
        .map(str::to_string);
    let deleting = req.method() == Method::DELETE;
    if let (Some(id), Some(who)) = (&session, &principal)
        && owners.owner(id).is_some_and(|owner| &owner != who)
    {
        tracing::warn!(principal = %who, "a request named another principal's MCP session; answered as unknown");
        let nowhere = format!("none-{}", uuid::Uuid::new_v4().simple());
        req.headers_mut().insert(
            HEADER,
            HeaderValue::from_str(&nowhere).expect("a hex id is a header value"),
        );
        return next.run(req).await;
    }
    let resp = next.run(req).await;
    match (&session, &principal) {
        (None, Some(who)) => {
            if let Some(id) = resp.headers().get(HEADER).and_then(|v| v.to_str().ok()) {
                owners
                    .owners
                    .lock()
                    .expect("owners")
                    .insert(id.to_string(), who.clone());
            }
        }
        (Some(id), Some(_)) if deleting && resp.status().is_success() => {
            owners.owners.lock().expect("owners").remove(id);
        }
        _ => {}
    }
    resp
}
