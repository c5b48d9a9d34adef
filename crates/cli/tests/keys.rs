//! `toolgate serve` and `toolgate worker` as processes, and their keys: without an approval key
//! and a redaction key they refuse to start (exit 2, before opening the store) with a message
//! naming both ways to give each and how to make one; with keys from the environment or from
//! key files they start (`/readyz` says `configured`); a key file every user can read is
//! refused; `--dev` starts, prints what it gives up and says `dev` in `/readyz`.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

const APPROVAL: &str = "cli-test-approval-key-0123456789abcdef0123";
const REDACTION: &str = "cli-test-redaction-key-0123456789abcdef012";

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

/// The finance example in a temporary folder (its upstream is not on PATH here, so it serves
/// without it: enough for what starting needs).
fn finance() -> (tempfile::TempDir, PathBuf) {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("finance");
    copy_dir(
        &PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../examples/finance"),
        &dir,
    );
    (tmp, dir)
}

/// A `toolgate` command with no key in its environment but those the test gives.
fn toolgate(args: &[&str], dir: &Path) -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_toolgate"));
    c.args(args)
        .arg("--config")
        .arg(dir)
        .env_remove("TOOLGATE_APPROVAL_KEY")
        .env_remove("TOOLGATE_REDACTION_KEY")
        .env("RUST_LOG", "warn")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    c
}

/// Kills the server when the test ends, whatever happens.
struct Server(Child);

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

impl Server {
    fn stderr(mut self) -> String {
        let _ = self.0.kill();
        let _ = self.0.wait();
        let mut s = String::new();
        if let Some(mut e) = self.0.stderr.take() {
            e.read_to_string(&mut s).unwrap();
        }
        s
    }
}

/// Waits for a process that must exit by itself; kills it (failing the test) after 60 s.
fn exits(mut c: Command) -> (ExitStatus, String) {
    let mut child = c.spawn().unwrap();
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            let mut text = String::new();
            child
                .stderr
                .take()
                .unwrap()
                .read_to_string(&mut text)
                .unwrap();
            child
                .stdout
                .take()
                .unwrap()
                .read_to_string(&mut text)
                .unwrap();
            return (status, text);
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            panic!("the process did not exit: it started without its keys");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// `GET /readyz` once the server answers (503 is an answer: the example's upstream is absent).
fn readyz(addr: SocketAddr, server: &mut Server) -> serde_json::Value {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        if let Ok(mut s) = TcpStream::connect(addr) {
            s.write_all(b"GET /readyz HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n")
                .unwrap();
            let mut resp = String::new();
            s.read_to_string(&mut resp).unwrap();
            if let Some((_, body)) = resp.split_once("\r\n\r\n") {
                return serde_json::from_str(body.trim()).unwrap_or_else(|e| {
                    panic!("/readyz answered {resp:?}: {e}");
                });
            }
        }
        if let Some(status) = server.0.try_wait().unwrap() {
            let mut text = String::new();
            server
                .0
                .stderr
                .take()
                .unwrap()
                .read_to_string(&mut text)
                .unwrap();
            panic!("toolgate serve exited ({status}) instead of serving:\n{text}");
        }
        assert!(Instant::now() < deadline, "toolgate serve did not answer");
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// `toolgate serve` on a port it picks; the server and the address it bound.
fn serve(dir: &Path, extra: &[&str], env: &[(&str, &str)]) -> (Server, SocketAddr) {
    let mut args = vec!["serve", "--http", "127.0.0.1:0", "--no-watch"];
    args.extend_from_slice(extra);
    let mut c = toolgate(&args, dir);
    for (k, v) in env {
        c.env(k, v);
    }
    let server = Server(c.spawn().unwrap());
    let addr = toolgate_testkit::served_addr_blocking(dir, server.0.id(), None);
    (server, addr)
}

fn write_key(path: &Path, key: &str, mode: u32) {
    std::fs::write(path, format!("{key}\n")).unwrap();
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).unwrap();
    }
    #[cfg(not(unix))]
    let _ = mode;
}

/// Adds key files to the example's toolgate.yaml.
fn use_key_files(dir: &Path) {
    let top = dir.join("toolgate.yaml");
    let text = std::fs::read_to_string(&top).unwrap();
    let text = text.replace(
        "approvals:\n  expiry_hours: 72\n",
        "approvals:\n  expiry_hours: 72\n  key_file: ../approval.key\nredaction:\n  key_file: ../redaction.key\n",
    );
    assert!(text.contains("key_file: ../approval.key"));
    std::fs::write(&top, text).unwrap();
}

