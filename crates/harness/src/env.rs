//! An example registry brought up for real: its folder copied to a temporary directory, each
//! upstream replaced by the matching fake served in-process over streamable HTTP, a store (a
//! fresh SQLite file unless a URL is given) and the gateway on a free loopback port.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::{Context, bail};
use rmcp::model::{
    CallToolRequestParams, CallToolResult, JsonObject, MetaObject, RequestMetaObject, Tool,
};
use rmcp::service::RunningService;
use rmcp::transport::streamable_http_client::StreamableHttpClientTransportConfig;
use rmcp::transport::streamable_http_server::session::local::LocalSessionManager;
use rmcp::transport::{
    StreamableHttpClientTransport, StreamableHttpServerConfig, StreamableHttpService,
};
use rmcp::{RoleClient, ServiceExt};
use serde_json::Value;
use tokio_util::sync::CancellationToken;
use toolgate_fakes::record::{Record, read_records};
use toolgate_fakes::{FakeServer, FaultPlan, FaultSpec, Recorder};
use toolgate_gateway::Gateway;

/// A running example: fakes, store and gateway.
pub struct Environment {
    pub dir: tempfile::TempDir,
    pub url: String,
    pub gateway: Gateway,
    records: Vec<(String, PathBuf)>,
    stop: CancellationToken,
}

/// An MCP client connected to the gateway with one principal's credential.
pub struct Client {
    service: RunningService<RoleClient, ()>,
}

fn copy_dir(from: &Path, to: &Path) -> std::io::Result<()> {
    std::fs::create_dir_all(to)?;
    for e in std::fs::read_dir(from)? {
        let e = e?;
        let dest = to.join(e.file_name());
        if e.file_type()?.is_dir() {
            copy_dir(&e.path(), &dest)?;
        } else if e.path().extension().is_none_or(|x| x != "db") {
            std::fs::copy(e.path(), dest)?;
        }
    }
    Ok(())
}

/// Serves a fake domain over streamable HTTP on a free loopback port.
async fn serve_fake<D: toolgate_fakes::Domain>(
    domain: D,
    record: &Path,
    faults: Vec<FaultSpec>,
    stop: CancellationToken,
) -> anyhow::Result<SocketAddr> {
    let server = FakeServer::new(
        domain,
        Recorder::to_file(record)?,
        FaultPlan::new(faults, 1),
    );
    let service = StreamableHttpService::new(
        move || Ok(server.clone()),
        Arc::new(LocalSessionManager::default()),
        StreamableHttpServerConfig::default().with_cancellation_token(stop.clone()),
    );
    let app = axum::Router::new().nest_service("/mcp", service);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    tokio::spawn(async move {
        let _ = axum::serve(listener, app)
            .with_graceful_shutdown(async move { stop.cancelled().await })
            .await;
    });
    Ok(addr)
}

impl Environment {
    /// Brings up the registry folder `example` (e.g. `examples/finance`). `store_url` replaces
    /// the registry's store (default: a SQLite file in the temporary folder).
    pub async fn start(
        example: &Path,
        store_url: Option<&str>,
        faults: Vec<FaultSpec>,
    ) -> anyhow::Result<Self> {
        Self::start_with(example, store_url, faults, |_| Ok(())).await
    }

