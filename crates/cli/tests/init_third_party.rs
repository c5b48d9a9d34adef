//! `toolgate init` against real MCP servers no one here wrote (installed at exact versions by
//! `scripts/install-third-party-servers.sh`: server-everything, server-filesystem,
//! server-memory, mcp-server-time) and a Python FastMCP server with optional fields
//! (tests/fixtures/fastmcp_inventory.py), each the way a new user meets it: the real binary
//! runs `init`, then `check` (clean: every decision left to a person is a refusal or a
//! `review:` line, not a finding), then `serve`; the official Python SDK's `Client`, as its
//! README shows and sending no `_meta`, lists the tools and calls one; the call is allowed and in
//! the audit chain, and `log verify` passes. Each step is timed (printed as `init-timing:`).
//! Skipped with a notice when the servers or the SDK are not installed, except under CI=true.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use toolgate_store::{AuditDecision, Store, StoreConfig};

fn toolgate() -> Command {
    Command::new(env!("CARGO_BIN_EXE_toolgate"))
}

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../..")
        .canonicalize()
        .unwrap()
}

fn in_ci() -> bool {
    std::env::var("CI").is_ok_and(|v| v == "true" || v == "1")
}

/// The installed servers' folder and the Python SDK client, or `None` after saying why.
fn installed() -> Option<(PathBuf, PathBuf)> {
    let tools = root().join(".tools/third-party");
    let python = root().join(".tools/pyclients/bin/python");
    let ready = tools
        .join("node_modules/@modelcontextprotocol/server-memory/dist/index.js")
        .is_file()
        && tools.join("venv/bin/mcp-server-time").is_file()
        && python.is_file();
    if ready {
        return Some((tools, python));
    }
    let why = "third-party MCP servers or the Python SDK are not installed: run \
               scripts/install-third-party-servers.sh and scripts/install-test-peers.sh";
    assert!(!in_ci(), "{why}");
    eprintln!("SKIPPED: {why}");
    None
}

/// Kills `toolgate serve` when the test ends, passed or not.
struct Serving(std::process::Child);

