//! The key → result ledger a target system keeps in front of its handlers, so a repeated
//! delivery with the same idempotency key answers with the first result and changes nothing.

use std::collections::HashMap;

use rmcp::model::{CallToolResult, JsonObject};
use serde_json::{Value, json};

use crate::server::Reply;
use crate::{Refusal, refuse};

#[derive(Debug, Clone)]
struct Entry {
    kind: &'static str,
    arguments: JsonObject,
    result: Value,
}

/// Keyed results, by idempotency key.
#[derive(Debug, Default)]
pub struct KeyLedger {
    entries: HashMap<String, Entry>,
}

impl KeyLedger {
    /// The answer for a key seen before: the stored result, or an error when the same key
    /// arrives with different arguments. `None` for a fresh (or absent) key.
    pub fn replay(
        &self,
        kind: &'static str,
        key: Option<&str>,
        args: &JsonObject,
    ) -> Option<Result<Reply, Refusal>> {
        let key = key?;
        let entry = self.entries.get(key)?;
        if entry.kind != kind || &entry.arguments != args {
            return Some(Err(refuse(format!(
                "idempotency key '{key}' was used for a different {} call; a changed call needs a new key",
                entry.kind
            ))));
        }
        Some(Ok(Reply::replayed(CallToolResult::structured(
            entry.result.clone(),
        ))))
    }

    /// Remembers the result of a committed keyed call.
    pub fn store(
        &mut self,
        kind: &'static str,
        key: Option<&str>,
        args: &JsonObject,
        result: &Value,
    ) {
        if let Some(key) = key {
            self.entries.insert(
                key.to_string(),
                Entry {
                    kind,
                    arguments: args.clone(),
                    result: result.clone(),
                },
            );
        }
    }

    /// The answer of a `lookup_*_by_key` tool.
    pub fn lookup(&self, kind: &str, key: &str) -> Value {
        let found = self.entries.get(key).filter(|e| e.kind == kind);
        json!({
            "idempotency_key": key,
            "found": found.is_some(),
            "result": found.map(|e| e.result.clone()),
        })
    }
}
