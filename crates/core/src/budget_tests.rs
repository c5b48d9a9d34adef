use std::path::Path;

use super::*;
use crate::decide::{BudgetView, CallRequest, CheckName, Outcome, Verdict};
use crate::registry::LoadError;
use crate::token::ApprovalKeys;

const HOUR: i64 = 3_600_000;
const T0: Timestamp = Timestamp::from_millis(1_780_000_000_000);

fn copy_dir(from: &Path, to: &Path) {
    for e in std::fs::read_dir(from).unwrap() {
        let e = e.unwrap();
        let dest = to.join(e.file_name());
        if e.file_type().unwrap().is_dir() {
            std::fs::create_dir_all(&dest).unwrap();
            copy_dir(&e.path(), &dest);
        } else {
            std::fs::copy(e.path(), dest).unwrap();
        }
    }
}

const VALUE_BUDGET: &str = "
    window_budgets:
      - {id: payment_value_24h, sum: amount, unit: EUR, limit: 20000, window: 24h, limits: {fin-lead: 30000}}
";

const DOMAIN_BUDGET: &str = "
    window_budgets:
      - {id: emails_per_domain_1h, limit: 2, window: 1h, key: to, key_kind: email_domain}
";

/// The acme fixture with window budgets added to payment.schedule and email.send, and an
/// optional policy file.
fn registry_with(
    payments: &str,
    emails: &str,
    policy: Option<&str>,
) -> Result<Registry, LoadError> {
    let tmp = tempfile::tempdir().unwrap();
    let fixture = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/acme");
    copy_dir(&fixture, tmp.path());
    let edit = |file: &str, anchor: &str, add: &str| {
        let p = tmp.path().join(file);
        let text = std::fs::read_to_string(&p).unwrap();
        assert!(text.contains(anchor), "{file} has {anchor}");
        std::fs::write(&p, text.replacen(anchor, &format!("{anchor}{add}"), 1)).unwrap();
    };
    edit(
        "tools/payments.yaml",
        "\n    handler: {upstream: erp, tool: schedule_payment}",
        payments.trim_end(),
    );
    edit(
        "tools/messaging.yaml",
        "\n    handler: {upstream: mailer, tool: send}",
        emails.trim_end(),
    );
    if let Some(p) = policy {
        std::fs::write(tmp.path().join("policies/budgets.cedar"), p).unwrap();
    }
    Registry::load(tmp.path())
}

fn findings(payments: &str) -> Vec<String> {
    match registry_with(payments, "", None) {
        Err(LoadError::Invalid(f)) => f
            .iter()
            .map(|f| format!("{} {} {}", f.rule, f.path, f.message))
            .collect(),
        Err(e) => panic!("unexpected: {e}"),
        Ok(_) => panic!("expected the registry to be refused"),
    }
}

fn payment(amount: f64) -> Value {
    json!({"invoice_id": "INV-20260611", "amount": amount, "currency": "EUR",
           "value_date": "2026-06-30", "reason": "Three-way match complete against PO-77812."})
}

fn held(hours_ago: i64, amount: i64) -> Held {
    Held {
        at: Timestamp::from_millis(T0.millis() - hours_ago * HOUR),
        amount: amount * SCALE,
    }
}

fn decide(
    reg: &Registry,
    who: &str,
    tool: &str,
    inputs: &Value,
    view: WindowView,
) -> crate::Decision {
    let keys = ApprovalKeys::new("k1", vec![7u8; 32]);
    let budgets = BudgetView {
        windows: view,
        ..BudgetView::default()
    };
    let mut req = CallRequest::new(who, tool, inputs);
    req.purpose = Some("billing");
    req.reason = Some("pay the matched invoice");
    req.budgets = &budgets;
    crate::Engine::new(reg, &keys).decide(&req, T0)
}

