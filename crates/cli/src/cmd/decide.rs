//! `toolgate decide`: a dry run of one call, printing every check, so a policy author can see
//! why a call would be allowed, refused or parked, and then each policy of the tool and whether
//! it matched, did not match or errored: a rule that did not fire is as visible as one that
//! did. Nothing is reserved, called or recorded.

use crate::exit::Exit;
use std::collections::HashMap;
use std::io::{Read, Write};
use std::path::PathBuf;

use anyhow::Context;
use serde::Deserialize;
use serde_json::Value;
use toolgate_core::policy::{self, PolicyEffect, PolicyOutcome, PolicyResult};
use toolgate_core::{
    ApprovalKeys, ApprovalToken, BudgetView, CallRequest, Definition, DestinationFacts, Engine,
    IdempotencyState, Outcome, PriorCall, RunHistory, Tier, Timestamp, Verdict,
};

use toolgate_core::registry::{UNPLANNED, unplanned_reason};

use crate::cmd::ConfigArg;
use crate::table::Table;

#[derive(clap::Args, Debug)]
pub struct Args {
    #[command(flatten)]
    pub config: ConfigArg,
    /// A JSON file describing the call (`-` or nothing for stdin):
    /// {"principal", "tool", "purpose", "reason", "inputs", "credential", "run": [{"tool","tier",
    ///  "outcome"}], "budgets": {"<principal>": {"act": n, "spend": n}}, "idempotency",
    ///  "destinations", "approvals": ["tg1…"], "subject", "at_ms", "planned"}. `purpose` and
    /// `reason` are what the call's `_meta` would say; `inputs` are the arguments as an agent
    /// sends them (with any `purpose`/`reason` arguments the tool lists), and the caller's
    /// defaults apply as in `serve` (`credential` names the key, for its default purpose). A
    /// principal whose role is plan-bound is refused (`plan.unplanned`), as `serve` refuses it,
    /// unless `"planned": true` says the call is one of its pending planned steps.
    pub file: Option<PathBuf>,
    /// Print the decision as JSON.
    #[arg(long)]
    pub json: bool,
}

/// The dry-run input. Unknown fields are refused so a typo cannot silently change the answer.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DecideInput {
    pub principal: String,
    pub tool: String,
    #[serde(default)]
    pub purpose: Option<String>,
    #[serde(default)]
    pub reason: Option<String>,
    #[serde(default)]
    pub inputs: Value,
    /// The id of the credential the call is made with (`credentials[].id`).
    #[serde(default)]
    pub credential: Option<String>,
    #[serde(default)]
    pub run: Vec<PriorCall>,
    #[serde(default)]
    pub budgets: HashMap<String, HashMap<Tier, u32>>,
    #[serde(default)]
    pub idempotency: IdempotencyState,
    #[serde(default)]
    pub destinations: HashMap<String, Vec<String>>,
    #[serde(default)]
    pub approvals: Vec<String>,
    #[serde(default)]
    pub subject: Option<String>,
    #[serde(default)]
    pub at_ms: Option<i64>,
    /// The call is one of the principal's pending planned steps (same tool and exactly the
    /// same inputs). A plan-bound principal's call is decided only then; otherwise `serve`
    /// refuses it before any other check (`plan.unplanned`), and so does `decide`.
    #[serde(default)]
    pub planned: bool,
}

/// The keys `decide` verifies approval tokens with: the gateway's, read as `serve` reads them
/// (current and previous), when the call carries tokens. A call without tokens verifies none,
/// so it needs no key.
fn keys(registry: &toolgate_core::Registry, tokens: bool) -> anyhow::Result<ApprovalKeys> {
    if !tokens {
        return Ok(ApprovalKeys::new(
            registry.gateway.approvals.key_id.clone(),
            Vec::new(),
        ));
    }
    toolgate_gateway::keys::load_approval_keys(registry, &|name| std::env::var(name).ok()).context(
        "the call carries approval tokens, and only the gateway's approval key verifies them",
    )
}

