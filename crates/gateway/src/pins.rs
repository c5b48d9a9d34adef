//! Serve-time pinning: an upstream tool is served only at the definition `toolgate.lock` (beside
//! the registry) pins for it. Each upstream is checked with [`PinSet::check_rmcp`] when the
//! gateway connects to it, when it announces `notifications/tools/list_changed`, and on every
//! reconnect; the verdict is kept, so a call costs one map lookup ([`PinGuard::allows`]).
//!
//! Fail closed: a server the lockfile does not know, or whose identity, reported name/version or
//! instructions changed, serves nothing; a changed or new tool is hidden from `tools/list` and a
//! call to it is refused with a result naming `toolgate lock diff`; a tool that is not pinned is
//! never forwarded; a pinned tool the server stopped listing is simply gone. The pinned hash of
//! each allowed call is bound into its decision and into any approval requested for it.
//!
//! Every verdict that changes (at start, on a change, after a lock approval took effect) is
//! written to the audit chain: one `pin` record with the hashes served, one `pin_block` record
//! per blocked tool or server. A call to a blocked tool is refused by the engine's pin check
//! (rule `pin.blocked`), recorded like any refusal.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock, RwLock};

use rmcp::model::{ServerPeerInfo, Tool};
use serde_json::json;
use toolgate_contract::{
    ContractError, DefinitionHash, Lockfile, PinSet, PinVerdict, ServerIdentity,
};
use toolgate_core::canon::sha256_tagged;
use toolgate_core::{Clock, Registry, Rule, Timestamp};
use toolgate_store::{AuditDraft, DirectCall, Store};

use crate::auth::Caller;
use crate::error::GatewayError;
use crate::server::GatewayState;

/// Why an upstream tool is not served: its upstream was never checked, or the pins in force
/// refuse it. Its text is the refusal the caller reads.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PinRefusal {
    #[error(
        "tool '{tool}' is not served yet: upstream '{upstream}' has not been reached and checked \
         against toolgate.lock"
    )]
    Unchecked { tool: String, upstream: String },
    /// The verdict in force blocks the tool (or its server); the text names `toolgate lock diff`.
    #[error("{0}")]
    Blocked(String),
}

/// The lockfile's name in the registry folder.
pub const LOCKFILE: &str = "toolgate.lock";

/// The lockfile as the gateway holds it. Re-read when a check runs and its text changed, so a
/// `toolgate lock approve` takes effect without a restart.
pub struct Pins {
    /// `None`: pinning is off (benchmarks only; `toolgate serve` always pins).
    path: Option<PathBuf>,
    loaded: Mutex<Loaded>,
    /// Bumped each time a changed lockfile is loaded; a verdict from an older generation is
    /// re-checked.
    generation: AtomicU64,
    ledger: OnceLock<Ledger>,
}

/// Where pin records go: the process's store, stamped by the executor's clock.
struct Ledger {
    store: Store,
    clock: Arc<dyn Clock>,
}

struct Loaded {
    text: Option<String>,
    set: Arc<PinSet>,
    /// `lock:sha256:…` of the lockfile text, recorded with each pin record.
    version: String,
}

fn read_text(path: &Path) -> Result<Option<String>, ContractError> {
    match std::fs::read_to_string(path) {
        Ok(t) => Ok(Some(t)),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(source) => Err(ContractError::Io {
            file: path.display().to_string(),
            doing: "cannot read: ",
            source,
        }),
    }
}

fn parse(path: &Path, text: Option<&str>) -> Result<Loaded, ContractError> {
    let lock = match text {
        Some(t) => Lockfile::parse(&path.display().to_string(), t)?,
        None => Lockfile::default(),
    };
    Ok(Loaded {
        text: text.map(str::to_string),
        set: Arc::new(PinSet::new(&lock)),
        version: format!("lock:{}", sha256_tagged(text.unwrap_or("").as_bytes())),
    })
}

