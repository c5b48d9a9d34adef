//! Policies are Cedar. Grants permit; policies only take away: a `forbid` refuses a call, and a
//! `forbid` annotated `@gate` sends it to a person instead. Each policy carries `@id("…")`, the
//! name that appears in denials and the audit log.
//!
//! The Cedar schema is generated from the registry: `Principal` (in a `Role`), `Tool`, one action
//! per tool, and a context with the purpose, the tool's typed inputs and the run so far. Policies
//! are validated against it at load, so one that names a missing input fails there.
//!
//! A rule must not load and then silently never fire. Beyond Cedar's validator (which already
//! refuses an optional input read without `has`: at evaluation it would error and refuse the
//! call), every `context.inputs` path a policy reads or tests is checked against the tools it
//! applies to: naming an input that has no Cedar type, or testing `has` on one no tool has, is
//! a load error saying why; so is a policy Cedar finds can never match.

use std::collections::{HashMap, HashSet};
use std::str::FromStr;

use cedar_policy::{
    ActionConstraint, AuthorizationError, Authorizer, Context, Decision as CedarDecision, Entities,
    Entity, EntityId, EntityTypeName, EntityUid, Policy, PolicyId, PolicySet, Request,
    ResourceConstraint, Response, RestrictedExpression, Schema, ValidationError, ValidationMode,
    ValidationWarning, Validator,
};
use serde::Serialize;
use serde_json::{Value, json};

use crate::budget::{self, WindowCheck};
use crate::config::{PrincipalConfig, ToolConfig};
use crate::decide::CallRequest;
use crate::error::CoreError;
use crate::model::Timestamp;
use crate::registry::{Registry, Tool};
use crate::schema::{CedarType, InputLookup, InputsError};

/// One loaded policy and what it does when it matches.
#[derive(Debug, Clone)]
pub struct PolicyInfo {
    pub id: String,
    pub file: String,
    /// `true` for `@gate` policies: a match asks for approval instead of refusing.
    pub gate: bool,
    /// `true` for `@shadow` policies: evaluated and recorded, never deciding.
    pub shadow: bool,
    /// The `@reason("…")` annotation: what a denial tells the caller.
    pub reason: Option<String>,
    pub text: String,
}

impl PolicyInfo {
    /// What a match of this policy does.
    pub fn effect(&self) -> PolicyEffect {
        match (self.shadow, self.gate) {
            (false, false) => PolicyEffect::Forbid,
            (false, true) => PolicyEffect::Gate,
            (true, false) => PolicyEffect::ShadowForbid,
            (true, true) => PolicyEffect::ShadowGate,
        }
    }
}

/// What a policy does when it matches.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum PolicyEffect {
    /// Refuses the call.
    Forbid,
    /// Asks a person to approve it.
    Gate,
    /// Would refuse it; recorded, not enforced.
    ShadowForbid,
    /// Would ask for approval; recorded, not enforced.
    ShadowGate,
}

impl PolicyEffect {
    pub fn as_str(self) -> &'static str {
        match self {
            PolicyEffect::Forbid => "forbid",
            PolicyEffect::Gate => "gate",
            PolicyEffect::ShadowForbid => "shadow forbid",
            PolicyEffect::ShadowGate => "shadow gate",
        }
    }
}

/// How one policy came out for one call.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "outcome", rename_all = "snake_case")]
pub enum PolicyOutcome {
    /// Its scope and conditions hold: it refuses, gates, or (shadow) would have.
    Matched,
    NotMatched,
    /// Evaluating it failed; an enforced policy that errors refuses the call.
    Errored {
        error: String,
    },
}

/// One policy that applies to a call's tool, and what it said: what `toolgate decide` prints.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct PolicyResult {
    pub id: String,
    pub file: String,
    pub effect: PolicyEffect,
    #[serde(flatten)]
    pub outcome: PolicyOutcome,
}

/// The run so far, as policies see it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RunCounts {
    /// Steps decided so far in this run.
    pub steps: i64,
    /// Refusals so far in this run.
    pub denials: i64,
    /// Allowed act-tier calls so far.
    pub act_steps: i64,
    /// Allowed spend-tier calls so far.
    pub spend_steps: i64,
    /// Allowed calls of this same tool so far.
    pub tool_calls: i64,
}

