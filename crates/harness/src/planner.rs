//! Planners turn a goal and what has been read so far into a plan: data, not actions. The
//! deterministic planner needs no model and no network, so every decision of the demo can be read
//! without an API key. It takes only structured fields from what it read — free text (where an
//! injected instruction would hide) never becomes an input.

use anyhow::{Context, bail};
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

/// One planned call.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PlannedCall {
    pub tool: String,
    pub inputs: Value,
    pub purpose: String,
    /// The justification, recorded with the call.
    pub reason: String,
    /// Ontology ids the step relies on (an invoice, its purchase order, the supplier…).
    #[serde(default)]
    pub evidence: Vec<String>,
}

/// A plan: the goal and its steps, in order.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Plan {
    pub goal: String,
    pub steps: Vec<PlannedCall>,
}

/// Something that plans. A model-backed planner would implement this too; the demo never needs one.
pub trait Planner {
    fn plan(&self, goal: &str, observations: &[Value]) -> anyhow::Result<Plan>;
}

/// Plans the demo goals from structured observations only.
#[derive(Debug, Default, Clone, Copy)]
pub struct DeterministicPlanner;

/// The goal of the field-services demo (seed 003's dispatch run).
pub const DISPATCH_GOAL: &str =
    "Get work order wo-001 at Harbour Bakery fixed, tell the customer, and bill it";
/// The goal of the supplier-payments demo.
pub const PAYMENT_GOAL: &str = "Process invoice INV-20260611 for payment";

impl Planner for DeterministicPlanner {
    fn plan(&self, goal: &str, observations: &[Value]) -> anyhow::Result<Plan> {
        match goal {
            DISPATCH_GOAL => Ok(dispatch_plan()),
            PAYMENT_GOAL => payment_plan(observations),
            other => bail!("the deterministic planner knows the demo goals only, not {other:?}"),
        }
    }
}

/// Six steps, as the dispatch agent of seed 003 plans them: it first tries to bill under the
/// purpose it was working for, then under billing.
fn dispatch_plan() -> Plan {
    let invoice = json!({"work_order_id": "wo-001", "amount": 180.0, "currency": "GBP",
                         "description": "Call-out and thermostat replacement"});
    let step = |tool: &str, purpose: &str, inputs: Value, reason: &str| PlannedCall {
        tool: tool.into(),
        inputs,
        purpose: purpose.into(),
        reason: reason.into(),
        evidence: vec!["cust-001".into(), "site-001".into(), "wo-001".into()],
    };
    Plan {
        goal: DISPATCH_GOAL.into(),
        steps: vec![
            step(
                "lookup_customer",
                "service_delivery",
                json!({"customer_id": "cust-001"}),
                "Find the customer behind the open work order.",
            ),
            step(
                "list_open_work_orders",
                "service_delivery",
                json!({"customer_id": "cust-001"}),
                "See what is open at the customer's sites.",
            ),
            step(
                "schedule_technician",
                "service_delivery",
                json!({"work_order_id": "wo-001", "technician_id": "tech-001", "date": "2026-06-12", "window": "am"}),
                "Book the refrigeration technician for the high-priority oven fault.",
            ),
            step(
                "send_notification",
                "service_delivery",
                json!({"customer_id": "cust-001", "work_order_id": "wo-001", "channel": "email", "template": "visit_booked"}),
                "Tell the customer when the technician arrives.",
            ),
            step(
                "draft_invoice",
                "service_delivery",
                invoice.clone(),
                "Bill the call-out as part of the service visit.",
            ),
            step(
                "draft_invoice",
                "billing",
                invoice,
                "Bill the call-out under the billing purpose.",
            ),
        ],
    }
}

/// Pays the invoice it read, from its structured fields: amount, currency, purchase order.
fn payment_plan(observations: &[Value]) -> anyhow::Result<Plan> {
    let invoice = observations
        .iter()
        .filter_map(|o| o.get("invoices").and_then(Value::as_array))
        .flatten()
        .find(|i| i.get("invoice_id").and_then(Value::as_str) == Some("INV-20260611"))
        .context("the planner has not read invoice INV-20260611")?;
    let field = |k: &str| invoice.get(k).cloned().unwrap_or(Value::Null);
    let po = field("po_id").as_str().unwrap_or_default().to_string();
    let supplier = field("supplier_id")
        .as_str()
        .unwrap_or_default()
        .to_string();
    let evidence = vec!["INV-20260611".to_string(), po.clone(), supplier];
    Ok(Plan {
        goal: PAYMENT_GOAL.into(),
        steps: vec![
            PlannedCall {
                tool: "note.draft".into(),
                inputs: json!({"invoice_id": "INV-20260611", "kind": "info",
                               "text": format!("Matched against {po}; scheduling payment for approval.")}),
                purpose: "billing".into(),
                reason: "Leave a trail on the invoice before payment.".into(),
                evidence: evidence.clone(),
            },
            PlannedCall {
                tool: "payment.schedule".into(),
                inputs: json!({"invoice_id": "INV-20260611", "amount": field("amount"),
                               "currency": field("currency"), "value_date": "2026-06-30",
                               "reason": format!("Three-way match complete against {po}; net-30 from receipt.")}),
                purpose: "billing".into(),
                reason: "Pay the matched invoice on its due date.".into(),
                evidence,
            },
        ],
    })
}
