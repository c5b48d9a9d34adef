//! `toolgate check`: the registry lint. A surface is unsafe when a schema is open or unbounded,
//! when a destination can be any string, when a write cannot be deduplicated or undone, or when
//! an irreversible call can neither be reconciled nor stopped. Each finding says how to fix it.
//!
//! Schemas are judged as real servers publish them: an optional field as `anyOf: [T, null]` is
//! judged by its alternatives (not as a free string of its own), and a `$ref` into `$defs` is
//! followed, with findings at the definition where the fix goes. Policies are checked at load
//! (a rule that cannot work does not load); what Cedar only warns about is reported here.

use crate::handler::Builtin;
use serde_json::Value;

use crate::config::{AcceptanceConfig, AnnotationsConfig, PrincipalConfig, ToolConfig};
use crate::model::{Effect, Gate, Tier};
use crate::registry::{Finding, Registry};

/// Parameter names that choose where data or money goes.
const DESTINATION_WORDS: &[&str] = &[
    "recipient",
    "recipients",
    "to",
    "cc",
    "bcc",
    "email",
    "url",
    "uri",
    "webhook",
    "callback",
    "endpoint",
    "channel",
    "account",
    "iban",
    "host",
    "domain",
    "address",
    "phone",
    "owner",
    "repo",
    "repository",
];

/// Whether a property name looks like a destination (`to`, `reply_to`, `webhook_url`, `iban`…).
pub fn is_destination_name(name: &str) -> bool {
    // Split snake_case, kebab-case and camelCase into words.
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
        .any(|part| DESTINATION_WORDS.contains(&part))
}

/// Whether a schema declares a property of this name anywhere.
pub fn schema_mentions(schema: &Value, name: &str) -> bool {
    match schema {
        Value::Object(m) => {
            m.get("properties")
                .and_then(Value::as_object)
                .is_some_and(|p| p.contains_key(name))
                || m.values().any(|v| schema_mentions(v, name))
        }
        Value::Array(a) => a.iter().any(|v| schema_mentions(v, name)),
        _ => false,
    }
}

/// Where a built-in's schema is open by design, and why that is safe: `plan.submit` carries
/// other tools' inputs, and each step's inputs are validated against the named tool's own closed
/// schema when the plan is submitted (a plan with a failing step is refused, naming it). These
/// are the only exemptions; an author cannot declare one.
pub const OPEN_BY_DESIGN: &[(Builtin, &str)] = &[(
    Builtin::PlanSubmit,
    ".properties.steps.items.properties.inputs",
)];

fn open_by_design(tool: &ToolConfig, path: &str) -> bool {
    tool.handler.builtin_kind().is_some_and(|b| {
        OPEN_BY_DESIGN
            .iter()
            .any(|(open, at)| *open == b && path.ends_with(at))
    })
}

/// Lints a loaded registry: every unsafe-surface finding.
pub fn lint(registry: &Registry) -> Vec<Finding> {
    let mut out = Vec::new();
    let compensations: Vec<&str> = registry
        .tools()
        .iter()
        .filter_map(|t| t.config.compensate.as_deref())
        .collect();
    for tool in registry.tools() {
        let is_compensation = compensations.contains(&tool.name());
        lint_tool(
            &tool.file,
            tool.index,
            &tool.config,
            is_compensation,
            &mut out,
        );
    }
    for (i, p) in registry.principals().iter().enumerate() {
        lint_principal(i, &p.config, &mut out);
    }
    out.extend(crate::approvers::lint(registry));
    for w in registry.policies.warnings() {
        push(
            &mut out,
            &w.file,
            w.policy.clone().unwrap_or_else(|| "(file)".into()),
            "policy.confusable-text",
            w.message.clone(),
            "write the policy's strings and names in one script, without bidirectional control \
             characters: a reviewer must read what Cedar evaluates",
        );
    }
    out
}

