//! The id of the rule behind a check's outcome and a decision (`grant.purpose`, `gate.always`, a
//! policy's id, `schema.maximum`, `budget.window.<id>`). The engine's own rules are constants;
//! the others are made from what the registry names (a policy, a window budget, a destination's
//! rule) or from the schema constraint that failed, by one constructor each. Rules are open — a
//! registry adds its own — so this is a newtype, not an enum. It is written as its text, byte for
//! byte, wherever it is recorded (serde transparent): the audit chain's hashes do not change.

use std::borrow::Cow;
use std::fmt;
use std::ops::Deref;

use serde::{Deserialize, Serialize};

use crate::model::Tier;

/// A rule id. See the module documentation.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(transparent)]
pub struct Rule(Cow<'static, str>);

impl Rule {
    /// A credential that names no principal.
    pub const CREDENTIAL: Rule = Rule::fixed("credential");
    /// An upstream tool whose definition is not the one `toolgate.lock` pins.
    pub const PIN_BLOCKED: Rule = Rule::fixed("pin.blocked");
    /// A tool that does not exist, or is not listed for the caller's role.
    pub const TOOL_UNKNOWN: Rule = Rule::fixed("tool.unknown");
    /// A call that states no purpose.
    pub const PURPOSE_MISSING: Rule = Rule::fixed("purpose.missing");
    /// A purpose the tool is not declared for.
    pub const TOOL_PURPOSE: Rule = Rule::fixed("tool.purpose");
    /// A purpose no grant of the caller's covers for the tool's scopes.
    pub const GRANT_PURPOSE: Rule = Rule::fixed("grant.purpose");
    /// A call the tool requires a reason for, without one.
    pub const REASON_MISSING: Rule = Rule::fixed("reason.missing");
    /// A tier above what the grants allow.
    pub const GRANT_TIER: Rule = Rule::fixed("grant.tier");
    /// A sensitivity above what the grants allow.
    pub const GRANT_SENSITIVITY: Rule = Rule::fixed("grant.sensitivity");
    /// The tool's per-run rate limit, used up.
    pub const RATE_LIMIT: Rule = Rule::fixed("rate_limit");
    /// A policy that could not be evaluated (fails closed).
    pub const POLICY_ERROR: Rule = Rule::fixed("policy.error");
    /// An operation already made by another principal.
    pub const IDEMPOTENCY_ELSEWHERE: Rule = Rule::fixed("idempotency.elsewhere");
    /// An idempotency key used again with other inputs.
    pub const IDEMPOTENCY_INPUTS_DIFFER: Rule = Rule::fixed("idempotency.inputs_differ");
    /// A call attempted as often as it may be.
    pub const ATTEMPTS_EXHAUSTED: Rule = Rule::fixed("attempts.exhausted");
    /// A tool that always needs a person's approval.
    pub const GATE_ALWAYS: Rule = Rule::fixed("gate.always");
    /// A call a person rejected.
    pub const APPROVAL_REJECTED: Rule = Rule::fixed("approval.rejected");
    /// A planned step a reviewer rejected.
    pub const REVIEW_REJECTED: Rule = Rule::fixed("review.rejected");
    /// An earlier attempt of the same operation has not finished.
    pub const IDEMPOTENCY_IN_PROGRESS: Rule = Rule::fixed("idempotency.in_progress");
    /// An earlier attempt of the same operation has an unknown outcome.
    pub const IDEMPOTENCY_UNKNOWN: Rule = Rule::fixed("idempotency.unknown");
    /// The target answered "no".
    pub const HANDLER_FAILED: Rule = Rule::fixed("handler.failed");
    /// A read or write that timed out: it did not happen, and may be retried.
    pub const TIMEOUT_RETRYABLE: Rule = Rule::fixed("timeout.retryable");
    /// A read or write that got no clean answer: it did not happen, and may be retried.
    pub const UNANSWERED_RETRYABLE: Rule = Rule::fixed("unanswered.retryable");
    /// An irreversible call that timed out: it may have happened.
    pub const TIMEOUT_IRREVERSIBLE: Rule = Rule::fixed("timeout.irreversible");
    /// An irreversible call that got no clean answer: it may have happened.
    pub const UNANSWERED_IRREVERSIBLE: Rule = Rule::fixed("unanswered.irreversible");
    /// A write not made because the values it would change could not be read first.
    pub const COMPENSATE_UNREAD: Rule = Rule::fixed("compensate_with.unread");
    /// A read whose worker died mid-call, settled by recovery.
    pub const RECOVERY_READ: Rule = Rule::fixed("recovery.read");
    /// A write whose worker died mid-call: its outcome is unknown.
    pub const RECOVERY_UNKNOWN: Rule = Rule::fixed("recovery.unknown");
    /// A step of an aborted run.
    pub const RUN_ABORTED: Rule = Rule::fixed("run.aborted");
    /// A run that is not the caller's.
    pub const RUN_FOREIGN: Rule = Rule::fixed("run.foreign");
    /// A run the caller has none of by that id.
    pub const RUN_UNKNOWN: Rule = Rule::fixed("run.unknown");
    /// A plan-bound principal's call that matches no planned step.
    pub const PLAN_UNPLANNED: Rule = Rule::fixed("plan.unplanned");
    /// A planned step no worker may execute.
    pub const PLAN_WORKER: Rule = Rule::fixed("plan.worker");
    /// A commit of a preview that takes other arguments than the plan id.
    pub const PREVIEW_PLAN_ID_ONLY: Rule = Rule::fixed("preview.plan_id_only");
    /// A commit of no plan of the caller's.
    pub const PREVIEW_UNKNOWN_PLAN: Rule = Rule::fixed("preview.unknown_plan");
    /// A commit of an expired plan.
    pub const PREVIEW_EXPIRED: Rule = Rule::fixed("preview.expired");
    /// A commit of a plan whose tool changed since the preview.
    pub const PREVIEW_TOOL_CHANGED: Rule = Rule::fixed("preview.tool_changed");
    /// An upstream served at its pinned definitions.
    pub const PIN_SERVED: Rule = Rule::fixed("pin.served");
    /// An upstream server blocked whole by `toolgate.lock`.
    pub const PIN_SERVER_BLOCKED: Rule = Rule::fixed("pin.server_blocked");
    /// One upstream tool blocked by `toolgate.lock`.
    pub const PIN_TOOL_BLOCKED: Rule = Rule::fixed("pin.tool_blocked");
    /// A registry folder that failed validation on reload.
    pub const RELOAD_INVALID: Rule = Rule::fixed("reload.invalid");
    /// A person re-pinned upstream definitions.
    pub const LOCK_APPROVE: Rule = Rule::fixed("lock.approve");
    /// The inputs of a built-in tool that do not fit its schema.
    pub const SCHEMA: Rule = Rule::fixed("schema");
    /// A refusal that names no rule of its own.
    pub const REFUSED: Rule = Rule::fixed("refused");

    const fn fixed(id: &'static str) -> Rule {
        Rule(Cow::Borrowed(id))
    }

    /// A rule the registry names (a policy's id, a destination's rule), as written there.
    pub fn new(id: impl Into<String>) -> Rule {
        Rule(Cow::Owned(id.into()))
    }

    /// The schema constraint the inputs failed first (`schema.maximum`, `schema.required`…).
    pub fn schema(constraint: &str) -> Rule {
        Rule::new(format!("schema.{constraint}"))
    }

    /// A destination field whose value is not on its list (`destination.<field>`).
    pub fn destination(field: &str) -> Rule {
        Rule::new(format!("destination.{field}"))
    }

    /// The daily budget of `tier` (`budget.<tier>`).
    pub fn daily_budget(tier: Tier) -> Rule {
        Rule::new(format!("budget.{tier}"))
    }

    /// The window budget `id` (`budget.window.<id>`).
    pub fn window(id: &str) -> Rule {
        Rule::new(format!("budget.window.{id}"))
    }

    /// The lookup `read` that reads the values a write changes, before it (`compensate_with.<read>`).
    pub fn compensate_with(read: &str) -> Rule {
        Rule::new(format!("compensate_with.{read}"))
    }

    /// The compensation of step `step_id` (`compensates.<step>`).
    pub fn compensates(step_id: &str) -> Rule {
        Rule::new(format!("compensates.{step_id}"))
    }

    /// An `unknown` call settled by asking the target with the lookup `lookup`
    /// (`reconciled.<lookup>`).
    pub fn reconciled(lookup: &str) -> Rule {
        Rule::new(format!("reconciled.{lookup}"))
    }

    /// Whether a call failed by this rule did not happen and may be made again with the same
    /// inputs: the one place that says which failures an agent is told to retry.
    pub fn is_retryable(&self) -> bool {
        *self == Rule::TIMEOUT_RETRYABLE
            || *self == Rule::UNANSWERED_RETRYABLE
            || *self == Rule::COMPENSATE_UNREAD
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for Rule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl Deref for Rule {
    type Target = str;
    fn deref(&self) -> &str {
        &self.0
    }
}

impl AsRef<str> for Rule {
    fn as_ref(&self) -> &str {
        &self.0
    }
}

impl From<String> for Rule {
    fn from(id: String) -> Rule {
        Rule::new(id)
    }
}

impl From<&Rule> for Rule {
    fn from(rule: &Rule) -> Rule {
        rule.clone()
    }
}

impl From<&str> for Rule {
    fn from(id: &str) -> Rule {
        Rule::new(id)
    }
}

impl From<&Rule> for String {
    fn from(rule: &Rule) -> String {
        rule.0.to_string()
    }
}

impl From<Rule> for String {
    fn from(rule: Rule) -> String {
        rule.0.into_owned()
    }
}

impl PartialEq<str> for Rule {
    fn eq(&self, other: &str) -> bool {
        self.0 == other
    }
}

impl PartialEq<&str> for Rule {
    fn eq(&self, other: &&str) -> bool {
        self.0 == *other
    }
}

impl PartialEq<String> for Rule {
    fn eq(&self, other: &String) -> bool {
        self.0.as_ref() == other.as_str()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_rule_is_written_as_its_text() {
        assert_eq!(
            serde_json::to_string(&Rule::GATE_ALWAYS).unwrap(),
            "\"gate.always\""
        );
        assert_eq!(
            serde_json::from_str::<Rule>("\"gate.always\"").unwrap(),
            Rule::GATE_ALWAYS
        );
        assert_eq!(Rule::schema("maximum"), "schema.maximum");
        assert_eq!(
            Rule::window("daily-eur").to_string(),
            "budget.window.daily-eur"
        );
    }

    #[test]
    fn only_a_failure_that_did_not_happen_is_retryable() {
        assert!(Rule::TIMEOUT_RETRYABLE.is_retryable());
        assert!(Rule::UNANSWERED_RETRYABLE.is_retryable());
        assert!(Rule::new("unanswered.retryable").is_retryable());
        // Not made because the values it would change could not be read first.
        assert!(Rule::COMPENSATE_UNREAD.is_retryable());
        assert!(!Rule::PIN_BLOCKED.is_retryable());
        assert!(!Rule::HANDLER_FAILED.is_retryable());
        assert!(!Rule::TIMEOUT_IRREVERSIBLE.is_retryable());
        assert!(!Rule::UNANSWERED_IRREVERSIBLE.is_retryable());
    }
}
