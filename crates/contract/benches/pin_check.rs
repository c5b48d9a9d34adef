//! What pinning costs: the check at list time (hash every definition once) and the per-call
//! lookup (one hash-map probe), for a server with 50 tools.

use criterion::{Criterion, criterion_group, criterion_main};
use serde_json::{Value, json};
use std::hint::black_box;
use toolgate_contract::{Approval, Lockfile, PinSet, ServerFacts, ServerIdentity};

fn tools(n: usize) -> Vec<Value> {
    (0..n)
        .map(|i| {
            json!({
                "name": format!("tool_{i}"),
                "description": format!("Tool number {i}, which does one thing well."),
                "inputSchema": {
                    "type": "object",
                    "additionalProperties": false,
                    "required": ["id"],
                    "properties": {
                        "id": {"type": "string", "pattern": "^[a-z0-9]{12}$"},
                        "amount": {"type": "number", "minimum": 0, "maximum": 10000},
                        "note": {"type": "string", "maxLength": 500}
                    }
                },
                "annotations": {"readOnlyHint": i % 2 == 0}
            })
        })
        .collect()
}

fn bench(c: &mut Criterion) {
    let identity = ServerIdentity {
        command: Some("srv".into()),
        ..Default::default()
    };
    let facts = ServerFacts {
        name: "srv".into(),
        version: "1".into(),
        ..Default::default()
    };
    let list = tools(50);
    let mut lock = Lockfile::default();
    lock.approve(
        "srv",
        &identity,
        &facts,
        &list,
        None,
        &Approval::now("bench"),
    )
    .unwrap();
    let pins = PinSet::new(&lock);
    c.bench_function("check 50 unchanged tools (list time)", |b| {
        b.iter(|| pins.check("srv", &identity, &facts, black_box(&list)))
    });
    let verdict = pins.check("srv", &identity, &facts, &list);
    c.bench_function("allows (per call)", |b| {
        b.iter(|| verdict.allows(black_box("tool_37")).is_some())
    });
}

criterion_group!(benches, bench);
criterion_main!(benches);