#[test]
fn windows_parse() {
    assert_eq!(parse_window("90s"), Some(90_000));
    assert_eq!(parse_window("15m"), Some(900_000));
    assert_eq!(parse_window("24h"), Some(24 * HOUR));
    assert_eq!(parse_window("7d"), Some(7 * 24 * HOUR));
    for bad in ["", "h", "0h", "1.5h", "1w", "-1h", "24 h"] {
        assert_eq!(parse_window(bad), None, "{bad}");
    }
}

#[test]
fn amounts_are_exact_units_and_read_back() {
    let n = |v: Value| v.as_number().unwrap().clone();
    assert_eq!(to_units(&n(json!(20000))).unwrap(), 200_000_000);
    assert_eq!(to_units(&n(json!(4180.5))).unwrap(), 41_805_000);
    assert_eq!(to_units(&n(json!(0.0001))).unwrap(), 1);
    assert!(matches!(
        to_units(&n(json!(0.00001))),
        Err(crate::CoreError::TooPrecise(_))
    ));
    assert_eq!(show_units(200_000_000), "20,000");
    assert_eq!(show_units(41_805_000), "4,180.5");
    assert_eq!(show_units(2_500), "0.25");
    assert_eq!(show_units(12_345_678_900_000), "1,234,567,890");
    assert_eq!(decimal_literal(41_805_000), "4180.5000");
    assert_eq!(utc(Timestamp::from_millis(0)), "1970-01-01 00:00:00 UTC");
    assert_eq!(
        utc(Timestamp::from_millis(1_780_000_000_000)),
        "2026-05-28 20:26:40 UTC"
    );
}

fn value_budget() -> WindowBudget {
    let reg = registry_with(VALUE_BUDGET, "", None).unwrap();
    reg.tool("payment.schedule").unwrap().windows[0].clone()
}

#[test]
fn a_sliding_window_frees_up_as_the_oldest_reservation_leaves_it() {
    let b = value_budget();
    assert_eq!(b.limit, 20_000 * SCALE);
    assert_eq!(b.limit_for("fin-lead"), 30_000 * SCALE);
    // 25 h ago is outside the window; 20 h, 10 h and 1 h ago are inside: 18,000 held.
    let window = [
        held(25, 9000),
        held(20, 5000),
        held(10, 8000),
        held(1, 5000),
    ];
    let a = b.assess("fin-worker", &window, 4000 * SCALE, T0);
    assert_eq!(a.used, 18_000 * SCALE);
    assert_eq!(a.left(), 2_000 * SCALE);
    assert!(!a.fits());
    // The oldest live reservation (20 h ago) leaves in 4 h; that frees 5,000, enough for 4,000.
    assert_eq!(
        a.oldest_leaves,
        Some(Timestamp::from_millis(T0.millis() + 4 * HOUR))
    );
    assert_eq!(a.fits_at, a.oldest_leaves);
    // 8,000 needs the 10-hours-ago reservation gone too: 14 h from now.
    let a = b.assess("fin-worker", &window, 8000 * SCALE, T0);
    assert_eq!(
        a.fits_at,
        Some(Timestamp::from_millis(T0.millis() + 14 * HOUR))
    );
    let msg = b.refusal(&a, "fin-worker", "fin-worker", "");
    assert!(
        msg.contains("18,000 EUR used, 2,000 EUR left, this call needs 8,000 EUR"),
        "{msg}"
    );
    assert!(
        msg.contains(&format!("it frees up at {}", utc(a.oldest_leaves.unwrap()))),
        "{msg}"
    );
    assert!(
        msg.contains(&format!("fits again from {}", utc(a.fits_at.unwrap()))),
        "{msg}"
    );
    // Exactly at the limit fits; one unit more does not.
    assert!(b.assess("fin-worker", &window, 2000 * SCALE, T0).fits());
    assert!(!b.assess("fin-worker", &window, 2000 * SCALE + 1, T0).fits());
    // A call larger than the whole budget never fits, and the refusal says so.
    let a = b.assess("fin-worker", &[], 25_000 * SCALE, T0);
    assert_eq!(a.fits_at, None);
    assert!(
        b.refusal(&a, "fin-worker", "fin-worker", "")
            .contains("never fits")
    );
}

