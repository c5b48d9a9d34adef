use super::*;
use proptest::prelude::*;
use serde_json::json;

fn payment_schema() -> InputSchema {
    InputSchema::compile(&json!({
        "type": "object",
        "additionalProperties": false,
        "required": ["invoice_id", "amount", "currency", "value_date", "reason"],
        "properties": {
            "invoice_id": {"type": "string", "pattern": "^INV-[0-9]{8}$"},
            "amount": {"type": "number", "exclusiveMinimum": 0, "maximum": 50000},
            "currency": {"type": "string", "enum": ["EUR"]},
            "value_date": {"type": "string", "format": "date"},
            "reason": {"type": "string", "minLength": 20, "maxLength": 400},
            "count": {"type": "integer", "minimum": 1, "maximum": 10}
        }
    }))
    .unwrap()
}

prop_compose! {
    fn valid_payment()(
        digits in "[0-9]{8}",
        cents in 1u64..=5_000_000,
        day in 1u32..=28,
        month in 1u32..=12,
        reason in "[A-Za-z ]{20,60}",
        count in proptest::option::of(1i64..=10),
    ) -> Value {
        let mut v = json!({
            "invoice_id": format!("INV-{digits}"),
            "amount": cents as f64 / 100.0,
            "currency": "EUR",
            "value_date": format!("2026-{month:02}-{day:02}"),
            "reason": reason,
        });
        if let Some(c) = count { v["count"] = json!(c); }
        v
    }
}

/// One single mutation of a valid input, with the field it breaks.
#[derive(Debug, Clone)]
enum Mutation {
    AboveMax(f64),
    NotPositive(f64),
    ExtraField(String),
    WrongType(&'static str),
    BrokenPattern(String),
    BadEnum(String),
    IntegerOutOfBounds(i64),
}

fn mutation() -> impl Strategy<Value = Mutation> {
    prop_oneof![
        (50_000.01f64..1e9).prop_map(Mutation::AboveMax),
        (-1e6f64..=0.0).prop_map(Mutation::NotPositive),
        "[a-z_]{1,12}"
            .prop_filter("not a declared field", |k| ![
                "invoice_id",
                "amount",
                "currency",
                "value_date",
                "reason",
                "count"
            ]
            .contains(&k.as_str()))
            .prop_map(Mutation::ExtraField),
        prop_oneof![Just("amount"), Just("invoice_id"), Just("reason")]
            .prop_map(Mutation::WrongType),
        "[A-Z]{3}-[0-9]{1,7}".prop_map(Mutation::BrokenPattern),
        "[A-Z]{3}"
            .prop_filter("not EUR", |c| c != "EUR")
            .prop_map(Mutation::BadEnum),
        prop_oneof![(-1000i64..1), (11i64..1000)].prop_map(Mutation::IntegerOutOfBounds),
    ]
}

fn apply(v: &mut Value, m: &Mutation) -> &'static str {
    match m {
        Mutation::AboveMax(x) => {
            v["amount"] = json!(x);
            "/amount"
        }
        Mutation::NotPositive(x) => {
            v["amount"] = json!(x);
            "/amount"
        }
        Mutation::ExtraField(k) => {
            v[k.as_str()] = json!("x");
            "/"
        }
        Mutation::WrongType(f) => {
            v[*f] = if *f == "amount" {
                json!("4180")
            } else {
                json!(42)
            };
            match *f {
                "amount" => "/amount",
                "invoice_id" => "/invoice_id",
                _ => "/reason",
            }
        }
        Mutation::BrokenPattern(s) => {
            v["invoice_id"] = json!(s);
            "/invoice_id"
        }
        Mutation::BadEnum(s) => {
            v["currency"] = json!(s);
            "/currency"
        }
        Mutation::IntegerOutOfBounds(n) => {
            v["count"] = json!(n);
            "/count"
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, failure_persistence: Some(Box::new(
        proptest::test_runner::FileFailurePersistence::SourceParallel("proptest-regressions"))), ..ProptestConfig::default() })]

    #[test]
    fn schema_valid_inputs_pass(v in valid_payment()) {
        prop_assert_eq!(payment_schema().validate(&v), Ok(()));
    }

    #[test]
    fn each_single_mutation_is_refused_with_the_fields_path(v in valid_payment(), m in mutation()) {
        let mut bad = v.clone();
        let field = apply(&mut bad, &m);
        let errors = payment_schema().validate(&bad).expect_err("a mutated input must be refused");
        let named = errors.iter().any(|e| if field == "/" {
            if let Mutation::ExtraField(k) = &m { e.field == format!("/{k}") } else { false }
        } else { e.field == field });
        prop_assert!(named, "mutation {:?} not named in {:?}", m, errors);
    }
}

