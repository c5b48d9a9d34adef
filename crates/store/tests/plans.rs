//! Plans in the store, on both backends: a submission queues its steps and executes nothing,
//! a plan with a bad step stores nothing, a retried submission is the same run, a reviewer's
//! rejection stops a parked step and closes its approval request, and a plan-bound call finds
//! its step.

use crate::common::*;
use serde_json::{Value, json};
use toolgate_core::StepStatus;
use toolgate_store::{
    Actor, ApprovalStatus, AuditDecision, PlanSubmission, PlannedStep, ReviewVerdict, StoreConfig,
    StoreError,
};

both_backends!(
    a_submitted_plan_queues_its_steps_and_runs_nothing,
    a_plan_with_a_bad_step_stores_nothing,
    a_reviewer_rejection_refuses_a_parked_step_and_closes_its_request,
);

fn step(tool: &str, inputs: Value) -> PlannedStep {
    PlannedStep {
        tool: tool.into(),
        inputs,
        principal: "worker".into(),
        purpose: Some("ops".into()),
        reason: Some("planned by the test".into()),
        evidence: vec!["INV-1001".into()],
        actor: Actor::default(),
    }
}

fn priority(amount: f64) -> Value {
    json!({"invoice_id": "INV-1001", "amount": amount})
}

fn submission(run: &str, steps: Vec<PlannedStep>) -> PlanSubmission {
    PlanSubmission {
        run_id: run.into(),
        // The steps' worker plans its own run (it is not in a plan-bound role).
        planner: "worker".into(),
        goal: "Pay INV-1001".into(),
        steps,
    }
}

async fn a_submitted_plan_queues_its_steps_and_runs_nothing(db: &TestDb) {
    let store = db.store(StoreConfig::default()).await;
    let reg = registry();
    let sub = submission(
        "plan-1",
        vec![
            step("ticket.read", json!({"ticket_id": "T-1"})),
            step("payment.priority", priority(120.0)),
        ],
    );
    let done = store.submit_plan(&reg, &sub, T0).await.unwrap();
    assert!(!done.existing);
    assert_eq!(done.steps.len(), 2);
    let st = store.run_status(&"plan-1".into()).await.unwrap();
    assert_eq!(st.goal.as_deref(), Some("Pay INV-1001"));
    assert_eq!(st.principal, "worker");
    assert!(st.steps.iter().all(|s| s.status == StepStatus::Pending));
    assert!(store.audit_records(None, None).await.unwrap().is_empty());

    // The same plan again is the same run; a different one under that id is refused.
    let again = store.submit_plan(&reg, &sub, T0).await.unwrap();
    assert!(again.existing);
    assert_eq!(again.steps, done.steps);
    let other = submission("plan-1", vec![step("payment.priority", priority(99.0))]);
    assert!(matches!(
        store.submit_plan(&reg, &other, T0).await,
        Err(StoreError::PlanRefused(_))
    ));
    assert_eq!(store.steps(&"plan-1".into()).await.unwrap().len(), 2);

    // A plan-bound call finds its step by principal, tool and exact inputs (and run).
    let id = store
        .assigned_step(
            &"worker".into(),
            "payment.priority",
            &priority(120.0),
            Some(&"plan-1".into()),
        )
        .await
        .unwrap();
    assert_eq!(id.as_deref(), Some(done.steps[1].1.as_str()));
    for miss in [
        store
            .assigned_step(&"worker".into(), "payment.priority", &priority(121.0), None)
            .await,
        store
            .assigned_step(&"lead".into(), "payment.priority", &priority(120.0), None)
            .await,
        store
            .assigned_step(
                &"worker".into(),
                "payment.priority",
                &priority(120.0),
                Some(&"plan-2".into()),
            )
            .await,
    ] {
        assert_eq!(miss.unwrap(), None);
    }
}

