//! The store's test suite, written once and run against both backends: each `suite!` entry
//! becomes a `<name>_sqlite` and a `<name>_postgres` test.

use std::sync::Arc;

use crate::common::*;
use serde_json::{Value, json};
use toolgate_core::config::Durability;
use toolgate_core::{ApprovalToken, CheckName, Rule, StepStatus};
use toolgate_store::{
    Actor, ApprovalStatus, CallResult, CallStatus, DirectCall, PlannedStep, Store, StoreConfig,
    StoreError,
};

both_backends!(
    duplicate_direct_call_is_replayed,
    duplicate_planned_step_is_suppressed,
    same_key_other_inputs_and_in_flight,
    failed_call_replays_its_error,
    a_call_the_pin_stops_on_its_way_out_is_the_pins_refusal,
    irreversible_timeout_is_unknown_then_reconciled,
    the_worker_loop_reconciles_unknown_steps,
    write_timeout_is_failed_and_retried,
    a_direct_call_is_attempted_four_times_then_refused_by_the_engine,
    approval_for_other_amount_is_refused,
    two_person_rule_needs_two_distinct_approvers,
    expired_gate_fails_closed,
    audit_is_append_only_and_tampering_is_named,
    budgets_are_conserved_up_the_parent_chain,
    abort_compensates_newest_first,
    direct_calls_are_numbered_after_the_runs_steps,
    export_and_trace,
    process_durability_records_and_replays_the_same,
    a_key_shared_by_a_tree_is_refused_to_the_others_naming_who,
    reads_run_again_and_a_key_past_its_retention_is_a_new_operation,
    a_retry_that_meets_its_unsettled_call_is_not_a_denial,
    a_parked_call_retried_meets_its_request_its_rejection_or_after_expiry_a_new_one,
    a_gated_read_runs_once_per_approval_and_a_spent_token_never_again,
    a_runs_counts_follow_every_change_of_its_steps,
    many_calls_that_find_a_principals_current_run_stale_write_it_once,
);

fn direct(tool: &str, inputs: Value) -> DirectCall {
    DirectCall {
        principal: "worker".into(),
        tool: tool.into(),
        inputs,
        run_id: "run-direct-1".into(),
        purpose: Some("ops".into()),
        reason: Some("settle invoice per contract".into()),
        purpose_from: None,
        argument_errors: Vec::new(),
        evidence: vec!["doc-1".into()],
        approvals: Vec::new(),
        actor: Actor {
            model: Some("worker-mid".into()),
            prompt_rev: Some("w-3".into()),
            usage: None,
        },
    }
}

fn payment(amount: f64) -> Value {
    json!({"invoice_id": "INV-1001", "amount": amount, "currency": "EUR", "iban": "DE89370400440532013000"})
}

fn step(principal: &str, tool: &str, inputs: Value) -> PlannedStep {
    PlannedStep {
        tool: tool.into(),
        inputs,
        principal: principal.into(),
        purpose: Some("ops".into()),
        reason: Some("planned by the test".into()),
        evidence: vec![],
        actor: Actor::default(),
    }
}

#[test]
fn idempotency_retention_never_shorter_than_approval_expiry() {
    let cfg = StoreConfig {
        idempotency_retention_hours: 1,
        ..StoreConfig::default()
    };
    assert_eq!(cfg.retention_ms(), 72 * 3_600_000);
    assert_eq!(StoreConfig::default().retention_ms(), 72 * 3_600_000);
}

/// The same payment asked for twice: the first is done, the second replayed, one upstream call.
async fn pay_twice(store: &Store) -> (CallResult, CallResult, Arc<Recorder>) {
    let fake = Recorder::new();
    let ex = executor(store, fake.clone(), clock());
    let first = ex
        .governed_call(direct("payment.send", payment(4180.0)))
        .await
        .unwrap();
    let second = ex
        .governed_call(direct("payment.send", payment(4180.0)))
        .await
        .unwrap();
    assert_eq!(first.status, CallStatus::Done, "{first:?}");
    assert_eq!(second.status, CallStatus::Replayed, "{second:?}");
    assert_eq!(fake.count("payment.send"), 1, "same key, one upstream call");
    (first, second, fake)
}

async fn duplicate_direct_call_is_replayed(db: &TestDb) {
    let store = db.store(StoreConfig::default()).await;
    let (first, second, fake) = pay_twice(&store).await;
    let (a, b) = (first.outcome.unwrap(), second.outcome.unwrap());
    assert_eq!(a.target_ref, b.target_ref);
    assert!(a.target_ref.is_some());
    assert_eq!(first.idem_key, second.idem_key);
    // The key travelled to the target; the IBAN did not reach the audit log in clear.
    assert_eq!(
        fake.keys_of("payment.send"),
        vec![first.idem_key.to_string()]
    );
    let recs = store
        .audit_records(Some(&"worker".into()), None)
        .await
        .unwrap();
    assert_eq!(recs.len(), 2);
    assert!(
        recs[0].body.inputs["iban"]
            .as_str()
            .unwrap()
            .starts_with("hmac:")
    );
    assert_eq!(recs[0].body.redacted, vec!["iban".to_string()]);
    assert_eq!(recs[0].body.why.checks.len(), 12, "every check recorded");
    assert!(store.verify_chain().await.unwrap().is_intact());
}

/// `durability: process` changes when commits reach the disk, nothing about what is recorded:
/// the call, its replay and the audit chain are as with fsync. On PostgreSQL it is the
/// server's `synchronous_commit = off` for every connection of the store.
async fn process_durability_records_and_replays_the_same(db: &TestDb) {
    let store = db
        .store(StoreConfig {
            durability: Durability::Process,
            ..StoreConfig::default()
        })
        .await;
    pay_twice(&store).await;
    assert_eq!(
        store
            .audit_records(Some(&"worker".into()), None)
            .await
            .unwrap()
            .len(),
        2
    );
    assert!(store.verify_chain().await.unwrap().is_intact());

    if db.backend == Backend::Postgres {
        let check = |want: &str| {
            format!(
                "DO $$ BEGIN IF current_setting('synchronous_commit') <> '{want}' THEN \
                 RAISE EXCEPTION 'synchronous_commit is %', current_setting('synchronous_commit'); \
                 END IF; END $$"
            )
        };
        store.execute_raw(&check("off")).await.unwrap();
        let fsync = db.store(StoreConfig::default()).await;
        let refused = fsync.execute_raw(&check("off")).await;
        assert!(
            refused.is_err(),
            "durability: fsync keeps synchronous commits"
        );
    }
}