/// Fixed cases: shrunk failures the fuzzer found are kept here as plain tests.
#[test]
fn fixed_cases_from_the_fuzzer() {
    let s = payment_schema();
    let base = json!({"invoice_id": "INV-00000000", "amount": 0.01, "currency": "EUR",
                      "value_date": "2026-01-01", "reason": "aaaaaaaaaaaaaaaaaaaa"});
    assert_eq!(s.validate(&base), Ok(()));
    // The exclusive minimum: zero itself is refused.
    let mut zero = base.clone();
    zero["amount"] = json!(0);
    assert_eq!(
        s.validate(&zero).unwrap_err()[0].constraint,
        "exclusiveMinimum"
    );
    // 50,000 exactly passes; one cent more does not.
    let mut max = base.clone();
    max["amount"] = json!(50000);
    assert_eq!(s.validate(&max), Ok(()));
    max["amount"] = json!(50000.01);
    assert_eq!(s.validate(&max).unwrap_err()[0].constraint, "maximum");
    // Day 31 of February is not a date.
    let mut date = base.clone();
    date["value_date"] = json!("2026-02-31");
    assert_eq!(s.validate(&date).unwrap_err()[0].constraint, "format");
}

#[test]
fn errors_say_what_would_pass() {
    let s = payment_schema();
    let bad = json!({"invoice_id": "INV-1", "amount": 60000, "currency": "USD",
                     "value_date": "2026-06-30", "reason": "short", "iban": "ES91"});
    let errors = s.validate(&bad).unwrap_err();
    let text: Vec<String> = errors.iter().map(|e| e.to_string()).collect();
    let all = text.join("\n");
    assert!(
        all.contains("'/amount' fails 'maximum': must be at most 50000"),
        "{all}"
    );
    assert!(all.contains("must be one of [\"EUR\"]"), "{all}");
    assert!(
        all.contains("must match the pattern ^INV-[0-9]{8}$"),
        "{all}"
    );
    assert!(
        all.contains("unexpected field(s) 'iban'; the allowed fields are: invoice_id, amount"),
        "{all}"
    );
    assert!(
        all.contains("'/reason' fails 'minLength': must be at least 20 characters"),
        "{all}"
    );
}

#[test]
fn cedar_types_follow_the_schema() {
    let s = payment_schema();
    let t = s.cedar_type();
    assert_eq!(
        t.lookup(&["amount"]),
        InputLookup::Typed {
            ty: &CedarType::Decimal,
            optional: false
        },
        "required"
    );
    assert_eq!(
        t.lookup(&["count"]),
        InputLookup::Typed {
            ty: &CedarType::Long,
            optional: true
        },
        "optional"
    );
}

#[test]
fn decimals_with_more_than_four_digits_are_refused_not_rounded() {
    assert_eq!(
        to_decimal(&serde_json::Number::from_f64(4180.5).unwrap()).unwrap(),
        "4180.5000"
    );
    assert_eq!(to_decimal(&serde_json::Number::from(12)).unwrap(), "12.0");
    assert!(to_decimal(&serde_json::Number::from_f64(0.123456).unwrap()).is_err());
}

#[test]
fn decimals_beyond_cedars_range_are_refused_whole_numbers_too() {
    assert!(to_decimal(&serde_json::Number::from(922_337_203_685_477i64)).is_err());
    assert!(to_decimal(&serde_json::Number::from(-922_337_203_685_478i64)).is_err());
    assert_eq!(
        to_decimal(&serde_json::Number::from(922_337_203_685_476i64)).unwrap(),
        "922337203685476.0"
    );
}

// --- Cedar types of the shapes real servers publish -------------------------------------

