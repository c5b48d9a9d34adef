//! `toolgate.lock`: per upstream server, what was reviewed and who approved it. YAML, so a pin
//! change is a readable diff in a pull request; read strictly (unknown fields refused, every
//! stored hash re-computed from the stored definition), and every error names its exact path.

use std::collections::BTreeMap;
use std::path::Path;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::ContractError;
use crate::definition::{
    DefinitionHash, ServerFacts, ServerIdentity, definition_hash, instructions_hash,
};

/// The only lockfile format version this build reads and writes.
pub const LOCKFILE_VERSION: u32 = 1;

const HEADER: &str = "\
# toolgate.lock: pinned upstream tool definitions. Generated; review changes in pull requests.
# A tool whose definition hash differs from its pin is blocked until someone runs
# `toolgate lock diff` and `toolgate lock approve SERVER [TOOL]`.
";

/// Who approved a pin, and when (RFC 3339, UTC).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Approval {
    pub by: String,
    pub at: String,
}

/// One reviewed tool definition.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ToolPin {
    /// The hash of `definition` (checked on load).
    pub sha256: DefinitionHash,
    pub approved: Approval,
    /// The whole definition as the server sent it, so a later diff can say what moved.
    pub definition: Value,
}

impl ToolPin {
    pub fn new(definition: Value, approved: Approval) -> Self {
        ToolPin {
            sha256: definition_hash(&definition),
            approved,
            definition,
        }
    }
}

/// The server half of a pin: what `initialize` said.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ServerInfoPin {
    pub name: String,
    pub version: String,
}

/// One upstream server as reviewed.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ServerPin {
    pub identity: ServerIdentity,
    pub server: ServerInfoPin,
    pub protocol_version: String,
    /// Hash of the server's `instructions` (of the empty string when it sent none).
    pub instructions_sha256: String,
    /// The instructions text itself, so a change can be shown.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub instructions: Option<String>,
    pub approved: Approval,
    #[serde(default)]
    pub tools: BTreeMap<String, ToolPin>,
}

impl ServerPin {
    /// Pins a server and every tool it listed, all approved by `approved`.
    pub fn new(
        identity: ServerIdentity,
        facts: &ServerFacts,
        tools: &[Value],
        approved: Approval,
    ) -> Self {
        let tools = tools
            .iter()
            .map(|t| {
                (
                    tool_name(t).to_string(),
                    ToolPin::new(t.clone(), approved.clone()),
                )
            })
            .collect();
        ServerPin {
            identity,
            server: ServerInfoPin {
                name: facts.name.clone(),
                version: facts.version.clone(),
            },
            protocol_version: facts.protocol_version.clone(),
            instructions_sha256: facts.instructions_hash(),
            instructions: facts.instructions.clone(),
            approved,
            tools,
        }
    }

    /// The facts this pin recorded, in the shape a live server reports them.
    pub fn facts(&self) -> ServerFacts {
        ServerFacts {
            name: self.server.name.clone(),
            version: self.server.version.clone(),
            protocol_version: self.protocol_version.clone(),
            instructions: self.instructions.clone(),
        }
    }
}

/// The name of a tool definition (`""` when it has none, which no server may send).
pub fn tool_name(tool: &Value) -> &str {
    tool.get("name").and_then(Value::as_str).unwrap_or("")
}

/// The whole lockfile.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Lockfile {
    pub version: u32,
    #[serde(default)]
    pub servers: BTreeMap<String, ServerPin>,
}

impl Default for Lockfile {
    fn default() -> Self {
        Lockfile {
            version: LOCKFILE_VERSION,
            servers: BTreeMap::new(),
        }
    }
}

impl Lockfile {
    /// Reads a lockfile; a missing file is an empty lockfile (nothing approved yet).
    pub fn read(path: &Path) -> Result<Lockfile, ContractError> {
        if !path.exists() {
            return Ok(Lockfile::default());
        }
        let text = std::fs::read_to_string(path).map_err(|source| ContractError::Io {
            file: path.display().to_string(),
            doing: "cannot read: ",
            source,
        })?;
        Lockfile::parse(&path.display().to_string(), &text)
    }

    /// Parses lockfile text; `file` names it in errors.
    pub fn parse(file: &str, text: &str) -> Result<Lockfile, ContractError> {
        let err = |path: &str, message: String| ContractError::Lockfile {
            file: file.to_string(),
            path: path.to_string(),
            message,
        };
        let value: Value = yaml_serde::from_str(text)
            .map_err(|e| err("(top level)", format!("not valid YAML: {e}")))?;
        let lock: Lockfile = serde_path_to_error::deserialize(value).map_err(|e| {
            let p = e.path().to_string();
            let p = if p == "." {
                "(top level)".to_string()
            } else {
                p
            };
            err(&p, e.into_inner().to_string())
        })?;
        if lock.version != LOCKFILE_VERSION {
            return Err(err(
                "version",
                format!(
                    "lockfile version {} is not supported; this toolgate reads version {LOCKFILE_VERSION}",
                    lock.version
                ),
            ));
        }
        for (server, pin) in &lock.servers {
            if let Some(text) = &pin.instructions
                && instructions_hash(Some(text)) != pin.instructions_sha256
            {
                return Err(err(
                    &format!("servers.{server}.instructions_sha256"),
                    "does not match the stored instructions; the lockfile was edited by hand: \
                     re-approve the server with `toolgate lock approve`"
                        .into(),
                ));
            }
            for (name, tool) in &pin.tools {
                let at = format!("servers.{server}.tools.{name}");
                if tool_name(&tool.definition) != name {
                    return Err(err(
                        &format!("{at}.definition.name"),
                        format!(
                            "the stored definition is named '{}', not '{name}'",
                            tool_name(&tool.definition)
                        ),
                    ));
                }
                let actual = definition_hash(&tool.definition);
                if actual != tool.sha256 {
                    return Err(err(
                        &format!("{at}.sha256"),
                        format!(
                            "is {} but the stored definition hashes to {actual}; the lockfile was \
                             edited by hand: re-approve with `toolgate lock approve {server} {name}`",
                            tool.sha256
                        ),
                    ));
                }
            }
        }
        Ok(lock)
    }

