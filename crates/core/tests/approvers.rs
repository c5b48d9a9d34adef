//! Segregation of duties, on a copy of the finance example: who may approve which gate, the
//! requester and the person behind an agent never counting, per-rule approvers, the load-time
//! references and the lint's `approval.nobody` and `approval.self` findings.

use std::path::{Path, PathBuf};

use toolgate_core::approvers::Ineligible;
use toolgate_core::{LoadError, Registry};

fn example() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../examples/finance")
}

fn copy_tree(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for e in std::fs::read_dir(from).unwrap() {
        let e = e.unwrap();
        let dest = to.join(e.file_name());
        if e.file_type().unwrap().is_dir() {
            copy_tree(&e.path(), &dest);
        } else {
            std::fs::copy(e.path(), dest).unwrap();
        }
    }
}

/// Replaces the first occurrence of `from` in `file` (it must be there).
fn edit(dir: &Path, file: &str, from: &str, to: &str) {
    let path = dir.join(file);
    let text = std::fs::read_to_string(&path).unwrap();
    assert!(text.contains(from), "{file} has no {from:?}");
    std::fs::write(&path, text.replacen(from, to, 1)).unwrap();
}

const VERA: &str = r#"
  - id: vera
    kind: human
    role: vendor.lead
    credentials:
      - {id: dev, sha256: "sha256:1111111111111111111111111111111111111111111111111111111111111111"}
    grants:
      - scopes: [suppliers:read]
        purposes: [supplier_maintenance]
        max_tier: read
        max_sensitivity: restricted
  - id: walt
    kind: human
    role: vendor.lead
    credentials:
      - {id: dev, sha256: "sha256:2222222222222222222222222222222222222222222222222222222222222222"}
"#;

/// The finance example with: fin-worker acting for alice; payment.schedule approved by the
/// AP clerks; IBAN changes approved by the vendor-master leads (vera, walt) and sam; large
/// payments approved by bob alone.
fn registry_with(extra: impl FnOnce(&Path)) -> Result<Registry, LoadError> {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("finance");
    copy_tree(&example(), &dir);
    edit(
        &dir,
        "principals.yaml",
        "  supplier.admin:",
        "  vendor.lead: {description: \"vendor-master leads: approve IBAN changes\"}\n  supplier.admin:",
    );
    edit(
        &dir,
        "principals.yaml",
        "  - id: fin-worker\n    kind: agent\n    role: worker.finance\n",
        "  - id: fin-worker\n    kind: agent\n    role: worker.finance\n    on_behalf_of: alice\n",
    );
    let text = std::fs::read_to_string(dir.join("principals.yaml")).unwrap();
    std::fs::write(dir.join("principals.yaml"), format!("{text}{VERA}")).unwrap();
    edit(
        &dir,
        "tools/payments.yaml",
        "    gate: always\n",
        "    gate: always\n    approved_by: {roles: [ap.clerk]}\n",
    );
    edit(
        &dir,
        "tools/suppliers.yaml",
        "    approvers: 2\n",
        "    approvers: 2\n    approved_by: {roles: [vendor.lead], people: [sam]}\n",
    );
    edit(
        &dir,
        "toolgate.yaml",
        "approvals:\n",
        "approvals:\n  gates:\n    large-payment-needs-approval: {people: [bob], approvers: 1}\n",
    );
    extra(&dir);
    let r = Registry::load(&dir);
    drop(tmp);
    r
}

fn registry() -> Registry {
    registry_with(|_| {}).unwrap_or_else(|e| panic!("{e}"))
}

