//! The domain's small closed sets and identifiers. Effect, tier and sensitivity are enums so a
//! misspelt class is a load error, never a string compared at 3 a.m.

use std::fmt;

use serde::{Deserialize, Serialize};

/// How reversible a call is. Decides gating, retry and what the audit record must carry.
#[derive(
    Debug,
    Clone,
    Copy,
    PartialEq,
    Eq,
    Hash,
    PartialOrd,
    Ord,
    Serialize,
    Deserialize,
    schemars::JsonSchema,
)]
#[serde(rename_all = "snake_case")]
pub enum Effect {
    /// Observes state only.
    Read,
    /// Changes state and has a compensating tool.
    Write,
    /// Cannot be undone; a timeout leaves it `unknown`, never retried blind.
    Irreversible,
}

/// What a call does to the business. Grants cap it; budgets count it.
#[derive(
    Debug,
    Clone,
    Copy,
    PartialEq,
    Eq,
    Hash,
    PartialOrd,
    Ord,
    Serialize,
    Deserialize,
    schemars::JsonSchema,
)]
#[serde(rename_all = "snake_case")]
pub enum Tier {
    Read,
    Act,
    Spend,
}

/// The data axis: how sensitive the data a tool touches is.
#[derive(
    Debug,
    Clone,
    Copy,
    PartialEq,
    Eq,
    Hash,
    PartialOrd,
    Ord,
    Serialize,
    Deserialize,
    schemars::JsonSchema,
)]
#[serde(rename_all = "snake_case")]
pub enum Sensitivity {
    Public,
    Internal,
    Confidential,
    Restricted,
}

/// Whether a principal is a program or a person. Only people approve.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum PrincipalKind {
    Agent,
    Human,
}

/// When a tool needs a person's approval.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, Default, schemars::JsonSchema,
)]
#[serde(rename_all = "snake_case")]
pub enum Gate {
    /// Never gated by the tool itself (a `@gate` policy can still gate a call).
    #[default]
    Never,
    /// Every call needs an approval.
    Always,
    /// Shadow mode for the tool's gate: every call is recorded as one that would have needed an
    /// approval (`gate.always`), and nothing waits. Switch to `always` once the evidence is in.
    Shadow,
}

/// The life of a step. Terminal states are recorded, never re-run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum StepStatus {
    Pending,
    Running,
    NeedsApproval,
    Done,
    Failed,
    Refused,
    Unknown,
}

macro_rules! named_enum {
    ($($t:ty),*) => {$(
        impl $t {
            /// The name used in configuration, storage and messages.
            pub fn as_str(self) -> &'static str {
                self.name()
            }
        }
        impl fmt::Display for $t {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(self.name())
            }
        }
    )*};
}

impl Effect {
    fn name(&self) -> &'static str {
        match self {
            Effect::Read => "read",
            Effect::Write => "write",
            Effect::Irreversible => "irreversible",
        }
    }
}
impl Tier {
    fn name(&self) -> &'static str {
        match self {
            Tier::Read => "read",
            Tier::Act => "act",
            Tier::Spend => "spend",
        }
    }
}
impl Sensitivity {
    fn name(&self) -> &'static str {
        match self {
            Sensitivity::Public => "public",
            Sensitivity::Internal => "internal",
            Sensitivity::Confidential => "confidential",
            Sensitivity::Restricted => "restricted",
        }
    }
}
impl PrincipalKind {
    fn name(&self) -> &'static str {
        match self {
            PrincipalKind::Agent => "agent",
            PrincipalKind::Human => "human",
        }
    }
}
impl Gate {
    fn name(&self) -> &'static str {
        match self {
            Gate::Never => "never",
            Gate::Always => "always",
            Gate::Shadow => "shadow",
        }
    }
}
impl StepStatus {
    fn name(&self) -> &'static str {
        match self {
            StepStatus::Pending => "pending",
            StepStatus::Running => "running",
            StepStatus::NeedsApproval => "needs_approval",
            StepStatus::Done => "done",
            StepStatus::Failed => "failed",
            StepStatus::Refused => "refused",
            StepStatus::Unknown => "unknown",
        }
    }

    /// Parses the stored name of a status.
    pub fn parse(s: &str) -> Option<Self> {
        Some(match s {
            "pending" => StepStatus::Pending,
            "running" => StepStatus::Running,
            "needs_approval" => StepStatus::NeedsApproval,
            "done" => StepStatus::Done,
            "failed" => StepStatus::Failed,
            "refused" => StepStatus::Refused,
            "unknown" => StepStatus::Unknown,
            _ => return None,
        })
    }

    /// A step in one of these states returns what was recorded instead of running again.
    pub fn is_settled(self) -> bool {
        matches!(
            self,
            StepStatus::Done
                | StepStatus::Refused
                | StepStatus::NeedsApproval
                | StepStatus::Unknown
        )
    }
}

