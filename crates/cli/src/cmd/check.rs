//! `toolgate check [-c DIR]`: the registry lint, with accepted findings as warnings; `--schema
//! KIND` prints a file kind's JSON Schema for editors, `--explain RULE` what a lint rule is about.

use crate::exit::Exit;
use std::io::Write;
use std::path::PathBuf;

use serde_json::{Value, json};
use toolgate_core::lint::{Review, review, subject_of};
use toolgate_core::reference::FileKind;
use toolgate_core::rules::{LINT_RULES, acceptable, explain};
use toolgate_core::{Finding, LoadError, Registry};

use super::ConfigArg;

#[derive(clap::Args, Debug)]
pub struct Args {
    /// The registry folder to check, as `-c DIR` names it for every command (a folder given
    /// here is the same).
    #[arg(value_name = "DIR")]
    pub folder: Option<PathBuf>,
    #[command(flatten)]
    pub config: ConfigArg,
    /// Print findings as JSON (one array) instead of text.
    #[arg(long)]
    pub json: bool,
    /// Print the Cedar schema generated from the registry (what policies are validated against).
    #[arg(long)]
    pub cedar_schema: bool,
    /// Print the JSON Schema of a file kind, for an editor: `toolgate` (toolgate.yaml), `tools`
    /// (tools/*.yaml) or `principals` (principals.yaml). Reads no folder.
    #[arg(long, value_name = "KIND")]
    pub schema: Option<String>,
    /// Explain a lint rule: what it finds, why it matters, how to fix or accept it. Reads no
    /// folder; `--explain all` lists every rule.
    #[arg(long, value_name = "RULE")]
    pub explain: Option<String>,
}

impl Args {
    /// The folder: the one given positionally, else `-c`.
    pub fn dir(&self) -> &PathBuf {
        self.folder.as_ref().unwrap_or(&self.config.dir)
    }
}

pub fn run(args: &Args, out: &mut dyn Write) -> anyhow::Result<Exit> {
    if let Some(kind) = &args.schema {
        return print_schema(kind, out);
    }
    if let Some(rule) = &args.explain {
        return print_explanation(rule, out);
    }
    let (registry, review): (Option<Registry>, Review) = match Registry::load(args.dir()) {
        Ok(r) => {
            let review = review(&r);
            (Some(r), review)
        }
        Err(LoadError::Invalid(findings)) => (
            None,
            Review {
                findings,
                accepted: Vec::new(),
            },
        ),
        Err(LoadError::Unreadable { file, message }) => {
            writeln!(out, "unreadable: {file}: {message}")?;
            return Ok(Exit::Failure);
        }
    };
    let code = Exit::refused_if(!review.is_clean());
    if args.cedar_schema {
        if let Some(r) = &registry {
            writeln!(out, "{}", super::json_text(r.policies.schema_json())?)?;
        }
        return Ok(code);
    }
    if args.json {
        let mut items: Vec<Value> = review
            .findings
            .iter()
            .map(|f| finding_json(registry.as_ref(), f, None))
            .collect();
        items.extend(
            review
                .accepted
                .iter()
                .map(|a| finding_json(registry.as_ref(), &a.finding, Some(&a.accepted))),
        );
        writeln!(out, "{}", super::json_text(&items)?)?;
        return Ok(code);
    }
    for f in &review.findings {
        writeln!(out, "{f}")?;
        if let Some(r) = &registry
            && acceptable(&f.rule)
        {
            let (subject, at) = subject_of(r, f);
            let at = if at.is_empty() {
                String::new()
            } else {
                format!(", at: {at}")
            };
            writeln!(
                out,
                "    or accept (toolgate.yaml `accept:`): {{rule: {}, subject: {subject}{at}, reason: ..., by: ...}}",
                f.rule
            )?;
        }
    }
    for a in &review.accepted {
        writeln!(out, "{a}")?;
    }
    let accepted = match review.accepted.len() {
        0 => String::new(),
        n => format!("; {n} accepted finding(s) (warnings)"),
    };
    match &registry {
        Some(r) if review.is_clean() => writeln!(
            out,
            "ok: {} tools, {} principals, {} policies; version {}{accepted}",
            r.tools().len(),
            r.principals().len(),
            r.policies.all().count(),
            r.version
        )?,
        _ => writeln!(out, "{} finding(s){accepted}", review.findings.len())?,
    }
    if !review.is_clean() {
        writeln!(
            out,
            "`toolgate check --explain RULE` says what a rule is about and how to fix or accept it"
        )?;
    }
    Ok(code)
}

/// A finding as JSON: where, the rule, what it is about (`subject`, `at`: what an acceptance
/// names), and its acceptance when a person accepted it (`severity: warning`).
fn finding_json(
    registry: Option<&Registry>,
    f: &Finding,
    accepted: Option<&toolgate_core::config::AcceptanceConfig>,
) -> Value {
    let mut v = serde_json::to_value(f).unwrap_or(Value::Null);
    if let Some(r) = registry {
        let (subject, at) = subject_of(r, f);
        v["subject"] = json!(subject);
        v["at"] = json!(at);
    }
    v["severity"] = json!(if accepted.is_some() {
        "warning"
    } else {
        "error"
    });
    if let Some(a) = accepted {
        v["accepted"] = json!({"reason": a.reason, "by": a.by});
    }
    v
}

fn print_schema(kind: &str, out: &mut dyn Write) -> anyhow::Result<Exit> {
    let Some(k) = FileKind::from_name(kind) else {
        let names: Vec<&str> = FileKind::ALL.iter().map(|k| k.name()).collect();
        anyhow::bail!(
            "no file kind '{kind}': the kinds are {} (toolgate.yaml, tools/*.yaml, principals.yaml)",
            names.join(", ")
        );
    };
    writeln!(out, "{}", super::json_text(&k.schema())?)?;
    Ok(Exit::Success)
}

fn print_explanation(rule: &str, out: &mut dyn Write) -> anyhow::Result<Exit> {
    if rule == "all" {
        for r in LINT_RULES {
            writeln!(out, "{:<30} {}", r.id, r.finds)?;
        }
        return Ok(Exit::Success);
    }
    let Some(r) = explain(rule) else {
        let ids: Vec<&str> = LINT_RULES.iter().map(|r| r.id).collect();
        anyhow::bail!(
            "no lint rule '{rule}'; the rules are: {} (load errors such as `ref.dangling` are \
             explained in the message that reports them)",
            ids.join(", ")
        );
    };
    writeln!(out, "{}\n", r.id)?;
    writeln!(out, "Finds: {}\n", r.finds)?;
    writeln!(out, "Why it matters: {}\n", r.why)?;
    writeln!(out, "Fix: {}\n", r.fix)?;
    if acceptable(r.id) {
        writeln!(
            out,
            "Or accept it, with a reason, in toolgate.yaml:\n  accept:\n    - rule: {}\n      \
             subject: <tool, principal or policy, as `toolgate check` names it>\n      \
             reason: <why it is acceptable here>\n      by: <who accepted it>",
            r.id
        )?;
    } else {
        writeln!(out, "It cannot be accepted.")?;
    }
    Ok(Exit::Success)
}
