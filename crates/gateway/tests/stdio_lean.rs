//! The lean stdio path (`src/stdio.rs`) and the lean stdio hop (`src/child.rs`), driven with raw
//! JSON-RPC lines over an in-memory pipe (what `serve --stdio` runs on stdin/stdout), in front
//! of the finance fake started as a child process that records every call. Each recorded
//! call's `_meta.progressToken` says the lean hop carried it (its ids are `tg-N`; rmcp's are
//! numbers); methods other than a plain `tools/call` are answered by rmcp on the same line.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader, DuplexStream, WriteHalf};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use toolgate_fakes::record::{Record, read_records};
use toolgate_gateway::{Gateway, GatewayError, KeySource, ServeOptions};

use crate::clients::workspace_binary;
use crate::common::*;

/// A stdio client speaking raw JSON-RPC lines to toolgate.
struct Client {
    dir: tempfile::TempDir,
    record: PathBuf,
    gateway: Arc<Gateway>,
    to: WriteHalf<DuplexStream>,
    from: mpsc::UnboundedReceiver<Value>,
    served: tokio::task::JoinHandle<Result<(), GatewayError>>,
}

impl Client {
    /// toolgate serving the test worker over stdio, in front of the finance fake started with
    /// `fake_args` (through a shell wrapper that notes the child's pid in `pid`), initialized.
    async fn start(fake_args: &[&str]) -> Client {
        let dir = tempfile::tempdir().unwrap();
        let record = dir.path().join("erp-calls.jsonl");
        let wrapper = dir.path().join("erp.sh");
        let mut args = format!("--record '{}'", record.display());
        for a in fake_args {
            args.push_str(&format!(" '{a}'"));
        }
        std::fs::write(
            &wrapper,
            format!(
                "#!/bin/sh\necho $$ > '{}'\nexec '{}' {args}\n",
                dir.path().join("pid").display(),
                workspace_binary("toolgate-fake-finance", "toolgate-fakes").display()
            ),
        )
        .unwrap();
        std::fs::set_permissions(
            &wrapper,
            std::os::unix::fs::PermissionsExt::from_mode(0o755),
        )
        .unwrap();
        write_registry(
            dir.path(),
            &format!(
                "    command: \"{}\"\n    args: []\n    package: \"toolgate-fakes@0.1.0\"\n    timeout_secs: 30\n",
                wrapper.display()
            ),
        );
        let gateway = Arc::new(
            Gateway::build(&ServeOptions {
                config_dir: dir.path().into(),
                stdio: true,
                keys: KeySource::Dev,
                ..ServeOptions::default()
            })
            .await
            .unwrap(),
        );
        let caller = gateway.stdio_caller(Some(WORKER_KEY)).unwrap();
        let (server_io, client_io) = tokio::io::duplex(1 << 16);
        let (server_in, server_out) = tokio::io::split(server_io);
        let served = {
            let gw = gateway.clone();
            tokio::spawn(async move {
                gw.serve_stdio_on(caller, server_in, server_out, CancellationToken::new())
                    .await
            })
        };
        let (client_in, to) = tokio::io::split(client_io);
        let (tx, from) = mpsc::unbounded_channel();
        tokio::spawn(async move {
            let mut lines = BufReader::new(client_in).lines();
            while let Ok(Some(line)) = lines.next_line().await {
                let message: Value = serde_json::from_str(&line).expect("each line is JSON");
                if tx.send(message).is_err() {
                    return;
                }
            }
        });
        let mut c = Client {
            dir,
            record,
            gateway,
            to,
            from,
            served,
        };
        c.send(
            json!({"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {
            "protocolVersion": "2025-06-18", "capabilities": {},
            "clientInfo": {"name": "raw", "version": "1"}}}),
        )
        .await;
        let (_, init) = c.reply(&json!(0)).await;
        assert!(init["result"]["serverInfo"].is_object(), "{init}");
        c.send(json!({"jsonrpc": "2.0", "method": "notifications/initialized"}))
            .await;
        c
    }

    async fn send(&mut self, message: Value) {
        let mut line = serde_json::to_vec(&message).unwrap();
        line.push(b'\n');
        self.to.write_all(&line).await.unwrap();
    }

    /// Reads until the reply to `id`: what came before it, and the reply.
    async fn reply(&mut self, id: &Value) -> (Vec<Value>, Value) {
        let mut before = Vec::new();
        loop {
            let m = self.from.recv().await.expect("toolgate answers");
            if m.get("id") == Some(id) && m.get("method").is_none() {
                return (before, m);
            }
            before.push(m);
        }
    }

    /// Closes stdin, and reads everything toolgate writes until it is done.
    async fn finish(mut self) -> (Vec<Value>, Arc<Gateway>, tempfile::TempDir, PathBuf) {
        self.to.shutdown().await.unwrap();
        self.served
            .await
            .unwrap()
            .expect("served until the client closed");
        let mut rest = Vec::new();
        while let Some(m) = self.from.recv().await {
            rest.push(m);
        }
        (rest, self.gateway, self.dir, self.record)
    }

    fn records(&self) -> Vec<Record> {
        read_records(&self.record).unwrap_or_default()
    }
}

