//! `toolgate serve`, `toolgate status` and `toolgate reload` as separate processes: the CLI finds
//! the running server through its status file, a reload of a broken folder is refused (exit 1,
//! the problems printed) while the old version keeps serving, and a fixed folder is applied.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};

fn toolgate(args: &[&str], dir: &Path) -> Output {
    Command::new(env!("CARGO_BIN_EXE_toolgate"))
        .args(args)
        .arg("--config")
        .arg(dir)
        .output()
        .expect("toolgate runs")
}

fn text(o: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for e in std::fs::read_dir(from).unwrap() {
        let e = e.unwrap();
        if e.file_type().unwrap().is_dir() {
            copy_dir(&e.path(), &to.join(e.file_name()));
        } else {
            std::fs::copy(e.path(), to.join(e.file_name())).unwrap();
        }
    }
}

/// Kills the server when the test ends, whatever happens.
struct Server(Child);

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[test]
fn reload_and_status_reach_the_running_server() {
    let tmp = tempfile::tempdir().unwrap();
    let dir: PathBuf = tmp.path().join("finance");
    copy_dir(
        &PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../examples/finance"),
        &dir,
    );
    // No status file: no server.
    let o = toolgate(&["status"], &dir);
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));

    let _server = Server(
        Command::new(env!("CARGO_BIN_EXE_toolgate"))
            .args([
                "serve",
                "--dev",
                "--http",
                "127.0.0.1:0",
                "--no-watch",
                "--config",
            ])
            .arg(&dir)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    );
    // Started on port 0: the status file says where it is once it is listening.
    let addr = toolgate_testkit::served_addr_blocking(&dir, _server.0.id(), None);
    assert_ne!(addr.port(), 0);
    let o = toolgate(&["status"], &dir);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    assert!(
        text(&o).contains("serving:  finance-example"),
        "{}",
        text(&o)
    );
    assert!(
        text(&o).contains(&format!("mcp:      http://{addr}/mcp")),
        "{}",
        text(&o)
    );
    assert!(
        text(&o).contains("on disk:  the same version"),
        "{}",
        text(&o)
    );

    // A broken policy: refused, the problems printed, the old version still serving.
    let broken = dir.join("policies/broken.cedar");
    std::fs::write(
        &broken,
        "@id(\"broken\")\nforbid (principal, action == Action::\"invoice.search\", resource)\n\
         when { context.inputs.no_such_field == \"x\" };\n",
    )
    .unwrap();
    let o = toolgate(&["reload"], &dir);
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    assert!(text(&o).contains("refused"), "{}", text(&o));
    assert!(text(&o).contains("broken"), "{}", text(&o));
    let o = toolgate(&["status"], &dir);
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    assert!(text(&o).contains("does not load"), "{}", text(&o));
    assert!(text(&o).contains("refused"), "{}", text(&o));

    // Fixed with a real change: applied.
    std::fs::remove_file(&broken).unwrap();
    std::fs::write(
        dir.join("policies/extra.cedar"),
        "@id(\"no-notes-marked-forbidden\")\nforbid (principal, action == Action::\"note.draft\", resource)\n\
         when { context.inputs.text like \"*FORBIDDEN*\" };\n",
    )
    .unwrap();
    let o = toolgate(&["reload"], &dir);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    assert!(text(&o).contains("applied"), "{}", text(&o));
    let o = toolgate(&["status"], &dir);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    assert!(
        text(&o).contains("on disk:  the same version"),
        "{}",
        text(&o)
    );
    assert!(text(&o).contains("last refused reload"), "{}", text(&o));

    // Both reloads are in the audit chain, and the chain verifies.
    let o = toolgate(&["log", "verify"], &dir);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    let o = toolgate(&["log", "export", "--principal", "toolgate"], &dir);
    let reloads: Vec<serde_json::Value> = String::from_utf8_lossy(&o.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .filter(|r: &serde_json::Value| r["tool"] == "registry.reload")
        .collect();
    let outcomes: Vec<&str> = reloads
        .iter()
        .map(|r| r["outcome"]["status"].as_str().unwrap())
        .collect();
    assert_eq!(outcomes, ["refused", "done"]);
}
