//! Window budgets: sums and counts over a sliding window, reserved with the step, released on
//! failure, conserved up the parent chain, refused with what is left and when it frees up. Each
//! test is written once and run against both backends, and the concurrency test is eight callers
//! against one value budget, and the sum never exceeds the limit.

use std::path::PathBuf;
use std::sync::Arc;

use crate::common::*;
use serde_json::json;
use toolgate_core::budget::{SCALE, WindowBudget, utc};
use toolgate_core::{CheckName, FixedClock, Registry, StepStatus, Timestamp, Verdict};
use toolgate_store::{
    Actor, CallResult, CallStatus, DirectCall, Executor, PlannedStep, Store, StoreConfig,
};

both_backends!(
    a_value_budget_refuses_with_what_is_left_and_when_it_frees_up,
    a_failed_call_gives_its_reservation_back_and_an_unknown_one_keeps_it,
    at_most_three_payments_to_one_supplier_per_hour,
    window_budgets_are_conserved_up_the_parent_chain,
    planned_steps_in_one_batch_never_overrun_the_window,
    eight_concurrent_callers_never_overrun_a_value_budget,
    a_replay_of_the_call_that_filled_the_window_is_replayed,
);

const HOUR: i64 = 3_600_000;

fn window_registry() -> Arc<Registry> {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/window-registry");
    Arc::new(Registry::load(&dir).unwrap_or_else(|e| panic!("window fixture registry: {e}")))
}

fn budget(reg: &Registry, id: &str) -> WindowBudget {
    reg.tool("pay.send")
        .unwrap()
        .windows
        .iter()
        .find(|b| b.id == id)
        .unwrap()
        .clone()
}

struct Env {
    store: Store,
    fake: Arc<Recorder>,
    clock: Arc<FixedClock>,
    ex: Executor,
    reg: Arc<Registry>,
}

async fn env(db: &TestDb) -> Env {
    let store = db.store(StoreConfig::default()).await;
    let fake = Recorder::new();
    let clock = clock();
    let reg = window_registry();
    let ex = Executor::new(
        store.clone(),
        reg.clone(),
        keys(),
        fake.clone(),
        clock.clone(),
    );
    Env {
        store,
        fake,
        clock,
        ex,
        reg,
    }
}

fn pay(who: &str, invoice: u32, supplier: &str, amount: f64) -> DirectCall {
    DirectCall {
        principal: who.into(),
        tool: "pay.send".into(),
        inputs: json!({"invoice_id": format!("INV-{invoice}"), "supplier_id": supplier, "amount": amount}),
        run_id: format!("run-{who}").into(),
        purpose: Some("ops".into()),
        reason: Some("pay the matched invoice".into()),
        purpose_from: None,
        argument_errors: Vec::new(),
        evidence: vec![],
        approvals: Vec::new(),
        actor: Actor::default(),
    }
}

/// The sum a window holds, in whole units of the input (EUR), or calls.
async fn held(e: &Env, id: &str, who: &str, key: &str) -> f64 {
    let b = budget(&e.reg, id);
    let held = e
        .store
        .window_use(&b, &who.into(), key, toolgate_core::Clock::now(&*e.clock))
        .await
        .unwrap();
    let total: i64 = held.iter().map(|h| h.amount).sum();
    match b.field {
        Some(_) => total as f64 / SCALE as f64,
        None => total as f64,
    }
}

fn refusal(r: &CallResult) -> (&str, &str) {
    assert_eq!(r.status, CallStatus::Refused, "{r:?}");
    match &r.decision.verdict {
        Verdict::Deny {
            check,
            rule,
            reason,
        } => {
            assert_eq!(*check, CheckName::Budget, "{r:?}");
            (rule.as_str(), reason.as_str())
        }
        v => panic!("expected a refusal, got {v:?}"),
    }
}

