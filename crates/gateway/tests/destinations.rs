//! A destination off its list sent to a person (`unknown: gate`), through a real rmcp client
//! and the finance fake over streamable HTTP: a recipient whose domain the supplier has not
//! verified parks the call with the reason "destination not on the list" instead of refusing
//! it; the clerk approves; the approved call runs once (the fake's record shows one delivery),
//! and its retry replays.

use serde_json::json;
use toolgate_core::registry::api_key_hash;
use toolgate_core::{Clock, SystemClock};
use toolgate_gateway::{ReloadOutcome, Trigger};

use crate::common::*;

const COMMS_KEY: &str = "tg-test-comms-key-0002";

fn text_of(r: &rmcp::model::CallToolResult) -> String {
    r.content
        .iter()
        .filter_map(|c| c.as_text().map(|t| t.text.clone()))
        .collect::<Vec<_>>()
        .join("\n")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unlisted_recipient_goes_to_a_person_and_the_approved_call_runs_once() {
    let h = Harness::start().await;
    let principals = h.dir.path().join("principals.yaml");
    let mut text = std::fs::read_to_string(&principals).unwrap();
    text.push_str(&format!(
        r#"  - id: test-comms
    kind: agent
    role: worker.comms
    credentials:
      - {{id: test, sha256: "{}"}}
    grants:
      - scopes: [suppliers:read, suppliers:contact]
        purposes: [billing]
        max_tier: act
        max_sensitivity: internal
    budgets: {{act: 10}}
"#,
        api_key_hash(COMMS_KEY)
    ));
    std::fs::write(&principals, text).unwrap();
    let suppliers = h.dir.path().join("tools/suppliers.yaml");
    let text = std::fs::read_to_string(&suppliers).unwrap();
    let gated = text.replace(
        "lookup: {tool: supplier.verified_domains, with: [supplier_id], result: domains}",
        "lookup: {tool: supplier.verified_domains, with: [supplier_id], result: domains}\n        unknown: gate",
    );
    assert_ne!(gated, text);
    std::fs::write(&suppliers, gated).unwrap();
    let r = h.gateway.reloader.reload(Trigger::Call).await;
    assert_eq!(r.outcome, ReloadOutcome::Applied, "{:?}", r.errors);

    let client = h.client(COMMS_KEY).await;
    let email = json!({
        "supplier_id": "SUP-0002",
        "invoice_id": "INV-20260612",
        "to": "facturas@costaverde-pagos.com",
        "subject": "INV-20260612 scheduled",
        "body": "Your invoice INV-20260612 is scheduled for payment on 3 July."
    });
    let meta = billing(
        "the supplier asked to write to its new address",
        "run-dest-1",
    );
    let r = call(&client, "supplier.notify", email.clone(), meta.clone())
        .await
        .unwrap();
    let content = r.structured_content.clone().unwrap_or_default();
    assert_eq!(content["status"], "needs_approval", "{r:?}");
    let msg = text_of(&r);
    assert!(msg.contains("destination not on the list"), "{msg}");
    assert!(msg.contains("costaverde-pagos.com"), "{msg}");
    assert!(
        h.records_for("notify_supplier").is_empty(),
        "nothing sent yet"
    );
    let id = content["approval_id"].as_str().unwrap().to_string();

    let ex = h.gateway.state.executor();
    let token = h
        .gateway
        .state
        .store
        .approve(
            &ex.registry,
            &ex.keys,
            &id.as_str().into(),
            &"test-clerk".into(),
            SystemClock.now(),
        )
        .await
        .unwrap();
    let mut approved = meta.clone();
    approved["approval_token"] = json!(token.as_str());
    let r = call(&client, "supplier.notify", email.clone(), approved.clone())
        .await
        .unwrap();
    assert_ne!(r.is_error, Some(true), "{r:?}");
    assert_eq!(h.records_for("notify_supplier").len(), 1, "sent once");
    // The retry with the same approval replays; nothing is sent again.
    let again = call(&client, "supplier.notify", email, approved)
        .await
        .unwrap();
    assert_ne!(again.is_error, Some(true), "{again:?}");
    assert_eq!(h.records_for("notify_supplier").len(), 1, "still once");
    let audit = h.audit("test-comms").await;
    let allowed: Vec<_> = audit
        .iter()
        .filter(|a| a["tool"] == "supplier.notify" && a["why"]["decision"] == "allow")
        .collect();
    assert_eq!(allowed.len(), 1, "{audit:?}");
    assert_eq!(allowed[0]["approval"]["approvers"], json!(["test-clerk"]));
    h.shutdown().await;
}
