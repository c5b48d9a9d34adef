//! The tool contract audit: what a server's `tools/list` shows about each tool's contract, asked
//! of any MCP server without a registry. It flags writes that cannot be deduplicated, destinations
//! a model can fill with any string, open and unbounded schemas, missing or contradictory
//! annotations and instruction-like text; and it always reports the implementation as
//! UNDETERMINED, because no definition, hashed or not, shows what the code does.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};
use toolgate_core::lint::is_destination_name;

use crate::definition::{DefinitionHash, ServerFacts, definition_hash};
use crate::lockfile::tool_name;

/// How much a finding matters. Ordered: `--fail-on medium` fails on medium and high.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Severity {
    Info,
    Low,
    Medium,
    High,
}

impl Severity {
    pub fn as_str(self) -> &'static str {
        match self {
            Severity::Info => "info",
            Severity::Low => "low",
            Severity::Medium => "medium",
            Severity::High => "high",
        }
    }
}

impl fmt::Display for Severity {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for Severity {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s.to_ascii_lowercase().as_str() {
            "info" => Ok(Severity::Info),
            "low" => Ok(Severity::Low),
            "medium" => Ok(Severity::Medium),
            "high" => Ok(Severity::High),
            other => Err(format!(
                "unknown severity '{other}': use info, low, medium or high"
            )),
        }
    }
}

/// Whether a finding is a failed check or a question the definition cannot answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Status {
    Fail,
    Undetermined,
}

/// One audit rule: its id, a one-line description and what to do about it.
#[derive(Debug, Clone, Copy)]
pub struct Rule {
    pub id: &'static str,
    pub summary: &'static str,
    pub help: &'static str,
}

/// Every rule the audit applies, in a fixed order (SARIF rule indices follow it).
pub const RULES: &[Rule] = &[
    Rule {
        id: "unkeyed-write",
        summary: "A write tool takes no idempotency key and has no keyed alternative",
        help: "Add an idempotency key parameter (derived by the caller from the operation's identity) so a retry after a timeout cannot repeat the effect.",
    },
    Rule {
        id: "free-destination",
        summary: "A parameter that chooses a destination accepts any string",
        help: "Constrain recipients, URLs, webhooks, channels, accounts and owners with enum, pattern, format or const in the schema, and check them against data on the server.",
    },
    Rule {
        id: "open-schema",
        summary: "An object schema accepts undeclared fields",
        help: "Set additionalProperties: false so only declared fields reach the server.",
    },
    Rule {
        id: "unbounded-value",
        summary: "A number, string or array has no bound",
        help: "Bound numbers with minimum/maximum, strings with maxLength (or enum/const), arrays with maxItems.",
    },
    Rule {
        id: "annotations-missing",
        summary: "The tool does not say whether it is read-only, destructive or idempotent",
        help: "Set readOnlyHint, destructiveHint, idempotentHint and openWorldHint; without them MCP treats a tool as a destructive, non-idempotent write to an open world.",
    },
    Rule {
        id: "annotations-contradictory",
        summary: "The tool's annotations contradict each other or its name",
        help: "Make the hints agree with what the tool does; a gateway should take the effect from its own registry, never from hints.",
    },
    Rule {
        id: "instruction-text",
        summary: "Text the model reads contains instructions to the model",
        help: "Descriptions say what a tool does, not what the model must do; remove imperatives such as 'ignore previous' or 'do not tell the user'.",
    },
    Rule {
        id: "hidden-unicode",
        summary: "Text the model reads contains invisible or control characters",
        help: "Remove zero-width, bidirectional-control and tag characters: a reviewer cannot see what they carry.",
    },
    Rule {
        id: "tool-mention",
        summary: "A description names another tool",
        help: "Check that the mention only describes the relationship; text that steers the model to call other tools is a poisoning channel.",
    },
    Rule {
        id: "implementation",
        summary: "What the implementation does cannot be determined from the definition",
        help: "Pin the package at an exact version, review its changes on every upgrade, and re-run this audit and the tool's evals before approving the new version.",
    },
];

/// One finding of the audit.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AuditFinding {
    pub rule: String,
    pub severity: Severity,
    pub status: Status,
    /// The tool it is about; `None` for the server as a whole.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tool: Option<String>,
    /// Where in the tool (`inputSchema.properties.to`), when it is one place.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub path: Option<String>,
    pub message: String,
}

