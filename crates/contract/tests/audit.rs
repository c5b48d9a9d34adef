//! The tool contract audit on a deliberately poisoned server definition: each rule fires where it
//! should and not where it should not; table, JSON and SARIF are snapshotted, and the SARIF is
//! validated against the SARIF 2.1.0 JSON schema (vendored from npm `@microsoft/jest-sarif`).

use serde_json::Value;
use toolgate_contract::audit::Status;
use toolgate_contract::sarif::to_sarif;
use toolgate_contract::{AuditReport, ServerFacts, Severity, audit};

fn poisoned() -> AuditReport {
    let path = format!(
        "{}/tests/fixtures/poisoned_server.json",
        env!("CARGO_MANIFEST_DIR")
    );
    let v: Value = serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    let facts: ServerFacts = serde_json::from_value(v["facts"].clone()).unwrap();
    audit(
        "helpful-mail --stdio",
        &facts,
        v["tools"].as_array().unwrap(),
    )
}

fn has(r: &AuditReport, rule: &str, tool: Option<&str>, severity: Severity) -> bool {
    r.findings
        .iter()
        .any(|f| f.rule == rule && f.tool.as_deref() == tool && f.severity == severity)
}

fn rules_for(r: &AuditReport, tool: &str) -> Vec<String> {
    r.findings
        .iter()
        .filter(|f| f.tool.as_deref() == Some(tool))
        .map(|f| f.rule.clone())
        .collect()
}

#[test]
fn an_unkeyed_destructive_write_is_high() {
    let r = poisoned();
    assert!(has(&r, "unkeyed-write", Some("send_email"), Severity::High));
    // add_contact takes request_id: keyed.
    assert!(!rules_for(&r, "add_contact").contains(&"unkeyed-write".to_string()));
}

#[test]
fn free_string_destinations_are_flagged_and_constrained_ones_are_not() {
    let r = poisoned();
    let dest: Vec<&str> = r
        .findings
        .iter()
        .filter(|f| f.rule == "free-destination")
        .filter_map(|f| f.path.as_deref())
        .collect();
    assert!(dest.contains(&"inputSchema.properties.to"), "{dest:?}");
    assert!(
        dest.contains(&"inputSchema.properties.cc"),
        "an array of free strings: {dest:?}"
    );
    assert!(
        !dest.contains(&"inputSchema.properties.webhook_url"),
        "format: uri constrains it: {dest:?}"
    );
}

#[test]
fn open_and_unbounded_schemas_are_flagged() {
    let r = poisoned();
    assert!(has(&r, "open-schema", Some("send_email"), Severity::Medium));
    assert!(!rules_for(&r, "list_contacts").contains(&"open-schema".to_string()));
    let unbounded: Vec<&str> = r
        .findings
        .iter()
        .filter(|f| f.rule == "unbounded-value" && f.tool.as_deref() == Some("send_email"))
        .map(|f| f.message.as_str())
        .collect();
    assert!(
        unbounded.iter().any(|m| m.contains("number")),
        "{unbounded:?}"
    );
    assert!(
        unbounded.iter().any(|m| m.contains("string")),
        "{unbounded:?}"
    );
    assert!(!rules_for(&r, "list_contacts").contains(&"unbounded-value".to_string()));
}

#[test]
fn missing_and_contradictory_annotations_are_flagged() {
    let r = poisoned();
    assert!(has(
        &r,
        "annotations-missing",
        Some("send_email"),
        Severity::Medium
    ));
    assert!(has(
        &r,
        "annotations-contradictory",
        Some("delete_contact"),
        Severity::High
    ));
    assert!(has(
        &r,
        "annotations-contradictory",
        Some("delete_contact"),
        Severity::Medium
    ));
    assert!(!rules_for(&r, "list_contacts").contains(&"annotations-contradictory".to_string()));
}

#[test]
fn instruction_text_hidden_unicode_and_tool_mentions_are_flagged() {
    let r = poisoned();
    assert!(
        has(&r, "instruction-text", Some("send_email"), Severity::High),
        "<IMPORTANT>"
    );
    assert!(
        has(&r, "instruction-text", Some("send_email"), Severity::Medium),
        "always call"
    );
    assert!(has(&r, "tool-mention", Some("send_email"), Severity::Low));
    assert!(has(
        &r,
        "hidden-unicode",
        Some("add_contact"),
        Severity::High
    ));
    assert!(
        has(&r, "instruction-text", Some("add_contact"), Severity::High),
        "ignore previous"
    );
    assert!(
        has(&r, "instruction-text", None, Severity::High),
        "server instructions: do not tell"
    );
    assert!(!rules_for(&r, "list_contacts").contains(&"instruction-text".to_string()));
}

#[test]
fn the_implementation_row_is_always_undetermined_and_never_fails_a_build() {
    let r = poisoned();
    let rows: Vec<_> = r
        .findings
        .iter()
        .filter(|f| f.rule == "implementation")
        .collect();
    assert_eq!(rows.len(), 1);
    assert_eq!(rows[0].status, Status::Undetermined);
    let clean = audit("empty", &ServerFacts::default(), &[]);
    assert_eq!(clean.findings.len(), 1, "only the implementation row");
    assert!(!clean.fails_at(Severity::Info));
}

#[test]
fn fail_on_thresholds() {
    let r = poisoned();
    assert!(r.fails_at(Severity::High));
    assert!(r.fails_at(Severity::Low));
    let only_low = audit(
        "t",
        &ServerFacts::default(),
        &[serde_json::json!({
            "name": "list_things",
            "inputSchema": {"type": "object", "additionalProperties": false,
                            "properties": {"q": {"type": "string"}}},
            "annotations": {"readOnlyHint": true, "openWorldHint": false}
        })],
    );
    assert_eq!(only_low.max_severity(), Some(Severity::Low));
    assert!(!only_low.fails_at(Severity::Medium));
    assert!(only_low.fails_at(Severity::Low));
}

#[test]
fn table_json_and_sarif_snapshots() {
    let r = poisoned();
    insta::assert_snapshot!("audit_table", r.render_table());
    insta::assert_snapshot!("audit_json", serde_json::to_string_pretty(&r).unwrap());
    insta::assert_snapshot!(
        "audit_sarif",
        serde_json::to_string_pretty(&to_sarif(&r, "0.0.0-test")).unwrap()
    );
}

#[test]
fn sarif_output_is_valid_against_the_sarif_2_1_0_schema() {
    let schema: Value = serde_json::from_str(
        &std::fs::read_to_string(format!(
            "{}/tests/fixtures/sarif-2.1.0-rtm.5.json",
            env!("CARGO_MANIFEST_DIR")
        ))
        .unwrap(),
    )
    .unwrap();
    let validator = jsonschema::options()
        .with_draft(jsonschema::Draft::Draft4)
        .build(&schema)
        .expect("the SARIF schema compiles");
    let log = to_sarif(&poisoned(), "0.1.0");
    let errors: Vec<String> = validator
        .iter_errors(&log)
        .map(|e| format!("{} at {}", e, e.instance_path()))
        .collect();
    assert!(errors.is_empty(), "{errors:#?}");
    // And the validator does reject a broken log, so the check above means something.
    let mut broken = log.clone();
    broken["runs"][0]["results"][0]["level"] = Value::from("critical");
    assert!(!validator.is_valid(&broken));
    let results = log["runs"][0]["results"].as_array().unwrap();
    assert!(
        results
            .iter()
            .any(|r| r["kind"] == "review" && r["ruleId"] == "implementation")
    );
}
