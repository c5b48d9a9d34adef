//! `toolgate approvals list|show|approve|reject`: the approver's queue from the terminal, with
//! the page's rules. An approver authenticates with their own API key (`TOOLGATE_API_KEY`)
//! for every subcommand: `list` and `show` show only the requests that person may decide, with
//! data above their sensitivity ceiling masked; `show` decides the call again, dry, and looks
//! up its decision facts through the registry's upstreams (read tools only: the terminal never
//! runs a tool that changes anything); `approve` takes the input hash that `show` printed, so
//! what is approved is exactly what was read, and refuses a call that would be refused now.
//! An approved planned step goes back to the queue, and the serving gateway's workers run it
//! once.

use crate::exit::Exit;
use std::io::Write;
use std::sync::Arc;

use anyhow::{Context, bail};
use serde_json::Value;
use toolgate_console::fmt::text;
use toolgate_console::queue::{self, Filter};
use toolgate_console::{ConsoleError, actions, item};
use toolgate_core::{ApprovalId, ApprovalKeys, Clock, Effect, Registry, SystemClock};
use toolgate_gateway::Upstreams;
use toolgate_store::{
    BoxFuture, CallMeta, Executor, Handler, HandlerError, HandlerOutput, Served, Store, Target,
};

use crate::cmd::ConfigArg;
use crate::cmd::store::{open_existing, runtime};
use crate::table::Table;

#[derive(clap::Args, Debug)]
pub struct Args {
    #[command(subcommand)]
    pub command: Sub,
    #[command(flatten)]
    pub config: ConfigArg,
    /// The store URL, instead of the registry's `store.url`.
    #[arg(long, global = true, value_name = "URL", env = "TOOLGATE_STORE_URL")]
    pub store: Option<String>,
}

#[derive(clap::Subcommand, Debug)]
pub enum Sub {
    /// The parked calls waiting for a decision, riskiest first, like calls together.
    List {
        #[arg(long)]
        tool: Option<String>,
        #[arg(long)]
        principal: Option<String>,
        #[arg(long)]
        run: Option<String>,
        /// Your API key: the list holds only the requests you may decide.
        #[arg(long, env = "TOOLGATE_API_KEY", hide_env_values = true)]
        api_key: Option<String>,
    },
    /// One request: the inputs exactly as they will be sent, what changed since the last
    /// approved call of the same kind, the reason, rule and evidence. With --run: a run's
    /// parked steps, to approve as one.
    ///
    /// Needs TOOLGATE_API_KEY (yours): you are shown only requests you may decide, with data
    /// above your sensitivity ceiling masked. The call is decided again now (a dry run of every
    /// check): a call that would be refused says so and by which rule. Decision facts are
    /// looked up through the registry's read tools.
    ///
    /// `show --run RUN_ID` lists every open request of the run in the order raised, each with
    /// its input hash, decides them together as if you approved them all and they ran in order,
    /// and prints the exact `approve --run` command, or why the run cannot be approved as one.
    #[command(verbatim_doc_comment)]
    Show {
        #[arg(required_unless_present = "run", conflicts_with = "run")]
        id: Option<String>,
        /// A run id: show its parked steps as one decision.
        #[arg(long, value_name = "RUN_ID")]
        run: Option<String>,
        /// Your API key: only requests you may decide are shown, masked above your ceiling.
        #[arg(long, env = "TOOLGATE_API_KEY", hide_env_values = true)]
        api_key: Option<String>,
    },
    /// Approve a request as the holder of TOOLGATE_API_KEY, for the input hash `show` printed;
    /// or, with --run, a run's parked steps as one decision.
    ///
    /// One request:   toolgate approvals approve ID --input-hash HASH
    /// A run's steps: toolgate approvals approve --run RUN_ID --set ID:HASH,ID:HASH,...
    ///
    /// A run is approved all or nothing, under the rules of the web page: you may not approve
    /// steps you asked for (segregation of duties) or that are not yours to decide; the set
    /// must be exactly the run's open requests with the input hashes `show --run` printed (a
    /// step added, decided or revised since refuses it); and the steps are decided together
    /// first, as if approved and run in order, so none is approved when any would be refused.
    /// Then every grant is taken in one transaction and the steps go back to the queue, where
    /// the serving gateway's workers run each once.
    #[command(verbatim_doc_comment)]
    Approve {
        #[arg(required_unless_present = "run", conflicts_with = "run")]
        id: Option<String>,
        /// The input hash you were shown (`toolgate approvals show ID` prints it).
        #[arg(long, required_unless_present = "run", conflicts_with = "run")]
        input_hash: Option<String>,
        /// A run id: approve its parked steps together (with --set).
        #[arg(long, value_name = "RUN_ID", requires = "set")]
        run: Option<String>,
        /// The run's parked steps as `show --run` printed them: ID:HASH pairs, comma-separated.
        #[arg(long, value_name = "ID:HASH,...", requires = "run")]
        set: Option<String>,
        /// Your API key.
        #[arg(long, env = "TOOLGATE_API_KEY", hide_env_values = true)]
        api_key: String,
    },
    /// Reject a request as the holder of TOOLGATE_API_KEY; the reason is required.
    Reject {
        id: String,
        #[arg(long)]
        reason: String,
        #[arg(long, env = "TOOLGATE_API_KEY", hide_env_values = true)]
        api_key: String,
    },
}