/// One listed tool, as the audit saw it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AuditedTool {
    pub name: String,
    pub sha256: DefinitionHash,
    /// Effective readOnlyHint (MCP default: false).
    pub read_only: bool,
    /// Effective destructiveHint for a non-read-only tool (MCP default: true).
    pub destructive: bool,
}

/// The whole audit of one server.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AuditReport {
    pub target: String,
    pub server: ServerFacts,
    pub instructions_sha256: String,
    pub tools: Vec<AuditedTool>,
    pub findings: Vec<AuditFinding>,
}

impl AuditReport {
    /// The highest severity among failed checks (undetermined rows never fail a build).
    pub fn max_severity(&self) -> Option<Severity> {
        self.findings
            .iter()
            .filter(|f| f.status == Status::Fail)
            .map(|f| f.severity)
            .max()
    }

    /// Whether a failed check at or above `threshold` was found.
    pub fn fails_at(&self, threshold: Severity) -> bool {
        self.max_severity().is_some_and(|s| s >= threshold)
    }

    /// Count of failed checks per severity, highest first.
    pub fn counts(&self) -> [(Severity, usize); 4] {
        let n = |s| {
            self.findings
                .iter()
                .filter(|f| f.status == Status::Fail && f.severity == s)
                .count()
        };
        [
            (Severity::High, n(Severity::High)),
            (Severity::Medium, n(Severity::Medium)),
            (Severity::Low, n(Severity::Low)),
            (Severity::Info, n(Severity::Info)),
        ]
    }

    /// The report as a table for people.
    pub fn render_table(&self) -> String {
        let mut s = String::new();
        s.push_str(&format!("toolgate audit: {}\n", self.target));
        s.push_str(&format!(
            "server: {} {} (protocol {}), {} tool(s), instructions {}\n\n",
            self.server.name,
            self.server.version,
            self.server.protocol_version,
            self.tools.len(),
            if self.server.instructions.is_some() {
                self.instructions_sha256.as_str()
            } else {
                "none"
            }
        ));
        let header = ["SEVERITY", "RULE", "TOOL", "WHERE", "FINDING"];
        let rows: Vec<[String; 5]> = self
            .findings
            .iter()
            .map(|f| {
                [
                    match f.status {
                        Status::Fail => f.severity.to_string(),
                        Status::Undetermined => "UNDETERMINED".to_string(),
                    },
                    f.rule.clone(),
                    f.tool.clone().unwrap_or_else(|| "(server)".into()),
                    f.path.clone().unwrap_or_else(|| "-".into()),
                    f.message.clone(),
                ]
            })
            .collect();
        let mut widths = header.map(str::len);
        for r in &rows {
            for (i, c) in r.iter().enumerate() {
                widths[i] = widths[i].max(c.chars().count());
            }
        }
        let line = |cells: &[String]| {
            let mut l = String::new();
            for (i, c) in cells.iter().enumerate() {
                if i + 1 == cells.len() {
                    l.push_str(c);
                } else {
                    l.push_str(&format!("{c:<w$}  ", w = widths[i]));
                }
            }
            format!("{}\n", l.trim_end())
        };
        s.push_str(&line(&header.map(str::to_string)));
        for r in &rows {
            s.push_str(&line(r));
        }
        let counts: Vec<String> = self
            .counts()
            .iter()
            .map(|(sev, n)| format!("{n} {sev}"))
            .collect();
        let undetermined = self
            .findings
            .iter()
            .filter(|f| f.status == Status::Undetermined)
            .count();
        s.push_str(&format!(
            "\n{} finding(s): {}; {undetermined} undetermined\n",
            self.findings.len() - undetermined,
            counts.join(", ")
        ));
        s
    }
}

