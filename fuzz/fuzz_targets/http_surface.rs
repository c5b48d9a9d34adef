//! The HTTP surface a stranger reaches: `/mcp` (credential check, session owners, rmcp's
//! streamable HTTP, the governed call), the approver's page under `/approvals` (sign-in, CSRF,
//! forms), `/metrics`, `/healthz`, `/readyz` and the OAuth metadata — the real router of
//! `toolgate serve`, driven in process over the finance example with its fake ERP served on
//! loopback (a real MCP server, so a `tools/call` that passes every check reaches it).
//!
//! An input is a request written as text:
//!
//! ```text
//! METHOD PATH
//! name: value
//! ...
//!
//! body
//! ```
//!
//! `$SESSION` in a header value stands for a live MCP session opened at start-up (the fuzzer
//! cannot guess its random id), so inputs can reach `tools/list` and `tools/call`; `$KEY` for a
//! valid agent key; `$CONSOLE` for the cookie of an approver signed in to the page at start-up
//! and `$CSRF` (in a header or the body) for that sign-in's form token. A request that does not
//! parse as HTTP is skipped. What must hold for every request: nothing panics (libFuzzer aborts
//! on a panic in any thread, rmcp's session tasks included), no reply is a 500, and every reply
//! carries `X-Content-Type-Options: nosniff`.
#![no_main]

use std::net::SocketAddr;
use std::path::Path;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::extract::ConnectInfo;
use http_body_util::BodyExt;
use libfuzzer_sys::fuzz_target;
use rmcp::transport::streamable_http_server::session::local::LocalSessionManager;
use rmcp::transport::{StreamableHttpServerConfig, StreamableHttpService};
use tokio::runtime::Runtime;
use tokio_util::sync::CancellationToken;
use toolgate_fakes::{FakeServer, FaultPlan, Recorder, finance::Finance};
use toolgate_gateway::{Gateway, ServeOptions};
use tower::ServiceExt;

/// The finance example's development key of its planner (reads invoices, proposes plans).
const KEY: &str = "tgdev_fin_planner";

struct Surface {
    runtime: Runtime,
    app: Router,
    session: String,
    console: Signed,
    _dir: tempfile::TempDir,
}

/// An approver signed in to the page: the session cookie and its form token.
struct Signed {
    cookie: String,
    csrf: String,
}

fn surface() -> &'static Surface {
    static SURFACE: OnceLock<Surface> = OnceLock::new();
    SURFACE.get_or_init(|| {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .expect("a tokio runtime");
        let dir = tempfile::tempdir().expect("a scratch folder");
        let app = runtime.block_on(start(dir.path()));
        let session = runtime.block_on(open_session(&app));
        let console = runtime.block_on(sign_in(&app));
        Surface {
            runtime,
            app,
            session,
            console,
            _dir: dir,
        }
    })
}

/// The fake ERP on a loopback port, the finance example copied beside it and pointed at it,
/// and the gateway's router over that folder with a store in the scratch folder.
async fn start(dir: &Path) -> Router {
    let server = FakeServer::new(
        Finance::seeded(),
        Recorder::to_file(&dir.join("erp-calls.jsonl")).expect("the fake's record"),
        FaultPlan::new(vec![], 1),
    );
    let stop = CancellationToken::new();
    let service = StreamableHttpService::new(
        move || Ok(server.clone()),
        Arc::new(LocalSessionManager::default()),
        StreamableHttpServerConfig::default().with_cancellation_token(stop.clone()),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("a loopback port");
    let fake = listener.local_addr().expect("its address");
    tokio::spawn(async move {
        let _ = axum::serve(listener, Router::new().nest_service("/mcp", service)).await;
    });

    let example = Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples/finance");
    let registry = dir.join("registry");
    copy_tree(&example, &registry);
    let yaml = std::fs::read_to_string(registry.join("toolgate.yaml")).expect("toolgate.yaml");
    let yaml = yaml
        .replace(
            "command: toolgate-fake-finance",
            &format!("url: \"http://{fake}/mcp\""),
        )
        .replace("    args: []\n", "");
    std::fs::write(registry.join("toolgate.yaml"), yaml).expect("toolgate.yaml written");
    toolgate_gateway::pins::rehome_lock(&registry).expect("the lock follows the fake");

    let opts = ServeOptions {
        config_dir: registry.clone(),
        http: true,
        store_url: Some(format!("sqlite://{}", dir.join("fuzz.db").display())),
        no_watch: true,
        // Not about keys: development keys, as `--dev`.
        keys: toolgate_gateway::KeySource::Dev,
        ..ServeOptions::default()
    };
    let gateway = Gateway::build(&opts).await.expect("the gateway builds");
    let app = gateway.http_app(peer(), CancellationToken::new());
    // The gateway lives as long as the process; its router holds what the requests need.
    std::mem::forget(gateway);
    app
}

fn copy_tree(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).expect("a folder");
    for entry in std::fs::read_dir(from).expect("the example folder") {
        let entry = entry.expect("an entry");
        let path = entry.path();
        if path.is_dir() {
            copy_tree(&path, &to.join(entry.file_name()));
        } else if path.extension().is_none_or(|e| e != "db") {
            std::fs::copy(&path, to.join(entry.file_name())).expect("a copy");
        }
    }
}

