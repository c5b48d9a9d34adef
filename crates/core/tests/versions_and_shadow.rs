//! Approvals across registry versions, and shadow rules, at the engine: an approval carries
//! over a reload only while the new rules gate the call under the same rule; a shadow rule is
//! evaluated and named in the decision, and never decides.

use std::path::Path;

use serde_json::{Value, json};
use toolgate_core::{
    ApprovalClaims, ApprovalKeys, ApprovalToken, CallRequest, CheckName, Decision, Engine,
    InputHash, Outcome, Registry, ShadowEffect, ShadowRule, Timestamp, Verdict,
};

const NOW: Timestamp = Timestamp::from_millis(1_790_000_000_000);
const GATE: &str = "large-payment-needs-approval";

fn fixture() -> &'static Path {
    Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/acme"))
}

/// The acme registry with `edit` applied to its policy text (and `tools` to a tool file).
fn version(edit: impl Fn(String) -> String, tools: impl Fn(&str, String) -> String) -> Registry {
    let dir = tempfile::tempdir().unwrap();
    copy(fixture(), dir.path(), &edit, &tools);
    Registry::load(dir.path()).expect("the edited registry loads")
}

fn copy(
    from: &Path,
    to: &Path,
    edit: &dyn Fn(String) -> String,
    tools: &dyn Fn(&str, String) -> String,
) {
    std::fs::create_dir_all(to).unwrap();
    for e in std::fs::read_dir(from).unwrap() {
        let e = e.unwrap();
        let target = to.join(e.file_name());
        if e.file_type().unwrap().is_dir() {
            copy(&e.path(), &target, edit, tools);
            continue;
        }
        let text = std::fs::read_to_string(e.path()).unwrap();
        let name = e.file_name().to_string_lossy().to_string();
        let text = if name.ends_with(".cedar") {
            edit(text)
        } else {
            tools(&name, text)
        };
        std::fs::write(target, text).unwrap();
    }
}

fn same(s: String) -> String {
    s
}

fn same_tools(_: &str, s: String) -> String {
    s
}

fn threshold(t: &'static str) -> impl Fn(String) -> String {
    move |s| s.replace("decimal(\"10000.0\")", &format!("decimal(\"{t}\")"))
}

fn keys() -> ApprovalKeys {
    ApprovalKeys::new("k1", b"versions-and-shadow-key-0123456789".to_vec())
}

fn payment(amount: f64) -> Value {
    json!({"invoice_id": "INV-20260611", "amount": amount, "currency": "EUR",
           "value_date": "2026-06-30", "reason": "Three-way match complete against PO-77812."})
}

fn decide(reg: &Registry, tool: &str, inputs: &Value, tokens: &[ApprovalToken]) -> Decision {
    let k = keys();
    let mut req = CallRequest::new("fin-worker", tool, inputs);
    req.purpose = Some("billing");
    req.reason = Some("Pay the approved invoice on its due date.");
    req.subject = "call-1";
    req.approvals = tokens;
    Engine::new(reg, &k).decide(&req, NOW)
}

/// The approval a person gives the call as `reg` parks it (as the store issues it).
fn approve(reg: &Registry, inputs: &Value, approver: &str) -> ApprovalToken {
    let parked = decide(reg, "payment.schedule", inputs, &[]);
    let Verdict::NeedsApproval { rule, .. } = &parked.verdict else {
        panic!("the call is parked first: {:?}", parked.verdict);
    };
    let tool = reg.tool("payment.schedule").unwrap();
    keys().issue(&ApprovalClaims {
        subject: "call-1".into(),
        tool: "payment.schedule".into(),
        tool_version: tool.config.version.clone(),
        input_hash: InputHash::of(inputs),
        registry_version: Some(reg.version.hash.clone()),
        gate_rule: Some(rule.clone()),
        definition_hash: None,
        approver: approver.into(),
        expires_at: NOW.plus_hours(72),
        nonce: format!("nonce-{approver}"),
    })
}