    /// The lockfile as text, with its header comment.
    pub fn render(&self) -> String {
        let body = yaml_serde::to_string(self).expect("a lockfile always serialises");
        format!("{HEADER}{body}")
    }

    /// Writes the lockfile (whole file, replaced atomically through a temporary beside it).
    pub fn write(&self, path: &Path) -> Result<(), ContractError> {
        let tmp = path.with_extension("lock.tmp");
        let io = |source: std::io::Error| ContractError::Io {
            file: path.display().to_string(),
            doing: "cannot write: ",
            source,
        };
        std::fs::write(&tmp, self.render()).map_err(io)?;
        std::fs::rename(&tmp, path).map_err(io)
    }
}

impl Lockfile {
    /// Moves a pinned server to a new address without re-approving it: only its identity is
    /// replaced. Its `initialize` name and version, its instructions and every tool definition
    /// stay pinned and are still checked. For test environments that serve a reviewed upstream
    /// on a loopback URL instead of the command the lockfile was written for; returns whether
    /// `server` was pinned.
    pub fn rehome(&mut self, server: &str, identity: ServerIdentity) -> bool {
        match self.servers.get_mut(server) {
            Some(pin) => {
                pin.identity = identity;
                true
            }
            None => false,
        }
    }

    /// Re-pins after review. Without `tool`: the server's identity, `initialize` facts and every
    /// listed tool (a tool whose definition did not change keeps its earlier approval; tools no
    /// longer listed are dropped). With `tool`: only that tool, and only on a server whose own
    /// pin still holds. Returns one line per pin written.
    pub fn approve(
        &mut self,
        server: &str,
        identity: &ServerIdentity,
        facts: &ServerFacts,
        tools: &[Value],
        tool: Option<&str>,
        approval: &Approval,
    ) -> Result<Vec<String>, ContractError> {
        let mut done = Vec::new();
        match tool {
            None => {
                let mut pin = ServerPin::new(identity.clone(), facts, tools, approval.clone());
                let old = self.servers.get(server);
                if let Some(old) = old
                    && old.identity == pin.identity
                    && old.server == pin.server
                    && old.instructions_sha256 == pin.instructions_sha256
                {
                    pin.approved = old.approved.clone();
                } else {
                    done.push(format!(
                        "pinned server {server}: {} {} ({})",
                        facts.name,
                        facts.version,
                        identity.describe()
                    ));
                }
                for (name, t) in pin.tools.iter_mut() {
                    match old.and_then(|o| o.tools.get(name)) {
                        Some(prev) if prev.sha256 == t.sha256 => t.approved = prev.approved.clone(),
                        _ => done.push(format!("pinned {server}/{name} {}", t.sha256)),
                    }
                }
                if let Some(old) = old {
                    for name in old.tools.keys().filter(|n| !pin.tools.contains_key(*n)) {
                        done.push(format!("dropped {server}/{name} (no longer listed)"));
                    }
                }
                self.servers.insert(server.to_string(), pin);
            }
            Some(name) => {
                let Some(pin) = self.servers.get_mut(server) else {
                    return Err(ContractError::Refused(format!(
                        "server '{server}' is not pinned yet: review `toolgate lock diff {server}` \
                         and approve the whole server with `toolgate lock approve {server}`"
                    )));
                };
                if pin.identity != *identity
                    || pin.server.name != facts.name
                    || pin.server.version != facts.version
                    || pin.instructions_sha256 != facts.instructions_hash()
                {
                    return Err(ContractError::Refused(format!(
                        "server '{server}' itself changed (identity, version or instructions): \
                         approve it as a whole with `toolgate lock approve {server}`"
                    )));
                }
                match tools.iter().find(|t| tool_name(t) == name) {
                    Some(def) => {
                        let t = ToolPin::new(def.clone(), approval.clone());
                        if pin.tools.get(name).map(|p| &p.sha256) != Some(&t.sha256) {
                            done.push(format!("pinned {server}/{name} {}", t.sha256));
                            pin.tools.insert(name.to_string(), t);
                        }
                    }
                    None if pin.tools.remove(name).is_some() => {
                        done.push(format!("dropped {server}/{name} (no longer listed)"));
                    }
                    None => {
                        return Err(ContractError::Refused(format!(
                            "server '{server}' lists no tool named '{name}'"
                        )));
                    }
                }
            }
        }
        Ok(done)
    }
}

impl Approval {
    /// An approval by `by` at the current UTC time.
    pub fn now(by: impl Into<String>) -> Approval {
        let secs = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_secs() as i64)
            .unwrap_or(0);
        Approval {
            by: by.into(),
            at: rfc3339_utc(secs),
        }
    }
}

/// Seconds since the Unix epoch as `YYYY-MM-DDTHH:MM:SSZ`.
pub fn rfc3339_utc(secs: i64) -> String {
    toolgate_core::Timestamp::from_millis(secs * 1000).to_rfc3339()
}

#[cfg(test)]
mod tests {
    use super::rfc3339_utc;

    #[test]
    fn rfc3339_of_known_instants() {
        assert_eq!(rfc3339_utc(0), "1970-01-01T00:00:00Z");
        assert_eq!(rfc3339_utc(951_782_400), "2000-02-29T00:00:00Z");
        assert_eq!(rfc3339_utc(1_796_000_000), "2026-11-30T00:53:20Z");
    }
}
