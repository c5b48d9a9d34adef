//! `toolgate audit`, `toolgate lock` and `toolgate registry diff` as a user runs them: the real
//! binary against a small stdio MCP server (tests/fixtures/fake_mcp_server.py in
//! toolgate-contract, Python standard library only) whose tool list a test rewrites between runs.

use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::{Value, json};

fn toolgate() -> Command {
    Command::new(env!("CARGO_BIN_EXE_toolgate"))
}

fn fake_server() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../contract/tests/fixtures/fake_mcp_server.py")
        .canonicalize()
        .unwrap()
}

fn run(cmd: &mut Command) -> (i32, String, String) {
    let out = cmd.output().expect("run toolgate");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

fn send_email() -> Value {
    json!({
        "name": "send_email",
        "description": "Send one email.",
        "inputSchema": {
            "type": "object",
            "additionalProperties": false,
            "required": ["to", "idempotency_key"],
            "properties": {
                "to": {"type": "string", "format": "email", "maxLength": 254},
                "idempotency_key": {"type": "string", "maxLength": 64}
            }
        },
        "annotations": {"readOnlyHint": false, "destructiveHint": false,
                        "idempotentHint": true, "openWorldHint": true}
    })
}

fn list_inbox() -> Value {
    json!({
        "name": "list_inbox",
        "description": "List the inbox.",
        "inputSchema": {"type": "object", "additionalProperties": false,
                        "properties": {"limit": {"type": "integer", "minimum": 1, "maximum": 50}}},
        "annotations": {"readOnlyHint": true, "openWorldHint": false}
    })
}

fn write_spec(path: &Path, tools: &[Value]) {
    let spec = json!({"name": "mail", "version": "1.0.15", "tools": tools});
    std::fs::write(path, serde_json::to_string_pretty(&spec).unwrap()).unwrap();
}

#[test]
fn audit_exit_code_follows_fail_on() {
    let dir = tempfile::tempdir().unwrap();
    let spec = dir.path().join("tools.json");
    let mut open = send_email();
    open["inputSchema"]["additionalProperties"] = json!(true);
    write_spec(&spec, &[open, list_inbox()]);
    let audit = |fail_on: &str| {
        run(toolgate()
            .args(["audit", "--fail-on", fail_on, "--", "python3"])
            .arg(fake_server())
            .arg(&spec))
    };
    let (code, out, err) = audit("medium");
    assert_eq!(code, 1, "an open schema is medium: {out}{err}");
    assert!(out.contains("open-schema"), "{out}");
    assert!(out.contains("UNDETERMINED  implementation"), "{out}");
    let (code, _, err) = audit("high");
    assert_eq!(code, 0, "nothing high: {err}");
}

#[test]
fn audit_sarif_and_json_formats() {
    let dir = tempfile::tempdir().unwrap();
    let spec = dir.path().join("tools.json");
    write_spec(&spec, &[send_email(), list_inbox()]);
    let (code, out, err) = run(toolgate()
        .args(["audit", "--format", "sarif", "--", "python3"])
        .arg(fake_server())
        .arg(&spec));
    assert_eq!(code, 0, "{err}");
    let sarif: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(sarif["version"], "2.1.0");
    assert_eq!(sarif["runs"][0]["tool"]["driver"]["name"], "toolgate");
    let (code, out, _) = run(toolgate()
        .args(["audit", "--format", "json", "--", "python3"])
        .arg(fake_server())
        .arg(&spec));
    assert_eq!(code, 0);
    let report: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(report["server"]["name"], "mail");
    assert_eq!(report["tools"].as_array().unwrap().len(), 2);
}

#[test]
fn audit_lock_writes_a_lockfile_with_the_approver() {
    let dir = tempfile::tempdir().unwrap();
    let spec = dir.path().join("tools.json");
    write_spec(&spec, &[send_email(), list_inbox()]);
    let lock = dir.path().join("toolgate.lock");
    let (code, _, err) = run(toolgate()
        .args(["audit", "--by", "carol", "--name", "mail", "--lock"])
        .arg(&lock)
        .args(["--", "python3"])
        .arg(fake_server())
        .arg(&spec));
    assert_eq!(code, 0, "{err}");
    let text = std::fs::read_to_string(&lock).unwrap();
    assert!(text.contains("by: carol"), "{text}");
    assert!(text.contains("send_email:"), "{text}");
}

/// A registry folder whose one upstream is the fake server reading `tools.json` beside it.
fn registry(dir: &Path) {
    std::fs::write(
        dir.join("toolgate.yaml"),
        format!(
            "upstreams:\n  mail:\n    command: python3\n    args: [{:?}, tools.json]\n    package: \"mail-mcp@1.0.15\"\n",
            fake_server().display().to_string()
        ),
    )
    .unwrap();
    std::fs::write(dir.join("principals.yaml"), "principals: []\n").unwrap();
    write_spec(&dir.join("tools.json"), &[send_email(), list_inbox()]);
}

fn lock_cmd(dir: &Path, args: &[&str]) -> (i32, String, String) {
    run(toolgate()
        .arg("lock")
        .arg(args[0])
        .arg("--config")
        .arg(dir)
        .args(&args[1..]))
}

#[test]
fn lock_status_diff_and_approve_round() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    registry(dir);

    // A new server serves nothing until approved.
    let (code, out, err) = lock_cmd(dir, &["status"]);
    assert_eq!(code, 1, "{out}{err}");
    assert!(out.contains("BLOCKED: new server"), "{out}");

    let (code, out, err) = lock_cmd(dir, &["approve", "mail", "--by", "alice"]);
    assert_eq!(code, 0, "{out}{err}");
    assert!(out.contains("approved by alice"), "{out}");
    let (code, out, _) = lock_cmd(dir, &["status"]);
    assert_eq!(code, 0, "{out}");
    assert!(
        out.contains("mail: 2 served, 0 blocked, 0 removed; ok"),
        "{out}"
    );

    // The upstream quietly adds a cc field and drops a bound.
    let mut changed = send_email();
    changed["inputSchema"]["properties"]["cc"] = json!({"type": "string"});
    changed["inputSchema"]["properties"]["to"]
        .as_object_mut()
        .unwrap()
        .remove("maxLength");
    write_spec(&dir.join("tools.json"), &[changed, list_inbox()]);
    let (code, out, _) = lock_cmd(dir, &["diff"]);
    assert_eq!(code, 1);
    insta::assert_snapshot!("lock_diff_cli", out);
    let (code, out, _) = lock_cmd(dir, &["status"]);
    assert_eq!(code, 1);
    assert!(out.contains("1 served, 1 blocked (1 widening)"), "{out}");

    // Approving the one tool re-pins it, by bob; the other keeps alice's approval.
    let (code, out, err) = lock_cmd(dir, &["approve", "mail", "send_email", "--by", "bob"]);
    assert_eq!(code, 0, "{out}{err}");
    let (code, out, _) = lock_cmd(dir, &["status"]);
    assert_eq!(code, 0, "{out}");
    let lock = std::fs::read_to_string(dir.join("toolgate.lock")).unwrap();
    let send = lock.split("send_email:").nth(1).unwrap();
    assert!(send.contains("by: bob"), "{lock}");
    let inbox = lock.split("list_inbox:").nth(1).unwrap();
    assert!(inbox.contains("by: alice"), "{lock}");

    // A broken lockfile is refused with the path of the problem.
    std::fs::write(
        dir.join("toolgate.lock"),
        lock.replace("version: 1\n", "version: 1\nextra: x\n"),
    )
    .unwrap();
    let (code, _, err) = lock_cmd(dir, &["status"]);
    assert_eq!(code, 2);
    assert!(err.contains("toolgate.lock: extra"), "{err}");
}

