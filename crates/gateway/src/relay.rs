//! What travels from a `tools/call` to the upstream call it leads to: the caller waiting for
//! progress, and the call's trace span (see [`crate::otlp`]). Both are set once per request, as
//! a task-local value ([`scope`]), around the governed call and the preview commit alike: the
//! executor calls the handler on the task that serves the request.
//!
//! Progress an upstream reports during a forwarded call is passed on to the client that made it.
//! One connection to an upstream carries every caller's calls, so a progress notification is
//! routed by its token alone: a forwarded call whose caller asked for progress carries a fresh
//! token (rmcp's client gives every request one), mapped back to the caller's session and token
//! until the call returns. Nothing else reaches the caller: a token with no open call is
//! dropped, which includes progress sent in the microseconds between the request leaving and
//! its route being opened (the token is known only once the request is out). Log messages
//! (`notifications/message`) name no call, so on a shared connection they could reach another
//! principal; they are not relayed.

use std::collections::HashMap;
use std::future::Future;
use std::sync::Mutex;

use rmcp::RoleServer;
use rmcp::model::{ProgressNotificationParam, ProgressToken};
use rmcp::service::Peer;

use crate::otlp::CallSpan;

tokio::task_local! {
    static FORWARD: Forward;
}

/// What one `tools/call` hands on to the upstream call it leads to.
pub struct Forward {
    /// The caller, when it asked for progress.
    pub progress: Option<Caller>,
    pub span: CallSpan,
}

/// Who to tell about a call's progress: the client's session and the token it chose.
#[derive(Clone)]
pub struct Caller {
    pub peer: Peer<RoleServer>,
    pub token: ProgressToken,
}

/// Runs `fut` (one `tools/call`) with `forward` for the upstream call it may lead to.
pub async fn scope<F: Future>(forward: Forward, fut: F) -> F::Output {
    FORWARD.scope(forward, fut).await
}

/// Whether the call on this task has a caller waiting for progress.
pub fn wanted() -> bool {
    FORWARD.try_with(|f| f.progress.is_some()).unwrap_or(false)
}

/// The `traceparent` the upstream call on this task carries, if any.
pub fn traceparent() -> Option<String> {
    FORWARD.try_with(|f| f.span.outgoing()).ok().flatten()
}

/// Runs `f` with the trace span of the call on this task, if there is one.
pub fn with_span<R>(f: impl FnOnce(&CallSpan) -> R) -> Option<R> {
    FORWARD.try_with(|fw| f(&fw.span)).ok()
}

/// The progress routes of one upstream connection.
#[derive(Default)]
pub struct Routes {
    open: Mutex<HashMap<ProgressToken, Caller>>,
}

/// Removes its route when the forwarded call returns (or is dropped).
pub struct Route<'a> {
    routes: &'a Routes,
    token: ProgressToken,
}

impl Drop for Route<'_> {
    fn drop(&mut self) {
        self.routes.open.lock().expect("routes").remove(&self.token);
    }
}

impl Routes {
    /// Routes progress under `token` (the forwarded request's) to the caller of the call on
    /// this task, if it asked for progress, while the returned guard lives.
    pub fn open(&self, token: ProgressToken) -> Option<Route<'_>> {
        let caller = FORWARD.try_with(|f| f.progress.clone()).ok().flatten()?;
        self.open
            .lock()
            .expect("routes")
            .insert(token.clone(), caller);
        Some(Route {
            routes: self,
            token,
        })
    }

    /// Passes an upstream's progress notification on to the caller its token belongs to.
    pub async fn forward(&self, mut progress: ProgressNotificationParam) {
        let caller = self
            .open
            .lock()
            .expect("routes")
            .get(&progress.progress_token)
            .cloned();
        let Some(caller) = caller else {
            tracing::debug!(token = ?progress.progress_token, "upstream progress for no open call; dropped");
            return;
        };
        progress.progress_token = caller.token;
        if let Err(e) = caller.peer.notify_progress(progress).await {
            tracing::debug!(error = %e, "a client was not told of its call's progress");
        }
    }
}
