//! What travels from a `tools/call` to the upstream call it leads to: the caller waiting for
//! progress, and the call's trace span (see [`crate::otlp`]). Both are set once per request, as
//! a task-local value ([`scope`]), around the governed call and the preview commit alike: the
//! executor calls the handler on the task that serves the request.
//!
//! Progress an upstream reports during a forwarded call is passed on to the client that made it.
//! One connection to an upstream carries every caller's calls, so a progress notification is
//! routed by its token alone: a forwarded call whose caller asked for progress carries a fresh
//! token (rmcp's client gives every request one), mapped back to the caller's session and token
//! until the call returns. The token is known only once the request is out, so an upstream
//! that reports progress at once can answer before the route is open: such progress is kept
//! for a moment (two seconds, a bounded number, forgotten on reconnection, when tokens start
//! again) and handed to the route when it opens. Nothing else reaches a caller. Log messages
//! (`notifications/message`) name no call, so on a shared connection they could reach another
//! principal; they are not relayed.

use std::collections::HashMap;
use std::future::Future;
use std::sync::Mutex;
use std::time::{Duration, Instant};

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

/// How long progress for a token with no open route is kept for that route.
const EARLY_FOR: Duration = Duration::from_secs(2);
/// The most such notifications kept at once (an upstream could send any number).
const EARLY_MOST: usize = 256;

/// The progress routes of one upstream.
#[derive(Default)]
pub struct Routes {
    state: Mutex<RouteState>,
}

#[derive(Default)]
struct RouteState {
    open: HashMap<ProgressToken, Caller>,
    /// Progress that arrived before its route opened, with when it arrived.
    early: Vec<(Instant, ProgressNotificationParam)>,
}

/// Removes its route when the forwarded call returns (or is dropped).
pub struct Route<'a> {
    routes: &'a Routes,
    token: ProgressToken,
}

impl Drop for Route<'_> {
    fn drop(&mut self) {
        self.routes
            .state
            .lock()
            .expect("routes")
            .open
            .remove(&self.token);
    }
}

impl Routes {
    /// Routes progress under `token` (the forwarded request's) to the caller of the call on
    /// this task, if it asked for progress, while the returned guard lives; progress that came
    /// under `token` before is passed on first.
    pub async fn open(&self, token: ProgressToken) -> Option<Route<'_>> {
        let caller = FORWARD.try_with(|f| f.progress.clone()).ok().flatten();
        let early: Vec<ProgressNotificationParam> = {
            let mut state = self.state.lock().expect("routes");
            let mut mine = Vec::new();
            state.early.retain(|(at, p)| {
                if p.progress_token != token {
                    return at.elapsed() < EARLY_FOR;
                }
                if at.elapsed() < EARLY_FOR {
                    mine.push(p.clone());
                }
                false
            });
            if let Some(c) = &caller {
                state.open.insert(token.clone(), c.clone());
            }
            mine
        };
        let caller = caller?;
        for progress in early {
            tell(&caller, progress).await;
        }
        Some(Route {
            routes: self,
            token,
        })
    }

    /// Forgets progress kept for routes not yet open: on a new connection tokens start again.
    pub fn reconnected(&self) {
        self.state.lock().expect("routes").early.clear();
    }

    /// Passes an upstream's progress notification on to the caller its token belongs to, or
    /// keeps it a moment for a route about to open.
    pub async fn forward(&self, progress: ProgressNotificationParam) {
        let caller = {
            let mut state = self.state.lock().expect("routes");
            let caller = state.open.get(&progress.progress_token).cloned();
            if caller.is_none() {
                state.early.retain(|(at, _)| at.elapsed() < EARLY_FOR);
                if state.early.len() < EARLY_MOST {
                    tracing::debug!(token = ?progress.progress_token, "upstream progress before its route opened; kept");
                    state.early.push((Instant::now(), progress.clone()));
                } else {
                    tracing::debug!(token = ?progress.progress_token, "upstream progress for no open call; dropped");
                }
            }
            caller
        };
        if let Some(caller) = caller {
            tell(&caller, progress).await;
        }
    }
}

/// Passes `progress` to `caller` under the caller's own token.
async fn tell(caller: &Caller, mut progress: ProgressNotificationParam) {
    progress.progress_token = caller.token.clone();
    if let Err(e) = caller.peer.notify_progress(progress).await {
        tracing::debug!(error = %e, "a client was not told of its call's progress");
    }
}
