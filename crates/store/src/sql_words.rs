//! The store's SQL names statuses, kinds and states as literals (`status = 'running'`), not as
//! bound parameters: partial indexes (`WHERE status = 'running'`) are used only for a
//! statement that names the same literal. These tests hold the literals to the enums: every
//! value a migration's `CHECK` admits is one the Rust enum writes and reads, and every literal
//! a statement compares a column with is one that column's `CHECK` admits in a table the
//! statement names. A misspelt status fails here instead of silently matching nothing.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use toolgate_core::{Effect, StepStatus, Tier};

use crate::ledger::keys::KeyState;
use crate::model::{ApprovalStatus, RunState, StepKind};

/// The columns whose values are closed sets.
const WORDS: &[&str] = &["status", "state", "kind", "effect", "tier", "verdict"];

type Checks = BTreeMap<(String, String), BTreeSet<String>>;

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn files(dir: &Path, ext: &str, out: &mut Vec<PathBuf>) {
    let mut entries: Vec<_> = std::fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|e| e.unwrap().path())
        .collect();
    entries.sort();
    for p in entries {
        if p.is_dir() {
            files(&p, ext, out);
        } else if p.extension().is_some_and(|x| x == ext) {
            out.push(p);
        }
    }
}

/// The quoted words of a list like `('a', 'b')` or a single `'a'` at the start of `s`.
fn quoted(s: &str) -> Vec<String> {
    let s = s.trim_start();
    let (body, listed) = match s.strip_prefix('(') {
        Some(rest) => (rest.split(')').next().unwrap_or(""), true),
        None => (s, false),
    };
    let mut words = Vec::new();
    let mut rest = body.trim_start();
    while let Some(after) = rest.strip_prefix('\'') {
        let Some(end) = after.find('\'') else { break };
        words.push(after[..end].to_string());
        rest = after[end + 1..].trim_start();
        match rest.strip_prefix(',') {
            Some(r) if listed => rest = r.trim_start(),
            _ => break,
        }
    }
    words
}

/// The string literals of Rust source, whole (a statement continued over lines with `\` is
/// one), skipping comments and the character literal `'"'`.
fn string_literals(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut chars = text.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            '/' if chars.peek() == Some(&'/') => {
                for c in chars.by_ref() {
                    if c == '\n' {
                        break;
                    }
                }
            }
            '\'' => {
                // A character literal (`'"'`, `'\''`) or a lifetime: step over the former.
                let mut ahead = chars.clone();
                let first = ahead.next();
                let lit = match first {
                    Some('\\') => ahead.nth(1) == Some('\''),
                    Some(_) => ahead.next() == Some('\''),
                    None => false,
                };
                if lit {
                    let skip = if first == Some('\\') { 3 } else { 2 };
                    for _ in 0..skip {
                        chars.next();
                    }
                }
            }
            '"' => {
                let mut s = String::new();
                while let Some(c) = chars.next() {
                    match c {
                        '\\' => {
                            if let Some(e) = chars.next() {
                                s.push(e);
                            }
                        }
                        '"' => break,
                        c => s.push(c),
                    }
                }
                out.push(s);
            }
            _ => {}
        }
    }
    out
}

/// Every `CHECK (col IN (...))` of every `CREATE TABLE` in one backend's migrations.
fn checks(backend: &str) -> Checks {
    let mut paths = Vec::new();
    files(&root().join("migrations").join(backend), "sql", &mut paths);
    let mut out = Checks::new();
    for p in paths {
        let sql = std::fs::read_to_string(&p).unwrap();
        for block in sql.split("CREATE TABLE ").skip(1) {
            let table = block
                .split(|c: char| c.is_whitespace() || c == '(')
                .find(|w| !w.is_empty() && *w != "IF" && *w != "NOT" && *w != "EXISTS")
                .unwrap()
                .to_string();
            let body = block.split(";").next().unwrap();
            for col in WORDS {
                let pat = format!("CHECK ({col} IN");
                if let Some(i) = body.find(&pat) {
                    let words = quoted(&body[i + pat.len()..]);
                    assert!(!words.is_empty(), "{}: {table}.{col}", p.display());
                    out.insert(
                        (table.clone(), col.to_string()),
                        words.into_iter().collect(),
                    );
                }
            }
        }
    }
    out
}

fn set(words: impl IntoIterator<Item = &'static str>) -> BTreeSet<String> {
    words.into_iter().map(str::to_string).collect()
}

fn all_step_statuses() -> [StepStatus; 7] {
    // Exhaustive: a new variant fails to compile here until it is listed.
    let _ = |s: StepStatus| match s {
        StepStatus::Pending
        | StepStatus::Running
        | StepStatus::NeedsApproval
        | StepStatus::Done
        | StepStatus::Failed
        | StepStatus::Refused
        | StepStatus::Unknown => (),
    };
    [
        StepStatus::Pending,
        StepStatus::Running,
        StepStatus::NeedsApproval,
        StepStatus::Done,
        StepStatus::Failed,
        StepStatus::Refused,
        StepStatus::Unknown,
    ]
}

