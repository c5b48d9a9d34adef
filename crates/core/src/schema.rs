//! Input schemas, compiled once at load. Validation is server-side and total: a call whose inputs
//! do not pass never reaches a policy, a gate or a handler. Failures name the field, the
//! constraint and the values that would pass, so a model can correct the call.
//!
//! The same schema also gives the Cedar type of each input, so policies can read typed inputs
//! (`context.inputs.amount`) and a policy naming a field the tool does not have fails validation.
//! Every shape real servers publish (pydantic's `anyOf: [T, null]` for an optional field,
//! `$ref`s into `$defs`, enums, nested objects) is typed or left out with its reason, never
//! dropped silently: a rule over an input policies cannot see must not load and never fire.

use std::fmt;

use cedar_policy::RestrictedExpression;
use jsonschema::error::{TypeKind, ValidationErrorKind};
use serde_json::{Value, json};

use crate::error::CoreError;

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
    pub fn compile(raw: &Value) -> Result<Self, CoreError> {
        let validator = jsonschema::options()
            .should_validate_formats(true)
            .build(raw)
            .map_err(|e| CoreError::Schema(Box::new(e)))?;
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

/// The Cedar type of a tool's inputs, derived from its JSON Schema: what policies see as
/// `context.inputs`. Every property gets a Cedar type or is left out on purpose, with the
/// reason kept ([`AttributeKind::Untyped`]), so a policy that names it is refused at load with
/// that reason instead of loading and never firing. The rules, shape by shape:
///
/// | JSON Schema | Cedar |
/// |---|---|
/// | `string` (any `format`, `pattern`) | `String` |
/// | `integer` | `Long` |
/// | `number`, or `integer` and `number` together | `decimal` (four fraction digits) |
/// | `boolean` | `Boolean` |
/// | `enum` / `const` of one JSON type | that type |
/// | `array` with one `items` schema | `Set` of the item type |
/// | `object` with `properties` | `Record`; required if in `required` and not nullable |
/// | `anyOf`/`oneOf` with `{type: null}`, `type: [T, "null"]` | an optional attribute of type T |
/// | `anyOf`/`oneOf` of alternatives of one type (formats, object shapes) | that type (object shapes merge; attributes not in every alternative are optional) |
/// | `allOf` | the alternatives' common type (objects merge) |
/// | `$ref` to `#/$defs/…`, `#/definitions/…` (any local pointer) | the target's type |
/// | a `$ref` back into itself (a tree) | typed down to the recursion, which is left out |
/// | a union of different types, a map (`additionalProperties` without `properties`), a tuple (`prefixItems`), an array of nullable or untyped items, `{}`, only `null` | left out, with the reason |
///
/// Formats stay strings: Cedar's `datetime` and `ip` accept narrower grammars than RFC 3339 and
/// RFC 4291, so converting would refuse calls the schema accepts or rewrite their values.
#[derive(Debug, Clone, PartialEq)]
pub enum CedarType {
    Long,
    /// Cedar's `decimal` (four fraction digits): JSON Schema `number`, such as an amount.
    Decimal,
    String,
    Bool,
    Set(Box<CedarType>),
    Record(Vec<Attribute>),
}

/// One property of an object input.
#[derive(Debug, Clone, PartialEq)]
pub struct Attribute {
    pub name: String,
    pub kind: AttributeKind,
}

/// Whether policies can see a property, and as what.
#[derive(Debug, Clone, PartialEq)]
pub enum AttributeKind {
    /// In the Cedar schema. `required` only when the JSON Schema requires it and does not
    /// allow `null` (a `null` value is passed to policies as an absent attribute).
    Typed { ty: CedarType, required: bool },
    /// Declared in the input schema but of a shape with no Cedar type: not in the Cedar
    /// schema, and a policy that names it is refused at load, saying why.
    Untyped(Untypable),
}

/// Why an input has no Cedar type.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Untypable {
    /// Alternatives of different types (`anyOf: [string, integer]`, `type: [string, number]`).
    Union(Vec<String>),
    /// An object without declared properties: its keys are data (`dict[str, str]`).
    Map,
    /// An array whose positions differ in meaning (`prefixItems`, a Python tuple).
    Tuple,
    /// A schema that allows any JSON value (`{}`, `true`, only a description).
    AnyValue,
    /// Only `null` passes.
    OnlyNull,
    /// No value passes (`false`, an `allOf` that contradicts itself).
    NoValue,
    /// A `$ref` to a definition that contains it (a tree of itself).
    Recursive(String),
    /// A `$ref` that does not point inside this schema.
    Unresolved(String),
    /// A keyword toolgate does not type (`$dynamicRef`, an unknown `type`).
    Unsupported(String),
    /// An array whose items have no Cedar type.
    Items(Box<Untypable>),
    /// An array whose items may be `null`: a Cedar set cannot hold an absent value.
    NullableItems,
    /// Nested deeper, or through more subschemas, than toolgate follows.
    TooLarge,
}

