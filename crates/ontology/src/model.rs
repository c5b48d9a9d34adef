//! The file format, parsed once into checked types.
//!
//! ```yaml
//! types:
//!   work_order:
//!     label: summary                 # the attribute shown in quotes
//!     tags: [status, priority]       # attributes shown in brackets: [open/high]
//!     attributes:
//!       summary: string              # string | number | integer | boolean | date
//!       status: {enum: [open, in_progress, closed]}
//!       priority: {enum: [low, medium, high]}
//!       closed_on: {type: date, optional: true}
//!     relations:
//!       raised_at: site              # exactly one site
//!       assigned_to: {to: technician, optional: true}
//! entities:
//!   - {id: wo-001, type: work_order, summary: "…", status: open, priority: high, raised_at: site-001}
//! ```

use std::collections::{BTreeMap, HashMap};
use std::path::Path;

use serde::Deserialize;
use serde_json::Value;

use crate::{OntologyError, Problem};

/// The type of one attribute.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AttributeType {
    String,
    Number,
    Integer,
    Boolean,
    /// `YYYY-MM-DD`.
    Date,
    /// A string from a fixed set.
    Enum(Vec<String>),
}

impl AttributeType {
    fn accepts(&self, v: &Value) -> bool {
        match self {
            AttributeType::String => v.is_string(),
            AttributeType::Number => v.is_number(),
            AttributeType::Integer => v.is_i64() || v.is_u64(),
            AttributeType::Boolean => v.is_boolean(),
            AttributeType::Date => v.as_str().is_some_and(is_date),
            AttributeType::Enum(values) => {
                v.as_str().is_some_and(|s| values.iter().any(|e| e == s))
            }
        }
    }

    fn describe(&self) -> String {
        match self {
            AttributeType::String => "a string".into(),
            AttributeType::Number => "a number".into(),
            AttributeType::Integer => "an integer".into(),
            AttributeType::Boolean => "true or false".into(),
            AttributeType::Date => "a date (YYYY-MM-DD)".into(),
            AttributeType::Enum(values) => format!("one of {}", values.join(", ")),
        }
    }
}

fn is_date(s: &str) -> bool {
    let b = s.as_bytes();
    b.len() == 10
        && b[4] == b'-'
        && b[7] == b'-'
        && b.iter()
            .enumerate()
            .all(|(i, c)| i == 4 || i == 7 || c.is_ascii_digit())
        && (1..=12).contains(&s[5..7].parse::<u32>().unwrap_or(0))
        && (1..=31).contains(&s[8..10].parse::<u32>().unwrap_or(0))
}

/// A declared attribute.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Attribute {
    pub ty: AttributeType,
    pub optional: bool,
}

/// A declared relation: its target type and cardinality.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RelationType {
    /// The entity type the relation points to.
    pub to: String,
    /// The relation may be absent.
    pub optional: bool,
    /// The relation holds a list of ids.
    pub many: bool,
}

/// An entity type.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EntityType {
    pub name: String,
    pub description: Option<String>,
    /// The attribute shown as the entity's label.
    pub label: Option<String>,
    /// Attributes shown in brackets after the id.
    pub tags: Vec<String>,
    pub attributes: BTreeMap<String, Attribute>,
    pub relations: BTreeMap<String, RelationType>,
}

/// An entity, with its attributes and outgoing relations checked against its type.
#[derive(Debug, Clone, PartialEq)]
pub struct Entity {
    pub id: String,
    pub type_name: String,
    pub attributes: BTreeMap<String, Value>,
    /// Relation name → target ids (one for a single-valued relation).
    pub relations: BTreeMap<String, Vec<String>>,
    /// Position in the file's `entities` list, for error paths.
    position: usize,
}

impl Entity {
    /// A string attribute.
    pub fn attr_str(&self, name: &str) -> Option<&str> {
        self.attributes.get(name).and_then(Value::as_str)
    }
}

/// A loaded, checked ontology.
#[derive(Debug, Clone)]
pub struct Ontology {
    file: String,
    types: BTreeMap<String, EntityType>,
    entities: Vec<Entity>,
    index: HashMap<String, usize>,
    /// Target id → (source entity index, relation), in declaration order.
    inbound: HashMap<String, Vec<(usize, String)>>,
}

