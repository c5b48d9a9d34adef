use super::*;
use crate::registry::LoadError;

const TOOLS: &str = r#"
tools:
  - name: invoice.search
    version: "1.0.0"
    owner: "@t/ap"
    description: Find invoices.
    effect: read
    tier: read
    sensitivity: internal
    scopes: [invoices:read]
    purposes: [billing, audit]
    roles: [worker, auditor]
    handler: {upstream: erp}
    input_schema:
      type: object
      additionalProperties: false
      properties:
        invoice_id: {type: string}
  - name: note.draft
    version: "1.0.0"
    owner: "@t/ap"
    description: Draft a note.
    effect: write
    tier: act
    sensitivity: internal
    scopes: [notes:write]
    purposes: [billing]
    roles: [worker]
    identity: [invoice_id]
    handler: {upstream: erp}
    input_schema:
      type: object
      additionalProperties: false
      required: [invoice_id, text]
      properties:
        invoice_id: {type: string}
        text: {type: string}
  - name: payment.schedule
    version: "1.0.0"
    owner: "@t/ap"
    description: Pay.
    effect: irreversible
    tier: spend
    sensitivity: internal
    scopes: [payments:write]
    purposes: [billing]
    roles: [worker]
    identity: [invoice_id]
    reason_from: reason
    idempotency: {scope: registry}
    handler: {upstream: erp}
    input_schema:
      type: object
      additionalProperties: false
      required: [invoice_id, reason]
      properties:
        invoice_id: {type: string}
        reason: {type: string}
"#;

const PRINCIPALS: &str = r#"
roles:
  worker: {description: "works"}
  auditor: {description: "audits", default_purpose: audit}
principals:
  - id: both
    kind: agent
    role: worker
    credentials:
      - {id: plain, sha256: "sha256:1111111111111111111111111111111111111111111111111111111111111111"}
      - {id: audit-key, sha256: "sha256:2222222222222222222222222222222222222222222222222222222222222222", default_purpose: audit}
    grants:
      - {scopes: [invoices:read, notes:write, payments:write], purposes: [billing, audit], max_tier: spend}
  - id: billing-only
    kind: agent
    role: worker
    parent: both
    grants:
      - {scopes: [invoices:read, notes:write, payments:write], purposes: [billing], max_tier: spend}
  - id: auditor
    kind: agent
    role: auditor
    grants:
      - {scopes: [invoices:read], purposes: [billing, audit], max_tier: read}
"#;

fn registry_with(tools: &str, principals: &str) -> Result<Registry, LoadError> {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("toolgate.yaml"),
        "upstreams:\n  erp: {url: \"http://127.0.0.1:1/mcp\", package: \"erp@1.0.0\"}\n",
    )
    .unwrap();
    std::fs::create_dir(dir.path().join("tools")).unwrap();
    std::fs::write(dir.path().join("tools/t.yaml"), tools).unwrap();
    std::fs::write(dir.path().join("principals.yaml"), principals).unwrap();
    Registry::load(dir.path())
}

fn registry() -> Registry {
    registry_with(TOOLS, PRINCIPALS).unwrap()
}

fn args(v: Value) -> Map<String, Value> {
    v.as_object().unwrap().clone()
}

#[test]
fn a_caller_with_one_granted_purpose_needs_to_state_none() {
    let r = registry();
    let tool = r.tool("invoice.search").unwrap();
    let only = r.principal("billing-only").unwrap();
    assert_eq!(
        r.default_purpose(only, None, tool),
        Some(("billing".to_string(), PurposeSource::OnlyGranted))
    );
    // Two purposes and no default: nothing is guessed.
    let both = r.principal("both").unwrap();
    assert_eq!(r.default_purpose(both, Some("plain"), tool), None);
}

#[test]
fn defaults_apply_credential_then_principal_then_role() {
    let r = registry();
    let tool = r.tool("invoice.search").unwrap();
    let both = r.principal("both").unwrap();
    assert_eq!(
        r.default_purpose(both, Some("audit-key"), tool),
        Some(("audit".to_string(), PurposeSource::Credential))
    );
    let auditor = r.principal("auditor").unwrap();
    assert_eq!(
        r.default_purpose(auditor, None, tool),
        Some(("audit".to_string(), PurposeSource::Role))
    );
    // A default the tool cannot be used for does not apply: note.draft is for billing only.
    let note = r.tool("note.draft").unwrap();
    assert_eq!(
        r.default_purpose(both, Some("audit-key"), note),
        Some(("billing".to_string(), PurposeSource::OnlyGranted))
    );
}

