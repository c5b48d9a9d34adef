//! A first registry declaration for a tool someone else wrote: what `toolgate init` proposes
//! from an upstream's `tools/list`. The upstream's annotations and the tool's name are hints,
//! never trusted over a person, so the proposal is conservative: a tool is served ungated only
//! when the server says it is read-only and nothing contradicts it; a tool that changes state is
//! gated on every call; anything it cannot place safely is refused (declared nowhere, explained).
//! Every guess carries a `review:` note for the person who owns the registry.
//!
//! ```
//! use serde_json::json;
//! use toolgate_contract::propose::{Class, ProposeOptions, propose};
//!
//! let tool = json!({"name": "read_graph", "description": "Read the graph.",
//!                   "inputSchema": {"type": "object", "properties": {}},
//!                   "annotations": {"readOnlyHint": true}});
//! let p = propose("memory", &tool, &ProposeOptions::default());
//! assert_eq!(p.class, Class::Read);
//! assert_eq!(p.declaration.as_ref().unwrap()["name"], "memory.read_graph");
//! assert_eq!(p.declaration.as_ref().unwrap()["input_schema"]["additionalProperties"], false);
//! ```

use serde_json::{Map, Value, json};

/// How a proposed tool is served.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Class {
    /// Read-only by the server's own annotation, nothing contradicting it: listed, ungated.
    Read,
    /// Changes state: listed, and every call waits for a person (`gate: always`).
    Gated,
    /// Not declared: a person must decide first.
    Refused,
}

impl Class {
    pub fn as_str(self) -> &'static str {
        match self {
            Class::Read => "read",
            Class::Gated => "gated",
            Class::Refused => "refused",
        }
    }
}

/// What every proposal shares: who owns the tools, which role sees them, what they are for.
#[derive(Debug, Clone)]
pub struct ProposeOptions {
    pub owner: String,
    pub role: String,
    pub purpose: String,
    pub read_scope: String,
    pub act_scope: String,
}

impl Default for ProposeOptions {
    fn default() -> Self {
        ProposeOptions {
            owner: "@platform".into(),
            role: "agent".into(),
            purpose: "operations".into(),
            read_scope: "mcp:read".into(),
            act_scope: "mcp:act".into(),
        }
    }
}

/// One upstream tool's proposal.
#[derive(Debug, Clone)]
pub struct Proposal {
    /// The tool's name on the upstream.
    pub upstream_tool: String,
    /// Its name in the registry (`<upstream>.<tool>`).
    pub name: String,
    pub class: Class,
    /// The registry declaration (a `tools/*.yaml` entry as JSON), when not refused.
    pub declaration: Option<Value>,
    /// What a person must look at (one line each), and for a refused tool why it is refused.
    pub review: Vec<String>,
    /// The server's annotations as it sent them, for the record.
    pub annotations: Value,
}

impl Proposal {
    /// Turns the proposal into a refusal (the registry check found something a person must fix).
    pub fn refuse(&mut self, why: impl Into<String>) {
        self.class = Class::Refused;
        self.declaration = None;
        self.review.insert(0, why.into());
    }
}

/// What a tool's name says it does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Verb {
    Read,
    Write,
    Unknown,
}

const READ_VERBS: &[&str] = &[
    "get",
    "list",
    "read",
    "search",
    "find",
    "query",
    "describe",
    "show",
    "fetch",
    "lookup",
    "view",
    "count",
    "open",
    "check",
    "inspect",
    "stat",
    "info",
    "browse",
    "echo",
    "convert",
    "tree",
    "directory",
    "whoami",
    "status",
];

const WRITE_VERBS: &[&str] = &[
    "create",
    "add",
    "update",
    "set",
    "write",
    "edit",
    "put",
    "post",
    "insert",
    "upsert",
    "delete",
    "remove",
    "drop",
    "destroy",
    "erase",
    "purge",
    "move",
    "rename",
    "send",
    "publish",
    "execute",
    "exec",
    "run",
    "toggle",
    "start",
    "stop",
    "kill",
    "restart",
    "deploy",
    "merge",
    "push",
    "commit",
    "close",
    "cancel",
    "approve",
    "reject",
    "submit",
    "upload",
    "install",
    "uninstall",
    "modify",
    "patch",
    "replace",
    "clear",
    "reset",
    "revoke",
    "grant",
    "invite",
    "archive",
    "assign",
    "book",
    "schedule",
    "notify",
    "reply",
    "comment",
    "mkdir",
    "rm",
];

