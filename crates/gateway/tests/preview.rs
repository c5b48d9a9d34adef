//! Preview, then commit through a real rmcp client: a tool declaring `preview:` is
//! listed as `T.preview` (its inputs) and `T` (only `plan_id`); the preview does nothing and
//! returns the envelope, plan id, hash and expiry; the commit runs exactly the previewed inputs;
//! an approval of the parked commit binds to the plan's hash. Checked against the fake ERP's
//! record, the audit chain and the approval store.

use std::collections::BTreeSet;

use crate::common::*;
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;
use toolgate_core::{Clock, SystemClock};
use toolgate_gateway::{Gateway, GatewayServer, ReloadOutcome, ServeOptions, Trigger};

/// The finance test registry with `note.draft` and `payment.schedule` declaring a preview.
async fn start() -> Harness {
    let dir = tempfile::tempdir().unwrap();
    let record = dir.path().join("erp-calls.jsonl");
    let (fake, fake_stop) = start_fake_finance(&record, Vec::new()).await;
    write_registry(
        dir.path(),
        &format!(
            "    url: \"http://{fake}/mcp\"\n    package: \"toolgate-fakes@0.1.0\"\n    timeout_secs: 2\n"
        ),
    );
    for (file, tool) in [
        ("notes.yaml", "note.draft"),
        ("payments.yaml", "payment.schedule"),
    ] {
        let path = dir.path().join("tools").join(file);
        let text = std::fs::read_to_string(&path).unwrap();
        let anchor = format!("  - name: {tool}\n");
        assert!(text.contains(&anchor), "{file} declares {tool}");
        let text = text.replacen(
            &anchor,
            &format!("{anchor}    preview: {{expires_secs: 600}}\n"),
            1,
        );
        std::fs::write(&path, text).unwrap();
    }
    let gateway = Gateway::build(&ServeOptions {
        config_dir: dir.path().to_path_buf(),
        http: true,
        keys: toolgate_gateway::KeySource::Dev,
        ..ServeOptions::default()
    })
    .await
    .expect("gateway builds");
    let stop = CancellationToken::new();
    let (addr, fut) = gateway
        .bind_http("127.0.0.1:0", stop.clone())
        .await
        .unwrap();
    tokio::spawn(fut);
    Harness::from_parts(dir, record, addr, gateway, stop, fake_stop)
}

