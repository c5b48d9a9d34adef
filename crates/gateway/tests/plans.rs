//! The plan built-ins (`plan.submit`, `step.approve`/`step.reject`, `run.status`) through a real
//! rmcp client, on the finance example's registry (plan-bound workers): a planner submits a plan, a
//! reviewer approves or rejects a step, a worker process executes it, `run.status` shows it; a
//! plan-bound worker's unplanned call is refused. Assertions are on the audit chain, the store and
//! the fake ERP's call record.

use std::path::Path;

use rmcp::RoleClient;
use rmcp::model::CallToolResult;
use rmcp::service::RunningService;
use serde_json::{Value, json};
use toolgate_gateway::{Gateway, ServeOptions, WorkerOptions, run_worker};
use toolgate_store::{ApprovalStatus, AuditDecision, AuditRecord, WorkOptions};

use crate::common::{call, connect, start_fake_finance};

const PLANNER: &str = "tgdev_fin_planner";
const WORKER: &str = "tgdev_fin_worker";
const REVIEWER: &str = "tgdev_fin_reviewer";

struct Env {
    dir: tempfile::TempDir,
    url: String,
    gateway: Gateway,
    record: std::path::PathBuf,
    stop: tokio_util::sync::CancellationToken,
    fake_stop: tokio_util::sync::CancellationToken,
}

fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for e in std::fs::read_dir(from).unwrap() {
        let e = e.unwrap();
        std::fs::copy(e.path(), to.join(e.file_name())).unwrap();
    }
}

/// The finance example as shipped (plan-bound workers, its dev keys), its ERP the in-process fake.
async fn start() -> Env {
    let dir = tempfile::tempdir().unwrap();
    let ex = crate::common::example_dir();
    copy_dir(&ex.join("tools"), &dir.path().join("tools"));
    copy_dir(&ex.join("policies"), &dir.path().join("policies"));
    std::fs::copy(
        ex.join("principals.yaml"),
        dir.path().join("principals.yaml"),
    )
    .unwrap();
    let record = dir.path().join("erp-calls.jsonl");
    let (fake, fake_stop) = start_fake_finance(&record, Vec::new()).await;
    std::fs::write(
        dir.path().join("toolgate.yaml"),
        format!(
            "label: finance-example\nstore:\n  url: \"sqlite://toolgate.db\"\nupstreams:\n  erp:\n    url: \"http://{fake}/mcp\"\n    package: \"toolgate-fakes@0.1.0\"\n    timeout_secs: 5\n"
        ),
    )
    .unwrap();
    // The example's pins, moved to where this registry reaches the same fake.
    std::fs::copy(ex.join("toolgate.lock"), dir.path().join("toolgate.lock")).unwrap();
    toolgate_gateway::pins::rehome_lock(dir.path()).unwrap();
    let opts = ServeOptions {
        config_dir: dir.path().to_path_buf(),
        http: true,
        keys: toolgate_gateway::KeySource::Dev,
        ..ServeOptions::default()
    };
    let gateway = Gateway::build(&opts).await.expect("gateway builds");
    let stop = tokio_util::sync::CancellationToken::new();
    let (addr, fut) = gateway
        .bind_http("127.0.0.1:0", stop.clone())
        .await
        .unwrap();
    tokio::spawn(fut);
    Env {
        url: format!("http://{addr}/mcp"),
        dir,
        gateway,
        record,
        stop,
        fake_stop,
    }
}

impl Env {
    async fn client(&self, key: &str) -> RunningService<RoleClient, ()> {
        connect(&self.url, key).await
    }

    /// Tools the fake ERP was called with, in order.
    fn erp_calls(&self) -> Vec<String> {
        if !self.record.exists() {
            return Vec::new();
        }
        toolgate_fakes::record::read_records(&self.record)
            .unwrap()
            .into_iter()
            .map(|r| r.tool)
            .collect()
    }

    async fn audit(&self, principal: Option<&str>, run: Option<&str>) -> Vec<AuditRecord> {
        self.gateway
            .state
            .store
            .audit_records(
                principal.map(Into::into).as_ref(),
                run.map(Into::into).as_ref(),
            )
            .await
            .unwrap()
    }

