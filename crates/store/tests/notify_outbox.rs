//! The outbox of notifications (migration 0018), on both backends: a request is put in once
//! per webhook; two gateways claiming at the same moment get each delivery once between them;
//! a failed one is due again only after its backoff, then given up on; a claim whose process
//! died runs out and is taken again; the summary counts each state and keeps the last error.

use crate::common::*;
use toolgate_core::Timestamp;
use toolgate_store::StoreConfig;

both_backends!(a_delivery_is_enqueued_once_claimed_once_and_retried_after_backoff);

fn at(ms: i64) -> Timestamp {
    Timestamp::from_millis(T0.millis() + ms)
}

async fn a_delivery_is_enqueued_once_claimed_once_and_retried_after_backoff(db: &TestDb) {
    let a = db.store(StoreConfig::default()).await;
    let b = db.store(StoreConfig::default()).await;
    assert!(
        a.enqueue_notification(&"apr_1".into(), "desk", at(0))
            .await
            .unwrap()
    );
    assert!(
        !b.enqueue_notification(&"apr_1".into(), "desk", at(5))
            .await
            .unwrap(),
        "the second gateway finds it there"
    );
    assert!(
        a.enqueue_notification(&"apr_1".into(), "vendors", at(0))
            .await
            .unwrap()
    );
    assert!(
        a.enqueue_notification(&"apr_2".into(), "desk", at(0))
            .await
            .unwrap()
    );

    // Two gateways claim at once: each row goes to exactly one.
    let (ca, cb) = tokio::join!(
        a.claim_notifications(at(10), 30_000, 10),
        b.claim_notifications(at(10), 30_000, 10)
    );
    let (ca, cb) = (ca.unwrap(), cb.unwrap());
    let mut all: Vec<_> = ca
        .iter()
        .chain(cb.iter())
        .map(|d| (d.approval_id.clone(), d.destination.clone(), d.attempts))
        .collect();
    all.sort();
    assert_eq!(
        all,
        vec![
            ("apr_1".into(), "desk".into(), 1),
            ("apr_1".into(), "vendors".into(), 1),
            ("apr_2".into(), "desk".into(), 1),
        ]
    );
    assert!(
        a.claim_notifications(at(20), 30_000, 10)
            .await
            .unwrap()
            .is_empty(),
        "claimed rows are not due"
    );
    let find = |id: &str, dest: &str| {
        ca.iter()
            .chain(cb.iter())
            .find(|d| d.approval_id == id && d.destination == dest)
            .unwrap()
            .clone()
    };
    a.notification_sent(&find("apr_1", "desk"), at(100))
        .await
        .unwrap();
    a.notification_failed(
        &find("apr_1", "vendors"),
        at(100),
        "HTTP status 500",
        Some(at(1_100)),
    )
    .await
    .unwrap();
    // apr_2/desk: its process "dies" holding the claim.

    assert!(
        a.claim_notifications(at(1_000), 30_000, 10)
            .await
            .unwrap()
            .is_empty()
    );
    let again = b.claim_notifications(at(1_200), 30_000, 10).await.unwrap();
    assert_eq!(again.len(), 1);
    assert_eq!(
        (again[0].destination.as_str(), again[0].attempts),
        ("vendors", 2)
    );
    a.notification_failed(&again[0], at(1_300), "connecting: refused", None)
        .await
        .unwrap();

    let taken = a.claim_notifications(at(30_011), 30_000, 10).await.unwrap();
    assert_eq!(taken.len(), 1, "the dead claim ran out: {taken:?}");
    assert_eq!(
        (taken[0].approval_id.as_str(), taken[0].attempts),
        ("apr_2", 2)
    );

    let summary = a.notify_summary().await.unwrap();
    let desk = summary.iter().find(|s| s.destination == "desk").unwrap();
    assert_eq!(
        (desk.sent, desk.waiting, desk.retrying, desk.failed),
        (1, 1, 0, 0)
    );
    assert!(!desk.failing());
    let vendors = summary.iter().find(|s| s.destination == "vendors").unwrap();
    assert_eq!((vendors.sent, vendors.failed), (0, 1));
    assert!(vendors.failing());
    assert_eq!(vendors.last_error.as_deref(), Some("connecting: refused"));
    assert_eq!(vendors.last_error_at, Some(at(1_300)));
    a.close().await;
    b.close().await;
}