/// The terminal never runs a tool that changes anything (approved steps are run by the
/// gateway's workers); it asks read tools, through the registry's upstreams, for the decision
/// facts and the dry decision's destination lookups.
struct ReadsOnly {
    registry: Arc<Registry>,
    upstreams: Option<Arc<Upstreams>>,
}

impl Handler for ReadsOnly {
    fn call<'a>(
        &'a self,
        target: &'a Target,
        inputs: &'a Value,
        meta: &'a CallMeta,
    ) -> BoxFuture<'a, Result<HandlerOutput, HandlerError>> {
        let read = self
            .registry
            .tool(&target.tool)
            .is_some_and(|t| t.config.effect == Effect::Read);
        match (&self.upstreams, read) {
            (Some(u), true) => Handler::call(u.as_ref(), target, inputs, meta),
            (None, true) => Box::pin(async {
                Err(HandlerError::Failed(
                    "no upstream is reachable from here (toolgate.lock could not be read)".into(),
                ))
            }),
            (_, false) => Box::pin(async {
                Err(HandlerError::Failed(
                    "the terminal does not run tools that change anything; the gateway does".into(),
                ))
            }),
        }
    }

    fn served(&self, target: &Target) -> Served {
        match &self.upstreams {
            Some(u) => u.served(target),
            None => Served::Local,
        }
    }
}

/// The approval key the gateway uses (tokens issued here must verify there), read as `serve`
/// reads it: `approvals.key_file` or the environment variable `approvals.key_env`.
fn approval_keys(registry: &Registry) -> anyhow::Result<ApprovalKeys> {
    toolgate_gateway::keys::load_approval_keys(registry, &|name| std::env::var(name).ok())
        .context("approving from the terminal signs a token the gateway verifies (or approve in the web page)")
}

#[cfg(test)]
fn executor(registry: Registry, store: Store, keys: ApprovalKeys) -> Executor {
    terminal(registry, store, keys).0
}

/// The terminal's executor: its handler asks read tools only (see [`ReadsOnly`]). The
/// upstreams are returned to be closed when the command is done.
fn terminal(
    registry: Registry,
    store: Store,
    keys: ApprovalKeys,
) -> (Executor, Option<Arc<Upstreams>>) {
    let registry = Arc::new(registry);
    let upstreams = toolgate_gateway::pins::Pins::load(&registry.dir)
        .ok()
        .map(|pins| {
            Arc::new(Upstreams::new(
                &registry.dir,
                &registry.gateway.upstreams,
                None,
                Arc::new(pins),
            ))
        });
    let handler = ReadsOnly {
        registry: registry.clone(),
        upstreams: upstreams.clone(),
    };
    (
        Executor::new(
            store,
            registry,
            Arc::new(keys),
            Arc::new(handler),
            Arc::new(SystemClock),
        ),
        upstreams,
    )
}

/// The person whose key was given, or what to do when none was.
fn viewer(registry: &Registry, key: Option<&str>, what: &str) -> anyhow::Result<String> {
    match key {
        Some(k) => approver(registry, k),
        None => bail!(
            "{what} shows only the requests you may decide, masked above your sensitivity \
             ceiling: set TOOLGATE_API_KEY to your own API key (or pass --api-key KEY); only \
             people whose role may approve have one that works here"
        ),
    }
}

fn approver(registry: &Registry, key: &str) -> anyhow::Result<String> {
    match registry.principal_by_key(key.trim()) {
        Some(p) if actions::is_approver(registry, p.id()) => Ok(p.id().to_string()),
        _ => bail!("TOOLGATE_API_KEY does not belong to a person whose role may approve"),
    }
}

/// A refusal is printed and exits 1; a failure is an error (exit 2).
fn refused(out: &mut dyn Write, e: ConsoleError) -> anyhow::Result<Exit> {
    if e.is_refusal() {
        writeln!(out, "refused: {e}")?;
        Ok(Exit::Refused)
    } else {
        Err(e.into())
    }
}

pub fn run(args: &Args, out: &mut dyn Write) -> anyhow::Result<Exit> {
    runtime()?
        .block_on(async {
            let registry = args.config.load()?;
            let store = open_existing(&registry, args.store.as_deref()).await?;
            let (exit, upstreams) = command(args, registry, store, out).await;
            if let Some(u) = upstreams {
                u.close().await;
            }
            exit
        })
        .context("approvals")
}