async fn a_plan_with_a_bad_step_stores_nothing(db: &TestDb) {
    let store = db.store(StoreConfig::default()).await;
    let reg = registry();
    let bad = submission(
        "plan-bad",
        vec![
            step("ticket.read", json!({"ticket_id": "T-1"})),
            step("payment.priority", priority(60_000.0)),
        ],
    );
    match store.submit_plan(&reg, &bad, T0).await {
        Err(StoreError::PlanRefused(why)) => {
            assert!(why.starts_with("step 2 (payment.priority)"), "{why}")
        }
        other => panic!("expected a refusal, got {other:?}"),
    }
    let unknown = submission("plan-bad", vec![step("payment.nowhere", json!({}))]);
    assert!(matches!(
        store.submit_plan(&reg, &unknown, T0).await,
        Err(StoreError::PlanRefused(_))
    ));
    let mut borrowed = submission(
        "plan-bad",
        vec![step("ticket.read", json!({"ticket_id": "T-1"}))],
    );
    borrowed.planner = "lead".into();
    match store.submit_plan(&reg, &borrowed, T0).await {
        Err(StoreError::PlanRefused(why)) => assert!(why.contains("cannot execute"), "{why}"),
        other => panic!("a planner cannot hand a step to an agent that acts on its own: {other:?}"),
    }
    assert!(matches!(
        store.run_status(&"plan-bad".into()).await,
        Err(StoreError::NotFound { .. })
    ));
    assert!(store.status_counts().await.unwrap().is_empty());
}

async fn a_reviewer_rejection_refuses_a_parked_step_and_closes_its_request(db: &TestDb) {
    let store = db.store(StoreConfig::default()).await;
    let reg = registry();
    let fake = Recorder::new();
    let ex = executor(&store, fake.clone(), clock());
    let sub = submission("plan-r", vec![step("payment.priority", priority(120.0))]);
    let done = store.submit_plan(&reg, &sub, T0).await.unwrap();
    let step_id = done.steps[0].1.clone();
    let parked = ex.run_batch(10).await.unwrap();
    assert_eq!(parked[0].status, StepStatus::NeedsApproval);
    assert_eq!(
        store
            .approvals(Some(ApprovalStatus::Pending))
            .await
            .unwrap()
            .len(),
        1
    );

    // An approval by the reviewer is a note: the step stays parked, the request stays open.
    let s = store
        .review_step(
            &reg,
            &step_id,
            &"lead".into(),
            ReviewVerdict::Approved,
            "matches",
            T0,
        )
        .await
        .unwrap();
    assert_eq!(s.status, StepStatus::NeedsApproval);
    assert_eq!(
        store
            .approvals(Some(ApprovalStatus::Pending))
            .await
            .unwrap()
            .len(),
        1
    );
    // One verdict per reviewer: changing it is refused; repeating it is not.
    assert!(matches!(
        store
            .review_step(
                &reg,
                &step_id,
                &"lead".into(),
                ReviewVerdict::Rejected,
                "changed my mind",
                T0
            )
            .await,
        Err(StoreError::AlreadyReviewed { .. })
    ));
    store
        .review_step(
            &reg,
            &step_id,
            &"lead".into(),
            ReviewVerdict::Approved,
            "matches",
            T0,
        )
        .await
        .unwrap();

    let s = store
        .review_step(
            &reg,
            &step_id,
            &"worker".into(),
            ReviewVerdict::Rejected,
            "wrong payee",
            T0,
        )
        .await
        .unwrap();
    assert_eq!(s.status, StepStatus::Refused);
    assert_eq!(s.outcome.unwrap().rule.as_deref(), Some("review.rejected"));
    assert!(
        store
            .approvals(Some(ApprovalStatus::Pending))
            .await
            .unwrap()
            .is_empty()
    );
    assert_eq!(
        store
            .approvals(Some(ApprovalStatus::Rejected))
            .await
            .unwrap()
            .len(),
        1
    );
    let st = store.run_status(&"plan-r".into()).await.unwrap();
    assert_eq!(st.reviews.len(), 2);
    let records = store
        .audit_records(None, Some(&"plan-r".into()))
        .await
        .unwrap();
    let last = records.last().unwrap();
    assert_eq!(last.body.why.decision, AuditDecision::Rejected);
    assert_eq!(last.body.who.principal, "worker");
    assert!(
        ex.run_batch(10).await.unwrap().is_empty(),
        "a refused step never runs"
    );
    assert_eq!(fake.count("payment.priority"), 0);
    assert!(store.verify_chain().await.unwrap().broken.is_none());
}
