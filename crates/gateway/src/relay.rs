//! What travels from a `tools/call` to the upstream call it leads to: the caller waiting for
//! progress, and the call's trace span (see [`crate::otlp`]). Both are set once per request, as
//! a task-local value ([`scope`]), around the governed call and the preview commit alike: the
//! executor calls the handler on the task that serves the request.
//!
//! Progress an upstream reports during a forwarded call is passed on to the client that made it.
//! One connection to an upstream carries every caller's calls, so a progress notification is
//! routed by its token alone: a forwarded call whose caller asked for progress carries a fresh
//! token (rmcp's client gives every request one), mapped back to the caller's session and token
//! until the call returns. Progress is taken from the upstream's transport as it is read
//! ([`Watched`]), so what the upstream sent before its answer reaches the caller before the
//! answer does. The token is known only once the request is out, so an upstream that reports
//! progress at once can answer before the route is open: such progress is kept for a moment
//! (two seconds, a bounded number, forgotten on reconnection, when tokens start again) and
//! handed to the route when it opens. Nothing else reaches a caller. Log messages
//! (`notifications/message`) name no call, so on a shared connection they could reach another
//! principal; they are not relayed.

use std::collections::HashMap;
use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rmcp::model::{JsonRpcMessage, ProgressNotificationParam, ProgressToken, ServerNotification};
use rmcp::service::{Peer, RxJsonRpcMessage, TxJsonRpcMessage};
use rmcp::transport::Transport;
use rmcp::{RoleClient, RoleServer};
use tokio::sync::mpsc;

use crate::otlp::CallSpan;

tokio::task_local! {
    static FORWARD: Forward;
}

/// What one `tools/call` hands on to the upstream call it leads to.
pub struct Forward {
    /// Who hears the call's progress, when the caller asked for it.
    pub progress: Option<ProgressRecipient>,
    pub span: CallSpan,
}

/// Who to tell about a call's progress: where the client hears it and the token it chose.
/// (Not who calls: that is [`crate::auth::Caller`].)
#[derive(Clone)]
pub struct ProgressRecipient {
    pub to: ProgressSink,
    pub token: ProgressToken,
}

/// Where a caller hears progress.
#[derive(Clone)]
pub enum ProgressSink {
    /// The client's rmcp session (a call rmcp's handler serves).
    Peer(Peer<RoleServer>),
    /// The event stream that answers the call on the lean path ([`crate::lean`]).
    Stream(mpsc::UnboundedSender<ProgressNotificationParam>),
    /// The stdout of a stdio client whose call the lean stdio path serves ([`crate::stdio`]).
    Lines(crate::stdio::Lines),
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
    open: HashMap<ProgressToken, mpsc::UnboundedSender<ProgressNotificationParam>>,
    /// Progress that arrived before its route opened, with when it arrived.
    early: Vec<(Instant, ProgressNotificationParam)>,
}

/// One forwarded call's progress, on its way to the caller; the route closes when this is
/// dropped.
pub struct Route<'a> {
    routes: &'a Routes,
    token: ProgressToken,
    recipient: ProgressRecipient,
    progress: mpsc::UnboundedReceiver<ProgressNotificationParam>,
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

impl Route<'_> {
    /// Runs `call` (the forwarded request), passing its progress on to the caller meanwhile,
    /// and before returning, all progress that arrived ahead of the answer: a client drops
    /// progress that comes after its call's result, so none may overtake it.
    pub async fn relay<T>(mut self, call: impl Future<Output = T>) -> T {
        let mut call = std::pin::pin!(call);
        let out = loop {
            tokio::select! {
                biased;
                Some(p) = self.progress.recv() => tell(&self.recipient, p).await,
                out = &mut call => break out,
            }
        };
        // The transport saw everything the upstream sent before its answer, in order, and
        // queued it here before the answer was read.
        while let Ok(p) = self.progress.try_recv() {
            tell(&self.recipient, p).await;
        }
        out
    }
}