async fn duplicate_planned_step_is_suppressed(db: &TestDb) {
    let store = db.store(StoreConfig::default()).await;
    let fake = Recorder::new();
    let ex = executor(&store, fake.clone(), clock());
    let reg = registry();
    let run = store
        .create_run(
            &reg,
            &"worker".into(),
            Some("ops"),
            &[step("worker", "payment.send", payment(4180.0))],
            T0,
        )
        .await
        .unwrap();
    let steps = store.steps(&run).await.unwrap();
    let first = ex.execute_step(&steps[0].step_id).await.unwrap();
    let second = ex.execute_step(&steps[0].step_id).await.unwrap();
    assert_eq!(first.status, StepStatus::Done);
    assert!(!first.replayed);
    assert_eq!(second.status, StepStatus::Done);
    assert!(second.replayed, "a done step returns what was recorded");
    assert_eq!(
        first.outcome.unwrap().target_ref,
        second.outcome.unwrap().target_ref
    );
    assert_eq!(fake.count("payment.send"), 1);
    // The queue does not pick a done step up again either.
    assert!(ex.run_batch(10).await.unwrap().is_empty());
    assert_eq!(fake.count("payment.send"), 1);
    let s = store.step(&steps[0].step_id).await.unwrap();
    assert_eq!(s.attempts, 1);
}

async fn same_key_other_inputs_and_in_flight(db: &TestDb) {
    let store = db.store(StoreConfig::default()).await;
    // ticket.update's identity is (ticket_id, status): a different note is the same operation.
    let fake = Recorder::new();
    let ex = executor(&store, fake.clone(), clock());
    let a = ex
        .governed_call(direct(
            "ticket.update",
            json!({"ticket_id": "T-1", "status": "closed", "note": "a"}),
        ))
        .await
        .unwrap();
    assert_eq!(a.status, CallStatus::Done);
    let b = ex
        .governed_call(direct(
            "ticket.update",
            json!({"ticket_id": "T-1", "status": "closed", "note": "b"}),
        ))
        .await
        .unwrap();
    assert_eq!(b.status, CallStatus::InputsDiffer, "{b:?}");
    assert_eq!(b.decision.rule(), Some("idempotency.inputs_differ"));
    assert_eq!(fake.count("ticket.update"), 1);

    // In flight: the first call is held inside the handler while the second arrives.
    let gate = Arc::new(tokio::sync::Notify::new());
    let entered = Arc::new(tokio::sync::Notify::new());
    let slow = Arc::new(Recorder {
        gate: Some(gate.clone()),
        entered: Some(entered.clone()),
        ..Recorder::default()
    });
    let ex2 = executor(&store, slow.clone(), clock());
    let call = direct(
        "ticket.update",
        json!({"ticket_id": "T-2", "status": "hold"}),
    );
    let ex_bg = ex2.clone();
    let call_bg = call.clone();
    let first = tokio::spawn(async move { ex_bg.governed_call(call_bg).await.unwrap() });
    entered.notified().await;
    let r = ex.governed_call(call.clone()).await.unwrap();
    assert_eq!(r.status, CallStatus::InProgress, "{r:?}");
    // Not a refusal: nothing runs, the state of the first attempt is reported.
    assert!(r.decision.is_allow(), "{r:?}");
    assert_eq!(
        r.outcome.as_ref().unwrap().rule.as_deref(),
        Some("idempotency.in_progress")
    );
    let rec = store.audit_records(None, None).await.unwrap();
    assert_eq!(
        rec.last().unwrap().body.why.decision,
        toolgate_store::audit::AuditDecision::Replay
    );
    gate.notify_one();
    let done = first.await.unwrap();
    assert_eq!(done.status, CallStatus::Done);
    assert_eq!(slow.count("ticket.update"), 1);
    let again = ex.governed_call(call).await.unwrap();
    assert_eq!(again.status, CallStatus::Replayed);
    assert_eq!(
        fake.count("ticket.update"),
        1,
        "the replay did not call the target"
    );
}

async fn failed_call_replays_its_error(db: &TestDb) {
    let store = db.store(StoreConfig::default()).await;
    let fake = Recorder::new();
    fake.set("ticket.update", Mode::Fail);
    let ex = executor(&store, fake.clone(), clock());
    let call = direct(
        "ticket.update",
        json!({"ticket_id": "T-9", "status": "open"}),
    );
    let a = ex.governed_call(call.clone()).await.unwrap();
    assert_eq!(a.status, CallStatus::Failed);
    let b = ex.governed_call(call).await.unwrap();
    assert_eq!(b.status, CallStatus::Replayed);
    assert_eq!(b.outcome.as_ref().unwrap().status, StepStatus::Failed);
    assert_eq!(a.outcome.unwrap().error, b.outcome.unwrap().error);
    assert_eq!(fake.count("ticket.update"), 1);
    // A failure spends nothing.
    let used = store.budget_use(T0).await.unwrap();
    assert!(used.iter().all(|u| u.used == 0), "{used:?}");
}

/// A definition that changed between the decision and the forward (the engine's pin check saw
/// it served as pinned) stops the call before it is sent: recorded under the pin's rule, not as
/// the target's "no", replayed to a retry, nothing sent and nothing spent.
async fn a_call_the_pin_stops_on_its_way_out_is_the_pins_refusal(db: &TestDb) {
    let store = db.store(StoreConfig::default()).await;
    let fake = Recorder::new();
    fake.set("ticket.update", Mode::NotPinned);
    let ex = executor(&store, fake.clone(), clock());
    let call = direct(
        "ticket.update",
        json!({"ticket_id": "T-9", "status": "open"}),
    );
    let a = ex.governed_call(call.clone()).await.unwrap();
    assert_eq!(a.status, CallStatus::Failed);
    let outcome = a.outcome.as_ref().unwrap();
    assert_eq!(outcome.rule, Some(Rule::PIN_BLOCKED), "{outcome:?}");
    let records = store.audit_records(None, None).await.unwrap();
    let record = records.last().unwrap();
    assert_eq!(record.body.why.rule, Some(Rule::PIN_BLOCKED), "{record:?}");
    let b = ex.governed_call(call).await.unwrap();
    assert_eq!(b.status, CallStatus::Replayed);
    assert_eq!(b.outcome.unwrap().rule, Some(Rule::PIN_BLOCKED));
    assert_eq!(fake.count("ticket.update"), 0, "nothing was sent");
    let used = store.budget_use(T0).await.unwrap();
    assert!(used.iter().all(|u| u.used == 0), "{used:?}");
}

/// `toolgate worker` runs the reconciler: an `unknown` direct call is settled by asking the
/// target by key, without sending the call again.
async fn the_worker_loop_reconciles_unknown_steps(db: &TestDb) {
    let store = db.store(StoreConfig::default()).await;
    let fake = Recorder::new();
    fake.set("payment.send", Mode::TimeoutAfterLanding);
    let ex = executor(&store, fake.clone(), clock());
    let d = ex
        .governed_call(direct("payment.send", payment(640.0)))
        .await
        .unwrap();
    assert_eq!(d.status, CallStatus::Unknown);

    let stats = ex.work_until_idle().await.unwrap();
    assert_eq!(stats.reconciled, 1, "{stats:?}");
    let step = store.step(d.step_id.as_ref().unwrap()).await.unwrap();
    assert_eq!(step.status, StepStatus::Done);
    assert_eq!(
        fake.count("payment.send"),
        1,
        "settled by asking, not by sending again"
    );
}

