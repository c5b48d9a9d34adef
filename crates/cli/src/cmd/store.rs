//! Opening the store a registry names, the same way `serve` does: a relative SQLite path is
//! resolved against the registry folder, the redaction key and approval expiry come from
//! `toolgate.yaml`.

use std::path::Path;

use anyhow::Context;
use toolgate_core::{Redactor, Registry};
use toolgate_store::{Store, StoreConfig};

/// The store URL with a relative `sqlite://` path made absolute against `dir`.
pub fn resolve_url(url: &str, dir: &Path) -> String {
    match url.strip_prefix("sqlite://") {
        Some(path) if !path.starts_with('/') && !path.starts_with(':') => {
            format!("sqlite://{}", dir.join(path).display())
        }
        _ => url.to_string(),
    }
}

/// The store configuration a registry implies.
pub fn config_for(registry: &Registry) -> StoreConfig {
    let g = &registry.gateway;
    let mut cfg = StoreConfig {
        idempotency_retention_hours: g.idempotency.retention_hours,
        approval_expiry_hours: g.approvals.expiry_hours,
        ..StoreConfig::default()
    };
    if let Ok(key) = std::env::var(&g.redaction.key_env)
        && !key.is_empty()
    {
        cfg.redactor = Redactor::new(key.into_bytes());
    }
    cfg
}

/// Connects (running migrations) to `--store URL` or to the registry's store.
pub async fn open(registry: &Registry, store_url: Option<&str>) -> anyhow::Result<Store> {
    let url = match store_url {
        Some(u) => u.to_string(),
        None => resolve_url(&registry.gateway.store.url, &registry.dir),
    };
    Store::connect(&url, config_for(registry))
        .await
        .with_context(|| format!("opening the store at {url}"))
}

pub fn runtime() -> anyhow::Result<tokio::runtime::Runtime> {
    Ok(tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?)
}
