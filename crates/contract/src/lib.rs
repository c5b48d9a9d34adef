//! Tool contracts. A tool definition is a contract a model depends on, and a third-party server
//! can change it under you: a description rewritten to carry instructions, a schema loosened, an
//! enum value dropped. This crate pins what was reviewed and says, in labelled terms, what moved.
//!
//! - [`lockfile`]: `toolgate.lock`, the reviewed definitions of each upstream, with who approved them.
//! - [`diff`]: what changed between a pinned and a live definition, each change labelled
//!   **breaking**, **widening** or **description**.
//! - [`pin`]: [`PinSet::check`], the serve-time verdict: which tools may be served (by definition
//!   hash), which are blocked and why, and whether the whole server is blocked.
//! - [`audit`]: the tool contract audit of any MCP server's `tools/list`, rendered as a table,
//!   JSON or SARIF.
//! - [`client`]: an rmcp client that reads a server's `initialize` answer and `tools/list`.
//! - [`registry_diff`]: the same labels for the organisation's own registry tools across a git revision.

pub mod audit;
pub mod client;
pub mod definition;
pub mod diff;
mod error;
pub mod lockfile;
pub mod pin;
pub mod registry_diff;
pub mod sarif;

pub use audit::{AuditFinding, AuditReport, Severity, audit};
pub use definition::{DefinitionHash, ServerFacts, ServerIdentity, definition_hash, tool_value};
pub use diff::{Change, DiffLabel, ToolChange, diff_tool, diff_tool_sets};
pub use error::ContractError;
pub use lockfile::{Approval, Lockfile, ServerPin, ToolPin};
pub use pin::{BlockedTool, PinSet, PinVerdict};
