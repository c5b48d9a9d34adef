//! The registry as the user writes it: one folder of YAML and Cedar files, reviewable in a pull
//! request. These types mirror the files exactly and refuse unknown fields; `registry` turns them
//! into checked types.

use std::collections::BTreeMap;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::error::CoreError;
use crate::model::{Effect, Gate, PrincipalKind, Sensitivity, Tier};

/// `toolgate.yaml`: the server, the store and the upstream servers.
#[derive(Debug, Clone, Default, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct GatewayFile {
    /// A human label for this registry; recorded with its content hash in every decision.
    #[serde(default)]
    #[schemars(example = &"finance-2026-11")]
    pub label: Option<String>,
    #[serde(default)]
    /// Where the gateway listens: the HTTP address and its public URL.
    pub server: ServerConfig,
    #[serde(default)]
    /// The database: SQLite (one file, the default) or PostgreSQL, and how durable a commit is.
    pub store: StoreConfig,
    #[serde(default)]
    #[schemars(example = serde_json::json!({"erp": {"command": "erp-mcp", "args": ["--stdio"], "package": "erp-mcp@2.4.1"}}))]
    /// The upstream MCP servers by name: a command to run over stdio or a streamable-HTTP URL, each pinned to an exact package version.
    pub upstreams: BTreeMap<String, UpstreamConfig>,
    #[serde(default)]
    /// How long an approval request stays open, and where the key that signs approval tokens comes from.
    pub approvals: ApprovalConfig,
    #[serde(default)]
    /// How long a completed call is replayed to a retry.
    pub idempotency: IdempotencyConfig,
    /// Where the key for redaction hashes comes from.
    #[serde(default)]
    pub redaction: RedactionConfig,
    /// The typed ontology of the domain, if it has one (a path relative to the folder).
    #[serde(default)]
    #[schemars(example = &"ontology.yaml")]
    pub ontology: Option<String>,
    /// What "the run so far" is for calls that name no run.
    #[serde(default, skip_serializing_if = "RunsConfig::is_default")]
    pub runs: RunsConfig,
    /// Who may read `/metrics`: the scrape token's source, and whether peers off this host may.
    #[serde(default, skip_serializing_if = "MetricsConfig::is_default")]
    pub metrics: MetricsConfig,
    /// Lint findings a person has reviewed and accepted, each with the reason and who accepted
    /// it. `toolgate check`, `serve` and reloads report them as warnings; an acceptance that no
    /// longer matches a finding is itself a finding (`accept.stale`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub accept: Vec<AcceptanceConfig>,
}

/// One accepted lint finding (`accept:` in toolgate.yaml), reviewed in the pull request like
/// any change of the registry.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct AcceptanceConfig {
    /// The lint rule accepted (`toolgate check --explain RULE` says what it finds).
    #[schemars(example = &"irreversible.unguarded")]
    pub rule: String,
    /// What the finding is about: a tool's name, a principal's id, or a policy's id (as
    /// `toolgate check` prints it after `subject`).
    #[schemars(example = &"bank.send_money")]
    pub subject: String,
    /// Where inside the subject, as `toolgate check` prints it (`input_schema.properties.memo`);
    /// unset, every finding of the rule on the subject is accepted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(example = &"input_schema.properties.subject")]
    pub at: Option<String>,
    /// Why the finding is acceptable here.
    #[schemars(example = &"the bank API has no lookup by key; every transfer above 100 EUR is gated by policy")]
    pub reason: String,
    /// Who accepted it (a CODEOWNERS handle or an email address).
    #[schemars(example = &"@acme/security")]
    pub by: String,
}

/// Runs of calls that name none (`_meta.run_id` absent): a principal's calls belong to its
/// current run while they keep coming; after `idle_minutes` without one, the next call starts a
/// new run. Sessions and reconnects do not matter, so per-run limits and run policies hold for
/// stateless clients and cannot be reset by reconnecting.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RunsConfig {
    #[serde(default = "default_idle_minutes")]
    #[schemars(example = 30)]
    /// Minutes without a call after which a principal's next call that names no run starts a new run (1 to 10080).
    pub idle_minutes: u32,
}

fn default_idle_minutes() -> u32 {
    30
}

impl Default for RunsConfig {
    fn default() -> Self {
        RunsConfig {
            idle_minutes: default_idle_minutes(),
        }
    }
}

impl RunsConfig {
    fn is_default(&self) -> bool {
        *self == RunsConfig::default()
    }
}

#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ServerConfig {
    /// Address for streamable HTTP; loopback unless the operator says otherwise.
    #[serde(default = "default_http")]
    #[schemars(example = &"127.0.0.1:8480")]
    pub http: String,
    /// Public base URL of the MCP endpoint, used in OAuth protected-resource metadata.
    #[serde(default)]
    #[schemars(example = &"https://gateway.example.com/mcp")]
    pub public_url: Option<String>,
}

fn default_http() -> String {
    "127.0.0.1:8480".to_string()
}

impl Default for ServerConfig {
    fn default() -> Self {
        ServerConfig {
            http: default_http(),
            public_url: None,
        }
    }
}

