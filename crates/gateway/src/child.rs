//! The lean stdio hop: a governed `tools/call` to an upstream that runs as a child process is
//! written to the child's stdin by the calling task and its answer routed straight back to it,
//! instead of going through rmcp's client (a worker task, channels, and its own serialisation
//! per request). rmcp's client still runs on the same child for everything else: `initialize`,
//! `tools/list`, list-changed notifications, the requests the child makes of its client
//! (answered by rmcp's default client handler), prompts, resources and shutdown. It is the
//! stdio counterpart of the HTTP upstream hop ([`crate::hop`]) and pairs with the lean stdio
//! path on the caller's side ([`crate::stdio`]); the stdio bench measures both (figures in
//! docs/evidence.md).
//!
//! - **One reader, one writer.** [`spawn`] starts the child and gives rmcp an in-process pipe
//!   in place of the child's stdio. One task reads the child's stdout a line at a time: an
//!   answer whose id is one of the lean hop's (strings `tg-N`, which never meet rmcp's numeric
//!   ids) goes to the call waiting for it, progress under one of those ids (the call's progress
//!   token) goes to the caller through [`Routes`] before the answer that follows it, and every
//!   other line goes to rmcp unchanged. Lines to the child (rmcp's and the lean calls') are
//!   written whole under one lock, so they never interleave; a call that stops waiting in the
//!   middle of a write leaves the rest of its line to be written by a task of its own.
//! - **What was delivered.** A call whose line could not be written (the child had exited or
//!   closed its stdin) never reached it ([`HopError::Refused`]); once the line is written, a
//!   child that exits before answering may have run it ([`HopError::Lost`]).
//! - **Cancellation.** A call dropped after its line was written (the per-tool timeout fired)
//!   sends `notifications/cancelled` for its id, as rmcp does for its requests.
//! - **Shutdown** as rmcp's child transport does it: when rmcp closes its side, the child's
//!   stdin is closed, and a child still running after three seconds gets SIGTERM, then after
//!   three more is killed.

use std::collections::HashMap;
use std::future::Future;
use std::io;
use std::pin::Pin;
use std::process::Stdio;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use rmcp::RoleClient;
use rmcp::model::{CallToolResult, ProgressNotificationParam};
use rmcp::service::{RxJsonRpcMessage, TxJsonRpcMessage};
use rmcp::transport::Transport;
use rmcp::transport::async_rw::{AsyncRwTransport, DEFAULT_MAX_LINE_LENGTH};
use serde_json::{Value, json};
use tokio::io::{
    AsyncBufReadExt, AsyncReadExt, AsyncWrite, AsyncWriteExt, BufReader, DuplexStream,
};
use tokio::process::{Child, ChildStdin, ChildStdout};
use tokio::sync::{OwnedMutexGuard, oneshot, watch};

use crate::hop::HopError;
use crate::relay::Routes;

/// The buffer of each in-process pipe between the child and rmcp.
const PIPE: usize = 1 << 20;
/// How long a child is given to exit after its stdin is closed, and again after SIGTERM.
const EXIT_WAIT: Duration = Duration::from_secs(3);

type Stdin = Arc<tokio::sync::Mutex<Option<ChildStdin>>>;

/// One child process's stdio, shared by rmcp's client and the lean hop.
pub struct ChildLink {
    name: String,
    stdin: Stdin,
    calls: Mutex<Calls>,
    routes: Arc<Routes>,
    next_id: AtomicU64,
}

/// The lean calls waiting for their answers.
struct Calls {
    /// False once the child's stdout has ended: nothing more will be answered.
    open: bool,
    waiting: HashMap<Arc<str>, Waiting>,
}

struct Waiting {
    answer: oneshot::Sender<Value>,
    /// Whether the call's progress goes to its caller.
    relay: bool,
}

/// Starts `cmd` as the child of upstream `name`: the link the lean hop calls through, and the
/// transport rmcp's client runs on.
pub fn spawn(
    name: &str,
    mut cmd: tokio::process::Command,
    routes: Arc<Routes>,
) -> io::Result<(Arc<ChildLink>, ChildTransport)> {
    cmd.stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .kill_on_drop(true);
    let mut child = cmd.spawn()?;
    let (Some(stdin), Some(stdout)) = (child.stdin.take(), child.stdout.take()) else {
        return Err(io::Error::other("the child's stdio was not piped"));
    };
    // rmcp reads what `to_rmcp` is given and writes into `from_rmcp`: two pipes, so that rmcp
    // dropping its writer is an end of input here.
    let (rmcp_in, to_rmcp) = tokio::io::duplex(PIPE);
    let (rmcp_out, from_rmcp) = tokio::io::duplex(PIPE);
    let link = Arc::new(ChildLink {
        name: name.to_string(),
        stdin: Arc::new(tokio::sync::Mutex::new(Some(stdin))),
        calls: Mutex::new(Calls {
            open: true,
            waiting: HashMap::new(),
        }),
        routes,
        next_id: AtomicU64::new(1),
    });
    let (exited_tx, exited) = watch::channel(false);
    tokio::spawn(link.clone().read_child(stdout, to_rmcp));
    tokio::spawn(link.clone().write_rmcp(from_rmcp, child, exited_tx));
    let transport = ChildTransport {
        inner: AsyncRwTransport::new_client(rmcp_in, rmcp_out),
        exited,
    };
    Ok((link, transport))
}

