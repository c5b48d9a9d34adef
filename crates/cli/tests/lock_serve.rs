//! `toolgate lock approve` as an operator runs it beside a gateway that is serving: the finance
//! example with no `toolgate.lock`, its ERP a real child process (the finance fake). The new
//! server serves nothing; after the real command approves it, the running gateway serves it at
//! the pinned hashes, and the audit chain holds the block, the approval and the pins.

use std::path::{Path, PathBuf};
use std::process::Command;

use toolgate_gateway::{Gateway, ServeOptions};
use toolgate_store::AuditDecision;

fn toolgate() -> Command {
    Command::new(env!("CARGO_BIN_EXE_toolgate"))
}

fn fake_binary() -> PathBuf {
    // target/debug/deps/lock_serve-… → target/debug/toolgate-fake-finance
    let dir = std::env::current_exe()
        .unwrap()
        .parent()
        .unwrap()
        .parent()
        .unwrap()
        .to_path_buf();
    let bin = dir.join("toolgate-fake-finance");
    if !bin.exists() {
        let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
        let ok = Command::new(cargo)
            .args(["build", "-p", "toolgate-fakes", "--bins"])
            .status()
            .unwrap()
            .success();
        assert!(ok, "building toolgate-fakes failed");
    }
    bin
}

fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for e in std::fs::read_dir(from).unwrap() {
        let e = e.unwrap();
        let name = e.file_name().to_string_lossy().into_owned();
        if e.file_type().unwrap().is_dir() {
            copy_dir(&e.path(), &to.join(&name));
        } else if name != "toolgate.lock" && !name.contains(".db") {
            std::fs::copy(e.path(), to.join(&name)).unwrap();
        }
    }
}

/// The finance example without its lockfile, its ERP the fake binary, its store in `dir`.
fn registry(dir: &Path) {
    let example = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../examples/finance");
    copy_dir(&example, dir);
    let top = dir.join("toolgate.yaml");
    let text = std::fs::read_to_string(&top).unwrap();
    let text = text
        .replace(
            "command: toolgate-fake-finance",
            &format!("command: {:?}", fake_binary().display().to_string()),
        )
        .replace(
            "url: \"sqlite://finance.db\"",
            &format!(
                "url: {:?}",
                format!("sqlite://{}", dir.join("t.db").display())
            ),
        );
    assert!(text.contains("t.db") && !text.contains("command: toolgate-fake-finance"));
    std::fs::write(top, text).unwrap();
}

fn run(args: &[&str], dir: &Path) -> (i32, String, String) {
    let out = toolgate().args(args).arg("-c").arg(dir).output().unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_server_serves_nothing_until_toolgate_lock_approve() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    registry(dir);
    let gw = Gateway::build(&ServeOptions {
        config_dir: dir.to_path_buf(),
        http: true,
        keys: toolgate_gateway::KeySource::Dev,
        ..ServeOptions::default()
    })
    .await
    .unwrap();
    let ups = &gw.state.upstreams;
    let refusal = ups
        .pin_check("erp", "search_invoices")
        .await
        .unwrap_err()
        .to_string();
    assert!(refusal.contains("new server"), "{refusal}");
    assert!(refusal.contains("toolgate lock diff erp"), "{refusal}");
    assert!(!ups.is_served("erp", "search_invoices"));

    let (code, out, err) = run(&["lock", "status"], dir);
    assert_eq!(code, 1, "{out}{err}");
    assert!(out.contains("BLOCKED: new server"), "{out}");

    let (code, out, err) = run(&["lock", "approve", "--by", "alice"], dir);
    assert_eq!(code, 0, "{out}{err}");
    assert!(out.contains("recorded in the audit chain"), "{out}");

    // The running gateway picks the approval up (the lockfile is re-read on a refusal or a
    // tools/list) and serves at the hash the command pinned.
    let lock = toolgate_contract::Lockfile::read(&dir.join("toolgate.lock")).unwrap();
    let pinned = &lock.servers["erp"].tools["search_invoices"].sha256;
    let served = ups.pin_check("erp", "search_invoices").await.unwrap();
    assert_eq!(served.as_ref(), Some(pinned));
    assert_eq!(lock.servers["erp"].approved.by, "alice");

    let audit = gw.state.store.audit_records(None, None).await.unwrap();
    let kinds: Vec<AuditDecision> = audit.iter().map(|r| r.body.why.decision).collect();
    let block = kinds.iter().position(|k| *k == AuditDecision::PinBlock);
    let approval = kinds.iter().position(|k| *k == AuditDecision::LockApproval);
    let pin = kinds.iter().rposition(|k| *k == AuditDecision::Pin);
    assert!(
        block < approval && approval < pin && block.is_some(),
        "blocked, then approved, then served: {kinds:?}"
    );
    let a = &audit[approval.unwrap()].body;
    assert_eq!(a.who.principal, "alice");
    assert!(
        a.inputs["pins"]
            .as_array()
            .unwrap()
            .iter()
            .any(|p| p.as_str().unwrap().contains("erp/search_invoices")),
        "{}",
        a.inputs
    );
    let p = &audit[pin.unwrap()].body;
    assert_eq!(
        p.inputs["served"]["search_invoices"],
        serde_json::json!(pinned)
    );

    let (code, out, err) = run(&["log", "verify"], dir);
    assert_eq!(code, 0, "{out}{err}");
    gw.close().await;
}
