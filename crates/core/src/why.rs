//! Why a call is made — its purpose and its reason — from wherever an ordinary client can give
//! it. An MCP client used as its README shows sends no `_meta`, so besides `_meta.purpose` and
//! `_meta.reason` a tool may list `purpose` and `reason` as arguments the model fills in like any
//! other (checked here, recorded, and stripped before the call is forwarded), and a caller may
//! carry a default purpose. Precedence, first that applies: `_meta`, the argument, the
//! credential's default, the principal's, the role's, and the only purpose the caller's grants
//! allow for the tool.
//!
//! The key of a direct call belongs here too: it names the operation (scope, tool, identity
//! fields), never the connection it arrived on.

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value, json};

use crate::canon::IdempotencyKey;
use crate::config::{CallField, KeyScope, LengthBounds};
use crate::model::Effect;
use crate::registry::{Principal, Registry, Tool};
use crate::schema::FieldError;

/// Where a call's purpose came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum PurposeSource {
    /// `_meta.purpose`.
    Meta,
    /// The `purpose` argument the tool lists.
    Argument,
    /// The default purpose of the credential the call was made with.
    Credential,
    /// The principal's default purpose.
    Principal,
    /// The default purpose of the principal's role.
    Role,
    /// The only purpose the caller's grants allow for this tool.
    OnlyGranted,
}

/// Where a call's reason came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ReasonSource {
    /// `_meta.reason`.
    Meta,
    /// The `reason` argument the tool lists.
    Argument,
    /// The tool's own input named by `reason_from`.
    Input,
}

/// A call's purpose and reason, and where each came from.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Why {
    pub purpose: Option<String>,
    pub purpose_from: Option<PurposeSource>,
    pub reason: Option<String>,
    pub reason_from: Option<ReasonSource>,
}

/// A `tools/call`'s arguments split into the tool's own inputs and toolgate's fields.
#[derive(Debug, Clone, PartialEq)]
pub struct Split {
    /// The tool's inputs, without the governance arguments: what is checked against the
    /// tool's schema, keyed, stored and forwarded.
    pub inputs: Value,
    pub why: Why,
    /// Governance arguments that do not pass (refused by the schema check).
    pub errors: Vec<FieldError>,
}

/// The `purpose` argument as listed to one caller.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AskedPurpose {
    /// The purposes this caller may use the tool for.
    pub allowed: Vec<String>,
    /// Required when no default applies.
    pub required: bool,
}

/// The `reason` argument as listed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AskedReason {
    pub length: LengthBounds,
    /// Required for a tool that changes state.
    pub required: bool,
}

/// What a tool lists of toolgate's own fields to one caller.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Asked {
    pub purpose: Option<AskedPurpose>,
    pub reason: Option<AskedReason>,
}

/// The credential a call was made with, for its default purpose.
pub type CredentialId<'a> = Option<&'a str>;

impl Tool {
    /// Whether `field` can be given as an argument of this tool: not when the tool's own inputs
    /// have a property of that name (it is the tool's), nor a reason when `reason_from` names
    /// the input that carries it.
    pub fn accepts(&self, field: CallField) -> bool {
        let own = self
            .config
            .input_schema
            .pointer(&format!("/properties/{}", field.as_str()))
            .is_some();
        let carried_by_input = field == CallField::Reason && self.config.reason_from.is_some();
        !(own || carried_by_input)
    }

    fn length(&self) -> LengthBounds {
        self.config.reason_length.unwrap_or_default()
    }
}

impl Registry {
    /// The purposes `principal` may use `tool` for: the tool's purposes that one of its
    /// grants covers together with all of the tool's scopes.
    pub fn purposes_for(&self, principal: &Principal, tool: &Tool) -> Vec<String> {
        tool.config
            .purposes
            .iter()
            .filter(|p| {
                principal.config.grants.iter().any(|g| {
                    g.purposes.contains(p)
                        && tool.config.scopes.iter().all(|s| g.scopes.contains(s))
                })
            })
            .cloned()
            .collect()
    }