/// Runs one subcommand; returns the upstreams it opened, to close.
async fn command(
    args: &Args,
    registry: Registry,
    store: Store,
    out: &mut dyn Write,
) -> (anyhow::Result<Exit>, Option<Arc<Upstreams>>) {
    // A throwaway key signs nothing kept: showing and rejecting issue no token.
    let reads = || ApprovalKeys::new("show", vec![0u8; 32]);
    match &args.command {
        Sub::List {
            tool,
            principal,
            run,
            api_key,
        } => {
            let filter = Filter {
                tool: tool.clone(),
                principal: principal.clone(),
                run: run.clone(),
            };
            (
                list(&registry, &store, &filter, api_key.as_deref(), out).await,
                None,
            )
        }
        Sub::Show {
            run: Some(run),
            api_key,
            ..
        } => {
            let who = match viewer(&registry, api_key.as_deref(), "show --run") {
                Ok(w) => w,
                Err(e) => return (Err(e), None),
            };
            let (exec, upstreams) = terminal(registry, store, reads());
            let exit = match toolgate_console::bulk::run_offer(&exec, &who, run).await {
                Ok(Some(offer)) => write_run(out, &exec, &offer).await,
                Ok(None) => writeln!(
                    out,
                    "run {} has fewer than two parked steps open that you may decide: decide \
                     them one by one (`toolgate approvals list --run {}`)",
                    text(run),
                    shell_word(run)
                )
                .map(|_| Exit::Refused)
                .map_err(Into::into),
                Err(e) => refused(out, e),
            };
            (exit, upstreams)
        }
        Sub::Show { id, api_key, .. } => {
            let who = match viewer(&registry, api_key.as_deref(), "show") {
                Ok(w) => w,
                Err(e) => return (Err(e), None),
            };
            let id = id.as_deref().unwrap_or_default();
            let (exec, upstreams) = terminal(registry, store, reads());
            let exit = match item::load_for(&exec, &ApprovalId::from(id), &who).await {
                Ok(v) => write_item(out, &v).map(|_| Exit::Success),
                Err(e) => refused(out, e),
            };
            (exit, upstreams)
        }
        Sub::Approve {
            run: Some(run),
            set,
            api_key,
            ..
        } => {
            let (who, keys) = match approver(&registry, api_key)
                .and_then(|w| Ok((w, approval_keys(&registry)?)))
            {
                Ok(x) => x,
                Err(e) => return (Err(e), None),
            };
            let (exec, upstreams) = terminal(registry, store, keys);
            let set = set.as_deref().unwrap_or_default();
            let exit = match toolgate_console::bulk::approve_run(&exec, &who, run, set, false).await
            {
                Ok(done) => (|| {
                    writeln!(
                        out,
                        "approved by {who}: the {} parked steps of run {}, as one decision",
                        done.len(),
                        text(run)
                    )?;
                    for (id, a) in &done {
                        writeln!(out, "  {id}: {}", approved_text(a))?;
                    }
                    Ok(Exit::Success)
                })(),
                Err(e) => refused(out, e),
            };
            (exit, upstreams)
        }
        Sub::Approve {
            id,
            input_hash,
            api_key,
            ..
        } => {
            let (id, input_hash) = (
                id.as_deref().unwrap_or_default(),
                input_hash.as_deref().unwrap_or_default(),
            );
            let (who, keys) = match approver(&registry, api_key)
                .and_then(|w| Ok((w, approval_keys(&registry)?)))
            {
                Ok(x) => x,
                Err(e) => return (Err(e), None),
            };
            let (exec, upstreams) = terminal(registry, store, keys);
            // Decided again, dry, first: a call that would be refused is not approved.
            let exit = match actions::approve(&exec, &ApprovalId::from(id), &who, input_hash, false)
                .await
            {
                Ok(a) => writeln!(out, "approved by {who}: {}", approved_text(&a))
                    .map(|_| Exit::Success)
                    .map_err(Into::into),
                Err(e) => refused(out, e),
            };
            (exit, upstreams)
        }
        Sub::Reject {
            id,
            reason,
            api_key,
        } => {
            let who = match approver(&registry, api_key) {
                Ok(w) => w,
                Err(e) => return (Err(e), None),
            };
            let (exec, upstreams) = terminal(registry, store, reads());
            let exit = match actions::reject(&exec, &ApprovalId::from(id), &who, reason).await {
                Ok(()) => writeln!(out, "rejected by {who}: {}", text(reason.trim()))
                    .map(|_| Exit::Success)
                    .map_err(Into::into),
                Err(e) => refused(out, e),
            };
            (exit, upstreams)
        }
    }
}

/// `approvals list`: the queue the key's holder works, riskiest first, like calls together.
async fn list(
    registry: &Registry,
    store: &Store,
    filter: &Filter,
    key: Option<&str>,
    out: &mut dyn Write,
) -> anyhow::Result<Exit> {
    use toolgate_console::fmt::{duration_ms, money, short};
    let who = viewer(registry, key, "list")?;
    let now = SystemClock.now();
    let reqs = store.approvals(None).await?;
    let groups = queue::build_for(reqs, registry, now, filter, &who);
    if groups.is_empty() {
        writeln!(out, "nothing is waiting for a decision by {who}")?;
        return Ok(Exit::Success);
    }
    for g in &groups {
        writeln!(
            out,
            "{} · gated by {} ({})",
            text(&g.tool),
            text(&g.rule),
            g.items.len()
        )?;
        let mut t = Table::new(&[
            "ID",
            "TIER",
            "PRINCIPAL",
            "RUN",
            "AMOUNT",
            "WAITING",
            "LEFT",
            "APPROVALS",
            "DIFFERS",
        ]);
        for it in &g.items {
            let r = &it.request;
            let currency = r.inputs.get("currency").and_then(Value::as_str);
            let differs: Vec<String> = g
                .varying
                .iter()
                .filter_map(|f| {
                    r.inputs.get(f.as_str()).map(|v| {
                        format!(
                            "{}={}",
                            text(f),
                            toolgate_console::fmt::cell(f, v, currency)
                        )
                    })
                })
                .collect();
            t.row(vec![
                r.approval_id.to_string(),
                if it.new_destinations.is_empty() {
                    it.tier.to_string()
                } else {
                    format!("{} NEW {}", it.tier, text(&it.new_destinations.join(",")))
                },
                text(&r.principal),
                r.run_id.as_deref().map(short).unwrap_or_default(),
                it.amount
                    .map(|a| money(a, currency.unwrap_or_default()))
                    .unwrap_or_default(),
                duration_ms(it.age_ms),
                if it.expired() {
                    "expired".into()
                } else {
                    duration_ms(it.time_left_ms)
                },
                format!("{}/{}", r.approved_by.len(), r.approvers_needed),
                differs.join(" "),
            ]);
        }
        t.write(out)?;
        writeln!(out)?;
    }
    Ok(Exit::Success)
}

