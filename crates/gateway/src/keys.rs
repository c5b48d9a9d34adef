//! The two secrets a process that governs calls holds: the **approval key** (signs approval
//! tokens and verifies them, so an approval granted in one process is honoured by the worker that
//! runs the step) and the **redaction key** (keys the hashes that replace sensitive fields in the
//! audit log). Each comes from an environment variable or a file toolgate.yaml names, and a
//! process without both refuses to start, saying how to provide and make them; only `--dev`
//! replaces a missing key with a development key, and then says at start and in `/readyz` what
//! that gives up. Operators' guide: docs/keys.md.

use std::path::Path;

use serde_json::{Value, json};
use toolgate_core::keyconfig::MIN_KEY_BYTES;
use toolgate_core::{ApprovalKeys, Redactor, Registry};

/// Where a process's keys come from.
#[derive(Debug, Clone, Default)]
pub enum KeySource {
    /// The environment and the files toolgate.yaml names; missing keys refuse the start.
    #[default]
    Configured,
    /// As `Configured`, but a missing key is replaced by a development key (`--dev`).
    Dev,
    /// Keys the embedding program made (tests, benchmarks), used as given.
    Given(Secrets),
}

impl KeySource {
    /// The keys this source gives for `registry`, reading the process environment.
    pub fn resolve(&self, registry: &Registry) -> Result<Secrets, KeyError> {
        let env = |name: &str| std::env::var(name).ok();
        match self {
            KeySource::Configured => load(registry, false, &env),
            KeySource::Dev => load(registry, true, &env),
            KeySource::Given(s) => Ok(s.clone()),
        }
    }
}

/// A process's keys, and which of them are development keys.
#[derive(Debug, Clone)]
pub struct Secrets {
    pub approval: ApprovalKeys,
    pub redactor: Redactor,
    pub status: KeyStatus,
    /// Where each key was read from, for the start-up log line.
    pub origin: String,
    /// Settings that were present but not used (an environment variable beside a key file).
    pub notes: Vec<String>,
}

/// Which keys a process runs with are development keys (both false: everything configured).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct KeyStatus {
    pub approval_dev: bool,
    pub redaction_dev: bool,
}

const GIVES_UP_APPROVAL: &str = "approval key: a random key made for this process alone. \
    Approvals signed with it stop verifying when the process exits, and no other gateway or \
    worker can verify them (a step approved here and run by another worker is refused).";
const GIVES_UP_REDACTION: &str = "redaction key: the development key published in toolgate's \
    source. Redacted fields (IBANs, email addresses) are stored as hashes anyone can recompute, \
    so a value with little entropy can be recovered by hashing guesses; these hashes read \
    `hmac:dev:`.";

impl KeyStatus {
    pub fn is_dev(&self) -> bool {
        self.approval_dev || self.redaction_dev
    }

    /// What the development keys in use give up, one sentence each.
    pub fn gives_up(&self) -> Vec<&'static str> {
        let mut out = Vec::new();
        if self.approval_dev {
            out.push(GIVES_UP_APPROVAL);
        }
        if self.redaction_dev {
            out.push(GIVES_UP_REDACTION);
        }
        out
    }

    /// The paragraph `--dev` prints on stderr at start; None when no development key is in use.
    pub fn warning(&self) -> Option<String> {
        if !self.is_dev() {
            return None;
        }
        let mut s = String::from(
            "WARNING: --dev: this process runs with development keys. Do not let it near real \
             data or real approvals:\n",
        );
        for g in self.gives_up() {
            s.push_str("  - ");
            s.push_str(g);
            s.push('\n');
        }
        s.push_str(
            "Provide both keys (docs/keys.md: `toolgate key secret`) and drop --dev before real use.",
        );
        Some(s)
    }

    /// The `keys` member of `/readyz`.
    pub fn to_json(&self) -> Value {
        let mode = |dev: bool| if dev { "dev" } else { "configured" };
        let mut v = json!({
            "approval": mode(self.approval_dev),
            "redaction": mode(self.redaction_dev),
        });
        if self.is_dev() {
            v["dev_gives_up"] = json!(self.gives_up());
        }
        v
    }
}

/// Which key a problem is about.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KeyKind {
    Approval,
    Redaction,
}

/// One reason a key could not be had.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KeyProblem {
    /// Neither the environment variable nor a key file holds the key.
    Missing {
        kind: KeyKind,
        env: String,
        setting: &'static str,
    },
    /// A key shorter than [`MIN_KEY_BYTES`].
    TooShort { from: String, bytes: usize },
    /// A key file that cannot be read.
    Unreadable { from: String, error: String },
    /// A key file every user of the machine can read or write.
    Exposed { from: String, mode: u32 },
    /// A previous approval key whose environment variable is not set.
    PreviousMissing { id: String, env: String },
    /// The approval key and the redaction key are one value.
    SameKey,
}

