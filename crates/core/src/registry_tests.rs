use super::*;
use crate::config::Durability;

fn fixture() -> std::path::PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/acme")
}

/// Copies the fixture to a temp folder and applies an edit to one file.
fn edited(file: &str, edit: impl Fn(String) -> String) -> tempfile::TempDir {
    let tmp = tempfile::tempdir().unwrap();
    copy_dir(&fixture(), tmp.path());
    let p = tmp.path().join(file);
    let text = std::fs::read_to_string(&p).unwrap();
    std::fs::write(&p, edit(text)).unwrap();
    tmp
}

fn copy_dir(from: &Path, to: &Path) {
    for e in std::fs::read_dir(from).unwrap() {
        let e = e.unwrap();
        let dest = to.join(e.file_name());
        if e.file_type().unwrap().is_dir() {
            std::fs::create_dir_all(&dest).unwrap();
            copy_dir(&e.path(), &dest);
        } else {
            std::fs::copy(e.path(), dest).unwrap();
        }
    }
}

fn findings(dir: &Path) -> Vec<Finding> {
    match Registry::load(dir) {
        Err(LoadError::Invalid(f)) => f,
        Err(e) => panic!("expected findings, got {e}"),
        Ok(_) => panic!("expected the registry to be refused"),
    }
}

#[test]
fn the_fixture_loads() {
    let r = Registry::load(fixture()).unwrap();
    assert!(r.tool("payment.schedule").is_some());
    assert_eq!(
        r.principal("fin-worker").unwrap().ancestors,
        vec!["fin-lead".to_string()]
    );
    assert!(r.version.hash.starts_with("sha256:"));
    assert_eq!(r.version.label, "acme-test");
    assert_eq!(
        r.principal_by_key("tg_dev_fin_worker").map(|p| p.id()),
        Some("fin-worker")
    );
    assert!(r.principal_by_key("tg_dev_wrong").is_none());
}

#[test]
fn unknown_fields_name_file_and_path() {
    let d = edited("tools/notes.yaml", |t| {
        t.replacen("    rate_limit: 2", "    rate_limt: 2", 1)
    });
    let f = findings(d.path());
    assert_eq!(f[0].file, "tools/notes.yaml");
    assert_eq!(f[0].path, "tools[0].rate_limt");
    assert!(
        f[0].message.contains("unknown field `rate_limt`"),
        "{}",
        f[0].message
    );
    assert!(
        f[0].message.contains("rate_limit"),
        "the message lists what would be right"
    );
}

#[test]
fn bad_enum_values_name_the_path() {
    let d = edited("tools/payments.yaml", |t| {
        t.replacen("effect: irreversible", "effect: permanent", 1)
    });
    let f = findings(d.path());
    assert_eq!(f[0].path, "tools[0].effect");
    assert!(f[0].message.contains("read") && f[0].message.contains("irreversible"));
}

#[test]
fn store_durability_is_fsync_unless_process_is_asked_for() {
    let r = Registry::load(fixture()).unwrap();
    assert_eq!(r.gateway.store.durability, Durability::Fsync);
    let d = edited("toolgate.yaml", |t| {
        t.replacen(
            "  url: \"sqlite://acme.db\"\n",
            "  url: \"sqlite://acme.db\"\n  durability: process\n",
            1,
        )
    });
    let r = Registry::load(d.path()).unwrap();
    assert_eq!(r.gateway.store.durability, Durability::Process);
    // The benchmarks' `--durability` flag reads the same names.
    assert_eq!("fsync".parse(), Ok(Durability::Fsync));
    assert_eq!("process".parse(), Ok(Durability::Process));
    assert!(
        "eventually"
            .parse::<Durability>()
            .is_err_and(|e| e.contains("fsync") && e.contains("process"))
    );

    let d = edited("toolgate.yaml", |t| {
        t.replacen(
            "  url: \"sqlite://acme.db\"\n",
            "  url: \"sqlite://acme.db\"\n  durability: eventually\n",
            1,
        )
    });
    let f = findings(d.path());
    assert_eq!(f[0].path, "store.durability");
    assert!(
        f[0].message.contains("fsync") && f[0].message.contains("process"),
        "the message names the values that would pass: {}",
        f[0].message
    );
}