fn s(r: &rmcp::model::CallToolResult) -> &Value {
    r.structured_content.as_ref().expect("structured content")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_preview_does_nothing_and_the_commit_does_exactly_the_plan() {
    let h = start().await;
    let worker = h.client(WORKER_KEY).await;
    let tools = worker.peer().list_all_tools().await.unwrap();
    let names: BTreeSet<String> = tools.iter().map(|t| t.name.to_string()).collect();
    assert!(names.contains("note.draft") && names.contains("note.draft.preview"));
    let commit_tool = tools.iter().find(|t| t.name == "note.draft").unwrap();
    assert_eq!(
        commit_tool.input_schema["required"],
        json!(["plan_id"]),
        "the commit takes only a plan id"
    );
    let preview_tool = tools
        .iter()
        .find(|t| t.name == "note.draft.preview")
        .unwrap();
    // The preview takes the tool's inputs as listed to this caller (with the reason it asks for).
    let registry = h.gateway.state.registry();
    let listed = registry.listed_schema(
        registry.principal("test-worker").unwrap(),
        Some("test"),
        registry.tool("note.draft").unwrap(),
    );
    assert_eq!(Value::Object((*preview_tool.input_schema).clone()), listed);
    assert!(listed["properties"].get("reason").is_some());

    let args = json!({"invoice_id": "INV-20260615", "kind": "query", "text": "Please confirm the delivery date."});
    let meta = billing(
        "ask the supplier to confirm the delivery date",
        "run-preview",
    );
    let p = call(&worker, "note.draft.preview", args.clone(), meta.clone())
        .await
        .unwrap();
    assert_ne!(p.is_error, Some(true), "{p:?}");
    assert_eq!(s(&p)["status"], "previewed");
    assert_eq!(
        s(&p)["envelope"]["inputs"],
        args,
        "the full envelope, exactly"
    );
    assert_eq!(s(&p)["envelope"]["upstream_tool"], "draft_note");
    assert_eq!(s(&p)["expires_in_s"], 600);
    let plan_id = s(&p)["plan_id"].as_str().unwrap().to_string();
    let hash = s(&p)["hash"].as_str().unwrap().to_string();
    // Nothing was done: the ERP saw nothing; the audit chain holds the preview itself, with
    // the plan id as its reference.
    assert!(h.records_for("draft_note").is_empty());
    let audit = h.audit("test-worker").await;
    assert_eq!(audit.len(), 1, "{audit:#?}");
    assert_eq!(audit[0]["tool"], "note.draft.preview");
    assert_eq!(audit[0]["why"]["decision"], "preview");
    assert_eq!(audit[0]["outcome"]["status"], "done");
    assert_eq!(audit[0]["outcome"]["target_ref"], plan_id.as_str());
    assert_eq!(audit[0]["run_id"], "run-preview");
    assert_eq!(audit[0]["inputs"], args);

    // A preview the commit would certainly refuse (above the schema's ceiling) makes no plan.
    let over = call(
        &worker,
        "payment.schedule.preview",
        json!({"invoice_id": "INV-20260615", "amount": 60000, "currency": "EUR", "value_date": "2026-06-30",
               "reason": "Pay invoice INV-20260615 matched against PO-77901"}),
        billing("pay an approved invoice matched against PO-77901", "run-preview-over"),
    )
    .await
    .unwrap();
    assert_eq!(over.is_error, Some(true));
    assert_eq!(s(&over)["check"], "schema");
    assert!(s(&over).get("plan_id").is_none());
    let audit = h.audit("test-worker").await;
    let refused = audit.last().unwrap();
    assert_eq!(refused["tool"], "payment.schedule.preview");
    assert_eq!(refused["why"]["decision"], "deny");
    assert_eq!(refused["why"]["rule"], s(&over)["rule"]);
    assert_eq!(refused["outcome"]["status"], "refused");

    // Fresh arguments at commit are refused; nothing runs.
    let r = call(
        &worker,
        "note.draft",
        json!({"plan_id": plan_id, "text": "something else"}),
        meta.clone(),
    )
    .await
    .unwrap();
    assert_eq!(r.is_error, Some(true));
    assert_eq!(s(&r)["rule"], "preview.plan_id_only");
    assert!(h.records_for("draft_note").is_empty());
    let audit = h.audit("test-worker").await;
    let refused = audit.last().unwrap();
    assert_eq!(
        (
            &refused["tool"],
            &refused["why"]["decision"],
            &refused["why"]["rule"]
        ),
        (
            &json!("note.draft"),
            &json!("deny"),
            &json!("preview.plan_id_only")
        )
    );

    // The commit runs exactly the plan: the ERP receives the previewed inputs; the audit
    // record's input hash is the plan's hash. The trace context is the commit request's own.
    let tp = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
    let c = call(
        &worker,
        "note.draft",
        json!({"plan_id": plan_id}),
        json!({"traceparent": tp}),
    )
    .await
    .unwrap();
    assert_ne!(c.is_error, Some(true), "{c:?}");
    assert_eq!(s(&c)["plan_id"], plan_id.as_str());
    let drafts = h.records_for("draft_note");
    assert_eq!(drafts.len(), 1);
    assert_eq!(drafts[0].arguments["text"], args["text"]);
    assert_eq!(drafts[0].arguments["invoice_id"], args["invoice_id"]);
    assert_eq!(drafts[0].meta["traceparent"], tp);
    let audit = h.audit("test-worker").await;
    assert_eq!(
        audit.len(),
        4,
        "preview, refused preview, refused commit, commit"
    );
    let done = &audit[3];
    assert_eq!(done["tool"], "note.draft");
    assert_eq!(done["why"]["decision"], "allow");
    assert_eq!(done["inputs"], args);
    assert_eq!(toolgate_core::InputHash::of(&args).as_str(), hash);
    assert_eq!(done["run_id"], "run-preview", "the preview's run id");

    // Another principal cannot commit it; an unknown plan is refused; nothing more ran.
    let planner = h.client(PLANNER_KEY).await;
    let other = call(
        &planner,
        "note.draft",
        json!({"plan_id": plan_id}),
        json!({}),
    )
    .await;
    assert!(other.is_err(), "not listed for the planner: {other:?}");
    let unknown = call(
        &worker,
        "note.draft",
        json!({"plan_id": "pln_00000000000000000000000000000000"}),
        json!({}),
    )
    .await
    .unwrap();
    assert_eq!(s(&unknown)["rule"], "preview.unknown_plan");
    assert_eq!(h.records_for("draft_note").len(), 1);
    let audit = h.audit("test-worker").await;
    assert_eq!(audit.len(), 5);
    assert_eq!(audit[4]["why"]["rule"], "preview.unknown_plan");
    h.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn approving_the_parked_commit_approves_the_previewed_plan() {
    let h = start().await;
    let worker = h.client(WORKER_KEY).await;
    let args = json!({"invoice_id": "INV-20260611", "amount": 4180.0, "currency": "EUR", "value_date": "2026-06-30",
                      "reason": "Invoice 20260611 matched against PO-77812, goods received"});
    let p = call(
        &worker,
        "payment.schedule.preview",
        args.clone(),
        billing(
            "pay an approved invoice matched against PO-77901",
            "run-plan-gate",
        ),
    )
    .await
    .unwrap();
    let plan_id = s(&p)["plan_id"].as_str().unwrap().to_string();
    let hash = s(&p)["hash"].as_str().unwrap().to_string();

    let c = call(
        &worker,
        "payment.schedule",
        json!({"plan_id": plan_id}),
        json!({}),
    )
    .await
    .unwrap();
    assert_eq!(s(&c)["status"], "needs_approval", "{c:?}");
    assert_eq!(s(&c)["plan_hash"], hash.as_str());
    let id = s(&c)["approval_id"].as_str().unwrap().to_string();
    let store = &h.gateway.state.store;
    let req = store.approval(&id.as_str().into()).await.unwrap();
    let req = serde_json::to_value(&req).unwrap();
    assert_eq!(
        req["input_hash"],
        hash.as_str(),
        "the approval binds the plan's hash"
    );
    assert!(h.records_for("schedule_payment").is_empty());

    let registry = h.gateway.state.registry();
    let token = store
        .approve(
            &registry,
            &h.gateway.state.executor().keys,
            &id.as_str().into(),
            &"test-clerk".into(),
            SystemClock.now(),
        )
        .await
        .unwrap();
    let c = call(
        &worker,
        "payment.schedule",
        json!({"plan_id": plan_id}),
        json!({"approval_token": token.as_str()}),
    )
    .await
    .unwrap();
    assert_ne!(c.is_error, Some(true), "{c:?}");
    let paid = h.records_for("schedule_payment");
    assert_eq!(paid.len(), 1);
    assert_eq!(paid[0].arguments["amount"], args["amount"]);
    let audit = h.audit("test-worker").await;
    let last = audit.last().unwrap();
    assert_eq!(last["why"]["decision"], "allow");
    // The audit stores the inputs in canonical form; their hash is the plan's.
    assert_eq!(toolgate_core::InputHash::of(&last["inputs"]).as_str(), hash);
    h.shutdown().await;
}

/// A request keeps the registry version it took when it came in, through every phase: a commit
/// routed under v1 is decided under v1 even when v2 (which forbids the tool) is put in service
/// before its governed call; the next request takes v2 and is refused by it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reload_between_phases_does_not_split_a_commit_across_versions() {
    let h = start().await;
    let worker = h.client(WORKER_KEY).await;
    let args =
        json!({"invoice_id": "INV-20260612", "kind": "hold", "text": "Hold: freight query."});
    let meta = billing(
        "hold the invoice while the freight query is open",
        "run-split",
    );
    let preview = |args: Value| call(&worker, "note.draft.preview", args, meta.clone());
    let p = preview(args.clone()).await.unwrap();
    let plan_id = s(&p)["plan_id"].as_str().unwrap().to_string();

    // The commit's request takes its snapshot (v1) ...
    let v1 = h.gateway.state.surface();
    // ... and v2, which forbids notes, is put in service before the commit is decided.
    std::fs::write(
        h.dir.path().join("policies/no-notes.cedar"),
        "@id(\"no-notes\")\nforbid (principal, action == Action::\"note.draft\", resource);\n",
    )
    .unwrap();
    let r = h.gateway.reloader.reload(Trigger::Call).await;
    assert_eq!(r.outcome, ReloadOutcome::Applied, "{:?}", r.errors);
    let v2 = h.gateway.state.registry().version.hash.clone();
    assert_ne!(v1.registry.version.hash, v2);

    let caller = h.gateway.auth.by_api_key(&v1.registry, WORKER_KEY).unwrap();
    let server = GatewayServer::new(h.gateway.state.clone(), None);
    let commit = rmcp::model::CallToolRequestParams::new("note.draft")
        .with_arguments(obj(json!({"plan_id": plan_id})));
    let c = server
        .call_under(v1.clone(), caller, commit, Default::default())
        .await
        .unwrap();
    assert_ne!(c.is_error, Some(true), "decided under v1: {c:?}");
    assert_eq!(h.records_for("draft_note").len(), 1);
    let audit = h.audit("test-worker").await;
    let done = audit.last().unwrap();
    assert_eq!(done["why"]["decision"], "allow");
    assert_eq!(
        done["registry_version"],
        v1.registry.version.hash.as_str(),
        "the commit's record names the version it was decided under"
    );

    // A request that comes in now takes v2: its commit is refused by v2's rule.
    let p = preview(
        json!({"invoice_id": "INV-20260611", "kind": "hold", "text": "Hold: freight query."}),
    )
    .await
    .unwrap();
    let plan_id = s(&p)["plan_id"].as_str().unwrap().to_string();
    let c = call(
        &worker,
        "note.draft",
        json!({"plan_id": plan_id}),
        json!({}),
    )
    .await
    .unwrap();
    assert_eq!(c.is_error, Some(true), "{c:?}");
    assert_eq!(s(&c)["rule"], "no-notes");
    assert_eq!(h.records_for("draft_note").len(), 1);
    h.shutdown().await;
}
