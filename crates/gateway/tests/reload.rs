//! Hot reload and shadow mode through the running gateway (real rmcp clients over streamable
//! HTTP, the finance fake behind it): a reload under load leaves no call failed or decided under
//! a half-loaded registry and a broken folder never replaces the serving one; an approval taken
//! under one version carries over a reload that still gates the call the same way and not one
//! that forbids it; shadow rules never block, and the report counts what the audit log holds.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use crate::common::*;
use serde_json::{Value, json};
use toolgate_core::{Clock, SystemClock};
use toolgate_gateway::{ReloadOutcome, Trigger};
use toolgate_store::AuditDecision;

const CLERK: &str = "test-clerk";

fn edit(h: &Harness, file: &str, f: impl FnOnce(String) -> String) {
    let path = h.dir.path().join(file);
    let text = std::fs::read_to_string(&path).unwrap();
    let new = f(text.clone());
    assert_ne!(new, text, "the edit of {file} changes it");
    std::fs::write(path, new).unwrap();
}

fn write(h: &Harness, file: &str, text: &str) {
    std::fs::write(h.dir.path().join(file), text).unwrap();
}

fn version(h: &Harness) -> String {
    h.gateway.state.registry().version.hash.clone()
}

fn status(r: &rmcp::model::CallToolResult) -> String {
    r.structured_content
        .as_ref()
        .and_then(|s| s["status"].as_str())
        .unwrap_or("")
        .to_string()
}

