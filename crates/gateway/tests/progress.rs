//! Progress an upstream reports on a call reaches the caller that made it, under that caller's
//! own token, and no other caller: three clients call the same slow tool through toolgate at the
//! same time (the fake ERP reports two progress steps on a slow call), over the one connection
//! toolgate keeps to the ERP. rmcp's client numbers its progress tokens from 0 in each session,
//! so all three callers use the same token: routing by the caller's token instead of by the
//! forwarded call would deliver six notifications to one of them. Each client records every
//! `notifications/progress` it receives. And the official TypeScript SDK, which drops progress
//! that comes after its call's result, gets every step although the upstream reports the last
//! one just before it answers.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::clients::ts_client;
use crate::common::*;
use rmcp::model::{
    CallToolRequestParams, ClientCapabilities, ClientConfig, Implementation, MetaObject,
    ProgressNotificationParam, ProgressToken, RequestMetaObject,
};
use rmcp::service::{NotificationContext, RunningService};
use rmcp::transport::StreamableHttpClientTransport;
use rmcp::transport::streamable_http_client::StreamableHttpClientTransportConfig;
use rmcp::{ClientHandler, RoleClient, ServiceExt};
use serde_json::json;

/// A client that keeps every progress notification it is sent.
#[derive(Clone, Default)]
struct Listener {
    seen: Arc<Mutex<Vec<ProgressNotificationParam>>>,
}

impl ClientHandler for Listener {
    fn get_info(&self) -> ClientConfig {
        ClientConfig::new(
            ClientCapabilities::default(),
            Implementation::new("progress-test", "0.1.0"),
        )
    }

    async fn on_progress(
        &self,
        params: ProgressNotificationParam,
        _context: NotificationContext<RoleClient>,
    ) {
        self.seen.lock().unwrap().push(params);
    }
}

async fn listener(url: &str) -> (RunningService<RoleClient, Listener>, Listener) {
    let l = Listener::default();
    let transport = StreamableHttpClientTransport::from_config(
        StreamableHttpClientTransportConfig::with_uri(url).auth_header(WORKER_KEY),
    );
    (l.clone().serve(transport).await.unwrap(), l)
}

/// The gateway in front of a fake ERP whose `search_invoices` takes `ms` and reports two
/// progress steps, the last just before it answers.
async fn slow_search(ms: u64) -> Harness {
    Harness::start_slow("search_invoices", ms).await
}

/// A governed `invoice.search` in its own run.
fn search(run: &str) -> CallToolRequestParams {
    let mut p = CallToolRequestParams::new("invoice.search")
        .with_arguments(obj(json!({"invoice_id": "INV-20260615"})));
    p.meta = Some(RequestMetaObject(MetaObject(obj(billing("progress", run)))));
    p
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_caller_gets_only_its_own_calls_progress_under_its_own_token() {
    let h = slow_search(300).await;
    let (a, seen_a) = listener(&h.url).await;
    let (b, seen_b) = listener(&h.url).await;
    let (c, seen_c) = listener(&h.url).await;

    // rmcp's client puts a progress token of its own on every request.
    let (ra, rb, rc) = tokio::join!(
        a.peer().call_tool(search("progress-a")),
        b.peer().call_tool(search("progress-b")),
        c.peer().call_tool(search("progress-c")),
    );
    for r in [&ra, &rb, &rc] {
        assert_ne!(r.as_ref().unwrap().is_error, Some(true), "{r:?}");
    }

    // rmcp's client hands each notification to a task of its own, which can run just after the
    // call's answer is back: give those tasks a moment.
    for seen in [&seen_a, &seen_b, &seen_c] {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(2);
        while seen.seen.lock().unwrap().len() < 2 && tokio::time::Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }
    let tokens = |seen: &Listener| -> Vec<ProgressToken> {
        seen.seen
            .lock()
            .unwrap()
            .iter()
            .map(|p| p.progress_token.clone())
            .collect()
    };
    for (name, seen) in [("a", &seen_a), ("b", &seen_b), ("c", &seen_c)] {
        let t = tokens(seen);
        assert_eq!(
            t.len(),
            2,
            "both steps of {name}'s call reached {name}, nothing else: {t:?}"
        );
        // Under the token its own client put on its request (the first of the session).
        assert!(
            t.iter()
                .all(|t| *t == ProgressToken(rmcp::model::NumberOrString::Number(0))),
            "{t:?}"
        );
        let steps: Vec<f64> = seen
            .seen
            .lock()
            .unwrap()
            .iter()
            .map(|p| p.progress)
            .collect();
        assert_eq!(steps, [1.0, 2.0]);
        assert_eq!(
            seen.seen.lock().unwrap()[0].message.as_deref(),
            Some("search_invoices step 1")
        );
    }

    // After the call returned, a late progress for it goes nowhere: nothing more arrives.
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(tokens(&seen_a).len(), 2);
    assert_eq!(
        h.records_for("search_invoices").len(),
        3,
        "one delivery per call"
    );
    h.shutdown().await;
}

/// The official TypeScript SDK as its README shows (`callTool(params, schema, {onprogress})`,
/// the SDK choosing the token): the fake ERP reports its last step just before it answers, and
/// the SDK ignores progress for a call whose result it already has. Over ten calls in one
/// session, every step of each reaches the caller, in order, before the result. (The race this
/// guards against showed most over a stdio upstream under load: the conformance suite's
/// `tools-call-with-progress`, run by `tests/conformance/run.sh`, lost the last step of 3 in 40
/// calls before progress was taken from the transport as it is read, none of 60 after.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn progress_reported_just_before_the_answer_reaches_the_caller_before_the_answer() {
    let Some(client) = ts_client() else { return };
    let h = slow_search(100).await;
    let ops: Vec<_> = (0..10)
        .map(|i| {
            json!({"op": "call", "name": "invoice.search", "progress": true,
                   "arguments": {"invoice_id": "INV-20260615"},
                   "meta": billing("progress", &format!("progress-ts-{i}"))})
        })
        .collect();
    let out = client
        .run(&json!({"transport": "http", "url": h.url,
                     "sessions": [{"bearer": WORKER_KEY, "ops": ops}]}))
        .await;
    let results = out["sessions"][0]["results"].as_array().unwrap();
    assert_eq!(results.len(), 10);
    for (i, r) in results.iter().enumerate() {
        assert_ne!(r["isError"], true, "call {i}: {r}");
        let steps: Vec<f64> = r["progress"]
            .as_array()
            .unwrap()
            .iter()
            .map(|p| p["progress"].as_f64().unwrap())
            .collect();
        assert_eq!(steps, [1.0, 2.0], "call {i}: {r}");
        assert_eq!(r["progress"][1]["message"], "search_invoices step 2");
    }
    assert_eq!(
        h.records_for("search_invoices").len(),
        10,
        "one delivery per call"
    );
    h.shutdown().await;
}
