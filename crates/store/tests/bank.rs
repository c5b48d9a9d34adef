//! What third-party tools need to say, against a fake bank without lookups by key: a payee off
//! the list parks the call for a person (`unknown: gate`) and the approved call runs once; a
//! transfer left unknown is settled by listing recent transactions (`reconcile_query`); a
//! change of the user's details is undone with the same tool and the values read before it
//! (`compensate_with`). On both backends.

use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use crate::common::*;
use serde_json::{Value, json};
use toolgate_core::{CheckName, FixedClock, Outcome, Registry, StepStatus, Verdict};
use toolgate_store::audit::AuditDecision;
use toolgate_store::{
    Actor, ApprovalStatus, BoxFuture, CallMeta, CallStatus, DirectCall, Executor, Handler,
    HandlerError, HandlerOutput, PlannedStep, StoreConfig, Target,
};

both_backends!(
    an_unlisted_payee_goes_to_a_person_and_the_approved_call_runs_once,
    an_unknown_transfer_is_settled_by_the_reconciling_query,
    a_change_is_undone_with_the_same_tool_and_the_previous_values,
    a_change_whose_previous_values_cannot_be_read_is_not_made,
);

pub fn bank_registry_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/bank-registry")
}

fn bank_registry() -> Arc<Registry> {
    Arc::new(
        Registry::load(bank_registry_dir())
            .unwrap_or_else(|e| panic!("bank fixture registry: {e}")),
    )
}

/// How the fake bank answers `send_money`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum SendMode {
    Ok,
    /// The transfer is booked, and the answer never comes back.
    BookedThenTimeout,
    /// Nothing is booked, and no answer comes back.
    LostThenTimeout,
}

/// A fake bank: a ledger of transactions, the user's details, and every call it received.
struct Bank {
    calls: Mutex<Vec<(String, Value)>>,
    transactions: Mutex<Vec<Value>>,
    user: Mutex<Value>,
    send: Mutex<SendMode>,
    user_info_down: Mutex<bool>,
}

