//! The README's quickstart, run verbatim: the shell block under the `<!-- quickstart: … -->`
//! marker is extracted from README.md and run by bash in an empty folder, with this build's
//! `toolgate` first on PATH, exactly as a reader would paste it (npm and PyPI through their own
//! clients). It must end with the governed call's answer and its audit record. It serves on the
//! README's port (8480), so it waits for that port to be free first. Skipped with a notice when
//! node, npm, python3, curl or openssl are missing, except under CI=true.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

const MARKER: &str = "<!-- quickstart:";

/// The first ```sh block after the marker.
fn quickstart_block(readme: &str) -> String {
    let at = readme
        .find(MARKER)
        .expect("README.md has the quickstart marker");
    let rest = &readme[at..];
    let start = rest
        .find("```sh\n")
        .expect("a ```sh block after the marker")
        + "```sh\n".len();
    let end = rest[start..]
        .find("\n```\n")
        .expect("the quickstart block is closed");
    rest[start..start + end + 1].to_string()
}

fn have(program: &str) -> bool {
    Command::new("sh")
        .arg("-c")
        .arg(format!("command -v {program}"))
        .stdout(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

fn port_free(addr: &str) -> bool {
    std::net::TcpListener::bind(addr).is_ok()
}

#[test]
fn the_readme_quickstart_runs_verbatim() {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..");
    let readme = std::fs::read_to_string(root.join("README.md")).unwrap();
    let block = quickstart_block(&readme);
    let missing: Vec<&str> = ["node", "npm", "python3", "curl", "openssl", "bash"]
        .into_iter()
        .filter(|p| !have(p))
        .collect();
    if !missing.is_empty() {
        let ci = std::env::var("CI").is_ok_and(|v| v == "true" || v == "1");
        assert!(!ci, "the quickstart needs {missing:?} on PATH");
        eprintln!("SKIPPED: the quickstart needs {missing:?} on PATH");
        return;
    }
    let deadline = Instant::now() + Duration::from_secs(180);
    while !port_free("127.0.0.1:8480") {
        assert!(
            Instant::now() < deadline,
            "port 8480, the README's, stayed busy for 180 s"
        );
        std::thread::sleep(Duration::from_millis(500));
    }

    let tmp = tempfile::tempdir().unwrap();
    let bin_dir = Path::new(env!("CARGO_BIN_EXE_toolgate")).parent().unwrap();
    let path = format!(
        "{}:{}",
        bin_dir.display(),
        std::env::var("PATH").unwrap_or_default()
    );
    // The wrapper only stops on the first failing command and ends what the block started in
    // the background (`serve`); the block itself is as the README prints it.
    let script =
        format!("set -euo pipefail\ntrap 'kill $(jobs -p) 2>/dev/null || true' EXIT\n{block}");
    let started = Instant::now();
    let mut child = {
        use std::os::unix::process::CommandExt;
        Command::new("bash")
            .arg("-c")
            .arg(&script)
            .current_dir(tmp.path())
            .env("PATH", path)
            .env("RUST_LOG", "warn")
            .env_remove("TOOLGATE_CONFIG")
            .env_remove("TOOLGATE_STORE_URL")
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .process_group(0)
            .spawn()
            .unwrap()
    };
    let pgid = child.id();
    // A hung block is ended with everything it started.
    let (tx, rx) = std::sync::mpsc::channel::<()>();
    let watchdog = std::thread::spawn(move || {
        if rx.recv_timeout(Duration::from_secs(600)).is_err() {
            let _ = Command::new("kill")
                .arg("--")
                .arg(format!("-{pgid}"))
                .status();
        }
    });
    let mut stdout = String::new();
    let mut stderr = String::new();
    {
        use std::io::Read;
        let mut out = child.stdout.take().unwrap();
        let mut err = child.stderr.take().unwrap();
        let t = std::thread::spawn(move || {
            let mut s = String::new();
            let _ = err.read_to_string(&mut s);
            s
        });
        let _ = out.read_to_string(&mut stdout);
        stderr.push_str(&t.join().unwrap());
    }
    let status = child.wait().unwrap();
    let _ = tx.send(());
    watchdog.join().unwrap();
    let secs = started.elapsed().as_secs_f64();
    assert!(
        status.success(),
        "the quickstart failed ({status}) after {secs:.0} s:\n--- stdout\n{stdout}\n--- stderr\n{stderr}"
    );
    // The SDK listed the gated and ungated tools, the call came back, and its audit record.
    assert!(stdout.contains("'everything.echo'"), "{stdout}");
    assert!(
        stdout.contains("Echo: hello through toolgate"),
        "{stdout}\n{stderr}"
    );
    let record = stdout
        .lines()
        .find(|l| l.contains("\"everything.echo\""))
        .unwrap_or_else(|| panic!("no audit record of the call:\n{stdout}"));
    assert!(record.contains("\"allow\""), "{record}");
    assert!(stdout.contains("\"ready\":true"), "{stdout}");
    eprintln!("quickstart-timing: {secs:.1} s from an empty folder to the governed call's record");
}

#[test]
fn the_quickstart_block_is_found() {
    let readme = "x\n<!-- quickstart: y -->\n```sh\na\nb\n```\nafter\n```sh\nc\n```\n";
    assert_eq!(quickstart_block(readme), "a\nb\n");
}
