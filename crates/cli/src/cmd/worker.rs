//! `toolgate worker`: claims and executes the steps of submitted plans. Parsing and printing
//! only; the loop is `toolgate_gateway::worker`.

use crate::exit::Exit;
use std::io::Write;
use std::time::Duration;

use toolgate_gateway::{LogFormat, WorkerOptions};
use toolgate_store::WorkOptions;

use super::ConfigArg;
use super::serve::Format;

#[derive(clap::Args, Debug)]
pub struct Args {
    #[command(flatten)]
    pub config: ConfigArg,
    /// Overrides `store.url` from toolgate.yaml.
    #[arg(
        long = "store",
        visible_alias = "store-url",
        value_name = "URL",
        env = "TOOLGATE_STORE_URL"
    )]
    pub store_url: Option<String>,
    /// Steps claimed per transaction.
    #[arg(long, default_value_t = 64)]
    pub batch: usize,
    /// Longest wait between claims when nothing wakes the worker, in milliseconds (PostgreSQL
    /// wakes it at once on new or approved steps; SQLite polls every 250 ms).
    #[arg(long, value_name = "MS", default_value_t = 5000)]
    pub idle_ms: u64,
    /// Exit once the queue is empty instead of waiting for more work.
    #[arg(long)]
    pub until_idle: bool,
    /// Log lines as text or JSON (always on stderr).
    #[arg(long, value_enum, default_value = "text")]
    pub log_format: Format,
    /// Development only: start without an approval key and a redaction key (see `toolgate
    /// serve --dev` and docs/keys.md for what that gives up).
    #[arg(long)]
    pub dev: bool,
}

pub fn run(args: &Args, out: &mut dyn Write) -> anyhow::Result<Exit> {
    toolgate_gateway::init_logging(match args.log_format {
        Format::Text => LogFormat::Text,
        Format::Json => LogFormat::Json,
    });
    let opts = WorkerOptions {
        config_dir: args.config.dir.clone(),
        store_url: args.store_url.clone(),
        work: Some(WorkOptions {
            batch: args.batch.max(1),
            idle: Duration::from_millis(args.idle_ms.max(1)),
            until_idle: args.until_idle,
            ..WorkOptions::default()
        }),
        keys: super::serve::key_source(args.dev),
    };
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    let stats = rt.block_on(toolgate_gateway::worker(opts))?;
    writeln!(
        out,
        "worker stopped: {} step(s) executed ({} done, {} refused, {} parked for approval, {} other), {} recovered",
        stats.executed, stats.done, stats.refused, stats.parked, stats.other, stats.recovered
    )?;
    Ok(Exit::Success)
}