/// A registry's lint findings with its acceptances applied: what still needs fixing (including
/// acceptances that match nothing), and what a person accepted.
#[derive(Debug, Clone, Default)]
pub struct Review {
    /// Findings nobody accepted, and `accept.stale` for each acceptance that matches nothing:
    /// `check` fails and a reload is refused while any remains.
    pub findings: Vec<Finding>,
    /// Findings accepted in `accept:`: reported as warnings.
    pub accepted: Vec<Accepted>,
}

/// A finding and the acceptance that covers it.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Accepted {
    #[serde(flatten)]
    pub finding: Finding,
    pub accepted: AcceptanceConfig,
}

impl Review {
    pub fn is_clean(&self) -> bool {
        self.findings.is_empty()
    }
}

impl std::fmt::Display for Accepted {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "warning: {}: {}: [{}] {}\n    accepted by {}: {}",
            self.finding.file,
            self.finding.path,
            self.finding.rule,
            self.finding.message,
            self.accepted.by,
            self.accepted.reason
        )
    }
}

/// What a finding is about, as an acceptance names it: the subject (a tool's name, a
/// principal's id, a policy's id, or else the file) and the path inside it.
pub fn subject_of(registry: &Registry, f: &Finding) -> (String, String) {
    let (head, rest) = match f.path.split_once('.') {
        Some((h, r)) => (h, r),
        None => (f.path.as_str(), ""),
    };
    let index = |prefix: &str| {
        head.strip_prefix(prefix)
            .and_then(|x| x.strip_suffix(']'))
            .and_then(|n| n.parse::<usize>().ok())
    };
    if let Some(i) = index("tools[")
        && let Some(t) = registry
            .tools()
            .iter()
            .find(|t| t.file == f.file && t.index == i)
    {
        return (t.name().to_string(), rest.to_string());
    }
    if let Some(i) = index("principals[")
        && let Some(p) = registry.principals().get(i)
    {
        return (p.id().to_string(), rest.to_string());
    }
    if f.file.ends_with(".cedar") && f.path != "(file)" {
        return (f.path.clone(), String::new());
    }
    (f.file.clone(), f.path.clone())
}

/// Whether an acceptance covers a finding: same rule and subject, and `at` unset, equal to
/// the finding's path inside the subject, or a prefix of it (`input_schema.properties.to`
/// covers its `anyOf[0]`).
fn covers(a: &AcceptanceConfig, rule: &str, subject: &str, at: &str) -> bool {
    a.rule == rule
        && a.subject == subject
        && a.at.as_deref().is_none_or(|want| {
            at == want
                || at
                    .strip_prefix(want)
                    .is_some_and(|r| r.starts_with('.') || r.starts_with('['))
        })
}

/// Lints a registry and applies its `accept:` list.
pub fn review(registry: &Registry) -> Review {
    let accept = &registry.gateway.accept;
    let mut used = vec![false; accept.len()];
    let mut review = Review::default();
    for f in lint(registry) {
        let (subject, at) = subject_of(registry, &f);
        match accept
            .iter()
            .position(|a| covers(a, &f.rule, &subject, &at))
        {
            Some(i) => {
                used[i] = true;
                review.accepted.push(Accepted {
                    finding: f,
                    accepted: accept[i].clone(),
                });
            }
            None => review.findings.push(f),
        }
    }
    for (i, a) in accept.iter().enumerate() {
        if !used[i] {
            review.findings.push(Finding {
                file: "toolgate.yaml".into(),
                path: format!("accept[{i}]"),
                rule: "accept.stale".into(),
                message: format!(
                    "the accepted finding [{}] on '{}'{} no longer occurs",
                    a.rule,
                    a.subject,
                    a.at.as_deref()
                        .map(|at| format!(" at {at}"))
                        .unwrap_or_default()
                ),
                fix: "remove this acceptance (the finding was fixed), or correct its `subject` \
                      or `at` to what `toolgate check` prints"
                    .into(),
            });
        }
    }
    review
}

