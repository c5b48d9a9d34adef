use super::*;

const FIELD: &str = r#"
types:
  customer:
    label: name
    attributes: {name: string}
  site:
    label: address
    attributes: {address: string}
    relations: {belongs_to: customer}
  technician:
    label: name
    attributes: {name: string, skills: {type: string, optional: true}}
  work_order:
    label: summary
    tags: [status, priority]
    attributes:
      summary: string
      status: {enum: [open, in_progress, closed]}
      priority: {enum: [low, medium, high]}
    relations:
      raised_at: site
      assigned_to: {to: technician, optional: true}
  invoice:
    label: description
    attributes: {description: string, amount: number, issued: {type: date, optional: true}}
    relations:
      bills: {to: work_order, many: true}
entities:
  - {id: cust-001, type: customer, name: Harbour Bakery}
  - {id: site-001, type: site, address: "12 Quay Street, Whitby", belongs_to: cust-001}
  - {id: tech-001, type: technician, name: Priya Shah}
  - id: wo-001
    type: work_order
    summary: Oven proofing cabinet not holding temperature.
    status: open
    priority: high
    raised_at: site-001
  - id: wo-003
    type: work_order
    summary: Display fridge door seal replaced.
    status: closed
    priority: low
    raised_at: site-001
    assigned_to: tech-001
  - {id: inv-001, type: invoice, description: Door seal, amount: 145.0, issued: "2026-05-02", bills: [wo-003]}
"#;

fn field() -> Ontology {
    Ontology::from_yaml("ontology.yaml", FIELD).expect("the test ontology loads")
}

/// The problems of an ontology that must not load.
fn problems(text: &str) -> Vec<Problem> {
    match Ontology::from_yaml("bad.yaml", text) {
        Err(OntologyError::Invalid { file, problems }) => {
            assert_eq!(file, "bad.yaml");
            problems
        }
        other => panic!("expected an invalid ontology, got {other:?}"),
    }
}

/// FIELD with one entity line replaced.
fn field_with(from: &str, to: &str) -> String {
    assert!(FIELD.contains(from), "fixture has no {from:?}");
    FIELD.replacen(from, to, 1)
}

#[test]
fn walking_a_customer_descends_through_sites_to_work_orders_and_invoices() {
    let walk = field().walk("cust-001").unwrap();
    assert_eq!(
        walk.to_string(),
        "customer cust-001 'Harbour Bakery'\n\
         <- belongs_to site site-001 '12 Quay Street, Whitby'\n   \
            <- raised_at work_order wo-001 [open/high] 'Oven proofing cabinet not holding temperature.'\n   \
            <- raised_at work_order wo-003 [closed/low] 'Display fridge door seal replaced.'\n      \
               <- bills invoice inv-001 'Door seal'\n"
    );
    assert_eq!(walk.steps[0].direction, Direction::Inbound);
    assert_eq!(walk.steps[0].depth, 1);
}

#[test]
fn walking_a_work_order_climbs_to_its_customer_then_descends_to_its_invoice() {
    let walk = field().walk("wo-003").unwrap();
    assert_eq!(walk.ids(), ["tech-001", "site-001", "cust-001", "inv-001"]);
    let kinds: Vec<(Direction, &str, usize)> = walk
        .steps
        .iter()
        .map(|s| (s.direction, s.relation.as_str(), s.depth))
        .collect();
    assert_eq!(
        kinds,
        [
            (Direction::Outbound, "assigned_to", 1),
            (Direction::Outbound, "raised_at", 1),
            (Direction::Outbound, "belongs_to", 2),
            (Direction::Inbound, "bills", 1),
        ]
    );
    assert!(walk.to_string().contains("-> raised_at site site-001"));
    assert!(
        walk.to_string()
            .contains("   -> belongs_to customer cust-001 'Harbour Bakery'")
    );
}

#[test]
fn resolve_finds_evidence_by_id_or_typed_id() {
    let o = field();
    assert_eq!(o.resolve("wo-001").unwrap().type_name, "work_order");
    assert_eq!(o.resolve("invoice:inv-001").unwrap().id, "inv-001");
    assert_eq!(o.resolve("inv-001").unwrap().attributes["amount"], 145.0);
}

