//! Who does a tool's work: an upstream MCP server, or toolgate itself (a built-in).
//!
//! The registry file says it as `handler: {upstream, tool}` or `handler: {builtin}`
//! ([`HandlerConfig`](crate::config::HandlerConfig), the shape people write); a loaded
//! registry has checked that each tool names exactly one of them, so code that acts on a tool
//! asks [`Tool::handler`](crate::registry::Tool::handler) and matches on the answer instead of
//! comparing names.

use std::fmt;

/// The tools toolgate implements itself.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Builtin {
    /// A planner submits a plan of steps for workers to run.
    PlanSubmit,
    /// A reviewer approves a planned step.
    StepApprove,
    /// A reviewer rejects a planned step.
    StepReject,
    /// The state of a run and its steps.
    RunStatus,
}

impl Builtin {
    pub const ALL: [Builtin; 4] = [
        Builtin::PlanSubmit,
        Builtin::StepApprove,
        Builtin::StepReject,
        Builtin::RunStatus,
    ];

    /// Its name in a registry file (`handler: {builtin: NAME}`), which is also the name it is
    /// listed under.
    pub const fn name(self) -> &'static str {
        match self {
            Builtin::PlanSubmit => "plan.submit",
            Builtin::StepApprove => "step.approve",
            Builtin::StepReject => "step.reject",
            Builtin::RunStatus => "run.status",
        }
    }

    pub fn from_name(name: &str) -> Option<Builtin> {
        Builtin::ALL.into_iter().find(|b| b.name() == name)
    }

    /// A reviewer's verdict on a step.
    pub const fn is_review(self) -> bool {
        matches!(self, Builtin::StepApprove | Builtin::StepReject)
    }

    /// Whether what it writes is only toolgate's own record (a plan, a review): nothing
    /// outside toolgate changes, so there is nothing a compensating tool could undo.
    pub const fn records_only(self) -> bool {
        !matches!(self, Builtin::RunStatus)
    }
}

impl fmt::Display for Builtin {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// Who does one tool's work.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Handler<'a> {
    /// `tool` on the upstream server `server` (named in `toolgate.yaml`).
    Upstream { server: &'a str, tool: &'a str },
    /// toolgate itself.
    Builtin(Builtin),
}

impl Handler<'_> {
    pub fn builtin(self) -> Option<Builtin> {
        match self {
            Handler::Builtin(b) => Some(b),
            Handler::Upstream { .. } => None,
        }
    }

    pub fn is_upstream(self) -> bool {
        matches!(self, Handler::Upstream { .. })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_builtin_is_found_by_its_name_and_nothing_else_is() {
        for b in Builtin::ALL {
            assert_eq!(Builtin::from_name(b.name()), Some(b));
            assert_eq!(b.to_string(), b.name());
        }
        assert_eq!(Builtin::from_name("plan.Submit"), None);
        assert_eq!(Builtin::from_name("step.approve "), None);
        assert_eq!(Builtin::from_name(""), None);
    }
}
