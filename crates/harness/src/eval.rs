//! `toolgate eval DIR`: YAML fixtures that script runs against an example registry and assert
//! what was allowed, refused or parked and why, what budgets were used, what reached the
//! upstream systems and what the audit log holds. Each fixture gets its own environment (fakes,
//! store, gateway), so fixtures never see each other's state.

use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Path, PathBuf};

use anyhow::{Context, bail};
use serde::Deserialize;
use serde_json::{Value, json};
use toolgate_core::Tier;
use toolgate_core::registry::api_key_hash;

use crate::env::{Client, Environment, text_of};

/// One fixture file.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Fixture {
    pub name: String,
    #[serde(default)]
    pub description: Option<String>,
    /// The registry folder, relative to the fixture file.
    pub registry: String,
    /// Principals added to the registry for this fixture (same shape as in principals.yaml).
    #[serde(default)]
    pub add_principals: Vec<Value>,
    /// The principal calling, unless a step says otherwise.
    #[serde(default)]
    pub principal: Option<String>,
    /// Who submits the plan a plan-bound principal's steps belong to (default: the first
    /// principal whose role lists `plan.submit`).
    #[serde(default)]
    pub planner: Option<String>,
    /// A goal for the planner: after the steps (the planner's reads, whose structured results
    /// are its observations), the planner (`TOOLGATE_PLANNER`, deterministic by default) plans
    /// it, submits the plan through `plan.submit`, a worker executes it, and `plan_expect` is
    /// checked against `run.status`.
    #[serde(default)]
    pub goal: Option<String>,
    /// What each step of the goal's plan must come to, in order.
    #[serde(default)]
    pub plan_expect: Vec<PlanStepExpect>,
    #[serde(default)]
    pub steps: Vec<Step>,
    #[serde(default)]
    pub expect: Expect,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Step {
    #[serde(default, rename = "as")]
    pub principal: Option<String>,
    /// A label for the run the step belongs to (steps with the same label share a run).
    #[serde(default = "first_run")]
    pub run: String,
    pub tool: String,
    #[serde(default)]
    pub purpose: Option<String>,
    #[serde(default)]
    pub reason: Option<String>,
    #[serde(default = "empty_object")]
    pub inputs: Value,
    /// Make the same call this many times.
    #[serde(default = "one")]
    pub repeat: u32,
    /// A plan-bound principal's call that is not in the plan (an improvisation): it is left out
    /// of the plan submitted for its run and made directly.
    #[serde(default)]
    pub unplanned: bool,
    /// People who approve the call if it is parked; it is then made again with the same inputs,
    /// and the expectation is about that second call (both count in the totals).
    #[serde(default)]
    pub approve: Vec<String>,
    #[serde(default)]
    pub expect: Option<StepExpect>,
}

fn first_run() -> String {
    "1".into()
}
fn empty_object() -> Value {
    json!({})
}
fn one() -> u32 {
    1
}

/// What one step of a planned goal must come to.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PlanStepExpect {
    pub tool: String,
    /// The step's status in `run.status`: `done`, `refused`, `needs_approval`…
    pub status: String,
    #[serde(default)]
    pub rule: Option<String>,
}

/// What one step must come to.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StepExpect {
    /// `allowed`, `denied`, `needs_approval`, `unknown_tool` (the protocol answer), or
    /// `inputs_differ` / `in_progress`.
    pub decision: String,
    /// A keyword the refusal's reason must contain.
    #[serde(default)]
    pub reason: Option<String>,
    /// The rule that decided.
    #[serde(default)]
    pub rule: Option<String>,
}

/// What the whole fixture must come to.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Expect {
    #[serde(default)]
    pub allowed: Option<usize>,
    #[serde(default)]
    pub denied: Option<usize>,
    #[serde(default)]
    pub needs_approval: Option<usize>,
    /// Deliveries per upstream tool name (the fake's names, e.g. `schedule_payment`).
    #[serde(default)]
    pub upstream_calls: BTreeMap<String, usize>,
    /// Today's budget use per principal and tier.
    #[serde(default)]
    pub budgets: BTreeMap<String, BTreeMap<Tier, i64>>,
    /// Audit records written by the fixture's runs.
    #[serde(default)]
    pub audit_records: Option<usize>,
    /// Tools that must not be in a principal's `tools/list`.
    #[serde(default)]
    pub not_listed: BTreeMap<String, Vec<String>>,
}

/// The key the eval gives each principal of the fixture's registry.
pub fn eval_key(principal: &str) -> String {
    format!("tgeval_{principal}")
}

