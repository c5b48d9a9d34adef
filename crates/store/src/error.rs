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
    /// A stored JSON value (`what`: a step's outcome, an audit record) does not parse.
    #[error("stored data is corrupt: {what}: {source}")]
    Unparsable {
        what: String,
        #[source]
        source: serde_json::Error,
    },
    /// A stored audit record that does not read back as its text (its packed form is damaged).
    #[error("stored data is corrupt: audit record {seq} cannot be read: {source}")]
    UnreadableRecord {
        seq: i64,
        #[source]
        source: crate::packed::Unreadable,
    },
    /// A stored enum value (`what`: a step status, a tier) that the store never writes.
    #[error("stored data is corrupt: {what} '{value}' is not one the store writes")]
    UnknownValue { what: &'static str, value: String },
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
    /// A plan hands a step to someone who may not execute planned steps.
    #[error(
        "'{principal}' cannot execute planned steps: a step goes to the planner itself or to an \
         agent in a plan-bound role"
    )]
    NotAWorker { principal: String },
    /// A plan hands a step to a worker whose role does not list its tool.
    #[error("unknown tool '{tool}' for '{principal}'")]
    NotListedFor { tool: String, principal: String },
    #[error("unknown tool '{tool}': no plan-bound worker runs it")]
    NoWorker { tool: String },
    #[error("several workers run '{tool}' ({}); name one in the step's `worker`", workers.join(", "))]
    SeveralWorkers { tool: String, workers: Vec<String> },
    /// Inputs toolgate built for a call of its own (a lookup, a reconciling read, a
    /// compensation) do not fit the tool's schema: the call is not made.
    #[error("the inputs built for {tool} do not fit its schema: {}", list(errors))]
    InputsUnfit {
        tool: String,
        errors: Vec<toolgate_core::schema::FieldError>,
    },
    /// A read toolgate made itself failed: its handler's answer says why.
    #[error(transparent)]
    Handler(#[from] crate::exec::HandlerError),
    #[error("{tool} did not answer in time")]
    NoAnswer { tool: String },
    /// A read's answer does not hold what the registry says it holds.
    #[error(transparent)]
    Answer(#[from] toolgate_core::CoreError),
    /// The previous values a compensable write read could not be kept with its step.
    #[error("the previous values could not be stored: {0}")]
    PreviousNotKept(#[source] Box<StoreError>),
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

/// Field errors as one line.
fn list(errors: &[toolgate_core::schema::FieldError]) -> String {
    let list: Vec<String> = errors.iter().map(ToString::to_string).collect();
    list.join("; ")
}

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
