//! The lean stdio path: `toolgate serve --stdio` answers a plain `tools/call` itself and leaves
//! everything else to rmcp. rmcp's stdio server reads and writes stdin/stdout through tokio's
//! blocking pool and routes each request through its service task and channels, work the
//! commonest request does not need. Here a plain call goes from the line read straight to a
//! governed call and its reply straight to stdout, and the lean upstream hop
//! ([`crate::child`]) does the same on the upstream's side. The serving loop runs as a task on
//! the runtime's workers, so a call it spawns starts on the thread that read it rather than
//! being handed over from the thread that blocks on `serve`. What a stdio call costs:
//! `cargo bench -p toolgate-gateway --bench stdio_overhead` (figures in docs/evidence.md).
//!
//! - **One reader, one writer.** One task reads stdin line by line. A plain JSON-RPC
//!   `tools/call` request after the client's `notifications/initialized` (the same test as the
//!   HTTP lean path, [`crate::lean`]: no protocol metadata in `_meta`, a string or integer id and
//!   progress token) runs through [`GatewayServer::call`] in a task of its own, and its reply is
//!   written to stdout. Every other line goes to rmcp unchanged through an in-process pipe, and
//!   rmcp's output is copied to stdout line by line. Every write to stdout goes through one
//!   [`Lines`], a line at a time, so lines never interleave.
//! - **Progress** the upstream reports on a lean call is written as `notifications/progress`
//!   under the caller's token; the relay ([`crate::relay`]) hands it over before the call
//!   returns, so it is written before the reply.
//! - **Cancellation.** rmcp's server, told `notifications/cancelled` for a request it is
//!   serving, lets the handler run on (toolgate's does not watch for it) and drops the response.
//!   A lean call does the same: the governed call is decided, forwarded and recorded as if the
//!   client had waited (a retry finds it), and its reply is not written. A cancellation for any
//!   other id goes to rmcp.
//! - **Pipes.** When stdin or stdout is a pipe (as an MCP client starts a server), it is read
//!   or written directly by the runtime's reactor instead of through the blocking pool; stdout
//!   stays on tokio's blocking writer when it is the same pipe as stderr, whose log lines must
//!   never meet a non-blocking descriptor.
//! - **Lines too long** for the lean path (over 4 MiB) go to rmcp as they came; rmcp applies its
//!   own limit.

use std::collections::HashMap;
use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use rmcp::ErrorData;
use rmcp::ServiceExt;
use rmcp::model::{CallToolResult, ProgressNotificationParam};
use rmcp::transport::async_rw::DEFAULT_MAX_LINE_LENGTH;
use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt, AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, BufReader};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use crate::auth::Caller;
use crate::error::GatewayError;
use crate::lean::LeanCall;
use crate::relay::ProgressSink;
use crate::server::GatewayServer;

/// The longest line the lean path looks at (the HTTP lean path's body limit).
const MAX_LEAN_LINE: usize = 4 * 1024 * 1024;
/// The buffer of the in-process pipe to and from rmcp.
const PIPE: usize = 1 << 20;

type Writer = Pin<Box<dyn AsyncWrite + Send>>;

/// The one writer of the client's stdout: each message is written whole, with its newline.
#[derive(Clone)]
pub struct Lines(Arc<tokio::sync::Mutex<Writer>>);

impl Lines {
    fn new(out: impl AsyncWrite + Send + 'static) -> Lines {
        Lines(Arc::new(tokio::sync::Mutex::new(Box::pin(out))))
    }

    /// Writes `line` (which ends with its newline) and flushes it.
    async fn write_line(&self, line: &[u8]) -> io::Result<()> {
        let mut out = self.0.lock().await;
        out.write_all(line).await?;
        out.flush().await
    }

    /// Writes one JSON-RPC message as a line.
    async fn write_message(&self, message: &Value) -> io::Result<()> {
        let mut line = serde_json::to_vec(message).expect("a JSON value serialises");
        line.push(b'\n');
        self.write_line(&line).await
    }

    /// Tells the client of its call's progress (already under its token).
    pub(crate) async fn progress(&self, progress: ProgressNotificationParam) -> io::Result<()> {
        self.write_message(
            &json!({"jsonrpc": "2.0", "method": "notifications/progress",
            "params": progress}),
        )
        .await
    }
}