#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct StoreConfig {
    /// `sqlite://path` (the embedded default) or `postgres://…`.
    #[serde(default = "default_store_url")]
    #[schemars(example = &"sqlite://toolgate.db")]
    pub url: String,
    /// SQLite only: `serve` and `worker` grow the WAL file to this size (MiB) in the background
    /// at start, so commits overwrite blocks already on disk rather than extend the file, whose
    /// fsync costs several times more. The default covers the length at which the WAL starts
    /// over (4,096 pages of 4 KiB, with frame headers) twice over; 0 turns it off.
    #[serde(default = "default_wal_preallocate_mb")]
    #[schemars(example = 40)]
    pub wal_preallocate_mb: u64,
    /// What an acknowledged call's outcome and audit record survive. `fsync` (the default): a
    /// power loss or an OS crash. `process`: the gateway process being killed, not a power
    /// loss; commits are not flushed to the disk one by one (SQLite: WAL with `synchronous =
    /// NORMAL`; PostgreSQL: `synchronous_commit = off`, so a crash of the database server
    /// loses its last fraction of a second too).
    #[serde(default)]
    #[schemars(example = &"fsync")]
    pub durability: Durability,
}

/// See [`StoreConfig::durability`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum Durability {
    /// Every acknowledged record is flushed to the disk before the call returns.
    #[default]
    Fsync,
    /// Written to the operating system (SQLite) or the database server (PostgreSQL) before the
    /// call returns, flushed later: survives the gateway being killed, not a power loss.
    Process,
}

impl Durability {
    const ALL: [Durability; 2] = [Durability::Fsync, Durability::Process];

    /// The name in toolgate.yaml.
    pub fn as_str(self) -> &'static str {
        match self {
            Durability::Fsync => "fsync",
            Durability::Process => "process",
        }
    }
}

impl std::str::FromStr for Durability {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Durability::ALL
            .into_iter()
            .find(|d| d.as_str() == s)
            .ok_or_else(|| format!("durability '{s}' is not one of: fsync (the default), process"))
    }
}

fn default_store_url() -> String {
    "sqlite://toolgate.db".to_string()
}

fn default_wal_preallocate_mb() -> u64 {
    40
}

impl Default for StoreConfig {
    fn default() -> Self {
        StoreConfig {
            url: default_store_url(),
            wal_preallocate_mb: default_wal_preallocate_mb(),
            durability: Durability::default(),
        }
    }
}

/// An upstream MCP server: a child process over stdio, or a streamable-HTTP URL.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct UpstreamConfig {
    #[serde(default)]
    #[schemars(example = &"npx")]
    /// The command that starts a stdio upstream (with `args`); or give `url`.
    pub command: Option<String>,
    #[serde(default)]
    #[schemars(example = ["-y", "@modelcontextprotocol/server-everything@2026.8.31"])]
    /// Arguments of `command`.
    pub args: Vec<String>,
    /// Names of environment variables passed through to the child; values are never in the file.
    #[serde(default)]
    #[schemars(example = ["GITHUB_TOKEN"])]
    pub env: Vec<String>,
    #[serde(default)]
    #[schemars(example = &"http://127.0.0.1:9000/mcp")]
    /// A streamable-HTTP upstream's MCP endpoint; or give `command`.
    pub url: Option<String>,
    /// The exact package version this upstream is pinned to (`name@1.2.3`).
    #[schemars(example = &"@modelcontextprotocol/server-everything@2026.8.31")]
    pub package: String,
    /// Seconds before a call to this upstream is a timeout.
    #[serde(default = "default_timeout")]
    #[schemars(example = 30.0)]
    pub timeout_secs: f64,
    /// Streamable HTTP only: keep the connections of toolgate's MCP client to the upstream
    /// (`initialize`, `tools/list`, prompts, resources) open and reuse them, instead of one new
    /// TCP connection per request (rmcp's default). Governed tool calls always go over kept
    /// connections of their own, which acknowledge at once and so never wait on the upstream's
    /// Nagle algorithm. Turn this on only for an upstream that sets `TCP_NODELAY` on its
    /// connections (Node's and Python's HTTP servers do; an rmcp server behind a plain
    /// `axum::serve` does not): otherwise a reused connection waits for delayed ACKs, about 40 ms
    /// a request.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    #[schemars(example = false)]
    pub keep_alive: bool,
    /// The upstream's prompts agents may list and get, by name; no other prompt passes through.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(example = ["simple_prompt"])]
    pub prompts: Vec<String>,
    /// The upstream's resources agents may list and read, by exact URI; no other passes through.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(example = ["demo://resource/static/document/architecture.md"])]
    pub resources: Vec<String>,
}

fn default_timeout() -> f64 {
    30.0
}

