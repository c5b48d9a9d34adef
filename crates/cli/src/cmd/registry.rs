//! `toolgate registry diff REF`: the registry's tools now, compared with their declarations at a
//! git revision, each change labelled; a behaviour change without a version bump fails.

use crate::exit::Exit;
use std::io::Write;

use toolgate_contract::registry_diff::{diff_registry, tools_at_revision, tools_on_disk};

use super::ConfigArg;

#[derive(clap::Args, Debug)]
pub struct Args {
    #[command(subcommand)]
    pub action: Action,
}

#[derive(clap::Subcommand, Debug)]
pub enum Action {
    /// Label every tool change since REF; exit 1 when a behaviour change has no version bump.
    Diff(DiffArgs),
}

#[derive(clap::Args, Debug)]
pub struct DiffArgs {
    /// The git revision to compare with (`main`, `HEAD~1`, a tag).
    pub rev: String,
    #[command(flatten)]
    pub config: ConfigArg,
    /// Also exit 1 when a change is widening (it needs an owner's review).
    #[arg(long)]
    pub strict: bool,
    /// Print JSON instead of text.
    #[arg(long)]
    pub json: bool,
}

pub fn run(args: &Args, out: &mut dyn Write) -> anyhow::Result<Exit> {
    match &args.action {
        Action::Diff(d) => {
            let old = tools_at_revision(&d.config.dir, &d.rev)?;
            let new = tools_on_disk(&d.config.dir)?;
            let diff = diff_registry(&d.rev, &old, &new);
            if d.json {
                writeln!(out, "{}", super::json_text(&diff)?)?;
            } else {
                write!(out, "{}", diff.render())?;
            }
            let widening = diff.tools.iter().any(|t| t.needs_owner_review());
            Ok(Exit::refused_if(diff.failed() || (d.strict && widening)))
        }
    }
}
