//! Starting and stopping: load the registry, open (and migrate) the store, connect the
//! upstreams, then serve MCP over streamable HTTP and/or stdio until SIGINT or SIGTERM (or, on
//! stdio, until the client closes), working the plan queue in the same process unless told not
//! to, and stop cleanly: in-flight calls and the batch of planned steps in hand finish and are
//! recorded, the store's pending group commits are flushed, upstream children are asked to exit.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use tokio_util::sync::CancellationToken;
use toolgate_core::config::Durability;
use toolgate_core::{Clock, Redactor, Registry, SystemClock};
use toolgate_store::{Executor, Store, StoreConfig};

use crate::auth::{Authenticator, Caller, CredentialKind};
use crate::error::GatewayError;
use crate::http::{HttpState, router};
use crate::jwt::{JwtVerifier, OAuthOptions};
use crate::keys::{KeySource, KeyStatus, Secrets};
use crate::pins::Pins;
use crate::reload::Reloader;
use crate::server::{GatewayServer, GatewayState};
use crate::upstream::{ToolsChangedHook, Upstreams};

/// What `toolgate serve` was asked to do.
#[derive(Debug, Clone, Default)]
pub struct ServeOptions {
    /// The registry folder.
    pub config_dir: PathBuf,
    /// Serve streamable HTTP. The address is `http_addr`, or `server.http` from toolgate.yaml.
    pub http: bool,
    pub http_addr: Option<String>,
    /// Serve one client over stdin/stdout, as the principal holding `stdio_api_key`.
    pub stdio: bool,
    pub stdio_api_key: Option<String>,
    /// Overrides `store.url` from toolgate.yaml.
    pub store_url: Option<String>,
    /// Accept OAuth access tokens (JWT) verified against this JWKS.
    pub oauth: Option<OAuthOptions>,
    /// Overrides `server.public_url` (the resource identifier in OAuth metadata).
    pub public_url: Option<String>,
    /// Do not watch the registry folder for changes (SIGHUP and `toolgate reload` still work).
    pub no_watch: bool,
    /// Do not work the plan queue in this process: approved and submitted planned steps are
    /// left to `toolgate worker` processes (a deployment that runs dedicated workers).
    pub no_worker: bool,
    /// Where the approval and redaction keys come from (configured ones by default: missing
    /// keys refuse the start).
    pub keys: KeySource,
}

/// A loaded gateway: registry, store, executor, upstreams, authenticator.
pub struct Gateway {
    pub state: Arc<GatewayState>,
    pub auth: Arc<Authenticator>,
    pub dir: PathBuf,
    /// Loads, validates and swaps registry versions (hot reload).
    pub reloader: Arc<Reloader>,
    /// Which of the process's keys are development keys (`--dev`).
    pub keys: KeyStatus,
    oauth: Option<OAuthOptions>,
    public_url: Option<String>,
}

/// Resolves a relative SQLite path against the registry folder, so the database lives beside
/// the registry whatever the working directory.
pub fn resolve_store_url(dir: &Path, url: &str) -> String {
    let Some(rest) = url
        .strip_prefix("sqlite://")
        .or_else(|| url.strip_prefix("sqlite:"))
    else {
        return url.to_string();
    };
    let (path, query) = match rest.split_once('?') {
        Some((p, q)) => (p, Some(q)),
        None => (rest, None),
    };
    if path.is_empty() || path.starts_with('/') || path.starts_with(':') {
        return url.to_string();
    }
    let abs = dir.join(path);
    match query {
        Some(q) => format!("sqlite://{}?{q}", abs.display()),
        None => format!("sqlite://{}", abs.display()),
    }
}

/// The store configuration a registry implies: retention, approval expiry, durability. The
/// CLI opens the store with it too, so `trace` and `log` read what `serve` wrote; its redactor
/// is the store's development one, because none of those commands redacts anything (they read
/// records, or record approval decisions, which carry no inputs). A process that redacts sets
/// its configured key: [`store_config`].
pub fn registry_store_config(registry: &Registry) -> StoreConfig {
    let g = &registry.gateway;
    StoreConfig {
        idempotency_retention_hours: g.idempotency.retention_hours,
        approval_expiry_hours: g.approvals.expiry_hours,
        durability: g.store.durability,
        ..StoreConfig::default()
    }
}

/// The store configuration of a long-running process (`serve`, `worker`), with its redactor.
pub(crate) fn store_config(
    registry: &Registry,
    upstreams: &Upstreams,
    redactor: Redactor,
) -> StoreConfig {
    StoreConfig {
        // The upstream's own timeout fires first; this is the backstop.
        call_timeout: upstreams.max_timeout() + Duration::from_secs(1),
        wal_preallocate: registry.gateway.store.wal_preallocate_mb << 20,
        redactor,
        ..registry_store_config(registry)
    }
}