#[test]
fn the_loader_refuses_bad_budgets_with_their_path() {
    let f = findings(
        "
    window_budgets:
      - {id: Pay-Value, sum: amount, limit: 20000, window: 24 hours}
      - {id: by_currency, sum: currency, limit: 5, window: 1h}
      - {id: by_note, limit: 2.5, window: 1h, key: memo}
      - {id: by_lead, limit: 3, window: 40d, limits: {nobody: 4}}
      - {id: by_invoice, limit: 3, window: 1h, key: invoice_id, key_kind: email_domain, colour: red}
",
    );
    let all = f.join("\n");
    assert!(
        all.contains("config.shape"),
        "unknown fields are refused: {all}"
    );
    let f = findings(
        "
    window_budgets:
      - {id: Pay-Value, sum: amount, limit: 20000, window: 24 hours}
      - {id: by_currency, sum: currency, limit: 5, window: 1h}
      - {id: by_note, limit: 2.5, window: 1h, key: memo}
      - {id: by_lead, limit: 3, window: 40d, limits: {nobody: 4}}
      - {id: by_value, sum: amount, limit: 0, window: 1h}
",
    );
    let all = f.join("\n");
    for want in [
        "budget.id tools[0].window_budgets[0].id",
        "budget.window tools[0].window_budgets[0].window",
        "budget.sum-field tools[0].window_budgets[1].sum",
        "budget.limit tools[0].window_budgets[2].limit",
        "budget.key-field tools[0].window_budgets[2].key",
        "budget.window tools[0].window_budgets[3].window",
        "ref.dangling tools[0].window_budgets[3].limits.nobody",
        "budget.limit tools[0].window_budgets[4].limit",
    ] {
        assert!(all.contains(want), "missing {want} in:\n{all}");
    }
    // The same id twice in the registry.
    let dup = registry_with(
        VALUE_BUDGET,
        "
    window_budgets:
      - {id: payment_value_24h, limit: 2, window: 1h}
",
        None,
    );
    match dup {
        Err(LoadError::Invalid(f)) => assert!(f.iter().any(|f| f.rule == "ref.duplicate")),
        _ => panic!("a duplicate id must be refused"),
    }
}

#[test]
fn a_summed_input_that_may_be_negative_is_refused() {
    // payment.priority's amount has exclusiveMinimum 0; strip it from the schedule tool.
    let tmp_budget = "
    window_budgets:
      - {id: v, sum: amount, limit: 10, window: 1h}
";
    let reg = registry_with(tmp_budget, "", None).unwrap();
    assert_eq!(reg.tool("payment.schedule").unwrap().windows.len(), 1);
    let schema = json!({"type": "object", "required": ["amount"],
                        "properties": {"amount": {"type": "number"}}});
    let cfg: WindowBudgetConfig =
        serde_json::from_value(json!({"id": "v", "sum": "amount", "limit": 10, "window": "1h"}))
            .unwrap();
    let mut f = Vec::new();
    let out = compile("t.yaml", 0, &[cfg], &schema, &HashSet::new(), &mut f);
    assert!(out.is_empty());
    assert_eq!(f[0].rule, "budget.sum-field");
    assert!(f[0].message.contains("negative"), "{}", f[0].message);
}

