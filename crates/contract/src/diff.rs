//! What changed between a pinned tool definition and a live one, each change labelled:
//!
//! - **breaking**: a call that worked may now fail or mean something else (enum value removed,
//!   optional↔required flipped, default changed, type narrowed, bound tightened, tool removed);
//! - **widening**: the tool now accepts, reaches or claims more than was reviewed (new field,
//!   new destination-like field, pattern or allowlist loosened or dropped, bound raised or dropped,
//!   `additionalProperties` opened, enum value added, annotations moved);
//! - **description**: text only. Still blocked: descriptions are read by the model and are a
//!   poisoning channel.
//!
//! A keyword this module does not classify is reported as widening, so an unknown change is
//! reviewed rather than waved through.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;

use serde::{Deserialize, Serialize};
use serde_json::Value;
use toolgate_core::lint::is_destination_name;

use crate::lockfile::tool_name;

/// The class of one change. Ordered by how much review it needs before it is served again:
/// a tool's overall label is the highest of its changes' labels.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum DiffLabel {
    Description,
    Breaking,
    Widening,
}

impl DiffLabel {
    pub fn as_str(self) -> &'static str {
        match self {
            DiffLabel::Description => "description",
            DiffLabel::Breaking => "breaking",
            DiffLabel::Widening => "widening",
        }
    }
}

impl fmt::Display for DiffLabel {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One labelled change inside a tool definition; `path` is dotted from the tool object
/// (`inputSchema.properties.to.pattern`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Change {
    pub path: String,
    pub label: DiffLabel,
    pub message: String,
}

impl fmt::Display for Change {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "[{}] {}: {}", self.label, self.path, self.message)
    }
}

/// How one tool differs between a pinned set and a live set.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum ToolChange {
    /// Listed now, not pinned: blocked until approved.
    Added { name: String },
    /// Pinned, no longer listed: simply gone.
    Removed { name: String },
    /// The same definition under another name: the old name is gone and the new one is new.
    Renamed { from: String, to: String },
    /// Pinned under this name with a different definition.
    Changed { name: String, changes: Vec<Change> },
}

impl ToolChange {
    /// The tool's name as listed now (the old name for a removed tool).
    pub fn name(&self) -> &str {
        match self {
            ToolChange::Added { name }
            | ToolChange::Removed { name }
            | ToolChange::Changed { name, .. } => name,
            ToolChange::Renamed { to, .. } => to,
        }
    }

    /// The highest label of this tool's changes.
    pub fn label(&self) -> DiffLabel {
        match self {
            ToolChange::Added { .. } => DiffLabel::Widening,
            ToolChange::Removed { .. } | ToolChange::Renamed { .. } => DiffLabel::Breaking,
            ToolChange::Changed { changes, .. } => changes
                .iter()
                .map(|c| c.label)
                .max()
                .unwrap_or(DiffLabel::Description),
        }
    }

    /// Every change as a labelled line.
    pub fn changes(&self) -> Vec<Change> {
        match self {
            ToolChange::Added { name } => vec![Change {
                path: name.clone(),
                label: DiffLabel::Widening,
                message: "new tool, not in the lockfile".into(),
            }],
            ToolChange::Removed { name } => vec![Change {
                path: name.clone(),
                label: DiffLabel::Breaking,
                message: "tool removed: calls to it now fail".into(),
            }],
            ToolChange::Renamed { from, to } => vec![Change {
                path: "name".into(),
                label: DiffLabel::Breaking,
                message: format!(
                    "renamed from '{from}' to '{to}': calls to '{from}' now fail, and '{to}' is unreviewed"
                ),
            }],
            ToolChange::Changed { changes, .. } => changes.clone(),
        }
    }
}

