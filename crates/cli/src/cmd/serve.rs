//! `toolgate serve`: the MCP gateway. Parsing only; everything else is in `toolgate_gateway`.

use crate::exit::Exit;
use std::io::Write;

use clap::ValueEnum;
use toolgate_gateway::{KeySource, LogFormat, OAuthOptions, ServeOptions};

use super::ConfigArg;

#[derive(Debug, Clone, Copy, ValueEnum)]
pub enum Format {
    Text,
    Json,
}

#[derive(clap::Args, Debug)]
pub struct Args {
    #[command(flatten)]
    pub config: ConfigArg,
    /// Serve streamable HTTP at ADDR (default: `server.http` from toolgate.yaml, loopback only).
    /// Given without --stdio, or when neither is given, HTTP is served.
    #[arg(long, value_name = "ADDR", num_args = 0..=1, default_missing_value = "")]
    pub http: Option<String>,
    /// Serve one client over stdin/stdout as the principal whose API key is in TOOLGATE_API_KEY.
    #[arg(long)]
    pub stdio: bool,
    /// Overrides `store.url` from toolgate.yaml.
    #[arg(
        long = "store",
        visible_alias = "store-url",
        value_name = "URL",
        env = "TOOLGATE_STORE_URL"
    )]
    pub store_url: Option<String>,
    /// Log lines as text or JSON (always on stderr).
    #[arg(long, value_enum, default_value = "text")]
    pub log_format: Format,
    /// Accept OAuth 2.1 access tokens (JWT) verified against this JWKS file or http(s):// URL.
    #[arg(long, value_name = "FILE|URL", env = "TOOLGATE_OAUTH_JWKS")]
    pub oauth_jwks: Option<String>,
    /// A PEM file of CA certificates trusted for an https:// --oauth-jwks URL, besides the system's.
    #[arg(long, value_name = "FILE", env = "TOOLGATE_OAUTH_JWKS_CA")]
    pub oauth_jwks_ca: Option<std::path::PathBuf>,
    /// The audience access tokens must carry (required with --oauth-jwks).
    #[arg(long, value_name = "AUD", env = "TOOLGATE_OAUTH_AUDIENCE")]
    pub oauth_audience: Option<String>,
    /// The issuer access tokens must carry.
    #[arg(long, value_name = "ISS", env = "TOOLGATE_OAUTH_ISSUER")]
    pub oauth_issuer: Option<String>,
    /// Authorization servers to list in the protected-resource metadata (repeatable).
    #[arg(long = "oauth-authorization-server", value_name = "URL")]
    pub oauth_authorization_servers: Vec<String>,
    /// The public URL of the MCP endpoint (overrides `server.public_url`).
    #[arg(long, value_name = "URL")]
    pub public_url: Option<String>,
    /// Do not reload when files in the registry folder change (SIGHUP and `toolgate reload`
    /// still reload it).
    #[arg(long)]
    pub no_watch: bool,
    /// Do not execute planned steps in this process. By default `serve` also works the plan
    /// queue: the steps of submitted plans, and a planned step as soon as a person approves it
    /// (on the page or with `toolgate approvals approve`), run here through every check, as
    /// `toolgate worker` runs them. Turn it off where dedicated `toolgate worker` processes
    /// share the store and should be the only ones calling upstreams for planned steps.
    /// Direct calls parked for approval are unaffected: the agent's retry runs them.
    #[arg(long)]
    pub no_worker: bool,
    /// Development only: start even without an approval key and a redaction key, using a
    /// random approval key (approvals die with the process and are not shared with other
    /// processes) and the public development redaction key (redacted values can be guessed
    /// back). Said at start and in /readyz. Without --dev a missing key refuses the start;
    /// docs/keys.md says how to provide them.
    #[arg(long)]
    pub dev: bool,
}

/// `--dev` or the configured keys.
pub fn key_source(dev: bool) -> KeySource {
    if dev {
        KeySource::Dev
    } else {
        KeySource::Configured
    }
}

pub fn run(args: &Args, _out: &mut dyn Write) -> anyhow::Result<Exit> {
    toolgate_gateway::init_logging(match args.log_format {
        Format::Text => LogFormat::Text,
        Format::Json => LogFormat::Json,
    });
    let oauth = match (&args.oauth_jwks, &args.oauth_audience) {
        (Some(jwks), Some(aud)) => Some(OAuthOptions {
            jwks: jwks.clone(),
            jwks_ca: args.oauth_jwks_ca.clone(),
            audience: aud.clone(),
            issuer: args.oauth_issuer.clone(),
            authorization_servers: args.oauth_authorization_servers.clone(),
        }),
        (Some(_), None) => {
            anyhow::bail!("--oauth-jwks needs --oauth-audience (this server's resource identifier)")
        }
        _ => None,
    };
    let opts = ServeOptions {
        config_dir: args.config.dir.clone(),
        http: args.http.is_some() || !args.stdio,
        http_addr: args.http.clone().filter(|a| !a.is_empty()),
        stdio: args.stdio,
        stdio_api_key: std::env::var("TOOLGATE_API_KEY").ok(),
        store_url: args.store_url.clone(),
        oauth,
        public_url: args.public_url.clone(),
        no_watch: args.no_watch,
        no_worker: args.no_worker,
        keys: key_source(args.dev),
    };
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    rt.block_on(toolgate_gateway::serve(opts))?;
    Ok(Exit::Success)
}
