//! Notifications of raised requests through the real `toolgate serve` (the finance example,
//! a real MCP client parking a payment), to webhooks served by this test: the one for the
//! payment's approvers gets exactly one post with the item's link, a webhook that fails twice
//! gets it on the third attempt and only once, a webhook nobody answers at does not hold up
//! the call and shows as retrying in `toolgate status` and `/metrics`, a webhook for other
//! approvers gets nothing, a webhook for the gate's rule gets it and one for another rule
//! does not; the agent's hostile reason arrives as inert text.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::extract::{Path as UrlPath, State};
use axum::http::StatusCode;
use axum::routing::post;
use serde_json::Value;

use crate::approvals_browser::{
    METRICS_TOKEN, Setup, WORKER_A, free_port, meta, payment, structured,
};
use crate::clients::workspace_binary;
use crate::common::{call, connect};

/// Every post the receiver got, by hook name; `fail[name]` posts are answered 500 first.
#[derive(Clone, Default)]
struct Receiver {
    posts: Arc<Mutex<BTreeMap<String, Vec<Value>>>>,
    fail: Arc<Mutex<BTreeMap<String, usize>>>,
}

impl Receiver {
    fn posts(&self, hook: &str) -> Vec<Value> {
        self.posts
            .lock()
            .unwrap()
            .get(hook)
            .cloned()
            .unwrap_or_default()
    }
}

async fn hook(
    State(r): State<Receiver>,
    UrlPath(name): UrlPath<String>,
    body: axum::body::Bytes,
) -> StatusCode {
    let v: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
    r.posts
        .lock()
        .unwrap()
        .entry(name.clone())
        .or_default()
        .push(v);
    let mut fail = r.fail.lock().unwrap();
    match fail.get_mut(&name) {
        Some(n) if *n > 0 => {
            *n -= 1;
            StatusCode::INTERNAL_SERVER_ERROR
        }
        _ => StatusCode::OK,
    }
}

async fn start_receiver() -> (Receiver, u16) {
    let r = Receiver::default();
    r.fail.lock().unwrap().insert("flaky".into(), 2);
    let app = axum::Router::new()
        .route("/hook/{name}", post(hook))
        .with_state(r.clone());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    tokio::spawn(async move { axum::serve(listener, app).await });
    (r, port)
}