impl fmt::Display for Untypable {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Untypable::Union(types) => write!(
                f,
                "it is one of several types ({}), and a Cedar attribute has exactly one",
                types.join(" | ")
            ),
            Untypable::Map => f.write_str(
                "it is an object without declared properties (a map whose keys are data), and \
                 Cedar records have fixed attribute names",
            ),
            Untypable::Tuple => f.write_str(
                "it is an array whose positions differ in meaning (a tuple), and a Cedar set has \
                 no positions",
            ),
            Untypable::AnyValue => f.write_str("its schema allows any JSON value"),
            Untypable::OnlyNull => f.write_str("it can only be null"),
            Untypable::NoValue => f.write_str("no value passes its schema"),
            Untypable::Recursive(r) => write!(
                f,
                "it refers back to `{r}`, which contains it (a recursive structure), and Cedar \
                 types are finite"
            ),
            Untypable::Unresolved(r) => {
                write!(f, "its `$ref` `{r}` does not point inside this schema")
            }
            Untypable::Unsupported(what) => write!(f, "it uses {what}, which toolgate cannot type"),
            Untypable::Items(inner) => write!(f, "its items have no Cedar type: {inner}"),
            Untypable::NullableItems => {
                f.write_str("its items may be null, and a Cedar set cannot hold an absent value")
            }
            Untypable::TooLarge => write!(
                f,
                "its schema nests deeper than {MAX_DEPTH} levels or through more than \
                 {MAX_SUBSCHEMAS} subschemas"
            ),
        }
    }
}

impl Untypable {
    /// What a registry author can do about it.
    pub fn fix(&self) -> String {
        let tail = "or write the rule over an input that has a type";
        match self {
            Untypable::Union(_) => format!(
                "give the input one type in the tool's input_schema (a value that may come as a \
                 number or a string: `type: number`), {tail}"
            ),
            Untypable::Map => format!(
                "declare the keys a rule needs under `properties` (with `additionalProperties: \
                 false`), {tail}"
            ),
            Untypable::Tuple => format!(
                "declare it as an object with named properties, or an array of one item type, {tail}"
            ),
            Untypable::AnyValue | Untypable::OnlyNull | Untypable::NoValue => {
                format!("give the input a `type` in the tool's input_schema, {tail}")
            }
            Untypable::Recursive(_) => format!(
                "policies can read the levels above the recursion; if a rule needs a deeper \
                 level, declare that level's properties without the `$ref`, {tail}"
            ),
            Untypable::Unresolved(_) => {
                format!("point the `$ref` at `#/$defs/<name>` inside the schema, {tail}")
            }
            Untypable::Unsupported(_) | Untypable::TooLarge => {
                format!("describe the input with plain `type`, `properties` and `items`, {tail}")
            }
            Untypable::Items(inner) => inner.fix(),
            Untypable::NullableItems => {
                format!("drop `null` from the item schema (`items: {{type: string}}`), {tail}")
            }
        }
    }
}