async fn irreversible_timeout_is_unknown_then_reconciled(db: &TestDb) {
    let store = db.store(StoreConfig::default()).await;
    let fake = Recorder::new();
    fake.set("payment.send", Mode::TimeoutAfterLanding);
    let ex = executor(&store, fake.clone(), clock());
    let reg = registry();

    // Planned step.
    let run = store
        .create_run(
            &reg,
            &"worker".into(),
            Some("ops"),
            &[step("worker", "payment.send", payment(900.0))],
            T0,
        )
        .await
        .unwrap();
    let id = store.steps(&run).await.unwrap()[0].step_id.clone();
    let r = ex.execute_step(&id).await.unwrap();
    assert_eq!(r.status, StepStatus::Unknown);
    // Never retried blind: neither by id nor by the queue.
    let again = ex.execute_step(&id).await.unwrap();
    assert_eq!(again.status, StepStatus::Unknown);
    assert!(ex.run_batch(10).await.unwrap().is_empty());
    assert_eq!(fake.count("payment.send"), 1);
    // The budget stays reserved while nobody knows.
    let spent = |u: &Vec<toolgate_store::BudgetUse>| {
        u.iter()
            .find(|b| b.principal == "worker")
            .map(|b| b.used)
            .unwrap_or(0)
    };
    assert_eq!(spent(&store.budget_use(T0).await.unwrap()), 1);

    // Direct call with the same behaviour: a duplicate is told it is in progress.
    let d = ex
        .governed_call(direct("payment.send", payment(700.0)))
        .await
        .unwrap();
    assert_eq!(d.status, CallStatus::Unknown);
    let d2 = ex
        .governed_call(direct("payment.send", payment(700.0)))
        .await
        .unwrap();
    // The retry hears that the first call's outcome is not known yet; nothing is sent again.
    assert_eq!(d2.status, CallStatus::Unknown);
    assert_eq!(fake.count("payment.send"), 2);

    // The reconciler asks the target by key: both landed, both settle done.
    let settled = ex.reconcile().await.unwrap();
    assert_eq!(settled.len(), 2);
    assert!(
        settled.iter().all(|s| s.status == StepStatus::Done),
        "{settled:?}"
    );
    assert_eq!(store.step(&id).await.unwrap().status, StepStatus::Done);
    assert_eq!(
        fake.count("payment.send"),
        2,
        "reconciliation reads, it does not resend"
    );
    let d3 = ex
        .governed_call(direct("payment.send", payment(700.0)))
        .await
        .unwrap();
    assert_eq!(d3.status, CallStatus::Replayed);
    assert_eq!(spent(&store.budget_use(T0).await.unwrap()), 2);

    // A timeout whose call never landed is settled failed, and only then retried.
    let fake2 = Recorder::new();
    let clock2 = clock();
    let ex2 = executor(&store, fake2.clone(), clock2.clone());
    let run2 = store
        .create_run(
            &reg,
            &"worker".into(),
            Some("ops"),
            &[step("worker", "payment.send", payment(50.0))],
            T0,
        )
        .await
        .unwrap();
    let id2 = store.steps(&run2).await.unwrap()[0].step_id.clone();
    store
        .execute_raw(&format!(
            "UPDATE steps SET status = 'unknown', attempts = 1 WHERE step_id = '{id2}'"
        ))
        .await
        .unwrap();
    // "Not found" is believed only once a late commit can no longer land.
    assert!(ex2.reconcile().await.unwrap().is_empty());
    clock2.advance_hours(1);
    let s = ex2.reconcile().await.unwrap();
    assert_eq!(s.len(), 1);
    assert_eq!(s[0].status, StepStatus::Failed);
    let retried = ex2.execute_step(&id2).await.unwrap();
    assert_eq!(retried.status, StepStatus::Done);
    assert_eq!(fake2.count("payment.send"), 1);
    assert!(store.verify_chain().await.unwrap().is_intact());
}

async fn write_timeout_is_failed_and_retried(db: &TestDb) {
    let cfg = StoreConfig {
        retry_backoff: std::time::Duration::ZERO,
        ..StoreConfig::default()
    };
    let store = db.store(cfg).await;
    let fake = Recorder::new();
    fake.set("ticket.update", Mode::TimeoutAfterLanding);
    let ex = executor(&store, fake.clone(), clock());
    let reg = registry();
    let run = store
        .create_run(
            &reg,
            &"worker".into(),
            Some("ops"),
            &[step(
                "worker",
                "ticket.update",
                json!({"ticket_id": "T-5", "status": "open"}),
            )],
            T0,
        )
        .await
        .unwrap();
    let id = store.steps(&run).await.unwrap()[0].step_id.clone();
    let mut statuses = Vec::new();
    for _ in 0..6 {
        let r = ex.run_batch(10).await.unwrap();
        if r.is_empty() {
            break;
        }
        statuses.push(r[0].status);
    }
    assert_eq!(
        statuses,
        vec![StepStatus::Failed; 4],
        "retried until 4 attempts"
    );
    let s = store.step(&id).await.unwrap();
    assert_eq!(s.attempts, 4);
    assert_eq!(s.status, StepStatus::Failed);
    // Every attempt carried the same key.
    let keys = fake.keys_of("ticket.update");
    assert_eq!(keys.len(), 4);
    assert!(keys.iter().all(|k| *k == s.idem_key.to_string()));
    // Failed attempts released their budget.
    assert!(
        store
            .budget_use(T0)
            .await
            .unwrap()
            .iter()
            .all(|u| u.used == 0)
    );
}

/// A direct write that times out each time is retried by its caller: each retry is a new
/// attempt of the same step, until the fourth; the fifth is refused by the engine's
/// idempotency check (the ledger's attempt count is its input), not by an edit of a decision
/// that allowed it, and the target hears four calls.
async fn a_direct_call_is_attempted_four_times_then_refused_by_the_engine(db: &TestDb) {
    let store = db.store(StoreConfig::default()).await;
    let fake = Recorder::new();
    fake.set("ticket.update", Mode::TimeoutAfterLanding);
    let ex = executor(&store, fake.clone(), clock());
    let call = direct(
        "ticket.update",
        json!({"ticket_id": "T-77", "status": "closed"}),
    );
    let mut statuses = Vec::new();
    for _ in 0..4 {
        statuses.push(ex.governed_call(call.clone()).await.unwrap().status);
    }
    assert_eq!(statuses, vec![CallStatus::Failed; 4]);
    let fifth = ex.governed_call(call).await.unwrap();
    assert_eq!(fifth.status, CallStatus::Refused, "{fifth:?}");
    assert_eq!(fifth.decision.rule(), Some("attempts.exhausted"));
    let idem = fifth
        .decision
        .checks
        .iter()
        .find(|c| c.name == CheckName::Idempotency)
        .unwrap();
    assert_eq!(idem.outcome, toolgate_core::Outcome::Fail);
    assert!(idem.detail.contains("attempted 4 times"), "{}", idem.detail);
    assert_eq!(
        fake.count("ticket.update"),
        4,
        "the fifth never reached the target"
    );
    let step = store.step(fifth.step_id.as_ref().unwrap()).await.unwrap();
    assert_eq!(step.attempts, 4);
    // The record of the refusal is the engine's decision as made: the check that failed is the
    // one the verdict names.
    let recs = store
        .audit_records(Some(&"worker".into()), None)
        .await
        .unwrap();
    let last = recs.last().unwrap();
    assert_eq!(last.body.why.rule.as_deref(), Some("attempts.exhausted"));
    assert!(
        last.body
            .why
            .checks
            .iter()
            .any(|c| c.name == CheckName::Idempotency && c.outcome == toolgate_core::Outcome::Fail)
    );
    assert!(store.verify_chain().await.unwrap().is_intact());
}

