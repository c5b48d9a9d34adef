//! What a value core reads can fail to be: a number kept exactly (budgets, policies), an
//! upstream's answer it was told where to look in, a schema or policy entities it builds. The
//! registry's, approvals' and tokens' errors are reports of their own ([`crate::LoadError`],
//! [`crate::approvers::Ineligible`], [`crate::TokenError`]).

use serde_json::Number;

#[derive(Debug, thiserror::Error)]
pub enum CoreError {
    #[error("{0} is too large")]
    TooLarge(Number),
    #[error("{0} is not a number")]
    NotANumber(Number),
    /// Kept in units of 1/10,000: more digits would be rounded, so the number is refused.
    #[error("{0} has more than four fraction digits")]
    TooPrecise(Number),
    #[error("{0} is not above 0")]
    NotAbove0(Number),
    #[error("{0} is not a whole number of calls above 0")]
    NotACount(Number),
    /// Cedar's decimals hold an i64 of 1/10,000ths.
    #[error("{0} is outside the range policies can compare")]
    OutsidePolicyRange(Number),
    #[error("{0} has more than four fraction digits; policies cannot compare it exactly")]
    TooPreciseForPolicies(Number),
    #[error("number is not finite")]
    NotFinite,
    /// A read's answer has no list where the registry says it has one.
    #[error("the answer of {tool} has no list{}", at.as_deref().map(|r| format!(" at '{r}'")).unwrap_or_default())]
    NoList { tool: String, at: Option<String> },
    #[error("the answer of {tool} has nothing at '{}'", at.as_deref().unwrap_or_default())]
    NothingAt { tool: String, at: Option<String> },
    #[error("the answer of {tool} lists no record for this call")]
    NoRecord { tool: String },
    #[error("the answer of {tool} is not a record{}", if *list { " (it is a list: say which item with `pick:`)" } else { "" })]
    NotARecord { tool: String, list: bool },
    /// An input schema that does not compile under draft 2020-12.
    #[error("{0}")]
    Schema(#[source] Box<jsonschema::ValidationError<'static>>),
    /// The registry's principals and tools as Cedar entities.
    #[error("{0}")]
    Entity(#[source] Box<cedar_policy::EntityAttrEvaluationError>),
    #[error("{0}")]
    Entities(#[source] Box<cedar_policy::entities_errors::EntitiesError>),
}