/// The `tools/list` fixtures: real servers' published inputs (tests/fixtures/schemas).
fn fixture_tools(file: &str) -> Vec<(String, Value)> {
    let path = format!(
        "{}/tests/fixtures/schemas/{file}.json",
        env!("CARGO_MANIFEST_DIR")
    );
    let doc: Value = serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    doc["tools"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| {
            (
                t["name"].as_str().unwrap().to_string(),
                t["inputSchema"].clone(),
            )
        })
        .collect()
}

fn typed(t: &CedarType, path: &str) -> (CedarType, bool) {
    let segments: Vec<&str> = path.split('.').collect();
    match t.lookup(&segments) {
        InputLookup::Typed { ty, optional } => (ty.clone(), optional),
        other => panic!("{path}: {other:?}"),
    }
}

fn untyped(t: &CedarType, path: &str) -> Untypable {
    let segments: Vec<&str> = path.split('.').collect();
    match t.lookup(&segments) {
        InputLookup::Untyped { why, .. } => why.clone(),
        other => panic!("{path}: {other:?}"),
    }
}

/// The generated Cedar schema fragment must be one Cedar accepts.
fn assert_cedar_accepts(t: &CedarType) {
    let schema = json!({"": {
        "entityTypes": {"P": {}, "T": {}},
        "actions": {"a": {"appliesTo": {"principalTypes": ["P"], "resourceTypes": ["T"],
            "context": {"type": "Record", "attributes": {"inputs": t.to_cedar_schema()}}}}}
    }});
    cedar_policy::Schema::from_json_value(schema).expect("Cedar accepts the generated types");
}

#[test]
fn pydantic_optional_fields_are_optional_attributes_of_their_type() {
    let tools = fixture_tools("fastmcp_shapes");
    let t = CedarType::of(&tools[0].1);
    assert_cedar_accepts(&t);
    // `recipient: Optional[str] = None` is `anyOf: [{type: string}, {type: null}]`.
    assert_eq!(typed(&t, "recipient"), (CedarType::String, true));
    assert_eq!(typed(&t, "count"), (CedarType::Long, true));
    assert_eq!(typed(&t, "flag"), (CedarType::Bool, true));
    assert_eq!(
        typed(&t, "when"),
        (CedarType::String, true),
        "a date stays a string"
    );
    assert_eq!(
        typed(&t, "items"),
        (CedarType::Set(Box::new(CedarType::Long)), true)
    );
    // An enum class through `$ref: #/$defs/Color`, a Literal, a one-value Literal (`const`).
    assert_eq!(typed(&t, "color").0, CedarType::String);
    assert_eq!(typed(&t, "mode").0, CedarType::String);
    assert_eq!(typed(&t, "only").0, CedarType::String);
    assert_eq!(typed(&t, "lit_int").0, CedarType::Long);
    assert_eq!(typed(&t, "amount").0, CedarType::Decimal);
    assert_eq!(typed(&t, "ratio").0, CedarType::Decimal);
    // A nested model, optional, through `anyOf: [{$ref}, {type: null}]`: its own required
    // field is required inside it, but reaching it goes through an optional record.
    assert_eq!(typed(&t, "addr.street"), (CedarType::String, true));
    let (addr, optional) = typed(&t, "addr");
    assert!(optional);
    assert_eq!(
        addr.lookup(&["street"]),
        InputLookup::Typed {
            ty: &CedarType::String,
            optional: false
        }
    );
    assert_eq!(typed(&t, "addr.city"), (CedarType::String, true));
    let CedarType::Set(element) = typed(&t, "addrs").0 else {
        panic!("a list of models is a set of records")
    };
    assert_eq!(element.attributes().len(), 2);
    // A recursive model is typed down to the recursion.
    assert_eq!(typed(&t, "tree.label"), (CedarType::String, true));
    assert_eq!(
        untyped(&t, "tree.children"),
        Untypable::Items(Box::new(Untypable::Recursive("#/$defs/Tree".into())))
    );
    // What has no Cedar type is left out, with its reason.
    assert_eq!(untyped(&t, "tags"), Untypable::Map);
    assert_eq!(
        untyped(&t, "either"),
        Untypable::Union(vec!["string".into(), "integer".into()])
    );
    assert_eq!(untyped(&t, "nums"), Untypable::Tuple);
    let left_out: Vec<String> = t.untyped().into_iter().map(|(p, _)| p).collect();
    assert_eq!(left_out, ["tags", "either", "tree.children", "nums"]);
    // Left out of the Cedar schema, not given an empty type.
    let attrs = t.to_cedar_schema()["attributes"].clone();
    assert!(attrs.get("either").is_none() && attrs.get("recipient").is_some());
    assert_eq!(attrs["recipient"]["required"], json!(false));
}