async fn approval_for_other_amount_is_refused(db: &TestDb) {
    let store = db.store(StoreConfig::default()).await;
    let fake = Recorder::new();
    let clk = clock();
    let ex = executor(&store, fake.clone(), clk.clone());
    let reg = registry();

    let parked = ex
        .governed_call(direct("payment.send", payment(12000.00)))
        .await
        .unwrap();
    assert_eq!(parked.status, CallStatus::NeedsApproval, "{parked:?}");
    assert_eq!(parked.decision.rule(), Some("large-payment-needs-approval"));
    let approval_id = parked.approval_id.clone().unwrap();
    let req = store.approval(&approval_id).await.unwrap();
    assert_eq!(
        toolgate_core::canonical(&req.inputs),
        toolgate_core::canonical(&payment(12000.00))
    );
    assert_eq!(req.reason.as_deref(), Some("settle invoice per contract"));
    assert_eq!(req.evidence, vec!["doc-1".to_string()]);
    assert_eq!(req.expires_at, T0.plus_hours(72));
    let token = store
        .approve(&reg, &keys(), &approval_id, &"alice".into(), T0)
        .await
        .unwrap();

    // The same token presented with the amount changed by one cent.
    let mut changed = direct("payment.send", payment(12000.01));
    changed.approvals = vec![token.clone()];
    let r = ex.governed_call(changed).await.unwrap();
    assert_eq!(r.status, CallStatus::NeedsApproval, "{r:?}");
    let gate = r.decision.check(CheckName::Gate);
    assert!(gate.detail.contains("approval refused"), "{}", gate.detail);
    assert_eq!(fake.count("payment.send"), 0, "nothing was sent");

    // The exact approved call goes through, once; the token is then spent.
    let mut exact = direct("payment.send", payment(12000.00));
    exact.approvals = vec![token.clone()];
    let ok = ex.governed_call(exact).await.unwrap();
    assert_eq!(ok.status, CallStatus::Done, "{ok:?}");
    assert_eq!(fake.count("payment.send"), 1);
    assert_eq!(
        store.approval(&approval_id).await.unwrap().status,
        ApprovalStatus::Consumed
    );
    let recs = store
        .audit_records(Some(&"worker".into()), None)
        .await
        .unwrap();
    let last = recs.last().unwrap();
    assert_eq!(
        last.body.approval.as_ref().unwrap().approvers,
        vec!["alice".to_string()]
    );
    assert_eq!(
        last.body.approval.as_ref().unwrap().token_fingerprints,
        vec![token.fingerprint()]
    );

    // The same call again from another run (a retry after a reconnect), token or not: the
    // payment was made, so its outcome is replayed and nothing is sent twice; no new request.
    for approvals in [vec![token.clone()], vec![]] {
        let mut retry = direct("payment.send", payment(12000.00));
        retry.run_id = "run-direct-2".into();
        retry.approvals = approvals;
        let again = ex.governed_call(retry).await.unwrap();
        assert_eq!(again.status, CallStatus::Replayed, "{again:?}");
        assert_eq!(again.idem_key, ok.idem_key);
    }
    assert_eq!(fake.count("payment.send"), 1);
    // The only open request is the one-cent-changed call's own: none was raised by the retries.
    let open = store
        .approvals(Some(ApprovalStatus::Pending))
        .await
        .unwrap();
    assert_eq!(open.len(), 1);
    assert_eq!(open[0].inputs["amount"], json!(12000.01));

    // The spent token on another payment fails closed; so does a forged one.
    for token in [token, ApprovalToken::from_wire("tg1.k1.e30.AAAA")] {
        let mut other = direct(
            "payment.send",
            json!({"invoice_id": "INV-2001", "amount": 12000.0, "currency": "EUR", "iban": "DE89370400440532013000"}),
        );
        other.approvals = vec![token];
        let f = ex.governed_call(other).await.unwrap();
        assert_eq!(f.status, CallStatus::NeedsApproval, "{f:?}");
        assert!(
            f.decision
                .check(CheckName::Gate)
                .detail
                .contains("approval refused"),
            "{}",
            f.decision.check(CheckName::Gate).detail
        );
    }
    assert_eq!(fake.count("payment.send"), 1);
}

async fn two_person_rule_needs_two_distinct_approvers(db: &TestDb) {
    let store = db.store(StoreConfig::default()).await;
    let fake = Recorder::new();
    let ex = executor(&store, fake.clone(), clock());
    let reg = registry();
    let run = store
        .create_run(
            &reg,
            &"worker".into(),
            Some("ops"),
            &[step(
                "worker",
                "payment.priority",
                json!({"invoice_id": "INV-7", "amount": 10.0}),
            )],
            T0,
        )
        .await
        .unwrap();
    let r = ex.run_batch(10).await.unwrap();
    assert_eq!(r[0].status, StepStatus::NeedsApproval);
    let approval_id = r[0].outcome.as_ref().unwrap().approval_id.clone().unwrap();
    assert!(matches!(
        store
            .approve(&reg, &keys(), &approval_id, &"worker".into(), T0)
            .await,
        Err(StoreError::NotAnApprover(_))
    ));
    store
        .approve(&reg, &keys(), &approval_id, &"alice".into(), T0)
        .await
        .unwrap();
    assert!(matches!(
        store
            .approve(&reg, &keys(), &approval_id, &"alice".into(), T0)
            .await,
        Err(StoreError::SameApprover { .. })
    ));
    // One approval is not enough: the step stays parked and is not queued.
    assert!(ex.run_batch(10).await.unwrap().is_empty());
    assert_eq!(
        store.steps(&run).await.unwrap()[0].status,
        StepStatus::NeedsApproval
    );
    store
        .approve(&reg, &keys(), &approval_id, &"bob".into(), T0)
        .await
        .unwrap();
    let r = ex.run_batch(10).await.unwrap();
    assert_eq!(r.len(), 1);
    assert_eq!(r[0].status, StepStatus::Done, "{r:?}");
    assert_eq!(fake.count("payment.priority"), 1);
    let s = store.steps(&run).await.unwrap().remove(0);
    assert_eq!(s.approval.unwrap()["by"], json!(["alice", "bob"]));
    // Waiting for work returns (on Postgres it listens; a timeout is not an error).
    store
        .wait_for_work(std::time::Duration::from_millis(20))
        .await
        .unwrap();
}

