//! The lean path: a plain `tools/call` on a live session is answered by toolgate itself as one
//! JSON reply (or, when the call wants progress, as an event stream: its progress, then its
//! reply), the same governed call rmcp's handler makes; what it does not take (here, a call on
//! a closed session) is answered by rmcp as before.

use serde_json::{Value, json};

use crate::common::*;
use crate::principals::Raw;

fn draft(id: u64, invoice: &str, meta: Value) -> Value {
    json!({"jsonrpc": "2.0", "id": id, "method": "tools/call", "params": {
        "name": "note.draft",
        "arguments": {"invoice_id": invoice, "kind": "query", "text": "Please confirm the date.",
                      "reason": "ask the supplier about the delivery date"},
        "_meta": meta}})
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_plain_call_on_a_session_is_one_json_reply_and_the_rest_is_rmcps() {
    let h = Harness::start().await;
    let raw = Raw::new(&h.url);
    let session = raw.open(WORKER_KEY).await;

    let r = raw
        .send(
            WORKER_KEY,
            Some(&session),
            draft(41, "INV-20260615", json!({})),
        )
        .await;
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(r.content_type, "application/json", "{}", r.body);
    let reply: Value = serde_json::from_str(&r.body).expect("one JSON message");
    assert_eq!(reply["jsonrpc"], "2.0");
    assert_eq!(reply["id"], 41);
    assert_ne!(reply["result"]["isError"], true, "{reply}");
    assert_eq!(h.records_for("draft_note").len(), 1);
    let audit = h.audit("test-worker").await;
    assert!(
        audit.iter().any(|a| a["tool"] == "note.draft"),
        "the call is in the audit chain: {audit:?}"
    );

    // A refusal is a result too, on the same path.
    let r = raw
        .send(
            WORKER_KEY,
            Some(&session),
            json!({"jsonrpc": "2.0", "id": "x-1", "method": "tools/call", "params": {
                "name": "note.draft", "arguments": {"invoice_id": "bad"}}}),
        )
        .await;
    assert_eq!(r.content_type, "application/json", "{}", r.body);
    let reply: Value = serde_json::from_str(&r.body).unwrap();
    assert_eq!(reply["id"], "x-1");
    assert_eq!(reply["result"]["isError"], true, "{reply}");

    // A call that wants progress is answered by the lean path as an event stream: only its
    // reply here (the fake reports no progress on a quick call).
    let r = raw
        .send(
            WORKER_KEY,
            Some(&session),
            draft(42, "INV-20260612", json!({"progressToken": "p-1"})),
        )
        .await;
    assert_eq!(r.status, 200, "{}", r.body);
    assert!(
        r.content_type.starts_with("text/event-stream"),
        "{}",
        r.content_type
    );
    // rmcp's session streams give every event an id (for resumption); the lean one has none.
    assert!(
        !r.body.lines().any(|l| l.starts_with("id:")),
        "answered by rmcp, not the lean path: {}",
        r.body
    );
    let events: Vec<Value> = r
        .body
        .split("\n\n")
        .filter_map(|e| e.strip_prefix("data: "))
        .map(|d| serde_json::from_str(d).expect("each event is one JSON message"))
        .collect();
    assert_eq!(events.len(), 1, "{}", r.body);
    assert_eq!(events[0]["id"], 42);
    assert_ne!(events[0]["result"]["isError"], true, "{}", r.body);
    assert_eq!(h.records_for("draft_note").len(), 2);

    // A request naming a host toolgate does not serve (DNS rebinding) is refused as rmcp
    // refuses it, on a live session too, and nothing runs.
    let r = raw
        .send_with(
            WORKER_KEY,
            Some(&session),
            draft(44, "INV-20260613", json!({})),
            &[("host", "attacker.example")],
        )
        .await;
    assert_eq!(r.status, 403, "{}", r.body);
    assert_eq!(h.records_for("draft_note").len(), 2);

    // A closed session is rmcp's to answer, and nothing runs.
    let closed = raw.delete(WORKER_KEY, &session).await;
    assert!((200..300).contains(&closed.0), "{closed:?}");
    let r = raw
        .send(
            WORKER_KEY,
            Some(&session),
            draft(43, "INV-20260610", json!({})),
        )
        .await;
    assert_eq!(r.status, 404, "{}", r.body);
    assert_eq!(h.records_for("draft_note").len(), 2);
    h.shutdown().await;
}

/// A client that hangs up while its call is at the upstream does not cancel the call halfway:
/// it reaches the upstream once and is recorded, as if the client had waited.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_whose_client_hangs_up_still_runs_and_is_recorded() {
    let h = Harness::start_slow("draft_note", 600).await;
    let raw = Raw::new(&h.url);
    let session = raw.open(WORKER_KEY).await;
    let hung_up = tokio::time::timeout(
        std::time::Duration::from_millis(200),
        raw.send(
            WORKER_KEY,
            Some(&session),
            draft(51, "INV-20260615", json!({})),
        ),
    )
    .await;
    assert!(hung_up.is_err(), "the client gave up before the answer");
    assert!(
        h.records_for("draft_note").is_empty(),
        "still at the upstream"
    );

    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    let recorded = loop {
        let audit = h.audit("test-worker").await;
        let done = audit
            .iter()
            .any(|a| a["tool"] == "note.draft" && a["outcome"]["status"] == "done");
        if done || std::time::Instant::now() > deadline {
            break audit;
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    };
    assert!(
        recorded
            .iter()
            .any(|a| a["tool"] == "note.draft" && a["outcome"]["status"] == "done"),
        "the call ran to its end and was recorded: {recorded:?}"
    );
    assert_eq!(
        h.records_for("draft_note").len(),
        1,
        "reached the upstream once"
    );
    h.shutdown().await;
}