#[test]
fn resolve_refuses_an_unknown_id_with_a_suggestion() {
    let err = field().resolve("wo-01").unwrap_err();
    match &err {
        OntologyError::UnknownEntity { id, suggestion, .. } => {
            assert_eq!(id, "wo-01");
            assert_eq!(suggestion.as_deref(), Some("wo-001"));
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(
        err.to_string(),
        "ontology.yaml: no entity 'wo-01'; did you mean 'wo-001'?"
    );
}

#[test]
fn resolve_refuses_a_typed_id_of_another_type() {
    let err = field().resolve("invoice:wo-001").unwrap_err();
    assert!(
        matches!(&err, OntologyError::WrongType { expected, actual, .. } if expected == "invoice" && actual == "work_order"),
        "{err:?}"
    );
}

#[test]
fn a_relation_to_an_entity_of_the_wrong_type_is_a_load_error() {
    let p = problems(&field_with(
        "address: \"12 Quay Street, Whitby\", belongs_to: cust-001",
        "address: \"12 Quay Street, Whitby\", belongs_to: tech-001",
    ));
    assert_eq!(p.len(), 1, "{p:?}");
    assert_eq!(p[0].path, "entities[1].belongs_to");
    assert!(
        p[0].message
            .contains("which is a technician; belongs_to points to a customer"),
        "{}",
        p[0].message
    );
}

#[test]
fn a_relation_to_a_missing_entity_is_a_load_error() {
    let p = problems(&field_with("bills: [wo-003]", "bills: [wo-003, wo-404]"));
    assert_eq!(p.len(), 1, "{p:?}");
    assert_eq!(p[0].path, "entities[5].bills[1]");
    assert!(
        p[0].message
            .contains("'wo-404', which is not a declared entity")
    );
}

#[test]
fn a_relation_declared_to_an_undeclared_type_is_a_load_error() {
    let p = problems(&field_with(
        "relations: {belongs_to: customer}",
        "relations: {belongs_to: client}",
    ));
    assert!(
        p.iter().any(|p| p.path == "types.site.relations.belongs_to"
            && p.message.contains("type 'client', which is not declared")),
        "{p:?}"
    );
}

#[test]
fn entity_fields_are_type_checked_against_their_type() {
    let p = problems(&field_with("status: open\n", "status: pending\n"));
    assert_eq!(p[0].path, "entities[3].status");
    assert!(p[0].message.contains("one of open, in_progress, closed"));

    let p = problems(&field_with("amount: 145.0", "amount: lots"));
    assert_eq!(p[0].path, "entities[5].amount");

    let p = problems(&field_with(
        "issued: \"2026-05-02\"",
        "issued: \"2026-13-02\"",
    ));
    assert_eq!(p[0].path, "entities[5].issued");
    assert!(p[0].message.contains("a date"));

    let p = problems(&field_with(
        "{id: tech-001, type: technician, name: Priya Shah}",
        "{id: tech-001, type: technician, name: Priya Shah, van: VX12}",
    ));
    assert_eq!(p[0].path, "entities[2].van");
    assert!(
        p[0].message.contains("it has: name, skills"),
        "{}",
        p[0].message
    );
}

#[test]
fn missing_required_attributes_and_relations_unknown_types_and_duplicates_are_errors() {
    let p = problems(&field_with(", belongs_to: cust-001}", "}"));
    assert!(
        p.iter()
            .any(|p| p.path == "entities[1]" && p.message.contains("lacks relation 'belongs_to'")),
        "{p:?}"
    );

    let p = problems(&field_with(
        "{id: cust-001, type: customer, name: Harbour Bakery}",
        "{id: cust-001, type: customer}",
    ));
    assert!(
        p.iter()
            .any(|p| p.message.contains("lacks attribute 'name'")),
        "{p:?}"
    );

    let p = problems(&field_with(
        "type: technician, name",
        "type: engineer, name",
    ));
    assert!(
        p.iter().any(|p| p.path == "entities[2].type"
            && p.message.contains("'engineer' is not a declared type")),
        "{p:?}"
    );

    let p = problems(&field_with("{id: tech-001,", "{id: cust-001,"));
    assert!(
        p.iter()
            .any(|p| p.path == "entities[2].id"
                && p.message.contains("already declared at entities[0]")),
        "{p:?}"
    );
}

#[test]
fn shape_errors_name_their_path_and_yaml_errors_the_file() {
    let p = problems("types: {a: {lable: x}}\n");
    assert_eq!(p[0].path, "types.a.lable");
    assert!(p[0].message.contains("lable"));
    let err = Ontology::from_yaml("x.yaml", "types: [").unwrap_err();
    assert!(
        matches!(err, OntologyError::Yaml { ref file, .. } if file == "x.yaml"),
        "{err:?}"
    );
}

#[test]
fn load_reads_a_file_and_names_a_missing_one() {
    let dir = std::env::temp_dir().join(format!("toolgate-ontology-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("ontology.yaml");
    std::fs::write(&path, FIELD).unwrap();
    assert_eq!(Ontology::load(&path).unwrap().entities().len(), 6);
    let err = Ontology::load(dir.join("missing.yaml")).unwrap_err();
    assert!(
        err.to_string().contains("missing.yaml: cannot read"),
        "{err}"
    );
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn resolve_all_reports_every_unknown_evidence_id() {
    let o = field();
    let found = o.resolve_all(&["wo-001", "site:site-001"]).unwrap();
    assert_eq!(
        found.iter().map(|e| e.id.as_str()).collect::<Vec<_>>(),
        ["wo-001", "site-001"]
    );
    let errors = o
        .resolve_all(&["wo-001", "wo-999", "customer:site-001"])
        .unwrap_err();
    assert_eq!(errors.len(), 2);
    assert!(matches!(errors[0], OntologyError::UnknownEntity { ref id, .. } if id == "wo-999"));
    assert!(matches!(errors[1], OntologyError::WrongType { .. }));
}
