//! `toolgate report [--since 7d|2026-06-01] [--prometheus]`: the surface numbers from the audit
//! chain, the approval requests and today's budgets; the same figures as the page and
//! `/metrics`.

use crate::exit::Exit;
use std::io::Write;

use anyhow::bail;
use toolgate_core::{Clock, SystemClock};

use crate::cmd::ConfigArg;
use crate::cmd::store::{open_existing, runtime};

#[derive(clap::Args, Debug)]
pub struct Args {
    /// Only records and requests from then on: `7d`, `36h`, `4w`, or a date (UTC midnight).
    #[arg(long)]
    pub since: Option<String>,
    /// Print the Prometheus text format instead of the table.
    #[arg(long)]
    pub prometheus: bool,
    #[command(flatten)]
    pub config: ConfigArg,
    /// The store URL, instead of the registry's `store.url`.
    #[arg(long, value_name = "URL", env = "TOOLGATE_STORE_URL")]
    pub store: Option<String>,
}

pub fn run(args: &Args, out: &mut dyn Write) -> anyhow::Result<Exit> {
    runtime()?.block_on(async {
        let registry = args.config.load()?;
        let now = SystemClock.now();
        let since = match &args.since {
            None => None,
            Some(s) => match toolgate_console::report::parse_since(s, now) {
                Some(t) => Some(t),
                None => bail!("--since '{s}': use 7d, 36h, 4w or a date like 2026-06-01"),
            },
        };
        let store = open_existing(&registry, args.store.as_deref()).await?;
        let report = toolgate_console::report::gather(&store, &registry, since, now).await?;
        if args.prometheus {
            write!(out, "{}", report.to_prometheus())?;
        } else {
            write!(out, "{}", report.to_text())?;
        }
        Ok(Exit::Success)
    })
}