#[test]
fn the_listed_schema_asks_for_what_the_caller_must_say() {
    let r = registry();
    let both = r.principal("both").unwrap();
    let only = r.principal("billing-only").unwrap();
    let search = r.tool("invoice.search").unwrap();

    // A read with two possible purposes and no default: purpose asked, required, as an enum
    // of what this caller may use; no reason (a read needs none).
    let s = r.listed_schema(both, Some("plain"), search);
    assert_eq!(
        s["properties"]["purpose"]["enum"],
        json!(["billing", "audit"])
    );
    assert_eq!(s["required"], json!(["purpose"]));
    assert!(s["properties"].get("reason").is_none());
    // The same read for a caller whose purpose is known: listed exactly as declared.
    assert_eq!(
        r.listed_schema(only, None, search),
        search.config.input_schema
    );

    // A write: a required reason with the default bounds; its own inputs unchanged.
    let note = r.tool("note.draft").unwrap();
    let s = r.listed_schema(only, None, note);
    assert_eq!(s["properties"]["reason"]["minLength"], 10);
    assert_eq!(s["properties"]["reason"]["maxLength"], 500);
    assert_eq!(s["required"], json!(["invoice_id", "text", "reason"]));
    assert_eq!(s["additionalProperties"], false);

    // A tool whose own `reason` input is the reason: nothing added.
    let pay = r.tool("payment.schedule").unwrap();
    assert_eq!(r.listed_schema(only, None, pay), pay.config.input_schema);
}

#[test]
fn arguments_are_split_from_the_inputs_and_meta_wins() {
    let r = registry();
    let both = r.principal("both").unwrap();
    let note = r.tool("note.draft").unwrap();
    let given = args(json!({
        "invoice_id": "INV-1", "text": "hello",
        "purpose": "billing", "reason": "ask the supplier about the delivery"
    }));
    let s = r.split_call(both, None, note, given.clone(), None, None);
    assert_eq!(s.inputs, json!({"invoice_id": "INV-1", "text": "hello"}));
    assert_eq!(s.why.purpose.as_deref(), Some("billing"));
    assert_eq!(s.why.purpose_from, Some(PurposeSource::Argument));
    assert_eq!(s.why.reason_from, Some(ReasonSource::Argument));
    assert!(s.errors.is_empty());

    let s = r.split_call(
        both,
        None,
        note,
        given,
        Some("billing"),
        Some("the reason from _meta"),
    );
    assert_eq!(s.why.purpose_from, Some(PurposeSource::Meta));
    assert_eq!(s.why.reason.as_deref(), Some("the reason from _meta"));
    assert_eq!(s.inputs, json!({"invoice_id": "INV-1", "text": "hello"}));
}

#[test]
fn bad_governance_arguments_are_field_errors() {
    let r = registry();
    let both = r.principal("both").unwrap();
    let note = r.tool("note.draft").unwrap();
    let s = r.split_call(
        both,
        None,
        note,
        args(json!({"invoice_id": "I", "text": "t", "purpose": "marketing", "reason": "short"})),
        None,
        None,
    );
    let got: Vec<(&str, &str)> = s
        .errors
        .iter()
        .map(|e| (e.field.as_str(), e.constraint.as_str()))
        .collect();
    assert_eq!(got, vec![("/purpose", "enum"), ("/reason", "minLength")]);
    let s = r.split_call(
        both,
        None,
        note,
        args(json!({"invoice_id": "I", "text": "t", "reason": 7})),
        None,
        None,
    );
    assert_eq!(s.errors[0].field, "/reason");
    assert_eq!(s.errors[0].constraint, "type");
}

#[test]
fn a_tools_own_reason_input_is_kept_and_read_as_the_reason() {
    let r = registry();
    let only = r.principal("billing-only").unwrap();
    let pay = r.tool("payment.schedule").unwrap();
    let s = r.split_call(
        only,
        None,
        pay,
        args(json!({"invoice_id": "INV-1", "reason": "invoice matched against PO-1"})),
        None,
        None,
    );
    assert_eq!(
        s.inputs,
        json!({"invoice_id": "INV-1", "reason": "invoice matched against PO-1"})
    );
    assert_eq!(s.why.reason_from, Some(ReasonSource::Input));
    assert_eq!(s.why.purpose_from, Some(PurposeSource::OnlyGranted));
}