async fn a_value_budget_refuses_with_what_is_left_and_when_it_frees_up(db: &TestDb) {
    let e = env(db).await;
    let first =
        e.ex.governed_call(pay("agent-a", 1, "SUP-0001", 12_000.0))
            .await
            .unwrap();
    assert_eq!(first.status, CallStatus::Done, "{first:?}");
    e.clock.advance_hours(2);
    let second =
        e.ex.governed_call(pay("agent-a", 2, "SUP-0002", 7_000.5))
            .await
            .unwrap();
    assert_eq!(second.status, CallStatus::Done, "{second:?}");
    assert_eq!(held(&e, "pay_value_24h", "agent-a", "").await, 19_000.5);

    // 999.5 EUR are left; 1,000 do not fit.
    let third =
        e.ex.governed_call(pay("agent-a", 3, "SUP-0003", 1_000.0))
            .await
            .unwrap();
    let (rule, reason) = refusal(&third);
    assert_eq!(rule, "budget.window.pay_value_24h");
    assert!(
        reason.contains("19,000.5 EUR used, 999.5 EUR left, this call needs 1,000 EUR"),
        "{reason}"
    );
    // The oldest reservation (taken at T0) leaves the window at T0 + 24 h.
    let frees = utc(T0.plus_hours(24));
    assert!(
        reason.contains(&format!("it frees up at {frees}")),
        "{reason}"
    );
    assert_eq!(
        e.fake.count("pay.send"),
        2,
        "the refused call never reached the target"
    );
    // The refusal is on the record, with the rule.
    let audit = e
        .store
        .audit_records(None, Some(&"run-agent-a".into()))
        .await
        .unwrap();
    let last = audit.last().unwrap();
    assert_eq!(
        last.body.why.rule.as_deref(),
        Some("budget.window.pay_value_24h")
    );
    // 999.5 still fit.
    let fits =
        e.ex.governed_call(pay("agent-a", 4, "SUP-0004", 999.5))
            .await
            .unwrap();
    assert_eq!(fits.status, CallStatus::Done, "{fits:?}");

    // Once the first 12,000 leave the window (24 h after they were taken), 1,000 fit again.
    e.clock.advance_hours(22);
    let later =
        e.ex.governed_call(pay("agent-a", 5, "SUP-0005", 1_000.0))
            .await
            .unwrap();
    assert_eq!(later.status, CallStatus::Done, "{later:?}");
    assert_eq!(held(&e, "pay_value_24h", "agent-a", "").await, 9_000.0);
    assert_eq!(e.fake.count("pay.send"), 4);
    assert!(e.store.verify_chain().await.unwrap().is_intact());
}

async fn a_failed_call_gives_its_reservation_back_and_an_unknown_one_keeps_it(db: &TestDb) {
    let e = env(db).await;
    e.fake.set("pay.send", Mode::Fail);
    let failed =
        e.ex.governed_call(pay("agent-a", 1, "SUP-0001", 15_000.0))
            .await
            .unwrap();
    assert_eq!(failed.status, CallStatus::Failed, "{failed:?}");
    assert_eq!(held(&e, "pay_value_24h", "agent-a", "").await, 0.0);
    assert_eq!(held(&e, "pay_value_24h", "org", "").await, 0.0);
    assert_eq!(
        held(&e, "pay_per_supplier_1h", "agent-a", "SUP-0001").await,
        0.0
    );

    // An irreversible call that timed out may have happened: its reservation stays.
    e.fake.set("pay.send", Mode::TimeoutAfterLanding);
    let unknown =
        e.ex.governed_call(pay("agent-a", 2, "SUP-0001", 15_000.0))
            .await
            .unwrap();
    assert_eq!(unknown.status, CallStatus::Unknown, "{unknown:?}");
    assert_eq!(held(&e, "pay_value_24h", "agent-a", "").await, 15_000.0);
    assert_eq!(held(&e, "pay_value_24h", "org", "").await, 15_000.0);
    let over =
        e.ex.governed_call(pay("agent-a", 3, "SUP-0002", 6_000.0))
            .await
            .unwrap();
    assert_eq!(refusal(&over).0, "budget.window.pay_value_24h");

    // Reconciliation finds it landed: done, and the amount stays spent.
    let settled = e.ex.reconcile().await.unwrap();
    assert_eq!(settled.len(), 1);
    assert_eq!(settled[0].status, StepStatus::Done);
    assert_eq!(held(&e, "pay_value_24h", "agent-a", "").await, 15_000.0);

    // A call that never landed is settled failed by reconciliation, and gives its amount back.
    let fresh = Recorder::new();
    fresh.set("pay.send", Mode::Ok);
    let ex2 = Executor::new(
        e.store.clone(),
        e.reg.clone(),
        keys(),
        fresh.clone(),
        e.clock.clone(),
    );
    e.fake.set("pay.send", Mode::TimeoutAfterLanding);
    let lost =
        e.ex.governed_call(pay("agent-b", 4, "SUP-0003", 2_000.0))
            .await
            .unwrap();
    assert_eq!(lost.status, CallStatus::Unknown);
    assert_eq!(held(&e, "pay_value_24h", "org", "").await, 17_000.0);
    // `fresh` has seen no call, so it answers "not found" for the key: believed once a late
    // commit can no longer land (the call timeout after the call went unknown).
    assert!(ex2.reconcile().await.unwrap().is_empty());
    e.clock
        .0
        .fetch_add(60_000, std::sync::atomic::Ordering::SeqCst);
    let settled = ex2.reconcile().await.unwrap();
    assert_eq!(settled.len(), 1);
    assert_eq!(settled[0].status, StepStatus::Failed);
    assert_eq!(held(&e, "pay_value_24h", "agent-b", "").await, 0.0);
    assert_eq!(held(&e, "pay_value_24h", "org", "").await, 15_000.0);
}

