use serde_json::json;

use super::*;

fn tool(name: &str, annotations: Value, schema: Value) -> Value {
    json!({"name": name, "description": "d", "inputSchema": schema, "annotations": annotations})
}

#[test]
fn read_only_tools_are_listed_closed_and_bounded() {
    let t = tool(
        "read_text_file",
        json!({"readOnlyHint": true}),
        json!({"type": "object", "required": ["path"], "properties": {
            "path": {"type": "string"}, "head": {"type": "number"},
            "paths": {"type": "array", "items": {"type": "string"}}}}),
    );
    let p = propose("fs", &t, &ProposeOptions::default());
    assert_eq!(p.class, Class::Read);
    let d = p.declaration.unwrap();
    assert_eq!(d["effect"], "read");
    assert_eq!(
        d["handler"],
        json!({"upstream": "fs", "tool": "read_text_file"})
    );
    let s = &d["input_schema"];
    assert_eq!(s["additionalProperties"], false);
    assert_eq!(s["properties"]["path"]["maxLength"], 4096);
    assert_eq!(s["properties"]["head"]["maximum"], SAFE_INT);
    assert_eq!(s["properties"]["paths"]["maxItems"], 100);
    assert_eq!(s["properties"]["paths"]["items"]["maxLength"], 4096);
    assert!(p.review.iter().any(|r| r.contains("bounds added")));
}

#[test]
fn state_changing_tools_are_gated_with_every_input_as_identity() {
    let t = tool(
        "write_file",
        json!({"readOnlyHint": false, "destructiveHint": true}),
        json!({"type": "object", "properties": {"path": {"type": "string"}, "content": {"type": "string"}}}),
    );
    let p = propose("fs", &t, &ProposeOptions::default());
    assert_eq!(p.class, Class::Gated);
    let d = p.declaration.unwrap();
    assert_eq!(d["gate"], "always");
    assert_eq!(d["effect"], "irreversible");
    assert_eq!(d["tier"], "act");
    assert_eq!(
        d["identity"],
        json!(["path", "content"]),
        "in the schema's order"
    );
}

#[test]
fn what_cannot_be_placed_safely_is_refused_with_a_reason() {
    let o = ProposeOptions::default();
    let obj = json!({"type": "object", "properties": {"x": {"type": "string"}}});
    // Contradicting hints, a lying name, no hints at all, money, no inputs, a free destination.
    for (name, ann, schema, why) in [
        (
            "a",
            json!({"readOnlyHint": true, "destructiveHint": true}),
            obj.clone(),
            "both",
        ),
        (
            "delete_all",
            json!({"readOnlyHint": true}),
            obj.clone(),
            "name",
        ),
        ("get_thing", Value::Null, obj.clone(), "no readOnlyHint"),
        (
            "frobnicate",
            Value::Null,
            obj.clone(),
            "neither read nor write",
        ),
        (
            "create_payment",
            json!({"readOnlyHint": false}),
            obj.clone(),
            "money",
        ),
        (
            "toggle-logging",
            json!({"readOnlyHint": false}),
            json!({"type": "object", "properties": {}}),
            "no inputs",
        ),
        (
            "fetch",
            json!({"readOnlyHint": true}),
            json!({"type": "object", "properties": {"url": {"type": "string", "format": "uri"}}}),
            "'url'",
        ),
    ] {
        let p = propose("s", &tool(name, ann, schema), &o);
        assert_eq!(p.class, Class::Refused, "{name}");
        assert!(p.declaration.is_none(), "{name}");
        assert!(
            p.review[0].starts_with("refused: ") && p.review[0].contains(why),
            "{name}: {:?}",
            p.review
        );
    }
}

#[test]
fn nullable_and_nested_shapes_are_closed_through_alternatives_and_defs() {
    let schema = json!({"type": "object", "properties": {
        "addr": {"anyOf": [{"$ref": "#/$defs/Address"}, {"type": "null"}]},
        "tags": {"type": "object", "additionalProperties": {"type": "string"}}},
        "$defs": {"Address": {"type": "object", "properties": {"street": {"type": "string"}}}}});
    let mut notes = Vec::new();
    let c = close(&schema, "", &mut notes);
    assert_eq!(c["$defs"]["Address"]["additionalProperties"], false);
    assert_eq!(
        c["$defs"]["Address"]["properties"]["street"]["maxLength"],
        1000
    );
    assert_eq!(c["properties"]["tags"]["additionalProperties"], false);
    assert!(
        notes.iter().any(|n| n.contains("tags took any keys")),
        "{notes:?}"
    );
}
