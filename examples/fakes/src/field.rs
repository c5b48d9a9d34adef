//! The field-services domain: customers, their sites, work orders raised at sites, technicians
//! and invoices. Scheduling, notifications and invoices honour `_meta.idempotency_key`.

use std::collections::BTreeMap;
use std::sync::Mutex;

use rmcp::RoleServer;
use rmcp::model::{CallToolResult, JsonObject, Tool};
use rmcp::service::RequestContext;
use serde_json::{Value, json};

use crate::ledger::KeyLedger;
use crate::server::{Call, Domain, Reply};
use crate::{Refusal, opt_str, read_tool, refuse, str_arg, write_tool};

#[derive(Debug, Clone)]
struct Customer {
    id: &'static str,
    name: &'static str,
    contact: &'static str,
    email: &'static str,
    phone: &'static str,
}

#[derive(Debug, Clone)]
struct Site {
    id: &'static str,
    customer_id: &'static str,
    address: &'static str,
}

#[derive(Debug, Clone)]
struct WorkOrder {
    id: &'static str,
    site_id: &'static str,
    status: &'static str,
    priority: &'static str,
    summary: &'static str,
    assigned_to: Option<&'static str>,
}

#[derive(Debug, Clone)]
struct Technician {
    id: &'static str,
    name: &'static str,
    skills: &'static [&'static str],
}

#[derive(Debug)]
struct State {
    customers: BTreeMap<&'static str, Customer>,
    sites: BTreeMap<&'static str, Site>,
    work_orders: BTreeMap<&'static str, WorkOrder>,
    technicians: BTreeMap<&'static str, Technician>,
    /// Booked visits: (technician, date, window) → visit.
    visits: BTreeMap<(String, String, String), Value>,
    notifications: Vec<Value>,
    invoices: Vec<Value>,
    ledger: KeyLedger,
    visit_seq: u32,
}

/// The field-services fake's data and behaviour.
#[derive(Debug)]
pub struct Field {
    state: Mutex<State>,
}

impl Default for Field {
    fn default() -> Self {
        Field::seeded()
    }
}

impl Field {
    /// Three customers, four sites, five work orders, three technicians and one invoice.
    pub fn seeded() -> Field {
        let customers = [
            Customer {
                id: "cust-001",
                name: "Harbour Bakery",
                contact: "Maggie Ward",
                email: "maggie@harbourbakery.co.uk",
                phone: "+44 1947 600101",
            },
            Customer {
                id: "cust-002",
                name: "Moorside Dental Practice",
                contact: "Dr Ian Pike",
                email: "practice@moorsidedental.co.uk",
                phone: "+44 1751 470202",
            },
            Customer {
                id: "cust-003",
                name: "Abbey Lane Brewery",
                contact: "Sunita Rao",
                email: "ops@abbeylanebrewery.co.uk",
                phone: "+44 1723 350303",
            },
        ];
        let sites = [
            Site {
                id: "site-001",
                customer_id: "cust-001",
                address: "12 Quay Street, Whitby",
            },
            Site {
                id: "site-002",
                customer_id: "cust-001",
                address: "3 Flowergate, Whitby",
            },
            Site {
                id: "site-003",
                customer_id: "cust-002",
                address: "Moorside Road, Pickering",
            },
            Site {
                id: "site-004",
                customer_id: "cust-003",
                address: "Unit 7, Abbey Lane, Scarborough",
            },
        ];
        let work_orders = [
            WorkOrder {
                id: "wo-001",
                site_id: "site-001",
                status: "open",
                priority: "high",
                summary: "Oven proofing cabinet not holding temperature.",
                assigned_to: None,
            },
            WorkOrder {
                id: "wo-002",
                site_id: "site-003",
                status: "open",
                priority: "medium",
                summary: "Compressor in the sterilisation room rattles at start-up.",
                assigned_to: None,
            },
            WorkOrder {
                id: "wo-003",
                site_id: "site-002",
                status: "closed",
                priority: "low",
                summary: "Display fridge door seal replaced.",
                assigned_to: Some("tech-001"),
            },
            WorkOrder {
                id: "wo-004",
                site_id: "site-004",
                status: "open",
                priority: "low",
                summary: "Fermentation tank thermostat reads two degrees high.",
                assigned_to: None,
            },
            WorkOrder {
                id: "wo-005",
                site_id: "site-004",
                status: "in_progress",
                priority: "high",
                summary: "Glycol chiller trips its breaker under load.",
                assigned_to: Some("tech-002"),
            },
        ];
        let technicians = [
            Technician {
                id: "tech-001",
                name: "Priya Shah",
                skills: &["refrigeration", "catering-equipment"],
            },
            Technician {
                id: "tech-002",
                name: "Tom Hartley",
                skills: &["electrical", "refrigeration"],
            },
            Technician {
                id: "tech-003",
                name: "Ellen Marsh",
                skills: &["gas", "catering-equipment"],
            },
        ];
        let invoice = json!({
            "invoice_id": "inv-001",
            "work_order_id": "wo-003",
            "customer_id": "cust-001",
            "amount": 145.00,
            "currency": "GBP",
            "status": "issued",
            "description": "Door seal for display fridge, parts and labour",
        });
        Field {
            state: Mutex::new(State {
                customers: customers.into_iter().map(|c| (c.id, c)).collect(),
                sites: sites.into_iter().map(|s| (s.id, s)).collect(),
                work_orders: work_orders.into_iter().map(|w| (w.id, w)).collect(),
                technicians: technicians.into_iter().map(|t| (t.id, t)).collect(),
                visits: BTreeMap::new(),
                notifications: Vec::new(),
                invoices: vec![invoice],
                ledger: KeyLedger::default(),
                visit_seq: 0,
            }),
        }
    }
}