async fn at_most_three_payments_to_one_supplier_per_hour(db: &TestDb) {
    let e = env(db).await;
    for i in 0..3 {
        let r =
            e.ex.governed_call(pay("agent-a", i, "SUP-0001", 100.0))
                .await
                .unwrap();
        assert_eq!(r.status, CallStatus::Done, "{r:?}");
        e.clock
            .0
            .fetch_add(10 * 60_000, std::sync::atomic::Ordering::SeqCst);
    }
    // 30 minutes after the first: the fourth payment to SUP-0001 is refused.
    let fourth =
        e.ex.governed_call(pay("agent-a", 3, "SUP-0001", 100.0))
            .await
            .unwrap();
    let (rule, reason) = refusal(&fourth);
    assert_eq!(rule, "budget.window.pay_per_supplier_1h");
    assert!(
        reason.contains("at most 3 calls per 1h for supplier_id 'SUP-0001'"),
        "{reason}"
    );
    assert!(reason.contains("3 calls used, 0 calls left"), "{reason}");
    assert!(
        reason.contains(&format!(
            "it frees up at {}",
            utc(Timestamp::from_millis(T0.millis() + HOUR))
        )),
        "{reason}"
    );
    // Another supplier has its own window.
    let other =
        e.ex.governed_call(pay("agent-a", 4, "SUP-0002", 100.0))
            .await
            .unwrap();
    assert_eq!(other.status, CallStatus::Done, "{other:?}");
    // An hour after the first payment, one slot for SUP-0001 is free again.
    e.clock
        .0
        .fetch_add(30 * 60_000, std::sync::atomic::Ordering::SeqCst);
    let again =
        e.ex.governed_call(pay("agent-a", 3, "SUP-0001", 100.0))
            .await
            .unwrap();
    assert_eq!(again.status, CallStatus::Done, "{again:?}");
    assert_eq!(
        held(&e, "pay_per_supplier_1h", "agent-a", "SUP-0001").await,
        3.0
    );
    assert_eq!(e.fake.count("pay.send"), 5);
}

async fn window_budgets_are_conserved_up_the_parent_chain(db: &TestDb) {
    let e = env(db).await;
    // agent-a and agent-b have 20,000 each; their parent 'org' pools 30,000.
    let a =
        e.ex.governed_call(pay("agent-a", 1, "SUP-0001", 18_000.0))
            .await
            .unwrap();
    let b =
        e.ex.governed_call(pay("agent-b", 2, "SUP-0002", 11_000.0))
            .await
            .unwrap();
    assert_eq!((a.status, b.status), (CallStatus::Done, CallStatus::Done));
    // agent-b has 9,000 left of its own, but org only 1,000.
    let c =
        e.ex.governed_call(pay("agent-b", 3, "SUP-0003", 2_000.0))
            .await
            .unwrap();
    let (rule, reason) = refusal(&c);
    assert_eq!(rule, "budget.window.pay_value_24h");
    assert!(
        reason.contains("'org' (which 'agent-b' draws from)"),
        "{reason}"
    );
    assert!(reason.contains("1,000 EUR left"), "{reason}");
    assert_eq!(held(&e, "pay_value_24h", "org", "").await, 29_000.0);
    assert_eq!(held(&e, "pay_value_24h", "agent-b", "").await, 11_000.0);
    // Nothing of the refused call was kept in any window of the chain.
    assert_eq!(
        held(&e, "pay_per_supplier_1h", "agent-b", "SUP-0003").await,
        0.0
    );
    assert_eq!(
        held(&e, "pay_per_supplier_1h", "org", "SUP-0003").await,
        0.0
    );
    assert_eq!(e.fake.count("pay.send"), 2);
}

async fn planned_steps_in_one_batch_never_overrun_the_window(db: &TestDb) {
    let e = env(db).await;
    let steps: Vec<PlannedStep> = (0..10)
        .map(|i| PlannedStep {
            tool: "pay.send".into(),
            inputs: json!({"invoice_id": format!("INV-{}", 100 + i),
                           "supplier_id": format!("SUP-{:04}", i), "amount": 3_000.0}),
            principal: "agent-a".into(),
            purpose: Some("ops".into()),
            reason: Some("planned by the test".into()),
            evidence: vec![],
            actor: Actor::default(),
        })
        .collect();
    e.store
        .create_run(&e.reg, &"agent-a".into(), Some("ops"), &steps, T0)
        .await
        .unwrap();
    let reports = e.ex.drain().await.unwrap();
    let done = reports
        .iter()
        .filter(|r| r.status == StepStatus::Done)
        .count();
    let refused: Vec<_> = reports
        .iter()
        .filter(|r| r.status == StepStatus::Refused)
        .collect();
    assert_eq!(done, 6, "6 × 3,000 fit in 20,000: {reports:?}");
    assert_eq!(refused.len(), 4);
    assert!(
        refused
            .iter()
            .all(|r| r.outcome.as_ref().and_then(|o| o.rule.as_deref())
                == Some("budget.window.pay_value_24h")),
        "{refused:?}"
    );
    assert_eq!(held(&e, "pay_value_24h", "agent-a", "").await, 18_000.0);
    assert_eq!(e.fake.count("pay.send"), 6);
}

