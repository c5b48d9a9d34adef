//! The store's one error type. Every variant says what went wrong and, where it can, what to do.

use toolgate_core::TokenError;

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("store URL '{0}' is not understood: use sqlite://PATH or postgres://USER@HOST/DB")]
    BadUrl(String),
    #[error("database error: {0}")]
    Db(#[from] sqlx::Error),
    #[error("database error: {0}")]
    Sqlite(#[from] rusqlite::Error),
    #[error("migrating the database failed: {0}")]
    Migrate(#[from] sqlx::migrate::MigrateError),
    /// A command that only reads found no store, or a schema it does not read, at the URL.
    #[error("{0}")]
    Schema(crate::db::SchemaProblem),
    /// What the store holds does not read as what it writes: a row it needs is missing, or a
    /// stored value does not parse.
    #[error("stored data is corrupt: {0}")]
    Corrupt(String),
    /// Recording a call's outcome and audit record failed (the cause says why: a full disk,
    /// a lost database connection, ...). The call itself may have run.
    #[error("recording the outcome failed: {0}")]
    Recording(#[source] Box<StoreError>),
    /// Making acknowledged writes durable (an fsync barrier) failed.
    #[error("making {what} durable failed: {source}")]
    NotDurable {
        what: &'static str,
        #[source]
        source: std::sync::Arc<StoreError>,
    },
    /// A task the store handed work to panicked or was cancelled.
    #[error("{what} failed: {source}")]
    Task {
        what: &'static str,
        #[source]
        source: tokio::task::JoinError,
    },
    /// A mistake in toolgate itself, not in the data or the environment.
    #[error("internal error (a bug in toolgate, please report it): {0}")]
    Bug(String),
    #[error("no {what} with id '{id}'")]
    NotFound { what: &'static str, id: String },
    #[error("tool '{0}' is not in the registry")]
    UnknownTool(String),
    #[error("principal '{0}' is not in the registry")]
    UnknownPrincipal(String),
    #[error("approval {id} is {status}; only a pending approval can be decided")]
    ApprovalClosed { id: String, status: String },
    #[error("approval {id} expired at {expires_at} ms; the call must go back through the gate")]
    ApprovalExpired { id: String, expires_at: i64 },
    #[error("'{0}' cannot approve: only a person with an approver role can")]
    NotAnApprover(String),
    /// Segregation of duties: this person may not decide this request.
    #[error("{id}: {why}")]
    Ineligible {
        id: String,
        why: Box<toolgate_core::approvers::Ineligible>,
    },
    #[error("'{approver}' already approved {id}; a second approval must come from someone else")]
    SameApprover { id: String, approver: String },
    #[error("approval token refused: {0}")]
    Token(#[from] TokenError),
    /// A reservation kept losing to other calls taking and giving back what it needs: nothing
    /// was reserved. Retried like a serialization failure.
    #[error("{0}; nothing was reserved, try the call again")]
    Contended(String),
    #[error("the audit writer has stopped; the store must be reopened")]
    WriterGone,
    #[error("the store is closed")]
    Closed,
    #[error("run {0} is aborted; no more steps run in it")]
    RunAborted(String),
    #[error("plan refused: {0}")]
    PlanRefused(String),
    #[error(
        "step {step} was already {verdict} by this reviewer; a reviewer gives one verdict per step"
    )]
    AlreadyReviewed { step: String, verdict: String },
    #[error("I/O error: {0}")]
    Io(#[from] std::io::Error),
    #[error(
        "{origin}: not a usable checkpoint signing key: {problem}; make one with \
         `toolgate log key new --out FILE`"
    )]
    CheckpointKey { origin: String, problem: String },
    #[error(
        "{origin}: not a usable checkpoint public key: {problem}; `toolgate log key public` \
         prints the public key of a signing key"
    )]
    CheckpointPublicKey { origin: String, problem: String },
    #[error("{origin}: not a toolgate audit checkpoint: {problem}")]
    CheckpointUnreadable { origin: String, problem: String },
    #[error(
        "the checkpoint of record {seq} was signed by key {key_id}, which is not among the \
         public keys given ({known}): give its public key too (an old key still verifies \
         what it signed)"
    )]
    CheckpointKeyUnknown {
        seq: i64,
        key_id: String,
        known: String,
    },
    #[error("making a checkpoint signing key: the system's random source failed: {0}")]
    Random(#[source] getrandom::Error),
}

pub type Result<T, E = StoreError> = std::result::Result<T, E>;

impl StoreError {
    /// Whether PostgreSQL aborted the transaction for a deadlock (SQLSTATE 40P01) or a
    /// serialization failure (40001), or a reservation was [contended](StoreError::Contended):
    /// the transaction may simply be tried again.
    pub fn is_conflict(&self) -> bool {
        match self {
            StoreError::Db(sqlx::Error::Database(e)) => {
                matches!(e.code().as_deref(), Some("40P01" | "40001"))
            }
            StoreError::Contended(_) => true,
            _ => false,
        }
    }
}
