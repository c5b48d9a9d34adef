//! Preview, then commit, for tools that declare `preview:` in the registry: a destructive call
//! is shown exactly before it is made. Such a tool `T` is listed twice:
//!
//! - `T.preview` takes `T`'s inputs, does nothing, and answers with the full envelope (the
//!   registry tool and version, the upstream and its tool, every input exactly as it will be
//!   sent), a plan id, the plan's hash and its expiry. The plan is kept in the store.
//! - `T` takes only `{"plan_id"}`: never fresh arguments. The commit runs the governed call
//!   with exactly the previewed inputs and the preview's purpose, reason and run id; only
//!   approval tokens come from the commit's `_meta`. The plan's hash is the input hash
//!   approvals bind to, so approving the parked commit is approving the previewed plan.
//!
//! A plan is the caller's own: another principal's plan id is answered as if it did not exist.
//! A plan expires; a plan made under another version of the tool is refused at commit.
//!
//! Every preview is in the audit chain before it is answered: a `preview` record of `T.preview`
//! (the plan id as its target reference, the inputs redacted as `T`'s are), or a `deny` record
//! when the preview was refused.

use std::sync::Arc;

use rmcp::ErrorData;
use rmcp::model::{CallToolResult, ContentBlock, JsonObject, Tool, ToolAnnotations};
use serde_json::{Value, json};
use toolgate_core::registry::Tool as RegistryTool;
use toolgate_core::{
    CallRequest, CheckName, Decision, InputHash, Registry, Rule, Timestamp, Verdict,
};
use toolgate_store::audit::{AuditCall, AuditDraft, AuditWho};
use toolgate_store::previews::Preview;
use toolgate_store::{Executor, StoreError};

use crate::auth::Caller;
use crate::meta::CallContext;
use crate::render::Refusal;
use crate::server::{GatewayServer, Surface, mcp_tool, mcp_tool_with, split_arguments};
use toolgate_core::why::Split;

/// The suffix of a preview tool's name.
pub const SUFFIX: &str = ".preview";

/// `_meta` keys a commit may add to the preview's: approval tokens only.
const COMMIT_META: &[&str] = &[
    "approval_token",
    "approval_tokens",
    "toolgate/approval_token",
    "toolgate/approval_tokens",
];

/// What a `tools/call` name means.
pub enum Route<'a> {
    Preview(&'a RegistryTool),
    Commit(&'a RegistryTool),
}

/// The MCP tools a registry tool is listed as, given the input schema it is listed with to
/// this caller: itself, or (when it declares a preview) its commit form and its preview tool
/// (which takes the inputs, and the governance arguments with them).
pub fn listed(tool: &RegistryTool, schema: &Value) -> Vec<Tool> {
    if tool.config.preview.is_none() {
        return vec![mcp_tool_with(tool, schema)];
    }
    let name = tool.name();
    let mut commit = mcp_tool(tool);
    commit.description = Some(
        format!(
            "{} Preview first: call `{name}{SUFFIX}` with the inputs, then call this with only \
             the plan_id it returned; exactly the previewed plan is done.",
            tool.config.description
        )
        .into(),
    );
    commit.input_schema = Arc::new(as_object(json!({
        "type": "object",
        "additionalProperties": false,
        "required": ["plan_id"],
        "properties": {"plan_id": {"type": "string", "pattern": "^pln_[0-9a-f]{32}$"}}
    })));
    commit.output_schema = None;
    let mut preview = mcp_tool_with(tool, schema);
    preview.name = format!("{name}{SUFFIX}").into();
    preview.description = Some(
        format!(
            "Preview of `{name}`: does nothing; returns exactly what `{name}` would do with these \
             inputs (the full envelope), a plan_id, the plan's hash and its expiry."
        )
        .into(),
    );
    preview.output_schema = None;
    preview.annotations = Some(
        ToolAnnotations::new()
            .read_only(true)
            .destructive(false)
            .idempotent(false)
            .open_world(false),
    );
    vec![commit, preview]
}

/// The preview or commit route for `name`, when it names a previewable tool listed for `role`.
pub fn route<'a>(registry: &'a Registry, role: &str, name: &str) -> Option<Route<'a>> {
    let listed_for = |n: &str| -> Option<&'a RegistryTool> {
        let t = registry.tool(n)?;
        (t.config.preview.is_some() && t.is_listed_for(role)).then_some(t)
    };
    if let Some(base) = name.strip_suffix(SUFFIX) {
        return listed_for(base).map(Route::Preview);
    }
    listed_for(name).map(Route::Commit)
}

