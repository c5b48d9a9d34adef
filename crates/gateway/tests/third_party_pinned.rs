//! Real third-party MCP servers no one here wrote (installed at exact versions by
//! `scripts/install-third-party-servers.sh`), pinned in `toolgate.lock` the way
//! `toolgate lock approve` pins them, served behind toolgate, and a tool of each called through
//! the gateway by a real rmcp client. Skipped with a notice when the servers are not installed,
//! except under CI=true, where a missing install is a failure.

use std::path::{Path, PathBuf};
use std::time::Duration;

use rmcp::ServiceExt;
use rmcp::model::{CallToolRequestParams, MetaObject, RequestMetaObject};
use rmcp::transport::StreamableHttpClientTransport;
use rmcp::transport::streamable_http_client::StreamableHttpClientTransportConfig;
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;
use toolgate_contract::client::{Target, observe};
use toolgate_contract::{Approval, Lockfile, ServerIdentity};
use toolgate_core::registry::{Sources, api_key_hash};
use toolgate_gateway::{Gateway, ServeOptions};
use toolgate_store::AuditDecision;

const KEY: &str = "tg-test-third-party-0001";

fn tools_dir() -> Option<PathBuf> {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../.tools/third-party");
    let ready = dir
        .join("node_modules/@modelcontextprotocol/server-memory/dist/index.js")
        .is_file()
        && dir.join("venv/bin/mcp-server-time").is_file();
    if ready {
        return Some(dir.canonicalize().unwrap());
    }
    if std::env::var("CI").as_deref() == Ok("true") {
        panic!(
            "third-party MCP servers are not installed in {}: CI must run scripts/install-third-party-servers.sh first",
            dir.display()
        );
    }
    eprintln!(
        "SKIPPED: third-party MCP servers not installed; run scripts/install-third-party-servers.sh"
    );
    None
}

fn node(dir: &Path, package: &str) -> String {
    dir.join(format!(
        "node_modules/@modelcontextprotocol/{package}/dist/index.js"
    ))
    .display()
    .to_string()
}

/// One read tool per server, each with a schema of our own (the registry is our contract).
fn tool(name: &str, upstream: &str, upstream_tool: &str, props: Value) -> Value {
    json!({
        "name": name,
        "version": "1.0.0",
        "owner": "@toolgate/tests",
        "description": format!("{upstream_tool} of the third-party {upstream} server."),
        "effect": "read",
        "tier": "read",
        "sensitivity": "internal",
        "scopes": ["thirdparty:read"],
        "purposes": ["testing"],
        "roles": ["tester"],
        "handler": {"upstream": upstream, "tool": upstream_tool},
        "input_schema": {"type": "object", "additionalProperties": false, "properties": props},
    })
}

fn write_registry(reg: &Path, tools: &Path, root: &Path, memory: &Path) {
    let q = |s: &str| serde_json::to_string(s).unwrap();
    let upstreams = format!(
        "upstreams:\n\
         \x20 everything:\n    command: node\n    args: [{}, stdio]\n    package: \"@modelcontextprotocol/server-everything@2026.8.31\"\n    timeout_secs: 30\n\
         \x20 filesystem:\n    command: node\n    args: [{}, {}]\n    package: \"@modelcontextprotocol/server-filesystem@2026.8.31\"\n    timeout_secs: 30\n\
         \x20 memory:\n    command: env\n    args: [{}, node, {}]\n    package: \"@modelcontextprotocol/server-memory@2026.8.31\"\n    timeout_secs: 30\n\
         \x20 time:\n    command: {}\n    args: [--local-timezone, UTC]\n    package: \"mcp-server-time==2026.10.19\"\n    timeout_secs: 30\n",
        q(&node(tools, "server-everything")),
        q(&node(tools, "server-filesystem")),
        q(&root.display().to_string()),
        q(&format!("MEMORY_FILE_PATH={}", memory.display())),
        q(&node(tools, "server-memory")),
        q(&tools.join("venv/bin/mcp-server-time").display().to_string()),
    );
    std::fs::write(
        reg.join("toolgate.yaml"),
        format!("label: third-party\nstore:\n  url: \"sqlite://third-party.db\"\n{upstreams}"),
    )
    .unwrap();
    std::fs::create_dir_all(reg.join("tools")).unwrap();
    let decls = json!({"tools": [
        tool("tp.echo", "everything", "echo", json!({"message": {"type": "string", "maxLength": 200}})),
        tool("tp.list_dir", "filesystem", "list_directory", json!({"path": {"type": "string", "maxLength": 500}})),
        tool("tp.read_graph", "memory", "read_graph", json!({})),
        tool("tp.now", "time", "get_current_time", json!({"timezone": {"type": "string", "enum": ["UTC"]}})),
    ]});
    std::fs::write(reg.join("tools/third-party.yaml"), decls.to_string()).unwrap();
    std::fs::write(
        reg.join("principals.yaml"),
        format!(
            "roles:\n  tester: {{description: \"calls third-party servers\"}}\nprincipals:\n  - id: tester\n    kind: agent\n    role: tester\n    credentials:\n      - {{id: t, sha256: \"{}\"}}\n    grants:\n      - scopes: [thirdparty:read]\n        purposes: [testing]\n        max_tier: read\n        max_sensitivity: internal\n",
            api_key_hash(KEY)
        ),
    )
    .unwrap();
}

