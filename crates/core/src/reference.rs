//! The registry reference, generated from the config types: a JSON Schema of each file kind
//! (`toolgate check --schema KIND`, for editors) and the page `docs/registry.md` (every key,
//! its type, default and an example, then every lint rule). Both come from the types' derives
//! and doc comments, so the reference cannot describe keys the loader does not take; a test
//! fails when the committed page differs from what the types generate.

use std::fmt::Write as _;

use schemars::JsonSchema;
use serde_json::{Map, Value};

use crate::config::{GatewayFile, PrincipalsFile, ToolsFile};

/// The kinds of file in a registry folder.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FileKind {
    /// `toolgate.yaml`
    Toolgate,
    /// `tools/*.yaml`
    Tools,
    /// `principals.yaml`
    Principals,
}

impl FileKind {
    pub const ALL: [FileKind; 3] = [FileKind::Toolgate, FileKind::Tools, FileKind::Principals];

    /// The name `--schema` takes.
    pub fn name(self) -> &'static str {
        match self {
            FileKind::Toolgate => "toolgate",
            FileKind::Tools => "tools",
            FileKind::Principals => "principals",
        }
    }

    /// Where files of this kind are, in the folder.
    pub fn files(self) -> &'static str {
        match self {
            FileKind::Toolgate => "toolgate.yaml",
            FileKind::Tools => "tools/*.yaml",
            FileKind::Principals => "principals.yaml",
        }
    }

    pub fn from_name(name: &str) -> Option<FileKind> {
        let name = name.trim_end_matches(".yaml");
        FileKind::ALL.into_iter().find(|k| k.name() == name)
    }

    /// The kind of a file by its path relative to the folder.
    pub fn of_file(file: &str) -> Option<FileKind> {
        let file = file.replace('\\', "/");
        if file == "toolgate.yaml" || file.ends_with("/toolgate.yaml") {
            Some(FileKind::Toolgate)
        } else if file == "principals.yaml" || file.ends_with("/principals.yaml") {
            Some(FileKind::Principals)
        } else if file.starts_with("tools/") || file.contains("/tools/") {
            Some(FileKind::Tools)
        } else {
            None
        }
    }

    /// The JSON Schema (draft 2020-12) of a file of this kind.
    pub fn schema(self) -> Value {
        fn of<T: JsonSchema>() -> Value {
            schemars::SchemaGenerator::default()
                .into_root_schema_for::<T>()
                .to_value()
        }
        let mut v = match self {
            FileKind::Toolgate => of::<GatewayFile>(),
            FileKind::Tools => of::<ToolsFile>(),
            FileKind::Principals => of::<PrincipalsFile>(),
        };
        if let Some(m) = v.as_object_mut() {
            m.insert(
                "title".into(),
                Value::String(format!("toolgate registry: {}", self.files())),
            );
        }
        v
    }
}

/// The reference page, `docs/registry.md`.
pub fn markdown() -> String {
    let mut out = String::new();
    out.push_str(
        "<!-- Generated from the config types in crates/core/src/config.rs by \
         `UPDATE_REFERENCE=1 cargo test -p toolgate-core --lib reference`; do not edit by hand. -->\n\n",
    );
    out.push_str("# The registry reference\n\n");
    out.push_str(
        "A registry is one folder: `toolgate.yaml` (the server, the store, the upstream servers, \
         accepted findings), `tools/*.yaml` (one file per tool family), `principals.yaml` (roles, \
         agents and people, their credentials and grants) and `policies/*.cedar`. Every file \
         refuses keys it does not know. `toolgate check DIR` loads and lints the folder; \
         `toolgate check --schema KIND` prints the JSON Schema of a file kind for an editor \
         (`toolgate`, `tools`, `principals`); `toolgate check --explain RULE` explains a lint \
         rule.\n\n",
    );
    out.push_str("Contents:\n\n");
    for k in FileKind::ALL {
        let _ = writeln!(out, "- [`{}`](#{})", k.files(), anchor(k, "file"));
    }
    out.push_str("- [Lint rules](#lint-rules)\n\n");
    for k in FileKind::ALL {
        render_kind(&mut out, k);
    }
    render_rules(&mut out);
    out
}

fn anchor(kind: FileKind, def: &str) -> String {
    format!("{}-{}", kind.name(), def.to_ascii_lowercase())
}