/// Compares the pinned tools (by name) with a live `tools/list`. Tools whose definitions are
/// equal are not reported. Output order: by tool name.
pub fn diff_tool_sets(pinned: &BTreeMap<String, Value>, live: &[Value]) -> Vec<ToolChange> {
    let live_by_name: BTreeMap<&str, &Value> = live.iter().map(|t| (tool_name(t), t)).collect();
    let mut removed: Vec<&str> = pinned
        .keys()
        .map(String::as_str)
        .filter(|n| !live_by_name.contains_key(n))
        .collect();
    let mut out = Vec::new();
    for (name, def) in &live_by_name {
        match pinned.get(*name) {
            Some(old) if old == *def => {}
            Some(old) => out.push(ToolChange::Changed {
                name: name.to_string(),
                changes: diff_tool(old, def),
            }),
            None => {
                // A rename: a removed tool whose definition, name aside, is this one.
                let renamed_from = removed
                    .iter()
                    .position(|r| same_but_name(&pinned[*r], def))
                    .map(|i| removed.remove(i));
                match renamed_from {
                    Some(from) => out.push(ToolChange::Renamed {
                        from: from.to_string(),
                        to: name.to_string(),
                    }),
                    None => out.push(ToolChange::Added {
                        name: name.to_string(),
                    }),
                }
            }
        }
    }
    out.extend(removed.into_iter().map(|n| ToolChange::Removed {
        name: n.to_string(),
    }));
    out.sort_by(|a, b| a.name().cmp(b.name()));
    out
}

fn same_but_name(a: &Value, b: &Value) -> bool {
    match (a, b) {
        (Value::Object(a), Value::Object(b)) => {
            let strip = |m: &serde_json::Map<String, Value>| {
                let mut m = m.clone();
                m.remove("name");
                m
            };
            strip(a) == strip(b)
        }
        _ => false,
    }
}

/// Every labelled change between two definitions of one tool (both whole tool objects).
pub fn diff_tool(old: &Value, new: &Value) -> Vec<Change> {
    let mut out = Vec::new();
    let (Some(o), Some(n)) = (old.as_object(), new.as_object()) else {
        push(
            &mut out,
            "",
            DiffLabel::Widening,
            "the definition is not a JSON object",
        );
        return out;
    };
    for key in union_keys(o, n) {
        let (a, b) = (o.get(key), n.get(key));
        if a == b {
            continue;
        }
        match key {
            "name" => push(
                &mut out,
                "name",
                DiffLabel::Breaking,
                format!("renamed from {} to {}", show(a), show(b)),
            ),
            "title" | "description" => text_change(&mut out, key, a, b),
            "inputSchema" | "outputSchema" => diff_schema(
                key,
                a.unwrap_or(&Value::Bool(true)),
                b.unwrap_or(&Value::Bool(true)),
                &mut out,
            ),
            "annotations" => diff_annotations(a, b, &mut out),
            other => push(
                &mut out,
                other,
                DiffLabel::Widening,
                format!(
                    "changed from {} to {} (not classified; reviewed as widening)",
                    show(a),
                    show(b)
                ),
            ),
        }
    }
    out
}

fn union_keys<'a>(
    a: &'a serde_json::Map<String, Value>,
    b: &'a serde_json::Map<String, Value>,
) -> BTreeSet<&'a str> {
    a.keys().chain(b.keys()).map(String::as_str).collect()
}

pub(crate) fn push(
    out: &mut Vec<Change>,
    path: &str,
    label: DiffLabel,
    message: impl Into<String>,
) {
    out.push(Change {
        path: path.to_string(),
        label,
        message: message.into(),
    });
}

/// A short rendering of a value for messages (long text is cut).
pub(crate) fn show(v: Option<&Value>) -> String {
    match v {
        None => "(absent)".into(),
        Some(v) => {
            let s = v.to_string();
            if s.chars().count() > 80 {
                let cut: String = s.chars().take(77).collect();
                format!("{cut}...")
            } else {
                s
            }
        }
    }
}

fn text_change(out: &mut Vec<Change>, path: &str, a: Option<&Value>, b: Option<&Value>) {
    push(
        out,
        path,
        DiffLabel::Description,
        format!("text changed from {} to {}", show(a), show(b)),
    );
}

fn join(path: &str, key: &str) -> String {
    if path.is_empty() {
        key.to_string()
    } else {
        format!("{path}.{key}")
    }
}

const UPPER_BOUNDS: &[&str] = &[
    "maxLength",
    "maximum",
    "exclusiveMaximum",
    "maxItems",
    "maxProperties",
    "maxContains",
];
const LOWER_BOUNDS: &[&str] = &[
    "minLength",
    "minimum",
    "exclusiveMinimum",
    "minItems",
    "minProperties",
    "minContains",
];
const TEXT_KEYWORDS: &[&str] = &["description", "title", "$comment", "examples", "deprecated"];
const SCHEMA_MAPS: &[&str] = &[
    "patternProperties",
    "$defs",
    "definitions",
    "dependentSchemas",
];
const SUBSCHEMAS: &[&str] = &[
    "items",
    "additionalItems",
    "contains",
    "not",
    "if",
    "then",
    "else",
    "propertyNames",
    "unevaluatedItems",
];

