//! Hot reload: a changed registry folder is loaded, checked as completely as `toolgate check`
//! checks it (load errors and every lint finding nobody accepted refuse it; findings accepted
//! in `accept:` are reported as warnings and do not), and swapped in whole; requests that
//! started before keep the version they started with. A folder that fails never replaces the
//! serving version: the error is logged, written to the status file `toolgate status` reads,
//! and recorded in the audit chain, like every applied reload.
//!
//! Three triggers: a file watch on the folder (debounced), SIGHUP, and `toolgate reload`, which
//! finds the running server through the status file (`<folder>/.toolgate/serve.json`, holding
//! its pid) and sends it SIGHUP. Settings the process took at start (server, store, upstreams,
//! approval keys, idempotency, redaction) cannot change in a reload: a folder that changes them
//! is refused with the sections named, and applies at the next restart.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;
use toolgate_core::lint::review;
use toolgate_core::{Clock, LoadError, Registry, Timestamp};
use toolgate_store::audit::AuditDraft;

use crate::server::GatewayState;

/// The folder, under the registry folder, where a running `toolgate serve` says what it serves.
pub const STATE_DIR: &str = ".toolgate";
/// The status file in [`STATE_DIR`].
pub const STATUS_FILE: &str = "serve.json";

/// How long the folder must be quiet after a change before it is reloaded (editors write a
/// file in several steps; `git checkout` changes many).
pub const DEBOUNCE: Duration = Duration::from_millis(400);

/// What asked for a reload.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Trigger {
    /// A file in the folder changed.
    Watch,
    /// SIGHUP (what `toolgate reload` sends).
    Signal,
    /// Called in-process (tests, embedders).
    Call,
}

/// How a reload attempt ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ReloadOutcome {
    /// The new version serves from now on.
    Applied,
    /// The folder's content hash is the one serving: nothing to do.
    Unchanged,
    /// The folder failed validation (or changes restart-only settings); the old version serves.
    Refused,
}

/// A registry version, as people read it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct VersionInfo {
    pub hash: String,
    pub label: String,
}

impl VersionInfo {
    fn of(r: &Registry) -> Self {
        VersionInfo {
            hash: r.version.hash.clone(),
            label: r.version.label.clone(),
        }
    }
}

/// One reload attempt.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReloadReport {
    /// Milliseconds since the epoch.
    pub at: i64,
    pub trigger: Trigger,
    pub outcome: ReloadOutcome,
    /// The version serving before the attempt.
    pub from: VersionInfo,
    /// The folder's version, when it loaded far enough to have one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub to: Option<VersionInfo>,
    /// Why it was refused: each problem on its own line (lint findings as `check` prints them).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub errors: Vec<String>,
    /// Accepted lint findings of the folder's version (they do not refuse it), each with who
    /// accepted it and why.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub warnings: Vec<String>,
    /// Milliseconds to load, validate and (if applied) swap the folder.
    #[serde(default)]
    pub took_ms: u64,
    /// The audit record of the attempt (none when nothing changed).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub audit_seq: Option<i64>,
}

/// What `<folder>/.toolgate/serve.json` holds while `toolgate serve` runs.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ServeStatus {
    pub pid: u32,
    pub config_dir: String,
    pub started_at: i64,
    /// The version serving now, and since when.
    pub serving: VersionInfo,
    pub serving_since: i64,
    /// The MCP endpoint served over HTTP, at the address actually bound (so a server started
    /// on port 0 can be found); absent with stdio only, and until the listener is bound.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub http: Option<String>,
    /// The last reload attempt (applied, unchanged or refused).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_reload: Option<ReloadReport>,
    /// The last refused attempt, kept after later successes are reported in `last_reload`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_refused: Option<ReloadReport>,
}

impl ServeStatus {
    /// The status file of the server serving `dir`, if one wrote it.
    pub fn path(dir: &Path) -> PathBuf {
        dir.join(STATE_DIR).join(STATUS_FILE)
    }

    /// Reads the status file of `dir`.
    pub fn read(dir: &Path) -> std::io::Result<ServeStatus> {
        let text = std::fs::read_to_string(Self::path(dir))?;
        serde_json::from_str(&text)
            .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidData, e))
    }
}

