//! `/metrics`: the surface numbers for Prometheus, kept as the audit chain grows rather than
//! recomputed from the whole log per scrape, with labels bounded by the registry, behind a
//! scrape token and, by default, answered only to this host. The design note beside this file
//! (`README.md`) says why the figures follow the chain's tail and what a scrape costs.

mod render;
mod tally;

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use axum::http::header::{AUTHORIZATION, CONTENT_TYPE, WWW_AUTHENTICATE};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use tokio::sync::Mutex;
use toolgate_core::config::MetricsConfig;
use toolgate_store::{Executor, StoreError};

use crate::auth::same_secret;
use crate::peer::Peer;
pub use render::Tables;
pub use tally::{MAX_OPEN_UNKNOWNS, MAX_RULES, OTHER, Tally, UNKNOWN, tool_label};

/// Records read from the chain per query while catching up.
const PAGE: u32 = 2000;

/// The shortest scrape token accepted.
pub const MIN_TOKEN_LEN: usize = 16;

/// Why a scrape token cannot be used: it is too short, or where `metrics:` points for it cannot
/// be read.
#[derive(Debug, thiserror::Error)]
pub enum ScrapeTokenError {
    #[error(
        "the scrape token has {chars} character(s); use at least {MIN_TOKEN_LEN} (e.g. `openssl rand -hex 32`)"
    )]
    TooShort { chars: usize },
    #[error(
        "metrics.token_file {}: {source}; write the scrape token there, or drop token_file to read ${token_env}",
        path.display()
    )]
    Unreadable {
        path: PathBuf,
        token_env: String,
        #[source]
        source: std::io::Error,
    },
    /// The token in `metrics.token_file` is unusable.
    #[error("metrics.token_file {}: {source}", path.display())]
    InFile {
        path: PathBuf,
        #[source]
        source: Box<ScrapeTokenError>,
    },
    /// The token in the environment variable `token_env` is unusable.
    #[error("${token_env}: {source}")]
    InEnv {
        token_env: String,
        #[source]
        source: Box<ScrapeTokenError>,
    },
}

/// The secret a scraper presents as `Authorization: Bearer <token>`.
#[derive(Clone)]
pub struct ScrapeToken(String);

impl std::fmt::Debug for ScrapeToken {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ScrapeToken(…)")
    }
}

impl ScrapeToken {
    /// A token of at least [`MIN_TOKEN_LEN`] characters (surrounding whitespace dropped).
    pub fn new(token: &str) -> Result<Self, ScrapeTokenError> {
        let t = token.trim();
        let chars = t.chars().count();
        if chars < MIN_TOKEN_LEN {
            return Err(ScrapeTokenError::TooShort { chars });
        }
        Ok(ScrapeToken(t.to_string()))
    }

    /// Whether the request carries this token as its bearer credential.
    fn admits(&self, headers: &HeaderMap) -> bool {
        headers
            .get(AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix("Bearer "))
            .is_some_and(|t| same_secret(t.trim(), &self.0))
    }

    /// The token `metrics:` in toolgate.yaml points at: `token_file` (relative to `dir`) when
    /// set, else the environment variable `token_env`. None when neither holds one.
    pub fn from_config(cfg: &MetricsConfig, dir: &Path) -> Result<Option<Self>, ScrapeTokenError> {
        if let Some(file) = &cfg.token_file {
            let path = dir.join(file);
            let text = match std::fs::read_to_string(&path) {
                Ok(text) => text,
                Err(source) => {
                    return Err(ScrapeTokenError::Unreadable {
                        path,
                        token_env: cfg.token_env.clone(),
                        source,
                    });
                }
            };
            return ScrapeToken::new(&text)
                .map(Some)
                .map_err(|e| ScrapeTokenError::InFile {
                    path,
                    source: Box::new(e),
                });
        }
        match std::env::var(&cfg.token_env) {
            Ok(v) if !v.trim().is_empty() => {
                ScrapeToken::new(&v)
                    .map(Some)
                    .map_err(|e| ScrapeTokenError::InEnv {
                        token_env: cfg.token_env.clone(),
                        source: Box::new(e),
                    })
            }
            _ => Ok(None),
        }
    }
}

/// Who may read `/metrics`, and how fresh the table-derived gauges are.
#[derive(Debug, Clone)]
pub struct MetricsOptions {
    /// None: no scrape is admitted (every one is answered 401).
    pub token: Option<ScrapeToken>,
    /// Admit peers that are not on this host. Off: only loopback peers, and never a request
    /// whose peer address the server did not record.
    pub allow_remote: bool,
    /// How long the figures read from mutable tables (approval requests per gate, today's
    /// budget counters) are reused before they are read again. Audit-derived counters are
    /// always brought up to the chain's last record.
    pub table_refresh: Duration,
    /// Scrapes are answered one at a time, at most one per this interval: a scraper asking
    /// faster waits (which costs nothing), so scrapers in a tight loop cannot take the CPU the
    /// governed calls need. A refused scrape is answered after the same delay.
    pub min_interval: Duration,
}

impl Default for MetricsOptions {
    fn default() -> Self {
        MetricsOptions {
            token: None,
            allow_remote: false,
            table_refresh: Duration::from_secs(5),
            min_interval: Duration::from_millis(100),
        }
    }
}