    /// The purpose of a call that states none, and where it came from: the first configured
    /// default (credential, principal, role) that the caller may use the tool for, else the
    /// only purpose it may use the tool for.
    pub fn default_purpose(
        &self,
        principal: &Principal,
        credential: CredentialId<'_>,
        tool: &Tool,
    ) -> Option<(String, PurposeSource)> {
        let allowed = self.purposes_for(principal, tool);
        let credential_default = credential.and_then(|id| {
            principal
                .config
                .credentials
                .iter()
                .find(|c| c.id == id)
                .and_then(|c| c.default_purpose.clone())
        });
        let role_default = self
            .role(principal.role())
            .and_then(|r| r.default_purpose.clone());
        let configured = [
            (credential_default, PurposeSource::Credential),
            (
                principal.config.default_purpose.clone(),
                PurposeSource::Principal,
            ),
            (role_default, PurposeSource::Role),
        ];
        for (purpose, source) in configured {
            if let Some(p) = purpose.filter(|p| allowed.contains(p)) {
                return Some((p, source));
            }
        }
        match allowed.as_slice() {
            [only] => Some((only.clone(), PurposeSource::OnlyGranted)),
            _ => None,
        }
    }

    /// Which of toolgate's fields `tool` lists as arguments to this caller. An explicit `ask`
    /// lists exactly those; without one, `reason` for a tool that changes state (unless
    /// `reason_from` carries it) and `purpose` when no default applies and the caller may use
    /// the tool for more than one purpose.
    pub fn asked(&self, principal: &Principal, credential: CredentialId<'_>, tool: &Tool) -> Asked {
        let cfg = &tool.config;
        let allowed = self.purposes_for(principal, tool);
        let default = self.default_purpose(principal, credential, tool);
        let changes_state = cfg.effect != Effect::Read;
        let (purpose, reason) = match &cfg.ask {
            Some(list) => (
                list.contains(&CallField::Purpose),
                list.contains(&CallField::Reason),
            ),
            None => (
                default.is_none() && allowed.len() > 1,
                changes_state && cfg.reason_from.is_none(),
            ),
        };
        Asked {
            purpose: (purpose && tool.accepts(CallField::Purpose)).then(|| AskedPurpose {
                allowed,
                required: default.is_none(),
            }),
            reason: (reason && tool.accepts(CallField::Reason)).then(|| AskedReason {
                length: tool.length(),
                required: changes_state,
            }),
        }
    }

    /// The input schema `tool` is listed with to this caller: the declared one, with the
    /// asked arguments added as properties (required where they must be given).
    pub fn listed_schema(
        &self,
        principal: &Principal,
        credential: CredentialId<'_>,
        tool: &Tool,
    ) -> Value {
        let asked = self.asked(principal, credential, tool);
        let mut schema = tool.config.input_schema.clone();
        if asked.purpose.is_none() && asked.reason.is_none() {
            return schema;
        }
        let Some(obj) = schema.as_object_mut() else {
            return schema;
        };
        let mut add = |name: &str, prop: Value, required: bool| {
            let props = obj
                .entry("properties")
                .or_insert_with(|| Value::Object(Map::new()));
            if let Some(p) = props.as_object_mut() {
                p.insert(name.to_string(), prop);
            }
            if required {
                let req = obj
                    .entry("required")
                    .or_insert_with(|| Value::Array(Vec::new()));
                if let Some(r) = req.as_array_mut() {
                    r.push(json!(name));
                }
            }
        };
        if let Some(p) = &asked.purpose {
            add(
                "purpose",
                json!({
                    "type": "string",
                    "enum": p.allowed,
                    "description": "Why this call is made: the business purpose it serves. \
                                    Checked against your grants and recorded.",
                }),
                p.required,
            );
        }
        if let Some(r) = &asked.reason {
            add(
                "reason",
                json!({
                    "type": "string",
                    "minLength": r.length.min,
                    "maxLength": r.length.max,
                    "description": "In one sentence, why this exact call is needed now (for \
                                    the audit log and any person who approves it).",
                }),
                r.required,
            );
        }
        schema
    }