/// Loads, validates and swaps registry versions for one running gateway.
pub struct Reloader {
    dir: PathBuf,
    state: Arc<GatewayState>,
    /// One reload at a time.
    running: tokio::sync::Mutex<()>,
    status: Mutex<ServeStatus>,
    /// Whether to keep the status file up to date (`toolgate serve` does; an embedded gateway
    /// need not).
    write_status: AtomicBool,
}

impl Reloader {
    pub fn new(dir: PathBuf, state: Arc<GatewayState>) -> Arc<Reloader> {
        let surface = state.surface();
        let now = surface.executor.clock.now().millis();
        let serving = VersionInfo::of(&surface.registry);
        let status = ServeStatus {
            pid: std::process::id(),
            config_dir: dir.display().to_string(),
            started_at: now,
            serving,
            serving_since: now,
            http: None,
            last_reload: None,
            last_refused: None,
        };
        Arc::new(Reloader {
            dir,
            state,
            running: tokio::sync::Mutex::new(()),
            status: Mutex::new(status),
            write_status: AtomicBool::new(false),
        })
    }

    /// Writes the status file now and after every reload attempt, until [`Self::clear_status`].
    pub fn keep_status_file(&self) {
        self.write_status.store(true, Ordering::SeqCst);
        self.save_status();
    }

    /// Records the MCP endpoint the HTTP listener serves, in the status file.
    pub fn set_http(&self, url: String) {
        self.status.lock().expect("status").http = Some(url);
        self.save_status();
    }

    /// What the status file says now.
    pub fn status(&self) -> ServeStatus {
        self.status.lock().expect("status").clone()
    }

    /// Loads the folder again and, if it validates and differs, puts it in service.
    pub async fn reload(&self, trigger: Trigger) -> ReloadReport {
        let _one = self.running.lock().await;
        let started = std::time::Instant::now();
        let serving = self.state.surface();
        let clock = serving.executor.clock.as_ref();
        let (mut report, next) = check_folder(&self.dir, &serving.registry, clock, trigger).await;
        if let Some(next) = next {
            // One swap: principals, roles, tools and rules change together for the requests
            // that take a snapshot after it (the authenticator resolves against that snapshot).
            self.state.swap_registry(Arc::new(next));
            self.state.tools_changed();
            report.outcome = ReloadOutcome::Applied;
        }
        report.took_ms = started.elapsed().as_millis() as u64;
        log_report(&report);
        if report.outcome != ReloadOutcome::Unchanged {
            match self
                .state
                .store
                .append_audit(vec![reload_draft(&self.dir, &report)])
                .await
            {
                Ok(seqs) => report.audit_seq = seqs.first().copied(),
                Err(e) => tracing::error!(error = %e, "the reload could not be recorded"),
            }
        }
        {
            let mut s = self.status.lock().expect("status");
            if report.outcome == ReloadOutcome::Applied {
                s.serving = report.to.clone().unwrap_or_else(|| s.serving.clone());
                s.serving_since = report.at;
            }
            if report.outcome == ReloadOutcome::Refused {
                s.last_refused = Some(report.clone());
            }
            s.last_reload = Some(report.clone());
        }
        self.save_status();
        report
    }

    fn save_status(&self) {
        if !self.write_status.load(Ordering::SeqCst) {
            return;
        }
        let status = self.status();
        let path = ServeStatus::path(&self.dir);
        let write = || -> std::io::Result<()> {
            std::fs::create_dir_all(path.parent().expect("a parent"))?;
            let tmp = path.with_extension("json.tmp");
            std::fs::write(
                &tmp,
                serde_json::to_vec_pretty(&status).expect("serialises"),
            )?;
            std::fs::rename(&tmp, &path)
        };
        if let Err(e) = write() {
            tracing::warn!(path = %path.display(), error = %e, "cannot write the status file");
        }
    }

    /// Removes the status file (at shutdown).
    pub fn clear_status(&self) {
        if self.write_status.swap(false, Ordering::SeqCst) {
            let _ = std::fs::remove_file(ServeStatus::path(&self.dir));
        }
    }

    /// Reloads on SIGHUP until `stop` is cancelled.
    pub fn on_sighup(self: &Arc<Self>, stop: CancellationToken) {
        #[cfg(unix)]
        {
            use tokio::signal::unix::{SignalKind, signal};
            let me = self.clone();
            let mut hup = match signal(SignalKind::hangup()) {
                Ok(s) => s,
                Err(e) => {
                    tracing::warn!(error = %e, "cannot listen for SIGHUP: reload by file watch only");
                    return;
                }
            };
            tokio::spawn(async move {
                loop {
                    tokio::select! {
                        _ = stop.cancelled() => break,
                        got = hup.recv() => {
                            if got.is_none() { break; }
                            me.reload(Trigger::Signal).await;
                        }
                    }
                }
            });
        }
        #[cfg(not(unix))]
        let _ = stop;
    }