async fn eight_concurrent_callers_never_overrun_a_value_budget(db: &TestDb) {
    // Each caller has its own store handle (its own pool and reservation batcher), as eight
    // gateway processes sharing one database would: their reservations are concurrent
    // transactions, and only the store's locking keeps the window within its limit.
    let fake = Recorder::new();
    let reg = window_registry();
    const CALLERS: u32 = 8;
    const EACH: u32 = 6;
    let amount = |c: u32, i: u32| 700.0 + f64::from((c * 37 + i * 101) % 900) + 0.25;
    let mut stores = Vec::new();
    for _ in 0..CALLERS {
        stores.push(
            Store::connect_with(&db.url, StoreConfig::default(), db.options(2))
                .await
                .unwrap(),
        );
    }
    let store = stores[0].clone();
    let start = Arc::new(tokio::sync::Barrier::new(CALLERS as usize));
    let mut tasks = Vec::new();
    for (c, s) in (0..CALLERS).zip(stores) {
        let ex = Executor::new(s, reg.clone(), keys(), fake.clone(), clock());
        let start = start.clone();
        tasks.push(tokio::spawn(async move {
            start.wait().await;
            let mut out = Vec::new();
            for i in 0..EACH {
                let mut call = pay(
                    "agent-a",
                    c * 100 + i,
                    &format!("SUP-{:04}", c * 100 + i),
                    amount(c, i),
                );
                call.run_id = format!("run-caller-{c}").into();
                let r = ex.governed_call(call).await.unwrap();
                out.push((amount(c, i), r));
            }
            out
        }));
    }
    let mut results = Vec::new();
    for t in tasks {
        results.extend(t.await.unwrap());
    }
    assert_eq!(results.len(), (CALLERS * EACH) as usize);
    let limit = 20_000.0;
    let done: f64 = results
        .iter()
        .filter(|(_, r)| r.status == CallStatus::Done)
        .map(|(a, _)| a)
        .sum();
    let refused: Vec<f64> = results
        .iter()
        .filter(|(_, r)| r.status != CallStatus::Done)
        .map(|(a, r)| {
            assert_eq!(refusal(r).0, "budget.window.pay_value_24h", "{r:?}");
            *a
        })
        .collect();
    let attempted: f64 = results.iter().map(|(a, _)| a).sum();
    assert!(
        attempted > 2.0 * limit,
        "the callers ask for more than the budget"
    );
    // The sum never exceeds the limit: in what reached the target and in the window.
    let landed: f64 = fake
        .calls
        .lock()
        .unwrap()
        .iter()
        .map(|(_, _, inputs)| inputs["amount"].as_f64().unwrap())
        .sum();
    assert!(done <= limit, "done {done} > {limit}");
    assert!((landed - done).abs() < 1e-6, "landed {landed}, done {done}");
    let b = budget(&reg, "pay_value_24h");
    let window: i64 = store
        .window_use(&b, &"agent-a".into(), "", T0)
        .await
        .unwrap()
        .iter()
        .map(|h| h.amount)
        .sum();
    assert!(window <= b.limit, "window holds {window} > {}", b.limit);
    assert_eq!(window as f64 / SCALE as f64, done);
    // And nothing was refused that would have fitted: each refusal needed more than was left.
    for a in &refused {
        assert!(
            done + a > limit,
            "{a} was refused with {done} of {limit} used"
        );
    }
}

async fn a_replay_of_the_call_that_filled_the_window_is_replayed(db: &TestDb) {
    let e = env(db).await;
    let first =
        e.ex.governed_call(pay("agent-a", 1, "SUP-0001", 20_000.0))
            .await
            .unwrap();
    assert_eq!(first.status, CallStatus::Done, "{first:?}");
    // The same call again: the window is full, but nothing runs again and nothing is reserved.
    let again =
        e.ex.governed_call(pay("agent-a", 1, "SUP-0001", 20_000.0))
            .await
            .unwrap();
    assert_eq!(again.status, CallStatus::Replayed, "{again:?}");
    assert_eq!(again.outcome, first.outcome);
    assert_eq!(held(&e, "pay_value_24h", "agent-a", "").await, 20_000.0);
    assert_eq!(e.fake.count("pay.send"), 1);
}
