use super::*;
use serde_json::json;

fn claims(input_hash: InputHash) -> ApprovalClaims {
    ApprovalClaims {
        subject: "step-7".into(),
        tool: "payment.schedule".into(),
        tool_version: "3.1.0".into(),
        input_hash,
        registry_version: Some("sha256:abc".into()),
        gate_rule: Some("gate.always".into()),
        definition_hash: None,
        approver: "alice".into(),
        expires_at: Timestamp::from_millis(1_000_000),
        nonce: "n-1".into(),
    }
}

fn inputs(amount: f64) -> serde_json::Value {
    json!({"invoice_id": "INV-20260611", "amount": amount, "currency": "EUR"})
}

fn keys() -> ApprovalKeys {
    ApprovalKeys::new("k1", b"0123456789abcdef0123456789abcdef".to_vec())
}

fn expected(hash: &InputHash) -> Expected<'_> {
    Expected {
        subject: "step-7",
        tool: "payment.schedule",
        tool_version: "3.1.0",
        input_hash: hash,
        registry_version: None,
        definition_hash: None,
    }
}

const NOW: Timestamp = Timestamp::from_millis(500_000);

#[test]
fn a_token_verifies_for_exactly_the_approved_call() {
    let k = keys();
    let h = InputHash::of(&inputs(4180.0));
    let t = k.issue(&claims(h.clone()));
    let c = k.verify(&t, &expected(&h), NOW, &|_| false).unwrap();
    assert_eq!(c.approver, "alice");
}

#[test]
fn one_cent_more_is_refused() {
    let k = keys();
    let t = k.issue(&claims(InputHash::of(&inputs(4180.0))));
    let changed = InputHash::of(&inputs(4180.01));
    let err = k
        .verify(&t, &expected(&changed), NOW, &|_| false)
        .unwrap_err();
    assert!(
        matches!(err, TokenError::Mismatch { what: "inputs", .. }),
        "{err}"
    );
}

#[test]
fn another_tool_version_is_refused() {
    let k = keys();
    let h = InputHash::of(&inputs(4180.0));
    let t = k.issue(&claims(h.clone()));
    let mut e = expected(&h);
    e.tool_version = "3.2.0";
    assert!(matches!(
        k.verify(&t, &e, NOW, &|_| false),
        Err(TokenError::Mismatch {
            what: "tool version",
            ..
        })
    ));
}

#[test]
fn another_subject_or_tool_is_refused() {
    let k = keys();
    let h = InputHash::of(&inputs(4180.0));
    let t = k.issue(&claims(h.clone()));
    let mut e = expected(&h);
    e.subject = "step-8";
    assert!(matches!(
        k.verify(&t, &e, NOW, &|_| false),
        Err(TokenError::Mismatch { what: "call", .. })
    ));
    let mut e = expected(&h);
    e.tool = "payment.priority";
    assert!(matches!(
        k.verify(&t, &e, NOW, &|_| false),
        Err(TokenError::Mismatch { what: "tool", .. })
    ));
}

#[test]
fn a_changed_upstream_definition_is_refused() {
    let k = keys();
    let h = InputHash::of(&inputs(4180.0));
    let mut c = claims(h.clone());
    c.definition_hash = Some("sha256:old".into());
    let t = k.issue(&c);
    let mut e = expected(&h);
    e.definition_hash = Some("sha256:new");
    assert!(matches!(
        k.verify(&t, &e, NOW, &|_| false),
        Err(TokenError::Mismatch {
            what: "upstream definition",
            ..
        })
    ));
}

#[test]
fn an_altered_approver_or_expiry_breaks_the_signature() {
    let k = keys();
    let h = InputHash::of(&inputs(4180.0));
    let t = k.issue(&claims(h.clone()));
    // Re-sign nothing: swap the payload for one naming another approver / a later expiry.
    for tamper in [
        |c: &mut ApprovalClaims| c.approver = "mallory".into(),
        |c: &mut ApprovalClaims| c.expires_at = Timestamp::from_millis(9_000_000),
    ] {
        let mut c = claims(h.clone());
        tamper(&mut c);
        let forged_payload = k.issue(&c).as_str().split('.').nth(2).unwrap().to_string();
        let parts: Vec<&str> = t.as_str().split('.').collect();
        let forged = ApprovalToken::from_wire(format!(
            "{}.{}.{}.{}",
            parts[0], parts[1], forged_payload, parts[3]
        ));
        assert_eq!(
            k.verify(&forged, &expected(&h), NOW, &|_| false),
            Err(TokenError::BadSignature)
        );
    }
}

#[test]
fn an_expired_token_fails_closed() {
    let k = keys();
    let h = InputHash::of(&inputs(4180.0));
    let t = k.issue(&claims(h.clone()));
    let at_expiry = Timestamp::from_millis(1_000_000);
    assert_eq!(
        k.verify(&t, &expected(&h), at_expiry, &|_| false),
        Err(TokenError::Expired(1_000_000))
    );
}

#[test]
fn a_reused_nonce_is_refused() {
    let k = keys();
    let h = InputHash::of(&inputs(4180.0));
    let t = k.issue(&claims(h.clone()));
    assert_eq!(
        k.verify(&t, &expected(&h), NOW, &|n| n == "n-1"),
        Err(TokenError::Reused("n-1".into()))
    );
}

#[test]
fn keys_rotate_by_id() {
    let old = ApprovalKeys::new("k0", b"old-key-old-key-old-key-old-key!".to_vec());
    let h = InputHash::of(&inputs(1.0));
    let t = old.issue(&claims(h.clone()));
    let rotated = ApprovalKeys::new("k1", b"new-key-new-key-new-key-new-key!".to_vec())
        .with_retired("k0", b"old-key-old-key-old-key-old-key!".to_vec());
    assert!(rotated.verify(&t, &expected(&h), NOW, &|_| false).is_ok());
    assert!(
        rotated
            .issue(&claims(h.clone()))
            .as_str()
            .starts_with("tg1.k1.")
    );
    let dropped = ApprovalKeys::new("k1", b"new-key-new-key-new-key-new-key!".to_vec());
    assert_eq!(
        dropped.verify(&t, &expected(&h), NOW, &|_| false),
        Err(TokenError::UnknownKey("k0".into()))
    );
}

#[test]
fn garbage_is_malformed_not_a_panic() {
    let k = keys();
    let h = InputHash::of(&inputs(1.0));
    for s in ["", "tg1", "tg1.k1.x.y.z", "tg1.k1.!!!.???", "tg2.k1.a.b"] {
        assert!(
            k.verify(&ApprovalToken::from_wire(s), &expected(&h), NOW, &|_| false)
                .is_err()
        );
    }
}
