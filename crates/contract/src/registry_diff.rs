//! `toolgate registry diff REF`: the organisation's own tools get the same discipline as a
//! third-party upgrade. Each tool in the registry is compared with its declaration at a git
//! revision; every change is labelled like a lockfile diff; a change of behaviour (schema, effect,
//! tier, sensitivity, gate, handler, destinations, identity, compensation) without a version bump
//! is a failure, and a widening change names the owner who must review it.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::process::Command;

use serde::Serialize;
use serde_json::Value;
use toolgate_core::config::{ToolConfig, ToolsFile};
use toolgate_core::registry::parse_yaml;

use crate::ContractError;
use crate::diff::{Change, DiffLabel, diff_annotations, diff_schema, push, show};

/// Fields whose change is a change of behaviour and so needs a version bump.
pub const BEHAVIOUR_FIELDS: &[&str] = &[
    "input_schema",
    "output_schema",
    "effect",
    "tier",
    "sensitivity",
    "gate",
    "approvers",
    "handler",
    "destinations",
    "identity",
    "compensate",
    "reconcile",
    "reconcile_query",
    "compensate_with",
];

/// One tool's changes between the revision and now.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct RegistryToolDiff {
    pub name: String,
    pub owner: String,
    /// `None` for a tool that is new.
    pub old_version: Option<String>,
    /// `None` for a tool that was removed.
    pub new_version: Option<String>,
    pub changes: Vec<Change>,
    /// Set when the version should have been bumped and was not.
    pub failure: Option<String>,
}

impl RegistryToolDiff {
    pub fn label(&self) -> Option<DiffLabel> {
        self.changes.iter().map(|c| c.label).max()
    }

    pub fn needs_owner_review(&self) -> bool {
        self.label() == Some(DiffLabel::Widening)
    }
}

/// Every tool that changed, by name.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct RegistryDiff {
    pub revision: String,
    pub tools: Vec<RegistryToolDiff>,
}

impl RegistryDiff {
    pub fn failed(&self) -> bool {
        self.tools.iter().any(|t| t.failure.is_some())
    }

    /// The diff for people: per tool, its labelled changes, then failures and reviews.
    pub fn render(&self) -> String {
        let mut s = String::new();
        if self.tools.is_empty() {
            s.push_str(&format!("no tool changed since {}\n", self.revision));
            return s;
        }
        for t in &self.tools {
            let v = |x: &Option<String>| x.clone().unwrap_or_else(|| "-".into());
            s.push_str(&format!(
                "{}  {} -> {}  owner {}  [{}]\n",
                t.name,
                v(&t.old_version),
                v(&t.new_version),
                t.owner,
                t.label().map(DiffLabel::as_str).unwrap_or("unchanged")
            ));
            for c in &t.changes {
                s.push_str(&format!("  {c}\n"));
            }
            if let Some(f) = &t.failure {
                s.push_str(&format!("  FAIL: {f}\n"));
            }
            if t.needs_owner_review() {
                s.push_str(&format!(
                    "  REVIEW: widening change; needs review and approval by {}\n",
                    t.owner
                ));
            }
        }
        let failures = self.tools.iter().filter(|t| t.failure.is_some()).count();
        let reviews = self.tools.iter().filter(|t| t.needs_owner_review()).count();
        s.push_str(&format!(
            "\n{} tool(s) changed since {}: {failures} without a needed version bump, {reviews} needing an owner's review\n",
            self.tools.len(),
            self.revision
        ));
        s
    }
}

/// Reads `tools/*.yaml` of the registry folder `dir` as it is on disk.
pub fn tools_on_disk(dir: &Path) -> Result<Vec<ToolConfig>, ContractError> {
    let tools_dir = dir.join("tools");
    let mut files: Vec<_> = match std::fs::read_dir(&tools_dir) {
        Ok(rd) => rd
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| p.extension().is_some_and(|x| x == "yaml"))
            .collect(),
        Err(_) => Vec::new(),
    };
    files.sort();
    let mut out = Vec::new();
    for path in files {
        let file = path.display().to_string();
        let text = std::fs::read_to_string(&path).map_err(|source| ContractError::Io {
            file: file.clone(),
            doing: "",
            source,
        })?;
        out.extend(parse_tools(&file, &text)?);
    }
    Ok(out)
}