/// Words in a name that suggest money moves; such a tool is never proposed to run.
const MONEY_WORDS: &[&str] = &[
    "pay", "payment", "payout", "transfer", "purchase", "buy", "charge", "refund", "withdraw",
    "deposit", "invoice", "checkout", "order", "trade", "sell",
];

fn words(name: &str) -> Vec<String> {
    let mut spaced = String::with_capacity(name.len() + 4);
    let mut prev_lower = false;
    for c in name.chars() {
        if c.is_ascii_uppercase() && prev_lower {
            spaced.push(' ');
        }
        prev_lower = c.is_ascii_lowercase() || c.is_ascii_digit();
        spaced.push(c.to_ascii_lowercase());
    }
    spaced
        .split(|c: char| !c.is_ascii_alphanumeric())
        .filter(|w| !w.is_empty())
        .map(str::to_string)
        .collect()
}

fn verb_of(name: &str) -> Verb {
    let w = words(name);
    let Some(first) = w.first() else {
        return Verb::Unknown;
    };
    if WRITE_VERBS.contains(&first.as_str()) {
        Verb::Write
    } else if READ_VERBS.contains(&first.as_str()) {
        Verb::Read
    } else {
        Verb::Unknown
    }
}

fn hint(annotations: &Value, key: &str) -> Option<bool> {
    annotations.get(key).and_then(Value::as_bool)
}

/// Proposes the declaration of `tool` (one object of `tools/list`) of upstream `upstream`.
pub fn propose(upstream: &str, tool: &Value, opts: &ProposeOptions) -> Proposal {
    let upstream_tool = tool
        .get("name")
        .and_then(Value::as_str)
        .unwrap_or_default()
        .to_string();
    let annotations = tool.get("annotations").cloned().unwrap_or(Value::Null);
    let mut p = Proposal {
        name: format!("{upstream}.{upstream_tool}"),
        upstream_tool: upstream_tool.clone(),
        class: Class::Refused,
        declaration: None,
        review: Vec::new(),
        annotations: annotations.clone(),
    };
    let ro = hint(&annotations, "readOnlyHint");
    let destructive = hint(&annotations, "destructiveHint");
    let idempotent = hint(&annotations, "idempotentHint");
    let open_world = hint(&annotations, "openWorldHint");
    let verb = verb_of(&upstream_tool);
    let money = words(&upstream_tool)
        .iter()
        .any(|w| MONEY_WORDS.contains(&w.as_str()));

    let class = match (ro, verb) {
        (Some(true), _) if destructive == Some(true) => {
            p.review.push(
                "refused: the server says both readOnlyHint and destructiveHint; decide which is true"
                    .into(),
            );
            return p;
        }
        (Some(true), Verb::Write) => {
            p.review.push(format!(
                "refused: the server says readOnlyHint, but the name '{upstream_tool}' says it changes \
                 something; decide which is true"
            ));
            return p;
        }
        (Some(true), _) => Class::Read,
        (Some(false), _) => Class::Gated,
        (None, Verb::Write) => {
            p.review.push(
                "no annotations: gated because the name says it changes state; confirm".into(),
            );
            Class::Gated
        }
        (None, Verb::Read) => {
            p.review.push(
                "refused: the server gives no readOnlyHint; the name suggests a read — if it only \
                 reads, declare it `effect: read` with the role"
                    .into(),
            );
            return p;
        }
        (None, Verb::Unknown) => {
            p.review.push(
                "refused: no annotations and a name that says neither read nor write; decide its \
                 effect and tier"
                    .into(),
            );
            return p;
        }
    };
    if class == Class::Gated && money {
        p.review.insert(
            0,
            "refused: the name suggests money moves; declare `tier: spend` with budgets and a gate \
             yourself"
                .into(),
        );
        return p;
    }

    let raw = tool
        .get("inputSchema")
        .cloned()
        .unwrap_or_else(|| json!({"type": "object"}));
    if raw.get("type").and_then(Value::as_str) != Some("object") {
        p.review
            .push("refused: its inputs are not an object schema".into());
        return p;
    }
    let mut notes = Vec::new();
    let schema = close(&raw, "", &mut notes);
    // A free string that chooses where data goes cannot be bounded by a length: a person
    // must give its allowlist (the registry check would refuse it, listed or gated).
    if let Some(field) = free_destination(&schema, &schema, "", &mut Vec::new()) {
        p.review.insert(
            0,
            format!(
                "refused: '{field}' chooses where data goes and accepts any value; give it an \
                 `enum`/`pattern` or a `destinations:` allowlist, then list it"
            ),
        );
        return p;
    }
    let props: Vec<String> = schema
        .get("properties")
        .and_then(Value::as_object)
        .map(|m| m.keys().cloned().collect())
        .unwrap_or_default();

    let description = tool
        .get("description")
        .and_then(Value::as_str)
        .filter(|d| !d.trim().is_empty())
        .map(str::to_string)
        .unwrap_or_else(|| format!("{upstream_tool} of the {upstream} server."));
    let mut decl = Map::new();
    decl.insert("name".into(), json!(p.name));
    decl.insert("version".into(), json!("1.0.0"));
    decl.insert("owner".into(), json!(opts.owner));
    decl.insert("description".into(), json!(description));
    match class {
        Class::Read => {
            decl.insert("effect".into(), json!("read"));
            decl.insert("tier".into(), json!("read"));
            decl.insert("sensitivity".into(), json!("internal"));
            decl.insert("scopes".into(), json!([opts.read_scope]));
            if open_world == Some(true) {
                p.review.push(
                    "openWorldHint: it reaches systems outside the server; check what it can fetch"
                        .into(),
                );
            }
            if verb == Verb::Unknown {
                p.review.push(format!(
                    "read-only by its annotation; the name '{upstream_tool}' does not say so, confirm"
                ));
            }
        }
        Class::Gated => {
            if props.is_empty() {
                p.review.insert(
                    0,
                    "refused: it changes state and takes no inputs, so a retry cannot be told from \
                     a second call; declare it yourself if a person should run it"
                        .into(),
                );
                p.class = Class::Refused;
                return p;
            }
            decl.insert("effect".into(), json!("irreversible"));
            decl.insert("tier".into(), json!("act"));
            decl.insert("sensitivity".into(), json!("internal"));
            decl.insert("scopes".into(), json!([opts.act_scope]));
            decl.insert("gate".into(), json!("always"));
            decl.insert("identity".into(), json!(props));
            p.review.push(match (destructive, idempotent) {
                (Some(true), _) => "destructive: every call waits for a person's approval".into(),
                (_, Some(true)) | (Some(false), _) => {
                    "changes state: every call waits for a person; to run it without one, name a \
                     compensating tool (`effect: write`, `compensate:`) or a reconciling read \
                     (`reconcile:`) and drop the gate"
                        .into()
                }
                _ => "changes state: every call waits for a person's approval".into(),
            });
            if open_world == Some(true) {
                p.review.push(
                    "openWorldHint: it reaches systems outside the server; check where it writes"
                        .into(),
                );
            }
        }
        Class::Refused => unreachable!("refusals returned above"),
    }
    decl.insert("purposes".into(), json!([opts.purpose]));
    decl.insert("roles".into(), json!([opts.role]));
    decl.insert(
        "handler".into(),
        json!({"upstream": upstream, "tool": upstream_tool}),
    );
    decl.insert("input_schema".into(), schema);
    if !notes.is_empty() {
        p.review.push(format!(
            "bounds added where the server set none: {}; widen or narrow them to what the tool \
             should accept",
            notes.join(", ")
        ));
    }
    p.class = class;
    p.declaration = Some(Value::Object(decl));
    p
}

