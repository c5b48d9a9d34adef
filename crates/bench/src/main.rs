//! `toolgate-bench`: evidence that toolgate holds under faults. See the library for the model.

use clap::{Parser, Subcommand};
use toolgate_bench::{RunOptions, Timing, run_faults, table};

#[derive(Parser)]
#[command(name = "toolgate-bench", about = "Benchmarks toolgate under faults")]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Seeded fault-injection episodes, through toolgate and direct, with a ledger of effects.
    Faults {
        #[arg(long, default_value_t = 200)]
        episodes: u64,
        #[arg(long, default_value_t = 1)]
        seed: u64,
        /// Episodes run at once (each on its own pair of clients).
        #[arg(long, default_value_t = 32)]
        concurrency: usize,
        /// Print the report as JSON instead of a table.
        #[arg(long)]
        json: bool,
    },
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    match Cli::parse().cmd {
        Cmd::Faults {
            episodes,
            seed,
            concurrency,
            json,
        } => {
            let report = run_faults(RunOptions {
                episodes,
                seed,
                concurrency,
                timing: Timing::default(),
            })
            .await?;
            if json {
                println!("{}", serde_json::to_string_pretty(&report)?);
            } else {
                print!("{}", table(&report));
            }
        }
    }
    Ok(())
}