impl Bank {
    fn new() -> Arc<Bank> {
        Arc::new(Bank {
            calls: Mutex::new(Vec::new()),
            // An older transfer to the same payee, for another amount: not this call.
            transactions: Mutex::new(vec![json!({
                "id": 1, "sender": "me", "recipient": "GB29NWBK60161331926819",
                "amount": 10.0, "subject": "rent", "date": "2026-11-01"
            })]),
            user: Mutex::new(json!({
                "first_name": "Emma", "last_name": "Johnson",
                "street": "Apple Street 1", "city": "Cupertino"
            })),
            send: Mutex::new(SendMode::Ok),
            user_info_down: Mutex::new(false),
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
    fn inputs_of(&self, tool: &str) -> Vec<Value> {
        self.calls
            .lock()
            .unwrap()
            .iter()
            .filter(|c| c.0 == tool)
            .map(|c| c.1.clone())
            .collect()
    }
}

impl Handler for Bank {
    fn call<'a>(
        &'a self,
        target: &'a Target,
        inputs: &'a Value,
        _meta: &'a CallMeta,
    ) -> BoxFuture<'a, Result<HandlerOutput, HandlerError>> {
        Box::pin(async move {
            let tool = target.upstream_tool.clone().unwrap_or_default();
            self.calls
                .lock()
                .unwrap()
                .push((tool.clone(), inputs.clone()));
            match tool.as_str() {
                "send_money" => {
                    let mode = *self.send.lock().unwrap();
                    if mode != SendMode::LostThenTimeout {
                        let mut txs = self.transactions.lock().unwrap();
                        let mut t = inputs.clone();
                        t["id"] = json!(txs.len() + 1);
                        t["sender"] = json!("me");
                        txs.push(t);
                    }
                    match mode {
                        SendMode::Ok => Ok(HandlerOutput {
                            result: json!({"message": "sent"}),
                            target_ref: Some("TX".into()),
                        }),
                        _ => Err(HandlerError::Timeout),
                    }
                }
                "get_most_recent_transactions" => Ok(HandlerOutput {
                    result: json!({"transactions": *self.transactions.lock().unwrap()}),
                    target_ref: None,
                }),
                "get_user_info" => {
                    if *self.user_info_down.lock().unwrap() {
                        return Err(HandlerError::Failed("the profile service is down".into()));
                    }
                    Ok(HandlerOutput {
                        result: self.user.lock().unwrap().clone(),
                        target_ref: None,
                    })
                }
                "update_user_info" => {
                    let mut user = self.user.lock().unwrap();
                    for (k, v) in inputs.as_object().unwrap() {
                        if !v.is_null() {
                            user[k] = v.clone();
                        }
                    }
                    Ok(HandlerOutput {
                        result: user.clone(),
                        target_ref: None,
                    })
                }
                other => Err(HandlerError::Failed(format!("no tool {other}"))),
            }
        })
    }
}

fn bank_executor(
    store: &toolgate_store::Store,
    bank: Arc<Bank>,
    clock: Arc<FixedClock>,
) -> Executor {
    Executor::new(store.clone(), bank_registry(), keys(), bank, clock)
}

fn transfer(recipient: &str, amount: f64) -> Value {
    json!({"recipient": recipient, "amount": amount, "subject": "invoice 2026-11", "date": "2026-11-30"})
}

fn send(inputs: Value) -> DirectCall {
    DirectCall {
        principal: "worker".into(),
        tool: "bank.send_money".into(),
        inputs,
        run_id: "run-bank-1".into(),
        purpose: Some("ops".into()),
        reason: Some("pay the supplier's invoice".into()),
        purpose_from: None,
        argument_errors: Vec::new(),
        evidence: Vec::new(),
        approvals: Vec::new(),
        actor: Actor::default(),
    }
}

fn planned(tool: &str, inputs: Value) -> PlannedStep {
    PlannedStep {
        tool: tool.into(),
        inputs,
        principal: "worker".into(),
        purpose: Some("ops".into()),
        reason: Some("the user moved house".into()),
        evidence: Vec::new(),
        actor: Actor::default(),
    }
}

async fn an_unlisted_payee_goes_to_a_person_and_the_approved_call_runs_once(db: &TestDb) {
    let store = db.store(StoreConfig::default()).await;
    let bank = Bank::new();
    let ex = bank_executor(&store, bank.clone(), clock());
    let reg = bank_registry();

    // A payee on record goes through without anyone.
    let ok = ex
        .governed_call(send(transfer("GB29NWBK60161331926819", 100.0)))
        .await
        .unwrap();
    assert_eq!(ok.status, CallStatus::Done, "{:?}", ok.decision);

    // A payee off the list is not refused: it waits for a person, saying why.
    let unlisted = transfer("US133000000121212121212", 250.0);
    let parked = ex.governed_call(send(unlisted.clone())).await.unwrap();
    assert_eq!(
        parked.status,
        CallStatus::NeedsApproval,
        "{:?}",
        parked.decision
    );
    assert_eq!(parked.decision.rule(), Some("destination.recipient"));
    let dest = parked.decision.check(CheckName::Destination);
    assert_eq!(dest.outcome, Outcome::Gate, "{dest:?}");
    let Verdict::NeedsApproval { reason, .. } = &parked.decision.verdict else {
        panic!("{:?}", parked.decision.verdict)
    };
    assert!(reason.contains("destination not on the list"), "{reason}");
    assert!(reason.contains("US133000000121212121212"), "{reason}");
    assert_eq!(
        bank.count("send_money"),
        1,
        "the unlisted transfer was not sent"
    );
    let approval_id = parked.approval_id.clone().unwrap();
    let request = store.approval(&approval_id).await.unwrap();
    assert_eq!(
        toolgate_core::canonical(&request.inputs),
        toolgate_core::canonical(&unlisted)
    );

    // The person approves; the approved call runs once, and its retry replays.
    let token = store
        .approve(&reg, &keys(), &approval_id, &"alice".into(), T0)
        .await
        .unwrap();
    let mut approved = send(unlisted.clone());
    approved.approvals = vec![token.clone()];
    let done = ex.governed_call(approved.clone()).await.unwrap();
    assert_eq!(done.status, CallStatus::Done, "{:?}", done.decision);
    assert_eq!(
        store.approval(&approval_id).await.unwrap().status,
        ApprovalStatus::Consumed
    );
    let again = ex.governed_call(approved).await.unwrap();
    assert_eq!(again.status, CallStatus::Replayed, "{:?}", again.decision);
    let sent = bank.inputs_of("send_money");
    assert_eq!(sent.len(), 2, "{sent:?}");
    assert_eq!(
        sent.iter()
            .filter(|i| i["recipient"] == "US133000000121212121212")
            .count(),
        1,
        "the approved transfer ran once"
    );

    // The same approval does not stretch to another amount to the same unlisted payee.
    let mut other = send(transfer("US133000000121212121212", 9000.0));
    other.approvals = vec![token];
    let r = ex.governed_call(other).await.unwrap();
    assert_eq!(r.status, CallStatus::NeedsApproval, "{:?}", r.decision);
    assert_eq!(bank.count("send_money"), 2);
    assert!(store.verify_chain().await.unwrap().is_intact());
}

async fn an_unknown_transfer_is_settled_by_the_reconciling_query(db: &TestDb) {
    let store = db
        .store(StoreConfig {
            reconcile_quiet: Some(std::time::Duration::ZERO),
            ..StoreConfig::default()
        })
        .await;
    let bank = Bank::new();
    let ex = bank_executor(&store, bank.clone(), clock());

    // Booked, then no answer: unknown, never retried blind.
    *bank.send.lock().unwrap() = SendMode::BookedThenTimeout;
    let booked = ex
        .governed_call(send(transfer("GB29NWBK60161331926819", 480.0)))
        .await
        .unwrap();
    assert_eq!(booked.status, CallStatus::Unknown, "{booked:?}");
    // Lost, then no answer: unknown too.
    *bank.send.lock().unwrap() = SendMode::LostThenTimeout;
    let lost = ex
        .governed_call(send(transfer("DE89370400440532013000", 75.5)))
        .await
        .unwrap();
    assert_eq!(lost.status, CallStatus::Unknown, "{lost:?}");

    // The reconciler lists recent transactions and looks for each call in them.
    let settled = ex.reconcile().await.unwrap();
    assert_eq!(settled.len(), 2, "{settled:?}");
    let by_status = |st: StepStatus| settled.iter().filter(|r| r.status == st).count();
    assert_eq!(by_status(StepStatus::Done), 1, "{settled:?}");
    assert_eq!(by_status(StepStatus::Failed), 1, "{settled:?}");
    let queries = bank.inputs_of("get_most_recent_transactions");
    assert_eq!(queries, vec![json!({"n": 50}), json!({"n": 50})]);
    let done = settled
        .iter()
        .find(|r| r.status == StepStatus::Done)
        .unwrap();
    let item = done.outcome.as_ref().unwrap().result.as_ref().unwrap();
    assert_eq!(
        item["amount"],
        json!(480.0),
        "the matched transaction is the result"
    );
    assert_eq!(
        done.outcome.as_ref().unwrap().rule.as_deref(),
        Some("reconciled.bank.transactions")
    );

    // The booked transfer replays as done; the lost one, known not to have happened, runs
    // again once, and no transfer was booked twice.
    *bank.send.lock().unwrap() = SendMode::Ok;
    let replay = ex
        .governed_call(send(transfer("GB29NWBK60161331926819", 480.0)))
        .await
        .unwrap();
    assert_eq!(replay.status, CallStatus::Replayed, "{replay:?}");
    let retry = ex
        .governed_call(send(transfer("DE89370400440532013000", 75.5)))
        .await
        .unwrap();
    assert_eq!(retry.status, CallStatus::Done, "{retry:?}");
    let txs = bank.transactions.lock().unwrap().clone();
    assert_eq!(
        txs.len(),
        3,
        "the old one, the booked one, the retried one: {txs:?}"
    );
    assert_eq!(bank.count("send_money"), 3);
    let records = store.audit_records(None, None).await.unwrap();
    assert_eq!(
        records
            .iter()
            .filter(|r| r.body.why.decision == AuditDecision::Reconcile)
            .count(),
        2
    );
    assert!(store.verify_chain().await.unwrap().is_intact());
}

async fn a_change_is_undone_with_the_same_tool_and_the_previous_values(db: &TestDb) {
    let store = db.store(StoreConfig::default()).await;
    let bank = Bank::new();
    let ex = bank_executor(&store, bank.clone(), clock());
    let reg = bank_registry();
    let run = store
        .create_run(
            &reg,
            &"worker".into(),
            Some("ops"),
            &[planned(
                "bank.update_user_info",
                json!({"street": "Dalton Street 123", "city": "New York", "first_name": null}),
            )],
            T0,
        )
        .await
        .unwrap();
    let reports = ex.drain().await.unwrap();
    assert_eq!(reports.len(), 1);
    assert_eq!(reports[0].status, StepStatus::Done, "{reports:?}");
    assert_eq!(bank.user.lock().unwrap()["city"], "New York");
    // The previous values were read just before the write, and the read is audited.
    let tools: Vec<String> = bank
        .calls
        .lock()
        .unwrap()
        .iter()
        .map(|c| c.0.clone())
        .collect();
    assert_eq!(tools, vec!["get_user_info", "update_user_info"]);
    let records = store.audit_records(None, Some(&run)).await.unwrap();
    let read = records
        .iter()
        .find(|r| r.body.why.decision == AuditDecision::Lookup)
        .expect("the read is recorded");
    assert_eq!(read.body.tool, "bank.get_user_info");
    assert_eq!(
        read.body.why.rule.as_deref(),
        Some("compensate_with.bank.get_user_info")
    );

    // Aborting the run calls the same tool with the previous values.
    let comp = ex.abort_run(&run, "the user did not move").await.unwrap();
    assert_eq!(comp.len(), 1);
    assert_eq!(comp[0].status, StepStatus::Done, "{comp:?}");
    let updates = bank.inputs_of("update_user_info");
    assert_eq!(updates.len(), 2);
    assert_eq!(
        updates[1],
        json!({"first_name": "Emma", "last_name": "Johnson", "street": "Apple Street 1", "city": "Cupertino"})
    );
    assert_eq!(
        *bank.user.lock().unwrap(),
        json!({"first_name": "Emma", "last_name": "Johnson", "street": "Apple Street 1", "city": "Cupertino"})
    );
    let steps = store.steps(&run).await.unwrap();
    let comp_step = steps.iter().find(|s| s.compensates.is_some()).unwrap();
    assert_eq!(comp_step.tool, "bank.update_user_info");
    assert!(store.verify_chain().await.unwrap().is_intact());
}

async fn a_change_whose_previous_values_cannot_be_read_is_not_made(db: &TestDb) {
    let store = db.store(StoreConfig::default()).await;
    let bank = Bank::new();
    *bank.user_info_down.lock().unwrap() = true;
    let ex = bank_executor(&store, bank.clone(), clock());
    let reg = bank_registry();
    let run = store
        .create_run(
            &reg,
            &"worker".into(),
            Some("ops"),
            &[planned("bank.update_user_info", json!({"city": "Boston"}))],
            T0,
        )
        .await
        .unwrap();
    let reports = ex.run_batch(1).await.unwrap();
    assert_eq!(reports[0].status, StepStatus::Failed, "{reports:?}");
    let outcome = reports[0].outcome.as_ref().unwrap();
    assert_eq!(outcome.rule.as_deref(), Some("compensate_with.unread"));
    assert_eq!(bank.count("update_user_info"), 0, "the write was not made");
    assert_eq!(bank.user.lock().unwrap()["city"], "Cupertino");
    let steps = store.steps(&run).await.unwrap();
    assert_eq!(steps[0].status, StepStatus::Failed);
    assert!(store.verify_chain().await.unwrap().is_intact());
}
