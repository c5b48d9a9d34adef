//! The commands' output, snapshotted, called as functions with a writer.

use std::path::PathBuf;

use super::*;
use crate::exit::Exit;

fn fixture() -> ConfigArg {
    ConfigArg {
        dir: PathBuf::from(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../core/tests/fixtures/acme"
        )),
    }
}

fn output(f: impl FnOnce(&mut Vec<u8>) -> anyhow::Result<crate::exit::Exit>) -> (u8, String) {
    let mut out = Vec::new();
    let code = f(&mut out).expect("the command runs").code();
    (code, String::from_utf8(out).unwrap())
}

#[test]
fn check_a_clean_registry() {
    let args = check::Args {
        folder: None,
        config: fixture(),
        json: false,
        cedar_schema: false,
        schema: None,
        explain: None,
    };
    let (code, text) = output(|o| check::run(&args, o));
    assert_eq!(code, 0);
    insta::assert_snapshot!(text);
}

#[test]
fn check_reports_findings_with_exit_1_and_unreadable_with_2() {
    let tmp = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(tmp.path().join("tools")).unwrap();
    std::fs::write(tmp.path().join("toolgate.yaml"), "label: t\n").unwrap();
    std::fs::write(
        tmp.path().join("principals.yaml"),
        "principals:\n  - {id: a, kind: agent, role: r, credentials: [{id: k, sha256: \"sha256:0000000000000000000000000000000000000000000000000000000000000009\"}], grants: [{scopes: [s], purposes: [p], max_tier: act}]}\n",
    )
    .unwrap();
    std::fs::write(
        tmp.path().join("tools/mail.yaml"),
        r#"tools:
  - name: mail.send
    version: "1"
    owner: "@o"
    description: Send mail.
    effect: write
    tier: act
    sensitivity: internal
    scopes: [s]
    purposes: [p]
    roles: [r]
    handler: {builtin: run.status}
    input_schema:
      type: object
      properties:
        to: {type: string}
        count: {type: integer}
"#,
    )
    .unwrap();
    let args = check::Args {
        folder: Some(tmp.path().into()),
        config: ConfigArg { dir: ".".into() },
        json: false,
        cedar_schema: false,
        schema: None,
        explain: None,
    };
    let (code, text) = output(|o| check::run(&args, o));
    assert_eq!(code, 1);
    insta::assert_snapshot!(text);

    std::fs::write(tmp.path().join("principals.yaml"), "principals: [ {").unwrap();
    let (code, text) = output(|o| check::run(&args, o));
    assert_eq!(code, 2);
    assert!(text.starts_with("unreadable: principals.yaml"), "{text}");
}