async fn expired_gate_fails_closed(db: &TestDb) {
    let store = db.store(StoreConfig::default()).await;
    let fake = Recorder::new();
    let clk = clock();
    let ex = executor(&store, fake.clone(), clk.clone());
    let reg = registry();
    let run = store
        .create_run(&reg, &"worker".into(), Some("ops"), &[
            step("worker", "payment.send", payment(20000.0)),
            step("worker", "payment.send", json!({"invoice_id": "INV-2002", "amount": 30000.0, "currency": "EUR", "iban": "X"})),
        ], T0)
        .await
        .unwrap();
    let r = ex.run_batch(10).await.unwrap();
    assert!(r.iter().all(|s| s.status == StepStatus::NeedsApproval));
    let pending = store
        .approvals(Some(ApprovalStatus::Pending))
        .await
        .unwrap();
    assert_eq!(pending.len(), 2);

    // Step 2 is approved in time, but executed after the approval lapsed.
    let second = store.steps(&run).await.unwrap()[1].step_id.clone();
    let a2 = pending
        .iter()
        .find(|a| a.subject == second)
        .unwrap()
        .approval_id
        .clone();
    store
        .approve(&reg, &keys(), &a2, &"alice".into(), T0)
        .await
        .unwrap();

    clk.advance_hours(73);
    let now = clk.0.load(std::sync::atomic::Ordering::SeqCst);
    let now = toolgate_core::Timestamp::from_millis(now);
    // Step 1: approving after 72 h is refused and the request is closed.
    let first = store.steps(&run).await.unwrap()[0].step_id.clone();
    let a1 = pending
        .iter()
        .find(|a| a.subject == first)
        .unwrap()
        .approval_id
        .clone();
    let err = store
        .approve(&reg, &keys(), &a1, &"alice".into(), now)
        .await
        .unwrap_err();
    assert!(matches!(err, StoreError::ApprovalExpired { .. }), "{err}");
    assert_eq!(
        store.approval(&a1).await.unwrap().status,
        ApprovalStatus::Expired
    );
    assert_eq!(
        store.step(&first).await.unwrap().status,
        StepStatus::NeedsApproval
    );

    // Step 2: its token expired, so it goes back to the gate with a new request.
    let r = ex.run_batch(10).await.unwrap();
    assert_eq!(r.len(), 1);
    assert_eq!(r[0].status, StepStatus::NeedsApproval, "{r:?}");
    let new_req = r[0].outcome.as_ref().unwrap().approval_id.clone().unwrap();
    assert_ne!(new_req, a2);
    assert_eq!(
        store.approval(&a2).await.unwrap().status,
        ApprovalStatus::Expired
    );
    assert_eq!(
        fake.count("payment.send"),
        0,
        "nothing was sent under a lapsed gate"
    );
}

async fn audit_is_append_only_and_tampering_is_named(db: &TestDb) {
    let store = db.store(StoreConfig::default()).await;
    let fake = Recorder::new();
    let ex = executor(&store, fake.clone(), clock());
    for i in 0..5 {
        ex.governed_call(direct(
            "ticket.read",
            json!({"ticket_id": format!("T-{i}")}),
        ))
        .await
        .unwrap();
    }
    // A refusal is recorded too.
    let mut bad = direct("ticket.read", json!({"ticket_id": "T-1"}));
    bad.purpose = Some("marketing".into());
    let r = ex.governed_call(bad).await.unwrap();
    assert_eq!(r.status, CallStatus::Refused);
    let report = store.verify_chain().await.unwrap();
    assert!(report.is_intact(), "{report}");
    assert_eq!(report.records, 6);

    assert!(
        store
            .execute_raw("UPDATE audit SET ts = 0 WHERE seq = 2")
            .await
            .is_err()
    );
    assert!(
        store
            .execute_raw("DELETE FROM audit WHERE seq = 2")
            .await
            .is_err()
    );

    match db.backend {
        Backend::Sqlite => {
            store
                .execute_raw("DROP TRIGGER audit_no_update")
                .await
                .unwrap();
        }
        Backend::Postgres => {
            store
                .execute_raw("ALTER TABLE audit DISABLE TRIGGER audit_no_update")
                .await
                .unwrap();
        }
    }
    // One byte: T-3 becomes T-8 in record 4 (written back as text, a form the column holds
    // as well as the packed one).
    let text = store.audit_records(None, None).await.unwrap()[3].canonical();
    assert!(text.contains("\"T-3\""), "{text}");
    let n = store
        .execute_raw(&format!(
            "UPDATE audit SET record = '{}' WHERE seq = 4",
            text.replace("\"T-3\"", "\"T-8\"").replace('\'', "''")
        ))
        .await
        .unwrap();
    assert_eq!(n, 1);
    let report = store.verify_chain().await.unwrap();
    let broken = report.broken.clone().expect("tampering detected");
    assert_eq!(broken.seq, 4, "{report}");
    assert!(
        report.to_string().contains("BROKEN at record 4"),
        "{report}"
    );
}

async fn budgets_are_conserved_up_the_parent_chain(db: &TestDb) {
    let store = db.store(StoreConfig::default()).await;
    let fake = Recorder::new();
    let ex = executor(&store, fake.clone(), clock());
    let reg = registry();
    // child-a and child-b may each take 400 act steps; their parent only 600 in total.
    for r in 0..40 {
        let steps: Vec<PlannedStep> = (0..25)
            .map(|i| {
                let who = if i % 2 == 0 { "child-a" } else { "child-b" };
                step(
                    who,
                    "ticket.update",
                    json!({"ticket_id": format!("T-{}", r * 100 + i), "status": "closed"}),
                )
            })
            .collect();
        store
            .create_run(&reg, &"capped-lead".into(), Some("ops"), &steps, T0)
            .await
            .unwrap();
    }
    let reports = ex.drain().await.unwrap();
    assert_eq!(reports.len(), 1000);
    let done = reports
        .iter()
        .filter(|r| r.status == StepStatus::Done)
        .count();
    let refused = reports
        .iter()
        .filter(|r| r.status == StepStatus::Refused)
        .count();
    assert_eq!(done, 600, "the parent's 600 is the ceiling for the tree");
    assert_eq!(refused, 400);
    assert_eq!(fake.count("ticket.update"), 600);
    let used = store.budget_use(T0).await.unwrap();
    let get = |p: &str| {
        used.iter()
            .find(|u| u.principal == p)
            .map(|u| u.used)
            .unwrap_or(0)
    };
    assert_eq!(get("capped-lead"), 600);
    assert!(get("child-a") <= 400 && get("child-b") <= 400);
    assert_eq!(get("child-a") + get("child-b"), 600);
    // Every done step charged what it reserved: no unit is left held by a step.
    let held = store
        .execute_raw("DELETE FROM budget_reservations")
        .await
        .unwrap();
    assert_eq!(held, 0, "units still held by settled steps");
}