/// How deep a schema's typing follows nesting and `$ref`s, and how many subschemas in all:
/// a bound on the work a hostile or generated schema can cause at load.
const MAX_DEPTH: usize = 32;
const MAX_SUBSCHEMAS: usize = 10_000;

/// What one path under `context.inputs` names.
#[derive(Debug, Clone, PartialEq)]
pub enum InputLookup<'t> {
    /// A typed input; `optional` when it or any record on the way may be absent.
    Typed { ty: &'t CedarType, optional: bool },
    /// An input (at `field`, a prefix of the path) declared without a Cedar type.
    Untyped { field: String, why: &'t Untypable },
    /// No such input: `field` is the path up to the first name that is not there.
    Missing { field: String },
}

impl CedarType {
    /// The type of a tool's inputs. The top level is a record; a schema that is not an object
    /// with properties gives an empty one (the lint reports `schema.not-object`).
    pub fn of(schema: &Value) -> CedarType {
        let mut mapper = Mapper {
            root: schema,
            refs: vec!["#"],
            seen: 0,
        };
        match mapper.node(schema, 0) {
            Shape::Typed {
                ty: t @ CedarType::Record(_),
                ..
            } => t,
            _ => CedarType::Record(Vec::new()),
        }
    }

    /// A short name for messages: `string`, `set of integer`, `object`.
    pub fn describe(&self) -> String {
        match self {
            CedarType::Long => "integer".into(),
            CedarType::Decimal => "number".into(),
            CedarType::String => "string".into(),
            CedarType::Bool => "boolean".into(),
            CedarType::Set(t) => format!("set of {}", t.describe()),
            CedarType::Record(_) => "object".into(),
        }
    }

    /// The attributes of a record (none for other types).
    pub fn attributes(&self) -> &[Attribute] {
        match self {
            CedarType::Record(a) => a,
            _ => &[],
        }
    }

    /// What `context.inputs.<path>` names.
    pub fn lookup<'t, S: AsRef<str>>(&'t self, path: &[S]) -> InputLookup<'t> {
        let mut here = self;
        let mut optional = false;
        let mut field = String::new();
        for segment in path {
            let name = segment.as_ref();
            if !field.is_empty() {
                field.push('.');
            }
            field.push_str(name);
            let Some(attr) = here.attributes().iter().find(|a| a.name == name) else {
                return InputLookup::Missing { field };
            };
            match &attr.kind {
                AttributeKind::Untyped(why) => return InputLookup::Untyped { field, why },
                AttributeKind::Typed { ty, required } => {
                    optional |= !required;
                    here = ty;
                }
            }
        }
        InputLookup::Typed { ty: here, optional }
    }

    /// The type in Cedar's JSON schema format. Untyped attributes are left out.
    pub fn to_cedar_schema(&self) -> Value {
        match self {
            CedarType::Long => json!({"type": "Long"}),
            CedarType::Decimal => json!({"type": "Extension", "name": "decimal"}),
            CedarType::String => json!({"type": "String"}),
            CedarType::Bool => json!({"type": "Boolean"}),
            CedarType::Set(t) => json!({"type": "Set", "element": t.to_cedar_schema()}),
            CedarType::Record(attrs) => {
                let mut m = serde_json::Map::new();
                for a in attrs {
                    if let AttributeKind::Typed { ty, required } = &a.kind {
                        let mut s = ty.to_cedar_schema();
                        s["required"] = Value::Bool(*required);
                        m.insert(a.name.clone(), s);
                    }
                }
                json!({"type": "Record", "attributes": m})
            }
        }
    }

    /// The untyped inputs, by dotted path, with the reason: what `--cedar-schema` notes.
    pub fn untyped(&self) -> Vec<(String, &Untypable)> {
        // Set elements have no attribute access in Cedar, so only records are walked.
        fn walk<'t>(t: &'t CedarType, prefix: &str, out: &mut Vec<(String, &'t Untypable)>) {
            for a in t.attributes() {
                let path = if prefix.is_empty() {
                    a.name.clone()
                } else {
                    format!("{prefix}.{}", a.name)
                };
                match &a.kind {
                    AttributeKind::Untyped(why) => out.push((path, why)),
                    AttributeKind::Typed { ty, .. } => walk(ty, &path, out),
                }
            }
        }
        let mut out = Vec::new();
        walk(self, "", &mut out);
        out
    }

    /// Converts a schema-valid value into a Cedar expression of this type. A `null` or absent
    /// property is an absent attribute; untyped properties are not passed.
    pub fn to_cedar(&self, value: &Value) -> Result<RestrictedExpression, InputsError> {
        Ok(match (self, value) {
            (CedarType::Long, Value::Number(n)) => {
                RestrictedExpression::new_long(n.as_i64().or_else(|| whole(n)).ok_or_else(
                    || InputsError::new(format!("{n} is not an integer Cedar can hold")),
                )?)
            }
            (CedarType::Decimal, Value::Number(n)) => RestrictedExpression::new_decimal(
                to_decimal(n).map_err(|e| InputsError::new(e.to_string()))?,
            ),
            (CedarType::String, Value::String(s)) => RestrictedExpression::new_string(s.clone()),
            (CedarType::Bool, Value::Bool(b)) => RestrictedExpression::new_bool(*b),
            (CedarType::Set(t), Value::Array(items)) => RestrictedExpression::new_set(
                items
                    .iter()
                    .enumerate()
                    .map(|(i, v)| t.to_cedar(v).map_err(|e| e.within(&i.to_string())))
                    .collect::<Result<Vec<_>, _>>()?,
            ),
            (CedarType::Record(attrs), Value::Object(map)) => {
                let mut fields = Vec::with_capacity(attrs.len());
                for a in attrs {
                    if let AttributeKind::Typed { ty, .. } = &a.kind
                        && let Some(v) = map.get(&a.name).filter(|v| !v.is_null())
                    {
                        fields.push((
                            a.name.clone(),
                            ty.to_cedar(v).map_err(|e| e.within(&a.name))?,
                        ));
                    }
                }
                RestrictedExpression::new_record(fields)
                    .map_err(|e| InputsError::new(e.to_string()))?
            }
            (t, v) => {
                return Err(InputsError::new(format!("{v} is not a {}", t.describe())));
            }
        })
    }
}