// ---- the raw file ----

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawFile {
    types: BTreeMap<String, RawType>,
    #[serde(default)]
    entities: Vec<RawEntity>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawType {
    #[serde(default)]
    description: Option<String>,
    #[serde(default)]
    label: Option<String>,
    #[serde(default)]
    tags: Vec<String>,
    #[serde(default)]
    attributes: BTreeMap<String, RawAttribute>,
    #[serde(default)]
    relations: BTreeMap<String, RawRelation>,
}

#[derive(Debug, Deserialize)]
#[serde(untagged)]
enum RawAttribute {
    Short(String),
    Long {
        #[serde(default, rename = "type")]
        ty: Option<String>,
        #[serde(default, rename = "enum")]
        values: Option<Vec<String>>,
        #[serde(default)]
        optional: bool,
    },
}

#[derive(Debug, Deserialize)]
#[serde(untagged)]
enum RawRelation {
    Short(String),
    Long {
        to: String,
        #[serde(default)]
        optional: bool,
        #[serde(default)]
        many: bool,
    },
}

#[derive(Debug, Deserialize)]
struct RawEntity {
    id: String,
    #[serde(rename = "type")]
    ty: String,
    #[serde(flatten)]
    fields: BTreeMap<String, Value>,
}

fn attribute_type(name: &str) -> Option<AttributeType> {
    Some(match name {
        "string" => AttributeType::String,
        "number" => AttributeType::Number,
        "integer" => AttributeType::Integer,
        "boolean" => AttributeType::Boolean,
        "date" => AttributeType::Date,
        _ => return None,
    })
}

const ATTRIBUTE_TYPES: &str = "string, number, integer, boolean, date or {enum: [...]}";

impl Ontology {
    /// Reads and checks an ontology file.
    pub fn load(path: impl AsRef<Path>) -> Result<Ontology, OntologyError> {
        let path = path.as_ref();
        let file = path.display().to_string();
        let text = std::fs::read_to_string(path).map_err(|source| OntologyError::Io {
            file: file.clone(),
            source,
        })?;
        Ontology::from_yaml(&file, &text)
    }

    /// Checks an ontology given as YAML text; `file` names it in errors.
    pub fn from_yaml(file: &str, text: &str) -> Result<Ontology, OntologyError> {
        let value: Value = yaml_serde::from_str(text).map_err(|e| OntologyError::Yaml {
            file: file.to_string(),
            message: e.to_string(),
        })?;
        let raw: RawFile = serde_path_to_error::deserialize(value).map_err(|e| {
            let path = e.path().to_string();
            OntologyError::Invalid {
                file: file.to_string(),
                problems: vec![Problem {
                    path: if path == "." {
                        "(top level)".into()
                    } else {
                        path
                    },
                    message: e.into_inner().to_string(),
                }],
            }
        })?;
        let mut problems = Vec::new();
        let types = check_types(raw.types, &mut problems);
        let entities = check_entities(raw.entities, &types, &mut problems);
        let mut index = HashMap::new();
        for (i, e) in entities.iter().enumerate() {
            index.insert(e.id.clone(), i);
        }
        check_targets(&entities, &types, &index, &mut problems);
        if !problems.is_empty() {
            return Err(OntologyError::Invalid {
                file: file.to_string(),
                problems,
            });
        }
        let mut inbound: HashMap<String, Vec<(usize, String)>> = HashMap::new();
        for (i, e) in entities.iter().enumerate() {
            for (rel, targets) in &e.relations {
                for t in targets {
                    inbound.entry(t.clone()).or_default().push((i, rel.clone()));
                }
            }
        }
        Ok(Ontology {
            file: file.to_string(),
            types,
            entities,
            index,
            inbound,
        })
    }

    /// The file this ontology was read from.
    pub fn file(&self) -> &str {
        &self.file
    }

    pub fn types(&self) -> &BTreeMap<String, EntityType> {
        &self.types
    }

    pub fn entity_type(&self, name: &str) -> Option<&EntityType> {
        self.types.get(name)
    }

    /// Entities in declaration order.
    pub fn entities(&self) -> &[Entity] {
        &self.entities
    }

    pub fn entity(&self, id: &str) -> Option<&Entity> {
        self.index.get(id).map(|&i| &self.entities[i])
    }

    /// Resolves an evidence id: `wo-001`, or `work_order:wo-001` to also check its type.
    pub fn resolve(&self, reference: &str) -> Result<&Entity, OntologyError> {
        let (expected, id) = match reference.split_once(':') {
            Some((ty, id)) if self.types.contains_key(ty) => (Some(ty), id),
            _ => (None, reference),
        };
        let entity = self
            .entity(id)
            .ok_or_else(|| OntologyError::UnknownEntity {
                file: self.file.clone(),
                id: id.to_string(),
                suggestion: self.closest_id(id),
            })?;
        match expected {
            Some(ty) if ty != entity.type_name => Err(OntologyError::WrongType {
                file: self.file.clone(),
                id: id.to_string(),
                expected: ty.to_string(),
                actual: entity.type_name.clone(),
            }),
            _ => Ok(entity),
        }
    }

    /// Resolves every evidence id a plan cites; all unknown ids are reported, not only the first.
    pub fn resolve_all<'a>(
        &'a self,
        references: &[&str],
    ) -> Result<Vec<&'a Entity>, Vec<OntologyError>> {
        let (found, errors): (Vec<_>, Vec<_>) = references
            .iter()
            .map(|r| self.resolve(r))
            .partition(Result::is_ok);
        if errors.is_empty() {
            Ok(found.into_iter().map(Result::unwrap).collect())
        } else {
            Err(errors.into_iter().map(|e| e.unwrap_err()).collect())
        }
    }

    /// Entities whose relations point at `id`: (source, relation), in declaration order.
    pub fn inbound(&self, id: &str) -> impl Iterator<Item = (&Entity, &str)> + '_ {
        self.inbound
            .get(id)
            .into_iter()
            .flatten()
            .map(|(i, rel)| (&self.entities[*i], rel.as_str()))
    }

    /// How an entity reads in a walk: `work_order wo-001 [open/high] 'Oven proofing…'`.
    pub fn describe(&self, entity: &Entity) -> String {
        let mut out = format!("{} {}", entity.type_name, entity.id);
        let Some(ty) = self.types.get(&entity.type_name) else {
            return out;
        };
        let tags: Vec<String> = ty
            .tags
            .iter()
            .filter_map(|t| entity.attributes.get(t))
            .map(value_text)
            .collect();
        if !tags.is_empty() {
            out.push_str(&format!(" [{}]", tags.join("/")));
        }
        if let Some(label) = ty.label.as_ref().and_then(|l| entity.attributes.get(l)) {
            out.push_str(&format!(" '{}'", value_text(label)));
        }
        out
    }

    /// The declared id closest to `id`, for "did you mean".
    fn closest_id(&self, id: &str) -> Option<String> {
        self.entities
            .iter()
            .map(|e| (edit_distance(&e.id, id), &e.id))
            .filter(|(d, _)| *d <= 2)
            .min()
            .map(|(_, e)| e.clone())
    }
}