/// A registry whose only findings are accepted passes with warnings; an acceptance that
/// matches nothing is a finding of its own.
#[test]
fn check_passes_with_accepted_findings_as_warnings_and_reports_a_stale_acceptance() {
    let tmp = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(tmp.path().join("tools")).unwrap();
    std::fs::write(
        tmp.path().join("principals.yaml"),
        "principals:\n  - {id: a, kind: agent, role: r, credentials: [{id: k, sha256: \"sha256:0000000000000000000000000000000000000000000000000000000000000009\"}], grants: [{scopes: [s], purposes: [p], max_tier: act}], budgets: {act: 10}}\n",
    )
    .unwrap();
    std::fs::write(
        tmp.path().join("tools/pay.yaml"),
        r#"tools:
  - name: pay.send
    version: "1"
    owner: "@o"
    description: Send a payment.
    effect: irreversible
    tier: act
    sensitivity: internal
    scopes: [s]
    purposes: [p]
    roles: [r]
    identity: [ref]
    handler: {builtin: run.status}
    input_schema:
      type: object
      additionalProperties: false
      properties:
        ref: {type: string, maxLength: 20}
        memo: {anyOf: [{type: string}, {type: null}]}
"#,
    )
    .unwrap();
    let accept = |extra: &str| {
        format!(
            "label: t\naccept:\n  - rule: irreversible.unguarded\n    subject: pay.send\n    reason: gated by policy above 100 EUR\n    by: \"@acme/security\"\n  - rule: schema.unbounded-string\n    subject: pay.send\n    at: input_schema.properties.memo\n    reason: the memo is free text the bank bounds\n    by: \"@acme/security\"\n{extra}"
        )
    };
    std::fs::write(tmp.path().join("toolgate.yaml"), accept("")).unwrap();
    let args = check::Args {
        folder: Some(tmp.path().into()),
        config: ConfigArg { dir: ".".into() },
        json: false,
        cedar_schema: false,
        schema: None,
        explain: None,
    };
    let (code, text) = output(|o| check::run(&args, o));
    assert_eq!(code, 0, "{text}");
    insta::assert_snapshot!("check_accepted_findings", text);

    // The same in JSON: each accepted finding a warning naming who accepted it.
    let json_args = check::Args {
        json: true,
        ..check::Args {
            folder: Some(tmp.path().into()),
            config: ConfigArg { dir: ".".into() },
            json: false,
            cedar_schema: false,
            schema: None,
            explain: None,
        }
    };
    let (code, text) = output(|o| check::run(&json_args, o));
    assert_eq!(code, 0);
    let items: serde_json::Value = serde_json::from_str(&text).unwrap();
    let items = items.as_array().unwrap();
    assert_eq!(items.len(), 2, "{text}");
    assert!(items.iter().all(|i| i["severity"] == "warning"), "{text}");
    assert_eq!(items[0]["accepted"]["by"], "@acme/security");
    assert_eq!(items[0]["subject"], "pay.send");

    // A third acceptance that matches nothing: a finding, exit 1.
    std::fs::write(
        tmp.path().join("toolgate.yaml"),
        accept("  - rule: schema.open-object\n    subject: pay.send\n    reason: it used to be open\n    by: \"@acme/security\"\n"),
    )
    .unwrap();
    let (code, text) = output(|o| check::run(&args, o));
    assert_eq!(code, 1, "{text}");
    assert!(
        text.contains("toolgate.yaml: accept[2]: [accept.stale] the accepted finding [schema.open-object] on 'pay.send' no longer occurs"),
        "{text}"
    );

    // An acceptance of something that is not a lint rule does not load.
    std::fs::write(
        tmp.path().join("toolgate.yaml"),
        accept("  - rule: ref.dangling\n    subject: pay.send\n    reason: nope\n    by: me\n"),
    )
    .unwrap();
    let (code, text) = output(|o| check::run(&args, o));
    assert_eq!(code, 1, "{text}");
    assert!(
        text.contains("[config.accept] 'ref.dangling' is not a lint rule that can be accepted"),
        "{text}"
    );
}

#[test]
fn check_schema_prints_each_file_kind() {
    for kind in ["toolgate", "tools", "principals"] {
        let args = check::Args {
            folder: None,
            config: ConfigArg { dir: ".".into() },
            json: false,
            cedar_schema: false,
            schema: Some(kind.into()),
            explain: None,
        };
        let (code, text) = output(|o| check::run(&args, o));
        assert_eq!(code, 0);
        let schema: serde_json::Value = serde_json::from_str(&text).unwrap();
        assert_eq!(
            schema["$schema"],
            "https://json-schema.org/draft/2020-12/schema"
        );
        insta::assert_snapshot!(format!("check_schema_{kind}"), text);
    }
    let bad = check::Args {
        folder: None,
        config: ConfigArg { dir: ".".into() },
        json: false,
        cedar_schema: false,
        schema: Some("lockfile".into()),
        explain: None,
    };
    let err = check::run(&bad, &mut Vec::new()).unwrap_err().to_string();
    assert!(err.contains("toolgate, tools, principals"), "{err}");
}

#[test]
fn check_explain_each_rule() {
    let explain = |rule: &str| {
        let args = check::Args {
            folder: None,
            config: ConfigArg { dir: ".".into() },
            json: false,
            cedar_schema: false,
            schema: None,
            explain: Some(rule.into()),
        };
        let mut out = Vec::new();
        let r = check::run(&args, &mut out);
        (r, String::from_utf8(out).unwrap())
    };
    for rule in toolgate_core::rules::LINT_RULES {
        let (r, text) = explain(rule.id);
        assert_eq!(r.unwrap(), Exit::Success);
        assert!(
            text.starts_with(rule.id) && text.contains("Fix: "),
            "{text}"
        );
    }
    let (r, text) = explain("irreversible.unguarded");
    assert_eq!(r.unwrap(), Exit::Success);
    insta::assert_snapshot!("check_explain_irreversible_unguarded", text);
    let (r, text) = explain("all");
    assert_eq!(r.unwrap(), Exit::Success);
    insta::assert_snapshot!("check_explain_all", text);
    let (r, _) = explain("no.such-rule");
    assert!(r.unwrap_err().to_string().contains("schema.open-object"));
}

