//! Both example registries load, lint clean, and decide the field-services dispatch run as
//! `examples/field-services/README.md` documents it.

use std::path::PathBuf;

use serde_json::json;
use toolgate_core::decide::{CallRequest, PriorCall, PriorOutcome, RunHistory, Verdict};
use toolgate_core::{ApprovalKeys, CheckName, Engine, Registry, Tier, Timestamp};

fn example(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("..")
        .join(name)
}

fn load(name: &str) -> Registry {
    Registry::load(example(name)).unwrap_or_else(|e| panic!("examples/{name} does not load:\n{e}"))
}

#[test]
fn both_registries_load_with_zero_lint_findings() {
    for name in ["finance", "field-services"] {
        let registry = load(name);
        let findings = toolgate_core::lint::lint(&registry);
        let text: Vec<String> = findings.iter().map(|f| f.to_string()).collect();
        assert!(
            findings.is_empty(),
            "examples/{name} lint:\n{}",
            text.join("\n")
        );
    }
}

/// One planned step of the field-services dispatch run.
struct Step {
    tool: &'static str,
    purpose: &'static str,
    inputs: serde_json::Value,
}

fn dispatch_run() -> Vec<Step> {
    let visit = json!({"work_order_id": "wo-001", "technician_id": "tech-001", "date": "2026-06-12", "window": "am"});
    let invoice = json!({"work_order_id": "wo-001", "amount": 180.0, "currency": "GBP", "description": "Call-out and thermostat replacement"});
    vec![
        Step {
            tool: "lookup_customer",
            purpose: "service_delivery",
            inputs: json!({"customer_id": "cust-001"}),
        },
        Step {
            tool: "list_open_work_orders",
            purpose: "service_delivery",
            inputs: json!({"customer_id": "cust-001"}),
        },
        Step {
            tool: "schedule_technician",
            purpose: "service_delivery",
            inputs: visit,
        },
        Step {
            tool: "send_notification",
            purpose: "service_delivery",
            inputs: json!({"customer_id": "cust-001", "work_order_id": "wo-001", "channel": "email", "template": "visit_booked"}),
        },
        Step {
            tool: "draft_invoice",
            purpose: "service_delivery",
            inputs: invoice.clone(),
        },
        Step {
            tool: "draft_invoice",
            purpose: "billing",
            inputs: invoice,
        },
    ]
}

#[test]
fn seed_003s_dispatch_run_comes_out_four_allowed_then_refused_for_scopes_then_by_policy() {
    let registry = load("field-services");
    let keys = ApprovalKeys::new("k1", vec![7u8; 32]);
    let engine = Engine::new(&registry, &keys);
    let mut run = RunHistory::default();
    let mut verdicts = Vec::new();
    for step in dispatch_run() {
        let mut req = CallRequest::new("dispatch-agent", step.tool, &step.inputs);
        req.purpose = Some(step.purpose);
        req.reason = Some("Customer reported the proofing cabinet failing; book the first slot.");
        req.run = &run;
        let decision = engine.decide(&req, Timestamp(1_781_170_937_000));
        let tier = registry.tool(step.tool).expect("declared").config.tier;
        let outcome = match decision.verdict {
            Verdict::Allow => PriorOutcome::Allowed,
            Verdict::NeedsApproval { .. } => PriorOutcome::Gated,
            Verdict::Deny { .. } => PriorOutcome::Denied,
        };
        verdicts.push(decision.verdict);
        let next = PriorCall {
            tool: step.tool.to_string(),
            tier,
            outcome,
        };
        run.calls.push(next);
    }
    for (i, v) in verdicts.iter().take(4).enumerate() {
        assert_eq!(v, &Verdict::Allow, "step {} is allowed", i + 1);
    }
    match &verdicts[4] {
        Verdict::Deny {
            check,
            rule,
            reason,
        } => {
            assert_eq!(*check, CheckName::Purpose);
            assert_eq!(rule, "grant.purpose");
            assert_eq!(
                reason,
                "scopes ['invoices:write'] not granted for purpose 'service_delivery'"
            );
        }
        other => panic!("step 5: {other:?}"),
    }
    match &verdicts[5] {
        Verdict::Deny {
            check,
            rule,
            reason,
        } => {
            assert_eq!(*check, CheckName::Policy);
            assert_eq!(rule, "no-spend-after-denial");
            assert!(
                reason.starts_with("policy 'no-spend-after-denial' objects"),
                "{reason}"
            );
        }
        other => panic!("step 6: {other:?}"),
    }
    assert_eq!(
        run.calls.iter().filter(|c| c.tier == Tier::Spend).count(),
        2
    );
}

