//! Segregation of duties in the store and the engine, on both backends: the requester and the
//! person an agent acts for never count as approvers (the store refuses to issue, the engine
//! refuses a token issued anyway), only a gate's named approvers count, and a parked call is
//! decided again, dry, under the run as it stands (a rejection earlier in the run trips
//! `no-spend-after-denial` before anyone approves the next payment).

use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::common::*;
use serde_json::{Value, json};
use toolgate_core::approvers::Ineligible;
use toolgate_core::{
    ApprovalClaims, ApprovalId, CheckName, Registry, StepStatus, Timestamp, Verdict,
};
use toolgate_store::{
    Actor, CallStatus, DirectCall, Executor, PlannedStep, StoreConfig, StoreError,
};

both_backends!(
    the_person_behind_the_agent_does_not_count,
    the_person_behind_an_agents_parent_does_not_count,
    a_requester_cannot_approve_or_reject_their_own_call,
    a_parked_payment_after_a_rejection_would_be_refused,
);

fn copy_tree(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for e in std::fs::read_dir(from).unwrap() {
        let e = e.unwrap();
        let dest = to.join(e.file_name());
        if e.file_type().unwrap().is_dir() {
            copy_tree(&e.path(), &dest);
        } else {
            std::fs::copy(e.path(), dest).unwrap();
        }
    }
}

/// The store's fixture registry with: `worker` acting for alice, a person `henry` in the
/// worker role (he may request payments), and `payment.priority` approved by the approver
/// role or henry.
fn duties_registry() -> Arc<Registry> {
    duties_registry_with(|text| text)
}

/// [`duties_registry`] with principals.yaml changed by `edit` first.
fn duties_registry_with(edit: impl FnOnce(String) -> String) -> Arc<Registry> {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("registry");
    copy_tree(
        &PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/registry"),
        &dir,
    );
    let p = dir.join("principals.yaml");
    let text = std::fs::read_to_string(&p).unwrap();
    let text = text.replacen(
        "  - id: worker\n    kind: agent\n    role: worker\n",
        "  - id: worker\n    kind: agent\n    role: worker\n    on_behalf_of: alice\n",
        1,
    );
    assert!(text.contains("on_behalf_of: alice"));
    let text = edit(text);
    let text = format!(
        "{text}  - id: henry\n    kind: human\n    role: worker\n    grants:\n      - {{scopes: [payments:write], purposes: [ops], max_tier: spend, max_sensitivity: confidential}}\n    budgets: {{act: 100, spend: 100}}\n"
    );
    std::fs::write(&p, text).unwrap();
    let t = dir.join("tools/payments.yaml");
    let text = std::fs::read_to_string(&t).unwrap();
    let text = text.replacen(
        "    approvers: 2\n",
        "    approvers: 2\n    approved_by: {roles: [approver], people: [henry]}\n",
        1,
    );
    assert!(text.contains("people: [henry]"));
    std::fs::write(&t, text).unwrap();
    let r = Registry::load(&dir).unwrap_or_else(|e| panic!("{e}"));
    Arc::new(r)
}

fn exec_with(store: &toolgate_store::Store, reg: Arc<Registry>, fake: Arc<Recorder>) -> Executor {
    Executor::new(store.clone(), reg, keys(), fake, clock())
}

fn priority(invoice: &str) -> Value {
    json!({"invoice_id": invoice, "amount": 10.0})
}