/// The string length given to a free string, by what its name says it holds.
fn max_length_for(name: &str) -> u64 {
    let w = words(name);
    let has = |set: &[&str]| w.iter().any(|x| set.contains(&x.as_str()));
    if has(&[
        "content",
        "data",
        "body",
        "text",
        "observations",
        "contents",
    ]) {
        100_000
    } else if has(&[
        "path",
        "paths",
        "file",
        "dir",
        "directory",
        "source",
        "destination",
    ]) {
        4096
    } else {
        1000
    }
}

const MAX_ITEMS: u64 = 100;
/// The largest integer a JSON number carries exactly (JavaScript's `Number.MAX_SAFE_INTEGER`).
const SAFE_INT: i64 = 9_007_199_254_740_991;

fn has_any(m: &Map<String, Value>, keys: &[&str]) -> bool {
    keys.iter().any(|k| m.contains_key(*k))
}

/// The schema closed (`additionalProperties: false` on every object) and bounded where the
/// server set no bound; each bound added is named in `notes` (`message ≤ 1000 chars`).
pub fn close(schema: &Value, name: &str, notes: &mut Vec<String>) -> Value {
    let Some(m) = schema.as_object() else {
        return schema.clone();
    };
    let mut out = m.clone();
    let types: Vec<String> = match m.get("type") {
        Some(Value::String(s)) => vec![s.clone()],
        Some(Value::Array(a)) => a
            .iter()
            .filter_map(Value::as_str)
            .map(str::to_string)
            .collect(),
        _ => vec![],
    };
    let label = if name.is_empty() { "(inputs)" } else { name };
    let constrained = has_any(m, &["enum", "const"]);
    for ty in &types {
        match ty.as_str() {
            "object" => {
                match m.get("additionalProperties") {
                    Some(Value::Bool(false)) => {}
                    Some(Value::Object(_)) => {
                        notes.push(format!("{label} took any keys, now none"));
                        out.insert("additionalProperties".into(), Value::Bool(false));
                    }
                    _ => {
                        out.insert("additionalProperties".into(), Value::Bool(false));
                    }
                }
                out.remove("patternProperties");
            }
            "string" if !has_any(m, &["maxLength", "enum", "const", "pattern", "format"]) => {
                let n = max_length_for(name);
                notes.push(format!("{label} ≤ {n} chars"));
                out.insert("maxLength".into(), json!(n));
            }
            "array" if !m.contains_key("maxItems") => {
                notes.push(format!("{label} ≤ {MAX_ITEMS} items"));
                out.insert("maxItems".into(), json!(MAX_ITEMS));
            }
            "number" | "integer" if !constrained => {
                let low = has_any(m, &["minimum", "exclusiveMinimum"]);
                let high = has_any(m, &["maximum", "exclusiveMaximum"]);
                if !low {
                    out.insert("minimum".into(), json!(-SAFE_INT));
                }
                if !high {
                    out.insert("maximum".into(), json!(SAFE_INT));
                }
                if !(low && high) {
                    notes.push(format!("{label} within ±2^53"));
                }
            }
            _ => {}
        }
    }
    if let Some(Value::Object(props)) = m.get("properties") {
        let closed: Map<String, Value> = props
            .iter()
            .map(|(k, v)| (k.clone(), close(v, k, notes)))
            .collect();
        out.insert("properties".into(), Value::Object(closed));
    }
    if let Some(items) = m.get("items") {
        out.insert("items".into(), close(items, name, notes));
    }
    if let Some(Value::Array(pre)) = m.get("prefixItems") {
        let closed: Vec<Value> = pre.iter().map(|v| close(v, name, notes)).collect();
        out.insert("prefixItems".into(), Value::Array(closed));
    }
    for key in ["anyOf", "oneOf", "allOf"] {
        if let Some(Value::Array(alts)) = m.get(key) {
            let closed: Vec<Value> = alts.iter().map(|v| close(v, name, notes)).collect();
            out.insert(key.into(), Value::Array(closed));
        }
    }
    for key in ["$defs", "definitions"] {
        if let Some(Value::Object(defs)) = m.get(key) {
            let closed: Map<String, Value> = defs
                .iter()
                .map(|(k, v)| (k.clone(), close(v, k, notes)))
                .collect();
            out.insert(key.into(), Value::Object(closed));
        }
    }
    Value::Object(out)
}

