//! `toolgate check [-c DIR]`: the registry lint.

use std::io::Write;
use std::path::PathBuf;

use toolgate_core::lint::lint;
use toolgate_core::{Finding, LoadError, Registry};

use super::ConfigArg;

#[derive(clap::Args, Debug)]
pub struct Args {
    /// The registry folder to check, as `-c DIR` names it for every command (a folder given
    /// here is the same).
    #[arg(value_name = "DIR")]
    pub folder: Option<PathBuf>,
    #[command(flatten)]
    pub config: ConfigArg,
    /// Print findings as JSON (one array) instead of text.
    #[arg(long)]
    pub json: bool,
    /// Print the Cedar schema generated from the registry (what policies are validated against).
    #[arg(long)]
    pub cedar_schema: bool,
}

impl Args {
    /// The folder: the one given positionally, else `-c`.
    pub fn dir(&self) -> &PathBuf {
        self.folder.as_ref().unwrap_or(&self.config.dir)
    }
}

pub fn run(args: &Args, out: &mut dyn Write) -> anyhow::Result<u8> {
    let (registry, findings): (Option<Registry>, Vec<Finding>) = match Registry::load(args.dir()) {
        Ok(r) => {
            let f = lint(&r);
            (Some(r), f)
        }
        Err(LoadError::Invalid(f)) => (None, f),
        Err(LoadError::Unreadable { file, message }) => {
            writeln!(out, "unreadable: {file}: {message}")?;
            return Ok(2);
        }
    };
    if args.cedar_schema {
        if let Some(r) = &registry {
            writeln!(
                out,
                "{}",
                serde_json::to_string_pretty(r.policies.schema_json())?
            )?;
        }
        return Ok(if findings.is_empty() { 0 } else { 1 });
    }
    if args.json {
        writeln!(out, "{}", serde_json::to_string_pretty(&findings)?)?;
    } else {
        for f in &findings {
            writeln!(out, "{f}")?;
        }
        match &registry {
            Some(r) if findings.is_empty() => writeln!(
                out,
                "ok: {} tools, {} principals, {} policies; version {}",
                r.tools().len(),
                r.principals().len(),
                r.policies.all().count(),
                r.version
            )?,
            _ => writeln!(out, "{} finding(s)", findings.len())?,
        }
    }
    Ok(if findings.is_empty() { 0 } else { 1 })
}
