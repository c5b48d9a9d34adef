//! toolgate's core: the registry, grants, Cedar policies and the ordered checks, canonical JSON
//! and the values derived from it. Pure and synchronous: no I/O beyond reading the registry
//! folder, no async, no clock of its own. The store and the gateway build on it.

pub mod approvers;
pub mod bounds;
pub mod budget;
pub mod canon;
pub mod clip;
pub mod config;
pub mod decide;
pub mod error;
pub mod handler;
pub mod ids;
pub mod keyconfig;
pub mod lint;
pub mod model;
pub mod policy;
pub mod reference;
pub mod registry;
pub mod rule;
pub mod rules;
pub mod schema;
pub mod token;
pub mod why;

pub use budget::{Held, WindowBudget, WindowView};
pub use canon::{IdempotencyKey, InputHash, Redactor, canonical};
pub use decide::{
    BudgetView, CallRequest, Check, CheckName, Decision, Definition, DestinationFacts,
    DestinationLookupCall, Engine, IdempotencyState, MAX_ATTEMPTS, Outcome, PriorCall, PriorCalls,
    PriorOutcome, RunHistory, ShadowEffect, ShadowRule, Verdict, destination_lookups,
};
pub use error::CoreError;
pub use handler::{Builtin, Handler};
pub use ids::{ApprovalId, PrincipalId, RunId, StepId};
pub use model::{
    Clock, Effect, FixedClock, Gate, PrincipalKind, Sensitivity, StepStatus, SystemClock, Tier,
    Timestamp,
};
pub use registry::{Finding, LoadError, Registry, RegistryVersion};
pub use rule::Rule;
pub use token::{ApprovalClaims, ApprovalKeys, ApprovalToken, TokenError};