#[test]
fn registry_diff_fails_on_a_behaviour_change_without_a_version_bump() {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path();
    std::fs::create_dir_all(root.join("tools")).unwrap();
    std::fs::write(root.join("toolgate.yaml"), "label: t\n").unwrap();
    let v1 = "tools:\n  - name: notes.add\n    version: \"1\"\n    owner: \"@acme/ops\"\n    description: Add a note.\n    effect: write\n    tier: act\n    sensitivity: internal\n    purposes: [ops]\n    roles: [worker]\n    handler: { upstream: notes }\n    input_schema: { type: object, additionalProperties: false, properties: { text: { type: string, maxLength: 500 } } }\n";
    std::fs::write(root.join("tools/notes.yaml"), v1).unwrap();
    let git = |args: &[&str]| {
        let ok = Command::new("git")
            .arg("-C")
            .arg(root)
            .args(["-c", "user.name=t", "-c", "user.email=t@example.com"])
            .args(args)
            .status()
            .unwrap()
            .success();
        assert!(ok, "git {args:?}");
    };
    git(&["init", "-q"]);
    git(&["add", "."]);
    git(&["commit", "-q", "-m", "v1"]);
    let wider = v1.replace("maxLength: 500", "maxLength: 5000");
    std::fs::write(root.join("tools/notes.yaml"), &wider).unwrap();
    let diff = |strict: bool| {
        let mut c = toolgate();
        c.args(["registry", "diff", "HEAD", "--config"]).arg(root);
        if strict {
            c.arg("--strict");
        }
        run(&mut c)
    };
    let (code, out, err) = diff(false);
    assert_eq!(code, 1, "{out}{err}");
    assert!(
        out.contains("[widening] input_schema.properties.text.maxLength"),
        "{out}"
    );
    assert!(
        out.contains("needs review and approval by @acme/ops"),
        "{out}"
    );

    std::fs::write(
        root.join("tools/notes.yaml"),
        wider.replace("version: \"1\"", "version: \"2\""),
    )
    .unwrap();
    let (code, out, _) = diff(false);
    assert_eq!(code, 0, "bumped: {out}");
    let (code, _, _) = diff(true);
    assert_eq!(code, 1, "--strict fails on a widening change");
}
