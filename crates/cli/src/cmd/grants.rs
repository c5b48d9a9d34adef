//! `toolgate grants show PRINCIPAL`: what one principal may do, and why.

use crate::exit::Exit;
use std::io::Write;

use toolgate_core::Tier;

use crate::cmd::ConfigArg;
use crate::table::Table;

#[derive(clap::Args, Debug)]
pub struct Args {
    #[command(subcommand)]
    pub action: Action,
}

#[derive(clap::Subcommand, Debug)]
pub enum Action {
    /// Role, kind, parent chain, grants, daily budgets and the tools the role lists.
    Show {
        principal: String,
        #[command(flatten)]
        config: ConfigArg,
    },
}

pub fn run(args: &Args, out: &mut dyn Write) -> anyhow::Result<Exit> {
    let Action::Show { principal, config } = &args.action;
    let registry = config.load()?;
    let Some(p) = registry.principal(principal) else {
        let known: Vec<&str> = registry.principals().iter().map(|p| p.id()).collect();
        writeln!(
            out,
            "no principal '{principal}'; known: {}",
            known.join(", ")
        )?;
        return Ok(Exit::Refused);
    };
    let c = &p.config;
    writeln!(out, "principal  {} ({})", c.id, c.kind)?;
    writeln!(out, "role       {}", c.role)?;
    if let Some(r) = registry.role(&c.role) {
        let mut flags = Vec::new();
        if r.plan_bound {
            flags.push("plan-bound");
        }
        if r.approver {
            flags.push("approver");
        }
        if !flags.is_empty() {
            writeln!(out, "           {}", flags.join(", "))?;
        }
    }
    if !p.ancestors.is_empty() {
        writeln!(out, "draws from {}", p.ancestors.join(" -> "))?;
    }
    let budget = |t: Tier| {
        p.budget(t)
            .map_or("unbudgeted".to_string(), |b| format!("{b}/day"))
    };
    writeln!(
        out,
        "budgets    act {}, spend {} (read is never budgeted)",
        budget(Tier::Act),
        budget(Tier::Spend)
    )?;
    writeln!(out, "credentials {}", c.credentials.len())?;
    writeln!(out)?;
    let mut g = Table::new(&["grant", "scopes", "purposes", "max tier", "max sensitivity"]);
    for (i, grant) in c.grants.iter().enumerate() {
        g.row(vec![
            format!("#{}", i + 1),
            grant.scopes.join(","),
            grant.purposes.join(","),
            grant.max_tier.to_string(),
            grant.max_sensitivity.to_string(),
        ]);
    }
    g.write(out)?;
    writeln!(out)?;
    let mut t = Table::new(&["tool listed for role", "tier", "usable for purposes"]);
    for tool in registry.tools_for_role(&c.role) {
        let tc = &tool.config;
        let usable: Vec<&str> = tc
            .purposes
            .iter()
            .filter(|purpose| {
                c.grants.iter().any(|g| {
                    g.purposes.contains(purpose)
                        && tc.scopes.iter().all(|s| g.scopes.contains(s))
                        && g.max_tier >= tc.tier
                        && g.max_sensitivity >= tc.sensitivity
                })
            })
            .map(String::as_str)
            .collect();
        t.row(vec![
            tc.name.clone(),
            tc.tier.to_string(),
            if usable.is_empty() {
                "(none: no grant covers it)".into()
            } else {
                usable.join(",")
            },
        ]);
    }
    t.write(out)?;
    Ok(Exit::Success)
}
