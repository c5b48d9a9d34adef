//! An HTTP upstream with `keep_alive: true` is reached over connections toolgate keeps open:
//! sequential governed calls reuse them, where rmcp's default client opens a new TCP connection
//! for every request. Counted at the fake's listener, with the fake's record confirming every
//! call arrived.

use std::sync::atomic::Ordering;

use crate::common::*;
use serde_json::json;

const CALLS: usize = 16;

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
async fn keep_alive_reuses_connections_to_the_upstream() {
    let fresh = connections_for_calls(false).await;
    assert!(
        fresh >= CALLS,
        "without keep_alive every call has its own connection: {fresh} for {CALLS} calls"
    );
    let kept = connections_for_calls(true).await;
    // Not always zero: toolgate's rmcp client opens its standing GET stream to the upstream in
    // the background, and a call can start before the last response has finished and freed its
    // connection. Without reuse it would be one per call.
    assert!(
        kept <= CALLS / 4,
        "with keep_alive the calls share kept connections: {kept} for {CALLS} calls"
    );
}