/// Adds an eval credential to every principal, and the fixture's extra principals.
fn prepare(dir: &Path, extra: &[Value]) -> anyhow::Result<()> {
    let path = dir.join("principals.yaml");
    let mut doc: Value = yaml_serde::from_str(&std::fs::read_to_string(&path)?)?;
    let list = doc
        .get_mut("principals")
        .and_then(Value::as_array_mut)
        .context("principals.yaml has no principals list")?;
    list.extend(extra.iter().cloned());
    for p in list.iter_mut() {
        let id = p
            .get("id")
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_string();
        let cred = json!({"id": "eval", "sha256": api_key_hash(&eval_key(&id))});
        match p.get_mut("credentials").and_then(Value::as_array_mut) {
            Some(c) => c.push(cred),
            None => p["credentials"] = json!([cred]),
        }
    }
    std::fs::write(&path, yaml_serde::to_string(&doc)?)?;
    Ok(())
}

/// How a call came out, as the client sees it.
fn classify(result: &anyhow::Result<rmcp::model::CallToolResult>) -> (String, String, String) {
    match result {
        Err(e) => ("unknown_tool".into(), e.to_string(), "tool.unknown".into()),
        Ok(r) if r.is_error != Some(true) => ("allowed".into(), String::new(), String::new()),
        Ok(r) => {
            let s = r.structured_content.clone().unwrap_or(Value::Null);
            let status = match s.get("status").and_then(Value::as_str) {
                Some("refused") => "denied",
                Some(other) => other,
                None => "error",
            };
            let reason = s
                .get("reason")
                .and_then(Value::as_str)
                .map(str::to_string)
                .unwrap_or_else(|| text_of(r));
            let rule = s.get("rule").and_then(Value::as_str).unwrap_or_default();
            (status.to_string(), reason, rule.to_string())
        }
    }
}

/// The people named approve the request a parked call is waiting on, as in the approver's page.
async fn approve(
    env: &Environment,
    parked: &anyhow::Result<rmcp::model::CallToolResult>,
    people: &[String],
) -> anyhow::Result<()> {
    let id = parked
        .as_ref()
        .ok()
        .and_then(|r| r.structured_content.as_ref())
        .and_then(|s| s.get("approval_id"))
        .and_then(Value::as_str)
        .context("a parked call names its approval request")?;
    let surface = env.gateway.state.surface();
    let now = toolgate_core::Clock::now(&toolgate_core::SystemClock);
    for who in people {
        env.store()
            .approve(
                &surface.registry,
                &surface.executor.keys,
                &id.into(),
                &toolgate_core::PrincipalId::from(who),
                now,
            )
            .await
            .with_context(|| format!("{who} approving {id}"))?;
    }
    Ok(())
}

/// The fixture's planner, or the first principal whose role lists `plan.submit`.
fn planner_of(registry: &toolgate_core::Registry, fx: &Fixture) -> anyhow::Result<String> {
    if let Some(p) = &fx.planner {
        return Ok(p.clone());
    }
    registry
        .principals()
        .iter()
        .find(|p| {
            registry
                .tools_for_role(p.role())
                .any(|t| t.builtin() == Some(toolgate_core::Builtin::PlanSubmit))
        })
        .map(|p| p.id().to_string())
        .context("a plan needs a planner: no principal's role lists plan.submit")
}

/// Plans `goal` from the observations, submits the plan as the planner, lets a worker execute
/// it, and returns the run and each step's (tool, status, rule) from `run.status`.
async fn plan_goal(
    env: &Environment,
    fx: &Fixture,
    goal: &str,
    observations: &[Value],
    clients: &mut BTreeMap<String, Client>,
) -> anyhow::Result<(String, Vec<(String, String, String)>)> {
    let registry = toolgate_core::Registry::load(env.dir.path())?;
    let planner = planner_of(&registry, fx)?;
    if !clients.contains_key(&planner) {
        clients.insert(planner.clone(), env.client(&eval_key(&planner)).await?);
    }
    let catalogue = registry
        .tools()
        .iter()
        .filter(|t| t.builtin().is_none())
        .map(|t| crate::planner::ToolSummary {
            name: t.name().to_string(),
            description: t.config.description.clone(),
            input_schema: t.config.input_schema.clone(),
            worker: None,
        })
        .collect();
    let plan = crate::planner::PlannerConfig::from_env()?
        .build(catalogue)?
        .plan(goal, observations)
        .await?;
    let purpose = plan
        .steps
        .first()
        .map(|s| s.purpose.clone())
        .unwrap_or_default();
    let client = &clients[&planner];
    let run = crate::demo::submit(client, &plan, &purpose).await?;
    crate::demo::work(env).await?;
    let st = crate::demo::run_status(client, &run).await?;
    let text = |v: &Value| v.as_str().unwrap_or_default().to_string();
    let outcomes = st["steps"]
        .as_array()
        .map(|a| {
            a.iter()
                .map(|s| (text(&s["tool"]), text(&s["status"]), text(&s["rule"])))
                .collect()
        })
        .unwrap_or_default();
    Ok((run, outcomes))
}

