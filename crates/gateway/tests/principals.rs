//! Two principals against each other: sessions, runs and approvals belong to the principal that
//! opened, started or asked for them. Agent B holds a valid key of its own and uses it on what
//! is A's: A's `Mcp-Session-Id` (a request, a DELETE), A's `_meta.run_id`, the inputs of A's
//! approved payment (with A's approval token in its `_meta`). Each is refused without telling
//! B whether A's session exists, nothing reaches the upstream, and A carries on unaffected.

use serde_json::{Value, json};
use toolgate_core::{Clock, SystemClock};
use toolgate_store::ApprovalStatus;

use crate::common::*;

const PROTOCOL: &str = "2025-11-25";

/// A raw streamable-HTTP client: exactly the bytes a hostile peer could send.
pub(crate) struct Raw {
    http: reqwest::Client,
    url: String,
}

/// One reply as [`Raw`] read it.
pub(crate) struct Reply {
    pub status: u16,
    pub content_type: String,
    pub body: String,
    pub session: Option<String>,
}

impl Raw {
    pub(crate) fn new(url: &str) -> Raw {
        Raw {
            http: reqwest::Client::new(),
            url: url.to_string(),
        }
    }

    async fn post(
        &self,
        key: &str,
        session: Option<&str>,
        body: Value,
    ) -> (u16, String, Option<String>) {
        let r = self.send(key, session, body).await;
        (r.status, r.body, r.session)
    }

    pub(crate) async fn send(&self, key: &str, session: Option<&str>, body: Value) -> Reply {
        self.send_with(key, session, body, &[]).await
    }

    /// As [`Raw::send`], with `headers` added (or replacing the client's own, such as `host`).
    pub(crate) async fn send_with(
        &self,
        key: &str,
        session: Option<&str>,
        body: Value,
        headers: &[(&str, &str)],
    ) -> Reply {
        let mut req = self
            .http
            .post(&self.url)
            .bearer_auth(key)
            .header("accept", "application/json, text/event-stream")
            .header("content-type", "application/json")
            .header("mcp-protocol-version", PROTOCOL)
            .json(&body);
        if let Some(s) = session {
            req = req.header("mcp-session-id", s);
        }
        for (name, value) in headers {
            req = req.header(*name, *value);
        }
        let r = req.send().await.unwrap();
        let header = |name: &str| {
            r.headers()
                .get(name)
                .and_then(|v| v.to_str().ok())
                .map(str::to_string)
        };
        let (session, content_type) = (header("mcp-session-id"), header("content-type"));
        Reply {
            status: r.status().as_u16(),
            content_type: content_type.unwrap_or_default(),
            session,
            body: r.text().await.unwrap(),
        }
    }

    pub(crate) async fn delete(&self, key: &str, session: &str) -> (u16, String) {
        let r = self
            .http
            .delete(&self.url)
            .bearer_auth(key)
            .header("mcp-session-id", session)
            .header("mcp-protocol-version", PROTOCOL)
            .send()
            .await
            .unwrap();
        (r.status().as_u16(), r.text().await.unwrap())
    }

