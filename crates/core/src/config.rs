//! The registry as the user writes it: one folder of YAML and Cedar files, reviewable in a pull
//! request. These types mirror the files exactly and refuse unknown fields; `registry` turns them
//! into checked types.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::model::{Effect, Gate, PrincipalKind, Sensitivity, Tier};

/// `toolgate.yaml`: the server, the store and the upstream servers.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GatewayFile {
    /// A human label for this registry; recorded with its content hash in every decision.
    #[serde(default)]
    pub label: Option<String>,
    #[serde(default)]
    pub server: ServerConfig,
    #[serde(default)]
    pub store: StoreConfig,
    #[serde(default)]
    pub upstreams: BTreeMap<String, UpstreamConfig>,
    #[serde(default)]
    pub approvals: ApprovalConfig,
    #[serde(default)]
    pub idempotency: IdempotencyConfig,
    /// Where the key for redaction hashes comes from.
    #[serde(default)]
    pub redaction: RedactionConfig,
    /// The typed ontology of the domain, if it has one (a path relative to the folder).
    #[serde(default)]
    pub ontology: Option<String>,
    /// What "the run so far" is for calls that name no run.
    #[serde(default, skip_serializing_if = "RunsConfig::is_default")]
    pub runs: RunsConfig,
    /// Who may read `/metrics`: the scrape token's source, and whether peers off this host may.
    #[serde(default, skip_serializing_if = "MetricsConfig::is_default")]
    pub metrics: MetricsConfig,
}

/// Runs of calls that name none (`_meta.run_id` absent): a principal's calls belong to its
/// current run while they keep coming; after `idle_minutes` without one, the next call starts a
/// new run. Sessions and reconnects do not matter, so per-run limits and run policies hold for
/// stateless clients and cannot be reset by reconnecting.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RunsConfig {
    #[serde(default = "default_idle_minutes")]
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

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ServerConfig {
    /// Address for streamable HTTP; loopback unless the operator says otherwise.
    #[serde(default = "default_http")]
    pub http: String,
    /// Public base URL of the MCP endpoint, used in OAuth protected-resource metadata.
    #[serde(default)]
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

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StoreConfig {
    /// `sqlite://path` (the embedded default) or `postgres://…`.
    #[serde(default = "default_store_url")]
    pub url: String,
    /// SQLite only: `serve` and `worker` grow the WAL file to this size (MiB) in the background
    /// at start, so commits overwrite blocks already on disk rather than extend the file, whose
    /// fsync costs several times more. The default covers the length at which the WAL starts
    /// over (4,096 pages of 4 KiB, with frame headers) twice over; 0 turns it off.
    #[serde(default = "default_wal_preallocate_mb")]
    pub wal_preallocate_mb: u64,
    /// What an acknowledged call's outcome and audit record survive. `fsync` (the default): a
    /// power loss or an OS crash. `process`: the gateway process being killed, not a power
    /// loss; commits are not flushed to the disk one by one (SQLite: WAL with `synchronous =
    /// NORMAL`; PostgreSQL: `synchronous_commit = off`, so a crash of the database server
    /// loses its last fraction of a second too).
    #[serde(default)]
    pub durability: Durability,
}

/// See [`StoreConfig::durability`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
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
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct UpstreamConfig {
    #[serde(default)]
    pub command: Option<String>,
    #[serde(default)]
    pub args: Vec<String>,
    /// Names of environment variables passed through to the child; values are never in the file.
    #[serde(default)]
    pub env: Vec<String>,
    #[serde(default)]
    pub url: Option<String>,
    /// The exact package version this upstream is pinned to (`name@1.2.3`).
    pub package: String,
    /// Seconds before a call to this upstream is a timeout.
    #[serde(default = "default_timeout")]
    pub timeout_secs: f64,
    /// Streamable HTTP only: keep connections to the upstream open and reuse them, instead of
    /// one new TCP connection per request (rmcp's default). Saves a connection set-up per call;
    /// turn it on only for an upstream that sets `TCP_NODELAY` on its connections (Node's and
    /// Python's HTTP servers do; an rmcp server behind a plain `axum::serve` does not), because
    /// against Nagle's algorithm a reused connection waits for delayed ACKs, about 40 ms a call.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub keep_alive: bool,
    /// The upstream's prompts agents may list and get, by name; no other prompt passes through.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub prompts: Vec<String>,
    /// The upstream's resources agents may list and read, by exact URI; no other passes through.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub resources: Vec<String>,
}

fn default_timeout() -> f64 {
    30.0
}

/// Approvals: how long a request stays open, and the key that signs approval tokens. The key
/// is read from the environment variable `key_env`, or from `key_file` when that is set; a
/// process that signs or verifies tokens refuses to start without one (unless `--dev`). See
/// docs/keys.md.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ApprovalConfig {
    /// How long an approval request stays open (hours).
    #[serde(default = "default_expiry")]
    pub expiry_hours: i64,
    /// The id of the current MAC key; tokens name it so keys can rotate.
    #[serde(default = "default_key_id")]
    pub key_id: String,
    /// Environment variable holding the current key (at least 32 bytes: `toolgate key secret`).
    #[serde(default = "default_key_env")]
    pub key_env: String,
    /// A file holding the current key, relative to the registry folder; read instead of
    /// `key_env` when set. It must not be readable by every user. Surrounding whitespace is
    /// ignored.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key_file: Option<String>,
    /// Keys that no longer sign but still verify the tokens they signed, each under the id
    /// those tokens name (keep one until its tokens have expired: `expiry_hours`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub previous: Vec<PreviousKey>,
    /// Who approves the calls each `@gate` policy gates (by its @id), and how many.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub gates: BTreeMap<String, crate::approvers::GateApprovers>,
}