/// What the policies said about one call.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PolicyVerdict {
    pub forbidden_by: Vec<String>,
    pub gated_by: Vec<String>,
    /// Shadow policies that matched (and so would have refused or gated).
    pub shadow_matched: Vec<String>,
    /// A policy that errored is treated as matching: policies fail closed.
    pub errors: Vec<String>,
}

/// The compiled policy set with the entities it needs.
pub struct Policies {
    /// For each tool (Cedar action), only the policies whose action scope can match it, so a
    /// call evaluates what concerns it and nothing else.
    by_action: HashMap<String, PolicySet>,
    empty: PolicySet,
    entities: Entities,
    info: HashMap<String, PolicyInfo>,
    authorizer: Authorizer,
    schema: Value,
    /// What Cedar's validator warns about that does not stop a rule (mixed scripts, bidi
    /// characters): findings of the lint.
    warnings: Vec<PolicyProblem>,
}

impl std::fmt::Debug for Policies {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Policies")
            .field("ids", &self.info.keys().collect::<Vec<_>>())
            .finish()
    }
}

/// A problem found while loading policies.
#[derive(Debug, Clone)]
pub struct PolicyProblem {
    pub file: String,
    pub policy: Option<String>,
    pub message: String,
    /// What would be right, when the problem has a specific fix.
    pub fix: Option<String>,
}

impl PolicyProblem {
    fn new(file: &str, policy: Option<&str>, message: String) -> Self {
        PolicyProblem {
            file: file.to_string(),
            policy: policy.map(str::to_string),
            message,
            fix: None,
        }
    }

    fn fix(mut self, fix: String) -> Self {
        self.fix = Some(fix);
        self
    }
}