/// Compares two JSON Schemas at `path`.
pub(crate) fn diff_schema(path: &str, old: &Value, new: &Value, out: &mut Vec<Change>) {
    if old == new {
        return;
    }
    let (o, n) = match (old.as_object(), new.as_object()) {
        (Some(o), Some(n)) => (o, n),
        _ => {
            // Boolean schemas (`true` accepts anything, `false` nothing) or a malformed one.
            let label = if old == &Value::Bool(true) || new == &Value::Bool(false) {
                DiffLabel::Breaking
            } else {
                DiffLabel::Widening
            };
            push(
                out,
                path,
                label,
                format!(
                    "schema replaced: {} -> {}",
                    show(Some(old)),
                    show(Some(new))
                ),
            );
            return;
        }
    };
    for key in union_keys(o, n) {
        let (a, b) = (o.get(key), n.get(key));
        if a == b {
            continue;
        }
        let at = join(path, key);
        match key {
            k if TEXT_KEYWORDS.contains(&k) => text_change(out, &at, a, b),
            "type" => type_change(out, &at, a, b),
            "enum" => enum_change(out, &at, a, b),
            "const" => {
                let (label, what) = match (a, b) {
                    (None, Some(_)) => (
                        DiffLabel::Breaking,
                        "const added: only one value passes now",
                    ),
                    (Some(_), None) => (DiffLabel::Widening, "const removed: any value passes now"),
                    _ => (
                        DiffLabel::Breaking,
                        "const changed: the value that passed no longer does",
                    ),
                };
                push(
                    out,
                    &at,
                    label,
                    format!("{what} ({} -> {})", show(a), show(b)),
                );
            }
            "pattern" | "format" | "contentMediaType" | "contentEncoding" => {
                let (label, what) = match (a, b) {
                    (None, Some(_)) => (
                        DiffLabel::Breaking,
                        format!("{key} added: fewer values pass"),
                    ),
                    (Some(_), None) => (
                        DiffLabel::Widening,
                        format!("{key} removed: any string passes now"),
                    ),
                    _ => (
                        DiffLabel::Widening,
                        format!(
                            "{key} changed; it cannot be proven narrower, so it is reviewed as loosened"
                        ),
                    ),
                };
                push(
                    out,
                    &at,
                    label,
                    format!("{what} ({} -> {})", show(a), show(b)),
                );
            }
            k if UPPER_BOUNDS.contains(&k) || LOWER_BOUNDS.contains(&k) => {
                bound_change(out, &at, key, UPPER_BOUNDS.contains(&k), a, b)
            }
            "multipleOf" => {
                let label = if b.is_none() {
                    DiffLabel::Widening
                } else {
                    DiffLabel::Breaking
                };
                push(
                    out,
                    &at,
                    label,
                    format!("multipleOf {} -> {}", show(a), show(b)),
                );
            }
            "uniqueItems" => {
                let on = |v: Option<&Value>| v == Some(&Value::Bool(true));
                let label = if on(a) && !on(b) {
                    DiffLabel::Widening
                } else {
                    DiffLabel::Breaking
                };
                push(
                    out,
                    &at,
                    label,
                    format!("uniqueItems {} -> {}", show(a), show(b)),
                );
            }
            "default" => push(
                out,
                &at,
                DiffLabel::Breaking,
                format!(
                    "default changed from {} to {}: a call that omits this field now means something else",
                    show(a),
                    show(b)
                ),
            ),
            "required" => required_change(out, path, a, b),
            "properties" => properties_change(out, &at, a, b),
            k if SCHEMA_MAPS.contains(&k) => schema_map_change(out, &at, a, b),
            "additionalProperties" | "unevaluatedProperties" => {
                openness_change(out, &at, key, a, b)
            }
            k if SUBSCHEMAS.contains(&k) => match (a, b) {
                (Some(a), Some(b)) => diff_schema(&at, a, b, out),
                (None, Some(_)) => push(
                    out,
                    &at,
                    DiffLabel::Breaking,
                    format!("{key} constraint added"),
                ),
                _ => push(
                    out,
                    &at,
                    DiffLabel::Widening,
                    format!("{key} constraint removed"),
                ),
            },
            "anyOf" | "oneOf" | "allOf" | "prefixItems" => composition_change(out, &at, key, a, b),
            "nullable" => {
                let label = if b == Some(&Value::Bool(true)) {
                    DiffLabel::Widening
                } else {
                    DiffLabel::Breaking
                };
                push(
                    out,
                    &at,
                    label,
                    format!("nullable {} -> {}", show(a), show(b)),
                );
            }
            other => push(
                out,
                &at,
                DiffLabel::Widening,
                format!(
                    "keyword '{other}' changed from {} to {} (not classified; reviewed as widening)",
                    show(a),
                    show(b)
                ),
            ),
        }
    }
}