#[test]
fn the_requester_and_the_person_behind_an_agent_never_approve() {
    let r = registry();
    // alice is an AP clerk, but fin-worker acts for her.
    assert_eq!(
        r.may_approve("alice", "fin-worker", "payment.schedule", "gate.always"),
        Err(Ineligible::BehindAgent {
            person: "alice".into(),
            agent: "fin-worker".into()
        })
    );
    assert_eq!(
        r.may_approve("bob", "fin-worker", "payment.schedule", "gate.always"),
        Ok(())
    );
    // sam may approve IBAN changes, but not his own.
    assert_eq!(
        r.may_approve("sam", "sam", "supplier.update_iban", "gate.always"),
        Err(Ineligible::Requester("sam".into()))
    );
    assert_eq!(
        r.may_approve("vera", "sam", "supplier.update_iban", "gate.always"),
        Ok(())
    );
    // Agents never approve.
    assert!(matches!(
        r.may_approve("fin-reviewer", "sam", "supplier.update_iban", "gate.always"),
        Err(Ineligible::NotAPerson(_))
    ));
}

#[test]
fn only_the_gates_own_approvers_count() {
    let r = registry();
    // An AP clerk is outside the IBAN change's approvers; a vendor lead outside the payment's.
    let e = r
        .may_approve("alice", "sam", "supplier.update_iban", "gate.always")
        .unwrap_err();
    assert!(matches!(e, Ineligible::NotListed { .. }), "{e}");
    assert!(e.to_string().contains("role vendor.lead; or sam"), "{e}");
    assert!(matches!(
        r.may_approve("vera", "fin-worker", "payment.schedule", "gate.always"),
        Err(Ineligible::NotListed { .. })
    ));
    assert_eq!(
        r.approvers("supplier.update_iban", "gate.always").count,
        2,
        "the tool's two-person rule"
    );
    // A @gate rule with its own approvers replaces the tool's.
    let large = r.approvers("payment.schedule", "large-payment-needs-approval");
    assert_eq!((large.people, large.count), (&["bob".to_string()][..], 1));
    assert!(
        r.may_approve(
            "alice",
            "fin-comms",
            "payment.schedule",
            "large-payment-needs-approval"
        )
        .is_err()
    );
    assert_eq!(
        r.may_approve(
            "bob",
            "fin-worker",
            "payment.schedule",
            "large-payment-needs-approval"
        ),
        Ok(())
    );
    // vera's role is not `approver: true`, but she is named: she signs in; fin-planner never.
    assert!(r.approves_anything("vera"));
    assert!(!r.approves_anything("fin-planner"));
    assert_eq!(
        r.sensitivity_ceiling("alice"),
        toolgate_core::Sensitivity::Confidential
    );
}

#[test]
fn the_lint_names_a_person_who_may_approve_what_they_request() {
    let r = registry();
    let findings = toolgate_core::lint::lint(&r);
    let selfish: Vec<_> = findings
        .iter()
        .filter(|f| f.rule == "approval.self")
        .collect();
    assert_eq!(selfish.len(), 2, "{selfish:#?}");
    assert!(
        selfish
            .iter()
            .any(|f| f.message.contains("'sam' may approve supplier.update_iban")),
        "{selfish:#?}"
    );
    // alice approves payments, and fin-worker, which requests them, acts for her.
    assert!(
        selfish.iter().any(|f| f
            .message
            .contains("'alice' may approve payment.schedule under gate.always")
            && f.message.contains("through 'fin-worker'")),
        "{selfish:#?}"
    );
    assert!(!findings.iter().any(|f| f.rule == "approval.nobody"));
}

#[test]
fn the_lint_names_a_gate_too_few_may_approve() {
    let r = registry_with(|dir| {
        // Two people needed, only walt and vera qualify once sam is dropped: fine; then a
        // rule naming only bob for two approvals is not.
        edit(
            dir,
            "toolgate.yaml",
            "{people: [bob], approvers: 1}",
            "{people: [bob], approvers: 2}",
        );
    })
    .unwrap();
    let nobody: Vec<_> = toolgate_core::lint::lint(&r)
        .into_iter()
        .filter(|f| f.rule == "approval.nobody")
        .collect();
    assert_eq!(nobody.len(), 1, "{nobody:#?}");
    assert!(
        nobody[0].message.contains("large-payment-needs-approval")
            && nobody[0].message.contains("only bob"),
        "{}",
        nobody[0].message
    );
}

