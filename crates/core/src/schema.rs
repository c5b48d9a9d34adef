//! Input schemas, compiled once at load. Validation is server-side and total: a call whose inputs
//! do not pass never reaches a policy, a gate or a handler. Failures name the field, the
//! constraint and the values that would pass, so a model can correct the call.
//!
//! The same schema also gives the Cedar type of each input, so policies can read typed inputs
//! (`context.inputs.amount`) and a policy naming a field the tool does not have fails validation.

use std::fmt;

use cedar_policy::RestrictedExpression;
use jsonschema::error::{TypeKind, ValidationErrorKind};
use serde_json::{Value, json};

/// A compiled, closed input schema.
pub struct InputSchema {
    raw: Value,
    validator: jsonschema::Validator,
    cedar: CedarType,
}

impl fmt::Debug for InputSchema {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("InputSchema")
            .field("raw", &self.raw)
            .finish()
    }
}

/// One reason the inputs were refused.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct FieldError {
    /// JSON pointer to the offending value (`/amount`), or `/` for the whole object.
    pub field: String,
    /// The JSON Schema keyword that fired (`maximum`, `pattern`, `additionalProperties`…).
    pub constraint: String,
    /// What would pass.
    pub expected: String,
}

impl fmt::Display for FieldError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "field '{}' fails '{}': {}",
            self.field, self.constraint, self.expected
        )
    }
}

impl InputSchema {
    /// Compiles a schema; formats are validated (a `date` must be a date).
    pub fn compile(raw: &Value) -> Result<Self, String> {
        let validator = jsonschema::options()
            .should_validate_formats(true)
            .build(raw)
            .map_err(|e| e.to_string())?;
        Ok(InputSchema {
            raw: raw.clone(),
            validator,
            cedar: CedarType::of(raw),
        })
    }

    pub fn raw(&self) -> &Value {
        &self.raw
    }

    pub fn cedar_type(&self) -> &CedarType {
        &self.cedar
    }

    /// Validates inputs; on failure, every violated constraint with a readable fix.
    pub fn validate(&self, inputs: &Value) -> Result<(), Vec<FieldError>> {
        if self.validator.is_valid(inputs) {
            return Ok(());
        }
        let errors: Vec<FieldError> = self
            .validator
            .iter_errors(inputs)
            .map(|e| self.explain(&e))
            .collect();
        Err(errors)
    }

    fn explain(&self, e: &jsonschema::ValidationError<'_>) -> FieldError {
        let mut field = e.instance_path().as_str().to_string();
        if field.is_empty() {
            field = "/".to_string();
        }
        let schema_path = e.schema_path().as_str();
        let keyword = schema_path.rsplit('/').next().unwrap_or("").to_string();
        let parent = self.raw.pointer(
            schema_path
                .rsplit_once('/')
                .map(|(p, _)| p)
                .unwrap_or_default(),
        );
        let expected = match e.kind() {
            ValidationErrorKind::AdditionalProperties { unexpected } => {
                let allowed = parent
                    .and_then(|p| p.get("properties"))
                    .and_then(Value::as_object)
                    .map(|m| m.keys().cloned().collect::<Vec<_>>().join(", "))
                    .unwrap_or_default();
                let base = if field == "/" {
                    String::new()
                } else {
                    field.clone()
                };
                field = format!("{base}/{}", unexpected.join(","));
                format!(
                    "unexpected field(s) {}; the allowed fields are: {allowed}",
                    unexpected
                        .iter()
                        .map(|u| format!("'{u}'"))
                        .collect::<Vec<_>>()
                        .join(", ")
                )
            }
            ValidationErrorKind::Required { property } => {
                let name = property.as_str().unwrap_or_default();
                let base = if field == "/" {
                    String::new()
                } else {
                    field.clone()
                };
                field = format!("{base}/{name}");
                "this field is required".to_string()
            }
            ValidationErrorKind::Enum { options } => format!("must be one of {options}"),
            ValidationErrorKind::Constant { expected_value } => {
                format!("must be exactly {expected_value}")
            }
            ValidationErrorKind::Maximum { limit } => format!("must be at most {limit}"),
            ValidationErrorKind::Minimum { limit } => format!("must be at least {limit}"),
            ValidationErrorKind::ExclusiveMaximum { limit } => format!("must be below {limit}"),
            ValidationErrorKind::ExclusiveMinimum { limit } => format!("must be above {limit}"),
            ValidationErrorKind::MaxLength { limit } => {
                format!("must be at most {limit} characters")
            }
            ValidationErrorKind::MinLength { limit } => {
                format!("must be at least {limit} characters")
            }
            ValidationErrorKind::MaxItems { limit } => format!("must have at most {limit} items"),
            ValidationErrorKind::MinItems { limit } => {
                format!("must have at least {limit} items")
            }
            ValidationErrorKind::Pattern { pattern } => format!("must match the pattern {pattern}"),
            ValidationErrorKind::Format { format } => format!("must be a valid {format}"),
            ValidationErrorKind::Type { kind } => match kind {
                TypeKind::Single(t) => format!("must be of type {t}"),
                TypeKind::Multiple(ts) => format!("must be of type {ts:?}"),
            },
            ValidationErrorKind::MultipleOf { .. } => e.to_string(),
            _ => e.to_string(),
        };
        FieldError {
            field,
            constraint: keyword,
            expected,
        }
    }
}

