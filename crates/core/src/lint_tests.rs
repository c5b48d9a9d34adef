use super::*;
use serde_json::json;

fn tool(schema: Value) -> ToolConfig {
    serde_json::from_value(json!({
        "name": "email.send", "version": "1", "owner": "@o", "description": "d",
        "effect": "irreversible", "tier": "act", "sensitivity": "internal",
        "scopes": ["s"], "purposes": ["p"], "roles": ["r"],
        "identity": ["to"], "reconcile": "email.lookup",
        "handler": {"upstream": "u"},
        "input_schema": schema,
    }))
    .unwrap()
}

fn rules(t: &ToolConfig) -> Vec<String> {
    let mut out = Vec::new();
    lint_tool("tools/t.yaml", 0, t, false, &mut out);
    out.into_iter()
        .map(|f| format!("{} @ {}", f.rule, f.path))
        .collect()
}

#[test]
fn a_closed_bounded_schema_is_clean() {
    let t = tool(
        json!({"type": "object", "additionalProperties": false, "properties": {
            "to": {"type": "string", "pattern": "^[^@]+@northwind\\.com$", "maxLength": 254},
            "n": {"type": "integer", "minimum": 0, "maximum": 9},
            "tags": {"type": "array", "maxItems": 3, "items": {"type": "string", "enum": ["a"]}}
        }}),
    );
    assert_eq!(rules(&t), Vec::<String>::new());
}

#[test]
fn each_unsafe_shape_is_found_where_it_is() {
    let t = tool(json!({"type": "object", "properties": {
        "to": {"type": "string", "maxLength": 254},
        "amount": {"type": "number", "minimum": 0},
        "note": {"type": "string"},
        "lines": {"type": "array", "items": {"type": "object", "additionalProperties": false,
            "properties": {"webhook_url": {"type": "string", "format": "uri"}}}}
    }}));
    let r = rules(&t);
    for want in [
        "schema.open-object @ tools[0].input_schema",
        "destination.free-string @ tools[0].input_schema.properties.to",
        "schema.unbounded-number @ tools[0].input_schema.properties.amount",
        "schema.unbounded-string @ tools[0].input_schema.properties.note",
        "schema.unbounded-array @ tools[0].input_schema.properties.lines",
        "destination.free-string @ tools[0].input_schema.properties.lines.items.properties.webhook_url",
    ] {
        assert!(r.contains(&want.to_string()), "missing {want} in {r:#?}");
    }
}

#[test]
fn a_destination_constraint_satisfies_the_destination_rule() {
    let mut t = tool(
        json!({"type": "object", "additionalProperties": false, "properties": {
        "to": {"type": "string", "format": "email", "maxLength": 254}}}),
    );
    assert!(
        rules(&t)
            .iter()
            .any(|r| r.starts_with("destination.free-string"))
    );
    t.destinations = vec![
        serde_json::from_value(
            json!({"field": "to", "kind": "email_domain", "allowed": ["a.com"]}),
        )
        .unwrap(),
    ];
    assert!(!rules(&t).iter().any(|r| r.starts_with("destination")));
}

#[test]
fn writes_need_identity_and_compensation_and_irreversibles_a_reconciler_or_gate() {
    let schema = json!({"type": "object", "additionalProperties": false, "properties": {}});
    let mut t = tool(schema);
    t.effect = Effect::Write;
    t.identity.clear();
    let r = rules(&t);
    assert!(r.iter().any(|r| r.starts_with("write.no-identity")));
    assert!(r.iter().any(|r| r.starts_with("write.no-compensation")));
    t.effect = Effect::Irreversible;
    t.reconcile = None;
    assert!(
        rules(&t)
            .iter()
            .any(|r| r.starts_with("irreversible.unguarded"))
    );
    t.gate = Gate::Always;
    assert!(
        !rules(&t)
            .iter()
            .any(|r| r.starts_with("irreversible.unguarded"))
    );
}