/// Audits one server's `initialize` facts and `tools/list` (whole tool objects).
pub fn audit(target: &str, server: &ServerFacts, tools: &[Value]) -> AuditReport {
    let mut findings = Vec::new();
    let names: Vec<&str> = tools.iter().map(tool_name).collect();
    let mut audited = Vec::new();
    for tool in tools {
        let name = tool_name(tool);
        let ann = tool.get("annotations").and_then(Value::as_object);
        let hint = |k: &str| ann.and_then(|a| a.get(k)).and_then(Value::as_bool);
        let read_only = hint("readOnlyHint").unwrap_or(false);
        let destructive = hint("destructiveHint").unwrap_or(true);
        audited.push(AuditedTool {
            name: name.to_string(),
            sha256: definition_hash(tool),
            read_only,
            destructive,
        });
        let mut f = ToolAudit {
            tool: name,
            out: &mut findings,
        };
        let schema = tool.get("inputSchema").unwrap_or(&Value::Null);
        if !read_only {
            f.unkeyed_write(tool, tools, hint("idempotentHint"), destructive);
        }
        f.destinations(schema, read_only);
        f.open_and_unbounded(schema, read_only);
        f.annotations(ann, read_only);
        f.texts(tool, &names);
    }
    if let Some(text) = &server.instructions {
        let mut f = ToolAudit {
            tool: "",
            out: &mut findings,
        };
        f.text("instructions", text, &names);
    }
    findings.push(AuditFinding {
        rule: "implementation".into(),
        severity: Severity::Info,
        status: Status::Undetermined,
        tool: None,
        path: None,
        message: "a definition hash cannot see code: the same definition can front a changed \
                  implementation (a release that quietly adds a BCC). Pin the package version \
                  exactly and re-test every upgrade"
            .into(),
    });
    findings.sort_by(|a, b| {
        (a.status == Status::Undetermined)
            .cmp(&(b.status == Status::Undetermined))
            .then(b.severity.cmp(&a.severity))
            .then(a.tool.cmp(&b.tool))
            .then(a.rule.cmp(&b.rule))
            .then(a.path.cmp(&b.path))
    });
    AuditReport {
        target: target.to_string(),
        server: server.clone(),
        instructions_sha256: server.instructions_hash(),
        tools: audited,
        findings,
    }
}

/// Whether a parameter name is an idempotency key (`idempotency_key`, `requestId`, `dedupe_key`…).
pub fn is_key_name(name: &str) -> bool {
    let n: String = name
        .chars()
        .filter(|c| c.is_ascii_alphanumeric())
        .collect::<String>()
        .to_ascii_lowercase();
    n.contains("idempoten")
        || n.contains("dedup")
        || matches!(
            n.as_str(),
            "requestid" | "clientrequestid" | "clienttoken" | "operationid" | "nonce" | "uniquekey"
        )
}

fn has_key_param(tool: &Value) -> bool {
    tool.pointer("/inputSchema/properties")
        .and_then(Value::as_object)
        .is_some_and(|p| p.keys().any(|k| is_key_name(k)))
}

struct ToolAudit<'a> {
    tool: &'a str,
    out: &'a mut Vec<AuditFinding>,
}