/// What one approval of a run led to, on one line.
fn approved_text(a: &actions::Approved) -> String {
    match a {
        actions::Approved::Waiting {
            approved_by,
            needed,
        } => format!(
            "{} of {needed} approvals; a different person must approve too",
            approved_by.len()
        ),
        actions::Approved::Queued { step_id } => format!(
            "step {step_id} is queued; a running `toolgate serve` on this store executes it once"
        ),
        actions::Approved::Ran(r) => format!("the step ran: {}", r.status),
        actions::Approved::DirectCall => {
            "the agent's retry of exactly this call now passes the gate once".into()
        }
    }
}

/// A run's parked steps as one decision: each with its tool, key inputs and hash, then the
/// command that approves exactly this set, or why it cannot be approved as one.
async fn write_run(
    out: &mut dyn Write,
    exec: &Executor,
    offer: &toolgate_console::bulk::RunOffer,
) -> anyhow::Result<Exit> {
    use toolgate_console::fmt::plain;
    writeln!(
        out,
        "run {}: {} parked steps, as one decision",
        text(&offer.run_id),
        offer.members.len()
    )?;
    let mut t = Table::new(&["#", "ID", "TOOL", "INPUTS", "INPUT HASH"]);
    for (n, (id, hash, tool)) in offer.members.iter().enumerate() {
        let inputs = match exec.store.approval(id).await {
            Ok(r) => r
                .inputs
                .as_object()
                .map(|m| {
                    m.iter()
                        .filter(|(k, _)| !matches!(k.as_str(), "reason" | "note" | "text" | "body"))
                        .map(|(k, v)| format!("{k}={}", plain(v)))
                        .collect::<Vec<_>>()
                        .join(" ")
                })
                .unwrap_or_default(),
            Err(e) => return Err(e.into()),
        };
        t.row(vec![
            (n + 1).to_string(),
            id.to_string(),
            tool.clone(),
            inputs,
            hash.clone(),
        ]);
    }
    t.write(out)?;
    match &offer.refusal {
        Some(why) => {
            writeln!(
                out,
                "\ncannot be approved together: {}. Decide the steps one by one (`toolgate approvals show ID`).",
                text(why)
            )?;
            Ok(Exit::Refused)
        }
        None => {
            writeln!(
                out,
                "\nto approve exactly these {} steps: toolgate approvals approve --run {} --set {}",
                offer.members.len(),
                shell_word(&offer.run_id),
                offer.set()
            )?;
            Ok(Exit::Success)
        }
    }
}

/// `s` as one shell word people may copy: bare when it is plain, single-quoted otherwise.
fn shell_word(s: &str) -> String {
    if !s.is_empty()
        && s.chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.' | ':' | '/'))
    {
        s.to_string()
    } else {
        format!("'{}'", text(s).replace('\'', "'\\''"))
    }
}