/// Resolves the process's keys before anything else starts (no store opened, no upstream
/// spawned), and logs where they came from.
pub(crate) fn resolve_keys(
    registry: &Registry,
    source: &KeySource,
) -> Result<Secrets, GatewayError> {
    let secrets = source.resolve(registry)?;
    for note in &secrets.notes {
        tracing::warn!("{note}");
    }
    if secrets.status.is_dev() {
        tracing::warn!(keys = %secrets.origin, "--dev: running with development keys");
    } else {
        tracing::info!(keys = %secrets.origin, "keys loaded");
    }
    Ok(secrets)
}

impl Gateway {
    /// Loads everything `opts` names and connects the upstreams (an upstream that cannot be
    /// reached is logged, reported by `/readyz`, and retried on its first call).
    pub async fn build(opts: &ServeOptions) -> Result<Gateway, GatewayError> {
        Self::build_with_hook(opts, None).await
    }

    /// As [`Gateway::build`], with a hook told when an upstream's `tools/list` changes.
    pub async fn build_with_hook(
        opts: &ServeOptions,
        hook: Option<ToolsChangedHook>,
    ) -> Result<Gateway, GatewayError> {
        let pins = Pins::load(&opts.config_dir).map_err(GatewayError::Lockfile)?;
        Self::build_pinned(opts, hook, Arc::new(pins)).await
    }

    /// As [`Gateway::build`] with no pin check at all: upstream tools are served as listed.
    /// Only for measuring what pinning costs (the gateway benchmark's `--no-pin`).
    pub async fn build_without_pins(opts: &ServeOptions) -> Result<Gateway, GatewayError> {
        Self::build_pinned(opts, None, Arc::new(Pins::off())).await
    }

    async fn build_pinned(
        opts: &ServeOptions,
        hook: Option<ToolsChangedHook>,
        pins: Arc<Pins>,
    ) -> Result<Gateway, GatewayError> {
        let dir = opts.config_dir.clone();
        let registry = Arc::new(
            Registry::load(&dir).map_err(|source| GatewayError::Registry {
                dir: dir.clone(),
                source,
            })?,
        );
        let secrets = resolve_keys(&registry, &opts.keys)?;
        crate::reload::log_review(&registry);
        let upstreams = Arc::new(Upstreams::new(
            &dir,
            &registry.gateway.upstreams,
            hook,
            pins.clone(),
        ));
        let url = resolve_store_url(
            &dir,
            opts.store_url
                .as_deref()
                .unwrap_or(&registry.gateway.store.url),
        );
        let store = Store::connect(
            &url,
            store_config(&registry, &upstreams, secrets.redactor.clone()),
        )
        .await
        .map_err(|source| GatewayError::Store {
            url: url.clone(),
            source,
        })?;
        let durability = store.config().durability;
        tracing::info!(store = %url, registry = %registry.version.label, durability = durability.as_str(), "store open, migrations applied");
        if durability == Durability::Process {
            tracing::warn!(
                "store.durability is process: acknowledged records survive this process being \
                 killed, not a power loss (commits are flushed to the disk later, not one by one)"
            );
        }
        // One clock for the executor's decisions and the pin records alike.
        let clock: Arc<dyn Clock> = Arc::new(SystemClock);
        pins.attach_store(store.clone(), clock.clone());
        let failed = upstreams.connect_all().await;
        for (name, why) in &failed {
            tracing::warn!(upstream = %name, error = %why, "serving without this upstream for now");
        }
        let executor = Executor::new(
            store,
            registry.clone(),
            Arc::new(secrets.approval),
            upstreams.clone(),
            clock,
        );
        let jwt = match &opts.oauth {
            Some(o) => Some(JwtVerifier::load(o).await.map_err(GatewayError::OAuth)?),
            None => None,
        };
        let public_url = opts
            .public_url
            .clone()
            .or_else(|| registry.gateway.server.public_url.clone());
        let metadata_url = match &public_url {
            Some(u) => metadata_url_for(u),
            None => format!(
                "http://{}/.well-known/oauth-protected-resource",
                opts.http_addr
                    .as_deref()
                    .unwrap_or(&registry.gateway.server.http)
            ),
        };
        let auth = Arc::new(Authenticator::new(jwt, metadata_url));
        let state = Arc::new(GatewayState::new(executor, upstreams));
        let reloader = Reloader::new(dir.clone(), state.clone());
        Ok(Gateway {
            state,
            auth,
            reloader,
            dir,
            keys: secrets.status,
            oauth: opts.oauth.clone(),
            public_url,
        })
    }