/// Approvals: how long a request stays open, and the key that signs approval tokens. The key
/// is read from the environment variable `key_env`, or from `key_file` when that is set; a
/// process that signs or verifies tokens refuses to start without one (unless `--dev`). See
/// docs/keys.md.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ApprovalConfig {
    /// How long an approval request stays open (hours).
    #[serde(default = "default_expiry")]
    #[schemars(example = 72)]
    pub expiry_hours: i64,
    /// The id of the current MAC key; tokens name it so keys can rotate.
    #[serde(default = "default_key_id")]
    #[schemars(example = &"k1")]
    pub key_id: String,
    /// Environment variable holding the current key (at least 32 bytes: `toolgate key secret`).
    #[serde(default = "default_key_env")]
    #[schemars(example = &"TOOLGATE_APPROVAL_KEY")]
    pub key_env: String,
    /// A file holding the current key, relative to the registry folder; read instead of
    /// `key_env` when set. It must not be readable by every user. Surrounding whitespace is
    /// ignored.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(example = &"keys/approval.key")]
    pub key_file: Option<String>,
    /// Keys that no longer sign but still verify the tokens they signed, each under the id
    /// those tokens name (keep one until its tokens have expired: `expiry_hours`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub previous: Vec<PreviousKey>,
    /// Who approves the calls each `@gate` policy gates (by its @id), and how many.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub gates: BTreeMap<String, crate::approvers::GateApprovers>,
    /// Webhooks told when a request is raised, by a name of your choosing (kept with each
    /// delivery, so the URL itself is never stored): each for the requests of some `@gate`
    /// rules or of some approver roles, or for every request. Each gets one JSON post per
    /// request, with a Slack-compatible `text` and a link to the item; a failed post is
    /// retried with backoff and shown by `toolgate status` and `/metrics`; the call parks
    /// whatever the webhook does.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    #[schemars(example = serde_json::json!({"ap-desk": {"url_env": "AP_DESK_WEBHOOK", "roles": ["ap.clerk"]}}))]
    pub notify: BTreeMap<String, crate::approvers::NotifyWebhook>,
}

/// A retired key, kept for verification only: its id and where to read it (`env` or `file`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct PreviousKey {
    /// The key id the tokens it signed name (the `key_id` it had when it signed).
    #[schemars(example = &"k1")]
    pub id: String,
    /// Environment variable holding the key.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(example = &"TOOLGATE_APPROVAL_KEY_K1")]
    pub env: Option<String>,
    /// A file holding the key, relative to the registry folder.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(example = &"keys/approval-k1.key")]
    pub file: Option<String>,
}

fn default_expiry() -> i64 {
    72
}
fn default_key_id() -> String {
    "k1".to_string()
}
fn default_key_env() -> String {
    "TOOLGATE_APPROVAL_KEY".to_string()
}

impl Default for ApprovalConfig {
    fn default() -> Self {
        ApprovalConfig {
            expiry_hours: default_expiry(),
            key_id: default_key_id(),
            key_env: default_key_env(),
            key_file: None,
            previous: Vec::new(),
            gates: BTreeMap::new(),
            notify: BTreeMap::new(),
        }
    }
}

#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct IdempotencyConfig {
    /// How long a completed key is replayed (hours); never shorter than the approval expiry.
    #[serde(default = "default_retention")]
    #[schemars(example = 24)]
    pub retention_hours: i64,
}

fn default_retention() -> i64 {
    24
}

impl Default for IdempotencyConfig {
    fn default() -> Self {
        IdempotencyConfig {
            retention_hours: default_retention(),
        }
    }
}

/// The key of the keyed hashes that replace redacted fields in the audit log: from the
/// environment variable `key_env`, or from `key_file` when that is set. There is no list of
/// previous keys: hashes are always made with the current key, and each names the key it was
/// made with (`hmac:<key id>:…`), so hashes made before a rotation are not compared with
/// hashes made after it. See docs/keys.md.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RedactionConfig {
    /// Environment variable holding the key for redaction hashes (at least 32 bytes).
    #[serde(default = "default_redaction_env")]
    #[schemars(example = &"TOOLGATE_REDACTION_KEY")]
    pub key_env: String,
    /// A file holding the key, relative to the registry folder; read instead of `key_env`
    /// when set. It must not be readable by every user.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(example = &"keys/redaction.key")]
    pub key_file: Option<String>,
}

fn default_redaction_env() -> String {
    "TOOLGATE_REDACTION_KEY".to_string()
}

impl Default for RedactionConfig {
    fn default() -> Self {
        RedactionConfig {
            key_env: default_redaction_env(),
            key_file: None,
        }
    }
}

/// `tools/*.yaml`: one file per tool family.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ToolsFile {
    /// The tools of this family, each a complete declaration.
    pub tools: Vec<ToolConfig>,
}