impl Pins {
    /// Reads `toolgate.lock` in `dir`. A missing lockfile pins nothing (every upstream is then
    /// new and serves nothing); an unreadable or tampered one is an error.
    pub fn load(dir: &Path) -> Result<Pins, ContractError> {
        let path = dir.join(LOCKFILE);
        let text = read_text(&path)?;
        let loaded = parse(&path, text.as_deref())?;
        if text.is_none() {
            tracing::warn!(lock = %path.display(), "no toolgate.lock: no upstream tool is served until `toolgate lock approve`");
        }
        Ok(Pins {
            path: Some(path),
            loaded: Mutex::new(loaded),
            generation: AtomicU64::new(0),
            ledger: OnceLock::new(),
        })
    }

    /// No pinning: every upstream tool is served as listed, with no definition hash. For
    /// measuring what pinning costs; nothing in `toolgate serve` turns it on.
    pub fn off() -> Pins {
        Pins {
            path: None,
            loaded: Mutex::new(Loaded {
                text: None,
                set: Arc::new(PinSet::default()),
                version: String::new(),
            }),
            generation: AtomicU64::new(0),
            ledger: OnceLock::new(),
        }
    }

    pub fn is_on(&self) -> bool {
        self.path.is_some()
    }

    /// Where pin records go, and the clock that stamps them: the store and the clock of the
    /// executor that decides calls (set once the store is open, before upstreams are checked).
    pub fn attach_store(&self, store: Store, clock: Arc<dyn Clock>) {
        let _ = self.ledger.set(Ledger { store, clock });
    }

    fn current(&self) -> (Arc<PinSet>, String, u64) {
        let l = self.loaded.lock().expect("pins lock");
        (
            l.set.clone(),
            l.version.clone(),
            self.generation.load(Ordering::Acquire),
        )
    }

    /// Re-reads the lockfile; true when its text changed (and parsed). A lockfile that no longer
    /// parses keeps the pins in force and is logged: it cannot widen what is served.
    pub fn refresh(&self) -> bool {
        let Some(path) = &self.path else {
            return false;
        };
        let text = match read_text(path) {
            Ok(t) => t,
            Err(e) => {
                tracing::error!(error = %e, "toolgate.lock unreadable; keeping the pins in force");
                return false;
            }
        };
        let mut l = self.loaded.lock().expect("pins lock");
        if l.text == text {
            return false;
        }
        match parse(path, text.as_deref()) {
            Ok(new) => {
                tracing::info!(lock = %path.display(), "toolgate.lock changed; re-checking upstreams");
                *l = new;
                self.generation.fetch_add(1, Ordering::AcqRel);
                true
            }
            Err(e) => {
                tracing::error!(error = %e, "toolgate.lock changed but does not parse; keeping the pins in force");
                false
            }
        }
    }

    /// Appends the records `drafts` makes at the attached clock's time.
    async fn record(&self, drafts: impl FnOnce(Timestamp) -> Vec<AuditDraft>) {
        let Some(ledger) = self.ledger.get() else {
            tracing::warn!("pin check before the store was attached: not recorded");
            return;
        };
        let drafts = drafts(ledger.clock.now());
        if drafts.is_empty() {
            return;
        }
        if let Err(e) = ledger.store.append_audit(drafts).await {
            tracing::error!(error = %e, "recording a pin check in the audit chain failed");
        }
    }
}

/// The last check of one upstream.
struct Checked {
    info: Arc<ServerPeerInfo>,
    verdict: Arc<PinVerdict>,
    /// The lockfile generation the verdict was taken under.
    generation: u64,
}

/// One upstream's pin state, shared by its connection and its `list_changed` handler.
pub struct PinGuard {
    name: String,
    identity: ServerIdentity,
    pins: Arc<Pins>,
    checked: RwLock<Option<Checked>>,
}

impl PinGuard {
    pub fn new(name: &str, identity: ServerIdentity, pins: Arc<Pins>) -> PinGuard {
        PinGuard {
            name: name.to_string(),
            identity,
            pins,
            checked: RwLock::new(None),
        }
    }

    /// Whether the upstream still has to be checked before anything of it is served.
    pub fn unchecked(&self) -> bool {
        self.pins.is_on() && self.checked.read().expect("pin guard").is_none()
    }