/// Submits, per run label, the steps of plan-bound principals (each once) as one plan, and
/// names that label's run after the plan's run. A step the plan cannot hold (its inputs fail
/// the tool's schema, say) is left out, and `plan.submit`'s refusal is that step's answer.
async fn submit_plans(
    env: &Environment,
    fx: &Fixture,
    nonce: u128,
    clients: &mut BTreeMap<String, Client>,
    runs: &mut BTreeMap<String, String>,
) -> anyhow::Result<BTreeMap<usize, rmcp::model::CallToolResult>> {
    let registry = toolgate_core::Registry::load(env.dir.path())?;
    let bound = |who: &str, tool: &str| registry.is_plan_bound_call(who, tool);
    let mut labels: Vec<&str> = Vec::new();
    let mut planned: BTreeMap<&str, Vec<usize>> = BTreeMap::new();
    for (i, step) in fx.steps.iter().enumerate() {
        let who = step
            .principal
            .as_deref()
            .or(fx.principal.as_deref())
            .unwrap_or_default();
        if bound(who, &step.tool) && !step.unplanned {
            if !labels.contains(&step.run.as_str()) {
                labels.push(&step.run);
            }
            planned.entry(&step.run).or_default().push(i);
        }
    }
    let mut refused = BTreeMap::new();
    if labels.is_empty() {
        return Ok(refused);
    }
    let planner = planner_of(&registry, fx)?;
    if !clients.contains_key(&planner) {
        clients.insert(planner.clone(), env.client(&eval_key(&planner)).await?);
    }
    for label in labels {
        let mut left = planned.remove(label).unwrap_or_default();
        while !left.is_empty() {
            let steps: Vec<Value> = left
                .iter()
                .map(|&i| {
                    let s = &fx.steps[i];
                    let who = s.principal.as_deref().or(fx.principal.as_deref()).unwrap_or_default();
                    json!({"tool": s.tool, "inputs": s.inputs, "worker": who,
                           "purpose": s.purpose.clone().unwrap_or_default(),
                           "justification": s.reason.clone().unwrap_or_else(|| format!("eval step {}", i + 1))})
                })
                .collect();
            let purpose = fx.steps[left[0]].purpose.clone().unwrap_or_default();
            let meta = json!({"purpose": purpose, "reason": format!("Plan run {label} of {}", fx.name),
                              "run_id": format!("eval-{nonce:x}-{label}-plan"), "model": "eval", "prompt_rev": fx.name});
            let r = clients[&planner]
                .call(
                    "plan.submit",
                    json!({"goal": fx.name, "steps": steps}),
                    meta,
                )
                .await?;
            let facts = r.structured_content.clone().unwrap_or(Value::Null);
            if r.is_error != Some(true) {
                let run = facts["run_id"]
                    .as_str()
                    .context("plan.submit named no run")?;
                runs.insert(label.to_string(), run.to_string());
                break;
            }
            // The refusal names the step; that step gets it as its answer, the rest are resubmitted.
            let n = facts["step"]
                .as_u64()
                .with_context(|| format!("plan.submit refused the plan: {}", text_of(&r)))?;
            let i = left.remove(n as usize - 1);
            refused.insert(i, r);
        }
    }
    Ok(refused)
}

/// The outcome of one fixture: the failures found (empty means it passed).
#[derive(Debug)]
pub struct FixtureReport {
    pub file: PathBuf,
    pub name: String,
    pub steps: usize,
    pub failures: Vec<String>,
}