fn planned(principal: &str, tool: &str, inputs: Value) -> PlannedStep {
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

async fn the_person_behind_the_agent_does_not_count(db: &TestDb) {
    let store = db.store(StoreConfig::default()).await;
    let fake = Recorder::new();
    let reg = duties_registry();
    let ex = exec_with(&store, reg.clone(), fake.clone());
    let run = store
        .create_run(
            &reg,
            &"worker".into(),
            Some("ops"),
            &[planned("worker", "payment.priority", priority("INV-7"))],
            T0,
        )
        .await
        .unwrap();
    let r = ex.run_batch(10).await.unwrap();
    assert_eq!(r[0].status, StepStatus::NeedsApproval, "{r:?}");
    let id = r[0].outcome.as_ref().unwrap().approval_id.clone().unwrap();
    // alice is an approver, but `worker` acts for her: refused, nothing issued.
    match store.approve(&reg, &keys(), &id, &"alice".into(), T0).await {
        Err(StoreError::Ineligible { why, .. }) => assert_eq!(
            *why,
            Ineligible::BehindAgent {
                person: "alice".into(),
                agent: "worker".into()
            }
        ),
        other => panic!("alice approved her own agent's request: {other:?}"),
    }
    assert!(store.approval(&id).await.unwrap().approved_by.is_empty());
    // bob (approver role) and henry (named) are the two distinct people; then it runs once.
    store
        .approve(&reg, &keys(), &id, &"bob".into(), T0)
        .await
        .unwrap();
    assert!(ex.run_batch(10).await.unwrap().is_empty(), "one of two");
    store
        .approve(&reg, &keys(), &id, &"henry".into(), T0)
        .await
        .unwrap();
    let r = ex.run_batch(10).await.unwrap();
    assert_eq!(r[0].status, StepStatus::Done, "{r:?}");
    assert_eq!(fake.count("payment.priority"), 1);
    let s = store.steps(&run).await.unwrap().remove(0);
    assert_eq!(s.approval.unwrap()["by"], json!(["bob", "henry"]));
}

/// `worker`'s parent `lead` acts for bob: bob stands behind `worker` too, and the store and
/// the engine refuse his approval as they refuse alice's.
async fn the_person_behind_an_agents_parent_does_not_count(db: &TestDb) {
    let store = db.store(StoreConfig::default()).await;
    let fake = Recorder::new();
    let reg = duties_registry_with(|text| {
        let edited = text.replacen(
            "  - id: lead\n    kind: agent\n    role: worker\n",
            "  - id: lead\n    kind: agent\n    role: worker\n    on_behalf_of: bob\n",
            1,
        );
        assert_ne!(edited, text, "the fixture's lead moved");
        edited
    });
    let ex = exec_with(&store, reg.clone(), fake.clone());
    store
        .create_run(
            &reg,
            &"worker".into(),
            Some("ops"),
            &[planned("worker", "payment.priority", priority("INV-9"))],
            T0,
        )
        .await
        .unwrap();
    let r = ex.run_batch(10).await.unwrap();
    assert_eq!(r[0].status, StepStatus::NeedsApproval, "{r:?}");
    let id = r[0].outcome.as_ref().unwrap().approval_id.clone().unwrap();
    for (who, result) in [
        (
            "bob",
            store
                .approve(&reg, &keys(), &id, &"bob".into(), T0)
                .await
                .map(|_| ()),
        ),
        (
            "bob",
            store
                .reject(&reg, &id, &"bob".into(), "not this one", T0)
                .await,
        ),
        (
            "alice",
            store
                .approve(&reg, &keys(), &id, &"alice".into(), T0)
                .await
                .map(|_| ()),
        ),
    ] {
        match result {
            Err(StoreError::Ineligible { why, .. }) => assert_eq!(
                *why,
                Ineligible::BehindAgent {
                    person: who.into(),
                    agent: "worker".into()
                }
            ),
            other => panic!("{who} decided a request of an agent acting for them: {other:?}"),
        }
    }
    // henry may; one of the two people it needs.
    store
        .approve(&reg, &keys(), &id, &"henry".into(), T0)
        .await
        .unwrap();
    let req = store.approval(&id).await.unwrap();
    assert_eq!(req.approved_by, vec!["henry".to_string()]);
    assert_eq!(req.status, toolgate_store::ApprovalStatus::Pending);
    assert!(
        ex.run_batch(10).await.unwrap().is_empty(),
        "it ran on one approval"
    );
    assert_eq!(fake.count("payment.priority"), 0);
}

fn henry_call(invoice: &str) -> DirectCall {
    DirectCall {
        principal: "henry".into(),
        tool: "payment.priority".into(),
        inputs: priority(invoice),
        run_id: "run-henry".into(),
        purpose: Some("ops".into()),
        reason: Some("same-day payment, per the contract".into()),
        purpose_from: None,
        argument_errors: Vec::new(),
        evidence: Vec::new(),
        approvals: Vec::new(),
        actor: Actor::default(),
    }
}

async fn a_requester_cannot_approve_or_reject_their_own_call(db: &TestDb) {
    let store = db.store(StoreConfig::default()).await;
    let fake = Recorder::new();
    let reg = duties_registry();
    let ex = exec_with(&store, reg.clone(), fake.clone());
    let parked = ex.governed_call(henry_call("INV-8")).await.unwrap();
    assert_eq!(parked.status, CallStatus::NeedsApproval, "{parked:?}");
    let id = parked.approval_id.clone().unwrap();
    for result in [
        store
            .approve(&reg, &keys(), &id, &"henry".into(), T0)
            .await
            .map(|_| ()),
        store
            .reject(&reg, &id, &"henry".into(), "not needed after all", T0)
            .await,
    ] {
        match result {
            Err(StoreError::Ineligible { why, .. }) => {
                assert_eq!(*why, Ineligible::Requester("henry".into()))
            }
            other => panic!("henry decided his own request: {other:?}"),
        }
    }
    // A token issued to henry anyway (a forged or carried-over lease) does not count at the
    // gate: the engine asks the same question.
    let req = store.approval(&id).await.unwrap();
    let forged_for = |approver: &str| {
        keys().issue(&ApprovalClaims {
            subject: req.subject.clone(),
            tool: req.tool.clone(),
            tool_version: req.tool_version.clone(),
            input_hash: req.input_hash.clone(),
            registry_version: Some(reg.version.hash.clone()),
            gate_rule: Some(req.rule.clone()),
            definition_hash: None,
            approver: approver.to_string(),
            expires_at: Timestamp::from_millis(req.expires_at.millis()),
            nonce: format!("nonce-{approver}"),
        })
    };
    let mut retry = henry_call("INV-8");
    retry.approvals = vec![forged_for("henry"), forged_for("bob")];
    let r = ex.governed_call(retry).await.unwrap();
    assert_eq!(r.status, CallStatus::NeedsApproval, "{r:?}");
    let gate = r.decision.check(CheckName::Gate);
    assert!(
        gate.detail.contains("nobody approves their own request"),
        "{}",
        gate.detail
    );
    assert!(
        matches!(
            r.decision.verdict,
            Verdict::NeedsApproval {
                approvers_needed: 1,
                ..
            }
        ),
        "bob's counts, henry's does not: {:?}",
        r.decision.verdict
    );
    assert_eq!(fake.count("payment.priority"), 0, "nothing was sent");
}

async fn a_parked_payment_after_a_rejection_would_be_refused(db: &TestDb) {
    let store = db.store(StoreConfig::default()).await;
    let fake = Recorder::new();
    let reg = registry();
    let ex = executor(&store, fake.clone(), clock());
    let pay = |invoice: &str, amount: f64| json!({"invoice_id": invoice, "amount": amount, "currency": "EUR", "iban": "DE89370400440532013000"});
    store
        .create_run(
            &reg,
            &"worker".into(),
            Some("ops"),
            &[
                planned("worker", "payment.send", pay("INV-21", 20000.0)),
                planned("worker", "payment.send", pay("INV-22", 15000.0)),
            ],
            T0,
        )
        .await
        .unwrap();
    let r = ex.run_batch(10).await.unwrap();
    assert_eq!(r.len(), 2);
    assert!(
        r.iter().all(|s| s.status == StepStatus::NeedsApproval),
        "{r:?}"
    );
    let ids: Vec<ApprovalId> = r
        .iter()
        .map(|s| s.outcome.as_ref().unwrap().approval_id.clone().unwrap())
        .collect();
    let second = store.approval(&ids[1]).await.unwrap();
    // Before anything is decided, the second payment would run once approved.
    let dry = ex.dry_decide(&second).await.unwrap();
    assert_eq!(dry.refused_by(), None, "{:?}", dry.decision.verdict);
    assert!(matches!(
        dry.decision.verdict,
        Verdict::NeedsApproval { .. }
    ));
    // A person rejects the first: the run now has a denial, and the second would be refused.
    store
        .reject(&reg, &ids[0], &"alice".into(), "duplicate invoice", T0)
        .await
        .unwrap();
    let dry = ex.dry_decide(&second).await.unwrap();
    assert_eq!(
        dry.refused_by().map(|(rule, _)| rule),
        Some("no-spend-after-denial"),
        "{:?}",
        dry.decision.verdict
    );
    // The dry run left no trace: still pending, nothing sent, no new audit record.
    let audit_before = store.audit_records(None, None).await.unwrap().len();
    ex.dry_decide(&second).await.unwrap();
    assert_eq!(
        store.audit_records(None, None).await.unwrap().len(),
        audit_before
    );
    assert_eq!(
        store.approval(&ids[1]).await.unwrap().status,
        toolgate_store::ApprovalStatus::Pending
    );
    assert_eq!(fake.count("payment.send"), 0);
}
