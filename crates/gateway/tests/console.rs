//! `toolgate serve` carries the approver's page and `/metrics` in the same process: the page
//! behind its sign-in, `/metrics` behind the scrape token named in toolgate.yaml, and the
//! security headers on every reply of the HTTP surface.

use crate::common::*;
use serde_json::json;

const SCRAPE_TOKEN: &str = "tg-test-scrape-token-0001";

/// The harness, with `metrics.token_file` in its toolgate.yaml.
async fn start() -> Harness {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("metrics-token"),
        format!("{SCRAPE_TOKEN}\n"),
    )
    .unwrap();
    let record = dir.path().join("erp-calls.jsonl");
    let (fake, fake_stop) = start_fake_finance(&record, Vec::new()).await;
    Harness::serve(
        dir,
        record,
        fake,
        fake_stop,
        "metrics:\n  token_file: metrics-token\n",
        None,
    )
    .await
}

fn client() -> reqwest::Client {
    reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serve_mounts_the_approval_page_and_metrics() {
    let h = start().await;
    let client = client();
    let base = format!("http://{}", h.addr);

    // The queue needs a signed-in approver: a visitor is sent to the sign-in page.
    let r = client
        .get(format!("{base}/approvals"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 303);
    let to = r.headers()["location"].to_str().unwrap().to_string();
    assert!(to.starts_with("/approvals/login"), "{to}");
    let page = client.get(format!("{base}{to}")).send().await.unwrap();
    assert_eq!(page.status().as_u16(), 200);
    assert!(
        page.text()
            .await
            .unwrap()
            .contains("action=\"/approvals/login\"")
    );

    // The surface numbers in the Prometheus format, to the holder of the scrape token only.
    let m = client.get(format!("{base}/metrics")).send().await.unwrap();
    assert_eq!(m.status().as_u16(), 401);
    let m = client
        .get(format!("{base}/metrics"))
        .bearer_auth("tg-test-scrape-token-0002")
        .send()
        .await
        .unwrap();
    assert_eq!(m.status().as_u16(), 401);
    let scrape = || async {
        let m = client
            .get(format!("{base}/metrics"))
            .bearer_auth(SCRAPE_TOKEN)
            .send()
            .await
            .unwrap();
        assert_eq!(m.status().as_u16(), 200);
        m.text().await.unwrap()
    };
    let before = scrape().await;
    assert!(before.contains("# TYPE toolgate_calls_total counter"));

    // A governed call (the peer is this host: the server records it) shows on the next scrape.
    let worker = h.client(WORKER_KEY).await;
    call(
        &worker,
        "invoice.search",
        json!({"invoice_id": "INV-20260611"}),
        billing("read the invoice", "run-metrics"),
    )
    .await
    .unwrap();
    let after = scrape().await;
    let series = "toolgate_calls_total{tool=\"invoice.search\",decision=\"allow\"} 1";
    assert!(
        !before.contains(series) && after.contains(series),
        "{after}"
    );
    h.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_reply_of_the_http_surface_carries_nosniff_and_a_csp() {
    let h = start().await;
    let client = client();
    let base = format!("http://{}", h.addr);
    let mcp_init = json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
        "protocolVersion": "2025-06-18", "capabilities": {},
        "clientInfo": {"name": "t", "version": "1"}}});
    let requests = [
        client.get(format!("{base}/healthz")),
        client.get(format!("{base}/readyz")),
        client.get(format!("{base}/.well-known/oauth-protected-resource")),
        client.get(format!("{base}/metrics")),
        client
            .get(format!("{base}/metrics"))
            .bearer_auth(SCRAPE_TOKEN),
        client.get(format!("{base}/approvals/login")),
        client.get(format!("{base}/approvals")),
        client.get(format!("{base}/no-such-route")),
        // /mcp without a credential (401 from the credential middleware), and with one.
        client.post(format!("{base}/mcp")).json(&mcp_init),
        client
            .post(format!("{base}/mcp"))
            .bearer_auth(WORKER_KEY)
            .header("accept", "application/json, text/event-stream")
            .json(&mcp_init),
    ];
    for req in requests {
        let r = req.send().await.unwrap();
        let what = format!("{} {}", r.status(), r.url().path());
        let hd = r.headers();
        assert_eq!(hd["x-content-type-options"], "nosniff", "{what}");
        let csp = hd["content-security-policy"].to_str().unwrap();
        assert!(
            csp.contains("default-src 'none'") && csp.contains("frame-ancestors 'none'"),
            "{what}: {csp}"
        );
        assert!(!csp.contains("unsafe-inline"), "{what}: {csp}");
    }
    h.shutdown().await;
}
