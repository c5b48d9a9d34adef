//! `toolgate demo`: both example runs end to end, on an embedded SQLite store by default.

use std::io::Write;
use std::path::PathBuf;

#[derive(clap::Args, Debug)]
pub struct Args {
    /// The examples folder (holding field-services/ and finance/).
    #[arg(long, default_value_os_t = toolgate_harness::demo::examples_dir())]
    pub examples: PathBuf,
    /// Use this store instead of a fresh SQLite file (e.g. postgres://…; use an empty database).
    #[arg(long)]
    pub store: Option<String>,
    /// Keep the temporary folders (registry copies, stores, call records) for `trace` and `log verify`.
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set)]
    pub keep: bool,
}

pub fn run(args: &Args, out: &mut dyn Write) -> anyhow::Result<u8> {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    rt.block_on(toolgate_harness::demo::run(
        out,
        &args.examples,
        args.store.as_deref(),
        args.keep,
    ))?;
    Ok(0)
}