    /// A `toolgate worker` for this registry, run until the queue is empty.
    async fn work(&self) -> toolgate_store::WorkStats {
        let (_tx, rx) = tokio::sync::watch::channel(false);
        let opts = WorkerOptions {
            config_dir: self.dir.path().to_path_buf(),
            store_url: None,
            work: Some(WorkOptions {
                until_idle: true,
                ..WorkOptions::default()
            }),
            keys: toolgate_gateway::KeySource::Dev,
        };
        run_worker(&opts, rx).await.expect("the worker runs")
    }

    async fn shutdown(self) {
        self.stop.cancel();
        self.gateway.close().await;
        self.fake_stop.cancel();
    }
}

fn billing(reason: &str) -> Value {
    json!({"purpose": "billing", "reason": reason})
}

fn facts(r: &CallToolResult) -> Value {
    r.structured_content.clone().unwrap_or(Value::Null)
}

const PAYMENT: &str = "payment.schedule";

fn payment(amount: f64) -> Value {
    json!({"invoice_id": "INV-20260611", "amount": amount, "currency": "EUR",
           "value_date": "2026-06-30", "reason": "Three-way match complete against PO-77812; net-30."})
}

fn note() -> Value {
    json!({"invoice_id": "INV-20260611", "kind": "info", "text": "Matched against PO-77812."})
}

fn plan(payment_amount: f64) -> Value {
    json!({
        "goal": "Process invoice INV-20260611 for payment",
        "steps": [
            {"tool": "note.draft", "inputs": note(), "purpose": "billing", "worker": "fin-worker",
             "justification": "Leave a trail on the invoice.", "evidence": ["INV-20260611", "PO-77812"]},
            {"tool": PAYMENT, "inputs": payment(payment_amount), "purpose": "billing",
             "justification": "Pay the matched invoice.", "evidence": ["INV-20260611", "PO-77812", "SUP-0042"]},
        ]
    })
}

async fn submit(planner: &RunningService<RoleClient, ()>, p: Value) -> CallToolResult {
    call(
        planner,
        "plan.submit",
        p,
        billing("Plan the payment of the matched invoice."),
    )
    .await
    .expect("plan.submit answers")
}

async fn status(client: &RunningService<RoleClient, ()>, run: &str) -> Value {
    let r = call(
        client,
        "run.status",
        json!({"run_id": run}),
        billing("Follow the run."),
    )
    .await
    .expect("run.status answers");
    assert_ne!(r.is_error, Some(true), "{r:?}");
    facts(&r)
}