impl ToolAudit<'_> {
    fn push(&mut self, rule: &str, severity: Severity, path: Option<String>, message: String) {
        self.out.push(AuditFinding {
            rule: rule.into(),
            severity,
            status: Status::Fail,
            tool: (!self.tool.is_empty()).then(|| self.tool.to_string()),
            path,
            message,
        });
    }

    fn unkeyed_write(
        &mut self,
        tool: &Value,
        all: &[Value],
        idempotent: Option<bool>,
        destructive: bool,
    ) {
        if has_key_param(tool) {
            return;
        }
        let name = self.tool;
        let alternative = all.iter().any(|other| {
            let o = tool_name(other);
            o != name && (o.contains(name) || name.contains(o)) && has_key_param(other)
        });
        if alternative {
            return;
        }
        let (severity, why) = match (idempotent, destructive) {
            (Some(true), _) => (
                Severity::Low,
                "it declares idempotentHint, but that is a hint nothing enforces",
            ),
            (_, true) => (
                Severity::High,
                "it is destructive (explicitly or by MCP's default), so a retry after a timeout can repeat it",
            ),
            (_, false) => (
                Severity::Medium,
                "a retry after a timeout can repeat its effect",
            ),
        };
        self.push(
            "unkeyed-write",
            severity,
            Some("inputSchema".into()),
            format!("write with no idempotency key parameter and no keyed alternative: {why}"),
        );
    }

    fn destinations(&mut self, schema: &Value, read_only: bool) {
        let mut hits = Vec::new();
        walk_properties(schema, "inputSchema", &mut |path, name, prop| {
            if is_destination_name(name) && free_string(prop) {
                hits.push(path.to_string());
            }
        });
        for path in hits {
            let (severity, what) = if read_only {
                (
                    Severity::Medium,
                    "a read that reaches a free destination is an egress channel",
                )
            } else {
                (
                    Severity::High,
                    "a well-formed wrong value sends data or money elsewhere",
                )
            };
            self.push(
                "free-destination",
                severity,
                Some(path),
                format!("destination-like parameter is a free string (no enum, pattern, format or const): {what}"),
            );
        }
    }

    fn open_and_unbounded(&mut self, schema: &Value, read_only: bool) {
        let mut open = Vec::new();
        let (mut strings, mut numbers, mut arrays) = (Vec::new(), Vec::new(), Vec::new());
        walk_schemas(schema, "inputSchema", &mut |path, node| {
            let types = types_of(node);
            let fixed = node.contains_key("enum") || node.contains_key("const");
            let is_object = types.iter().any(|t| t == "object") || node.contains_key("properties");
            if is_object
                && matches!(
                    node.get("additionalProperties"),
                    None | Some(Value::Bool(true))
                )
            {
                open.push(path.to_string());
            }
            if fixed {
                return;
            }
            if types.iter().any(|t| t == "string") && !node.contains_key("maxLength") {
                strings.push(path.to_string());
            }
            if types.iter().any(|t| t == "number" || t == "integer")
                && !((node.contains_key("maximum") || node.contains_key("exclusiveMaximum"))
                    && (node.contains_key("minimum") || node.contains_key("exclusiveMinimum")))
            {
                numbers.push(path.to_string());
            }
            if types.iter().any(|t| t == "array") && !node.contains_key("maxItems") {
                arrays.push(path.to_string());
            }
        });
        if !open.is_empty() {
            let (path, places) = places(&open);
            self.push(
                "open-schema",
                Severity::Medium,
                Some(path),
                format!(
                    "{} object schema(s) without additionalProperties: false{places}; undeclared fields reach the server",
                    open.len()
                ),
            );
        }
        let num_sev = if read_only {
            Severity::Low
        } else {
            Severity::Medium
        };
        for (list, what, sev) in [
            (
                numbers,
                "number(s) without both a minimum and a maximum",
                num_sev,
            ),
            (strings, "string(s) without maxLength", Severity::Low),
            (arrays, "array(s) without maxItems", Severity::Low),
        ] {
            if !list.is_empty() {
                let (path, places) = places(&list);
                self.push(
                    "unbounded-value",
                    sev,
                    Some(path),
                    format!("{} {what}{places}", list.len()),
                );
            }
        }
    }

    fn annotations(&mut self, ann: Option<&Map<String, Value>>, read_only: bool) {
        let Some(ann) = ann else {
            self.push(
                "annotations-missing",
                Severity::Medium,
                None,
                "no annotations: MCP treats the tool as a destructive, non-idempotent write to an open world".into(),
            );
            return;
        };
        let mut absent: Vec<&str> = Vec::new();
        let wanted: &[&str] = if read_only {
            &["readOnlyHint", "openWorldHint"]
        } else {
            &[
                "readOnlyHint",
                "destructiveHint",
                "idempotentHint",
                "openWorldHint",
            ]
        };
        for k in wanted {
            if !ann.contains_key(*k) {
                absent.push(k);
            }
        }
        if !absent.is_empty() {
            let sev = if absent.contains(&"readOnlyHint") || absent.contains(&"destructiveHint") {
                Severity::Low
            } else {
                Severity::Info
            };
            self.push(
                "annotations-missing",
                sev,
                Some("annotations".into()),
                format!(
                    "{} absent; MCP defaults apply (readOnly false, destructive true, idempotent false, openWorld true)",
                    absent.join(", ")
                ),
            );
        }
        let b = |k: &str| ann.get(k).and_then(Value::as_bool);
        if b("readOnlyHint") == Some(true) && b("destructiveHint") == Some(true) {
            self.push(
                "annotations-contradictory",
                Severity::High,
                Some("annotations".into()),
                "readOnlyHint and destructiveHint are both true".into(),
            );
        }
        if read_only && let Some(verb) = write_verb(self.tool) {
            self.push(
                "annotations-contradictory",
                Severity::Medium,
                Some("annotations.readOnlyHint".into()),
                format!("claims to be read-only but its name starts with '{verb}'"),
            );
        }
    }

    fn texts(&mut self, tool: &Value, names: &[&str]) {
        let mut texts: Vec<(String, String)> = Vec::new();
        for k in ["title", "description"] {
            if let Some(s) = tool.get(k).and_then(Value::as_str) {
                texts.push((k.to_string(), s.to_string()));
            }
        }
        if let Some(s) = tool.pointer("/annotations/title").and_then(Value::as_str) {
            texts.push(("annotations.title".into(), s.to_string()));
        }
        for key in ["inputSchema", "outputSchema"] {
            if let Some(schema) = tool.get(key) {
                walk_schemas(schema, key, &mut |path, node| {
                    for k in ["description", "title"] {
                        if let Some(s) = node.get(k).and_then(Value::as_str) {
                            texts.push((format!("{path}.{k}"), s.to_string()));
                        }
                    }
                });
            }
        }
        // Property names are read by the model too.
        walk_properties(
            tool.get("inputSchema").unwrap_or(&Value::Null),
            "inputSchema",
            &mut |path, name, _| {
                if hidden_chars(name).next().is_some() {
                    texts.push((path.to_string(), name.to_string()));
                }
            },
        );
        for (path, text) in texts {
            self.text(&path, &text, names);
        }
    }

    fn text(&mut self, path: &str, text: &str, names: &[&str]) {
        let hidden: Vec<String> = hidden_chars(text)
            .map(|c| format!("U+{:04X}", c as u32))
            .collect();
        if !hidden.is_empty() {
            let mut uniq = hidden.clone();
            uniq.dedup();
            self.push(
                "hidden-unicode",
                Severity::High,
                Some(path.to_string()),
                format!(
                    "{} invisible or control character(s): {}",
                    hidden.len(),
                    uniq.join(" ")
                ),
            );
        }
        let lower = text.to_lowercase();
        for (phrase, severity) in INSTRUCTION_PHRASES {
            if lower.contains(phrase) {
                self.push(
                    "instruction-text",
                    *severity,
                    Some(path.to_string()),
                    format!("instruction-like text: \"{phrase}\""),
                );
            }
        }
        for other in names {
            if *other != self.tool && distinctive(other) && mentions(text, other) {
                self.push(
                    "tool-mention",
                    Severity::Low,
                    Some(path.to_string()),
                    format!("mentions another tool, '{other}'"),
                );
            }
        }
    }
}