/// The first property, anywhere in the schema, whose name says it chooses a destination and
/// whose value is a free string (what `toolgate check` reports as `destination.free-string`).
fn free_destination<'a>(
    root: &'a Value,
    schema: &'a Value,
    name: &str,
    refs: &mut Vec<&'a str>,
) -> Option<String> {
    let m = schema.as_object()?;
    let types: Vec<&str> = match m.get("type") {
        Some(Value::String(s)) => vec![s.as_str()],
        Some(Value::Array(a)) => a.iter().filter_map(Value::as_str).collect(),
        _ => vec![],
    };
    if !name.is_empty()
        && types.contains(&"string")
        && toolgate_core::lint::is_destination_name(name)
        && !has_any(m, &["enum", "const", "pattern"])
    {
        return Some(name.to_string());
    }
    if let Some(Value::Object(props)) = m.get("properties") {
        for (k, v) in props {
            if let Some(f) = free_destination(root, v, k, refs) {
                return Some(f);
            }
        }
    }
    if let Some(items) = m.get("items")
        && let Some(f) = free_destination(root, items, name, refs)
    {
        return Some(f);
    }
    for key in ["anyOf", "oneOf", "allOf"] {
        if let Some(Value::Array(alts)) = m.get(key) {
            for a in alts {
                if let Some(f) = free_destination(root, a, name, refs) {
                    return Some(f);
                }
            }
        }
    }
    if let Some(Value::String(r)) = m.get("$ref")
        && !refs.contains(&r.as_str())
        && let Some(pointer) = r.strip_prefix("#/")
        && let Some(target) = root.pointer(&format!("/{pointer}"))
    {
        refs.push(r);
        let found = free_destination(root, target, name, refs);
        refs.pop();
        return found;
    }
    None
}

#[cfg(test)]
#[path = "propose_tests.rs"]
mod tests;