/// An integer sent as a whole float (`3.0`), which JSON Schema counts as an integer.
fn whole(n: &serde_json::Number) -> Option<i64> {
    n.as_f64()
        .filter(|f| f.fract() == 0.0 && f.abs() < 9.2e18)
        .map(|f| f as i64)
}

/// Why inputs that passed the schema could not be given to policies (a number Cedar cannot
/// hold exactly). The call is then refused: policies fail closed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InputsError {
    /// The path from the top, innermost last.
    path: Vec<String>,
    problem: String,
}

impl InputsError {
    fn new(problem: String) -> Self {
        InputsError {
            path: Vec::new(),
            problem,
        }
    }

    fn within(mut self, segment: &str) -> Self {
        self.path.insert(0, segment.to_string());
        self
    }
}

impl fmt::Display for InputsError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "input /{}: {}", self.path.join("/"), self.problem)
    }
}

impl std::error::Error for InputsError {}

/// What a subschema allows, on the way to a Cedar type.
#[derive(Debug, Clone, PartialEq)]
enum Shape {
    /// Anything (no type constraint).
    Any,
    /// Nothing.
    Never,
    /// Only `null`.
    Null,
    Typed {
        ty: CedarType,
        nullable: bool,
    },
    Untyped(Untypable),
}

impl Shape {
    fn typed(ty: CedarType) -> Shape {
        Shape::Typed {
            ty,
            nullable: false,
        }
    }

