//! `toolgate status`: what the running `toolgate serve` of a registry folder serves, whether
//! the folder on disk is that version, and the last reload attempts (a refused one with its
//! problems), from `<folder>/.toolgate/serve.json`.

use crate::exit::Exit;
use std::io::Write;

use toolgate_core::{LoadError, Registry, Timestamp};

use crate::cmd::ConfigArg;
use crate::cmd::reload::{read_status, short, write_report};

/// Show what the running `toolgate serve` serves and how its last reloads went.
///
/// Reads `<folder>/.toolgate/serve.json` (written by `toolgate serve`). Exit 0: serving the
/// folder's version; 1: serving, but the folder on disk differs (a reload is pending or was
/// refused); 2: no server running for the folder.
#[derive(clap::Args, Debug)]
pub struct Args {
    #[command(flatten)]
    pub config: ConfigArg,
    /// Print the status file as JSON.
    #[arg(long)]
    pub json: bool,
}

pub fn run(args: &Args, out: &mut dyn Write) -> anyhow::Result<Exit> {
    let dir = &args.config.dir;
    let status = read_status(dir)?;
    if args.json {
        writeln!(out, "{}", super::json_text(&status)?)?;
    }
    let at = |ms: i64| toolgate_console::fmt::datetime(Timestamp::from_millis(ms));
    let on_disk = match Registry::load(dir) {
        Ok(r) => Ok(r.version),
        Err(LoadError::Invalid(f)) => Err(format!("does not load ({} problem(s))", f.len())),
        Err(LoadError::Unreadable { file, message }) => {
            Err(format!("unreadable: {file}: {message}"))
        }
    };
    let current = matches!(&on_disk, Ok(v) if v.hash == status.serving.hash);
    if !args.json {
        writeln!(
            out,
            "toolgate serve: pid {}, folder {}, up since {}",
            status.pid,
            status.config_dir,
            at(status.started_at)
        )?;
        if let Some(url) = &status.http {
            writeln!(out, "mcp:      {url}")?;
        }
        writeln!(
            out,
            "serving:  {} ({}) since {}",
            status.serving.label,
            short(&status.serving.hash),
            at(status.serving_since)
        )?;
        match &on_disk {
            Ok(_) if current => writeln!(out, "on disk:  the same version")?,
            Ok(v) => writeln!(
                out,
                "on disk:  {} ({}), not serving: reload pending, or refused (below)",
                v.label,
                short(&v.hash)
            )?,
            Err(e) => writeln!(out, "on disk:  {e}; run `toolgate check {}`", dir.display())?,
        }
        match &status.last_reload {
            Some(r) => {
                write!(out, "last reload: ")?;
                write_report(out, r)?;
            }
            None => writeln!(out, "last reload: none since start")?,
        }
        if let Some(r) = &status.last_refused
            && status.last_reload.as_ref() != Some(r)
        {
            write!(out, "last refused reload: ")?;
            write_report(out, r)?;
        }
        if let Ok(registry) = Registry::load(dir)
            && !registry.gateway.approvals.notify.is_empty()
        {
            write_notifications(out, &registry)?;
        }
    }
    Ok(Exit::refused_if(!current))
}

/// How the `approvals.notify` webhooks' deliveries stand, read from the store (every gateway
/// sharing it posts from the same outbox).
fn write_notifications(out: &mut dyn Write, registry: &Registry) -> anyhow::Result<()> {
    let rt = crate::cmd::store::runtime()?;
    let summary = match rt.block_on(async {
        let store = crate::cmd::store::open_existing(registry, None).await?;
        let s = store.notify_summary().await;
        store.close().await;
        anyhow::Ok(s?)
    }) {
        Ok(s) => s,
        Err(e) => {
            writeln!(out, "notifications: cannot read the store: {e:#}")?;
            return Ok(());
        }
    };
    for name in registry.gateway.approvals.notify.keys() {
        let s = summary
            .iter()
            .find(|s| &s.destination == name)
            .cloned()
            .unwrap_or_default();
        write!(
            out,
            "notifications {name}: {} sent, {} waiting, {} retrying, {} failed",
            s.sent, s.waiting, s.retrying, s.failed
        )?;
        if s.failing()
            && let (Some(e), Some(at)) = (&s.last_error, s.last_error_at)
        {
            write!(
                out,
                "; last failure {}: {}",
                toolgate_console::fmt::datetime(at),
                toolgate_core::clip::printable(e)
            )?;
        }
        writeln!(out)?;
    }
    Ok(())
}