    /// Splits a call's arguments into the tool's inputs and its purpose and reason. `_meta`
    /// wins over an argument; an argument over the caller's defaults. Arguments named
    /// `purpose`/`reason` are taken as toolgate's whenever the tool's own inputs have no such
    /// property, listed or not. A tool this caller may not use is not split (its refusal
    /// does not depend on it).
    pub fn split_call(
        &self,
        principal: &Principal,
        credential: CredentialId<'_>,
        tool: &Tool,
        arguments: Map<String, Value>,
        meta_purpose: Option<&str>,
        meta_reason: Option<&str>,
    ) -> Split {
        let mut inputs = arguments;
        let mut errors = Vec::new();
        let mut take = |field: CallField, errors: &mut Vec<FieldError>| -> Option<String> {
            if !tool.accepts(field) {
                return None;
            }
            let v = inputs.remove(field.as_str())?;
            match v {
                Value::String(s) if !s.trim().is_empty() => Some(s),
                _ => {
                    errors.push(FieldError {
                        field: format!("/{}", field.as_str()),
                        constraint: "type".into(),
                        expected: "a non-empty string".into(),
                    });
                    None
                }
            }
        };
        let purpose_arg = take(CallField::Purpose, &mut errors);
        let reason_arg = take(CallField::Reason, &mut errors);
        if let Some(p) = &purpose_arg
            && !tool.config.purposes.contains(p)
        {
            errors.push(FieldError {
                field: "/purpose".into(),
                constraint: "enum".into(),
                expected: format!("one of: {}", tool.config.purposes.join(", ")),
            });
        }
        if let Some(r) = &reason_arg {
            let n = r.chars().count();
            let b = tool.length();
            if n < b.min as usize {
                errors.push(FieldError {
                    field: "/reason".into(),
                    constraint: "minLength".into(),
                    expected: format!("at least {} characters (got {n})", b.min),
                });
            } else if n > b.max as usize {
                errors.push(FieldError {
                    field: "/reason".into(),
                    constraint: "maxLength".into(),
                    expected: format!("at most {} characters (got {n})", b.max),
                });
            }
        }
        let mut why = Why::default();
        if let Some(p) = meta_purpose {
            why.purpose = Some(p.to_string());
            why.purpose_from = Some(PurposeSource::Meta);
        } else if let Some(p) = purpose_arg {
            why.purpose = Some(p);
            why.purpose_from = Some(PurposeSource::Argument);
        } else if let Some((p, source)) = self.default_purpose(principal, credential, tool) {
            why.purpose = Some(p);
            why.purpose_from = Some(source);
        }
        let from_input = tool
            .config
            .reason_from
            .as_ref()
            .and_then(|f| inputs.get(f))
            .and_then(Value::as_str)
            .filter(|s| !s.trim().is_empty())
            .map(str::to_string);
        if let Some(r) = meta_reason {
            why.reason = Some(r.to_string());
            why.reason_from = Some(ReasonSource::Meta);
        } else if let Some(r) = reason_arg {
            why.reason = Some(r);
            why.reason_from = Some(ReasonSource::Argument);
        } else if let Some(r) = from_input {
            why.reason = Some(r);
            why.reason_from = Some(ReasonSource::Input);
        }
        Split {
            inputs: Value::Object(inputs),
            why,
            errors,
        }
    }

    /// The scope a direct call's key is derived in: the caller, its tree (named by its root
    /// ancestor), or the whole registry, as the tool declares.
    pub fn key_scope(&self, principal: &str, tool: &Tool) -> String {
        match tool.config.idempotency.scope {
            KeyScope::Principal => format!("principal:{principal}"),
            KeyScope::Tree => {
                let root = self
                    .principal(principal)
                    .and_then(|p| p.ancestors.last().cloned())
                    .unwrap_or_else(|| principal.to_string());
                format!("tree:{root}")
            }
            KeyScope::Registry => "registry".into(),
        }
    }

    /// The idempotency key of a direct call of `tool` by `principal`: its scope, the tool and
    /// the identity fields of the inputs. The same operation has the same key from any
    /// session, after any reconnect, from a stateless client.
    pub fn call_key(&self, principal: &str, tool: &Tool, inputs: &Value) -> IdempotencyKey {
        IdempotencyKey::for_call(
            &self.key_scope(principal, tool),
            tool.name(),
            &tool.config.identity,
            inputs,
        )
    }
}

/// Whether a direct call of `tool` replays a stored outcome when repeated: always for a tool
/// that changes state, for a read only when it opts in.
pub fn replays(tool: &Tool) -> bool {
    tool.config.effect != Effect::Read || tool.config.idempotency.replay == Some(true)
}

#[cfg(test)]
#[path = "why_tests.rs"]
mod tests;