    /// A value of either shape (`anyOf`, `oneOf`, a list of types, an `enum`).
    fn union(self, other: Shape) -> Shape {
        use Shape::*;
        match (self, other) {
            (Any, _) | (_, Any) => Any,
            (Never, x) | (x, Never) => x,
            (Null, Null) => Null,
            (Null, Typed { ty, .. }) | (Typed { ty, .. }, Null) => Typed { ty, nullable: true },
            (
                Typed {
                    ty: a,
                    nullable: na,
                },
                Typed {
                    ty: b,
                    nullable: nb,
                },
            ) => {
                let names = [a.describe(), b.describe()];
                match join(a, b) {
                    Some(ty) => Typed {
                        ty,
                        nullable: na || nb,
                    },
                    None => Untyped(Untypable::Union(dedup(names.to_vec()))),
                }
            }
            (Untyped(Untypable::Union(mut xs)), Typed { ty, .. })
            | (Typed { ty, .. }, Untyped(Untypable::Union(mut xs))) => {
                xs.push(ty.describe());
                Untyped(Untypable::Union(dedup(xs)))
            }
            (Untyped(Untypable::Union(mut xs)), Untyped(Untypable::Union(ys))) => {
                xs.extend(ys);
                Untyped(Untypable::Union(dedup(xs)))
            }
            (Untyped(w), _) | (_, Untyped(w)) => Untyped(w),
        }
    }

    /// A value of both shapes (`allOf`, a `$ref` beside `type`, `enum` beside `type`).
    fn meet(self, other: Shape) -> Shape {
        use Shape::*;
        match (self, other) {
            (Any, x) | (x, Any) => x,
            (Never, _) | (_, Never) => Never,
            (Untyped(w), _) | (_, Untyped(w)) => Untyped(w),
            (Null, Null) => Null,
            (Null, Typed { nullable, .. }) | (Typed { nullable, .. }, Null) => {
                if nullable {
                    Null
                } else {
                    Never
                }
            }
            (
                Typed {
                    ty: a,
                    nullable: na,
                },
                Typed {
                    ty: b,
                    nullable: nb,
                },
            ) => match meet(a, b) {
                Some(ty) => Typed {
                    ty,
                    nullable: na && nb,
                },
                None => Never,
            },
        }
    }
}

fn dedup(mut names: Vec<String>) -> Vec<String> {
    let mut seen = Vec::with_capacity(names.len());
    names.retain(|n| {
        let new = !seen.contains(n);
        seen.push(n.clone());
        new
    });
    names
}

/// One Cedar type holding the values of both, if there is one: integers are numbers, and two
/// object shapes are one record whose attributes not in both are optional.
fn join(a: CedarType, b: CedarType) -> Option<CedarType> {
    use CedarType::*;
    match (a, b) {
        (a, b) if a == b => Some(a),
        (Long, Decimal) | (Decimal, Long) => Some(Decimal),
        (Set(x), Set(y)) => join(*x, *y).map(|t| Set(Box::new(t))),
        (Record(xs), Record(ys)) => {
            let mut out = Vec::with_capacity(xs.len().max(ys.len()));
            for x in &xs {
                let y = ys.iter().find(|y| y.name == x.name).map(|y| &y.kind);
                let kind = match (&x.kind, y) {
                    (AttributeKind::Untyped(w), _) | (_, Some(AttributeKind::Untyped(w))) => {
                        AttributeKind::Untyped(w.clone())
                    }
                    (AttributeKind::Typed { ty, .. }, None) => AttributeKind::Typed {
                        ty: ty.clone(),
                        required: false,
                    },
                    (
                        AttributeKind::Typed {
                            ty: a,
                            required: ra,
                        },
                        Some(AttributeKind::Typed {
                            ty: b,
                            required: rb,
                        }),
                    ) => AttributeKind::Typed {
                        ty: join(a.clone(), b.clone())?,
                        required: *ra && *rb,
                    },
                };
                out.push(Attribute {
                    name: x.name.clone(),
                    kind,
                });
            }
            for y in ys {
                if !xs.iter().any(|x| x.name == y.name) {
                    let kind = match y.kind {
                        AttributeKind::Typed { ty, .. } => AttributeKind::Typed {
                            ty,
                            required: false,
                        },
                        untyped => untyped,
                    };
                    out.push(Attribute { name: y.name, kind });
                }
            }
            Some(Record(out))
        }
        _ => None,
    }
}

