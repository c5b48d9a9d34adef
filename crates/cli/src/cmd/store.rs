//! Opening the store a registry names, exactly as `serve` does (the gateway's own functions):
//! a relative SQLite path is resolved against the registry folder, retention, approval expiry
//! and the redaction key come from `toolgate.yaml`.

use anyhow::Context;
use toolgate_core::Registry;
use toolgate_gateway::{registry_store_config, resolve_store_url};
use toolgate_store::Store;

/// Connects (running migrations) to `--store URL` or to the registry's store.
pub async fn open(registry: &Registry, store_url: Option<&str>) -> anyhow::Result<Store> {
    let url = resolve_store_url(
        &registry.dir,
        store_url.unwrap_or(&registry.gateway.store.url),
    );
    Store::connect(&url, registry_store_config(registry))
        .await
        .with_context(|| format!("opening the store at {url}"))
}

pub fn runtime() -> anyhow::Result<tokio::runtime::Runtime> {
    Ok(tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?)
}