#[test]
fn an_approval_carries_over_a_reload_that_gates_the_call_the_same_way() {
    let v1 = version(same, same_tools);
    let inputs = payment(15_000.0);
    let token = approve(&v1, &inputs, "alice");
    assert!(
        decide(
            &v1,
            "payment.schedule",
            &inputs,
            std::slice::from_ref(&token)
        )
        .is_allow()
    );

    // The threshold goes up to 12,000: 15,000 is still gated by the same rule, so the approval
    // taken under the old version still authorises it.
    let v2 = version(threshold("12000.0"), same_tools);
    assert_ne!(v1.version.hash, v2.version.hash);
    let d = decide(
        &v2,
        "payment.schedule",
        &inputs,
        std::slice::from_ref(&token),
    );
    assert!(d.is_allow(), "{:?}", d.verdict);
    assert_eq!(d.registry_version, v2.version.hash);
    assert_eq!(d.approvals.len(), 1);
    assert_eq!(d.check(CheckName::Gate).rule.as_deref(), Some(GATE));

    // Up to 20,000: the call is not gated at all any more, and runs.
    let v3 = version(threshold("20000.0"), same_tools);
    let d = decide(
        &v3,
        "payment.schedule",
        &inputs,
        std::slice::from_ref(&token),
    );
    assert!(d.is_allow(), "{:?}", d.verdict);
    assert!(d.approvals.is_empty());
}

#[test]
fn an_approval_does_not_carry_over_a_reload_that_forbids_or_gates_differently() {
    let v1 = version(same, same_tools);
    let inputs = payment(15_000.0);
    let token = approve(&v1, &inputs, "alice");

    // A new forbid: refused, approval or not.
    let forbid = version(
        |s| {
            s + "\n@id(\"payments-capped-at-14000\")\nforbid (principal, action == Action::\"payment.schedule\", resource)\n\
                 when { context.inputs.amount.greaterThan(decimal(\"14000.0\")) };\n"
        },
        same_tools,
    );
    let d = decide(
        &forbid,
        "payment.schedule",
        &inputs,
        std::slice::from_ref(&token),
    );
    assert_eq!(
        d.verdict,
        Verdict::Deny {
            check: CheckName::Policy,
            rule: "payments-capped-at-14000".into(),
            reason: d.check(CheckName::Policy).detail.clone(),
        }
    );

    // The same threshold under another rule: back to the gate, for a new approval.
    let renamed = version(
        |s| s.replace(GATE, "payments-over-10000-need-a-person"),
        same_tools,
    );
    let d = decide(
        &renamed,
        "payment.schedule",
        &inputs,
        std::slice::from_ref(&token),
    );
    match &d.verdict {
        Verdict::NeedsApproval { rule, .. } => {
            assert_eq!(rule, "payments-over-10000-need-a-person")
        }
        v => panic!("expected the gate again, got {v:?}"),
    }
    assert!(d.approvals.is_empty());
    let gate = d.check(CheckName::Gate);
    assert_eq!(gate.outcome, Outcome::Gate);
    assert!(
        gate.detail.contains("needs a new approval"),
        "{}",
        gate.detail
    );

    // A token from the same version is not second-guessed.
    let fresh = approve(&renamed, &inputs, "bob");
    assert!(decide(&renamed, "payment.schedule", &inputs, &[token, fresh]).is_allow());
}

