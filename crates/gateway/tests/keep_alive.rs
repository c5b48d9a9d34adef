//! Governed calls to an HTTP upstream go over connections toolgate keeps open (the lean hop,
//! `src/hop.rs`), with `keep_alive` or without it: sequential calls reuse them, where rmcp's
//! default client opened a new TCP connection for every request. (`keep_alive` now decides only
//! rmcp's own requests: `tools/list`, prompts, resources.) Counted at the fake's listener, with
//! the fake's record confirming every call arrived.

use std::sync::atomic::Ordering;

use crate::common::*;
use serde_json::json;

/// Enough calls that the few connections rmcp's client opens in the background (its standing GET
/// stream, its first posts, a stream re-opened on a loaded machine: five were seen once) cannot
/// pass for reuse, and one connection per call cannot pass for it either.
const CALLS: usize = 48;

/// Makes `CALLS` governed reads through toolgate and returns how many TCP connections the fake
/// accepted for them (after the client and toolgate had connected).
async fn connections_for_calls(keep_alive: bool) -> usize {
    let dir = tempfile::tempdir().unwrap();
    let record = dir.path().join("erp-calls.jsonl");
    let (fake, fake_stop, accepted) = start_fake_finance_counted(&record, Vec::new()).await;
    let extra = if keep_alive {
        "    keep_alive: true\n"
    } else {
        ""
    };
    let h = Harness::serve(dir, record, fake, fake_stop, extra, None).await;
    let client = h.client(WORKER_KEY).await;

    let before = accepted.load(Ordering::SeqCst);
    for i in 0..CALLS {
        let r = call(
            &client,
            "invoice.search",
            json!({"invoice_id": "INV-20260615"}),
            billing("keep-alive", &format!("keep-alive-{keep_alive}-{i}")),
        )
        .await
        .unwrap();
        assert_ne!(r.is_error, Some(true), "{r:?}");
    }
    let used = accepted.load(Ordering::SeqCst) - before;
    assert_eq!(h.records_for("search_invoices").len(), CALLS);
    let _ = client.cancel().await;
    h.shutdown().await;
    used
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn governed_calls_reuse_connections_to_the_upstream() {
    // Not always zero: toolgate's rmcp client opens its standing GET stream to the upstream in
    // the background, and its first posts open connections of their own. Without reuse it
    // would be one per call.
    for keep_alive in [false, true] {
        let used = connections_for_calls(keep_alive).await;
        assert!(
            used <= CALLS / 4,
            "keep_alive {keep_alive}: the calls share kept connections: {used} for {CALLS} calls"
        );
    }
}