/// A retired key, kept for verification only: its id and where to read it (`env` or `file`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PreviousKey {
    pub id: String,
    /// Environment variable holding the key.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub env: Option<String>,
    /// A file holding the key, relative to the registry folder.
    #[serde(default, skip_serializing_if = "Option::is_none")]
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
        }
    }
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct IdempotencyConfig {
    /// How long a completed key is replayed (hours); never shorter than the approval expiry.
    #[serde(default = "default_retention")]
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
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RedactionConfig {
    /// Environment variable holding the key for redaction hashes (at least 32 bytes).
    #[serde(default = "default_redaction_env")]
    pub key_env: String,
    /// A file holding the key, relative to the registry folder; read instead of `key_env`
    /// when set. It must not be readable by every user.
    #[serde(default, skip_serializing_if = "Option::is_none")]
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
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ToolsFile {
    pub tools: Vec<ToolConfig>,
}

/// One tool as declared. Every field is part of the contract and reviewed as such.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ToolConfig {
    pub name: String,
    /// Bumped on any change of behaviour (`toolgate registry diff` enforces it).
    pub version: String,
    /// Who reviews changes: a CODEOWNERS handle such as `@acme/billing-platform`.
    pub owner: String,
    pub description: String,
    pub effect: Effect,
    pub tier: Tier,
    pub sensitivity: Sensitivity,
    #[serde(default)]
    pub scopes: Vec<String>,
    /// The purposes this tool may be used for at all; a call naming another purpose is refused.
    pub purposes: Vec<String>,
    /// The roles whose `tools/list` shows this tool.
    pub roles: Vec<String>,
    #[serde(default)]
    pub gate: Gate,
    /// How many distinct people must approve a gated call (1 or 2).
    #[serde(default = "one")]
    pub approvers: u8,
    /// Who may approve its gated calls (roles, people); unset: any person of an approver role.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub approved_by: Option<crate::approvers::ApprovedBy>,
    /// Read-tool lookups shown beside a parked call's inputs on the approval page.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub approval_context: Vec<crate::approvers::ContextLookup>,
    /// Calls of this tool allowed per run.
    #[serde(default)]
    pub rate_limit: Option<u32>,
    /// Input fields that identify the operation; they, not free text, derive a direct call's key.
    #[serde(default)]
    pub identity: Vec<String>,
    #[serde(default)]
    pub destinations: Vec<DestinationConfig>,
    /// Input or output fields stored as keyed hashes in the audit log.
    #[serde(default)]
    pub redact: Vec<String>,
    /// The tool that undoes a `write`.
    #[serde(default)]
    pub compensate: Option<String>,
    /// The read tool that asks the target, by idempotency key, whether an `irreversible` call landed.
    #[serde(default)]
    pub reconcile: Option<String>,
    pub handler: HandlerConfig,
    pub input_schema: Value,
    #[serde(default)]
    pub output_schema: Option<Value>,
    /// MCP annotations, if the author sets them; checked against the effect, never trusted over it.
    #[serde(default)]
    pub annotations: Option<AnnotationsConfig>,
    /// Sums and counts of this tool's calls over a sliding window, per principal (and per key).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub window_budgets: Vec<WindowBudgetConfig>,
    /// Preview, then commit (seed 002): the gateway lists `<name>.preview` (these inputs, does
    /// nothing, returns a plan id, its hash and expiry) and `<name>` taking only `plan_id`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub preview: Option<PreviewConfig>,
    /// Which of the call's purpose and reason the listed tool asks for as ordinary arguments,
    /// for clients that send no `_meta` (toolgate checks, records and strips them before the
    /// call is forwarded). Unset: `reason` when the tool changes state and `reason_from` is
    /// not set, and `purpose` when the caller may use the tool for more than one purpose and
    /// has no default for it. `[]`: neither is listed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ask: Option<Vec<CallField>>,
    /// An input of the tool's own that is also the call's reason (it stays in the inputs and
    /// is forwarded), for tools whose upstream takes a reason or memo of its own.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason_from: Option<String>,
    /// Length bounds, in characters, of the `reason` argument toolgate lists (default 10–500).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason_length: Option<LengthBounds>,
    /// How far a direct call's idempotency key reaches, whether a read replays, and for how long.
    #[serde(default, skip_serializing_if = "ToolIdempotency::is_default")]
    pub idempotency: ToolIdempotency,
}

/// A field of toolgate's own that a tool may list as an argument.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
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
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LengthBounds {
    pub min: u32,
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
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
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
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ToolIdempotency {
    #[serde(default)]
    pub scope: KeyScope,
    /// Whether a repeated call returns the first call's stored outcome. Always for a tool that
    /// changes state; for a read only when set (a read replayed would answer from before a
    /// write that changed the data).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub replay: Option<bool>,
    /// How long a completed call's outcome is kept for replay (hours); default the registry's
    /// `idempotency.retention_hours`, and never shorter than the approval expiry.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retention_hours: Option<i64>,
}

impl ToolIdempotency {
    fn is_default(&self) -> bool {
        *self == ToolIdempotency::default()
    }
}

/// How a tool's previews behave.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PreviewConfig {
    /// How long a plan can be committed after its preview, in seconds (default 1 hour).
    #[serde(default = "preview_expiry")]
    pub expires_secs: u64,
}

fn preview_expiry() -> u64 {
    3600
}

/// A budget over a sliding window: the sum of a numeric input (`sum: amount`) or the number of
/// calls, per principal and optionally per the value of a key input (a supplier, a recipient
/// domain). It holds for the caller and for every ancestor it draws from.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WindowBudgetConfig {
    /// `[a-z][a-z0-9_]*`, unique in the registry: the rule `budget.window.<id>` and the policy
    /// context's `context.budgets.<id>`.
    pub id: String,
    /// The numeric input summed (non-negative, required); without it, calls are counted.
    #[serde(default)]
    pub sum: Option<String>,
    /// The most the window may hold: a sum in the input's unit, or a number of calls.
    pub limit: serde_json::Number,
    /// What the sum is in (`EUR`), for messages.
    #[serde(default)]
    pub unit: Option<String>,
    /// The window's length: `90s`, `15m`, `1h`, `24h`, `7d` (at most 31 days).
    pub window: String,
    /// An input (required, string or integer) whose value splits the budget: one window per value.
    #[serde(default)]
    pub key: Option<String>,
    /// Which part of the key's value is compared (`email_domain` for a recipient's domain).
    #[serde(default)]
    pub key_kind: Option<DestinationKind>,
    /// Limits that differ for named principals (a parent's pooled limit, say).
    #[serde(default)]
    pub limits: BTreeMap<String, serde_json::Number>,
}