/// What one line from the client is to the lean path.
enum Inbound {
    /// A plain `tools/call` the lean path answers.
    Call(Box<LeanCall>),
    /// `notifications/cancelled` for the request with this id (as JSON text).
    Cancelled(String),
    /// The client's `notifications/initialized`.
    Initialized,
    /// Anything else: rmcp's.
    Other,
}

/// Reads one complete line (with its newline) from the client.
fn classify(line: &[u8], initialized: bool) -> Inbound {
    if line.len() > MAX_LEAN_LINE {
        return Inbound::Other;
    }
    let Ok(Value::Object(message)) = serde_json::from_slice::<Value>(line) else {
        return Inbound::Other;
    };
    if message.get("jsonrpc").and_then(Value::as_str) != Some("2.0") {
        return Inbound::Other;
    }
    match message.get("method").and_then(Value::as_str) {
        Some("tools/call") if initialized => crate::lean::parse_message(message)
            .map(|call| Inbound::Call(Box::new(call)))
            .unwrap_or(Inbound::Other),
        Some("notifications/initialized") if !message.contains_key("id") => Inbound::Initialized,
        Some("notifications/cancelled") if !message.contains_key("id") => message
            .get("params")
            .and_then(|p| p.get("requestId"))
            .filter(|id| id.is_string() || id.is_i64() || id.is_u64())
            .map(|id| Inbound::Cancelled(id.to_string()))
            .unwrap_or(Inbound::Other),
        _ => Inbound::Other,
    }
}

/// The lean calls in flight, by id (as JSON text), with whether the client cancelled each.
type InFlight = Arc<Mutex<HashMap<String, Arc<AtomicBool>>>>;

/// One lean call's reply, written once; written as an internal error if the call's task ends
/// without one (it panicked), and not at all if the client cancelled the call.
struct Reply {
    id: Value,
    key: String,
    out: Lines,
    in_flight: InFlight,
    cancelled: Arc<AtomicBool>,
    /// Held until the reply is written: the serving loop waits for every sender to go.
    _running: mpsc::Sender<()>,
    written: bool,
}

impl Reply {
    async fn write(mut self, outcome: Result<CallToolResult, ErrorData>) {
        self.written = true;
        self.in_flight
            .lock()
            .expect("in-flight calls")
            .remove(&self.key);
        if self.cancelled.load(Ordering::Acquire) {
            tracing::debug!(id = %self.key, "a cancelled call's reply is not written");
            return;
        }
        let message = match outcome {
            Ok(result) => json!({"jsonrpc": "2.0", "id": &self.id, "result": result}),
            Err(error) => json!({"jsonrpc": "2.0", "id": &self.id, "error": error}),
        };
        if let Err(e) = self.out.write_message(&message).await {
            tracing::debug!(error = %e, "the stdio client went away before its reply");
        }
    }
}

impl Drop for Reply {
    fn drop(&mut self) {
        if self.written {
            return;
        }
        self.in_flight
            .lock()
            .expect("in-flight calls")
            .remove(&self.key);
        tracing::error!(id = %self.key, "a tools/call task failed");
        if self.cancelled.load(Ordering::Acquire) {
            return;
        }
        let message = json!({"jsonrpc": "2.0", "id": &self.id, "error": {
            "code": -32603, "message": "toolgate failed while handling this call"}});
        let (out, running) = (self.out.clone(), self._running.clone());
        tokio::spawn(async move {
            let _ = out.write_message(&message).await;
            drop(running);
        });
    }
}

