//! `toolgate log verify|export`: the audit chain, checked and exported.

use std::io::Write;

use crate::cmd::ConfigArg;
use crate::cmd::store::{open, runtime};

#[derive(clap::Args, Debug)]
pub struct Args {
    #[command(subcommand)]
    pub action: Action,
}

#[derive(clap::Subcommand, Debug)]
pub enum Action {
    /// Walk the audit chain and name the first broken link (exit 1 if there is one).
    Verify {
        #[command(flatten)]
        config: ConfigArg,
        /// The store URL, instead of the registry's.
        #[arg(long)]
        store: Option<String>,
    },
    /// Write one principal's audit records as JSON Lines.
    Export {
        #[arg(long)]
        principal: String,
        #[command(flatten)]
        config: ConfigArg,
        #[arg(long)]
        store: Option<String>,
    },
}

pub fn run(args: &Args, out: &mut dyn Write) -> anyhow::Result<u8> {
    runtime()?.block_on(async {
        match &args.action {
            Action::Verify { config, store } => {
                let registry = config.load()?;
                let store = open(&registry, store.as_deref()).await?;
                let report = store.verify_chain().await?;
                writeln!(out, "{report}")?;
                Ok(if report.is_intact() { 0 } else { 1 })
            }
            Action::Export {
                principal,
                config,
                store,
            } => {
                let registry = config.load()?;
                let store = open(&registry, store.as_deref()).await?;
                let mut buf = Vec::new();
                let n = store.export_principal(principal, &mut buf).await?;
                out.write_all(&buf)?;
                eprintln!("{n} record(s) for {principal}");
                Ok(0)
            }
        }
    })
}