fn one() -> u8 {
    1
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct AnnotationsConfig {
    #[serde(default)]
    pub read_only_hint: Option<bool>,
    #[serde(default)]
    pub destructive_hint: Option<bool>,
    #[serde(default)]
    pub idempotent_hint: Option<bool>,
    #[serde(default)]
    pub open_world_hint: Option<bool>,
}

/// Where a handler call goes.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct HandlerConfig {
    /// An upstream server named in `toolgate.yaml`.
    #[serde(default)]
    pub upstream: Option<String>,
    /// The tool's name on that upstream (defaults to the registry name).
    #[serde(default)]
    pub tool: Option<String>,
    /// A built-in handler: `plan.submit`, `step.approve`, `step.reject`, `run.status`.
    #[serde(default)]
    pub builtin: Option<String>,
}

/// A constraint on an input that chooses where data or money goes, enforced against data.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DestinationConfig {
    /// The input field holding the destination (a top-level property name).
    pub field: String,
    /// What part of the value is compared.
    pub kind: DestinationKind,
    /// A static allowlist.
    #[serde(default)]
    pub allowed: Vec<String>,
    /// Or: the allowed values are looked up through a read tool at call time.
    #[serde(default)]
    pub lookup: Option<DestinationLookup>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum DestinationKind {
    /// The domain after `@` of an email address.
    EmailDomain,
    /// The host of a URL.
    UrlHost,
    /// The whole value (an account number, a channel).
    Exact,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DestinationLookup {
    /// A read tool whose structured result carries the allowed values.
    pub tool: String,
    /// Input fields of this call passed to the lookup tool under the same names.
    pub with: Vec<String>,
    /// The field of the lookup result holding the list of allowed values.
    pub result: String,
}

/// `principals.yaml`: roles, then agents and people with their credentials and grants.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PrincipalsFile {
    #[serde(default)]
    pub roles: BTreeMap<String, RoleConfig>,
    pub principals: Vec<PrincipalConfig>,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RoleConfig {
    #[serde(default)]
    pub description: Option<String>,
    /// A plan-bound role may only call what a submitted plan assigned to it.
    #[serde(default)]
    pub plan_bound: bool,
    /// People in this role may approve gated calls.
    #[serde(default)]
    pub approver: bool,
    /// The purpose of a call that states none, for principals of this role (see
    /// `PrincipalConfig::default_purpose`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub default_purpose: Option<String>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PrincipalConfig {
    pub id: String,
    pub kind: PrincipalKind,
    pub role: String,
    #[serde(default)]
    pub description: Option<String>,
    /// API keys, stored as hashes only.
    #[serde(default)]
    pub credentials: Vec<CredentialConfig>,
    #[serde(default)]
    pub grants: Vec<GrantConfig>,
    /// Daily budgets per tier (read is never budgeted).
    #[serde(default)]
    pub budgets: BudgetsConfig,
    /// The principal whose budget this one also draws from.
    #[serde(default)]
    pub parent: Option<String>,
    /// The purpose of a call that states none (no `_meta.purpose`, no `purpose` argument), when
    /// the tool may be used for it. A credential's default comes first, then this, then the
    /// role's; without any, a caller whose grants allow the tool for exactly one purpose uses
    /// that one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub default_purpose: Option<String>,
    /// The person an agent acts for: never counted as an approver of the agent's requests.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub on_behalf_of: Option<String>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CredentialConfig {
    /// A name for the key, so it can be revoked on its own.
    pub id: String,
    /// `sha256:<hex>` of the API key.
    pub sha256: String,
    /// The subject of an OAuth access token that maps to this principal.
    #[serde(default)]
    pub oauth_subject: Option<String>,
    /// The purpose of calls made with this key that state none (before the principal's default).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub default_purpose: Option<String>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GrantConfig {
    pub scopes: Vec<String>,
    pub purposes: Vec<String>,
    pub max_tier: Tier,
    #[serde(default = "default_sensitivity")]
    pub max_sensitivity: Sensitivity,
}

fn default_sensitivity() -> Sensitivity {
    Sensitivity::Internal
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BudgetsConfig {
    #[serde(default)]
    pub act: Option<u32>,
    #[serde(default)]
    pub spend: Option<u32>,
}

/// `metrics:` in toolgate.yaml. The scrape token itself is never in the file: it comes from the
/// environment variable `token_env`, or from `token_file` (a mounted secret) when that is set.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MetricsConfig {
    /// Environment variable holding the scrape token (at least 16 characters).
    #[serde(default = "default_metrics_token_env")]
    pub token_env: String,
    /// A file holding the scrape token, relative to the registry folder; read instead of
    /// `token_env` when set. Surrounding whitespace is ignored.
    #[serde(default)]
    pub token_file: Option<String>,
    /// Answer scrapes from peers that are not on this host (loopback only by default).
    #[serde(default)]
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
