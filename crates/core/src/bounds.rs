//! The ranges of the registry's numeric settings. A value can parse and still make no sense:
//! an approval that expires as it is asked for, a timeout of zero or NaN (which would panic
//! when it becomes a `Duration`), a daily budget of 0 beside a grant that allows the tier. Each
//! such value is a load error naming the file, the path, what the value would do, and the
//! values that pass; nothing is clamped or defaulted in silence.
//!
//! Window budgets' limits and windows are checked where they are compiled ([`crate::budget`]),
//! and a tool's `approvers` where tools are resolved ([`crate::registry`]).

use std::fmt::Display;

use crate::config::{GatewayFile, PrincipalsFile, ToolConfig};
use crate::registry::Finding;

/// The range a setting must fall in, both ends included, and what a value outside would do.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Bound<T> {
    pub min: T,
    pub max: T,
    /// The unit, for messages (`hours`).
    pub unit: &'static str,
    /// The default, when the setting has one.
    pub default: Option<T>,
    /// What a value below `min` would do.
    pub too_low: &'static str,
    /// What a value above `max` would do.
    pub too_high: &'static str,
}

/// `approvals.expiry_hours`.
pub const APPROVAL_EXPIRY_HOURS: Bound<i64> = Bound {
    min: 1,
    max: 720,
    unit: "hours",
    default: Some(72),
    too_low: "every approval request would be born expired, so no gated call could be approved",
    too_high: "an approval would authorise a call decided on facts more than 30 days old",
};

/// `idempotency.retention_hours`.
pub const IDEMPOTENCY_RETENTION_HOURS: Bound<i64> = Bound {
    min: 1,
    max: 8_760,
    unit: "hours",
    default: Some(24),
    too_low: "a completed call's key would be forgotten at once, so a retry would run it again",
    too_high: "every key would be kept for more than a year",
};

/// `store.wal_preallocate_mb` (0 turns preallocation off).
pub const WAL_PREALLOCATE_MB: Bound<u64> = Bound {
    min: 0,
    max: 1_024,
    unit: "MiB",
    default: Some(40),
    too_low: "",
    too_high: "the WAL file would be grown past 1 GiB at start, far beyond the length at which \
               it starts over",
};

/// `upstreams.<name>.timeout_secs`.
pub const UPSTREAM_TIMEOUT_SECS: Bound<f64> = Bound {
    min: 0.001,
    max: 3_600.0,
    unit: "seconds",
    default: Some(30.0),
    too_low: "every call to it would time out before it could answer",
    too_high: "a hung upstream would hold the call, its idempotency key and a worker for more \
               than an hour",
};

/// `tools[i].rate_limit`.
pub const RATE_LIMIT_PER_RUN: Bound<u32> = Bound {
    min: 1,
    max: u32::MAX,
    unit: "calls per run",
    default: None,
    too_low: "no run could ever call the tool; to take a tool away, remove it from `roles`",
    too_high: "",
};

/// `tools[i].preview.expires_secs`.
pub const PREVIEW_EXPIRY_SECS: Bound<u64> = Bound {
    min: 1,
    max: 604_800,
    unit: "seconds",
    default: Some(3_600),
    too_low: "every preview's plan would be born expired, so nothing could be committed",
    too_high: "a plan could be committed more than 7 days after its preview was shown",
};

/// `principals[i].budgets.{act,spend}`.
pub const DAILY_BUDGET: Bound<u32> = Bound {
    min: 1,
    max: u32::MAX,
    unit: "calls a day",
    default: None,
    too_low: "every call of this tier its grants allow would be refused; to take a tier away, \
              lower the grants' `max_tier` (leaving the budget out leaves the tier unlimited)",
    too_high: "",
};

impl<T: PartialOrd + Display + Copy> Bound<T> {
    /// The finding for `value` at `path` in `file`, if it is out of range (or not a number).
    pub fn check(&self, file: &str, path: String, value: T) -> Option<Finding> {
        let setting = path.rsplit('.').next().unwrap_or(&path).to_string();
        let consequence = match (value.partial_cmp(&self.min), value.partial_cmp(&self.max)) {
            (None, _) | (_, None) => "it is not a number",
            (Some(std::cmp::Ordering::Less), _) => self.too_low,
            (_, Some(std::cmp::Ordering::Greater)) => self.too_high,
            _ => return None,
        };
        let default = self
            .default
            .map(|d| format!("; the default is {d}"))
            .unwrap_or_default();
        let range = if self.max_is_unbounded() {
            format!("to at least {} ({})", self.min, self.unit)
        } else {
            format!("from {} to {} ({})", self.min, self.max, self.unit)
        };
        Some(Finding {
            file: file.to_string(),
            path,
            rule: "config.range".into(),
            message: format!("{setting} is {value}: {consequence}"),
            fix: format!("set it {range}{default}"),
        })
    }

    /// Whether the top of the range is only the type's own limit (not worth printing).
    fn max_is_unbounded(&self) -> bool {
        self.too_high.is_empty()
    }
}

/// Every out-of-range numeric setting of a registry, as findings.
pub fn check(
    gateway: &GatewayFile,
    tools: &[(String, usize, ToolConfig)],
    principals: &PrincipalsFile,
) -> Vec<Finding> {
    let top = "toolgate.yaml";
    let mut out: Vec<Option<Finding>> = vec![
        APPROVAL_EXPIRY_HOURS.check(
            top,
            "approvals.expiry_hours".into(),
            gateway.approvals.expiry_hours,
        ),
        IDEMPOTENCY_RETENTION_HOURS.check(
            top,
            "idempotency.retention_hours".into(),
            gateway.idempotency.retention_hours,
        ),
        WAL_PREALLOCATE_MB.check(
            top,
            "store.wal_preallocate_mb".into(),
            gateway.store.wal_preallocate_mb,
        ),
    ];
    for (name, u) in &gateway.upstreams {
        out.push(UPSTREAM_TIMEOUT_SECS.check(
            top,
            format!("upstreams.{name}.timeout_secs"),
            u.timeout_secs,
        ));
    }
    for (file, i, t) in tools {
        if let Some(limit) = t.rate_limit {
            out.push(RATE_LIMIT_PER_RUN.check(file, format!("tools[{i}].rate_limit"), limit));
        }
        if let Some(p) = &t.preview {
            out.push(PREVIEW_EXPIRY_SECS.check(
                file,
                format!("tools[{i}].preview.expires_secs"),
                p.expires_secs,
            ));
        }
    }
    for (i, p) in principals.principals.iter().enumerate() {
        for (tier, budget) in [("act", p.budgets.act), ("spend", p.budgets.spend)] {
            if let Some(b) = budget {
                out.push(DAILY_BUDGET.check(
                    "principals.yaml",
                    format!("principals[{i}].budgets.{tier}"),
                    b,
                ));
            }
        }
    }
    out.into_iter().flatten().collect()
}

#[cfg(test)]
#[path = "bounds_tests.rs"]
mod tests;
