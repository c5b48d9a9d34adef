use super::*;
use serde_json::json;

/// A read tool named `name` with this input schema.
fn tool(name: &str, schema: Value) -> ToolConfig {
    serde_json::from_value(json!({
        "name": name, "version": "1", "owner": "@o", "description": "d",
        "effect": "read", "tier": "read", "sensitivity": "internal",
        "purposes": ["p"], "roles": ["r"], "handler": {"upstream": "u"},
        "input_schema": schema,
    }))
    .unwrap()
}

/// `mail.send` as a FastMCP server publishes it: `recipient: Optional[str] = None`, a union,
/// and an optional nested model.
fn mail() -> ToolConfig {
    tool(
        "mail.send",
        json!({"type": "object", "required": ["subject"], "properties": {
            "subject": {"type": "string"},
            "recipient": {"anyOf": [{"type": "string"}, {"type": "null"}], "default": null},
            "either": {"anyOf": [{"type": "string"}, {"type": "integer"}]},
            "count": {"type": "integer"},
            "addr": {"anyOf": [{"$ref": "#/$defs/Address"}, {"type": "null"}]}
        }, "$defs": {"Address": {"type": "object", "required": ["city"],
                                 "properties": {"city": {"type": "string"}}}}}),
    )
}

fn lookup() -> ToolConfig {
    tool(
        "mail.lookup",
        json!({"type": "object", "properties": {"either": {"type": "string"}}}),
    )
}

fn principal() -> PrincipalConfig {
    serde_json::from_value(json!({"id": "agent", "kind": "agent", "role": "r"})).unwrap()
}

fn load(tools: &[ToolConfig], policy: &str) -> Result<Policies, Vec<PolicyProblem>> {
    let types: Vec<CedarType> = tools
        .iter()
        .map(|t| CedarType::of(&t.input_schema))
        .collect();
    let refs: Vec<&CedarType> = types.iter().collect();
    Policies::load(
        &[("policies/p.cedar".into(), policy.into())],
        tools,
        &refs,
        &[principal()],
    )
}

/// The one problem a policy has, as `message` and `fix`.
fn refused(tools: &[ToolConfig], policy: &str) -> (String, String) {
    let problems = load(tools, policy).expect_err("the policy must be refused");
    assert_eq!(problems.len(), 1, "{problems:#?}");
    let p = &problems[0];
    assert_eq!(p.file, "policies/p.cedar");
    assert_eq!(p.policy.as_deref(), Some("p"));
    (p.message.clone(), p.fix.clone().unwrap_or_default())
}

const SEND: &str = "@id(\"p\") forbid (principal, action == Action::\"mail.send\", resource)";

#[test]
fn an_optional_input_read_with_has_loads_and_without_it_is_refused_with_the_guard() {
    load(
        &[mail()],
        &format!("{SEND} when {{ context.inputs has recipient && context.inputs.recipient like \"*@x.com\" }};"),
    )
    .expect("a guarded read of an anyOf-null input loads");
    load(
        &[mail()],
        &format!(
            "{SEND} when {{ context.inputs has addr.city && context.inputs.addr.city == \"x\" }};"
        ),
    )
    .expect("a has path guards the nested read");

    let (message, fix) = refused(
        &[mail()],
        &format!("{SEND} when {{ context.inputs.recipient like \"*@x.com\" }};"),
    );
    assert!(
        message.contains("reads `context.inputs.recipient` without testing it first")
            && message.contains("input `recipient` of 'mail.send' is optional")
            && message.contains("which refuses the call"),
        "{message}"
    );
    assert!(fix.contains("`context.inputs has recipient && …`"), "{fix}");
    // Required but nullable (pydantic's `to: Optional[str]` without a default): still
    // optional to policies, because null is passed as absent.
    let mut required = mail();
    required.input_schema["required"] = json!(["subject", "recipient"]);
    let (message, _) = refused(
        &[required],
        &format!("{SEND} when {{ context.inputs.recipient like \"*@x.com\" }};"),
    );
    assert!(
        message.contains("is optional (its schema allows null, which policies see as absent)"),
        "{message}"
    );
}

