//! One module per subcommand.

pub mod approvals;
pub mod audit;
pub mod capabilities;
pub mod check;
pub mod decide;
pub mod demo;
pub mod eval;
pub mod grants;
pub mod init;
pub mod key;
pub mod lock;
pub mod log;
pub mod ontology;
pub mod registry;
pub mod reload;
pub mod report;
pub mod serve;
pub mod status;
pub mod store;
pub mod trace;
pub mod worker;

use std::path::PathBuf;

use anyhow::{Context, bail};
use toolgate_core::{LoadError, Registry};

/// The registry folder option shared by every command that reads one.
#[derive(clap::Args, Debug, Clone)]
pub struct ConfigArg {
    /// The registry folder (toolgate.yaml, tools/, principals.yaml, policies/). Accepted before
    /// or after a subcommand (`toolgate approvals list -c DIR`).
    #[arg(
        long = "config",
        short = 'c',
        env = "TOOLGATE_CONFIG",
        default_value = ".",
        global = true
    )]
    pub dir: PathBuf,
}

impl ConfigArg {
    /// Loads the registry or explains, with every finding, why it cannot be loaded.
    pub fn load(&self) -> anyhow::Result<Registry> {
        match Registry::load(&self.dir) {
            Ok(r) => Ok(r),
            Err(LoadError::Invalid(findings)) => {
                let list: Vec<String> = findings.iter().map(|f| f.to_string()).collect();
                bail!(
                    "the registry in {} has {} problem(s); run `toolgate check {}`:\n{}",
                    self.dir.display(),
                    findings.len(),
                    self.dir.display(),
                    list.join("\n")
                )
            }
            Err(e) => Err(e).with_context(|| format!("loading {}", self.dir.display())),
        }
    }
}

#[cfg(test)]
mod tests;

/// Whether `e` is, at its root, a write to a pipe whose reader has closed (`| head`).
pub fn broken_pipe(e: &anyhow::Error) -> bool {
    e.chain().any(|cause| {
        cause
            .downcast_ref::<std::io::Error>()
            .is_some_and(|io| io.kind() == std::io::ErrorKind::BrokenPipe)
    })
}

/// `v` as pretty JSON for a person's terminal or a program: what an agent or an upstream wrote
/// into it (reasons, tool descriptions, inputs) can hold bidirectional overrides or terminal
/// controls, so those are written as JSON escapes: the same values to a parser, inert on a
/// screen.
pub fn json_text<T: serde::Serialize + ?Sized>(v: &T) -> serde_json::Result<String> {
    let text = serde_json::to_string_pretty(v)?;
    Ok(toolgate_core::clip::json_printable(&text).into_owned())
}