fn render_kind(out: &mut String, kind: FileKind) {
    let schema = kind.schema();
    let defs = schema
        .get("$defs")
        .and_then(Value::as_object)
        .cloned()
        .unwrap_or_default();
    let _ = writeln!(out, "<a id=\"{}\"></a>\n", anchor(kind, "file"));
    let _ = writeln!(out, "## `{}`\n", kind.files());
    if let Some(d) = schema.get("description").and_then(Value::as_str) {
        let _ = writeln!(out, "{}\n", paragraph(d));
    }
    let _ = writeln!(
        out,
        "JSON Schema: `toolgate check --schema {}`.\n",
        kind.name()
    );
    render_object(out, kind, &schema, &defs);
    // Each type the file uses, once, in the order they are first met.
    let mut order: Vec<String> = Vec::new();
    collect_refs(&schema, &defs, &mut order);
    for name in order {
        let def = &defs[&name];
        let _ = writeln!(out, "<a id=\"{}\"></a>\n", anchor(kind, &name));
        let _ = writeln!(out, "### {} `{name}`\n", kind.files());
        if let Some(d) = def.get("description").and_then(Value::as_str) {
            let _ = writeln!(out, "{}\n", paragraph(d));
        }
        if def.get("properties").is_some() {
            render_object(out, kind, def, &defs);
        } else {
            let _ = writeln!(out, "Type: {}.\n", type_of(kind, def));
            render_choices(out, def);
        }
    }
}

/// `$ref`s reachable from `v`, depth first, each once.
fn collect_refs(v: &Value, defs: &Map<String, Value>, order: &mut Vec<String>) {
    match v {
        Value::Object(m) => {
            if let Some(name) = m
                .get("$ref")
                .and_then(Value::as_str)
                .and_then(|r| r.strip_prefix("#/$defs/"))
                && !order.iter().any(|o| o == name)
            {
                order.push(name.to_string());
                if let Some(d) = defs.get(name) {
                    collect_refs(d, defs, order);
                }
            }
            for (k, child) in m {
                if k != "$defs" && k != "examples" && k != "default" {
                    collect_refs(child, defs, order);
                }
            }
        }
        Value::Array(a) => a.iter().for_each(|c| collect_refs(c, defs, order)),
        _ => {}
    }
}