#[test]
fn a_has_test_on_an_input_no_tool_declares_is_refused_as_always_false() {
    let (message, fix) = refused(
        &[mail()],
        &format!(
            "{SEND} when {{ context.inputs has recipent && context.inputs.recipent == \"x\" }};"
        ),
    );
    assert_eq!(
        message,
        "`context.inputs has recipent` names input `recipent`, which no tool this policy \
         applies to ('mail.send') declares: the test is always false, so the rule cannot work \
         as written"
    );
    assert!(
        fix.starts_with("name an input the tool declares; 'mail.send' has subject, recipient, either, count, addr"),
        "{fix}"
    );
    // Nested: the name missing is the one inside the record.
    let (message, _) = refused(
        &[mail()],
        &format!("{SEND} when {{ context.inputs has addr.zip }};"),
    );
    assert!(message.contains("names input `addr.zip`"), "{message}");
}

#[test]
fn a_policy_over_several_tools_may_test_an_input_only_some_have() {
    let all = "@id(\"p\") forbid (principal, action, resource) \
               when { context.inputs has count && context.inputs.count > 3 };";
    load(&[mail(), lookup()], all).expect("mail.send has count; mail.lookup does not");
    let none = "@id(\"p\") forbid (principal, action, resource) when { context.inputs has cuont };";
    let (message, _) = refused(&[mail(), lookup()], none);
    assert!(
        message.contains("which no tool this policy applies to ('mail.send', 'mail.lookup')"),
        "{message}"
    );
}

#[test]
fn an_input_without_a_cedar_type_is_refused_with_its_reason_not_as_missing() {
    for condition in [
        "context.inputs has either",
        "context.inputs has either && context.inputs.either == \"x\"",
    ] {
        let (message, fix) = refused(&[mail()], &format!("{SEND} when {{ {condition} }};"));
        assert!(
            message.contains("names input `either` of 'mail.send', which has no Cedar type")
                && message.contains("one of several types (string | integer)"),
            "{message}"
        );
        assert!(!message.contains("not found"), "{message}");
        assert!(fix.contains("give the input one type"), "{fix}");
    }
    // Reading it unguarded: the same one problem (Cedar's own "not found" is not repeated).
    let (message, _) = refused(
        &[mail()],
        &format!("{SEND} when {{ context.inputs.either == \"x\" }};"),
    );
    assert!(message.contains("has no Cedar type"), "{message}");
    // A policy over every tool names the tool where the input has no type, though another
    // tool has it typed: there the rule would silently never apply.
    let all = "@id(\"p\") forbid (principal, action, resource) \
               when { context.inputs has either && context.inputs.either == \"x\" };";
    let (message, _) = refused(&[mail(), lookup()], all);
    assert!(message.contains("of 'mail.send', which"), "{message}");
}

#[test]
fn a_resource_scope_narrows_the_tools_a_policy_is_checked_against() {
    let scoped = "@id(\"p\") forbid (principal, action, resource == Tool::\"mail.lookup\") \
                  when { context.inputs has either && context.inputs.either == \"x\" };";
    load(&[mail(), lookup()], scoped).expect("only mail.lookup, where `either` is a string");
}

#[test]
fn a_policy_that_can_never_match_is_refused() {
    let (message, fix) = refused(
        &[mail()],
        &format!("{SEND} when {{ context.purpose == \"a\" && false }};"),
    );
    assert!(message.contains("policy is impossible"), "{message}");
    assert!(fix.contains("enforces nothing"), "{fix}");
}

#[test]
fn the_cedar_schema_names_the_inputs_it_leaves_out_and_why() {
    let p = load(&[mail()], "").unwrap();
    let action = &p.schema_json()[""]["actions"]["mail.send"];
    let inputs = &action["appliesTo"]["context"]["attributes"]["inputs"]["attributes"];
    assert_eq!(inputs["recipient"]["required"], json!(false));
    assert!(inputs.get("either").is_none());
    let note = action["annotations"]["untyped_inputs"].as_str().unwrap();
    assert!(
        note.starts_with("either: it is one of several types (string | integer)"),
        "{note}"
    );
}