/// Runs one fixture file.
pub async fn run_fixture(file: &Path, store_url: Option<&str>) -> anyhow::Result<FixtureReport> {
    let text = std::fs::read_to_string(file)?;
    let fx: Fixture = toolgate_core::registry::parse_yaml(&file.display().to_string(), &text)?;
    let registry = file.parent().unwrap_or(Path::new(".")).join(&fx.registry);
    let env = Environment::start_with(&registry, store_url, Vec::new(), |d| {
        prepare(d, &fx.add_principals)
    })
    .await
    .with_context(|| format!("{}: starting {}", file.display(), registry.display()))?;
    let mut failures = Vec::new();
    let mut clients = BTreeMap::new();
    let mut runs: BTreeMap<String, String> = BTreeMap::new();
    let (mut allowed, mut denied, mut parked, mut steps) = (0, 0, 0, 0);
    let nonce = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default()
        .as_nanos();
    // A plan-bound principal makes no direct calls: its steps of each run are submitted as one
    // plan through plan.submit first, and its calls then run the planned steps they match.
    let presubmitted = submit_plans(&env, &fx, nonce, &mut clients, &mut runs).await?;
    let mut observations: Vec<Value> = Vec::new();
    for (i, step) in fx.steps.iter().enumerate() {
        let who = step
            .principal
            .clone()
            .or_else(|| fx.principal.clone())
            .with_context(|| {
                format!(
                    "step {} names no principal (`as:`) and the fixture has none",
                    i + 1
                )
            })?;
        if !clients.contains_key(&who) {
            clients.insert(who.clone(), env.client(&eval_key(&who)).await?);
        }
        let client = &clients[&who];
        let run_id = runs
            .entry(step.run.clone())
            .or_insert_with(|| format!("eval-{nonce:x}-{}", step.run))
            .clone();
        let mut meta = json!({"run_id": run_id, "model": "eval", "prompt_rev": fx.name});
        if let Some(p) = &step.purpose {
            meta["purpose"] = json!(p);
        }
        if let Some(r) = &step.reason {
            meta["reason"] = json!(r);
        }
        for n in 0..step.repeat {
            steps += 1;
            let mut result = match presubmitted.get(&i) {
                Some(refused) => Ok(refused.clone()),
                None => {
                    client
                        .call(&step.tool, step.inputs.clone(), meta.clone())
                        .await
                }
            };
            if !step.approve.is_empty() && classify(&result).0 == "needs_approval" {
                parked += 1;
                steps += 1;
                approve(&env, &result, &step.approve).await?;
                result = client
                    .call(&step.tool, step.inputs.clone(), meta.clone())
                    .await;
            }
            let (decision, reason, rule) = classify(&result);
            match decision.as_str() {
                "allowed" => allowed += 1,
                "needs_approval" => parked += 1,
                _ => denied += 1,
            }
            if decision == "allowed"
                && fx.goal.is_some()
                && let Ok(r) = &result
                && let Some(seen) = &r.structured_content
            {
                observations.push(seen.clone());
            }
            // A repeated step's expectation is about its last repetition.
            if n + 1 == step.repeat
                && let Some(want) = &step.expect
            {
                let at = format!("step {} ({})", i + 1, step.tool);
                if want.decision != decision {
                    failures.push(format!(
                        "{at}: expected {}, got {decision}: {reason}",
                        want.decision
                    ));
                }
                if let Some(k) = &want.reason
                    && !reason.contains(k.as_str())
                {
                    failures.push(format!("{at}: reason {reason:?} does not contain {k:?}"));
                }
                if let Some(r) = &want.rule
                    && r != &rule
                {
                    failures.push(format!("{at}: expected rule {r}, got {rule:?}"));
                }
            }
        }
    }
    if let Some(goal) = &fx.goal {
        let (run, outcomes) = plan_goal(&env, &fx, goal, &observations, &mut clients).await?;
        for (i, (tool, status, rule)) in outcomes.iter().enumerate() {
            steps += 1;
            match status.as_str() {
                "done" => allowed += 1,
                "needs_approval" => parked += 1,
                _ => denied += 1,
            }
            match fx.plan_expect.get(i) {
                Some(want) if &want.tool != tool || &want.status != status => {
                    failures.push(format!(
                        "plan step {}: expected {} {}, got {tool} {status}",
                        i + 1,
                        want.tool,
                        want.status
                    ))
                }
                Some(want) if want.rule.as_ref().is_some_and(|r| r != rule) => {
                    failures.push(format!(
                        "plan step {} ({tool}): expected rule {:?}, got {rule:?}",
                        i + 1,
                        want.rule
                    ))
                }
                _ => {}
            }
        }
        if fx.plan_expect.len() != outcomes.len() && !fx.plan_expect.is_empty() {
            failures.push(format!(
                "the plan has {} step(s), plan_expect lists {}",
                outcomes.len(),
                fx.plan_expect.len()
            ));
        }
        runs.insert("plan".into(), run);
    }
    let e = &fx.expect;
    for (label, want, got) in [
        ("allowed", e.allowed, allowed),
        ("denied", e.denied, denied),
        ("needs_approval", e.needs_approval, parked),
    ] {
        if let Some(w) = want
            && w != got
        {
            failures.push(format!("expected {w} {label}, got {got}"));
        }
    }
    let calls = env.all_upstream_calls();
    for (tool, want) in &e.upstream_calls {
        let got = calls.iter().filter(|r| &r.tool == tool).count();
        if got != *want {
            failures.push(format!(
                "expected {want} upstream call(s) of {tool}, got {got}"
            ));
        }
    }
    if !e.budgets.is_empty() {
        let now = toolgate_core::Clock::now(&toolgate_core::SystemClock);
        let used = env.store().budget_use(now).await?;
        for (principal, tiers) in &e.budgets {
            for (tier, want) in tiers {
                let got = used
                    .iter()
                    .filter(|u| {
                        &u.principal == principal && u.tier == *tier && u.day == now.utc_day()
                    })
                    .map(|u| u.used)
                    .sum::<i64>();
                if got != *want {
                    failures.push(format!(
                        "expected {principal} to have used {want} {tier} today, got {got}"
                    ));
                }
            }
        }
    }
    if let Some(want) = e.audit_records {
        let mut got = 0;
        for run in runs.values() {
            got += env
                .store()
                .audit_records(None, Some(&run.as_str().into()))
                .await?
                .len();
        }
        if got != want {
            failures.push(format!("expected {want} audit record(s), got {got}"));
        }
    }
    for (principal, tools) in &e.not_listed {
        let client = env.client(&eval_key(principal)).await?;
        let listed: Vec<String> = client
            .list_tools()
            .await?
            .into_iter()
            .map(|t| t.name.to_string())
            .collect();
        for t in tools {
            if listed.contains(t) {
                failures.push(format!("{t} is listed for {principal}"));
            }
        }
        client.close().await;
    }
    for (_, c) in clients {
        c.close().await;
    }
    env.shutdown().await;
    Ok(FixtureReport {
        file: file.to_path_buf(),
        name: fx.name,
        steps,
        failures,
    })
}