    /// As [`Environment::start`], letting `prepare` change the copied registry folder first
    /// (the eval runner adds its own credentials and principals this way).
    pub async fn start_with(
        example: &Path,
        store_url: Option<&str>,
        faults: Vec<FaultSpec>,
        prepare: impl FnOnce(&Path) -> anyhow::Result<()>,
    ) -> anyhow::Result<Self> {
        let dir = tempfile::tempdir()?;
        copy_dir(example, dir.path()).with_context(|| format!("copying {}", example.display()))?;
        prepare(dir.path())?;
        let top = dir.path().join("toolgate.yaml");
        let mut config: Value = yaml_serde::from_str(&std::fs::read_to_string(&top)?)?;
        let stop = CancellationToken::new();
        let mut records = Vec::new();
        let upstreams = config
            .get_mut("upstreams")
            .and_then(Value::as_object_mut)
            .context("the example declares no upstreams")?;
        for (name, up) in upstreams.iter_mut() {
            let command = up
                .get("command")
                .and_then(Value::as_str)
                .unwrap_or_default();
            let record = dir.path().join(format!("{name}-calls.jsonl"));
            let addr = match command {
                "toolgate-fake-finance" => {
                    serve_fake(
                        toolgate_fakes::finance::Finance::seeded(),
                        &record,
                        faults.clone(),
                        stop.clone(),
                    )
                    .await?
                }
                "toolgate-fake-field" => {
                    serve_fake(
                        toolgate_fakes::field::Field::seeded(),
                        &record,
                        faults.clone(),
                        stop.clone(),
                    )
                    .await?
                }
                other => bail!("upstream '{name}' runs '{other}', which has no in-process fake"),
            };
            let package = up.get("package").cloned().unwrap_or(Value::Null);
            *up = serde_json::json!({"url": format!("http://{addr}/mcp"), "package": package, "timeout_secs": 5});
            records.push((name.clone(), record));
        }
        let store = store_url
            .map(str::to_string)
            .unwrap_or_else(|| format!("sqlite://{}", dir.path().join("toolgate.db").display()));
        config["store"] = serde_json::json!({"url": store});
        std::fs::write(&top, yaml_serde::to_string(&config)?)?;
        // The example's toolgate.lock pins each upstream as reached by its command; here the
        // same fake is reached at a loopback URL, so only the pinned identity moves with it.
        let (gateway, url) = Gateway::start_loopback(dir.path(), stop.clone())
            .await
            .context("starting the gateway")?;
        Ok(Environment {
            url,
            dir,
            gateway,
            records,
            stop,
        })
    }

    /// A client holding `api_key`.
    pub async fn client(&self, api_key: &str) -> anyhow::Result<Client> {
        let transport = StreamableHttpClientTransport::from_config(
            StreamableHttpClientTransportConfig::with_uri(self.url.as_str()).auth_header(api_key),
        );
        let service = ().serve(transport).await.context("connecting to the gateway")?;
        Ok(Client { service })
    }

    /// Every delivery the fake behind upstream `name` received.
    pub fn upstream_calls(&self, name: &str) -> Vec<Record> {
        self.records
            .iter()
            .filter(|(n, _)| n == name)
            .flat_map(|(_, p)| {
                if p.exists() {
                    read_records(p).unwrap_or_default()
                } else {
                    Vec::new()
                }
            })
            .collect()
    }

    /// Every delivery any fake received.
    pub fn all_upstream_calls(&self) -> Vec<Record> {
        self.records
            .iter()
            .flat_map(|(_, p)| {
                if p.exists() {
                    read_records(p).unwrap_or_default()
                } else {
                    Vec::new()
                }
            })
            .collect()
    }

    pub fn store(&self) -> &toolgate_store::Store {
        &self.gateway.state.store
    }

    pub async fn shutdown(self) {
        self.shutdown_keep(false).await;
    }

    /// Stops everything; with `keep`, the temporary folder (registry copy, store, call records)
    /// stays on disk so `toolgate trace` and `log verify` can read it afterwards.
    pub async fn shutdown_keep(self, keep: bool) {
        self.stop.cancel();
        self.gateway.close().await;
        if keep {
            let _ = self.dir.keep();
        }
    }
}

impl Client {
    pub async fn list_tools(&self) -> anyhow::Result<Vec<Tool>> {
        Ok(self.service.peer().list_all_tools().await?)
    }

    /// Calls a tool with `_meta` (purpose, reason, run_id, …). A protocol error is an `Err`; a
    /// refusal is an `Ok` result with `is_error`.
    pub async fn call(
        &self,
        tool: &str,
        args: Value,
        meta: Value,
    ) -> anyhow::Result<CallToolResult> {
        let Value::Object(args) = args else {
            bail!("arguments must be an object")
        };
        let mut p = CallToolRequestParams::new(tool.to_string()).with_arguments(args);
        if let Value::Object(m) = meta {
            p.meta = Some(RequestMetaObject(MetaObject(m)));
        }
        Ok(self.service.peer().call_tool(p).await?)
    }

    pub async fn close(self) {
        let _ = self.service.cancel().await;
    }
}

/// The text of a result's first text block.
pub fn text_of(r: &CallToolResult) -> String {
    r.content
        .iter()
        .find_map(|c| c.as_text().map(|t| t.text.clone()))
        .unwrap_or_default()
}

/// The `_meta` of a result as JSON (toolgate puts its decision there).
pub fn meta_of(r: &CallToolResult) -> Value {
    r.meta
        .as_ref()
        .map(|m| Value::Object(m.0.clone()))
        .unwrap_or(Value::Null)
}

#[allow(dead_code)]
fn object(v: Value) -> JsonObject {
    match v {
        Value::Object(m) => m,
        _ => JsonObject::new(),
    }
}