async fn abort_compensates_newest_first(db: &TestDb) {
    let store = db.store(StoreConfig::default()).await;
    let fake = Recorder::new();
    let ex = executor(&store, fake.clone(), clock());
    let reg = registry();
    let run = store
        .create_run(
            &reg,
            &"worker".into(),
            Some("ops"),
            &[
                step(
                    "worker",
                    "ticket.update",
                    json!({"ticket_id": "T-1", "status": "closed"}),
                ),
                step("worker", "ticket.read", json!({"ticket_id": "T-1"})),
                step(
                    "worker",
                    "ticket.update",
                    json!({"ticket_id": "T-2", "status": "hold"}),
                ),
                step("worker", "payment.send", payment(20000.0)),
            ],
            T0,
        )
        .await
        .unwrap();
    let r = ex.drain().await.unwrap();
    assert_eq!(r.len(), 4);
    let comps = ex
        .abort_run(&run, "the invoice was disputed")
        .await
        .unwrap();
    assert_eq!(comps.len(), 2);
    assert!(comps.iter().all(|c| c.status == StepStatus::Done));
    let reverts: Vec<Value> = fake
        .calls
        .lock()
        .unwrap()
        .iter()
        .filter(|c| c.0 == "ticket.revert")
        .map(|c| c.2.clone())
        .collect();
    assert_eq!(
        reverts,
        vec![json!({"ticket_id": "T-2"}), json!({"ticket_id": "T-1"})],
        "newest first"
    );
    let steps = store.steps(&run).await.unwrap();
    assert_eq!(steps.len(), 6);
    let parked = &steps[3];
    assert_eq!(
        parked.status,
        StepStatus::Refused,
        "the parked payment is refused by the abort"
    );
    assert_eq!(
        steps[4].compensates.as_deref(),
        Some(steps[2].step_id.as_str())
    );
    assert_eq!(
        steps[5].compensates.as_deref(),
        Some(steps[0].step_id.as_str())
    );
    assert!(ex.run_batch(10).await.unwrap().is_empty());
    let recs = store.audit_records(None, Some(&run)).await.unwrap();
    assert_eq!(
        recs.iter()
            .filter(|r| r.body.why.decision == toolgate_store::AuditDecision::Compensation)
            .count(),
        2
    );
}

async fn direct_calls_are_numbered_after_the_runs_steps(db: &TestDb) {
    let store = db.store(StoreConfig::default()).await;
    let ex = executor(&store, Recorder::new(), clock());
    let run = store
        .create_run(
            &registry(),
            &"worker".into(),
            Some("ops"),
            &[
                step("worker", "ticket.read", json!({"ticket_id": "T-1"})),
                step("worker", "ticket.read", json!({"ticket_id": "T-2"})),
            ],
            T0,
        )
        .await
        .unwrap();
    assert_eq!(ex.drain().await.unwrap().len(), 2);
    let write = |id: &str| DirectCall {
        run_id: run.clone(),
        ..direct("ticket.update", json!({"ticket_id": id, "status": "hold"}))
    };
    let r = ex.governed_call(write("T-3")).await.unwrap();
    assert_eq!(r.status, CallStatus::Done, "{r:?}");
    // Arriving together, these are reserved in one transaction: each must see the one before.
    let calls = (4..10).map(|i| {
        let ex = ex.clone();
        let call = write(&format!("T-{i}"));
        tokio::spawn(async move { ex.governed_call(call).await.unwrap() })
    });
    for c in calls.collect::<Vec<_>>() {
        assert_eq!(c.await.unwrap().status, CallStatus::Done);
    }
    // A read made without a reservation holds no step (so takes no number), and is counted.
    let read = DirectCall {
        run_id: run.clone(),
        ..direct("ticket.read", json!({"ticket_id": "T-10"}))
    };
    let r = ex.governed_call(read).await.unwrap();
    assert_eq!(
        (r.status, r.step_id.as_deref()),
        (CallStatus::Done, None),
        "{r:?}"
    );
    let seqs: Vec<i64> = store
        .steps(&run)
        .await
        .unwrap()
        .iter()
        .map(|s| s.seq)
        .collect();
    assert_eq!(
        seqs,
        (1..=9).collect::<Vec<_>>(),
        "one number per step, none twice"
    );
}

async fn export_and_trace(db: &TestDb) {
    let store = db.store(StoreConfig::default()).await;
    let fake = Recorder::new();
    let ex = executor(&store, fake.clone(), clock());
    let reg = registry();
    let run = store
        .create_run(
            &reg,
            &"worker".into(),
            Some("ops"),
            &[
                step("worker", "ticket.read", json!({"ticket_id": "T-1"})),
                step("worker", "payment.send", payment(20000.0)),
            ],
            T0,
        )
        .await
        .unwrap();
    ex.drain().await.unwrap();
    let mut out = Vec::new();
    let n = store
        .export_principal(&"worker".into(), &mut out)
        .await
        .unwrap();
    assert_eq!(n, 2);
    let text = String::from_utf8(out).unwrap();
    for line in text.lines() {
        let v: Value = serde_json::from_str(line).unwrap();
        assert_eq!(v["who"]["principal"], "worker");
        assert!(v["prev"].as_str().unwrap().starts_with("sha256:") || v["prev"] == "genesis");
    }
    let trace = store.trace(&run, false).await.unwrap();
    assert!(trace.contains("ticket.read"), "{trace}");
    assert!(trace.contains("needs_approval"), "{trace}");
    assert!(trace.contains("large-payment-needs-approval"), "{trace}");
    let verbose = store.trace(&run, true).await.unwrap();
    assert!(verbose.lines().count() > trace.lines().count());
    assert!(verbose.contains("credential"));
}

/// A tool whose key is shared by a principal's tree: one child makes the operation; its sibling's
/// same operation is refused naming who made it and when, and is never told the outcome; the
/// maker's own retry replays. Nothing runs twice.
async fn a_key_shared_by_a_tree_is_refused_to_the_others_naming_who(db: &TestDb) {
    let store = db.store(StoreConfig::default()).await;
    let fake = Recorder::new();
    let ex = executor(&store, fake.clone(), clock());
    let assign = |who: &str, team: &str| DirectCall {
        principal: who.into(),
        ..direct("ticket.assign", json!({"ticket_id": "T-7", "team": team}))
    };
    let first = ex
        .governed_call(assign("child-a", "billing"))
        .await
        .unwrap();
    assert_eq!(first.status, CallStatus::Done, "{first:?}");
    let other = ex
        .governed_call(assign("child-b", "billing"))
        .await
        .unwrap();
    assert_eq!(other.status, CallStatus::Refused, "{other:?}");
    assert_eq!(other.decision.rule(), Some("idempotency.elsewhere"));
    let why = &other.decision.check(CheckName::Idempotency).detail;
    assert!(why.contains("by 'child-a' at 2026-"), "{why}");
    assert!(
        other.outcome.as_ref().unwrap().result.is_none(),
        "not the other's outcome"
    );
    // Other inputs for the same ticket from the sibling: the same refusal (the key is the ticket).
    let changed = ex.governed_call(assign("child-b", "field")).await.unwrap();
    assert_eq!(changed.decision.rule(), Some("idempotency.elsewhere"));
    let again = ex
        .governed_call(assign("child-a", "billing"))
        .await
        .unwrap();
    assert_eq!(again.status, CallStatus::Replayed);
    assert_eq!(fake.count("ticket.assign"), 1);
    // A principal outside the tree has a key of its own.
    let outside = ex.governed_call(assign("lead", "billing")).await.unwrap();
    assert_eq!(outside.status, CallStatus::Done, "{outside:?}");
    assert_ne!(outside.idem_key, first.idem_key);
    assert_eq!(fake.count("ticket.assign"), 2);
}