#[test]
fn no_supplier_tool_is_listed_for_the_finance_worker_or_the_planner() {
    let registry = load("finance");
    for role in ["worker.finance", "planner"] {
        let listed: Vec<&str> = registry.tools_for_role(role).map(|t| t.name()).collect();
        assert!(
            !listed.iter().any(|t| t.starts_with("supplier.")),
            "{role} sees {listed:?}"
        );
    }
    let admins: Vec<&str> = registry
        .tools()
        .iter()
        .filter(|t| t.is_listed_for("supplier.admin"))
        .map(|t| t.name())
        .collect();
    assert!(admins.contains(&"supplier.update_iban"));
    let holders: Vec<&str> = registry
        .tools()
        .iter()
        .filter(|t| t.name() == "supplier.update_iban")
        .flat_map(|t| t.config.roles.iter().map(String::as_str))
        .collect();
    assert_eq!(holders, ["supplier.admin"]);
}

#[test]
fn a_payment_is_gated_and_one_above_the_ceiling_is_refused_by_the_schema() {
    let registry = load("finance");
    let keys = ApprovalKeys::new("k1", vec![7u8; 32]);
    let engine = Engine::new(&registry, &keys);
    let decide = |amount: f64| {
        let inputs = json!({
            "invoice_id": "INV-20260611", "amount": amount, "currency": "EUR",
            "value_date": "2026-06-30",
            "reason": "Three-way match complete against PO-77812 lines 1-2; net 30."
        });
        let mut req = CallRequest::new("fin-worker", "payment.schedule", &inputs);
        req.purpose = Some("billing");
        req.reason = Some("pay the approved invoice");
        engine.decide(&req, Timestamp(1_781_170_937_000)).verdict
    };
    assert!(
        matches!(decide(4180.0), Verdict::NeedsApproval { ref rule, .. } if rule == "gate.always")
    );
    assert!(matches!(
        decide(50_000.01),
        Verdict::Deny {
            check: CheckName::Schema,
            ..
        }
    ));
}

#[test]
fn the_supplier_email_destination_is_looked_up_through_a_read_tool() {
    let registry = load("finance");
    let notify = registry.tool("supplier.notify").expect("declared");
    let d = &notify.config.destinations[0];
    assert_eq!(d.field, "to");
    let lookup = d.lookup.as_ref().expect("a lookup, not a static list");
    assert_eq!(lookup.tool, "supplier.verified_domains");
    assert_eq!(lookup.with, ["supplier_id"]);
    let reader = registry.tool(&lookup.tool).expect("declared");
    assert_eq!(reader.config.effect, toolgate_core::Effect::Read);
}

#[test]
fn each_example_names_an_ontology_that_loads_and_walks() {
    for name in ["finance", "field-services"] {
        let registry = load(name);
        let file = registry
            .gateway
            .ontology
            .clone()
            .expect("toolgate.yaml names its ontology");
        toolgate_ontology::Ontology::load(example(name).join(file))
            .unwrap_or_else(|e| panic!("examples/{name}: {e}"));
    }
    let field =
        toolgate_ontology::Ontology::load(example("field-services").join("ontology.yaml")).unwrap();
    let walk = field.walk("cust-001").unwrap().to_string();
    assert!(walk.starts_with(
        "customer cust-001 'Harbour Bakery'\n\
         <- belongs_to site site-001 '12 Quay Street, Whitby'\n   \
            <- raised_at work_order wo-001 [open/high] 'Oven proofing cabinet not holding temperature.'\n"
    ), "{walk}");
    let finance =
        toolgate_ontology::Ontology::load(example("finance").join("ontology.yaml")).unwrap();
    let walk = finance.walk("INV-20260611").unwrap();
    assert_eq!(walk.ids(), ["PO-77812", "SUP-0001"]);
}

/// The property names and required fields of a JSON Schema object.
fn shape(schema: &serde_json::Value) -> (Vec<String>, Vec<String>) {
    let mut props: Vec<String> = schema["properties"]
        .as_object()
        .map(|m| m.keys().cloned().collect())
        .unwrap_or_default();
    let mut required: Vec<String> = schema["required"]
        .as_array()
        .map(|a| {
            a.iter()
                .filter_map(|v| v.as_str().map(str::to_string))
                .collect()
        })
        .unwrap_or_default();
    props.sort();
    required.sort();
    (props, required)
}

