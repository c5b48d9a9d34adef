//! `toolgate ontology walk ID`: the path from an entity through its typed relations.

use crate::exit::Exit;
use std::io::Write;

use anyhow::Context;

use crate::cmd::ConfigArg;

#[derive(clap::Args, Debug)]
pub struct Args {
    #[command(subcommand)]
    pub action: Action,
}

#[derive(clap::Subcommand, Debug)]
pub enum Action {
    /// Print an entity and everything related to it, both directions.
    Walk {
        id: String,
        #[command(flatten)]
        config: ConfigArg,
    },
}

pub fn run(args: &Args, out: &mut dyn Write) -> anyhow::Result<Exit> {
    let Action::Walk { id, config } = &args.action;
    let top: toolgate_core::config::GatewayFile = toolgate_core::registry::parse_yaml(
        "toolgate.yaml",
        &std::fs::read_to_string(config.dir.join("toolgate.yaml"))
            .with_context(|| format!("reading {}/toolgate.yaml", config.dir.display()))?,
    )?;
    let file = top.ontology.context(
        "this registry names no ontology (set `ontology: ontology.yaml` in toolgate.yaml)",
    )?;
    let ontology = toolgate_ontology::Ontology::load(config.dir.join(file))?;
    match ontology.walk(id) {
        Ok(walk) => {
            writeln!(out, "{walk}")?;
            Ok(Exit::Success)
        }
        Err(e) => {
            writeln!(out, "{e}")?;
            Ok(Exit::Refused)
        }
    }
}