    /// Watches the folder and reloads once it has been quiet for [`DEBOUNCE`] after a change,
    /// until `stop` is cancelled. Only registry files count (YAML, Cedar, JSON, the lockfile),
    /// never the store's database files or the status folder.
    pub fn watch(self: &Arc<Self>, stop: CancellationToken) -> std::io::Result<()> {
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<()>();
        let watcher = crate::watch::watch(&self.dir, is_registry_file, tx)?;
        let me = self.clone();
        tokio::spawn(async move {
            let _keep = watcher;
            loop {
                tokio::select! {
                    _ = stop.cancelled() => break,
                    got = rx.recv() => if got.is_none() { break },
                }
                // Debounce: wait until no change arrived for DEBOUNCE.
                loop {
                    tokio::select! {
                        _ = stop.cancelled() => return,
                        _ = tokio::time::sleep(DEBOUNCE) => break,
                        got = rx.recv() => if got.is_none() { return },
                    }
                }
                me.reload(Trigger::Watch).await;
            }
        });
        Ok(())
    }
}

/// The audit record of a reload attempt of the folder `dir`.
pub(crate) fn reload_draft(dir: &Path, r: &ReloadReport) -> AuditDraft {
    let applied = r.outcome == ReloadOutcome::Applied;
    let serving = if applied {
        r.to.as_ref().unwrap_or(&r.from)
    } else {
        &r.from
    };
    let attempt = json!({
        "dir": dir.display().to_string(),
        "trigger": r.trigger,
        "from": r.from,
        "to": r.to,
    });
    let reason = match r.outcome {
        ReloadOutcome::Applied => {
            format!("registry {} replaced {}", serving.label, r.from.label)
        }
        _ => format!(
            "the folder failed validation; {} keeps serving",
            r.from.label
        ),
    };
    let invalid = (!applied).then(|| r.errors.join("\n"));
    let ts = Timestamp::from_millis(r.at);
    AuditDraft::reload(ts, attempt, reason, invalid, serving.hash.clone())
}

/// Loads and validates the folder against the serving registry: the attempt's report (stamped
/// by `clock`, the executor's) and, when it should be applied, the new registry (the caller
/// swaps it in and marks it applied).
pub(crate) async fn check_folder(
    dir: &Path,
    current: &Registry,
    clock: &dyn Clock,
    trigger: Trigger,
) -> (ReloadReport, Option<Registry>) {
    let from = VersionInfo::of(current);
    let d = dir.to_path_buf();
    let loaded = tokio::task::spawn_blocking(move || validate(&d))
        .await
        .unwrap_or_else(|e| Err((None, vec![format!("the reload task failed: {e}")])));
    let mut report = ReloadReport {
        at: clock.now().millis(),
        trigger,
        outcome: ReloadOutcome::Refused,
        from,
        to: None,
        errors: Vec::new(),
        warnings: Vec::new(),
        took_ms: 0,
        audit_seq: None,
    };
    match loaded {
        Err((version, errors)) => {
            report.to = version;
            report.errors = errors;
            (report, None)
        }
        Ok((next, warnings)) => {
            report.to = Some(VersionInfo::of(&next));
            report.warnings = warnings;
            if next.version.hash == current.version.hash {
                report.outcome = ReloadOutcome::Unchanged;
                return (report, None);
            }
            let fixed = restart_only_changes(current, &next);
            if fixed.is_empty() {
                (report, Some(next))
            } else {
                report.errors.push(format!(
                    "toolgate.yaml changes {}, which apply only at start: restart the process \
                     to change them (nothing was reloaded)",
                    fixed.join(", ")
                ));
                (report, None)
            }
        }
    }
}