fn render_object(out: &mut String, kind: FileKind, schema: &Value, defs: &Map<String, Value>) {
    let required: Vec<&str> = schema
        .get("required")
        .and_then(Value::as_array)
        .map(|a| a.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default();
    let Some(props) = schema.get("properties").and_then(Value::as_object) else {
        return;
    };
    let _ = writeln!(out, "| key | type | default | example |");
    let _ = writeln!(out, "|---|---|---|---|");
    let mut notes = String::new();
    for (key, p) in props {
        let default = match p.get("default") {
            _ if required.contains(&key.as_str()) => "**required**".to_string(),
            Some(d) => format!("`{}`", inline(d)),
            None => "—".to_string(),
        };
        let example = p
            .get("examples")
            .and_then(Value::as_array)
            .and_then(|a| a.first())
            .map(|e| format!("`{key}: {}`", inline(e)).replace('|', "\\|"))
            .unwrap_or_else(|| match ref_name(p) {
                Some(name) => format!("see [`{name}`](#{})", anchor(kind, &name)),
                None => "—".to_string(),
            });
        let _ = writeln!(
            out,
            "| `{key}` | {} | {default} | {example} |",
            type_of(kind, p).replace('|', "\\|")
        );
        let desc = p
            .get("description")
            .and_then(Value::as_str)
            .map(str::to_string)
            .or_else(|| {
                ref_name(p)
                    .and_then(|n| defs.get(&n))
                    .and_then(|d| d.get("description"))
                    .and_then(Value::as_str)
                    .map(str::to_string)
            });
        if let Some(d) = desc {
            let _ = writeln!(notes, "- `{key}`: {}", paragraph(&d));
        }
    }
    let _ = writeln!(out);
    if !notes.is_empty() {
        let _ = writeln!(out, "{notes}");
    }
}

/// The values of an enum type, with what each means.
fn render_choices(out: &mut String, def: &Value) {
    let alts = def
        .get("oneOf")
        .or_else(|| def.get("anyOf"))
        .and_then(Value::as_array);
    let mut any = false;
    if let Some(alts) = alts {
        for a in alts {
            let values = a
                .get("const")
                .map(|c| vec![c.clone()])
                .or_else(|| a.get("enum").and_then(Value::as_array).cloned());
            if let Some(values) = values {
                for v in values {
                    let desc = a
                        .get("description")
                        .and_then(Value::as_str)
                        .map(|d| format!(": {}", paragraph(d)))
                        .unwrap_or_default();
                    let _ = writeln!(out, "- `{}`{desc}", inline(&v));
                    any = true;
                }
            }
        }
    }
    if any {
        let _ = writeln!(out);
    }
}

fn ref_name(p: &Value) -> Option<String> {
    let direct = p.get("$ref").and_then(Value::as_str);
    let via_alt = || {
        p.get("anyOf")
            .and_then(Value::as_array)
            .and_then(|a| a.iter().find_map(|x| x.get("$ref").and_then(Value::as_str)))
    };
    direct
        .or_else(via_alt)
        .and_then(|r| r.strip_prefix("#/$defs/"))
        .map(str::to_string)
}

/// A schema's type as people read it.
fn type_of(kind: FileKind, p: &Value) -> String {
    if p == &Value::Bool(true) || p.as_object().is_some_and(|m| m.is_empty()) {
        return "any JSON value".into();
    }
    if let Some(r) = p
        .get("$ref")
        .and_then(Value::as_str)
        .and_then(|r| r.strip_prefix("#/$defs/"))
    {
        return format!("[`{r}`](#{})", anchor(kind, r));
    }
    if let Some(values) = p.get("enum").and_then(Value::as_array) {
        let v: Vec<String> = values.iter().map(|v| format!("`{}`", inline(v))).collect();
        return format!("one of {}", v.join(", "));
    }
    for key in ["anyOf", "oneOf"] {
        if let Some(alts) = p.get(key).and_then(Value::as_array) {
            let consts: Vec<String> = alts
                .iter()
                .filter_map(|a| a.get("const"))
                .map(|c| format!("`{}`", inline(c)))
                .collect();
            if consts.len() == alts.len() {
                return format!("one of {}", consts.join(", "));
            }
            let parts: Vec<String> = alts
                .iter()
                .filter(|a| a.get("type").and_then(Value::as_str) != Some("null"))
                .map(|a| type_of(kind, a))
                .collect();
            return parts.join(" or ");
        }
    }
    let types: Vec<&str> = match p.get("type") {
        Some(Value::String(s)) => vec![s.as_str()],
        Some(Value::Array(a)) => a
            .iter()
            .filter_map(Value::as_str)
            .filter(|t| *t != "null")
            .collect(),
        _ => vec![],
    };
    let one = |t: &str| -> String {
        match t {
            "array" => match p.get("items") {
                Some(items) => format!("list of {}", type_of(kind, items)),
                None => "list".into(),
            },
            "object" => match p.get("additionalProperties") {
                Some(v) if v.is_object() || v == &Value::Bool(true) => {
                    format!("map of name to {}", type_of(kind, v))
                }
                _ => "object".into(),
            },
            "integer" => match p.get("minimum").and_then(Value::as_f64) {
                Some(m) if m >= 0.0 => "integer (≥ 0)".into(),
                _ => "integer".into(),
            },
            "boolean" => "`true` or `false`".into(),
            other => other.into(),
        }
    };
    match types.as_slice() {
        [] => "any JSON value".into(),
        ts => ts.iter().map(|t| one(t)).collect::<Vec<_>>().join(" or "),
    }
}

/// A value on one line, as YAML reads it (JSON is YAML).
fn inline(v: &Value) -> String {
    match v {
        Value::String(s)
            if !s.is_empty()
                && !s.contains([
                    ':', '#', '{', '}', '[', ']', ',', '&', '*', '!', '|', '>', '\'', '"', '%',
                    '@', '`',
                ])
                && !s.starts_with(['-', '?', ' '])
                && !matches!(s.as_str(), "true" | "false" | "null" | "yes" | "no")
                && s.parse::<f64>().is_err() =>
        {
            s.clone()
        }
        other => serde_json::to_string(other).unwrap_or_default(),
    }
}

/// A doc comment as one paragraph (schemars keeps the comment's line breaks).
fn paragraph(s: &str) -> String {
    s.split("\n\n")
        .map(|p| p.split_whitespace().collect::<Vec<_>>().join(" "))
        .collect::<Vec<_>>()
        .join(" ")
}

fn render_rules(out: &mut String) {
    out.push_str("## Lint rules\n\n");
    out.push_str(
        "What `toolgate check` reports after the registry loaded. A finding is fixed, or \
         accepted in `toolgate.yaml` with a reason and who accepted it:\n\n\
         ```yaml\naccept:\n  - rule: irreversible.unguarded\n    subject: bank.send_money\n    \
         reason: the bank API has no lookup by key; transfers above 100 EUR are gated by policy\n    \
         by: \"@acme/security\"\n```\n\n\
         `check`, `serve` and reloads report accepted findings as warnings; a finding nobody \
         accepted fails `check` (exit 1) and refuses a reload. An acceptance that matches no \
         finding is itself a finding (`accept.stale`). Load errors (`config.*`, `ref.*`, \
         `schema.invalid`, `policy.invalid`) stop the folder from loading and are fixed, never \
         accepted.\n\n",
    );
    for r in crate::rules::LINT_RULES {
        let _ = writeln!(out, "### `{}`\n", r.id);
        let _ = writeln!(out, "- **Finds:** {}", r.finds);
        let _ = writeln!(out, "- **Why it matters:** {}", r.why);
        let _ = writeln!(out, "- **Fix:** {}\n", r.fix);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn page_path() -> std::path::PathBuf {
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../docs/registry.md")
    }

    /// The committed page is what the types generate. `UPDATE_REFERENCE=1` rewrites it.
    #[test]
    fn reference_page_is_current() {
        let want = markdown();
        let path = page_path();
        if std::env::var_os("UPDATE_REFERENCE").is_some() {
            std::fs::write(&path, &want).expect("write docs/registry.md");
            return;
        }
        let have = std::fs::read_to_string(&path).unwrap_or_default();
        assert!(
            have == want,
            "docs/registry.md is stale: the config types changed. Regenerate it with \
             `UPDATE_REFERENCE=1 cargo test -p toolgate-core --lib reference` and commit it"
        );
    }

    /// Every key of every file kind has a description, and a default, an example, or a type
    /// whose own section has them.
    #[test]
    fn reference_every_key_is_described_with_an_example_or_default() {
        let mut missing = Vec::new();
        for kind in FileKind::ALL {
            let schema = kind.schema();
            let defs = schema["$defs"].as_object().cloned().unwrap_or_default();
            let mut objects = vec![("(file)".to_string(), schema.clone())];
            objects.extend(defs.iter().map(|(k, v)| (k.clone(), v.clone())));
            for (name, obj) in objects {
                let Some(props) = obj.get("properties").and_then(Value::as_object) else {
                    continue;
                };
                for (key, p) in props {
                    let described = p.get("description").is_some()
                        || ref_name(p)
                            .and_then(|n| defs.get(&n))
                            .is_some_and(|d| d.get("description").is_some());
                    if !described {
                        missing.push(format!("{} {name}.{key}: no description", kind.name()));
                    }
                    let shown = p.get("examples").is_some()
                        || p.get("default").is_some()
                        || ref_name(p).is_some()
                        || p.get("items").and_then(ref_name).is_some()
                        || p.get("additionalProperties").and_then(ref_name).is_some();
                    if !shown {
                        missing.push(format!(
                            "{} {name}.{key}: no example or default",
                            kind.name()
                        ));
                    }
                }
            }
        }
        assert!(missing.is_empty(), "{missing:#?}");
    }

    /// The schemas accept the example registries the project ships.
    #[test]
    fn reference_schemas_accept_the_finance_example() {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples/finance");
        let check = |kind: FileKind, file: &std::path::Path| {
            let text = std::fs::read_to_string(file).expect("read");
            let value: Value = yaml_serde::from_str(&text).expect("yaml");
            let validator = jsonschema::validator_for(&kind.schema()).expect("schema compiles");
            let errors: Vec<String> = validator
                .iter_errors(&value)
                .map(|e| e.to_string())
                .collect();
            assert!(errors.is_empty(), "{}: {errors:?}", file.display());
        };
        check(FileKind::Toolgate, &dir.join("toolgate.yaml"));
        check(FileKind::Principals, &dir.join("principals.yaml"));
        for e in std::fs::read_dir(dir.join("tools")).expect("tools/") {
            let p = e.expect("entry").path();
            if p.extension().is_some_and(|x| x == "yaml") {
                check(FileKind::Tools, &p);
            }
        }
    }

    #[test]
    fn reference_kinds_by_name_and_file() {
        assert_eq!(FileKind::from_name("tools"), Some(FileKind::Tools));
        assert_eq!(
            FileKind::from_name("toolgate.yaml"),
            Some(FileKind::Toolgate)
        );
        assert_eq!(
            FileKind::of_file("tools/payments.yaml"),
            Some(FileKind::Tools)
        );
        assert_eq!(
            FileKind::of_file("principals.yaml"),
            Some(FileKind::Principals)
        );
        assert_eq!(FileKind::from_name("lock"), None);
    }
}