/// rmcp's side of the child: the pipes [`spawn`] made; closing it ends the child.
pub struct ChildTransport {
    inner: AsyncRwTransport<RoleClient, DuplexStream, DuplexStream>,
    exited: watch::Receiver<bool>,
}

impl Transport<RoleClient> for ChildTransport {
    type Error = io::Error;

    fn send(
        &mut self,
        item: TxJsonRpcMessage<RoleClient>,
    ) -> impl Future<Output = Result<(), Self::Error>> + Send + 'static {
        self.inner.send(item)
    }

    fn receive(&mut self) -> impl Future<Output = Option<RxJsonRpcMessage<RoleClient>>> + Send {
        self.inner.receive()
    }

    async fn close(&mut self) -> Result<(), Self::Error> {
        self.inner.close().await?;
        // rmcp's writer is gone: the child's stdin is closed, and the child waited for.
        let _ = self.exited.wait_for(|exited| *exited).await;
        Ok(())
    }
}

/// What one line from the child is.
enum FromChild {
    /// The answer to the lean call with this id.
    Answer(Arc<str>, Value),
    /// Progress on the lean call with this id.
    Progress(Arc<str>, ProgressNotificationParam),
    /// About a lean call no longer waiting: dropped.
    Stale,
    /// rmcp's.
    Rmcp,
}

fn lean_id(v: Option<&Value>) -> Option<&str> {
    v.and_then(Value::as_str).filter(|s| s.starts_with("tg-"))
}

fn classify(line: &[u8]) -> FromChild {
    let Ok(message) = serde_json::from_slice::<Value>(line) else {
        return FromChild::Rmcp;
    };
    match message.get("method").and_then(Value::as_str) {
        None => match lean_id(message.get("id")) {
            Some(id) => FromChild::Answer(id.into(), message),
            None => FromChild::Rmcp,
        },
        Some("notifications/progress") if message.get("id").is_none() => {
            let params = message.get("params");
            match lean_id(params.and_then(|p| p.get("progressToken"))) {
                Some(id) => match params
                    .cloned()
                    .map(serde_json::from_value::<ProgressNotificationParam>)
                {
                    Some(Ok(p)) => FromChild::Progress(id.into(), p),
                    _ => FromChild::Stale,
                },
                None => FromChild::Rmcp,
            }
        }
        Some(_) => FromChild::Rmcp,
    }
}

impl ChildLink {
    /// Whether the child's stdout is still open (calls can still be answered).
    pub fn is_open(&self) -> bool {
        self.calls.lock().expect("lean calls").open
    }

    /// A fresh request id, which is also the call's progress token.
    pub fn next_id(&self) -> Arc<str> {
        format!("tg-{}", self.next_id.fetch_add(1, Ordering::Relaxed)).into()
    }