/// The Cedar type of values that are both, if they can be: an integer that is a number is an
/// integer, and two object shapes merge (an attribute required by either is required).
fn meet(a: CedarType, b: CedarType) -> Option<CedarType> {
    use CedarType::*;
    match (a, b) {
        (a, b) if a == b => Some(a),
        (Long, Decimal) | (Decimal, Long) => Some(Long),
        (Set(x), Set(y)) => meet(*x, *y).map(|t| Set(Box::new(t))),
        (Record(mut xs), Record(ys)) => {
            for y in ys {
                match xs.iter_mut().find(|x| x.name == y.name) {
                    None => xs.push(y),
                    Some(x) => {
                        x.kind = match (
                            std::mem::replace(
                                &mut x.kind,
                                AttributeKind::Untyped(Untypable::NoValue),
                            ),
                            y.kind,
                        ) {
                            (AttributeKind::Untyped(w), _) | (_, AttributeKind::Untyped(w)) => {
                                AttributeKind::Untyped(w)
                            }
                            (
                                AttributeKind::Typed {
                                    ty: ta,
                                    required: ra,
                                },
                                AttributeKind::Typed {
                                    ty: tb,
                                    required: rb,
                                },
                            ) => match meet(ta, tb) {
                                Some(ty) => AttributeKind::Typed {
                                    ty,
                                    required: ra || rb,
                                },
                                None => AttributeKind::Untyped(Untypable::NoValue),
                            },
                        }
                    }
                }
            }
            Some(Record(xs))
        }
        _ => None,
    }
}

/// Walks a schema to its Cedar type, resolving local `$ref`s against the root.
struct Mapper<'s> {
    root: &'s Value,
    /// The `$ref`s being expanded, outermost first: one seen again is a recursion.
    refs: Vec<&'s str>,
    /// Subschemas visited so far.
    seen: usize,
}

impl<'s> Mapper<'s> {
    fn node(&mut self, schema: &'s Value, depth: usize) -> Shape {
        self.seen += 1;
        if depth > MAX_DEPTH || self.seen > MAX_SUBSCHEMAS {
            return Shape::Untyped(Untypable::TooLarge);
        }
        let m = match schema {
            Value::Bool(false) => return Shape::Never,
            Value::Object(m) => m,
            _ => return Shape::Any,
        };
        let mut shape = self.own(m, depth);
        if let Some(r) = m.get("$ref") {
            let target = self.reference(r, depth);
            shape = shape.meet(target);
        }
        for keyword in ["$dynamicRef", "$recursiveRef"] {
            if m.contains_key(keyword) {
                shape = shape.meet(Shape::Untyped(Untypable::Unsupported(format!(
                    "`{keyword}`"
                ))));
            }
        }
        if let Some(Value::Array(all)) = m.get("allOf") {
            for s in all {
                let part = self.node(s, depth + 1);
                shape = shape.meet(part);
            }
        }
        for keyword in ["anyOf", "oneOf"] {
            if let Some(Value::Array(alternatives)) = m.get(keyword) {
                let mut either = Shape::Never;
                for s in alternatives {
                    let alternative = self.node(s, depth + 1);
                    either = either.union(alternative);
                }
                shape = shape.meet(either);
            }
        }
        shape
    }

    /// What `type`, `enum` and `const` (and `properties`/`items` without a `type`) allow.
    fn own(&mut self, m: &'s serde_json::Map<String, Value>, depth: usize) -> Shape {
        let types: Vec<&str> = match m.get("type") {
            Some(Value::String(t)) => vec![t.as_str()],
            Some(Value::Array(ts)) => ts.iter().filter_map(Value::as_str).collect(),
            _ if m.contains_key("properties") => vec!["object"],
            _ if m.contains_key("items") || m.contains_key("prefixItems") => vec!["array"],
            _ => vec![],
        };
        let mut shape = if types.is_empty() {
            Shape::Any
        } else {
            let mut either = Shape::Never;
            for t in types {
                let one = self.of_type(t, m, depth);
                either = either.union(one);
            }
            either
        };
        if let Some(Value::Array(values)) = m.get("enum") {
            let values = values
                .iter()
                .map(value_shape)
                .fold(Shape::Never, Shape::union);
            shape = shape.meet(values);
        }
        if let Some(v) = m.get("const") {
            shape = shape.meet(value_shape(v));
        }
        shape
    }