    /// For test environments, benchmarks and the demo: builds the gateway for a copied
    /// registry folder whose upstreams were moved to loopback URLs (the pinned identities in
    /// its `toolgate.lock` move with them; every definition is still checked), and serves HTTP
    /// on a free loopback port until `shutdown`. Returns the gateway and its MCP URL. Keys as
    /// with `--dev`: the configured ones where set, development keys for the rest (its
    /// `keys` says which).
    pub async fn start_loopback(
        dir: &Path,
        shutdown: CancellationToken,
    ) -> Result<(Gateway, String), GatewayError> {
        crate::pins::rehome_lock(dir)?;
        let opts = ServeOptions {
            config_dir: dir.to_path_buf(),
            http: true,
            keys: KeySource::Dev,
            ..ServeOptions::default()
        };
        let gateway = Gateway::build(&opts).await?;
        let (addr, serving) = gateway.bind_http("127.0.0.1:0", shutdown).await?;
        tokio::spawn(serving);
        Ok((gateway, format!("http://{addr}/mcp")))
    }

    /// Binds the HTTP listener (port 0 picks a free port) and returns its address and the
    /// server future, which runs until `shutdown` is cancelled.
    pub async fn bind_http(
        &self,
        addr: &str,
        shutdown: CancellationToken,
    ) -> Result<
        (
            SocketAddr,
            impl Future<Output = std::io::Result<()>> + use<>,
        ),
        GatewayError,
    > {
        let listener = tokio::net::TcpListener::bind(addr)
            .await
            .map_err(|source| GatewayError::Bind {
                addr: addr.to_string(),
                source,
            })?;
        let local = listener.local_addr()?;
        let app = self.http_app(local, shutdown.clone());
        tracing::info!(addr = %local, "serving MCP over streamable HTTP at http://{local}/mcp");
        // Connections are served on threads of their own (`crate::lanes`), one for each worker
        // thread of this runtime. Each request carries its peer's address: /metrics answers
        // loopback peers only, sign-in throttles per source.
        let threads = tokio::runtime::Handle::current().metrics().num_workers();
        let fut = crate::lanes::serve(listener, app, shutdown, threads);
        Ok((local, fut))
    }

    /// The HTTP application served at `local` (its address names the resource and the `Host`
    /// values accepted): what [`Gateway::bind_http`] serves, for driving in process (the HTTP
    /// surface's fuzz target). Handlers that read the peer's address need
    /// `ConnectInfo<SocketAddr>` on each request, as `bind_http` provides.
    pub fn http_app(&self, local: SocketAddr, shutdown: CancellationToken) -> axum::Router {
        let resource = self
            .public_url
            .clone()
            .unwrap_or_else(|| format!("http://{local}/mcp"));
        let mut hosts: Vec<String> = vec!["localhost".into(), "127.0.0.1".into(), "::1".into()];
        hosts.push(local.ip().to_string());
        hosts.push(local.to_string());
        hosts.push(format!("localhost:{}", local.port()));
        if let Some(h) = self.public_url.as_deref().and_then(host_of) {
            hosts.push(h);
        }
        let state = HttpState {
            gateway: self.state.clone(),
            auth: self.auth.clone(),
            resource,
            authorization_servers: self
                .oauth
                .as_ref()
                .map(|o| o.authorization_servers.clone())
                .unwrap_or_default(),
            keys: self.keys,
        };
        router(state, hosts, shutdown)
    }

    /// The stdio caller: the principal holding `key`.
    pub fn stdio_caller(&self, key: Option<&str>) -> Result<Caller, GatewayError> {
        let key = key.filter(|k| !k.is_empty()).ok_or_else(|| {
            GatewayError::Stdio(
                "set TOOLGATE_API_KEY to the API key of the principal to serve".into(),
            )
        })?;
        let mut c = self
            .auth
            .by_api_key(&self.state.registry(), key)
            .ok_or_else(|| {
                GatewayError::Stdio(
                    "TOOLGATE_API_KEY matches no credential in principals.yaml".into(),
                )
            })?;
        c.credential = CredentialKind::Stdio;
        Ok(c)
    }

    /// Serves one client over stdin/stdout until it disconnects or `shutdown` is cancelled (a
    /// plain `tools/call` on the lean stdio path, everything else through rmcp: [`crate::stdio`]).
    pub async fn serve_stdio(
        &self,
        caller: Caller,
        shutdown: CancellationToken,
    ) -> Result<(), GatewayError> {
        let (input, output) = crate::stdio::process_stdio();
        self.serve_stdio_on(caller, input, output, shutdown).await
    }

