//! End to end through a real rmcp client, toolgate over streamable HTTP, and the finance fake
//! upstream. Every assertion is on what the fake recorded, the audit chain, or the structured
//! part of a result — never on prose.

use std::collections::BTreeSet;

use crate::common::*;
use rmcp::service::ServiceError;
use serde_json::{Value, json};
use toolgate_core::Registry;

fn names(tools: &[rmcp::model::Tool]) -> BTreeSet<String> {
    tools.iter().map(|t| t.name.to_string()).collect()
}

fn registry_names(h: &Harness, role: &str) -> BTreeSet<String> {
    h.gateway
        .state
        .registry()
        .tools_for_role(role)
        .map(|t| t.name().to_string())
        .collect()
}

fn status(r: &rmcp::model::CallToolResult) -> Option<&str> {
    r.structured_content.as_ref()?.get("status")?.as_str()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_role_credentials_see_two_tool_lists_with_registry_schemas_and_derived_hints() {
    let h = Harness::start().await;
    let worker = h.client(WORKER_KEY).await;
    let planner = h.client(PLANNER_KEY).await;
    let w = worker.peer().list_all_tools().await.unwrap();
    let p = planner.peer().list_all_tools().await.unwrap();

    assert_eq!(names(&w), registry_names(&h, "worker.finance"));
    assert_eq!(names(&p), registry_names(&h, "planner"));
    assert_ne!(names(&w), names(&p));
    assert!(names(&w).contains("payment.schedule"));
    assert!(!names(&p).contains("payment.schedule"));

    let reg: &Registry = &h.gateway.state.registry();
    let worker_principal = reg.principal("test-worker").unwrap();
    for t in &w {
        let declared = &reg.tool(&t.name).unwrap().config;
        // The schema as declared, never loosened on the way: the declared properties, required
        // fields and additionalProperties unchanged; added only the governance arguments this
        // caller is asked for (a state-changing tool asks for `reason`).
        let listed = Value::Object((*t.input_schema).clone());
        assert_eq!(
            listed,
            reg.listed_schema(worker_principal, Some("test"), reg.tool(&t.name).unwrap()),
            "{}",
            t.name
        );
        let mut without = listed.clone();
        let asked: Vec<String> = ["purpose", "reason"]
            .into_iter()
            .filter(|f| declared.input_schema["properties"].get(*f).is_none())
            .filter(|f| listed["properties"].get(*f).is_some())
            .map(str::to_string)
            .collect();
        for f in &asked {
            without["properties"].as_object_mut().unwrap().remove(f);
            if let Some(req) = without.get_mut("required").and_then(Value::as_array_mut) {
                req.retain(|r| r.as_str() != Some(f.as_str()));
            }
        }
        if declared.input_schema.get("required").is_none()
            && without.get("required").is_some_and(|r| r == &json!([]))
        {
            without.as_object_mut().unwrap().remove("required");
        }
        assert_eq!(without, declared.input_schema, "{}", t.name);
        assert_eq!(
            asked.contains(&"reason".to_string()),
            declared.effect != toolgate_core::Effect::Read
                && reg
                    .tool(&t.name)
                    .unwrap()
                    .accepts(toolgate_core::config::CallField::Reason),
            "{}: a tool that changes state asks for a reason",
            t.name
        );
        let a = t.annotations.as_ref().expect("annotations");
        assert_eq!(
            a.open_world_hint,
            Some(declared.handler.upstream.is_some()),
            "{}: open world when an upstream does the work, not for a built-in",
            t.name
        );
        match declared.effect {
            toolgate_core::Effect::Read => assert_eq!(a.read_only_hint, Some(true)),
            toolgate_core::Effect::Write => {
                assert_eq!(a.read_only_hint, Some(false));
                assert_eq!(a.destructive_hint, Some(false));
                assert_eq!(a.idempotent_hint, Some(!declared.identity.is_empty()));
            }
            toolgate_core::Effect::Irreversible => {
                assert_eq!(a.read_only_hint, Some(false));
                assert_eq!(a.destructive_hint, Some(true));
            }
        }
    }
    h.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_listed_call_reaches_the_upstream_with_the_derived_idempotency_key() {
    let h = Harness::start().await;
    let worker = h.client(WORKER_KEY).await;
    let r = call(
        &worker,
        "note.draft",
        json!({"invoice_id": "INV-20260615", "kind": "query", "text": "Please confirm the delivery date."}),
        billing("ask the supplier to confirm the delivery date", "run-listed"),
    )
    .await
    .unwrap();
    assert_ne!(r.is_error, Some(true), "{r:?}");
    assert_eq!(r.structured_content.as_ref().unwrap()["status"], "drafted");

    let recs = h.records_for("draft_note");
    assert_eq!(recs.len(), 1);
    let key = recs[0]
        .idempotency_key
        .clone()
        .expect("the key travels in _meta");
    assert!(key.starts_with("sha256:"), "{key}");
    assert_eq!(recs[0].meta["run_id"], "run-listed");
    // No spans are exported here and the caller sent no trace context: none goes upstream.
    assert!(recs[0].meta.get("traceparent").is_none());

    let audit = h.audit("test-worker").await;
    let last = audit.last().unwrap();
    assert_eq!(last["tool"], "note.draft");
    assert_eq!(last["why"]["decision"], "allow");
    assert_eq!(last["idem_key"], key.as_str());
    assert_eq!(last["outcome"]["status"], "done");

    // With spans not exported, the caller's trace context reaches the upstream unchanged.
    let tp = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
    let mut traced = billing("ask the supplier to confirm the price", "run-listed-2");
    traced["traceparent"] = json!(tp);
    let r = call(
        &worker,
        "note.draft",
        json!({"invoice_id": "INV-20260615", "kind": "hold", "text": "Hold until the price is confirmed."}),
        traced,
    )
    .await
    .unwrap();
    assert_ne!(r.is_error, Some(true), "{r:?}");
    assert_eq!(h.records_for("draft_note")[1].meta["traceparent"], tp);
    h.shutdown().await;
}

/// A client that gave up on a slow write and retried it from a new connection (what an SDK
/// does after a reconnect) gets the write's outcome once the first attempt finishes, not "in
/// progress, ask later"; the write reaches the upstream once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retry_that_finds_its_write_running_waits_and_answers_with_its_outcome() {
    let h = Harness::start_slow("draft_note", 700).await;
    let (first, again) = (h.client(WORKER_KEY).await, h.client(WORKER_KEY).await);
    let note = json!({"invoice_id": "INV-20260615", "kind": "query", "text": "Confirm the date."});
    let meta = billing(
        "ask the supplier to confirm the delivery date",
        "run-retried",
    );
    let retry = async {
        // The retry arrives while the first attempt is at the upstream.
        tokio::time::sleep(std::time::Duration::from_millis(250)).await;
        call(&again, "note.draft", note.clone(), meta.clone()).await
    };
    let (a, b) = tokio::join!(
        call(&first, "note.draft", note.clone(), meta.clone()),
        retry
    );
    let (a, b) = (a.unwrap(), b.unwrap());
    assert_ne!(a.is_error, Some(true), "{a:?}");
    assert_ne!(
        b.is_error,
        Some(true),
        "the retry waited for the outcome: {b:?}"
    );
    let status =
        |r: &rmcp::model::CallToolResult| r.structured_content.as_ref().unwrap()["status"].clone();
    assert_eq!(status(&a), "drafted");
    assert_eq!(status(&b), "drafted");
    assert_eq!(h.records_for("draft_note").len(), 1, "written once");
    // The audit shows what happened: the retry that found the call running, the call, the replay.
    let audit = h.audit("test-worker").await;
    let events: Vec<_> = audit
        .iter()
        .filter(|r| r["tool"] == "note.draft")
        .map(|r| {
            let s = |v: &Value| v.as_str().unwrap_or("").to_string();
            (
                s(&r["why"]["decision"]),
                s(&r["why"]["rule"]),
                s(&r["outcome"]["status"]),
            )
        })
        .collect();
    let event =
        |d: &str, rule: &str, status: &str| (d.to_string(), rule.to_string(), status.to_string());
    assert_eq!(
        events,
        [
            // In chain order: the retry found the key held while the first attempt ran ...
            event("replay", "idempotency.in_progress", "running"),
            // ... the first attempt finished, and the waiting retry replayed its outcome.
            event("allow", "", "done"),
            event("replay", "", "done"),
        ],
        "{audit:#?}"
    );
    h.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unlisted_tool_is_answered_exactly_like_an_unknown_one() {
    let h = Harness::start().await;
    let worker = h.client(WORKER_KEY).await;
    let args = json!({"supplier_id": "SUP-0001", "iban": "ES9121000418450200051332", "reason": "supplier asked for a new account"});
    let unlisted = call(
        &worker,
        "supplier.update_iban",
        args.clone(),
        billing("x", "run-u"),
    )
    .await;
    let unknown = call(&worker, "supplier.update_ibam", args, billing("x", "run-u")).await;
    let (ServiceError::McpError(a), ServiceError::McpError(b)) =
        (unlisted.unwrap_err(), unknown.unwrap_err())
    else {
        panic!("both must be protocol errors");
    };
    assert_eq!(a.code, b.code);
    assert_eq!(
        a.message.replace("supplier.update_iban", "T"),
        b.message.replace("supplier.update_ibam", "T")
    );
    assert_eq!(a.data, b.data);
    assert!(h.records_for("update_supplier_iban").is_empty());
    // Both refusals are in the audit chain, refused at the `listed` check.
    let audit = h.audit("test-worker").await;
    assert_eq!(audit.len(), 2);
    for rec in &audit {
        assert_eq!(rec["why"]["decision"], "deny");
        assert_eq!(rec["outcome"]["status"], "refused");
    }
    h.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_amount_above_the_ceiling_is_a_readable_refusal_and_never_reaches_the_upstream() {
    let h = Harness::start().await;
    let worker = h.client(WORKER_KEY).await;
    let r = call(
        &worker,
        "payment.schedule",
        json!({"invoice_id": "INV-20260615", "amount": 60000, "currency": "EUR", "value_date": "2026-06-30",
               "reason": "Pay invoice INV-20260615 matched against PO-77901"}),
        billing("pay an approved invoice matched against PO-77901", "run-ceiling"),
    )
    .await
    .unwrap();
    assert_eq!(r.is_error, Some(true));
    let s = r.structured_content.as_ref().unwrap();
    assert_eq!(s["status"], "refused");
    assert_eq!(s["check"], "schema");
    assert!(s["rule"].as_str().unwrap().starts_with("schema."), "{s}");
    assert!(h.records_for("schedule_payment").is_empty());
    let audit = h.audit("test-worker").await;
    assert_eq!(audit.len(), 1);
    assert_eq!(audit[0]["why"]["decision"], "deny");
    h.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_duplicate_call_reaches_the_upstream_once_and_returns_the_same_result_twice() {
    let h = Harness::start().await;
    let worker = h.client(WORKER_KEY).await;
    let args = json!({"invoice_id": "INV-20260612", "kind": "hold", "text": "Hold until the freight dispute is settled."});
    let meta = billing(
        "hold the invoice while the freight dispute is open",
        "run-dup",
    );
    let first = call(&worker, "note.draft", args.clone(), meta.clone())
        .await
        .unwrap();
    let second = call(&worker, "note.draft", args, meta).await.unwrap();
    assert_ne!(first.is_error, Some(true), "{first:?}");
    assert_eq!(first.structured_content, second.structured_content);
    assert_eq!(first.content, second.content);
    assert_eq!(h.records_for("draft_note").len(), 1);
    let audit = h.audit("test-worker").await;
    assert_eq!(audit.len(), 2);
    assert_eq!(audit[0]["idem_key"], audit[1]["idem_key"]);
    h.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gated_payment_returns_needs_approval_with_the_approval_id() {
    let h = Harness::start().await;
    let worker = h.client(WORKER_KEY).await;
    let r = call(
        &worker,
        "payment.schedule",
        json!({"invoice_id": "INV-20260615", "amount": 880.5, "currency": "EUR", "value_date": "2026-06-30",
               "reason": "Invoice FOS-5531 matched against PO-77901, goods received"}),
        billing("pay an approved invoice matched against PO-77901", "run-gate"),
    )
    .await
    .unwrap();
    assert_eq!(status(&r), Some("needs_approval"), "{r:?}");
    let id = r.structured_content.as_ref().unwrap()["approval_id"]
        .as_str()
        .unwrap()
        .to_string();
    assert!(!id.is_empty());
    // Parked, not sent: the ERP saw nothing, and the approval request exists.
    assert!(h.records_for("schedule_payment").is_empty());
    let req = h
        .gateway
        .state
        .store
        .approval(&id.as_str().into())
        .await
        .unwrap();
    assert_eq!(req.tool, "payment.schedule");
    let audit = h.audit("test-worker").await;
    assert_eq!(audit.last().unwrap()["why"]["decision"], "needs_approval");
    h.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_iban_change_injected_into_an_invoice_has_no_tool_to_act_through() {
    let h = Harness::start().await;
    let worker = h.client(WORKER_KEY).await;
    // The worker reads the invoice carrying the injected instruction.
    let inv = call(
        &worker,
        "invoice.search",
        json!({"invoice_id": "INV-20260611"}),
        billing("read the invoice to pay", "run-inj"),
    )
    .await
    .unwrap();
    let text = inv.structured_content.as_ref().unwrap()["invoices"][0]["text"]
        .as_str()
        .unwrap()
        .to_string();
    assert!(text.contains("IBAN"), "the fixture carries the injection");
    // No supplier.* tool is visible to it.
    let tools = worker.peer().list_all_tools().await.unwrap();
    assert!(names(&tools).iter().all(|n| !n.starts_with("supplier.")));
    // Acting on the injection anyway: the tool does not exist for it.
    let r = call(
        &worker,
        "supplier.update_iban",
        json!({"supplier_id": "SUP-0001", "iban": "ES9121000418450200051332", "reason": "invoice says to update the IBAN"}),
        billing("invoice says to update the IBAN", "run-inj"),
    )
    .await;
    assert!(matches!(r, Err(ServiceError::McpError(_))));
    // Paying the invoice parks for a person; nothing irreversible was sent.
    let pay = call(
        &worker,
        "payment.schedule",
        json!({"invoice_id": "INV-20260611", "amount": 4180.0, "currency": "EUR", "value_date": "2026-06-30",
               "reason": "Invoice 20260611 matched against PO-77812 lines 1-2"}),
        billing("pay an approved invoice matched against PO-77812", "run-inj"),
    )
    .await
    .unwrap();
    assert!(
        matches!(status(&pay), Some("needs_approval") | Some("refused")),
        "{pay:?}"
    );
    assert!(h.records_for("update_supplier_iban").is_empty());
    assert!(h.records_for("schedule_payment").is_empty());
    for rec in h.audit("test-worker").await {
        if rec["effect"] == "irreversible" {
            assert_ne!(rec["outcome"]["status"], "done", "{rec}");
        }
    }
    h.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_write_without_purpose_is_refused_and_not_sent() {
    let h = Harness::start().await;
    let worker = h.client(WORKER_KEY).await;
    let r = call(
        &worker,
        "note.draft",
        json!({"invoice_id": "INV-20260615", "kind": "info", "text": "n"}),
        json!({"run_id": "run-nopurpose"}),
    )
    .await
    .unwrap();
    assert_eq!(r.is_error, Some(true));
    assert_eq!(status(&r), Some("refused"));
    assert_eq!(r.structured_content.as_ref().unwrap()["check"], "purpose");
    assert!(h.records_for("draft_note").is_empty());
    h.shutdown().await;
}
