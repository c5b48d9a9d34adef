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
