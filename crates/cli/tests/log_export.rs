//! `toolgate log export` into a reader that stops early (`| head -1`): what the reader wanted,
//! it has, so the closed pipe is a success (exit 0), not an error.

use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Command, Stdio};

use toolgate_store::{Store, StoreConfig};

use crate::shared;

#[tokio::test]
async fn an_export_into_a_reader_that_stops_after_one_line_exits_0() {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite://{}", dir.path().join("t.db").display());
    // Far more than a pipe holds (64 KiB), so the export is still writing when the reader
    // goes away.
    let store = Store::connect(&url, StoreConfig::default()).await.unwrap();
    let drafts = (1..=2_000).map(|i| shared::draft("run-a", i)).collect();
    store.append_audit(drafts).await.unwrap();
    store.close().await;

    let finance = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../examples/finance");
    let mut child = Command::new(env!("CARGO_BIN_EXE_toolgate"))
        .args(["log", "export", "--principal", "worker", "-c"])
        .arg(finance)
        .arg("--store")
        .arg(&url)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut first = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut first)
        .unwrap();
    // The reader is dropped here: the pipe is closed with most of the export unwritten.
    assert!(first.contains("\"seq\":1"), "{first}");
    let out = child.wait_with_output().unwrap();
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        out.stderr.is_empty(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}