fn push(out: &mut Vec<Finding>, file: &str, path: String, rule: &str, message: String, fix: &str) {
    out.push(Finding {
        file: file.to_string(),
        path,
        rule: rule.to_string(),
        message,
        fix: fix.to_string(),
    });
}

/// The findings for one tool declaration. A tool that is itself another tool's compensation is
/// not asked to have one of its own (undoing the undo is a new action, not a rollback).
pub fn lint_tool(
    file: &str,
    index: usize,
    t: &ToolConfig,
    is_compensation: bool,
    out: &mut Vec<Finding>,
) {
    let base = format!("tools[{index}]");
    let schema_path = format!("{base}.input_schema");
    if t.input_schema.get("type").and_then(Value::as_str) != Some("object") {
        push(
            out,
            file,
            schema_path.clone(),
            "schema.not-object",
            format!("'{}' inputs are not an object", t.name),
            "MCP tool inputs are an object: `type: object` with `properties`",
        );
    }
    let mut schema_findings = Vec::new();
    SchemaLint {
        file,
        base: &schema_path,
        root: &t.input_schema,
        tool: t,
        out: &mut schema_findings,
    }
    .node(&schema_path, &t.input_schema, None, &mut Vec::new());
    // A definition used by several properties is judged once per use; report it once.
    let mut seen = std::collections::HashSet::new();
    schema_findings.retain(|f| seen.insert((f.path.clone(), f.rule.clone(), f.message.clone())));
    out.append(&mut schema_findings);

    let writes = matches!(t.effect, Effect::Write | Effect::Irreversible);
    if writes && t.identity.is_empty() {
        push(
            out,
            file,
            format!("{base}.identity"),
            "write.no-identity",
            format!(
                "{} tool '{}' declares no identity fields, so a retry cannot be recognised",
                t.effect, t.name
            ),
            "list the input fields that identify the operation (`identity: [invoice_id, amount]`), not free text",
        );
    }
    // The writing built-ins record only in toolgate's own store (a plan, a review), which no
    // compensating tool could undo better than aborting the run they belong to.
    let records_only = t.handler.builtin_kind().is_some_and(Builtin::records_only);
    let compensated = t.compensate.is_some() || t.compensate_with.is_some();
    if t.effect == Effect::Write && !compensated && !is_compensation && !records_only {
        push(
            out,
            file,
            format!("{base}.compensate"),
            "write.no-compensation",
            format!("write tool '{}' has no compensating tool", t.name),
            "name the tool that undoes it (`compensate: note.discard`), or undo it with the same \
             tool and the previous values (`compensate_with: {read: <read tool>, restore: [...]}`), \
             or declare it `irreversible`",
        );
    }
    let reconciled = t.reconcile.is_some() || t.reconcile_query.is_some();
    if t.effect == Effect::Irreversible && !reconciled && t.gate != Gate::Always {
        push(
            out,
            file,
            format!("{base}.reconcile"),
            "irreversible.unguarded",
            format!(
                "irreversible tool '{}' has neither a reconciling tool nor a gate",
                t.name
            ),
            "add `reconcile: <read tool that looks up by idempotency key>`, a `reconcile_query:` \
             (a read listing what the target did, and the fields that identify the call), or \
             `gate: always`; or accept the finding in toolgate.yaml `accept:` with a reason",
        );
    }
    if t.effect == Effect::Read && t.tier != Tier::Read {
        push(
            out,
            file,
            format!("{base}.tier"),
            "tier.contradicts-effect",
            format!("read tool '{}' is in tier {}", t.name, t.tier),
            "a read tool is tier read; if it changes state, its effect is write",
        );
    }
    if let Some(a) = t.annotations {
        lint_annotations(file, &base, t, a, out);
    }
    crate::budget::lint_tool(file, &base, t, out);
    for (j, d) in t.destinations.iter().enumerate() {
        if d.allowed.is_empty() && d.lookup.is_none() {
            push(
                out,
                file,
                format!("{base}.destinations[{j}]"),
                "destination.empty",
                format!("destination constraint on '{}' allows nothing", d.field),
                "give `allowed: [...]` or a `lookup:` read tool",
            );
        }
        if t.input_schema
            .pointer(&format!("/properties/{}", d.field))
            .is_none()
        {
            push(
                out,
                file,
                format!("{base}.destinations[{j}].field"),
                "ref.unknown-field",
                format!("'{}' is not an input of '{}'", d.field, t.name),
                "name a top-level input property",
            );
        }
    }
}

