//! Reads what an MCP server says about itself: the `initialize` answer, every page of
//! `tools/list`, and the names of its prompts and resources. Used by `toolgate audit`,
//! `toolgate lock` and `toolgate init`; the gateway has its own long-lived clients and calls
//! [`crate::PinSet::check_rmcp`] on what they read.

use std::path::PathBuf;
use std::time::Duration;

use rmcp::ServiceExt;
use rmcp::transport::{StreamableHttpClientTransport, TokioChildProcess};
use serde_json::Value;

use crate::ContractError;
use crate::definition::{ServerFacts, ServerIdentity, tool_value};

/// A server to reach: a command spawned over stdio, or a streamable-HTTP URL.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Target {
    Command {
        program: String,
        args: Vec<String>,
        /// Working directory of the child (relative programs resolve against it).
        dir: Option<PathBuf>,
        /// `Some(names)`: the child gets only these variables plus PATH, HOME, LANG and TMPDIR
        /// (as the gateway runs upstreams); `None`: it inherits the whole environment.
        env: Option<Vec<String>>,
    },
    Url(String),
}

impl Target {
    /// A target from command-line words: one `http(s)://` word is a URL, anything else a command.
    pub fn from_words(words: &[String]) -> Option<Target> {
        let (first, rest) = words.split_first()?;
        if rest.is_empty() && (first.starts_with("http://") || first.starts_with("https://")) {
            return Some(Target::Url(first.clone()));
        }
        Some(Target::Command {
            program: first.clone(),
            args: rest.to_vec(),
            dir: None,
            env: None,
        })
    }

    /// The identity recorded in a lockfile for this target.
    pub fn identity(&self, package: Option<String>) -> ServerIdentity {
        match self {
            Target::Command { program, args, .. } => ServerIdentity {
                command: Some(program.clone()),
                args: args.clone(),
                url: None,
                package,
            },
            Target::Url(u) => ServerIdentity {
                command: None,
                args: Vec::new(),
                url: Some(u.clone()),
                package,
            },
        }
    }

    pub fn describe(&self) -> String {
        self.identity(None).describe()
    }
}

/// What a server said: its `initialize` facts and its tools, as whole JSON objects.
#[derive(Debug, Clone)]
pub struct Observed {
    pub facts: ServerFacts,
    pub tools: Vec<Value>,
    /// The names of its prompts, when it offers any (`toolgate init` lists them for review).
    pub prompts: Vec<String>,
    /// The URIs of its resources, when it offers any.
    pub resources: Vec<String>,
}

/// Connects, reads `initialize` and all of `tools/list`, and disconnects (ending a child).
pub async fn observe(target: &Target, timeout: Duration) -> Result<Observed, ContractError> {
    let err = |message: String| ContractError::Server {
        target: target.describe(),
        message,
    };
    let work = async {
        let service = match target {
            Target::Url(url) => {
                let transport = StreamableHttpClientTransport::from_uri(url.as_str());
                ().serve(transport)
                    .await
                    .map_err(|e| err(format!("MCP handshake failed: {e}")))?
            }
            Target::Command {
                program,
                args,
                dir,
                env,
            } => {
                let mut cmd = tokio::process::Command::new(match dir {
                    Some(d) if program.contains('/') && !program.starts_with('/') => {
                        d.join(program).display().to_string()
                    }
                    _ => program.clone(),
                });
                cmd.args(args);
                if let Some(d) = dir {
                    cmd.current_dir(d);
                }
                if let Some(env) = env {
                    cmd.env_clear();
                    for name in ["PATH", "HOME", "LANG", "TMPDIR"]
                        .iter()
                        .copied()
                        .chain(env.iter().map(String::as_str))
                    {
                        if let Ok(v) = std::env::var(name) {
                            cmd.env(name, v);
                        }
                    }
                }
                let transport = TokioChildProcess::builder(cmd)
                    .stderr(std::process::Stdio::null())
                    .spawn()
                    .map(|(t, _)| t)
                    .map_err(|e| err(format!("cannot start `{program}`: {e}")))?;
                ().serve(transport)
                    .await
                    .map_err(|e| err(format!("MCP handshake failed: {e}")))?
            }
        };
        let facts = service
            .peer_info()
            .map(|i| ServerFacts::from_peer_info(&i))
            .unwrap_or_default();
        let caps = service.peer_info().map(|i| i.capabilities.clone());
        // Prompts and resources are read when offered; a server that fails to list them still
        // has its tools read (they are only listed for review).
        let mut prompts = Vec::new();
        let mut resources = Vec::new();
        if caps.as_ref().is_some_and(|c| c.prompts.is_some())
            && let Ok(list) = service.peer().list_all_prompts().await
        {
            prompts = list.into_iter().map(|p| p.name.to_string()).collect();
        }
        if caps.as_ref().is_some_and(|c| c.resources.is_some())
            && let Ok(list) = service.peer().list_all_resources().await
        {
            resources = list.into_iter().map(|r| r.uri.to_string()).collect();
        }
        let tools = service
            .peer()
            .list_all_tools()
            .await
            .map_err(|e| err(format!("tools/list failed: {e}")))?;
        let _ = service.cancel().await;
        Ok(Observed {
            facts,
            tools: tools.iter().map(tool_value).collect(),
            prompts,
            resources,
        })
    };
    tokio::time::timeout(timeout, work)
        .await
        .map_err(|_| err(format!("no answer within {} s", timeout.as_secs())))?
}
