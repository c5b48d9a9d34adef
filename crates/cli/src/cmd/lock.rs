//! `toolgate lock status|diff|approve`: the upstream servers declared in a registry, compared
//! with `toolgate.lock` beside it; `approve` re-pins after a person reviewed the diff and records
//! who re-pinned what in the registry's audit chain (a `lock_approval` record).

use crate::exit::Exit;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context, bail};
use toolgate_contract::client::{Observed, Target, observe};
use toolgate_contract::{Approval, Lockfile, PinSet, ServerIdentity};
use toolgate_core::config::UpstreamConfig;
use toolgate_core::registry::Sources;

use super::ConfigArg;

#[derive(clap::Args, Debug)]
pub struct Args {
    #[command(subcommand)]
    pub action: Action,
}

#[derive(clap::Subcommand, Debug)]
pub enum Action {
    /// One line per upstream: served, blocked (by label), removed. Exit 1 when anything is blocked.
    Status(Common),
    /// Every labelled change of every blocked tool (or of one server or tool). Exit 1 on changes.
    Diff(Selected),
    /// Re-pin after review: a whole server (identity, instructions, every tool) or one tool.
    Approve(Approve),
}

#[derive(clap::Args, Debug)]
pub struct Common {
    #[command(flatten)]
    pub config: ConfigArg,
    /// The lockfile (default: toolgate.lock in the registry folder).
    #[arg(long, value_name = "FILE")]
    pub lock: Option<PathBuf>,
    /// Seconds to wait for each upstream's handshake and tools/list.
    #[arg(long, default_value_t = 60)]
    pub timeout: u64,
}

#[derive(clap::Args, Debug)]
pub struct Selected {
    #[command(flatten)]
    pub common: Common,
    /// Only this upstream server (as named in toolgate.yaml).
    pub server: Option<String>,
    /// Only this tool of that server.
    pub tool: Option<String>,
}

#[derive(clap::Args, Debug)]
pub struct Approve {
    #[command(flatten)]
    pub selected: Selected,
    /// Who approves (default: $USER); written into the lockfile with the time.
    #[arg(long)]
    pub by: Option<String>,
    /// The store whose audit chain records the approval (default: the registry's `store.url`).
    #[arg(
        long = "store",
        visible_alias = "store-url",
        value_name = "URL",
        env = "TOOLGATE_STORE_URL"
    )]
    pub store_url: Option<String>,
}

pub fn run(args: &Args, out: &mut dyn Write) -> anyhow::Result<Exit> {
    match &args.action {
        Action::Status(c) => status(c, out),
        Action::Diff(s) => diff(s, out),
        Action::Approve(a) => approve(a, out),
    }
}

fn lock_path(c: &Common) -> PathBuf {
    c.lock
        .clone()
        .unwrap_or_else(|| c.config.dir.join("toolgate.lock"))
}

/// The upstreams to look at: all declared, or the one named.
fn upstreams(c: &Common, only: Option<&str>) -> anyhow::Result<Vec<(String, UpstreamConfig)>> {
    let sources = Sources::read(&c.config.dir)
        .with_context(|| format!("reading the registry in {}", c.config.dir.display()))?;
    let all = sources.gateway.upstreams;
    match only {
        None => Ok(all.into_iter().collect()),
        Some(name) => match all.get(name) {
            Some(cfg) => Ok(vec![(name.to_string(), cfg.clone())]),
            None => bail!(
                "toolgate.yaml declares no upstream named '{name}' (declared: {})",
                all.keys().cloned().collect::<Vec<_>>().join(", ")
            ),
        },
    }
}

fn target_of(dir: &Path, cfg: &UpstreamConfig) -> anyhow::Result<Target> {
    if let Some(url) = &cfg.url {
        return Ok(Target::Url(url.clone()));
    }
    let Some(program) = &cfg.command else {
        bail!("an upstream has neither `command` nor `url`");
    };
    Ok(Target::Command {
        program: program.clone(),
        args: cfg.args.clone(),
        dir: Some(dir.to_path_buf()),
        env: Some(cfg.env.clone()),
    })
}

/// Connects to each upstream and reads what it lists now.
fn observe_all(
    c: &Common,
    only: Option<&str>,
) -> anyhow::Result<Vec<(String, ServerIdentity, Observed)>> {
    let rt = tokio::runtime::Runtime::new()?;
    let mut seen = Vec::new();
    for (name, cfg) in upstreams(c, only)? {
        let target = target_of(&c.config.dir, &cfg)?;
        let observed = rt
            .block_on(observe(&target, Duration::from_secs(c.timeout)))
            .with_context(|| format!("upstream '{name}'"))?;
        seen.push((name, ServerIdentity::from_upstream(&cfg), observed));
    }
    Ok(seen)
}