    /// Checks what the upstream said in `initialize` and listed against the lockfile, puts the
    /// verdict in force, and records it when it differs from the last one.
    pub async fn check(&self, info: Arc<ServerPeerInfo>, tools: &[Tool]) {
        if !self.pins.is_on() {
            return;
        }
        self.pins.refresh();
        let (set, version, generation) = self.pins.current();
        let verdict = Arc::new(set.check_rmcp(&self.name, &self.identity, &info, tools));
        let previous = {
            let mut c = self.checked.write().expect("pin guard");
            let prev = c.as_ref().map(|c| c.verdict.clone());
            *c = Some(Checked {
                info,
                verdict: verdict.clone(),
                generation,
            });
            prev
        };
        if previous.as_deref() == Some(&*verdict) {
            return;
        }
        log_verdict(&verdict);
        self.pins
            .record(|now| drafts_for(&verdict, &self.identity, &version, now))
            .await;
    }

    /// Whether the verdict in force was taken under an older lockfile than the one loaded.
    pub fn stale(&self) -> bool {
        let now = self.pins.generation.load(Ordering::Acquire);
        self.checked
            .read()
            .expect("pin guard")
            .as_ref()
            .is_some_and(|c| c.generation != now)
    }

    /// Re-reads the lockfile and, when the verdict in force predates it, re-checks the last
    /// `initialize` answer and `tools` (no network). True when it re-checked.
    pub async fn recheck_if_lock_changed(&self, tools: &[Tool]) -> bool {
        if !self.pins.is_on() {
            return false;
        }
        self.pins.refresh();
        if !self.stale() {
            return false;
        }
        self.recheck(tools).await;
        true
    }

    /// Re-checks the last `initialize` answer and `tools` against the pins in force.
    pub async fn recheck(&self, tools: &[Tool]) {
        let info = self
            .checked
            .read()
            .expect("pin guard")
            .as_ref()
            .map(|c| c.info.clone());
        if let Some(info) = info {
            self.check(info, tools).await;
        }
    }

    /// The per-call check, one map lookup: `Ok(Some(hash))` when `tool` is served at a pinned
    /// definition, `Ok(None)` when pinning is off, `Err(refusal)` otherwise.
    pub fn allows(&self, tool: &str) -> Result<Option<DefinitionHash>, PinRefusal> {
        if !self.pins.is_on() {
            return Ok(None);
        }
        let c = self.checked.read().expect("pin guard");
        let Some(c) = c.as_ref() else {
            return Err(PinRefusal::Unchecked {
                tool: tool.to_string(),
                upstream: self.name.clone(),
            });
        };
        match c.verdict.allows(tool) {
            Some(h) => Ok(Some(h.clone())),
            None => Err(PinRefusal::Blocked(c.verdict.refusal(tool))),
        }
    }

    /// The verdict in force, if the upstream was checked.
    pub fn verdict(&self) -> Option<Arc<PinVerdict>> {
        self.checked
            .read()
            .expect("pin guard")
            .as_ref()
            .map(|c| c.verdict.clone())
    }
}

fn log_verdict(v: &PinVerdict) {
    if let Some(reason) = &v.server_blocked {
        tracing::warn!(upstream = %v.server, %reason, "upstream BLOCKED by toolgate.lock: nothing of it is served; see `toolgate lock diff`");
    }
    for b in &v.blocked {
        tracing::warn!(upstream = %v.server, tool = %b.tool, label = %b.label, reason = %b.reason, "upstream tool blocked by toolgate.lock; see `toolgate lock diff`");
    }
    tracing::info!(upstream = %v.server, served = v.allowed.len(), blocked = v.blocked.len(), removed = v.removed.len(), "checked against toolgate.lock");
}

