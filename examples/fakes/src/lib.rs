//! Fake upstream MCP servers for toolgate's example domains and tests.
//!
//! Each fake is a real MCP server (rmcp, stdio or streamable HTTP) over seeded, in-memory data.
//! Every delivery of a `tools/call` is appended to a JSONL record, so a test can count what
//! reached the target system, and faults (slow answers, a commit followed by silence or by an
//! error, a duplicated delivery) can be switched on to exercise retries and reconciliation.

pub mod conformance;
pub mod fault;
pub mod field;
pub mod finance;
pub mod ledger;
pub mod record;
pub mod server;

pub use fault::{FaultKind, FaultPlan, FaultSpec};
pub use record::{Record, Recorder};
pub use server::{Call, Domain, FakeArgs, FakeServer, Reply, run};

use std::sync::Arc;

use rmcp::model::{CallToolResult, JsonObject, Tool, ToolAnnotations};
use serde_json::Value;

/// A tool definition from a JSON Schema literal.
pub(crate) fn tool(name: &'static str, description: &'static str, schema: Value) -> Tool {
    let Value::Object(map) = schema else {
        panic!("the input schema of '{name}' is not an object literal");
    };
    Tool::new(name, description, Arc::new(map))
}

/// A read-only tool: the upstream's own hints, which toolgate checks but never trusts.
pub(crate) fn read_tool(name: &'static str, description: &'static str, schema: Value) -> Tool {
    tool(name, description, schema).annotate(
        ToolAnnotations::new()
            .read_only(true)
            .destructive(false)
            .open_world(false),
    )
}

/// A tool that changes state: keyed (idempotent when `_meta.idempotency_key` is sent).
pub(crate) fn write_tool(
    name: &'static str,
    description: &'static str,
    destructive: bool,
    schema: Value,
) -> Tool {
    tool(name, description, schema).annotate(
        ToolAnnotations::new()
            .read_only(false)
            .destructive(destructive)
            .idempotent(true)
            .open_world(false),
    )
}

/// A tool failure the caller can read (`isError: true`).
pub(crate) fn tool_error(message: impl Into<String>) -> CallToolResult {
    CallToolResult::error(vec![rmcp::model::ContentBlock::text(message.into())])
}

/// Why the target refused a call: becomes a tool error (`isError: true`) the caller can read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refusal(pub String);

impl From<Refusal> for CallToolResult {
    fn from(r: Refusal) -> CallToolResult {
        tool_error(r.0)
    }
}

pub(crate) fn refuse(message: impl Into<String>) -> Refusal {
    Refusal(message.into())
}

/// A required string argument, or a refusal naming it.
pub(crate) fn str_arg<'a>(args: &'a JsonObject, field: &str) -> Result<&'a str, Refusal> {
    args.get(field)
        .and_then(Value::as_str)
        .ok_or_else(|| refuse(format!("missing or non-string argument '{field}'")))
}

/// An optional string argument.
pub(crate) fn opt_str<'a>(args: &'a JsonObject, field: &str) -> Option<&'a str> {
    args.get(field).and_then(Value::as_str)
}
