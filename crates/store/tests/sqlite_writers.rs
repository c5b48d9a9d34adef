//! SQLite's inline statements (`src/lite.rs`) must never stall the runtime: a write lock held by
//! another process is waited for with async sleeps, and the write then goes through.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use toolgate_store::{AuditDraft, Store, StoreConfig};

#[path = "shared/draft.rs"]
mod shared;
use shared::draft as sample;

fn draft(i: i64) -> AuditDraft {
    sample("writers", i)
}

// One runtime thread: if waiting for the lock blocked it, the ticker below could not run.
#[tokio::test(flavor = "current_thread")]
async fn a_write_lock_held_elsewhere_is_waited_for_without_blocking_the_runtime() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("store.db");
    let store = Store::connect(
        &format!("sqlite://{}", path.display()),
        StoreConfig::default(),
    )
    .await
    .unwrap();
    store.append_audit(vec![draft(0)]).await.unwrap();

    // Another process's writer: a plain SQLite connection holding the write lock for 300 ms.
    let other = rusqlite::Connection::open(&path).unwrap();
    other.execute_batch("BEGIN IMMEDIATE").unwrap();
    let holder = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(300));
        other.execute_batch("COMMIT").unwrap();
    });

    let ticks = Arc::new(AtomicU64::new(0));
    let ticker = tokio::spawn({
        let ticks = ticks.clone();
        async move {
            loop {
                tokio::time::sleep(Duration::from_millis(10)).await;
                ticks.fetch_add(1, Ordering::Relaxed);
            }
        }
    });
    let started = Instant::now();
    let seqs = store.append_audit(vec![draft(1)]).await.unwrap();
    let waited = started.elapsed();
    ticker.abort();
    holder.join().unwrap();

    assert_eq!(
        seqs,
        vec![2],
        "the write went through once the lock was free"
    );
    assert!(
        waited >= Duration::from_millis(250),
        "the write waited for the other writer (waited {waited:?})"
    );
    let ticked = ticks.load(Ordering::Relaxed);
    assert!(
        ticked >= 10,
        "the runtime kept running while the write waited ({ticked} ticks in {waited:?})"
    );
    let report = store.verify_chain().await.unwrap();
    assert_eq!(report.records, 2);
    assert!(report.broken.is_none(), "{report:?}");
}

fn wal_len(db: &std::path::Path) -> u64 {
    let mut wal = db.as_os_str().to_owned();
    wal.push("-wal");
    std::fs::metadata(wal).map(|m| m.len()).unwrap_or(0)
}

/// A preallocated WAL (zeros past the last frame) is grown in the background, commits land
/// inside it without growing it, and a crash copy of the files (no shared-memory index, so
/// SQLite must recover from the WAL itself) reads back every record with the chain intact.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_preallocated_wal_is_written_in_place_and_recovers_after_a_crash() {
    // Each commit appends ~24 KB of frames here (the pages it changed), so 100 fit easily.
    const PREALLOCATE: u64 = 8 << 20;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("store.db");
    let store = Store::connect(
        &format!("sqlite://{}", path.display()),
        StoreConfig {
            wal_preallocate: PREALLOCATE,
            ..StoreConfig::default()
        },
    )
    .await
    .unwrap();
    tokio::time::timeout(Duration::from_secs(30), store.wal_preallocated())
        .await
        .expect("the WAL preallocation finishes");
    let primed = wal_len(&path);
    assert!(primed >= PREALLOCATE, "WAL is {primed} bytes");

    for i in 0..100 {
        store.append_audit(vec![draft(i)]).await.unwrap();
    }
    assert_eq!(
        wal_len(&path),
        primed,
        "commits overwrote the preallocated bytes"
    );

    // What a kill -9 leaves: the database and its WAL, without the -shm index.
    let crashed = dir.path().join("crashed");
    std::fs::create_dir(&crashed).unwrap();
    std::fs::copy(&path, crashed.join("store.db")).unwrap();
    let mut wal = path.as_os_str().to_owned();
    wal.push("-wal");
    std::fs::copy(&wal, crashed.join("store.db-wal")).unwrap();
    store.close().await;

    let reopened = Store::connect(
        &format!("sqlite://{}", crashed.join("store.db").display()),
        StoreConfig::default(),
    )
    .await
    .unwrap();
    let report = reopened.verify_chain().await.unwrap();
    assert_eq!(report.records, 100);
    assert!(report.is_intact(), "{:?}", report.broken);
    let seqs = reopened.append_audit(vec![draft(100)]).await.unwrap();
    assert_eq!(seqs, vec![101]);
}