async fn wait_until(what: &str, within: Duration, mut ok: impl FnMut() -> bool) {
    let deadline = Instant::now() + within;
    while !ok() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_parked_call_is_announced_once_retried_and_never_held_up() {
    let (rx, rport) = start_receiver().await;
    let dead = free_port();
    let mut dir = None;
    let setup = Setup::start_edited(|d: &Path| {
        dir = Some(d.to_path_buf());
        let f = d.join("toolgate.yaml");
        let text = std::fs::read_to_string(&f).unwrap();
        let hooks = format!(
            "approvals:\n  expiry_hours: 72\n  notify:\n    \
             desk: {{url: \"http://127.0.0.1:{rport}/hook/desk\", roles: [ap.clerk]}}\n    \
             flaky: {{url: \"http://127.0.0.1:{rport}/hook/flaky\"}}\n    \
             dead: {{url: \"http://127.0.0.1:{dead}/hook/dead\"}}\n    \
             vendors: {{url: \"http://127.0.0.1:{rport}/hook/vendors\", roles: [vendor.lead]}}\n    \
             ruled: {{url: \"http://127.0.0.1:{rport}/hook/ruled\", rules: [gate.always]}}\n    \
             large: {{url: \"http://127.0.0.1:{rport}/hook/large\", rules: [large-payment-needs-approval]}}\n\
             metrics:\n  token_env: TOOLGATE_METRICS_TOKEN\n"
        );
        let text = text.replace("approvals:\n  expiry_hours: 72\n", &hooks);
        std::fs::write(&f, text).unwrap();
    })
    .await;
    let dir = dir.unwrap();
    let a = connect(&setup.mcp, WORKER_A).await;
    // The agent's reason, in the inputs (at most 400 characters) and in `_meta` (up to 2,000).
    let hostile = "PO-77812 matched \u{1b}[2J\u{1b}[31mAPPROVED BY CFO\u{7}\r\n\u{202e}<!channel> <http://evil.example|pay> & co";
    let mut m = meta("notify-ü-run-日本");
    m["reason"] = Value::String(format!("{hostile} {}", "x".repeat(1_800)));
    let started = Instant::now();
    let r = call(
        &a,
        "payment.schedule",
        payment("INV-90000001", 4180.0, hostile),
        m,
    )
    .await
    .unwrap();
    let parked_in = started.elapsed();
    assert_eq!(structured(&r)["status"], "needs_approval", "{r:?}");
    assert!(
        parked_in < Duration::from_secs(2),
        "the call parked in {parked_in:?}: notifications must not hold it up"
    );
    let id = structured(&r)["approval_id"].as_str().unwrap().to_string();

    wait_until("the desk's post", Duration::from_secs(20), || {
        !rx.posts("desk").is_empty()
    })
    .await;
    wait_until("flaky's third attempt", Duration::from_secs(30), || {
        rx.posts("flaky").len() >= 3
    })
    .await;
    // Time for a second post, if there were going to be one.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let desk = rx.posts("desk");
    assert_eq!(desk.len(), 1, "exactly one post: {desk:?}");
    assert_eq!(
        rx.posts("flaky").len(),
        3,
        "two failures, one success, no more"
    );
    assert!(
        rx.posts("vendors").is_empty(),
        "vendor leads do not approve payments"
    );
    // By gate rule: the hook for the tool's own gate gets the payment once; the hook for the
    // large-payment rule, which did not gate it, gets nothing.
    let ruled = rx.posts("ruled");
    assert_eq!(ruled.len(), 1, "{ruled:?}");
    assert_eq!(ruled[0]["approval_id"], structured(&r)["approval_id"]);
    assert!(
        rx.posts("large").is_empty(),
        "a hook for another rule was told"
    );

    let post = &desk[0];
    let link = format!("http://127.0.0.1:{}/approvals/item/{id}", setup.port);
    assert_eq!(post["url"], link.as_str());
    assert_eq!(post["approval_id"], id.as_str());
    assert_eq!(post["tool"], "payment.schedule");
    let text = post["text"].as_str().unwrap();
    assert!(
        text.contains(&format!("<{link}|Open the request>")),
        "{text}"
    );
    assert!(text.contains("payment.schedule"), "{text}");
    assert!(
        text.contains("notify-ü-run-日本"),
        "the run id, multi-byte intact: {text}"
    );
    for bad in ['\u{1b}', '\u{7}', '\r', '\n', '\u{202e}'] {
        assert!(
            !text.contains(bad),
            "{bad:?} reached the chat text: {text:?}"
        );
    }
    assert!(text.contains("\\u{001b}[31mAPPROVED BY CFO"), "{text}");
    assert!(
        text.contains("&lt;!channel&gt;"),
        "a mention stays text: {text}"
    );
    assert!(
        text.contains("&lt;http://evil.example|pay&gt;"),
        "a link stays text: {text}"
    );
    assert!(!text.contains("<!channel>"), "{text}");
    assert!(
        text.chars().count() < 1_000,
        "the reason is cut: {} chars",
        text.chars().count()
    );
    // The link opens the item (after sign-in: the page asks for it).
    let http = reqwest::Client::builder()
        .no_proxy()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .unwrap();
    let page = http.get(&link).send().await.unwrap();
    assert!(
        page.status().is_redirection() || page.status().is_success(),
        "{}",
        page.status()
    );

    // The dead webhook: failing, retried, visible in status and /metrics.
    let status = tokio::process::Command::new(workspace_binary("toolgate", "toolgate"))
        .args(["status", "-c"])
        .arg(&dir)
        .output()
        .await
        .unwrap();
    let out = String::from_utf8_lossy(&status.stdout);
    assert!(
        out.contains("notifications desk: 1 sent, 0 waiting, 0 retrying, 0 failed"),
        "{out}\n{}",
        String::from_utf8_lossy(&status.stderr)
    );
    assert!(out.contains("notifications flaky: 1 sent"), "{out}");
    let dead_line = out
        .lines()
        .find(|l| l.starts_with("notifications dead:"))
        .unwrap_or_else(|| panic!("{out}"));
    assert!(
        dead_line.contains("0 sent") && dead_line.contains("1 retrying"),
        "{dead_line}"
    );
    assert!(dead_line.contains("last failure"), "{dead_line}");
    assert!(dead_line.to_lowercase().contains("refused"), "{dead_line}");
    assert!(
        out.contains("notifications vendors: 0 sent, 0 waiting"),
        "{out}"
    );

    let metrics = http
        .get(format!("http://127.0.0.1:{}/metrics", setup.port))
        .bearer_auth(METRICS_TOKEN)
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(
        metrics.contains("toolgate_notifications{webhook=\"desk\",state=\"sent\"} 1"),
        "{metrics}"
    );
    assert!(
        metrics.contains("toolgate_notifications{webhook=\"dead\",state=\"retrying\"} 1"),
        "{metrics}"
    );
    assert!(
        metrics.contains("toolgate_notification_last_failure_timestamp_seconds{webhook=\"dead\"}"),
        "{metrics}"
    );
    let mut serve = setup.serve;
    let _ = serve.kill().await;
}
