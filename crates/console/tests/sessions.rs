//! Sessions live in the store: a session survives a restart of the page (SQLite) and holds on
//! every gateway replica sharing one PostgreSQL; signing out on one ends it on all. The cookie
//! keeps its flags, the store keeps only a hash of its value, and CSRF still guards each POST.

use std::sync::Arc;

use crate::common::*;
use axum::http::StatusCode;
use toolgate_console::{ConsoleOptions, ConsoleState};
use toolgate_core::registry::api_key_hash;
use toolgate_core::{ApprovalKeys, FixedClock};
use toolgate_store::{ConnectOptions, Executor, Store, StoreConfig};

/// A second page over `store`, as another process (a restart, or another replica) would build it.
fn page_over(store: &Store) -> ConsoleState {
    let exec = Executor::new(
        store.clone(),
        registry(),
        Arc::new(ApprovalKeys::new("k1", vec![9u8; 32])),
        Arc::new(Recorder::default()),
        Arc::new(FixedClock::at(T0)),
    );
    ConsoleState::new(exec, ConsoleOptions::default())
}

fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as i64
}

/// Signs in on `a`, then checks the session on `b` (another page over the same database):
/// signed in there, CSRF required to sign out, and signing out on `b` ends it on `a`.
async fn shared_session(a: ConsoleState, b: ConsoleState, store: &Store) {
    let mut on_a = Http::new(toolgate_console::router(a));
    let r = on_a.sign_in(ALICE_KEY).await;
    assert_eq!(r.status, StatusCode::SEE_OTHER, "{}", r.body);
    let cookie = r
        .set_cookies
        .iter()
        .find(|c| c.starts_with("toolgate_session="))
        .unwrap();
    for flag in ["HttpOnly", "SameSite=Strict", "Secure"] {
        assert!(cookie.contains(flag), "{cookie} lacks {flag}");
    }
    let id = on_a.jar["toolgate_session"].clone();
    // The store holds the session under the hash of the cookie's value, never the value.
    assert!(
        store
            .console_session(&id, now_ms())
            .await
            .unwrap()
            .is_none()
    );
    let stored = store
        .console_session(&api_key_hash(&id), now_ms())
        .await
        .unwrap()
        .expect("the session is stored");
    assert_eq!(stored.principal, "alice");

    let mut on_b = Http::new(toolgate_console::router(b));
    on_b.jar = on_a.jar.clone();
    let q = on_b.get("/").await;
    assert_eq!(q.status, StatusCode::OK, "{}", q.body);
    assert!(q.body.contains("Signed in as"), "{}", q.body);
    let csrf = hidden(&q.body, "csrf").expect("the sign-out form carries the CSRF token");
    assert_eq!(csrf, stored.csrf);

    // Without its CSRF token, signing out changes nothing.
    let r = on_b.post("/logout", &[]).await;
    assert_eq!(r.status, StatusCode::FORBIDDEN);
    let r = on_b.post("/logout", &[("csrf", "0000")]).await;
    assert_eq!(r.status, StatusCode::FORBIDDEN);
    assert_eq!(on_a.get("/").await.status, StatusCode::OK);

    // With it, the session ends everywhere.
    let r = on_b.post("/logout", &[("csrf", &csrf)]).await;
    assert_eq!(r.status, StatusCode::SEE_OTHER);
    let r = on_a.get("/").await;
    assert_eq!(r.status, StatusCode::SEE_OTHER);
    assert_eq!(r.location.as_deref(), Some("/login"));
    assert!(
        store
            .console_session(&api_key_hash(&id), now_ms())
            .await
            .unwrap()
            .is_none()
    );
}

#[tokio::test]
async fn a_session_survives_a_restart_of_the_page() {
    let e = env().await;
    let url = format!("sqlite://{}", e.dir.path().join("toolgate.db").display());
    let before = e.console("");
    // The restarted process opens the database anew.
    let reopened = Store::connect(&url, StoreConfig::default()).await.unwrap();
    shared_session(before, page_over(&reopened), &e.store).await;
}

#[tokio::test]
async fn a_session_holds_on_every_replica_sharing_postgres() {
    let url = std::env::var("TOOLGATE_TEST_DATABASE_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".into());
    let schema = format!("tg_console_{}", std::process::id());
    let opts = || ConnectOptions {
        schema: Some(schema.clone()),
        max_connections: 4,
    };
    let first = match Store::connect_with(&url, StoreConfig::default(), opts()).await {
        Ok(s) => s,
        Err(e) if std::env::var("CI").as_deref() != Ok("true") => {
            eprintln!("NOTICE: skipping PostgreSQL test: {url} unreachable ({e})");
            return;
        }
        Err(e) => panic!("CI=true and PostgreSQL at {url} is unreachable: {e}"),
    };
    let second = Store::connect_with(&url, StoreConfig::default(), opts())
        .await
        .unwrap();
    shared_session(page_over(&first), page_over(&second), &first).await;
    second.close().await;
    first
        .execute_raw(&format!("DROP SCHEMA \"{schema}\" CASCADE"))
        .await
        .unwrap();
}