#[test]
fn dangling_references_are_errors() {
    let d = edited("tools/payments.yaml", |t| {
        t.replacen(
            "reconcile: payment.lookup_by_key",
            "reconcile: payment.lookup",
            1,
        )
    });
    let f = findings(d.path());
    assert!(
        f.iter().any(|f| f.rule == "ref.dangling"
            && f.path == "tools[0].reconcile"
            && f.message.contains("'payment.lookup'")),
        "{f:#?}"
    );

    let d = edited("tools/notes.yaml", |t| {
        t.replacen(
            "{upstream: erp, tool: draft_note}",
            "{upstream: sap, tool: draft_note}",
            1,
        )
    });
    let f = findings(d.path());
    assert!(
        f.iter()
            .any(|f| f.path == "tools[0].handler.upstream" && f.fix.contains("erp")),
        "{f:#?}"
    );

    let d = edited("principals.yaml", |t| {
        t.replacen("parent: fin-lead", "parent: fin-boss", 1)
    });
    let f = findings(d.path());
    assert!(
        f.iter()
            .any(|f| f.rule == "ref.dangling" && f.message.contains("fin-boss")),
        "{f:#?}"
    );
}

#[test]
fn duplicate_names_are_errors() {
    let d = edited("tools/notes.yaml", |t| {
        t.replacen("name: note.discard", "name: note.draft", 1)
    });
    let f = findings(d.path());
    assert!(
        f.iter()
            .any(|f| f.rule == "ref.duplicate" && f.message.contains("declared twice")),
        "{f:#?}"
    );
    let d = edited("principals.yaml", |t| t.replacen("id: bob", "id: alice", 1));
    assert!(findings(d.path()).iter().any(|f| f.rule == "ref.duplicate"));
}

#[test]
fn a_policy_naming_a_missing_input_fails_at_load() {
    let d = edited("policies/finance.cedar", |t| {
        t.replace("context.inputs.amount", "context.inputs.amount_eur")
    });
    let f = findings(d.path());
    assert!(
        f.iter().any(|f| f.rule == "policy.invalid"
            && f.file == "policies/finance.cedar"
            && f.path == "large-payment-needs-approval"
            && f.message.contains("amount_eur")),
        "{f:#?}"
    );
}

#[test]
fn a_policy_comparing_a_decimal_to_a_long_fails_at_load() {
    let d = edited("policies/finance.cedar", |t| {
        t.replace(
            "context.inputs.amount.greaterThan(decimal(\"10000.0\"))",
            "context.inputs.amount > 10000",
        )
    });
    assert!(
        findings(d.path())
            .iter()
            .any(|f| f.rule == "policy.invalid")
    );
}

#[test]
fn permits_and_unnamed_policies_are_refused() {
    let d = edited("policies/finance.cedar", |t| {
        t + "\npermit(principal, action, resource);\n"
    });
    let f = findings(d.path());
    assert!(f.iter().any(|f| f.message.contains("@id")), "{f:#?}");
    let d = edited("policies/finance.cedar", |t| {
        t + "\n@id(\"x\") permit(principal, action, resource);\n"
    });
    let f = findings(d.path());
    assert!(
        f.iter().any(|f| f.message.contains("only forbid or gate")),
        "{f:#?}"
    );
}

#[test]
fn an_agent_cannot_hold_an_approver_role() {
    let d = edited("principals.yaml", |t| {
        t.replacen(
            "  - id: alice\n    kind: human",
            "  - id: alice\n    kind: agent",
            1,
        )
    });
    assert!(
        findings(d.path())
            .iter()
            .any(|f| f.rule == "config.agent-approver")
    );
}

#[test]
fn credentials_must_be_hashes() {
    let d = edited("principals.yaml", |t| {
        t.replacen(
            "sha256:0000000000000000000000000000000000000000000000000000000000000002",
            "tg_live_plaintext_key",
            1,
        )
    });
    assert!(
        findings(d.path())
            .iter()
            .any(|f| f.rule == "config.credential")
    );
}

#[test]
fn unparseable_yaml_is_unreadable() {
    let d = edited("principals.yaml", |t| t + "\n  - : : :\n\t bad");
    assert!(matches!(
        Registry::load(d.path()),
        Err(LoadError::Unreadable { .. })
    ));
}

#[test]
fn the_version_changes_with_any_rule() {
    let a = Registry::load(fixture()).unwrap().version;
    let d = edited("policies/finance.cedar", |t| {
        t.replace("act_steps >= 3", "act_steps >= 4")
    });
    let b = Registry::load(d.path()).unwrap().version;
    assert_ne!(a.hash, b.hash);
    assert_eq!(a.label, b.label);
}
