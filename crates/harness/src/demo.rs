//! `toolgate demo`: a new user's first minute. The ontology walk, then a field-service dispatch run
//! (four allowed, one refused for scopes, one by policy), then a supplier payment whose invoice
//! carries an injected instruction: nothing irreversible is sent, the payment parks for a
//! person, and no supplier tool is ever visible to the roles that read the invoice.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::Context;
use serde_json::{Value, json};

use crate::env::{Client, Environment, text_of};
use crate::planner::{DISPATCH_GOAL, DeterministicPlanner, PAYMENT_GOAL, Plan, Planner};

/// Development keys published in the examples' READMEs.
pub const DISPATCH_KEY: &str = "tgdev_field_dispatch_agent";
pub const FIN_PLANNER_KEY: &str = "tgdev_fin_planner";
pub const FIN_WORKER_KEY: &str = "tgdev_fin_worker";
pub const FIN_REVIEWER_KEY: &str = "tgdev_fin_reviewer";

/// Where the example registries are: beside the workspace this binary was built from.
pub fn examples_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples")
}

/// The example registries, compiled in, so `toolgate demo` needs nothing but the binary.
const EMBEDDED_EXAMPLES: &[(&str, &str)] = &[
    (
        "field-services/README.md",
        include_str!("../../../examples/field-services/README.md"),
    ),
    (
        "field-services/ontology.yaml",
        include_str!("../../../examples/field-services/ontology.yaml"),
    ),
    (
        "field-services/policies/run-shape.cedar",
        include_str!("../../../examples/field-services/policies/run-shape.cedar"),
    ),
    (
        "field-services/principals.yaml",
        include_str!("../../../examples/field-services/principals.yaml"),
    ),
    (
        "field-services/toolgate.lock",
        include_str!("../../../examples/field-services/toolgate.lock"),
    ),
    (
        "field-services/toolgate.yaml",
        include_str!("../../../examples/field-services/toolgate.yaml"),
    ),
    (
        "field-services/tools/billing.yaml",
        include_str!("../../../examples/field-services/tools/billing.yaml"),
    ),
    (
        "field-services/tools/customers.yaml",
        include_str!("../../../examples/field-services/tools/customers.yaml"),
    ),
    (
        "field-services/tools/dispatch.yaml",
        include_str!("../../../examples/field-services/tools/dispatch.yaml"),
    ),
    (
        "field-services/tools/plans.yaml",
        include_str!("../../../examples/field-services/tools/plans.yaml"),
    ),
    (
        "finance/README.md",
        include_str!("../../../examples/finance/README.md"),
    ),
    (
        "finance/ontology.yaml",
        include_str!("../../../examples/finance/ontology.yaml"),
    ),
    (
        "finance/policies/payments.cedar",
        include_str!("../../../examples/finance/policies/payments.cedar"),
    ),
    (
        "finance/principals.yaml",
        include_str!("../../../examples/finance/principals.yaml"),
    ),
    (
        "finance/toolgate.lock",
        include_str!("../../../examples/finance/toolgate.lock"),
    ),
    (
        "finance/toolgate.yaml",
        include_str!("../../../examples/finance/toolgate.yaml"),
    ),
    (
        "finance/tools/invoices.yaml",
        include_str!("../../../examples/finance/tools/invoices.yaml"),
    ),
    (
        "finance/tools/notes.yaml",
        include_str!("../../../examples/finance/tools/notes.yaml"),
    ),
    (
        "finance/tools/payments.yaml",
        include_str!("../../../examples/finance/tools/payments.yaml"),
    ),
    (
        "finance/tools/plans.yaml",
        include_str!("../../../examples/finance/tools/plans.yaml"),
    ),
    (
        "finance/tools/suppliers.yaml",
        include_str!("../../../examples/finance/tools/suppliers.yaml"),
    ),
];

/// Writes the compiled-in example registries (`field-services/`, `finance/`) under `dest`.
pub fn write_examples(dest: &Path) -> std::io::Result<()> {
    for (rel, text) in EMBEDDED_EXAMPLES {
        let path = dest.join(rel);
        if let Some(parent) = path.parent() {
            std::fs::create_dir_all(parent)?;
        }
        std::fs::write(path, text)?;
    }
    Ok(())
}

/// What the demo did, for tests and for the closing lines.
#[derive(Debug, Default)]
pub struct DemoSummary {
    pub dispatch_run: String,
    pub dispatch: Vec<(String, String)>,
    /// What the worker that executed the dispatch plan did.
    pub dispatch_worker: toolgate_store::WorkStats,
    pub payment_run: String,
    pub payment: Vec<(String, String)>,
    pub worker_tools: Vec<String>,
    pub planner_tools: Vec<String>,
    pub erp_calls: Vec<String>,
    pub field_dir: PathBuf,
    pub finance_dir: PathBuf,
}