fn as_object(v: Value) -> JsonObject {
    match v {
        Value::Object(m) => m,
        _ => JsonObject::new(),
    }
}

fn store_error(e: StoreError) -> ErrorData {
    ErrorData::internal_error(
        format!("toolgate could not read or keep the plan: {e}"),
        None,
    )
}

/// Handles a preview or commit call under `surface`, the snapshot the request took (and `route`
/// was found in): every phase of it, the commit's governed call included, under that version.
pub async fn handle(
    server: &GatewayServer,
    surface: &Surface,
    caller: &Caller,
    route: Route<'_>,
    arguments: Option<JsonObject>,
    meta: &JsonObject,
) -> Result<CallToolResult, ErrorData> {
    match route {
        Route::Preview(tool) => preview(server, surface, caller, tool, arguments, meta).await,
        Route::Commit(tool) => commit(server, surface, caller, tool, arguments, meta).await,
    }
}

async fn preview(
    server: &GatewayServer,
    surface: &Surface,
    caller: &Caller,
    tool: &RegistryTool,
    arguments: Option<JsonObject>,
    meta: &JsonObject,
) -> Result<CallToolResult, ErrorData> {
    let cfg = &tool.config;
    // The request's snapshot of the registry and the executor for the whole preview, and the
    // executor's clock for its decision, its expiry and its record, as for the call that
    // commits it.
    let executor = &surface.executor;
    let now = executor.clock.now();
    let ctx = CallContext::from_meta(meta);
    let split = split_arguments(
        &surface.registry,
        caller,
        tool.name(),
        arguments.unwrap_or_default(),
        &ctx,
    );
    let inputs = split.inputs.clone();
    // The commit runs with the purpose and reason stated now, wherever they came from.
    let mut meta = meta.clone();
    if ctx.purpose.is_none()
        && let Some(p) = &split.why.purpose
    {
        meta.insert("purpose".into(), json!(p));
    }
    if ctx.reason.is_none()
        && let Some(r) = &split.why.reason
    {
        meta.insert("reason".into(), json!(r));
    }
    let meta = &meta;
    let decision = static_decision(executor, caller, tool, &inputs, &split, now);
    if let Some(refused) = static_refusal(tool, &decision) {
        let r = Recorded::PreviewRefused(&decision);
        record(server, surface, caller, tool, &inputs, meta, r, now).await?;
        return Ok(refused);
    }
    let hash = InputHash::of(&inputs);
    let created_at = now.millis();
    let expires_secs = cfg.preview.as_ref().map_or(0, |p| p.expires_secs);
    let plan = Preview {
        plan_id: format!("pln_{}", uuid::Uuid::now_v7().simple()),
        principal: caller.principal.to_string(),
        tool: cfg.name.clone(),
        tool_version: cfg.version.clone(),
        input_hash: hash.as_str().to_string(),
        inputs: inputs.clone(),
        meta: Value::Object(meta.clone()),
        created_at,
        expires_at: created_at + (expires_secs as i64) * 1000,
    };
    server
        .state()
        .store
        .save_preview(&plan)
        .await
        .map_err(store_error)?;
    let r = Recorded::Plan {
        decision: &decision,
        plan_id: plan.plan_id.clone(),
    };
    record(server, surface, caller, tool, &inputs, meta, r, now).await?;
    tracing::info!(principal = %caller.principal, tool = %cfg.name, plan_id = %plan.plan_id, hash = %plan.input_hash, "preview");
    let envelope = json!({
        "tool": cfg.name,
        "version": cfg.version,
        "upstream": cfg.handler.upstream,
        "upstream_tool": match tool.handler() {
            toolgate_core::Handler::Upstream { tool, .. } => Some(tool),
            toolgate_core::Handler::Builtin(_) => None,
        },
        "inputs": inputs,
    });
    let facts = json!({
        "status": "previewed",
        "plan_id": plan.plan_id,
        "hash": plan.input_hash,
        "expires_at_ms": plan.expires_at,
        "expires_in_s": expires_secs,
        "envelope": envelope,
        "next": format!("call `{}` with {{\"plan_id\": \"{}\"}} to do exactly this (it may need a person's approval, which then approves this plan)", cfg.name, plan.plan_id),
    });
    let text = format!(
        "Nothing was done. Plan {} would call `{}` (upstream tool `{}`) with exactly:\n{}\nPlan hash {}; \
         commit before it expires in {} s by calling `{}` with only {{\"plan_id\": \"{}\"}}.",
        plan.plan_id,
        cfg.name,
        facts["envelope"]["upstream_tool"]
            .as_str()
            .unwrap_or_default(),
        serde_json::to_string_pretty(&facts["envelope"]["inputs"]).unwrap_or_default(),
        plan.input_hash,
        expires_secs,
        cfg.name,
        plan.plan_id
    );
    let mut r = CallToolResult::success(vec![ContentBlock::text(text)]);
    r.structured_content = Some(facts);
    Ok(r)
}