impl std::fmt::Display for KeyProblem {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            KeyProblem::Missing { kind, env, setting } => {
                let (name, does) = match kind {
                    KeyKind::Approval => ("approval key", "it signs and verifies approval tokens"),
                    KeyKind::Redaction => (
                        "redaction key",
                        "it keys the hashes that replace redacted fields in the audit log",
                    ),
                };
                write!(
                    f,
                    "no {name} ({does}): set the environment variable {env}, or set {setting} in \
                     toolgate.yaml to a file only toolgate's user can read"
                )
            }
            KeyProblem::TooShort { from, bytes } => write!(
                f,
                "{from} holds {bytes} byte(s); a key needs at least {MIN_KEY_BYTES}"
            ),
            KeyProblem::Unreadable { from, error } => write!(f, "{from} cannot be read: {error}"),
            KeyProblem::Exposed { from, mode } => write!(
                f,
                "{from} can be read or written by every user (mode {mode:03o}): run `chmod 600` on \
                 it (or 640, with a group only toolgate's user is in)"
            ),
            KeyProblem::SameKey => write!(
                f,
                "the approval key and the redaction key are the same value: make one key for each"
            ),
            KeyProblem::PreviousMissing { id, env } => write!(
                f,
                "previous approval key '{id}': the environment variable {env} is not set (remove \
                 the entry once the tokens it signed have expired)"
            ),
        }
    }
}

/// Why a process refused to start: every key problem at once, and how to fix each.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub struct KeyError {
    /// What was refused (`start`, `approve`).
    pub action: &'static str,
    pub config: String,
    pub problems: Vec<KeyProblem>,
    /// Whether the command has a `--dev` to offer.
    pub dev_offered: bool,
}

impl std::fmt::Display for KeyError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        writeln!(
            f,
            "refusing to {} without its keys ({}):",
            self.action, self.config
        )?;
        for p in &self.problems {
            writeln!(f, "  - {p}")?;
        }
        write!(
            f,
            "Make a key with `toolgate key secret --out FILE` (or `openssl rand -hex 32`): at \
             least {MIN_KEY_BYTES} bytes, one per key; keep it out of the registry's repository. \
             docs/keys.md says how to provide and rotate them."
        )?;
        if self.dev_offered {
            write!(
                f,
                "\nTo try toolgate without keys, pass --dev: approvals then die with the process, \
                 and redacted fields are hashed with a key anyone can read."
            )?;
        }
        Ok(())
    }
}

/// Reads one key from the environment variable `env` or, when set, the file `file` (relative to
/// `dir`). `Ok(None)`: neither holds one.
fn read_key(
    dir: &Path,
    env_name: &str,
    file: Option<&str>,
    setting: &str,
    env: &dyn Fn(&str) -> Option<String>,
    notes: &mut Vec<String>,
) -> Result<Option<(Vec<u8>, String)>, KeyProblem> {
    let from_env = env(env_name).filter(|v| !v.trim().is_empty());
    let (bytes, from) = match file {
        Some(file) => {
            if from_env.is_some() {
                notes.push(format!(
                    "{env_name} is set but ignored: {setting} names the key file {file}"
                ));
            }
            let path = dir.join(file);
            let from = format!("{setting} {}", path.display());
            (read_key_file(&path, &from)?, from)
        }
        None => match from_env {
            Some(v) => (v.trim().as_bytes().to_vec(), env_name.to_string()),
            None => return Ok(None),
        },
    };
    if bytes.len() < MIN_KEY_BYTES {
        return Err(KeyProblem::TooShort {
            from,
            bytes: bytes.len(),
        });
    }
    Ok(Some((bytes, from)))
}

fn read_key_file(path: &Path, from: &str) -> Result<Vec<u8>, KeyProblem> {
    let unreadable = |e: std::io::Error| KeyProblem::Unreadable {
        from: from.to_string(),
        error: e.to_string(),
    };
    let meta = std::fs::metadata(path).map_err(unreadable)?;
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        let mode = meta.permissions().mode() & 0o777;
        if mode & 0o007 != 0 {
            return Err(KeyProblem::Exposed {
                from: from.to_string(),
                mode,
            });
        }
    }
    #[cfg(not(unix))]
    let _ = meta;
    let bytes = std::fs::read(path).map_err(unreadable)?;
    Ok(bytes.trim_ascii().to_vec())
}

fn dev_approval_keys(key_id: &str) -> ApprovalKeys {
    let mut k = uuid::Uuid::new_v4().as_bytes().to_vec();
    k.extend_from_slice(uuid::Uuid::new_v4().as_bytes());
    ApprovalKeys::new(key_id, k)
}

fn config_path(registry: &Registry) -> String {
    registry.dir.join("toolgate.yaml").display().to_string()
}