#[test]
fn capabilities_list() {
    let args = capabilities::Args {
        action: capabilities::Action::List {
            config: fixture(),
            role: None,
        },
    };
    let (code, text) = output(|o| capabilities::run(&args, o));
    assert_eq!(code, 0);
    insta::assert_snapshot!(text);
}

#[test]
fn grants_show() {
    let args = grants::Args {
        action: grants::Action::Show {
            principal: "fin-worker".into(),
            config: fixture(),
        },
    };
    let (code, text) = output(|o| grants::run(&args, o));
    assert_eq!(code, 0);
    insta::assert_snapshot!(text);
}

fn decide_with(json: &str) -> (u8, String) {
    let tmp = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(tmp.path(), json).unwrap();
    let args = decide::Args {
        config: fixture(),
        file: Some(tmp.path().into()),
        json: false,
    };
    output(|o| decide::run(&args, o))
}

#[test]
fn decide_prints_every_check_of_a_gated_payment() {
    let (code, text) = decide_with(
        r#"{"principal": "fin-worker", "tool": "payment.schedule", "purpose": "billing", "reason": "due",
            "inputs": {"invoice_id": "INV-20260611", "amount": 12000, "currency": "EUR",
                       "value_date": "2026-06-30", "reason": "Three-way match complete against PO-77812."},
            "at_ms": 1790000000000}"#,
    );
    assert_eq!(code, 3);
    insta::assert_snapshot!(text);
}

#[test]
fn decide_prints_the_first_failure_and_every_other_check() {
    let (code, text) = decide_with(
        r#"{"principal": "fin-worker", "tool": "payment.schedule", "purpose": "marketing",
            "inputs": {"invoice_id": "INV-1", "amount": 60000, "currency": "EUR",
                       "value_date": "2026-06-30", "reason": "Three-way match complete against PO-77812."},
            "run": [{"tool": "invoice.search", "tier": "read", "outcome": "denied"}],
            "budgets": {"fin-worker": {"spend": 2}}, "at_ms": 1790000000000}"#,
    );
    assert_eq!(code, 1);
    insta::assert_snapshot!(text);
}

/// The finance example's plan-bound worker: a direct call is refused as `serve` refuses it
/// (before any other check, `plan.unplanned`); as one of its planned steps it is decided.
#[test]
fn decide_refuses_a_plan_bound_direct_call_as_serve_does() {
    let dir = PathBuf::from(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../examples/finance"
    ));
    let call = |planned: &str, json: bool| {
        let tmp = tempfile::NamedTempFile::new().unwrap();
        std::fs::write(
            tmp.path(),
            format!(
                r#"{{"principal": "fin-worker", "tool": "payment.schedule", "purpose": "billing",
                    "inputs": {{"invoice_id": "INV-20260611", "amount": 4180, "currency": "EUR",
                               "value_date": "2026-06-30",
                               "reason": "Three-way match complete against PO-77812."}},
                    "at_ms": 1790000000000{planned}}}"#
            ),
        )
        .unwrap();
        let args = decide::Args {
            config: ConfigArg { dir: dir.clone() },
            file: Some(tmp.path().into()),
            json,
        };
        output(|o| decide::run(&args, o))
    };
    let (code, text) = call("", false);
    assert_eq!(code, 1, "{text}");
    assert!(
        text.starts_with("decision: DENY at check 'plan' (rule plan.unplanned)\n"),
        "{text}"
    );
    assert!(
        text.contains(&toolgate_core::registry::unplanned_reason(
            "fin-worker",
            "payment.schedule",
            false
        )),
        "the reason serve gives: {text}"
    );
    let (code, text) = call("", true);
    assert_eq!(code, 1, "{text}");
    let doc: serde_json::Value = serde_json::from_str(&text).unwrap();
    assert_eq!(doc["verdict"]["rule"], "plan.unplanned", "{doc}");
    assert_eq!(doc["verdict"]["kind"], "deny", "{doc}");
    // As the planned step it is: a payment, gated for a person.
    let (code, text) = call(r#", "planned": true"#, false);
    assert_eq!(code, 3, "{text}");
    assert!(text.contains("NEEDS APPROVAL"), "{text}");
    // A role that is not plan-bound is decided as before (the acme worker's payment).
    let (code, _) = decide_with(
        r#"{"principal": "fin-worker", "tool": "payment.schedule", "purpose": "billing", "reason": "due",
            "inputs": {"invoice_id": "INV-20260611", "amount": 12000, "currency": "EUR",
                       "value_date": "2026-06-30", "reason": "Three-way match complete against PO-77812."},
            "at_ms": 1790000000000}"#,
    );
    assert_eq!(code, 3);
}