fn log_report(report: &ReloadReport) {
    let trigger = report.trigger;
    match report.outcome {
        ReloadOutcome::Applied => {
            tracing::info!(
                from = %report.from.label, to = %report.to.as_ref().map(|v| v.label.as_str()).unwrap_or(""),
                hash = %report.to.as_ref().map(|v| v.hash.as_str()).unwrap_or(""),
                took_ms = report.took_ms,
                accepted_findings = report.warnings.len(),
                ?trigger, "registry reloaded"
            );
            log_accepted(&report.warnings);
        }
        ReloadOutcome::Unchanged => {
            tracing::debug!(?trigger, "registry folder unchanged: nothing to reload")
        }
        ReloadOutcome::Refused => tracing::error!(
            serving = %report.from.label, ?trigger, errors = %report.errors.join("; "),
            "registry reload refused: the serving version stays"
        ),
    }
}

/// Logs accepted lint findings, one warning each.
pub(crate) fn log_accepted(warnings: &[String]) {
    for w in warnings {
        tracing::warn!(finding = %w, "accepted lint finding");
    }
}

/// At start: the serving registry's lint findings, as `check` sees them. Accepted ones are
/// warnings; one nobody accepted is logged as an error (the process serves, as it always has,
/// but a reload is refused until it is fixed or accepted).
pub(crate) fn log_review(registry: &Registry) {
    let review = review(registry);
    log_accepted(
        &review
            .accepted
            .iter()
            .map(|a| a.to_string())
            .collect::<Vec<_>>(),
    );
    for f in &review.findings {
        tracing::error!(
            finding = %f,
            "lint finding nobody accepted: fix it or accept it in toolgate.yaml `accept:` \
             (until then every reload is refused)"
        );
    }
}

/// For `toolgate worker`: SIGHUP and (debounced) changes of registry files in `dir`, as
/// triggers, for as long as the receiver lives.
pub(crate) fn folder_signals(dir: &Path) -> tokio::sync::mpsc::UnboundedReceiver<Trigger> {
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel::<Trigger>();
    #[cfg(unix)]
    {
        use tokio::signal::unix::{SignalKind, signal};
        match signal(SignalKind::hangup()) {
            Ok(mut hup) => {
                let tx = tx.clone();
                // Ends with the receiver (the worker stopped).
                tokio::spawn(async move {
                    loop {
                        tokio::select! {
                            _ = tx.closed() => break,
                            got = hup.recv() => {
                                if got.is_none() || tx.send(Trigger::Signal).is_err() {
                                    break;
                                }
                            }
                        }
                    }
                });
            }
            Err(e) => tracing::warn!(error = %e, "cannot listen for SIGHUP"),
        }
    }
    let (raw_tx, mut raw) = tokio::sync::mpsc::unbounded_channel::<()>();
    match crate::watch::watch(dir, is_registry_file, raw_tx) {
        Ok(w) => {
            // Ends, dropping the watch, with the receiver (the worker stopped).
            tokio::spawn(async move {
                let _keep = w;
                loop {
                    tokio::select! {
                        _ = tx.closed() => return,
                        got = raw.recv() => if got.is_none() { return },
                    }
                    // Debounce: wait until no change arrived for DEBOUNCE.
                    loop {
                        tokio::select! {
                            _ = tokio::time::sleep(DEBOUNCE) => break,
                            got = raw.recv() => if got.is_none() { return },
                        }
                    }
                    if tx.send(Trigger::Watch).is_err() {
                        return;
                    }
                }
            });
        }
        Err(e) => {
            tracing::warn!(error = %e, "cannot watch the registry folder: reload with SIGHUP")
        }
    }
    rx
}

/// For `toolgate worker`: checks the folder after `trigger` and returns the executor to go on
/// with (the new version's, or the old one when the folder is unchanged or refused), recording
/// an applied or refused attempt in the audit chain.
pub(crate) async fn reload_executor(
    dir: &Path,
    executor: &toolgate_store::Executor,
    trigger: Trigger,
) -> toolgate_store::Executor {
    let started = std::time::Instant::now();
    let clock = executor.clock.as_ref();
    let (mut report, next) = check_folder(dir, &executor.registry, clock, trigger).await;
    let out = match next {
        Some(next) => {
            report.outcome = ReloadOutcome::Applied;
            toolgate_store::Executor {
                registry: Arc::new(next),
                ..executor.clone()
            }
        }
        None => executor.clone(),
    };
    report.took_ms = started.elapsed().as_millis() as u64;
    log_report(&report);
    if report.outcome != ReloadOutcome::Unchanged
        && let Err(e) = executor
            .store
            .append_audit(vec![reload_draft(dir, &report)])
            .await
    {
        tracing::error!(error = %e, "the reload could not be recorded");
    }
    out
}

