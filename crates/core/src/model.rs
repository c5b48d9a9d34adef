//! The domain's small closed sets and identifiers. Effect, tier and sensitivity are enums so a
//! misspelt class is a load error, never a string compared at 3 a.m.

use std::fmt;

use serde::{Deserialize, Serialize};

/// How reversible a call is. Decides gating, retry and what the audit record must carry.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
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
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Tier {
    Read,
    Act,
    Spend,
}

/// The data axis: how sensitive the data a tool touches is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Sensitivity {
    Public,
    Internal,
    Confidential,
    Restricted,
}

/// Whether a principal is a program or a person. Only people approve.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum PrincipalKind {
    Agent,
    Human,
}

/// When a tool needs a person's approval.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, Default)]
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
        let secs = self.0.div_euclid(1000);
        let days = secs.div_euclid(86_400);
        let rem = secs.rem_euclid(86_400);
        // Civil date from days since 1970-01-01 (Howard Hinnant's algorithm).
        let z = days + 719_468;
        let era = z.div_euclid(146_097);
        let doe = z - era * 146_097;
        let yoe = (doe - doe / 1_460 + doe / 36_524 - doe / 146_096) / 365;
        let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
        let mp = (5 * doy + 2) / 153;
        let d = doy - (153 * mp + 2) / 5 + 1;
        let m = if mp < 10 { mp + 3 } else { mp - 9 };
        let y = yoe + era * 400 + i64::from(m <= 2);
        format!(
            "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}Z",
            rem / 3_600,
            rem % 3_600 / 60,
            rem % 60
        )
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