    /// Sends `tools/call` with `params` (whose `_meta.progressToken` the caller set to `id`)
    /// and waits for its answer; its progress goes to [`Routes`] when `relay`.
    pub async fn call(
        self: &Arc<Self>,
        id: Arc<str>,
        params: &Value,
        relay: bool,
    ) -> Result<CallToolResult, HopError> {
        let mut line = Vec::with_capacity(256);
        line.extend_from_slice(br#"{"jsonrpc":"2.0","id":"#);
        serde_json::to_writer(&mut line, &*id).expect("a string serialises");
        line.extend_from_slice(br#","method":"tools/call","params":"#);
        serde_json::to_writer(&mut line, params).expect("a JSON value serialises");
        line.extend_from_slice(b"}\n");
        let (tx, rx) = oneshot::channel();
        {
            let mut calls = self.calls.lock().expect("lean calls");
            if !calls.open {
                return Err(self.not_sent("its process has exited"));
            }
            calls
                .waiting
                .insert(id.clone(), Waiting { answer: tx, relay });
        }
        let mut flight = InFlight {
            link: self.clone(),
            id,
            stage: Stage::Unsent,
        };
        let guard = self.stdin.clone().lock_owned().await;
        flight.stage = Stage::Writing(WholeLine {
            stdin: guard,
            line,
            at: 0,
        });
        let written = std::future::poll_fn(|cx| match &mut flight.stage {
            Stage::Writing(w) => w.poll_write(cx),
            _ => Poll::Ready(Ok(())),
        })
        .await;
        if let Err(e) = written {
            flight.stage = Stage::Done;
            return Err(self.not_sent(&format!("writing to its stdin failed: {e}")));
        }
        // The line is out (and the stdin lock released): from here the child may run it.
        flight.stage = Stage::Sent;
        let answer = rx.await;
        flight.stage = Stage::Done;
        match answer {
            Ok(message) => crate::hop::answer_of(&self.name, message),
            Err(_) => Err(HopError::Lost(format!(
                "upstream '{}' exited during the call (the call may have run)",
                self.name
            ))),
        }
    }

    fn not_sent(&self, why: &str) -> HopError {
        HopError::Refused(format!(
            "could not send the call to upstream '{}': {why}; the call was not delivered",
            self.name
        ))
    }

    fn forget(&self, id: &str) {
        self.calls.lock().expect("lean calls").waiting.remove(id);
    }

    /// Reads the child's stdout: lean answers and progress to their calls, the rest to rmcp.
    async fn read_child(self: Arc<Self>, stdout: ChildStdout, mut to_rmcp: DuplexStream) {
        let mut from = BufReader::with_capacity(64 * 1024, stdout);
        let mut line = Vec::with_capacity(4096);
        // Within a line longer than rmcp's limit: the rest goes to rmcp as it comes.
        let mut oversized = false;
        loop {
            line.clear();
            match (&mut from)
                .take(DEFAULT_MAX_LINE_LENGTH as u64)
                .read_until(b'\n', &mut line)
                .await
            {
                Ok(0) => break,
                Ok(_) => {}
                Err(e) => {
                    tracing::warn!(upstream = %self.name, error = %e, "reading the upstream's stdout failed");
                    break;
                }
            }
            let whole = line.ends_with(b"\n");
            let kind = if oversized || !whole {
                FromChild::Rmcp
            } else {
                classify(&line)
            };
            oversized = !whole;
            match kind {
                FromChild::Answer(id, message) => {
                    let waiting = self.calls.lock().expect("lean calls").waiting.remove(&id);
                    match waiting {
                        Some(w) => {
                            let _ = w.answer.send(message);
                        }
                        None => {
                            tracing::debug!(upstream = %self.name, %id, "an answer to a call no longer waiting; dropped")
                        }
                    }
                }
                FromChild::Progress(id, progress) => {
                    let relay = self
                        .calls
                        .lock()
                        .expect("lean calls")
                        .waiting
                        .get(&id)
                        .is_some_and(|w| w.relay);
                    if relay {
                        self.routes.arrived(progress);
                    }
                }
                FromChild::Stale => {}
                FromChild::Rmcp => {
                    if let Err(e) = to_rmcp.write_all(&line).await {
                        tracing::debug!(upstream = %self.name, error = %e, "rmcp no longer reads the upstream");
                    }
                }
            }
        }
        // Nothing more will be answered: the calls waiting hear it, and rmcp reads the end.
        let waiting = {
            let mut calls = self.calls.lock().expect("lean calls");
            calls.open = false;
            std::mem::take(&mut calls.waiting)
        };
        drop(waiting);
        let _ = to_rmcp.shutdown().await;
    }

    /// Writes rmcp's lines to the child's stdin; when rmcp closes its side, closes the child's
    /// stdin and waits for the child (SIGTERM, then kill, when it does not exit).
    async fn write_rmcp(
        self: Arc<Self>,
        from_rmcp: DuplexStream,
        mut child: Child,
        exited: watch::Sender<bool>,
    ) {
        let mut from = BufReader::new(from_rmcp);
        let mut line = Vec::with_capacity(4096);
        loop {
            line.clear();
            match from.read_until(b'\n', &mut line).await {
                Ok(0) | Err(_) => break,
                Ok(_) => {}
            }
            let mut stdin = self.stdin.lock().await;
            let Some(w) = stdin.as_mut() else { break };
            if let Err(e) = w.write_all(&line).await {
                tracing::debug!(upstream = %self.name, error = %e, "writing to the upstream's stdin failed");
            }
        }
        // Closing stdin tells the child to exit (lean calls still waiting hear the end).
        self.stdin.lock().await.take();
        stop(&self.name, &mut child).await;
        let _ = exited.send(true);
    }
}

/// Waits for `child` to exit after its stdin was closed; SIGTERM, then kill, when it does not.
async fn stop(name: &str, child: &mut Child) {
    if tokio::time::timeout(EXIT_WAIT, child.wait()).await.is_ok() {
        return;
    }
    #[cfg(unix)]
    if let Some(pid) = child.id().and_then(|p| i32::try_from(p).ok()) {
        // SAFETY: `kill` only sends a signal; the pid is our own child's, not yet reaped.
        unsafe {
            libc::kill(pid, libc::SIGTERM);
        }
        if tokio::time::timeout(EXIT_WAIT, child.wait()).await.is_ok() {
            return;
        }
    }
    tracing::warn!(upstream = %name, "the upstream did not exit after its stdin was closed; killed");
    let _ = child.kill().await;
}

/// One line on its way to the child's stdin, written whole (under the stdin lock) once begun.
struct WholeLine {
    stdin: OwnedMutexGuard<Option<ChildStdin>>,
    line: Vec<u8>,
    at: usize,
}

impl WholeLine {
    fn poll_write(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        while self.at < self.line.len() {
            let Some(w) = self.stdin.as_mut() else {
                return Poll::Ready(Err(io::Error::new(
                    io::ErrorKind::BrokenPipe,
                    "its stdin is closed",
                )));
            };
            match Pin::new(w).poll_write(cx, &self.line[self.at..]) {
                Poll::Ready(Ok(0)) => {
                    return Poll::Ready(Err(io::ErrorKind::WriteZero.into()));
                }
                Poll::Ready(Ok(n)) => self.at += n,
                Poll::Ready(Err(e)) => return Poll::Ready(Err(e)),
                Poll::Pending => return Poll::Pending,
            }
        }
        Poll::Ready(Ok(()))
    }

    /// Finishes the line in a task of its own (a part is already written), then writes
    /// `after`, if any, while still holding the lock.
    fn finish(mut self, after: Option<Vec<u8>>) {
        tokio::spawn(async move {
            if std::future::poll_fn(|cx| self.poll_write(cx))
                .await
                .is_err()
            {
                return;
            }
            if let (Some(after), Some(w)) = (after, self.stdin.as_mut()) {
                let _ = w.write_all(&after).await;
            }
        });
    }
}

enum Stage {
    /// Not written yet (waiting for the stdin lock).
    Unsent,
    /// Being written.
    Writing(WholeLine),
    /// Written, waiting for the answer.
    Sent,
    /// Answered, or certainly not delivered.
    Done,
}

/// A lean call in flight: dropped before its answer, it finishes a line it began and tells the
/// child the call is cancelled.
struct InFlight {
    link: Arc<ChildLink>,
    id: Arc<str>,
    stage: Stage,
}

impl Drop for InFlight {
    fn drop(&mut self) {
        let stage = std::mem::replace(&mut self.stage, Stage::Done);
        if matches!(stage, Stage::Done) {
            return;
        }
        self.link.forget(&self.id);
        let note = || {
            let mut line = serde_json::to_vec(&json!({"jsonrpc": "2.0",
                "method": "notifications/cancelled",
                "params": {"requestId": &*self.id, "reason": "the caller is no longer waiting"}}))
            .expect("a JSON value serialises");
            line.push(b'\n');
            line
        };
        match stage {
            Stage::Unsent | Stage::Done => {}
            // Nothing of it reached the child: nothing to cancel.
            Stage::Writing(w) if w.at == 0 => {}
            Stage::Writing(w) => w.finish(Some(note())),
            Stage::Sent => {
                let (stdin, line) = (self.link.stdin.clone(), note());
                tokio::spawn(async move {
                    if let Some(w) = stdin.lock().await.as_mut() {
                        let _ = w.write_all(&line).await;
                    }
                });
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn kind(line: &str) -> &'static str {
        match classify(line.as_bytes()) {
            FromChild::Answer(..) => "answer",
            FromChild::Progress(..) => "progress",
            FromChild::Stale => "stale",
            FromChild::Rmcp => "rmcp",
        }
    }

    #[test]
    fn only_the_lean_hops_own_ids_are_taken_from_rmcp() {
        assert_eq!(
            kind(r#"{"jsonrpc":"2.0","id":"tg-3","result":{}}"#),
            "answer"
        );
        assert_eq!(
            kind(r#"{"jsonrpc":"2.0","id":"tg-3","error":{"code":1,"message":"x"}}"#),
            "answer"
        );
        assert_eq!(
            kind(
                r#"{"jsonrpc":"2.0","method":"notifications/progress","params":{"progressToken":"tg-3","progress":1}}"#
            ),
            "progress"
        );
        for rmcps in [
            r#"{"jsonrpc":"2.0","id":3,"result":{}}"#,
            r#"{"jsonrpc":"2.0","id":"3","result":{}}"#,
            r#"{"jsonrpc":"2.0","method":"notifications/progress","params":{"progressToken":3,"progress":1}}"#,
            // a request the child makes of its client, even with an id like ours
            r#"{"jsonrpc":"2.0","id":"tg-3","method":"ping"}"#,
            r#"{"jsonrpc":"2.0","method":"notifications/tools/list_changed"}"#,
            "not json",
        ] {
            assert_eq!(kind(rmcps), "rmcp", "{rmcps}");
        }
    }
}
