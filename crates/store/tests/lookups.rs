//! Destinations looked up at decision time, answers that may follow a committed effect, late
//! commits, governance latency and approvals' decision time — on both backends.

use std::collections::HashSet;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use crate::common::*;
use serde_json::{Value, json};
use toolgate_core::{FixedClock, Registry, StepStatus, Timestamp, Verdict};
use toolgate_store::audit::AuditDecision;
use toolgate_store::{
    Actor, BoxFuture, CallMeta, CallStatus, DirectCall, Executor, Handler, HandlerError,
    HandlerOutput, PlannedStep, StoreConfig, Target,
};

both_backends!(
    destination_is_looked_up_and_enforced,
    failed_lookup_fails_closed,
    nothing_is_looked_up_for_a_caller_the_tool_is_not_listed_for,
    error_after_commit_is_unknown_then_reconciled,
    late_commit_is_not_settled_failed_too_early,
    approval_keeps_the_time_it_was_decided,
);

fn mail_registry() -> Arc<Registry> {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/lookup-registry");
    Arc::new(Registry::load(&dir).unwrap_or_else(|e| panic!("lookup fixture registry: {e}")))
}

/// How the fake mail system answers `send`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Send {
    Ok,
    /// Sent, then an HTTP 500 instead of the answer.
    ErrorAfterCommit,
    /// No answer; the message is sent later, when the test says so.
    LateCommit,
}

/// A fake mail system: `domains` answers the verified domains of ACC-001, `send` records what
/// it sent, `lookup` says whether a key was sent.
struct Mail {
    calls: Mutex<Vec<(String, Value)>>,
    sent: Mutex<HashSet<String>>,
    late: Mutex<Vec<String>>,
    send: Mutex<Send>,
    domains_down: Mutex<bool>,
}

impl Mail {
    fn new() -> Arc<Mail> {
        Arc::new(Mail {
            calls: Mutex::new(Vec::new()),
            sent: Mutex::new(HashSet::new()),
            late: Mutex::new(Vec::new()),
            send: Mutex::new(Send::Ok),
            domains_down: Mutex::new(false),
        })
    }
    fn count(&self, tool: &str) -> usize {
        self.calls
            .lock()
            .unwrap()
            .iter()
            .filter(|c| c.0 == tool)
            .count()
    }
    fn sent(&self) -> usize {
        self.sent.lock().unwrap().len()
    }
    /// The late commits land now.
    fn land_late(&self) {
        let late: Vec<String> = self.late.lock().unwrap().drain(..).collect();
        self.sent.lock().unwrap().extend(late);
    }
}

impl Handler for Mail {
    fn call<'a>(
        &'a self,
        target: &'a Target,
        inputs: &'a Value,
        meta: &'a CallMeta,
    ) -> BoxFuture<'a, Result<HandlerOutput, HandlerError>> {
        Box::pin(async move {
            let tool = target.upstream_tool.clone().unwrap_or_default();
            self.calls
                .lock()
                .unwrap()
                .push((tool.clone(), inputs.clone()));
            let key = meta.idempotency_key.to_string();
            match tool.as_str() {
                "domains" => {
                    if *self.domains_down.lock().unwrap() {
                        return Err(HandlerError::Failed("the mail directory is down".into()));
                    }
                    let domains = match inputs["account"].as_str() {
                        Some("ACC-001") => json!(["example-shop.de", "shop.example"]),
                        _ => json!([]),
                    };
                    Ok(HandlerOutput {
                        result: json!({"account": inputs["account"], "domains": domains}),
                        target_ref: None,
                    })
                }
                "lookup" => {
                    let asked = inputs["idempotency_key"].as_str().unwrap_or_default();
                    Ok(HandlerOutput {
                        result: json!({"found": self.sent.lock().unwrap().contains(asked)}),
                        target_ref: None,
                    })
                }
                "send" => match *self.send.lock().unwrap() {
                    Send::Ok => {
                        self.sent.lock().unwrap().insert(key.clone());
                        Ok(HandlerOutput {
                            result: json!({"sent": true}),
                            target_ref: Some("MSG-1".into()),
                        })
                    }
                    Send::ErrorAfterCommit => {
                        self.sent.lock().unwrap().insert(key);
                        Err(HandlerError::Unanswered(
                            "HTTP 500: internal server error".into(),
                        ))
                    }
                    Send::LateCommit => {
                        self.late.lock().unwrap().push(key);
                        Err(HandlerError::Timeout)
                    }
                },
                other => Err(HandlerError::Failed(format!("no tool {other}"))),
            }
        })
    }
}