#[test]
fn annotations_that_contradict_the_effect_are_found() {
    let schema = json!({"type": "object", "additionalProperties": false, "properties": {}});
    let mut t = tool(schema);
    t.annotations = Some(AnnotationsConfig {
        read_only_hint: Some(true),
        ..Default::default()
    });
    assert!(
        rules(&t)
            .iter()
            .any(|r| r.starts_with("annotations.contradict-effect"))
    );
    t.annotations = Some(AnnotationsConfig {
        destructive_hint: Some(false),
        ..Default::default()
    });
    assert!(
        rules(&t)
            .iter()
            .any(|r| r.starts_with("annotations.contradict-effect"))
    );
    t.annotations = Some(AnnotationsConfig {
        destructive_hint: Some(true),
        read_only_hint: Some(false),
        ..Default::default()
    });
    assert!(!rules(&t).iter().any(|r| r.starts_with("annotations")));
}

#[test]
fn destination_names_are_recognised_by_word() {
    for n in [
        "to",
        "reply_to",
        "webhookUrl",
        "callback_url",
        "iban",
        "channel",
        "account_id",
        "repo_owner",
    ] {
        assert!(is_destination_name(n), "{n}");
    }
    for n in ["amount", "total", "invoice_id", "reason", "tone"] {
        assert!(!is_destination_name(n), "{n}");
    }
}

#[test]
fn the_fixture_registry_lints_clean() {
    let r = Registry::load(
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/acme"),
    )
    .unwrap();
    let f = lint(&r);
    assert!(f.is_empty(), "{:#?}", f);
}

/// A built-in declared as `handler: {builtin: name}`, effect write, with `schema`.
fn builtin(name: &str, schema: Value) -> ToolConfig {
    serde_json::from_value(json!({
        "name": name, "version": "1", "owner": "@o", "description": "d",
        "effect": "write", "tier": "read", "sensitivity": "internal",
        "purposes": ["p"], "roles": ["r"], "identity": ["goal"],
        "handler": {"builtin": name},
        "input_schema": schema,
    }))
    .unwrap()
}

fn steps_with(inputs: Value) -> Value {
    json!({"type": "object", "additionalProperties": false, "properties": {
        "goal": {"type": "string", "maxLength": 9},
        "steps": {"type": "array", "maxItems": 5, "items": {
            "type": "object", "additionalProperties": false,
            "properties": {"inputs": inputs, "extra": {"type": "object"}}}}
    }})
}

#[test]
fn only_plan_submits_step_inputs_may_be_open_and_only_record_writing_builtins_skip_compensation() {
    let plan = builtin("plan.submit", steps_with(json!({"type": "object"})));
    assert_eq!(
        rules(&plan),
        ["schema.open-object @ tools[0].input_schema.properties.steps.items.properties.extra"],
        "the step inputs are exempt; another open object in the same schema is not"
    );
    let other = builtin("run.status", steps_with(json!({"type": "object"})));
    let found = rules(&other);
    assert!(
        found.contains(
            &"schema.open-object @ tools[0].input_schema.properties.steps.items.properties.inputs"
                .to_string()
        ),
        "{found:?}"
    );
    assert!(
        found.contains(&"write.no-compensation @ tools[0].compensate".to_string()),
        "a read built-in declared as a write is still asked for compensation: {found:?}"
    );
}

#[test]
fn an_optional_field_published_as_any_of_null_is_judged_by_its_alternatives() {
    // pydantic's `recipient: Optional[str]`, constrained: clean; the null alternative and the
    // type-less node around them are not free strings of their own.
    let constrained = tool(json!({"type": "object", "additionalProperties": false,
        "properties": {"to": {"anyOf": [
            {"type": "string", "pattern": "^[^@]+@northwind\\.com$", "maxLength": 254},
            {"type": "null"}], "default": null}}}));
    assert_eq!(rules(&constrained), Vec::<String>::new());
    // Unconstrained, it is found once, where the string is.
    let free = tool(json!({"type": "object", "additionalProperties": false,
        "properties": {"to": {"anyOf": [{"type": "string", "maxLength": 254}, {"type": "null"}]},
                       "cc": {"type": ["string", "null"], "maxLength": 254}}}));
    assert_eq!(
        rules(&free),
        [
            "destination.free-string @ tools[0].input_schema.properties.to.anyOf[0]",
            "destination.free-string @ tools[0].input_schema.properties.cc",
        ]
    );
}