#[test]
fn keys_name_the_operation_in_the_tools_scope() {
    let r = registry();
    let note = r.tool("note.draft").unwrap();
    let pay = r.tool("payment.schedule").unwrap();
    let a = json!({"invoice_id": "INV-1", "text": "one wording"});
    let b = json!({"invoice_id": "INV-1", "text": "another wording"});
    // The identity fields decide: rewording is the same operation.
    assert_eq!(r.call_key("both", note, &a), r.call_key("both", note, &b));
    // Principal scope: another principal's same operation is another key.
    assert_ne!(
        r.call_key("both", note, &a),
        r.call_key("billing-only", note, &a)
    );
    // Registry scope: one key whoever asks.
    let p = json!({"invoice_id": "INV-1", "reason": "x"});
    assert_eq!(
        r.call_key("both", pay, &p),
        r.call_key("billing-only", pay, &p)
    );
    assert_eq!(r.key_scope("billing-only", pay), "registry");
}

#[test]
fn a_tree_scope_is_named_by_the_root_ancestor() {
    let tools = TOOLS.replace("    identity: [invoice_id]\n    handler: {upstream: erp}\n    input_schema:\n      type: object\n      additionalProperties: false\n      required: [invoice_id, text]",
        "    identity: [invoice_id]\n    idempotency: {scope: tree}\n    handler: {upstream: erp}\n    input_schema:\n      type: object\n      additionalProperties: false\n      required: [invoice_id, text]");
    let r = registry_with(&tools, PRINCIPALS).unwrap();
    let note = r.tool("note.draft").unwrap();
    assert_eq!(r.key_scope("billing-only", note), "tree:both");
    assert_eq!(r.key_scope("both", note), "tree:both");
    assert_eq!(r.key_scope("auditor", note), "tree:auditor");
}

#[test]
fn reads_replay_only_when_they_opt_in() {
    let r = registry();
    assert!(!replays(r.tool("invoice.search").unwrap()));
    assert!(replays(r.tool("note.draft").unwrap()));
    let tools = TOOLS.replacen(
        "    purposes: [billing, audit]\n    roles: [worker, auditor]\n",
        "    purposes: [billing, audit]\n    roles: [worker, auditor]\n    idempotency: {replay: true}\n",
        1,
    );
    let r = registry_with(&tools, PRINCIPALS).unwrap();
    assert!(replays(r.tool("invoice.search").unwrap()));
}

fn rules(e: LoadError) -> Vec<(String, String)> {
    match e {
        LoadError::Invalid(f) => f.into_iter().map(|f| (f.rule, f.path)).collect(),
        e => panic!("unexpected {e}"),
    }
}

#[test]
fn conflicting_or_meaningless_call_fields_are_load_errors() {
    // Asking for a reason argument on a tool whose own input is called reason.
    let t = TOOLS.replace("    reason_from: reason\n", "    ask: [reason]\n");
    let got = rules(registry_with(&t, PRINCIPALS).unwrap_err());
    assert_eq!(
        got,
        vec![(
            "config.ask-conflict".to_string(),
            "tools[2].ask".to_string()
        )]
    );
    // reason_from naming no string input; a write that would not replay.
    let t = TOOLS
        .replace("    reason_from: reason\n", "    reason_from: memo\n")
        .replace(
            "    identity: [invoice_id]\n    handler",
            "    identity: [invoice_id]\n    idempotency: {replay: false}\n    handler",
        );
    let got = rules(registry_with(&t, PRINCIPALS).unwrap_err());
    assert!(got.contains(&(
        "config.replay".to_string(),
        "tools[1].idempotency.replay".to_string()
    )));
    assert!(got.contains(&(
        "ref.unknown-field".to_string(),
        "tools[2].reason_from".to_string()
    )));
    // A default purpose the principal holds no grant for.
    let p = PRINCIPALS.replace(
        "  - id: billing-only\n    kind: agent\n",
        "  - id: billing-only\n    kind: agent\n    default_purpose: audit\n",
    );
    let got = rules(registry_with(TOOLS, &p).unwrap_err());
    assert_eq!(
        got,
        vec![(
            "config.default-purpose".to_string(),
            "principals[1].default_purpose".to_string()
        )]
    );
}