#[test]
fn the_engine_refuses_with_what_is_left_and_names_the_budget() {
    let reg = registry_with(VALUE_BUDGET, "", None).unwrap();
    let mut view = WindowView::default();
    view.set(
        "payment_value_24h",
        "fin-worker",
        vec![held(3, 9000), held(2, 8000)],
    );
    // 17,000 held: 3,000 fits, 3,000.01 does not.
    let ok = decide(
        &reg,
        "fin-worker",
        "payment.schedule",
        &payment(3000.0),
        view.clone(),
    );
    let check = ok.check(CheckName::Budget);
    assert_eq!(check.outcome, Outcome::Pass, "{check:?}");
    assert!(
        check
            .detail
            .contains("payment_value_24h[fin-worker]: 17,000 EUR/20,000 EUR"),
        "{check:?}"
    );
    let no = decide(
        &reg,
        "fin-worker",
        "payment.schedule",
        &payment(3000.01),
        view,
    );
    match &no.verdict {
        Verdict::Deny {
            check,
            rule,
            reason,
        } => {
            assert_eq!(*check, CheckName::Budget);
            assert_eq!(rule, "budget.window.payment_value_24h");
            assert!(reason.contains("3,000 EUR left"), "{reason}");
            assert!(reason.contains("frees up at"), "{reason}");
        }
        v => panic!("expected a budget refusal, got {v:?}"),
    }
}

#[test]
fn a_childs_use_counts_against_its_parent() {
    let reg = registry_with(VALUE_BUDGET, "", None).unwrap();
    // fin-worker has used nothing; its parent fin-lead's window (30,000) holds 28,000.
    let mut view = WindowView::default();
    view.set("payment_value_24h", "fin-lead", vec![held(5, 28_000)]);
    let d = decide(
        &reg,
        "fin-worker",
        "payment.schedule",
        &payment(2500.0),
        view,
    );
    match &d.verdict {
        Verdict::Deny { rule, reason, .. } => {
            assert_eq!(rule, "budget.window.payment_value_24h");
            assert!(
                reason.contains("'fin-lead' (which 'fin-worker' draws from)"),
                "{reason}"
            );
            assert!(reason.contains("2,000 EUR left"), "{reason}");
        }
        v => panic!("expected the parent's window to refuse, got {v:?}"),
    }
}

#[test]
fn a_per_key_count_keys_on_the_recipients_domain() {
    let reg = registry_with("", DOMAIN_BUDGET, None).unwrap();
    let b = &reg.tool("email.send").unwrap().windows[0];
    let mail = |to: &str| {
        json!({"account_id": "acct_000000000001", "invoice_id": "INV-20260611",
               "to": to, "body": "Your invoice."})
    };
    assert_eq!(
        b.key_of(&mail("Ap@Northwind.COM")).as_deref(),
        Some("northwind.com")
    );
    // The store reads the window of the call's key: two calls held for northwind.com.
    let call = |mins: i64| Held {
        at: Timestamp::from_millis(T0.millis() - mins * 60_000),
        amount: 1,
    };
    let mut two = WindowView::default();
    two.set(
        "emails_per_domain_1h",
        "fin-worker",
        vec![call(50), call(5)],
    );
    let d = decide(
        &reg,
        "fin-worker",
        "email.send",
        &mail("ap@northwind.com"),
        two,
    );
    let c = d.check(CheckName::Budget);
    assert_eq!(c.outcome, Outcome::Fail, "{c:?}");
    assert_eq!(
        c.rule.as_deref(),
        Some("budget.window.emails_per_domain_1h")
    );
    assert!(
        c.detail
            .contains("at most 2 calls per 1h for to 'northwind.com'"),
        "{c:?}"
    );
    assert!(c.detail.contains("0 calls left"), "{c:?}");
}