/// Serves one stdio client as `caller` on `input`/`output` until it closes `input` or
/// `shutdown` is cancelled; lean calls still running then are finished and answered.
pub(crate) async fn serve(
    server: GatewayServer,
    caller: Caller,
    input: impl AsyncRead + Send + Unpin + 'static,
    output: impl AsyncWrite + Send + 'static,
    shutdown: CancellationToken,
) -> Result<(), GatewayError> {
    let out = Lines::new(output);
    let (ours, theirs) = tokio::io::duplex(PIPE);
    let (from_rmcp, mut to_rmcp) = tokio::io::split(ours);
    let rmcp_stop = CancellationToken::new();
    let mut rmcp = {
        let (server, stop) = (server.clone(), rmcp_stop.clone());
        tokio::spawn(async move {
            let running = server
                .serve_with_ct(tokio::io::split(theirs), stop)
                .await
                .map_err(|e| e.to_string())?;
            running.waiting().await.map_err(|e| e.to_string())?;
            Ok::<(), String>(())
        })
    };
    let copier = tokio::spawn(copy_lines(from_rmcp, out.clone()));
    let in_flight: InFlight = Arc::default();
    let (running, mut all_done) = mpsc::channel::<()>(1);
    let mut reader = BufReader::with_capacity(64 * 1024, input);
    let mut line = Vec::with_capacity(4096);
    let mut initialized = false;
    // Within a line longer than rmcp's limit: the rest goes to rmcp as it comes.
    let mut oversized = false;
    let rmcp_ended = loop {
        line.clear();
        let mut limited = (&mut reader).take(DEFAULT_MAX_LINE_LENGTH as u64);
        let read = tokio::select! {
            biased;
            _ = shutdown.cancelled() => break None,
            r = &mut rmcp => break Some(r),
            r = limited.read_until(b'\n', &mut line) => r,
        };
        match read {
            Ok(0) => break None,
            Ok(_) => {}
            Err(e) => {
                tracing::warn!(error = %e, "reading stdin failed; the stdio client is gone");
                break None;
            }
        }
        let whole = line.ends_with(b"\n");
        let kind = if oversized || !whole {
            Inbound::Other
        } else {
            classify(&line, initialized)
        };
        oversized = !whole;
        match kind {
            Inbound::Call(call) => {
                spawn_call(&server, &caller, *call, &out, &in_flight, &running);
                continue;
            }
            Inbound::Cancelled(key) => {
                if let Some(flag) = in_flight.lock().expect("in-flight calls").get(&key) {
                    flag.store(true, Ordering::Release);
                    continue;
                }
            }
            Inbound::Initialized => initialized = true,
            Inbound::Other => {}
        }
        if let Err(e) = to_rmcp.write_all(&line).await {
            tracing::debug!(error = %e, "rmcp no longer reads the stdio client");
        }
    };
    // The client is gone (or we stop): rmcp hears the end of its input, lean calls finish.
    let _ = to_rmcp.shutdown().await;
    drop(running);
    let rmcp_result = match rmcp_ended {
        Some(ended) => ended,
        None => {
            if shutdown.is_cancelled() {
                rmcp_stop.cancel();
            }
            rmcp.await
        }
    }
    .unwrap_or_else(|e| Err(e.to_string()));
    let _ = all_done.recv().await;
    let _ = copier.await;
    rmcp_result.map_err(GatewayError::Stdio)
}

/// Runs one lean call in a task of its own and writes its reply.
fn spawn_call(
    server: &GatewayServer,
    caller: &Caller,
    call: LeanCall,
    out: &Lines,
    in_flight: &InFlight,
    running: &mpsc::Sender<()>,
) {
    let key = call.id.to_string();
    let cancelled = Arc::new(AtomicBool::new(false));
    in_flight
        .lock()
        .expect("in-flight calls")
        .insert(key.clone(), cancelled.clone());
    let reply = Reply {
        id: call.id,
        key,
        out: out.clone(),
        in_flight: in_flight.clone(),
        cancelled,
        _running: running.clone(),
        written: false,
    };
    let progress = call.progress.map(|token| crate::relay::ProgressRecipient {
        to: ProgressSink::Lines(out.clone()),
        token,
    });
    let (server, caller) = (server.clone(), caller.clone());
    tokio::spawn(async move {
        let surface = server.state().surface();
        let outcome = server
            .call(caller, surface, call.params, call.meta, progress)
            .await;
        reply.write(outcome).await;
    });
}

/// Copies rmcp's output to the client a whole line at a time.
async fn copy_lines(from: impl AsyncRead + Unpin, out: Lines) {
    let mut from = BufReader::new(from);
    let mut line = Vec::with_capacity(4096);
    loop {
        line.clear();
        match from.read_until(b'\n', &mut line).await {
            Ok(0) | Err(_) => return,
            Ok(_) => {
                if let Err(e) = out.write_line(&line).await {
                    tracing::debug!(error = %e, "the stdio client stopped reading");
                    return;
                }
            }
        }
    }
}

/// This process's stdin and stdout, read and written by the reactor when they are pipes.
pub(crate) fn process_stdio() -> (
    Box<dyn AsyncRead + Send + Unpin>,
    Box<dyn AsyncWrite + Send + Unpin>,
) {
    (pipes::stdin(), pipes::stdout())
}

