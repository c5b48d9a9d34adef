//! The stdio face and stdio upstreams: a principal fixed at start from an API key (here over an
//! in-memory pipe, which is what `serve_stdio` runs on stdin/stdout), and an upstream started as
//! a child process (the finance fake binary) that receives the derived key in `_meta`.

use crate::clients::workspace_binary;
use crate::common::*;
use rmcp::ServiceExt;
use serde_json::json;
use toolgate_gateway::{Gateway, GatewayServer, ServeOptions};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stdio_caller_is_fixed_by_its_key_and_a_child_process_upstream_gets_the_key() {
    let dir = tempfile::tempdir().unwrap();
    let record = dir.path().join("erp-calls.jsonl");
    write_registry(
        dir.path(),
        &format!(
            "    command: \"{}\"\n    args: [\"--record\", \"{}\"]\n    package: \"toolgate-fakes@0.1.0\"\n    timeout_secs: 5\n",
            workspace_binary("toolgate-fake-finance", "toolgate-fakes").display(),
            record.display()
        ),
    );
    let gw = Gateway::build(&ServeOptions {
        config_dir: dir.path().into(),
        stdio: true,
        keys: toolgate_gateway::KeySource::Dev,
        ..ServeOptions::default()
    })
    .await
    .unwrap();
    assert!(gw.stdio_caller(None).is_err());
    assert!(gw.stdio_caller(Some("wrong-key")).is_err());
    let caller = gw.stdio_caller(Some(WORKER_KEY)).unwrap();
    assert_eq!(caller.principal, "test-worker");

    let (server_io, client_io) = tokio::io::duplex(1 << 16);
    let server = GatewayServer::new(gw.state.clone(), Some(caller));
    tokio::spawn(async move {
        let running = server.serve(server_io).await.unwrap();
        let _ = running.waiting().await;
    });
    let client = ().serve(client_io).await.unwrap();
    let tools = client.peer().list_all_tools().await.unwrap();
    let got: std::collections::BTreeSet<String> =
        tools.iter().map(|t| t.name.to_string()).collect();
    let want: std::collections::BTreeSet<String> = gw
        .state
        .registry()
        .tools_for_role("worker.finance")
        .map(|t| t.name().to_string())
        .collect();
    assert_eq!(got, want);

    let r = call(
        &client,
        "note.draft",
        json!({"invoice_id": "INV-20260615", "kind": "info", "text": "Goods received in full."}),
        billing("record that the goods were received", "run-stdio"),
    )
    .await
    .unwrap();
    assert_ne!(r.is_error, Some(true), "{r:?}");
    let recs = toolgate_fakes::record::read_records(&record).unwrap();
    let drafts: Vec<_> = recs.iter().filter(|r| r.tool == "draft_note").collect();
    assert_eq!(drafts.len(), 1);
    let audit = gw
        .state
        .store
        .audit_records(Some(&"test-worker".into()), None)
        .await
        .unwrap();
    let last = serde_json::to_value(audit.last().unwrap()).unwrap();
    assert_eq!(
        drafts[0].idempotency_key.as_deref(),
        last["idem_key"].as_str()
    );
    let _ = client.cancel().await;
    gw.close().await;
}
