//! Opening the store a registry names, exactly as `serve` does (the gateway's own functions):
//! a relative SQLite path is resolved against the registry folder, retention, approval expiry
//! and the redaction key come from `toolgate.yaml`. Commands that only read open it with
//! [`open_existing`], which never creates or migrates one: a store that is not there (or not
//! at this binary's schema) is an error.

use std::path::PathBuf;

use anyhow::{Context, bail};
use toolgate_core::Registry;
use toolgate_gateway::{registry_store_config, resolve_store_url};
use toolgate_store::{ConnectOptions, Store};

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

/// As [`open`], for commands that only read what `serve` recorded (and the approval
/// decisions): nothing is created or migrated. A SQLite store whose file does not exist, or a
/// database (SQLite or PostgreSQL) without toolgate's schema or with another version of it,
/// is an error saying what to do (nothing was recorded there, the folder or `--store` names
/// the wrong one, or `serve` of this version has not migrated it yet), never a new empty
/// store reported on as if it held something.
pub async fn open_existing(registry: &Registry, store_url: Option<&str>) -> anyhow::Result<Store> {
    let url = resolve_store_url(
        &registry.dir,
        store_url.unwrap_or(&registry.gateway.store.url),
    );
    if let Some(path) = sqlite_file(&url)
        && !path.exists()
    {
        bail!(
            "no store at {}: nothing has been recorded there yet (`toolgate serve -c {}` writes \
             it), or name the store with --store URL",
            path.display(),
            registry.dir.display()
        );
    }
    Store::connect_existing(
        &url,
        registry_store_config(registry),
        ConnectOptions::default(),
    )
    .await
    .with_context(|| format!("opening the store at {url}"))
}

/// The file of a `sqlite://` URL (none for an in-memory database).
fn sqlite_file(url: &str) -> Option<PathBuf> {
    let rest = url
        .strip_prefix("sqlite://")
        .or_else(|| url.strip_prefix("sqlite:"))?;
    let path = rest.split('?').next().unwrap_or(rest);
    if path.is_empty() || path.starts_with(":memory:") {
        return None;
    }
    Some(PathBuf::from(path))
}

pub fn runtime() -> anyhow::Result<tokio::runtime::Runtime> {
    Ok(tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?)
}