    /// Opens a session as the holder of `key`.
    pub(crate) async fn open(&self, key: &str) -> String {
        let (status, body, sid) = self
            .post(
                key,
                None,
                json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
                    "protocolVersion": PROTOCOL, "capabilities": {},
                    "clientInfo": {"name": "raw", "version": "1"}}}),
            )
            .await;
        assert_eq!(status, 200, "{body}");
        let sid = sid.expect("a session id");
        let (status, _, _) = self
            .post(
                key,
                Some(&sid),
                json!({"jsonrpc": "2.0", "method": "notifications/initialized"}),
            )
            .await;
        assert!(status == 202 || status == 200, "initialized: {status}");
        sid
    }

    async fn list(&self, key: &str, session: &str) -> (u16, String) {
        let (s, b, _) = self
            .post(
                key,
                Some(session),
                json!({"jsonrpc": "2.0", "id": 2, "method": "tools/list"}),
            )
            .await;
        (s, b)
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_answers_only_to_the_principal_that_opened_it() {
    let h = Harness::start().await;
    let raw = Raw::new(&h.url);
    let a = raw.open(WORKER_KEY).await;
    let (ok, listed) = raw.list(WORKER_KEY, &a).await;
    assert_eq!(ok, 200, "{listed}");
    assert!(listed.contains("payment.schedule"));

    // B on A's session: answered exactly as on a session that does not exist.
    let unknown = raw
        .list(WORKER_B_KEY, "0190f0d2-0000-7000-8000-000000000000")
        .await;
    let hijack = raw.list(WORKER_B_KEY, &a).await;
    assert_eq!(hijack.0, unknown.0);
    assert_eq!(hijack.1, unknown.1);
    assert_ne!(hijack.0, 200);
    assert!(!hijack.1.contains("payment.schedule"));
    // The same for a call on it: nothing reaches the upstream.
    let (status, body, _) = raw
        .post(
            WORKER_B_KEY,
            Some(&a),
            json!({"jsonrpc": "2.0", "id": 3, "method": "tools/call", "params": {
                "name": "note.draft",
                "arguments": {"invoice_id": "INV-20260615", "kind": "query", "text": "x",
                              "reason": "a call on someone else's session"}}}),
        )
        .await;
    assert_eq!((status, body.as_str()), (unknown.0, unknown.1.as_str()));
    assert!(h.records_for("draft_note").is_empty());

    // B's DELETE of A's session: the same answer as for an unknown one, and A's session lives.
    let unknown_delete = raw
        .delete(WORKER_B_KEY, "0190f0d2-0000-7000-8000-000000000000")
        .await;
    let delete = raw.delete(WORKER_B_KEY, &a).await;
    assert_eq!(delete, unknown_delete);
    assert_eq!(raw.list(WORKER_KEY, &a).await.0, 200);

    // A closes its own session.
    let (status, _) = raw.delete(WORKER_KEY, &a).await;
    assert!((200..300).contains(&status), "{status}");
    assert_ne!(raw.list(WORKER_KEY, &a).await.0, 200);
    h.shutdown().await;
}

fn note(invoice: &str, kind: &str) -> Value {
    json!({"invoice_id": invoice, "kind": kind, "text": "Please confirm the delivery date."})
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_takes_calls_only_from_the_principal_that_started_it() {
    let h = Harness::start().await;
    let a = h.client(WORKER_KEY).await;
    let b = h.client(WORKER_B_KEY).await;
    let r = call(
        &a,
        "note.draft",
        note("INV-20260615", "query"),
        billing("ask the supplier about the delivery", "run-of-a"),
    )
    .await
    .unwrap();
    assert_ne!(r.is_error, Some(true), "{r:?}");

    // B names A's run: refused, recorded outside A's run, nothing sent. Also a call that
    // would be refused anyway (it would count as a denial of whatever run it landed in).
    for args in [note("INV-20260612", "hold"), json!({"invoice_id": "bad"})] {
        let r = call(
            &b,
            "note.draft",
            args,
            billing("a note in someone else's run", "run-of-a"),
        )
        .await
        .unwrap();
        assert_eq!(r.is_error, Some(true));
        let facts = r.structured_content.unwrap();
        assert_eq!(facts["rule"], "run.foreign", "{facts}");
    }
    assert_eq!(h.records_for("draft_note").len(), 1);
    let b_audit = h.audit("test-worker-b").await;
    assert_eq!(b_audit.len(), 2);
    assert!(b_audit.iter().all(|r| r["run_id"].is_null()), "{b_audit:?}");

    // A's run saw no denial: A's payment in it is parked for a person, not refused by
    // no-spend-after-denial.
    let pay = json!({"invoice_id": "INV-20260612", "amount": 12600.0, "currency": "EUR",
                     "value_date": "2026-07-03",
                     "reason": "Freight invoice INV-20260612 matched against PO-77840"});
    let r = call(
        &a,
        "payment.schedule",
        pay,
        billing("pay the freight invoice", "run-of-a"),
    )
    .await
    .unwrap();
    assert_eq!(
        r.structured_content.unwrap()["status"],
        "needs_approval",
        "A's run is not poisoned by B"
    );
    h.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_approval_runs_only_the_call_of_the_principal_that_asked() {
    let h = Harness::start().await;
    let a = h.client(WORKER_KEY).await;
    let b = h.client(WORKER_B_KEY).await;
    let pay = json!({"invoice_id": "INV-20260612", "amount": 12600.0, "currency": "EUR",
                     "value_date": "2026-07-03",
                     "reason": "Freight invoice INV-20260612 matched against PO-77840"});
    let meta = json!({"purpose": "billing"});
    let parked = call(&a, "payment.schedule", pay.clone(), meta.clone())
        .await
        .unwrap();
    let id = parked.structured_content.unwrap()["approval_id"]
        .as_str()
        .unwrap()
        .to_string();
    let ex = h.gateway.state.executor();
    let token = h
        .gateway
        .state
        .store
        .approve(
            &ex.registry,
            &ex.keys,
            &id.as_str().into(),
            &"test-clerk".into(),
            SystemClock.now(),
        )
        .await
        .unwrap();

    // B makes the same call, with A's token in its _meta: B's own request is parked; A's
    // approval does not run it.
    let mut with_token = meta.clone();
    with_token["approval_token"] = json!(token.as_str());
    for m in [meta.clone(), with_token] {
        let r = call(&b, "payment.schedule", pay.clone(), m).await.unwrap();
        let facts = r.structured_content.unwrap();
        assert_eq!(facts["status"], "needs_approval", "{facts}");
        assert_ne!(facts["approval_id"], json!(id));
    }
    assert!(h.records_for("schedule_payment").is_empty());
    let store = &h.gateway.state.store;
    assert_eq!(
        store.approval(&id.as_str().into()).await.unwrap().status,
        ApprovalStatus::Approved
    );

    // A's plain retry runs it, once.
    let r = call(&a, "payment.schedule", pay.clone(), meta.clone())
        .await
        .unwrap();
    assert_ne!(r.is_error, Some(true), "{r:?}");
    let r = call(&a, "payment.schedule", pay, meta).await.unwrap();
    assert_ne!(r.is_error, Some(true), "{r:?}");
    assert_eq!(h.records_for("schedule_payment").len(), 1);
    // Nothing of toolgate's own went upstream: no approval token, no purpose or reason.
    let sent = &h.records_for("schedule_payment")[0];
    for k in sent.meta.as_object().unwrap().keys() {
        assert!(
            [
                "idempotency_key",
                "run_id",
                "step_id",
                "traceparent",
                "progressToken"
            ]
            .contains(&k.as_str()),
            "the upstream received _meta.{k}"
        );
    }
    h.shutdown().await;
}