/// One tool as declared. Every field is part of the contract and reviewed as such.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ToolConfig {
    #[schemars(example = &"invoice.pay")]
    /// The tool's name as agents see it in `tools/list` (unique in the registry).
    pub name: String,
    /// Bumped on any change of behaviour (`toolgate registry diff` enforces it).
    #[schemars(example = &"1.2.0")]
    pub version: String,
    /// Who reviews changes: a CODEOWNERS handle such as `@acme/billing-platform`.
    #[schemars(example = &"@acme/billing-platform")]
    pub owner: String,
    #[schemars(example = &"Pay one approved supplier invoice.")]
    /// What the tool does, as agents see it in `tools/list`. Reviewed like code: descriptions are a poisoning channel.
    pub description: String,
    #[schemars(example = &"irreversible")]
    pub effect: Effect,
    #[schemars(example = &"spend")]
    pub tier: Tier,
    #[schemars(example = &"confidential")]
    pub sensitivity: Sensitivity,
    #[serde(default)]
    #[schemars(example = ["payments"])]
    /// The scopes a grant must hold (all of them, for the call's purpose) to use this tool.
    pub scopes: Vec<String>,
    /// The purposes this tool may be used for at all; a call naming another purpose is refused.
    #[schemars(example = ["billing"])]
    pub purposes: Vec<String>,
    /// The roles whose `tools/list` shows this tool.
    #[schemars(example = ["worker.finance"])]
    pub roles: Vec<String>,
    #[serde(default)]
    #[schemars(example = &"never")]
    pub gate: Gate,
    /// How many distinct people must approve a gated call (1 or 2).
    #[serde(default = "one")]
    #[schemars(example = 1)]
    pub approvers: u8,
    /// Who may approve its gated calls (roles, people); unset: any person of an approver role.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub approved_by: Option<crate::approvers::ApprovedBy>,
    /// Read-tool lookups shown beside a parked call's inputs on the approval page.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub approval_context: Vec<crate::approvers::ContextLookup>,
    /// Calls of this tool allowed per run.
    #[serde(default)]
    #[schemars(example = 5)]
    pub rate_limit: Option<u32>,
    /// Input fields that identify the operation; they, not free text, derive a direct call's key.
    #[serde(default)]
    #[schemars(example = ["invoice_id", "amount"])]
    pub identity: Vec<String>,
    #[serde(default)]
    /// Constraints on inputs that choose where data or money goes, enforced against data at call time (check 5).
    pub destinations: Vec<DestinationConfig>,
    /// Input or output fields stored as keyed hashes in the audit log.
    #[serde(default)]
    #[schemars(example = ["iban"])]
    pub redact: Vec<String>,
    /// The tool that undoes a `write`.
    #[serde(default)]
    #[schemars(example = &"note.discard")]
    pub compensate: Option<String>,
    /// The read tool that asks the target, by idempotency key, whether an `irreversible` call landed.
    #[serde(default)]
    #[schemars(example = &"invoice.lookup")]
    pub reconcile: Option<String>,
    /// For an `irreversible` tool whose target has no lookup by key: a read that lists what the
    /// target did (recent transactions, say), asked with arguments derived from the call's
    /// inputs; an item whose `match` fields equal the call's inputs means the call landed.
    /// Recovery asks it to settle a call left `unknown`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reconcile_query: Option<ReconcileQueryConfig>,
    /// "Compensate with the same tool and the previous values": before each call, this read
    /// tool is asked for the values the call will change; they are stored with the step, and
    /// aborting the run calls this same tool with them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub compensate_with: Option<CompensateWithConfig>,
    #[schemars(example = serde_json::json!({"upstream": "erp", "tool": "schedule_payment"}))]
    pub handler: HandlerConfig,
    #[schemars(example = serde_json::json!({"type": "object", "additionalProperties": false, "required": ["invoice_id", "amount"], "properties": {"invoice_id": {"type": "string", "pattern": "^INV-[0-9]{4,8}$"}, "amount": {"type": "number", "exclusiveMinimum": 0, "maximum": 50000}}}))]
    /// The closed JSON Schema (draft 2020-12) of the tool's inputs, enforced before anything else: `type: object`, `additionalProperties: false`, every field bounded.
    pub input_schema: Value,
    #[serde(default)]
    #[schemars(example = serde_json::json!({"type": "object", "properties": {"payment_id": {"type": "string"}}}))]
    /// The JSON Schema of the tool's structured result, if it has one (listed to clients; `redact` may name its fields).
    pub output_schema: Option<Value>,
    /// MCP annotations, if the author sets them; checked against the effect, never trusted over it.
    #[serde(default)]
    #[schemars(example = serde_json::json!({"destructiveHint": true}))]
    pub annotations: Option<AnnotationsConfig>,
    /// Sums and counts of this tool's calls over a sliding window, per principal (and per key).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub window_budgets: Vec<WindowBudgetConfig>,
    /// Preview, then commit: the gateway lists `<name>.preview` (these inputs, does
    /// nothing, returns a plan id, its hash and expiry) and `<name>` taking only `plan_id`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(example = serde_json::json!({"expires_secs": 3600}))]
    pub preview: Option<PreviewConfig>,
    /// Which of the call's purpose and reason the listed tool asks for as ordinary arguments,
    /// for clients that send no `_meta` (toolgate checks, records and strips them before the
    /// call is forwarded). Unset: `reason` when the tool changes state and `reason_from` is
    /// not set, and `purpose` when the caller may use the tool for more than one purpose and
    /// has no default for it. `[]`: neither is listed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(example = ["purpose", "reason"])]
    pub ask: Option<Vec<CallField>>,
    /// An input of the tool's own that is also the call's reason (it stays in the inputs and
    /// is forwarded), for tools whose upstream takes a reason or memo of its own.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(example = &"memo")]
    pub reason_from: Option<String>,
    /// Length bounds, in characters, of the `reason` argument toolgate lists (default 10–500).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(example = serde_json::json!({"min": 10, "max": 500}))]
    pub reason_length: Option<LengthBounds>,
    /// How far a direct call's idempotency key reaches, whether a read replays, and for how long.
    #[serde(default, skip_serializing_if = "ToolIdempotency::is_default")]
    #[schemars(example = serde_json::json!({"scope": "registry"}))]
    pub idempotency: ToolIdempotency,
}