fn mail_executor(
    store: &toolgate_store::Store,
    mail: Arc<Mail>,
    clock: Arc<FixedClock>,
) -> Executor {
    Executor::new(store.clone(), mail_registry(), keys(), mail, clock)
}

fn mail_to(to: &str, run: &str) -> DirectCall {
    DirectCall {
        principal: "mailer".into(),
        tool: "mail.send".into(),
        inputs: json!({"account": "ACC-001", "to": to, "subject": "Invoice INV-1001"}),
        run_id: run.into(),
        purpose: Some("ops".into()),
        reason: Some("tell the customer the invoice is paid".into()),
        purpose_from: None,
        argument_errors: Vec::new(),
        evidence: Vec::new(),
        approvals: Vec::new(),
        actor: Actor::default(),
    }
}

fn planned(to: &str) -> PlannedStep {
    PlannedStep {
        tool: "mail.send".into(),
        inputs: json!({"account": "ACC-001", "to": to, "subject": "Payment sent"}),
        principal: "mailer".into(),
        purpose: Some("ops".into()),
        reason: Some("tell the customer".into()),
        evidence: Vec::new(),
        actor: Actor::default(),
    }
}

async fn destination_is_looked_up_and_enforced(db: &TestDb) {
    let store = db.store(StoreConfig::default()).await;
    let mail = Mail::new();
    let ex = mail_executor(&store, mail.clone(), clock());

    // A verified domain: looked up, allowed, sent once.
    let ok = ex
        .governed_call(mail_to("billing@example-shop.de", "run-a"))
        .await
        .unwrap();
    assert_eq!(ok.status, CallStatus::Done, "{:?}", ok.decision);
    assert_eq!(mail.count("domains"), 1);
    assert_eq!(mail.count("send"), 1);

    // An attacker's domain: refused, naming the domains that would pass; nothing is sent.
    let bad = ex
        .governed_call(mail_to("ceo@attacker.example", "run-b"))
        .await
        .unwrap();
    assert_eq!(bad.status, CallStatus::Refused);
    assert_eq!(bad.decision.rule(), Some("destination.to"));
    let Verdict::Deny { reason, .. } = &bad.decision.verdict else {
        panic!("{:?}", bad.decision.verdict)
    };
    for v in ["attacker.example", "example-shop.de", "shop.example"] {
        assert!(reason.contains(v), "{reason}");
    }
    assert_eq!(mail.count("domains"), 2);
    assert_eq!(mail.count("send"), 1);

    // The lookups are audited as reads, each before the record of the call it served.
    let records = store.audit_records(None, None).await.unwrap();
    let kinds: Vec<(AuditDecision, &str)> = records
        .iter()
        .map(|r| (r.body.why.decision, r.body.tool.as_str()))
        .collect();
    assert_eq!(
        kinds,
        vec![
            (AuditDecision::Lookup, "mail.domains"),
            (AuditDecision::Allow, "mail.send"),
            (AuditDecision::Lookup, "mail.domains"),
            (AuditDecision::Deny, "mail.send"),
        ]
    );
    let lookup = &records[0].body;
    assert_eq!(lookup.effect, Some(toolgate_core::Effect::Read));
    assert_eq!(lookup.who.principal, "mailer");
    assert_eq!(lookup.why.rule.as_deref(), Some("destination.to"));
    assert_eq!(lookup.inputs, json!({"account": "ACC-001"}));
    assert_eq!(lookup.outcome.status, StepStatus::Done);
    assert_eq!(lookup.outcome.governance_us, None);
    // Governance latency is recorded for the decided calls, not for the lookup.
    assert!(records[1].body.outcome.governance_us.is_some());
    assert!(records[3].body.outcome.governance_us.is_some());

    // Planned steps: one lookup for the batch (same account), the verified address sent, the
    // other refused.
    let reg = mail_registry();
    let run = store
        .create_run(
            &reg,
            &"mailer".into(),
            Some("ops"),
            &[
                planned("accounts@shop.example"),
                planned("payouts@attacker.example"),
            ],
            T0,
        )
        .await
        .unwrap();
    let reports = ex.run_batch(10).await.unwrap();
    assert_eq!(reports.len(), 2);
    let steps = store.steps(&run).await.unwrap();
    assert_eq!(steps[0].status, StepStatus::Done);
    assert_eq!(steps[1].status, StepStatus::Refused);
    let refusal = steps[1].outcome.as_ref().unwrap();
    assert_eq!(refusal.rule.as_deref(), Some("destination.to"));
    assert!(
        refusal
            .error
            .as_deref()
            .unwrap()
            .contains("example-shop.de, shop.example"),
        "{refusal:?}"
    );
    assert_eq!(mail.count("domains"), 3, "one lookup served the batch");
    assert_eq!(mail.count("send"), 2);
    let run_records = store.audit_records(None, Some(&run)).await.unwrap();
    assert_eq!(
        run_records
            .iter()
            .filter(|r| r.body.why.decision == AuditDecision::Lookup)
            .count(),
        1
    );
    assert!(store.verify_chain().await.unwrap().is_intact());
}