const ALL_TYPES: &[&str] = &[
    "string", "number", "integer", "boolean", "object", "array", "null",
];

fn type_set(v: Option<&Value>) -> BTreeSet<String> {
    match v {
        None => ALL_TYPES.iter().map(|s| s.to_string()).collect(),
        Some(Value::String(s)) => [s.clone()].into(),
        Some(Value::Array(a)) => a
            .iter()
            .filter_map(Value::as_str)
            .map(str::to_string)
            .collect(),
        Some(_) => BTreeSet::new(),
    }
}

/// Whether every value of type `t` is accepted by a schema of types `set`.
fn accepts(set: &BTreeSet<String>, t: &str) -> bool {
    set.contains(t) || (t == "integer" && set.contains("number"))
}

fn type_change(out: &mut Vec<Change>, at: &str, a: Option<&Value>, b: Option<&Value>) {
    let (old, new) = (type_set(a), type_set(b));
    let wider = old.iter().all(|t| accepts(&new, t));
    let narrower = new.iter().all(|t| accepts(&old, t));
    let (label, what) = match (wider, narrower) {
        (true, false) => (
            DiffLabel::Widening,
            "type widened: values the old type refused now pass",
        ),
        (false, true) => (
            DiffLabel::Breaking,
            "type narrowed: values that passed are now refused",
        ),
        _ => (
            DiffLabel::Breaking,
            "type changed: calls that passed are now refused",
        ),
    };
    push(
        out,
        at,
        label,
        format!("{what} ({} -> {})", show(a), show(b)),
    );
}

fn enum_change(out: &mut Vec<Change>, at: &str, a: Option<&Value>, b: Option<&Value>) {
    match (a.and_then(Value::as_array), b.and_then(Value::as_array)) {
        (Some(old), Some(new)) => {
            let gone: Vec<String> = old
                .iter()
                .filter(|v| !new.contains(v))
                .map(|v| v.to_string())
                .collect();
            let added: Vec<String> = new
                .iter()
                .filter(|v| !old.contains(v))
                .map(|v| v.to_string())
                .collect();
            if !gone.is_empty() {
                push(
                    out,
                    at,
                    DiffLabel::Breaking,
                    format!("enum value(s) removed: {}", gone.join(", ")),
                );
            }
            if !added.is_empty() {
                push(
                    out,
                    at,
                    DiffLabel::Widening,
                    format!("enum value(s) added: {}", added.join(", ")),
                );
            }
            if gone.is_empty() && added.is_empty() {
                push(out, at, DiffLabel::Description, "enum values reordered");
            }
        }
        (Some(_), None) => push(
            out,
            at,
            DiffLabel::Widening,
            format!("enum removed: any value passes now (was {})", show(a)),
        ),
        (None, Some(_)) => push(
            out,
            at,
            DiffLabel::Breaking,
            format!("enum added: only {} pass now", show(b)),
        ),
        (None, None) => push(
            out,
            at,
            DiffLabel::Widening,
            format!("enum changed from {} to {}", show(a), show(b)),
        ),
    }
}

fn as_f64(v: Option<&Value>) -> Option<f64> {
    v.and_then(Value::as_f64)
}