/// A field of toolgate's own that a tool may list as an argument.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum CallField {
    Purpose,
    Reason,
}

impl CallField {
    /// The argument's name in the listed schema.
    pub fn as_str(self) -> &'static str {
        match self {
            CallField::Purpose => "purpose",
            CallField::Reason => "reason",
        }
    }
}

/// Inclusive length bounds, in characters.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct LengthBounds {
    #[schemars(example = 10)]
    /// The fewest characters.
    pub min: u32,
    #[schemars(example = 500)]
    /// The most characters.
    pub max: u32,
}

impl Default for LengthBounds {
    fn default() -> Self {
        LengthBounds { min: 10, max: 500 }
    }
}

/// Whose calls share a direct call's idempotency key. The key is derived from this scope, the
/// tool and the identity fields, never from a session or a run, so the same operation retried
/// from any connection replays.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum KeyScope {
    /// The calling principal's own (the default).
    #[default]
    Principal,
    /// The principal's whole tree: it and every principal under the same root ancestor.
    Tree,
    /// Everyone's: "one invoice is paid once, whichever agent asks".
    Registry,
}

/// A tool's idempotency settings.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ToolIdempotency {
    #[serde(default)]
    #[schemars(example = &"principal")]
    pub scope: KeyScope,
    /// Whether a repeated call returns the first call's stored outcome. Always for a tool that
    /// changes state; for a read only when set (a read replayed would answer from before a
    /// write that changed the data).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(example = true)]
    pub replay: Option<bool>,
    /// How long a completed call's outcome is kept for replay (hours); default the registry's
    /// `idempotency.retention_hours`, and never shorter than the approval expiry.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(example = 72)]
    pub retention_hours: Option<i64>,
}

impl ToolIdempotency {
    fn is_default(&self) -> bool {
        *self == ToolIdempotency::default()
    }
}

/// How a tool's previews behave.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct PreviewConfig {
    /// How long a plan can be committed after its preview, in seconds (default 1 hour).
    #[serde(default = "preview_expiry")]
    #[schemars(example = 3600)]
    pub expires_secs: u64,
}

fn preview_expiry() -> u64 {
    3600
}

/// A budget over a sliding window: the sum of a numeric input (`sum: amount`) or the number of
/// calls, per principal and optionally per the value of a key input (a supplier, a recipient
/// domain). It holds for the caller and for every ancestor it draws from.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct WindowBudgetConfig {
    /// `[a-z][a-z0-9_]*`, unique in the registry: the rule `budget.window.<id>` and the policy
    /// context's `context.budgets.<id>`.
    #[schemars(example = &"supplier_daily")]
    pub id: String,
    /// The numeric input summed (non-negative, required); without it, calls are counted.
    #[serde(default)]
    #[schemars(example = &"amount")]
    pub sum: Option<String>,
    /// The most the window may hold: a sum in the input's unit, or a number of calls.
    #[schemars(example = 50000)]
    pub limit: serde_json::Number,
    /// What the sum is in (`EUR`), for messages.
    #[serde(default)]
    #[schemars(example = &"EUR")]
    pub unit: Option<String>,
    /// The window's length: `90s`, `15m`, `1h`, `24h`, `7d` (at most 31 days).
    #[schemars(example = &"24h")]
    pub window: String,
    /// An input (required, string or integer) whose value splits the budget: one window per value.
    #[serde(default)]
    #[schemars(example = &"supplier_id")]
    pub key: Option<String>,
    /// Which part of the key's value is compared (`email_domain` for a recipient's domain).
    #[serde(default)]
    #[schemars(example = &"exact")]
    pub key_kind: Option<DestinationKind>,
    /// Limits that differ for named principals (a parent's pooled limit, say).
    #[serde(default)]
    #[schemars(example = serde_json::json!({"ap-parent": 200000}))]
    pub limits: BTreeMap<String, serde_json::Number>,
}

fn one() -> u8 {
    1
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct AnnotationsConfig {
    #[serde(default)]
    #[schemars(example = false)]
    /// MCP `readOnlyHint`.
    pub read_only_hint: Option<bool>,
    #[serde(default)]
    #[schemars(example = true)]
    /// MCP `destructiveHint`.
    pub destructive_hint: Option<bool>,
    #[serde(default)]
    #[schemars(example = true)]
    /// MCP `idempotentHint`.
    pub idempotent_hint: Option<bool>,
    #[serde(default)]
    #[schemars(example = true)]
    /// MCP `openWorldHint`.
    pub open_world_hint: Option<bool>,
}

/// Where a handler call goes.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct HandlerConfig {
    /// An upstream server named in `toolgate.yaml`.
    #[serde(default)]
    #[schemars(example = &"erp")]
    pub upstream: Option<String>,
    /// The tool's name on that upstream (defaults to the registry name).
    #[serde(default)]
    #[schemars(example = &"schedule_payment")]
    pub tool: Option<String>,
    /// A built-in handler: `plan.submit`, `step.approve`, `step.reject`, `run.status`.
    #[serde(default)]
    #[schemars(example = &"plan.submit")]
    pub builtin: Option<String>,
}