pub fn run(args: &Args, out: &mut dyn Write) -> anyhow::Result<Exit> {
    let registry = args.config.load()?;
    let text = match args.file.as_deref() {
        None => read_stdin()?,
        Some(p) if p.as_os_str() == "-" => read_stdin()?,
        Some(p) => {
            std::fs::read_to_string(p).with_context(|| format!("reading {}", p.display()))?
        }
    };
    let input: DecideInput = serde_json::from_str(&text).context(
        "the call must be JSON with at least {\"principal\", \"tool\", \"inputs\"}; see `toolgate decide --help`",
    )?;
    let keys = keys(&registry, !input.approvals.is_empty())?;
    let engine = Engine::new(&registry, &keys);
    let run = RunHistory::of_calls(input.run);
    let budgets = BudgetView {
        used: input.budgets,
        ..BudgetView::default()
    };
    let facts = DestinationFacts {
        allowed: input.destinations,
    };
    let approvals: Vec<ApprovalToken> = input
        .approvals
        .into_iter()
        .map(ApprovalToken::from_wire)
        .collect();
    let subject = input.subject.unwrap_or_else(|| "dry-run".into());
    // The arguments split as `serve` splits them: toolgate's own arguments out of the inputs,
    // the purpose and reason from `_meta`, the arguments or the caller's defaults.
    let split = match (
        registry.principal(&input.principal),
        registry.tool(&input.tool),
        &input.inputs,
    ) {
        (Some(p), Some(t), Value::Object(args)) if t.is_listed_for(p.role()) => {
            Some(registry.split_call(
                p,
                input.credential.as_deref(),
                t,
                args.clone(),
                input.purpose.as_deref(),
                input.reason.as_deref(),
            ))
        }
        _ => None,
    };
    let (inputs, purpose, reason, purpose_from, errors) = match &split {
        Some(s) => (
            &s.inputs,
            s.why.purpose.as_deref(),
            s.why.reason.as_deref(),
            s.why.purpose_from,
            s.errors.as_slice(),
        ),
        None => (
            &input.inputs,
            input.purpose.as_deref(),
            input.reason.as_deref(),
            None,
            &[][..],
        ),
    };
    // Offline, no upstream is reached: an upstream tool's pin is checked when `serve` reaches
    // it, before anything is forwarded; a built-in tool has nothing upstream to pin.
    let definition = match registry.tool(&input.tool) {
        Some(t) if t.handler().is_upstream() => Definition::Unreached,
        _ => Definition::Local,
    };
    let req = CallRequest {
        purpose,
        reason,
        definition,
        purpose_from,
        argument_errors: errors,
        subject: &subject,
        run: &run,
        budgets: &budgets,
        idempotency: input.idempotency,
        approvals: &approvals,
        destinations: &facts,
        ..CallRequest::new(&input.principal, &input.tool, inputs)
    };
    let now = input
        .at_ms
        .map(Timestamp::from_millis)
        .unwrap_or_else(|| toolgate_core::Clock::now(&toolgate_core::SystemClock));
    let d = engine.decide(&req, now);
    if !input.planned && registry.is_plan_bound_call(&input.principal, &input.tool) {
        return unplanned(args, out, &registry, &input.principal, &input.tool, &d);
    }
    let policies = policy::explain(&registry, &req, now);
    if args.json {
        // The decision as the engine returns it, with each policy's outcome beside it.
        let mut doc = serde_json::to_value(&d)?;
        doc["policies"] = serde_json::to_value(&policies)?;
        writeln!(out, "{}", super::json_text(&doc)?)?;
    } else {
        match &d.verdict {
            Verdict::Allow => writeln!(out, "decision: ALLOW")?,
            Verdict::Deny {
                check,
                rule,
                reason,
            } => {
                writeln!(out, "decision: DENY at check '{check}' (rule {rule})")?;
                writeln!(out, "reason:   {reason}")?;
            }
            Verdict::NeedsApproval {
                rule,
                reason,
                approvers_needed,
                approved_by,
            } => {
                writeln!(
                    out,
                    "decision: NEEDS APPROVAL (rule {rule}, {approvers_needed} more approver(s))"
                )?;
                writeln!(out, "reason:   {reason}")?;
                if !approved_by.is_empty() {
                    writeln!(out, "approved first by: {}", approved_by.join(", "))?;
                }
            }
        }
        writeln!(out, "inputs:   {}", d.input_hash)?;
        writeln!(out, "registry: {}", registry.version)?;
        if !d.shadow.is_empty() {
            let rules: Vec<String> = d
                .shadow
                .iter()
                .map(|r| format!("{} ({})", r.rule, r.would.as_str()))
                .collect();
            writeln!(
                out,
                "shadow:   would also be stopped by {} (not enforced)",
                rules.join(", ")
            )?;
        }
        writeln!(out)?;
        let mut t = Table::new(&["#", "check", "outcome", "rule", "detail"]);
        for (i, c) in d.checks.iter().enumerate() {
            let outcome = match c.outcome {
                Outcome::Pass => "pass",
                Outcome::Fail => "FAIL",
                Outcome::Gate => "GATE",
                Outcome::Skip => "skip",
            };
            t.row(vec![
                (i + 1).to_string(),
                c.name.to_string(),
                outcome.into(),
                c.rule.as_deref().unwrap_or_default().to_string(),
                c.detail.clone(),
            ]);
        }
        t.write(out)?;
        writeln!(out)?;
        write_policies(out, &input.tool, policies.as_deref())?;
    }
    Ok(match d.verdict {
        Verdict::Allow => Exit::Success,
        Verdict::Deny { .. } => Exit::Refused,
        Verdict::NeedsApproval { .. } => Exit::NeedsApproval,
    })
}

