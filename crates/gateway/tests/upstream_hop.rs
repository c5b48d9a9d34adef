//! The lean upstream hop (`src/hop.rs`) against the finance fake, a real rmcp server over
//! streamable HTTP that records every call it is asked: answers as JSON (a stateless server)
//! and as an event stream, an expired session reopened with the call sent once, and kept
//! connections shared by calls at an upstream that leaves Nagle's algorithm on (that they do
//! not wait on it is the hop's own unit test, which reads the sockets' state). Each
//! call's `_meta.progressToken`, as the fake recorded it, says the lean hop carried it (its ids
//! are `tg-N`; rmcp's are numbers).

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use crate::common::*;
use axum::serve::ListenerExt;
#[allow(deprecated)]
use rmcp::model::{
    CallToolRequestParams, CallToolResponse, ListToolsResult, LoggingLevel,
    LoggingMessageNotificationParam, PaginatedRequestParams, ServerConfig,
};
use rmcp::service::RequestContext;
use rmcp::transport::streamable_http_server::session::SessionManager;
use rmcp::transport::streamable_http_server::session::local::LocalSessionManager;
use rmcp::transport::{StreamableHttpServerConfig, StreamableHttpService};
use rmcp::{ErrorData, RoleServer, ServerHandler};
use serde_json::json;
use std::sync::Mutex;
use tokio_util::sync::CancellationToken;
use toolgate_fakes::finance::Finance;
use toolgate_fakes::{FakeServer, FaultPlan, Recorder};

/// How the fake is served.
#[derive(Clone, Copy)]
struct Shape {
    /// Stateless, answering simple calls as `application/json` (else sessions and SSE).
    json: bool,
    /// Sets `TCP_NODELAY` on its connections (a plain `axum::serve` does not).
    nodelay: bool,
}

struct Fake {
    addr: std::net::SocketAddr,
    stop: CancellationToken,
    sessions: Arc<LocalSessionManager>,
    accepted: Arc<AtomicUsize>,
}

fn finance(record: &std::path::Path) -> FakeServer<Finance> {
    FakeServer::new(
        Finance::seeded(),
        Recorder::to_file(record).expect("record file"),
        FaultPlan::new(Vec::new(), 1),
    )
}

async fn start_fake<S: ServerHandler + Clone + Send + Sync + 'static>(
    server: S,
    shape: Shape,
) -> Fake {
    let stop = CancellationToken::new();
    let sessions = Arc::new(LocalSessionManager::default());
    let mut config = StreamableHttpServerConfig::default().with_cancellation_token(stop.clone());
    if shape.json {
        config = config
            .with_legacy_session_mode(false)
            .with_json_response(true);
    }
    let service = StreamableHttpService::new(move || Ok(server.clone()), sessions.clone(), config);
    let app = axum::Router::new().nest_service("/mcp", service);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let accepted = Arc::new(AtomicUsize::new(0));
    let counter = accepted.clone();
    let listener = listener.tap_io(move |tcp| {
        counter.fetch_add(1, Ordering::SeqCst);
        if shape.nodelay {
            let _ = tcp.set_nodelay(true);
        }
    });
    let until = stop.clone();
    tokio::spawn(async move {
        axum::serve(listener, app)
            .with_graceful_shutdown(async move { until.cancelled().await })
            .await
            .unwrap();
    });
    Fake {
        addr,
        stop,
        sessions,
        accepted,
    }
}

async fn harness(shape: Shape) -> (Harness, Fake) {
    let dir = tempfile::tempdir().unwrap();
    let record = dir.path().join("erp-calls.jsonl");
    let fake = start_fake(finance(&record), shape).await;
    let h = Harness::serve(dir, record, fake.addr, fake.stop.clone(), "", None).await;
    (h, fake)
}

async fn search(client: &rmcp::service::RunningService<rmcp::RoleClient, ()>, run: &str) {
    let r = call(
        client,
        "invoice.search",
        json!({"invoice_id": "INV-20260615"}),
        billing("lean hop", run),
    )
    .await
    .unwrap();
    assert_ne!(r.is_error, Some(true), "{r:?}");
    assert!(
        r.structured_content.is_some() || !r.content.is_empty(),
        "the upstream's answer reached the caller: {r:?}"
    );
}

