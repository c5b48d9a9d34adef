//! `toolgate audit TARGET`: the tool contract audit of any MCP server, no registry needed.

use crate::exit::Exit;
use std::io::Write;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context;
use toolgate_contract::client::{Target, observe};
use toolgate_contract::sarif::to_sarif;
use toolgate_contract::{Approval, Lockfile, Severity, audit};

#[derive(clap::Args, Debug)]
pub struct Args {
    /// The server: a command and its arguments (`toolgate audit -- npx -y some-server`), or one
    /// streamable-HTTP URL.
    #[arg(required = true, num_args = 1.., trailing_var_arg = true, allow_hyphen_values = true)]
    pub target: Vec<String>,
    /// Output: a table for people, JSON, or SARIF 2.1.0 for code scanning.
    #[arg(long, value_enum, default_value = "table")]
    pub format: Format,
    /// Exit 1 when a finding at or above this severity is found (info, low, medium, high).
    #[arg(long, value_name = "SEVERITY")]
    pub fail_on: Option<Severity>,
    /// Also write (or update) a lockfile pinning what the audit saw.
    #[arg(long, value_name = "FILE")]
    pub lock: Option<PathBuf>,
    /// The server's name in the lockfile (defaults to the name it reports).
    #[arg(long)]
    pub name: Option<String>,
    /// The exact package the server comes from (`name@1.2.3`), recorded in the lockfile.
    #[arg(long)]
    pub package: Option<String>,
    /// Who approves the pins written with --lock (defaults to $USER).
    #[arg(long)]
    pub by: Option<String>,
    /// Seconds to wait for the server's handshake and tools/list.
    #[arg(long, default_value_t = 60)]
    pub timeout: u64,
}

#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum Format {
    Table,
    Json,
    Sarif,
}

pub fn run(args: &Args, out: &mut dyn Write) -> anyhow::Result<Exit> {
    let target = Target::from_words(&args.target).context("name a command or a URL to audit")?;
    let rt = tokio::runtime::Runtime::new()?;
    let seen = rt.block_on(observe(&target, Duration::from_secs(args.timeout)))?;
    let report = audit(&target.describe(), &seen.facts, &seen.tools);
    match args.format {
        Format::Table => write!(out, "{}", report.render_table())?,
        Format::Json => writeln!(out, "{}", super::json_text(&report)?)?,
        Format::Sarif => writeln!(
            out,
            "{}",
            super::json_text(&to_sarif(&report, env!("CARGO_PKG_VERSION")))?
        )?,
    }
    if let Some(path) = &args.lock {
        let mut lock = Lockfile::read(path)?;
        let name = args.name.clone().unwrap_or_else(|| {
            if seen.facts.name.is_empty() {
                "server".into()
            } else {
                seen.facts.name.clone()
            }
        });
        let by = args
            .by
            .clone()
            .or_else(|| std::env::var("USER").ok())
            .unwrap_or_else(|| "unknown".into());
        let identity = target.identity(args.package.clone());
        let done = lock.approve(
            &name,
            &identity,
            &seen.facts,
            &seen.tools,
            None,
            &Approval::now(by),
        )?;
        lock.write(path)?;
        eprintln!(
            "wrote {}: server '{name}', {} change(s) pinned",
            path.display(),
            done.len()
        );
    }
    Ok(match args.fail_on {
        Some(t) if report.fails_at(t) => Exit::Refused,
        _ => Exit::Success,
    })
}