fn bound_change(
    out: &mut Vec<Change>,
    at: &str,
    key: &str,
    upper: bool,
    a: Option<&Value>,
    b: Option<&Value>,
) {
    let (label, what) = match (as_f64(a), as_f64(b)) {
        (None, Some(_)) if a.is_none() => {
            (DiffLabel::Breaking, format!("{key} added: a new bound"))
        }
        (Some(_), None) if b.is_none() => {
            (DiffLabel::Widening, format!("{key} dropped: no bound now"))
        }
        (Some(x), Some(y)) => {
            let looser = if upper { y > x } else { y < x };
            if looser {
                (
                    DiffLabel::Widening,
                    format!(
                        "{key} {} : the bound is looser",
                        if upper { "raised" } else { "lowered" }
                    ),
                )
            } else {
                (
                    DiffLabel::Breaking,
                    format!(
                        "{key} {} : the bound is tighter",
                        if upper { "lowered" } else { "raised" }
                    ),
                )
            }
        }
        _ => (DiffLabel::Widening, format!("{key} changed (not a number)")),
    };
    push(
        out,
        at,
        label,
        format!("{what} ({} -> {})", show(a), show(b)),
    );
}

fn string_set(v: Option<&Value>) -> BTreeSet<String> {
    v.and_then(Value::as_array)
        .map(|a| {
            a.iter()
                .filter_map(Value::as_str)
                .map(str::to_string)
                .collect()
        })
        .unwrap_or_default()
}

fn required_change(out: &mut Vec<Change>, path: &str, a: Option<&Value>, b: Option<&Value>) {
    let (old, new) = (string_set(a), string_set(b));
    for f in new.difference(&old) {
        push(
            out,
            &join(&join(path, "properties"), f),
            DiffLabel::Breaking,
            "optional -> required: calls that omit it are now refused",
        );
    }
    for f in old.difference(&new) {
        push(
            out,
            &join(&join(path, "properties"), f),
            DiffLabel::Breaking,
            "required -> optional: a call that omits it now reaches the server, where its meaning is unreviewed",
        );
    }
    if old == new {
        push(
            out,
            &join(path, "required"),
            DiffLabel::Description,
            "required list reordered",
        );
    }
}

fn properties_change(out: &mut Vec<Change>, at: &str, a: Option<&Value>, b: Option<&Value>) {
    let empty = serde_json::Map::new();
    let old = a.and_then(Value::as_object).unwrap_or(&empty);
    let new = b.and_then(Value::as_object).unwrap_or(&empty);
    for key in union_keys(old, new) {
        let p = join(at, key);
        match (old.get(key), new.get(key)) {
            (Some(x), Some(y)) => diff_schema(&p, x, y, out),
            (None, Some(_)) => {
                let what = if is_destination_name(key) {
                    format!(
                        "new destination-like field '{key}': data can now go somewhere unreviewed"
                    )
                } else {
                    format!("new field '{key}'")
                };
                push(out, &p, DiffLabel::Widening, what)
            }
            (Some(_), None) => push(
                out,
                &p,
                DiffLabel::Breaking,
                format!("field '{key}' removed: calls that send it fail or have it ignored"),
            ),
            (None, None) => {}
        }
    }
}

fn schema_map_change(out: &mut Vec<Change>, at: &str, a: Option<&Value>, b: Option<&Value>) {
    let empty = serde_json::Map::new();
    let old = a.and_then(Value::as_object).unwrap_or(&empty);
    let new = b.and_then(Value::as_object).unwrap_or(&empty);
    for key in union_keys(old, new) {
        let p = join(at, key);
        match (old.get(key), new.get(key)) {
            (Some(x), Some(y)) => diff_schema(&p, x, y, out),
            (None, Some(_)) => push(out, &p, DiffLabel::Widening, format!("'{key}' added")),
            (Some(_), None) => push(out, &p, DiffLabel::Breaking, format!("'{key}' removed")),
            (None, None) => {}
        }
    }
}

