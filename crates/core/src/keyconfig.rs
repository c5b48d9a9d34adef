//! The shape of the key settings in toolgate.yaml (`approvals.key_*`, `approvals.previous`,
//! `redaction.key_*`), checked when the registry loads. Reading the keys themselves is I/O and
//! happens where a process starts (`toolgate_gateway::keys`); what can be wrong with the
//! settings alone is a load error here, so `toolgate check` finds it before a deploy does.

use std::collections::BTreeSet;

use crate::config::GatewayFile;
use crate::registry::Finding;

/// The shortest key accepted, in bytes: an HMAC-SHA256 key shorter than its output gives away
/// strength (`toolgate key secret` and `openssl rand -hex 32` make 64).
pub const MIN_KEY_BYTES: usize = 32;

/// Whether `id` can name a key in a token's wire form `tg1.<key id>.<claims>.<mac>`.
fn valid_id(id: &str) -> bool {
    !id.is_empty()
        && id.len() <= 64
        && id
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_')
}

/// Every problem with the key settings, as findings.
pub fn check(gateway: &GatewayFile) -> Vec<Finding> {
    let top = "toolgate.yaml";
    let a = &gateway.approvals;
    let mut out = Vec::new();
    let mut finding = |path: String, rule: &str, message: String, fix: String| {
        out.push(Finding {
            file: top.to_string(),
            path,
            rule: rule.to_string(),
            message,
            fix,
        })
    };
    let id_fix = "use letters, digits, '-' and '_' only (at most 64), such as k2".to_string();
    if !valid_id(&a.key_id) {
        finding(
            "approvals.key_id".into(),
            "config.key-id",
            format!("'{}' cannot name a key in an approval token", a.key_id),
            id_fix.clone(),
        );
    }
    for (name, env) in [
        ("approvals.key_env", &a.key_env),
        ("redaction.key_env", &gateway.redaction.key_env),
    ] {
        if env.trim().is_empty() {
            finding(
                name.into(),
                "config.key-source",
                "is empty, so the key could come from no environment variable".into(),
                "name an environment variable, or leave the setting out for the default".into(),
            );
        }
    }
    let mut seen = BTreeSet::from([a.key_id.as_str()]);
    for (i, p) in a.previous.iter().enumerate() {
        let path = format!("approvals.previous[{i}]");
        if !valid_id(&p.id) {
            finding(
                format!("{path}.id"),
                "config.key-id",
                format!("'{}' cannot name a key in an approval token", p.id),
                id_fix.clone(),
            );
        } else if !seen.insert(p.id.as_str()) {
            finding(
                format!("{path}.id"),
                "config.key-id",
                if p.id == a.key_id {
                    format!("'{}' is also the current key's id (approvals.key_id)", p.id)
                } else {
                    format!("'{}' names two previous keys", p.id)
                },
                "give each key its own id: tokens name the key that signed them, and a \
                 rotated key needs a new id (the current k1 becomes a previous k1, the new key k2)"
                    .into(),
            );
        }
        match (&p.env, &p.file) {
            (Some(_), Some(_)) => finding(
                path,
                "config.key-source",
                format!("previous key '{}' names both an env and a file", p.id),
                "keep one: `env: VARIABLE` or `file: PATH`".into(),
            ),
            (None, None) => finding(
                path,
                "config.key-source",
                format!("previous key '{}' says neither where to read it", p.id),
                "add `env: VARIABLE` or `file: PATH`".into(),
            ),
            _ => {}
        }
    }
    out
}

#[cfg(test)]
#[path = "keyconfig_tests.rs"]
mod tests;
