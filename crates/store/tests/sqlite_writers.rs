//! SQLite's inline statements (`src/lite.rs`) must never stall the runtime: a write lock held by
//! another process is waited for with async sleeps, and the write then goes through.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use serde_json::json;
use toolgate_core::{StepStatus, Timestamp};
use toolgate_store::audit::{AuditOutcome, AuditWho, AuditWhy};
use toolgate_store::{Actor, AuditDecision, AuditDraft, Store, StoreConfig};

fn draft(i: i64) -> AuditDraft {
    AuditDraft {
        ts: Timestamp::from_millis(1_780_000_000_000 + i),
        run_id: Some("writers".into()),
        step_id: None,
        who: AuditWho {
            principal: "worker".into(),
            role: "worker".into(),
            actor: Actor::default(),
        },
        tool: "ticket.read".into(),
        tool_version: Some("1.0.0".into()),
        effect: None,
        tier: None,
        inputs: json!({"ticket_id": format!("T-{i}")}),
        redacted: vec![],
        idem_key: None,
        why: AuditWhy {
            purpose: Some("ops".into()),
            reason: None,
            evidence: vec![],
            decision: AuditDecision::Allow,
            rule: None,
            checks: vec![],
            shadow: Vec::new(),
        },
        approval: None,
        outcome: AuditOutcome {
            status: StepStatus::Done,
            target_ref: None,
            latency_ms: Some(1),
            governance_us: None,
            error: None,
        },
        registry_version: "test".into(),
    }
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
