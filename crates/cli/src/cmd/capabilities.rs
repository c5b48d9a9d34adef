//! `toolgate capabilities list`: what the registry declares, one tool per row.

use crate::exit::Exit;
use std::io::Write;

use crate::cmd::ConfigArg;
use crate::table::Table;

#[derive(clap::Args, Debug)]
pub struct Args {
    #[command(subcommand)]
    pub action: Action,
}

#[derive(clap::Subcommand, Debug)]
pub enum Action {
    /// A table: tool, effect, tier, sensitivity, scopes, purposes, roles, gate, limit.
    List {
        #[command(flatten)]
        config: ConfigArg,
        /// Only the tools listed for this role.
        #[arg(long)]
        role: Option<String>,
    },
}

pub fn run(args: &Args, out: &mut dyn Write) -> anyhow::Result<Exit> {
    let Action::List { config, role } = &args.action;
    let registry = config.load()?;
    let mut t = Table::new(&[
        "tool",
        "version",
        "effect",
        "tier",
        "sensitivity",
        "scopes",
        "purposes",
        "roles",
        "gate",
        "limit",
    ]);
    for tool in registry.tools() {
        if role.as_deref().is_some_and(|r| !tool.is_listed_for(r)) {
            continue;
        }
        let c = &tool.config;
        let gate = match (c.gate, c.approvers) {
            (toolgate_core::Gate::Always, 2) => "always (2 people)".to_string(),
            (g, _) => g.to_string(),
        };
        t.row(vec![
            c.name.clone(),
            c.version.clone(),
            c.effect.to_string(),
            c.tier.to_string(),
            c.sensitivity.to_string(),
            c.scopes.join(","),
            c.purposes.join(","),
            c.roles.join(","),
            gate,
            c.rate_limit.map_or("-".into(), |l| format!("{l}/run")),
        ]);
    }
    t.write(out)?;
    Ok(Exit::Success)
}