/// Where a grouped finding is: its one path, or `inputSchema` and the short names of all places.
fn places(paths: &[String]) -> (String, String) {
    if let [one] = paths {
        return (one.clone(), String::new());
    }
    let short: Vec<String> = paths
        .iter()
        .map(|p| {
            let p = p.strip_prefix("inputSchema").unwrap_or(p);
            let p = p.replace(".properties.", ".");
            let p = p.trim_start_matches('.');
            if p.is_empty() {
                "(root)".to_string()
            } else {
                p.to_string()
            }
        })
        .collect();
    ("inputSchema".into(), format!(" ({})", short.join(", ")))
}

/// Phrases that address the model rather than describe the tool, with how strongly they do.
const INSTRUCTION_PHRASES: &[(&str, Severity)] = &[
    ("ignore previous", Severity::High),
    ("ignore all previous", Severity::High),
    ("ignore the above", Severity::High),
    ("ignore any previous", Severity::High),
    ("disregard", Severity::High),
    ("forget your instructions", Severity::High),
    ("do not tell", Severity::High),
    ("don't tell", Severity::High),
    ("do not mention", Severity::High),
    ("don't mention", Severity::High),
    ("do not inform", Severity::High),
    ("without telling", Severity::High),
    ("without informing", Severity::High),
    ("never tell", Severity::High),
    ("never mention", Severity::High),
    ("do not reveal", Severity::High),
    ("secretly", Severity::High),
    ("<important>", Severity::High),
    ("<system>", Severity::High),
    ("<instructions>", Severity::High),
    ("system prompt", Severity::High),
    ("always call", Severity::Medium),
    ("always use", Severity::Medium),
    ("always invoke", Severity::Medium),
    ("always run", Severity::Medium),
    ("before using any other tool", Severity::Medium),
    ("before calling any", Severity::Medium),
    ("instead of any other tool", Severity::Medium),
    ("you must", Severity::Low),
    ("the assistant must", Severity::Low),
    ("the model must", Severity::Low),
];

