//! Approvals across registry versions, on both backends: a call parked and approved under one
//! version is decided again under the version serving when it runs. A raised threshold it still
//! exceeds (same gating rule) lets the approval carry over; a new forbid refuses it; a gate under
//! another rule sends it back to the gate for a new approval. Nothing runs unless it is allowed.

use std::path::Path;
use std::sync::Arc;

use crate::common::*;
use serde_json::{Value, json};
use toolgate_core::{Registry, StepStatus};
use toolgate_store::{Actor, CallStatus, DirectCall, Executor, PlannedStep, StoreConfig};

both_backends!(
    a_direct_approval_survives_a_raised_threshold_and_not_a_forbid,
    a_planned_step_gated_under_another_rule_goes_back_to_the_gate,
);

const POLICY: &str = "policies/payments.cedar";

/// The fixture registry with its policy file edited.
fn version(edit: impl Fn(String) -> String) -> Arc<Registry> {
    let from = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/registry");
    let dir = tempfile::tempdir().unwrap();
    copy(&from, dir.path());
    let p = dir.path().join(POLICY);
    let text = std::fs::read_to_string(&p).unwrap();
    std::fs::write(&p, edit(text)).unwrap();
    Arc::new(Registry::load(dir.path()).expect("the edited registry loads"))
}

fn copy(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for e in std::fs::read_dir(from).unwrap() {
        let e = e.unwrap();
        if e.file_type().unwrap().is_dir() {
            copy(&e.path(), &to.join(e.file_name()));
        } else {
            std::fs::copy(e.path(), to.join(e.file_name())).unwrap();
        }
    }
}

/// The same executor deciding under `registry`: what a hot reload swaps in.
fn under(ex: &Executor, registry: Arc<Registry>) -> Executor {
    Executor {
        registry,
        ..ex.clone()
    }
}

fn payment(invoice: &str, amount: f64) -> Value {
    json!({"invoice_id": invoice, "amount": amount, "currency": "EUR", "iban": "DE89370400440532013000"})
}

fn direct(run: &str, inputs: Value) -> DirectCall {
    DirectCall {
        principal: "worker".into(),
        tool: "payment.send".into(),
        inputs,
        run_id: run.into(),
        purpose: Some("ops".into()),
        reason: Some("settle invoice per contract".into()),
        purpose_from: None,
        argument_errors: Vec::new(),
        evidence: vec![],
        approvals: Vec::new(),
        actor: Actor::default(),
    }
}

