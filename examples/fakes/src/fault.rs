//! Switchable faults, for tests and benchmarks of what a gateway does when the target system
//! misbehaves. A fault is `KIND[=VALUE][,every=N|,rate=P][,tool=NAME]`:
//!
//! - `slow=MS`: answer after MS milliseconds;
//! - `timeout-after-commit`: commit the effect, then never answer;
//! - `error-after-commit`: commit the effect, then answer with a JSON-RPC internal error;
//! - `duplicate-delivery`: deliver the call to the handler twice (as a retrying network would)
//!   and answer with the second delivery's result.
//!
//! `every=N` fires on the Nth, 2Nth… matching call; `rate=P` fires with probability P from a
//! seeded generator (`--seed`), so a run is repeatable. Without a selector a fault always fires.

use std::fmt;
use std::str::FromStr;
use std::sync::Mutex;
use std::time::Duration;

/// What a fault does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FaultKind {
    Slow(Duration),
    TimeoutAfterCommit,
    ErrorAfterCommit,
    DuplicateDelivery,
}

impl FaultKind {
    pub fn name(&self) -> &'static str {
        match self {
            FaultKind::Slow(_) => "slow",
            FaultKind::TimeoutAfterCommit => "timeout-after-commit",
            FaultKind::ErrorAfterCommit => "error-after-commit",
            FaultKind::DuplicateDelivery => "duplicate-delivery",
        }
    }
}

/// Which calls a fault fires on.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Selector {
    Always,
    EveryNth(u64),
    Rate(f64),
}

/// One `--fault` flag, parsed.
#[derive(Debug, Clone, PartialEq)]
pub struct FaultSpec {
    pub kind: FaultKind,
    pub selector: Selector,
    /// Only calls of this (upstream) tool; all tools when absent.
    pub tool: Option<String>,
}

/// Why a `--fault` flag could not be parsed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FaultParseError(String);

impl fmt::Display for FaultParseError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}; a fault is KIND[=VALUE][,every=N|,rate=P][,tool=NAME] with KIND one of \
             slow=MS, timeout-after-commit, error-after-commit, duplicate-delivery",
            self.0
        )
    }
}

impl std::error::Error for FaultParseError {}

impl FromStr for FaultSpec {
    type Err = FaultParseError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let mut parts = s.split(',').map(str::trim);
        let head = parts.next().unwrap_or_default();
        let (name, value) = match head.split_once('=') {
            Some((n, v)) => (n, Some(v)),
            None => (head, None),
        };
        let kind = match (name, value) {
            ("slow", Some(ms)) => {
                FaultKind::Slow(Duration::from_millis(ms.parse().map_err(|_| {
                    FaultParseError(format!("slow needs milliseconds, got '{ms}'"))
                })?))
            }
            ("slow", None) => return Err(FaultParseError("slow needs a value: slow=MS".into())),
            ("timeout-after-commit", None) => FaultKind::TimeoutAfterCommit,
            ("error-after-commit", None) => FaultKind::ErrorAfterCommit,
            ("duplicate-delivery", None) => FaultKind::DuplicateDelivery,
            (other, _) => return Err(FaultParseError(format!("unknown fault '{other}'"))),
        };
        let mut spec = FaultSpec {
            kind,
            selector: Selector::Always,
            tool: None,
        };
        for part in parts {
            match part.split_once('=') {
                Some(("every", n)) => {
                    let n: u64 =
                        n.parse().ok().filter(|n| *n > 0).ok_or_else(|| {
                            FaultParseError(format!("every needs N ≥ 1, got '{n}'"))
                        })?;
                    spec.selector = Selector::EveryNth(n);
                }
                Some(("rate", p)) => {
                    let p: f64 = p
                        .parse()
                        .ok()
                        .filter(|p| (0.0..=1.0).contains(p))
                        .ok_or_else(|| {
                            FaultParseError(format!("rate needs 0 ≤ P ≤ 1, got '{p}'"))
                        })?;
                    spec.selector = Selector::Rate(p);
                }
                Some(("tool", t)) if !t.is_empty() => spec.tool = Some(t.to_string()),
                _ => return Err(FaultParseError(format!("unknown selector '{part}'"))),
            }
        }
        Ok(spec)
    }
}