fn lint_annotations(
    file: &str,
    base: &str,
    t: &ToolConfig,
    a: AnnotationsConfig,
    out: &mut Vec<Finding>,
) {
    let path = format!("{base}.annotations");
    let mut contradiction = |msg: String| {
        push(
            out,
            file,
            path.clone(),
            "annotations.contradict-effect",
            msg,
            "remove the annotations (toolgate derives them from `effect`) or make them agree",
        )
    };
    match t.effect {
        Effect::Read => {
            if a.read_only_hint == Some(false) {
                contradiction(format!(
                    "'{}' is a read tool but says readOnlyHint: false",
                    t.name
                ));
            }
            if a.destructive_hint == Some(true) {
                contradiction(format!(
                    "'{}' is a read tool but says destructiveHint: true",
                    t.name
                ));
            }
        }
        Effect::Write | Effect::Irreversible => {
            if a.read_only_hint == Some(true) {
                contradiction(format!(
                    "'{}' is a {} tool but says readOnlyHint: true",
                    t.name, t.effect
                ));
            }
            if t.effect == Effect::Irreversible && a.destructive_hint == Some(false) {
                contradiction(format!(
                    "'{}' is irreversible but says destructiveHint: false",
                    t.name
                ));
            }
            if a.idempotent_hint == Some(true) && t.identity.is_empty() {
                contradiction(format!(
                    "'{}' says idempotentHint: true but declares no identity fields",
                    t.name
                ));
            }
        }
    }
}

fn has_any(m: &serde_json::Map<String, Value>, keys: &[&str]) -> bool {
    keys.iter().any(|k| m.contains_key(*k))
}

/// One input schema being linted: the root `$ref`s resolve against and where findings go.
struct SchemaLint<'a> {
    file: &'a str,
    /// The path of the schema's root (`tools[0].input_schema`).
    base: &'a str,
    root: &'a Value,
    tool: &'a ToolConfig,
    out: &'a mut Vec<Finding>,
}