    fn of_type(&mut self, t: &str, m: &'s serde_json::Map<String, Value>, depth: usize) -> Shape {
        match t {
            "null" => Shape::Null,
            "boolean" => Shape::typed(CedarType::Bool),
            "integer" => Shape::typed(CedarType::Long),
            "number" => Shape::typed(CedarType::Decimal),
            "string" => Shape::typed(CedarType::String),
            "array" => self.array(m, depth),
            "object" => self.object(m, depth),
            other => Shape::Untyped(Untypable::Unsupported(format!("`type: {other}`"))),
        }
    }

    fn array(&mut self, m: &'s serde_json::Map<String, Value>, depth: usize) -> Shape {
        let items = m.get("items");
        if m.contains_key("prefixItems") || items.is_some_and(Value::is_array) {
            return Shape::Untyped(Untypable::Tuple);
        }
        let Some(items) = items else {
            return Shape::Untyped(Untypable::Items(Box::new(Untypable::AnyValue)));
        };
        match self.node(items, depth + 1) {
            Shape::Typed {
                ty,
                nullable: false,
            } => Shape::typed(CedarType::Set(Box::new(ty))),
            Shape::Typed { nullable: true, .. } | Shape::Null => {
                Shape::Untyped(Untypable::NullableItems)
            }
            Shape::Any => Shape::Untyped(Untypable::Items(Box::new(Untypable::AnyValue))),
            Shape::Never => Shape::Untyped(Untypable::Items(Box::new(Untypable::NoValue))),
            Shape::Untyped(w) => Shape::Untyped(Untypable::Items(Box::new(w))),
        }
    }

    fn object(&mut self, m: &'s serde_json::Map<String, Value>, depth: usize) -> Shape {
        let Some(properties) = m.get("properties").and_then(Value::as_object) else {
            let closed = m.get("additionalProperties") == Some(&Value::Bool(false))
                && !m.contains_key("patternProperties");
            return if closed {
                Shape::typed(CedarType::Record(Vec::new()))
            } else {
                Shape::Untyped(Untypable::Map)
            };
        };
        let required: Vec<&str> = m
            .get("required")
            .and_then(Value::as_array)
            .map(|a| a.iter().filter_map(Value::as_str).collect())
            .unwrap_or_default();
        let mut attrs = Vec::with_capacity(properties.len());
        for (name, schema) in properties {
            let kind = match self.node(schema, depth + 1) {
                Shape::Typed { ty, nullable } => AttributeKind::Typed {
                    ty,
                    required: !nullable && required.contains(&name.as_str()),
                },
                Shape::Null => AttributeKind::Untyped(Untypable::OnlyNull),
                Shape::Any => AttributeKind::Untyped(Untypable::AnyValue),
                Shape::Never => AttributeKind::Untyped(Untypable::NoValue),
                Shape::Untyped(w) => AttributeKind::Untyped(w),
            };
            attrs.push(Attribute {
                name: name.clone(),
                kind,
            });
        }
        Shape::typed(CedarType::Record(attrs))
    }

    fn reference(&mut self, r: &'s Value, depth: usize) -> Shape {
        let Some(r) = r.as_str() else {
            return Shape::Untyped(Untypable::Unresolved(r.to_string()));
        };
        if self.refs.contains(&r) {
            return Shape::Untyped(Untypable::Recursive(r.to_string()));
        }
        let target = r.strip_prefix('#').and_then(|pointer| {
            if pointer.is_empty() {
                Some(self.root)
            } else {
                self.root.pointer(&percent_decode(pointer))
            }
        });
        let Some(target) = target else {
            return Shape::Untyped(Untypable::Unresolved(r.to_string()));
        };
        self.refs.push(r);
        let shape = self.node(target, depth + 1);
        self.refs.pop();
        shape
    }
}