#[test]
fn serve_and_worker_without_keys_refuse_to_start_saying_how_to_give_them() {
    let (_t, dir) = finance();
    for cmd in [
        &["serve", "--http", "127.0.0.1:0", "--no-watch"][..],
        &["worker", "--until-idle"][..],
    ] {
        let (status, text) = exits(toolgate(cmd, &dir));
        assert_eq!(status.code(), Some(2), "{cmd:?}: {text}");
        for needle in [
            "refusing to start without its keys",
            "no approval key",
            "TOOLGATE_APPROVAL_KEY",
            "approvals.key_file",
            "no redaction key",
            "TOOLGATE_REDACTION_KEY",
            "redaction.key_file",
            "toolgate key secret",
            "openssl rand -hex 32",
            "--dev",
        ] {
            assert!(text.contains(needle), "{cmd:?}: no {needle:?} in:\n{text}");
        }
        // Refused before anything started: no store was created.
        assert!(!dir.join("finance.db").exists(), "{cmd:?} opened the store");
    }
    // One key given: only the other is asked for.
    let mut c = toolgate(&["serve", "--http", "127.0.0.1:0", "--no-watch"], &dir);
    c.env("TOOLGATE_APPROVAL_KEY", APPROVAL);
    let (status, text) = exits(c);
    assert_eq!(status.code(), Some(2), "{text}");
    assert!(!text.contains("no approval key"), "{text}");
    assert!(text.contains("no redaction key"), "{text}");
}

#[test]
fn serve_starts_with_keys_from_the_environment() {
    let (_t, dir) = finance();
    let (mut s, addr) = serve(
        &dir,
        &[],
        &[
            ("TOOLGATE_APPROVAL_KEY", APPROVAL),
            ("TOOLGATE_REDACTION_KEY", REDACTION),
        ],
    );
    let r = readyz(addr, &mut s);
    assert_eq!(r["keys"]["approval"], "configured", "{r}");
    assert_eq!(r["keys"]["redaction"], "configured", "{r}");
    assert!(r["keys"].get("dev_gives_up").is_none(), "{r}");
    let err = s.stderr();
    assert!(!err.contains("--dev"), "{err}");
}

#[test]
fn serve_starts_with_keys_from_files_and_refuses_a_file_everyone_can_read() {
    let (t, dir) = finance();
    use_key_files(&dir);
    let (a, r) = (
        t.path().join("approval.key"),
        t.path().join("redaction.key"),
    );
    write_key(&a, APPROVAL, 0o600);
    write_key(&r, REDACTION, 0o640);
    let (mut s, addr) = serve(&dir, &[], &[]);
    let body = readyz(addr, &mut s);
    assert_eq!(body["keys"]["approval"], "configured", "{body}");
    assert_eq!(body["keys"]["redaction"], "configured", "{body}");
    drop(s);

    #[cfg(unix)]
    {
        write_key(&r, REDACTION, 0o644);
        // Refused, and --dev does not paper over a configured key that is unsafe.
        for extra in [&[][..], &["--dev"][..]] {
            let mut args = vec!["serve", "--http", "127.0.0.1:0", "--no-watch"];
            args.extend_from_slice(extra);
            let (status, text) = exits(toolgate(&args, &dir));
            assert_eq!(status.code(), Some(2), "{extra:?}: {text}");
            assert!(text.contains("redaction.key"), "{text}");
            assert!(text.contains("every user (mode 644)"), "{text}");
            assert!(text.contains("chmod 600"), "{text}");
            assert!(!text.contains("no approval key"), "{text}");
        }
    }
}

#[test]
fn serve_dev_starts_without_keys_and_says_what_it_gives_up() {
    let (_t, dir) = finance();
    let (mut s, addr) = serve(&dir, &["--dev"], &[]);
    let r = readyz(addr, &mut s);
    assert_eq!(r["keys"]["approval"], "dev", "{r}");
    assert_eq!(r["keys"]["redaction"], "dev", "{r}");
    assert_eq!(
        r["keys"]["dev_gives_up"].as_array().unwrap().len(),
        2,
        "{r}"
    );
    let err = s.stderr();
    for needle in [
        "WARNING: --dev",
        "stop verifying when the process exits",
        "no other gateway or worker can verify them",
        "recovered by hashing guesses",
        "docs/keys.md",
    ] {
        assert!(err.contains(needle), "no {needle:?} in:\n{err}");
    }
}

#[test]
fn key_secret_makes_a_64_hex_digit_key_and_a_private_file_it_never_overwrites() {
    let tmp = tempfile::tempdir().unwrap();
    let run = |args: &[&str]| {
        Command::new(env!("CARGO_BIN_EXE_toolgate"))
            .args(args)
            .output()
            .unwrap()
    };
    let o = run(&["key", "secret"]);
    assert!(o.status.success());
    let a = String::from_utf8(o.stdout).unwrap();
    let a = a.trim();
    assert_eq!(a.len(), 64, "{a}");
    assert!(a.chars().all(|c| c.is_ascii_hexdigit()), "{a}");
    let b = String::from_utf8(run(&["key", "secret"]).stdout).unwrap();
    assert_ne!(a, b.trim(), "two keys are never the same");

    let file = tmp.path().join("approval.key");
    let o = run(&["key", "secret", "--out", file.to_str().unwrap()]);
    assert!(o.status.success(), "{o:?}");
    let key = std::fs::read_to_string(&file).unwrap();
    assert_eq!(key.trim().len(), 64);
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(&file).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode & 0o077, 0, "mode {mode:o}");
    }
    let o = run(&["key", "secret", "--out", file.to_str().unwrap()]);
    assert!(!o.status.success());
    assert_eq!(
        std::fs::read_to_string(&file).unwrap(),
        key,
        "not overwritten"
    );
}
