//! The serve-time pin check. The gateway calls [`PinSet::check`] when it connects to an upstream,
//! when the upstream announces `tools/list_changed`, and on every reconnect; it serves only
//! [`PinVerdict::allowed`] and, per call, asks [`PinVerdict::allows`] (one hash-map lookup) for
//! the definition hash it binds into the call's approval.
//!
//! Fail closed: a server not in the lockfile, or whose identity, reported name/version or
//! instructions changed, serves nothing; a new or changed tool is blocked; a tool that was pinned
//! and is no longer listed is simply gone.

use std::collections::{BTreeMap, HashMap};

use serde::Serialize;
use serde_json::Value;

use crate::definition::{DefinitionHash, ServerFacts, ServerIdentity, definition_hash, tool_value};
use crate::diff::{Change, DiffLabel, ToolChange, diff_tool, diff_tool_sets};
use crate::lockfile::{Lockfile, ServerPin, tool_name};

/// Every server's pins, indexed for the check.
#[derive(Debug, Clone, Default)]
pub struct PinSet {
    servers: HashMap<String, IndexedServer>,
}

#[derive(Debug, Clone)]
struct IndexedServer {
    pin: ServerPin,
    hashes: HashMap<String, DefinitionHash>,
}

/// A tool that is listed but not served, and why.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct BlockedTool {
    pub tool: String,
    pub label: DiffLabel,
    pub reason: String,
    /// The labelled diff against the pin (an `Added` for a tool never pinned).
    pub change: ToolChange,
}

/// What may be served from one upstream, as decided against the lockfile.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct PinVerdict {
    pub server: String,
    /// Tools whose live definition hash equals the pin: name → that hash. Empty when the whole
    /// server is blocked.
    pub allowed: HashMap<String, DefinitionHash>,
    /// Listed tools that are not served, with their labelled diff. Sorted by name.
    pub blocked: Vec<BlockedTool>,
    /// Pinned tools the server no longer lists.
    pub removed: Vec<String>,
    /// Set when nothing from this server may be served, with the reason.
    pub server_blocked: Option<String>,
    /// What changed about the server itself (identity, name, version, instructions), labelled.
    pub server_changes: Vec<Change>,
}

impl PinVerdict {
    /// The pinned definition hash of `tool` if it may be called: the per-call check.
    pub fn allows(&self, tool: &str) -> Option<&DefinitionHash> {
        self.allowed.get(tool)
    }

    /// The message a refused call gets: what is blocked and the command that shows why.
    pub fn refusal(&self, tool: &str) -> String {
        if let Some(reason) = &self.server_blocked {
            return format!(
                "tool '{tool}' is not served: upstream '{}' is blocked ({reason}); an operator must \
                 review `toolgate lock diff {}` and run `toolgate lock approve {}`",
                self.server, self.server, self.server
            );
        }
        match self.blocked.iter().find(|b| b.tool == tool) {
            Some(b) => format!(
                "tool '{tool}' is not served: its definition on upstream '{}' changed since it was \
                 approved ({}: {}); an operator must review `toolgate lock diff {} {tool}` and run \
                 `toolgate lock approve {} {tool}`",
                self.server, b.label, b.reason, self.server, self.server
            ),
            None => format!("tool '{tool}' is not served by upstream '{}'", self.server),
        }
    }

    /// The tools of a live `tools/list` that may be shown to callers, in their order.
    pub fn served<'a>(&self, tools: &'a [rmcp::model::Tool]) -> Vec<&'a rmcp::model::Tool> {
        tools
            .iter()
            .filter(|t| self.allowed.contains_key(t.name.as_ref()))
            .collect()
    }

    /// Whether everything listed is served unchanged (nothing blocked, server not blocked).
    pub fn is_clean(&self) -> bool {
        self.server_blocked.is_none() && self.blocked.is_empty()
    }
}

impl PinSet {
    pub fn new(lock: &Lockfile) -> PinSet {
        let servers = lock
            .servers
            .iter()
            .map(|(name, pin)| {
                let hashes = pin
                    .tools
                    .iter()
                    .map(|(t, p)| (t.clone(), p.sha256.clone()))
                    .collect();
                (
                    name.clone(),
                    IndexedServer {
                        pin: pin.clone(),
                        hashes,
                    },
                )
            })
            .collect();
        PinSet { servers }
    }

    /// The pin of one server, if it has one.
    pub fn server(&self, name: &str) -> Option<&ServerPin> {
        self.servers.get(name).map(|s| &s.pin)
    }