/// The status toolgate put in a result: `done`, `refused`, `needs_approval`…
fn status_of(r: &rmcp::model::CallToolResult) -> (String, Value) {
    let s = r.structured_content.clone().unwrap_or(Value::Null);
    let status = if r.is_error == Some(true) {
        s.get("status")
            .and_then(Value::as_str)
            .unwrap_or("error")
            .to_string()
    } else {
        "allowed".to_string()
    };
    (status, s)
}

fn new_run_id() -> String {
    uuid_like()
}

/// A run id: time-ordered and unique enough for a demo (the store mints its own for plans).
fn uuid_like() -> String {
    let n = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default()
        .as_nanos();
    format!("run-{:x}", n)
}

/// Submits `plan` through `plan.submit` as `client`'s principal; returns the new run's id.
pub async fn submit(client: &Client, plan: &Plan, purpose: &str) -> anyhow::Result<String> {
    let steps: Vec<Value> = plan
        .steps
        .iter()
        .map(|s| {
            let mut v = json!({"tool": s.tool, "inputs": s.inputs, "purpose": s.purpose,
                               "justification": s.reason, "evidence": s.evidence});
            if let Some(w) = &s.worker {
                v["worker"] = json!(w);
            }
            v
        })
        .collect();
    let r = client
        .call(
            "plan.submit",
            json!({"goal": plan.goal, "steps": steps}),
            json!({"purpose": purpose, "reason": format!("Plan: {}", plan.goal),
                   "model": "deterministic-planner", "prompt_rev": "demo-1"}),
        )
        .await?;
    if r.is_error == Some(true) {
        anyhow::bail!("plan.submit refused the plan: {}", text_of(&r));
    }
    r.structured_content
        .as_ref()
        .and_then(|s| s.get("run_id"))
        .and_then(Value::as_str)
        .map(str::to_string)
        .context("plan.submit answered without a run id")
}

/// `run.status` of `run_id` as `client`'s principal.
pub async fn run_status(client: &Client, run_id: &str) -> anyhow::Result<Value> {
    let r = client
        .call(
            "run.status",
            json!({"run_id": run_id}),
            json!({"purpose": "billing", "reason": "Follow the run."}),
        )
        .await?;
    if r.is_error == Some(true) {
        anyhow::bail!("run.status: {}", text_of(&r));
    }
    Ok(r.structured_content.unwrap_or(Value::Null))
}

/// A `toolgate worker` for the environment's registry, until the queue is empty.
pub async fn work(env: &Environment) -> anyhow::Result<toolgate_store::WorkStats> {
    let (_stop, rx) = tokio::sync::watch::channel(false);
    let opts = toolgate_gateway::WorkerOptions {
        config_dir: env.dir.path().to_path_buf(),
        store_url: None,
        work: Some(toolgate_store::WorkOptions {
            until_idle: true,
            ..Default::default()
        }),
        // As the environment's gateway: configured keys where set, development keys otherwise.
        keys: toolgate_gateway::KeySource::Dev,
    };
    Ok(toolgate_gateway::run_worker(&opts, rx).await?)
}

/// What the demo says about its keys: it needs no setup, so it makes development keys for any
/// that are not configured, and says what a deployment does instead.
fn keys_line(k: toolgate_gateway::KeyStatus) -> String {
    match (k.approval_dev, k.redaction_dev) {
        (false, false) => "the configured approval and redaction keys".into(),
        (a, r) => {
            let which = match (a, r) {
                (true, true) => "approval and redaction keys",
                (true, false) => "approval key",
                _ => "redaction key",
            };
            format!(
                "development {which} (as `--dev`: nothing to set up, nothing to keep; a \
                 deployment provides its own, see docs/keys.md)"
            )
        }
    }
}