/// Why a call's request could not be put to Cedar (boxed: Cedar's errors are large, and this
/// is the rare path).
#[derive(Debug, thiserror::Error)]
enum RequestError {
    #[error("the policy context cannot be built: {0}")]
    Context(#[from] Box<cedar_policy::ContextCreationError>),
    #[error("the policy request is invalid: {0}")]
    Request(#[from] Box<cedar_policy::RequestValidationError>),
}

pub fn uid(ty: &str, id: &str) -> EntityUid {
    EntityUid::from_type_name_and_id(
        EntityTypeName::from_str(ty).expect("fixed type names parse"),
        EntityId::new(id),
    )
}

/// The Cedar schema (JSON format) for a registry.
pub fn cedar_schema(tools: &[ToolConfig], input_types: &[&CedarType]) -> Value {
    let string = json!({"type": "String"});
    let long = json!({"type": "Long"});
    let mut actions = serde_json::Map::new();
    for (tool, ty) in tools.iter().zip(input_types) {
        let mut action = json!({
            "appliesTo": {
                "principalTypes": ["Principal"],
                "resourceTypes": ["Tool"],
                "context": {
                    "type": "Record",
                    "attributes": {
                        "purpose": string,
                        "reason": string,
                        "inputs": ty.to_cedar_schema(),
                        "run": {"type": "Record", "attributes": {
                            "steps": long, "denials": long, "act_steps": long,
                            "spend_steps": long, "tool_calls": long,
                        }},
                    }
                }
            }
        });
        // Inputs with no Cedar type are named, with the reason, where authors read the schema.
        let untyped: Vec<String> = ty
            .untyped()
            .into_iter()
            .map(|(path, why)| format!("{path}: {why}"))
            .collect();
        if !untyped.is_empty() {
            action["annotations"] = json!({"untyped_inputs": untyped.join("; ")});
        }
        // A tool with window budgets also shows them: `context.budgets.<id>.{used,limit,left}`.
        if !tool.window_budgets.is_empty() {
            action["appliesTo"]["context"]["attributes"]["budgets"] =
                crate::budget::context_schema(&tool.window_budgets);
        }
        actions.insert(tool.name.clone(), action);
    }
    json!({"": {
        "entityTypes": {
            "Role": {},
            "Principal": {
                "memberOfTypes": ["Role"],
                "shape": {"type": "Record", "attributes": {
                    "kind": string, "role": string,
                }}
            },
            "Tool": {
                "shape": {"type": "Record", "attributes": {
                    "effect": string, "tier": string, "sensitivity": string,
                    "version": string, "owner": string,
                }}
            }
        },
        "actions": actions,
    }})
}

impl Policies {
    /// Parses, names and validates the policy files. Every problem is returned, not the first.
    pub fn load(
        files: &[(String, String)],
        tools: &[ToolConfig],
        input_types: &[&CedarType],
        principals: &[PrincipalConfig],
    ) -> Result<Policies, Vec<PolicyProblem>> {
        let schema_json = cedar_schema(tools, input_types);
        let schema = Schema::from_json_value(schema_json.clone()).map_err(|e| {
            vec![PolicyProblem {
                file: "<generated schema>".into(),
                policy: None,
                message: format!("{e:?}"),
                fix: None,
            }]
        })?;
        let mut problems = Vec::new();
        let mut set = PolicySet::new();
        let mut info = HashMap::new();
        for (file, text) in files {
            let parsed = match PolicySet::from_str(text) {
                Ok(p) => p,
                Err(e) => {
                    problems.push(PolicyProblem {
                        file: file.clone(),
                        policy: None,
                        message: format!("{e}"),
                        fix: None,
                    });
                    continue;
                }
            };
            for (i, p) in parsed.policies().enumerate() {
                let Some(id) = p.annotation("id").map(str::to_string) else {
                    problems.push(PolicyProblem {
                        file: file.clone(),
                        policy: Some(format!("policy #{}", i + 1)),
                        message: "every policy needs an @id(\"…\") annotation: it is the name \
                                  denials and the audit log cite"
                            .into(),
                        fix: None,
                    });
                    continue;
                };
                if p.effect() == cedar_policy::Effect::Permit {
                    problems.push(PolicyProblem {
                        file: file.clone(),
                        policy: Some(id.clone()),
                        message: "toolgate policies only forbid or gate (grants are what permit); \
                                  write `forbid`, with `@gate` to ask a person instead of refusing"
                            .into(),
                        fix: None,
                    });
                    continue;
                }
                if info.contains_key(&id) {
                    problems.push(PolicyProblem {
                        file: file.clone(),
                        policy: Some(id.clone()),
                        message: format!("duplicate policy id '{id}'; each @id must be unique"),
                        fix: None,
                    });
                    continue;
                }
                let named = p.new_id(PolicyId::new(&id));
                if let Err(e) = set.add(named) {
                    problems.push(PolicyProblem {
                        file: file.clone(),
                        policy: Some(id.clone()),
                        message: e.to_string(),
                        fix: None,
                    });
                    continue;
                }
                info.insert(
                    id.clone(),
                    PolicyInfo {
                        id: id.clone(),
                        file: file.clone(),
                        gate: p.annotation("gate").is_some(),
                        shadow: p.annotation("shadow").is_some(),
                        reason: p.annotation("reason").map(str::to_string),
                        text: p.to_string(),
                    },
                );
            }
        }
        let tool_types: Vec<(&ToolConfig, &CedarType)> =
            tools.iter().zip(input_types.iter().copied()).collect();
        let mut warnings = Vec::new();
        check_policies(
            &set,
            &info,
            &schema,
            &tool_types,
            &mut problems,
            &mut warnings,
        );
        if !problems.is_empty() {
            return Err(problems);
        }
        // No permit is added: with only forbids, a call no policy objects to comes back as
        // Cedar's default deny with an empty reason, and a matching forbid is named in it.
        let mut by_action = HashMap::new();
        for tool in tools {
            let action = uid("Action", &tool.name);
            let mut slice = PolicySet::new();
            for p in set.policies() {
                let applies = match p.action_constraint() {
                    cedar_policy::ActionConstraint::Any => true,
                    cedar_policy::ActionConstraint::Eq(a) => a == action,
                    cedar_policy::ActionConstraint::In(list) => list.contains(&action),
                };
                if applies {
                    slice
                        .add(p.clone())
                        .expect("ids are unique in the full set");
                }
            }
            by_action.insert(tool.name.clone(), slice);
        }

        let entities = build_entities(tools, principals, &schema).map_err(|m| {
            vec![PolicyProblem {
                file: "principals.yaml".into(),
                policy: None,
                message: m.to_string(),
                fix: None,
            }]
        })?;
        Ok(Policies {
            by_action,
            empty: PolicySet::new(),
            entities,
            info,
            authorizer: Authorizer::new(),
            schema: schema_json,
            warnings,
        })
    }

    pub fn info(&self, id: &str) -> Option<&PolicyInfo> {
        self.info.get(id)
    }

    pub fn all(&self) -> impl Iterator<Item = &PolicyInfo> {
        self.info.values()
    }

    /// The generated Cedar schema, for `toolgate check --print-schema` and for authors.
    pub fn schema_json(&self) -> &Value {
        &self.schema
    }

    /// Whether any policy applies to this tool's action at all.
    pub fn apply_to(&self, action: &EntityUid) -> bool {
        self.by_action
            .get(action.id().unescaped())
            .is_some_and(|set| !set.is_empty())
    }

    /// What Cedar's validator warned about that does not stop a rule, for the lint.
    pub fn warnings(&self) -> &[PolicyProblem] {
        &self.warnings
    }

    fn slice(&self, action: &EntityUid) -> &PolicySet {
        self.by_action
            .get(action.id().unescaped())
            .unwrap_or(&self.empty)
    }

    fn authorize(
        &self,
        principal: &EntityUid,
        action: &EntityUid,
        resource: &EntityUid,
        context: Vec<(String, RestrictedExpression)>,
    ) -> Result<Response, RequestError> {
        let context = Context::from_pairs(context).map_err(Box::new)?;
        let request = Request::new(
            principal.clone(),
            action.clone(),
            resource.clone(),
            context,
            None,
        )
        .map_err(Box::new)?;
        Ok(self
            .authorizer
            .is_authorized(&request, self.slice(action), &self.entities))
    }

    /// Evaluates every policy for one call.
    pub fn evaluate(
        &self,
        principal: &EntityUid,
        action: &EntityUid,
        resource: &EntityUid,
        context: Vec<(String, RestrictedExpression)>,
    ) -> PolicyVerdict {
        let mut verdict = PolicyVerdict::default();
        let response = match self.authorize(principal, action, resource, context) {
            Ok(r) => r,
            Err(e) => {
                verdict.errors.push(e.to_string());
                return verdict;
            }
        };
        for e in response.diagnostics().errors() {
            let AuthorizationError::PolicyEvaluationError(inner) = e;
            let id = inner.policy_id().to_string();
            // A shadow policy never decides, not even by failing: it is recorded as one that
            // would have refused (policies fail closed).
            match self.info.get(&id) {
                Some(p) if p.shadow => verdict.shadow_matched.push(id),
                _ => verdict.errors.push(e.to_string()),
            }
        }
        if response.decision() == CedarDecision::Deny {
            for id in response.diagnostics().reason() {
                let id = id.to_string();
                match self.info.get(&id) {
                    Some(p) if p.shadow => verdict.shadow_matched.push(id),
                    Some(p) if p.gate => verdict.gated_by.push(id),
                    _ => verdict.forbidden_by.push(id),
                }
            }
        }
        verdict.forbidden_by.sort();
        verdict.gated_by.sort();
        verdict.shadow_matched.sort();
        verdict.shadow_matched.dedup();
        verdict
    }

    /// Every policy that applies to this call's tool, by id, and whether it matched, did not,
    /// or errored: the same single evaluation as [`Policies::evaluate`], itemised.
    pub fn evaluate_each(
        &self,
        principal: &EntityUid,
        action: &EntityUid,
        resource: &EntityUid,
        context: Vec<(String, RestrictedExpression)>,
    ) -> Vec<PolicyResult> {
        let outcome: Box<dyn Fn(&PolicyId) -> PolicyOutcome> = match self
            .authorize(principal, action, resource, context)
        {
            Err(e) => {
                let error = e.to_string();
                Box::new(move |_| PolicyOutcome::Errored {
                    error: error.clone(),
                })
            }
            Ok(response) => {
                let matched: HashSet<PolicyId> = response.diagnostics().reason().cloned().collect();
                let errors: HashMap<PolicyId, String> = response
                    .diagnostics()
                    .errors()
                    .map(|e| {
                        let AuthorizationError::PolicyEvaluationError(inner) = e;
                        (inner.policy_id().clone(), inner.inner().to_string())
                    })
                    .collect();
                Box::new(move |id| match errors.get(id) {
                    Some(error) => PolicyOutcome::Errored {
                        error: error.clone(),
                    },
                    None if matched.contains(id) => PolicyOutcome::Matched,
                    None => PolicyOutcome::NotMatched,
                })
            }
        };
        let mut out: Vec<PolicyResult> = self
            .slice(action)
            .policies()
            .filter_map(|p| {
                let info = self.info.get(p.id().to_string().as_str())?;
                Some(PolicyResult {
                    id: info.id.clone(),
                    file: info.file.clone(),
                    effect: info.effect(),
                    outcome: outcome(p.id()),
                })
            })
            .collect();
        out.sort_by(|a, b| a.id.cmp(&b.id));
        out
    }

    /// Whether any policy is in shadow mode (then shadow policies are evaluated on their own).
    pub fn has_shadow(&self) -> bool {
        self.info.values().any(|p| p.shadow)
    }
}

/// The Cedar context of one call: purpose, reason, the typed inputs, the run so far and, for a
/// tool with window budgets, what they hold. What every policy of the call's tool sees.
pub(crate) fn call_context(
    tool: &Tool,
    req: &CallRequest<'_>,
    counts: RunCounts,
    windows: Option<&WindowCheck>,
) -> Result<Vec<(String, RestrictedExpression)>, InputsError> {
    let inputs = tool.schema.cedar_type().to_cedar(req.inputs)?;
    let long = RestrictedExpression::new_long;
    let run = RestrictedExpression::new_record([
        ("steps".to_string(), long(counts.steps)),
        ("denials".to_string(), long(counts.denials)),
        ("act_steps".to_string(), long(counts.act_steps)),
        ("spend_steps".to_string(), long(counts.spend_steps)),
        ("tool_calls".to_string(), long(counts.tool_calls)),
    ])
    .expect("distinct keys");
    let mut context = vec![
        (
            "purpose".to_string(),
            RestrictedExpression::new_string(req.purpose.unwrap_or_default().to_string()),
        ),
        (
            "reason".to_string(),
            RestrictedExpression::new_string(req.reason.unwrap_or_default().to_string()),
        ),
        ("inputs".to_string(), inputs),
        ("run".to_string(), run),
    ];
    if let Some(w) = windows {
        context.push(("budgets".to_string(), budget::context(w)));
    }
    Ok(context)
}

/// Each policy that applies to one call's tool and how it came out, as the engine's policy
/// check (check 9) evaluates them: for `toolgate decide`, so an author sees a rule that did
/// not fire, not only the decision. `None` when the engine does not evaluate policies for the
/// call (an unknown principal or tool, a tool not listed for the role, inputs that fail the
/// schema); the decision's checks say which.
pub fn explain(
    registry: &Registry,
    req: &CallRequest<'_>,
    now: Timestamp,
) -> Option<Vec<PolicyResult>> {
    let principal = registry.principal(req.principal)?;
    let tool = registry
        .tool(req.tool)
        .filter(|t| t.is_listed_for(principal.role()))?;
    tool.schema.validate(req.inputs).ok()?;
    let counts = req.run.counts(tool.name());
    let windows = budget::check(
        registry,
        tool,
        principal,
        req.inputs,
        &req.budgets.windows,
        now,
    );
    let policies = &registry.policies;
    match call_context(tool, req, counts, windows.as_ref()) {
        Ok(context) => {
            Some(policies.evaluate_each(&principal.entity, &tool.action, &tool.resource, context))
        }
        Err(e) => Some(
            policies
                .slice(&tool.action)
                .policies()
                .filter_map(|p| policies.info.get(p.id().to_string().as_str()))
                .map(|info| PolicyResult {
                    id: info.id.clone(),
                    file: info.file.clone(),
                    effect: info.effect(),
                    outcome: PolicyOutcome::Errored {
                        error: format!("inputs cannot be given to policies: {e}"),
                    },
                })
                .collect(),
        ),
    }
}

/// A path under `context.inputs` that a policy reads, or tests with `has`.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
struct InputRef {
    path: Vec<String>,
    tested: bool,
}

impl InputRef {
    fn dotted(&self) -> String {
        self.path.join(".")
    }

    /// The expression as the policy wrote it, for messages.
    fn expression(&self) -> String {
        match self.path.split_last() {
            Some((last, rest)) if self.tested && rest.is_empty() => {
                format!("context.inputs has {last}")
            }
            Some(_) if self.tested => format!("context.inputs has {}", self.dotted()),
            _ => format!("context.inputs.{}", self.dotted()),
        }
    }
}

/// Every `context.inputs…` read and `has` test in a policy, from its JSON form (the EST), where
/// `.` is `{".": {left, attr}}` and `has` is `{"has": {left, attr}}` with one name or a path.
fn input_refs(policy: &Policy) -> Vec<InputRef> {
    fn inputs_path(e: &Value) -> Option<Vec<String>> {
        let get = e.get(".")?;
        let (left, attr) = (get.get("left")?, get.get("attr")?.as_str()?);
        if left == &json!({"Var": "context"}) {
            return (attr == "inputs").then(Vec::new);
        }
        let mut path = inputs_path(left)?;
        path.push(attr.to_string());
        Some(path)
    }
    fn walk(e: &Value, out: &mut Vec<InputRef>) {
        match e {
            Value::Object(m) => {
                let node = |key: &str| {
                    m.get(key).filter(|n| {
                        m.len() == 1 && n.get("left").is_some() && n.get("attr").is_some()
                    })
                };
                if let Some(get) = node(".") {
                    if let Some(path) = inputs_path(e).filter(|p| !p.is_empty()) {
                        out.push(InputRef {
                            path,
                            tested: false,
                        });
                    } else {
                        walk(&get["left"], out);
                    }
                    return;
                }
                if let Some(has) = node("has") {
                    let Some(mut path) = inputs_path(&has["left"]) else {
                        return walk(&has["left"], out);
                    };
                    if !path.is_empty() {
                        out.push(InputRef {
                            path: path.clone(),
                            tested: false,
                        });
                    }
                    let names: Vec<&str> = match &has["attr"] {
                        Value::String(a) => vec![a.as_str()],
                        Value::Array(a) => a.iter().filter_map(Value::as_str).collect(),
                        _ => vec![],
                    };
                    for name in names {
                        path.push(name.to_string());
                        out.push(InputRef {
                            path: path.clone(),
                            tested: true,
                        });
                    }
                    return;
                }
                for v in m.values() {
                    walk(v, out);
                }
            }
            Value::Array(items) => items.iter().for_each(|v| walk(v, out)),
            _ => {}
        }
    }
    let mut out = Vec::new();
    if let Ok(est) = policy.to_json() {
        walk(&est, &mut out);
    }
    out.sort();
    out.dedup();
    // A read and a test of the same path: the test is the one that can silently be false.
    out.dedup_by(|b, a| {
        a.path == b.path && {
            a.tested |= b.tested;
            true
        }
    });
    out
}

/// The tools a policy's scope can match: its action constraint, narrowed by a resource
/// constraint on one tool (`resource == Tool::"…"`).
fn scoped_tools<'t>(
    policy: &Policy,
    tools: &[(&'t ToolConfig, &'t CedarType)],
) -> Vec<(&'t ToolConfig, &'t CedarType)> {
    let by_action = |name: &str| match policy.action_constraint() {
        ActionConstraint::Any => true,
        ActionConstraint::Eq(a) => a.id().unescaped() == name,
        ActionConstraint::In(list) => list.iter().any(|a| a.id().unescaped() == name),
    };
    let by_resource = |name: &str| match policy.resource_constraint() {
        ResourceConstraint::Eq(r) | ResourceConstraint::In(r) => r.id().unescaped() == name,
        _ => true,
    };
    tools
        .iter()
        .filter(|(t, _)| by_action(&t.name) && by_resource(&t.name))
        .copied()
        .collect()
}

fn quoted_names<'a>(names: impl IntoIterator<Item = &'a str>) -> String {
    names
        .into_iter()
        .map(|n| format!("'{n}'"))
        .collect::<Vec<_>>()
        .join(", ")
}

