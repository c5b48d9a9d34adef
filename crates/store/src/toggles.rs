//! Switches that turn off one of the executor's safety mechanisms at a time, for the paired
//! toggle benchmark (`toolgate-bench toggles`) and tests: the same seeded episodes with and
//! without a mechanism measure what it is worth. All on by default. Nothing in the gateway, the
//! CLI or the configuration files turns one off; only code holding the [`Executor`] can.
//!
//! The switch is shared by every clone of an executor (the gateway clones its executor per
//! call), so setting it on one clone switches the running gateway.
//!
//! [`Executor`]: crate::Executor

use std::sync::Arc;
use std::sync::atomic::{AtomicU8, Ordering};

/// Which mechanisms are on. `ExecutorToggles::default()` is all on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ExecutorToggles {
    /// A direct call's idempotency key is derived from (run, tool, identity fields). Off: each
    /// call gets a freshly minted key, as when the caller mints one per request.
    pub derived_keys: bool,
    /// A call's key is reserved (`in_flight`) before the handler is called, and a reserved key
    /// stops another attempt. Off: an in-flight or `unknown` key does not stop a new attempt;
    /// only a finished outcome is replayed.
    pub reserve_before_call: bool,
    /// A timeout on an irreversible call becomes `unknown` and waits for reconciliation. Off:
    /// it is a retryable failure like any other timeout (its key is released).
    pub unknown_on_timeout: bool,
    /// An approval binds the exact canonical inputs. Off: a token approved for one set of
    /// inputs also passes for other inputs of the same call (same subject, tool and version).
    pub approval_binding: bool,
}

impl Default for ExecutorToggles {
    fn default() -> Self {
        ExecutorToggles {
            derived_keys: true,
            reserve_before_call: true,
            unknown_on_timeout: true,
            approval_binding: true,
        }
    }
}

const DERIVED_KEYS: u8 = 1;
const RESERVE_BEFORE_CALL: u8 = 2;
const UNKNOWN_ON_TIMEOUT: u8 = 4;
const APPROVAL_BINDING: u8 = 8;

impl ExecutorToggles {
    /// Every mechanism on except the one named (`derived-keys`, `reserve-before-call`,
    /// `unknown-on-timeout`, `approval-binding`); `None` for an unknown name.
    pub fn all_but(name: &str) -> Option<ExecutorToggles> {
        let mut t = ExecutorToggles::default();
        match name {
            "derived-keys" => t.derived_keys = false,
            "reserve-before-call" => t.reserve_before_call = false,
            "unknown-on-timeout" => t.unknown_on_timeout = false,
            "approval-binding" => t.approval_binding = false,
            _ => return None,
        }
        Some(t)
    }

    fn bits(self) -> u8 {
        let mut b = 0;
        for (on, bit) in [
            (self.derived_keys, DERIVED_KEYS),
            (self.reserve_before_call, RESERVE_BEFORE_CALL),
            (self.unknown_on_timeout, UNKNOWN_ON_TIMEOUT),
            (self.approval_binding, APPROVAL_BINDING),
        ] {
            if !on {
                b |= bit;
            }
        }
        b
    }

    fn from_bits(b: u8) -> ExecutorToggles {
        ExecutorToggles {
            derived_keys: b & DERIVED_KEYS == 0,
            reserve_before_call: b & RESERVE_BEFORE_CALL == 0,
            unknown_on_timeout: b & UNKNOWN_ON_TIMEOUT == 0,
            approval_binding: b & APPROVAL_BINDING == 0,
        }
    }
}

/// The shared switch an executor reads at each decision point.
#[derive(Debug, Clone, Default)]
pub struct Toggles(Arc<AtomicU8>);

impl Toggles {
    /// What is on now.
    pub fn get(&self) -> ExecutorToggles {
        ExecutorToggles::from_bits(self.0.load(Ordering::Relaxed))
    }

    /// Sets what is on for every clone of the executor, from the next decision on.
    pub fn set(&self, t: ExecutorToggles) {
        self.0.store(t.bits(), Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_is_all_on_and_each_name_turns_off_exactly_one() {
        let t = Toggles::default();
        assert_eq!(t.get(), ExecutorToggles::default());
        for name in [
            "derived-keys",
            "reserve-before-call",
            "unknown-on-timeout",
            "approval-binding",
        ] {
            let off = ExecutorToggles::all_but(name).expect("a known name");
            let clone = t.clone();
            clone.set(off);
            assert_eq!(t.get(), off, "{name}: clones share the switch");
            let on = [
                off.derived_keys,
                off.reserve_before_call,
                off.unknown_on_timeout,
                off.approval_binding,
            ];
            assert_eq!(on.iter().filter(|x| !**x).count(), 1, "{name}");
        }
        assert_eq!(ExecutorToggles::all_but("everything"), None);
    }
}