async fn a_direct_approval_survives_a_raised_threshold_and_not_a_forbid(db: &TestDb) {
    let store = db.store(StoreConfig::default()).await;
    let fake = Recorder::new();
    let v1 = executor(&store, fake.clone(), clock());
    let reg1 = v1.registry.clone();

    // Two payments above 10,000 parked and approved under v1.
    let mut tokens = Vec::new();
    for (run, inputs) in [
        ("run-a", payment("INV-1001", 12_000.0)),
        ("run-b", payment("INV-1002", 13_000.0)),
    ] {
        let parked = v1.governed_call(direct(run, inputs)).await.unwrap();
        assert_eq!(parked.status, CallStatus::NeedsApproval, "{parked:?}");
        let id = parked.approval_id.unwrap();
        let token = store
            .approve(&reg1, &keys(), &id, &"alice".into(), T0)
            .await
            .unwrap();
        let claims = keys().open(&token).unwrap();
        assert_eq!(
            claims.registry_version.as_deref(),
            Some(reg1.version.hash.as_str())
        );
        assert_eq!(
            claims.gate_rule.as_deref(),
            Some("large-payment-needs-approval")
        );
        tokens.push(token);
    }

    // v2 raises the threshold to 11,000: 12,000 is still gated by the same rule; it runs.
    let v2 = under(
        &v1,
        version(|s| s.replace("decimal(\"10000.0\")", "decimal(\"11000.0\")")),
    );
    assert_ne!(v2.registry.version.hash, reg1.version.hash);
    let mut a = direct("run-a", payment("INV-1001", 12_000.0));
    a.approvals = vec![tokens[0].clone()];
    let ran = v2.governed_call(a).await.unwrap();
    assert_eq!(ran.status, CallStatus::Done, "{ran:?}");
    assert_eq!(ran.decision.registry_version, v2.registry.version.hash);
    assert_eq!(fake.count("payment.send"), 1);

    // v3 forbids payments above 12,500: the approved 13,000 is refused, nothing is sent.
    let v3 = under(
        &v1,
        version(|s| {
            s + "\n@id(\"payments-capped\")\nforbid (principal, action == Action::\"payment.send\", resource)\n\
                 when { context.inputs.amount.greaterThan(decimal(\"12500.0\")) };\n"
        }),
    );
    let mut b = direct("run-b", payment("INV-1002", 13_000.0));
    b.approvals = vec![tokens[1].clone()];
    let refused = v3.governed_call(b).await.unwrap();
    assert_eq!(refused.status, CallStatus::Refused, "{refused:?}");
    assert_eq!(refused.decision.rule(), Some("payments-capped"));
    assert_eq!(fake.count("payment.send"), 1, "nothing more was sent");
    let last = store
        .audit_records(Some(&"worker".into()), None)
        .await
        .unwrap();
    let last = last.last().unwrap();
    assert_eq!(last.body.registry_version, v3.registry.version.hash);
    assert_eq!(last.body.why.rule.as_deref(), Some("payments-capped"));
}

async fn a_planned_step_gated_under_another_rule_goes_back_to_the_gate(db: &TestDb) {
    let store = db.store(StoreConfig::default()).await;
    let fake = Recorder::new();
    let v1 = executor(&store, fake.clone(), clock());
    let reg1 = v1.registry.clone();
    let step = PlannedStep {
        tool: "payment.send".into(),
        inputs: payment("INV-2001", 12_000.0),
        principal: "worker".into(),
        purpose: Some("ops".into()),
        reason: Some("planned by the test".into()),
        evidence: vec![],
        actor: Actor::default(),
    };
    let run = store
        .create_run(&reg1, &"worker".into(), Some("ops"), &[step], T0)
        .await
        .unwrap();
    let r = v1.run_batch(10).await.unwrap();
    assert_eq!(r[0].status, StepStatus::NeedsApproval);
    let first = r[0].outcome.as_ref().unwrap().approval_id.clone().unwrap();
    store
        .approve(&reg1, &keys(), &first, &"alice".into(), T0)
        .await
        .unwrap();

    // Before the approved step runs, the gate moves to another rule (same threshold): the
    // approval was for the old rule, so the step is parked again under a new request.
    let renamed = under(
        &v1,
        version(|s| {
            s.replace(
                "large-payment-needs-approval",
                "payments-over-10000-need-a-person",
            )
        }),
    );
    let r = renamed.run_batch(10).await.unwrap();
    assert_eq!(r.len(), 1);
    assert_eq!(r[0].status, StepStatus::NeedsApproval, "{r:?}");
    let second = r[0].outcome.as_ref().unwrap().approval_id.clone().unwrap();
    assert_ne!(second, first);
    assert_eq!(
        fake.count("payment.send"),
        0,
        "nothing ran on the old approval"
    );
    let req = store.approval(&second).await.unwrap();
    assert_eq!(req.rule, "payments-over-10000-need-a-person");

    // Approved under the rule that gates it now, it runs.
    store
        .approve(&renamed.registry, &keys(), &second, &"bob".into(), T0)
        .await
        .unwrap();
    let r = renamed.run_batch(10).await.unwrap();
    assert_eq!(r[0].status, StepStatus::Done, "{r:?}");
    assert_eq!(fake.count("payment.send"), 1);
    assert_eq!(store.steps(&run).await.unwrap()[0].status, StepStatus::Done);
}