    /// Decides what may be served from `server`, given how it is reached, what it said in
    /// `initialize`, and its `tools/list` (whole tool objects).
    pub fn check(
        &self,
        server: &str,
        identity: &ServerIdentity,
        facts: &ServerFacts,
        tools: &[Value],
    ) -> PinVerdict {
        let mut verdict = PinVerdict {
            server: server.to_string(),
            allowed: HashMap::new(),
            blocked: Vec::new(),
            removed: Vec::new(),
            server_blocked: None,
            server_changes: Vec::new(),
        };
        let Some(indexed) = self.servers.get(server) else {
            verdict.server_blocked = Some(format!("new server: '{server}' is not in the lockfile"));
            verdict.blocked = tools
                .iter()
                .map(|t| BlockedTool {
                    tool: tool_name(t).to_string(),
                    label: DiffLabel::Widening,
                    reason: "new tool on a new server".into(),
                    change: ToolChange::Added {
                        name: tool_name(t).to_string(),
                    },
                })
                .collect();
            verdict.blocked.sort_by(|a, b| a.tool.cmp(&b.tool));
            return verdict;
        };
        verdict.server_blocked = server_drift(&indexed.pin, identity, facts);
        verdict.server_changes = server_changes(&indexed.pin, identity, facts);

        // Names listed twice are ambiguous: which definition would a call reach?
        let mut seen: HashMap<&str, usize> = HashMap::new();
        for t in tools {
            *seen.entry(tool_name(t)).or_default() += 1;
        }
        let mut unmatched: Vec<Value> = Vec::new();
        for t in tools {
            let name = tool_name(t);
            if seen[name] > 1 {
                if !verdict.blocked.iter().any(|b| b.tool == name) {
                    verdict.blocked.push(BlockedTool {
                        tool: name.to_string(),
                        label: DiffLabel::Widening,
                        reason: format!("listed {} times with different definitions", seen[name]),
                        change: ToolChange::Added {
                            name: name.to_string(),
                        },
                    });
                }
                continue;
            }
            let hash = definition_hash(t);
            match indexed.hashes.get(name) {
                Some(pinned) if *pinned == hash => {
                    verdict.allowed.insert(name.to_string(), hash);
                }
                _ => unmatched.push(t.clone()),
            }
        }
        if !unmatched.is_empty() {
            // Only the tools that did not match are diffed; matched ones cost one hash each.
            let pinned: BTreeMap<String, Value> = indexed
                .pin
                .tools
                .iter()
                .filter(|(n, _)| !verdict.allowed.contains_key(*n))
                .filter(|(n, _)| {
                    tools.iter().all(|t| tool_name(t) != n.as_str())
                        || unmatched.iter().any(|t| tool_name(t) == n.as_str())
                })
                .map(|(n, p)| (n.clone(), p.definition.clone()))
                .collect();
            for change in diff_tool_sets(&pinned, &unmatched) {
                if let ToolChange::Removed { .. } = change {
                    continue;
                }
                verdict.blocked.push(BlockedTool {
                    tool: change.name().to_string(),
                    label: change.label(),
                    reason: summarise(&change),
                    change,
                });
            }
        }
        verdict.removed = indexed
            .pin
            .tools
            .keys()
            .filter(|n| tools.iter().all(|t| tool_name(t) != n.as_str()))
            .cloned()
            .collect();
        verdict.blocked.sort_by(|a, b| a.tool.cmp(&b.tool));
        if verdict.server_blocked.is_some() {
            verdict.allowed.clear();
        }
        verdict
    }

    /// [`PinSet::check`] on what an rmcp client read.
    pub fn check_rmcp(
        &self,
        server: &str,
        identity: &ServerIdentity,
        info: &rmcp::model::ServerPeerInfo,
        tools: &[rmcp::model::Tool],
    ) -> PinVerdict {
        let values: Vec<Value> = tools.iter().map(tool_value).collect();
        self.check(
            server,
            identity,
            &ServerFacts::from_peer_info(info),
            &values,
        )
    }
}

/// Why a pinned server as a whole may not be served, if it may not.
fn server_drift(pin: &ServerPin, identity: &ServerIdentity, facts: &ServerFacts) -> Option<String> {
    if pin.identity != *identity {
        return Some(format!(
            "identity changed: pinned `{}`{}, now `{}`{}",
            pin.identity.describe(),
            pkg(&pin.identity),
            identity.describe(),
            pkg(identity)
        ));
    }
    if pin.server.name != facts.name || pin.server.version != facts.version {
        return Some(format!(
            "server reports {} {}, pinned {} {}: the code behind unchanged definitions may have changed",
            facts.name, facts.version, pin.server.name, pin.server.version
        ));
    }
    if pin.instructions_sha256 != facts.instructions_hash() {
        return Some(format!(
            "instructions changed ({} -> {}): the server's instructions reach the model like a description",
            pin.instructions_sha256,
            facts.instructions_hash()
        ));
    }
    None
}