fn peer() -> SocketAddr {
    "127.0.0.1:4000".parse().expect("an address")
}

/// Opens an MCP session as the planner and returns its id.
async fn open_session(app: &Router) -> String {
    let init = r#"{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"fuzz","version":"0"}}}"#;
    let request = axum::http::Request::post("/mcp")
        .header("host", "localhost")
        .header("authorization", format!("Bearer {KEY}"))
        .header("content-type", "application/json")
        .header("accept", "application/json, text/event-stream")
        .body(Body::from(init))
        .expect("a request");
    let reply = app
        .clone()
        .oneshot(with_peer(request))
        .await
        .expect("a reply");
    let session = reply
        .headers()
        .get("mcp-session-id")
        .and_then(|v| v.to_str().ok())
        .expect("initialize opens a session")
        .to_string();
    let initialized = axum::http::Request::post("/mcp")
        .header("host", "localhost")
        .header("authorization", format!("Bearer {KEY}"))
        .header("content-type", "application/json")
        .header("accept", "application/json, text/event-stream")
        .header("mcp-session-id", &session)
        .body(Body::from(
            r#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#,
        ))
        .expect("a request");
    let _ = app.clone().oneshot(with_peer(initialized)).await;
    session
}

/// Signs in to the approver's page as alice (an approver of the finance example).
async fn sign_in(app: &Router) -> Signed {
    let request = axum::http::Request::post("/approvals/login")
        .header("host", "localhost")
        .header("cookie", "toolgate_login=seed")
        .header("content-type", "application/x-www-form-urlencoded")
        .body(Body::from("api_key=tgdev_fin_alice&csrf=seed"))
        .expect("a request");
    let reply = app
        .clone()
        .oneshot(with_peer(request))
        .await
        .expect("a reply");
    let cookie = reply
        .headers()
        .get_all("set-cookie")
        .iter()
        .filter_map(|v| v.to_str().ok())
        .find_map(|c| c.strip_prefix("toolgate_session="))
        .and_then(|c| c.split(';').next())
        .expect("signing in sets the session cookie")
        .to_string();
    let request = axum::http::Request::get("/approvals")
        .header("host", "localhost")
        .header("cookie", format!("toolgate_session={cookie}"))
        .body(Body::empty())
        .expect("a request");
    let reply = app
        .clone()
        .oneshot(with_peer(request))
        .await
        .expect("a reply");
    let page = reply.into_body().collect().await.expect("the queue page");
    let page = String::from_utf8_lossy(&page.to_bytes()).into_owned();
    let csrf = page
        .split("name=\"csrf\" value=\"")
        .nth(1)
        .and_then(|rest| rest.split('"').next())
        .unwrap_or_else(|| panic!("the queue page carries no form token:\n{page}"))
        .to_string();
    Signed { cookie, csrf }
}

fn with_peer(mut request: axum::http::Request<Body>) -> axum::http::Request<Body> {
    request.extensions_mut().insert(ConnectInfo(peer()));
    request
}

/// The input as a request, or `None` when it is not one.
fn parse(data: &[u8], surface: &Surface) -> Option<axum::http::Request<Body>> {
    let (head, body) = match data.windows(2).position(|w| w == b"\n\n") {
        Some(i) => (&data[..i], &data[i + 2..]),
        None => (data, &[][..]),
    };
    let head = std::str::from_utf8(head).ok()?;
    let mut lines = head.split('\n');
    let (method, path) = lines.next()?.split_once(' ')?;
    let mut request = axum::http::Request::builder().method(method).uri(path);
    let mut has_host = false;
    for line in lines {
        let (name, value) = line.split_once(':')?;
        let value = value
            .trim_start()
            .replace("$SESSION", &surface.session)
            .replace("$KEY", KEY)
            .replace("$CONSOLE", &surface.console.cookie)
            .replace("$CSRF", &surface.console.csrf);
        has_host |= name.eq_ignore_ascii_case("host");
        request = request.header(name, value);
    }
    if !has_host {
        request = request.header("host", "localhost");
    }
    let body = match std::str::from_utf8(body) {
        Ok(text) if text.contains("$CSRF") => {
            text.replace("$CSRF", &surface.console.csrf).into_bytes()
        }
        _ => body.to_vec(),
    };
    request.body(Body::from(body)).ok().map(with_peer)
}

fuzz_target!(|data: &[u8]| {
    let surface = surface();
    let Some(request) = parse(data, surface) else {
        return;
    };
    let app = surface.app.clone();
    surface.runtime.block_on(async move {
        let reply = tokio::time::timeout(Duration::from_secs(5), app.oneshot(request))
            .await
            .expect("the router answers within 5 s")
            .expect("the router is infallible");
        let status = reply.status();
        assert_ne!(
            status.as_u16(),
            500,
            "a request made the surface fail: {reply:?}"
        );
        assert_eq!(
            reply
                .headers()
                .get("x-content-type-options")
                .and_then(|v| v.to_str().ok()),
            Some("nosniff"),
            "a reply without nosniff: {reply:?}"
        );
        // Read what the reply says (a GET on /mcp may hold an event stream open: read a little).
        let _ = tokio::time::timeout(Duration::from_millis(200), reply.into_body().collect()).await;
    });
});
