//! Prompts and resources of upstream servers pass through only when `toolgate.yaml` lists them
//! (`prompts:` by name, `resources:` by exact URI, per upstream). Everything else an upstream
//! offers is neither listed nor fetched, and asking for it gets the answer an unknown prompt or
//! resource gets. Any authenticated caller may use what is listed; each use is logged with the
//! principal. Tools never come through here: they are the registry's own.

use rmcp::ErrorData;
use rmcp::model::{
    GetPromptRequestParams, GetPromptResult, ListPromptsResult, ListResourcesResult,
    ReadResourceRequestParams, ReadResourceResult,
};
use toolgate_core::Registry;

use crate::auth::Caller;
use crate::upstream::Upstreams;

/// Whether any upstream lists prompts, and whether any lists resources.
pub fn declared(registry: &Registry) -> (bool, bool) {
    let ups = registry.gateway.upstreams.values();
    let prompts = ups.clone().any(|u| !u.prompts.is_empty());
    let resources = ups.clone().any(|u| !u.resources.is_empty());
    (prompts, resources)
}

fn unknown_prompt(name: &str) -> ErrorData {
    ErrorData::invalid_params(format!("prompt '{name}' not found"), None)
}

fn unknown_resource(uri: &str) -> ErrorData {
    ErrorData::resource_not_found(format!("resource '{uri}' not found"), None)
}

fn upstream_failed(upstream: &str, e: impl std::fmt::Display) -> ErrorData {
    ErrorData::internal_error(format!("upstream '{upstream}' failed: {e}"), None)
}

/// The listed prompts of every upstream that lists any.
pub async fn list_prompts(
    registry: &Registry,
    upstreams: &Upstreams,
    caller: &Caller,
) -> Result<ListPromptsResult, ErrorData> {
    let mut out = Vec::new();
    for (name, cfg) in &registry.gateway.upstreams {
        if cfg.prompts.is_empty() {
            continue;
        }
        let peer = match upstreams.peer(name).await {
            Ok(p) => p,
            Err(e) => {
                tracing::warn!(upstream = %name, error = %e, "prompts/list: upstream unavailable");
                continue;
            }
        };
        let prompts = peer
            .list_all_prompts()
            .await
            .map_err(|e| upstream_failed(name, e))?;
        out.extend(
            prompts
                .into_iter()
                .filter(|p| cfg.prompts.iter().any(|n| n == &p.name)),
        );
    }
    tracing::debug!(principal = %caller.principal, prompts = out.len(), "prompts/list");
    Ok(ListPromptsResult::with_all_items(out))
}

/// Gets a listed prompt from its upstream.
pub async fn get_prompt(
    registry: &Registry,
    upstreams: &Upstreams,
    caller: &Caller,
    request: GetPromptRequestParams,
) -> Result<GetPromptResult, ErrorData> {
    let Some((upstream, _)) = registry
        .gateway
        .upstreams
        .iter()
        .find(|(_, u)| u.prompts.iter().any(|n| n == &request.name))
    else {
        tracing::info!(principal = %caller.principal, prompt = %request.name, "prompts/get of an unlisted prompt");
        return Err(unknown_prompt(&request.name));
    };
    tracing::info!(principal = %caller.principal, upstream = %upstream, prompt = %request.name, "prompts/get");
    let peer = upstreams
        .peer(upstream)
        .await
        .map_err(|e| upstream_failed(upstream, e))?;
    peer.get_prompt(request)
        .await
        .map_err(|e| upstream_failed(upstream, e))
}

/// The listed resources of every upstream that lists any.
pub async fn list_resources(
    registry: &Registry,
    upstreams: &Upstreams,
    caller: &Caller,
) -> Result<ListResourcesResult, ErrorData> {
    let mut out = Vec::new();
    for (name, cfg) in &registry.gateway.upstreams {
        if cfg.resources.is_empty() {
            continue;
        }
        let peer = match upstreams.peer(name).await {
            Ok(p) => p,
            Err(e) => {
                tracing::warn!(upstream = %name, error = %e, "resources/list: upstream unavailable");
                continue;
            }
        };
        let resources = peer
            .list_all_resources()
            .await
            .map_err(|e| upstream_failed(name, e))?;
        out.extend(
            resources
                .into_iter()
                .filter(|r| cfg.resources.iter().any(|u| u == &r.uri)),
        );
    }
    tracing::debug!(principal = %caller.principal, resources = out.len(), "resources/list");
    Ok(ListResourcesResult::with_all_items(out))
}

/// Reads a listed resource from its upstream.
pub async fn read_resource(
    registry: &Registry,
    upstreams: &Upstreams,
    caller: &Caller,
    request: ReadResourceRequestParams,
) -> Result<ReadResourceResult, ErrorData> {
    let Some((upstream, _)) = registry
        .gateway
        .upstreams
        .iter()
        .find(|(_, u)| u.resources.iter().any(|x| x == &request.uri))
    else {
        tracing::info!(principal = %caller.principal, uri = %request.uri, "resources/read of an unlisted resource");
        return Err(unknown_resource(&request.uri));
    };
    tracing::info!(principal = %caller.principal, upstream = %upstream, uri = %request.uri, "resources/read");
    let peer = upstreams
        .peer(upstream)
        .await
        .map_err(|e| upstream_failed(upstream, e))?;
    peer.read_resource(request)
        .await
        .map_err(|e| upstream_failed(upstream, e))
}