#[test]
fn refs_are_followed_to_their_definition_once_and_recursion_stops() {
    let t = tool(json!({
        "type": "object", "additionalProperties": false,
        "properties": {
            "to": {"$ref": "#/$defs/Address"},
            "reply_to": {"anyOf": [{"$ref": "#/$defs/Address"}, {"type": "null"}]},
            "tree": {"$ref": "#/$defs/Node"}
        },
        "$defs": {
            "Address": {"type": "string", "maxLength": 254},
            "Node": {"type": "object", "additionalProperties": false, "properties": {
                "children": {"type": "array", "maxItems": 9, "items": {"$ref": "#/$defs/Node"}}}}
        }
    }));
    // The fix goes in the definition: both names that use it are reported there, once each
    // (not once per path to it), and the recursive `Node` is linted without looping.
    assert_eq!(
        rules(&t),
        [
            "destination.free-string @ tools[0].input_schema.$defs.Address",
            "destination.free-string @ tools[0].input_schema.$defs.Address"
        ],
    );
    let mut out = Vec::new();
    lint_tool("tools/t.yaml", 0, &t, false, &mut out);
    let messages: Vec<&str> = out.iter().map(|f| f.message.as_str()).collect();
    assert_eq!(
        messages,
        [
            "destination-like parameter 'to' accepts any value",
            "destination-like parameter 'reply_to' accepts any value"
        ]
    );
}

#[test]
fn what_cedar_only_warns_about_in_a_policy_is_a_finding() {
    let dir = tempfile::tempdir().unwrap();
    let src = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/acme");
    for sub in ["", "tools", "policies"] {
        std::fs::create_dir_all(dir.path().join(sub)).unwrap();
        for e in std::fs::read_dir(src.join(sub)).unwrap() {
            let e = e.unwrap();
            if e.file_type().unwrap().is_file() {
                std::fs::copy(e.path(), dir.path().join(sub).join(e.file_name())).unwrap();
            }
        }
    }
    // A Cyrillic "а" among Latin letters: the string a reviewer reads is not the one compared.
    std::fs::write(
        dir.path().join("policies/mixed.cedar"),
        "@id(\"no-paypаl\")\nforbid (principal, action == Action::\"payment.schedule\", resource)\n\
         when { context.inputs.reason like \"*paypаl*\" };\n",
    )
    .unwrap();
    let r = Registry::load(dir.path()).expect("a warning does not stop the registry loading");
    let f = lint(&r);
    assert!(
        f.iter().any(|f| f.rule == "policy.confusable-text"
            && f.file == "policies/mixed.cedar"
            && f.path == "no-paypаl"),
        "{f:#?}"
    );
}

