//! One error type for the gateway: what failed while starting or serving, and where.

use std::path::PathBuf;

/// Why the gateway could not start or stopped.
#[derive(Debug, thiserror::Error)]
pub enum GatewayError {
    // The cause is the error's `source`, not part of its message: printed with its chain
    // (`{:#}`, as the CLI does) a message that also embedded it said every finding twice.
    #[error("the registry in {} cannot be loaded (run `toolgate check {}`)", dir.display(), dir.display())]
    Registry {
        dir: PathBuf,
        source: toolgate_core::LoadError,
    },
    #[error("the store at {url} cannot be opened")]
    Store {
        url: String,
        source: toolgate_store::StoreError,
    },
    #[error("upstream '{name}': {message}")]
    Upstream { name: String, message: String },
    #[error("toolgate.lock cannot be used (fix it, or re-pin with `toolgate lock approve`)")]
    Lockfile(#[source] toolgate_contract::ContractError),
    #[error("OAuth settings: {0}")]
    OAuth(#[source] crate::jwt::JwksError),
    #[error("cannot listen on {addr}")]
    Bind {
        addr: String,
        source: std::io::Error,
    },
    #[error("the stdio transport failed: {0}")]
    Stdio(String),
    #[error(transparent)]
    Keys(#[from] crate::keys::KeyError),
    #[error("nothing to serve: pass --http ADDR, --stdio, or both")]
    NoTransport,
    #[error(transparent)]
    Io(#[from] std::io::Error),
}