impl Routes {
    /// Routes progress under `token` (the forwarded request's) to the caller of the call on
    /// this task, if it asked for progress, while the returned route lives; progress that came
    /// under `token` before it opened goes first.
    pub fn open(&self, token: ProgressToken) -> Option<Route<'_>> {
        let recipient = FORWARD.try_with(|f| f.progress.clone()).ok().flatten();
        let mut state = self.state.lock().expect("routes");
        let (tx, rx) = mpsc::unbounded_channel();
        state.early.retain(|(at, p)| {
            if p.progress_token != token {
                return at.elapsed() < EARLY_FOR;
            }
            if at.elapsed() < EARLY_FOR {
                let _ = tx.send(p.clone());
            }
            false
        });
        let recipient = recipient?;
        state.open.insert(token.clone(), tx);
        Some(Route {
            routes: self,
            token,
            recipient,
            progress: rx,
        })
    }

    /// Forgets progress kept for routes not yet open: on a new connection tokens start again.
    pub fn reconnected(&self) {
        self.state.lock().expect("routes").early.clear();
    }

    /// Takes an upstream's progress notification as the transport reads it, in the order the
    /// upstream sent it: queued for the route its token belongs to, or kept a moment for a
    /// route about to open.
    pub fn arrived(&self, progress: ProgressNotificationParam) {
        let mut state = self.state.lock().expect("routes");
        if let Some(route) = state.open.get(&progress.progress_token) {
            // A route whose call just returned has no receiver; its progress is of no use.
            let _ = route.send(progress);
            return;
        }
        state.early.retain(|(at, _)| at.elapsed() < EARLY_FOR);
        if state.early.len() < EARLY_MOST {
            tracing::debug!(token = ?progress.progress_token, "upstream progress before its route opened; kept");
            state.early.push((Instant::now(), progress));
        } else {
            tracing::debug!(token = ?progress.progress_token, "upstream progress for no open call; dropped");
        }
    }
}

/// An upstream transport that hands progress notifications to [`Routes`] as it reads them.
/// rmcp runs notification handlers as tasks of their own, so a handler could pass on the
/// last progress after the call's answer was already on its way back; read here, progress is
/// queued strictly before the answer that follows it.
pub struct Watched<T> {
    inner: T,
    routes: Arc<Routes>,
}

impl<T> Watched<T> {
    pub fn new(inner: T, routes: Arc<Routes>) -> Self {
        Self { inner, routes }
    }
}

impl<T: Transport<RoleClient>> Transport<RoleClient> for Watched<T> {
    type Error = T::Error;

    fn send(
        &mut self,
        item: TxJsonRpcMessage<RoleClient>,
    ) -> impl Future<Output = Result<(), Self::Error>> + Send + 'static {
        self.inner.send(item)
    }

    async fn receive(&mut self) -> Option<RxJsonRpcMessage<RoleClient>> {
        let message = self.inner.receive().await?;
        if let JsonRpcMessage::Notification(n) = &message
            && let ServerNotification::ProgressNotification(p) = &n.notification
        {
            self.routes.arrived(p.params.clone());
        }
        Some(message)
    }

    fn close(&mut self) -> impl Future<Output = Result<(), Self::Error>> + Send {
        self.inner.close()
    }
}

/// Passes `progress` to `recipient` under the token its client chose.
async fn tell(recipient: &ProgressRecipient, mut progress: ProgressNotificationParam) {
    progress.progress_token = recipient.token.clone();
    match &recipient.to {
        ProgressSink::Peer(peer) => {
            if let Err(e) = peer.notify_progress(progress).await {
                tracing::debug!(error = %e, "a client was not told of its call's progress");
            }
        }
        ProgressSink::Stream(events) => {
            if events.send(progress).is_err() {
                tracing::debug!("a client hung up before hearing of its call's progress");
            }
        }
        ProgressSink::Lines(out) => {
            if let Err(e) = out.progress(progress).await {
                tracing::debug!(error = %e, "a stdio client was not told of its call's progress");
            }
        }
    }
}