#[test]
fn an_unquoted_yaml_type_null_is_the_null_type_not_a_free_string_nor_an_open_door() {
    // Written by hand in YAML, `{type: null}` reads as no type at all. Loaded, it is the null
    // type: no destination finding, and the alternative does not accept any value.
    let yaml = r#"
type: object
additionalProperties: false
properties:
  to:
    anyOf: [{type: string, pattern: "^[^@]+@northwind\\.com$", maxLength: 254}, {type: null}]
  channel: {type: null}
  cc: {type: [string, null], enum: [ops@northwind.com, null]}
"#;
    let mut schema: Value = yaml_serde::from_str(yaml).unwrap();
    assert_eq!(schema["properties"]["channel"]["type"], Value::Null);
    crate::schema::normalize_null_types(&mut schema);
    assert_eq!(schema["properties"]["channel"]["type"], json!("null"));
    assert_eq!(
        schema["properties"]["cc"]["type"],
        json!(["string", "null"])
    );
    // Data keeps its nulls.
    assert_eq!(schema["properties"]["cc"]["enum"][1], Value::Null);
    assert_eq!(rules(&tool(schema.clone())), Vec::<String>::new());
    let compiled = crate::schema::InputSchema::compile(&schema).unwrap();
    assert!(compiled.validate(&json!({"to": null})).is_ok());
    assert!(
        compiled
            .validate(&json!({"to": "ceo@attacker.example"}))
            .is_err(),
        "the null alternative does not let any string through"
    );
}

#[test]
fn a_reconciling_query_guards_an_irreversible_tool_and_compensate_with_undoes_a_write() {
    let schema = json!({"type": "object", "additionalProperties": false, "properties": {
        "to": {"type": "string", "enum": ["a"]}}});
    let mut irreversible = tool(schema.clone());
    irreversible.reconcile = None;
    assert_eq!(
        rules(&irreversible),
        ["irreversible.unguarded @ tools[0].reconcile"]
    );
    irreversible.reconcile_query =
        Some(serde_json::from_value(json!({"tool": "email.sent", "match": ["to"]})).unwrap());
    assert_eq!(rules(&irreversible), Vec::<String>::new());

    let mut write = tool(schema);
    write.effect = Effect::Write;
    write.reconcile = None;
    assert_eq!(
        rules(&write),
        ["write.no-compensation @ tools[0].compensate"]
    );
    write.compensate_with =
        Some(serde_json::from_value(json!({"read": "email.get", "restore": ["to"]})).unwrap());
    assert_eq!(rules(&write), Vec::<String>::new());
}

#[test]
fn the_query_finds_the_call_in_the_answer_and_the_previous_values_are_its_record() {
    use crate::config::{CompensateWithConfig, ReconcileQueryConfig};
    let q: ReconcileQueryConfig = serde_json::from_value(json!({
        "tool": "bank.transactions", "with": {"account": "from"}, "args": {"n": 50},
        "result": "data.transactions", "match": ["recipient", "amount"]
    }))
    .unwrap();
    let call = json!({"from": "ACC-1", "recipient": "GB29", "amount": 100, "subject": "x"});
    assert_eq!(q.arguments(&call), json!({"n": 50, "account": "ACC-1"}));
    let answer = json!({"data": {"transactions": [
        {"recipient": "GB29", "amount": 99.5}, {"recipient": "GB29", "amount": 100.0, "id": 7}]}});
    assert_eq!(
        q.find(&answer, &call).unwrap().unwrap()["id"],
        7,
        "100 is 100.0"
    );
    let other = json!({"recipient": "GB29", "amount": 5});
    assert_eq!(q.find(&answer, &other).unwrap(), None);
    assert!(
        q.find(&json!({"data": {}}), &call).is_err(),
        "no list: no conclusion"
    );

    let w: CompensateWithConfig = serde_json::from_value(json!({
        "read": "bank.scheduled", "result": "items", "pick": ["id"],
        "restore": {"amount": "amount", "recipient_iban": "recipient"}
    }))
    .unwrap();
    let call = json!({"id": 3, "amount": 50, "recipient": "NEW"});
    let answer = json!({"items": [{"id": 2, "amount": 1}, {"id": 3, "amount": 20, "recipient_iban": "OLD"}]});
    let prev = w.previous(&answer, &call).unwrap();
    assert_eq!(prev, json!({"amount": 20, "recipient": "OLD"}));
    assert_eq!(
        CompensateWithConfig::compensation_inputs(&call, &prev),
        json!({"id": 3, "amount": 20, "recipient": "OLD"})
    );
    assert!(w.previous(&json!({"items": [{"id": 9}]}), &call).is_err());
}