const SCHEMA_HINT: &str =
    "`toolgate check --cedar-schema` prints the inputs each tool's policies see";

/// The inputs checks, then Cedar's validator, for every policy: each problem once, in the
/// words of the input it is about.
fn check_policies(
    set: &PolicySet,
    info: &HashMap<String, PolicyInfo>,
    schema: &Schema,
    tools: &[(&ToolConfig, &CedarType)],
    problems: &mut Vec<PolicyProblem>,
    warnings: &mut Vec<PolicyProblem>,
) {
    let file_of = |id: &str| info.get(id).map(|i| i.file.clone()).unwrap_or_default();
    // Per policy, the input paths already explained (Cedar's own report of them is dropped)
    // and whether a `has` test was among them (Cedar then calls the policy impossible).
    let mut explained: HashMap<String, (Vec<String>, bool)> = HashMap::new();
    for p in set.policies() {
        let id = p.id().to_string();
        let file = file_of(&id);
        let scoped = scoped_tools(p, tools);
        if scoped.is_empty() {
            continue;
        }
        for r in input_refs(p) {
            let lookups: Vec<(&str, InputLookup<'_>)> = scoped
                .iter()
                .map(|(t, ty)| (t.name.as_str(), ty.lookup(&r.path)))
                .collect();
            let untyped: Vec<(&str, &String, &crate::schema::Untypable)> = lookups
                .iter()
                .filter_map(|(t, l)| match l {
                    InputLookup::Untyped { field, why } => Some((*t, field, *why)),
                    _ => None,
                })
                .collect();
            let problem = if let Some((_, field, why)) = untyped.first() {
                Some(
                    PolicyProblem::new(
                        &file,
                        Some(&id),
                        format!(
                            "`{}` names input `{field}` of {}, which has no Cedar type, so \
                             policies cannot see it: {why}",
                            r.expression(),
                            quoted_names(untyped.iter().map(|(t, _, _)| *t)),
                        ),
                    )
                    .fix(why.fix()),
                )
            } else if lookups
                .iter()
                .all(|(_, l)| matches!(l, InputLookup::Missing { .. }))
            {
                let field = match &lookups[0].1 {
                    InputLookup::Missing { field } => field.clone(),
                    _ => r.dotted(),
                };
                let consequence = if r.tested {
                    ": the test is always false, so the rule cannot work as written"
                } else {
                    ""
                };
                let known = match scoped.as_slice() {
                    [(t, ty)] => {
                        let parent = &r.path[..field.matches('.').count()];
                        let here = match ty.lookup(parent) {
                            InputLookup::Typed { ty, .. } => ty.attributes(),
                            _ => &[],
                        };
                        format!(
                            "; '{}' has {}",
                            t.name,
                            if here.is_empty() {
                                "none there".to_string()
                            } else {
                                here.iter()
                                    .map(|a| a.name.as_str())
                                    .collect::<Vec<_>>()
                                    .join(", ")
                            }
                        )
                    }
                    _ => String::new(),
                };
                Some(
                    PolicyProblem::new(
                        &file,
                        Some(&id),
                        format!(
                            "`{}` names input `{field}`, which no tool this policy applies to \
                             ({}) declares{consequence}",
                            r.expression(),
                            quoted_names(scoped.iter().map(|(t, _)| t.name.as_str())),
                        ),
                    )
                    .fix(format!(
                        "name an input the tool declares{known}; {SCHEMA_HINT}"
                    )),
                )
            } else {
                None
            };
            if let Some(problem) = problem {
                problems.push(problem);
                let entry = explained.entry(id.clone()).or_default();
                entry.0.push(format!("`inputs.{}`", r.dotted()));
                entry.1 |= r.tested || !untyped.is_empty();
            }
        }
    }

    let validation = Validator::new(schema.clone()).validate(set, ValidationMode::Strict);
    for err in validation.validation_errors() {
        let id = err.policy_id().to_string();
        let text = err.to_string();
        let (paths, _) = explained.get(&id).cloned().unwrap_or_default();
        if matches!(err, ValidationError::UnsafeAttributeAccess(_))
            && paths.iter().any(|p| text.contains(p.as_str()))
        {
            continue;
        }
        let problem = PolicyProblem::new(&file_of(&id), Some(&id), text.clone());
        problems.push(match err {
            ValidationError::UnsafeOptionalAttributeAccess(_) => unguarded_optional(problem, tools),
            _ => problem,
        });
    }
    for w in validation.validation_warnings() {
        let id = w.policy_id().to_string();
        let problem = PolicyProblem::new(&file_of(&id), Some(&id), w.to_string());
        match w {
            ValidationWarning::ImpossiblePolicy(_) => {
                if !explained.get(&id).is_some_and(|(_, tested)| *tested) {
                    problems.push(problem.fix(format!(
                        "a policy that can never match enforces nothing: check each `has` and \
                         comparison against the inputs and attributes it names; {SCHEMA_HINT}"
                    )));
                }
            }
            ValidationWarning::InvalidActionApplication(_) => problems.push(
                problem.fix(
                    "its principal, action and resource scopes can match no call: each tool is an \
                 action `Action::\"<tool>\"` on `resource` of type `Tool`, and callers are \
                 `Principal`s in a `Role`"
                        .into(),
                ),
            ),
            _ => warnings.push(problem),
        }
    }
}

/// Cedar's "unable to guarantee safety of access to optional attribute `inputs.x` … for
/// Action::"t"", in the words of the input: what happens to a call without it, and the guard.
fn unguarded_optional(
    mut problem: PolicyProblem,
    tools: &[(&ToolConfig, &CedarType)],
) -> PolicyProblem {
    let between = |text: &str, start: &str, end: char| -> Option<String> {
        let from = text.find(start)? + start.len();
        let len = text[from..].find(end)?;
        Some(text[from..from + len].to_string())
    };
    let attribute = between(&problem.message, "optional attribute `", '`');
    let tool = between(&problem.message, "Action::\"", '"');
    let Some(path) = attribute
        .as_deref()
        .and_then(|a| a.strip_prefix("inputs."))
        .map(str::to_string)
    else {
        return problem
            .fix("test the attribute first with `has` (`context has x && context.x …`)".into());
    };
    let why = tool
        .as_deref()
        .and_then(|t| tools.iter().find(|(c, _)| c.name == t))
        .map(|(c, _)| {
            format!(
                "input `{path}` of '{}' is optional ({})",
                c.name,
                why_optional(&c.input_schema, &path)
            )
        })
        .unwrap_or_else(|| format!("input `{path}` is optional"));
    problem.message = format!(
        "reads `context.inputs.{path}` without testing it first: {why}, and a call without it \
         would make this policy error, which refuses the call"
    );
    problem.fix(format!(
        "guard the read: `context.inputs has {path} && …` (in an `unless`, \
         `!(context.inputs has {path}) || …` refuses a call without it, on purpose)"
    ))
}

/// Why an input is optional, in the schema's terms.
fn why_optional(schema: &Value, path: &str) -> &'static str {
    if path.contains('.') {
        return "it, or an object it is in, is not required or allows null";
    }
    let required = schema
        .get("required")
        .and_then(Value::as_array)
        .is_some_and(|r| r.iter().any(|v| v.as_str() == Some(path)));
    if required {
        "its schema allows null, which policies see as absent"
    } else {
        "not in its schema's `required`"
    }
}