/// The approval keys: the current one, which signs, and each previous one, which only verifies;
/// with where the current one came from, and its bytes. None: no usable current key (the
/// reason is in `problems`).
fn approval_keys(
    registry: &Registry,
    env: &dyn Fn(&str) -> Option<String>,
    problems: &mut Vec<KeyProblem>,
    notes: &mut Vec<String>,
) -> Option<(ApprovalKeys, String, Vec<u8>)> {
    let a = &registry.gateway.approvals;
    let dir = &registry.dir;
    let current = match read_key(
        dir,
        &a.key_env,
        a.key_file.as_deref(),
        "approvals.key_file",
        env,
        notes,
    ) {
        Ok(Some(k)) => Some(k),
        Ok(None) => {
            problems.push(KeyProblem::Missing {
                kind: KeyKind::Approval,
                env: a.key_env.clone(),
                setting: "approvals.key_file",
            });
            None
        }
        Err(p) => {
            problems.push(p);
            None
        }
    };
    let mut previous = Vec::new();
    for (i, p) in a.previous.iter().enumerate() {
        let setting = format!("approvals.previous[{i}]");
        // The registry's load checked that each entry names exactly one of `env` and `file`.
        let read = match (&p.file, &p.env) {
            (Some(file), _) => {
                let path = dir.join(file);
                let from = format!("{setting}.file {}", path.display());
                read_key_file(&path, &from).and_then(|k| {
                    if k.len() < MIN_KEY_BYTES {
                        Err(KeyProblem::TooShort {
                            from,
                            bytes: k.len(),
                        })
                    } else {
                        Ok(k)
                    }
                })
            }
            (None, Some(var)) => match read_key(dir, var, None, &setting, env, notes) {
                Ok(Some((k, _))) => Ok(k),
                Ok(None) => Err(KeyProblem::PreviousMissing {
                    id: p.id.clone(),
                    env: var.clone(),
                }),
                Err(e) => Err(e),
            },
            (None, None) => continue,
        };
        match read {
            Ok(k) => previous.push((p.id.clone(), k)),
            Err(e) => problems.push(e),
        }
    }
    let (key, from) = current?;
    let mut origin = format!("approval key {} from {from}", a.key_id);
    let mut keys = ApprovalKeys::new(a.key_id.clone(), key.clone());
    if !previous.is_empty() {
        let ids: Vec<&str> = previous.iter().map(|(id, _)| id.as_str()).collect();
        origin.push_str(&format!(" (still verifying {})", ids.join(", ")));
    }
    for (id, k) in previous {
        keys = keys.with_retired(id, k);
    }
    Some((keys, origin, key))
}

/// Both keys for `registry`, reading environment variables through `env`. With `dev`, a key
/// that is not configured is replaced by a development key; a key that is configured but
/// unusable (too short, unreadable, readable by everyone) refuses the start either way.
pub fn load(
    registry: &Registry,
    dev: bool,
    env: &dyn Fn(&str) -> Option<String>,
) -> Result<Secrets, KeyError> {
    let mut problems = Vec::new();
    let mut notes = Vec::new();
    let approval = approval_keys(registry, env, &mut problems, &mut notes);
    let r = &registry.gateway.redaction;
    let redaction = match read_key(
        &registry.dir,
        &r.key_env,
        r.key_file.as_deref(),
        "redaction.key_file",
        env,
        &mut notes,
    ) {
        Ok(Some(k)) => Some(k),
        Ok(None) => {
            problems.push(KeyProblem::Missing {
                kind: KeyKind::Redaction,
                env: r.key_env.clone(),
                setting: "redaction.key_file",
            });
            None
        }
        Err(p) => {
            problems.push(p);
            None
        }
    };
    if let (Some((_, _, a)), Some((r, _))) = (&approval, &redaction)
        && a == r
    {
        problems.push(KeyProblem::SameKey);
    }
    if dev {
        problems.retain(|p| !matches!(p, KeyProblem::Missing { .. }));
    }
    if !problems.is_empty() {
        return Err(KeyError {
            action: "start",
            config: config_path(registry),
            problems,
            dev_offered: true,
        });
    }
    let mut status = KeyStatus::default();
    let (approval, a_origin) = match approval {
        Some((keys, origin, _)) => (keys, origin),
        None => {
            status.approval_dev = true;
            (
                dev_approval_keys(&registry.gateway.approvals.key_id),
                "a development approval key (this process only)".into(),
            )
        }
    };
    let (redactor, r_origin) = match redaction {
        Some((k, from)) => {
            let redactor = Redactor::new(k);
            let origin = format!("redaction key {} from {from}", redactor.key_id());
            (redactor, origin)
        }
        None => {
            status.redaction_dev = true;
            (
                Redactor::dev(),
                "the development redaction key (public)".into(),
            )
        }
    };
    Ok(Secrets {
        approval,
        redactor,
        status,
        origin: format!("{a_origin}; {r_origin}"),
        notes,
    })
}

/// The approval keys alone, for a command that signs tokens without serving (`toolgate
/// approvals approve`): no development fallback.
pub fn load_approval_keys(
    registry: &Registry,
    env: &dyn Fn(&str) -> Option<String>,
) -> Result<ApprovalKeys, KeyError> {
    let mut problems = Vec::new();
    let mut notes = Vec::new();
    match approval_keys(registry, env, &mut problems, &mut notes) {
        Some((keys, _, _)) if problems.is_empty() => Ok(keys),
        _ => Err(KeyError {
            action: "sign or verify approvals",
            config: config_path(registry),
            problems,
            dev_offered: false,
        }),
    }
}

#[cfg(test)]
#[path = "keys_tests.rs"]
mod tests;
