//! `toolgate trace RUN [--verbose]`: a run, step by step, with every check of every step.

use crate::exit::Exit;
use std::io::Write;

use crate::cmd::ConfigArg;
use anyhow::bail;

use crate::cmd::store::{open_existing, runtime};
use toolgate_core::RunId;

#[derive(clap::Args, Debug)]
pub struct Args {
    /// The run id (printed by `demo`, returned in `_meta` of every governed call).
    pub run: String,
    /// Print every check of every step, passed or failed.
    #[arg(long, short)]
    pub verbose: bool,
    #[command(flatten)]
    pub config: ConfigArg,
    /// The store URL, instead of the registry's `store.url`.
    #[arg(long, value_name = "URL", env = "TOOLGATE_STORE_URL")]
    pub store: Option<String>,
}

pub fn run(args: &Args, out: &mut dyn Write) -> anyhow::Result<Exit> {
    runtime()?.block_on(async {
        let registry = args.config.load()?;
        let store = open_existing(&registry, args.store.as_deref()).await?;
        let run = RunId::from(&args.run);
        if store.steps(&run).await?.is_empty()
            && store.audit_records(None, Some(&run)).await?.is_empty()
        {
            bail!(
                "no run '{}' in this store (run ids are printed by `demo` and returned in `_meta` \
                 of every governed call)",
                toolgate_core::clip::printable(&args.run)
            );
        }
        let text = store.trace(&run, args.verbose).await?;
        write!(out, "{text}")?;
        Ok(Exit::Success)
    })
}
