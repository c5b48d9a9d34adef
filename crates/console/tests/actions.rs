//! Approvals outside the page's happy path: a direct (unplanned) call that was parked runs once
//! when the agent retries after approval, and approvals racing each other still run a step once.

use crate::common::*;
use toolgate_console::actions::{self, Approved};
use toolgate_core::StepStatus;
use toolgate_store::{CallStatus, DirectCall};

fn direct() -> DirectCall {
    DirectCall {
        principal: "fin-worker".into(),
        tool: "payment.schedule".into(),
        inputs: payment("SUP-0001", "INV-20260612", 12600.5, NEW_IBAN),
        run_id: "run-direct".into(),
        purpose: Some("billing".into()),
        reason: Some("Three-way match complete against PO-77840".into()),
        purpose_from: None,
        argument_errors: Vec::new(),
        evidence: vec!["PO-77840".into()],
        approvals: vec![],
        actor: Default::default(),
    }
}

#[tokio::test]
async fn a_parked_direct_call_runs_once_on_the_agents_retry_after_approval() {
    let e = env().await;
    let first = e.exec.governed_call(direct()).await.unwrap();
    assert_eq!(first.status, CallStatus::NeedsApproval);
    let id = first.approval_id.unwrap();
    let hash = e.store.approval(&id).await.unwrap().input_hash;

    let r = actions::approve(&e.exec, &id, "alice", hash.as_str(), true)
        .await
        .unwrap();
    assert_eq!(r, Approved::DirectCall);
    assert_eq!(
        e.rec.count("payment.schedule"),
        0,
        "approval alone ran the call"
    );

    let retry = e.exec.governed_call(direct()).await.unwrap();
    assert_eq!(retry.status, CallStatus::Done);
    // A further identical call never runs again. (Today the gate answers before the
    // idempotency replay, so it is parked once more instead of replayed; see the report.)
    let again = e.exec.governed_call(direct()).await.unwrap();
    assert_ne!(again.status, CallStatus::Done);
    assert_eq!(e.rec.count("payment.schedule"), 1);
    if let Some(dup) = again.approval_id {
        // Parked again: the item page says it already ran, so nobody approves a duplicate.
        let v = toolgate_console::item::load(&e.exec, &dup).await.unwrap();
        let done = v.already_done.expect("the duplicate is not recognised");
        assert_eq!(done.status, StepStatus::Done);
    }
}

#[tokio::test]
async fn two_approvers_racing_on_one_item_run_it_once() {
    let e = env().await;
    let p = e.new_iban_payment().await;
    let hash = e.store.approval(&p.approval).await.unwrap().input_hash;
    let (a, b) = tokio::join!(
        actions::approve(&e.exec, &p.approval, "alice", hash.as_str(), true),
        actions::approve(&e.exec, &p.approval, "bob", hash.as_str(), true),
    );
    let ran = [&a, &b]
        .iter()
        .filter(|r| matches!(r, Ok(Approved::Ran(_))))
        .count();
    assert_eq!(ran, 1, "alice: {a:?}; bob: {b:?}");
    assert!(a.is_err() || b.is_err(), "both approvals were taken");
    assert_eq!(e.rec.count_step(&p.step), 1);
    assert_eq!(
        e.store.step(&p.step).await.unwrap().status,
        StepStatus::Done
    );
}

#[tokio::test]
async fn only_people_with_an_approver_role_may_decide() {
    let e = env().await;
    let p = e.new_iban_payment().await;
    let hash = e.store.approval(&p.approval).await.unwrap().input_hash;
    for who in ["carol", "fin-worker", "nobody"] {
        let r = actions::approve(&e.exec, &p.approval, who, hash.as_str(), true).await;
        assert!(
            matches!(r, Err(toolgate_console::ConsoleError::NotAnApprover(_))),
            "{who}: {r:?}"
        );
        let r = actions::reject(&e.exec, &p.approval, who, "no").await;
        assert!(matches!(
            r,
            Err(toolgate_console::ConsoleError::NotAnApprover(_))
        ));
    }
    assert_eq!(e.rec.count("payment.schedule"), 0);
    assert_eq!(
        e.store.step(&p.step).await.unwrap().status,
        StepStatus::NeedsApproval
    );
}
