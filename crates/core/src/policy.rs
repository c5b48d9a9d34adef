//! Policies are Cedar. Grants permit; policies only take away: a `forbid` refuses a call, and a
//! `forbid` annotated `@gate` sends it to a person instead. Each policy carries `@id("…")`, the
//! name that appears in denials and the audit log.
//!
//! The Cedar schema is generated from the registry: `Principal` (in a `Role`), `Tool`, one action
//! per tool, and a context with the purpose, the tool's typed inputs and the run so far. Policies
//! are validated against it at load, so one that names a missing input fails there.

use std::collections::HashMap;
use std::str::FromStr;

use cedar_policy::{
    Authorizer, Context, Decision as CedarDecision, Entities, Entity, EntityId, EntityTypeName,
    EntityUid, PolicyId, PolicySet, Request, RestrictedExpression, Schema, ValidationMode,
    Validator,
};
use serde_json::{Value, json};

use crate::config::{PrincipalConfig, ToolConfig};
use crate::schema::CedarType;

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
                    });
                    continue;
                }
                if info.contains_key(&id) {
                    problems.push(PolicyProblem {
                        file: file.clone(),
                        policy: Some(id.clone()),
                        message: format!("duplicate policy id '{id}'; each @id must be unique"),
                    });
                    continue;
                }
                let named = p.new_id(PolicyId::new(&id));
                if let Err(e) = set.add(named) {
                    problems.push(PolicyProblem {
                        file: file.clone(),
                        policy: Some(id.clone()),
                        message: e.to_string(),
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
        let validation = Validator::new(schema.clone()).validate(&set, ValidationMode::Strict);
        for err in validation.validation_errors() {
            let id = err.policy_id().to_string();
            let file = info.get(&id).map(|i| i.file.clone()).unwrap_or_default();
            problems.push(PolicyProblem {
                file,
                policy: Some(id),
                message: err.to_string(),
            });
        }
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
                message: m,
            }]
        })?;
        Ok(Policies {
            by_action,
            empty: PolicySet::new(),
            entities,
            info,
            authorizer: Authorizer::new(),
            schema: schema_json,
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

    /// Evaluates every policy for one call.
    pub fn evaluate(
        &self,
        principal: &EntityUid,
        action: &EntityUid,
        resource: &EntityUid,
        context: Vec<(String, RestrictedExpression)>,
    ) -> PolicyVerdict {
        let mut verdict = PolicyVerdict::default();
        let context = match Context::from_pairs(context) {
            Ok(c) => c,
            Err(e) => {
                verdict.errors.push(e.to_string());
                return verdict;
            }
        };
        let request = match Request::new(
            principal.clone(),
            action.clone(),
            resource.clone(),
            context,
            None,
        ) {
            Ok(r) => r,
            Err(e) => {
                verdict.errors.push(e.to_string());
                return verdict;
            }
        };
        let set = self
            .by_action
            .get(action.id().unescaped())
            .unwrap_or(&self.empty);
        let response = self.authorizer.is_authorized(&request, set, &self.entities);
        for e in response.diagnostics().errors() {
            verdict.errors.push(e.to_string());
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
        verdict
    }

    /// Whether any policy is in shadow mode (then shadow policies are evaluated on their own).
    pub fn has_shadow(&self) -> bool {
        self.info.values().any(|p| p.shadow)
    }
}

fn build_entities(
    tools: &[ToolConfig],
    principals: &[PrincipalConfig],
    schema: &Schema,
) -> Result<Entities, String> {
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
        out.push(Entity::new(uid("Principal", &p.id), attrs, parents).map_err(|e| e.to_string())?);
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
        out.push(
            Entity::new(uid("Tool", &t.name), attrs, Default::default())
                .map_err(|e| e.to_string())?,
        );
    }
    Entities::from_entities(out, Some(schema)).map_err(|e| e.to_string())
}