fn parse_tools(file: &str, text: &str) -> Result<Vec<ToolConfig>, ContractError> {
    parse_yaml::<ToolsFile>(file, text)
        .map(|f| f.tools)
        .map_err(|source| ContractError::ToolsFile {
            file: file.to_string(),
            source,
        })
}

fn git(dir: &Path, args: &[&str]) -> Result<String, ContractError> {
    let out = Command::new("git")
        .arg("-C")
        .arg(dir)
        .args(args)
        .output()
        .map_err(|source| ContractError::GitUnavailable { source })?;
    if !out.status.success() {
        return Err(ContractError::Git(format!(
            "git {} failed: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        )));
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// Reads `tools/*.yaml` of the registry folder `dir` as it was at git revision `rev`.
pub fn tools_at_revision(dir: &Path, rev: &str) -> Result<Vec<ToolConfig>, ContractError> {
    let prefix = git(dir, &["rev-parse", "--show-prefix"])?
        .trim()
        .to_string();
    let tools_dir = format!("{prefix}tools/");
    let listing = git(
        dir,
        &[
            "ls-tree",
            "--full-tree",
            "--name-only",
            rev,
            "--",
            &tools_dir,
        ],
    )?;
    let mut out = Vec::new();
    for path in listing.lines().filter(|p| p.ends_with(".yaml")) {
        let text = git(dir, &["show", &format!("{rev}:{path}")])?;
        out.extend(parse_tools(&format!("{rev}:{path}"), &text)?);
    }
    Ok(out)
}

/// Compares the tools at a revision (`old`) with the tools now (`new`).
pub fn diff_registry(revision: &str, old: &[ToolConfig], new: &[ToolConfig]) -> RegistryDiff {
    let old: BTreeMap<&str, &ToolConfig> = old.iter().map(|t| (t.name.as_str(), t)).collect();
    let new: BTreeMap<&str, &ToolConfig> = new.iter().map(|t| (t.name.as_str(), t)).collect();
    let names: BTreeSet<&str> = old.keys().chain(new.keys()).copied().collect();
    let mut tools = Vec::new();
    for name in names {
        match (old.get(name), new.get(name)) {
            (Some(a), Some(b)) => {
                let changes = diff_tool_config(a, b);
                if changes.is_empty() && a.version == b.version {
                    continue;
                }
                let behaviour: Vec<&str> = BEHAVIOUR_FIELDS
                    .iter()
                    .copied()
                    .filter(|f| {
                        changes
                            .iter()
                            .any(|c| c.path == *f || c.path.starts_with(&format!("{f}.")))
                    })
                    .collect();
                let failure = (!behaviour.is_empty() && a.version == b.version).then(|| {
                    format!(
                        "{} changed but version is still {}: bump `version` (any change of behaviour is a new version)",
                        behaviour.join(", "),
                        b.version
                    )
                });
                tools.push(RegistryToolDiff {
                    name: name.to_string(),
                    owner: b.owner.clone(),
                    old_version: Some(a.version.clone()),
                    new_version: Some(b.version.clone()),
                    changes,
                    failure,
                });
            }
            (None, Some(b)) => tools.push(RegistryToolDiff {
                name: name.to_string(),
                owner: b.owner.clone(),
                old_version: None,
                new_version: Some(b.version.clone()),
                changes: vec![Change {
                    path: "(tool)".into(),
                    label: DiffLabel::Widening,
                    message: "new tool".into(),
                }],
                failure: None,
            }),
            (Some(a), None) => tools.push(RegistryToolDiff {
                name: name.to_string(),
                owner: a.owner.clone(),
                old_version: Some(a.version.clone()),
                new_version: None,
                changes: vec![Change {
                    path: "(tool)".into(),
                    label: DiffLabel::Breaking,
                    message: "tool removed: calls to it now fail".into(),
                }],
                failure: None,
            }),
            (None, None) => {}
        }
    }
    RegistryDiff {
        revision: revision.to_string(),
        tools,
    }
}

fn rank(v: Option<&Value>, order: &[&str]) -> Option<usize> {
    v.and_then(Value::as_str)
        .and_then(|s| order.iter().position(|o| *o == s))
}

/// Every labelled change between two declarations of one registry tool.
pub fn diff_tool_config(old: &ToolConfig, new: &ToolConfig) -> Vec<Change> {
    let a = serde_json::to_value(old).expect("a tool config serialises");
    let b = serde_json::to_value(new).expect("a tool config serialises");
    let (a, b) = (a.as_object().unwrap(), b.as_object().unwrap());
    let mut out = Vec::new();
    let keys: BTreeSet<&str> = a.keys().chain(b.keys()).map(String::as_str).collect();
    for key in keys {
        let (x, y) = (a.get(key), b.get(key));
        if x == y || key == "version" || key == "name" {
            continue;
        }
        let up_is_wider = |order: &[&str], out: &mut Vec<Change>, what: &str| {
            let (label, dir) = match (rank(x, order), rank(y, order)) {
                (Some(i), Some(j)) if j > i => (DiffLabel::Widening, "raised"),
                _ => (DiffLabel::Breaking, "lowered"),
            };
            push(
                out,
                key,
                label,
                format!("{what} {dir}: {} -> {}", show(x), show(y)),
            );
        };
        match key {
            "description" => push(
                &mut out,
                key,
                DiffLabel::Description,
                format!("text changed from {} to {}", show(x), show(y)),
            ),
            "owner" => push(
                &mut out,
                key,
                DiffLabel::Description,
                format!("owner changed from {} to {}", show(x), show(y)),
            ),
            "input_schema" | "output_schema" => diff_schema(
                key,
                x.unwrap_or(&Value::Bool(true)),
                y.unwrap_or(&Value::Bool(true)),
                &mut out,
            ),
            "annotations" => {
                let start = out.len();
                diff_annotations(x, y, &mut out);
                for c in &mut out[start..] {
                    c.message =
                        format!("{} (the registry's effect stays authoritative)", c.message);
                }
            }
            "effect" => up_is_wider(&["read", "write", "irreversible"], &mut out, "effect"),
            "tier" => up_is_wider(&["read", "act", "spend"], &mut out, "tier"),
            "sensitivity" => up_is_wider(
                &["public", "internal", "confidential", "restricted"],
                &mut out,
                "sensitivity",
            ),
            "gate" => {
                let label = if y.and_then(Value::as_str) == Some("never") {
                    DiffLabel::Widening
                } else {
                    DiffLabel::Breaking
                };
                push(
                    &mut out,
                    key,
                    label,
                    format!("gate {} -> {}", show(x), show(y)),
                );
            }
            "approvers" => {
                let (i, j) = (x.and_then(Value::as_u64), y.and_then(Value::as_u64));
                let label = if j < i {
                    DiffLabel::Widening
                } else {
                    DiffLabel::Breaking
                };
                push(
                    &mut out,
                    key,
                    label,
                    format!("approvers {} -> {}", show(x), show(y)),
                );
            }
            "rate_limit" => {
                let (i, j) = (x.and_then(Value::as_u64), y.and_then(Value::as_u64));
                let label = match (i, j) {
                    (Some(_), None) => DiffLabel::Widening,
                    (Some(i), Some(j)) if j > i => DiffLabel::Widening,
                    _ => DiffLabel::Breaking,
                };
                push(
                    &mut out,
                    key,
                    label,
                    format!("rate_limit {} -> {}", show(x), show(y)),
                );
            }
            "roles" | "purposes" | "scopes" => {
                set_change(&mut out, key, x, y, "more callers or uses")
            }
            "redact" => {
                let (old, new) = (strings(x), strings(y));
                for f in old.difference(&new) {
                    push(
                        &mut out,
                        key,
                        DiffLabel::Widening,
                        format!("'{f}' no longer redacted in the audit log"),
                    );
                }
                for f in new.difference(&old) {
                    push(
                        &mut out,
                        key,
                        DiffLabel::Breaking,
                        format!("'{f}' now redacted in the audit log"),
                    );
                }
            }
            "identity" => push(
                &mut out,
                key,
                DiffLabel::Breaking,
                format!(
                    "identity fields {} -> {}: idempotency keys of direct calls change, so an earlier call is no longer recognised",
                    show(x),
                    show(y)
                ),
            ),
            "compensate" | "reconcile" | "reconcile_query" | "compensate_with" => {
                let label = if y.is_none_or(Value::is_null) {
                    DiffLabel::Widening
                } else {
                    DiffLabel::Breaking
                };
                push(
                    &mut out,
                    key,
                    label,
                    format!("{key} {} -> {}", show(x), show(y)),
                );
            }
            "handler" => push(
                &mut out,
                key,
                DiffLabel::Widening,
                format!(
                    "handler changed from {} to {}: different code now runs the tool",
                    show(x),
                    show(y)
                ),
            ),
            "destinations" => destinations_change(&mut out, x, y),
            other => push(
                &mut out,
                other,
                DiffLabel::Widening,
                format!(
                    "changed from {} to {} (not classified; reviewed as widening)",
                    show(x),
                    show(y)
                ),
            ),
        }
    }
    out
}

fn strings(v: Option<&Value>) -> BTreeSet<String> {
    v.and_then(Value::as_array)
        .map(|a| {
            a.iter()
                .filter_map(Value::as_str)
                .map(str::to_string)
                .collect()
        })
        .unwrap_or_default()
}

fn set_change(out: &mut Vec<Change>, key: &str, x: Option<&Value>, y: Option<&Value>, wider: &str) {
    let (old, new) = (strings(x), strings(y));
    let added: Vec<&String> = new.difference(&old).collect();
    let removed: Vec<&String> = old.difference(&new).collect();
    if !added.is_empty() {
        push(
            out,
            key,
            DiffLabel::Widening,
            format!(
                "added {}: {wider}",
                added
                    .iter()
                    .map(|s| s.as_str())
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
        );
    }
    if !removed.is_empty() {
        push(
            out,
            key,
            DiffLabel::Breaking,
            format!(
                "removed {}",
                removed
                    .iter()
                    .map(|s| s.as_str())
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
        );
    }
}

fn destinations_change(out: &mut Vec<Change>, x: Option<&Value>, y: Option<&Value>) {
    let by_field = |v: Option<&Value>| -> BTreeMap<String, Value> {
        v.and_then(Value::as_array)
            .map(|a| {
                a.iter()
                    .map(|d| {
                        (
                            d.get("field")
                                .and_then(Value::as_str)
                                .unwrap_or("")
                                .to_string(),
                            d.clone(),
                        )
                    })
                    .collect()
            })
            .unwrap_or_default()
    };
    let (old, new) = (by_field(x), by_field(y));
    let fields: BTreeSet<&String> = old.keys().chain(new.keys()).collect();
    for f in fields {
        let at = format!("destinations.{f}");
        match (old.get(f), new.get(f)) {
            (Some(a), Some(b)) if a == b => {}
            (Some(a), Some(b)) => {
                let (oa, na) = (strings(a.get("allowed")), strings(b.get("allowed")));
                for v in na.difference(&oa) {
                    push(
                        out,
                        &at,
                        DiffLabel::Widening,
                        format!("allowlist loosened: '{v}' added"),
                    );
                }
                for v in oa.difference(&na) {
                    push(
                        out,
                        &at,
                        DiffLabel::Breaking,
                        format!("allowlist narrowed: '{v}' removed"),
                    );
                }
                // `unknown: gate` lets a person pass what was refused: wider; back to refuse:
                // narrower.
                if a.get("unknown") != b.get("unknown") {
                    let gated = b.get("unknown").and_then(Value::as_str) == Some("gate");
                    push(
                        out,
                        &at,
                        if gated {
                            DiffLabel::Widening
                        } else {
                            DiffLabel::Breaking
                        },
                        format!(
                            "a value off the list is now {}",
                            if gated {
                                "sent to a person instead of refused"
                            } else {
                                "refused instead of sent to a person"
                            }
                        ),
                    );
                }
                for k in ["kind", "lookup"] {
                    if a.get(k) != b.get(k) {
                        push(
                            out,
                            &at,
                            DiffLabel::Widening,
                            format!("{k} changed from {} to {}", show(a.get(k)), show(b.get(k))),
                        );
                    }
                }
            }
            (Some(_), None) => push(
                out,
                &at,
                DiffLabel::Widening,
                format!("destination check on '{f}' removed: any value passes now"),
            ),
            (None, Some(_)) => push(
                out,
                &at,
                DiffLabel::Breaking,
                format!("destination check on '{f}' added"),
            ),
            (None, None) => {}
        }
    }
}