impl HandlerConfig {
    /// The built-in `builtin:` names, if it names one toolgate has.
    pub fn builtin_kind(&self) -> Option<crate::handler::Builtin> {
        self.builtin
            .as_deref()
            .and_then(crate::handler::Builtin::from_name)
    }
}

/// A constraint on an input that chooses where data or money goes, enforced against data.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct DestinationConfig {
    /// The input field holding the destination (a top-level property name).
    #[schemars(example = &"recipient")]
    pub field: String,
    /// What part of the value is compared.
    #[schemars(example = &"exact")]
    pub kind: DestinationKind,
    /// A static allowlist.
    #[serde(default)]
    #[schemars(example = ["DE89370400440532013000"])]
    pub allowed: Vec<String>,
    /// Or: the allowed values are looked up through a read tool at call time.
    #[serde(default)]
    pub lookup: Option<DestinationLookup>,
    /// What happens to a value that is not on the list: `refuse` (the default) or `gate` (the
    /// call waits for a person's approval, with the reason "destination not on the list").
    #[serde(default, skip_serializing_if = "UnknownDestination::is_refuse")]
    #[schemars(example = &"gate")]
    pub unknown: UnknownDestination,
}

/// See [`DestinationConfig::unknown`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum UnknownDestination {
    /// The call is refused, naming the values that would pass.
    #[default]
    Refuse,
    /// The call is parked for a person, who sees the destination and approves or rejects it.
    Gate,
}

impl UnknownDestination {
    fn is_refuse(&self) -> bool {
        *self == UnknownDestination::Refuse
    }
}

/// Fields of one side named from fields of the other: a list when the names are the same
/// (`[recipient, amount]`), a map when they differ (`{to: recipient}`: the left name is the
/// read tool's or the answer's, the right one the call's input).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(untagged)]
pub enum FieldNames {
    Same(Vec<String>),
    Renamed(BTreeMap<String, String>),
}

impl Default for FieldNames {
    fn default() -> Self {
        FieldNames::Same(Vec::new())
    }
}

impl FieldNames {
    /// (other side's name, the call's input name) pairs.
    pub fn pairs(&self) -> Vec<(&str, &str)> {
        match self {
            FieldNames::Same(v) => v.iter().map(|n| (n.as_str(), n.as_str())).collect(),
            FieldNames::Renamed(m) => m.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect(),
        }
    }

    pub fn is_empty(&self) -> bool {
        match self {
            FieldNames::Same(v) => v.is_empty(),
            FieldNames::Renamed(m) => m.is_empty(),
        }
    }
}

/// `reconcile_query:` on a tool. See [`ToolConfig::reconcile_query`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ReconcileQueryConfig {
    /// The read tool asked.
    #[schemars(example = &"bank.recent_transactions")]
    pub tool: String,
    /// The read tool's arguments taken from the call's inputs.
    #[serde(default, skip_serializing_if = "FieldNames::is_empty")]
    #[schemars(example = ["recipient"])]
    pub with: FieldNames,
    /// Fixed arguments of the read tool.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    #[schemars(example = serde_json::json!({"n": 50}))]
    pub args: BTreeMap<String, Value>,
    /// Where the list of items is in the read's structured answer (a dotted path); unset, the
    /// answer is the list.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(example = &"transactions")]
    pub result: Option<String>,
    /// The fields of an item that must equal the call's inputs for the item to be this call.
    #[serde(rename = "match")]
    #[schemars(example = ["recipient", "amount", "subject", "date"])]
    pub match_fields: FieldNames,
}

/// `compensate_with:` on a write tool. See [`ToolConfig::compensate_with`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct CompensateWithConfig {
    /// The read tool that answers the current values, asked just before the write.
    #[schemars(example = &"bank.get_user_info")]
    pub read: String,
    /// The read tool's arguments taken from the call's inputs.
    #[serde(default, skip_serializing_if = "FieldNames::is_empty")]
    #[schemars(example = ["account_id"])]
    pub with: FieldNames,
    /// Fixed arguments of the read tool.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    #[schemars(example = serde_json::json!({"include_archived": false}))]
    pub args: BTreeMap<String, Value>,
    /// Where the record is in the read's structured answer (a dotted path); unset, the answer
    /// is the record.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(example = &"user")]
    pub result: Option<String>,
    /// When the answer there is a list: the fields that pick this call's record from it (equal
    /// to the call's inputs).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(example = ["id"])]
    pub pick: Option<FieldNames>,
    /// The inputs the compensation sets back: each from the record's field of the same name
    /// (map form: `{record_field: input}`). The compensating call is the same tool with the
    /// original inputs and these set to their previous values.
    #[schemars(example = ["first_name", "last_name", "street", "city"])]
    pub restore: FieldNames,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum DestinationKind {
    /// The domain after `@` of an email address.
    EmailDomain,
    /// The host of a URL.
    UrlHost,
    /// The whole value (an account number, a channel).
    Exact,
}