/// Whether a changed path is part of the registry (and not the store or the status folder).
fn is_registry_file(root: &Path, p: &Path) -> bool {
    let rel = p.strip_prefix(root).unwrap_or(p);
    if rel.components().any(|c| {
        let s = c.as_os_str().to_string_lossy();
        s == STATE_DIR || s.starts_with(".git")
    }) {
        return false;
    }
    let name = rel
        .file_name()
        .map(|n| n.to_string_lossy())
        .unwrap_or_default();
    if name.starts_with('.') || name.ends_with('~') {
        return false; // editors' swap and backup files
    }
    matches!(
        rel.extension().and_then(|e| e.to_str()),
        Some("yaml" | "yml" | "cedar" | "json" | "lock")
    )
}

/// Loads and lints the folder as `toolgate check` does: the registry and its accepted findings
/// (warnings), or its version (when it loaded) and every problem.
#[allow(clippy::type_complexity)]
fn validate(dir: &Path) -> Result<(Registry, Vec<String>), (Option<VersionInfo>, Vec<String>)> {
    match Registry::load(dir) {
        Ok(r) => {
            let review = review(&r);
            if review.is_clean() {
                let warnings = review.accepted.iter().map(|a| a.to_string()).collect();
                Ok((r, warnings))
            } else {
                Err((
                    Some(VersionInfo::of(&r)),
                    review.findings.iter().map(|f| f.to_string()).collect(),
                ))
            }
        }
        Err(LoadError::Invalid(findings)) => {
            Err((None, findings.iter().map(|f| f.to_string()).collect()))
        }
        Err(LoadError::Unreadable { file, message }) => {
            Err((None, vec![format!("unreadable: {file}: {message}")]))
        }
    }
}

/// The sections of toolgate.yaml the process took at start that differ between two versions.
fn restart_only_changes(a: &Registry, b: &Registry) -> Vec<&'static str> {
    let (ga, gb) = (&a.gateway, &b.gateway);
    fn v<T: Serialize>(x: &T) -> Value {
        serde_json::to_value(x).unwrap_or(Value::Null)
    }
    let mut out = Vec::new();
    for (name, x, y) in [
        ("server", v(&ga.server), v(&gb.server)),
        ("store", v(&ga.store), v(&gb.store)),
        ("upstreams", v(&ga.upstreams), v(&gb.upstreams)),
        ("approvals", v(&ga.approvals), v(&gb.approvals)),
        ("idempotency", v(&ga.idempotency), v(&gb.idempotency)),
        ("redaction", v(&ga.redaction), v(&gb.redaction)),
        ("metrics", v(&ga.metrics), v(&gb.metrics)),
    ] {
        if x != y {
            out.push(name);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_reload_attempt_is_stamped_by_the_executors_clock() {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples/finance");
        let serving = Registry::load(&dir).unwrap();
        let at = Timestamp::from_millis(1_780_000_000_000);
        let clock = toolgate_core::FixedClock::at(at);
        let (report, next) = check_folder(&dir, &serving, &clock, Trigger::Call).await;
        assert_eq!(report.outcome, ReloadOutcome::Unchanged, "{report:?}");
        assert!(next.is_none());
        assert_eq!(report.at, at.millis());
        assert_eq!(reload_draft(&dir, &report).ts, at);
    }

    #[test]
    fn only_registry_files_trigger_a_reload() {
        let root = Path::new("/etc/tg");
        assert!(is_registry_file(
            root,
            Path::new("/etc/tg/tools/payments.yaml")
        ));
        assert!(is_registry_file(
            root,
            Path::new("/etc/tg/policies/finance.cedar")
        ));
        assert!(is_registry_file(root, Path::new("/etc/tg/toolgate.yaml")));
        assert!(!is_registry_file(root, Path::new("/etc/tg/finance.db-wal")));
        assert!(!is_registry_file(root, Path::new("/etc/tg/finance.db")));
        assert!(!is_registry_file(
            root,
            Path::new("/etc/tg/.toolgate/serve.json")
        ));
        assert!(!is_registry_file(
            root,
            Path::new("/etc/tg/tools/.payments.yaml.swp")
        ));
        assert!(!is_registry_file(
            root,
            Path::new("/etc/tg/erp-calls.jsonl")
        ));
    }
}
