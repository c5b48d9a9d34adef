//! The `toolgate` command. Argument parsing and printing only: each subcommand is a function in
//! `cmd/` that takes parsed arguments and a writer and returns an [`exit::Exit`] (an error is
//! `Exit::Failure`, printed with its causes), so tests call it directly and snapshot what it
//! printed.

use std::process::ExitCode;

use clap::{Parser, Subcommand};

mod cmd;
mod exit;
mod table;

/// mimalloc rather than glibc's malloc: under load the gateway allocates on every request
/// (JSON, MCP envelopes, SQL arguments), and glibc's arena locks made threads wake each other.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// toolgate: a governance gateway for AI agents' tool calls.
///
/// Agents connect over MCP; toolgate lists each role only the tools it is granted, checks every
/// input against a closed schema, decides every call against the caller's credential and the run
/// so far, parks consequential calls for a person's approval, deduplicates writes with derived
/// idempotency keys, and writes every decision to a hash-chained audit log.
#[derive(Parser, Debug)]
#[command(name = "toolgate", version, about, long_about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Write a registry folder for MCP servers you already run (`--add`: one more upstream).
    ///
    /// Connects to each upstream, proposes each tool's declaration (closed schema, effect,
    /// tier, gate, `review:` notes), refuses what it cannot place safely, makes an agent key
    /// and an approver, and pins toolgate.lock.
    Init(cmd::init::Args),
    /// Lint a registry folder: exit 0 clean, 1 findings, 2 unreadable.
    Check(cmd::check::Args),
    /// List the tools the registry declares, with their effect, tier, grants and gates.
    Capabilities(cmd::capabilities::Args),
    /// Show what a principal may do: role, grants, budgets, parent chain and listed tools.
    Grants(cmd::grants::Args),
    /// Dry-run one call through every check and print why it would be allowed, denied or gated.
    Decide(cmd::decide::Args),
    /// Run both example domains end to end: the ontology walk, a field-service dispatch run, and a
    /// supplier payment with an injected instruction. Needs nothing but this binary.
    Demo(cmd::demo::Args),
    /// Run YAML eval fixtures that script runs and assert decisions, budgets, upstream calls and
    /// audit records; exit 1 if any fails.
    Eval(cmd::eval::Args),
    /// Walk the typed ontology from an entity.
    Ontology(cmd::ontology::Args),
    /// Make and hash API keys for principals.yaml; make approval and redaction keys (`key secret`).
    Key(cmd::key::Args),
    /// Verify the audit chain (and that it still reaches signed checkpoints), export one
    /// principal's records as JSON Lines, or sign checkpoints of its head to keep elsewhere.
    Log(cmd::log::Args),
    /// Print a run with every step and, with --verbose, every check of every step.
    Trace(cmd::trace::Args),
    /// Serve MCP to agents (streamable HTTP and/or stdio), governing every call, and execute
    /// the steps of submitted plans, an approved one as soon as it is approved (`--no-worker`
    /// leaves them to `toolgate worker`). Reloads the registry folder when its files change, on SIGHUP and on `toolgate
    /// reload`.
    Serve(cmd::serve::Args),
    /// Ask the running `toolgate serve` to reload its registry folder (validated like `check`,
    /// swapped in unless a finding nobody accepted remains; a refused folder leaves the old version serving).
    Reload(cmd::reload::Args),
    /// What the running `toolgate serve` serves, and its last reload attempts and errors.
    Status(cmd::status::Args),
    /// Claim and execute the steps of submitted plans through every check (any number of
    /// workers, and gateways working the queue, may share a PostgreSQL store); stops cleanly on
    /// SIGINT or SIGTERM.
    Worker(cmd::worker::Args),
    /// Audit any MCP server's tool contract (a command after `--`, or a URL): table, JSON or SARIF.
    Audit(cmd::audit::Args),
    /// Compare upstream tool definitions with toolgate.lock: status, labelled diff, approve.
    Lock(cmd::lock::Args),
    /// Compare the registry's tools with a git revision; a behaviour change needs a version bump.
    Registry(cmd::registry::Args),
    /// Work the approval queue from the terminal: list, show, approve (bound to the input hash
    /// you were shown), reject (with a reason).
    Approvals(cmd::approvals::Args),
    /// The surface numbers: calls by decision, refusals by rule, each gate's rejection rate and
    /// break-even ratio, approval ages, duplicates, unknowns, budgets, latency.
    Report(cmd::report::Args),
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    // Not `stdout().lock()`: a lock held for the whole command would deadlock `serve --stdio`,
    // whose MCP transport writes to the same stdout from another thread.
    let mut out = std::io::stdout();
    let result = match cli.command {
        Command::Init(a) => cmd::init::run(&a, &mut out),
        Command::Check(a) => cmd::check::run(&a, &mut out),
        Command::Capabilities(a) => cmd::capabilities::run(&a, &mut out),
        Command::Grants(a) => cmd::grants::run(&a, &mut out),
        Command::Decide(a) => cmd::decide::run(&a, &mut out),
        Command::Demo(a) => cmd::demo::run(&a, &mut out),
        Command::Eval(a) => cmd::eval::run(&a, &mut out),
        Command::Ontology(a) => cmd::ontology::run(&a, &mut out),
        Command::Key(a) => cmd::key::run(&a, &mut out),
        Command::Log(a) => cmd::log::run(&a, &mut out),
        Command::Trace(a) => cmd::trace::run(&a, &mut out),
        Command::Serve(a) => cmd::serve::run(&a, &mut out),
        Command::Reload(a) => cmd::reload::run(&a, &mut out),
        Command::Status(a) => cmd::status::run(&a, &mut out),
        Command::Worker(a) => cmd::worker::run(&a, &mut out),
        Command::Audit(a) => cmd::audit::run(&a, &mut out),
        Command::Lock(a) => cmd::lock::run(&a, &mut out),
        Command::Registry(a) => cmd::registry::run(&a, &mut out),
        Command::Approvals(a) => cmd::approvals::run(&a, &mut out),
        Command::Report(a) => cmd::report::run(&a, &mut out),
    };
    match result {
        Ok(exit) => exit.into(),
        // The reader went away (`toolgate log export | head`): what it wanted, it has.
        Err(e) if cmd::broken_pipe(&e) => exit::Exit::Success.into(),
        Err(e) => {
            // Every cause, outermost first (`opening the store at …: database error: …`).
            eprintln!("toolgate: {e:#}");
            exit::Exit::Failure.into()
        }
    }
}
