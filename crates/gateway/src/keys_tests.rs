use std::collections::HashMap;
use std::path::{Path, PathBuf};

use toolgate_core::{ApprovalClaims, InputHash, Timestamp};

use super::*;

const A: &str = "approval-key-approval-key-approval-key-0001";
const B: &str = "approval-key-approval-key-approval-key-0002";
const R: &str = "redaction-key-redaction-key-redaction-key-01";

fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for e in std::fs::read_dir(from).unwrap() {
        let e = e.unwrap();
        if e.file_type().unwrap().is_dir() {
            copy_dir(&e.path(), &to.join(e.file_name()));
        } else {
            std::fs::copy(e.path(), to.join(e.file_name())).unwrap();
        }
    }
}

/// The finance example in a temporary folder, its `approvals:` section replaced by `approvals`
/// and a `redaction:` section added when given.
fn registry(approvals: &str, redaction: &str) -> (tempfile::TempDir, Registry) {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("finance");
    copy_dir(
        &PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../examples/finance"),
        &dir,
    );
    let top = dir.join("toolgate.yaml");
    let text = std::fs::read_to_string(&top).unwrap();
    let old = "approvals:\n  expiry_hours: 72\n";
    assert!(text.contains(old), "the example's approvals section moved");
    let mut text = text.replace(old, &format!("approvals:\n  expiry_hours: 72\n{approvals}"));
    if !redaction.is_empty() {
        text.push_str(&format!("redaction:\n{redaction}"));
    }
    std::fs::write(&top, text).unwrap();
    let reg = Registry::load(&dir).unwrap();
    (tmp, reg)
}

fn env(vars: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> {
    let map: HashMap<String, String> = vars
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    move |name: &str| map.get(name).cloned()
}

fn write_key(dir: &Path, name: &str, key: &str, mode: u32) -> PathBuf {
    let p = dir.join(name);
    std::fs::write(&p, format!("{key}\n")).unwrap();
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(mode)).unwrap();
    }
    p
}

fn claims() -> ApprovalClaims {
    ApprovalClaims {
        subject: "call-1".into(),
        tool: "payment.schedule".into(),
        tool_version: "1.0.0".into(),
        input_hash: InputHash::of(&serde_json::json!({"amount": 1})),
        registry_version: None,
        gate_rule: None,
        definition_hash: None,
        approver: "alice".into(),
        expires_at: Timestamp::from_millis(4_102_444_800_000),
        nonce: "n1".into(),
    }
}

#[test]
fn without_keys_the_start_is_refused_naming_both_ways_to_give_each_and_how_to_make_one() {
    let (_t, reg) = registry("", "");
    let e = load(&reg, false, &env(&[])).unwrap_err();
    assert_eq!(e.problems.len(), 2, "{e}");
    let text = e.to_string();
    for needle in [
        "refusing to start without its keys",
        "no approval key",
        "TOOLGATE_APPROVAL_KEY",
        "approvals.key_file",
        "no redaction key",
        "TOOLGATE_REDACTION_KEY",
        "redaction.key_file",
        "toolgate key secret",
        "openssl rand -hex 32",
        "--dev",
        "docs/keys.md",
    ] {
        assert!(text.contains(needle), "missing {needle:?} in:\n{text}");
    }
    // One key present: only the other is asked for.
    let e = load(&reg, false, &env(&[("TOOLGATE_APPROVAL_KEY", A)])).unwrap_err();
    assert_eq!(
        e.problems,
        [KeyProblem::Missing {
            kind: KeyKind::Redaction,
            env: "TOOLGATE_REDACTION_KEY".into(),
            setting: "redaction.key_file",
        }]
    );
}

#[test]
fn keys_from_the_environment_are_used_and_are_not_development_keys() {
    let (_t, reg) = registry("", "");
    let s = load(
        &reg,
        false,
        &env(&[("TOOLGATE_APPROVAL_KEY", A), ("TOOLGATE_REDACTION_KEY", R)]),
    )
    .unwrap();
    assert!(!s.status.is_dev());
    assert!(s.status.warning().is_none());
    assert_eq!(s.redactor.key_id(), Redactor::new(R.as_bytes()).key_id());
    // The approval key is A: a token signed with A under k1 opens.
    let t = ApprovalKeys::new("k1", A.as_bytes()).issue(&claims());
    assert_eq!(s.approval.open(&t).unwrap(), claims());
    assert!(s.origin.contains("TOOLGATE_APPROVAL_KEY"), "{}", s.origin);
}

#[test]
fn a_key_shorter_than_32_bytes_is_refused_even_with_dev() {
    let (_t, reg) = registry("", "");
    for dev in [false, true] {
        let e = load(
            &reg,
            dev,
            &env(&[
                ("TOOLGATE_APPROVAL_KEY", "short"),
                ("TOOLGATE_REDACTION_KEY", R),
            ]),
        )
        .unwrap_err();
        assert_eq!(
            e.problems,
            [KeyProblem::TooShort {
                from: "TOOLGATE_APPROVAL_KEY".into(),
                bytes: 5
            }]
        );
        assert!(e.to_string().contains("at least 32"), "{e}");
    }
}

#[test]
fn one_value_for_both_keys_is_refused() {
    let (_t, reg) = registry("", "");
    let e = load(
        &reg,
        false,
        &env(&[("TOOLGATE_APPROVAL_KEY", A), ("TOOLGATE_REDACTION_KEY", A)]),
    )
    .unwrap_err();
    assert_eq!(e.problems, [KeyProblem::SameKey]);
}