#[test]
fn every_registry_tool_maps_to_a_fake_tool_with_the_same_fields() {
    use toolgate_fakes::Domain;
    let cases: [(&str, Vec<rmcp::model::Tool>); 2] = [
        (
            "finance",
            toolgate_fakes::finance::Finance::seeded().tools(),
        ),
        (
            "field-services",
            toolgate_fakes::field::Field::seeded().tools(),
        ),
    ];
    for (name, upstream) in cases {
        let registry = load(name);
        for tool in registry.tools() {
            let handler = &tool.config.handler;
            if handler.builtin.is_some() {
                continue; // toolgate's own (plan.submit, run.status…): no upstream behind it
            }
            let target = handler.tool.as_deref().unwrap_or(tool.name());
            let fake = upstream
                .iter()
                .find(|t| t.name == target)
                .unwrap_or_else(|| {
                    panic!(
                        "{name}: '{}' calls '{target}', which the fake lacks",
                        tool.name()
                    )
                });
            let fake_schema = serde_json::Value::Object((*fake.input_schema).clone());
            assert_eq!(
                shape(&tool.config.input_schema),
                shape(&fake_schema),
                "{name}: '{}' and the fake's '{target}' disagree on fields",
                tool.name()
            );
        }
    }
}

#[test]
fn field_grants_budgets_and_policies_refuse_what_they_should() {
    use toolgate_core::BudgetView;
    let registry = load("field-services");
    let keys = ApprovalKeys::new("k1", vec![7u8; 32]);
    let engine = Engine::new(&registry, &keys);
    let now = Timestamp(1_781_170_937_000);
    let deny = |v: Verdict| match v {
        Verdict::Deny { check, rule, .. } => (check, rule.to_string()),
        other => panic!("expected a denial, got {other:?}"),
    };

    // The reporting agent reads, but not customers' personal data, and cannot act at all.
    let customer = json!({"customer_id": "cust-001"});
    let mut req = CallRequest::new("reporting-agent", "lookup_customer", &customer);
    req.purpose = Some("reporting");
    assert_eq!(
        deny(engine.decide(&req, now).verdict),
        (CheckName::TierSensitivity, "grant.sensitivity".to_string())
    );
    let open = json!({});
    let mut req = CallRequest::new("reporting-agent", "list_open_work_orders", &open);
    req.purpose = Some("reporting");
    assert_eq!(engine.decide(&req, now).verdict, Verdict::Allow);
    let visit = json!({"work_order_id": "wo-001", "technician_id": "tech-001", "date": "2026-06-12", "window": "am"});
    let mut req = CallRequest::new("reporting-agent", "schedule_technician", &visit);
    req.purpose = Some("service_delivery");
    req.reason = Some("book it");
    assert_eq!(
        deny(engine.decide(&req, now).verdict),
        (CheckName::Listed, "tool.unknown".to_string())
    );

    // The billing agent's fourth spend of the day is refused by its budget.
    let invoice = json!({"work_order_id": "wo-002", "amount": 95.0, "currency": "GBP", "description": "Compressor mount"});
    let mut used = BudgetView::default();
    used.set("billing-agent", Tier::Spend, 3);
    let mut req = CallRequest::new("billing-agent", "draft_invoice", &invoice);
    req.purpose = Some("billing");
    req.reason = Some("work order completed and signed off");
    req.budgets = &used;
    assert_eq!(
        deny(engine.decide(&req, now).verdict),
        (CheckName::Budget, "budget.spend".to_string())
    );

    // After five act steps in one run, a sixth is refused by max-act-steps.
    let run = RunHistory::of_calls(
        (0..5)
            .map(|_| PriorCall {
                tool: "cancel_visit".into(),
                tier: Tier::Act,
                outcome: PriorOutcome::Allowed,
            })
            .collect(),
    );
    let mut req = CallRequest::new("dispatch-agent", "schedule_technician", &visit);
    req.purpose = Some("service_delivery");
    req.reason = Some("book the first free slot");
    req.run = &run;
    assert_eq!(
        deny(engine.decide(&req, now).verdict),
        (CheckName::Policy, "max-act-steps".to_string())
    );
}