/// The fixture files under `dir` (or `dir` itself, if it is a file), sorted.
pub fn fixture_files(dir: &Path) -> anyhow::Result<Vec<PathBuf>> {
    if dir.is_file() {
        return Ok(vec![dir.to_path_buf()]);
    }
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
        .with_context(|| format!("reading {}", dir.display()))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "yaml" || x == "yml"))
        .collect();
    files.sort();
    if files.is_empty() {
        bail!("no fixtures (*.yaml) in {}", dir.display());
    }
    Ok(files)
}

/// Runs every fixture, printing progress and a summary table. Returns whether all passed.
pub async fn run_all(
    dir: &Path,
    store_url: Option<&str>,
    out: &mut dyn Write,
) -> anyhow::Result<bool> {
    let files = fixture_files(dir)?;
    let total = files.len();
    let mut reports = Vec::new();
    for (i, f) in files.iter().enumerate() {
        let name = f
            .file_name()
            .unwrap_or_default()
            .to_string_lossy()
            .to_string();
        write!(out, "[{}/{total}] {name} ... ", i + 1)?;
        out.flush()?;
        let report = match run_fixture(f, store_url).await {
            Ok(r) => r,
            Err(e) => FixtureReport {
                file: f.clone(),
                name: name.clone(),
                steps: 0,
                failures: vec![format!("could not run: {e:#}")],
            },
        };
        writeln!(
            out,
            "{}",
            if report.failures.is_empty() {
                "ok"
            } else {
                "FAILED"
            }
        )?;
        for fail in &report.failures {
            writeln!(out, "    {fail}")?;
        }
        reports.push(report);
    }
    let passed = reports.iter().filter(|r| r.failures.is_empty()).count();
    writeln!(out)?;
    let width = reports
        .iter()
        .map(|r| r.name.len())
        .max()
        .unwrap_or(7)
        .max(7);
    writeln!(out, "{:<width$}  {:>5}  result", "fixture", "calls")?;
    writeln!(out, "{}  -----  ------", "-".repeat(width))?;
    for r in &reports {
        writeln!(
            out,
            "{:<width$}  {:>5}  {}",
            r.name,
            r.steps,
            if r.failures.is_empty() {
                "pass"
            } else {
                "FAIL"
            }
        )?;
    }
    writeln!(out, "\n{passed} passed, {} failed", total - passed)?;
    Ok(passed == total)
}