async fn nothing_is_looked_up_for_a_caller_the_tool_is_not_listed_for(db: &TestDb) {
    let store = db.store(StoreConfig::default()).await;
    let mail = Mail::new();
    let ex = mail_executor(&store, mail.clone(), clock());
    let r = ex
        .governed_call(DirectCall {
            principal: "outsider".into(),
            ..mail_to("billing@example-shop.de", "run-a")
        })
        .await
        .unwrap();
    assert_eq!(r.status, CallStatus::Refused);
    assert_eq!(
        r.decision.check(toolgate_core::CheckName::Listed).outcome,
        toolgate_core::Outcome::Fail
    );
    assert_eq!(mail.count("domains"), 0);
    assert_eq!(mail.count("send"), 0);
    let records = store.audit_records(None, None).await.unwrap();
    assert_eq!(records.len(), 1);
    assert_eq!(records[0].body.why.decision, AuditDecision::Deny);
}

async fn failed_lookup_fails_closed(db: &TestDb) {
    let store = db.store(StoreConfig::default()).await;
    let mail = Mail::new();
    *mail.domains_down.lock().unwrap() = true;
    let ex = mail_executor(&store, mail.clone(), clock());
    let r = ex
        .governed_call(mail_to("billing@example-shop.de", "run-a"))
        .await
        .unwrap();
    assert_eq!(r.status, CallStatus::Refused);
    assert_eq!(r.decision.rule(), Some("destination.to"));
    let Verdict::Deny { reason, .. } = &r.decision.verdict else {
        panic!("{:?}", r.decision.verdict)
    };
    assert!(
        reason.contains("could not be looked up through mail.domains"),
        "{reason}"
    );
    assert_eq!(mail.count("send"), 0);
    let records = store.audit_records(None, None).await.unwrap();
    assert_eq!(records[0].body.why.decision, AuditDecision::Lookup);
    assert_eq!(records[0].body.outcome.status, StepStatus::Failed);
    assert!(
        records[0]
            .body
            .outcome
            .error
            .as_deref()
            .unwrap()
            .contains("directory is down")
    );
    assert_eq!(records[1].body.why.decision, AuditDecision::Deny);
}

async fn error_after_commit_is_unknown_then_reconciled(db: &TestDb) {
    let store = db.store(StoreConfig::default()).await;
    let mail = Mail::new();
    *mail.send.lock().unwrap() = Send::ErrorAfterCommit;
    let ex = mail_executor(&store, mail.clone(), clock());
    let r = ex
        .governed_call(mail_to("billing@example-shop.de", "run-a"))
        .await
        .unwrap();
    // Not "failed": the mail system sent it before it failed to answer.
    assert_eq!(r.status, CallStatus::Unknown);
    let outcome = r.outcome.unwrap();
    assert_eq!(outcome.rule.as_deref(), Some("unanswered.irreversible"));
    assert_eq!(mail.sent(), 1);
    // A retry is told the outcome is not known yet; nothing is sent twice.
    let again = ex
        .governed_call(mail_to("billing@example-shop.de", "run-a"))
        .await
        .unwrap();
    assert_eq!(again.status, CallStatus::Unknown);
    assert_eq!(mail.count("send"), 1);
    // Reconciled by key: it landed, so the step is done.
    let settled = ex.reconcile().await.unwrap();
    assert_eq!(settled.len(), 1);
    assert_eq!(settled[0].status, StepStatus::Done);
    assert_eq!(
        store.step(&settled[0].step_id).await.unwrap().status,
        StepStatus::Done
    );
}