/// Waits until `counter` has moved `n` past `from` (the load generator's completed calls).
async fn calls_completed(counter: &AtomicU64, from: u64, n: u64) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    while counter.load(Ordering::SeqCst) < from + n {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the load generator stalled"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reload_under_load_fails_no_call_and_a_broken_folder_is_refused() {
    let h = Harness::start().await;
    let v1 = version(&h);
    let done = Arc::new(AtomicU64::new(0));
    let stop = tokio_util::sync::CancellationToken::new();

    // The load generator: three clients reading invoices as fast as they are answered.
    let mut load = Vec::new();
    for c in 0..3 {
        let client = h.client(WORKER_KEY).await;
        let (done, stop) = (done.clone(), stop.clone());
        load.push(tokio::spawn(async move {
            let mut results = Vec::new();
            let mut i = 0u64;
            while !stop.is_cancelled() {
                let r = call(
                    &client,
                    "invoice.search",
                    json!({"invoice_id": "INV-20260611"}),
                    billing("check the invoice status", &format!("run-load-{c}-{i}")),
                )
                .await;
                results.push(r.map(|r| (r.is_error, status(&r))));
                done.fetch_add(1, Ordering::SeqCst);
                i += 1;
            }
            results
        }));
    }

    calls_completed(&done, 0, 10).await;
    // v2: a new label and a new (non-matching) policy.
    edit(&h, "toolgate.yaml", |s| {
        s.replace("label: gateway-test", "label: gateway-test-v2")
    });
    write(
        &h,
        "policies/extra.cedar",
        "@id(\"no-notes-marked-forbidden\")\nforbid (principal, action == Action::\"note.draft\", resource)\n\
         when { context.inputs.text like \"*FORBIDDEN*\" };\n",
    );
    let r = h.gateway.reloader.reload(Trigger::Call).await;
    assert_eq!(r.outcome, ReloadOutcome::Applied, "{r:?} {v1}");
    let v2 = version(&h);
    assert_ne!(v1, v2);
    assert_eq!(r.to.as_ref().unwrap().hash, v2);
    assert_eq!(h.gateway.state.registry().version.label, "gateway-test-v2");

    let at = done.load(Ordering::SeqCst);
    calls_completed(&done, at, 10).await;
    // A broken folder: a policy naming an input the tool does not have.
    write(
        &h,
        "policies/broken.cedar",
        "@id(\"broken\")\nforbid (principal, action == Action::\"invoice.search\", resource)\n\
         when { context.inputs.no_such_field == \"x\" };\n",
    );
    let r = h.gateway.reloader.reload(Trigger::Call).await;
    assert_eq!(r.outcome, ReloadOutcome::Refused);
    assert!(!r.errors.is_empty());
    assert!(r.errors.join("\n").contains("broken"), "{:?}", r.errors);
    assert_eq!(version(&h), v2, "the old version keeps serving");
    let status = h.gateway.reloader.status();
    assert_eq!(status.serving.hash, v2);
    assert_eq!(status.last_refused.as_ref(), Some(&r));

    let at = done.load(Ordering::SeqCst);
    calls_completed(&done, at, 10).await;
    // Fixed, and the extra policy tightened: v3.
    std::fs::remove_file(h.dir.path().join("policies/broken.cedar")).unwrap();
    edit(&h, "policies/extra.cedar", |s| {
        s.replace("*FORBIDDEN*", "*FORBIDDEN-NOTE*")
    });
    let r = h.gateway.reloader.reload(Trigger::Call).await;
    assert_eq!(r.outcome, ReloadOutcome::Applied, "{:?}", r.errors);
    let v3 = version(&h);
    // Reloading the same folder again changes nothing and records nothing.
    let same = h.gateway.reloader.reload(Trigger::Call).await;
    assert_eq!(same.outcome, ReloadOutcome::Unchanged);
    assert_eq!(same.audit_seq, None);

    let at = done.load(Ordering::SeqCst);
    calls_completed(&done, at, 10).await;
    stop.cancel();
    let mut results = Vec::new();
    for l in load {
        results.extend(l.await.unwrap());
    }

    // No call failed: every one was answered, and answered with the invoice.
    assert!(results.len() >= 40, "{} calls", results.len());
    for r in &results {
        let (is_error, st) = r.as_ref().expect("the call was answered");
        assert_ne!(*is_error, Some(true), "a call failed during a reload: {st}");
    }
    // Every decision names a whole version that was loaded, never anything in between, and
    // the load was decided under each of them.
    let audit = h.audit("test-worker").await;
    assert_eq!(audit.len(), results.len());
    let known: BTreeSet<&str> = [v1.as_str(), v2.as_str(), v3.as_str()].into();
    let mut seen = BTreeSet::new();
    for rec in &audit {
        let v = rec["registry_version"].as_str().unwrap();
        assert!(known.contains(v), "decided under unknown version {v}");
        assert_eq!(rec["why"]["decision"], "allow");
        seen.insert(v.to_string());
    }
    assert_eq!(seen.len(), 3, "calls were decided under each version");
    assert_eq!(
        h.records_for("search_invoices").len(),
        results.len(),
        "every call reached the ERP once"
    );

    // Each applied and refused reload is an audit record; the unchanged one is not.
    let reloads: Vec<_> = h
        .gateway
        .state
        .store
        .audit_records(Some(&"toolgate".into()), None)
        .await
        .unwrap()
        .into_iter()
        .filter(|r| r.body.why.decision == AuditDecision::Reload)
        .collect();
    let outcomes: Vec<(String, String)> = reloads
        .iter()
        .map(|r| {
            (
                r.body.outcome.status.to_string(),
                r.body.registry_version.clone(),
            )
        })
        .collect();
    assert_eq!(
        outcomes,
        vec![
            ("done".to_string(), v2.clone()),
            ("refused".to_string(), v2.clone()),
            ("done".to_string(), v3.clone()),
        ]
    );
    assert_eq!(reloads[1].body.why.rule.as_deref(), Some("reload.invalid"));
    assert!(
        reloads[1]
            .body
            .outcome
            .error
            .as_deref()
            .unwrap()
            .contains("broken")
    );
    assert!(h.gateway.state.store.verify_chain().await.is_ok());
    h.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_changed_file_is_picked_up_by_the_watch() {
    let h = Harness::start().await;
    let v1 = version(&h);
    let stop = tokio_util::sync::CancellationToken::new();
    h.gateway.reloader.watch(stop.clone()).unwrap();
    edit(&h, "toolgate.yaml", |s| {
        s.replace("label: gateway-test", "label: gateway-test-watched")
    });
    write(
        &h,
        "policies/watched.cedar",
        "@id(\"no-notes-marked-forbidden\")\nforbid (principal, action == Action::\"note.draft\", resource)\n\
         when { context.inputs.text like \"*FORBIDDEN*\" };\n",
    );
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    // The reload's report is published last, after the swap and its audit record.
    while h.gateway.reloader.status().last_reload.is_none() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the watch did not reload"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_ne!(version(&h), v1);
    let s = h.gateway.reloader.status();
    let last = s.last_reload.unwrap();
    assert_eq!(last.trigger, Trigger::Watch);
    assert_eq!(last.outcome, ReloadOutcome::Applied);
    assert_eq!(s.serving.label, "gateway-test-watched");
    stop.cancel();
    h.shutdown().await;
}

fn payment(invoice: &str, amount: f64) -> Value {
    json!({"invoice_id": invoice, "amount": amount, "currency": "EUR", "value_date": "2026-06-30",
           "reason": format!("Pay invoice {invoice} matched against PO-77901, goods received")})
}

fn with_token(meta: Value, token: &str) -> Value {
    let mut m = meta;
    m["approval_token"] = Value::String(token.to_string());
    m
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_approval_survives_a_raised_threshold_and_not_a_new_forbid() {
    let h = Harness::start().await;
    // Payments gated by the amount policy only (not by the tool's own gate).
    edit(&h, "tools/payments.yaml", |s| {
        s.replacen("gate: always", "gate: never", 1)
    });
    let r = h.gateway.reloader.reload(Trigger::Call).await;
    assert_eq!(r.outcome, ReloadOutcome::Applied, "{:?}", r.errors);
    let v1 = version(&h);
    let worker = h.client(WORKER_KEY).await;

    // Two payments above 10,000 are parked under v1 and approved by the clerk.
    let a_meta = billing("pay an approved invoice matched against PO-77901", "run-a");
    let b_meta = billing("pay an approved invoice matched against PO-77901", "run-b");
    // A matches its invoice (the ERP pays it); B would be refused by the ERP, but never gets there.
    let a = payment("INV-20260612", 12_600.0);
    let b = payment("INV-20260611", 16_000.0);
    let mut tokens = Vec::new();
    for (inputs, meta) in [(&a, &a_meta), (&b, &b_meta)] {
        let r = call(&worker, "payment.schedule", inputs.clone(), meta.clone())
            .await
            .unwrap();
        assert_eq!(status(&r), "needs_approval", "{r:?}");
        let id = r.structured_content.as_ref().unwrap()["approval_id"]
            .as_str()
            .unwrap()
            .to_string();
        let ex = h.gateway.state.executor();
        let token = h
            .gateway
            .state
            .store
            .approve(
                &ex.registry,
                &ex.keys,
                &id.as_str().into(),
                &toolgate_core::PrincipalId::from(CLERK),
                SystemClock.now(),
            )
            .await
            .unwrap();
        let claims = ex.keys.open(&token).unwrap();
        assert_eq!(claims.registry_version.as_deref(), Some(v1.as_str()));
        assert_eq!(
            claims.gate_rule.as_deref(),
            Some("large-payment-needs-approval")
        );
        tokens.push(token.as_str().to_string());
    }
    assert!(h.records_for("schedule_payment").is_empty());

    // v2 raises the threshold to 12,000: both are still gated by the same rule, so the
    // approval taken under v1 carries over and the payment runs.
    edit(&h, "policies/payments.cedar", |s| {
        s.replace("decimal(\"10000.0\")", "decimal(\"12000.0\")")
    });
    assert_eq!(
        h.gateway.reloader.reload(Trigger::Call).await.outcome,
        ReloadOutcome::Applied
    );
    let v2 = version(&h);
    let r = call(
        &worker,
        "payment.schedule",
        a.clone(),
        with_token(a_meta.clone(), &tokens[0]),
    )
    .await
    .unwrap();
    assert_ne!(r.is_error, Some(true), "{r:?}");
    assert_eq!(h.records_for("schedule_payment").len(), 1);
    let audit = h.audit("test-worker").await;
    let ran = audit.last().unwrap();
    assert_eq!(ran["why"]["decision"], "allow");
    assert_eq!(ran["registry_version"], v2.as_str());
    assert_eq!(ran["approval"]["approvers"], json!([CLERK]));

    // v3 forbids payments above 14,000: the approval does not carry over, the call is refused
    // and never reaches the ERP.
    edit(&h, "policies/payments.cedar", |s| {
        s + "\n@id(\"payments-capped-at-14000\")\n@reason(\"payments above 14,000 EUR are not made by agents\")\n\
             forbid (principal, action == Action::\"payment.schedule\", resource)\n\
             when { context.inputs.amount.greaterThan(decimal(\"14000.0\")) };\n"
    });
    assert_eq!(
        h.gateway.reloader.reload(Trigger::Call).await.outcome,
        ReloadOutcome::Applied
    );
    let v3 = version(&h);
    let r = call(
        &worker,
        "payment.schedule",
        b.clone(),
        with_token(b_meta.clone(), &tokens[1]),
    )
    .await
    .unwrap();
    assert_eq!(r.is_error, Some(true));
    assert_eq!(status(&r), "refused", "{r:?}");
    assert_eq!(
        r.structured_content.as_ref().unwrap()["rule"],
        "payments-capped-at-14000"
    );
    assert_eq!(
        h.records_for("schedule_payment").len(),
        1,
        "nothing more ran"
    );
    let audit = h.audit("test-worker").await;
    let refused = audit.last().unwrap();
    assert_eq!(refused["why"]["decision"], "deny");
    assert_eq!(refused["why"]["rule"], "payments-capped-at-14000");
    assert_eq!(refused["registry_version"], v3.as_str());
    h.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shadow_rules_never_block_and_the_report_counts_what_the_audit_log_holds() {
    let h = Harness::start().await;
    write(
        &h,
        "policies/shadow.cedar",
        "@id(\"shadow-no-dispute-notes\")\n@shadow\nforbid (principal, action == Action::\"note.draft\", resource)\n\
         when { context.inputs.text like \"*dispute*\" };\n\n\
         @id(\"shadow-searches-need-a-person\")\n@shadow\n@gate\nforbid (principal, action == Action::\"invoice.search\", resource);\n",
    );
    let r = h.gateway.reloader.reload(Trigger::Call).await;
    assert_eq!(r.outcome, ReloadOutcome::Applied, "{:?}", r.errors);
    let worker = h.client(WORKER_KEY).await;

    let notes = [
        ("INV-20260611", "hold", "Hold: freight dispute open."),
        ("INV-20260612", "hold", "Hold until the dispute is settled."),
        ("INV-20260615", "query", "Amount differs from PO line 2."),
        ("INV-20260611", "query", "Dispute raised by the supplier."),
        ("INV-20260612", "info", "Goods received in full."),
    ];
    for (i, (invoice, kind, text)) in notes.iter().enumerate() {
        let r = call(
            &worker,
            "note.draft",
            json!({"invoice_id": invoice, "kind": kind, "text": text}),
            billing(
                "record what is known about the invoice",
                &format!("run-note-{i}"),
            ),
        )
        .await
        .unwrap();
        assert_ne!(
            r.is_error,
            Some(true),
            "a shadow rule blocked a call: {r:?}"
        );
    }
    for i in 0..4 {
        let r = call(
            &worker,
            "invoice.search",
            json!({"status": "received", "limit": 5}),
            billing("find open invoices", &format!("run-search-{i}")),
        )
        .await
        .unwrap();
        assert_ne!(r.is_error, Some(true), "a shadow gate parked a call: {r:?}");
    }
    assert_eq!(h.records_for("draft_note").len(), 5);
    assert_eq!(h.records_for("search_invoices").len(), 4);

    // The audit log, counted by hand.
    let audit = h.audit("test-worker").await;
    let matched = |rule: &str| -> Vec<i64> {
        audit
            .iter()
            .filter(|r| {
                r["why"]["shadow"]
                    .as_array()
                    .is_some_and(|s| s.iter().any(|m| m["rule"] == rule))
            })
            .map(|r| r["seq"].as_i64().unwrap())
            .collect()
    };
    let disputes = matched("shadow-no-dispute-notes");
    let searches = matched("shadow-searches-need-a-person");
    // "dispute" matches case-sensitively: two of the three notes that mention one.
    assert_eq!(disputes.len(), 2);
    assert_eq!(searches.len(), 4);

    let now = SystemClock.now();
    let registry = h.gateway.state.registry();
    let report = toolgate_console::report::gather(&h.gateway.state.store, &registry, None, now)
        .await
        .unwrap();
    let row = |rule: &str| {
        report
            .shadow
            .iter()
            .find(|u| u.rule == rule)
            .unwrap_or_else(|| panic!("no report row for {rule}"))
    };
    let d = row("shadow-no-dispute-notes");
    assert_eq!(d.would, toolgate_core::ShadowEffect::Deny);
    assert_eq!(d.matched, disputes.len() as u64);
    assert_eq!(d.let_through, disputes.len() as u64);
    assert_eq!(d.calls.iter().map(|c| c.seq).collect::<Vec<_>>(), disputes);
    let s = row("shadow-searches-need-a-person");
    assert_eq!(s.would, toolgate_core::ShadowEffect::Gate);
    assert_eq!(s.matched, searches.len() as u64);
    assert_eq!(s.calls.iter().map(|c| c.seq).collect::<Vec<_>>(), searches);
    assert_eq!(report.shadow.len(), 2);
    let text = report.to_text();
    assert!(
        text.contains("shadow-no-dispute-notes would have refused 2 call(s)"),
        "{text}"
    );
    assert!(report.to_prometheus().contains(
        "toolgate_shadow_matches_total{rule=\"shadow-searches-need-a-person\",would=\"gate\"} 4"
    ));
    // The trace shows it too.
    let trace = h
        .gateway
        .state
        .store
        .trace(&"run-note-0".into(), false)
        .await
        .unwrap();
    assert!(
        trace.contains("would deny [shadow-no-dispute-notes]"),
        "{trace}"
    );
    h.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_in_flight_finishes_under_the_version_it_started_with() {
    let h = Harness::start_slow("draft_note", 800).await;
    let v1 = version(&h);
    let worker = h.client(WORKER_KEY).await;
    let slow =
        tokio::spawn(async move {
            let r = call(
            &worker,
            "note.draft",
            json!({"invoice_id": "INV-20260612", "kind": "hold", "text": "Hold: freight query."}),
            billing("hold the invoice while the freight query is open", "run-slow"),
        )
        .await;
            (worker, r)
        });
    // Wait until the call is reserved and at the ERP (its step is running).
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    loop {
        let steps = h
            .gateway
            .state
            .store
            .steps(&"run-slow".into())
            .await
            .unwrap();
        if steps
            .iter()
            .any(|s| s.status == toolgate_core::StepStatus::Running)
        {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the call never started"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    // v2 forbids notes altogether, while the call is in flight.
    write(
        &h,
        "policies/no-notes.cedar",
        "@id(\"no-notes\")\nforbid (principal, action == Action::\"note.draft\", resource);\n",
    );
    let r = h.gateway.reloader.reload(Trigger::Call).await;
    assert_eq!(r.outcome, ReloadOutcome::Applied, "{:?}", r.errors);
    let v2 = version(&h);

    let (worker, r) = slow.await.unwrap();
    let r = r.unwrap();
    assert_ne!(r.is_error, Some(true), "the call in flight finished: {r:?}");
    assert_eq!(h.records_for("draft_note").len(), 1);
    // The next one is decided under v2 and refused.
    let next = call(
        &worker,
        "note.draft",
        json!({"invoice_id": "INV-20260611", "kind": "hold", "text": "Hold: freight query."}),
        billing(
            "hold the invoice while the freight query is open",
            "run-next",
        ),
    )
    .await
    .unwrap();
    assert_eq!(next.is_error, Some(true));
    assert_eq!(
        next.structured_content.as_ref().unwrap()["rule"],
        "no-notes"
    );
    let audit = h.audit("test-worker").await;
    let versions: Vec<(&str, &str)> = audit
        .iter()
        .map(|r| {
            (
                r["why"]["decision"].as_str().unwrap(),
                r["registry_version"].as_str().unwrap(),
            )
        })
        .collect();
    assert_eq!(versions, [("allow", v1.as_str()), ("deny", v2.as_str())]);
    h.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_folder_changing_restart_only_settings_is_refused() {
    let h = Harness::start().await;
    let v1 = version(&h);
    edit(&h, "toolgate.yaml", |s| {
        s.replace("timeout_secs: 2", "timeout_secs: 3")
    });
    write(
        &h,
        "policies/extra.cedar",
        "@id(\"no-notes-marked-forbidden\")\nforbid (principal, action == Action::\"note.draft\", resource)\n\
         when { context.inputs.text like \"*FORBIDDEN*\" };\n",
    );
    let r = h.gateway.reloader.reload(Trigger::Call).await;
    assert_eq!(r.outcome, ReloadOutcome::Refused);
    assert!(r.errors[0].contains("upstreams"), "{:?}", r.errors);
    assert_eq!(version(&h), v1);
    assert!(r.audit_seq.is_some(), "a refused reload is recorded");
    h.shutdown().await;
}

/// An MCP client that counts `notifications/tools/list_changed`.
#[derive(Clone, Default)]
struct Watching {
    changed: Arc<AtomicU64>,
}

impl rmcp::ClientHandler for Watching {
    async fn on_tool_list_changed(
        &self,
        _context: rmcp::service::NotificationContext<rmcp::RoleClient>,
    ) {
        self.changed.fetch_add(1, Ordering::SeqCst);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connected_clients_are_told_that_tools_list_changed() {
    use rmcp::ServiceExt;
    use rmcp::transport::StreamableHttpClientTransport;
    use rmcp::transport::streamable_http_client::StreamableHttpClientTransportConfig;
    let h = Harness::start().await;
    let watching = Watching::default();
    let client = watching
        .clone()
        .serve(StreamableHttpClientTransport::from_config(
            StreamableHttpClientTransportConfig::with_uri(h.url.as_str()).auth_header(WORKER_KEY),
        ))
        .await
        .unwrap();
    let names = |tools: Vec<rmcp::model::Tool>| -> BTreeSet<String> {
        tools.iter().map(|t| t.name.to_string()).collect()
    };
    let before = names(client.peer().list_all_tools().await.unwrap());
    assert!(before.contains("note.draft"));

    // The finance worker loses note.draft.
    edit(&h, "tools/notes.yaml", |s| {
        s.replacen(
            "roles: [worker.finance, worker.comms]",
            "roles: [worker.comms]",
            1,
        )
    });
    let r = h.gateway.reloader.reload(Trigger::Call).await;
    assert_eq!(r.outcome, ReloadOutcome::Applied, "{:?}", r.errors);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    while watching.changed.load(Ordering::SeqCst) == 0 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "no tools/list_changed notification"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let after = names(client.peer().list_all_tools().await.unwrap());
    assert!(!after.contains("note.draft"), "{after:?}");
    assert_eq!(
        before.difference(&after).cloned().collect::<Vec<_>>(),
        ["note.draft"]
    );
    h.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_follows_the_folder_and_decides_the_next_step_under_the_new_version() {
    use toolgate_gateway::{WorkerOptions, run_worker};
    use toolgate_store::{PlannedStep, WorkOptions};
    let h = Harness::start().await;
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let opts = WorkerOptions {
        config_dir: h.dir.path().to_path_buf(),
        store_url: None,
        work: Some(WorkOptions {
            idle: Duration::from_millis(100),
            poll: Duration::from_millis(20),
            ..WorkOptions::default()
        }),
        keys: toolgate_gateway::KeySource::Dev,
    };
    let worker = tokio::spawn(async move { run_worker(&opts, stop_rx).await });
    let store = h.gateway.state.store.clone();
    let note = |invoice: &str| PlannedStep {
        tool: "note.draft".into(),
        inputs: json!({"invoice_id": invoice, "kind": "info", "text": "Goods received in full."}),
        principal: "test-worker".into(),
        purpose: Some("billing".into()),
        reason: Some("record the goods receipt".into()),
        evidence: vec![],
        actor: Default::default(),
    };
    let settled = |run: toolgate_core::RunId| {
        let store = store.clone();
        async move {
            let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
            loop {
                let s = store.steps(&run).await.unwrap().remove(0);
                if s.status.is_settled() {
                    return s;
                }
                assert!(
                    tokio::time::Instant::now() < deadline,
                    "the step never settled"
                );
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }
    };
    let registry = h.gateway.state.registry();
    let v1 = registry.version.hash.clone();
    let run1 = store
        .create_run(
            &registry,
            &"test-worker".into(),
            Some("billing"),
            &[note("INV-20260611")],
            SystemClock.now(),
        )
        .await
        .unwrap();
    let s1 = settled(run1).await;
    assert_eq!(s1.status, toolgate_core::StepStatus::Done, "{s1:?}");

    // The folder changes: notes are forbidden. The worker picks it up and records the reload.
    write(
        &h,
        "policies/no-notes.cedar",
        "@id(\"no-notes\")\nforbid (principal, action == Action::\"note.draft\", resource);\n",
    );
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    let v2 = loop {
        let reloads: Vec<_> = store
            .audit_records(Some(&"toolgate".into()), None)
            .await
            .unwrap()
            .into_iter()
            .filter(|r| r.body.tool == "registry.reload")
            .collect();
        if let Some(r) = reloads.last() {
            assert_eq!(r.body.outcome.status, toolgate_core::StepStatus::Done);
            break r.body.registry_version.clone();
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the worker did not reload"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert_ne!(v1, v2);

    let run2 = store
        .create_run(
            &registry,
            &"test-worker".into(),
            Some("billing"),
            &[note("INV-20260612")],
            SystemClock.now(),
        )
        .await
        .unwrap();
    let s2 = settled(run2.clone()).await;
    assert_eq!(s2.status, toolgate_core::StepStatus::Refused, "{s2:?}");
    assert_eq!(
        s2.outcome.as_ref().unwrap().rule.as_deref(),
        Some("no-notes")
    );
    assert_eq!(
        h.records_for("draft_note").len(),
        1,
        "only the first note reached the ERP"
    );
    let rec = store.audit_records(None, Some(&run2)).await.unwrap();
    assert_eq!(rec.last().unwrap().body.registry_version, v2);

    stop_tx.send(true).unwrap();
    let stats = worker.await.unwrap().unwrap();
    assert_eq!((stats.done, stats.refused), (1, 1));
    h.shutdown().await;
}

/// A finding nobody accepted refuses a reload; accepted (with a reason and who accepted it), a
/// reload applies and reports it as a warning; once the finding is fixed, the acceptance that
/// matches nothing refuses the reload until it is removed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reload_with_only_accepted_findings_applies_and_a_stale_acceptance_is_refused() {
    let h = Harness::start().await;
    let v1 = version(&h);
    edit(&h, "tools/notes.yaml", |s| {
        s.replace(
            "text: {type: string, minLength: 1, maxLength: 2000}",
            "text: {type: string, minLength: 1}",
        )
    });
    let r = h.gateway.reloader.reload(Trigger::Call).await;
    assert_eq!(r.outcome, ReloadOutcome::Refused, "{r:?}");
    assert!(
        r.errors.join("\n").contains("[schema.unbounded-string]"),
        "{:?}",
        r.errors
    );
    assert_eq!(version(&h), v1);

    let accepted = "accept:\n  - rule: schema.unbounded-string\n    subject: note.draft\n    \
                    at: input_schema.properties.text\n    reason: notes are bounded by the ERP at 64 KiB\n    \
                    by: \"@acme/finance-platform\"\n";
    edit(&h, "toolgate.yaml", |s| format!("{s}{accepted}"));
    let r = h.gateway.reloader.reload(Trigger::Call).await;
    assert_eq!(r.outcome, ReloadOutcome::Applied, "{:?}", r.errors);
    assert_eq!(r.warnings.len(), 1, "{r:?}");
    assert!(
        r.warnings[0].contains("[schema.unbounded-string]")
            && r.warnings[0].contains("accepted by @acme/finance-platform: notes are bounded"),
        "{:?}",
        r.warnings
    );
    let v2 = version(&h);
    assert_ne!(v1, v2);
    assert_eq!(
        h.gateway.reloader.status().last_reload.unwrap().warnings,
        r.warnings
    );

    // Fixed: the acceptance now matches nothing, and that is a finding of its own.
    edit(&h, "tools/notes.yaml", |s| {
        s.replace(
            "text: {type: string, minLength: 1}",
            "text: {type: string, minLength: 1, maxLength: 2000}",
        )
    });
    let r = h.gateway.reloader.reload(Trigger::Call).await;
    assert_eq!(r.outcome, ReloadOutcome::Refused, "{r:?}");
    assert!(
        r.errors
            .iter()
            .any(|e| e.contains("toolgate.yaml: accept[0]: [accept.stale]")),
        "{:?}",
        r.errors
    );
    assert_eq!(version(&h), v2);
    edit(&h, "toolgate.yaml", |s| s.replace(accepted, ""));
    let r = h.gateway.reloader.reload(Trigger::Call).await;
    assert_eq!(r.outcome, ReloadOutcome::Applied, "{:?}", r.errors);
    assert!(r.warnings.is_empty());
    assert_eq!(version(&h), v1, "the folder is what it was at start");
    h.shutdown().await;
}