/// The preview's decision: the executor's engine, of which only the checks that depend on
/// nothing but the caller, the inputs and the `_meta` can refuse a preview (see
/// [`static_refusal`]).
fn static_decision(
    executor: &Executor,
    caller: &Caller,
    tool: &RegistryTool,
    inputs: &Value,
    split: &Split,
    now: Timestamp,
) -> Decision {
    let req = CallRequest {
        purpose: split.why.purpose.as_deref(),
        reason: split.why.reason.as_deref(),
        purpose_from: split.why.purpose_from,
        argument_errors: &split.errors,
        ..CallRequest::new(&caller.principal, tool.name(), inputs)
    };
    executor.engine().decide(&req, now)
}

/// A plan the commit would certainly refuse is not made: the checks that depend only on the
/// caller, the inputs and the `_meta` (listed, schema, purpose) run now, and their refusal is the
/// preview's answer. The rest (budgets, policies over the run, destinations looked up from data,
/// the gate) is decided at commit.
fn static_refusal(tool: &RegistryTool, decision: &Decision) -> Option<CallToolResult> {
    let Verdict::Deny {
        check,
        rule,
        reason,
    } = &decision.verdict
    else {
        return None;
    };
    if !matches!(
        check,
        CheckName::Listed | CheckName::Schema | CheckName::Purpose
    ) {
        return None;
    }
    Some(
        Refusal::new(format!("{}{SUFFIX}", tool.name()), check, rule, reason)
            .next("no plan was made; correct the inputs or the _meta and preview again")
            .into_result(),
    )
}

/// What a preview or commit record says happened.
enum Recorded<'a> {
    /// `T.preview` made the plan `plan_id`, as the engine decided.
    Plan {
        decision: &'a Decision,
        plan_id: String,
    },
    /// `T.preview` was refused by the engine's decision: no plan was made.
    PreviewRefused(&'a Decision),
    /// The commit `T` was refused by `rule` (no current plan of the caller's).
    CommitRefused { rule: Rule },
}

/// Appends a preview's or a refused commit's audit record, durably, before the caller hears
/// anything.
#[allow(clippy::too_many_arguments)]
async fn record(
    server: &GatewayServer,
    surface: &Surface,
    caller: &Caller,
    tool: &RegistryTool,
    inputs: &Value,
    meta: &JsonObject,
    r: Recorded<'_>,
    now: Timestamp,
) -> Result<(), ErrorData> {
    let ctx = CallContext::from_meta(meta);
    // A run named that is not the caller's is not joined: the record names no run.
    let run_id = server
        .run_in(surface, caller, ctx.run_id.clone())
        .await?
        .ok();
    let store = &server.state().store;
    let (inputs, redacted) = store.config().redactor.redact(inputs, &tool.config.redact);
    let name = match r {
        Recorded::Plan { .. } | Recorded::PreviewRefused(_) => format!("{}{SUFFIX}", tool.name()),
        Recorded::CommitRefused { .. } => tool.name().to_string(),
    };
    let who = AuditWho {
        actor: ctx.actor,
        ..AuditWho::new(caller.principal.clone(), &caller.role)
    };
    let call = AuditCall {
        run_id,
        tool_version: Some(tool.config.version.clone()),
        inputs,
        redacted,
        purpose: ctx.purpose,
        reason: ctx.reason,
        evidence: ctx.evidence,
        ..AuditCall::new(who, name, None)
    };
    let draft = match r {
        Recorded::Plan { decision, plan_id } => AuditDraft::preview(now, call, decision, plan_id),
        Recorded::PreviewRefused(decision) => AuditDraft::preview_refusal(now, call, decision),
        Recorded::CommitRefused { rule } => {
            let version = surface.registry.version.hash.clone();
            AuditDraft::refusal(now, call, rule, None, version)
        }
    };
    store
        .append_audit_grouped(draft)
        .await
        .map(drop)
        .map_err(store_error)
}

