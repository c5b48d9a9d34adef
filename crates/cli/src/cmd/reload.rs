//! `toolgate reload`: asks the running `toolgate serve` of a registry folder to load it again,
//! and prints what came of it.
//!
//! How it reaches the server: `toolgate serve` writes `<folder>/.toolgate/serve.json` (its pid,
//! the version it serves, its last reload attempts) and reloads on SIGHUP. This command reads
//! the pid, sends SIGHUP, and waits for the status file to report the attempt. The server
//! validates the folder completely (what `toolgate check` checks) and swaps it in only if it
//! passes; a folder that fails leaves the serving version in place. One server per folder: with
//! several processes serving one folder, send each SIGHUP (or rely on their file watches).

use crate::exit::Exit;
use std::io::Write;
use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use toolgate_gateway::{ReloadOutcome, ReloadReport, ServeStatus};

use crate::cmd::ConfigArg;

/// Ask the running `toolgate serve` to reload its registry folder (validated like `toolgate
/// check`; swapped in unless a finding nobody accepted remains).
///
/// Finds the server through `<folder>/.toolgate/serve.json`, which `toolgate serve` writes,
/// sends it SIGHUP and waits for the outcome. Exit 0: applied or unchanged; 1: refused (the old
/// version keeps serving; the problems are printed); 2: no server answered. `toolgate serve`
/// also reloads by itself when files in the folder change (unless --no-watch), and on SIGHUP
/// from anything else (`kill -HUP <pid>`).
#[derive(clap::Args, Debug)]
pub struct Args {
    #[command(flatten)]
    pub config: ConfigArg,
    /// How long to wait for the server to report the reload, in seconds.
    #[arg(long, default_value_t = 10)]
    pub timeout: u64,
    /// Print the reload report as JSON.
    #[arg(long)]
    pub json: bool,
}

pub fn run(args: &Args, out: &mut dyn Write) -> anyhow::Result<Exit> {
    let dir = &args.config.dir;
    let before = read_status(dir)?;
    let pid = before.pid;
    let last = before.last_reload.as_ref().map(|r| r.at);
    hangup(pid)?;
    let deadline = Instant::now() + Duration::from_secs(args.timeout);
    let report = loop {
        if let Ok(s) = ServeStatus::read(dir)
            && let Some(r) = s.last_reload
            && Some(r.at) != last
        {
            break r;
        }
        if Instant::now() >= deadline {
            bail!(
                "toolgate serve (pid {pid}) did not report a reload within {} s; see its log",
                args.timeout
            );
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    if args.json {
        writeln!(out, "{}", super::json_text(&report)?)?;
    } else {
        write_report(out, &report)?;
    }
    Ok(match report.outcome {
        ReloadOutcome::Applied | ReloadOutcome::Unchanged => Exit::Success,
        ReloadOutcome::Refused => Exit::Refused,
    })
}

/// The status file, or why there is no server to talk to.
pub fn read_status(dir: &Path) -> anyhow::Result<ServeStatus> {
    let path = ServeStatus::path(dir);
    let status = ServeStatus::read(dir).with_context(|| {
        format!(
            "no running `toolgate serve` found for {} (cannot read {})",
            dir.display(),
            path.display()
        )
    })?;
    if !alive(status.pid) {
        bail!(
            "{} names pid {}, which is not running (toolgate serve stopped without cleaning up?)",
            path.display(),
            status.pid
        );
    }
    Ok(status)
}

/// Whether a process with this pid exists (`kill -0`).
pub fn alive(pid: u32) -> bool {
    std::process::Command::new("kill")
        .args(["-0", &pid.to_string()])
        .stderr(std::process::Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

fn hangup(pid: u32) -> anyhow::Result<()> {
    let status = std::process::Command::new("kill")
        .args(["-HUP", &pid.to_string()])
        .status()
        .context("running `kill -HUP`")?;
    if !status.success() {
        bail!("could not send SIGHUP to toolgate serve (pid {pid})");
    }
    Ok(())
}

/// A reload report as people read it.
pub fn write_report(out: &mut dyn Write, r: &ReloadReport) -> std::io::Result<()> {
    let when = toolgate_console::fmt::datetime(toolgate_core::Timestamp::from_millis(r.at));
    let to =
        r.to.as_ref()
            .map(|v| format!("{} ({})", v.label, short(&v.hash)))
            .unwrap_or_else(|| "(did not load)".into());
    let from = format!("{} ({})", r.from.label, short(&r.from.hash));
    let trigger = serde_json::to_value(r.trigger)
        .ok()
        .and_then(|v| v.as_str().map(str::to_string))
        .unwrap_or_default();
    match r.outcome {
        ReloadOutcome::Applied => writeln!(
            out,
            "{when} ({trigger}): applied {to}, replacing {from} (checked and swapped in {} ms)",
            r.took_ms
        )?,
        ReloadOutcome::Unchanged => writeln!(
            out,
            "{when} ({trigger}): unchanged, {from} is what the folder holds"
        )?,
        ReloadOutcome::Refused => {
            writeln!(
                out,
                "{when} ({trigger}): refused {to}; {from} keeps serving. {} problem(s):",
                r.errors.len()
            )?;
            for e in &r.errors {
                writeln!(out, "  {e}")?;
            }
        }
    }
    for w in &r.warnings {
        writeln!(out, "  {}", w.replace('\n', "\n  "))?;
    }
    if let Some(seq) = r.audit_seq {
        writeln!(out, "  audit record #{seq}")?;
    }
    Ok(())
}

/// The first characters of a version hash.
pub fn short(hash: &str) -> &str {
    let hex = hash.strip_prefix("sha256:").unwrap_or(hash);
    &hex[..hex.len().min(12)]
}