/// The labelled changes of the server itself, for `lock diff`.
fn server_changes(pin: &ServerPin, identity: &ServerIdentity, facts: &ServerFacts) -> Vec<Change> {
    let mut out = Vec::new();
    let mut add = |path: &str, label: DiffLabel, message: String| {
        out.push(Change {
            path: path.to_string(),
            label,
            message,
        })
    };
    if pin.identity.describe() != identity.describe() {
        add(
            "identity",
            DiffLabel::Widening,
            format!(
                "now `{}`, pinned `{}`",
                identity.describe(),
                pin.identity.describe()
            ),
        );
    }
    if pin.identity.package != identity.package {
        add(
            "identity.package",
            DiffLabel::Widening,
            format!(
                "now {}, pinned {}: new code",
                identity.package.as_deref().unwrap_or("(none)"),
                pin.identity.package.as_deref().unwrap_or("(none)")
            ),
        );
    }
    if pin.server.name != facts.name || pin.server.version != facts.version {
        add(
            "server",
            DiffLabel::Widening,
            format!(
                "reports {} {}, pinned {} {}: new code behind the definitions",
                facts.name, facts.version, pin.server.name, pin.server.version
            ),
        );
    }
    if pin.instructions_sha256 != facts.instructions_hash() {
        let quote = |s: Option<&str>| {
            s.map(|s| format!("{s:?}"))
                .unwrap_or_else(|| "(none)".into())
        };
        add(
            "instructions",
            DiffLabel::Description,
            format!(
                "text changed from {} to {}",
                match &pin.instructions {
                    Some(t) => quote(Some(t)),
                    None if pin.instructions_sha256
                        == crate::definition::instructions_hash(None) =>
                        "(none)".into(),
                    None => pin.instructions_sha256.clone(),
                },
                quote(facts.instructions.as_deref())
            ),
        );
    }
    out
}

fn pkg(id: &ServerIdentity) -> String {
    id.package
        .as_ref()
        .map(|p| format!(" (package {p})"))
        .unwrap_or_default()
}

/// One line for a blocked tool: its label and its first changes.
fn summarise(change: &ToolChange) -> String {
    let changes = change.changes();
    let mut parts: Vec<String> = changes
        .iter()
        .take(3)
        .map(|c| format!("{}: {}", c.path, c.message))
        .collect();
    if changes.len() > 3 {
        parts.push(format!("and {} more", changes.len() - 3));
    }
    parts.join("; ")
}

/// The labelled changes of one tool against its pin (empty when it is unchanged); for
/// `toolgate lock diff SERVER TOOL`.
pub fn diff_against_pin(pin: &ServerPin, live: &Value) -> Vec<crate::diff::Change> {
    match pin.tools.get(tool_name(live)) {
        Some(p) => diff_tool(&p.definition, live),
        None => ToolChange::Added {
            name: tool_name(live).to_string(),
        }
        .changes(),
    }
}

impl PinVerdict {
    /// One line for `toolgate lock status`.
    pub fn status_line(&self) -> String {
        let state = match &self.server_blocked {
            Some(r) => format!("BLOCKED: {r}"),
            None if self.blocked.is_empty() => "ok".to_string(),
            None => "changes pending review".to_string(),
        };
        let mut labels: Vec<String> = Vec::new();
        for l in [
            DiffLabel::Widening,
            DiffLabel::Breaking,
            DiffLabel::Description,
        ] {
            let n = self.blocked.iter().filter(|b| b.label == l).count();
            if n > 0 {
                labels.push(format!("{n} {l}"));
            }
        }
        format!(
            "{}: {} served, {} blocked{}, {} removed; {state}",
            self.server,
            self.allowed.len(),
            self.blocked.len(),
            if labels.is_empty() {
                String::new()
            } else {
                format!(" ({})", labels.join(", "))
            },
            self.removed.len()
        )
    }

    /// The labelled diff for `toolgate lock diff`: every change of every blocked tool, or of one.
    pub fn render_diff(&self, only_tool: Option<&str>) -> String {
        let mut s = format!("server {}", self.server);
        match &self.server_blocked {
            Some(r) => s.push_str(&format!(": BLOCKED, {r}\n")),
            None => s.push('\n'),
        }
        for c in &self.server_changes {
            s.push_str(&format!("    {c}\n"));
        }
        let renamed_from: Vec<&str> = self
            .blocked
            .iter()
            .filter_map(|b| match &b.change {
                ToolChange::Renamed { from, .. } => Some(from.as_str()),
                _ => None,
            })
            .collect();
        let mut any = false;
        for b in &self.blocked {
            if only_tool.is_some_and(|t| t != b.tool) {
                continue;
            }
            any = true;
            s.push_str(&format!("  {} [{}]\n", b.tool, b.label));
            for c in b.change.changes() {
                s.push_str(&format!("    {c}\n"));
            }
        }
        for r in &self.removed {
            if only_tool.is_some_and(|t| t != r) || renamed_from.contains(&r.as_str()) {
                continue;
            }
            any = true;
            s.push_str(&format!("  {r} [breaking]\n    tool removed: no longer listed (not blocked: it is simply gone)\n"));
        }
        if !any {
            s.push_str("  no tool definition changed\n");
        }
        s
    }
}