/// Every recorded call of `tool` went over the lean hop.
fn all_lean(h: &Harness, tool: &str, want: usize) {
    let records = h.records_for(tool);
    assert_eq!(records.len(), want, "delivered exactly {want} times");
    for r in records {
        let token = r.meta["progressToken"].as_str().unwrap_or_default();
        assert!(
            token.starts_with("tg-"),
            "not over the lean hop: {:?}",
            r.meta
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_json_answer_from_a_stateless_upstream() {
    let (h, _fake) = harness(Shape {
        json: true,
        nodelay: true,
    })
    .await;
    let client = h.client(WORKER_KEY).await;
    for i in 0..3 {
        search(&client, &format!("json-{i}")).await;
    }
    all_lean(&h, "search_invoices", 3);
    let _ = client.cancel().await;
    h.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_event_stream_answer_in_a_session() {
    let (h, _fake) = harness(Shape {
        json: false,
        nodelay: true,
    })
    .await;
    let client = h.client(WORKER_KEY).await;
    for i in 0..3 {
        search(&client, &format!("sse-{i}")).await;
    }
    all_lean(&h, "search_invoices", 3);
    let _ = client.cancel().await;
    h.shutdown().await;
}

/// The upstream forgets toolgate's session (a restart, an idle timeout): the next call gets an
/// HTTP 404, which it was not delivered with, so toolgate reconnects and sends it once more.
/// A write, recorded once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_expired_session_is_reopened_and_the_write_sent_once() {
    let (h, fake) = harness(Shape {
        json: false,
        nodelay: true,
    })
    .await;
    let client = h.client(WORKER_KEY).await;
    search(&client, "expiry-0").await;
    let ids: Vec<_> = fake
        .sessions
        .sessions
        .read()
        .await
        .keys()
        .cloned()
        .collect();
    assert!(!ids.is_empty(), "toolgate holds a session at the fake");
    for id in ids {
        fake.sessions.close_session(&id).await.unwrap();
    }
    let note = json!({"invoice_id": "INV-20260615", "kind": "query", "text": "Confirm the date."});
    let r = call(
        &client,
        "note.draft",
        note,
        billing("ask the supplier to confirm the date", "expiry-1"),
    )
    .await
    .unwrap();
    assert_ne!(r.is_error, Some(true), "sent again in a new session: {r:?}");
    all_lean(&h, "draft_note", 1);
    assert!(
        !fake.sessions.sessions.read().await.is_empty(),
        "a new session was opened"
    );
    let _ = client.cancel().await;
    h.shutdown().await;
}

/// At an upstream that leaves Nagle's algorithm on, an event-stream answer is several small
/// writes; on a reused connection each would wait for the client's delayed ACK (40 ms) unless
/// the hop acknowledges at once. Sequential calls share kept connections, every one answered
/// over the lean hop. That those sockets acknowledge at once is the hop's own unit test
/// (`a_dialled_connection_acknowledges_at_once_after_every_read`), which reads the socket's
/// state instead of timing calls on a machine that may be loaded.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kept_connections_serve_an_upstream_that_leaves_nagle_on() {
    const CALLS: usize = 12;
    let (h, fake) = harness(Shape {
        json: false,
        nodelay: false,
    })
    .await;
    let client = h.client(WORKER_KEY).await;
    search(&client, "nagle-warm").await;
    let before = fake.accepted.load(Ordering::SeqCst);
    for i in 0..CALLS {
        search(&client, &format!("nagle-{i}")).await;
    }
    let opened = fake.accepted.load(Ordering::SeqCst) - before;
    assert!(
        opened <= CALLS / 4,
        "calls share kept connections: {opened} opened for {CALLS} calls"
    );
    all_lean(&h, "search_invoices", CALLS + 1);
    let _ = client.cancel().await;
    h.shutdown().await;
}

/// The finance fake, chattier: before answering a call it logs a line and asks its client for
/// its roots, in the call's own stream, and keeps what the client answered.
#[derive(Clone)]
struct Chatty {
    inner: FakeServer<Finance>,
    heard: Arc<Mutex<Vec<String>>>,
    /// Instead: hold every call until it is cancelled, and note the cancellation.
    stall: bool,
}

impl ServerHandler for Chatty {
    fn get_info(&self) -> ServerConfig {
        self.inner.get_info()
    }

    async fn list_tools(
        &self,
        request: Option<PaginatedRequestParams>,
        context: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, ErrorData> {
        self.inner.list_tools(request, context).await
    }

    // Log lines and roots are deprecated in the newest protocol revision, but a server on
    // 2025-11-25 (what toolgate's client negotiates) still sends them.
    #[allow(deprecated)]
    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, ErrorData> {
        if self.stall {
            tokio::select! {
                _ = context.ct.cancelled() => self.heard.lock().unwrap().push("cancelled".into()),
                _ = tokio::time::sleep(Duration::from_secs(10)) => {}
            }
            return Err(ErrorData::internal_error("stalled", None));
        }
        let _ = context
            .peer
            .notify_logging_message(LoggingMessageNotificationParam::new(
                LoggingLevel::Info,
                json!("looking the invoice up"),
            ))
            .await;
        let roots = context.peer.list_roots().await;
        self.heard.lock().unwrap().push(match roots {
            Ok(r) => format!("roots: {}", r.roots.len()),
            Err(e) => format!("roots failed: {e}"),
        });
        self.inner.call_tool(request, context).await
    }
}

/// A request the upstream makes of its client in the call's stream is answered (as rmcp's
/// client answers it: no roots), so the upstream goes on to answer the call; its log line is
/// not relayed, and does not end the stream.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_and_log_lines_in_the_calls_stream() {
    let dir = tempfile::tempdir().unwrap();
    let record = dir.path().join("erp-calls.jsonl");
    let heard = Arc::new(Mutex::new(Vec::new()));
    let chatty = Chatty {
        inner: finance(&record),
        heard: heard.clone(),
        stall: false,
    };
    let fake = start_fake(
        chatty,
        Shape {
            json: false,
            nodelay: true,
        },
    )
    .await;
    let h = Harness::serve(dir, record, fake.addr, fake.stop.clone(), "", None).await;
    let client = h.client(WORKER_KEY).await;
    search(&client, "chatty").await;
    assert_eq!(*heard.lock().unwrap(), vec!["roots: 0".to_string()]);
    all_lean(&h, "search_invoices", 1);
    let _ = client.cancel().await;
    h.shutdown().await;
}

/// A call the upstream does not answer within the tool's timeout (2 s here) is a timeout for
/// the caller, and the upstream is told the call is cancelled, as rmcp's client tells it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_past_its_timeout_is_cancelled_at_the_upstream() {
    let dir = tempfile::tempdir().unwrap();
    let record = dir.path().join("erp-calls.jsonl");
    let heard = Arc::new(Mutex::new(Vec::new()));
    let stalling = Chatty {
        inner: finance(&record),
        heard: heard.clone(),
        stall: true,
    };
    let fake = start_fake(
        stalling,
        Shape {
            json: false,
            nodelay: true,
        },
    )
    .await;
    let h = Harness::serve(dir, record, fake.addr, fake.stop.clone(), "", None).await;
    let client = h.client(WORKER_KEY).await;
    let at = Instant::now();
    let r = call(
        &client,
        "invoice.search",
        json!({"invoice_id": "INV-20260615"}),
        billing("lean hop", "stalled"),
    )
    .await
    .unwrap();
    assert_eq!(r.is_error, Some(true), "a timeout is a failed call: {r:?}");
    assert!(at.elapsed() < Duration::from_secs(8), "{:?}", at.elapsed());
    let mut told = false;
    for _ in 0..50 {
        if heard.lock().unwrap().iter().any(|h| h == "cancelled") {
            told = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(told, "the upstream was told the call is cancelled");
    let _ = client.cancel().await;
    h.shutdown().await;
}
