//! `toolgate log checkpoint` and `toolgate log verify --checkpoint` as an operator runs them:
//! the real binary against a SQLite store, a key made with `log key new`, checkpoints in a file,
//! on stdout, posted to a webhook and on a schedule, and the exit codes and messages of every
//! refusal. The truncation a checkpoint exists for passes plain `log verify` and fails with it.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpListener;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use toolgate_store::{Store, StoreConfig, read_checkpoints};

use crate::shared;

/// A store with `records` audit records, and the paths a test needs.
struct Env {
    dir: tempfile::TempDir,
    url: String,
}

impl Env {
    async fn new(records: i64) -> Env {
        let dir = tempfile::tempdir().unwrap();
        let url = format!("sqlite://{}", dir.path().join("t.db").display());
        let env = Env { dir, url };
        env.append(1..=records).await;
        env
    }

    async fn store(&self) -> Store {
        Store::connect(&self.url, StoreConfig::default())
            .await
            .unwrap()
    }

    async fn append(&self, seqs: std::ops::RangeInclusive<i64>) {
        let store = self.store().await;
        let drafts = seqs.map(|i| shared::draft("run-a", i)).collect();
        store.append_audit(drafts).await.unwrap();
        store.close().await;
    }

    /// Deletes the records after `keep` and moves the chain head back to the last one left.
    async fn truncate_to(&self, keep: i64) {
        let store = self.store().await;
        store
            .execute_raw(&format!(
                "DROP TRIGGER IF EXISTS audit_no_delete; DELETE FROM audit WHERE seq > {keep}; \
                 UPDATE audit_head SET seq = {keep}, \
                 hash = (SELECT hash FROM audit WHERE seq = {keep}) WHERE id = 1;"
            ))
            .await
            .unwrap();
        store.close().await;
    }

    fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    /// `toolgate log ARGS -c examples/finance --store URL`, without the caller's key variables.
    fn log(&self, args: &[&str]) -> Command {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_toolgate"));
        cmd.arg("log")
            .args(args)
            .arg("-c")
            .arg(finance())
            .arg("--store")
            .arg(&self.url)
            .current_dir(self.dir.path())
            .env_remove("TOOLGATE_CHECKPOINT_KEY")
            .env_remove("TOOLGATE_CHECKPOINT_KEY_FILE")
            .env_remove("TOOLGATE_CHECKPOINT_WEBHOOK_TOKEN");
        cmd
    }

    /// `toolgate log key ...` (no store).
    fn key(&self, args: &[&str]) -> Command {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_toolgate"));
        cmd.args(["log", "key"])
            .args(args)
            .current_dir(self.dir.path())
            .env_remove("TOOLGATE_CHECKPOINT_KEY")
            .env_remove("TOOLGATE_CHECKPOINT_KEY_FILE");
        cmd
    }

    fn lines(&self, name: &str) -> usize {
        std::fs::read_to_string(self.path(name))
            .unwrap_or_default()
            .lines()
            .count()
    }
}

fn finance() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../examples/finance")
}