fn search(id: Value, invoice: &str, run: &str, progress: Option<Value>) -> Value {
    let mut meta = json!({"purpose": "billing", "run_id": run});
    if let Some(p) = progress {
        meta["progressToken"] = p;
    }
    json!({"jsonrpc": "2.0", "id": id, "method": "tools/call", "params": {
        "name": "invoice.search", "arguments": {"invoice_id": invoice}, "_meta": meta}})
}

fn text_of(reply: &Value) -> String {
    reply["result"]["content"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|c| c["text"].as_str())
        .collect::<Vec<_>>()
        .join("\n")
}

/// The progress token the upstream saw on each recorded call.
fn upstream_tokens(records: &[Record]) -> Vec<String> {
    records
        .iter()
        .map(|r| {
            r.meta["progressToken"]
                .as_str()
                .unwrap_or("(not a string)")
                .to_string()
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_over_stdio_is_answered_under_its_id_and_reaches_the_child_on_the_lean_hop() {
    let mut c = Client::start(&[]).await;
    // Not a plain call: rmcp answers on the same stdio.
    c.send(json!({"jsonrpc": "2.0", "id": "list", "method": "tools/list"}))
        .await;
    let (_, list) = c.reply(&json!("list")).await;
    let names: Vec<&str> = list["result"]["tools"]
        .as_array()
        .expect("a tools/list result")
        .iter()
        .filter_map(|t| t["name"].as_str())
        .collect();
    assert!(names.contains(&"invoice.search"), "{list}");
    c.send(json!({"jsonrpc": "2.0", "id": 5, "method": "ping"}))
        .await;
    let (_, pong) = c.reply(&json!(5)).await;
    assert_eq!(pong["result"], json!({}), "{pong}");

    c.send(search(
        json!("c-1"),
        "INV-20260611",
        "run-stdio-lean-1",
        None,
    ))
    .await;
    let (_, reply) = c.reply(&json!("c-1")).await;
    assert_eq!(reply["jsonrpc"], "2.0");
    assert_ne!(reply["result"]["isError"], true, "{reply}");
    assert!(text_of(&reply).contains("INV-20260611"), "{reply}");
    c.send(search(json!(6), "INV-20260611", "run-stdio-lean-2", None))
        .await;
    let (_, reply) = c.reply(&json!(6)).await;
    assert_ne!(reply["result"]["isError"], true, "{reply}");

    let records = c.records();
    assert_eq!(records.len(), 2, "{records:?}");
    for token in upstream_tokens(&records) {
        assert!(token.starts_with("tg-"), "not the lean hop's id: {token}");
    }
    let audit = c
        .gateway
        .state
        .store
        .audit_records(Some(&"test-worker".into()), None)
        .await
        .unwrap();
    assert_eq!(audit.len(), 2, "one audit record per call");
    let (rest, gw, _dir, _) = c.finish().await;
    assert!(rest.is_empty(), "nothing after the replies: {rest:?}");
    gw.close().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_calls_get_their_own_progress_and_replies_and_rmcp_answers_between_them() {
    // Every search reports two progress steps, the last just before its answer.
    let mut c = Client::start(&["--fault", "slow=400,tool=search_invoices"]).await;
    c.send(search(
        json!(10),
        "INV-20260611",
        "run-a",
        Some(json!("tok-a")),
    ))
    .await;
    c.send(search(json!(11), "INV-20260612", "run-b", Some(json!(77))))
        .await;
    c.send(json!({"jsonrpc": "2.0", "id": 12, "method": "ping"}))
        .await;
    let mut seen = Vec::new();
    let mut replies = std::collections::BTreeMap::new();
    while replies.len() < 3 {
        let m = c.from.recv().await.expect("toolgate answers");
        if m.get("method").is_none() {
            replies.insert(m["id"].as_u64().expect("a numeric id"), seen.len());
        }
        seen.push(m);
    }
    assert_eq!(
        seen[replies[&12]]["result"],
        json!({}),
        "ping answered by rmcp"
    );
    for (id, token) in [(10u64, json!("tok-a")), (11, json!(77))] {
        let at = replies[&id];
        let reply = &seen[at];
        assert_ne!(reply["result"]["isError"], true, "{reply}");
        let progress: Vec<&Value> = seen
            .iter()
            .filter(|m| {
                m["method"] == "notifications/progress" && m["params"]["progressToken"] == token
            })
            .collect();
        assert_eq!(progress.len(), 2, "two steps under {token}: {seen:?}");
        let last = seen
            .iter()
            .rposition(|m| {
                m["method"] == "notifications/progress" && m["params"]["progressToken"] == token
            })
            .unwrap();
        assert!(last < at, "progress for {token} after its reply: {seen:?}");
    }
    // Nothing but these two tokens' progress and the three replies.
    assert_eq!(seen.len(), 7, "{seen:?}");
    assert!(
        upstream_tokens(&c.records())
            .iter()
            .all(|t| t.starts_with("tg-")),
        "{:?}",
        c.records()
    );
    let (_, gw, _dir, _) = c.finish().await;
    gw.close().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refusal_over_stdio_is_a_result_and_never_reaches_the_child() {
    let mut c = Client::start(&[]).await;
    let mut call = search(json!(20), "INV-20260611", "run-refused", None);
    call["params"]["_meta"]["purpose"] = json!("marketing");
    c.send(call).await;
    let (_, reply) = c.reply(&json!(20)).await;
    assert!(
        reply.get("error").is_none(),
        "a result, not an error: {reply}"
    );
    assert_eq!(reply["result"]["isError"], true, "{reply}");
    assert!(text_of(&reply).contains("marketing"), "{reply}");
    // An input the schema refuses, too.
    c.send(search(json!(21), "not-an-invoice", "run-refused-2", None))
        .await;
    let (_, reply) = c.reply(&json!(21)).await;
    assert_eq!(reply["result"]["isError"], true, "{reply}");
    assert!(text_of(&reply).contains("invoice_id"), "{reply}");
    assert!(c.records().is_empty(), "{:?}", c.records());
    let (_, gw, _dir, _) = c.finish().await;
    gw.close().await;
}

fn child_pid(dir: &Path) -> String {
    std::fs::read_to_string(dir.join("pid"))
        .unwrap()
        .trim()
        .to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_child_that_dies_mid_call_is_an_honest_error_and_the_next_call_starts_it_again() {
    // The search commits and never answers; the child is killed once it has the call.
    let mut c = Client::start(&["--fault", "timeout-after-commit,tool=search_invoices"]).await;
    c.send(search(json!(30), "INV-20260611", "run-died", None))
        .await;
    // The record is written when the fake has taken the call (and decided not to answer).
    let records = loop {
        if let Ok(m) = c.from.try_recv() {
            panic!("an answer before the child died: {m}");
        }
        let r = c.records();
        if !r.is_empty() {
            break r;
        }
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    };
    assert_eq!(records[0].outcome.status, "no_response", "{records:?}");
    let pid = child_pid(c.dir.path());
    let killed = std::process::Command::new("kill")
        .args(["-9", &pid])
        .status()
        .unwrap();
    assert!(killed.success());
    let (_, reply) = c.reply(&json!(30)).await;
    assert_eq!(reply["result"]["isError"], true, "{reply}");
    let text = text_of(&reply);
    assert!(
        text.contains("exited during the call") && text.contains("may have run"),
        "{reply}"
    );
    let audit = c
        .gateway
        .state
        .store
        .audit_records(Some(&"test-worker".into()), None)
        .await
        .unwrap();
    let last = serde_json::to_value(audit.last().unwrap()).unwrap();
    assert!(last.to_string().contains("unanswered.retryable"), "{last}");

    // The next call starts the upstream again and is answered.
    c.send(
        json!({"jsonrpc": "2.0", "id": 31, "method": "tools/call", "params": {
        "name": "purchase_order.get", "arguments": {"po_id": "PO-77812"},
        "_meta": {"purpose": "billing", "run_id": "run-after"}}}),
    )
    .await;
    let (_, reply) = c.reply(&json!(31)).await;
    assert_ne!(reply["result"]["isError"], true, "{reply}");
    assert_ne!(child_pid(c.dir.path()), pid, "a new child");
    let (_, gw, _dir, _) = c.finish().await;
    gw.close().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancelled_call_is_still_run_and_recorded_but_not_answered() {
    let mut c = Client::start(&["--fault", "slow=1500,tool=search_invoices"]).await;
    c.send(search(json!(40), "INV-20260611", "run-cancelled", None))
        .await;
    c.send(
        json!({"jsonrpc": "2.0", "method": "notifications/cancelled",
        "params": {"requestId": 40, "reason": "changed my mind"}}),
    )
    .await;
    c.send(json!({"jsonrpc": "2.0", "id": 41, "method": "ping"}))
        .await;
    let (before, _) = c.reply(&json!(41)).await;
    assert!(before.is_empty(), "{before:?}");
    // Closing stdin lets the calls in flight finish before toolgate stops writing.
    let (rest, gw, _dir, record) = c.finish().await;
    assert!(rest.is_empty(), "a reply to a cancelled call: {rest:?}");
    let records = read_records(&record).unwrap();
    assert_eq!(records.len(), 1, "the call still ran: {records:?}");
    let audit = gw
        .state
        .store
        .audit_records(Some(&"test-worker".into()), None)
        .await
        .unwrap();
    assert_eq!(audit.len(), 1, "and was recorded");
    gw.close().await;
}