fn id_schema(prefix: &str) -> Value {
    json!({"type": "string", "pattern": format!("^{prefix}-[0-9]{{3}}$")})
}

fn visit_schema() -> Value {
    json!({
        "type": "object",
        "additionalProperties": false,
        "required": ["work_order_id", "technician_id", "date", "window"],
        "properties": {
            "work_order_id": id_schema("wo"),
            "technician_id": id_schema("tech"),
            "date": {"type": "string", "format": "date"},
            "window": {"type": "string", "enum": ["am", "pm"]}
        }
    })
}

fn key_schema() -> Value {
    json!({
        "type": "object",
        "additionalProperties": false,
        "required": ["idempotency_key"],
        "properties": {"idempotency_key": {"type": "string", "minLength": 1, "maxLength": 200}}
    })
}

fn field_tools() -> Vec<Tool> {
    vec![
        read_tool(
            "lookup_customer",
            "A customer with its contact details and sites.",
            json!({
                "type": "object",
                "additionalProperties": false,
                "required": ["customer_id"],
                "properties": {"customer_id": id_schema("cust")}
            }),
        ),
        read_tool(
            "list_open_work_orders",
            "Open and in-progress work orders, optionally for one customer, site or priority.",
            json!({
                "type": "object",
                "additionalProperties": false,
                "properties": {
                    "customer_id": id_schema("cust"),
                    "site_id": id_schema("site"),
                    "priority": {"type": "string", "enum": ["low", "medium", "high"]}
                }
            }),
        ),
        read_tool(
            "list_technicians",
            "Technicians with their skills and booked visits.",
            json!({
                "type": "object",
                "additionalProperties": false,
                "properties": {"skill": {"type": "string", "maxLength": 40}}
            }),
        ),
        write_tool(
            "schedule_technician",
            "Book a technician's visit for a work order in a half-day window.",
            false,
            visit_schema(),
        ),
        write_tool(
            "cancel_visit",
            "Cancel a booked visit (the compensation of schedule_technician).",
            false,
            visit_schema(),
        ),
        write_tool(
            "send_notification",
            "Send the customer's contact on record a templated message about a work order.",
            true,
            json!({
                "type": "object",
                "additionalProperties": false,
                "required": ["customer_id", "work_order_id", "channel", "template"],
                "properties": {
                    "customer_id": id_schema("cust"),
                    "work_order_id": id_schema("wo"),
                    "channel": {"type": "string", "enum": ["email", "sms"]},
                    "template": {"type": "string", "enum": ["visit_booked", "visit_cancelled", "visit_reminder"]}
                }
            }),
        ),
        read_tool(
            "lookup_notification_by_key",
            "Whether a notification was sent under an idempotency key.",
            key_schema(),
        ),
        write_tool(
            "draft_invoice",
            "Raise a draft invoice for a work order; its number is allocated in the ledger.",
            true,
            json!({
                "type": "object",
                "additionalProperties": false,
                "required": ["work_order_id", "amount", "currency", "description"],
                "properties": {
                    "work_order_id": id_schema("wo"),
                    "amount": {"type": "number", "exclusiveMinimum": 0, "maximum": 5000},
                    "currency": {"type": "string", "enum": ["GBP"]},
                    "description": {"type": "string", "minLength": 5, "maxLength": 400}
                }
            }),
        ),
        read_tool(
            "lookup_invoice_by_key",
            "Whether an invoice was drafted under an idempotency key.",
            key_schema(),
        ),
        read_tool(
            "list_invoices",
            "Invoices, optionally by status.",
            json!({
                "type": "object",
                "additionalProperties": false,
                "properties": {"status": {"type": "string", "enum": ["draft", "issued", "paid"]}}
            }),
        ),
    ]
}

