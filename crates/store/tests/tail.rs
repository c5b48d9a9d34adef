//! The reads behind the console's `/metrics`, on both backends: the audit records after a
//! sequence number (a page at a time, in chain order), and the approval requests counted per
//! gate and status by the database.

use crate::common::*;
use serde_json::json;
use toolgate_store::{Actor, ApprovalStatus, PlannedStep, StoreConfig};

both_backends!(the_tail_pages_through_the_chain_and_gates_are_counted_in_the_database);

fn step(tool: &str, inputs: serde_json::Value) -> PlannedStep {
    PlannedStep {
        tool: tool.into(),
        inputs,
        principal: "worker".into(),
        purpose: Some("ops".into()),
        reason: Some("planned by the test".into()),
        evidence: vec![],
        actor: Actor::default(),
    }
}

async fn the_tail_pages_through_the_chain_and_gates_are_counted_in_the_database(db: &TestDb) {
    let store = db.store(StoreConfig::default()).await;
    let ex = executor(&store, Recorder::new(), clock());
    let payment = json!({"invoice_id": "INV-1001", "amount": 20000.0, "currency": "EUR", "iban": "DE89370400440532013000"});
    store
        .create_run(
            &registry(),
            &"worker".into(),
            Some("ops"),
            &[
                step("ticket.read", json!({"ticket_id": "T-1"})),
                step("payment.send", payment),
            ],
            T0,
        )
        .await
        .unwrap();
    ex.drain().await.unwrap();

    let all = store.audit_records(None, None).await.unwrap();
    assert!(all.len() >= 2, "{all:?}");
    let first = store.audit_after(0, 1).await.unwrap();
    assert_eq!(first, all[..1]);
    let rest = store.audit_after(first[0].seq, 1000).await.unwrap();
    assert_eq!(rest, all[1..]);
    let last = all.last().unwrap().seq;
    assert!(store.audit_after(last, 10).await.unwrap().is_empty());

    let gates = store.gate_counts(T0).await.unwrap();
    assert_eq!(gates.len(), 1, "{gates:?}");
    let g = &gates[0];
    assert_eq!(
        (
            g.tool.as_str(),
            g.status,
            g.requests,
            g.decided,
            g.age_ms_sum
        ),
        ("payment.send", ApprovalStatus::Pending, 1, 0, 0)
    );
    assert!(!g.rule.is_empty());
}