fn all_approval_statuses() -> [ApprovalStatus; 5] {
    let _ = |s: ApprovalStatus| match s {
        ApprovalStatus::Pending
        | ApprovalStatus::Approved
        | ApprovalStatus::Rejected
        | ApprovalStatus::Expired
        | ApprovalStatus::Consumed => (),
    };
    [
        ApprovalStatus::Pending,
        ApprovalStatus::Approved,
        ApprovalStatus::Rejected,
        ApprovalStatus::Expired,
        ApprovalStatus::Consumed,
    ]
}

#[test]
fn every_checked_column_admits_exactly_what_its_enum_writes() {
    let kinds = [StepKind::Planned, StepKind::Direct, StepKind::Compensation];
    let _ = |k: StepKind| match k {
        StepKind::Planned | StepKind::Direct | StepKind::Compensation => (),
    };
    let _ = |r: RunState| match r {
        RunState::Open | RunState::Aborted => (),
    };
    let _ = |k: KeyState| match k {
        KeyState::InFlight | KeyState::Done => (),
    };
    let enums: [(&str, &str, BTreeSet<String>); 7] = [
        (
            "steps",
            "status",
            set(all_step_statuses().map(StepStatus::as_str)),
        ),
        ("steps", "kind", set(kinds.map(StepKind::as_str))),
        (
            "steps",
            "effect",
            set([Effect::Read, Effect::Write, Effect::Irreversible].map(Effect::as_str)),
        ),
        (
            "steps",
            "tier",
            set([Tier::Read, Tier::Act, Tier::Spend].map(Tier::as_str)),
        ),
        (
            "approval_requests",
            "status",
            set(all_approval_statuses().map(ApprovalStatus::as_str)),
        ),
        (
            "runs",
            "status",
            set([RunState::Open, RunState::Aborted].map(RunState::as_str)),
        ),
        (
            "idempotency",
            "state",
            set(KeyState::ALL.map(KeyState::as_str)),
        ),
    ];
    for backend in ["postgres", "sqlite"] {
        let checks = checks(backend);
        for (table, col, want) in &enums {
            let got = checks
                .get(&(table.to_string(), col.to_string()))
                .unwrap_or_else(|| panic!("{backend}: no CHECK on {table}.{col}"));
            assert_eq!(got, want, "{backend}: {table}.{col}");
        }
    }
}

#[test]
fn every_literal_a_statement_compares_is_one_its_column_admits() {
    let checks = checks("postgres");
    assert_eq!(
        checks,
        self::checks("sqlite"),
        "both backends check the same values"
    );
    let tables: BTreeSet<&str> = checks.keys().map(|(t, _)| t.as_str()).collect();
    let mut sources = Vec::new();
    files(&root().join("src"), "rs", &mut sources);
    let mut compared = 0;
    let mut wrong = Vec::new();
    for p in sources.iter().filter(|p| !p.ends_with("sql_words.rs")) {
        let text = std::fs::read_to_string(p).unwrap();
        for (n, literal) in string_literals(&text).iter().enumerate() {
            let literal = literal.as_str();
            let upper = literal.to_ascii_uppercase();
            if ![
                "SELECT ", "UPDATE ", "INSERT ", "DELETE ", "FROM ", "WHERE ",
            ]
            .iter()
            .any(|k| upper.contains(k))
            {
                continue;
            }
            let named: Vec<&str> = tables
                .iter()
                .copied()
                .filter(|t| {
                    literal
                        .split(|c: char| !(c.is_alphanumeric() || c == '_'))
                        .any(|w| w == *t)
                })
                .collect();
            for col in WORDS {
                let mut rest = literal;
                while let Some(i) = rest.find(col) {
                    let before = rest[..i].chars().next_back();
                    let after = &rest[i + col.len()..];
                    rest = after;
                    if before.is_some_and(|c| c.is_alphanumeric() || c == '_') {
                        continue;
                    }
                    let op = after.trim_start();
                    let values = ["NOT IN", "IN", "<>", "!=", "="]
                        .iter()
                        .find_map(|o| op.strip_prefix(o))
                        .map(quoted)
                        .unwrap_or_default();
                    for v in values {
                        compared += 1;
                        let admitted = named.iter().any(|t| {
                            checks
                                .get(&(t.to_string(), col.to_string()))
                                .is_some_and(|s| s.contains(&v))
                        });
                        if !admitted {
                            wrong.push(format!(
                                "{} (string {n}): {col} '{v}' is admitted by no table it names ({named:?})",
                                p.strip_prefix(root()).unwrap().display()
                            ));
                        }
                    }
                }
            }
        }
    }
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
    // The scan finds the comparisons (a scanner that found none would pass anything).
    assert!(compared > 40, "only {compared} compared literals found");
}
