//! `toolgate-bench`: evidence that toolgate holds under faults. See the library for the model.

use clap::{Parser, Subcommand};
use std::path::PathBuf;

use toolgate_bench::crash::{CrashOptions, StoreKind, crash_table, run_crash};
use toolgate_bench::fleet::{FleetOptions, run_fleet};
use toolgate_bench::peers::{Hop, PeersOptions, run_peers, run_relay};
use toolgate_bench::scale::{ScaleOptions, run_scale, scale_table};
use toolgate_bench::storm::{StormOptions, run_storm, storm_table};
use toolgate_bench::{RunOptions, run_faults, run_toggles, table, toggle_table};
use toolgate_core::config::Durability;

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
    /// Paired toggles: the same seeded fault episodes (through toolgate) with one safety
    /// mechanism switched off at a time, against an ERP that deduplicates on the key and one
    /// that does not; then approval episodes with the approval binding on and off.
    Toggles {
        /// Fault episodes per setting.
        #[arg(long, default_value_t = 200)]
        episodes: u64,
        /// Approval episodes per setting.
        #[arg(long, default_value_t = 200)]
        approval_episodes: u64,
        #[arg(long, default_value_t = 1)]
        seed: u64,
        #[arg(long, default_value_t = 32)]
        concurrency: usize,
        #[arg(long)]
        json: bool,
    },
    /// Processes taken down mid-step: a `toolgate serve` child killed with SIGKILL and
    /// restarted on the same store, the ERP restarted, the store's PostgreSQL connections
    /// terminated. One episode at a time.
    Crash {
        /// Episodes per store.
        #[arg(long, default_value_t = 24)]
        episodes: u64,
        /// The `toolgate` binary (default: beside this one).
        #[arg(long)]
        toolgate: Option<PathBuf>,
        /// Also run on PostgreSQL (a server URL; the bench creates and drops its own database).
        #[arg(long, env = "TOOLGATE_TEST_DATABASE_URL")]
        postgres: Option<String>,
        /// SQLite only.
        #[arg(long)]
        sqlite_only: bool,
        /// The gateway's `store.durability`: `fsync` (each acknowledged record flushed to
        /// the disk) or `process` (survives the gateway being killed, flushed later).
        #[arg(long, default_value = "fsync")]
        durability: Durability,
        #[arg(long)]
        json: bool,
    },
    /// Agents paying distinct invoices with no `_meta` through a `toolgate serve` that is
    /// SIGKILLed again and again while the ERP holds payments; the ERP books every delivery.
    /// Reports payments booked, booked twice, agents told "refused" for a booked payment, and
    /// bookings without an allow record in the audit chain.
    Storm {
        #[arg(long, default_value_t = 2000)]
        payments: u64,
        #[arg(long, default_value_t = 16)]
        agents: usize,
        #[arg(long, default_value_t = 20)]
        kills: u32,
        /// Longest the ERP holds a payment before or after booking it (ms).
        #[arg(long, default_value_t = 300)]
        hold_ms: u64,
        /// Run on PostgreSQL (a server URL; the bench creates and drops its own database)
        /// instead of SQLite.
        #[arg(long)]
        postgres: Option<String>,
        #[arg(long, default_value = "fsync")]
        durability: Durability,
        #[arg(long)]
        toolgate: Option<PathBuf>,
        #[arg(long)]
        json: bool,
    },
    /// What one hop costs: the same upstream called direct, through haproxy, through an rmcp
    /// relay and through toolgate (durability process and fsync), loaded by wrk in alternated
    /// rounds; p50, p99, calls/s and the hop's CPU per call. Needs wrk and haproxy
    /// (scripts/install-bench-peers.sh).
    Peers {
        /// Seconds of load per point.
        #[arg(long, default_value_t = 10)]
        secs: u64,
        #[arg(long, default_value_t = 4)]
        rounds: u32,
        /// Concurrency levels (connections).
        #[arg(long, value_delimiter = ',', default_value = "1,8,32")]
        conc: Vec<u32>,
        /// Send no `_meta`: every call joins the principal's current run, as an unmodified
        /// client's do (default: each call names its own run).
        #[arg(long)]
        implicit_runs: bool,
        /// Reads only (no payment.schedule loads).
        #[arg(long)]
        reads_only: bool,
        #[arg(long)]
        toolgate: Option<PathBuf>,
        /// The paths to measure beside direct (which is always measured).
        #[arg(long, value_enum, value_delimiter = ',', default_values_t = Hop::ALL)]
        hops: Vec<Hop>,
        /// Another `toolgate` binary, measured in the same rounds beside `--toolgate` on each
        /// toolgate path chosen (a before/after comparison).
        #[arg(long)]
        baseline: Option<PathBuf>,
    },
    /// What one governed call costs PostgreSQL: `toolgate serve` on SQLite and on a PostgreSQL
    /// database the bench creates and drops, loaded by wrk with a read and a write tool;
    /// calls/s, p50, p99, toolgate's and the database's CPU per call, and statements, round
    /// trips and commits per call counted on the wire. Run it with nothing else using the
    /// PostgreSQL server: its CPU is read from every `postgres` process.
    Fleet {
        /// A PostgreSQL server URL whose user may create databases.
        #[arg(
            long,
            env = "TOOLGATE_TEST_DATABASE_URL",
            default_value = "postgres://postgres@127.0.0.1:5432/test"
        )]
        postgres: String,
        /// Seconds of load per point.
        #[arg(long, default_value_t = 10)]
        secs: u64,
        #[arg(long, default_value_t = 3)]
        rounds: u32,
        /// Concurrency levels (connections).
        #[arg(long, value_delimiter = ',', default_value = "8,32")]
        conc: Vec<u32>,
        /// Send no `_meta`: every call joins the principal's current run, as an unmodified
        /// client's do (default: each call names its own run, which it creates).
        #[arg(long)]
        implicit_runs: bool,
        /// Reads only (no payment.schedule loads).
        #[arg(long)]
        reads_only: bool,
        /// The `toolgate` binary (default: beside this one).
        #[arg(long)]
        toolgate: Option<PathBuf>,
        /// An older `toolgate` binary to run on PostgreSQL beside it, load by load.
        #[arg(long)]
        baseline: Option<PathBuf>,
    },
    /// The relay `peers` measures: forwards each `tools/call` to UPSTREAM, governs nothing.
    Relay {
        #[arg(long)]
        listen: String,
        #[arg(long)]
        upstream: String,
    },
    /// Replicas on one PostgreSQL: 1–3 `toolgate serve` and 1–2 `toolgate worker` processes,
    /// throughput, one budget across replicas, each step run once, the audit chain.
    Scale {
        #[arg(long, env = "TOOLGATE_TEST_DATABASE_URL")]
        postgres: String,
        #[arg(long)]
        toolgate: Option<PathBuf>,
        /// Seconds of load per replica count.
        #[arg(long, default_value_t = 10)]
        secs: u64,
        #[arg(long, default_value_t = 24)]
        concurrency: usize,
        /// Daily spend budget of the budgeted principal and of each worker principal.
        #[arg(long, default_value_t = 300)]
        budget: u32,
        /// Payments asked for in the budget phase, and plan steps per worker phase.
        #[arg(long, default_value_t = 400)]
        requests: u32,
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
            let report = run_faults(RunOptions::new(episodes, seed, concurrency)).await?;
            if json {
                println!("{}", serde_json::to_string_pretty(&report)?);
            } else {
                print!("{}", table(&report));
            }
        }
        Cmd::Toggles {
            episodes,
            approval_episodes,
            seed,
            concurrency,
            json,
        } => {
            let report = run_toggles(episodes, approval_episodes, seed, concurrency).await?;
            if json {
                println!("{}", serde_json::to_string_pretty(&report)?);
            } else {
                print!("{}", toggle_table(&report));
            }
        }
        Cmd::Crash {
            episodes,
            toolgate,
            postgres,
            sqlite_only,
            durability,
            json,
        } => {
            let toolgate = toolgate_or_beside(toolgate)?;
            let mut stores = vec![StoreKind::Sqlite];
            if let (Some(url), false) = (postgres, sqlite_only) {
                stores.push(StoreKind::Postgres(url));
            }
            let report = run_crash(&CrashOptions {
                episodes,
                toolgate,
                stores,
                durability,
            })
            .await?;
            if json {
                println!("{}", serde_json::to_string_pretty(&report)?);
            } else {
                print!("{}", crash_table(&report));
            }
        }
        Cmd::Storm {
            payments,
            agents,
            kills,
            hold_ms,
            postgres,
            durability,
            toolgate,
            json,
        } => {
            let toolgate = toolgate_or_beside(toolgate)?;
            let report = run_storm(&StormOptions {
                toolgate,
                store: postgres.map_or(StoreKind::Sqlite, StoreKind::Postgres),
                durability,
                payments,
                agents: agents.max(1),
                kills,
                hold_ms,
            })
            .await?;
            if json {
                println!("{}", serde_json::to_string_pretty(&report)?);
            } else {
                print!("{}", storm_table(&report));
            }
        }
        Cmd::Scale {
            postgres,
            toolgate,
            secs,
            concurrency,
            budget,
            requests,
            json,
        } => {
            let toolgate = toolgate_or_beside(toolgate)?;
            let report = run_scale(&ScaleOptions {
                toolgate,
                postgres,
                secs,
                concurrency,
                budget,
                requests,
            })
            .await?;
            if json {
                println!("{}", serde_json::to_string_pretty(&report)?);
            } else {
                print!("{}", scale_table(&report));
            }
        }
        Cmd::Peers {
            secs,
            rounds,
            conc,
            implicit_runs,
            reads_only,
            toolgate,
            hops,
            baseline,
        } => {
            let toolgate = toolgate_or_beside(toolgate)?;
            let table = run_peers(&PeersOptions {
                secs,
                rounds,
                conc,
                toolgate,
                baseline,
                hops,
                implicit_runs,
                writes: !reads_only,
            })
            .await?;
            print!("{table}");
        }
        Cmd::Fleet {
            postgres,
            secs,
            rounds,
            conc,
            implicit_runs,
            reads_only,
            toolgate,
            baseline,
        } => {
            let toolgate = toolgate_or_beside(toolgate)?;
            let table = run_fleet(&FleetOptions {
                implicit_runs,
                secs,
                rounds,
                conc,
                toolgate,
                baseline,
                postgres,
                reads_only,
            })
            .await?;
            print!("{table}");
        }
        Cmd::Relay { listen, upstream } => run_relay(&listen, &upstream).await?,
    }
    Ok(())
}

/// The `toolgate` binary named on the command line, or the one beside this binary.
fn toolgate_or_beside(named: Option<PathBuf>) -> std::io::Result<PathBuf> {
    match named {
        Some(t) => Ok(t),
        None => Ok(std::env::current_exe()?.with_file_name("toolgate")),
    }
}