/// What `toolgate lock approve` does for every declared upstream: spawn it as the gateway
/// will, read `initialize` and `tools/list`, pin it all.
async fn approve_all(reg: &Path) -> Lockfile {
    let sources = Sources::read(reg).unwrap();
    let mut lock = Lockfile::default();
    for (name, cfg) in &sources.gateway.upstreams {
        let target = Target::Command {
            program: cfg.command.clone().unwrap(),
            args: cfg.args.clone(),
            dir: Some(reg.to_path_buf()),
            env: Some(cfg.env.clone()),
        };
        let seen = observe(&target, Duration::from_secs(60))
            .await
            .unwrap_or_else(|e| panic!("{name}: {e}"));
        lock.approve(
            name,
            &ServerIdentity::from_upstream(cfg),
            &seen.facts,
            &seen.tools,
            None,
            &Approval::now("alice"),
        )
        .unwrap();
    }
    lock.write(&reg.join("toolgate.lock")).unwrap();
    lock
}

fn text(r: &rmcp::model::CallToolResult) -> String {
    r.content
        .iter()
        .filter_map(|c| c.as_text().map(|t| t.text.clone()))
        .collect::<Vec<_>>()
        .join("\n")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn third_party_servers_pinned_behind_toolgate_answer_through_it() {
    let Some(tools) = tools_dir() else { return };
    let reg = tempfile::tempdir().unwrap();
    let root = tempfile::tempdir().unwrap();
    std::fs::write(root.path().join("invoice-20260611.txt"), "4,180.00 EUR").unwrap();
    let root_path = root.path().canonicalize().unwrap();
    let memory = tempfile::tempdir().unwrap();
    write_registry(
        reg.path(),
        &tools,
        &root_path,
        &memory.path().join("memory.jsonl"),
    );
    let lock = approve_all(reg.path()).await;
    assert_eq!(lock.servers.len(), 4);

    let gw = Gateway::build(&ServeOptions {
        config_dir: reg.path().to_path_buf(),
        http: true,
        keys: toolgate_gateway::KeySource::Dev,
        ..ServeOptions::default()
    })
    .await
    .unwrap();
    for name in ["everything", "filesystem", "memory", "time"] {
        let v = gw.state.upstreams.verdict(name).unwrap();
        assert!(v.is_clean(), "{name}: {}", v.status_line());
        assert_eq!(v.allowed.len(), lock.servers[name].tools.len(), "{name}");
    }
    let stop = CancellationToken::new();
    let (addr, fut) = gw.bind_http("127.0.0.1:0", stop.clone()).await.unwrap();
    tokio::spawn(fut);
    let client = ()
        .serve(StreamableHttpClientTransport::from_config(
            StreamableHttpClientTransportConfig::with_uri(format!("http://{addr}/mcp"))
                .auth_header(KEY),
        ))
        .await
        .unwrap();
    let mut names: Vec<String> = client
        .peer()
        .list_all_tools()
        .await
        .unwrap()
        .iter()
        .map(|t| t.name.to_string())
        .collect();
    names.sort();
    assert_eq!(names, ["tp.echo", "tp.list_dir", "tp.now", "tp.read_graph"]);

    let calls = [
        (
            "tp.echo",
            json!({"message": "hello through toolgate"}),
            "hello through toolgate",
        ),
        (
            "tp.list_dir",
            json!({"path": root_path.display().to_string()}),
            "invoice-20260611.txt",
        ),
        ("tp.read_graph", json!({}), "entities"),
        ("tp.now", json!({"timezone": "UTC"}), "UTC"),
    ];
    for (i, (tool, args, expect)) in calls.into_iter().enumerate() {
        let mut p =
            CallToolRequestParams::new(tool).with_arguments(args.as_object().unwrap().clone());
        p.meta = Some(RequestMetaObject(MetaObject(
            json!({"purpose": "testing", "reason": "third-party pin check", "run_id": format!("tp-{i}")})
                .as_object()
                .unwrap()
                .clone(),
        )));
        let r = client.peer().call_tool(p).await.unwrap();
        assert_ne!(r.is_error, Some(true), "{tool}: {}", text(&r));
        let body = format!(
            "{}{}",
            text(&r),
            r.structured_content.clone().unwrap_or_default()
        );
        assert!(body.contains(expect), "{tool}: {body}");
    }

    // The pins in force are in the audit chain, hash for hash, and each call was allowed.
    let audit = gw.state.store.audit_records(None, None).await.unwrap();
    for (name, pin) in &lock.servers {
        let rec = audit
            .iter()
            .find(|r| {
                r.body.why.decision == AuditDecision::Pin
                    && r.body.tool == format!("upstream:{name}")
            })
            .unwrap_or_else(|| panic!("no pin record for {name}"));
        for (tool, p) in &pin.tools {
            assert_eq!(
                rec.body.inputs["served"][tool],
                json!(p.sha256),
                "{name}/{tool}"
            );
        }
    }
    let allowed = audit
        .iter()
        .filter(|r| r.body.who.principal == "tester" && r.body.why.decision == AuditDecision::Allow)
        .count();
    assert_eq!(allowed, 4);
    client.cancel().await.unwrap();
    stop.cancel();
    gw.close().await;
}