    /// As [`Gateway::serve_stdio`], on `input` and `output` instead of this process's stdin and
    /// stdout (an in-memory pipe in tests).
    pub async fn serve_stdio_on(
        &self,
        caller: Caller,
        input: impl tokio::io::AsyncRead + Send + Unpin + 'static,
        output: impl tokio::io::AsyncWrite + Send + 'static,
        shutdown: CancellationToken,
    ) -> Result<(), GatewayError> {
        tracing::info!(principal = %caller.principal, role = %caller.role, "serving MCP over stdio");
        let server = GatewayServer::new(self.state.clone(), Some(caller.clone()));
        // On a worker thread of the runtime (not the thread that may be blocking on `serve`), so
        // the calls it spawns start on the thread that read them.
        let serving = crate::stdio::serve(server, caller, input, output, shutdown);
        tokio::spawn(serving)
            .await
            .unwrap_or_else(|e| Err(GatewayError::Stdio(format!("the stdio task failed: {e}"))))
    }

    /// Works the plan queue under the serving registry version until `stop` is cancelled, as
    /// `toolgate serve` does in its own process (see `--no-worker`): reloads are followed, and
    /// the batch in hand finishes before it returns.
    pub async fn work_plans(&self, stop: CancellationToken) -> toolgate_store::WorkStats {
        crate::worker::work_in_gateway(self.state.clone(), stop).await
    }

    /// Starts announcing raised approval requests to the `approvals.notify` webhooks, with
    /// links to the page under the public URL or `served` (the HTTP address), until `shutdown`.
    pub fn spawn_notifier(&self, served: &str, shutdown: CancellationToken) {
        let state = self.state.clone();
        let base = crate::notify::item_base(self.public_url.as_deref(), served);
        tokio::spawn(crate::notify::run(move || state.executor(), base, shutdown));
    }

    /// Closes the upstreams and the store.
    pub async fn close(&self) {
        self.state.upstreams.close().await;
        self.state.store.close().await;
    }
}

fn metadata_url_for(public_url: &str) -> String {
    // RFC 9728: the well-known path is inserted between the host and the resource's path.
    match public_url.find("://").map(|i| i + 3) {
        Some(start) => {
            let rest = &public_url[start..];
            let (host, path) = match rest.find('/') {
                Some(i) => (&rest[..i], &rest[i..]),
                None => (rest, ""),
            };
            format!(
                "{}{host}/.well-known/oauth-protected-resource{}",
                &public_url[..start],
                path.trim_end_matches('/')
            )
        }
        None => public_url.to_string(),
    }
}

fn host_of(url: &str) -> Option<String> {
    let rest = &url[url.find("://")? + 3..];
    let authority = rest.split('/').next()?;
    Some(authority.to_string())
}

/// Resolves when SIGINT or SIGTERM arrives.
pub(crate) async fn signal() {
    let ctrl_c = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    #[cfg(unix)]
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    #[cfg(not(unix))]
    let term = std::future::pending::<()>();
    tokio::select! { _ = ctrl_c => {}, _ = term => {} }
}