#[test]
fn policies_read_the_budgets_in_the_context() {
    let policy = r#"
@id("gate-the-last-quarter")
@gate
@reason("a payment that leaves less than 5,000 EUR in the 24-hour budget needs a person")
forbid (principal, action == Action::"payment.schedule", resource)
when { context.budgets.payment_value_24h.left.lessThan(decimal("5000.0")) };
"#;
    let reg = registry_with(VALUE_BUDGET, "", Some(policy)).unwrap();
    let schema = reg.policies.schema_json().to_string();
    assert!(
        schema.contains("payment_value_24h"),
        "the generated schema declares it"
    );
    let mut view = WindowView::default();
    view.set("payment_value_24h", "fin-worker", vec![held(1, 16_000)]);
    let d = decide(
        &reg,
        "fin-worker",
        "payment.schedule",
        &payment(100.0),
        view,
    );
    assert!(
        matches!(&d.verdict, Verdict::NeedsApproval { rule, .. } if rule == "gate-the-last-quarter"),
        "{:?}",
        d.verdict
    );
    let d = decide(
        &reg,
        "fin-worker",
        "payment.schedule",
        &payment(100.0),
        WindowView::default(),
    );
    assert_eq!(d.check(CheckName::Policy).outcome, Outcome::Pass);
    // A policy naming a budget the tool does not have fails validation at load.
    let bad = policy.replace("payment_value_24h", "no_such_budget");
    assert!(matches!(
        registry_with(VALUE_BUDGET, "", Some(&bad)),
        Err(LoadError::Invalid(f)) if f.iter().any(|f| f.rule == "policy.invalid")
    ));
}

#[test]
fn the_lint_flags_a_key_anyone_can_respell() {
    let t: crate::config::ToolConfig = serde_json::from_value(json!({
        "name": "pay", "version": "1", "owner": "@o", "description": "d",
        "effect": "irreversible", "tier": "spend", "sensitivity": "internal",
        "purposes": ["p"], "roles": ["r"], "handler": {"upstream": "u"},
        "input_schema": {"type": "object", "required": ["supplier", "iban"], "properties": {
            "supplier": {"type": "string", "maxLength": 40},
            "iban": {"type": "string", "pattern": "^[A-Z]{2}[0-9]{2}[A-Z0-9]{11,30}$"}}},
        "window_budgets": [
            {"id": "per_supplier", "limit": 3, "window": "1h", "key": "supplier"},
            {"id": "per_iban", "limit": 3, "window": "1h", "key": "iban"}]
    }))
    .unwrap();
    let mut out = Vec::new();
    lint_tool("tools/t.yaml", "tools[0]", &t, &mut out);
    assert_eq!(out.len(), 1, "{out:?}");
    assert_eq!(out[0].rule, "budget.key-unconstrained");
    assert_eq!(out[0].path, "tools[0].window_budgets[0].key");
}

#[test]
fn a_registry_without_window_budgets_keeps_its_version() {
    // The field is skipped when empty, so declaring none leaves the content hash unchanged.
    let plain =
        Registry::load(Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/acme")).unwrap();
    let same = registry_with("", "", None).unwrap();
    assert_eq!(plain.version.hash, same.version.hash);
    let with = registry_with(VALUE_BUDGET, "", None).unwrap();
    assert_ne!(plain.version.hash, with.version.hash);
}

#[test]
fn a_replay_is_not_refused_for_the_window_its_first_run_filled() {
    let reg = registry_with(VALUE_BUDGET, "", None).unwrap();
    let keys = ApprovalKeys::new("k1", vec![7u8; 32]);
    // The window holds 12,000; a fresh call of 9,000 does not fit.
    let mut budgets = BudgetView::default();
    budgets
        .windows
        .set("payment_value_24h", "fin-worker", vec![held(0, 12_000)]);
    let inputs = payment(9000.0);
    let mut req = CallRequest::new("fin-worker", "payment.schedule", &inputs);
    req.purpose = Some("billing");
    req.reason = Some("pay the matched invoice");
    req.budgets = &budgets;
    let fresh = crate::Engine::new(&reg, &keys).decide(&req, T0);
    assert_eq!(fresh.check(CheckName::Budget).outcome, Outcome::Fail);
    // A replay of a call whose key is done runs nothing, so the budget does not refuse it.
    req.idempotency = crate::IdempotencyState::Done;
    let replay = crate::Engine::new(&reg, &keys).decide(&req, T0);
    assert_eq!(replay.check(CheckName::Budget).outcome, Outcome::Pass);
    assert!(replay.is_allow(), "{:?}", replay.verdict);
}