/// Invisible, bidirectional-control, tag and control characters (tab and newlines are fine).
fn hidden_chars(text: &str) -> impl Iterator<Item = char> + '_ {
    text.chars().filter(|&c| {
        matches!(c as u32,
            0x00AD | 0x180E | 0x200B..=0x200F | 0x202A..=0x202E | 0x2060..=0x2064
            | 0x2066..=0x2069 | 0xFEFF | 0xE0000..=0xE007F)
            || (c.is_control() && !matches!(c, '\n' | '\r' | '\t'))
    })
}

/// A tool name unlikely to be an ordinary word: `send_email`, `get-file`, `readFile`, or long.
fn distinctive(name: &str) -> bool {
    name.contains('_')
        || name.contains('-')
        || name
            .chars()
            .zip(name.chars().skip(1))
            .any(|(a, b)| a.is_ascii_lowercase() && b.is_ascii_uppercase())
        || name.len() >= 12
}

/// Whether `text` contains `name` as a whole word.
fn mentions(text: &str, name: &str) -> bool {
    let word = |c: char| c.is_alphanumeric() || c == '_' || c == '-';
    text.match_indices(name).any(|(i, _)| {
        let before = text[..i].chars().next_back();
        let after = text[i + name.len()..].chars().next();
        !before.is_some_and(word) && !after.is_some_and(word)
    })
}

const WRITE_VERBS: &[&str] = &[
    "create", "delete", "remove", "update", "write", "send", "post", "put", "set", "move", "edit",
    "add", "insert", "drop", "execute", "exec", "run", "kill", "publish", "upload", "transfer",
    "pay", "approve", "modify", "patch", "rename", "destroy", "purge",
];

fn write_verb(name: &str) -> Option<&'static str> {
    let first: String = name
        .chars()
        .take_while(|c| c.is_ascii_lowercase() || c.is_ascii_digit())
        .collect();
    WRITE_VERBS.iter().copied().find(|v| *v == first)
}

fn types_of(node: &Map<String, Value>) -> Vec<String> {
    match node.get("type") {
        Some(Value::String(s)) => vec![s.clone()],
        Some(Value::Array(a)) => a
            .iter()
            .filter_map(Value::as_str)
            .map(str::to_string)
            .collect(),
        _ => Vec::new(),
    }
}

/// A string-valued schema (or array of them) with nothing constraining which strings pass.
fn free_string(prop: &Value) -> bool {
    let Some(node) = prop.as_object() else {
        return prop == &Value::Bool(true);
    };
    let constrained = ["enum", "const", "pattern", "format"]
        .iter()
        .any(|k| node.contains_key(*k));
    if constrained {
        return false;
    }
    let types = types_of(node);
    if types.iter().any(|t| t == "array") {
        return node.get("items").is_none_or(free_string);
    }
    if let Some(alts) = node
        .get("anyOf")
        .or_else(|| node.get("oneOf"))
        .and_then(Value::as_array)
    {
        return alts.iter().any(free_string);
    }
    types.is_empty() || types.iter().any(|t| t == "string")
}

/// Calls `f(path, node)` for every schema object in `schema`, depth first.
fn walk_schemas(schema: &Value, path: &str, f: &mut dyn FnMut(&str, &Map<String, Value>)) {
    let Some(node) = schema.as_object() else {
        return;
    };
    f(path, node);
    for (k, v) in node {
        match k.as_str() {
            "properties" | "patternProperties" | "$defs" | "definitions" => {
                if let Some(m) = v.as_object() {
                    for (name, sub) in m {
                        walk_schemas(sub, &format!("{path}.{k}.{name}"), f);
                    }
                }
            }
            "items" | "additionalProperties" | "not" | "contains" | "if" | "then" | "else" => {
                walk_schemas(v, &format!("{path}.{k}"), f)
            }
            "anyOf" | "oneOf" | "allOf" | "prefixItems" => {
                if let Some(a) = v.as_array() {
                    for (i, sub) in a.iter().enumerate() {
                        walk_schemas(sub, &format!("{path}.{k}[{i}]"), f);
                    }
                }
            }
            _ => {}
        }
    }
}

/// Calls `f(path, name, schema)` for every named property anywhere in `schema`.
fn walk_properties(schema: &Value, path: &str, f: &mut dyn FnMut(&str, &str, &Value)) {
    walk_schemas(schema, path, &mut |p, node| {
        if let Some(props) = node.get("properties").and_then(Value::as_object) {
            for (name, sub) in props {
                f(&format!("{p}.properties.{name}"), name, sub);
            }
        }
    });
}
