//! `toolgate key new|hash`: API keys are shown once and stored only as hashes.

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
}

pub fn run(args: &Args, out: &mut dyn Write) -> anyhow::Result<u8> {
    match args.action {
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
    }
    Ok(0)
}

fn getrandom(buf: &mut [u8]) -> anyhow::Result<()> {
    let mut f = std::fs::File::open("/dev/urandom")?;
    f.read_exact(buf)?;
    Ok(())
}

fn hex_encode(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}