fn ok(v: Value) -> CallToolResult {
    CallToolResult::structured(v)
}

type Outcome = Result<Reply, Refusal>;

impl Domain for Field {
    fn name(&self) -> &'static str {
        "field"
    }

    fn server_name(&self) -> &'static str {
        "toolgate-fake-field"
    }

    fn tools(&self) -> Vec<Tool> {
        field_tools()
    }

    async fn call(&self, call: &Call, _context: &RequestContext<RoleServer>) -> Reply {
        let mut st = self.state.lock().expect("field state");
        let args = &call.arguments;
        let key = call.idempotency_key();
        let outcome: Outcome = match call.tool.as_str() {
            "lookup_customer" => lookup_customer(&st, args),
            "list_open_work_orders" => Ok(Reply::read(list_open(&st, args))),
            "list_technicians" => Ok(Reply::read(list_technicians(&st, args))),
            "schedule_technician" => keyed(&mut st, "visit", key, args, schedule),
            "cancel_visit" => keyed(&mut st, "cancellation", key, args, cancel),
            "send_notification" => keyed(&mut st, "notification", key, args, notify),
            "lookup_notification_by_key" => lookup(&st, "notification", args),
            "draft_invoice" => keyed(&mut st, "invoice", key, args, draft_invoice),
            "lookup_invoice_by_key" => lookup(&st, "invoice", args),
            "list_invoices" => {
                let status = opt_str(args, "status");
                let list: Vec<&Value> = st
                    .invoices
                    .iter()
                    .filter(|i| status.is_none_or(|s| i["status"] == s))
                    .collect();
                Ok(Reply::read(ok(json!({"invoices": list}))))
            }
            other => Err(refuse(format!("unknown tool '{other}'"))),
        };
        outcome.unwrap_or_else(|r| Reply::read(r.into()))
    }
}

fn keyed(
    st: &mut State,
    kind: &'static str,
    key: Option<&str>,
    args: &JsonObject,
    op: fn(&mut State, &JsonObject) -> Result<Value, Refusal>,
) -> Outcome {
    if let Some(replay) = st.ledger.replay(kind, key, args) {
        return replay;
    }
    let result = op(st, args)?;
    st.ledger.store(kind, key, args, &result);
    Ok(Reply::committed(ok(result)))
}

fn lookup(st: &State, kind: &str, args: &JsonObject) -> Outcome {
    let key = str_arg(args, "idempotency_key")?;
    Ok(Reply::read(ok(st.ledger.lookup(kind, key))))
}

fn lookup_customer(st: &State, args: &JsonObject) -> Outcome {
    let id = str_arg(args, "customer_id")?;
    let c = st
        .customers
        .get(id)
        .ok_or_else(|| refuse(format!("no customer '{id}'")))?;
    let sites: Vec<Value> = st
        .sites
        .values()
        .filter(|s| s.customer_id == id)
        .map(|s| json!({"site_id": s.id, "address": s.address}))
        .collect();
    Ok(Reply::read(ok(json!({
        "customer_id": c.id,
        "name": c.name,
        "contact": {"name": c.contact, "email": c.email, "phone": c.phone},
        "sites": sites,
    }))))
}

fn work_order_json(st: &State, w: &WorkOrder) -> Value {
    let site = &st.sites[w.site_id];
    json!({
        "work_order_id": w.id,
        "site_id": w.site_id,
        "customer_id": site.customer_id,
        "address": site.address,
        "status": w.status,
        "priority": w.priority,
        "summary": w.summary,
        "assigned_to": w.assigned_to,
    })
}

fn list_open(st: &State, args: &JsonObject) -> CallToolResult {
    let list: Vec<Value> = st
        .work_orders
        .values()
        .filter(|w| w.status != "closed")
        .filter(|w| opt_str(args, "site_id").is_none_or(|s| s == w.site_id))
        .filter(|w| {
            opt_str(args, "customer_id").is_none_or(|c| st.sites[w.site_id].customer_id == c)
        })
        .filter(|w| opt_str(args, "priority").is_none_or(|p| p == w.priority))
        .map(|w| work_order_json(st, w))
        .collect();
    ok(json!({"work_orders": list}))
}