#[cfg(unix)]
mod pipes {
    use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
    use std::os::unix::fs::{FileTypeExt, MetadataExt};

    use tokio::io::{AsyncRead, AsyncWrite};
    use tokio::net::unix::pipe;

    /// The file behind `fd`: whether it is a pipe, and its identity.
    fn pipe_identity(fd: BorrowedFd<'_>) -> Option<(u64, u64)> {
        let owned: OwnedFd = fd.try_clone_to_owned().ok()?;
        let meta = std::fs::File::from(owned).metadata().ok()?;
        meta.file_type().is_fifo().then(|| (meta.dev(), meta.ino()))
    }

    pub(super) fn stdin() -> Box<dyn AsyncRead + Send + Unpin> {
        let fd = std::io::stdin();
        if pipe_identity(fd.as_fd()).is_some()
            && let Ok(owned) = fd.as_fd().try_clone_to_owned()
            && let Ok(rx) = pipe::Receiver::from_owned_fd(owned)
        {
            return Box::new(rx);
        }
        Box::new(tokio::io::stdin())
    }

    pub(super) fn stdout() -> Box<dyn AsyncWrite + Send + Unpin> {
        let out = std::io::stdout();
        let err = std::io::stderr();
        let shared_with_stderr = pipe_identity(err.as_fd()) == pipe_identity(out.as_fd());
        if !shared_with_stderr
            && pipe_identity(out.as_fd()).is_some()
            && let Ok(owned) = out.as_fd().try_clone_to_owned()
            && let Ok(tx) = pipe::Sender::from_owned_fd(owned)
        {
            return Box::new(tx);
        }
        Box::new(tokio::io::stdout())
    }
}

#[cfg(not(unix))]
mod pipes {
    use tokio::io::{AsyncRead, AsyncWrite};

    pub(super) fn stdin() -> Box<dyn AsyncRead + Send + Unpin> {
        Box::new(tokio::io::stdin())
    }

    pub(super) fn stdout() -> Box<dyn AsyncWrite + Send + Unpin> {
        Box::new(tokio::io::stdout())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn kind(line: &str, initialized: bool) -> &'static str {
        match classify(format!("{line}\n").as_bytes(), initialized) {
            Inbound::Call(_) => "call",
            Inbound::Cancelled(_) => "cancelled",
            Inbound::Initialized => "initialized",
            Inbound::Other => "other",
        }
    }

    #[test]
    fn only_a_plain_call_after_initialization_is_taken() {
        let call = r#"{"jsonrpc":"2.0","id":3,"method":"tools/call","params":{"name":"x"}}"#;
        assert_eq!(kind(call, true), "call");
        assert_eq!(kind(call, false), "other", "before initialization: rmcp's");
        for other in [
            r#"{"jsonrpc":"2.0","id":3,"method":"tools/list"}"#,
            r#"[{"jsonrpc":"2.0","id":3,"method":"tools/call","params":{"name":"x"}}]"#,
            r#"{"jsonrpc":"2.0","id":3,"method":"tools/call","params":{"name":"x","_meta":{"io.modelcontextprotocol/protocolVersion":"2026-07-28"}}}"#,
            r#"{"jsonrpc":"2.0","id":3,"result":{}}"#,
            "not json",
        ] {
            assert_eq!(kind(other, true), "other", "{other}");
        }
        assert_eq!(
            kind(
                r#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#,
                false
            ),
            "initialized"
        );
    }

    #[test]
    fn a_cancellation_names_its_request_id_as_json_text() {
        let line = r#"{"jsonrpc":"2.0","method":"notifications/cancelled","params":{"requestId":"a","reason":"x"}}"#;
        match classify(line.as_bytes(), true) {
            Inbound::Cancelled(key) => assert_eq!(key, r#""a""#),
            _ => panic!("not a cancellation"),
        }
        match classify(
            br#"{"jsonrpc":"2.0","method":"notifications/cancelled","params":{"requestId":7}}"#,
            true,
        ) {
            Inbound::Cancelled(key) => assert_eq!(key, "7"),
            _ => panic!("not a cancellation"),
        }
        assert_eq!(
            kind(
                r#"{"jsonrpc":"2.0","method":"notifications/cancelled","params":{}}"#,
                true
            ),
            "other"
        );
    }
}