#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct DestinationLookup {
    /// A read tool whose structured result carries the allowed values.
    #[schemars(example = &"account.verified_domains")]
    pub tool: String,
    /// Input fields of this call passed to the lookup tool under the same names.
    #[schemars(example = ["account_id"])]
    pub with: Vec<String>,
    /// The field of the lookup result holding the list of allowed values.
    #[schemars(example = &"domains")]
    pub result: String,
}

/// `principals.yaml`: roles, then agents and people with their credentials and grants.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct PrincipalsFile {
    #[serde(default)]
    /// The roles by name: what each is for, whether it is plan-bound, whether its people approve.
    pub roles: BTreeMap<String, RoleConfig>,
    /// The agents and people, each with one role.
    pub principals: Vec<PrincipalConfig>,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RoleConfig {
    #[serde(default)]
    #[schemars(example = &"Pays approved invoices.")]
    /// What the role is for, for people reading the registry.
    pub description: Option<String>,
    /// A plan-bound role may only call what a submitted plan assigned to it.
    #[serde(default)]
    #[schemars(example = true)]
    pub plan_bound: bool,
    /// People in this role may approve gated calls.
    #[serde(default)]
    #[schemars(example = false)]
    pub approver: bool,
    /// The purpose of a call that states none, for principals of this role (see
    /// `PrincipalConfig::default_purpose`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(example = &"billing")]
    pub default_purpose: Option<String>,
}

#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct PrincipalConfig {
    #[schemars(example = &"ap-agent")]
    /// The principal's id (unique): recorded in every audit record it causes.
    pub id: String,
    #[schemars(example = &"agent")]
    pub kind: PrincipalKind,
    #[schemars(example = &"worker.finance")]
    /// Its role: decides which tools it is listed.
    pub role: String,
    #[serde(default)]
    #[schemars(example = &"The accounts-payable agent.")]
    /// Who or what this is, for people reading the registry.
    pub description: Option<String>,
    /// API keys, stored as hashes only.
    #[serde(default)]
    pub credentials: Vec<CredentialConfig>,
    #[serde(default)]
    /// What it may do: scopes for purposes, up to a tier and a sensitivity.
    pub grants: Vec<GrantConfig>,
    /// Daily budgets per tier (read is never budgeted).
    #[serde(default)]
    #[schemars(example = serde_json::json!({"act": 50, "spend": 10}))]
    pub budgets: BudgetsConfig,
    /// The principal whose budget this one also draws from.
    #[serde(default)]
    #[schemars(example = &"ap-parent")]
    pub parent: Option<String>,
    /// The purpose of a call that states none (no `_meta.purpose`, no `purpose` argument), when
    /// the tool may be used for it. A credential's default comes first, then this, then the
    /// role's; without any, a caller whose grants allow the tool for exactly one purpose uses
    /// that one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(example = &"billing")]
    pub default_purpose: Option<String>,
    /// The person an agent acts for: never counted as an approver of the agent's requests.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(example = &"alice")]
    pub on_behalf_of: Option<String>,
}

#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct CredentialConfig {
    /// A name for the key, so it can be revoked on its own.
    #[schemars(example = &"key1")]
    pub id: String,
    /// `sha256:<hex>` of the API key.
    #[schemars(example = &"sha256:9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08")]
    pub sha256: String,
    /// The subject of an OAuth access token that maps to this principal.
    #[serde(default)]
    #[schemars(example = &"agent-7@idp.example.com")]
    pub oauth_subject: Option<String>,
    /// The purpose of calls made with this key that state none (before the principal's default).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(example = &"billing")]
    pub default_purpose: Option<String>,
}

#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct GrantConfig {
    #[schemars(example = ["payments"])]
    /// The scopes granted (a tool needs all of its scopes from one grant).
    pub scopes: Vec<String>,
    #[schemars(example = ["billing"])]
    /// The purposes these scopes are granted for.
    pub purposes: Vec<String>,
    #[schemars(example = &"spend")]
    pub max_tier: Tier,
    #[serde(default = "default_sensitivity")]
    #[schemars(example = &"confidential")]
    pub max_sensitivity: Sensitivity,
}

fn default_sensitivity() -> Sensitivity {
    Sensitivity::Internal
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct BudgetsConfig {
    #[serde(default)]
    #[schemars(example = 50)]
    /// Calls of tier `act` allowed per day.
    pub act: Option<u32>,
    #[serde(default)]
    #[schemars(example = 10)]
    /// Calls of tier `spend` allowed per day.
    pub spend: Option<u32>,
}

/// `metrics:` in toolgate.yaml. The scrape token itself is never in the file: it comes from the
/// environment variable `token_env`, or from `token_file` (a mounted secret) when that is set.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct MetricsConfig {
    /// Environment variable holding the scrape token (at least 16 characters).
    #[serde(default = "default_metrics_token_env")]
    #[schemars(example = &"TOOLGATE_METRICS_TOKEN")]
    pub token_env: String,
    /// A file holding the scrape token, relative to the registry folder; read instead of
    /// `token_env` when set. Surrounding whitespace is ignored.
    #[serde(default)]
    #[schemars(example = &"secrets/metrics-token")]
    pub token_file: Option<String>,
    /// Answer scrapes from peers that are not on this host (loopback only by default).
    #[serde(default)]
    #[schemars(example = false)]
    pub allow_remote: bool,
}