/// The faults of one server process, with their counters and a seeded generator.
#[derive(Debug)]
pub struct FaultPlan {
    specs: Vec<FaultSpec>,
    state: Mutex<PlanState>,
}

#[derive(Debug)]
struct PlanState {
    /// Matching calls seen, per spec.
    seen: Vec<u64>,
    rng: u64,
}

impl FaultPlan {
    pub fn new(specs: Vec<FaultSpec>, seed: u64) -> FaultPlan {
        let n = specs.len();
        FaultPlan {
            specs,
            state: Mutex::new(PlanState {
                seen: vec![0; n],
                // xorshift must not start at zero.
                rng: seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1,
            }),
        }
    }

    pub fn none() -> FaultPlan {
        FaultPlan::new(Vec::new(), 1)
    }

    /// The faults that fire on this call of `tool`.
    pub fn select(&self, tool: &str) -> Vec<FaultKind> {
        let mut state = self.state.lock().expect("fault plan lock");
        let mut fired = Vec::new();
        for (i, spec) in self.specs.iter().enumerate() {
            if spec.tool.as_deref().is_some_and(|t| t != tool) {
                continue;
            }
            state.seen[i] += 1;
            let fire = match spec.selector {
                Selector::Always => true,
                Selector::EveryNth(n) => state.seen[i].is_multiple_of(n),
                Selector::Rate(p) => {
                    let mut x = state.rng;
                    x ^= x << 13;
                    x ^= x >> 7;
                    x ^= x << 17;
                    state.rng = x;
                    ((x >> 11) as f64 / (1u64 << 53) as f64) < p
                }
            };
            if fire {
                fired.push(spec.kind);
            }
        }
        fired
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_each_kind_and_selector() {
        let s: FaultSpec = "slow=250".parse().unwrap();
        assert_eq!(s.kind, FaultKind::Slow(Duration::from_millis(250)));
        assert_eq!(s.selector, Selector::Always);
        let s: FaultSpec = "timeout-after-commit,every=3,tool=schedule_payment"
            .parse()
            .unwrap();
        assert_eq!(s.kind, FaultKind::TimeoutAfterCommit);
        assert_eq!(s.selector, Selector::EveryNth(3));
        assert_eq!(s.tool.as_deref(), Some("schedule_payment"));
        let s: FaultSpec = "duplicate-delivery,rate=0.25".parse().unwrap();
        assert_eq!(s.selector, Selector::Rate(0.25));
        assert!("error-after-commit".parse::<FaultSpec>().is_ok());
        assert!("slow".parse::<FaultSpec>().is_err());
        assert!("explode".parse::<FaultSpec>().is_err());
        assert!("slow=5,every=0".parse::<FaultSpec>().is_err());
        assert!("slow=5,rate=2".parse::<FaultSpec>().is_err());
    }

    #[test]
    fn every_nth_fires_on_multiples_of_matching_calls_only() {
        let plan = FaultPlan::new(
            vec!["error-after-commit,every=2,tool=a".parse().unwrap()],
            7,
        );
        let fired: Vec<bool> = ["a", "b", "a", "a", "b", "a"]
            .iter()
            .map(|t| !plan.select(t).is_empty())
            .collect();
        assert_eq!(fired, [false, false, true, false, false, true]);
    }

    #[test]
    fn rate_is_repeatable_for_a_seed_and_near_its_probability() {
        let run = |seed| {
            let plan = FaultPlan::new(vec!["duplicate-delivery,rate=0.3".parse().unwrap()], seed);
            (0..2000).filter(|_| !plan.select("x").is_empty()).count()
        };
        assert_eq!(run(42), run(42));
        let n = run(42);
        assert!((450..750).contains(&n), "fired {n} of 2000 at rate 0.3");
    }
}
