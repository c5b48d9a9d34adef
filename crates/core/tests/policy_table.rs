//! Policy tables: (principal, tool, purpose, inputs, run state) → decision, failing check, rule.
//! No model, no I/O beyond loading the fixture registry; every check is seen failing and passing.

use serde_json::{Value, json};
use toolgate_core::{
    ApprovalClaims, ApprovalKeys, ApprovalToken, BudgetView, CallRequest, CheckName, Definition,
    DestinationFacts, Engine, IdempotencyState, InputHash, Outcome, PriorCall, PriorOutcome,
    Registry, RunHistory, Tier, Timestamp, Verdict,
};

const NOW: Timestamp = Timestamp::from_millis(1_790_000_000_000);

fn registry() -> Registry {
    Registry::load(concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/acme"))
        .expect("fixture loads")
}

fn keys() -> ApprovalKeys {
    ApprovalKeys::new("k1", b"policy-table-key-policy-table-key".to_vec())
}

fn payment(amount: f64) -> Value {
    json!({"invoice_id": "INV-20260611", "amount": amount, "currency": "EUR",
           "value_date": "2026-06-30", "reason": "Three-way match complete against PO-77812."})
}

fn note() -> Value {
    json!({"invoice_id": "INV-20260611", "kind": "query", "text": "Amount differs from PO line 2."})
}

fn email(to: &str) -> Value {
    json!({"account_id": "acct_7f3k2m9q1x0b", "invoice_id": "INV-20260611", "to": to, "body": "Your invoice is attached."})
}

fn approval(
    k: &ApprovalKeys,
    tool: &str,
    version: &str,
    inputs: &Value,
    approver: &str,
    nonce: &str,
) -> ApprovalToken {
    k.issue(&ApprovalClaims {
        subject: "call-1".into(),
        tool: tool.into(),
        tool_version: version.into(),
        input_hash: InputHash::of(inputs),
        registry_version: None,
        gate_rule: None,
        definition_hash: None,
        approver: approver.into(),
        expires_at: NOW.plus_hours(72),
        nonce: nonce.into(),
    })
}

fn history(entries: &[(&str, Tier, PriorOutcome)]) -> RunHistory {
    RunHistory::of_calls(
        entries
            .iter()
            .map(|(t, tier, o)| PriorCall {
                tool: t.to_string(),
                tier: *tier,
                outcome: *o,
            })
            .collect(),
    )
}

/// What a row expects.
#[derive(Debug, Clone, PartialEq)]
enum Want {
    Allow,
    Deny(CheckName, &'static str),
    Parked(&'static str),
}

struct Row {
    name: &'static str,
    principal: &'static str,
    tool: &'static str,
    purpose: Option<&'static str>,
    reason: Option<&'static str>,
    inputs: Value,
    run: RunHistory,
    budgets: BudgetView,
    idem: IdempotencyState,
    approvals: Vec<ApprovalToken>,
    facts: DestinationFacts,
    /// How the tool's upstream definition is served (the pin check's input).
    definition: Definition<'static>,
    want: Want,
    /// A keyword the denial's reason must contain, as fixtures match it.
    keyword: &'static str,
}

fn row(
    name: &'static str,
    principal: &'static str,
    tool: &'static str,
    inputs: Value,
    want: Want,
) -> Row {
    Row {
        name,
        principal,
        tool,
        purpose: Some("billing"),
        reason: Some("Pay the approved invoice on its due date."),
        inputs,
        run: RunHistory::default(),
        budgets: BudgetView::default(),
        idem: IdempotencyState::Fresh,
        approvals: vec![],
        facts: DestinationFacts::default(),
        definition: Definition::Local,
        want,
        keyword: "",
    }
}

impl Row {
    fn purpose(mut self, p: Option<&'static str>) -> Self {
        self.purpose = p;
        self
    }
    fn reason(mut self, r: Option<&'static str>) -> Self {
        self.reason = r;
        self
    }
    fn run(mut self, r: RunHistory) -> Self {
        self.run = r;
        self
    }
    fn budget(mut self, p: &str, t: Tier, used: u32) -> Self {
        self.budgets.set(p, t, used);
        self
    }
    fn idem(mut self, s: IdempotencyState) -> Self {
        self.idem = s;
        self
    }
    fn approve(mut self, t: ApprovalToken) -> Self {
        self.approvals.push(t);
        self
    }
    fn facts(mut self, field: &str, allowed: &[&str]) -> Self {
        self.facts.allowed.insert(
            field.into(),
            allowed.iter().map(|s| s.to_string()).collect(),
        );
        self
    }
    fn served(mut self, d: Definition<'static>) -> Self {
        self.definition = d;
        self
    }
    fn keyword(mut self, k: &'static str) -> Self {
        self.keyword = k;
        self
    }
}

fn rows(k: &ApprovalKeys) -> Vec<Row> {
    use CheckName::*;
    use IdempotencyState as I;
    use PriorOutcome::*;
    use Want::*;
    let big = payment(12_000.0);
    let prio = json!({"invoice_id": "INV-20260611", "amount": 900.0});
    vec![
        // 1. credential
        row(
            "unknown principal",
            "nobody",
            "invoice.search",
            json!({}),
            Deny(Credential, "credential"),
        ),
        // 2. listed
        row(
            "read tool listed for the role",
            "fin-worker",
            "invoice.search",
            json!({"invoice_id": "INV-20260611"}),
            Allow,
        ),
        row(
            "unknown tool",
            "fin-worker",
            "payroll.run",
            json!({}),
            Deny(Listed, "tool.unknown"),
        )
        .keyword("unknown tool"),
        row(
            "tool not listed for role is unknown",
            "planner",
            "payment.schedule",
            payment(10.0),
            Deny(Listed, "tool.unknown"),
        )
        .keyword("unknown tool 'payment.schedule'"),
        // 3. pin
        row(
            "upstream tool served at its pinned definition",
            "fin-worker",
            "invoice.search",
            json!({"invoice_id": "INV-20260611"}),
            Allow,
        )
        .served(Definition::Pinned("sha256:0f1e")),
        row(
            "upstream tool whose definition changed since it was pinned",
            "fin-worker",
            "invoice.search",
            json!({"invoice_id": "INV-20260611"}),
            Deny(Pin, "pin.blocked"),
        )
        .served(Definition::Blocked(
            "tool 'search_invoices' changed since it was pinned; see `toolgate lock diff`",
        ))
        .keyword("toolgate lock diff"),
        row(
            "reconciler-only tool hidden from worker",
            "fin-worker",
            "customer.domains",
            json!({"account_id": "acct_7f3k2m9q1x0b"}),
            Deny(Listed, "tool.unknown"),
        ),
        // 4. schema
        row(
            "amount above the ceiling",
            "fin-worker",
            "payment.schedule",
            payment(50_000.01),
            Deny(Schema, "schema.maximum"),
        )
        .keyword("amount"),
        row(
            "amount zero",
            "fin-worker",
            "payment.schedule",
            payment(0.0),
            Deny(Schema, "schema.exclusiveMinimum"),
        ),
        row(
            "extra input field refused (agentic-os gap)",
            "fin-worker",
            "payment.schedule",
            {
                let mut p = payment(10.0);
                p["iban"] = json!("ES9121000418450200051332");
                p
            },
            Deny(Schema, "schema.additionalProperties"),
        )
        .keyword("iban"),
        row(
            "invoice id pattern broken",
            "fin-worker",
            "payment.schedule",
            {
                let mut p = payment(10.0);
                p["invoice_id"] = json!("20260611");
                p
            },
            Deny(Schema, "schema.pattern"),
        ),
        row(
            "wrong currency",
            "fin-worker",
            "payment.schedule",
            {
                let mut p = payment(10.0);
                p["currency"] = json!("USD");
                p
            },
            Deny(Schema, "schema.enum"),
        ),
        row(
            "reason too short",
            "fin-worker",
            "payment.schedule",
            {
                let mut p = payment(10.0);
                p["reason"] = json!("pay");
                p
            },
            Deny(Schema, "schema.minLength"),
        ),
        row(
            "bad date format",
            "fin-worker",
            "payment.schedule",
            {
                let mut p = payment(10.0);
                p["value_date"] = json!("30/06/2026");
                p
            },
            Deny(Schema, "schema.format"),
        ),
        row(
            "missing required field",
            "fin-worker",
            "note.draft",
            json!({"invoice_id": "INV-20260611", "kind": "query"}),
            Deny(Schema, "schema.required"),
        )
        .keyword("text"),
        row(
            "wrong type",
            "fin-worker",
            "invoice.search",
            json!({"limit": "ten"}),
            Deny(Schema, "schema.type"),
        ),
        row(
            "inputs validated before any approval is asked (agentic-os gap)",
            "fin-worker",
            "payment.priority",
            json!({"invoice_id": "INV-20260611", "amount": 60_000.0}),
            Deny(Schema, "schema.maximum"),
        ),
        // 5. destination
        row(
            "recipient on a verified domain",
            "fin-worker",
            "email.send",
            email("ap@northwind.com"),
            Allow,
        )
        .facts("to", &["northwind.com", "northwind.co.uk"]),
        row(
            "recipient on an unverified domain",
            "fin-worker",
            "email.send",
            email("me@gmail.com"),
            Deny(Destination, "destination.to"),
        )
        .facts("to", &["northwind.com", "northwind.co.uk"])
        .keyword("northwind.com, northwind.co.uk"),
        row(
            "no lookup result fails closed",
            "fin-worker",
            "email.send",
            email("ap@northwind.com"),
            Deny(Destination, "destination.to"),
        )
        .keyword("could not be looked up"),
        row(
            "webhook host on the allowlist",
            "fin-worker",
            "webhook.post",
            json!({"url": "https://hooks.acme.example/in", "event": "invoice.paid"}),
            Allow,
        ),
        row(
            "webhook host off the allowlist",
            "fin-worker",
            "webhook.post",
            json!({"url": "https://evil.example.net/hooks.acme.example", "event": "invoice.paid"}),
            Deny(Destination, "destination.url"),
        )
        .keyword("evil.example.net"),
        // 6. purpose
        row(
            "missing purpose",
            "fin-worker",
            "invoice.search",
            json!({}),
            Deny(Purpose, "purpose.missing"),
        )
        .purpose(None),
        row(
            "tool purpose tags enforced (agentic-os gap)",
            "fin-worker",
            "note.draft",
            note(),
            Deny(Purpose, "tool.purpose"),
        )
        .purpose(Some("marketing"))
        .keyword("not granted for purpose"),
        row(
            "purpose not in any grant",
            "fin-worker",
            "invoice.search",
            json!({}),
            Deny(Purpose, "grant.purpose"),
        )
        .purpose(Some("audit"))
        .keyword("not granted for purpose 'audit'"),
        row(
            "scopes from two grants do not combine (agentic-os gap)",
            "split-worker",
            "payment.schedule",
            payment(10.0),
            Deny(Purpose, "grant.purpose"),
        )
        .keyword("scopes"),
        row(
            "write without a reason",
            "fin-worker",
            "note.draft",
            note(),
            Deny(Purpose, "reason.missing"),
        )
        .reason(None)
        .keyword("reason"),
        row(
            "read without a reason is fine",
            "fin-worker",
            "invoice.search",
            json!({}),
            Allow,
        )
        .reason(None),
        // 7. tier and sensitivity
        row(
            "spend above the grant's tier",
            "low-worker",
            "payment.schedule",
            payment(10.0),
            Deny(TierSensitivity, "grant.tier"),
        )
        .keyword("tier"),
        row(
            "confidential data above the grant",
            "low-worker",
            "invoice.search",
            json!({}),
            Deny(TierSensitivity, "grant.sensitivity"),
        )
        .keyword("sensitivity"),
        row(
            "restricted data above a confidential grant",
            "fin-worker",
            "records.export",
            json!({"table": "staff"}),
            Deny(TierSensitivity, "grant.sensitivity"),
        ),
        row(
            "act within an act grant",
            "low-worker",
            "note.draft",
            note(),
            Allow,
        ),
        // 8. rate limit
        row(
            "rate limit has headroom",
            "fin-worker",
            "note.draft",
            note(),
            Allow,
        )
        .run(history(&[("note.draft", Tier::Act, Allowed)])),
        row(
            "rate limit reached",
            "fin-worker",
            "note.draft",
            note(),
            Deny(RateLimit, "rate_limit"),
        )
        .run(history(&[
            ("note.draft", Tier::Act, Allowed),
            ("note.draft", Tier::Act, Allowed),
        ]))
        .keyword("rate limit"),
        row(
            "denied calls do not use the rate limit",
            "fin-worker",
            "note.draft",
            note(),
            Allow,
        )
        .run(history(&[
            ("note.draft", Tier::Act, Denied),
            ("note.draft", Tier::Act, Allowed),
        ])),
        // 9. policy
        row(
            "no spend after a denial",
            "fin-worker",
            "payment.schedule",
            payment(10.0),
            Deny(Policy, "no-spend-after-denial"),
        )
        .run(history(&[("invoice.search", Tier::Read, Denied)]))
        .keyword("policy 'no-spend-after-denial'"),
        row(
            "a denial does not stop reads",
            "fin-worker",
            "invoice.search",
            json!({}),
            Allow,
        )
        .run(history(&[("note.draft", Tier::Act, Denied)])),
        row(
            "max act steps",
            "fin-worker",
            "webhook.post",
            json!({"url": "https://hooks.acme.example/x", "event": "invoice.held"}),
            Deny(Policy, "max-act-steps"),
        )
        .run(history(&[
            ("note.draft", Tier::Act, Allowed),
            ("note.discard", Tier::Act, Allowed),
            ("note.draft", Tier::Act, Allowed),
        ]))
        .keyword("policy 'max-act-steps'"),
        row(
            "under max act steps",
            "fin-worker",
            "webhook.post",
            json!({"url": "https://hooks.acme.example/x", "event": "invoice.held"}),
            Allow,
        )
        .run(history(&[
            ("note.draft", Tier::Act, Allowed),
            ("note.discard", Tier::Act, Allowed),
        ])),
        row(
            "small payment is not gated",
            "fin-worker",
            "payment.schedule",
            payment(4180.0),
            Allow,
        ),
        row(
            "large payment gated by policy, not refused",
            "fin-worker",
            "payment.schedule",
            big.clone(),
            Parked("large-payment-needs-approval"),
        ),
        row(
            "large payment with a valid approval",
            "fin-worker",
            "payment.schedule",
            big.clone(),
            Allow,
        )
        .approve(approval(
            k,
            "payment.schedule",
            "3.1.0",
            &big,
            "alice",
            "n1",
        )),
        // 10. budget
        row(
            "spend budget has headroom",
            "fin-worker",
            "payment.schedule",
            payment(10.0),
            Allow,
        )
        .budget("fin-worker", Tier::Spend, 1),
        row(
            "spend budget exhausted",
            "fin-worker",
            "payment.schedule",
            payment(10.0),
            Deny(Budget, "budget.spend"),
        )
        .budget("fin-worker", Tier::Spend, 2)
        .keyword("budget"),
        row(
            "parent's budget exhausted stops the child",
            "fin-worker",
            "payment.schedule",
            payment(10.0),
            Deny(Budget, "budget.spend"),
        )
        .budget("fin-worker", Tier::Spend, 0)
        .budget("fin-lead", Tier::Spend, 3)
        .keyword("fin-lead"),
        row(
            "act budget exhausted",
            "fin-worker",
            "note.draft",
            note(),
            Deny(Budget, "budget.act"),
        )
        .budget("fin-worker", Tier::Act, 5),
        row(
            "reads are never budgeted",
            "fin-worker",
            "invoice.search",
            json!({}),
            Allow,
        )
        .budget("fin-worker", Tier::Act, 99),
        // 11. idempotency
        row(
            "done key replays",
            "fin-worker",
            "note.draft",
            note(),
            Allow,
        )
        .idem(I::Done),
        // An unsettled earlier attempt of the same call: nothing runs, its state is reported,
        // and it is not a denial (a retry after a crash must not poison the run).
        row(
            "in-flight key reported, not refused",
            "fin-worker",
            "note.draft",
            note(),
            Allow,
        )
        .idem(I::InFlight),
        row(
            "a replay is not refused by the run's spent allowance",
            "fin-worker",
            "note.draft",
            note(),
            Allow,
        )
        .idem(I::Done)
        .run(history(&[
            ("note.draft", Tier::Act, Allowed),
            ("note.draft", Tier::Act, Allowed),
        ])),
        row(
            "a replay of a payment is not refused by a later denial",
            "fin-worker",
            "payment.schedule",
            payment(10.0),
            Allow,
        )
        .idem(I::Done)
        .run(history(&[("invoice.search", Tier::Read, Denied)])),
        row(
            "a gated call in flight does not park again",
            "fin-worker",
            "payment.priority",
            prio.clone(),
            Allow,
        )
        .idem(I::InFlight),
        row(
            "an operation another principal made is refused",
            "fin-worker",
            "note.draft",
            note(),
            Deny(Idempotency, "idempotency.elsewhere"),
        )
        .idem(I::Elsewhere)
        .keyword("already made"),
        row(
            "same key, different inputs",
            "fin-worker",
            "note.draft",
            note(),
            Deny(Idempotency, "idempotency.inputs_differ"),
        )
        .idem(I::InputsDiffer),
        // 12. gate
        row(
            "always-gated tool parks",
            "fin-worker",
            "payment.priority",
            prio.clone(),
            Parked("gate.always"),
        ),
        row(
            "two-person rule: one approval is not enough",
            "fin-worker",
            "payment.priority",
            prio.clone(),
            Parked("gate.always"),
        )
        .approve(approval(
            k,
            "payment.priority",
            "1.0.0",
            &prio,
            "alice",
            "n2",
        )),
        row(
            "two-person rule: the same person twice is not two",
            "fin-worker",
            "payment.priority",
            prio.clone(),
            Parked("gate.always"),
        )
        .approve(approval(
            k,
            "payment.priority",
            "1.0.0",
            &prio,
            "alice",
            "n3",
        ))
        .approve(approval(
            k,
            "payment.priority",
            "1.0.0",
            &prio,
            "alice",
            "n4",
        )),
        row(
            "two-person rule: two people",
            "fin-worker",
            "payment.priority",
            prio.clone(),
            Allow,
        )
        .approve(approval(
            k,
            "payment.priority",
            "1.0.0",
            &prio,
            "alice",
            "n5",
        ))
        .approve(approval(k, "payment.priority", "1.0.0", &prio, "bob", "n6")),
        row(
            "approval refused (for another amount)",
            "fin-worker",
            "payment.schedule",
            big.clone(),
            Parked("large-payment-needs-approval"),
        )
        .approve(approval(
            k,
            "payment.schedule",
            "3.1.0",
            &payment(11_999.99),
            "alice",
            "n7",
        )),
        row(
            "approval by someone who is not an approver",
            "fin-worker",
            "payment.schedule",
            big.clone(),
            Parked("large-payment-needs-approval"),
        )
        .approve(approval(
            k,
            "payment.schedule",
            "3.1.0",
            &big,
            "carol",
            "n8",
        )),
        row(
            "approval cannot rescue a policy refusal",
            "fin-worker",
            "payment.schedule",
            big.clone(),
            Deny(Policy, "no-spend-after-denial"),
        )
        .run(history(&[("invoice.search", Tier::Read, Denied)]))
        .approve(approval(
            k,
            "payment.schedule",
            "3.1.0",
            &big,
            "alice",
            "n9",
        )),
    ]
}

/// Decides one row of the table.
fn decide_row(engine: &Engine<'_>, r: &Row) -> toolgate_core::Decision {
    let req = CallRequest {
        purpose: r.purpose,
        reason: r.reason,
        subject: "call-1",
        run: &r.run,
        budgets: &r.budgets,
        idempotency: r.idem,
        approvals: &r.approvals,
        destinations: &r.facts,
        definition: r.definition,
        ..CallRequest::new(r.principal, r.tool, &r.inputs)
    };
    engine.decide(&req, NOW)
}

#[test]
fn policy_table() {
    let reg = registry();
    let k = keys();
    let engine = Engine::new(&reg, &k);
    let rows = rows(&k);
    assert!(rows.len() >= 40, "the table has {} rows", rows.len());
    let mut failures = Vec::new();
    for r in &rows {
        let d = decide_row(&engine, r);
        assert_eq!(d.checks.len(), 12, "{}: every check is recorded", r.name);
        let got = match &d.verdict {
            Verdict::Allow => Want::Allow,
            Verdict::Deny {
                check,
                rule,
                reason,
            } => {
                if !reason.contains(r.keyword) {
                    failures.push(format!(
                        "{}: reason {reason:?} lacks {:?}",
                        r.name, r.keyword
                    ));
                }
                let first_fail = d
                    .checks
                    .iter()
                    .find(|c| c.outcome == Outcome::Fail)
                    .unwrap();
                assert_eq!(
                    first_fail.name, *check,
                    "{}: the first failing check is the reason",
                    r.name
                );
                Want::Deny(*check, Box::leak(rule.to_string().into_boxed_str()))
            }
            Verdict::NeedsApproval { rule, .. } => {
                Want::Parked(Box::leak(rule.to_string().into_boxed_str()))
            }
        };
        if got != r.want {
            failures.push(format!(
                "{}: want {:?}, got {:?}\n  checks: {:#?}",
                r.name, r.want, got, d.checks
            ));
        }
    }
    assert!(
        failures.is_empty(),
        "{} row(s) failed:\n{}",
        failures.len(),
        failures.join("\n")
    );
}

#[test]
fn every_check_is_seen_failing_and_passing() {
    let reg = registry();
    let k = keys();
    let engine = Engine::new(&reg, &k);
    let mut passed = std::collections::HashSet::new();
    let mut failed = std::collections::HashSet::new();
    for r in rows(&k) {
        for c in decide_row(&engine, &r).checks {
            match c.outcome {
                Outcome::Pass => {
                    passed.insert(c.name);
                }
                Outcome::Fail | Outcome::Gate => {
                    failed.insert(c.name);
                }
                Outcome::Skip => {}
            }
        }
    }
    for name in CheckName::ALL {
        assert!(passed.contains(&name), "{name} never passes in the table");
        assert!(failed.contains(&name), "{name} never fails in the table");
    }
}

#[test]
fn all_checks_are_evaluated_after_the_first_failure() {
    let reg = registry();
    let k = keys();
    let engine = Engine::new(&reg, &k);
    // Wrong purpose AND an exhausted budget AND a rate limit reached: all three are recorded.
    let run = history(&[
        ("note.draft", Tier::Act, PriorOutcome::Allowed),
        ("note.draft", Tier::Act, PriorOutcome::Allowed),
    ]);
    let mut budgets = BudgetView::default();
    budgets.set("fin-worker", Tier::Act, 5);
    let inputs = note();
    let req = CallRequest {
        purpose: Some("marketing"),
        reason: Some("x"),
        run: &run,
        budgets: &budgets,
        ..CallRequest::new("fin-worker", "note.draft", &inputs)
    };
    let d = engine.decide(&req, NOW);
    let outcome = |n| d.check(n).outcome;
    assert_eq!(outcome(CheckName::Purpose), Outcome::Fail);
    assert_eq!(outcome(CheckName::RateLimit), Outcome::Fail);
    assert_eq!(outcome(CheckName::Budget), Outcome::Fail);
    assert_eq!(outcome(CheckName::Idempotency), Outcome::Pass);
    assert!(matches!(
        d.verdict,
        Verdict::Deny {
            check: CheckName::Purpose,
            ..
        }
    ));
}

#[test]
fn an_unlisted_tool_answers_exactly_like_an_unknown_one() {
    let reg = registry();
    let k = keys();
    let engine = Engine::new(&reg, &k);
    let inputs = payment(10.0);
    let hidden = engine.decide(
        &CallRequest::new("planner", "payment.schedule", &inputs),
        NOW,
    );
    let missing = engine.decide(
        &CallRequest::new("planner", "payment.scheduled", &inputs),
        NOW,
    );
    let reason = |d: &toolgate_core::Decision| match &d.verdict {
        Verdict::Deny {
            reason,
            rule,
            check,
        } => (
            reason.replace("payment.scheduled", "payment.schedule"),
            rule.clone(),
            *check,
        ),
        v => panic!("{v:?}"),
    };
    assert_eq!(reason(&hidden), reason(&missing));
}

#[test]
fn two_person_rule_says_who_approved_first() {
    let reg = registry();
    let k = keys();
    let engine = Engine::new(&reg, &k);
    let prio = json!({"invoice_id": "INV-20260611", "amount": 900.0});
    let approvals = vec![approval(
        &k,
        "payment.priority",
        "1.0.0",
        &prio,
        "alice",
        "a",
    )];
    let req = CallRequest {
        purpose: Some("billing"),
        reason: Some("same-day"),
        subject: "call-1",
        approvals: &approvals,
        ..CallRequest::new("fin-worker", "payment.priority", &prio)
    };
    match engine.decide(&req, NOW).verdict {
        Verdict::NeedsApproval {
            approvers_needed,
            approved_by,
            ..
        } => {
            assert_eq!(approvers_needed, 1);
            assert_eq!(approved_by, vec!["alice".to_string()]);
        }
        v => panic!("{v:?}"),
    }
}

#[test]
fn an_expired_or_reused_approval_sends_the_call_back_to_the_gate() {
    let reg = registry();
    let k = keys();
    let engine = Engine::new(&reg, &k);
    let big = payment(12_000.0);
    let approvals = vec![approval(
        &k,
        "payment.schedule",
        "3.1.0",
        &big,
        "alice",
        "once",
    )];
    let base = CallRequest {
        purpose: Some("billing"),
        reason: Some("r"),
        subject: "call-1",
        approvals: &approvals,
        ..CallRequest::new("fin-worker", "payment.schedule", &big)
    };
    assert!(engine.decide(&base, NOW).is_allow());
    let late = engine.decide(&base, NOW.plus_hours(73));
    assert!(matches!(late.verdict, Verdict::NeedsApproval { .. }));
    assert!(late.check(CheckName::Gate).detail.contains("expired"));
    let used = |n: &str| n == "once";
    let reused = engine.decide(
        &CallRequest {
            nonce_used: &used,
            ..base
        },
        NOW,
    );
    assert!(matches!(reused.verdict, Verdict::NeedsApproval { .. }));
    assert!(
        reused
            .check(CheckName::Gate)
            .detail
            .contains("already used")
    );
}

/// A registry over a Python MCP server whose optional fields are `anyOf: [T, {type: null}]`
/// (fixtures/optional-inputs): the policies written over them gate and refuse the calls they
/// were written for, through the engine, and let the others through.
#[test]
fn policies_over_inputs_published_as_any_of_null_decide_the_calls_they_were_written_for() {
    let reg = Registry::load(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/fixtures/optional-inputs"
    ))
    .expect("fixture loads");
    let k = keys();
    let engine = Engine::new(&reg, &k);
    let mail = |extra: Value| {
        let mut v = json!({"invoice_id": "INV-20260611", "subject": "Your invoice"});
        v.as_object_mut()
            .unwrap()
            .extend(extra.as_object().unwrap().clone());
        v
    };
    let table: Vec<(&str, Value, Want)> = vec![
        (
            "an external recipient is gated",
            mail(json!({"recipient": "ap@evil.example"})),
            Want::Parked("external-recipient-needs-approval"),
        ),
        (
            "an acme recipient passes",
            mail(json!({"recipient": "ap@acme.com"})),
            Want::Allow,
        ),
        (
            "a null recipient is an absent one, not an error",
            mail(json!({"recipient": null})),
            Want::Allow,
        ),
        ("no recipient at all passes", mail(json!({})), Want::Allow),
        (
            "a forbidden copy is refused",
            mail(json!({"cc": ["me@acme.com", "all@partner.example"]})),
            Want::Deny(CheckName::Policy, "no-external-cc"),
        ),
        (
            "a null cc list passes",
            mail(json!({"cc": null})),
            Want::Allow,
        ),
        (
            "an external reply address, inside a nullable $ref model, is gated",
            mail(json!({"reply": {"email": "x@evil.example", "name": null}})),
            Want::Parked("external-reply-needs-approval"),
        ),
        (
            "an acme reply address passes",
            mail(json!({"reply": {"email": "desk@acme.com"}})),
            Want::Allow,
        ),
    ];
    for (name, inputs, want) in table {
        let req = CallRequest {
            purpose: Some("billing"),
            reason: Some("Send the invoice the customer asked for."),
            subject: "call-1",
            ..CallRequest::new("mail-agent", "mail.send", &inputs)
        };
        let d = engine.decide(&req, NOW);
        let got = match &d.verdict {
            Verdict::Allow => Want::Allow,
            Verdict::Deny { check, rule, .. } => {
                Want::Deny(*check, Box::leak(rule.to_string().into_boxed_str()))
            }
            Verdict::NeedsApproval { rule, .. } => {
                Want::Parked(Box::leak(rule.to_string().into_boxed_str()))
            }
        };
        assert_eq!(got, want, "{name}: {:#?}", d.checks);
        assert_ne!(
            d.check(CheckName::Policy).rule.as_deref(),
            Some("policy.error"),
            "{name}: no policy errors on an absent optional input"
        );
    }
}

/// A run handed over as counts decides like the same run listed call by call.
#[test]
fn a_counted_run_counts_like_the_same_run_listed() {
    use toolgate_core::PriorCalls;
    let listed = history(&[
        ("a", Tier::Act, PriorOutcome::Allowed),
        ("a", Tier::Act, PriorOutcome::Allowed),
        ("b", Tier::Spend, PriorOutcome::Allowed),
        ("b", Tier::Spend, PriorOutcome::Denied),
        ("c", Tier::Read, PriorOutcome::Gated),
    ]);
    let group = |tool: &str, tier, outcome, n| PriorCalls {
        call: PriorCall {
            tool: tool.into(),
            tier,
            outcome,
        },
        n,
    };
    let counted = RunHistory {
        calls: Vec::new(),
        counted: vec![
            group("a", Tier::Act, PriorOutcome::Allowed, 2),
            group("b", Tier::Spend, PriorOutcome::Allowed, 1),
            group("b", Tier::Spend, PriorOutcome::Denied, 1),
            group("c", Tier::Read, PriorOutcome::Gated, 1),
        ],
    };
    for tool in ["a", "b", "c", "d"] {
        assert_eq!(listed.counts(tool), counted.counts(tool), "{tool}");
    }
}