fn write_item(out: &mut dyn Write, v: &item::ItemView) -> anyhow::Result<()> {
    use toolgate_console::fmt::{cell, datetime, duration_ms, lines, value};
    let r = &v.request;
    let currency = r.inputs.get("currency").and_then(Value::as_str);
    let status = if v.expired() {
        "expired"
    } else {
        r.status.as_str()
    };
    writeln!(
        out,
        "approval {}  {}  [{status}]",
        r.approval_id,
        text(&r.tool)
    )?;
    if let Some(t) = &v.tool {
        writeln!(
            out,
            "  effect {} · tier {} · sensitivity {} · version {}",
            t.effect,
            t.tier,
            t.sensitivity,
            text(&t.version)
        )?;
    }
    writeln!(
        out,
        "  raised {} · expires {}{}",
        datetime(r.created_at),
        datetime(r.expires_at),
        if v.expired() {
            String::new()
        } else {
            format!(" ({} left)", duration_ms(v.time_left_ms()))
        }
    )?;
    writeln!(
        out,
        "  principal {} · run {}",
        text(&r.principal),
        text(r.run_id.as_deref().unwrap_or("-"))
    )?;
    writeln!(out, "  gated by rule: {}", text(&r.rule))?;
    writeln!(
        out,
        "  reason: {}",
        text(r.reason.as_deref().unwrap_or("(none given)"))
    )?;
    writeln!(
        out,
        "  evidence: {}",
        if r.evidence.is_empty() {
            "(none cited)".into()
        } else {
            text(&r.evidence.join(", "))
        }
    )?;
    writeln!(
        out,
        "  approvals: {} of {}{}",
        r.approved_by.len(),
        r.approvers_needed,
        r.approved_by
            .first()
            .map(|a| format!(" (approved first by {})", text(a)))
            .unwrap_or_default()
    )?;
    if let Some((rule, reason)) = &v.would_refuse {
        writeln!(
            out,
            "  !! WILL BE REFUSED by {rule} if approved: {reason}. Decided again just now under \
             the current registry and this run's state; approving cannot make it run: reject it \
             with a note"
        )?;
    }
    for f in v.new_destinations() {
        writeln!(
            out,
            "  !! NEW DESTINATION: {} = {} {}{}",
            text(&f.path),
            value(&f.value),
            if v.comparison.count == 0 {
                "is a first: no earlier call of this kind was approved".to_string()
            } else {
                format!(
                    "was not used by any of the {} approved earlier calls of this kind",
                    v.comparison.count
                )
            },
            f.previous
                .as_ref()
                .map(|p| format!(" (last approved: {})", value(p)))
                .unwrap_or_default()
        )?;
    }
    for d in &v.duplicates {
        writeln!(
            out,
            "  !! POSSIBLE DUPLICATE: the same operation is also {} as {} ({}, run {}, raised {})",
            d.status.as_str(),
            d.approval_id,
            text(&d.principal),
            toolgate_console::fmt::short(d.run_id.as_deref().unwrap_or("-")),
            datetime(d.created_at)
        )?;
    }
    if !v.facts.is_empty() {
        writeln!(out, "\ndecision facts:")?;
    }
    for f in &v.facts {
        if let Some(e) = &f.error {
            writeln!(out, "  !! NO FACTS from {}: {}", text(&f.tool), text(e))?;
        }
        for x in &f.facts {
            writeln!(
                out,
                "  {:<16} {}{}{}",
                text(&x.label),
                cell(&x.label, &x.value, currency),
                if x.masked { "  [masked]" } else { "" },
                x.since
                    .as_ref()
                    .map(|s| format!("  {}{}", if s.recent() { "!! " } else { "" }, s.text()))
                    .unwrap_or_default()
            )?;
        }
        for m in &f.mismatches {
            writeln!(
                out,
                "  !! MISMATCH: {} = {} but {} = {}",
                text(&m.input),
                cell(&m.input, &m.sent, currency),
                text(&m.label),
                cell(&m.label, &m.found, currency)
            )?;
        }
    }
    writeln!(out, "\ninputs, exactly as they will be sent:")?;
    let mut t = Table::new(&["FIELD", "VALUE", "LAST APPROVED", "NOTES"]);
    let mut texts = Vec::new();
    for f in &v.fields {
        let mut notes = Vec::new();
        if let Some(x) = f
            .value
            .as_f64()
            .filter(|_| toolgate_console::fmt::is_amount(&f.path))
        {
            notes.push(format!(
                "= {}",
                toolgate_console::fmt::money(x, currency.unwrap_or_default())
            ));
        }
        if f.new_destination {
            notes.push("NEW destination".into());
        } else if f.changed {
            notes.push("changed".into());
        }
        if f.redacted {
            notes.push("redacted in the audit log".into());
        }
        if f.masked {
            notes.push("masked: above your sensitivity ceiling".into());
        }
        if let Some(s) = f.value.as_str().filter(|s| s.contains('\n')) {
            texts.push((f.path.clone(), s.to_string()));
            notes.push("several lines: read below".into());
        }
        t.row(vec![
            text(&f.path),
            value(&f.value),
            f.previous.as_ref().map(value).unwrap_or_default(),
            notes.join(", "),
        ]);
    }
    t.write(out)?;
    for (path, s) in &texts {
        writeln!(out, "\n{} as it reads:", text(path))?;
        for l in lines(s) {
            writeln!(out, "  | {l}")?;
        }
    }
    writeln!(out, "\ncanonical: {}", text(&v.canonical))?;
    writeln!(out, "input hash: {}", r.input_hash)?;
    if !v.earlier.is_empty() {
        writeln!(out, "\nthe run so far:")?;
        for s in &v.earlier {
            writeln!(out, "  {} {} {}", s.seq, text(&s.tool), s.status)?;
        }
    }
    if v.approvable() {
        writeln!(
            out,
            "\nto approve exactly this: toolgate approvals approve {} --input-hash {}",
            r.approval_id, r.input_hash
        )?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cmd::ConfigArg;
    use serde_json::json;
    use std::path::PathBuf;
    use toolgate_core::StepStatus;
    use toolgate_store::{PlannedStep, StoreConfig};

    const ALICE_KEY: &str = "alice-console-key-0001";
    const BOB_KEY: &str = "bob-console-key-0002";

    fn registry_dir() -> PathBuf {
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../console/tests/fixtures/registry")
    }

    /// A store holding one parked payment; returns (url, approval id, step id).
    fn parked(dir: &std::path::Path) -> (String, String, String) {
        let url = format!("sqlite://{}", dir.join("t.db").display());
        let rt = runtime().unwrap();
        let ids = rt.block_on(async {
            let registry = Registry::load(registry_dir()).unwrap();
            let store = Store::connect(&url, StoreConfig::default()).await.unwrap();
            let step = PlannedStep {
                tool: "payment.schedule".into(),
                inputs: json!({"supplier_id": "SUP-0001", "invoice_id": "INV-20260612",
                    "amount": 12600.5, "currency": "EUR", "iban": "ES9121000418450200051332",
                    "reason": "Three-way match against PO-77840"}),
                principal: "fin-worker".into(),
                purpose: Some("billing".into()),
                reason: Some("matched".into()),
                evidence: vec!["PO-77840".into()],
                actor: Default::default(),
            };
            let run = store
                .create_run(
                    &registry,
                    &"fin-worker".into(),
                    Some("billing"),
                    &[step],
                    SystemClock.now(),
                )
                .await
                .unwrap();
            let step_id = store.steps(&run).await.unwrap()[0].step_id.clone();
            let exec = executor(
                registry,
                store.clone(),
                ApprovalKeys::new("k1", vec![1; 32]),
            );
            let rep = exec.execute_step(&step_id).await.unwrap();
            assert_eq!(rep.status, StepStatus::NeedsApproval);
            let id = rep.outcome.unwrap().approval_id.unwrap();
            store.close().await;
            (id.to_string(), step_id.to_string())
        });
        (url, ids.0, ids.1)
    }

    fn args(url: &str, command: Sub) -> Args {
        Args {
            command,
            config: ConfigArg {
                dir: registry_dir(),
            },
            store: Some(url.to_string()),
        }
    }

    fn step_status(url: &str, step: &str) -> StepStatus {
        runtime().unwrap().block_on(async {
            let store = Store::connect(url, StoreConfig::default()).await.unwrap();
            let s = store.step(&step.into()).await.unwrap().status;
            store.close().await;
            s
        })
    }

    #[test]
    fn list_show_and_a_bound_approval_from_the_terminal() {
        let dir = tempfile::tempdir().unwrap();
        let (url, id, step) = parked(dir.path());

        let mut out = Vec::new();
        let list = Sub::List {
            tool: None,
            principal: None,
            run: None,
            api_key: Some(ALICE_KEY.into()),
        };
        assert_eq!(run(&args(&url, list), &mut out).unwrap(), Exit::Success);
        let text = String::from_utf8(out).unwrap();
        assert!(
            text.contains(&id) && text.contains("12,600.50 EUR"),
            "{text}"
        );

        let mut out = Vec::new();
        assert_eq!(
            run(
                &args(
                    &url,
                    Sub::Show {
                        id: Some(id.clone()),
                        run: None,
                        api_key: Some(ALICE_KEY.into())
                    }
                ),
                &mut out
            )
            .unwrap(),
            Exit::Success
        );
        let text = String::from_utf8(out).unwrap();
        assert!(text.contains("\"ES9121000418450200051332\""), "{text}");
        assert!(text.contains("redacted in the audit log"), "{text}");
        let hash = text
            .lines()
            .find_map(|l| l.strip_prefix("input hash: "))
            .unwrap()
            .to_string();

        // SAFETY: only this test reads or writes this variable.
        unsafe { std::env::set_var("TOOLGATE_APPROVAL_KEY", "k".repeat(32)) };
        let wrong = Sub::Approve {
            id: Some(id.clone()),
            input_hash: Some("sha256:0000".into()),
            run: None,
            set: None,
            api_key: ALICE_KEY.into(),
        };
        let mut out = Vec::new();
        assert_eq!(run(&args(&url, wrong), &mut out).unwrap(), Exit::Refused);
        assert!(
            String::from_utf8(out)
                .unwrap()
                .contains("refused: the inputs changed")
        );
        assert_eq!(step_status(&url, &step), StepStatus::NeedsApproval);

        let right = Sub::Approve {
            id: Some(id.clone()),
            input_hash: Some(hash.clone()),
            run: None,
            set: None,
            api_key: ALICE_KEY.into(),
        };
        let mut out = Vec::new();
        assert_eq!(run(&args(&url, right), &mut out).unwrap(), Exit::Success);
        assert!(String::from_utf8(out).unwrap().contains("is queued"));
        // Back in the queue for the gateway's workers; nothing ran here.
        assert_eq!(step_status(&url, &step), StepStatus::Pending);

        let again = Sub::Approve {
            id: Some(id),
            input_hash: Some(hash),
            run: None,
            set: None,
            api_key: BOB_KEY.into(),
        };
        let mut out = Vec::new();
        assert_eq!(run(&args(&url, again), &mut out).unwrap(), Exit::Refused);
    }

    #[test]
    fn a_terminal_rejection_needs_an_approver_and_a_reason() {
        let dir = tempfile::tempdir().unwrap();
        let (url, id, step) = parked(dir.path());
        let not_approver = Sub::Reject {
            id: id.clone(),
            reason: "no".into(),
            api_key: "carol-console-key-0003".into(),
        };
        assert!(run(&args(&url, not_approver), &mut Vec::new()).is_err());
        let empty = Sub::Reject {
            id: id.clone(),
            reason: " ".into(),
            api_key: BOB_KEY.into(),
        };
        assert_eq!(
            run(&args(&url, empty), &mut Vec::new()).unwrap(),
            Exit::Refused
        );
        assert_eq!(step_status(&url, &step), StepStatus::NeedsApproval);
        let ok = Sub::Reject {
            id,
            reason: "IBAN not in the vendor master".into(),
            api_key: BOB_KEY.into(),
        };
        assert_eq!(
            run(&args(&url, ok), &mut Vec::new()).unwrap(),
            Exit::Success
        );
        assert_eq!(step_status(&url, &step), StepStatus::Refused);
    }

    /// Characters that would act on a terminal or reorder text if printed raw.
    fn acts(c: char) -> bool {
        (c.is_control() && c != '\n')
            || matches!(c, '\u{061C}' | '\u{200B}'..='\u{200F}' | '\u{2028}'..='\u{202E}' | '\u{2060}'..='\u{2069}' | '\u{FEFF}')
    }

    const NASTY: &str = "Zahlung\u{1b}[2J\u{1b}]0;pwned\u{7} \u{202e}NABI\u{202c} \u{2066}iso\u{2069} Zürich 東京 🚀\r\nAPPROVED BY CFO";

    /// An agent's hostile text — in its reason (with 100 KB more), a run id with a direction
    /// override and multi-byte characters, its evidence — written to the store as the executor
    /// takes it (the gateway bounds `_meta` before this; the printers must not rely on it), then
    /// through every terminal printer of approvals and runs: `approvals list`, `list --run`,
    /// `show`, `show --run`, `trace`, and `report` (an unknown tool's name is the agent's). None prints it raw; the multi-byte text is whole;
    /// the 100 KB value does not widen the tables.
    #[test]
    fn hostile_agent_text_through_every_terminal_printer() {
        let dir = tempfile::tempdir().unwrap();
        let url = format!("sqlite://{}", dir.path().join("t.db").display());
        let run_id = format!("run-{}-Zürich-東京🚀-\u{202e}x-\u{1b}[31mü", "é".repeat(20));
        let ids: Vec<String> = runtime().unwrap().block_on(async {
            let registry = Registry::load(registry_dir()).unwrap();
            let store = Store::connect(&url, StoreConfig::default()).await.unwrap();
            let exec = executor(registry, store.clone(), ApprovalKeys::new("k1", vec![1; 32]));
            let mut ids = Vec::new();
            for (invoice, amount) in [("INV-20260701", 600.0), ("INV-20260702", 300.0)] {
                let c = exec
                    .governed_call(toolgate_store::DirectCall {
                        principal: "fin-worker".into(),
                        tool: "payment.transfer".into(),
                        inputs: json!({"supplier_id": "SUP-0001", "invoice_id": invoice, "amount": amount}),
                        run_id: run_id.clone().into(),
                        purpose: Some("billing".into()),
                        reason: Some(format!("{NASTY} {}", "x".repeat(100_000))),
                        purpose_from: None,
                        argument_errors: Vec::new(),
                        evidence: vec![NASTY.into()],
                        approvals: vec![],
                        actor: Default::default(),
                    })
                    .await
                    .unwrap();
                assert_eq!(c.status, toolgate_store::CallStatus::NeedsApproval, "{c:?}");
                ids.push(c.approval_id.unwrap().to_string());
            }
            // A tool name the agent chose: refused as unknown, kept in the audit chain.
            let unknown = exec
                .governed_call(toolgate_store::DirectCall {
                    principal: "fin-worker".into(),
                    tool: format!("x{NASTY}"),
                    inputs: json!({}),
                    run_id: run_id.clone().into(),
                    purpose: Some("billing".into()),
                    reason: None,
                    purpose_from: None,
                    argument_errors: Vec::new(),
                    evidence: vec![],
                    approvals: vec![],
                    actor: Default::default(),
                })
                .await
                .unwrap();
            assert_eq!(unknown.status, toolgate_store::CallStatus::Refused);
            store.close().await;
            ids
        });

        let print = |command: Sub| {
            let mut out = Vec::new();
            run(&args(&url, command), &mut out).unwrap();
            String::from_utf8(out).unwrap()
        };
        let mut trace = Vec::new();
        crate::cmd::trace::run(
            &crate::cmd::trace::Args {
                run: run_id.clone(),
                verbose: true,
                config: ConfigArg {
                    dir: registry_dir(),
                },
                store: Some(url.clone()),
            },
            &mut trace,
        )
        .unwrap();
        let outputs = [
            (
                "approvals list",
                print(Sub::List {
                    tool: None,
                    principal: None,
                    run: None,
                    api_key: Some(ALICE_KEY.into()),
                }),
            ),
            (
                "approvals list --run",
                print(Sub::List {
                    tool: None,
                    principal: None,
                    run: Some(run_id.clone()),
                    api_key: Some(ALICE_KEY.into()),
                }),
            ),
            (
                "approvals show",
                print(Sub::Show {
                    id: Some(ids[0].clone()),
                    run: None,
                    api_key: Some(ALICE_KEY.into()),
                }),
            ),
            (
                "approvals show --run",
                print(Sub::Show {
                    id: None,
                    run: Some(run_id.clone()),
                    api_key: Some(ALICE_KEY.into()),
                }),
            ),
            ("trace", String::from_utf8(trace).unwrap()),
        ];
        let mut report = Vec::new();
        crate::cmd::report::run(
            &crate::cmd::report::Args {
                since: None,
                prometheus: false,
                config: ConfigArg {
                    dir: registry_dir(),
                },
                store: Some(url.clone()),
            },
            &mut report,
        )
        .unwrap();
        let report = String::from_utf8(report).unwrap();
        let raw: Vec<char> = report.chars().filter(|c| acts(*c)).collect();
        assert!(raw.is_empty(), "report printed {raw:?}");
        assert!(report.contains("Zürich 東京 🚀"), "{report}");
        for (what, out) in &outputs {
            let raw: Vec<String> = out
                .chars()
                .filter(|c| acts(*c))
                .map(|c| format!("U+{:04X}", c as u32))
                .collect();
            assert!(raw.is_empty(), "{what} printed {raw:?}");
            assert!(
                !out.contains("\nAPPROVED BY CFO"),
                "{what} let a newline forge a line"
            );
            assert!(
                out.contains("京🚀"),
                "{what}: the run id's multi-byte text is whole"
            );
            for line in out.lines().filter(|l| !l.contains("xxxxxxxxxx")) {
                assert!(
                    line.chars().count() < 1_000,
                    "{what}: a table was widened: {line:.200}"
                );
            }
        }
        let show = &outputs[2].1;
        assert!(show.contains("Zürich 東京 🚀"), "{show:.2000}");
        assert!(
            show.contains("\\u{202e}NABI"),
            "the override is shown, written out"
        );
        assert!(
            show.contains(&"x".repeat(100_000)),
            "the reason is printed whole"
        );
        let run_view = &outputs[3].1;
        assert!(
            run_view.contains("toolgate approvals approve --run 'run-"),
            "{run_view}"
        );
    }

    /// A copy of the console's fixture registry, to change after something was parked.
    fn registry_copy(dir: &std::path::Path) -> PathBuf {
        let to = dir.join("registry");
        let from = registry_dir();
        std::fs::create_dir_all(to.join("tools")).unwrap();
        for f in ["toolgate.yaml", "principals.yaml", "tools/payments.yaml"] {
            std::fs::copy(from.join(f), to.join(f)).unwrap();
        }
        to
    }

    fn args_in(url: &str, dir: &std::path::Path, command: Sub) -> Args {
        Args {
            command,
            config: ConfigArg {
                dir: dir.to_path_buf(),
            },
            store: Some(url.to_string()),
        }
    }

    #[test]
    fn list_and_show_need_a_key_and_show_only_what_it_may_decide() {
        let dir = tempfile::tempdir().unwrap();
        let (url, id, _) = parked(dir.path());
        let list = |key: Option<&str>| Sub::List {
            tool: None,
            principal: None,
            run: None,
            api_key: key.map(str::to_string),
        };
        let show = |key: Option<&str>| Sub::Show {
            id: Some(id.clone()),
            run: None,
            api_key: key.map(str::to_string),
        };
        for command in [list(None), show(None)] {
            let e = run(&args(&url, command), &mut Vec::new()).unwrap_err();
            let e = format!("{e:#}");
            assert!(
                e.contains("set TOOLGATE_API_KEY to your own API key"),
                "{e}"
            );
        }
        // carol may not approve: her key shows nothing.
        for command in [
            list(Some("carol-console-key-0003")),
            show(Some("carol-console-key-0003")),
        ] {
            assert!(run(&args(&url, command), &mut Vec::new()).is_err());
        }
        // dave is an AP clerk whose grants reach internal data: the IBAN is masked for him.
        let mut out = Vec::new();
        assert_eq!(
            run(&args(&url, show(Some("dave-console-key-0005"))), &mut out).unwrap(),
            Exit::Success
        );
        let text = String::from_utf8(out).unwrap();
        assert!(!text.contains("ES9121000418450200051332"), "{text}");
        assert!(text.contains("••••1332"), "{text}");
        assert!(
            text.contains("masked: above your sensitivity ceiling"),
            "{text}"
        );
        assert!(text.contains("= 12,600.50 EUR"), "{text}");
        let mut out = Vec::new();
        run(&args(&url, list(Some("dave-console-key-0005"))), &mut out).unwrap();
        let text = String::from_utf8(out).unwrap();
        assert!(text.contains(&id), "{text}");
        assert!(!text.contains("ES9121000418450200051332"), "{text}");
    }

    /// A parked payment whose principal's grant no longer reaches spending: `show` says it
    /// will be refused and by which rule, and `approve` refuses it, nothing approved.
    #[test]
    fn a_call_that_would_be_refused_is_not_approved_from_the_terminal() {
        let dir = tempfile::tempdir().unwrap();
        let (url, id, step) = parked(dir.path());
        let reg = registry_copy(dir.path());
        let p = reg.join("principals.yaml");
        let text = std::fs::read_to_string(&p).unwrap();
        let lowered = text.replacen("max_tier: spend", "max_tier: act", 1);
        assert_ne!(text, lowered);
        std::fs::write(&p, lowered).unwrap();

        let mut out = Vec::new();
        let show = Sub::Show {
            id: Some(id.clone()),
            run: None,
            api_key: Some(ALICE_KEY.into()),
        };
        assert_eq!(
            run(&args_in(&url, &reg, show), &mut out).unwrap(),
            Exit::Success
        );
        let shown = String::from_utf8(out).unwrap();
        let line = shown
            .lines()
            .find(|l| l.contains("WILL BE REFUSED by "))
            .unwrap_or_else(|| panic!("{shown}"));
        let rule = line
            .split("WILL BE REFUSED by ")
            .nth(1)
            .unwrap()
            .split(' ')
            .next()
            .unwrap()
            .to_string();
        assert!(!shown.contains("to approve exactly this"), "{shown}");
        let hash = shown
            .lines()
            .find_map(|l| l.strip_prefix("input hash: "))
            .unwrap()
            .to_string();

        // SAFETY: only the tests of this module set this variable, to the same value.
        unsafe { std::env::set_var("TOOLGATE_APPROVAL_KEY", "k".repeat(32)) };
        let mut out = Vec::new();
        let approve = Sub::Approve {
            id: Some(id.clone()),
            input_hash: Some(hash),
            run: None,
            set: None,
            api_key: ALICE_KEY.into(),
        };
        assert_eq!(
            run(&args_in(&url, &reg, approve), &mut out).unwrap(),
            Exit::Refused
        );
        let said = String::from_utf8(out).unwrap();
        assert!(
            said.contains("nothing was approved")
                && said.contains(&format!("would be refused by {rule}")),
            "{said}"
        );
        assert_eq!(step_status(&url, &step), StepStatus::NeedsApproval);
        runtime().unwrap().block_on(async {
            let store = Store::connect(&url, StoreConfig::default()).await.unwrap();
            assert!(
                store
                    .approval(&ApprovalId::from(&id))
                    .await
                    .unwrap()
                    .approved_by
                    .is_empty()
            );
            store.close().await;
        });
    }
}