#[test]
fn every_input_of_the_third_party_servers_is_typed() {
    for server in ["everything", "filesystem", "memory", "time"] {
        for (name, schema) in fixture_tools(server) {
            let t = CedarType::of(&schema);
            assert_cedar_accepts(&t);
            assert_eq!(t.untyped(), vec![], "{server} {name}");
            let declared = schema["properties"].as_object().unwrap().len();
            assert_eq!(t.attributes().len(), declared, "{server} {name}");
        }
    }
    // zod's `z.number().optional()` (a line count) and a list of objects.
    let fs = fixture_tools("filesystem");
    let read = CedarType::of(&fs.iter().find(|(n, _)| n == "read_file").unwrap().1);
    assert_eq!(typed(&read, "head"), (CedarType::Decimal, true));
    assert_eq!(typed(&read, "path"), (CedarType::String, false));
    let edit = CedarType::of(&fs.iter().find(|(n, _)| n == "edit_file").unwrap().1);
    let CedarType::Set(edits) = typed(&edit, "edits").0 else {
        panic!()
    };
    assert_eq!(
        edits.lookup(&["oldText"]),
        InputLookup::Typed {
            ty: &CedarType::String,
            optional: false
        }
    );
}

fn object(props: Value, required: &[&str]) -> Value {
    json!({"type": "object", "properties": props, "required": required})
}

#[test]
fn a_list_of_types_with_null_is_an_optional_attribute_even_when_required() {
    let t = CedarType::of(&object(
        json!({"to": {"type": ["string", "null"]}, "n": {"type": ["null", "integer"]},
               "x": {"type": ["integer", "number"]}, "y": {"type": ["string", "integer"]}}),
        &["to", "n", "x"],
    ));
    assert_eq!(typed(&t, "to"), (CedarType::String, true));
    assert_eq!(typed(&t, "n"), (CedarType::Long, true));
    assert_eq!(
        typed(&t, "x"),
        (CedarType::Decimal, false),
        "integers are numbers"
    );
    assert_eq!(
        untyped(&t, "y"),
        Untypable::Union(vec!["string".into(), "integer".into()])
    );
}

#[test]
fn enums_and_consts_take_the_type_of_their_values() {
    let t = CedarType::of(&object(
        json!({"s": {"enum": ["a", "b"]}, "n": {"enum": [1, 2]}, "d": {"enum": [1, 2.5]},
               "b": {"const": true}, "opt": {"enum": ["a", null]},
               "mixed": {"enum": ["a", 1]}, "list": {"enum": [[1], [2]]},
               "typed": {"type": "string", "enum": ["EUR"]}}),
        &["s", "n", "d", "b", "opt", "mixed", "typed"],
    ));
    assert_eq!(typed(&t, "s"), (CedarType::String, false));
    assert_eq!(typed(&t, "n"), (CedarType::Long, false));
    assert_eq!(typed(&t, "d"), (CedarType::Decimal, false));
    assert_eq!(typed(&t, "b"), (CedarType::Bool, false));
    assert_eq!(typed(&t, "opt"), (CedarType::String, true));
    assert_eq!(typed(&t, "typed"), (CedarType::String, false));
    assert!(matches!(untyped(&t, "mixed"), Untypable::Union(_)));
    assert!(matches!(untyped(&t, "list"), Untypable::Unsupported(_)));
}

