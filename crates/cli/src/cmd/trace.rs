//! `toolgate trace RUN [--verbose]`: a run, step by step, with every check of every step.

use std::io::Write;

use crate::cmd::ConfigArg;
use crate::cmd::store::{open, runtime};

#[derive(clap::Args, Debug)]
pub struct Args {
    /// The run id (printed by `demo`, returned in `_meta` of every governed call).
    pub run: String,
    /// Print every check of every step, passed or failed.
    #[arg(long, short)]
    pub verbose: bool,
    #[command(flatten)]
    pub config: ConfigArg,
    /// The store URL, instead of the registry's.
    #[arg(long)]
    pub store: Option<String>,
}

pub fn run(args: &Args, out: &mut dyn Write) -> anyhow::Result<u8> {
    runtime()?.block_on(async {
        let registry = args.config.load()?;
        let store = open(&registry, args.store.as_deref()).await?;
        let text = store.trace(&args.run, args.verbose).await?;
        write!(out, "{text}")?;
        Ok(0)
    })
}