named_enum!(Effect, Tier, Sensitivity, PrincipalKind, Gate, StepStatus);

/// A point in time, in milliseconds since the Unix epoch (UTC). The engine never reads a clock
/// itself; callers pass one in, so tests can move time.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(transparent)]
pub struct Timestamp(pub i64);

impl Timestamp {
    pub const fn from_millis(ms: i64) -> Self {
        Timestamp(ms)
    }
    pub const fn millis(self) -> i64 {
        self.0
    }
    pub const fn plus_hours(self, hours: i64) -> Self {
        Timestamp(self.0 + hours * 3_600_000)
    }
    /// The UTC day number (days since the epoch), the unit of daily budgets.
    pub const fn utc_day(self) -> i64 {
        self.0.div_euclid(86_400_000)
    }

    /// `YYYY-MM-DDTHH:MM:SSZ`, to the second, for messages people and models read.
    pub fn to_rfc3339(self) -> String {
        self.format(time::macros::format_description!(
            "[year]-[month]-[day]T[hour]:[minute]:[second]Z"
        ))
    }

    /// `YYYY-MM-DDTHH:MM:SS.mmmZ`.
    pub fn to_rfc3339_millis(self) -> String {
        self.format(time::macros::format_description!(
            "[year]-[month]-[day]T[hour]:[minute]:[second].[subsecond digits:3]Z"
        ))
    }

    /// `2026-11-30 09:12:03 UTC`.
    pub fn to_utc_text(self) -> String {
        self.format(time::macros::format_description!(
            "[year]-[month]-[day] [hour]:[minute]:[second] UTC"
        ))
    }

    fn format(self, f: &[time::format_description::BorrowedFormatItem<'_>]) -> String {
        time::OffsetDateTime::from_unix_timestamp_nanos(i128::from(self.0) * 1_000_000)
            .ok()
            .and_then(|t| t.format(f).ok())
            .unwrap_or_else(|| format!("{} ms after the epoch", self.0))
    }
}

/// Where the engine gets "now" from. Production uses [`SystemClock`]; tests a fixed one.
pub trait Clock: Send + Sync {
    fn now(&self) -> Timestamp;
}

/// The wall clock.
#[derive(Debug, Clone, Copy, Default)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now(&self) -> Timestamp {
        let d = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default();
        Timestamp(d.as_millis() as i64)
    }
}

/// A clock that says what it is told; for tests and deterministic replays.
#[derive(Debug)]
pub struct FixedClock(pub std::sync::atomic::AtomicI64);

impl FixedClock {
    pub fn at(t: Timestamp) -> Self {
        FixedClock(std::sync::atomic::AtomicI64::new(t.0))
    }
    pub fn advance_hours(&self, hours: i64) {
        self.0
            .fetch_add(hours * 3_600_000, std::sync::atomic::Ordering::SeqCst);
    }
}

impl Clock for FixedClock {
    fn now(&self) -> Timestamp {
        Timestamp(self.0.load(std::sync::atomic::Ordering::SeqCst))
    }
}
