use thiserror::Error;

/// Everything that can go wrong reading, writing or observing tool contracts.
#[derive(Debug, Error)]
pub enum ContractError {
    /// The lockfile is not well-formed; `path` is the exact place (`servers.billing.tools.send`).
    #[error("{file}: {path}: {message}")]
    Lockfile {
        file: String,
        path: String,
        message: String,
    },
    /// A file could not be read or written; `doing` says which (`cannot read: `), and the
    /// operating system's error is kept as the source.
    #[error("{file}: {doing}{source}")]
    Io {
        file: String,
        doing: &'static str,
        #[source]
        source: std::io::Error,
    },
    /// Connecting to or reading from an MCP server failed.
    #[error("{target}: {message}")]
    Server { target: String, message: String },
    /// A git revision or a registry file at it could not be read.
    #[error("{0}")]
    Git(String),
    /// git could not be started.
    #[error("cannot run git: {source}")]
    GitUnavailable {
        #[source]
        source: std::io::Error,
    },
    /// A registry tools file (at a git revision or in the folder) does not load.
    #[error("{file}: {source}")]
    ToolsFile {
        file: String,
        #[source]
        source: toolgate_core::LoadError,
    },
    /// A request that cannot be honoured as asked (e.g. approving a tool of an unapproved server).
    #[error("{0}")]
    Refused(String),
}