/// `additionalProperties`: absent or `true` is open, `false` closed, a schema partly open.
fn openness_change(
    out: &mut Vec<Change>,
    at: &str,
    key: &str,
    a: Option<&Value>,
    b: Option<&Value>,
) {
    let closed = |v: Option<&Value>| v == Some(&Value::Bool(false));
    let open = |v: Option<&Value>| v.is_none() || v == Some(&Value::Bool(true));
    match (a, b) {
        _ if closed(a) && !closed(b) => push(
            out,
            at,
            DiffLabel::Widening,
            format!(
                "{key} opened ({} -> {}): undeclared fields now pass",
                show(a),
                show(b)
            ),
        ),
        _ if !closed(a) && closed(b) => push(
            out,
            at,
            DiffLabel::Breaking,
            format!(
                "{key} closed ({} -> {}): undeclared fields are now refused",
                show(a),
                show(b)
            ),
        ),
        _ if open(a) && open(b) => push(
            out,
            at,
            DiffLabel::Description,
            format!(
                "{key} spelled differently, same meaning ({} -> {})",
                show(a),
                show(b)
            ),
        ),
        (Some(x), Some(y)) if x.is_object() && y.is_object() => diff_schema(at, x, y, out),
        _ if open(b) => push(
            out,
            at,
            DiffLabel::Widening,
            format!("{key} opened ({} -> {})", show(a), show(b)),
        ),
        _ => push(
            out,
            at,
            DiffLabel::Breaking,
            format!("{key} restricted ({} -> {})", show(a), show(b)),
        ),
    }
}

fn composition_change(
    out: &mut Vec<Change>,
    at: &str,
    key: &str,
    a: Option<&Value>,
    b: Option<&Value>,
) {
    let empty = Vec::new();
    let old = a.and_then(Value::as_array).unwrap_or(&empty);
    let new = b.and_then(Value::as_array).unwrap_or(&empty);
    if a.is_some() && b.is_some() && old.len() == new.len() {
        for (i, (x, y)) in old.iter().zip(new).enumerate() {
            diff_schema(&format!("{at}[{i}]"), x, y, out);
        }
        return;
    }
    // More alternatives accept more; more conjuncts accept less.
    let more = new.len() > old.len() && a.is_some();
    let widening = match key {
        "anyOf" | "oneOf" => b.is_none() || more,
        _ => b.is_none() || !more,
    };
    let label = if widening {
        DiffLabel::Widening
    } else {
        DiffLabel::Breaking
    };
    push(
        out,
        at,
        label,
        format!("{key} changed from {} to {} entries", old.len(), new.len()),
    );
}

/// MCP's defaults for absent hints: not read-only, destructive, not idempotent, open world.
const HINTS: &[(&str, bool)] = &[
    ("readOnlyHint", false),
    ("destructiveHint", true),
    ("idempotentHint", false),
    ("openWorldHint", true),
];

pub(crate) fn diff_annotations(a: Option<&Value>, b: Option<&Value>, out: &mut Vec<Change>) {
    let empty = serde_json::Map::new();
    let old = a.and_then(Value::as_object).unwrap_or(&empty);
    let new = b.and_then(Value::as_object).unwrap_or(&empty);
    for key in union_keys(old, new) {
        let (x, y) = (old.get(key), new.get(key));
        if x == y {
            continue;
        }
        let at = join("annotations", key);
        let Some(&(_, default)) = HINTS.iter().find(|(k, _)| *k == key) else {
            if key == "title" {
                text_change(out, &at, x, y);
            } else {
                push(
                    out,
                    &at,
                    DiffLabel::Widening,
                    format!("changed from {} to {} (not classified)", show(x), show(y)),
                );
            }
            continue;
        };
        let eff = |v: Option<&Value>| v.and_then(Value::as_bool).unwrap_or(default);
        let (before, after) = (eff(x), eff(y));
        if before == after {
            push(
                out,
                &at,
                DiffLabel::Description,
                format!(
                    "{} -> {}: the same meaning (MCP default is {default})",
                    show(x),
                    show(y)
                ),
            );
            continue;
        }
        let what = match (key, after) {
            ("readOnlyHint", false) => {
                "no longer read-only: the tool may now modify its environment"
            }
            ("readOnlyHint", true) => {
                "now claims to be read-only: clients that skip confirmation for read-only tools stop asking; hints are not verified"
            }
            ("destructiveHint", true) => "now destructive: it may delete or overwrite",
            ("destructiveHint", false) => {
                "now claims not to be destructive: fewer confirmations; hints are not verified"
            }
            ("idempotentHint", false) => "no longer idempotent: a retry may repeat the effect",
            ("idempotentHint", true) => "now claims to be idempotent: clients may retry it blind",
            ("openWorldHint", true) => "now reaches an open world of external systems",
            _ => "now claims a closed world: hints are not verified",
        };
        push(
            out,
            &at,
            DiffLabel::Widening,
            format!("{what} ({} -> {})", show(x), show(y)),
        );
    }
}