impl MetricsOptions {
    /// The options `metrics:` in toolgate.yaml gives. A token that cannot be read, or is too
    /// short, is logged and leaves `/metrics` closed (fail closed, the gateway still serves).
    pub fn from_config(cfg: &MetricsConfig, dir: &Path) -> Self {
        let token = match ScrapeToken::from_config(cfg, dir) {
            Ok(Some(t)) => Some(t),
            Ok(None) => {
                tracing::info!(
                    "/metrics is closed: no scrape token (set ${} or metrics.token_file)",
                    cfg.token_env
                );
                None
            }
            Err(e) => {
                tracing::error!(error = %e, "/metrics is closed: the scrape token is unusable");
                None
            }
        };
        MetricsOptions {
            token,
            allow_remote: cfg.allow_remote,
            ..MetricsOptions::default()
        }
    }
}

/// Why a scrape was not answered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    /// The peer is not on this host and `allow_remote` is off.
    NotLocal,
    /// No token is configured, so none can be right.
    NoToken,
    /// The request has no bearer token, or the wrong one.
    BadToken,
}

impl IntoResponse for Refusal {
    fn into_response(self) -> Response {
        let (status, text) = match self {
            Refusal::NotLocal => (
                StatusCode::FORBIDDEN,
                "/metrics answers scrapes from this host only; set metrics.allow_remote: true in toolgate.yaml to admit others\n",
            ),
            Refusal::NoToken => (
                StatusCode::UNAUTHORIZED,
                "/metrics needs a scrape token and none is configured: set $TOOLGATE_METRICS_TOKEN (or metrics.token_env / metrics.token_file) and present it as `Authorization: Bearer <token>`\n",
            ),
            Refusal::BadToken => (
                StatusCode::UNAUTHORIZED,
                "/metrics needs the scrape token as `Authorization: Bearer <token>`\n",
            ),
        };
        let mut r = (status, text).into_response();
        if status == StatusCode::UNAUTHORIZED {
            r.headers_mut().insert(
                WWW_AUTHENTICATE,
                axum::http::HeaderValue::from_static("Bearer realm=\"toolgate-metrics\""),
            );
        }
        r
    }
}

struct State {
    tally: Tally,
    tables: Option<(Instant, Tables)>,
    /// When the last page was rendered.
    rendered: Option<Instant>,
}

/// The aggregate behind `/metrics`, shared by every scrape of one process.
pub struct Metrics {
    opts: MetricsOptions,
    state: Mutex<State>,
}

impl Metrics {
    pub fn new(opts: MetricsOptions) -> Self {
        Metrics {
            opts,
            state: Mutex::new(State {
                tally: Tally::default(),
                tables: None,
                rendered: None,
            }),
        }
    }

    /// Admits a scrape from `peer` carrying `headers`, or says why not. Every admitted scrape
    /// is authenticated, so budgets and rule names only ever reach a holder of the token.
    pub fn admit(&self, peer: Peer, headers: &HeaderMap) -> Result<(), Refusal> {
        if !self.opts.allow_remote && !peer.is_loopback() {
            return Err(Refusal::NotLocal);
        }
        match &self.opts.token {
            None => Err(Refusal::NoToken),
            Some(t) if t.admits(headers) => Ok(()),
            Some(_) => Err(Refusal::BadToken),
        }
    }

    /// Brings the counters up to the chain's last record (reading only the records after the
    /// last one folded in), re-reads the tables when they are older than `table_refresh`, and
    /// renders the page. Concurrent scrapes wait for one another (one reads, the next finds
    /// nothing new), and each waits until `min_interval` has passed since the last page.
    pub async fn scrape(&self, exec: &Executor) -> Result<String, StoreError> {
        let mut st = self.state.lock().await;
        if let Some(at) = st.rendered {
            tokio::time::sleep_until((at + self.opts.min_interval).into()).await;
        }
        st.rendered = Some(Instant::now());
        loop {
            let page = exec.store.audit_after(st.tally.last_seq, PAGE).await?;
            for r in &page {
                st.tally.fold(&exec.registry, r);
            }
            if page.len() < PAGE as usize {
                break;
            }
        }
        let fresh = st
            .tables
            .as_ref()
            .is_some_and(|(at, _)| at.elapsed() < self.opts.table_refresh);
        if !fresh {
            let tables = Tables {
                gates: exec.store.gate_counts(exec.clock.now()).await?,
                approvers: exec.store.decisions_per_approver().await?,
                budgets: exec.store.budget_use(exec.clock.now()).await?,
                notifications: exec.store.notify_summary().await?,
            };
            st.tables = Some((Instant::now(), tables));
        }
        let tables = st.tables.as_ref().map(|(_, t)| t).expect("read above");
        Ok(render::render(&exec.registry, &st.tally, tables))
    }

    /// The counters as folded so far (for tests and benchmarks).
    pub async fn tally(&self) -> Tally {
        self.state.lock().await.tally.clone()
    }
}

/// The `/metrics` reply: the page, or why not.
pub async fn answer(m: &Metrics, exec: &Executor, peer: Peer, headers: &HeaderMap) -> Response {
    if let Err(r) = m.admit(peer, headers) {
        tokio::time::sleep(m.opts.min_interval).await;
        return r.into_response();
    }
    match m.scrape(exec).await {
        Ok(text) => (
            StatusCode::OK,
            [(CONTENT_TYPE, "text/plain; version=0.0.4; charset=utf-8")],
            text,
        )
            .into_response(),
        Err(e) => {
            tracing::error!(error = %e, "/metrics could not read the store");
            (
                StatusCode::SERVICE_UNAVAILABLE,
                "metrics unavailable: the store did not answer\n",
            )
                .into_response()
        }
    }
}