#[test]
fn dev_replaces_only_the_missing_keys_and_says_what_each_gives_up() {
    let (_t, reg) = registry("", "");
    let s = load(&reg, true, &env(&[])).unwrap();
    assert_eq!(
        s.status,
        KeyStatus {
            approval_dev: true,
            redaction_dev: true
        }
    );
    assert_eq!(s.redactor.key_id(), "dev");
    let w = s.status.warning().unwrap();
    assert!(w.contains("--dev"), "{w}");
    assert!(w.contains("stop verifying when the process exits"), "{w}");
    assert!(w.contains("recovered by hashing guesses"), "{w}");
    let j = s.status.to_json();
    assert_eq!(j["approval"], "dev");
    assert_eq!(j["redaction"], "dev");
    assert_eq!(j["dev_gives_up"].as_array().unwrap().len(), 2);

    let s = load(&reg, true, &env(&[("TOOLGATE_REDACTION_KEY", R)])).unwrap();
    assert_eq!(
        s.status,
        KeyStatus {
            approval_dev: true,
            redaction_dev: false
        }
    );
    assert_ne!(s.redactor.key_id(), "dev");
    let w = s.status.warning().unwrap();
    assert!(!w.contains("redaction key"), "{w}");
    assert_eq!(s.status.to_json()["redaction"], "configured");
}

#[test]
fn keys_from_files_are_read_trimmed_and_a_file_everyone_can_read_is_refused() {
    let (t, reg) = registry(
        "  key_file: ../approval.key\n",
        "  key_file: ../redaction.key\n",
    );
    let a = write_key(t.path(), "approval.key", A, 0o600);
    let r = write_key(t.path(), "redaction.key", R, 0o640);
    let s = load(&reg, false, &env(&[])).unwrap();
    assert!(!s.status.is_dev());
    assert_eq!(s.redactor.key_id(), Redactor::new(R.as_bytes()).key_id());
    let token = ApprovalKeys::new("k1", A.as_bytes()).issue(&claims());
    assert!(s.approval.open(&token).is_ok());

    // A file wins over the environment variable, which is reported as ignored.
    let s = load(&reg, false, &env(&[("TOOLGATE_APPROVAL_KEY", B)])).unwrap();
    assert!(s.approval.open(&token).is_ok());
    assert!(
        s.notes
            .iter()
            .any(|n| n.contains("TOOLGATE_APPROVAL_KEY is set but ignored")),
        "{:?}",
        s.notes
    );

    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&a, std::fs::Permissions::from_mode(0o644)).unwrap();
        // Refused with --dev too: a key that is configured is never replaced in silence.
        for dev in [false, true] {
            let e = load(&reg, dev, &env(&[])).unwrap_err();
            assert_eq!(e.problems.len(), 1, "{e}");
            assert!(
                matches!(&e.problems[0], KeyProblem::Exposed { mode: 0o644, .. }),
                "{e}"
            );
            let text = e.to_string();
            assert!(text.contains("approval.key"), "{text}");
            assert!(text.contains("chmod 600"), "{text}");
        }
        std::fs::set_permissions(&a, std::fs::Permissions::from_mode(0o600)).unwrap();
    }
    std::fs::remove_file(&r).unwrap();
    let e = load(&reg, false, &env(&[])).unwrap_err();
    assert!(
        matches!(&e.problems[..], [KeyProblem::Unreadable { from, .. }] if from.contains("redaction.key")),
        "{e}"
    );
}

#[test]
fn a_token_signed_with_a_previous_key_verifies_and_one_whose_key_is_gone_is_refused() {
    let old = ApprovalKeys::new("k1", A.as_bytes()).issue(&claims());
    let (t, reg) = registry(
        "  key_id: k2\n  previous:\n    - id: k1\n      env: TOOLGATE_APPROVAL_KEY_K1\n    - id: k0\n      file: ../k0.key\n",
        "",
    );
    write_key(t.path(), "k0.key", B, 0o600);
    let vars = [
        ("TOOLGATE_APPROVAL_KEY", B),
        ("TOOLGATE_APPROVAL_KEY_K1", A),
        ("TOOLGATE_REDACTION_KEY", R),
    ];
    let s = load(&reg, false, &env(&vars)).unwrap();
    assert_eq!(s.approval.open(&old).unwrap(), claims());
    assert!(s.origin.contains("still verifying k1, k0"), "{}", s.origin);
    // New tokens are signed with the current key, k2.
    let new = s.approval.issue(&claims());
    assert!(new.as_str().starts_with("tg1.k2."), "{}", new.as_str());
    // The approvals command reads the same keys.
    assert!(
        load_approval_keys(&reg, &env(&vars))
            .unwrap()
            .open(&old)
            .is_ok()
    );

    // A listed previous key that cannot be read refuses the start.
    let e = load(&reg, false, &env(&vars[..1])).unwrap_err();
    assert!(
        e.problems.contains(&KeyProblem::PreviousMissing {
            id: "k1".into(),
            env: "TOOLGATE_APPROVAL_KEY_K1".into()
        }),
        "{e}"
    );

    // Once k1 is no longer listed, its tokens are refused, readably.
    let (_t2, reg) = registry("  key_id: k2\n", "");
    let s = load(&reg, false, &env(&vars)).unwrap();
    let err = s.approval.open(&old).unwrap_err();
    assert_eq!(err, toolgate_core::TokenError::UnknownKey("k1".into()));
    assert_eq!(
        err.to_string(),
        "the approval token names key 'k1', which is not configured"
    );
}

#[test]
fn the_approvals_command_has_no_dev_fallback() {
    let (_t, reg) = registry("", "");
    let e = load_approval_keys(&reg, &env(&[])).unwrap_err();
    assert!(!e.dev_offered);
    let text = e.to_string();
    assert!(text.contains("TOOLGATE_APPROVAL_KEY"), "{text}");
    assert!(!text.contains("--dev"), "{text}");
    assert!(!text.contains("redaction"), "{text}");
}