fn list_technicians(st: &State, args: &JsonObject) -> CallToolResult {
    let list: Vec<Value> = st
        .technicians
        .values()
        .filter(|t| opt_str(args, "skill").is_none_or(|s| t.skills.contains(&s)))
        .map(|t| {
            let visits: Vec<&Value> = st
                .visits
                .iter()
                .filter(|((tech, _, _), _)| tech == t.id)
                .map(|(_, v)| v)
                .collect();
            json!({"technician_id": t.id, "name": t.name, "skills": t.skills, "visits": visits})
        })
        .collect();
    ok(json!({"technicians": list}))
}

fn slot(args: &JsonObject) -> Result<(String, String, String, String), Refusal> {
    Ok((
        str_arg(args, "work_order_id")?.to_string(),
        str_arg(args, "technician_id")?.to_string(),
        str_arg(args, "date")?.to_string(),
        str_arg(args, "window")?.to_string(),
    ))
}

fn schedule(st: &mut State, args: &JsonObject) -> Result<Value, Refusal> {
    let (wo, tech, date, window) = slot(args)?;
    let w = st
        .work_orders
        .get(wo.as_str())
        .ok_or_else(|| refuse(format!("no work order '{wo}'")))?;
    if w.status == "closed" {
        return Err(refuse(format!("work order '{wo}' is closed")));
    }
    if !st.technicians.contains_key(tech.as_str()) {
        return Err(refuse(format!("no technician '{tech}'")));
    }
    let at = (tech.clone(), date.clone(), window.clone());
    if let Some(v) = st.visits.get(&at) {
        return Err(refuse(format!(
            "{tech} is already booked on {date} ({window}) for {}",
            v["work_order_id"].as_str().unwrap_or("another work order")
        )));
    }
    st.visit_seq += 1;
    let visit = json!({
        "visit_id": format!("visit-{:03}", st.visit_seq),
        "work_order_id": wo,
        "technician_id": tech,
        "date": date,
        "window": window,
        "status": "booked",
    });
    st.visits.insert(at, visit.clone());
    Ok(visit)
}

fn cancel(st: &mut State, args: &JsonObject) -> Result<Value, Refusal> {
    let (wo, tech, date, window) = slot(args)?;
    let at = (tech.clone(), date.clone(), window.clone());
    match st.visits.get(&at) {
        Some(v) if v["work_order_id"] == wo.as_str() => {
            let mut v = st.visits.remove(&at).expect("present");
            v["status"] = json!("cancelled");
            Ok(v)
        }
        _ => Err(refuse(format!(
            "no visit of {tech} on {date} ({window}) for {wo}"
        ))),
    }
}

fn notify(st: &mut State, args: &JsonObject) -> Result<Value, Refusal> {
    let customer = str_arg(args, "customer_id")?;
    let wo = str_arg(args, "work_order_id")?;
    let channel = str_arg(args, "channel")?;
    let template = str_arg(args, "template")?;
    let c = st
        .customers
        .get(customer)
        .ok_or_else(|| refuse(format!("no customer '{customer}'")))?;
    let belongs = st
        .work_orders
        .get(wo)
        .is_some_and(|w| st.sites[w.site_id].customer_id == customer);
    if !belongs {
        return Err(refuse(format!(
            "work order '{wo}' is not at a site of '{customer}'"
        )));
    }
    let to = if channel == "sms" { c.phone } else { c.email };
    let n = st.notifications.len() + 1;
    let message = json!({
        "notification_id": format!("ntf-{n:04}"),
        "customer_id": customer,
        "work_order_id": wo,
        "channel": channel,
        "template": template,
        "to": to,
        "status": "sent",
    });
    st.notifications.push(message.clone());
    Ok(message)
}

fn draft_invoice(st: &mut State, args: &JsonObject) -> Result<Value, Refusal> {
    let wo = str_arg(args, "work_order_id")?;
    let description = str_arg(args, "description")?;
    let amount = args
        .get("amount")
        .and_then(Value::as_f64)
        .ok_or_else(|| refuse("missing or non-numeric argument 'amount'"))?;
    let w = st
        .work_orders
        .get(wo)
        .ok_or_else(|| refuse(format!("no work order '{wo}'")))?;
    let customer = st.sites[w.site_id].customer_id;
    let n = st.invoices.len() + 1;
    let invoice = json!({
        "invoice_id": format!("inv-{n:03}"),
        "work_order_id": wo,
        "customer_id": customer,
        "amount": amount,
        "currency": "GBP",
        "status": "draft",
        "description": description,
    });
    st.invoices.push(invoice.clone());
    Ok(invoice)
}