/// `toolgate serve`: builds the gateway from `opts` and serves until a signal (or, with stdio,
/// until the client disconnects).
pub async fn serve(opts: ServeOptions) -> Result<(), GatewayError> {
    if !opts.http && !opts.stdio {
        return Err(GatewayError::NoTransport);
    }
    let gw = Gateway::build(&opts).await?;
    if let Some(warning) = gw.keys.warning() {
        eprintln!("{warning}");
    }
    let shutdown = CancellationToken::new();
    // Hot reload: SIGHUP (what `toolgate reload` sends), the folder watch, and the status file
    // `toolgate status` and `toolgate reload` read.
    gw.reloader.keep_status_file();
    gw.reloader.on_sighup(shutdown.clone());
    if !opts.no_watch
        && let Err(e) = gw.reloader.watch(shutdown.clone())
    {
        tracing::warn!(error = %e, "cannot watch the registry folder: reload with SIGHUP or `toolgate reload`");
    }
    {
        let s = shutdown.clone();
        tokio::spawn(async move {
            signal().await;
            tracing::info!("shutting down: finishing in-flight calls");
            s.cancel();
        });
    }
    // Recovery and the reconciler, for direct calls (and planned steps, alongside any
    // `toolgate worker`): a call whose process died mid-call is settled once its lease has run
    // out (for a direct call, its timeout and two seconds) — its allow decision goes into the
    // chain, and a write or irreversible call becomes `unknown` — and each `unknown` call is
    // settled by asking the target by key, read tools only, under the current registry. An
    // agent retrying the same call meanwhile hears "in progress" or "unknown for now", then the
    // settled outcome. Recovery looks every second (an indexed query that finds nothing almost
    // always); the reconciler asks the targets every five seconds, and at once after recovery.
    {
        let (state, s) = (gw.state.clone(), shutdown.clone());
        tokio::spawn(async move {
            let mut last_reconcile = std::time::Instant::now();
            loop {
                tokio::select! {
                    _ = s.cancelled() => break,
                    _ = tokio::time::sleep(std::time::Duration::from_secs(1)) => {}
                }
                let ex = state.executor();
                let recovered = match ex.recover_stale().await {
                    Ok(r) => {
                        if !r.is_empty() {
                            tracing::warn!(
                                settled = r.len(),
                                "recovered calls whose process stopped mid-call"
                            );
                        }
                        r.len()
                    }
                    Err(e) => {
                        tracing::warn!(error = %e, "recovering stale calls failed");
                        0
                    }
                };
                if recovered == 0 && last_reconcile.elapsed() < std::time::Duration::from_secs(5) {
                    continue;
                }
                last_reconcile = std::time::Instant::now();
                match ex.reconcile().await {
                    Ok(r) if !r.is_empty() => {
                        tracing::info!(settled = r.len(), "reconciled unknown steps")
                    }
                    Ok(_) => {}
                    Err(e) => tracing::warn!(error = %e, "reconciling unknown steps failed"),
                }
            }
        });
    }
    let stdio_caller = if opts.stdio {
        Some(gw.stdio_caller(opts.stdio_api_key.as_deref())?)
    } else {
        None
    };
    let http = if opts.http {
        let addr = opts
            .http_addr
            .clone()
            .unwrap_or_else(|| gw.state.registry().gateway.server.http.clone());
        let (local, fut) = gw.bind_http(&addr, shutdown.clone()).await?;
        gw.reloader.set_http(format!("http://{local}/mcp"));
        gw.spawn_notifier(&local.to_string(), shutdown.clone());
        Some(tokio::spawn(fut))
    } else {
        let served = gw.state.registry().gateway.server.http.clone();
        gw.spawn_notifier(&served, shutdown.clone());
        None
    };
    // The plan queue: submitted and approved planned steps run here, as a `toolgate worker`
    // would run them (any number of workers may share the store; a claim is taken once).
    let plan_worker = (!opts.no_worker).then(|| {
        tokio::spawn(crate::worker::work_in_gateway(
            gw.state.clone(),
            shutdown.clone(),
        ))
    });
    if let Some(caller) = stdio_caller {
        let r = gw.serve_stdio(caller, shutdown.clone()).await;
        if http.is_none() {
            shutdown.cancel();
        }
        r?;
    }
    if let Some(h) = http {
        match h.await {
            Ok(r) => r?,
            Err(e) => tracing::error!(error = %e, "the HTTP server task failed"),
        }
    }
    if let Some(w) = plan_worker {
        // The batch in hand finishes and is recorded before the store closes.
        shutdown.cancel();
        if let Err(e) = w.await {
            tracing::error!(error = %e, "the plan worker task failed");
        }
    }
    gw.reloader.clear_status();
    gw.close().await;
    tracing::info!("stopped");
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn relative_sqlite_paths_live_beside_the_registry() {
        let d = Path::new("/etc/tg");
        assert_eq!(
            resolve_store_url(d, "sqlite://t.db"),
            "sqlite:///etc/tg/t.db"
        );
        assert_eq!(
            resolve_store_url(d, "sqlite://t.db?mode=rwc"),
            "sqlite:///etc/tg/t.db?mode=rwc"
        );
        assert_eq!(resolve_store_url(d, "sqlite:///abs.db"), "sqlite:///abs.db");
        assert_eq!(resolve_store_url(d, "sqlite::memory:"), "sqlite::memory:");
        assert_eq!(resolve_store_url(d, "postgres://x/y"), "postgres://x/y");
    }

    #[test]
    fn metadata_url_inserts_the_well_known_path() {
        assert_eq!(
            metadata_url_for("https://gw.example.com/mcp"),
            "https://gw.example.com/.well-known/oauth-protected-resource/mcp"
        );
        assert_eq!(
            metadata_url_for("https://gw.example.com"),
            "https://gw.example.com/.well-known/oauth-protected-resource"
        );
    }
}