/// The caller's own plan for `tool` named by `args`, still current; or why it cannot be
/// committed.
async fn committable(
    server: &GatewayServer,
    caller: &Caller,
    tool: &RegistryTool,
    args: &Value,
    now: Timestamp,
) -> Result<Result<Preview, Refusal>, ErrorData> {
    let name = tool.name();
    let only_plan_id = args.as_object().filter(|a| a.len() == 1);
    let Some(plan_id) = only_plan_id
        .and_then(|a| a.get("plan_id"))
        .and_then(Value::as_str)
    else {
        return Ok(Err(Refusal::new(
            name,
            "preview",
            Rule::PREVIEW_PLAN_ID_ONLY,
            format!("`{name}` takes only {{\"plan_id\"}}; arguments are never taken at commit"),
        )
        .next(format!(
            "preview the call with `{name}{SUFFIX}` and commit the plan_id it returns"
        ))));
    };
    let again = format!("preview again with `{name}{SUFFIX}` and commit the new plan_id");
    let plan = match server.state().store.preview(plan_id).await {
        Ok(p) if p.principal == caller.principal && p.tool == name => p,
        // Another principal's plan, or another tool's, is answered as unknown.
        Ok(_) | Err(StoreError::NotFound { .. }) => {
            return Ok(Err(Refusal::new(
                name,
                "preview",
                Rule::PREVIEW_UNKNOWN_PLAN,
                format!("there is no plan {plan_id} of yours for `{name}`"),
            )
            .next(again)
            .fact("plan_id", plan_id)));
        }
        Err(e) => return Err(store_error(e)),
    };
    if now.millis() > plan.expires_at {
        return Ok(Err(Refusal::new(
            name,
            "preview",
            Rule::PREVIEW_EXPIRED,
            format!("plan {plan_id} expired"),
        )
        .next(again)
        .fact("plan_id", plan_id)
        .fact("expires_at_ms", plan.expires_at)));
    }
    if plan.tool_version != tool.config.version {
        return Ok(Err(Refusal::new(
            name,
            "preview",
            Rule::PREVIEW_TOOL_CHANGED,
            format!(
                "plan {plan_id} was made for `{name}` version {}, which is now version {}",
                plan.tool_version, tool.config.version
            ),
        )
        .next(again)
        .fact("plan_id", plan_id)));
    }
    Ok(Ok(plan))
}

async fn commit(
    server: &GatewayServer,
    surface: &Surface,
    caller: &Caller,
    tool: &RegistryTool,
    arguments: Option<JsonObject>,
    meta: &JsonObject,
) -> Result<CallToolResult, ErrorData> {
    let args = Value::Object(arguments.unwrap_or_default());
    let now = surface.executor.clock.now();
    let plan = match committable(server, caller, tool, &args, now).await? {
        Ok(plan) => plan,
        Err(refusal) => {
            let r = Recorded::CommitRefused {
                rule: refusal.rule().clone(),
            };
            record(server, surface, caller, tool, &args, meta, r, now).await?;
            return Ok(refusal.into_result());
        }
    };
    let name = tool.name();
    let mut call_meta = match &plan.meta {
        Value::Object(m) => m.clone(),
        _ => JsonObject::new(),
    };
    for k in COMMIT_META {
        if let Some(v) = meta.get(*k) {
            call_meta.insert((*k).to_string(), v.clone());
        }
    }
    let inputs = match plan.inputs {
        Value::Object(m) => m,
        _ => JsonObject::new(),
    };
    // Decided under the snapshot the commit was routed and checked under, not a newer one.
    let mut r = server
        .governed_in(surface, caller, name, Some(inputs), &call_meta)
        .await?;
    if let Some(Value::Object(m)) = r.structured_content.as_mut() {
        m.insert("plan_id".into(), json!(plan.plan_id));
        m.insert("plan_hash".into(), json!(plan.input_hash));
    }
    Ok(r)
}
