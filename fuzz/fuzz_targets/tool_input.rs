//! Tool inputs against the registry's schemas: whatever JSON a caller sends as `arguments` is
//! validated against the tool's closed schema and decided by the engine (schema, destination,
//! Cedar policies over typed inputs, budgets, idempotency, gate), as the gateway does for every
//! `tools/call`. The registry is the complete example in `crates/core/tests/fixtures/acme`. The
//! first byte picks the tool, the second the principal; the rest is the JSON arguments. Any
//! decision is fine; a panic is not, and inputs the schema refuses must never be allowed.
#![no_main]

use std::sync::LazyLock;

use libfuzzer_sys::fuzz_target;
use serde_json::Value;
use toolgate_core::{
    ApprovalKeys, CallRequest, Engine, IdempotencyKey, InputHash, Redactor, Registry, Timestamp,
    canonical,
};

static REGISTRY: LazyLock<Registry> = LazyLock::new(|| {
    Registry::load(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../crates/core/tests/fixtures/acme"
    ))
    .expect("the acme fixture registry loads")
});
static KEYS: LazyLock<ApprovalKeys> =
    LazyLock::new(|| ApprovalKeys::new("k1", b"fuzz-key-fuzz-key-fuzz-key-32byt".to_vec()));

fuzz_target!(|data: &[u8]| {
    let [t, p, json @ ..] = data else {
        return;
    };
    let Ok(inputs) = serde_json::from_slice::<Value>(json) else {
        return;
    };
    let registry = &*REGISTRY;
    let tools = registry.tools();
    let tool = &tools[*t as usize % tools.len()];
    let principals = registry.principals();
    let principal = &principals[*p as usize % principals.len()];

    let valid = tool.schema.validate(&inputs).is_ok();
    let _ = canonical(&inputs);
    let _ = InputHash::of(&inputs);
    let _ = IdempotencyKey::for_call("run-fuzz", tool.name(), &tool.config.identity, &inputs);
    let _ = Redactor::new(b"fuzz".to_vec()).redact(&inputs, &tool.config.redact);

    let engine = Engine::new(registry, &KEYS);
    let req = CallRequest {
        purpose: tool.config.purposes.first().map(String::as_str),
        reason: Some("fuzzing the inputs"),
        subject: "call-fuzz",
        ..CallRequest::new(principal.id(), tool.name(), &inputs)
    };
    let decision = engine.decide(&req, Timestamp::from_millis(1_790_000_000_000));
    assert!(
        valid || !decision.is_allow(),
        "inputs the schema refuses were allowed for {}: {inputs}",
        tool.name()
    );
});