#[test]
fn refs_resolve_through_defs_definitions_and_escaped_pointers() {
    let t = CedarType::of(&json!({
        "type": "object", "required": ["a", "b", "c"],
        "properties": {
            "a": {"$ref": "#/$defs/Amount"},
            "b": {"$ref": "#/definitions/Party"},
            "c": {"$ref": "#/%24defs/Amount", "description": "the same, percent-encoded"},
            "d": {"$ref": "#/$defs/Nowhere"},
            "e": {"$ref": "https://example.com/schema.json"}
        },
        "$defs": {"Amount": {"type": "number", "minimum": 0}},
        "definitions": {"Party": {"type": "object", "required": ["name"],
                                  "properties": {"name": {"type": "string"}}}}
    }));
    assert_eq!(typed(&t, "a"), (CedarType::Decimal, false));
    assert_eq!(typed(&t, "b.name"), (CedarType::String, false));
    assert_eq!(typed(&t, "c"), (CedarType::Decimal, false));
    assert_eq!(
        untyped(&t, "d"),
        Untypable::Unresolved("#/$defs/Nowhere".into())
    );
    assert!(matches!(untyped(&t, "e"), Untypable::Unresolved(_)));
}

#[test]
fn mutual_recursion_is_cut_where_it_closes() {
    let t = CedarType::of(&json!({
        "type": "object",
        "properties": {"a": {"$ref": "#/$defs/A"}, "root": {"$ref": "#"}},
        "$defs": {
            "A": {"type": "object", "properties": {"name": {"type": "string"}, "b": {"$ref": "#/$defs/B"}}},
            "B": {"type": "object", "properties": {"a": {"$ref": "#/$defs/A"}}}
        }
    }));
    assert_eq!(typed(&t, "a.name").0, CedarType::String);
    assert_eq!(
        untyped(&t, "a.b.a"),
        Untypable::Recursive("#/$defs/A".into())
    );
    assert_eq!(untyped(&t, "root"), Untypable::Recursive("#".into()));
    assert_cedar_accepts(&t);
}

#[test]
fn alternatives_of_one_type_are_that_type_and_object_shapes_merge() {
    let t = CedarType::of(&object(
        json!({
            "contact": {"anyOf": [{"type": "string", "format": "email"},
                                  {"type": "string", "pattern": "^\\+[0-9]+$"}]},
            "pet": {"oneOf": [
                {"type": "object", "required": ["kind", "meows"],
                 "properties": {"kind": {"const": "cat"}, "meows": {"type": "boolean"}}},
                {"type": "object", "required": ["kind", "barks"],
                 "properties": {"kind": {"const": "dog"}, "barks": {"type": "boolean"}}}]},
            "clash": {"anyOf": [
                {"type": "object", "properties": {"v": {"type": "string"}}},
                {"type": "object", "properties": {"v": {"type": "integer"}}}]},
            "both": {"allOf": [
                {"type": "object", "required": ["x"], "properties": {"x": {"type": "string"}}},
                {"properties": {"y": {"type": "integer"}}}]},
            "narrowed": {"type": "string", "anyOf": [{"format": "email"}, {"format": "uri"}]}
        }),
        &["contact", "pet", "both", "narrowed"],
    ));
    assert_eq!(typed(&t, "contact"), (CedarType::String, false));
    assert_eq!(typed(&t, "pet.kind"), (CedarType::String, false));
    assert_eq!(typed(&t, "pet.meows"), (CedarType::Bool, true));
    assert_eq!(typed(&t, "pet.barks"), (CedarType::Bool, true));
    assert!(matches!(untyped(&t, "clash"), Untypable::Union(_)));
    assert_eq!(typed(&t, "both.x"), (CedarType::String, false));
    assert_eq!(typed(&t, "both.y"), (CedarType::Long, true));
    assert_eq!(typed(&t, "narrowed"), (CedarType::String, false));
    assert_cedar_accepts(&t);
}

