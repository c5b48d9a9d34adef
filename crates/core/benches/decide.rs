//! The cost of one full decision: every check, three Cedar policies, a run history of 50 steps.
//! Run: `cargo bench -p toolgate-core --bench decide`.

use criterion::{Criterion, criterion_group, criterion_main};
use serde_json::json;
use std::hint::black_box;
use toolgate_core::{
    ApprovalKeys, BudgetView, CallRequest, Engine, PriorCall, PriorOutcome, Registry, RunHistory,
    Tier, Timestamp,
};

fn bench_decide(c: &mut Criterion) {
    let registry =
        Registry::load(concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/acme")).unwrap();
    let keys = ApprovalKeys::new("k1", b"bench-key-bench-key-bench-key-32".to_vec());
    let engine = Engine::new(&registry, &keys);
    // An act-tier call that passes every check, after 50 earlier steps in the run.
    let run = RunHistory::of_calls(
        (0..50)
            .map(|i| PriorCall {
                tool: if i % 2 == 0 {
                    "invoice.search"
                } else {
                    "payment.lookup_by_key"
                }
                .into(),
                tier: Tier::Read,
                outcome: PriorOutcome::Allowed,
            })
            .collect(),
    );
    let mut budgets = BudgetView::default();
    budgets.set("fin-worker", Tier::Act, 2);
    budgets.set("fin-lead", Tier::Act, 3);
    let inputs = json!({"invoice_id": "INV-20260611", "kind": "query",
                        "text": "Amount differs from PO-77812 line 2 by 14.20 EUR."});
    let req = CallRequest {
        purpose: Some("billing"),
        reason: Some("Flag the mismatch before payment."),
        subject: "step-1",
        run: &run,
        budgets: &budgets,
        ..CallRequest::new("fin-worker", "note.draft", &inputs)
    };
    let now = Timestamp::from_millis(1_790_000_000_000);
    assert!(
        engine.decide(&req, now).is_allow(),
        "the benchmarked call must pass every check"
    );
    assert_eq!(registry.policies.all().count(), 3);

    c.bench_function("decide/act-call/3-policies/50-step-run", |b| {
        b.iter(|| black_box(engine.decide(black_box(&req), now)))
    });

    let big = json!({"invoice_id": "INV-20260611", "amount": 12000.0, "currency": "EUR",
                     "value_date": "2026-06-30", "reason": "Three-way match complete against PO-77812."});
    let gated = CallRequest {
        ..CallRequest::new("fin-worker", "payment.schedule", &big)
    };
    let gated = CallRequest {
        purpose: Some("billing"),
        reason: Some("pay"),
        run: &run,
        budgets: &budgets,
        ..gated
    };
    c.bench_function("decide/spend-call-gated-by-policy/50-step-run", |b| {
        b.iter(|| black_box(engine.decide(black_box(&gated), now)))
    });
}

/// The parts of a decision, to see where the time goes.
fn bench_parts(c: &mut Criterion) {
    let registry =
        Registry::load(concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/acme")).unwrap();
    let inputs = json!({"invoice_id": "INV-20260611", "kind": "query",
                        "text": "Amount differs from PO-77812 line 2 by 14.20 EUR."});
    let tool = registry.tool("note.draft").unwrap();
    c.bench_function("parts/input-hash", |b| {
        b.iter(|| black_box(toolgate_core::InputHash::of(black_box(&inputs))))
    });
    c.bench_function("parts/schema-validate", |b| {
        b.iter(|| black_box(tool.schema.validate(black_box(&inputs))))
    });
    use cedar_policy::RestrictedExpression as R;
    let p = toolgate_core::policy::uid("Principal", "fin-worker");
    let a = toolgate_core::policy::uid("Action", "note.draft");
    let r = toolgate_core::policy::uid("Tool", "note.draft");
    let ctx = || {
        vec![
            ("purpose".to_string(), R::new_string("billing".into())),
            ("reason".to_string(), R::new_string("x".into())),
            (
                "inputs".to_string(),
                tool.schema.cedar_type().to_cedar(&inputs).unwrap(),
            ),
            (
                "run".to_string(),
                R::new_record([
                    ("steps".to_string(), R::new_long(50)),
                    ("denials".to_string(), R::new_long(0)),
                    ("act_steps".to_string(), R::new_long(0)),
                    ("spend_steps".to_string(), R::new_long(0)),
                    ("tool_calls".to_string(), R::new_long(0)),
                ])
                .unwrap(),
            ),
        ]
    };
    c.bench_function("parts/cedar-evaluate", |b| {
        b.iter_batched(
            ctx,
            |cx| black_box(registry.policies.evaluate(&p, &a, &r, cx)),
            criterion::BatchSize::SmallInput,
        )
    });
    c.bench_function("parts/cedar-inputs", |b| {
        b.iter(|| black_box(tool.schema.cedar_type().to_cedar(black_box(&inputs))))
    });
}

criterion_group!(benches, bench_decide, bench_parts);
criterion_main!(benches);
