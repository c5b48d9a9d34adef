//! One error type for the gateway: what failed while starting or serving, and where.

use std::path::PathBuf;

/// Why the gateway could not start or stopped.
#[derive(Debug, thiserror::Error)]
pub enum GatewayError {
    #[error("the registry in {dir} cannot be loaded (run `toolgate check {dir}`): {source}")]
    Registry {
        dir: PathBuf,
        source: toolgate_core::LoadError,
    },
    #[error("the store at {url} cannot be opened: {source}")]
    Store {
        url: String,
        source: toolgate_store::StoreError,
    },
    #[error("upstream '{name}': {message}")]
    Upstream { name: String, message: String },
    #[error("{0} (fix it, or re-pin with `toolgate lock approve`)")]
    Lockfile(String),
    #[error("OAuth settings: {0}")]
    OAuth(String),
    #[error("cannot listen on {addr}: {source}")]
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