async fn late_commit_is_not_settled_failed_too_early(db: &TestDb) {
    let cfg = StoreConfig {
        reconcile_quiet: Some(std::time::Duration::from_secs(600)),
        ..StoreConfig::default()
    };
    let store = db.store(cfg).await;
    let mail = Mail::new();
    *mail.send.lock().unwrap() = Send::LateCommit;
    let clock = clock();
    let ex = mail_executor(&store, mail.clone(), clock.clone());

    let a = ex
        .governed_call(mail_to("billing@example-shop.de", "run-a"))
        .await
        .unwrap();
    assert_eq!(a.status, CallStatus::Unknown);
    let step_a = a.step_id.unwrap();
    // Asked at once, the mail system has not sent it yet: "not found" is not believed.
    assert!(ex.reconcile().await.unwrap().is_empty());
    assert_eq!(
        store.step(&step_a).await.unwrap().status,
        StepStatus::Unknown
    );
    // The late commit lands; the next round finds it.
    mail.land_late();
    let settled = ex.reconcile().await.unwrap();
    assert_eq!(settled.len(), 1);
    assert_eq!(settled[0].status, StepStatus::Done);
    assert_eq!(store.step(&step_a).await.unwrap().status, StepStatus::Done);

    // A call that never lands is settled failed once the quiet period has passed.
    let b = ex
        .governed_call(mail_to("accounts@shop.example", "run-b"))
        .await
        .unwrap();
    assert_eq!(b.status, CallStatus::Unknown);
    let step_b = b.step_id.unwrap();
    mail.late.lock().unwrap().clear(); // it will never land
    assert!(ex.reconcile().await.unwrap().is_empty());
    clock.advance_hours(1);
    let settled = ex.reconcile().await.unwrap();
    assert_eq!(settled.len(), 1);
    assert_eq!(settled[0].status, StepStatus::Failed);
    assert_eq!(
        store.step(&step_b).await.unwrap().status,
        StepStatus::Failed
    );
    assert!(store.verify_chain().await.unwrap().is_intact());
}

async fn approval_keeps_the_time_it_was_decided(db: &TestDb) {
    let store = db.store(StoreConfig::default()).await;
    let fake = Recorder::new();
    let clock = clock();
    let ex = executor(&store, fake.clone(), clock.clone());
    let reg = registry();
    let call = DirectCall {
        principal: "worker".into(),
        tool: "payment.send".into(),
        inputs: json!({"invoice_id": "INV-1001", "amount": 12000.0, "currency": "EUR", "iban": "DE89370400440532013000"}),
        run_id: "run-gated".into(),
        purpose: Some("ops".into()),
        reason: Some("settle invoice per contract".into()),
        purpose_from: None,
        argument_errors: Vec::new(),
        evidence: Vec::new(),
        approvals: Vec::new(),
        actor: Actor::default(),
    };
    let parked = ex.governed_call(call.clone()).await.unwrap();
    assert_eq!(parked.status, CallStatus::NeedsApproval);
    let id = parked.approval_id.unwrap();
    clock.advance_hours(1);
    store
        .approve(&reg, &keys(), &id, &"alice".into(), clock.now_ts())
        .await
        .unwrap();
    clock.advance_hours(2);
    let ran = ex.governed_call(call).await.unwrap();
    assert_eq!(ran.status, CallStatus::Done);
    let a = store.approval(&id).await.unwrap();
    assert_eq!(a.status, toolgate_store::ApprovalStatus::Consumed);
    // The age at decision is the person's, not the time the call came back to use it.
    assert_eq!(
        a.decided_at,
        Some(Timestamp::from_millis(T0.millis() + 3_600_000))
    );
    assert_eq!(fake.count("payment.send"), 1);
}

trait NowTs {
    fn now_ts(&self) -> Timestamp;
}

impl NowTs for FixedClock {
    fn now_ts(&self) -> Timestamp {
        toolgate_core::Clock::now(self)
    }
}