/// The shape of one `enum` or `const` value.
fn value_shape(v: &Value) -> Shape {
    match v {
        Value::Null => Shape::Null,
        Value::Bool(_) => Shape::typed(CedarType::Bool),
        Value::String(_) => Shape::typed(CedarType::String),
        Value::Number(n) if n.is_i64() || n.is_u64() => Shape::typed(CedarType::Long),
        Value::Number(_) => Shape::typed(CedarType::Decimal),
        Value::Array(_) | Value::Object(_) => Shape::Untyped(Untypable::Unsupported(
            "an `enum` or `const` of arrays or objects".into(),
        )),
    }
}

/// A URI fragment's JSON pointer with `%xx` escapes undone (`#/%24defs/A` is `#/$defs/A`).
fn percent_decode(s: &str) -> String {
    let bytes = s.as_bytes();
    let hex = |i: usize| bytes.get(i).and_then(|b| (*b as char).to_digit(16));
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        match (bytes[i], hex(i + 1), hex(i + 2)) {
            (b'%', Some(h), Some(l)) => {
                out.push((h * 16 + l) as u8);
                i += 3;
            }
            (b, _, _) => {
                out.push(b);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// A JSON number as a Cedar decimal literal. Cedar decimals have four fraction digits; a number
/// that needs more cannot be compared exactly and is refused rather than rounded.
fn to_decimal(n: &serde_json::Number) -> Result<String, CoreError> {
    /// Cedar's decimal is an i64 of 1/10,000ths.
    const LIMIT: f64 = 922_337_203_685_477.0;
    if let Some(i) = n.as_i64() {
        if (i as f64).abs() >= LIMIT {
            return Err(CoreError::OutsidePolicyRange(n.clone()));
        }
        return Ok(format!("{i}.0"));
    }
    let f = n.as_f64().ok_or(CoreError::NotFinite)?;
    if f.abs() >= LIMIT {
        return Err(CoreError::OutsidePolicyRange(n.clone()));
    }
    let s = format!("{f:.4}");
    let back: f64 = s.parse().map_err(|_| CoreError::NotFinite)?;
    if (back - f).abs() > f64::EPSILON * f.abs().max(1.0) {
        return Err(CoreError::TooPreciseForPolicies(n.clone()));
    }
    Ok(s)
}

/// Rewrites each `type` of JSON null in a schema to the type `"null"`. YAML reads an unquoted
/// `type: null` (how people write a nullable alternative, `anyOf: [{type: string}, {type:
/// null}]`) as no value rather than the string, and a validator would then let that
/// alternative accept anything. Only schema positions are touched, never `enum`, `const`,
/// `default` or `examples` data.
pub fn normalize_null_types(schema: &mut Value) {
    let Value::Object(m) = schema else { return };
    match m.get_mut("type") {
        Some(t @ Value::Null) => *t = Value::String("null".into()),
        Some(Value::Array(a)) => {
            for t in a.iter_mut().filter(|t| t.is_null()) {
                *t = Value::String("null".into());
            }
        }
        _ => {}
    }
    for key in [
        "properties",
        "patternProperties",
        "$defs",
        "definitions",
        "dependentSchemas",
    ] {
        if let Some(Value::Object(children)) = m.get_mut(key) {
            children.values_mut().for_each(normalize_null_types);
        }
    }
    for key in ["anyOf", "oneOf", "allOf", "prefixItems"] {
        if let Some(Value::Array(children)) = m.get_mut(key) {
            children.iter_mut().for_each(normalize_null_types);
        }
    }
    for key in [
        "items",
        "additionalProperties",
        "not",
        "if",
        "then",
        "else",
        "contains",
        "propertyNames",
        "unevaluatedProperties",
        "unevaluatedItems",
    ] {
        if let Some(child) = m.get_mut(key) {
            normalize_null_types(child);
        }
    }
}

#[cfg(test)]
#[path = "schema_tests.rs"]
mod tests;