/// The audit records of one verdict, made at `now`: what is served, and each block.
fn drafts_for(
    v: &PinVerdict,
    identity: &ServerIdentity,
    version: &str,
    now: Timestamp,
) -> Vec<AuditDraft> {
    let server = &v.server;
    if let Some(reason) = &v.server_blocked {
        return vec![AuditDraft::pin_block(
            now,
            format!("upstream:{server}"),
            json!({
                "server": server,
                "identity": identity,
                "changes": v.server_changes,
                "listed": v.blocked.iter().map(|b| &b.tool).collect::<Vec<_>>(),
            }),
            Rule::PIN_SERVER_BLOCKED,
            format!("upstream '{server}' serves nothing: {reason}"),
            reason.clone(),
            version,
        )];
    }
    let served: BTreeMap<&String, &DefinitionHash> = v.allowed.iter().collect();
    let mut out = vec![AuditDraft::pin(
        now,
        format!("upstream:{server}"),
        json!({
            "server": server,
            "identity": identity,
            "served": served,
            "removed": v.removed,
        }),
        format!(
            "upstream '{server}': {} tool(s) served at their pinned definitions, {} blocked, {} removed",
            v.allowed.len(),
            v.blocked.len(),
            v.removed.len()
        ),
        version,
    )];
    for b in &v.blocked {
        out.push(AuditDraft::pin_block(
            now,
            format!("upstream:{server}/{}", b.tool),
            json!({
                "server": server,
                "tool": b.tool,
                "label": b.label,
                "changes": b.change.changes(),
            }),
            Rule::PIN_TOOL_BLOCKED,
            format!(
                "'{}' on upstream '{server}' is blocked ({}): {}",
                b.tool, b.label, b.reason
            ),
            v.refusal(&b.tool),
            version,
        ));
    }
    out
}

/// The upstream and upstream tool name a registry tool is served from, if any.
fn upstream_of(tool: &toolgate_core::registry::Tool) -> Option<(&str, &str)> {
    let h = &tool.config.handler;
    let upstream = h.upstream.as_deref()?;
    Some((upstream, h.tool.as_deref().unwrap_or(&tool.config.name)))
}

/// Picks up a changed `toolgate.lock` before a `tools/list` is answered.
pub async fn refresh(state: &GatewayState) {
    state.upstreams.refresh_pins().await;
}

/// Whether a registry tool may appear in `tools/list`: built-in tools always; upstream tools
/// only while served at their pinned definition.
pub fn listed(state: &GatewayState, tool: &toolgate_core::registry::Tool) -> bool {
    match upstream_of(tool) {
        None => true,
        Some((upstream, name)) => state.upstreams.is_served(upstream, name),
    }
}

/// Brings the pin state of a call's upstream up to date before the engine's pin check reads it
/// ([`toolgate_store::Handler::served`]): an upstream never reached is connected, which checks
/// it, and a tool it blocks re-reads `toolgate.lock` once, so an approval given since takes
/// effect without a restart. Nothing for a tool the caller's role is not granted: the engine
/// refuses that without naming any upstream.
pub async fn freshen(
    state: &GatewayState,
    registry: &Registry,
    caller: &Caller,
    call: &DirectCall,
) {
    let Some(tool) = registry.tool(&call.tool) else {
        return;
    };
    let Some((upstream, name)) = upstream_of(tool) else {
        return;
    };
    if tool.is_listed_for(&caller.role) {
        // An unreachable upstream stays unreached: the call path reports the outage.
        let _ = state.upstreams.pin_check(upstream, name).await;
    }
}

/// Rewrites the identity of each server pinned in `dir`'s `toolgate.lock` to how `dir`'s
/// `toolgate.yaml` now reaches it, keeping every other pin (server name and version,
/// instructions, tool definitions) as it was. For test environments that copy an example and
/// serve its upstreams on loopback URLs; returns the servers moved.
pub fn rehome_lock(dir: &Path) -> Result<Vec<String>, GatewayError> {
    let path = dir.join(LOCKFILE);
    if !path.exists() {
        return Ok(Vec::new());
    }
    let mut lock = Lockfile::read(&path).map_err(GatewayError::Lockfile)?;
    let sources =
        toolgate_core::registry::Sources::read(dir).map_err(|source| GatewayError::Registry {
            dir: dir.to_path_buf(),
            source,
        })?;
    let mut moved = Vec::new();
    for (name, cfg) in &sources.gateway.upstreams {
        if lock.rehome(name, ServerIdentity::from_upstream(cfg)) {
            moved.push(name.clone());
        }
    }
    lock.write(&path).map_err(GatewayError::Lockfile)?;
    Ok(moved)
}