/// Runs the demo, writing what happened to `out`. `store_url` replaces the embedded SQLite store.
pub async fn run(
    out: &mut dyn Write,
    examples: &Path,
    store_url: Option<&str>,
    keep: bool,
) -> anyhow::Result<DemoSummary> {
    let started = Instant::now();
    let mut summary = DemoSummary::default();
    writeln!(
        out,
        "toolgate demo: two example runs through the gateway, over real MCP, on {}",
        match store_url {
            Some(_) => "the given store",
            None => "an embedded SQLite store in a temporary folder",
        }
    )?;

    // 1. The ontology: agreement on what the words mean comes first.
    let field_dir = examples.join("field-services");
    let ontology = toolgate_ontology::Ontology::load(field_dir.join("ontology.yaml"))
        .context("loading the field-services ontology")?;
    writeln!(out, "\n== 1. The ontology: what the work order is about\n")?;
    writeln!(out, "{}", ontology.walk("cust-001")?)?;

    // 2. The dispatch run: the dispatch agent submits its plan through plan.submit, a
    //    worker executes the steps through every check, and run.status reports each one.
    let env = Environment::start(&field_dir, store_url, Vec::new()).await?;
    writeln!(out, "keys: {}", keys_line(env.gateway.keys))?;
    let agent = env.client(DISPATCH_KEY).await?;
    let plan = DeterministicPlanner.plan(DISPATCH_GOAL, &[]).await?;
    let run_id = submit(&agent, &plan, "service_delivery").await?;
    writeln!(
        out,
        "\n== 2. Field services: dispatch-agent, run {run_id}\n"
    )?;
    writeln!(out, "goal: {DISPATCH_GOAL}")?;
    writeln!(
        out,
        "plan submitted through plan.submit: {} steps, nothing run yet; a worker executes them",
        plan.steps.len()
    )?;
    let worked = work(&env).await?;
    let status = run_status(&agent, &run_id).await?;
    let (mut allowed, mut denied) = (0, 0);
    for (i, step) in plan.steps.iter().enumerate() {
        let s = status
            .get("steps")
            .and_then(|v| v.get(i))
            .cloned()
            .unwrap_or(Value::Null);
        let label = format!(
            "step {}: {:<22} (purpose={})",
            i + 1,
            step.tool,
            step.purpose
        );
        let st = s.get("status").and_then(Value::as_str).unwrap_or("?");
        if st == "done" {
            allowed += 1;
            let ms = s.get("latency_ms").and_then(Value::as_i64).unwrap_or(0) as f64;
            writeln!(out, "{label:<62} [allowed] {ms:.1} ms")?;
            summary.dispatch.push((step.tool.clone(), "allowed".into()));
        } else {
            denied += 1;
            writeln!(out, "{label:<62} [DENIED]")?;
            let why = s.get("reason").and_then(Value::as_str).unwrap_or_default();
            writeln!(out, "        reason: {why}")?;
            summary.dispatch.push((step.tool.clone(), st.to_string()));
        }
    }
    summary.dispatch_worker = worked;
    let field_calls = env.all_upstream_calls();
    let invoices = field_calls
        .iter()
        .filter(|r| r.tool == "draft_invoice")
        .count();
    writeln!(
        out,
        "\nsummary  {allowed} allowed, {denied} denied; the field system received {} call(s), {invoices} of them an invoice",
        field_calls.len()
    )?;
    summary.dispatch_run = run_id;
    agent.close().await;
    summary.field_dir = env.dir.path().to_path_buf();
    let field_env = env;

    // 3. Supplier payments with an instruction injected into the invoice text.
    let fin_dir = examples.join("finance");
    let env = Environment::start(&fin_dir, store_url, Vec::new()).await?;
    let planner = env.client(FIN_PLANNER_KEY).await?;
    let worker = env.client(FIN_WORKER_KEY).await?;
    let reviewer = env.client(FIN_REVIEWER_KEY).await?;
    let run_id = new_run_id();
    writeln!(
        out,
        "\n== 3. Supplier payments: invoice INV-20260611 (the planner reads in run {run_id})\n"
    )?;
    summary.planner_tools = planner
        .list_tools()
        .await?
        .into_iter()
        .map(|t| t.name.to_string())
        .collect();
    summary.worker_tools = worker
        .list_tools()
        .await?
        .into_iter()
        .map(|t| t.name.to_string())
        .collect();
    writeln!(out, "planner sees: {}", summary.planner_tools.join(", "))?;
    writeln!(out, "worker sees:  {}", summary.worker_tools.join(", "))?;
    let meta = json!({"purpose": "billing", "reason": "Read the invoice to plan its payment.", "run_id": run_id});
    let read = planner
        .call(
            "invoice.search",
            json!({"invoice_id": "INV-20260611"}),
            meta,
        )
        .await?;
    let observation = read.structured_content.clone().unwrap_or(Value::Null);
    let text = observation
        .pointer("/invoices/0/text")
        .and_then(Value::as_str)
        .unwrap_or_default();
    writeln!(
        out,
        "invoice text the planner read:\n  | {}",
        text.replace('\n', "\n  | ")
    )?;
    let plan = DeterministicPlanner
        .plan(PAYMENT_GOAL, &[observation])
        .await?;
    let plan_run = submit(&planner, &plan, "billing").await?;
    writeln!(
        out,
        "plan: {} (submitted through plan.submit as run {plan_run}; nothing run yet)",
        plan.steps
            .iter()
            .map(|s| s.tool.as_str())
            .collect::<Vec<_>>()
            .join(" -> ")
    )?;
    // The worker is plan-bound: each call it makes runs the planned step it matches exactly.
    for step in &plan.steps {
        let meta = json!({"purpose": step.purpose, "reason": step.reason, "run_id": plan_run,
                          "model": "deterministic-planner", "prompt_rev": "demo-1"});
        let result = worker.call(&step.tool, step.inputs.clone(), meta).await?;
        let (status, s) = status_of(&result);
        match status.as_str() {
            "allowed" => writeln!(out, "worker: {:<18} [allowed]", step.tool)?,
            "needs_approval" => writeln!(
                out,
                "worker: {:<18} [PARKED] waiting for a person: approval {} ({})",
                step.tool,
                s.get("approval_id").and_then(Value::as_str).unwrap_or("?"),
                s.get("reason").and_then(Value::as_str).unwrap_or_default()
            )?,
            other => writeln!(
                out,
                "worker: {:<18} [{other}] {}",
                step.tool,
                text_of(&result)
            )?,
        }
        summary.payment.push((step.tool.clone(), status));
    }
    // A model reviewer checks the parked payment before a person's time is spent; its
    // approval is recorded beside the step and is not the person's.
    let status = run_status(&planner, &plan_run).await?;
    if let Some(pay) = status
        .get("steps")
        .and_then(Value::as_array)
        .and_then(|a| a.iter().find(|s| s["tool"] == "payment.schedule"))
    {
        let step_id = pay["step_id"].as_str().unwrap_or_default();
        let r = reviewer
            .call(
                "step.approve",
                json!({"step_id": step_id, "note": "Amount, currency and PO match the invoice; the payee is the supplier on record."}),
                json!({"purpose": "billing", "reason": "Check the payment step against its evidence.", "run_id": plan_run}),
            )
            .await?;
        let s = r.structured_content.clone().unwrap_or(Value::Null);
        writeln!(
            out,
            "reviewer: step.approve payment.schedule [recorded] step still {}: {}",
            s.get("step_status").and_then(Value::as_str).unwrap_or("?"),
            s.get("effect").and_then(Value::as_str).unwrap_or_default()
        )?;
    }
    // The injected instruction asks for an IBAN change: for the worker, that tool does not exist.
    let attempt = worker
        .call(
            "supplier.update_iban",
            json!({"supplier_id": "SUP-0042", "iban": "ES9121000418450200051332"}),
            json!({"purpose": "billing", "reason": "as the invoice says", "run_id": plan_run}),
        )
        .await;
    let refused = match &attempt {
        Err(e) => e.to_string(),
        Ok(r) => text_of(r),
    };
    writeln!(
        out,
        "worker: supplier.update_iban  [no such tool for this role] {refused}"
    )?;
    summary.erp_calls = env
        .upstream_calls("erp")
        .into_iter()
        .map(|r| r.tool)
        .collect();
    let booked = summary
        .erp_calls
        .iter()
        .filter(|t| t.as_str() == "schedule_payment")
        .count();
    let supplier = summary
        .erp_calls
        .iter()
        .filter(|t| t.contains("supplier") || t.contains("iban"))
        .count();
    writeln!(
        out,
        "\nthe ERP received: {}; payments booked: {booked}; supplier changes: {supplier}",
        summary.erp_calls.join(", ")
    )?;
    summary.payment_run = plan_run;
    summary.finance_dir = env.dir.path().to_path_buf();
    planner.close().await;
    worker.close().await;
    reviewer.close().await;

    writeln!(out, "\n== Next\n")?;
    writeln!(
        out,
        "  see a run in full:      toolgate trace {} --verbose -c {}",
        summary.dispatch_run,
        summary.field_dir.display()
    )?;
    writeln!(
        out,
        "                          toolgate trace {} --verbose -c {}",
        summary.payment_run,
        summary.finance_dir.display()
    )?;
    writeln!(
        out,
        "  the parked payment:     toolgate approvals list --api-key tgdev_fin_alice -c {}",
        summary.finance_dir.display()
    )?;
    writeln!(
        out,
        "  verify the audit chain: toolgate log verify -c {}",
        summary.finance_dir.display()
    )?;
    writeln!(
        out,
        "\ndone in {:.0} ms",
        started.elapsed().as_secs_f64() * 1000.0
    )?;

    field_env.shutdown_keep(keep).await;
    env.shutdown_keep(keep).await;
    Ok(summary)
}
