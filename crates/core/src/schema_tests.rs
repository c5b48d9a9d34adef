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
    let CedarType::Record(attrs) = s.cedar_type() else {
        panic!()
    };
    let get = |n: &str| attrs.iter().find(|(k, _, _)| k == n).cloned().unwrap();
    assert_eq!(get("amount").1, CedarType::Decimal);
    assert_eq!(get("count").1, CedarType::Long);
    assert!(get("amount").2, "required");
    assert!(!get("count").2, "optional");
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