#[test]
fn shapes_without_a_cedar_type_say_why() {
    let t = CedarType::of(&object(
        json!({"any": {"description": "anything"}, "null": {"type": "null"},
               "never": false, "open": {"type": "object"},
               "closed": {"type": "object", "additionalProperties": false},
               "bag": {"type": "array"}, "maybes": {"type": "array", "items": {"type": ["string", "null"]}},
               "unions": {"type": "array", "items": {"anyOf": [{"type": "string"}, {"type": "number"}]}},
               "dyn": {"$dynamicRef": "#meta"}}),
        &[],
    ));
    assert_eq!(untyped(&t, "any"), Untypable::AnyValue);
    assert_eq!(untyped(&t, "null"), Untypable::OnlyNull);
    assert_eq!(untyped(&t, "never"), Untypable::NoValue);
    assert_eq!(untyped(&t, "open"), Untypable::Map);
    assert_eq!(typed(&t, "closed").0, CedarType::Record(vec![]));
    assert_eq!(
        untyped(&t, "bag"),
        Untypable::Items(Box::new(Untypable::AnyValue))
    );
    assert_eq!(untyped(&t, "maybes"), Untypable::NullableItems);
    assert!(matches!(untyped(&t, "unions"), Untypable::Items(_)));
    assert!(matches!(untyped(&t, "dyn"), Untypable::Unsupported(_)));
    // Each reason reads as a sentence and comes with a fix.
    for (path, why) in t.untyped() {
        assert!(
            !why.to_string().is_empty() && why.fix().contains("input"),
            "{path}"
        );
    }
    assert!(
        untyped(&t, "maybes").to_string().contains("null"),
        "{}",
        untyped(&t, "maybes")
    );
}

#[test]
fn deep_or_exponential_schemas_are_bounded_not_followed() {
    // 200 levels of nesting: typing stops at its depth bound, without overflowing the stack.
    let mut deep = json!({"type": "string"});
    for _ in 0..200 {
        deep = json!({"type": "object", "properties": {"x": deep}});
    }
    let t = CedarType::of(&object(json!({"deep": deep}), &[]));
    assert!(
        t.untyped()
            .iter()
            .any(|(_, why)| **why == Untypable::TooLarge)
    );
    // Each definition uses the one below it twice: 2^40 paths, cut by the subschema budget.
    let mut defs = serde_json::Map::new();
    defs.insert("D0".into(), json!({"type": "string"}));
    for i in 1..=40 {
        defs.insert(
            format!("D{i}"),
            json!({"type": "object", "properties": {
                "l": {"$ref": format!("#/$defs/D{}", i - 1)},
                "r": {"$ref": format!("#/$defs/D{}", i - 1)}}}),
        );
    }
    let started = std::time::Instant::now();
    let t = CedarType::of(&json!({"type": "object",
        "properties": {"top": {"$ref": "#/$defs/D40"}}, "$defs": defs}));
    assert!(started.elapsed() < std::time::Duration::from_secs(2));
    assert!(
        t.untyped()
            .iter()
            .any(|(_, why)| **why == Untypable::TooLarge)
    );
}

#[test]
fn null_and_absent_optional_inputs_are_absent_attributes() {
    let t = CedarType::of(
        &json!({"type": "object", "required": ["to"], "properties": {
            "to": {"anyOf": [{"type": "string"}, {"type": "null"}]},
            "n": {"type": "integer"},
            "either": {"anyOf": [{"type": "string"}, {"type": "integer"}]}
        }}),
    );
    // Converts, and Cedar accepts it, whether `to` is a string, null or missing; the untyped
    // input is never passed.
    for inputs in [
        json!({"to": "a@b.c", "either": 3}),
        json!({"to": null, "n": 3.0}),
        json!({}),
    ] {
        let e = t.to_cedar(&inputs).unwrap();
        let ctx = cedar_policy::Context::from_pairs([("inputs".to_string(), e)]).unwrap();
        let text = format!("{ctx:?}");
        assert!(!text.contains("either"), "{text}");
    }
}

#[test]
fn unrepresentable_numbers_are_refused_naming_the_input() {
    let t = CedarType::of(&json!({"type": "object", "properties": {
        "n": {"type": "integer"},
        "lines": {"type": "array", "items": {"type": "object",
                  "properties": {"amount": {"type": "number"}}}}
    }}));
    let e = t
        .to_cedar(&json!({"n": 18446744073709551615u64}))
        .unwrap_err();
    assert_eq!(
        e.to_string(),
        "input /n: 18446744073709551615 is not an integer Cedar can hold"
    );
    let e = t
        .to_cedar(&json!({"lines": [{"amount": 1.5}, {"amount": 0.123456}]}))
        .unwrap_err();
    assert!(
        e.to_string()
            .starts_with("input /lines/1/amount: 0.123456 has more than four fraction digits"),
        "{e}"
    );
    // A whole number sent as 3.0 is an integer, as JSON Schema counts it.
    assert!(t.to_cedar(&json!({"n": 3.0})).is_ok());
}