fn status(c: &Common, out: &mut dyn Write) -> anyhow::Result<Exit> {
    let lock = Lockfile::read(&lock_path(c))?;
    let pins = PinSet::new(&lock);
    let seen = observe_all(c, None)?;
    let mut clean = true;
    for (name, identity, o) in &seen {
        let v = pins.check(name, identity, &o.facts, &o.tools);
        clean &= v.is_clean();
        writeln!(out, "{}", v.status_line())?;
    }
    for name in lock.servers.keys() {
        if !seen.iter().any(|(n, _, _)| n == name) {
            writeln!(
                out,
                "{name}: pinned but no longer declared in toolgate.yaml (stale pin)"
            )?;
        }
    }
    if !clean {
        writeln!(
            out,
            "\nreview with `toolgate lock diff`, then `toolgate lock approve SERVER [TOOL]`"
        )?;
    }
    Ok(Exit::refused_if(!clean))
}

fn diff(s: &Selected, out: &mut dyn Write) -> anyhow::Result<Exit> {
    let lock = Lockfile::read(&lock_path(&s.common))?;
    let pins = PinSet::new(&lock);
    let mut clean = true;
    for (name, identity, o) in observe_all(&s.common, s.server.as_deref())? {
        let v = pins.check(&name, &identity, &o.facts, &o.tools);
        clean &= v.is_clean() && v.removed.is_empty();
        write!(out, "{}", v.render_diff(s.tool.as_deref()))?;
    }
    Ok(Exit::refused_if(!clean))
}

fn approve(a: &Approve, out: &mut dyn Write) -> anyhow::Result<Exit> {
    let s = &a.selected;
    let path = lock_path(&s.common);
    let mut lock = Lockfile::read(&path)?;
    let by =
        a.by.clone()
            .or_else(|| std::env::var("USER").ok())
            .context("say who approves with --by NAME (no $USER is set)")?;
    let approval = Approval::now(by);
    // The approval is recorded, or not made: the store is opened before anything is re-pinned.
    let registry = s.common.config.load()?;
    let rt = super::store::runtime()?;
    let store = rt.block_on(super::store::open(&registry, a.store_url.as_deref()))?;
    let mut lines = Vec::new();
    for (name, identity, o) in observe_all(&s.common, s.server.as_deref())? {
        lines.extend(lock.approve(
            &name,
            &identity,
            &o.facts,
            &o.tools,
            s.tool.as_deref(),
            &approval,
        )?);
    }
    lock.write(&path)?;
    let text = std::fs::read_to_string(&path)?;
    let record = approval_record(
        s.server.as_deref(),
        s.tool.as_deref(),
        &approval,
        &lines,
        &text,
        "toolgate lock approve",
    );
    let seq = rt.block_on(async {
        let seq = store.append_audit(vec![record]).await;
        store.close().await;
        seq
    });
    let seq = seq.context("recording the lock approval in the audit chain")?;
    for l in &lines {
        writeln!(out, "{l}")?;
    }
    writeln!(
        out,
        "{}: {} pin(s) written, approved by {} at {}",
        path.display(),
        lines.len(),
        approval.by,
        approval.at
    )?;
    writeln!(out, "recorded in the audit chain as record {}", seq[0])?;
    Ok(Exit::Success)
}

/// The audit record of one `lock approve`: who, what was selected, every pin line written, and
/// the hash of the lockfile it left. `toolgate init` records its first pins the same way.
pub(crate) fn approval_record(
    server: Option<&str>,
    tool: Option<&str>,
    approval: &Approval,
    lines: &[String],
    lock_text: &str,
    command: &str,
) -> toolgate_store::AuditDraft {
    use toolgate_core::canon::sha256_tagged;
    use toolgate_core::{Clock, SystemClock};
    let version = format!("lock:{}", sha256_tagged(lock_text.as_bytes()));
    let target = match (server, tool) {
        (Some(server), Some(tool)) => format!("upstream:{server}/{tool}"),
        (Some(server), None) => format!("upstream:{server}"),
        _ => "upstream:*".into(),
    };
    let pins = serde_json::json!({
        "server": server,
        "tool": tool,
        "pins": lines,
        "approved_at": approval.at,
        "lockfile": version,
    });
    let reason = format!(
        "{} re-pinned {} definition(s) with `{command}`",
        approval.by,
        lines.len()
    );
    toolgate_store::AuditDraft::lock_approval(
        SystemClock.now(),
        &approval.by,
        target,
        pins,
        reason,
        version,
    )
}
