//! `toolgate demo`: both example runs end to end, on an embedded SQLite store by default. The
//! example registries are compiled into the binary, so it runs from any folder.

use crate::exit::Exit;
use std::io::Write;
use std::path::PathBuf;

#[derive(clap::Args, Debug)]
pub struct Args {
    /// An examples folder (holding field-services/ and finance/) instead of the copies compiled
    /// into this binary.
    #[arg(long)]
    pub examples: Option<PathBuf>,
    /// Use this store instead of a fresh SQLite file (e.g. postgres://…; use an empty database).
    #[arg(long, env = "TOOLGATE_STORE_URL")]
    pub store: Option<String>,
    /// Keep the temporary folders (registry copies, stores, call records) for `trace` and `log verify`.
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set)]
    pub keep: bool,
}

pub fn run(args: &Args, out: &mut dyn Write) -> anyhow::Result<Exit> {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    // The demo copies each example into a folder of its own; this one only holds the source.
    let embedded = tempfile::tempdir()?;
    let examples = match &args.examples {
        Some(dir) => dir.clone(),
        None => {
            toolgate_harness::demo::write_examples(embedded.path())?;
            embedded.path().to_path_buf()
        }
    };
    rt.block_on(toolgate_harness::demo::run(
        out,
        &examples,
        args.store.as_deref(),
        args.keep,
    ))?;
    Ok(Exit::Success)
}
