//! Plans made by preview calls (migration 0005), on both backends: what is saved is read back
//! exactly; an unknown plan id is `NotFound`; a plan id is unique.

use crate::common::*;
use serde_json::json;
use toolgate_store::StoreConfig;
use toolgate_store::StoreError;
use toolgate_store::previews::Preview;

both_backends!(a_saved_plan_reads_back_exactly_and_ids_are_unique);

async fn a_saved_plan_reads_back_exactly_and_ids_are_unique(db: &TestDb) {
    let store = db.store(StoreConfig::default()).await;
    let plan = Preview {
        plan_id: "pln_0123456789abcdef0123456789abcdef".into(),
        principal: "agent-a".into(),
        tool: "supplier.notify".into(),
        tool_version: "3".into(),
        input_hash: "sha256:abc".into(),
        inputs: json!({"to": ["ap@northwind.example"], "amount": 4180.5, "note": "ü"}),
        meta: json!({"purpose": "billing", "run_id": "run-1"}),
        created_at: T0.millis(),
        expires_at: T0.millis() + 3_600_000,
    };
    store.save_preview(&plan).await.unwrap();
    assert_eq!(store.preview(&plan.plan_id).await.unwrap(), plan);
    assert!(matches!(
        store.preview("pln_none").await,
        Err(StoreError::NotFound { .. })
    ));
    assert!(
        store.save_preview(&plan).await.is_err(),
        "a plan id is unique"
    );
    store.close().await;
}
