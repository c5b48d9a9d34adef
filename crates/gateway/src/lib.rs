//! The MCP edge of toolgate. Agents connect here (stdio or streamable HTTP), authenticate with a
//! credential, see only the tools their role is granted, and every `tools/call` goes through the
//! store's governed call path before an upstream server is reached. The engine never depends on
//! this crate; this crate only translates between MCP and the engine's values.
//!
//! - [`serve`]: load a registry folder, open the store, connect the upstreams, serve.
//! - [`reload`]: hot reload of the registry folder (file watch, SIGHUP, `toolgate reload`).
//! - [`GatewayServer`]: the hand-written rmcp `ServerHandler` (per-role `tools/list`, governed
//!   `tools/call`).
//! - [`Upstreams`]: rmcp clients to the upstream servers, as the store's [`toolgate_store::Handler`];
//!   tool calls to a streamable-HTTP upstream take a lean hyper hop in rmcp's session (`hop`),
//!   and those to a child process a lean hop on its stdio (`child`).
//! - [`auth`]: API keys and OAuth 2.1 bearer tokens at the HTTP boundary.
//! - [`keys`]: the approval and redaction keys a process refuses to start without.

pub mod auth;
mod builtins;
mod child;
mod error;
pub mod exit;
mod hop;
pub mod http;
mod https;
pub mod jwt;
mod kept;
pub mod keys;
mod lanes;
mod lean;
mod logging;
mod meta;
pub mod notify;
pub mod otlp;
mod passthrough;
pub mod pins;
mod preview;
mod relay;
pub mod reload;
mod render;
mod serve;
mod server;
pub mod sessions;
mod sse;
mod stdio;
pub mod upstream;
mod watch;
mod worker;

pub use auth::{Authenticator, Caller, CredentialKind};
pub use error::GatewayError;
pub use exit::Exit;
pub use https::HttpsError;
pub use jwt::{JwksError, JwtVerifier, OAuthOptions, TokenRejected};
pub use keys::{KeySource, KeyStatus, Secrets};
pub use logging::{LogFormat, init_logging};
pub use reload::{ReloadOutcome, ReloadReport, Reloader, ServeStatus, Trigger};
pub use render::{from_stored, to_stored};
pub use serve::{Gateway, ServeOptions, registry_store_config, resolve_store_url, serve};
pub use server::{GatewayServer, Surface, derive_annotations, mcp_tool};
pub use upstream::{PinCheckError, ToolsChangedHook, UpstreamError, Upstreams};
pub use worker::{WorkerOptions, run_worker, worker};