#[test]
fn shadow_rules_are_named_in_the_decision_and_never_decide() {
    let shadow = version(
        |s| {
            s + "\n@id(\"shadow-cap-5000\")\n@shadow\nforbid (principal, action == Action::\"payment.schedule\", resource)\n\
                 when { context.inputs.amount.greaterThan(decimal(\"5000.0\")) };\n\
                 \n@id(\"shadow-gate-1000\")\n@shadow\n@gate\nforbid (principal, action == Action::\"payment.schedule\", resource)\n\
                 when { context.inputs.amount.greaterThan(decimal(\"1000.0\")) };\n"
        },
        |name, s| {
            if name == "messaging.yaml" {
                s.replace("gate: never", "gate: shadow")
            } else {
                s
            }
        },
    );
    let d = decide(&shadow, "payment.schedule", &payment(8_000.0), &[]);
    assert!(d.is_allow(), "{:?}", d.verdict);
    let mut got = d.shadow.clone();
    got.sort_by(|a, b| a.rule.cmp(&b.rule));
    assert_eq!(
        got,
        vec![
            ShadowRule {
                rule: "shadow-cap-5000".into(),
                would: ShadowEffect::Deny
            },
            ShadowRule {
                rule: "shadow-gate-1000".into(),
                would: ShadowEffect::Gate
            },
        ]
    );
    let policy = d.check(CheckName::Policy);
    assert_eq!(policy.outcome, Outcome::Pass);
    assert!(
        policy.detail.contains("shadow, not enforced"),
        "{}",
        policy.detail
    );

    // Below both thresholds nothing is recorded.
    assert!(
        decide(&shadow, "payment.schedule", &payment(500.0), &[])
            .shadow
            .is_empty()
    );

    // An enforced gate still gates; the shadow rules ride along.
    let d = decide(&shadow, "payment.schedule", &payment(12_000.0), &[]);
    assert!(matches!(&d.verdict, Verdict::NeedsApproval { rule, .. } if rule == GATE));
    assert_eq!(d.shadow.len(), 2);
}

#[test]
fn a_tool_gate_in_shadow_is_recorded_and_nothing_waits() {
    let reg = version(same, |name, s| {
        if name == "messaging.yaml" {
            s.replace("gate: never", "gate: shadow")
        } else {
            s
        }
    });
    let email = json!({"account_id": "acct_7f3k2m9q1x0b", "invoice_id": "INV-20260611",
                       "to": "ap@supplier.example", "body": "Your invoice is attached."});
    let d = decide(&reg, "email.send", &email, &[]);
    assert_ne!(
        d.check(CheckName::Gate).outcome,
        Outcome::Gate,
        "a shadow gate never parks the call"
    );
    assert_eq!(
        d.shadow,
        vec![ShadowRule {
            rule: "gate.always".into(),
            would: ShadowEffect::Gate
        }]
    );
    assert!(
        d.check(CheckName::Gate)
            .detail
            .contains("would ask for approval")
    );
}

/// The pin check, at the engine: the gateway says how the tool's upstream definition is served;
/// a blocked one is refused by the third check with every check recorded, a pinned one passes
/// and binds approvals to its hash.
mod pin {
    use super::*;
    use toolgate_core::Definition;

    fn decide_served(
        reg: &Registry,
        definition: Definition<'_>,
        tokens: &[ApprovalToken],
    ) -> Decision {
        let k = keys();
        let inputs = payment(15_000.0);
        let mut req = CallRequest::new("fin-worker", "payment.schedule", &inputs);
        req.purpose = Some("billing");
        req.reason = Some("Pay the approved invoice on its due date.");
        req.subject = "call-1";
        req.approvals = tokens;
        req.definition = definition;
        Engine::new(reg, &k).decide(&req, NOW)
    }

    fn check(d: &Decision, name: CheckName) -> &toolgate_core::Check {
        d.checks.iter().find(|c| c.name == name).expect("recorded")
    }

