//! `toolgate key new|hash`: API keys are shown once and stored only as hashes. `toolgate key
//! secret`: a random approval or redaction key (docs/keys.md), printed or written to a file
//! only its owner can read.

use crate::exit::Exit;
use std::io::{Read, Write};

use toolgate_core::registry::api_key_hash;

#[derive(clap::Args, Debug)]
pub struct Args {
    #[command(subcommand)]
    pub action: Action,
}

#[derive(clap::Subcommand, Debug)]
pub enum Action {
    /// Generate a new random API key and print it with the hash to put in principals.yaml.
    New,
    /// Print the hash of a key read from stdin (so it stays out of shell history).
    Hash,
    /// Make a random 32-byte key for `approvals` or `redaction` in toolgate.yaml, as 64 hex
    /// digits: printed alone (for an environment variable), or written to a new file with mode
    /// 600 (for `key_file`).
    Secret {
        /// Write the key to this new file (mode 600) instead of printing it.
        #[arg(long, value_name = "FILE")]
        out: Option<std::path::PathBuf>,
    },
}

pub fn run(args: &Args, out: &mut dyn Write) -> anyhow::Result<Exit> {
    match &args.action {
        Action::New => {
            let mut bytes = [0u8; 24];
            getrandom(&mut bytes)?;
            let key = format!("tg_{}", hex_encode(&bytes));
            writeln!(out, "key:    {key}")?;
            writeln!(out, "sha256: {}", api_key_hash(&key))?;
            writeln!(
                out,
                "Put the sha256 line in principals.yaml; give the key to the agent once."
            )?;
        }
        Action::Hash => {
            let mut key = String::new();
            std::io::stdin().read_to_string(&mut key)?;
            writeln!(out, "{}", api_key_hash(key.trim()))?;
        }
        Action::Secret { out: file } => {
            let mut bytes = [0u8; 32];
            getrandom(&mut bytes)?;
            let key = hex_encode(&bytes);
            match file {
                None => writeln!(out, "{key}")?,
                Some(path) => {
                    write_private(path, &key)?;
                    writeln!(
                        out,
                        "wrote a new key to {} (mode 600); name it in toolgate.yaml as \
                         approvals.key_file or redaction.key_file (docs/keys.md)",
                        path.display()
                    )?;
                }
            }
        }
    }
    Ok(Exit::Success)
}

/// Creates `path` (never overwriting a key already there) readable by its owner only.
fn write_private(path: &std::path::Path, key: &str) -> anyhow::Result<()> {
    use anyhow::Context;
    let mut o = std::fs::OpenOptions::new();
    o.write(true).create_new(true);
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt;
        o.mode(0o600);
    }
    let mut f = o.open(path).with_context(|| {
        format!(
            "creating {} (an existing key file is never overwritten: rotate into a new file)",
            path.display()
        )
    })?;
    writeln!(f, "{key}")?;
    f.sync_all()?;
    Ok(())
}

fn getrandom(buf: &mut [u8]) -> anyhow::Result<()> {
    let mut f = std::fs::File::open("/dev/urandom")?;
    f.read_exact(buf)?;
    Ok(())
}

fn hex_encode(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}