fn step_of<'a>(st: &'a Value, tool: &str) -> &'a Value {
    st["steps"]
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["tool"] == tool)
        .unwrap_or_else(|| panic!("no {tool} step in {st}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_submitted_plan_is_reviewed_executed_by_a_worker_and_shown_by_run_status() {
    let env = start().await;
    let planner = env.client(PLANNER).await;
    let reviewer = env.client(REVIEWER).await;
    let listed: Vec<String> = planner
        .peer()
        .list_all_tools()
        .await
        .unwrap()
        .into_iter()
        .map(|t| t.name.to_string())
        .collect();
    assert!(listed.contains(&"plan.submit".to_string()), "{listed:?}");
    assert!(!listed.contains(&PAYMENT.to_string()), "{listed:?}");

    let r = submit(&planner, plan(4180.0)).await;
    assert_ne!(r.is_error, Some(true), "{r:?}");
    let run = facts(&r)["run_id"].as_str().unwrap().to_string();
    assert_eq!(
        facts(&r)["steps"][1]["worker"],
        "fin-worker",
        "assigned to the one plan-bound worker that runs payments"
    );
    assert!(env.erp_calls().is_empty(), "submitting executes nothing");
    let st = status(&planner, &run).await;
    assert_eq!(step_of(&st, "note.draft")["status"], "pending");
    assert_eq!(st["goal"], "Process invoice INV-20260611 for payment");

    // The reviewer's check passes: recorded, and it changes nothing about the gate.
    let pay_step = step_of(&st, PAYMENT)["step_id"]
        .as_str()
        .unwrap()
        .to_string();
    let a = call(
        &reviewer,
        "step.approve",
        json!({"step_id": pay_step, "note": "Amount and PO match the invoice."}),
        billing("Check the payment step."),
    )
    .await
    .unwrap();
    assert_ne!(a.is_error, Some(true), "{a:?}");
    assert_eq!(facts(&a)["step_status"], "pending");

    let stats = env.work().await;
    assert_eq!(
        (stats.executed, stats.done, stats.parked),
        (2, 1, 1),
        "{stats:?}"
    );
    assert_eq!(
        env.erp_calls(),
        ["draft_note"],
        "the payment is parked, not sent"
    );

    let st = status(&planner, &run).await;
    assert_eq!(step_of(&st, "note.draft")["status"], "done");
    let pay = step_of(&st, PAYMENT);
    assert_eq!(pay["status"], "needs_approval");
    assert_eq!(pay["rule"], "gate.always");
    assert!(pay["approval_id"].is_string());
    assert_eq!(pay["reviews"][0]["reviewer"], "fin-reviewer");
    assert_eq!(pay["reviews"][0]["verdict"], "approved");
    let pending = env
        .gateway
        .state
        .store
        .approvals(Some(ApprovalStatus::Pending))
        .await
        .unwrap();
    assert_eq!(
        pending.len(),
        1,
        "the reviewer's approval is not a person's"
    );

    // Audit: the submission, the review, and each step's execution under the plan's run.
    let submitted = env.audit(Some("fin-planner"), None).await;
    let rec = submitted
        .iter()
        .find(|r| r.body.tool == "plan.submit")
        .expect("plan.submit is audited");
    assert_eq!(rec.body.why.decision, AuditDecision::Allow);
    assert_eq!(rec.body.outcome.target_ref.as_deref(), Some(run.as_str()));
    let reviewed = env.audit(Some("fin-reviewer"), None).await;
    assert!(reviewed.iter().any(|r| r.body.tool == "step.approve"
        && r.body.outcome.target_ref.as_deref() == Some(pay_step.as_str())));
    let in_run = env.audit(None, Some(&run)).await;
    let kinds: Vec<(&str, AuditDecision, &str)> = in_run
        .iter()
        .map(|r| {
            (
                r.body.tool.as_str(),
                r.body.why.decision,
                r.body.who.principal.as_str(),
            )
        })
        .collect();
    assert!(
        kinds.contains(&("note.draft", AuditDecision::Allow, "fin-worker")),
        "{kinds:?}"
    );
    assert!(
        kinds.contains(&(PAYMENT, AuditDecision::NeedsApproval, "fin-worker")),
        "{kinds:?}"
    );

    // The same plan again (a retried submission) is the same run: nothing new is queued.
    let again = submit(&planner, plan(4180.0)).await;
    assert_eq!(facts(&again)["run_id"], run.as_str());
    assert_eq!(env.work().await.executed, 0);
    assert!(
        env.gateway
            .state
            .store
            .verify_chain()
            .await
            .unwrap()
            .broken
            .is_none()
    );
    env.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reviewer_rejection_stops_a_parked_step_before_a_person_sees_it() {
    let env = start().await;
    let planner = env.client(PLANNER).await;
    let reviewer = env.client(REVIEWER).await;
    let r = submit(&planner, plan(4180.0)).await;
    let run = facts(&r)["run_id"].as_str().unwrap().to_string();
    env.work().await;
    let st = status(&reviewer, &run).await;
    let pay_step = step_of(&st, PAYMENT)["step_id"]
        .as_str()
        .unwrap()
        .to_string();
    assert_eq!(
        env.gateway
            .state
            .store
            .approvals(Some(ApprovalStatus::Pending))
            .await
            .unwrap()
            .len(),
        1
    );

    // A rejection needs a note.
    let bare = call(
        &reviewer,
        "step.reject",
        json!({"step_id": pay_step}),
        billing("Check the payment."),
    )
    .await
    .unwrap();
    assert_eq!(bare.is_error, Some(true));
    let no = call(
        &reviewer,
        "step.reject",
        json!({"step_id": pay_step, "note": "Value date is before the goods were received."}),
        billing("Check the payment."),
    )
    .await
    .unwrap();
    assert_ne!(no.is_error, Some(true), "{no:?}");
    assert_eq!(facts(&no)["step_status"], "refused");

    let st = status(&planner, &run).await;
    assert_eq!(step_of(&st, PAYMENT)["status"], "refused");
    assert_eq!(step_of(&st, PAYMENT)["rule"], "review.rejected");
    assert!(
        env.gateway
            .state
            .store
            .approvals(Some(ApprovalStatus::Pending))
            .await
            .unwrap()
            .is_empty(),
        "no person is asked"
    );
    let in_run = env.audit(None, Some(&run)).await;
    let rejected = in_run
        .iter()
        .find(|r| r.body.why.decision == AuditDecision::Rejected)
        .expect("the rejection is on the step's record");
    assert_eq!(rejected.body.who.principal, "fin-reviewer");
    assert_eq!(rejected.body.why.rule.as_deref(), Some("review.rejected"));
    assert_eq!(rejected.body.step_id.as_deref(), Some(pay_step.as_str()));
    assert_eq!(env.work().await.executed, 0, "a rejected step never runs");
    assert!(!env.erp_calls().contains(&"schedule_payment".to_string()));
    env.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_plan_bound_worker_runs_only_its_planned_steps() {
    let env = start().await;
    let planner = env.client(PLANNER).await;
    let worker = env.client(WORKER).await;

    // No plan: a direct call of a tool the worker's role lists is refused and recorded.
    let direct = call(&worker, "note.draft", note(), json!({"purpose": "billing", "reason": "The invoice text says so.", "run_id": "run-improvised"}))
        .await
        .unwrap();
    assert_eq!(direct.is_error, Some(true));
    assert_eq!(facts(&direct)["rule"], "plan.unplanned");
    assert!(env.erp_calls().is_empty());
    let refused = env.audit(Some("fin-worker"), Some("run-improvised")).await;
    assert_eq!(refused.len(), 1);
    assert_eq!(refused[0].body.why.decision, AuditDecision::Deny);
    assert_eq!(refused[0].body.why.rule.as_deref(), Some("plan.unplanned"));

    // With a plan, the worker's call that is exactly its planned step runs that step, once.
    let r = submit(&planner, plan(4180.0)).await;
    let run = facts(&r)["run_id"].as_str().unwrap().to_string();
    let meta = json!({"purpose": "billing", "reason": "My planned step.", "run_id": run});
    let first = call(&worker, "note.draft", note(), meta.clone())
        .await
        .unwrap();
    assert_ne!(first.is_error, Some(true), "{first:?}");
    let again = call(&worker, "note.draft", note(), meta.clone())
        .await
        .unwrap();
    assert_eq!(
        again.structured_content, first.structured_content,
        "a repeat gets the recorded outcome"
    );
    assert_eq!(env.erp_calls(), ["draft_note"]);
    // Changed inputs are not the planned step.
    let mut changed = note();
    changed["text"] = json!("Pay the new IBAN instead.");
    let other = call(&worker, "note.draft", changed, meta).await.unwrap();
    assert_eq!(facts(&other)["rule"], "plan.unplanned");
    assert_eq!(env.erp_calls(), ["draft_note"]);
    let st = status(&worker, &run).await;
    assert_eq!(step_of(&st, "note.draft")["status"], "done");
    env.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_plan_whose_step_fails_its_tools_schema_is_refused_naming_the_step() {
    let env = start().await;
    let planner = env.client(PLANNER).await;
    let r = submit(&planner, plan(50_000.01)).await;
    assert_eq!(r.is_error, Some(true));
    let f = facts(&r);
    assert_eq!(f["rule"], "schema.maximum");
    assert_eq!(f["step"], 2);
    assert!(
        f["reason"]
            .as_str()
            .unwrap()
            .starts_with("step 2 (payment.schedule)"),
        "{f}"
    );
    let counts = env.gateway.state.store.status_counts().await.unwrap();
    assert!(counts.is_empty(), "nothing was queued: {counts:?}");
    let recs = env.audit(Some("fin-planner"), None).await;
    assert_eq!(recs.len(), 1);
    assert_eq!(recs[0].body.why.decision, AuditDecision::Deny);
    assert_eq!(recs[0].body.why.rule.as_deref(), Some("schema.maximum"));

    // A step for a tool its worker cannot see is refused the same way, as an unknown tool.
    let mut p = plan(4180.0);
    p["steps"][0] = json!({"tool": "supplier.update_iban", "purpose": "billing", "justification": "The invoice asks for it.",
                           "inputs": {"supplier_id": "SUP-0042", "iban": "ES9121000418450200051332"}});
    let r = submit(&planner, p).await;
    assert_eq!(facts(&r)["rule"], "plan.worker");
    assert!(env.erp_calls().is_empty());
    // The refused plan is recorded with the step's IBAN redacted as supplier.update_iban's own
    // records redact it.
    let recs = env.audit(Some("fin-planner"), None).await;
    let text = serde_json::to_string(&recs.last().unwrap().body).unwrap();
    assert!(!text.contains("ES9121000418450200051332"), "{text}");
    assert!(text.contains("hmac:"), "{text}");
    env.shutdown().await;
}
