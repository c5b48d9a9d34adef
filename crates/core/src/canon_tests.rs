use super::*;
use serde_json::json;

#[test]
fn key_order_and_number_spelling_do_not_change_the_hash() {
    let a = json!({"amount": 4180.00, "currency": "EUR", "invoice_id": "INV-20260611"});
    let b: Value =
        serde_json::from_str(r#"{"invoice_id":"INV-20260611","currency":"EUR","amount":4180}"#)
            .unwrap();
    let c: Value =
        serde_json::from_str(r#"{"currency":"EUR","amount":4.18e3,"invoice_id":"INV-20260611"}"#)
            .unwrap();
    assert_eq!(InputHash::of(&a), InputHash::of(&b));
    assert_eq!(InputHash::of(&a), InputHash::of(&c));
}

#[test]
fn one_cent_changes_the_hash() {
    let a = json!({"amount": 4180.00});
    let b = json!({"amount": 4180.01});
    assert_ne!(InputHash::of(&a), InputHash::of(&b));
}

#[test]
fn canonical_form_follows_rfc_8785() {
    // Keys sorted by UTF-16 code units, no whitespace, shortest number form.
    let v = json!({"b": 1.0, "a": [true, null, "x"], "c": {"z": 1e21, "y": 0.1}});
    assert_eq!(
        canonical(&v),
        r#"{"a":[true,null,"x"],"b":1,"c":{"y":0.1,"z":1e+21}}"#
    );
}

#[test]
fn step_keys_are_derived_from_run_seq_and_inputs() {
    let inputs = json!({"invoice_id": "INV-20260611", "amount": 4180.0});
    let k1 = IdempotencyKey::for_step("run-1", 7, &inputs);
    assert_eq!(k1, IdempotencyKey::for_step("run-1", 7, &inputs));
    assert_ne!(k1, IdempotencyKey::for_step("run-1", 8, &inputs));
    assert_ne!(k1, IdempotencyKey::for_step("run-2", 7, &inputs));
    assert_ne!(
        k1,
        IdempotencyKey::for_step(
            "run-1",
            7,
            &json!({"invoice_id": "INV-20260611", "amount": 4180.01})
        )
    );
    assert!(k1.as_str().starts_with("sha256:") && k1.as_str().len() == 71);
}

#[test]
fn call_keys_ignore_reworded_free_text() {
    let identity = vec!["invoice_id".to_string(), "to".to_string()];
    let a =
        json!({"invoice_id": "INV-1", "to": "ap@northwind.com", "body": "Dear team, please find…"});
    let b = json!({"invoice_id": "INV-1", "to": "ap@northwind.com", "body": "Hello! Attached is…"});
    let c = json!({"invoice_id": "INV-1", "to": "cfo@northwind.com", "body": "Dear team, please find…"});
    let key = |v| IdempotencyKey::for_call("run-9", "email.send", &identity, v);
    assert_eq!(key(&a), key(&b));
    assert_ne!(key(&a), key(&c));
    assert_ne!(
        key(&a),
        IdempotencyKey::for_call("run-9", "email.other", &identity, &a)
    );
}

#[test]
fn redaction_is_a_keyed_hash_that_still_compares() {
    let r = Redactor::new(b"test-key".to_vec());
    let a = json!({"supplier": "Northwind", "iban": "DE89370400440532013000"});
    let b = json!({"supplier": "Other", "iban": "DE89370400440532013000"});
    let (ra, done) = r.redact(&a, &["iban".to_string(), "missing".to_string()]);
    let (rb, _) = r.redact(&b, &["iban".to_string()]);
    assert_eq!(done, vec!["iban".to_string()]);
    assert_eq!(ra["supplier"], "Northwind", "unmarked fields stay readable");
    assert!(ra["iban"].as_str().unwrap().starts_with("hmac:"));
    assert!(!ra.to_string().contains("DE8937"));
    assert_eq!(ra["iban"], rb["iban"], "equal IBANs hash equal");
    let other_key = Redactor::new(b"another".to_vec());
    assert_ne!(other_key.redact(&a, &["iban".into()]).0["iban"], ra["iban"]);
}

#[test]
fn each_redaction_hash_names_its_key() {
    let v = json!("DE89370400440532013000");
    let a = Redactor::new(b"first-key-first-key-first-key-32".to_vec());
    let a_again = Redactor::new(b"first-key-first-key-first-key-32".to_vec());
    let b = Redactor::new(b"second-key-second-key-second-key".to_vec());
    // The id is a fingerprint: the same key gives the same id in any process, another key
    // another id, and neither is the key.
    assert_eq!(a.key_id(), a_again.key_id());
    assert_ne!(a.key_id(), b.key_id());
    assert_eq!(a.key_id().len(), 8);
    assert!(!a.key_id().contains("first"));
    let ha = a.hash(&v);
    assert!(ha.starts_with(&format!("hmac:{}:", a.key_id())), "{ha}");
    assert_eq!(ha.len(), "hmac:".len() + 8 + 1 + 32);
    assert_eq!(ha, a_again.hash(&v));
    assert!(b.hash(&v).starts_with(&format!("hmac:{}:", b.key_id())));
    // The development key says so in every hash it makes.
    assert_eq!(Redactor::dev().key_id(), "dev");
    assert!(Redactor::dev().hash(&v).starts_with("hmac:dev:"));
    assert_ne!(Redactor::dev().hash(&v), ha);
}

#[test]
fn redaction_reaches_nested_fields_and_lists() {
    let r = Redactor::new(b"k".to_vec());
    let v = json!({"results": [{"iban": "A"}, {"iban": "B"}], "supplier": {"iban": "C"}});
    let (out, _) = r.redact(&v, &["results.iban".into(), "supplier.iban".into()]);
    assert!(
        out["results"][0]["iban"]
            .as_str()
            .unwrap()
            .starts_with("hmac:")
    );
    assert!(
        out["results"][1]["iban"]
            .as_str()
            .unwrap()
            .starts_with("hmac:")
    );
    assert!(
        out["supplier"]["iban"]
            .as_str()
            .unwrap()
            .starts_with("hmac:")
    );
}

mod props {
    use super::*;
    use proptest::prelude::*;

    fn arb_json() -> impl Strategy<Value = Value> {
        let leaf = prop_oneof![
            Just(Value::Null),
            any::<bool>().prop_map(Value::Bool),
            (-1_000_000i64..1_000_000).prop_map(|n| json!(n)),
            (-1.0e6f64..1.0e6).prop_map(|f| json!(f)),
            "[a-z0-9 ]{0,8}".prop_map(Value::String),
        ];
        leaf.prop_recursive(3, 24, 4, |inner| {
            prop_oneof![
                prop::collection::vec(inner.clone(), 0..4).prop_map(Value::Array),
                prop::collection::btree_map("[a-z]{1,4}", inner, 0..4)
                    .prop_map(|m| Value::Object(m.into_iter().collect())),
            ]
        })
    }

    /// Rebuilds objects with their keys in reverse order.
    fn reorder(v: &Value) -> Value {
        match v {
            Value::Object(m) => {
                let mut pairs: Vec<_> = m.iter().collect();
                pairs.reverse();
                Value::Object(
                    pairs
                        .into_iter()
                        .map(|(k, v)| (k.clone(), reorder(v)))
                        .collect(),
                )
            }
            Value::Array(a) => Value::Array(a.iter().map(reorder).collect()),
            other => other.clone(),
        }
    }

    proptest! {
        #[test]
        fn key_order_never_changes_the_hash(v in arb_json()) {
            prop_assert_eq!(InputHash::of(&v), InputHash::of(&reorder(&v)));
        }

        #[test]
        fn reparsing_the_canonical_form_is_stable(v in arb_json()) {
            let c = canonical(&v);
            let back: Value = serde_json::from_str(&c).unwrap();
            prop_assert_eq!(canonical(&back), c);
        }

        #[test]
        fn any_value_change_changes_the_hash(v in arb_json(), extra in "[a-z]{1,6}") {
            let mut changed = json!({"v": v.clone()});
            changed["v2"] = Value::String(extra);
            prop_assert_ne!(InputHash::of(&json!({"v": v})), InputHash::of(&changed));
        }

        #[test]
        fn integer_spelling_as_float_hashes_the_same(n in -1_000_000i64..1_000_000) {
            let as_int: Value = serde_json::from_str(&format!("{{\"a\":{n}}}")).unwrap();
            let as_float: Value = serde_json::from_str(&format!("{{\"a\":{n}.0}}")).unwrap();
            prop_assert_eq!(InputHash::of(&as_int), InputHash::of(&as_float));
        }

        #[test]
        fn changing_a_number_changes_the_hash(n in -1_000_000i64..1_000_000, d in 1i64..1000) {
            prop_assert_ne!(InputHash::of(&json!({"a": n})), InputHash::of(&json!({"a": n + d})));
        }
    }
}

fn arb_any_json() -> impl proptest::strategy::Strategy<Value = Value> {
    use proptest::prelude::*;
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        any::<i64>().prop_map(|i| json!(i)),
        any::<u64>().prop_map(|u| json!(u)),
        any::<f64>()
            .prop_filter("finite", |f| f.is_finite())
            .prop_map(|f| json!(f)),
        (-1_000_000i64..1_000_000, 0u32..6)
            .prop_map(|(m, e)| json!(m as f64 / 10f64.powi(e as i32))),
        any::<String>().prop_map(Value::String),
        "[\\x00-\\x1f\"\\\\a-z\u{e000}\u{10000}]{0,8}".prop_map(Value::String),
    ];
    leaf.prop_recursive(4, 64, 8, |inner| {
        prop_oneof![
            proptest::collection::vec(inner.clone(), 0..6).prop_map(Value::Array),
            proptest::collection::vec(
                (
                    "[a-zA-Z\u{e000}\u{10000}\u{7f}-\u{ff}]{0,4}|\\PC{0,3}",
                    inner
                ),
                0..6
            )
            .prop_map(|kv| Value::Object(kv.into_iter().collect())),
        ]
    })
}

proptest::proptest! {
    /// The hand-written canonical form is byte for byte what `serde_json_canonicalizer` (a
    /// full RFC 8785 implementation) writes: every stored chain hash depends on it.
    #[test]
    fn canonical_matches_the_reference_implementation(v in arb_any_json()) {
        let reference = serde_json_canonicalizer::to_string(&v).unwrap();
        proptest::prop_assert_eq!(canonical(&v), reference);
    }
}

proptest::proptest! {
    /// A value written straight to its canonical form is byte for byte its canonical form
    /// through `serde_json::Value`.
    #[test]
    fn canonical_of_a_value_is_its_canonical_form(v in arb_any_json()) {
        proptest::prop_assert_eq!(crate::canon::canonical_of(&v).unwrap(), canonical(&v));
    }
}

/// Typed values too: structs whose fields are not in key order, every shape of enum variant,
/// options, bytes, chars, floats, maps with number and bool keys, and a flattened map that
/// repeats a field's key.
#[test]
fn canonical_of_a_typed_value_is_its_canonical_form_through_a_value() {
    use serde::Serialize;
    use std::collections::BTreeMap;

    #[derive(Serialize)]
    enum Shape {
        Unit,
        Newtype(i64),
        Tuple(u8, String),
        Struct { zeta: bool, alpha: Option<f64> },
    }

    #[derive(Serialize)]
    struct Extra {
        zz: u32,
        seq: &'static str,
    }

    #[derive(Serialize)]
    struct Record<'a> {
        seq: i64,
        prev: &'a str,
        body: Vec<Shape>,
        big: u64,
        negative_big: i64,
        half: f32,
        nan: f64,
        letter: char,
        #[serde(with = "serde_bytes_as_seq")]
        bytes: Vec<u8>,
        none: Option<String>,
        ids: BTreeMap<u32, &'a str>,
        flags: BTreeMap<bool, u8>,
        text: String,
        #[serde(flatten)]
        extra: Extra,
        value: Value,
    }

    mod serde_bytes_as_seq {
        pub fn serialize<S: serde::Serializer>(v: &[u8], s: S) -> Result<S::Ok, S::Error> {
            s.serialize_bytes(v)
        }
    }

    let record = Record {
        seq: 7,
        prev: "sha256:00",
        body: vec![
            Shape::Unit,
            Shape::Newtype(-3),
            Shape::Tuple(1, "é\u{10000}\u{1f}".into()),
            Shape::Struct {
                zeta: true,
                alpha: Some(0.1),
            },
            Shape::Struct {
                zeta: false,
                alpha: None,
            },
        ],
        big: u64::MAX,
        negative_big: i64::MIN,
        half: 0.5,
        nan: f64::NAN,
        letter: '\u{202e}',
        bytes: vec![0, 255],
        none: None,
        ids: BTreeMap::from([(2, "b"), (10, "a")]),
        flags: BTreeMap::from([(true, 1), (false, 0)]),
        text: "line\nbreak \"quoted\" \u{7f}".into(),
        extra: Extra {
            zz: 9,
            seq: "flattened over the field of the same name",
        },
        value: json!({"z": 1, "a": {"y": [true, null], "b": 1e300}}),
    };
    let through_value = canonical(&serde_json::to_value(&record).unwrap());
    assert_eq!(crate::canon::canonical_of(&record).unwrap(), through_value);
    assert!(through_value.contains(r#""seq":"flattened over the field of the same name""#));

    // serde_json's raw JSON text (as `RawValue` serialises itself) is canonicalised in place.
    struct Raw(&'static str);
    impl Serialize for Raw {
        fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
            use serde::ser::SerializeStruct as _;
            const TOKEN: &str = "$serde_json::private::RawValue";
            let mut st = s.serialize_struct(TOKEN, 1)?;
            st.serialize_field(TOKEN, self.0)?;
            st.end()
        }
    }
    let mut expected = serde_json::Map::new();
    expected.insert("outer".into(), json!({"a": "x", "b": [1, 2.5]}));
    assert_eq!(
        crate::canon::canonical_of(&BTreeMap::from([(
            "outer",
            Raw(r#"{"b": [1, 2.50], "a": "x"}"#)
        )]))
        .unwrap(),
        canonical(&Value::Object(expected))
    );

    // A key that is not a string, a number or a bool has no canonical form, as in serde_json.
    let bad = BTreeMap::from([(vec![1u8], 1)]);
    assert!(serde_json::to_value(&bad).is_err());
    assert!(crate::canon::canonical_of(&bad).is_err());
}
