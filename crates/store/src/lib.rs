//! toolgate's durable state. The model holds nothing between calls, networks drop requests and
//! processes restart mid-call, so runs, steps, idempotency keys, budgets, approvals and the
//! audit chain live in a database: SQLite (embedded, one file, WAL) or PostgreSQL (many
//! gateway and worker processes), chosen by URL, with one set of semantics and one test suite.
//!
//! - [`Store`]: connect, create runs, approvals, budgets, `verify_chain`, `export_principal`,
//!   `trace`, and signed checkpoints of the audit chain (`checkpoint`, `verify_checkpoints`).
//! - [`Executor`]: the planned-step queue (`run_batch`, `execute_step`), the direct governed
//!   call path (`governed_call`), `recover_stale`, `reconcile` and `abort_run`.
//! - [`Handler`]: what performs a call (an upstream MCP server in the gateway, a fake in tests).

pub mod audit;
pub mod checkpoint;
mod combine;
mod db;
pub mod error;
pub mod exec;
mod group;
mod ledger;
mod lite;
pub mod model;
pub mod notify;
mod packed;
mod pg;
pub mod plan;
pub mod previews;
mod reserve;
pub mod sessions;
#[cfg(test)]
mod sql_words;
mod store;
mod tail;
pub mod toggles;
mod trace;
pub mod worker;

pub use audit::{
    AuditCall, AuditColumn, AuditDecision, AuditDraft, AuditRecord, BrokenLink, ChainPoint,
    ChainReport, LinkFault,
};
pub use checkpoint::{
    CheckpointCheck, CheckpointFault, CheckpointOutcome, CheckpointPublicKey, CheckpointRefusal,
    CheckpointReport, CheckpointSigner, KeyId, SignedCheckpoint, read_checkpoints,
};
pub use combine::{Panicked, RunToEnd};
pub use db::{ConnectOptions, SchemaProblem};
pub use error::{Result, StoreError};
pub use exec::{
    BoxFuture, CallMeta, CallResult, CallStatus, DirectCall, DryRun, Executor, Handler,
    HandlerError, HandlerOutput, Served, SyncHook, SyncPoint, Target,
};
pub use model::{
    Actor, ApprovalDecision, ApprovalRequest, ApprovalStatus, BudgetUse, PlannedStep, RunState,
    Step, StepKind, StepOutcome, StepReport,
};
pub use notify::{Delivery, NotifySummary, RaisedRequest};
pub use packed::Unreadable;
pub use plan::{
    PlanSubmission, Review, ReviewVerdict, RunStatus, StepProblem, SubmittedPlan, WorkSignal,
    assign_worker, check_step,
};
pub use sessions::ConsoleSession;
pub use store::{Store, StoreConfig};
pub use tail::GateCount;
pub use toggles::{ExecutorToggles, Toggles};
pub use worker::{WorkOptions, WorkStats};