/// Runs a command (built here, or borrowed after setting its environment): exit code, stdout,
/// stderr.
fn run(mut cmd: impl std::borrow::BorrowMut<Command>) -> (i32, String, String) {
    let out = cmd.borrow_mut().output().expect("run toolgate");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// `log key new --out ck.pem` in the env's folder; returns the key id.
fn new_key(env: &Env, name: &str) -> String {
    let (code, out, err) = run(env.key(&["new", "--out", name]));
    assert_eq!(code, 0, "{out}{err}");
    out.lines()
        .find_map(|l| l.strip_prefix("key id:"))
        .expect("the key id is printed")
        .trim()
        .to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_truncation_passes_verify_and_fails_verify_with_the_checkpoint() {
    let env = Env::new(6).await;
    let id = new_key(&env, "ck.pem");
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(env.path("ck.pem"))
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(
            mode & 0o077,
            0,
            "the signing key is for its owner only: {mode:o}"
        );
    }

    let (code, out, err) =
        run(env.log(&["checkpoint", "--key-file", "ck.pem", "--out", "cps.jsonl"]));
    assert_eq!(code, 0, "{out}{err}");
    assert!(out.starts_with("checkpoint of record 6 (sha256:"), "{out}");
    assert!(
        out.contains(&format!("by key {id}: appended to cps.jsonl")),
        "{out}"
    );
    assert_eq!(env.lines("cps.jsonl"), 1);

    let verify_with = [
        "verify",
        "--checkpoint",
        "cps.jsonl",
        "--public-key",
        "ck.pem.pub",
    ];
    let (code, out, err) = run(env.log(&verify_with));
    assert_eq!(code, 0, "{out}{err}");
    assert!(
        out.contains("audit chain intact: 6 record(s) verified"),
        "{out}"
    );
    assert!(
        out.contains("1 checkpoint(s) hold; the latest: record 6 ("),
        "{out}"
    );

    env.truncate_to(4).await;

    // Without the checkpoint, the shorter chain looks whole...
    let (code, out, err) = run(env.log(&["verify"]));
    assert_eq!(code, 0, "{out}{err}");
    assert_eq!(out, "audit chain intact: 4 record(s) verified\n");
    // ...with it, the missing records show, and the exit code says so.
    let (code, out, err) = run(env.log(&verify_with));
    assert_eq!(code, 1, "{out}{err}");
    assert!(
        out.contains("audit chain intact: 4 record(s) verified"),
        "{out}"
    );
    assert!(
        out.contains(
            "checkpoint FAILED: record 6 (sha256:"
        ) && out.contains(
            "the chain ends at record 4, but the checkpoint says record 6 existed: records after 4 were removed"
        ),
        "{out}"
    );
    assert!(out.contains("1 of 1 checkpoint(s) FAILED"), "{out}");
    assert!(!out.contains("hold;"), "{out}");

    // The checkpointer will not sign over it either, and leaves its file as it was.
    let (code, out, err) =
        run(env.log(&["checkpoint", "--key-file", "ck.pem", "--out", "cps.jsonl"]));
    assert_eq!(code, 1, "{out}{err}");
    assert!(
        err.contains("no checkpoint written: the chain does not extend the last checkpoint (record 6, signed ")
            && err.contains("the chain ends at record 4"),
        "{err}"
    );
    assert_eq!(env.lines("cps.jsonl"), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refusals_say_what_to_do_and_exit_2() {
    let env = Env::new(2).await;
    new_key(&env, "ck.pem");
    new_key(&env, "other.pem");

    let (code, _, err) = run(env.log(&["checkpoint"]));
    assert_eq!(code, 2);
    assert!(
        err.contains("no checkpoint signing key: set TOOLGATE_CHECKPOINT_KEY to the key or pass --key-file FILE (make one with `toolgate log key new --out FILE`)"),
        "{err}"
    );
    let (code, out, err) =
        run(env.log(&["checkpoint", "--key-file", "ck.pem", "--out", "cps.jsonl"]));
    assert_eq!(code, 0, "{out}{err}");

    let (code, _, err) = run(env.log(&["verify", "--checkpoint", "cps.jsonl"]));
    assert_eq!(code, 2);
    assert!(
        err.contains("--checkpoint needs the public key of the key that signed it"),
        "{err}"
    );

    // A keyring without the key that signed it.
    let (code, _, err) = run(env.log(&[
        "verify",
        "--checkpoint",
        "cps.jsonl",
        "--public-key",
        "other.pem.pub",
    ]));
    assert_eq!(code, 2);
    assert!(
        err.contains("the checkpoint of record 2 was signed by key "),
        "{err}"
    );
    assert!(
        err.contains("which is not among the public keys given"),
        "{err}"
    );

    // A private key where a public one belongs.
    let (code, _, err) = run(env.log(&[
        "verify",
        "--checkpoint",
        "cps.jsonl",
        "--public-key",
        "ck.pem",
    ]));
    assert_eq!(code, 2);
    assert!(
        err.contains("ck.pem: not a usable checkpoint public key: it holds a private key"),
        "{err}"
    );

    // A file that is not checkpoints.
    std::fs::write(env.path("junk.jsonl"), "{\"seq\": 2}\n").unwrap();
    let (code, _, err) = run(env.log(&[
        "verify",
        "--checkpoint",
        "junk.jsonl",
        "--public-key",
        "ck.pem.pub",
    ]));
    assert_eq!(code, 2);
    assert!(
        err.contains("junk.jsonl: not a toolgate audit checkpoint: line 1:"),
        "{err}"
    );

    // A checkpoint edited after signing is a failed check, not an error.
    let text = std::fs::read_to_string(env.path("cps.jsonl")).unwrap();
    std::fs::write(
        env.path("edited.jsonl"),
        text.replace("\"seq\":2", "\"seq\":1"),
    )
    .unwrap();
    let (code, out, _) = run(env.log(&[
        "verify",
        "--checkpoint",
        "edited.jsonl",
        "--public-key",
        "ck.pem.pub",
    ]));
    assert_eq!(code, 1, "{out}");
    assert!(
        out.contains("its signature does not verify with key"),
        "{out}"
    );

    let (code, _, err) = run(env.log(&[
        "checkpoint",
        "--key-file",
        "ck.pem",
        "--webhook",
        "https://tickets.example/api",
    ]));
    assert_eq!(code, 2);
    assert!(
        err.contains("only http:// URLs can be posted to by this build"),
        "{err}"
    );

    let (code, _, err) = run(env.key(&["new", "--out", "ck.pem"]));
    assert_eq!(code, 2);
    assert!(err.contains("ck.pem exists: choose another name"), "{err}");

    let (code, _, err) = run(env
        .log(&["checkpoint", "--key-file", "ck.pem"])
        .env("TOOLGATE_CHECKPOINT_KEY", "x"));
    assert_eq!(code, 2);
    assert!(
        err.contains("give the checkpoint signing key one way only"),
        "{err}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_in_the_environment_signs_to_stdout_and_verifies() {
    let env = Env::new(3).await;
    let (code, printed, _) = run(env.key(&["new"]));
    assert_eq!(code, 0);
    let start = printed.find("-----BEGIN PRIVATE KEY-----").unwrap();
    let end =
        printed.find("-----END PRIVATE KEY-----").unwrap() + "-----END PRIVATE KEY-----".len();
    let private = &printed[start..end];
    let id = printed
        .lines()
        .next()
        .unwrap()
        .strip_prefix("key id: ")
        .unwrap();

    let (code, out, err) = run(env
        .log(&["checkpoint"])
        .env("TOOLGATE_CHECKPOINT_KEY", private));
    assert_eq!(code, 0, "{err}");
    // Stdout carries the checkpoint and nothing else.
    let cps = read_checkpoints(&out, "stdout").unwrap();
    assert_eq!(out.lines().count(), 1, "{out}");
    assert_eq!((cps[0].seq, cps[0].key_id.as_str()), (3, id));
    std::fs::write(env.path("cp.json"), &out).unwrap();

    let (code, out, err) = run(env
        .log(&["verify", "--checkpoint", "cp.json"])
        .env("TOOLGATE_CHECKPOINT_KEY", private));
    assert_eq!(code, 0, "{out}{err}");
    assert!(out.contains("1 checkpoint(s) hold"), "{out}");

    let (code, out, _) = run(env.key(&["public"]).env("TOOLGATE_CHECKPOINT_KEY", private));
    assert_eq!(code, 0);
    assert!(
        out.starts_with(&format!("key id: {id}\n-----BEGIN PUBLIC KEY-----\n")),
        "{out}"
    );
}

/// Answers one HTTP request with `status`, and hands back what it received.
fn one_request_server(status: &'static str) -> (String, std::thread::JoinHandle<String>) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}/hook", listener.local_addr().unwrap());
    let handle = std::thread::spawn(move || {
        let (stream, _) = listener.accept().unwrap();
        let mut reader = BufReader::new(stream.try_clone().unwrap());
        let mut head = String::new();
        let mut length = 0;
        loop {
            let mut line = String::new();
            reader.read_line(&mut line).unwrap();
            if let Some(v) = line.to_ascii_lowercase().strip_prefix("content-length:") {
                length = v.trim().parse().unwrap();
            }
            head.push_str(&line);
            if line == "\r\n" {
                break;
            }
        }
        let mut body = vec![0; length];
        reader.read_exact(&mut body).unwrap();
        let mut stream = stream;
        write!(
            stream,
            "HTTP/1.1 {status}\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
        )
        .unwrap();
        format!("{head}{}", String::from_utf8(body).unwrap())
    });
    (url, handle)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_webhook_receives_the_signed_checkpoint() {
    let env = Env::new(2).await;
    new_key(&env, "ck.pem");
    let (url, server) = one_request_server("201 Created");
    let (code, out, err) = run(env
        .log(&["checkpoint", "--key-file", "ck.pem", "--webhook", &url])
        .env("TOOLGATE_CHECKPOINT_WEBHOOK_TOKEN", "s3cret"));
    assert_eq!(code, 0, "{out}{err}");
    assert!(
        out.contains(&format!("posted to {url} (HTTP 201)")),
        "{out}"
    );
    let request = server.join().unwrap();
    assert!(request.starts_with("POST /hook HTTP/1.1\r\n"), "{request}");
    assert!(
        request
            .to_ascii_lowercase()
            .contains("authorization: bearer s3cret\r\n"),
        "{request}"
    );
    assert!(
        request
            .to_ascii_lowercase()
            .contains("content-type: application/json\r\n"),
        "{request}"
    );
    let body = request.split("\r\n\r\n").nth(1).unwrap();
    assert_eq!(read_checkpoints(body, "the request").unwrap()[0].seq, 2);

    // A webhook that fails is an error, after the file was written.
    let (url, server) = one_request_server("500 Internal Server Error");
    let (code, out, err) = run(env.log(&[
        "checkpoint",
        "--key-file",
        "ck.pem",
        "--out",
        "cps.jsonl",
        "--webhook",
        &url,
    ]));
    server.join().unwrap();
    assert_eq!(code, 2, "{out}{err}");
    assert!(
        err.contains(&format!(
            "posting the checkpoint of record 2 to {url} (it was appended to cps.jsonl)"
        )) && err.contains("the webhook answered 500"),
        "{err}"
    );
    assert_eq!(env.lines("cps.jsonl"), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_signs_on_a_schedule_until_sigterm() {
    let env = Env::new(2).await;
    new_key(&env, "ck.pem");
    let mut child = env
        .log(&[
            "checkpoint",
            "--key-file",
            "ck.pem",
            "--out",
            "cps.jsonl",
            "--every",
            "1s",
        ])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let wait_for = |lines: usize| {
        let deadline = Instant::now() + Duration::from_secs(30);
        while env.lines("cps.jsonl") < lines {
            assert!(Instant::now() < deadline, "no checkpoint {lines} in 30 s");
            std::thread::sleep(Duration::from_millis(50));
        }
    };
    wait_for(1);
    env.append(3..=5).await;
    wait_for(3);
    let status = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .unwrap();
    assert!(status.success());
    let code = child.wait().unwrap().code();
    let mut err = String::new();
    child
        .stderr
        .take()
        .unwrap()
        .read_to_string(&mut err)
        .unwrap();
    assert_eq!(code, Some(0), "{err}");
    let text = std::fs::read_to_string(env.path("cps.jsonl")).unwrap();
    let seqs: Vec<i64> = read_checkpoints(&text, "cps.jsonl")
        .unwrap()
        .iter()
        .map(|c| c.seq)
        .collect();
    assert_eq!(seqs.first(), Some(&2), "{seqs:?}");
    assert_eq!(seqs.last(), Some(&5), "{seqs:?}");

    // Every one of them still holds.
    let (code, out, err) = run(env.log(&[
        "verify",
        "--checkpoint",
        "cps.jsonl",
        "--public-key",
        "ck.pem.pub",
    ]));
    assert_eq!(code, 0, "{out}{err}");
    assert!(
        out.contains(&format!(
            "{} checkpoint(s) hold; the latest: record 5",
            seqs.len()
        )),
        "{out}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reader_that_stops_early_is_not_an_error() {
    let env = Env::new(200).await;
    for args in [&["export", "--principal", "worker"][..], &["verify"][..]] {
        let mut child = env
            .log(args)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        drop(child.stdout.take()); // `| head -c 0`: the reader is gone before the first write
        let out = child.wait_with_output().unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(0), "{args:?}: {err}");
        assert!(!err.contains("Broken pipe"), "{args:?}: {err}");
    }
}

#[test]
fn any_command_whose_reader_stops_early_exits_zero() {
    let mut child = Command::new(env!("CARGO_BIN_EXE_toolgate"))
        .args(["capabilities", "list", "-c"])
        .arg(finance())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    drop(child.stdout.take());
    let out = child.wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{err}");
    assert!(err.is_empty(), "{err}");
}