/// A plan-bound principal's call that claims no planned step: refused as `serve` refuses it,
/// before any other check (the gateway records it with no checks), exit 1.
fn unplanned(
    args: &Args,
    out: &mut dyn Write,
    registry: &toolgate_core::Registry,
    principal: &str,
    tool: &str,
    d: &toolgate_core::Decision,
) -> anyhow::Result<Exit> {
    let reason = unplanned_reason(principal, tool, false);
    if args.json {
        let doc = serde_json::json!({
            "verdict": {"kind": "deny", "check": "plan", "rule": UNPLANNED, "reason": reason},
            "checks": [],
            "input_hash": d.input_hash,
            "approvals": [],
            "shadow": [],
            "registry_version": d.registry_version,
            "policies": null,
        });
        writeln!(out, "{}", super::json_text(&doc)?)?;
    } else {
        writeln!(out, "decision: DENY at check 'plan' (rule {UNPLANNED})")?;
        writeln!(out, "reason:   {reason}")?;
        writeln!(out, "inputs:   {}", d.input_hash)?;
        writeln!(out, "registry: {}", registry.version)?;
        writeln!(out)?;
        writeln!(
            out,
            "`serve` refuses this call before any other check. A call that matches one of \
             '{principal}''s pending planned steps runs that step: add \"planned\": true to \
             decide it as that step."
        )?;
    }
    Ok(Exit::Refused)
}

/// Each policy of the call's tool: matched (and what that does), no match, or the error.
fn write_policies(
    out: &mut dyn Write,
    tool: &str,
    policies: Option<&[PolicyResult]>,
) -> std::io::Result<()> {
    let Some(policies) = policies else {
        return writeln!(
            out,
            "policies: not evaluated for this call (see the checks above)"
        );
    };
    if policies.is_empty() {
        return writeln!(out, "policies: none applies to '{tool}'");
    }
    writeln!(out, "policies of '{tool}': {}", policies.len())?;
    let mut t = Table::new(&["policy", "effect", "outcome", "file", "detail"]);
    for p in policies {
        let shadow = matches!(
            p.effect,
            PolicyEffect::ShadowForbid | PolicyEffect::ShadowGate
        );
        let (outcome, detail) = match &p.outcome {
            PolicyOutcome::Matched => (
                "MATCHED",
                match p.effect {
                    PolicyEffect::Forbid => "refuses the call".to_string(),
                    PolicyEffect::Gate => "asks for approval".to_string(),
                    PolicyEffect::ShadowForbid => "would refuse (shadow, not enforced)".to_string(),
                    PolicyEffect::ShadowGate => {
                        "would ask for approval (shadow, not enforced)".to_string()
                    }
                },
            ),
            PolicyOutcome::NotMatched => ("no match", String::new()),
            PolicyOutcome::Errored { error } => (
                "ERROR",
                if shadow {
                    format!("{error} (shadow: recorded as would refuse)")
                } else {
                    format!("{error} (an error refuses the call)")
                },
            ),
        };
        t.row(vec![
            p.id.clone(),
            p.effect.as_str().into(),
            outcome.into(),
            p.file.clone(),
            detail,
        ]);
    }
    t.write(out)
}

fn read_stdin() -> anyhow::Result<String> {
    let mut s = String::new();
    std::io::stdin().read_to_string(&mut s)?;
    Ok(s)
}
