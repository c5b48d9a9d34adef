//! The typed ontology of a domain: what the business's words mean, written down once so the
//! agent and the governor argue about the same world. Entity types declare typed attributes and
//! typed relations; every entity and every relation is checked at load, so a relation from the
//! wrong type of entity, or to one that does not exist, is an error naming the file and the path.
//!
//! ```
//! let text = r#"
//! types:
//!   customer: {label: name, attributes: {name: string}}
//!   site:
//!     label: address
//!     attributes: {address: string}
//!     relations: {belongs_to: customer}
//! entities:
//!   - {id: cust-001, type: customer, name: Harbour Bakery}
//!   - {id: site-001, type: site, address: "12 Quay Street, Whitby", belongs_to: cust-001}
//! "#;
//! let ontology = toolgate_ontology::Ontology::from_yaml("ontology.yaml", text).unwrap();
//! let walk = ontology.walk("cust-001").unwrap();
//! assert_eq!(
//!     walk.to_string(),
//!     "customer cust-001 'Harbour Bakery'\n\
//!      <- belongs_to site site-001 '12 Quay Street, Whitby'\n"
//! );
//! ```

mod model;
mod walk;

pub use model::{Attribute, AttributeType, Entity, EntityType, Ontology, RelationType};
pub use walk::{Direction, Walk, WalkStep};

/// One problem in an ontology file, located by its path inside the file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Problem {
    /// `entities[3].belongs_to`, `types.site.relations.belongs_to`…
    pub path: String,
    pub message: String,
}

impl std::fmt::Display for Problem {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}", self.path, self.message)
    }
}

/// Why an ontology could not be loaded, or an id not resolved.
#[derive(Debug, thiserror::Error)]
pub enum OntologyError {
    #[error("{file}: cannot read: {source}")]
    Io {
        file: String,
        #[source]
        source: std::io::Error,
    },
    #[error("{file}: not valid YAML: {message}")]
    Yaml { file: String, message: String },
    /// The file parsed but is not a consistent ontology; every problem is listed.
    #[error("{file}: {} problem(s):\n{}", .problems.len(), .problems.iter().map(|p| format!("  {p}")).collect::<Vec<_>>().join("\n"))]
    Invalid {
        file: String,
        problems: Vec<Problem>,
    },
    /// An id (an evidence id, a walk's start) names no entity.
    #[error("{file}: no entity '{id}'{}", .suggestion.as_ref().map(|s| format!("; did you mean '{s}'?")).unwrap_or_default())]
    UnknownEntity {
        file: String,
        id: String,
        suggestion: Option<String>,
    },
    /// A `type:id` reference whose entity has another type.
    #[error("{file}: '{id}' is a {actual}, not a {expected}")]
    WrongType {
        file: String,
        id: String,
        expected: String,
        actual: String,
    },
}

#[cfg(test)]
mod tests;
