//! JSON-RPC at the gateway edge: a request body (streamable HTTP) or line (stdio) is parsed into
//! rmcp's `ClientJsonRpcMessage`, the type rmcp's transports hand to the gateway. For a
//! `tools/call`, the gateway then reads the tool name, `arguments` and `_meta` and derives the
//! call's canonical input hash and idempotency key from them; this target does the same. A
//! message that parses must also serialise, and what it serialises to must parse again (the
//! gateway forwards messages and writes them to the audit log). Any refusal is fine; a panic is
//! not.
#![no_main]

use libfuzzer_sys::fuzz_target;
use rmcp::model::{ClientJsonRpcMessage, ClientRequest, JsonRpcMessage};
use serde_json::Value;
use toolgate_core::{IdempotencyKey, InputHash, canonical};

fuzz_target!(|data: &[u8]| {
    let Ok(message) = serde_json::from_slice::<ClientJsonRpcMessage>(data) else {
        return;
    };
    let wire = serde_json::to_vec(&message).expect("a parsed message serialises");
    serde_json::from_slice::<ClientJsonRpcMessage>(&wire).unwrap_or_else(|e| {
        panic!(
            "a parsed message serialises to JSON it refuses: {e}\n{}",
            String::from_utf8_lossy(&wire)
        )
    });
    if let JsonRpcMessage::Request(request) = &message
        && let ClientRequest::CallToolRequest(call) = &request.request
    {
        let inputs = Value::Object(call.params.arguments.clone().unwrap_or_default());
        let _ = canonical(&inputs);
        let _ = InputHash::of(&inputs);
        let meta = call
            .params
            .meta
            .as_ref()
            .map(|m| m.0.0.clone())
            .unwrap_or_default();
        let run = meta
            .get("run_id")
            .and_then(Value::as_str)
            .unwrap_or("session");
        let _ = IdempotencyKey::for_call(run, &call.params.name, &["invoice_id".into()], &inputs);
        let _ = canonical(&Value::Object(meta));
    }
});
