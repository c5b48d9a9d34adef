//! Walking the graph from one entity: up through its own relations (a work order is raised at a
//! site, which belongs to a customer) and down through the relations that point at it (a
//! customer's sites, the work orders raised at them, the invoices that bill those).

use std::collections::HashSet;
use std::fmt;

use crate::{Entity, Ontology, OntologyError};

/// Which way a relation was followed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Direction {
    /// From the entity through one of its own relations (`->`).
    Outbound,
    /// From an entity whose relation points here (`<-`).
    Inbound,
}

/// One entity reached by the walk.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WalkStep {
    /// 1 for a neighbour of the start, 2 for its neighbour's neighbour…
    pub depth: usize,
    pub direction: Direction,
    pub relation: String,
    /// The id of the entity reached.
    pub id: String,
    /// How it reads: `site site-001 '12 Quay Street, Whitby'`.
    pub description: String,
}

/// The path from an entity through its relations, in both directions.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Walk {
    pub start: String,
    /// How the start reads.
    pub description: String,
    /// Outbound steps first (what the entity belongs to), then inbound (what hangs off it).
    pub steps: Vec<WalkStep>,
}

impl Walk {
    /// The ids reached, in order.
    pub fn ids(&self) -> Vec<&str> {
        self.steps.iter().map(|s| s.id.as_str()).collect()
    }
}

impl fmt::Display for Walk {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "{}", self.description)?;
        for s in &self.steps {
            let arrow = match s.direction {
                Direction::Outbound => "->",
                Direction::Inbound => "<-",
            };
            writeln!(
                f,
                "{}{arrow} {} {}",
                "   ".repeat(s.depth - 1),
                s.relation,
                s.description
            )?;
        }
        Ok(())
    }
}

impl Ontology {
    /// Walks from the entity `id` (or `type:id`): up its own relations, then down the relations
    /// that point at it; each entity appears once.
    pub fn walk(&self, id: &str) -> Result<Walk, OntologyError> {
        let start = self.resolve(id)?;
        let mut seen: HashSet<&str> = HashSet::from([start.id.as_str()]);
        let mut steps = Vec::new();
        self.walk_out(start, 1, &mut seen, &mut steps);
        self.walk_in(start, 1, &mut seen, &mut steps);
        Ok(Walk {
            start: start.id.clone(),
            description: self.describe(start),
            steps,
        })
    }

    fn walk_out<'a>(
        &'a self,
        from: &'a Entity,
        depth: usize,
        seen: &mut HashSet<&'a str>,
        steps: &mut Vec<WalkStep>,
    ) {
        for (rel, targets) in &from.relations {
            for target in targets {
                let Some(next) = self.entity(target) else {
                    continue;
                };
                if !seen.insert(next.id.as_str()) {
                    continue;
                }
                steps.push(self.step(depth, Direction::Outbound, rel, next));
                self.walk_out(next, depth + 1, seen, steps);
            }
        }
    }

    fn walk_in<'a>(
        &'a self,
        to: &'a Entity,
        depth: usize,
        seen: &mut HashSet<&'a str>,
        steps: &mut Vec<WalkStep>,
    ) {
        let sources: Vec<(&Entity, &str)> = self.inbound(&to.id).collect();
        for (source, rel) in sources {
            if !seen.insert(source.id.as_str()) {
                continue;
            }
            steps.push(self.step(depth, Direction::Inbound, rel, source));
            self.walk_in(source, depth + 1, seen, steps);
        }
    }

    fn step(&self, depth: usize, direction: Direction, relation: &str, e: &Entity) -> WalkStep {
        WalkStep {
            depth,
            direction,
            relation: relation.to_string(),
            id: e.id.clone(),
            description: self.describe(e),
        }
    }
}