/// A read is asked again each time (a replay would answer from before a write); a completed
/// write past its retention is a new operation, with a new step (the old one keeps its record).
async fn reads_run_again_and_a_key_past_its_retention_is_a_new_operation(db: &TestDb) {
    let store = db.store(StoreConfig::default()).await;
    let fake = Recorder::new();
    let clk = clock();
    let ex = executor(&store, fake.clone(), clk.clone());
    let read = || direct("ticket.get", json!({"ticket_id": "T-2"}));
    let r1 = ex.governed_call(read()).await.unwrap();
    let r2 = ex.governed_call(read()).await.unwrap();
    assert_eq!((r1.status, r2.status), (CallStatus::Done, CallStatus::Done));
    // Each asked, each recorded; neither reserved a step (there is nothing to replay).
    assert_eq!((r1.step_id.as_deref(), r2.step_id.as_deref()), (None, None));
    assert!(r2.audit_seq > r1.audit_seq, "{r1:?} {r2:?}");
    assert_eq!(fake.count("ticket.get"), 2);

    let update = || {
        direct(
            "ticket.update",
            json!({"ticket_id": "T-2", "status": "hold"}),
        )
    };
    let w1 = ex.governed_call(update()).await.unwrap();
    assert_eq!(w1.status, CallStatus::Done);
    assert_eq!(
        ex.governed_call(update()).await.unwrap().status,
        CallStatus::Replayed
    );
    // 73 hours on (the retention is raised to the 72-hour approval expiry): a new operation.
    clk.advance_hours(73);
    let w2 = ex.governed_call(update()).await.unwrap();
    assert_eq!(w2.status, CallStatus::Done, "{w2:?}");
    assert_ne!(w2.step_id, w1.step_id);
    assert_eq!(w2.idem_key, w1.idem_key);
    assert_eq!(fake.count("ticket.update"), 2);
    // The first step is still there, done, under its archived key.
    let old = store.step(w1.step_id.as_ref().unwrap()).await.unwrap();
    assert_eq!(old.status, StepStatus::Done);
    assert!(
        old.idem_key
            .as_str()
            .ends_with(w1.step_id.as_deref().unwrap())
    );
}

/// A retry that meets its own call still running (a crash, a slow upstream) hears that it is in
/// progress; that answer is not a denial of the run, so a payment in the same run afterwards is
/// not refused by no-spend-after-denial.
async fn a_retry_that_meets_its_unsettled_call_is_not_a_denial(db: &TestDb) {
    let store = db.store(StoreConfig::default()).await;
    let entered = Arc::new(tokio::sync::Notify::new());
    let gate = Arc::new(tokio::sync::Notify::new());
    let slow = Arc::new(Recorder {
        gate: Some(gate.clone()),
        entered: Some(entered.clone()),
        ..Recorder::default()
    });
    let ex = executor(&store, slow.clone(), clock());
    let call = direct(
        "ticket.update",
        json!({"ticket_id": "T-9", "status": "closed"}),
    );
    let bg = {
        let (ex, call) = (ex.clone(), call.clone());
        tokio::spawn(async move { ex.governed_call(call).await.unwrap() })
    };
    entered.notified().await;
    for _ in 0..3 {
        let r = ex.governed_call(call.clone()).await.unwrap();
        assert_eq!(r.status, CallStatus::InProgress, "{r:?}");
    }
    gate.notify_one();
    assert_eq!(bg.await.unwrap().status, CallStatus::Done);
    // The run saw no denial: the policy over spend after a denial does not fire.
    let pay = executor(&store, Recorder::new(), clock())
        .governed_call(direct("payment.send", payment(50.0)))
        .await
        .unwrap();
    assert_eq!(pay.status, CallStatus::Done, "{pay:?}");
    let records = store
        .audit_records(None, Some(&"run-direct-1".into()))
        .await
        .unwrap();
    assert!(
        records
            .iter()
            .all(|r| r.body.why.decision != toolgate_store::audit::AuditDecision::Deny),
        "no denial recorded in the run"
    );
}

/// A gated direct call retried: the same pending request while nobody decided; after a
/// rejection, the rejection with who and the note (no new request) until the retention has
/// passed; a request that expired undecided gives way to a new one.
async fn a_parked_call_retried_meets_its_request_its_rejection_or_after_expiry_a_new_one(
    db: &TestDb,
) {
    let store = db.store(StoreConfig::default()).await;
    let fake = Recorder::new();
    let clk = clock();
    let ex = executor(&store, fake.clone(), clk.clone());
    let reg = registry();
    let big = |invoice: &str| DirectCall {
        run_id: format!("run-{invoice}").into(),
        ..direct(
            "payment.send",
            json!({"invoice_id": invoice, "amount": 20000.0,
                                             "currency": "EUR", "iban": "DE89370400440532013000"}),
        )
    };
    let first = ex.governed_call(big("INV-3001")).await.unwrap();
    assert_eq!(first.status, CallStatus::NeedsApproval);
    let id = first.approval_id.clone().unwrap();
    // Another run, the same operation: the same request.
    let again = ex
        .governed_call(DirectCall {
            run_id: "run-elsewhere".into(),
            ..big("INV-3001")
        })
        .await
        .unwrap();
    assert_eq!(again.approval_id.as_deref(), Some(id.as_str()));

    store
        .reject(
            &reg,
            &id,
            &"alice".into(),
            "the supplier's bank letter was not verified",
            T0,
        )
        .await
        .unwrap();
    let r = ex.governed_call(big("INV-3001")).await.unwrap();
    assert_eq!(r.status, CallStatus::Refused, "{r:?}");
    assert_eq!(r.decision.rule(), Some("approval.rejected"));
    let why = &r.decision.check(CheckName::Gate).detail;
    assert!(why.contains("rejected by alice"), "{why}");
    assert!(
        why.contains("the supplier's bank letter was not verified"),
        "{why}"
    );
    let all = store.approvals(None).await.unwrap();
    assert_eq!(all.len(), 1, "no new request after a rejection");

    // Past the retention (72 h), the same call is a new question for a person.
    clk.advance_hours(73);
    let later = ex.governed_call(big("INV-3001")).await.unwrap();
    assert_eq!(later.status, CallStatus::NeedsApproval, "{later:?}");
    assert_ne!(later.approval_id.as_deref(), Some(id.as_str()));

    // A request nobody decided expires; the next retry raises a new one.
    let parked = ex.governed_call(big("INV-3002")).await.unwrap();
    let old = parked.approval_id.clone().unwrap();
    clk.advance_hours(73);
    let renewed = ex.governed_call(big("INV-3002")).await.unwrap();
    assert_eq!(renewed.status, CallStatus::NeedsApproval);
    assert_ne!(renewed.approval_id.as_deref(), Some(old.as_str()));
    assert_eq!(
        store.approval(&old).await.unwrap().status,
        ApprovalStatus::Expired
    );
    assert_eq!(fake.count("payment.send"), 0);
}