/// The Cedar type of an input, derived from its JSON Schema. Inputs of a shape Cedar cannot
/// type (unions, open maps) are left out of the policy context, so a policy cannot name them.
#[derive(Debug, Clone, PartialEq)]
pub enum CedarType {
    Long,
    /// Cedar's `decimal` (four fraction digits): JSON Schema `number`, such as an amount.
    Decimal,
    String,
    Bool,
    Set(Box<CedarType>),
    Record(Vec<(String, CedarType, bool)>),
    Untyped,
}

impl CedarType {
    pub fn of(schema: &Value) -> CedarType {
        let ty = schema.get("type").and_then(Value::as_str);
        let ty = ty.or_else(|| {
            // A bare enum or const of strings is still a string.
            let probe = schema
                .get("enum")
                .and_then(|e| e.get(0))
                .or_else(|| schema.get("const"))?;
            probe.is_string().then_some("string")
        });
        match ty {
            Some("integer") => CedarType::Long,
            Some("number") => CedarType::Decimal,
            Some("string") => CedarType::String,
            Some("boolean") => CedarType::Bool,
            Some("array") => match schema.get("items") {
                Some(items) => match CedarType::of(items) {
                    CedarType::Untyped => CedarType::Untyped,
                    t => CedarType::Set(Box::new(t)),
                },
                None => CedarType::Untyped,
            },
            Some("object") => {
                let required: Vec<&str> = schema
                    .get("required")
                    .and_then(Value::as_array)
                    .map(|a| a.iter().filter_map(Value::as_str).collect())
                    .unwrap_or_default();
                let attrs = schema
                    .get("properties")
                    .and_then(Value::as_object)
                    .map(|props| {
                        props
                            .iter()
                            .filter_map(|(k, v)| match CedarType::of(v) {
                                CedarType::Untyped => None,
                                t => Some((k.clone(), t, required.contains(&k.as_str()))),
                            })
                            .collect()
                    })
                    .unwrap_or_default();
                CedarType::Record(attrs)
            }
            _ => CedarType::Untyped,
        }
    }

    /// The type in Cedar's JSON schema format.
    pub fn to_cedar_schema(&self) -> Value {
        match self {
            CedarType::Long => json!({"type": "Long"}),
            CedarType::Decimal => json!({"type": "Extension", "name": "decimal"}),
            CedarType::String => json!({"type": "String"}),
            CedarType::Bool => json!({"type": "Boolean"}),
            CedarType::Set(t) => json!({"type": "Set", "element": t.to_cedar_schema()}),
            CedarType::Record(attrs) => {
                let mut m = serde_json::Map::new();
                for (k, t, req) in attrs {
                    let mut s = t.to_cedar_schema();
                    s["required"] = Value::Bool(*req);
                    m.insert(k.clone(), s);
                }
                json!({"type": "Record", "attributes": m})
            }
            CedarType::Untyped => json!({"type": "Record", "attributes": {}}),
        }
    }

    /// Converts a schema-valid value into a Cedar expression of this type.
    pub fn to_cedar(&self, value: &Value) -> Result<RestrictedExpression, String> {
        Ok(match (self, value) {
            (CedarType::Long, Value::Number(n)) => {
                RestrictedExpression::new_long(n.as_i64().ok_or("integer out of range")?)
            }
            (CedarType::Decimal, Value::Number(n)) => {
                RestrictedExpression::new_decimal(to_decimal(n)?)
            }
            (CedarType::String, Value::String(s)) => RestrictedExpression::new_string(s.clone()),
            (CedarType::Bool, Value::Bool(b)) => RestrictedExpression::new_bool(*b),
            (CedarType::Set(t), Value::Array(items)) => RestrictedExpression::new_set(
                items
                    .iter()
                    .map(|i| t.to_cedar(i))
                    .collect::<Result<Vec<_>, _>>()?,
            ),
            (CedarType::Record(attrs), Value::Object(map)) => {
                let mut fields = Vec::with_capacity(attrs.len());
                for (k, t, _) in attrs {
                    if let Some(v) = map.get(k) {
                        fields.push((k.clone(), t.to_cedar(v)?));
                    }
                }
                RestrictedExpression::new_record(fields).map_err(|e| e.to_string())?
            }
            (CedarType::Untyped, _) => RestrictedExpression::new_record([]).expect("empty record"),
            (t, v) => return Err(format!("value {v} is not a {t:?}")),
        })
    }
}

/// A JSON number as a Cedar decimal literal. Cedar decimals have four fraction digits; a number
/// that needs more cannot be compared exactly and is refused rather than rounded.
fn to_decimal(n: &serde_json::Number) -> Result<String, String> {
    if let Some(i) = n.as_i64() {
        return Ok(format!("{i}.0"));
    }
    let f = n.as_f64().ok_or("number is not finite")?;
    let s = format!("{f:.4}");
    let back: f64 = s.parse().map_err(|_| "number cannot be formatted")?;
    if (back - f).abs() > f64::EPSILON * f.abs().max(1.0) {
        return Err(format!(
            "{n} has more than four fraction digits; policies cannot compare it exactly"
        ));
    }
    if f.abs() >= 922_337_203_685_477.0 {
        return Err(format!("{n} is outside the range policies can compare"));
    }
    Ok(s)
}

#[cfg(test)]
#[path = "schema_tests.rs"]
mod tests;