fn default_metrics_token_env() -> String {
    "TOOLGATE_METRICS_TOKEN".to_string()
}

impl Default for MetricsConfig {
    fn default() -> Self {
        MetricsConfig {
            token_env: default_metrics_token_env(),
            token_file: None,
            allow_remote: false,
        }
    }
}

impl MetricsConfig {
    fn is_default(&self) -> bool {
        *self == MetricsConfig::default()
    }
}

/// The value at a dotted path (`data.transactions`); the value itself for no path.
pub fn value_at<'v>(v: &'v Value, path: Option<&str>) -> Option<&'v Value> {
    match path.filter(|p| !p.is_empty()) {
        None => Some(v),
        Some(p) => p.split('.').try_fold(v, |v, key| v.get(key)),
    }
}

/// Whether two JSON values are the same value (numbers compared as numbers: `100` is `100.0`).
fn same_value(a: &Value, b: &Value) -> bool {
    match (a, b) {
        (Value::Number(x), Value::Number(y)) => x.as_f64() == y.as_f64(),
        _ => a == b,
    }
}

/// A read tool's arguments: the fixed `args`, then the call's inputs named by `with`.
fn read_arguments(with: &FieldNames, args: &BTreeMap<String, Value>, call_inputs: &Value) -> Value {
    let mut out: serde_json::Map<String, Value> =
        args.iter().map(|(k, v)| (k.clone(), v.clone())).collect();
    for (arg, input) in with.pairs() {
        if let Some(v) = call_inputs.get(input).filter(|v| !v.is_null()) {
            out.insert(arg.to_string(), v.clone());
        }
    }
    Value::Object(out)
}

/// Whether an item of an answer has these fields equal to the call's inputs.
fn matches_call(item: &Value, fields: &FieldNames, call_inputs: &Value) -> bool {
    fields.pairs().iter().all(
        |(field, input)| match (item.get(*field), call_inputs.get(*input)) {
            (Some(a), Some(b)) => same_value(a, b),
            (None, None) => true,
            _ => false,
        },
    )
}

impl ReconcileQueryConfig {
    /// The arguments the reconciling read is asked with, for a call with these inputs.
    pub fn arguments(&self, call_inputs: &Value) -> Value {
        read_arguments(&self.with, &self.args, call_inputs)
    }

    /// Whether the read's answer shows the call landed: the item that matches it, `None`
    /// when it does not, and `Err` when the answer holds no list where one was declared (the
    /// question was not answered, so nothing is concluded).
    pub fn find<'a>(
        &self,
        answer: &'a Value,
        call_inputs: &Value,
    ) -> Result<Option<&'a Value>, CoreError> {
        let list = value_at(answer, self.result.as_deref())
            .and_then(Value::as_array)
            .ok_or_else(|| CoreError::NoList {
                tool: self.tool.clone(),
                at: self.result.clone(),
            })?;
        Ok(list
            .iter()
            .find(|item| matches_call(item, &self.match_fields, call_inputs)))
    }
}

impl CompensateWithConfig {
    /// The arguments the read is asked with, for a call with these inputs.
    pub fn arguments(&self, call_inputs: &Value) -> Value {
        read_arguments(&self.with, &self.args, call_inputs)
    }

    /// The previous values of the restored inputs, from the read's answer: `{input: value}`
    /// (a field the record does not have is `null`, and the compensation leaves it unset).
    /// `Err` when the answer holds no record for the call.
    pub fn previous(&self, answer: &Value, call_inputs: &Value) -> Result<Value, CoreError> {
        let at = value_at(answer, self.result.as_deref()).ok_or_else(|| CoreError::NothingAt {
            tool: self.read.clone(),
            at: self.result.clone(),
        })?;
        let record = match (at, &self.pick) {
            (Value::Array(items), Some(pick)) => items
                .iter()
                .find(|item| matches_call(item, pick, call_inputs))
                .ok_or_else(|| CoreError::NoRecord {
                    tool: self.read.clone(),
                })?,
            (Value::Object(_), _) => at,
            _ => {
                return Err(CoreError::NotARecord {
                    tool: self.read.clone(),
                    list: at.is_array(),
                });
            }
        };
        let mut out = serde_json::Map::new();
        for (field, input) in self.restore.pairs() {
            out.insert(
                input.to_string(),
                record.get(field).cloned().unwrap_or(Value::Null),
            );
        }
        Ok(Value::Object(out))
    }

    /// The compensating call's inputs: the original inputs with the restored ones set back to
    /// their previous values (one that had none is left out).
    pub fn compensation_inputs(original: &Value, previous: &Value) -> Value {
        let mut out = original.as_object().cloned().unwrap_or_default();
        if let Some(prev) = previous.as_object() {
            for (k, v) in prev {
                if v.is_null() {
                    out.remove(k);
                } else {
                    out.insert(k.clone(), v.clone());
                }
            }
        }
        Value::Object(out)
    }
}