/// A gated read is not replayed (it runs every time), so each run of it spends an approval:
/// presented as a token or found by a plain retry, an approval runs it once, and the spent
/// token presented again is refused by its nonce.
async fn a_gated_read_runs_once_per_approval_and_a_spent_token_never_again(db: &TestDb) {
    let store = db.store(StoreConfig::default()).await;
    let fake = Recorder::new();
    let ex = executor(&store, fake.clone(), clock());
    let reg = registry();
    let read = || direct("payment.statement", json!({"supplier_id": "SUP-0042"}));

    let parked = ex.governed_call(read()).await.unwrap();
    assert_eq!(parked.status, CallStatus::NeedsApproval, "{parked:?}");
    let first = parked.approval_id.clone().unwrap();
    let token = store
        .approve(&reg, &keys(), &first, &"alice".into(), T0)
        .await
        .unwrap();

    // Presented: it runs, once.
    let mut with_token = read();
    with_token.approvals = vec![token.clone()];
    let ran = ex.governed_call(with_token).await.unwrap();
    assert_eq!(ran.status, CallStatus::Done, "{ran:?}");
    assert_eq!(fake.count("payment.statement"), 1);

    // The same token again: its nonce is spent, so the read is gated again and nothing runs.
    let mut again = read();
    again.approvals = vec![token];
    let refused = ex.governed_call(again).await.unwrap();
    assert_eq!(refused.status, CallStatus::NeedsApproval, "{refused:?}");
    let gate = refused.decision.check(CheckName::Gate);
    assert!(gate.detail.contains("approval refused"), "{}", gate.detail);
    assert_eq!(
        fake.count("payment.statement"),
        1,
        "a spent token runs nothing"
    );

    // A plain retry after a person approves the open request runs it once more; the next plain
    // retry finds that approval spent and waits for a person again.
    let second = refused.approval_id.clone().unwrap();
    store
        .approve(&reg, &keys(), &second, &"alice".into(), T0)
        .await
        .unwrap();
    let plain = ex.governed_call(read()).await.unwrap();
    assert_eq!(plain.status, CallStatus::Done, "{plain:?}");
    assert_eq!(fake.count("payment.statement"), 2);
    let next = ex.governed_call(read()).await.unwrap();
    assert_eq!(next.status, CallStatus::NeedsApproval, "{next:?}");
    assert_eq!(fake.count("payment.statement"), 2);
}

/// The counts a run is decided on are kept by triggers as its steps change: a step inserted in
/// every status, moved from every status to every other, compensations among them, and some
/// deleted, leave the kept counts equal to a count of the steps at each point (checked here, and
/// after every test of this suite).
async fn a_runs_counts_follow_every_change_of_its_steps(db: &TestDb) {
    const STATUSES: [&str; 7] = [
        "pending",
        "running",
        "needs_approval",
        "done",
        "failed",
        "refused",
        "unknown",
    ];
    let store = db.store(StoreConfig::default()).await;
    for run in ["counted-a", "counted-b"] {
        store
            .execute_raw(&format!(
                "INSERT INTO runs (run_id, principal, purpose, status, created_at, updated_at) \
                 VALUES ('{run}', 'worker', NULL, 'open', 1, 1)"
            ))
            .await
            .unwrap();
    }
    let mut n = 0;
    for from in STATUSES {
        for to in STATUSES.iter().filter(|&&to| to != from) {
            for kind in ["direct", "compensation"] {
                n += 1;
                let run = if n % 2 == 0 { "counted-a" } else { "counted-b" };
                let (tool, tier) = if n % 3 == 0 {
                    ("ticket.read", "read")
                } else {
                    ("payment.schedule", "spend")
                };
                store
                    .execute_raw(&format!(
                        "INSERT INTO steps (step_id, run_id, seq, kind, principal, role, tool, \
                         effect, tier, inputs, input_hash, idem_key, status, created_at, \
                         updated_at) VALUES ('s{n}', '{run}', {n}, '{kind}', 'worker', 'agent', \
                         '{tool}', 'write', '{tier}', '{{}}', 'h{n}', 'k{n}', '{from}', 1, 1)"
                    ))
                    .await
                    .unwrap();
                let moved = store
                    .execute_raw(&format!(
                        "UPDATE steps SET status = '{to}' WHERE step_id = 's{n}'"
                    ))
                    .await
                    .unwrap();
                assert_eq!(moved, 1);
            }
        }
    }
    // An update that leaves the status as it was, and one of another column.
    store
        .execute_raw("UPDATE steps SET status = status, attempts = 1 WHERE seq % 5 = 0")
        .await
        .unwrap();
    db.assert_step_tally_exact().await;
    let deleted = store
        .execute_raw("DELETE FROM steps WHERE seq % 3 = 1")
        .await
        .unwrap();
    assert!(deleted > 0);
    db.assert_step_tally_exact().await;
    // Something was counted, so the comparison above compared something.
    let kept = store
        .execute_raw("UPDATE step_tally SET n = n WHERE n > 0")
        .await
        .unwrap();
    assert!(kept >= 6, "only {kept} counts kept");
}

/// A principal's current run (its calls that name none) is written to the store at most once a
/// minute; when many of its calls arrive together once that minute is up, one of them writes
/// it and the others use what it wrote.
async fn many_calls_that_find_a_principals_current_run_stale_write_it_once(db: &TestDb) {
    let store = db.store(StoreConfig::default()).await;
    let count_writes = match db.backend {
        Backend::Sqlite => {
            "CREATE TABLE run_writes (n INTEGER); \
             CREATE TRIGGER run_written AFTER INSERT ON principal_runs \
             BEGIN INSERT INTO run_writes VALUES (1); END; \
             CREATE TRIGGER run_rewritten AFTER UPDATE ON principal_runs \
             BEGIN INSERT INTO run_writes VALUES (1); END;"
        }
        Backend::Postgres => {
            "CREATE TABLE run_writes (n INTEGER); \
             CREATE FUNCTION run_written() RETURNS trigger LANGUAGE plpgsql AS \
             $$ BEGIN INSERT INTO run_writes VALUES (1); RETURN NULL; END $$; \
             CREATE TRIGGER run_written AFTER INSERT OR UPDATE ON principal_runs \
             FOR EACH ROW EXECUTE FUNCTION run_written();"
        }
    };
    store.execute_raw(count_writes).await.unwrap();
    let writes = || store.execute_raw("DELETE FROM run_writes");
    let worker = toolgate_core::PrincipalId::new("worker");
    let idle = std::time::Duration::from_secs(30 * 60);
    let at = |ms: i64| toolgate_core::Timestamp::from_millis(1_700_000_000_000 + ms);
    let t0 = at(0);
    let first = store.current_run(&worker, t0, idle).await.unwrap();
    assert_eq!(writes().await.unwrap(), 1, "the first call makes the row");
    let again = store.current_run(&worker, at(59_000), idle).await.unwrap();
    assert_eq!(again, first);
    assert_eq!(writes().await.unwrap(), 0, "within the minute: no write");

    let mut calls = tokio::task::JoinSet::new();
    for _ in 0..16 {
        let (store, worker) = (store.clone(), worker.clone());
        calls.spawn(async move { store.current_run(&worker, at(61_000), idle).await });
    }
    while let Some(run) = calls.join_next().await {
        assert_eq!(
            run.unwrap().unwrap(),
            first,
            "still the same run: it was not idle"
        );
    }
    assert_eq!(writes().await.unwrap(), 1, "sixteen stale calls, one write");
}