impl<'a> SchemaLint<'a> {
    /// Lints one subschema at `path`; `refs` are the `$ref`s being followed (a recursion stops).
    fn node(
        &mut self,
        path: &str,
        schema: &'a Value,
        prop_name: Option<&str>,
        refs: &mut Vec<&'a str>,
    ) {
        let Some(m) = schema.as_object() else { return };
        let (file, tool) = (self.file, self.tool);
        let types: Vec<&str> = match m.get("type") {
            Some(Value::String(s)) => vec![s.as_str()],
            Some(Value::Array(a)) => a.iter().filter_map(Value::as_str).collect(),
            _ => vec![],
        };
        let constrained = has_any(m, &["enum", "const"]);
        for ty in &types {
            match *ty {
                "object"
                    if m.get("additionalProperties") != Some(&Value::Bool(false))
                        && !open_by_design(tool, path) =>
                {
                    push(
                        self.out,
                        file,
                        path.to_string(),
                        "schema.open-object",
                        "object schema without `additionalProperties: false`".into(),
                        "close it: extra fields are how unreviewed parameters slip through",
                    );
                }
                "number" | "integer" if !constrained => {
                    let low = has_any(m, &["minimum", "exclusiveMinimum"]);
                    let high = has_any(m, &["maximum", "exclusiveMaximum"]);
                    if !(low && high) {
                        push(
                            self.out,
                            file,
                            path.to_string(),
                            "schema.unbounded-number",
                            format!(
                                "number without {} bound",
                                match (low, high) {
                                    (false, false) => "a lower or an upper",
                                    (true, false) => "an upper",
                                    _ => "a lower",
                                }
                            ),
                            "set `minimum`/`exclusiveMinimum` and `maximum`/`exclusiveMaximum`",
                        );
                    }
                }
                "string" if !has_any(m, &["maxLength", "enum", "const", "pattern", "format"]) => {
                    push(
                        self.out,
                        file,
                        path.to_string(),
                        "schema.unbounded-string",
                        "string without `maxLength`, `enum`, `const`, `pattern` or `format`".into(),
                        "bound it: `maxLength`, or better a `pattern` or `enum`",
                    );
                }
                "array" if !m.contains_key("maxItems") => {
                    push(
                        self.out,
                        file,
                        path.to_string(),
                        "schema.unbounded-array",
                        "array without `maxItems`".into(),
                        "set `maxItems`",
                    );
                }
                _ => {}
            }
        }
        // A node without a type of its own whose alternatives or reference decide what it is
        // is judged there; `null` alone sends nothing anywhere.
        let composed = types.is_empty() && has_any(m, &["anyOf", "oneOf", "allOf", "$ref"]);
        let only_null = !types.is_empty() && types.iter().all(|t| *t == "null");
        if let Some(name) = prop_name
            && is_destination_name(name)
            && !composed
            && !only_null
            && !types.contains(&"object")
            && !types.contains(&"array")
            && !has_any(m, &["enum", "const", "pattern"])
            && !tool.destinations.iter().any(|d| d.field == name)
        {
            push(
                self.out,
                file,
                path.to_string(),
                "destination.free-string",
                format!("destination-like parameter '{name}' accepts any value"),
                "constrain it with `enum`/`const`/`pattern`, or declare a `destinations:` allowlist or lookup for it",
            );
        }
        if let Some(props) = m.get("properties").and_then(Value::as_object) {
            for (k, v) in props {
                self.node(&format!("{path}.properties.{k}"), v, Some(k), refs);
            }
        }
        if let Some(items) = m.get("items") {
            self.node(&format!("{path}.items"), items, prop_name, refs);
        }
        for key in ["anyOf", "oneOf", "allOf"] {
            if let Some(Value::Array(alts)) = m.get(key) {
                for (i, alt) in alts.iter().enumerate() {
                    self.node(&format!("{path}.{key}[{i}]"), alt, prop_name, refs);
                }
            }
        }
        if let Some(Value::String(r)) = m.get("$ref")
            && !refs.contains(&r.as_str())
            && let Some(pointer) = r.strip_prefix("#/")
            && let Some(target) = self.root.pointer(&format!("/{pointer}"))
        {
            let at = format!("{}.{}", self.base, pointer.replace('/', "."));
            refs.push(r);
            self.node(&at, target, prop_name, refs);
            refs.pop();
        }
    }
}

fn lint_principal(i: usize, p: &PrincipalConfig, out: &mut Vec<Finding>) {
    let max = p.grants.iter().map(|g| g.max_tier).max();
    for (tier, budget) in [(Tier::Act, p.budgets.act), (Tier::Spend, p.budgets.spend)] {
        if max.is_some_and(|m| m >= tier) && budget.is_none() {
            push(
                out,
                "principals.yaml",
                format!("principals[{i}].budgets.{tier}"),
                "budget.missing",
                format!(
                    "'{}' holds a grant up to tier {} but has no daily {tier} budget",
                    p.id,
                    max.expect("checked")
                ),
                "set `budgets: {act: N, spend: M}`; an unbudgeted tier is unlimited",
            );
        }
    }
    if p.kind == crate::model::PrincipalKind::Agent && p.credentials.is_empty() {
        push(
            out,
            "principals.yaml",
            format!("principals[{i}].credentials"),
            "principal.no-credential",
            format!("agent '{}' has no credential and can never connect", p.id),
            "add `credentials: [{id: key1, sha256: ...}]` (`toolgate key new` makes one)",
        );
    }
}

#[cfg(test)]
#[path = "lint_tests.rs"]
mod tests;