#[test]
fn decide_refuses_unknown_fields_in_its_input() {
    let tmp = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(
        tmp.path(),
        r#"{"principal": "a", "tool": "b", "input": {}}"#,
    )
    .unwrap();
    let args = decide::Args {
        config: fixture(),
        file: Some(tmp.path().into()),
        json: false,
    };
    let err = decide::run(&args, &mut Vec::new()).unwrap_err();
    assert!(
        format!("{err:#}").contains("unknown field `input`"),
        "{err:#}"
    );
}

/// The FastMCP-style fixture, with a policy that errors on some calls and one in shadow.
fn optional_inputs_with(extra_policy: &str) -> tempfile::TempDir {
    let from = PathBuf::from(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../core/tests/fixtures/optional-inputs"
    ));
    let tmp = tempfile::tempdir().unwrap();
    for sub in ["", "tools", "policies"] {
        std::fs::create_dir_all(tmp.path().join(sub)).unwrap();
        for e in std::fs::read_dir(from.join(sub)).unwrap() {
            let e = e.unwrap();
            if e.file_type().unwrap().is_file() {
                std::fs::copy(e.path(), tmp.path().join(sub).join(e.file_name())).unwrap();
            }
        }
    }
    std::fs::write(tmp.path().join("policies/extra.cedar"), extra_policy).unwrap();
    tmp
}

#[test]
fn decide_shows_each_policy_matched_not_matched_or_errored() {
    let dir = optional_inputs_with(
        r#"@id("cc-count-overflows")
forbid (principal, action == Action::"mail.send", resource)
when { context.inputs has cc && context.run.steps + 9223372036854775807 > 0 };

@id("trial-no-reply") @shadow
forbid (principal, action == Action::"mail.send", resource)
unless { context.inputs has reply };
"#,
    );
    let tmp = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(
        tmp.path(),
        r#"{"principal": "mail-agent", "tool": "mail.send", "purpose": "billing", "reason": "asked",
            "inputs": {"invoice_id": "INV-20260611", "subject": "Your invoice",
                       "recipient": "ap@evil.example", "cc": ["me@acme.com"]},
            "run": [{"tool": "mail.send", "tier": "act", "outcome": "allowed"}],
            "at_ms": 1790000000000}"#,
    )
    .unwrap();
    let args = decide::Args {
        config: ConfigArg {
            dir: dir.path().into(),
        },
        file: Some(tmp.path().into()),
        json: false,
    };
    let (code, text) = output(|o| decide::run(&args, o));
    assert_eq!(code, 1, "the erroring policy refuses the call");
    let policies = &text[text.find("policies of").expect("per-policy lines")..];
    insta::assert_snapshot!(policies);

    let args = decide::Args { json: true, ..args };
    let (_, text) = output(|o| decide::run(&args, o));
    let doc: serde_json::Value = serde_json::from_str(&text).unwrap();
    let outcomes: Vec<(&str, &str)> = doc["policies"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| (p["id"].as_str().unwrap(), p["outcome"].as_str().unwrap()))
        .collect();
    assert_eq!(
        outcomes,
        [
            ("cc-count-overflows", "errored"),
            ("external-recipient-needs-approval", "matched"),
            ("external-reply-needs-approval", "not_matched"),
            ("no-external-cc", "not_matched"),
            ("trial-no-reply", "matched"),
        ]
    );
    assert_eq!(
        doc["verdict"]["kind"], "deny",
        "the decision is still there"
    );
}