#[test]
fn approvers_must_be_declared_people_and_gates_real_rules() {
    let cases: Vec<(&str, &str, &str, &str)> = vec![
        (
            "tools/suppliers.yaml",
            "people: [sam]",
            "people: [fin-worker]",
            "config.agent-approver",
        ),
        (
            "tools/suppliers.yaml",
            "roles: [vendor.lead]",
            "roles: [vendor.boss]",
            "ref.dangling",
        ),
        (
            "principals.yaml",
            "on_behalf_of: alice",
            "on_behalf_of: nobody",
            "ref.dangling",
        ),
        (
            "toolgate.yaml",
            "large-payment-needs-approval:",
            "no-spend-after-denial:",
            "ref.dangling",
        ),
    ];
    for (file, from, to, rule) in cases {
        match registry_with(|dir| edit(dir, file, from, to)) {
            Err(LoadError::Invalid(f)) => assert!(
                f.iter().any(|x| x.rule == rule),
                "{file}: {to}: expected {rule}, got {f:#?}"
            ),
            other => panic!("{file}: {to}: loaded: {:?}", other.map(|_| ())),
        }
    }
}

/// Agents on a `parent` chain: `ap-lead` (a planner, which cannot request payments) acts for
/// bob, and its child `ap-sub` and grandchild `ap-subsub` request payments in its name.
const CHAIN: &str = r#"
  - id: ap-lead
    kind: agent
    role: planner
    on_behalf_of: bob
  - id: ap-sub
    kind: agent
    role: worker.finance
    parent: ap-lead
  - id: ap-subsub
    kind: agent
    role: worker.finance
    parent: ap-sub
  - id: fin-sub
    kind: agent
    role: worker.finance
    parent: fin-worker
"#;

fn registry_with_chain() -> Registry {
    registry_with(|dir| {
        let p = dir.join("principals.yaml");
        let text = std::fs::read_to_string(&p).unwrap();
        std::fs::write(&p, format!("{text}{CHAIN}")).unwrap();
    })
    .unwrap_or_else(|e| panic!("{e}"))
}

#[test]
fn the_person_behind_an_agents_parent_never_approves_its_child() {
    let r = registry_with_chain();
    // fin-worker acts for alice; fin-sub is its child: alice stands behind it too.
    assert_eq!(
        r.may_approve("alice", "fin-sub", "payment.schedule", "gate.always"),
        Err(Ineligible::BehindAgent {
            person: "alice".into(),
            agent: "fin-sub".into()
        })
    );
    // Two levels down, through an agent that acts for nobody itself.
    for child in ["ap-sub", "ap-subsub"] {
        assert_eq!(
            r.may_approve("bob", child, "payment.schedule", "gate.always"),
            Err(Ineligible::BehindAgent {
                person: "bob".into(),
                agent: child.into()
            }),
            "{child}"
        );
        // Another clerk, behind nothing on the chain, may.
        assert_eq!(
            r.may_approve("alice", child, "payment.schedule", "gate.always"),
            Ok(())
        );
    }
    assert_eq!(
        r.requesting_people("ap-subsub"),
        vec!["ap-subsub", "ap-sub", "ap-lead", "bob"]
    );
    assert_eq!(
        r.may_approve("bob", "fin-sub", "payment.schedule", "gate.always"),
        Ok(())
    );
}

#[test]
fn the_lint_follows_the_parent_chain() {
    let r = registry_with_chain();
    let findings = toolgate_core::lint::lint(&r);
    // ap-lead (a planner) cannot request payments, but its child can, in its name: bob holds
    // both duties for payment.schedule.
    let bob: Vec<_> = findings
        .iter()
        .filter(|f| {
            f.rule == "approval.self"
                && f.message
                    .contains("'bob' may approve payment.schedule under gate.always")
        })
        .collect();
    assert_eq!(bob.len(), 1, "{findings:#?}");
    assert!(
        bob[0].message.contains("through 'ap-sub'"),
        "{}",
        bob[0].message
    );
}