fn context(tool: &ToolConfig, inputs: Value) -> Vec<(String, RestrictedExpression)> {
    let long = RestrictedExpression::new_long;
    vec![
        (
            "purpose".into(),
            RestrictedExpression::new_string("p".into()),
        ),
        (
            "reason".into(),
            RestrictedExpression::new_string("r".into()),
        ),
        (
            "inputs".into(),
            CedarType::of(&tool.input_schema).to_cedar(&inputs).unwrap(),
        ),
        (
            "run".into(),
            RestrictedExpression::new_record(
                ["steps", "denials", "act_steps", "spend_steps", "tool_calls"]
                    .map(|k| (k.to_string(), long(0))),
            )
            .unwrap(),
        ),
    ]
}

const THREE: &str = r#"
@id("external") @gate
forbid (principal, action == Action::"mail.send", resource)
when { context.inputs has recipient && !(context.inputs.recipient like "*@acme.com") };

@id("many") forbid (principal, action == Action::"mail.send", resource)
when { context.inputs has count && context.inputs.count > 10 };

@id("overflow") forbid (principal, action == Action::"mail.send", resource)
when { context.inputs has count && context.inputs.count + 9223372036854775807 > 0 };

@id("other-tool") forbid (principal, action == Action::"mail.lookup", resource);
"#;

#[test]
fn each_policy_of_the_calls_tool_is_matched_not_matched_or_errored() {
    let (mail, lookup) = (mail(), lookup());
    let p = load(&[mail.clone(), lookup], THREE).unwrap();
    let (who, action, resource) = (
        uid("Principal", "agent"),
        uid("Action", "mail.send"),
        uid("Tool", "mail.send"),
    );
    let results = p.evaluate_each(
        &who,
        &action,
        &resource,
        context(
            &mail,
            json!({"subject": "s", "recipient": "a@evil.com", "count": 1}),
        ),
    );
    let got: Vec<(&str, PolicyEffect, &PolicyOutcome)> = results
        .iter()
        .map(|r| (r.id.as_str(), r.effect, &r.outcome))
        .collect();
    assert_eq!(got.len(), 3, "mail.lookup's policy does not apply: {got:?}");
    assert_eq!(
        got[0],
        ("external", PolicyEffect::Gate, &PolicyOutcome::Matched)
    );
    assert_eq!(
        got[1],
        ("many", PolicyEffect::Forbid, &PolicyOutcome::NotMatched)
    );
    assert_eq!(got[2].0, "overflow");
    assert!(
        matches!(got[2].2, PolicyOutcome::Errored { error } if error.contains("overflow")),
        "{:?}",
        got[2]
    );
    // The same evaluation as the verdict: the error refuses, the gate is named.
    let v = p.evaluate(
        &who,
        &action,
        &resource,
        context(
            &mail,
            json!({"subject": "s", "recipient": "a@evil.com", "count": 1}),
        ),
    );
    assert_eq!(v.gated_by, ["external"]);
    assert_eq!(v.errors.len(), 1);
    // Without a recipient, the guarded gate simply does not match (and nothing errors).
    let quiet = p.evaluate_each(
        &who,
        &action,
        &resource,
        context(&mail, json!({"subject": "s"})),
    );
    assert!(
        quiet.iter().all(|r| r.outcome == PolicyOutcome::NotMatched),
        "{quiet:?}"
    );
}

#[test]
fn a_shadow_policy_that_errors_is_recorded_and_does_not_refuse() {
    let mail = mail();
    let p = load(
        std::slice::from_ref(&mail),
        r#"@id("trial") @shadow forbid (principal, action == Action::"mail.send", resource)
           when { context.inputs has count && context.inputs.count + 9223372036854775807 > 0 };"#,
    )
    .unwrap();
    let v = p.evaluate(
        &uid("Principal", "agent"),
        &uid("Action", "mail.send"),
        &uid("Tool", "mail.send"),
        context(&mail, json!({"subject": "s", "count": 1})),
    );
    assert!(v.errors.is_empty(), "{v:?}");
    assert_eq!(v.shadow_matched, ["trial"]);
}