#[cfg(test)]
mod tests {
    use super::*;
    use rmcp::model::{Implementation, ServerCapabilities, ServerConfig};
    use serde_json::Value;
    use toolgate_contract::{Approval, ServerFacts, tool_value};

    fn info(name: &str) -> Arc<ServerPeerInfo> {
        Arc::new(ServerPeerInfo::from(
            ServerConfig::new(ServerCapabilities::default())
                .with_server_info(Implementation::new(name, "1.0.0")),
        ))
    }

    fn tools() -> Vec<Tool> {
        vec![
            serde_json::from_value(json!({"name": "t", "inputSchema": {"type": "object"}}))
                .unwrap(),
        ]
    }

    fn identity(name: &str) -> ServerIdentity {
        ServerIdentity {
            command: Some(name.into()),
            ..Default::default()
        }
    }

    fn approve(dir: &Path, server: &str) {
        let path = dir.join(LOCKFILE);
        let mut lock = Lockfile::read(&path).unwrap();
        let values: Vec<Value> = tools().iter().map(tool_value).collect();
        lock.approve(
            server,
            &identity(server),
            &ServerFacts::from_peer_info(&info(server)),
            &values,
            None,
            &Approval::now("alice"),
        )
        .unwrap();
        lock.write(&path).unwrap();
    }

    #[tokio::test]
    async fn a_lockfile_change_read_while_checking_one_upstream_reaches_every_other() {
        let dir = tempfile::tempdir().unwrap();
        approve(dir.path(), "a");
        let pins = Arc::new(Pins::load(dir.path()).unwrap());
        let a = PinGuard::new("a", identity("a"), pins.clone());
        let b = PinGuard::new("b", identity("b"), pins.clone());
        a.check(info("a"), &tools()).await;
        b.check(info("b"), &tools()).await;
        assert!(a.allows("t").unwrap().is_some());
        assert!(
            b.allows("t")
                .unwrap_err()
                .to_string()
                .contains("new server")
        );

        approve(dir.path(), "b");
        // Upstream a is checked first and reads the new lockfile ...
        a.check(info("a"), &tools()).await;
        // ... b's verdict predates it, so b is re-checked on its next refusal or tools/list.
        assert!(b.stale());
        assert!(b.recheck_if_lock_changed(&tools()).await);
        assert!(b.allows("t").unwrap().is_some());
        assert!(
            !b.recheck_if_lock_changed(&tools()).await,
            "nothing changed since"
        );
    }

    #[tokio::test]
    async fn pin_records_are_stamped_by_the_attached_clock() {
        let dir = tempfile::tempdir().unwrap();
        approve(dir.path(), "a");
        let url = format!("sqlite://{}", dir.path().join("toolgate.db").display());
        let store = Store::connect(&url, toolgate_store::StoreConfig::default())
            .await
            .unwrap();
        let at = Timestamp::from_millis(1_780_000_000_000);
        let pins = Arc::new(Pins::load(dir.path()).unwrap());
        pins.attach_store(store.clone(), Arc::new(toolgate_core::FixedClock::at(at)));
        PinGuard::new("a", identity("a"), pins.clone())
            .check(info("a"), &tools())
            .await;
        PinGuard::new("b", identity("b"), pins)
            .check(info("b"), &tools())
            .await;
        let records = store.audit_records(None, None).await.unwrap();
        assert_eq!(records.len(), 2, "a pin record and a block record");
        assert!(records.iter().all(|r| r.body.ts == at), "{records:#?}");
    }

    #[test]
    fn pinning_off_serves_without_a_hash() {
        let g = PinGuard::new("a", identity("a"), Arc::new(Pins::off()));
        assert!(!g.unchecked());
        assert_eq!(g.allows("anything"), Ok(None));
    }
}