fn build_entities(
    tools: &[ToolConfig],
    principals: &[PrincipalConfig],
    schema: &Schema,
) -> Result<Entities, CoreError> {
    let entity = |e| CoreError::Entity(Box::new(e));
    let mut out = Vec::new();
    let mut roles: Vec<&str> = principals.iter().map(|p| p.role.as_str()).collect();
    roles.sort();
    roles.dedup();
    for r in &roles {
        out.push(Entity::new_no_attrs(uid("Role", r), Default::default()));
    }
    for p in principals {
        let attrs = HashMap::from([
            (
                "kind".to_string(),
                RestrictedExpression::new_string(p.kind.to_string()),
            ),
            (
                "role".to_string(),
                RestrictedExpression::new_string(p.role.clone()),
            ),
        ]);
        let parents = [uid("Role", &p.role)].into_iter().collect();
        out.push(Entity::new(uid("Principal", &p.id), attrs, parents).map_err(entity)?);
    }
    for t in tools {
        let s = |v: String| RestrictedExpression::new_string(v);
        let attrs = HashMap::from([
            ("effect".to_string(), s(t.effect.to_string())),
            ("tier".to_string(), s(t.tier.to_string())),
            ("sensitivity".to_string(), s(t.sensitivity.to_string())),
            ("version".to_string(), s(t.version.clone())),
            ("owner".to_string(), s(t.owner.clone())),
        ]);
        out.push(Entity::new(uid("Tool", &t.name), attrs, Default::default()).map_err(entity)?);
    }
    Entities::from_entities(out, Some(schema)).map_err(|e| CoreError::Entities(Box::new(e)))
}

#[cfg(test)]
#[path = "policy_tests.rs"]
mod tests;