    #[test]
    fn a_blocked_definition_is_refused_by_the_pin_check_and_nothing_after_it_is_evaluated() {
        let reg = version(same, same_tools);
        let why = "tool 'pay' changed since it was pinned (description); see `toolgate lock diff`";
        let d = decide_served(&reg, Definition::Blocked(why), &[]);
        match &d.verdict {
            Verdict::Deny {
                check,
                rule,
                reason,
            } => {
                assert_eq!(*check, CheckName::Pin);
                assert_eq!(rule, "pin.blocked");
                assert_eq!(reason, why);
            }
            other => panic!("refused, not {other:?}"),
        }
        assert_eq!(d.checks.len(), CheckName::ALL.len(), "every check recorded");
        assert_eq!(d.checks.len(), 12);
        let names: Vec<CheckName> = d.checks.iter().map(|c| c.name).collect();
        assert_eq!(names, CheckName::ALL.to_vec(), "in the documented order");
        assert_eq!(check(&d, CheckName::Credential).outcome, Outcome::Pass);
        assert_eq!(check(&d, CheckName::Listed).outcome, Outcome::Pass);
        assert_eq!(check(&d, CheckName::Pin).outcome, Outcome::Fail);
        // A changed definition is not decided further, not even parked for a person.
        for c in &d.checks[3..] {
            assert_eq!(c.outcome, Outcome::Skip, "{:?}", c);
            assert!(c.detail.contains("the pin check failed"), "{}", c.detail);
        }
    }

    #[test]
    fn a_tool_not_listed_for_the_role_is_unknown_before_its_pin_is_looked_at() {
        let reg = version(same, same_tools);
        let k = keys();
        let inputs = payment(15_000.0);
        let mut req = CallRequest::new("fin-worker", "no.such.tool", &inputs);
        req.definition = Definition::Blocked("upstream 'erp' is blocked");
        let d = Engine::new(&reg, &k).decide(&req, NOW);
        assert!(
            matches!(
                d.verdict,
                Verdict::Deny {
                    check: CheckName::Listed,
                    ..
                }
            ),
            "{:?}",
            d.verdict
        );
        assert!(!check(&d, CheckName::Listed).detail.contains("erp"));
    }

    #[test]
    fn a_pinned_definition_passes_and_binds_the_approval_to_its_hash() {
        let reg = version(same, same_tools);
        let d = decide_served(&reg, Definition::Pinned("sha256:aaa"), &[]);
        let pin = check(&d, CheckName::Pin);
        assert_eq!(pin.outcome, Outcome::Pass);
        assert!(pin.detail.contains("sha256:aaa"), "{}", pin.detail);
        assert!(
            matches!(d.verdict, Verdict::NeedsApproval { .. }),
            "{:?}",
            d.verdict
        );

        // An approval issued under that definition lets the call through; once the served
        // definition is another, the same approval no longer verifies.
        let Verdict::NeedsApproval { rule, .. } = &d.verdict else {
            unreachable!()
        };
        let tool = reg.tool("payment.schedule").unwrap();
        let token = keys().issue(&ApprovalClaims {
            subject: "call-1".into(),
            tool: "payment.schedule".into(),
            tool_version: tool.config.version.clone(),
            input_hash: InputHash::of(&payment(15_000.0)),
            registry_version: Some(reg.version.hash.clone()),
            gate_rule: Some(rule.clone()),
            definition_hash: Some("sha256:aaa".into()),
            approver: "alice".into(),
            expires_at: NOW.plus_hours(72),
            nonce: "nonce-pin".into(),
        });
        let tokens = std::slice::from_ref(&token);
        assert!(decide_served(&reg, Definition::Pinned("sha256:aaa"), tokens).is_allow());
        let moved = decide_served(&reg, Definition::Pinned("sha256:bbb"), tokens);
        assert!(!moved.is_allow(), "{:?}", moved.verdict);
    }

    #[test]
    fn built_in_and_unreached_upstreams_skip_the_pin_check_with_the_reason() {
        let reg = version(same, same_tools);
        let local = decide_served(&reg, Definition::Local, &[]);
        assert_eq!(check(&local, CheckName::Pin).outcome, Outcome::Skip);
        let unreached = decide_served(&reg, Definition::Unreached, &[]);
        let c = check(&unreached, CheckName::Pin);
        assert_eq!(c.outcome, Outcome::Skip);
        assert!(c.detail.contains("not been reached"), "{}", c.detail);
        assert!(matches!(unreached.verdict, Verdict::NeedsApproval { .. }));
    }
}