fn value_text(v: &Value) -> String {
    match v {
        Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}

fn edit_distance(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut prev: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.chars().enumerate() {
        let mut cur = vec![i + 1];
        for (j, cb) in b.iter().enumerate() {
            let sub = prev[j] + usize::from(ca != *cb);
            cur.push(sub.min(prev[j + 1] + 1).min(cur[j] + 1));
        }
        prev = cur;
    }
    prev[b.len()]
}

fn check_types(
    raw: BTreeMap<String, RawType>,
    problems: &mut Vec<Problem>,
) -> BTreeMap<String, EntityType> {
    let names: Vec<String> = raw.keys().cloned().collect();
    let mut out = BTreeMap::new();
    for (name, t) in raw {
        let base = format!("types.{name}");
        let mut attributes = BTreeMap::new();
        for (attr, spec) in t.attributes {
            let path = format!("{base}.attributes.{attr}");
            let parsed = match spec {
                RawAttribute::Short(s) => attribute_type(&s).map(|ty| Attribute {
                    ty,
                    optional: false,
                }),
                RawAttribute::Long {
                    ty,
                    values,
                    optional,
                } => match (ty.as_deref(), values) {
                    (None | Some("string"), Some(v)) if !v.is_empty() => Some(Attribute {
                        ty: AttributeType::Enum(v),
                        optional,
                    }),
                    (Some(s), None) => attribute_type(s).map(|ty| Attribute { ty, optional }),
                    _ => None,
                },
            };
            match parsed {
                Some(a) => {
                    attributes.insert(attr, a);
                }
                None => problems.push(Problem {
                    path,
                    message: format!("not an attribute type; use {ATTRIBUTE_TYPES}"),
                }),
            }
        }
        let mut relations = BTreeMap::new();
        for (rel, spec) in t.relations {
            let path = format!("{base}.relations.{rel}");
            let r = match spec {
                RawRelation::Short(to) => RelationType {
                    to,
                    optional: false,
                    many: false,
                },
                RawRelation::Long { to, optional, many } => RelationType { to, optional, many },
            };
            if !names.contains(&r.to) {
                problems.push(Problem {
                    path,
                    message: format!(
                        "relation '{rel}' points to type '{}', which is not declared; declared types: {}",
                        r.to,
                        names.join(", ")
                    ),
                });
            }
            if attributes.contains_key(&rel) {
                problems.push(Problem {
                    path: format!("{base}.relations.{rel}"),
                    message: format!("'{rel}' is declared both as an attribute and as a relation"),
                });
            }
            relations.insert(rel, r);
        }
        for (i, shown) in t.label.iter().chain(t.tags.iter()).enumerate() {
            if !attributes.contains_key(shown) {
                problems.push(Problem {
                    path: if i == 0 && t.label.is_some() {
                        format!("{base}.label")
                    } else {
                        format!("{base}.tags")
                    },
                    message: format!("'{shown}' is not an attribute of '{name}'"),
                });
            }
        }
        out.insert(
            name.clone(),
            EntityType {
                name,
                description: t.description,
                label: t.label,
                tags: t.tags,
                attributes,
                relations,
            },
        );
    }
    out
}

fn check_entities(
    raw: Vec<RawEntity>,
    types: &BTreeMap<String, EntityType>,
    problems: &mut Vec<Problem>,
) -> Vec<Entity> {
    let mut seen: HashMap<String, usize> = HashMap::new();
    let mut out = Vec::new();
    for (i, e) in raw.into_iter().enumerate() {
        let base = format!("entities[{i}]");
        if let Some(prev) = seen.insert(e.id.clone(), i) {
            problems.push(Problem {
                path: format!("{base}.id"),
                message: format!("'{}' is already declared at entities[{prev}]", e.id),
            });
            continue;
        }
        let Some(ty) = types.get(&e.ty) else {
            problems.push(Problem {
                path: format!("{base}.type"),
                message: format!(
                    "'{}' is not a declared type; declared types: {}",
                    e.ty,
                    types.keys().cloned().collect::<Vec<_>>().join(", ")
                ),
            });
            continue;
        };
        let mut attributes = BTreeMap::new();
        let mut relations = BTreeMap::new();
        for (field, value) in e.fields {
            let path = format!("{base}.{field}");
            if let Some(a) = ty.attributes.get(&field) {
                if a.ty.accepts(&value) {
                    attributes.insert(field, value);
                } else {
                    problems.push(Problem {
                        path,
                        message: format!("{value} is not {}", a.ty.describe()),
                    });
                }
            } else if let Some(r) = ty.relations.get(&field) {
                let ids: Option<Vec<String>> = match (&value, r.many) {
                    (Value::String(s), false) => Some(vec![s.clone()]),
                    (Value::Array(a), true) => {
                        a.iter().map(|v| v.as_str().map(str::to_string)).collect()
                    }
                    _ => None,
                };
                match ids {
                    Some(ids) => {
                        relations.insert(field, ids);
                    }
                    None => problems.push(Problem {
                        path,
                        message: if r.many {
                            format!("'{field}' holds a list of {} ids", r.to)
                        } else {
                            format!("'{field}' holds one {} id", r.to)
                        },
                    }),
                }
            } else {
                let mut known: Vec<&str> = ty
                    .attributes
                    .keys()
                    .chain(ty.relations.keys())
                    .map(String::as_str)
                    .collect();
                known.sort();
                problems.push(Problem {
                    path,
                    message: format!(
                        "a {} has no attribute or relation '{field}'; it has: {}",
                        ty.name,
                        known.join(", ")
                    ),
                });
            }
        }
        for (name, a) in &ty.attributes {
            if !a.optional && !attributes.contains_key(name) {
                problems.push(Problem {
                    path: base.clone(),
                    message: format!("{} '{}' lacks attribute '{name}'", ty.name, e.id),
                });
            }
        }
        for (name, r) in &ty.relations {
            if !r.optional && !relations.contains_key(name) {
                problems.push(Problem {
                    path: base.clone(),
                    message: format!(
                        "{} '{}' lacks relation '{name}' (to a {})",
                        ty.name, e.id, r.to
                    ),
                });
            }
        }
        out.push(Entity {
            id: e.id,
            type_name: e.ty,
            attributes,
            relations,
            position: i,
        });
    }
    out
}

fn check_targets(
    entities: &[Entity],
    types: &BTreeMap<String, EntityType>,
    index: &HashMap<String, usize>,
    problems: &mut Vec<Problem>,
) {
    for e in entities {
        let i = e.position;
        let ty = &types[&e.type_name];
        for (rel, targets) in &e.relations {
            let want = &ty.relations[rel].to;
            for (j, target) in targets.iter().enumerate() {
                let path = if ty.relations[rel].many {
                    format!("entities[{i}].{rel}[{j}]")
                } else {
                    format!("entities[{i}].{rel}")
                };
                match index.get(target) {
                    None => problems.push(Problem {
                        path,
                        message: format!(
                            "{} '{}' {rel} '{target}', which is not a declared entity",
                            e.type_name, e.id
                        ),
                    }),
                    Some(&t) if &entities[t].type_name != want => problems.push(Problem {
                        path,
                        message: format!(
                            "{} '{}' {rel} '{target}', which is a {}; {rel} points to a {want}",
                            e.type_name, e.id, entities[t].type_name
                        ),
                    }),
                    Some(_) => {}
                }
            }
        }
    }
}