impl Drop for Serving {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

struct Case {
    upstream: &'static str,
    command: String,
    /// Tools listed ungated, gated, refused.
    counts: (usize, usize, usize),
    tool: &'static str,
    arguments: Value,
    expect: String,
}

fn node(tools: &Path, package: &str) -> String {
    tools
        .join(format!(
            "node_modules/@modelcontextprotocol/{package}/dist/index.js"
        ))
        .display()
        .to_string()
}

/// `(stdout, stderr)` of a command that must succeed.
fn run_ok(cmd: &mut Command, what: &str) -> (String, String) {
    let out = cmd.output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(
        out.status.success(),
        "{what} failed ({}):\n{stdout}\n{stderr}",
        out.status
    );
    (stdout, stderr)
}

async fn wait_ready(addr: &str, log: &Path) {
    let url = format!("http://{addr}/readyz");
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        if let Ok(r) = reqwest::get(&url).await
            && r.status().is_success()
        {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "toolgate serve was not ready in 60 s:\n{}",
            std::fs::read_to_string(log).unwrap_or_default()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

async fn init_check_serve_call(case: Case) {
    let Some((_, python)) = installed() else {
        return;
    };
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("gw");
    let key_file = tmp.path().join("agent.key");
    let t0 = Instant::now();

    // init: connects, proposes, checks, pins, prints the keys once.
    let (stdout, stderr) = run_ok(
        toolgate()
            .arg("init")
            .arg(&dir)
            .arg("--upstream")
            .arg(format!("{}={}", case.upstream, case.command))
            .arg("--approver")
            .arg("alice")
            .arg("--key-file")
            .arg(&key_file),
        "toolgate init",
    );
    let t_init = t0.elapsed();
    assert!(
        stderr.contains(&format!("toolgate init: connecting to {}", case.upstream)),
        "progress on stderr: {stderr}"
    );
    let (read, gated, refused) = case.counts;
    let line = format!(
        "{}: {} tools — {read} read, {gated} gated, {refused} refused",
        case.upstream,
        read + gated + refused
    );
    assert!(stdout.contains(&line), "expected '{line}' in:\n{stdout}");
    let key = std::fs::read_to_string(&key_file)
        .unwrap()
        .trim()
        .to_string();
    assert!(
        stdout.contains(&format!("agent    agent: {key}")),
        "the key is printed once: {stdout}"
    );
    let principals = std::fs::read_to_string(dir.join("principals.yaml")).unwrap();
    assert!(!principals.contains(&key), "only the key's hash is stored");
    assert!(principals.contains(&toolgate_core::registry::api_key_hash(&key)));
    let readme = std::fs::read_to_string(dir.join("README.md")).unwrap();
    assert!(readme.contains("## What to review"), "{readme}");
    assert!(
        readme.contains(&format!("## Upstream `{}`", case.upstream)),
        "{readme}"
    );
    let tools_file =
        std::fs::read_to_string(dir.join(format!("tools/{}.yaml", case.upstream))).unwrap();
    if refused > 0 {
        assert!(
            tools_file.contains("# Refused (not declared):"),
            "{tools_file}"
        );
    }
    assert!(dir.join("toolgate.lock").is_file());

    // check: clean, so `serve` and every reload take it as it is.
    let t1 = Instant::now();
    let (stdout, _) = run_ok(
        toolgate().arg("check").arg("-c").arg(&dir),
        "toolgate check",
    );
    assert!(stdout.starts_with("ok: "), "{stdout}");
    let t_check = t1.elapsed();

    // serve, then the Python SDK's Client as its README shows it: a URL, no `_meta`.
    let t2 = Instant::now();
    let log = tmp.path().join("serve.log");
    let log_file = std::fs::File::create(&log).unwrap();
    let _serving = Serving(
        toolgate()
            .arg("serve")
            .arg("-c")
            .arg(&dir)
            .args(["--http", "127.0.0.1:0", "--no-watch"])
            .env(
                "TOOLGATE_APPROVAL_KEY",
                "init-test-approval-key-0123456789abcdef",
            )
            .env(
                "TOOLGATE_REDACTION_KEY",
                "init-test-redaction-key-0123456789",
            )
            .env("RUST_LOG", "warn")
            .stdout(log_file.try_clone().unwrap())
            .stderr(log_file)
            .spawn()
            .unwrap(),
    );
    let addr = toolgate_testkit::served_addr(&dir, _serving.0.id(), Some(&log))
        .await
        .to_string();
    wait_ready(&addr, &log).await;
    let t_ready = t2.elapsed();
    let script = json!({
        "transport": "http",
        "url": format!("http://{addr}/mcp"),
        "client": "modern",
        "sessions": [{"bearer": key, "ops": [
            {"op": "list"},
            {"op": "call", "name": case.tool, "arguments": case.arguments},
        ]}],
    });
    let script_file = tmp.path().join("script.json");
    std::fs::write(&script_file, script.to_string()).unwrap();
    let t3 = Instant::now();
    let (stdout, _) = run_ok(
        Command::new(&python)
            .arg(root().join("tests/clients/python_client.py"))
            .arg(&script_file)
            .stdin(Stdio::null()),
        "the Python SDK client",
    );
    let t_call = t3.elapsed();
    let out: Value = serde_json::from_str(stdout.trim()).unwrap();
    let results = &out["sessions"][0]["results"];
    let listed: Vec<&str> = results[0]["tools"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["name"].as_str().unwrap())
        .collect();
    assert_eq!(listed.len(), read + gated, "listed: {listed:?}");
    assert!(listed.contains(&case.tool), "{listed:?}");
    let result = &results[1];
    assert_ne!(result["isError"], json!(true), "{result}");
    assert!(
        result.to_string().contains(&case.expect),
        "expected {:?} in {result}",
        case.expect
    );

    // The call is in the audit chain, allowed, as the agent; so are init's pins.
    let store = Store::connect(
        &format!("sqlite://{}", dir.join("toolgate.db").display()),
        StoreConfig::default(),
    )
    .await
    .unwrap();
    let audit = store.audit_records(None, None).await.unwrap();
    assert!(
        audit.iter().any(|r| r.body.tool == case.tool
            && r.body.who.principal == "agent"
            && r.body.why.decision == AuditDecision::Allow),
        "no allowed call of {} in the audit chain",
        case.tool
    );
    assert!(
        audit
            .iter()
            .any(|r| r.body.why.decision == AuditDecision::LockApproval
                && r.body.who.principal == "alice"),
        "init's pins are recorded as alice's approval"
    );
    store.close().await;
    let (stdout, _) = run_ok(
        toolgate().args(["log", "verify", "-c"]).arg(&dir),
        "toolgate log verify",
    );
    eprintln!("{}", stdout.trim());
    eprintln!(
        "init-timing: server={} listed={read} gated={gated} refused={refused} init={:.1}s \
         check={:.2}s serve-ready={:.1}s first-call={:.1}s total={:.1}s",
        case.upstream,
        t_init.as_secs_f64(),
        t_check.as_secs_f64(),
        t_ready.as_secs_f64(),
        t_call.as_secs_f64(),
        t0.elapsed().as_secs_f64()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn init_server_everything() {
    let Some((tools, _)) = installed() else {
        return;
    };
    init_check_serve_call(Case {
        upstream: "everything",
        command: format!("node {} stdio", node(&tools, "server-everything")),
        counts: (9, 2, 2),
        tool: "everything.echo",
        arguments: json!({"message": "hello through toolgate"}),
        expect: "hello through toolgate".into(),
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn init_server_filesystem() {
    let Some((tools, _)) = installed() else {
        return;
    };
    let share = tempfile::tempdir().unwrap();
    std::fs::write(share.path().join("invoice-20260611.txt"), "4,180.00 EUR").unwrap();
    let share = share.path().canonicalize().unwrap();
    init_check_serve_call(Case {
        upstream: "filesystem",
        command: format!(
            "node {} {}",
            node(&tools, "server-filesystem"),
            share.display()
        ),
        counts: (10, 4, 0),
        tool: "filesystem.list_directory",
        arguments: json!({"path": share.display().to_string()}),
        expect: "invoice-20260611.txt".into(),
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn init_server_memory() {
    let Some((tools, _)) = installed() else {
        return;
    };
    let data = tempfile::tempdir().unwrap();
    init_check_serve_call(Case {
        upstream: "memory",
        command: format!(
            "env MEMORY_FILE_PATH={} node {}",
            data.path().join("memory.jsonl").display(),
            node(&tools, "server-memory")
        ),
        counts: (3, 4, 2),
        tool: "memory.read_graph",
        arguments: json!({}),
        expect: "entities".into(),
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn init_mcp_server_time() {
    let Some((tools, _)) = installed() else {
        return;
    };
    init_check_serve_call(Case {
        upstream: "time",
        command: format!(
            "{} --local-timezone UTC",
            tools.join("venv/bin/mcp-server-time").display()
        ),
        counts: (2, 0, 0),
        tool: "time.get_current_time",
        arguments: json!({"timezone": "UTC"}),
        expect: "UTC".into(),
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn init_python_fastmcp_server_with_optional_fields() {
    let Some((tools, _)) = installed() else {
        return;
    };
    let server =
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/fastmcp_inventory.py");
    init_check_serve_call(Case {
        upstream: "inventory",
        command: format!(
            "{} {}",
            tools.join("venv/bin/python").display(),
            server.display()
        ),
        counts: (1, 1, 2),
        tool: "inventory.search_items",
        // Only the required field; the optional ones (`anyOf: [T, null]`) may be left out.
        arguments: json!({"query": "bolt"}),
        expect: "BOLT-M8".into(),
    })
    .await;
}

#[test]
fn init_refuses_a_non_empty_folder_and_add_keeps_what_a_person_edited() {
    let Some((tools, _)) = installed() else {
        return;
    };
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("gw");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("notes.txt"), "mine").unwrap();
    let everything = format!(
        "everything=node {} stdio",
        node(&tools, "server-everything")
    );
    let out = toolgate()
        .arg("init")
        .arg(&dir)
        .args(["--upstream", &everything])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("is not empty") && err.contains("--add"),
        "{err}"
    );
    assert_eq!(
        std::fs::read_to_string(dir.join("notes.txt")).unwrap(),
        "mine"
    );
    std::fs::remove_file(dir.join("notes.txt")).unwrap();

    run_ok(
        toolgate()
            .arg("init")
            .arg(&dir)
            .args(["--upstream", &everything, "--approver", "alice"]),
        "toolgate init",
    );
    // A person edits: a tighter bound on echo, a comment in toolgate.yaml, a budget.
    let edit = |file: &str, from: &str, to: &str| {
        let p = dir.join(file);
        let text = std::fs::read_to_string(&p).unwrap();
        assert!(text.contains(from), "{file}: {from}");
        std::fs::write(&p, text.replacen(from, to, 1)).unwrap();
    };
    edit("tools/everything.yaml", "maxLength: 1000", "maxLength: 200");
    edit(
        "toolgate.yaml",
        "upstreams:\n",
        "# ours: keep\nupstreams:\n",
    );
    edit("principals.yaml", "budgets: {act: 50}", "budgets: {act: 7}");
    let before: Vec<(String, String)> = ["tools/everything.yaml", "principals.yaml"]
        .iter()
        .map(|f| (f.to_string(), std::fs::read_to_string(dir.join(f)).unwrap()))
        .collect();

    let time = format!(
        "time={} --local-timezone UTC",
        tools.join("venv/bin/mcp-server-time").display()
    );
    let (stdout, _) = run_ok(
        toolgate().args(["init", "--add"]).arg(&dir).args([
            "--upstream",
            &time,
            "--approver",
            "alice",
        ]),
        "toolgate init --add",
    );
    assert!(stdout.contains("time: 2 tools — 2 read"), "{stdout}");
    assert!(
        !stdout.contains("API keys"),
        "--add makes no new keys: {stdout}"
    );
    for (f, text) in before {
        assert_eq!(std::fs::read_to_string(dir.join(&f)).unwrap(), text, "{f}");
    }
    let top = std::fs::read_to_string(dir.join("toolgate.yaml")).unwrap();
    assert!(top.contains("# ours: keep\nupstreams:\n  time:\n"), "{top}");
    assert!(top.contains("  everything:\n"), "{top}");
    let readme = std::fs::read_to_string(dir.join("README.md")).unwrap();
    assert!(readme.contains("## Upstream `everything`") && readme.contains("## Upstream `time`"));
    let lock = std::fs::read_to_string(dir.join("toolgate.lock")).unwrap();
    assert!(
        lock.contains("everything") && lock.contains("get_current_time"),
        "{lock}"
    );
    let (stdout, _) = run_ok(
        toolgate().arg("check").arg("-c").arg(&dir),
        "toolgate check",
    );
    assert!(stdout.starts_with("ok: 13 tools"), "{stdout}");

    // The same name twice is refused, and nothing changes.
    let out = toolgate()
        .args(["init", "--add"])
        .arg(&dir)
        .args(["--upstream", &time])
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("already declared"));
}
