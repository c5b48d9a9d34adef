//! `toolgate eval DIR`: run the YAML fixtures and fail on any that does not hold.

use crate::exit::Exit;
use std::io::Write;
use std::path::PathBuf;

#[derive(clap::Args, Debug)]
pub struct Args {
    /// A folder of fixtures (*.yaml) or one fixture file.
    #[arg(default_value = "evals")]
    pub dir: PathBuf,
    /// Use this store instead of a fresh SQLite file per fixture.
    #[arg(long)]
    pub store: Option<String>,
}

pub fn run(args: &Args, out: &mut dyn Write) -> anyhow::Result<Exit> {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    let ok = rt.block_on(toolgate_harness::eval::run_all(
        &args.dir,
        args.store.as_deref(),
        out,
    ))?;
    Ok(Exit::refused_if(!ok))
}
