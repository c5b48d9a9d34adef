//! What is pinned: a tool's whole definition as the server sent it, hashed in canonical form, and
//! the facts that identify the server behind it. Hashing the whole object, not a chosen subset,
//! is the point: any field a model can read is a field an attacker can change.

use std::fmt;

use serde::{Deserialize, Serialize};
use serde_json::Value;
use toolgate_core::canon::{canonical, sha256_tagged};

/// `sha256:<hex>` of the RFC 8785 canonical JSON of one whole tool definition (name, title,
/// description, inputSchema, outputSchema, annotations, icons, `_meta`: every field).
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(transparent)]
pub struct DefinitionHash(String);

impl DefinitionHash {
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for DefinitionHash {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// Hashes a tool definition (a JSON object as in `tools/list`).
///
/// ```
/// use serde_json::json;
/// let a = json!({"name": "t", "inputSchema": {"type": "object", "properties": {}}});
/// let b = json!({"inputSchema": {"properties": {}, "type": "object"}, "name": "t"});
/// assert_eq!(toolgate_contract::definition_hash(&a), toolgate_contract::definition_hash(&b));
/// ```
pub fn definition_hash(tool: &Value) -> DefinitionHash {
    DefinitionHash(sha256_tagged(canonical(tool).as_bytes()))
}

/// A tool as rmcp parsed it, as the JSON object that is hashed and stored.
pub fn tool_value(tool: &rmcp::model::Tool) -> Value {
    serde_json::to_value(tool).expect("an rmcp tool always serialises")
}

/// `sha256:<hex>` of a server's instructions text (absent instructions hash as the empty string).
pub fn instructions_hash(instructions: Option<&str>) -> String {
    sha256_tagged(instructions.unwrap_or("").as_bytes())
}

/// How the gateway reaches a server: the command it spawns or the URL it connects to, and the
/// exact package version it was declared with.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ServerIdentity {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub command: Option<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub args: Vec<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub url: Option<String>,
    /// The exact package the server comes from (`name@1.2.3`), when known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub package: Option<String>,
}

impl ServerIdentity {
    pub fn from_upstream(cfg: &toolgate_core::config::UpstreamConfig) -> Self {
        ServerIdentity {
            command: cfg.command.clone(),
            args: cfg.args.clone(),
            url: cfg.url.clone(),
            package: Some(cfg.package.clone()),
        }
    }

    /// A one-line rendering for messages: the command line or the URL.
    pub fn describe(&self) -> String {
        match (&self.url, &self.command) {
            (Some(url), _) => url.clone(),
            (None, Some(cmd)) => std::iter::once(cmd.as_str())
                .chain(self.args.iter().map(String::as_str))
                .collect::<Vec<_>>()
                .join(" "),
            (None, None) => "(no command or url)".into(),
        }
    }
}

/// What a server said about itself in `initialize`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ServerFacts {
    pub name: String,
    pub version: String,
    pub protocol_version: String,
    pub instructions: Option<String>,
}

impl ServerFacts {
    pub fn from_peer_info(info: &rmcp::model::ServerPeerInfo) -> Self {
        let (name, version) = info
            .server_info
            .as_ref()
            .map(|i| (i.name.clone(), i.version.clone()))
            .unwrap_or_default();
        ServerFacts {
            name,
            version,
            protocol_version: info.protocol_version.to_string(),
            instructions: info.instructions.clone(),
        }
    }

    pub fn instructions_hash(&self) -> String {
        instructions_hash(self.instructions.as_deref())
    }
}
